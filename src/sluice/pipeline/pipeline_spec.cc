// parse_pipeline(): pipeline files (YAML, via yaml-cpp) into a validated PipelineSpec. docs/pipelines.md is
// the user reference; connector_option_tables.cc holds the per-connector option tables.
//
// The parser stops at the first error. Inside this file a failure is thrown as a ParseFailure (a mark and a
// reason) and turned into one kConfiguration Error "FILE:LINE:COLUMN: reason" at parse_pipeline(); nothing
// is thrown across the API.
#include "sluice/pipeline/pipeline_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <utility>

#include "sluice/pipeline/connector_option_tables.h"

namespace sluice::pipeline {

// --- ConnectorOptions / PipelineSpec accessors ---

const OptionValue* ConnectorOptions::find(std::string_view key) const noexcept {
  for (const OptionValue& option : values) {
    if (option.key == key) return &option;
  }
  return nullptr;
}

std::string ConnectorOptions::get_string(std::string_view key, std::string fallback) const {
  const OptionValue* option = find(key);
  if (option == nullptr || !option->value.is_string()) return fallback;
  return std::string(option->value.as_string());
}

int64_t ConnectorOptions::get_int(std::string_view key, int64_t fallback) const {
  const OptionValue* option = find(key);
  if (option == nullptr || !option->value.is_int64()) return fallback;
  return option->value.as_int64();
}

bool ConnectorOptions::get_bool(std::string_view key, bool fallback) const {
  const OptionValue* option = find(key);
  if (option == nullptr || !option->value.is_bool()) return fallback;
  return option->value.as_bool();
}

std::vector<std::string> ConnectorOptions::get_list(std::string_view key) const {
  std::vector<std::string> out;
  const OptionValue* option = find(key);
  if (option == nullptr || !option->value.is_array()) return out;
  for (const Value& element : option->value.as_array()) {
    if (element.is_string()) out.emplace_back(element.as_string());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ConnectorOptions::get_map(std::string_view key) const {
  std::vector<std::pair<std::string, std::string>> out;
  const OptionValue* option = find(key);
  if (option == nullptr || !option->value.is_object()) return out;
  for (const auto& [name, value] : option->value.as_object()) {
    if (value.is_string()) out.emplace_back(name, std::string(value.as_string()));
  }
  return out;
}

const SinkSpec* PipelineSpec::find_sink(std::string_view name) const noexcept {
  for (const SinkSpec& sink : sinks) {
    if (sink.name == name) return &sink;
  }
  return nullptr;
}

// --- match_collection ---

bool match_collection(std::string_view pattern, std::string_view name) noexcept {
  // matches[i][j]: pattern[i..] matches name[j..]; filled backwards (O(|pattern| * |name|), no backtracking).
  const size_t p = pattern.size();
  const size_t n = name.size();
  std::vector<uint8_t> matches((p + 1) * (n + 1), 0);
  auto at = [&](size_t i, size_t j) -> uint8_t& { return matches[i * (n + 1) + j]; };
  at(p, n) = 1;
  for (size_t i = p; i-- > 0;) {
    const bool double_star = pattern[i] == '*' && i + 1 < p && pattern[i + 1] == '*';
    for (size_t j = n + 1; j-- > 0;) {
      bool ok = false;
      if (double_star) {
        ok = at(i + 2, j) || (j < n && at(i, j + 1));
      } else if (pattern[i] == '*') {
        ok = at(i + 1, j) || (j < n && name[j] != '.' && at(i, j + 1));
      } else if (pattern[i] == '?') {
        ok = j < n && at(i + 1, j + 1);
      } else {
        ok = j < n && pattern[i] == name[j] && at(i + 1, j + 1);
      }
      at(i, j) = ok ? 1 : 0;
    }
  }
  return at(0, 0) != 0;
}

namespace {

using detail::ConnectorTable;
using detail::OptionDef;
using detail::OptionKind;

/// The first error, thrown inside this file only and caught by parse_pipeline().
struct ParseFailure {
  Mark mark;
  std::string reason;
};

[[noreturn]] void fail(Mark mark, std::string reason) {
  throw ParseFailure{mark, std::move(reason)};
}

Mark mark_of(const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (m.line < 0 || m.column < 0) return Mark{};
  return Mark{m.line + 1, m.column + 1};
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string join(std::span<const std::string_view> items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// "; did you mean 'x'?" for the closest candidate when it is close, else "" .
std::string suggestion(std::string_view word, std::span<const std::string_view> candidates) {
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    const size_t d = edit_distance(word, candidate);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  const size_t longest = std::max(word.size(), best.size());
  if (best.empty() || best_distance == 0 || best_distance > 2 || best_distance * 3 > longest) return "";
  return "; did you mean " + in_quotes(best) + "?";
}

/// The unknown-key reason: with a suggestion when one is close, else the list of known keys.
std::string unknown_key(std::string_view noun, std::string_view key, std::string_view where,
                        std::span<const std::string_view> known) {
  std::string reason = "unknown " + std::string(noun) + " " + in_quotes(key) + " in " + std::string(where);
  std::string hint = suggestion(key, known);
  if (hint.empty()) return reason + " (known: " + join(known) + ")";
  return reason + hint;
}

/// How a node reads in a message: "a mapping", "a list", "nothing", or the scalar quoted.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return in_quotes(node.Scalar());
    default:
      return "nothing";
  }
}

/// One key/value pair of a mapping.
struct Entry {
  std::string key;
  YAML::Node value;
  Mark key_mark;
  Mark value_mark;  ///< the key's when the value is empty (yaml-cpp has no position for an implicit null)
};

std::optional<int64_t> parse_integer(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// "250ms", "1s", "5m", "1h", "2d" or a bare integer of milliseconds; nullopt otherwise (or on overflow).
std::optional<int64_t> parse_duration(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9')
    ++digits;
  if (digits == 0) return std::nullopt;
  int64_t amount = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, amount);
  if (ec != std::errc()) return std::nullopt;
  const std::string_view unit = text.substr(digits);
  int64_t factor = 0;
  if (unit.empty() || unit == "ms") {
    factor = 1;
  } else if (unit == "s") {
    factor = 1000;
  } else if (unit == "m") {
    factor = 60'000;
  } else if (unit == "h") {
    factor = 3'600'000;
  } else if (unit == "d") {
    factor = 86'400'000;
  } else {
    return std::nullopt;
  }
  if (amount > std::numeric_limits<int64_t>::max() / factor) return std::nullopt;
  return amount * factor;
}

constexpr std::string_view kDurationForms =
    "a duration: an integer with unit ms, s, m, h or d (250ms, 1s, 5m, 1h, 2d) or an integer of milliseconds";

constexpr std::array<std::string_view, 5> kSections{"pipeline", "source", "transform", "route", "sink"};
constexpr std::array<std::string_view, 10> kPipelineKeys{"name",    "parallelism",   "checkpoint", "delivery",
                                                         "restart", "dead-letter",   "http",       "health",
                                                         "config",  "entity-version"};
constexpr std::array<std::string_view, 2> kCheckpointKeys{"interval", "storage"};
constexpr std::array<std::string_view, 2> kDeliveries{"at-least-once", "exactly-once"};
constexpr std::array<std::string_view, 4> kRestartKeys{"strategy", "attempts", "delay", "max-delay"};
constexpr std::array<std::string_view, 3> kRestartStrategies{"none", "fixed-delay", "exponential-delay"};
constexpr std::array<std::string_view, 2> kHttpKeys{"address", "port"};
constexpr std::array<std::string_view, 5> kHealthKeys{"max-checkpoint-age", "max-failed-checkpoints", "max-source-lag",
                                                      "restart-grace", "filter-window"};
constexpr std::array<std::string_view, 6> kTransformKeys{"match", "filter", "projection", "key", "function", "event"};
constexpr std::array<std::string_view, 8> kFunctionKeys{"runtime",         "module",        "export",  "batch-size",
                                                        "batch-max-delay", "max-in-flight", "timeout", "memory"};
constexpr std::array<std::string_view, 2> kFunctionRuntimes{"node", "python"};
constexpr std::array<std::string_view, 4> kEventKeys{"type", "entity", "payload", "occurred-at"};
constexpr std::array<std::string_view, 4> kRouteKeys{"match", "sink", "topic", "index"};

/// Where a route's keys are, for the checks made once all sinks are known.
struct RouteMarks {
  Mark sink;
  Mark topic;
  Mark index;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  PipelineSpec parse(const YAML::Node& root) {
    PipelineSpec spec;
    if (root.IsNull()) fail(Mark{1, 1}, "missing required section 'source'");
    if (!root.IsMap()) {
      fail(mark_of(root), "a pipeline file is a mapping of sections (" + join(kSections) + "), got " + describe(root));
    }
    bool has_source = false;
    bool has_sink = false;
    std::vector<RouteMarks> route_marks;
    for (const Entry& e : entries(root)) {
      if (e.key == "pipeline") {
        if (!e.value.IsNull()) parse_settings(e, spec.pipeline);
      } else if (e.key == "source") {
        has_source = true;
        spec.source = parse_connector(e, detail::source_tables(), "source", "the source", nullptr);
      } else if (e.key == "transform") {
        for (const YAML::Node& item : sequence(e)) {
          spec.transforms.push_back(parse_transform(item, e.value_mark));
        }
      } else if (e.key == "route") {
        for (const YAML::Node& item : sequence(e)) {
          route_marks.emplace_back();
          spec.routes.push_back(parse_route(item, e.value_mark, route_marks.back()));
        }
      } else if (e.key == "sink") {
        has_sink = true;
        parse_sinks(e, spec.sinks);
      } else {
        fail(e.key_mark, unknown_key("section", e.key, "the pipeline file", kSections));
      }
    }
    if (!has_source) fail(mark_of(root), "missing required section 'source'");
    if (!has_sink) fail(mark_of(root), "missing required section 'sink'");
    check_routes(spec, route_marks);
    if (spec.pipeline.delivery == "exactly-once" && spec.pipeline.checkpoint_interval_ms <= 0) {
      // Exactly-once sinks commit on completed checkpoints: without checkpoints the run would be at-least-once
      // at best, silently.
      fail(delivery_mark_,
           "'delivery: exactly-once' needs checkpoints, but 'pipeline.checkpoint.interval' is 0 (disabled) at "
           "line " +
               std::to_string(interval_mark_.line) + "; set an interval (e.g. 1s) or use 'delivery: at-least-once'");
    }
    return spec;
  }

 private:
  // --- generic readers ---

  /// The pairs of a mapping in file order; rejects non-scalar and duplicated keys.
  std::vector<Entry> entries(const YAML::Node& map) {
    std::vector<Entry> out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;  // copies: operator-> yields a temporary
      const YAML::Node value = it->second;
      const Mark key_mark = mark_of(key);
      if (!key.IsScalar()) fail(key_mark, "a key must be a string, got " + describe(key));
      for (const Entry& seen : out) {
        if (seen.key == key.Scalar()) {
          fail(key_mark,
               "duplicate key " + in_quotes(seen.key) + " (first at line " + std::to_string(seen.key_mark.line) + ")");
        }
      }
      Entry entry{key.Scalar(), value, key_mark, key_mark};
      if (!entry.value.IsNull()) entry.value_mark = mark_of(entry.value);
      if (entry.value_mark.line == 0) entry.value_mark = key_mark;
      out.push_back(std::move(entry));
    }
    return out;
  }

  /// The mapping under `e` (its pairs).
  std::vector<Entry> mapping(const Entry& e) {
    if (!e.value.IsMap()) fail(e.value_mark, in_quotes(e.key) + " must be a mapping, got " + describe(e.value));
    return entries(e.value);
  }

  /// The items of the list under `e`; an empty value is an empty list.
  std::vector<YAML::Node> sequence(const Entry& e) {
    std::vector<YAML::Node> out;
    if (e.value.IsNull()) return out;
    if (!e.value.IsSequence()) fail(e.value_mark, in_quotes(e.key) + " must be a list, got " + describe(e.value));
    for (auto it = e.value.begin(); it != e.value.end(); ++it) {
      out.push_back(*it);
    }
    return out;
  }

  std::string scalar(const Entry& e, std::string_view kind = "a string") {
    if (!e.value.IsScalar())
      fail(e.value_mark, in_quotes(e.key) + " must be " + std::string(kind) + ", got " + describe(e.value));
    return e.value.Scalar();
  }

  int64_t integer(const Entry& e, int64_t min, int64_t max) {
    const std::string range = min == std::numeric_limits<int64_t>::min() ? std::string("an integer")
                              : max == std::numeric_limits<int64_t>::max()
                                  ? "an integer >= " + std::to_string(min)
                                  : "an integer from " + std::to_string(min) + " to " + std::to_string(max);
    const std::string text = scalar(e, range);
    std::optional<int64_t> value = parse_integer(text);
    if (!value || *value < min || *value > max) {
      fail(e.value_mark, in_quotes(e.key) + " must be " + range + ", got " + describe(e.value));
    }
    return *value;
  }

  bool boolean(const Entry& e) {
    const std::string text = scalar(e, "true or false");
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    fail(e.value_mark, in_quotes(e.key) + " must be true or false, got " + describe(e.value));
  }

  int64_t duration(const Entry& e) {
    const std::string text = scalar(e, kDurationForms);
    std::optional<int64_t> ms = parse_duration(text);
    if (!ms)
      fail(e.value_mark, in_quotes(e.key) + " must be " + std::string(kDurationForms) + ", got " + describe(e.value));
    return *ms;
  }

  std::string one_of(const Entry& e, std::span<const std::string_view> allowed) {
    const std::string text = scalar(e, "one of " + join(allowed));
    if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
      fail(e.value_mark, in_quotes(e.key) + " must be one of " + join(allowed) + ", got " + describe(e.value) +
                             suggestion(text, allowed));
    }
    return text;
  }

  Value string_list(const Entry& e) {
    if (!e.value.IsSequence()) fail(e.value_mark, in_quotes(e.key) + " must be a list, got " + describe(e.value));
    Value out = Value::array();
    for (auto it = e.value.begin(); it != e.value.end(); ++it) {
      const YAML::Node item = *it;
      if (!item.IsScalar()) {
        fail(item.IsNull() ? e.value_mark : mark_of(item),
             "the items of " + in_quotes(e.key) + " must be strings, got " + describe(item));
      }
      out.push_back(Value(item.Scalar()));
    }
    return out;
  }

  std::vector<std::pair<std::string, std::string>> string_map(const Entry& e) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Entry& item : mapping(e)) {
      out.emplace_back(item.key, scalar(item, "a scalar"));
    }
    return out;
  }

