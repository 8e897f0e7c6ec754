// Value to JSON text: to_json, write_json with its options (value_json.h), JSON strings, base64 bytes and
// ISO-8601 timestamps (docs/value.md).
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <ostream>
#include <string>

#include "sluice/core/utf8.h"
#include "sluice/core/value.h"
#include "sluice/core/value_json.h"
#include "value_internals.h"

namespace sluice {

// ---------------------------------------------------------------------------------------------------------
// JSON output

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

void append_escaped_ascii(unsigned char c, std::string& out) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      out += "\\u00";
      out.push_back(kHexDigits[c >> 4]);
      out.push_back(kHexDigits[c & 0xF]);
      break;
  }
}

// Writes the `width` low decimal digits of `v` at p, zero-padded.
void put_fixed_digits(char* p, uint64_t v, int width) {
  for (int i = width - 1; i >= 0; --i) {
    p[i] = static_cast<char>('0' + v % 10);
    v /= 10;
  }
}

// Byte classes for the JSON string writer: copied as is, escaped, or the lead of a multi-byte sequence.
enum class ByteClass : uint8_t { kPlain, kEscape, kNonAscii };

constexpr std::array<ByteClass, 256> kByteClasses = [] {
  std::array<ByteClass, 256> t{};
  for (size_t c = 0; c < 256; ++c) {
    if (c < 0x20 || c == '"' || c == '\\') {
      t[c] = ByteClass::kEscape;
    } else if (c >= 0x80) {
      t[c] = ByteClass::kNonAscii;
    } else {
      t[c] = ByteClass::kPlain;
    }
  }
  return t;
}();

void append_base64(std::string_view in, std::string& out) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t w = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out.push_back(kAlphabet[(w >> 18) & 63]);
    out.push_back(kAlphabet[(w >> 12) & 63]);
    out.push_back(kAlphabet[(w >> 6) & 63]);
    out.push_back(kAlphabet[w & 63]);
  }
  const size_t rest = in.size() - i;
  if (rest == 0) return;
  uint32_t w = uint32_t{p[i]} << 16;
  if (rest == 2) w |= uint32_t{p[i + 1]} << 8;
  out.push_back(kAlphabet[(w >> 18) & 63]);
  out.push_back(kAlphabet[(w >> 12) & 63]);
  out.push_back(rest == 2 ? kAlphabet[(w >> 6) & 63] : '=');
  out.push_back('=');
}

// NaN and ±infinity have no JSON number: they are written as the strings Postgres, Debezium and Flink's JSON
// format use ("NaN", "Infinity", "-Infinity"), or as null / an error when the caller asks (JsonWriteOptions).
// Returns false for kFail.
bool write_json_double(double d, std::string& out, NonFiniteFloats non_finite) {
  if (!std::isfinite(d)) {
    switch (non_finite) {
      case NonFiniteFloats::kString:
        out += std::isnan(d) ? "\"NaN\"" : d > 0 ? "\"Infinity\"" : "\"-Infinity\"";
        return true;
      case NonFiniteFloats::kNull:
        out += "null";
        return true;
      case NonFiniteFloats::kFail:
        return false;
    }
  }
  const size_t start = out.size();
  fmt::format_to(std::back_inserter(out), "{}", d);
  // fmt prints the shortest round-trip form, which drops ".0" from integral values; keep a marker so the
  // number parses back as a double rather than an int64.
  if (out.find_first_of(".e", start) == std::string::npos) out += ".0";
  return true;
}

// Writes `v`; returns the first non-finite double met under NonFiniteFloats::kFail (nullptr: none).
const Value* write_json_value(const Value& v, std::string& out, NonFiniteFloats non_finite) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kNull:
      out += "null";
      break;
    case K::kBool:
      out += ValueInternals::bool_of(v) ? "true" : "false";
      break;
    case K::kInt64: {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof(buf), ValueInternals::int_of(v));
      out.append(buf, r.ptr);
      break;
    }
    case K::kDouble:
      if (!write_json_double(ValueInternals::double_of(v), out, non_finite)) return &v;
      break;
    case K::kDecimal:
      ValueInternals::decimal(v).append_to(out);
      break;
    case K::kString:
      append_json_string(ValueInternals::payload(v), out);
      break;
    case K::kBytes:
      out.push_back('"');
      append_base64(ValueInternals::payload(v), out);
      out.push_back('"');
      break;
    case K::kTimestamp:
      out.push_back('"');
      append_iso8601_micros(ValueInternals::int_of(v), out);
      out.push_back('"');
      break;
    case K::kArray: {
      out.push_back('[');
      bool first = true;
      for (const Value& e : ValueInternals::array_of(v)) {
        if (!first) out.push_back(',');
        first = false;
        if (const Value* bad = write_json_value(e, out, non_finite)) return bad;
      }
      out.push_back(']');
      break;
    }
    case K::kObject: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, value] : ValueInternals::object_of(v)) {
        if (!first) out.push_back(',');
        first = false;
        append_json_string(key, out);
        out.push_back(':');
        if (const Value* bad = write_json_value(value, out, non_finite)) return bad;
      }
      out.push_back('}');
      break;
    }
  }
  return nullptr;
}

}  // namespace

