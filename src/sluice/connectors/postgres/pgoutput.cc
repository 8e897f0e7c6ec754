#include "sluice/connectors/postgres/pgoutput.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "sluice/core/utf8.h"
#include "sluice/core/value_json.h"

namespace sluice::postgres {

namespace {

Error value_error(std::string message) {
  return Error(ErrorCode::kSerialization, std::move(message));
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

Result<Value> decode_int(std::string_view text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
    return value_error(fmt::format("integer \"{}\" is not a 64-bit integer", text));
  }
  return Value(v);
}

Result<Value> decode_float(std::string_view text) {
  if (text == "NaN") return Value(std::numeric_limits<double>::quiet_NaN());
  if (text == "Infinity") return Value(std::numeric_limits<double>::infinity());
  if (text == "-Infinity") return Value(-std::numeric_limits<double>::infinity());
  std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) {
    return value_error(fmt::format("floating-point value \"{}\" cannot be parsed", text));
  }
  // Postgres never prints a float beyond the double range (float4 and float8 both fit); should such text
  // come anyway, an overflow to infinity or an underflow to zero would alter it.
  if (errno == ERANGE && (std::isinf(d) || d == 0)) {
    return value_error(fmt::format("floating-point value \"{}\" is outside the range of a double", text));
  }
  return Value(d);
}

Result<Value> decode_numeric(std::string_view text) {
  // Sluice decimals are finite; a double holds these three exactly (the value, not a rounding of it), and
  // writes them as Postgres prints them ("NaN", "Infinity", "-Infinity").
  if (text == "NaN") return Value(std::numeric_limits<double>::quiet_NaN());
  if (text == "Infinity") return Value(std::numeric_limits<double>::infinity());
  if (text == "-Infinity") return Value(-std::numeric_limits<double>::infinity());
  auto d = Decimal::parse(text);
  if (!d) {
    return value_error(
        fmt::format("numeric {} cannot be represented as a decimal ({}); at most {} significant "
                    "digits are supported",
                    text, d.error().message(), Decimal::kMaxPrecision));
  }
  return Value(*d);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<Value> decode_bytea(std::string_view text) {
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) {
    return value_error("bytea value is not in hex output form (\\x...): set bytea_output = hex");
  }
  std::string out;
  out.resize((text.size() - 2) / 2);
  for (size_t i = 2, o = 0; i < text.size(); i += 2, ++o) {
    const int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
    if (hi < 0 || lo < 0) {
      return value_error(fmt::format("bytea value has a bad hex digit at character {}", hi < 0 ? i : i + 1));
    }
    out[o] = static_cast<char>((hi << 4) | lo);
  }
  return Value::bytes(out);
}

// Reads an unsigned decimal number of at least `min_digits` (and at most `max_digits`) digits at text[pos].
bool read_digits(std::string_view text, size_t& pos, size_t min_digits, size_t max_digits, int64_t& out) {
  size_t n = 0;
  int64_t v = 0;
  while (pos < text.size() && n < max_digits && text[pos] >= '0' && text[pos] <= '9') {
    v = v * 10 + (text[pos] - '0');
    ++pos;
    ++n;
  }
  out = v;
  return n >= min_digits;
}

bool expect_char(std::string_view text, size_t& pos, char c) {
  if (pos < text.size() && text[pos] == c) {
    ++pos;
    return true;
  }
  return false;
}

constexpr int64_t kMicrosPerDay = 86'400'000'000LL;

// Sluice timestamps are int64 µs since 1970 with INT64_MAX / INT64_MIN reserved for ±infinity; Postgres counts
// from 2000 (and dates in days), so its last 30 years of timestamps (294247-01-10T04:00:54.775807Z to 294276
// AD) and dates after that do not fit. Such values are errors, never wrapped around.
Result<Value> checked_timestamp(std::string_view type, std::string_view text, int64_t days, int64_t micros_of_day) {
  int64_t us = 0;
  if (__builtin_mul_overflow(days, kMicrosPerDay, &us) || __builtin_add_overflow(us, micros_of_day, &us) ||
      is_infinite_timestamp(us)) {
    return value_error(
        fmt::format("{} \"{}\" is outside the range of a Sluice timestamp (microseconds since 1970 in 64 bits: "
                    "-290308-12-21T19:59:05.224193Z to 294247-01-10T04:00:54.775806Z)",
                    type, text));
  }
  return Value::timestamp_micros(us);
}

// Parses "YYYY-MM-DD" (4+ digit year) at text[pos]; returns days since the epoch (year not yet BC-adjusted).
bool read_date(std::string_view text, size_t& pos, int64_t& year, int64_t& month, int64_t& day) {
  return read_digits(text, pos, 4, 9, year) && expect_char(text, pos, '-') && read_digits(text, pos, 2, 2, month) &&
         expect_char(text, pos, '-') && read_digits(text, pos, 2, 2, day) && month >= 1 && month <= 12 && day >= 1 &&
         day <= 31;
}

bool strip_bc(std::string_view& text) {
  constexpr std::string_view kBc = " BC";
  if (text.size() > kBc.size() && text.substr(text.size() - kBc.size()) == kBc) {
    text.remove_suffix(kBc.size());
    return true;
  }
  return false;
}

Result<Value> decode_date(std::string_view text) {
  if (text == "infinity") return Value::timestamp_micros(kTimestampInfinity);
  if (text == "-infinity") return Value::timestamp_micros(kTimestampMinusInfinity);
  std::string_view t = text;
  const bool bc = strip_bc(t);
  size_t pos = 0;
  int64_t y = 0, m = 0, d = 0;
  if (!read_date(t, pos, y, m, d) || pos != t.size()) {
    return value_error(fmt::format("date \"{}\" is not in ISO form (YYYY-MM-DD): set DateStyle = ISO", text));
  }
  if (bc) y = 1 - y;
  return checked_timestamp("date", text, days_from_civil(y, static_cast<unsigned>(m), static_cast<unsigned>(d)), 0);
}

// timestamp and timestamptz: "YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]".
Result<Value> decode_timestamp(std::string_view text, bool with_zone) {
  if (text == "infinity") return Value::timestamp_micros(kTimestampInfinity);
  if (text == "-infinity") return Value::timestamp_micros(kTimestampMinusInfinity);
  std::string_view t = text;
  const bool bc = strip_bc(t);
  size_t pos = 0;
  int64_t y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  auto bad = [&] {
    return value_error(
        fmt::format("{} \"{}\" is not in ISO form (YYYY-MM-DD HH:MM:SS[.ffffff]{}): set "
                    "DateStyle = ISO",
                    with_zone ? "timestamptz" : "timestamp", text, with_zone ? "+HH[:MM]" : ""));
  };
  if (!read_date(t, pos, y, mo, d) || !expect_char(t, pos, ' ') || !read_digits(t, pos, 2, 2, h) ||
      !expect_char(t, pos, ':') || !read_digits(t, pos, 2, 2, mi) || !expect_char(t, pos, ':') ||
      !read_digits(t, pos, 2, 2, s)) {
    return bad();
  }
  int64_t frac = 0;
  if (expect_char(t, pos, '.')) {
    size_t n = 0;
    while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') {
      if (n < 6) frac = frac * 10 + (t[pos] - '0');
      ++pos;
      ++n;
    }
    if (n == 0) return bad();
    for (; n < 6; ++n)
      frac *= 10;
  }
  int64_t offset_s = 0;
  if (with_zone) {
    if (pos >= t.size() || (t[pos] != '+' && t[pos] != '-')) return bad();
    const int sign = t[pos] == '-' ? -1 : 1;
    ++pos;
    int64_t oh = 0, om = 0, os = 0;
    if (!read_digits(t, pos, 2, 2, oh)) return bad();
    if (expect_char(t, pos, ':')) {
      if (!read_digits(t, pos, 2, 2, om)) return bad();
      if (expect_char(t, pos, ':') && !read_digits(t, pos, 2, 2, os)) return bad();
    }
    offset_s = sign * (oh * 3600 + om * 60 + os);
  }
  if (pos != t.size() || h > 24 || mi > 59 || s > 60) return bad();
  if (bc) y = 1 - y;
  const int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  // Small terms (|x| < 2 days in µs): only the day count can overflow.
  return checked_timestamp(with_zone ? "timestamptz" : "timestamp", text, days,
                           (h * 3600 + mi * 60 + s - offset_s) * 1'000'000 + frac);
}

