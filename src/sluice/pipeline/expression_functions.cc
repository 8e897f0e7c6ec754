// The built-in scalar functions (docs/expressions.md, "Functions"). Strings are UTF-8 and positions count
// code points, 1-based as in SQL. Arguments that should be strings but are not are converted to their text
// form (as with ||).
#include "sluice/pipeline/expression_functions.h"

#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "sluice/pipeline/expression_lexer.h"
#include "sluice/pipeline/expression_time.h"

namespace sluice::pipeline::detail {

namespace {

using Args = ArgList;

std::string_view text_arg(const Value& v, std::string& buf) {
  if (v.is_string()) return v.as_string();
  buf = to_text(v);
  return buf;
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (v.is_int64()) return v.as_int64();
  if (v.is_decimal() || v.is_double()) {
    const Value i = cast_value(v, CastType::kBigint, std::nullopt, std::nullopt);
    if (compare_values(i, v, what) == 0) return i.as_int64();
  }
  throw EvalError{std::string(what) + " must be an integer, found " + std::string(value_kind_name(v.kind())) + " " +
                  to_text(v)};
}

// Byte offsets of each code point of `s`, plus s.size() at the end.
std::vector<size_t> code_points(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

int64_t timestamp_arg(const Value& v, std::string_view what, bool* unparsable) {
  if (v.is_timestamp()) return v.as_timestamp_micros();
  if (v.is_string()) {
    auto t = parse_timestamp(v.as_string());
    if (t) return *t;
    *unparsable = true;
    return 0;
  }
  throw EvalError{std::string(what) + " must be a timestamp or an ISO-8601 string, found " +
                  std::string(value_kind_name(v.kind()))};
}

const re2::RE2& regex_for(const Value& pattern, const FunctionState& state, std::shared_ptr<const re2::RE2>& tmp) {
  if (state.regex) return *state.regex;
  std::string buf;
  tmp = compile_regex(text_arg(pattern, buf));
  return *tmp;
}

// ---- string functions ----

Value fn_upper(const Args& a, const FunctionState&) {
  std::string buf;
  std::string s(text_arg(a[0], buf));
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return Value(s);
}

Value fn_lower(const Args& a, const FunctionState&) {
  std::string buf;
  std::string s(text_arg(a[0], buf));
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return Value(s);
}

Value trim_impl(const Args& a, bool left, bool right) {
  std::string buf;
  std::string_view s = text_arg(a[0], buf);
  while (left && !s.empty() && s.front() == ' ')
    s.remove_prefix(1);
  while (right && !s.empty() && s.back() == ' ')
    s.remove_suffix(1);
  return Value(s);
}
Value fn_trim(const Args& a, const FunctionState&) {
  return trim_impl(a, true, true);
}
Value fn_ltrim(const Args& a, const FunctionState&) {
  return trim_impl(a, true, false);
}
Value fn_rtrim(const Args& a, const FunctionState&) {
  return trim_impl(a, false, true);
}

Value fn_char_length(const Args& a, const FunctionState&) {
  std::string buf;
  return static_cast<int64_t>(count_code_points(text_arg(a[0], buf)));
}

Value fn_substring(const Args& a, const FunctionState&) {
  std::string buf;
  const std::string_view s = text_arg(a[0], buf);
  const std::vector<size_t> cps = code_points(s);
  const int64_t n = static_cast<int64_t>(cps.size()) - 1;
  int64_t start = int_arg(a[1], "start");
  if (start < 0) start = std::max<int64_t>(n + start + 1, 1);
  if (start == 0) start = 1;
  int64_t end = n + 1;  // exclusive, 1-based
  if (a.size() > 2) {
    const int64_t len = int_arg(a[2], "length");
    if (len < 0) throw EvalError{"length must not be negative, found " + std::to_string(len)};
    end = start > n ? start : std::min(end, start + len);
  }
  if (start > n || end <= start) return Value("");
  return Value(s.substr(cps[start - 1], cps[end - 1] - cps[start - 1]));
}

Value fn_concat(const Args& a, const FunctionState&) {
  std::string out;
  for (size_t i = 0; i < a.size(); ++i) {
    append_text(a[i], out);
    check_string_size(out.size(), "the result");
  }
  return Value(out);
}

Value fn_concat_ws(const Args& a, const FunctionState&) {
  if (a[0].is_null()) return Value();
  std::string sep_buf;
  const std::string_view sep = text_arg(a[0], sep_buf);
  std::string out;
  bool first = true;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i].is_null()) continue;
    if (!first) out += sep;
    append_text(a[i], out);
    check_string_size(out.size(), "the result");
    first = false;
  }
  return Value(out);
}

