// Value::from_json: JSON text to a Value with simdjson's on-demand parser, numbers kept exact where a double
// would alter them, errors with byte offset, line and column (docs/value.md).
#include <absl/container/flat_hash_map.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sluice/core/utf8.h"
#include "sluice/core/value.h"
#include "value_internals.h"

namespace sluice {

// ---------------------------------------------------------------------------------------------------------
// JSON input

namespace {

namespace od = simdjson::ondemand;

// Merges repeated keys in `f`: the first position keeps the last value (JavaScript's JSON.parse
// semantics). Moves the surviving fields, in order, to the front and returns their count.
size_t merge_duplicate_keys(std::span<Value::Object::Field> f) {
  const size_t n = f.size();
  if (n < 2) return n;
  std::vector<uint8_t> dead;
  auto merge = [&](size_t keep, size_t dup) {
    f[keep].second = std::move(f[dup].second);
    if (dead.empty()) dead.resize(n);
    dead[dup] = 1;
  };
  // Pairwise for small objects: cheaper than building a hash map for every parsed object. Keys of one object
  // mostly differ in length or in their first byte: checking those inline first keeps memcmp (a call per
  // pair of keys of equal length) off the path of every parsed object.
  if (n <= 32) {
    for (size_t i = 1; i < n; ++i) {
      const std::string& key = f[i].first;
      for (size_t j = 0; j < i; ++j) {
        const std::string& other = f[j].first;
        if (other.size() == key.size() && (key.empty() || other[0] == key[0]) && other == key) {
          merge(j, i);
          break;
        }
      }
    }
  } else {
    absl::flat_hash_map<std::string_view, size_t> first;
    first.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto [it, inserted] = first.try_emplace(f[i].first, i);
      if (!inserted) merge(it->second, i);
    }
  }
  if (dead.empty()) return n;
  size_t w = 0;
  for (size_t r = 0; r < n; ++r) {
    if (dead[r] != 0) continue;
    if (w != r) f[w] = std::move(f[r]);
    ++w;
  }
  return w;
}

// Per-thread parser, padded input copy and scratch stacks, all keeping their capacity, so parsing a stream
// of records allocates only for the Values themselves. simdjson needs SIMDJSON_PADDING readable bytes
// after the input. The stacks collect a container's children until its size is known, so each array
// and object gets one exactly sized allocation instead of a series of regrowths.
struct JsonParserState {
  od::parser parser;
  std::vector<char> buffer;
  std::vector<Value> elements;
  std::vector<Value::Object::Field> fields;

