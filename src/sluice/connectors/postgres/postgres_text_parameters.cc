// How the Postgres upsert sink spells a Value as a text parameter for a column's type (append_text_parameter,
// PgColumnType, append_pg_timestamp): scalars, array literals, JSON, and the values a column would alter (bad
// records, never rounded). Pure functions; no I/O.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <utility>

#include "sluice/connectors/postgres/postgres_upsert_sink.h"
#include "sluice/core/value_json.h"

namespace sluice {

namespace {

void append_hex(std::string_view bytes, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
}

Status nul_error(std::string_view what) {
  return Error(ErrorCode::kConnector, fmt::format("{} contains a NUL byte, which Postgres text cannot hold", what));
}

// A finite decimal number's text ("-1.50e-3", "42") as its significant digits (no leading or trailing zeros) and
// the place of the point: value = ±0.<digits> × 10^point. Zero has no digits. nullopt for any other text (NaN,
// Infinity, ...).
struct DecimalDigits {
  std::string digits;
  int64_t point = 0;
  bool operator==(const DecimalDigits&) const = default;
};

std::optional<DecimalDigits> decimal_digits(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  DecimalDigits d;
  int64_t before_point = 0;
  bool seen_point = false, any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && !seen_point) {
      seen_point = true;
    } else if (c >= '0' && c <= '9') {
      any = true;
      if (d.digits.empty() && c == '0') {
        if (seen_point) --d.point;  // a leading zero after the point moves the first digit right
        continue;
      }
      d.digits.push_back(c);
      if (!seen_point) ++before_point;
    } else {
      break;
    }
  }
  if (!any) return std::nullopt;
  int64_t exponent = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    auto [end, ec] = std::from_chars(s.data() + i + 1 + (i + 1 < s.size() && s[i + 1] == '+' ? 1 : 0),
                                     s.data() + s.size(), exponent);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  } else if (i != s.size()) {
    return std::nullopt;
  }
  while (!d.digits.empty() && d.digits.back() == '0')
    d.digits.pop_back();
  if (d.digits.empty()) return DecimalDigits{};
  d.point += before_point + exponent;
  return d;
}

// The shortest text of `text` read as a float (F = float) or double, as Postgres prints it back; nullopt when it is
// out of the type's range (Postgres refuses it itself).
template <class F>
std::optional<std::string> float_round_trip(std::string_view text) {
  F f{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), f);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(f)) return std::nullopt;
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, r.ptr);
}

// Refuses a scalar `v` (already spelled as `text`) that a column of `type` would alter without an error.
Status check_exact(const Value& v, const postgres::PgColumnType& type, std::string_view text) {
  using Base = postgres::PgColumnType::Base;
  const bool number = v.is_int64() || v.is_double() || v.is_decimal();
  if (number && (type.base == Base::kFloat4 || type.base == Base::kFloat8)) {
    const bool f4 = type.base == Base::kFloat4;
    const std::optional<DecimalDigits> want = decimal_digits(text);
    if (!want) return ok_status();  // NaN, Infinity: both types hold them
    const std::optional<std::string> stored = f4 ? float_round_trip<float>(text) : float_round_trip<double>(text);
    if (!stored) return ok_status();  // out of range: Postgres refuses it (22003)
    // Exact when Postgres prints back the same number (a float4 value read as the double of its text, 0.1, stays
    // 0.1), or, for a double, when its binary value is a float's (float4's largest, 3.4028234663852886e+38).
    const bool binary_exact =
        f4 && v.is_double() && static_cast<double>(static_cast<float>(v.as_double())) == v.as_double();
    if (!binary_exact && decimal_digits(*stored) != want) {
      return Error(ErrorCode::kConnector,
                   fmt::format("{} {} has no exact {} value: Postgres would store {}", value_kind_name(v.kind()), text,
                               f4 ? "float4 (real)" : "float8 (double precision)", *stored));
    }
    return ok_status();
  }
  if (number && type.base == Base::kNumeric && type.numeric_constrained) {
    const std::optional<DecimalDigits> d = decimal_digits(text);
    if (d && static_cast<int64_t>(d->digits.size()) - d->point > type.numeric_scale) {
      return Error(ErrorCode::kConnector,
                   fmt::format("{} {} has more decimal places than the column's numeric scale {}: Postgres would "
                               "round it",
                               value_kind_name(v.kind()), text, type.numeric_scale));
    }
    return ok_status();
  }
  if (v.is_timestamp() && !is_infinite_timestamp(v.as_timestamp_micros())) {
    const int64_t micros = v.as_timestamp_micros();
    if (type.base == Base::kDate && micros % 86'400'000'000 != 0) {
      return Error(ErrorCode::kConnector,
                   fmt::format("timestamp {} has a time of day, which a date column would drop", text));
    }
    if (type.base == Base::kTimestamp && type.timestamp_precision < 6) {
      int64_t unit = 1;
      for (int i = type.timestamp_precision; i < 6; ++i)
        unit *= 10;
      if (micros % unit != 0) {
        return Error(ErrorCode::kConnector,
                     fmt::format("timestamp {} has more fractional digits than the column's precision {}: Postgres "
                                 "would round it",
                                 text, type.timestamp_precision));
      }
    }
  }
  return ok_status();
}

Status append_scalar(const Value& v, const postgres::PgColumnType& type, std::string& out);