  /// Where the expression error at byte `offset` of `node`'s text is: exact when the text up to it sits on
  /// the scalar's first line (plain or quoted); otherwise nullopt (block scalars, folded lines).
  std::optional<Mark> expression_mark(const YAML::Node& node, size_t offset) const {
    const YAML::Mark m = node.Mark();
    if (m.pos < 0 || static_cast<size_t>(m.pos) >= text_.size()) return std::nullopt;
    size_t raw = static_cast<size_t>(m.pos);
    const char first = text_[raw];
    if (first == '|' || first == '>') return std::nullopt;
    const char quote = (first == '"' || first == '\'') ? first : '\0';
    if (quote != '\0') ++raw;
    for (size_t decoded = 0; decoded < offset; ++decoded) {
      if (raw >= text_.size() || text_[raw] == '\n' || text_[raw] == '\r') return std::nullopt;
      if (quote == '\'' && text_[raw] == '\'' && raw + 1 < text_.size() && text_[raw + 1] == '\'') {
        raw += 2;
      } else if (quote == '"' && text_[raw] == '\\' && raw + 1 < text_.size()) {
        const char escape = text_[raw + 1];
        raw += escape == 'x' ? 4 : escape == 'u' ? 6 : escape == 'U' ? 10 : 2;
        if (escape == 'u' || escape == 'U') return std::nullopt;  // several UTF-8 bytes: do not guess
      } else {
        ++raw;
      }
    }
    return Mark{m.line + 1, m.column + 1 + static_cast<int>(raw - static_cast<size_t>(m.pos))};
  }