  void clear_scratch() noexcept {
    elements.clear();
    fields.clear();
  }
};

JsonParserState& json_parser_state() {
  thread_local JsonParserState state;
  return state;
}

std::string_view raw_token(od::value& v) {
  return v.raw_json_token();
}

std::string_view raw_token(od::document& d) {
  std::string_view raw;
  if (d.raw_json_token().get(raw) != simdjson::SUCCESS) return {};
  return raw;
}

// True when the digits before the exponent of a JSON number literal are not all zero.
bool nonzero_mantissa(std::string_view literal) {
  for (const char c : literal) {
    if (c == 'e' || c == 'E') return false;
    if (c >= '1' && c <= '9') return true;
  }
  return false;
}

// True when `d`, the double nearest to the JSON number `literal`, is that number exactly in the sense that
// matters for text: its shortest round-trip form has the same value as the literal. Any literal of at most
// 15 significant digits in the normal range is (DBL_DIG); longer ones are checked.
bool double_holds_literal(std::string_view literal, double d) {
  // Trailing zeros of the mantissa carry no digit of the value (1.010000000000000000e179 is 1.01e179): counting
  // them sent such a literal down the exact path, whose decimal text then read back as a double (a fuzz finding).
  int significant = 0;
  int digits = 0;
  bool leading = true;
  for (const char c : literal) {
    if (c == 'e' || c == 'E') break;
    if (c < '0' || c > '9') continue;
    if (leading && c == '0') continue;
    leading = false;
    ++digits;
    if (c != '0') significant = digits;
  }
  if (significant <= 15 && std::fabs(d) >= std::numeric_limits<double>::min()) return true;
  char buf[32];
  const auto r = fmt::format_to_n(buf, sizeof(buf), "{}", d);
  const Result<Decimal> shortest = Decimal::parse(std::string_view(buf, r.size));
  const Result<Decimal> exact = Decimal::parse(literal);
  return !shortest.ok() || !exact.ok() || Decimal::compare(*shortest, *exact) == 0;
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

Error json_error(std::string_view input, size_t offset, std::string_view reason) {
  offset = std::min(offset, input.size());
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (input[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return Error(ErrorCode::kSerialization, fmt::format("invalid JSON at byte {} (line {}, column {}): {}", offset, line,
                                                      offset - line_start + 1, reason));
}

// Converts a simdjson on-demand document into a Value. Every step returns false on failure after
// recording the error with the best location simdjson can give.
class JsonReader {
 public:
  JsonReader(std::string_view input, od::document& doc, JsonParserState& state)
      : input_(input), doc_(doc), elements_(state.elements), fields_(state.fields) {}

  bool read_root(Value& out) {
    bool scalar = false;
    if (auto e = doc_.is_scalar().get(scalar)) return fail(e);
    if (scalar) {
      od::json_type type;
      if (auto e = doc_.type().get(type)) return fail(e);
      // raw_json_token() spans the token and the whitespace after it, so anything left is trailing content.
      const std::string_view raw = raw_token(doc_);
      const size_t end = static_cast<size_t>(raw.data() + raw.size() - input_.data());
      if (!raw.empty() && end < input_.size()) return fail_at(end, "trailing content after the JSON value");
      return read_scalar(doc_, type, out);
    }
    od::value root;
    if (auto e = doc_.get_value().get(root)) return fail(e);
    if (!read(root, out, 0)) return false;
    const char* location = nullptr;
    if (doc_.current_location().get(location) == simdjson::SUCCESS) {
      return fail_at(static_cast<size_t>(location - input_.data()), "trailing content after the JSON value");
    }
    return true;
  }

  const Error& error() const { return *error_; }

 private:
  bool read(od::value v, Value& out, int depth) {
    od::json_type type;
    if (auto e = v.type().get(type)) return fail(e);
    switch (type) {
      case od::json_type::array: {
        if (depth >= kMaxValueDepth) return fail_here(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
        od::array array;
        if (auto e = v.get_array().get(array)) return fail(e);
        const size_t base = elements_.size();
        for (auto element_result : array) {
          od::value element;
          if (auto e = element_result.get(element)) return fail(e);
          Value child;  // not read in place: nested containers push onto the same stack
          if (!read(element, child, depth + 1)) return false;
          elements_.push_back(std::move(child));
        }
        Value::Array& result = ValueInternals::make_array(out);
        result.reserve(elements_.size() - base);
        std::move(elements_.begin() + static_cast<ptrdiff_t>(base), elements_.end(), std::back_inserter(result));
        elements_.resize(base);
        return true;
      }
      case od::json_type::object: {
        if (depth >= kMaxValueDepth) return fail_here(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
        od::object object;
        if (auto e = v.get_object().get(object)) return fail(e);
        const size_t base = fields_.size();
        for (auto field_result : object) {
          od::field field;
          if (auto e = std::move(field_result).get(field)) return fail(e);
          std::string_view key;  // lives in the parser's string buffer until the next document
          if (auto e = field.unescaped_key().get(key)) return fail(e);
          Value child;
          if (!read(field.value(), child, depth + 1)) return false;
          fields_.emplace_back(std::string(key), std::move(child));
        }
        const size_t live = merge_duplicate_keys(std::span(fields_).subspan(base));
        auto& result = ValueInternals::fields(ValueInternals::make_object(out));
        result.reserve(live);
        const auto first = fields_.begin() + static_cast<ptrdiff_t>(base);
        std::move(first, first + static_cast<ptrdiff_t>(live), std::back_inserter(result));
        fields_.erase(first, fields_.end());
        return true;
      }
      default:
        return read_scalar(v, type, out);
    }
  }

  template <class V>
  bool read_scalar(V& v, od::json_type type, Value& out) {
    switch (type) {
      case od::json_type::number:
        return read_number(v, out);
      case od::json_type::string: {
        std::string_view s;
        if (auto e = v.get_string().get(s)) return fail(e);
        out = Value(s);
        return true;
      }
      case od::json_type::boolean: {
        bool b = false;
        if (auto e = v.get_bool().get(b)) {
          return e == simdjson::INCORRECT_TYPE ? fail_here("invalid literal (expected true or false)") : fail(e);
        }
        out = Value(b);
        return true;
      }
      case od::json_type::null: {
        bool is_null = false;
        if (auto e = v.is_null().get(is_null)) return fail(e);
        if (!is_null) return fail_here("invalid literal (expected null)");
        out = Value();
        return true;
      }
      default:
        return fail_here("unexpected token");
    }
  }

  template <class V>
  bool read_number(V& v, Value& out) {
    const std::string_view raw = trim_right(raw_token(v));
    od::number number;
    const auto e = v.get_number().get(number);
    if (e == simdjson::SUCCESS) {
      switch (number.get_number_type()) {
        case od::number_type::signed_integer:
          out = Value(number.get_int64());
          return true;
        case od::number_type::unsigned_integer:
          out = Value(number.get_uint64());  // above INT64_MAX: a decimal, not a lossy double
          return true;
        case od::number_type::floating_point_number: {
          const double d = number.get_double();
          // A non-zero literal below the double range (1e-999) reads as ±0.0: keep it exactly as a decimal,
          // as numbers above the range are (1e400).
          if (d == 0 && nonzero_mantissa(raw)) break;
          if (!double_holds_literal(raw, d)) {
            // More digits than the double keeps (a jsonb numeric such as 12345678901234567890.123): the exact
            // decimal when it has at most 38 digits, else the double, as every JSON parser reads it.
            if (Result<Decimal> exact = Decimal::parse(raw); exact.ok()) {
              out = Value(*exact);
              return true;
            }
          }
          out = Value(d);
          return true;
        }
      }
      if (number.get_number_type() != od::number_type::floating_point_number) return fail_here("unknown number type");
    } else if (e != simdjson::NUMBER_ERROR) {
      return fail(e);
    }
    // simdjson refuses integers beyond 64 bits and numbers beyond the double range (and rounds those below it
    // to zero); keep them exactly.
    // A literal with a fraction or an exponent that simdjson refuses (a 19-digit mantissa with an exponent,
    // -1010000000000000000E+161) but that a double holds is the double, as read_number gives for the same number
    // written otherwise: else its text would change kind on a round trip (a fuzz finding).
    if (raw.find_first_of(".eE") != std::string_view::npos) {
      const std::string text(raw);
      char* end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      if (end == text.c_str() + text.size() && std::isfinite(d) && !(d == 0 && nonzero_mantissa(raw)) &&
          Decimal::parse(raw).ok() && double_holds_literal(raw, d)) {
        out = Value(d);
        return true;
      }
    }
    int128_t unscaled = 0;
    int32_t scale = 0;
    std::string reason;
    const size_t offset = raw.empty() ? input_.size() : static_cast<size_t>(raw.data() - input_.data());
    if (!value_internal::parse_decimal(raw, unscaled, scale, reason))
      return fail_at(offset, fmt::format("number {}: {}", raw, reason));
    out = Value(ValueInternals::decimal_of(unscaled, scale));
    return true;
  }

  bool fail(simdjson::error_code e) { return fail_here(simdjson::error_message(e)); }

  bool fail_here(std::string_view reason) {
    const char* location = nullptr;
    if (doc_.current_location().get(location) == simdjson::SUCCESS) {
      return fail_at(static_cast<size_t>(location - input_.data()), reason);
    }
    return fail_at(input_.size(), reason);
  }

  bool fail_at(size_t offset, std::string_view reason) {
    error_ = json_error(input_, offset, reason);
    return false;
  }

  std::string_view input_;
  od::document& doc_;
  std::vector<Value>& elements_;
  std::vector<Value::Object::Field>& fields_;
  std::optional<Error> error_;
};

}  // namespace

Result<Value> Value::from_json(std::string_view json) {
  JsonParserState& state = json_parser_state();
  state.buffer.resize(json.size() + simdjson::SIMDJSON_PADDING);
  if (!json.empty()) std::memcpy(state.buffer.data(), json.data(), json.size());
  // Zero padding: a number at the very end must not run on into stale bytes of an earlier document.
  std::memset(state.buffer.data() + json.size(), 0, simdjson::SIMDJSON_PADDING);
  const std::string_view input(state.buffer.data(), json.size());

  od::document doc;
  if (auto e = state.parser.iterate(simdjson::padded_string_view(input.data(), input.size(), state.buffer.size()))
                   .get(doc)) {
    if (e == simdjson::UTF8_ERROR) {
      return json_error(json, std::min(first_invalid_utf8(json), json.size()), "invalid UTF-8");
    }
    return Error(ErrorCode::kSerialization, fmt::format("invalid JSON: {}", simdjson::error_message(e)));
  }
  state.clear_scratch();
  JsonReader reader(input, doc, state);
  Value out;
  const bool ok = reader.read_root(out);
  state.clear_scratch();  // after a failure, children of unfinished containers are still on the stacks
  if (!ok) return reader.error();
  return out;
}
}  // namespace sluice
