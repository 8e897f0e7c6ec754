#include "sluice/core/json_mapping.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>

namespace sluice {

namespace {

template <class F>
void append_float(F d, std::string& out, bool for_display) {
  if (!std::isfinite(d)) {
    // JSON has no literal for these; null would read back as NaN for +-infinity too. Strings, as Value::to_json.
    const char* text = std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
    if (!for_display) out.push_back('"');
    out += text;
    if (!for_display) out.push_back('"');
    return;
  }
  const size_t start = out.size();
  fmt::format_to(std::back_inserter(out), "{}", d);
  // fmt drops ".0" from integral values; keep it so the text reads back as a floating-point number
  // (Value::from_json makes "3" an int64 and "3.0" a double), as Value::to_json does.
  if (out.find_first_of(".e", start) == std::string::npos) out += ".0";
}

// Appends at most kExcerptBytes of the JSON text of `v`, cut at a UTF-8 character boundary.
void append_excerpt(const Value& v, std::string& out) {
  constexpr size_t kExcerptBytes = 40;
  std::string json = v.to_json();
  if (json.size() <= kExcerptBytes) {
    out += json;
    return;
  }
  size_t cut = kExcerptBytes;
  while (cut > 0 && (static_cast<unsigned char>(json[cut]) & 0xC0) == 0x80)
    --cut;
  out.append(json, 0, cut);
  out += "...";
}

}  // namespace

void append_json_number(double d, std::string& out) {
  append_float(d, out, false);
}
void append_json_number(float f, std::string& out) {
  append_float(f, out, false);
}
void append_display_number(double d, std::string& out) {
  append_float(d, out, true);
}
void append_display_number(float f, std::string& out) {
  append_float(f, out, true);
}

namespace detail {

bool fail_kind(JsonReadError& err, std::string_view expected, const Value& actual) {
  err.path.clear();
  err.reason = fmt::format("expected {}, found {}", expected, value_kind_name(actual.kind()));
  if (!actual.is_null()) {
    err.reason.push_back(' ');
    append_excerpt(actual, err.reason);
  }
  return false;
}

bool fail_range(JsonReadError& err, const Value& actual, std::string_view type_name) {
  err.path.clear();
  err.reason.clear();
  append_excerpt(actual, err.reason);
  err.reason += fmt::format(" is out of range for {}", type_name);
  return false;
}

void prepend_key(JsonReadError& err, std::string_view key) {
  std::string segment;
  if (key.find_first_of(".[]\"\\") == std::string_view::npos && !key.empty()) {
    segment.assign(key);
    if (!err.path.empty() && err.path.front() != '[') segment.push_back('.');
  } else {
    // Value::at_path's quoted form: ["key.with.dots"], with '"' and '\' escaped.
    segment = "[\"";
    for (char c : key) {
      if (c == '"' || c == '\\') segment.push_back('\\');
      segment.push_back(c);
    }
    segment += "\"]";
    if (!err.path.empty() && err.path.front() != '[') segment.push_back('.');
  }
  err.path.insert(0, segment);
}

void prepend_index(JsonReadError& err, size_t index) {
  std::string segment = fmt::format("[{}]", index);
  if (!err.path.empty() && err.path.front() != '[') segment.push_back('.');
  err.path.insert(0, segment);
}

Error to_error(const JsonReadError& err) {
  if (err.path.empty()) return Error(ErrorCode::kSerialization, "JSON value: " + err.reason);
  return Error(ErrorCode::kSerialization, fmt::format("field '{}': {}", err.path, err.reason));
}

DecimalToInteger decimal_to_integer(const Decimal& d, int128_t& out) noexcept {
  const Decimal n = d.normalized();
  if (n.scale() > 0) return DecimalToInteger::kNotIntegral;
  int128_t v = n.unscaled();
  // Multiply by 10 per trailing zero, stopping before int128 overflows (the callers' types are at most
  // 64 bits wide, so anything that large is out of their range anyway).
  constexpr int128_t kInt128Max = (static_cast<int128_t>(INT64_MAX) << 64) | static_cast<int128_t>(UINT64_MAX);
  constexpr int128_t kLimit = kInt128Max / 10;
  for (int32_t i = 0; i < -n.scale(); ++i) {
    if (v > kLimit || v < -kLimit) return DecimalToInteger::kTooLarge;
    v *= 10;
  }
  out = v;
  return DecimalToInteger::kOk;
}

}  // namespace detail
}  // namespace sluice