// One pass that escapes and validates together: most strings are short, where a separate SIMD validation
// call costs more than it saves.
void append_json_string(std::string_view s, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  // Eight bytes at a time while none is a control character, '"', '\\' or non-ASCII (the classic
  // "has a byte less than / equal to" word tricks; a hit is re-checked byte by byte below).
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHighs = 0x8080808080808080ULL;
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, p + i, sizeof(w));
    const uint64_t quote = w ^ (kOnes * '"');
    const uint64_t backslash = w ^ (kOnes * '\\');
    const uint64_t special = ((w - kOnes * 0x20) | (quote - kOnes) | (backslash - kOnes) | w) & kHighs;
    if (special != 0) break;
    i += 8;
  }
  while (i < n && kByteClasses[p[i]] == ByteClass::kPlain)
    ++i;
  if (i == n) {  // nothing to escape or check (most keys and values): one copy, quotes included
    const size_t old = out.size();
    out.resize(old + n + 2);
    char* d = out.data() + old;
    d[0] = '"';
    if (n != 0) std::memcpy(d + 1, s.data(), n);
    d[n + 1] = '"';
    return;
  }
  out.push_back('"');
  size_t run = 0;
  while (i < n) {
    const ByteClass cls = kByteClasses[p[i]];
    if (cls == ByteClass::kPlain) {
      ++i;
      continue;
    }
    if (cls == ByteClass::kNonAscii) {
      if (const size_t len = utf8_sequence_length(p + i, n - i); len != 0) {
        i += len;
        continue;
      }
    }
    out.append(s.data() + run, i - run);
    if (cls == ByteClass::kEscape) {
      append_escaped_ascii(p[i], out);
    } else {
      // RFC 8259 §8.1 requires UTF-8; each invalid byte becomes U+FFFD so the output stays valid JSON.
      out += "\xEF\xBF\xBD";
    }
    run = ++i;
  }
  out.append(s.data() + run, n - run);
  out.push_back('"');
}

void append_iso8601_micros(int64_t micros, std::string& out) {
  // The two ends of the range are Postgres' own infinities (its timestamps use INT64_MAX/MIN the same way);
  // a finite date there would look plausible and be wrong.
  if (micros == kTimestampInfinity) {
    out += "infinity";
    return;
  }
  if (micros == kTimestampMinusInfinity) {
    out += "-infinity";
    return;
  }
  constexpr int64_t kMicrosPerDay = 86'400'000'000;
  int64_t days = micros / kMicrosPerDay;
  int64_t rem = micros % kMicrosPerDay;
  if (rem < 0) {
    rem += kMicrosPerDay;
    --days;
  }
  // civil_from_days from Howard Hinnant's "chrono-Compatible Low-Level Date Algorithms"; exact for the
  // whole int64 microsecond range, unlike std::chrono::year (limited to ±32767).
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);

  // Written digit by digit: fmt's run-time format strings cost about 2,500 instructions per timestamp
  // (callgrind of a CDC pipeline, several timestamps per event); this is under 200.
  if (year >= 0 && year <= 9999) {
    char y[4];
    put_fixed_digits(y, static_cast<uint64_t>(year), 4);
    out.append(y, sizeof(y));
  } else if (year < 0) {
    fmt::format_to(std::back_inserter(out), "-{:04}", -year);
  } else {
    fmt::format_to(std::back_inserter(out), "+{}", year);
  }
  const int64_t secs = rem / 1'000'000;
  char rest[] = "-MM-DDTHH:MM:SS.ffffffZ";
  put_fixed_digits(rest + 1, static_cast<uint64_t>(month), 2);
  put_fixed_digits(rest + 4, static_cast<uint64_t>(day), 2);
  put_fixed_digits(rest + 7, static_cast<uint64_t>(secs / 3600), 2);
  put_fixed_digits(rest + 10, static_cast<uint64_t>(secs / 60 % 60), 2);
  put_fixed_digits(rest + 13, static_cast<uint64_t>(secs % 60), 2);
  put_fixed_digits(rest + 16, static_cast<uint64_t>(rem % 1'000'000), 6);
  out.append(rest, sizeof(rest) - 1);
}

std::string Value::to_json() const {
  std::string out;
  write_json_value(*this, out, NonFiniteFloats::kString);
  return out;
}

Status write_json(const Value& value, std::string& out, const JsonWriteOptions& options) {
  const size_t start = out.size();
  if (const Value* bad = write_json_value(value, out, options.non_finite_floats)) {
    out.resize(start);
    return Error(ErrorCode::kSerialization, fmt::format("double {} has no JSON number (non-finite floats: fail)",
                                                        ValueInternals::double_of(*bad)));
  }
  return ok_status();
}

void Value::write_json(std::string& out) const {
  write_json_value(*this, out, NonFiniteFloats::kString);
}

std::ostream& operator<<(std::ostream& os, const Value& value) {
  return os << value.to_json();
}
}  // namespace sluice