// `array` at `depth` (1: the outermost) as a Postgres array literal: every non-null element double-quoted with '"'
// and '\' escaped, so commas, braces, spaces, quotes and the text NULL stay text; NULL only for a null element.
Status append_array_literal(const Value& array, const postgres::PgColumnType& type, int depth, std::string& out) {
  using Base = postgres::PgColumnType::Base;
  out.push_back('{');
  bool first = true;
  std::string element;
  for (const Value& e : array.as_array()) {
    if (!first) out.push_back(',');
    first = false;
    if (e.is_null()) {
      out += "NULL";
    } else if (e.is_array() && (type.base != Base::kJson || depth < type.dimensions)) {
      SLUICE_RETURN_IF_ERROR(append_array_literal(e, type, depth + 1, out));
    } else {
      element.clear();
      SLUICE_RETURN_IF_ERROR(append_scalar(e, type, element));
      out.push_back('"');
      for (char c : element) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
      }
      out.push_back('"');
    }
  }
  out.push_back('}');
  return ok_status();
}

// One value of a column (or array element) of `type`, not null.
Status append_scalar(const Value& v, const postgres::PgColumnType& type, std::string& out) {
  using Base = postgres::PgColumnType::Base;
  if (type.base == Base::kJson) {
    v.write_json(out);  // NaN, ±Infinity, bytes and timestamps as Value::to_json writes them (docs/value.md)
    return ok_status();
  }
  const size_t start = out.size();
  switch (v.kind()) {
    case Value::Kind::kNull:
      return Error(ErrorCode::kInternal, "append_text_parameter: null has no text parameter");
    case Value::Kind::kBool:
      out.push_back(v.as_bool() ? 't' : 'f');
      return ok_status();
    case Value::Kind::kInt64:
      out += std::to_string(v.as_int64());
      break;
    case Value::Kind::kDouble: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        char buf[64];
        auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
        out.append(buf, end);
      }
      break;
    }
    case Value::Kind::kDecimal:
      v.as_decimal().append_to(out);
      break;
    case Value::Kind::kString: {
      const std::string_view s = v.as_string();
      if (s.find('\0') != std::string_view::npos) return nul_error("a string");
      out += s;
      return ok_status();
    }
    case Value::Kind::kBytes:
      append_hex(v.as_bytes(), out);
      return ok_status();
    case Value::Kind::kTimestamp:
      postgres::append_pg_timestamp(v.as_timestamp_micros(), out);
      break;
    case Value::Kind::kArray:
      if (type.array) return append_array_literal(v, type, 1, out);
      v.write_json(out);
      return ok_status();
    case Value::Kind::kObject:
      v.write_json(out);
      return ok_status();
  }
  return check_exact(v, type, std::string_view(out).substr(start));
}

}  // namespace

namespace postgres {

void append_pg_timestamp(int64_t micros, std::string& out) {
  // ISO-8601 as Value writes it, except where Postgres reads it differently: it refuses the signed years of
  // ISO-8601's extended form ("+10000-...", "-0001-...": "time zone displacement out of range"), and counts
  // years BC (year 0 of ISO-8601 is 1 BC). The infinities are "infinity"/"-infinity" in both.
  std::string iso;
  append_iso8601_micros(micros, iso);
  if (is_infinite_timestamp(micros) || (iso[0] != '+' && iso[0] != '-' && !iso.starts_with("0000-"))) {
    out += iso;
    return;
  }
  if (iso[0] == '+') {
    out.append(iso, 1);
    return;
  }
  const bool negative = iso[0] == '-';
  const size_t year_end = iso.find('-', 1);
  int64_t year = 0;
  std::from_chars(iso.data() + (negative ? 1 : 0), iso.data() + year_end, year);
  fmt::format_to(std::back_inserter(out), "{:04}{} BC", (negative ? year : -year) + 1, iso.substr(year_end));
}

PgColumnType PgColumnType::from_catalog(std::string_view type_name, int typmod, bool array, int dimensions) {
  PgColumnType t;
  t.array = array;
  t.dimensions = std::max(1, dimensions);
  if (type_name == "json" || type_name == "jsonb") {
    t.base = Base::kJson;
  } else if (type_name == "numeric") {
    t.base = Base::kNumeric;
    if (typmod >= 4) {  // ((precision << 16) | scale) + VARHDRSZ; the scale is an 11-bit signed field (PG 15)
      t.numeric_constrained = true;
      t.numeric_scale = (((typmod - 4) & 0x7ff) ^ 1024) - 1024;
    }
  } else if (type_name == "float4") {
    t.base = Base::kFloat4;
  } else if (type_name == "float8") {
    t.base = Base::kFloat8;
  } else if (type_name == "date") {
    t.base = Base::kDate;
  } else if (type_name == "timestamp" || type_name == "timestamptz") {
    t.base = Base::kTimestamp;
    if (typmod >= 0 && typmod < 6) t.timestamp_precision = typmod;
  }
  return t;
}

Status append_text_parameter(const Value& v, const PgColumnType& type, std::string& out) {
  if (v.is_null()) return Error(ErrorCode::kInternal, "append_text_parameter: null has no text parameter");
  if (type.array && v.is_array()) return append_array_literal(v, type, 1, out);
  return append_scalar(v, type, out);
}

Status append_text_parameter(const Value& v, bool array_column, std::string& out) {
  PgColumnType type;
  type.array = array_column;
  return append_text_parameter(v, type, out);
}

}  // namespace postgres
}  // namespace sluice
