#include "sluice/metrics/prometheus_text.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <set>

namespace sluice::metrics {
namespace {

bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool name_char(char c) {
  return name_start(c) || (c >= '0' && c <= '9');
}

Error bad(size_t line_no, std::string_view line, std::string_view why) {
  return Error(ErrorCode::kSerialization,
               fmt::format("Prometheus text line {} ('{}'): {}", line_no, line.substr(0, 200), why));
}

std::optional<double> parse_value(std::string_view v) {
  if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (v == "+Inf" || v == "Inf") return std::numeric_limits<double>::infinity();
  if (v == "-Inf") return -std::numeric_limits<double>::infinity();
  double d = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return d;
}

// The family a sample belongs to: a histogram's or summary's _bucket, _sum and _count samples belong to it.
std::string family_of(const std::string& name, const std::map<std::string, std::string>& types) {
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) {
      std::string base = name.substr(0, name.size() - suffix.size());
      auto t = types.find(base);
      if (t != types.end() && (t->second == "histogram" || t->second == "summary")) return base;
    }
  }
  return name;
}

}  // namespace

void append_escaped_label_value(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  append_escaped_label_value(out, value);
  return out;
}

std::vector<const ParsedSample*> ParsedExposition::find(std::string_view name,
                                                        const std::map<std::string, std::string>& match) const {
  std::vector<const ParsedSample*> out;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) {
        ok = false;
        break;
      }
    }
    if (ok) out.push_back(&s);
  }
  return out;
}

std::optional<double> ParsedExposition::sum(std::string_view name,
                                            const std::map<std::string, std::string>& match) const {
  auto found = find(name, match);
  if (found.empty()) return std::nullopt;
  double total = 0;
  for (const auto* s : found)
    total += s->value;
  return total;
}

Result<ParsedExposition> parse_prometheus_text(std::string_view text) {
  ParsedExposition out;
  std::set<std::string> series;
  std::set<std::string> seen_families;  // families that had samples (a TYPE after them is an error)
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::string_view rest = line.substr(1);
      while (!rest.empty() && rest[0] == ' ')
        rest.remove_prefix(1);
      const bool is_type = rest.starts_with("TYPE ");
      const bool is_help = rest.starts_with("HELP ");
      if (!is_type && !is_help) continue;  // a comment
      rest.remove_prefix(5);
      const size_t sp = rest.find(' ');
      std::string name(rest.substr(0, sp));
      if (name.empty() || !name_start(name[0])) return bad(line_no, line, "bad metric name");
      for (char c : name)
        if (!name_char(c)) return bad(line_no, line, "bad metric name");
      std::string arg(sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1));
      if (is_type) {
        if (arg != "counter" && arg != "gauge" && arg != "histogram" && arg != "summary" && arg != "untyped") {
          return bad(line_no, line, "unknown type");
        }
        if (out.types.count(name) != 0) return bad(line_no, line, "a second TYPE for the family");
        if (seen_families.count(name) != 0) return bad(line_no, line, "TYPE after the family's samples");
        out.types[name] = arg;
      } else {
        if (out.help.count(name) != 0) return bad(line_no, line, "a second HELP for the family");
        out.help[name] = arg;
      }
      continue;
    }
    ParsedSample s;
    size_t i = 0;
    if (!name_start(line[0])) return bad(line_no, line, "bad metric name");
    while (i < line.size() && name_char(line[i]))
      ++i;
    s.name = std::string(line.substr(0, i));
    std::string key = s.name;
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        const size_t ln = i;
        if (i >= line.size() || !name_start(line[i])) return bad(line_no, line, "bad label name");
        while (i < line.size() && name_char(line[i]))
          ++i;
        std::string label(line.substr(ln, i - ln));
        if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') return bad(line_no, line, "expected =\"");
        i += 2;
        std::string value;
        for (;;) {
          if (i >= line.size()) return bad(line_no, line, "unterminated label value");
          const char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return bad(line_no, line, "unterminated escape");
            const char e = line[i++];
            if (e == 'n') {
              value += '\n';
            } else if (e == '\\' || e == '"') {
              value += e;
            } else {
              return bad(line_no, line, "bad escape in a label value");
            }
          } else {
            value += c;
          }
        }
        if (!s.labels.emplace(label, value).second) return bad(line_no, line, "a label twice");
        key += '\x1f' + label + '\x1e' + value;
        if (i < line.size() && line[i] == ',') ++i;
      }
    }
    if (i >= line.size() || line[i] != ' ') return bad(line_no, line, "expected a space before the value");
    while (i < line.size() && line[i] == ' ')
      ++i;
    std::string_view rest = line.substr(i);
    const size_t sp = rest.find(' ');
    auto v = parse_value(rest.substr(0, sp));
    if (!v) return bad(line_no, line, "bad value");
    if (sp != std::string_view::npos) {
      int64_t ts = 0;
      std::string_view t = rest.substr(sp + 1);
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), ts);
      if (ec != std::errc() || p != t.data() + t.size()) return bad(line_no, line, "bad timestamp");
    }
    s.value = *v;
    const std::string family = family_of(s.name, out.types);
    if (out.types.count(family) == 0) return bad(line_no, line, "a sample before its family's TYPE");
    seen_families.insert(family);
    if (!series.insert(key).second) return bad(line_no, line, "a series twice");
    out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace sluice::metrics