  template <class Compiled>
  Compiled compile(const Entry& e, std::string_view noun) {
    const std::string text = scalar(e, "an " + std::string(noun) + " (a string)");
    Compiled out;
    ExpressionError error;
    if (!Compiled::compile(text, &out, &error)) {
      std::string reason = "invalid " + std::string(noun) + " in " + in_quotes(e.key) + ": ";
      if (std::optional<Mark> at = expression_mark(e.value, error.offset)) fail(*at, reason + error.message);
      fail(e.value_mark, reason + "at offset " + std::to_string(error.offset) + ": " + error.message);
    }
    return out;
  }

  // --- sections ---

  void parse_settings(const Entry& section, PipelineSettings& out) {
    for (const Entry& e : mapping(section)) {
      if (e.key == "name") {
        out.name = scalar(e);
      } else if (e.key == "parallelism") {
        out.parallelism = static_cast<int>(integer(e, 1, 1024));
      } else if (e.key == "checkpoint") {
        for (const Entry& c : mapping(e)) {
          if (c.key == "interval") {
            out.checkpoint_interval_ms = duration(c);
            interval_mark_ = c.value_mark;
          } else if (c.key == "storage") {
            out.checkpoint_storage = scalar(c);
          } else {
            fail(c.key_mark, unknown_key("key", c.key, "'checkpoint'", kCheckpointKeys));
          }
        }
      } else if (e.key == "delivery") {
        out.delivery = one_of(e, kDeliveries);
        delivery_mark_ = e.value_mark;
      } else if (e.key == "entity-version") {
        out.entity_version = boolean(e);
      } else if (e.key == "restart") {
        for (const Entry& r : mapping(e)) {
          if (r.key == "strategy") {
            out.restart.strategy = one_of(r, kRestartStrategies);
          } else if (r.key == "attempts") {
            out.restart.attempts = static_cast<int>(integer(r, 0, std::numeric_limits<int>::max()));
          } else if (r.key == "delay") {
            out.restart.delay_ms = duration(r);
          } else if (r.key == "max-delay") {
            out.restart.max_delay_ms = duration(r);
          } else {
            fail(r.key_mark, unknown_key("key", r.key, "'restart'", kRestartKeys));
          }
        }
      } else if (e.key == "dead-letter") {
        SinkSpec sink;
        sink.name = "dead-letter";
        sink.options = parse_connector(e, detail::sink_tables(), "sink", "the dead-letter sink", &sink);
        const auto allowed = detail::dead_letter_types();
        if (std::find(allowed.begin(), allowed.end(), sink.options.type) == allowed.end()) {
          fail(sink.options.find("type")->mark,
               "the dead-letter sink must be of type " + join(allowed) + ", got " + in_quotes(sink.options.type));
        }
        if (sink.options.type == "kafka" && sink.options.find("topic") == nullptr) {
          fail(sink.options.mark, "the dead-letter sink (kafka) is missing required option 'topic'");
        }
        out.dead_letter = std::move(sink);
      } else if (e.key == "http") {
        for (const Entry& h : mapping(e)) {
          if (h.key == "address") {
            out.http_address = scalar(h);
          } else if (h.key == "port") {
            out.http_port = static_cast<int>(integer(h, -1, 65535));
          } else {
            fail(h.key_mark, unknown_key("key", h.key, "'http'", kHttpKeys));
          }
        }
      } else if (e.key == "health") {
        for (const Entry& h : mapping(e)) {
          if (h.key == "max-checkpoint-age") {
            out.health_max_checkpoint_age_ms = duration(h);
          } else if (h.key == "max-failed-checkpoints") {
            out.health_max_failed_checkpoints = static_cast<int>(integer(h, 0, 1'000'000));
          } else if (h.key == "max-source-lag") {
            out.health_max_source_lag_ms = duration(h);
          } else if (h.key == "restart-grace") {
            out.health_restart_grace_ms = duration(h);
          } else if (h.key == "filter-window") {
            out.health_filter_window_ms = duration(h);
            if (out.health_filter_window_ms <= 0) fail(h.value_mark, "health.filter-window must be positive");
          } else {
            fail(h.key_mark, unknown_key("key", h.key, "'health'", kHealthKeys));
          }
        }
      } else if (e.key == "config") {
        out.config = string_map(e);
      } else {
        fail(e.key_mark, unknown_key("key", e.key, "'pipeline'", kPipelineKeys));
      }
    }
  }