Value fn_replace(const Args& a, const FunctionState&) {
  std::string b0, b1, b2;
  const std::string_view s = text_arg(a[0], b0), from = text_arg(a[1], b1), to = text_arg(a[2], b2);
  if (from.empty()) return Value(s);
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    check_string_size(out.size() + (s.size() - hit - from.size()), "the result");
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return Value(out);
}

Value fn_locate(const Args& a, const FunctionState&) {
  std::string b0, b1;
  const std::string_view sub = text_arg(a[0], b0), s = text_arg(a[1], b1);
  const std::vector<size_t> cps = code_points(s);
  int64_t from = a.size() > 2 ? int_arg(a[2], "start") : 1;
  if (from < 1) return int64_t{0};
  if (from > static_cast<int64_t>(cps.size())) return int64_t{0};
  const size_t hit = s.find(sub, cps[from - 1]);
  if (hit == std::string_view::npos) return int64_t{0};
  return static_cast<int64_t>(std::lower_bound(cps.begin(), cps.end(), hit) - cps.begin()) + 1;
}

Value fn_split_index(const Args& a, const FunctionState&) {
  std::string b0, b1;
  const std::string_view s = text_arg(a[0], b0), sep = text_arg(a[1], b1);
  const int64_t index = int_arg(a[2], "index");
  if (sep.empty() || index < 0) return Value();
  size_t pos = 0;
  for (int64_t i = 0; i < index; ++i) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string_view::npos) return Value();
    pos = hit + sep.size();
  }
  const size_t end = s.find(sep, pos);
  return Value(s.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
}

// Appends `repl` for one match, as JavaScript's String.replace: $& is the match, $1..$99 a group ('' when it
// did not take part), $$ a dollar; a $n the pattern has no group for, and any other character, stand for
// themselves.
void append_replacement(std::string& out, std::string_view repl, const std::vector<std::string_view>& groups) {
  for (size_t i = 0; i < repl.size(); ++i) {
    const char c = repl[i];
    if (c != '$' || i + 1 == repl.size()) {
      out.push_back(c);
      continue;
    }
    const char d = repl[i + 1];
    if (d == '$') {
      out.push_back('$');
      ++i;
    } else if (d == '&') {
      out.append(groups[0]);
      ++i;
    } else if (d >= '0' && d <= '9') {
      const size_t dollar = i;
      size_t n = static_cast<size_t>(d - '0');
      ++i;
      // A second digit belongs to the number when that group exists ($10 with ten groups), as in ECMAScript.
      if (i + 1 < repl.size() && repl[i + 1] >= '0' && repl[i + 1] <= '9') {
        const size_t n2 = n * 10 + static_cast<size_t>(repl[i + 1] - '0');
        if (n2 < groups.size()) {
          n = n2;
          ++i;
        }
      }
      if (n > 0 && n < groups.size()) {
        out.append(groups[n]);
      } else {
        out.append(repl.substr(dollar, i + 1 - dollar));
      }
    } else {
      out.push_back(c);
    }
  }
}

Value fn_regexp_replace(const Args& a, const FunctionState& st) {
  std::string b0, b2;
  const std::string_view s = text_arg(a[0], b0), repl = text_arg(a[2], b2);
  std::shared_ptr<const re2::RE2> tmp;
  const re2::RE2& re = regex_for(a[1], st, tmp);
  const size_t ngroups = static_cast<size_t>(re.NumberOfCapturingGroups()) + 1;
  std::vector<re2::StringPiece> match(ngroups);
  std::vector<std::string_view> groups(ngroups);
  std::string out;
  size_t pos = 0;     // where the next search starts
  size_t copied = 0;  // s[0, copied) is in `out` already
  while (pos <= s.size() && re.Match(re2::StringPiece(s.data(), s.size()), pos, s.size(), re2::RE2::UNANCHORED,
                                     match.data(), static_cast<int>(ngroups))) {
    const size_t begin = static_cast<size_t>(match[0].data() - s.data());
    const size_t end = begin + match[0].size();
    for (size_t g = 0; g < ngroups; ++g)
      groups[g] = match[g].data() == nullptr ? std::string_view() : std::string_view(match[g].data(), match[g].size());
    out.append(s.substr(copied, begin - copied));
    append_replacement(out, repl, groups);
    copied = end;
    pos = end;
    if (begin == end) {
      // An empty match: copy one character (code point) and search after it, so the loop always advances.
      if (end == s.size()) break;
      size_t next = end + 1;
      while (next < s.size() && (static_cast<unsigned char>(s[next]) & 0xC0) == 0x80)
        ++next;
      out.append(s.substr(end, next - end));
      copied = pos = next;
    }
    check_string_size(out.size() + (s.size() - copied), "the result");
  }
  out.append(s.substr(copied));
  return Value(out);
}