// Array literals: {a,b,"c d",NULL,{nested}} with an optional "[l:u]=" dimension prefix.
class ArrayParser {
 public:
  ArrayParser(std::string_view text, uint32_t element_oid) : text_(text), element_oid_(element_oid) {}

  Result<Value> parse() {
    if (!text_.empty() && text_[0] == '[') {
      const size_t eq = text_.find('=');
      if (eq == std::string_view::npos) return bad("a dimension prefix without '='");
      pos_ = eq + 1;
    }
    auto v = parse_array(0);
    if (!v) return v;
    if (pos_ != text_.size()) return bad("text after the closing brace");
    return v;
  }

 private:
  Error bad(std::string_view what) const {
    return value_error(fmt::format("array literal \"{}\" is malformed at character {}: {}", text_, pos_, what));
  }

  Result<Value> parse_array(int depth) {
    if (depth > 6) return bad("more than 6 dimensions");
    if (pos_ >= text_.size() || text_[pos_] != '{') return bad("expected '{'");
    ++pos_;
    Value out = Value::array();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return out;
    }
    for (;;) {
      if (pos_ >= text_.size()) return bad("unterminated array");
      if (text_[pos_] == '{') {
        auto inner = parse_array(depth + 1);
        if (!inner) return inner;
        out.push_back(std::move(*inner));
      } else {
        auto el = parse_element();
        if (!el) return el;
        out.push_back(std::move(*el));
      }
      if (pos_ >= text_.size()) return bad("unterminated array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        return out;
      }
      return bad("expected ',' or '}'");
    }
  }

  Result<Value> parse_element() {
    std::string s;
    if (text_[pos_] == '"') {
      ++pos_;
      for (;;) {
        if (pos_ >= text_.size()) return bad("unterminated quoted element");
        const char c = text_[pos_++];
        if (c == '"') break;
        if (c == '\\') {
          if (pos_ >= text_.size()) return bad("backslash at the end");
          s.push_back(text_[pos_++]);
        } else {
          s.push_back(c);
        }
      }
    } else {
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '}') {
        if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
        ++pos_;
      }
      std::string_view raw = text_.substr(start, pos_ - start);
      if (iequals(raw, "NULL")) return Value();
      if (raw.empty()) return bad("empty element");
      s.reserve(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size()) ++i;
        s.push_back(raw[i]);
      }
    }
    auto v = decode_text_value(element_oid_, s);
    if (!v) return Error(v.error().code(), fmt::format("array element: {}", v.error().message()));
    return v;
  }

  std::string_view text_;
  uint32_t element_oid_;
  size_t pos_ = 0;
};