  /// A source or sink mapping: `type` plus the options of that type's table. `sink` (null for the source)
  /// receives the compiled expressions.
  ConnectorOptions parse_connector(const Entry& section, std::span<const ConnectorTable> tables, std::string_view role,
                                   const std::string& where, SinkSpec* sink) {
    std::vector<Entry> items = mapping(section);
    ConnectorOptions out;
    out.mark = section.value_mark;
    std::vector<std::string_view> types;
    for (const ConnectorTable& table : tables) {
      types.push_back(table.type);
    }

    const ConnectorTable* table = nullptr;
    for (const Entry& e : items) {
      if (e.key != "type") continue;
      out.type = scalar(e);
      table = detail::find_table(tables, out.type);
      if (table == nullptr) {
        fail(e.value_mark, "unknown " + std::string(role) + " type " + in_quotes(out.type) + " (types: " + join(types) +
                               ")" + suggestion(out.type, types));
      }
      out.values.push_back(OptionValue{"type", Value(out.type), e.value_mark});
    }
    if (table == nullptr) {
      fail(out.mark, where + " is missing required key 'type' (one of " + join(types) + ")");
    }
    const std::string context = where + " (" + out.type + ")";
    std::vector<std::string_view> known{"type"};
    for (const OptionDef& def : table->options) {
      known.push_back(def.key);
    }

    for (const Entry& e : items) {
      if (e.key == "type") continue;
      const OptionDef* def = table->find(e.key);
      if (def == nullptr) fail(e.key_mark, unknown_key("option", e.key, context, known));
      OptionValue option{e.key, Value(), e.value_mark};
      switch (def->kind) {
        case OptionKind::kString:
          option.value = def->allowed.empty() ? Value(scalar(e)) : Value(one_of(e, def->allowed));
          break;
        case OptionKind::kInt:
          option.value = Value(integer(e, 0, std::numeric_limits<int64_t>::max()));
          break;
        case OptionKind::kBool:
          option.value = Value(boolean(e));
          break;
        case OptionKind::kDuration:
          option.value = Value(duration(e));
          break;
        case OptionKind::kList:
          option.value = string_list(e);
          break;
        case OptionKind::kMap: {
          Value object = Value::object();
          for (auto& [key, value] : string_map(e)) {
            object.set(key, Value(value));
          }
          option.value = std::move(object);
          break;
        }
        case OptionKind::kExpression: {
          Expression expression = compile<Expression>(e, "expression");
          option.value = Value(expression.text());
          if (sink != nullptr) {
            if (e.key == "key") sink->kafka_key = std::move(expression);
            if (e.key == "id") sink->document_id = std::move(expression);
            if (e.key == "index-expression") sink->index_expression = std::move(expression);
          }
          break;
        }
        case OptionKind::kProjection: {
          Projection projection = compile<Projection>(e, "projection");
          option.value = Value(projection.text());
          if (sink != nullptr && e.key == "row") sink->row = std::move(projection);
          break;
        }
      }
      out.values.push_back(std::move(option));
    }

    for (const OptionDef& def : table->options) {
      if (def.required && out.find(def.key) == nullptr) {
        fail(out.mark, context + " is missing required option " + in_quotes(def.key));
      }
    }
    if (role == "source") check_source_rules(out, context);
    return out;
  }