Value fn_regexp(const Args& a, const FunctionState& st) {
  std::string b0;
  const std::string_view s = text_arg(a[0], b0);
  std::shared_ptr<const re2::RE2> tmp;
  const re2::RE2& re = regex_for(a[1], st, tmp);
  return re2::RE2::PartialMatch(re2::StringPiece(s.data(), s.size()), re);
}

Value pad_impl(const Args& a, bool left) {
  std::string b0, b2;
  const std::string_view s = text_arg(a[0], b0), pad = text_arg(a[2], b2);
  const int64_t len = int_arg(a[1], "length");
  if (len < 0) return Value();
  if (static_cast<uint64_t>(len) > kMaxStringBytes) {
    throw EvalError{"length " + std::to_string(len) + " is over the limit of " + std::to_string(kMaxStringBytes) +
                    " characters of a string"};
  }
  const std::vector<size_t> cps = code_points(s);
  const int64_t n = static_cast<int64_t>(cps.size()) - 1;
  if (len <= n) return Value(s.substr(0, cps[len]));
  if (pad.empty()) return Value();
  const std::vector<size_t> pcps = code_points(pad);
  const int64_t pn = static_cast<int64_t>(pcps.size()) - 1;
  std::string fill;
  for (int64_t i = 0; i < len - n; ++i) {
    const int64_t k = i % pn;
    fill.append(pad.substr(pcps[k], pcps[k + 1] - pcps[k]));
    if (k == 0) check_string_size(fill.size() + s.size(), "the result");  // multi-byte pad characters
  }
  check_string_size(fill.size() + s.size(), "the result");
  return Value(left ? fill + std::string(s) : std::string(s) + fill);
}
Value fn_lpad(const Args& a, const FunctionState&) {
  return pad_impl(a, true);
}
Value fn_rpad(const Args& a, const FunctionState&) {
  return pad_impl(a, false);
}

// ---- numeric functions ----

void require_number(const Value& v) {
  if (!v.is_number()) throw EvalError{"needs a number, found " + std::string(value_kind_name(v.kind()))};
}

Value fn_abs(const Args& a, const FunctionState&) {
  require_number(a[0]);
  if (a[0].is_int64()) {
    const int64_t v = a[0].as_int64();
    if (v == std::numeric_limits<int64_t>::min()) throw EvalError{"integer overflow"};
    return v < 0 ? -v : v;
  }
  if (a[0].is_double()) return std::fabs(a[0].as_double());
  const Decimal d = a[0].as_decimal();
  return make_decimal(d.unscaled() < 0 ? -d.unscaled() : d.unscaled(), d.scale(), "ABS");
}

Value fn_round(const Args& a, const FunctionState&) {
  require_number(a[0]);
  const int64_t digits = a.size() > 1 ? int_arg(a[1], "digits") : 0;
  if (digits < -38 || digits > 38) throw EvalError{"digits must be within -38..38"};
  const int32_t d = static_cast<int32_t>(digits);
  if (a[0].is_double()) {
    const double f = std::pow(10.0, d);
    return std::round(a[0].as_double() * f) / f;
  }
  const Decimal r = round_decimal(to_decimal(a[0]), d);
  if (a[0].is_int64()) return cast_value(Value(r), CastType::kBigint, std::nullopt, std::nullopt);
  return Value(r);
}

Value floor_ceil(const Args& a, bool ceil) {
  require_number(a[0]);
  if (a[0].is_int64()) return a[0];
  if (a[0].is_double()) return ceil ? std::ceil(a[0].as_double()) : std::floor(a[0].as_double());
  const Decimal d = a[0].as_decimal();
  if (d.scale() <= 0) return a[0];
  int128_t p = 1;
  for (int i = 0; i < d.scale() && i < 39; ++i)
    p *= 10;
  int128_t q = d.scale() > 38 ? 0 : d.unscaled() / p;
  const int128_t r = d.scale() > 38 ? d.unscaled() : d.unscaled() % p;
  if (ceil && r > 0) ++q;
  if (!ceil && r < 0) --q;
  return make_decimal(q, 0, ceil ? "CEIL" : "FLOOR");
}
Value fn_floor(const Args& a, const FunctionState&) {
  return floor_ceil(a, false);
}
Value fn_ceil(const Args& a, const FunctionState&) {
  return floor_ceil(a, true);
}