// ------------------------------------------------------------------------------------------------------
// Message reader

class ByteReader {
 public:
  ByteReader(std::string_view bytes, char type) : b_(bytes), type_(type) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }

  Error truncated(size_t need, std::string_view what) const {
    return Error(ErrorCode::kConnector,
                 fmt::format("pgoutput: malformed '{}' message: truncated at byte {} (need {} bytes for {}, {} left)",
                             type_, pos_, need, what, remaining()));
  }
  Error malformed(std::string_view what) const {
    return Error(ErrorCode::kConnector,
                 fmt::format("pgoutput: malformed '{}' message at byte {}: {}", type_, pos_, what));
  }

  template <class U>
  Result<U> read_int(std::string_view what) {
    if (remaining() < sizeof(U)) return truncated(sizeof(U), what);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(U); ++i)
      v = (v << 8) | static_cast<uint8_t>(b_[pos_ + i]);
    pos_ += sizeof(U);
    return static_cast<U>(v);
  }
  Result<std::string> read_cstring(std::string_view what) {
    const size_t end = b_.find('\0', pos_);
    if (end == std::string_view::npos) return malformed(fmt::format("{} is not NUL-terminated", what));
    std::string s(b_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  Result<std::string_view> read_bytes(size_t n, std::string_view what) {
    if (remaining() < n) return truncated(n, what);
    std::string_view s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::string_view b_;
  char type_;
  size_t pos_ = 1;  // after the type byte
};

#define PG_TRY(var, expr)               \
  auto var##_r = (expr);                \
  if (!var##_r) return var##_r.error(); \
  auto var = std::move(*var##_r)

/// One decoded tuple: per column, kind 'n', 'u' or 't' and its value.
struct Tuple {
  std::vector<char> kinds;
  std::vector<Value> values;
};

Result<Tuple> read_tuple(ByteReader& r, const PgRelation& rel) {
  PG_TRY(ncols, r.read_int<int16_t>("the column count"));
  if (ncols < 0 || static_cast<size_t>(ncols) > rel.columns.size()) {
    return r.malformed(
        fmt::format("tuple has {} columns, relation {} has {}", ncols, rel.qualified_name(), rel.columns.size()));
  }
  Tuple t;
  t.kinds.resize(rel.columns.size(), 'n');
  t.values.resize(rel.columns.size());
  std::optional<Error> value_err;
  for (int i = 0; i < ncols; ++i) {
    PG_TRY(kind, r.read_int<uint8_t>("a column kind"));
    const auto k = static_cast<char>(kind);
    const PgColumn& col = rel.columns[static_cast<size_t>(i)];
    t.kinds[static_cast<size_t>(i)] = k;
    if (k == 'n') continue;
    if (k == 'u') {
      t.values[static_cast<size_t>(i)] = unchanged_toast_marker();
      continue;
    }
    if (k == 't' || k == 'b') {
      PG_TRY(len, r.read_int<int32_t>("a column length"));
      if (len < 0) return r.malformed(fmt::format("column {} has a negative length {}", col.name, len));
      PG_TRY(data, r.read_bytes(static_cast<size_t>(len), "a column value"));
      if (k == 'b') {
        if (!value_err) {
          value_err = value_error(fmt::format("table {}: column {}: binary-format values are not supported",
                                              rel.qualified_name(), col.name));
        }
        continue;
      }
      auto v = decode_text_value(col.type_oid, data);
      if (!v) {
        // Keep reading the message to its end (so protocol errors still win), report the first value error.
        if (!value_err) {
          value_err = value_error(fmt::format("table {}: column {} (type oid {}): {}", rel.qualified_name(), col.name,
                                              col.type_oid, v.error().message()));
        }
        continue;
      }
      t.values[static_cast<size_t>(i)] = std::move(*v);
      continue;
    }
    return r.malformed(fmt::format("unknown column kind '{}' (0x{:02x}) for column {}", std::isprint(kind) ? k : '?',
                                   static_cast<unsigned>(kind), col.name));
  }
  if (value_err) return *value_err;
  return t;
}

// Both take the tuple's values by move: a row is built once per change, and copying each decoded column again
// cost as much as decoding it.
Value row_object(const PgRelation& rel, Tuple&& t) {
  Value row = Value::object();
  row.as_object().reserve(rel.columns.size());
  for (size_t i = 0; i < rel.columns.size(); ++i)
    row.set(rel.columns[i].name, std::move(t.values[i]));
  return row;
}

// Only the identity columns of a 'K' tuple (the others are sent as nulls and mean nothing).
Value identity_object(const PgRelation& rel, Tuple&& t) {
  Value row = Value::object();
  for (size_t i = 0; i < rel.columns.size(); ++i) {
    if (rel.columns[i].part_of_identity) row.set(rel.columns[i].name, std::move(t.values[i]));
  }
  return row;
}

Value key_of(const PgRelation& rel, const Value& row) {
  if (rel.key_columns.empty()) return row;
  Value key = Value::object();
  for (const auto& c : rel.key_columns) {
    const Value* v = row.find(c);
    key.set(c, v != nullptr ? *v : Value());
  }
  return key;
}

Result<const PgRelation*> row_relation(ByteReader& r, const std::map<uint32_t, std::unique_ptr<PgRelation>>& rels) {
  PG_TRY(relid, r.read_int<uint32_t>("the relation OID"));
  auto it = rels.find(relid);
  if (it == rels.end()) {
    return r.malformed(fmt::format("a row of relation OID {} that no Relation message described", relid));
  }
  return it->second.get();
}

}  // namespace

// ------------------------------------------------------------------------------------------------------

std::string format_lsn(Lsn lsn) {
  return fmt::format("{:X}/{:X}", static_cast<uint32_t>(lsn >> 32), static_cast<uint32_t>(lsn));
}

Result<Lsn> parse_lsn(std::string_view text) {
  const size_t slash = text.find('/');
  auto bad = [&] { return Error(ErrorCode::kConfiguration, fmt::format("\"{}\" is not an LSN (X/Y in hex)", text)); };
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == text.size()) return bad();
  uint32_t hi = 0, lo = 0;
  auto [p1, e1] = std::from_chars(text.data(), text.data() + slash, hi, 16);
  auto [p2, e2] = std::from_chars(text.data() + slash + 1, text.data() + text.size(), lo, 16);
  if (e1 != std::errc() || p1 != text.data() + slash || e2 != std::errc() || p2 != text.data() + text.size()) {
    return bad();
  }
  return (static_cast<Lsn>(hi) << 32) | lo;
}

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) noexcept {
  // Howard Hinnant's days_from_civil.
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

uint32_t array_element_type(uint32_t type_oid) noexcept {
  switch (type_oid) {
    case 1000:
      return oid::kBool;
    case 1001:
      return oid::kBytea;
    case 1002:
      return oid::kChar;
    case 1003:
      return oid::kName;
    case 1005:
      return oid::kInt2;
    case 1007:
      return oid::kInt4;
    case 1009:
      return oid::kText;
    case 1014:
      return oid::kBpchar;
    case 1015:
      return oid::kVarchar;
    case 1016:
      return oid::kInt8;
    case 1021:
      return oid::kFloat4;
    case 1022:
      return oid::kFloat8;
    case 1028:
      return oid::kOid;
    case 1115:
      return oid::kTimestamp;
    case 1182:
      return oid::kDate;
    case 1185:
      return oid::kTimestamptz;
    case 1231:
      return oid::kNumeric;
    case 199:
      return oid::kJson;
    case 2951:
      return oid::kUuid;
    case 3807:
      return oid::kJsonb;
    default:
      return 0;
  }
}

Result<Value> decode_text_value(uint32_t type_oid, std::string_view text) {
  switch (type_oid) {
    case oid::kBool:
      if (text == "t") return Value(true);
      if (text == "f") return Value(false);
      return value_error(fmt::format("bool \"{}\" is neither t nor f", text));
    case oid::kInt2:
    case oid::kInt4:
    case oid::kInt8:
    case oid::kOid:
      return decode_int(text);
    case oid::kFloat4:
    case oid::kFloat8:
      return decode_float(text);
    case oid::kNumeric:
      return decode_numeric(text);
    case oid::kBytea:
      return decode_bytea(text);
    case oid::kJson:
    case oid::kJsonb: {
      auto v = Value::from_json(text);
      if (!v) return value_error(fmt::format("json value cannot be parsed: {}", v.error().message()));
      return v;
    }
    case oid::kDate:
      return decode_date(text);
    case oid::kTimestamp:
      return decode_timestamp(text, false);
    case oid::kTimestamptz:
      return decode_timestamp(text, true);
    default:
      break;
  }
  if (const uint32_t el = array_element_type(type_oid); el != 0) return ArrayParser(text, el).parse();
  // A Value string is UTF-8 (JSON sinks could only replace the other bytes). The source's connections ask for
  // client_encoding UTF8, so the server converts every other encoding; a SQL_ASCII database is not converted and
  // may hold any bytes.
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    return value_error(
        fmt::format("text of {} bytes is not valid UTF-8 (byte {} is 0x{:02x}); the database's "
                    "encoding is probably SQL_ASCII, which Postgres does not convert",
                    text.size(), bad, static_cast<unsigned char>(text[bad])));
  }
  return Value(text);  // text, varchar, bpchar, name, uuid and every type without a mapping
}

Value unchanged_toast_marker() {
  return Value::object({{"$unchanged_toast", Value(true)}});
}

bool is_unchanged_toast(const Value& v) noexcept {
  if (!v.is_object() || v.as_object().size() != 1) return false;
  const Value* f = v.find("$unchanged_toast");
  return f != nullptr && f->is_bool() && f->as_bool();
}

const PgRelation* PgOutputDecoder::relation(uint32_t oid) const {
  auto it = relations_.find(oid);
  return it == relations_.end() ? nullptr : it->second.get();
}

const PgType* PgOutputDecoder::type(uint32_t oid) const {
  auto it = types_.find(oid);
  return it == types_.end() ? nullptr : &it->second;
}

Result<PgOutputMessage> PgOutputDecoder::decode(std::string_view bytes) {
  if (bytes.empty()) return Error(ErrorCode::kConnector, "pgoutput: empty message");
  const char type = bytes[0];
  ByteReader r(bytes, type);
  PgOutputMessage m;
  // Commit times are µs since 2000; a value whose move to 1970 overflows is not a real commit time.
  auto pg_ts = [&r](int64_t pg_us) -> Result<int64_t> {
    int64_t us = 0;
    if (__builtin_add_overflow(pg_us, kPostgresEpochMicros, &us) || is_infinite_timestamp(us)) {
      return r.malformed(fmt::format("commit timestamp {} µs since 2000 is out of range", pg_us));
    }
    return us;
  };
  switch (type) {
    case 'B': {
      m.kind = PgOutputMessage::Kind::kBegin;
      PG_TRY(lsn, r.read_int<uint64_t>("the final LSN"));
      PG_TRY(ts, r.read_int<int64_t>("the commit timestamp"));
      PG_TRY(xid, r.read_int<uint32_t>("the transaction id"));
      PG_TRY(commit_ts, pg_ts(ts));
      m.begin = PgBegin{lsn, commit_ts, xid};
      break;
    }
    case 'C': {
      m.kind = PgOutputMessage::Kind::kCommit;
      PG_TRY(flags, r.read_int<uint8_t>("the flags"));
      PG_TRY(commit_lsn, r.read_int<uint64_t>("the commit LSN"));
      PG_TRY(end_lsn, r.read_int<uint64_t>("the end LSN"));
      PG_TRY(ts, r.read_int<int64_t>("the commit timestamp"));
      PG_TRY(commit_ts, pg_ts(ts));
      m.commit = PgCommit{flags, commit_lsn, end_lsn, commit_ts};
      break;
    }
    case 'O': {
      m.kind = PgOutputMessage::Kind::kOrigin;
      PG_TRY(lsn, r.read_int<uint64_t>("the origin LSN"));
      PG_TRY(name, r.read_cstring("the origin name"));
      m.origin = PgOrigin{lsn, std::move(name)};
      break;
    }
    case 'Y': {
      m.kind = PgOutputMessage::Kind::kType;
      PG_TRY(toid, r.read_int<uint32_t>("the type OID"));
      PG_TRY(ns, r.read_cstring("the namespace"));
      PG_TRY(name, r.read_cstring("the type name"));
      m.type = PgType{toid, std::move(ns), std::move(name)};
      types_[toid] = m.type;
      break;
    }
    case 'R': {
      m.kind = PgOutputMessage::Kind::kRelation;
      auto rel = std::make_unique<PgRelation>();
      PG_TRY(relid, r.read_int<uint32_t>("the relation OID"));
      PG_TRY(ns, r.read_cstring("the namespace"));
      PG_TRY(name, r.read_cstring("the relation name"));
      PG_TRY(ident, r.read_int<uint8_t>("the replica identity"));
      PG_TRY(ncols, r.read_int<int16_t>("the column count"));
      if (ncols < 0) return r.malformed(fmt::format("negative column count {}", ncols));
      rel->oid = relid;
      rel->schema = ns.empty() ? "pg_catalog" : std::move(ns);
      rel->name = std::move(name);
      rel->replica_identity = static_cast<char>(ident);
      for (int i = 0; i < ncols; ++i) {
        PgColumn c;
        PG_TRY(flags, r.read_int<uint8_t>("the column flags"));
        PG_TRY(cname, r.read_cstring("the column name"));
        PG_TRY(toid, r.read_int<uint32_t>("the column type OID"));
        PG_TRY(typmod, r.read_int<int32_t>("the column type modifier"));
        c.part_of_identity = (flags & 1) != 0;
        c.name = std::move(cname);
        c.type_oid = toid;
        c.type_modifier = typmod;
        rel->columns.push_back(std::move(c));
      }
      if (rel->replica_identity == 'f') {
        if (resolver_) {
          auto keys = resolver_(*rel);
          if (!keys) return keys.error().with_context(fmt::format("table {}", rel->qualified_name()));
          rel->key_columns = std::move(*keys);
        }
      } else {
        for (const auto& c : rel->columns) {
          if (c.part_of_identity) rel->key_columns.push_back(c.name);
        }
      }
      auto& slot = relations_[relid];
      slot = std::move(rel);
      m.relation = slot.get();
      break;
    }
    case 'I': {
      m.kind = PgOutputMessage::Kind::kInsert;
      PG_TRY(rel, row_relation(r, relations_));
      PG_TRY(marker, r.read_int<uint8_t>("the tuple marker"));
      if (marker != 'N') return r.malformed(fmt::format("expected 'N' before the new tuple, found 0x{:02x}", marker));
      PG_TRY(tuple, read_tuple(r, *rel));
      m.relation = rel;
      m.change.op = cdc::ChangeOp::kCreate;
      m.change.relation = rel;
      m.change.after = row_object(*rel, std::move(tuple));
      m.change.key = key_of(*rel, m.change.after);
      break;
    }
    case 'U': {
      m.kind = PgOutputMessage::Kind::kUpdate;
      PG_TRY(rel, row_relation(r, relations_));
      PG_TRY(marker, r.read_int<uint8_t>("the tuple marker"));
      std::optional<Tuple> old;
      char old_kind = 0;
      if (marker == 'K' || marker == 'O') {
        old_kind = static_cast<char>(marker);
        PG_TRY(t, read_tuple(r, *rel));
        old = std::move(t);
        PG_TRY(next, r.read_int<uint8_t>("the tuple marker"));
        marker = next;
      }
      if (marker != 'N') return r.malformed(fmt::format("expected 'N' before the new tuple, found 0x{:02x}", marker));
      PG_TRY(tuple, read_tuple(r, *rel));
      if (old && old_kind == 'O') {
        // REPLICA IDENTITY FULL: an unchanged TOAST value of the new row is the old row's value when known.
        for (size_t i = 0; i < tuple.kinds.size(); ++i) {
          if (tuple.kinds[i] == 'u' && old->kinds[i] == 't') tuple.values[i] = old->values[i];
        }
      }
      m.relation = rel;
      m.change.op = cdc::ChangeOp::kUpdate;
      m.change.relation = rel;
      m.change.after = row_object(*rel, std::move(tuple));
      if (old)
        m.change.before = old_kind == 'O' ? row_object(*rel, std::move(*old)) : identity_object(*rel, std::move(*old));
      m.change.key = key_of(*rel, m.change.after);
      break;
    }
    case 'D': {
      m.kind = PgOutputMessage::Kind::kDelete;
      PG_TRY(rel, row_relation(r, relations_));
      PG_TRY(marker, r.read_int<uint8_t>("the tuple marker"));
      if (marker != 'K' && marker != 'O') {
        return r.malformed(fmt::format("expected 'K' or 'O' before the old tuple, found 0x{:02x}", marker));
      }
      PG_TRY(old, read_tuple(r, *rel));
      m.relation = rel;
      m.change.op = cdc::ChangeOp::kDelete;
      m.change.relation = rel;
      m.change.before = marker == 'O' ? row_object(*rel, std::move(old)) : identity_object(*rel, std::move(old));
      m.change.key = key_of(*rel, m.change.before);
      break;
    }
    case 'T': {
      m.kind = PgOutputMessage::Kind::kTruncate;
      PG_TRY(nrels, r.read_int<uint32_t>("the relation count"));
      PG_TRY(options, r.read_int<uint8_t>("the options"));
      m.truncate.options = options;
      if (nrels > r.remaining() / 4) return r.truncated(static_cast<size_t>(nrels) * 4, "the relation OIDs");
      for (uint32_t i = 0; i < nrels; ++i) {
        PG_TRY(relid, r.read_int<uint32_t>("a relation OID"));
        m.truncate.relation_oids.push_back(relid);
        const PgRelation* rel = relation(relid);
        m.truncate.tables.push_back(rel != nullptr ? rel->qualified_name() : fmt::format("oid {}", relid));
      }
      break;
    }
    case 'M': {
      m.kind = PgOutputMessage::Kind::kMessage;
      PG_TRY(flags, r.read_int<uint8_t>("the flags"));
      PG_TRY(lsn, r.read_int<uint64_t>("the message LSN"));
      PG_TRY(prefix, r.read_cstring("the prefix"));
      PG_TRY(len, r.read_int<uint32_t>("the content length"));
      PG_TRY(content, r.read_bytes(len, "the content"));
      m.message = PgLogicalMessage{(flags & 1) != 0, lsn, std::move(prefix), std::string(content)};
      break;
    }
    default:
      return Error(ErrorCode::kConnector,
                   fmt::format("pgoutput: unknown message type 0x{:02x} at byte 0 (streamed or two-phase messages "
                               "are not requested; is the slot's plugin pgoutput?)",
                               static_cast<unsigned>(static_cast<uint8_t>(type))));
  }
  if (r.remaining() != 0) {
    return r.malformed(fmt::format("{} unexpected trailing bytes", r.remaining()));
  }
  return m;
}

}  // namespace sluice::postgres