  static void exactly_one(const ConnectorOptions& options, const std::string& context, std::string_view a,
                          std::string_view b) {
    const OptionValue* first = options.find(a);
    const OptionValue* second = options.find(b);
    if (first != nullptr && second != nullptr) {
      const OptionValue* later = first->mark.line > second->mark.line || (first->mark.line == second->mark.line &&
                                                                          first->mark.column > second->mark.column)
                                     ? first
                                     : second;
      fail(later->mark, context + " takes only one of " + in_quotes(a) + " and " + in_quotes(b));
    }
    if (first == nullptr && second == nullptr) {
      fail(options.mark, context + " needs one of " + in_quotes(a) + " or " + in_quotes(b));
    }
  }

  static void check_source_rules(const ConnectorOptions& options, const std::string& context) {
    if (options.type == "mongodb") {
      exactly_one(options, context, "collections", "collection-regex");
      if (options.get_string("start") == "timestamp" && options.find("start-timestamp") == nullptr) {
        fail(options.mark, context + " is missing 'start-timestamp' (required by start: timestamp)");
      }
    } else if (options.type == "kafka") {
      exactly_one(options, context, "topics", "topic-pattern");
    }
  }

  /// `list_mark` stands in for the position of an empty item (yaml-cpp has none).
  TransformSpec parse_transform(const YAML::Node& node, Mark list_mark) {
    TransformSpec out;
    out.mark = node.IsNull() ? list_mark : mark_of(node);
    if (!node.IsMap()) fail(out.mark, "a transform item must be a mapping, got " + describe(node));
    const Entry self{"transform", node, out.mark, out.mark};
    bool has_match = false;
    for (const Entry& e : mapping(self)) {
      if (e.key == "match") {
        out.match = scalar(e);
        has_match = true;
      } else if (e.key == "filter") {
        out.filter = compile<Expression>(e, "expression");
      } else if (e.key == "projection") {
        out.projection = compile<Projection>(e, "projection");
      } else if (e.key == "key") {
        out.key = compile<Expression>(e, "expression");
      } else if (e.key == "function") {
        out.function = parse_function(e);
      } else if (e.key == "event") {
        for (const Entry& v : mapping(e)) {
          if (v.key == "type") {
            out.event.type = compile<Expression>(v, "expression");
          } else if (v.key == "entity") {
            out.event.entity = compile<Expression>(v, "expression");
          } else if (v.key == "payload") {
            out.event.payload = compile<Projection>(v, "projection");
          } else if (v.key == "occurred-at") {
            out.event.occurred_at = compile<Expression>(v, "expression");
          } else {
            fail(v.key_mark, unknown_key("key", v.key, "'event'", kEventKeys));
          }
        }
      } else {
        fail(e.key_mark, unknown_key("key", e.key, "a transform", kTransformKeys));
      }
    }
    if (!has_match) fail(out.mark, "a transform is missing required key 'match'");
    return out;
  }