Value fn_mod(const Args& a, const FunctionState&) {
  return arithmetic('%', a[0], a[1], "MOD");
}

// ---- conditional ----

Value fn_nullif(const Args& a, const FunctionState&) {
  if (a[0].is_null()) return Value();
  if (a[1].is_null()) return a[0];
  return compare_values(a[0], a[1], "NULLIF") == 0 ? Value() : a[0];
}

Value fn_typeof(const Args& a, const FunctionState&) {
  return Value(value_kind_name(a[0].kind()));
}

// ---- time ----

Value fn_to_timestamp(const Args& a, const FunctionState&) {
  std::string b0, b1;
  const std::string_view s = text_arg(a[0], b0);
  const auto t = a.size() > 1 ? parse_timestamp(s, text_arg(a[1], b1)) : parse_timestamp(s);
  return t ? Value::timestamp_micros(*t) : Value();
}

Value fn_to_timestamp_ltz(const Args& a, const FunctionState&) {
  const int64_t n = int_arg(a[0], "epoch");
  const int64_t precision = a.size() > 1 ? int_arg(a[1], "precision") : 3;
  int64_t factor = 0;
  if (precision == 0) {
    factor = 1'000'000;
  } else if (precision == 3) {
    factor = 1'000;
  } else if (precision == 6) {
    factor = 1;
  } else {
    throw EvalError{"precision must be 0 (seconds), 3 (milliseconds) or 6 (microseconds), found " +
                    std::to_string(precision)};
  }
  int64_t micros = 0;
  if (__builtin_mul_overflow(n, factor, &micros)) throw EvalError{"epoch value out of range"};
  return Value::timestamp_micros(micros);
}

Value fn_date_format(const Args& a, const FunctionState&) {
  bool unparsable = false;
  const int64_t t = timestamp_arg(a[0], "the first argument", &unparsable);
  if (unparsable) return Value();
  std::string b1;
  return Value(format_timestamp(t, text_arg(a[1], b1)));
}

Value fn_unix_timestamp(const Args& a, const FunctionState&) {
  int64_t t = 0;
  if (a.size() > 1) {
    std::string b0, b1;
    const auto p = parse_timestamp(text_arg(a[0], b0), text_arg(a[1], b1));
    if (!p) return Value();
    t = *p;
  } else {
    bool unparsable = false;
    t = timestamp_arg(a[0], "the argument", &unparsable);
    if (unparsable) return Value();
  }
  int64_t secs = t / 1'000'000;
  if (t % 1'000'000 < 0) --secs;
  return secs;
}

Value fn_extract(const Args& a, const FunctionState&) {
  bool unparsable = false;
  const int64_t t = timestamp_arg(a[1], "EXTRACT's source", &unparsable);
  if (unparsable) return Value();
  const CivilTime c = to_civil(t);
  const std::string_view unit = a[0].as_string();
  if (unit == "YEAR") return c.year;
  if (unit == "QUARTER") return int64_t{(c.month - 1) / 3 + 1};
  if (unit == "MONTH") return int64_t{c.month};
  if (unit == "DAY") return int64_t{c.day};
  if (unit == "HOUR") return int64_t{c.hour};
  if (unit == "MINUTE") return int64_t{c.minute};
  if (unit == "SECOND") return int64_t{c.second};
  if (unit == "MILLISECOND") return int64_t{c.second * 1000 + c.micros / 1000};
  if (unit == "MICROSECOND") return int64_t{c.second * 1'000'000LL + c.micros};
  throw EvalError{"unknown unit " + std::string(unit)};
}

constexpr std::array kFunctions = {
    FunctionSpec{"UPPER", 1, 1, true, fn_upper},
    FunctionSpec{"LOWER", 1, 1, true, fn_lower},
    FunctionSpec{"TRIM", 1, 1, true, fn_trim},
    FunctionSpec{"LTRIM", 1, 1, true, fn_ltrim},
    FunctionSpec{"RTRIM", 1, 1, true, fn_rtrim},
    FunctionSpec{"CHAR_LENGTH", 1, 1, true, fn_char_length},
    FunctionSpec{"CHARACTER_LENGTH", 1, 1, true, fn_char_length},
    FunctionSpec{"LENGTH", 1, 1, true, fn_char_length},
    FunctionSpec{"SUBSTRING", 2, 3, true, fn_substring},
    FunctionSpec{"SUBSTR", 2, 3, true, fn_substring},
    FunctionSpec{"CONCAT", 1, -1, true, fn_concat},
    FunctionSpec{"CONCAT_WS", 2, -1, false, fn_concat_ws},
    FunctionSpec{"REPLACE", 3, 3, true, fn_replace},
    FunctionSpec{"LOCATE", 2, 3, true, fn_locate},
    FunctionSpec{"SPLIT_INDEX", 3, 3, true, fn_split_index},
    FunctionSpec{"REGEXP_REPLACE", 3, 3, true, fn_regexp_replace, 1},
    FunctionSpec{"REGEXP", 2, 2, true, fn_regexp, 1},
    FunctionSpec{"LPAD", 3, 3, true, fn_lpad},
    FunctionSpec{"RPAD", 3, 3, true, fn_rpad},
    FunctionSpec{"ABS", 1, 1, true, fn_abs},
    FunctionSpec{"ROUND", 1, 2, true, fn_round},
    FunctionSpec{"FLOOR", 1, 1, true, fn_floor},
    FunctionSpec{"CEIL", 1, 1, true, fn_ceil},
    FunctionSpec{"CEILING", 1, 1, true, fn_ceil},
    FunctionSpec{"MOD", 2, 2, true, fn_mod},
    FunctionSpec{"NULLIF", 2, 2, false, fn_nullif},
    FunctionSpec{"TYPEOF", 1, 1, false, fn_typeof},
    FunctionSpec{"TO_TIMESTAMP", 1, 2, true, fn_to_timestamp},
    FunctionSpec{"TO_TIMESTAMP_LTZ", 1, 2, true, fn_to_timestamp_ltz},
    FunctionSpec{"DATE_FORMAT", 2, 2, true, fn_date_format},
    FunctionSpec{"UNIX_TIMESTAMP", 1, 2, true, fn_unix_timestamp},
    FunctionSpec{"EXTRACT", 2, 2, true, fn_extract},
};

// Names the parser handles itself; listed for "did you mean".
constexpr std::array<std::string_view, 6> kSpecialForms = {"IF", "COALESCE", "CAST", "TRY_CAST", "POSITION", "EXTRACT"};

constexpr std::array<std::string_view, 13> kNondeterministic = {"NOW",
                                                                "CURRENT_TIMESTAMP",
                                                                "LOCALTIMESTAMP",
                                                                "LOCALTIME",
                                                                "CURRENT_DATE",
                                                                "CURRENT_TIME",
                                                                "CURRENT_ROW_TIMESTAMP",
                                                                "PROCTIME",
                                                                "RAND",
                                                                "RAND_INTEGER",
                                                                "UUID",
                                                                "RANDOM",
                                                                "SYSDATE"};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

const FunctionSpec* find_function(std::string_view upper_name) {
  for (const FunctionSpec& f : kFunctions) {
    if (f.name == upper_name) return &f;
  }
  return nullptr;
}

std::string suggest_function(std::string_view upper_name) {
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  auto consider = [&](std::string_view name) {
    const size_t d = edit_distance(upper_name, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  };
  for (const FunctionSpec& f : kFunctions)
    consider(f.name);
  for (std::string_view s : kSpecialForms)
    consider(s);
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, upper_name.size() / 3));
  return best_distance <= limit ? std::string(best) : std::string();
}

bool is_nondeterministic_function(std::string_view upper_name) {
  return std::find(kNondeterministic.begin(), kNondeterministic.end(), upper_name) != kNondeterministic.end();
}

std::shared_ptr<const re2::RE2> compile_regex(std::string_view pattern) {
  re2::RE2::Options options;
  options.set_log_errors(false);  // the error goes into the message below, not to stderr
  auto re = std::make_shared<const re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()), options);
  if (!re->ok()) {
    std::string shown(pattern.substr(0, 200));
    if (pattern.size() > 200) shown += "...";
    throw EvalError{"invalid regular expression '" + shown + "': " + re->error() +
                    " (RE2 syntax: no backreferences or lookaround; docs/expressions.md)"};
  }
  return re;
}

void check_string_size(size_t bytes, std::string_view what) {
  if (bytes > kMaxStringBytes) {
    throw EvalError{std::string(what) + " would be " + std::to_string(bytes) + " bytes or more, over the limit of " +
                    std::to_string(kMaxStringBytes) + " bytes of a string"};
  }
}

}  // namespace sluice::pipeline::detail