  FunctionSpec parse_function(const Entry& e) {
    FunctionSpec out;
    out.mark = e.key_mark;
    bool has_module = false;
    bool has_export = false;
    for (const Entry& f : mapping(e)) {
      if (f.key == "runtime") {
        out.runtime = one_of(f, kFunctionRuntimes);
      } else if (f.key == "module") {
        out.module = scalar(f);
        out.module_mark = f.value_mark;
        has_module = !out.module.empty();
      } else if (f.key == "export") {
        out.export_name = scalar(f);
        has_export = !out.export_name.empty();
      } else if (f.key == "batch-size") {
        out.batch_size = integer(f, 1, 100'000);
      } else if (f.key == "batch-max-delay") {
        out.batch_max_delay_ms = duration(f);
      } else if (f.key == "max-in-flight") {
        out.max_in_flight = integer(f, 1, 1024);
      } else if (f.key == "timeout") {
        out.timeout_ms = duration(f);
        if (out.timeout_ms <= 0) fail(f.value_mark, "'timeout' must be positive");
      } else if (f.key == "memory") {
        out.memory_mb = integer(f, 16, 1 << 20);
      } else {
        fail(f.key_mark, unknown_key("key", f.key, "'function'", kFunctionKeys));
      }
    }
    if (!has_module) fail(out.mark, "'function' is missing required key 'module' (a .ts, .js, .mjs or .py file)");
    if (!has_export) fail(out.mark, "'function' is missing required key 'export' (the exported function's name)");
    return out;
  }

  RouteSpec parse_route(const YAML::Node& node, Mark list_mark, RouteMarks& marks) {
    RouteSpec out;
    out.mark = node.IsNull() ? list_mark : mark_of(node);
    if (!node.IsMap()) fail(out.mark, "a route item must be a mapping, got " + describe(node));
    const Entry self{"route", node, out.mark, out.mark};
    bool has_match = false;
    bool has_sink = false;
    for (const Entry& e : mapping(self)) {
      if (e.key == "match") {
        out.match = scalar(e);
        has_match = true;
      } else if (e.key == "sink") {
        out.sink = scalar(e);
        marks.sink = e.value_mark;
        has_sink = true;
      } else if (e.key == "topic") {
        out.topic = scalar(e);
        marks.topic = e.key_mark;
      } else if (e.key == "index") {
        out.index = scalar(e);
        marks.index = e.key_mark;
      } else {
        fail(e.key_mark, unknown_key("key", e.key, "a route", kRouteKeys));
      }
    }
    if (!has_match) fail(out.mark, "a route is missing required key 'match'");
    if (!has_sink) fail(out.mark, "a route is missing required key 'sink'");
    return out;
  }

  void parse_sinks(const Entry& section, std::vector<SinkSpec>& out) {
    if (section.value.IsNull()) fail(section.key_mark, "'sink' needs at least one sink");
    std::vector<Entry> named = mapping(section);
    if (named.empty()) fail(section.value_mark, "'sink' needs at least one sink");
    for (const Entry& e : named) {
      SinkSpec sink;
      sink.name = e.key;
      sink.options = parse_connector(e, detail::sink_tables(), "sink", "sink " + in_quotes(e.key), &sink);
      out.push_back(std::move(sink));
    }
  }

  /// Cross-section checks: routes name existing sinks; kafka sinks get a topic and search sinks an index.
  static void check_routes(const PipelineSpec& spec, const std::vector<RouteMarks>& marks) {
    std::vector<std::string_view> names;
    for (const SinkSpec& sink : spec.sinks) {
      names.push_back(sink.name);
    }
    for (size_t i = 0; i < spec.routes.size(); ++i) {
      const RouteSpec& route = spec.routes[i];
      const SinkSpec* sink = spec.find_sink(route.sink);
      if (sink == nullptr) {
        fail(marks[i].sink,
             "unknown sink " + in_quotes(route.sink) + " (sinks: " + join(names) + ")" + suggestion(route.sink, names));
      }
      const std::string& type = sink->options.type;
      if (!route.topic.empty() && type != "kafka") {
        fail(marks[i].topic, "'topic' applies to routes to kafka sinks; sink " + in_quotes(route.sink) + " is " + type);
      }
      if (!route.index.empty() && type != "opensearch" && type != "elasticsearch") {
        fail(marks[i].index, "'index' applies to routes to opensearch and elasticsearch sinks; sink " +
                                 in_quotes(route.sink) + " is " + type);
      }
    }
    for (const SinkSpec& sink : spec.sinks) {
      const std::string& type = sink.options.type;
      const bool kafka = type == "kafka";
      const bool search = type == "opensearch" || type == "elasticsearch";
      if (kafka && sink.options.find("topic") != nullptr) continue;
      if (search && (sink.options.find("index") != nullptr || sink.options.find("index-expression") != nullptr))
        continue;
      if (!kafka && !search) continue;
      const std::string_view need = kafka ? "topic" : "index";
      const std::string context = "sink " + in_quotes(sink.name) + " (" + type + ")";
      if (spec.routes.empty()) {
        fail(sink.options.mark, context + " is missing required option " + in_quotes(need) +
                                    (kafka ? "" : " (or 'index-expression')") +
                                    "; without routes every event goes to it");
      }
      for (const RouteSpec& route : spec.routes) {
        if (route.sink != sink.name) continue;
        if ((kafka ? route.topic : route.index).empty()) {
          fail(sink.options.mark, context + " is missing required option " + in_quotes(need) +
                                      (kafka ? "" : " (or 'index-expression')") + "; the route at line " +
                                      std::to_string(route.mark.line) + " gives it no " + std::string(need));
        }
      }
    }
  }

  std::string_view text_;
  Mark delivery_mark_;  ///< where `pipeline.delivery` was given
  Mark interval_mark_;  ///< where `pipeline.checkpoint.interval` was given
};

Error located_error(const std::string& file, Mark mark, const std::string& reason) {
  return Error(ErrorCode::kConfiguration,
               file + ":" + std::to_string(mark.line) + ":" + std::to_string(mark.column) + ": " + reason);
}

}  // namespace

Result<PipelineSpec> parse_pipeline(std::string_view yaml_text, std::string file_name) {
  const std::string text(yaml_text);
  try {
    YAML::Node root = YAML::Load(text);
    PipelineSpec spec = Parser(text).parse(root);
    spec.file = std::move(file_name);
    return spec;
  } catch (const ParseFailure& failure) {
    const Mark mark = failure.mark.line > 0 ? failure.mark : Mark{1, 1};
    return located_error(file_name, mark, failure.reason);
  } catch (const YAML::Exception& e) {
    const Mark mark = e.mark.line >= 0 ? Mark{e.mark.line + 1, e.mark.column + 1} : Mark{1, 1};
    return located_error(file_name, mark, "invalid YAML: " + e.msg);
  }
}

Result<PipelineSpec> load_pipeline(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Error(ErrorCode::kConfiguration,
                 "cannot read pipeline file '" + path.string() + "': " + std::strerror(errno));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return Error(ErrorCode::kConfiguration, "cannot read pipeline file '" + path.string() + "'");
  }
  return parse_pipeline(buffer.str(), path.string());
}

}  // namespace sluice::pipeline
