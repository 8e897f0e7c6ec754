#include "sluice/connectors/mongodb/bson_value.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <limits>
#include <memory>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/value_json.h"

namespace sluice::mongodb {

namespace {

// Nesting deeper than this is refused (the recursion would otherwise follow a crafted document's depth).
constexpr int kMaxDepth = 200;
// Decimal128: 34 significant digits; exponent (= -scale) within [-6176, 6111].
constexpr int kDecimal128Digits = 34;
constexpr int32_t kDecimal128MinExponent = -6176;
constexpr int32_t kDecimal128MaxExponent = 6111;

Error serialization_error(std::string_view path, std::string_view what) {
  return Error(ErrorCode::kSerialization, fmt::format("BSON: {}{}{}", what, path.empty() ? "" : " at field '",
                                                      path.empty() ? "" : fmt::format("{}'", path)));
}

std::string child_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string p(parent);
  p += '.';
  p += key;
  return p;
}

constexpr char kBase64Chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const uint8_t* data, size_t len) {
  std::string out;
  out.reserve((len + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= len; i += 3) {
    const uint32_t n = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
    out += kBase64Chars[(n >> 18) & 63];
    out += kBase64Chars[(n >> 12) & 63];
    out += kBase64Chars[(n >> 6) & 63];
    out += kBase64Chars[n & 63];
  }
  if (len - i == 1) {
    const uint32_t n = uint32_t{data[i]} << 16;
    out += kBase64Chars[(n >> 18) & 63];
    out += kBase64Chars[(n >> 12) & 63];
    out += "==";
  } else if (len - i == 2) {
    const uint32_t n = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8);
    out += kBase64Chars[(n >> 18) & 63];
    out += kBase64Chars[(n >> 12) & 63];
    out += kBase64Chars[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view in, std::string& out) {
  if (in.size() % 4 != 0) return false;
  out.clear();
  out.reserve(in.size() / 4 * 3);
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;
        v[k] = val(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out += static_cast<char>((n >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(n & 0xFF);
  }
  return true;
}

Value wrap(std::string_view name, Value inner) {
  return Value::object({{name, std::move(inner)}});
}

// IEEE 754-2008 BID encoding (the one BSON uses): a coefficient above 10^34 - 1, or the "11" combination form of a
// finite number (whose implied coefficient is at least 2^113), is non-canonical and reads as zero.
bool decimal128_is_canonical(const bson_decimal128_t& dec) {
  const uint64_t combination = dec.high >> 58 & 0x1f;
  if (combination >= 0x1e) return true;  // Infinity (11110) and NaN (11111)
  if ((dec.high >> 61 & 0x3) == 0x3) return false;
  // The 113-bit coefficient against 10^34 as two 64-bit halves (0x1ed09bead87c0 : 0x378d8e6400000000), since
  // ISO C++ has no 128-bit integer.
  constexpr uint64_t kTenTo34High = 0x1ed09bead87c0;
  constexpr uint64_t kTenTo34Low = 0x378d8e6400000000;
  const uint64_t high = dec.high & ((uint64_t{1} << 49) - 1);
  return high < kTenTo34High || (high == kTenTo34High && dec.low < kTenTo34Low);
}

Result<Value> decimal128_to_value(const bson_decimal128_t& dec) {
  char text[BSON_DECIMAL128_STRING];
  bson_decimal128_to_string(&dec, text);
  const std::string_view s(text);
  const bool negative = (dec.high >> 63) != 0;
  if (s.find_first_of("NI") != std::string_view::npos) return wrap("$numberDecimal", Value(s));  // NaN, Infinity
  Result<Decimal> d = Decimal::parse(s);
  if (!d.ok())
    return Error(ErrorCode::kSerialization,
                 fmt::format("BSON: Decimal128 '{}' has no exact decimal: {}", s, d.error().message()));
  // A non-canonical encoding (IEEE 754-2008 reads it as zero; libbson prints digits, and may round them into a
  // different exponent): neither reading is safe, and no valid Decimal128 writes it back (found by bson_value_fuzz,
  // twice: decided from the bits, not from libbson's text).
  if (!decimal128_is_canonical(dec) || d->precision() > kDecimal128Digits || -d->scale() > kDecimal128MaxExponent ||
      -d->scale() < kDecimal128MinExponent) {
    return Error(
        ErrorCode::kSerialization,
        fmt::format("BSON: Decimal128 '{}' is not canonical: its coefficient is above 10^34 - 1 (IEEE 754-2008 "
                    "reads it as zero)",
                    s));
  }
  if (negative && d->unscaled() == 0) return wrap("$numberDecimal", Value(s));  // -0 keeps its sign
  return Value(*d);
}

class Reader {
 public:
  explicit Reader(const BsonToValueOptions& options) : options_(options) {}

  Result<Value> document(bson_iter_t& it, std::string_view path, int depth, bool array) {
    if (depth > kMaxDepth) return serialization_error(path, fmt::format("nesting deeper than {} levels", kMaxDepth));
    Value out = array ? Value::array() : Value::object();
    while (bson_iter_next(&it)) {
      const char* key = bson_iter_key(&it);
      const size_t key_len = bson_iter_key_len(&it);
      if (!bson_utf8_validate(key, key_len, false)) return serialization_error(path, "a field name that is not UTF-8");
      SLUICE_ASSIGN_OR_RETURN(
          Value v, value(it, array ? std::string(path) : child_path(path, std::string_view(key, key_len)), depth));
      if (array) {
        out.push_back(std::move(v));
      } else {
        out.set(std::string_view(key, key_len), std::move(v));
      }
    }
    if (it.err_off != 0) {
      return serialization_error(path, fmt::format("corrupt document (bad element at byte {})", it.err_off));
    }
    return out;
  }

  Result<Value> value(const bson_iter_t& it, const std::string& path, int depth) {
    switch (bson_iter_type(&it)) {
      case BSON_TYPE_DOUBLE:
        return Value(bson_iter_double(&it));
      case BSON_TYPE_UTF8: {
        uint32_t len = 0;
        const char* s = bson_iter_utf8(&it, &len);
        if (!bson_utf8_validate(s, len, true)) return serialization_error(path, "a string that is not UTF-8");
        return Value(std::string_view(s, len));
      }
      case BSON_TYPE_DOCUMENT:
      case BSON_TYPE_ARRAY: {
        bson_iter_t child;
        if (!bson_iter_recurse(&it, &child)) return serialization_error(path, "a corrupt embedded document");
        return document(child, path, depth + 1, bson_iter_type(&it) == BSON_TYPE_ARRAY);
      }
      case BSON_TYPE_BINARY: {
        bson_subtype_t subtype = BSON_SUBTYPE_BINARY;
        uint32_t len = 0;
        const uint8_t* data = nullptr;
        bson_iter_binary(&it, &subtype, &len, &data);
        if (data == nullptr && len != 0) return serialization_error(path, "a corrupt binary value");
        if (subtype == BSON_SUBTYPE_BINARY)
          return Value::bytes(std::string_view(reinterpret_cast<const char*>(data), len));
        return wrap("$binary",
                    Value::object({{"base64", Value(base64_encode(data, len))},
                                   {"subType", Value(fmt::format("{:02x}", static_cast<unsigned>(subtype)))}}));
      }
      case BSON_TYPE_UNDEFINED:
        return wrap("$undefined", Value(true));
      case BSON_TYPE_OID: {
        char hex[25];
        bson_oid_to_string(bson_iter_oid(&it), hex);
        return wrap("$oid", Value(std::string_view(hex, 24)));
      }
      case BSON_TYPE_BOOL:
        return Value(bson_iter_bool(&it));
      case BSON_TYPE_DATE_TIME: {
        const int64_t ms = bson_iter_date_time(&it);
        int64_t us = 0;
        if (__builtin_mul_overflow(ms, int64_t{1000}, &us)) {
          return wrap("$date", wrap("$numberLong", Value(std::to_string(ms))));
        }
        return Value::timestamp_micros(us);
      }
      case BSON_TYPE_NULL:
        return Value::null();
      case BSON_TYPE_REGEX: {
        const char* options = nullptr;
        const char* pattern = bson_iter_regex(&it, &options);
        if (pattern == nullptr) return serialization_error(path, "a corrupt regular expression");
        if (options == nullptr) options = "";
        // The options are carried as they are, even letters MongoDB does not define (value_to_bson writes them
        // back byte for byte): a connector never rewrites a value.
        if (!bson_utf8_validate(pattern, std::strlen(pattern), false) ||
            !bson_utf8_validate(options, std::strlen(options), false)) {
          return serialization_error(path, "a regular expression that is not UTF-8");
        }
        return wrap("$regularExpression", Value::object({{"pattern", Value(pattern)}, {"options", Value(options)}}));
      }
      case BSON_TYPE_DBPOINTER: {
        uint32_t len = 0;
        const char* ns = nullptr;
        const bson_oid_t* oid = nullptr;
        bson_iter_dbpointer(&it, &len, &ns, &oid);
        if (ns == nullptr || oid == nullptr) return serialization_error(path, "a corrupt DBPointer");
        if (!bson_utf8_validate(ns, len, true))
          return serialization_error(path, "a DBPointer namespace that is not UTF-8");
        char hex[25];
        bson_oid_to_string(oid, hex);
        return wrap("$dbPointer", Value::object({{"$ref", Value(std::string_view(ns, len))},
                                                 {"$id", wrap("$oid", Value(std::string_view(hex, 24)))}}));
      }
      case BSON_TYPE_CODE: {
        uint32_t len = 0;
        const char* code = bson_iter_code(&it, &len);
        if (code == nullptr) return serialization_error(path, "a corrupt JavaScript code value");
        if (!bson_utf8_validate(code, len, true)) return serialization_error(path, "JavaScript code that is not UTF-8");
        return wrap("$code", Value(std::string_view(code, len)));
      }
      case BSON_TYPE_SYMBOL: {
        uint32_t len = 0;
        const char* sym = bson_iter_symbol(&it, &len);
        if (sym == nullptr) return serialization_error(path, "a corrupt symbol");
        if (!bson_utf8_validate(sym, len, true)) return serialization_error(path, "a symbol that is not UTF-8");
        return wrap("$symbol", Value(std::string_view(sym, len)));
      }
      case BSON_TYPE_CODEWSCOPE: {
        uint32_t len = 0;
        uint32_t scope_len = 0;
        const uint8_t* scope = nullptr;
        const char* code = bson_iter_codewscope(&it, &len, &scope_len, &scope);
        if (code == nullptr || scope == nullptr) return serialization_error(path, "a corrupt code-with-scope value");
        if (!bson_utf8_validate(code, len, true)) return serialization_error(path, "JavaScript code that is not UTF-8");
        bson_t scope_doc;
        bson_iter_t scope_it;
        if (!bson_init_static(&scope_doc, scope, scope_len) || !bson_iter_init(&scope_it, &scope_doc)) {
          return serialization_error(path, "a corrupt code-with-scope scope");
        }
        SLUICE_ASSIGN_OR_RETURN(Value s, document(scope_it, path, depth + 1, false));
        return Value::object({{"$code", Value(std::string_view(code, len))}, {"$scope", std::move(s)}});
      }
      case BSON_TYPE_INT32:
        if (options_.int32 == Int32Mapping::kTagged) {
          return wrap("$numberInt", Value(std::to_string(bson_iter_int32(&it))));
        }
        return Value(int64_t{bson_iter_int32(&it)});
      case BSON_TYPE_TIMESTAMP: {
        uint32_t t = 0;
        uint32_t i = 0;
        bson_iter_timestamp(&it, &t, &i);
        return wrap("$timestamp", Value::object({{"t", Value(int64_t{t})}, {"i", Value(int64_t{i})}}));
      }
      case BSON_TYPE_INT64:
        return Value(bson_iter_int64(&it));
      case BSON_TYPE_DECIMAL128: {
        bson_decimal128_t dec;
        if (!bson_iter_decimal128(&it, &dec)) return serialization_error(path, "a corrupt Decimal128");
        Result<Value> v = decimal128_to_value(dec);
        if (!v.ok()) return v.error().with_context(fmt::format("at field '{}'", path));
        return v;
      }
      case BSON_TYPE_MAXKEY:
        return wrap("$maxKey", Value(int64_t{1}));
      case BSON_TYPE_MINKEY:
        return wrap("$minKey", Value(int64_t{1}));
      case BSON_TYPE_EOD:
      default:
        return serialization_error(
            path, fmt::format("unknown BSON type 0x{:02x}", static_cast<unsigned>(bson_iter_type(&it))));
    }
  }

 private:
  BsonToValueOptions options_;
};

// ---------------------------------------------------------------------------------------------------------
// Value -> BSON

bool is_hex_oid(std::string_view s) {
  if (s.size() != 24) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

const Value* only_field(const Value& obj, std::string_view name) {
  const Value::Object& o = obj.as_object();
  if (o.size() != 1 || o.field_at(0).first != name) return nullptr;
  return &o.field_at(0).second;
}

template <class T>
bool parse_integer(std::string_view s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool key_ok(std::string_view key) {
  return key.find('\0') == std::string_view::npos;
}

void append_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

/// The bytes of a BSON string (int32 length including the terminator, the bytes, NUL): NULs inside are kept.
std::string bson_string_bytes(std::string_view s) {
  std::string out;
  append_le32(out, static_cast<uint32_t>(s.size() + 1));
  out += s;
  out += '\0';
  return out;
}

/// Appends one element of `type` whose value is `payload` (its bytes as BSON lays them out). libbson's
/// bson_append_code and bson_append_code_with_scope take C strings (a NUL inside the code would cut it) and
/// bson_append_regex sorts the options and drops letters it does not know: for those types the element is
/// laid out here as a one-field document and concatenated, so the value is written exactly as it was read.
/// False when the document would pass BSON's size limit.
bool append_raw_element(bson_t& out, bson_type_t type, std::string_view key, std::string_view payload) {
  const size_t total = 4 + 1 + key.size() + 1 + payload.size() + 1;
  if (total > static_cast<size_t>(std::numeric_limits<int32_t>::max())) return false;
  std::string doc;
  doc.reserve(total);
  append_le32(doc, static_cast<uint32_t>(total));
  doc += static_cast<char>(type);
  doc += key;
  doc += '\0';
  doc += payload;
  doc += '\0';
  bson_t element;
  if (!bson_init_static(&element, reinterpret_cast<const uint8_t*>(doc.data()), doc.size())) return false;
  return bson_concat(&out, &element);
}

class Writer {
 public:
  Status fields(const Value& object, bson_t& out, int depth) {
    if (depth > kMaxDepth) return serialization_error("", fmt::format("nesting deeper than {} levels", kMaxDepth));
    for (const auto& [key, v] : object.as_object()) {
      SLUICE_RETURN_IF_ERROR(field(out, key, v, depth));
    }
    return ok_status();
  }

  Status field(bson_t& out, std::string_view key, const Value& v, int depth) {
    if (!key_ok(key)) return serialization_error(key, "a field name with a NUL byte");
    const char* k = key.data();
    const int kl = static_cast<int>(key.size());
    bool ok = true;
    switch (v.kind()) {
      case Value::Kind::kNull:
        ok = bson_append_null(&out, k, kl);
        break;
      case Value::Kind::kBool:
        ok = bson_append_bool(&out, k, kl, v.as_bool());
        break;
      case Value::Kind::kInt64:
        ok = bson_append_int64(&out, k, kl, v.as_int64());
        break;
      case Value::Kind::kDouble:
        ok = bson_append_double(&out, k, kl, v.as_double());
        break;
      case Value::Kind::kDecimal: {
        bson_decimal128_t dec;
        SLUICE_RETURN_IF_ERROR(to_decimal128(v.as_decimal(), key, dec));
        ok = bson_append_decimal128(&out, k, kl, &dec);
        break;
      }
      case Value::Kind::kString: {
        const std::string_view s = v.as_string();
        ok = bson_append_utf8(&out, k, kl, s.data(), static_cast<int>(s.size()));
        break;
      }
      case Value::Kind::kBytes: {
        const std::string_view b = v.as_bytes();
        ok = bson_append_binary(&out, k, kl, BSON_SUBTYPE_BINARY, reinterpret_cast<const uint8_t*>(b.data()),
                                static_cast<uint32_t>(b.size()));
        break;
      }
      case Value::Kind::kTimestamp: {
        const int64_t us = v.as_timestamp_micros();
        // A BSON date has no infinity; the nearest date would be a plausible, wrong value.
        if (is_infinite_timestamp(us)) {
          return serialization_error(key, fmt::format("timestamp {}infinity has no BSON date", us > 0 ? "" : "-"));
        }
        const int64_t ms = us >= 0 ? us / 1000 : -((-(us + 1)) / 1000) - 1;  // floor
        ok = bson_append_date_time(&out, k, kl, ms);
        break;
      }
      case Value::Kind::kArray: {
        bson_t child;
        if (!bson_append_array_begin(&out, k, kl, &child)) return serialization_error(key, "the document is too large");
        size_t i = 0;
        Status st = ok_status();
        for (const Value& e : v.as_array()) {
          const std::string idx = std::to_string(i++);
          st = field(child, idx, e, depth + 1);
          if (!st.ok()) break;
        }
        bson_append_array_end(&out, &child);
        if (!st.ok()) return st;
        break;
      }
      case Value::Kind::kObject: {
        SLUICE_ASSIGN_OR_RETURN(bool special, wrapper(out, key, v));
        if (special) break;
        bson_t child;
        if (!bson_append_document_begin(&out, k, kl, &child))
          return serialization_error(key, "the document is too large");
        Status st = fields(v, child, depth + 1);
        bson_append_document_end(&out, &child);
        if (!st.ok()) return st;
        break;
      }
    }
    if (!ok) return serialization_error(key, "the document is too large (BSON's limit is 2 GiB per document)");
    return ok_status();
  }

  static Status to_decimal128(const Decimal& d, std::string_view key, bson_decimal128_t& out) {
    const int32_t exponent = -d.scale();
    if (d.precision() > kDecimal128Digits || exponent < kDecimal128MinExponent || exponent > kDecimal128MaxExponent) {
      return serialization_error(key,
                                 fmt::format("decimal {} does not fit Decimal128 exactly (at most 34 digits and an "
                                             "exponent within [-6176, 6111])",
                                             d.to_string()));
    }
    // "<coefficient>E<exponent>": libbson keeps the coefficient and the exponent as given (no rounding).
    SLUICE_ASSIGN_OR_RETURN(Decimal coefficient, Decimal::of(d.unscaled(), 0));
    const std::string text = fmt::format("{}E{}{}", coefficient.to_string(), exponent >= 0 ? "+" : "", exponent);
    if (!bson_decimal128_from_string(text.c_str(), &out)) {
      return serialization_error(key, fmt::format("decimal {} was refused by Decimal128", text));
    }
    return ok_status();
  }

  // Writes the BSON type a wrapper object stands for; false when `v` is an ordinary document.
  Result<bool> wrapper(bson_t& out, std::string_view key, const Value& v) {
    const Value::Object& o = v.as_object();
    if (o.empty() || o.size() > 2 || o.field_at(0).first.empty() || o.field_at(0).first[0] != '$') return false;
    const char* k = key.data();
    const int kl = static_cast<int>(key.size());
    const std::string& name = o.field_at(0).first;
    const Value& inner = o.field_at(0).second;
    if (o.size() == 2) {
      const Value* scope = o.find("$scope");
      if (name != "$code" || !inner.is_string() || scope == nullptr || !scope->is_object()) return false;
      bson_t scope_doc = BSON_INITIALIZER;
      Status st = fields(*scope, scope_doc, 1);
      if (!st.ok()) {
        bson_destroy(&scope_doc);
        return st.error();
      }
      // int32 total length, the code as a BSON string, the scope document.
      const std::string code = bson_string_bytes(inner.as_string());
      std::string payload;
      append_le32(payload, static_cast<uint32_t>(4 + code.size() + scope_doc.len));
      payload += code;
      payload.append(reinterpret_cast<const char*>(bson_get_data(&scope_doc)), scope_doc.len);
      bson_destroy(&scope_doc);
      const bool ok = append_raw_element(out, BSON_TYPE_CODEWSCOPE, key, payload);
      if (!ok) return serialization_error(key, "the document is too large");
      return true;
    }
    if (name == "$oid" && inner.is_string() && is_hex_oid(inner.as_string())) {
      const std::string hex(inner.as_string());
      bson_oid_t oid;
      bson_oid_init_from_string(&oid, hex.c_str());
      return bson_append_oid(&out, k, kl, &oid);
    }
    if (name == "$numberDecimal" && inner.is_string()) {
      const std::string text(inner.as_string());
      bson_decimal128_t dec;
      if (!bson_decimal128_from_string(text.c_str(), &dec)) {
        return serialization_error(key, fmt::format("'{}' is not a Decimal128", text));
      }
      return bson_append_decimal128(&out, k, kl, &dec);
    }
    if (name == "$numberInt" && inner.is_string()) {
      int32_t n = 0;
      if (!parse_integer(inner.as_string(), n)) return serialization_error(key, "$numberInt is not an int32");
      return bson_append_int32(&out, k, kl, n);
    }
    if (name == "$numberLong" && inner.is_string()) {
      int64_t n = 0;
      if (!parse_integer(inner.as_string(), n)) return serialization_error(key, "$numberLong is not an int64");
      return bson_append_int64(&out, k, kl, n);
    }
    if (name == "$date" && inner.is_object()) {
      const Value* ms = only_field(inner, "$numberLong");
      int64_t n = 0;
      if (ms == nullptr || !ms->is_string() || !parse_integer(ms->as_string(), n)) return false;
      return bson_append_date_time(&out, k, kl, n);
    }
    if (name == "$binary" && inner.is_object() && inner.size() == 2) {
      const Value* b64 = inner.find("base64");
      const Value* sub = inner.find("subType");
      unsigned subtype = 0;
      if (b64 == nullptr || sub == nullptr || !b64->is_string() || !sub->is_string()) return false;
      auto [p, ec] =
          std::from_chars(sub->as_string().data(), sub->as_string().data() + sub->as_string().size(), subtype, 16);
      if (ec != std::errc() || p != sub->as_string().data() + sub->as_string().size() || subtype > 255) return false;
      std::string bytes;
      if (!base64_decode(b64->as_string(), bytes)) return serialization_error(key, "$binary.base64 is not base64");
      return bson_append_binary(&out, k, kl, static_cast<bson_subtype_t>(subtype),
                                reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<uint32_t>(bytes.size()));
    }
    if (name == "$undefined" && inner.is_bool() && inner.as_bool()) return bson_append_undefined(&out, k, kl);
    if (name == "$regularExpression" && inner.is_object() && inner.size() == 2) {
      const Value* pat = inner.find("pattern");
      const Value* opt = inner.find("options");
      if (pat == nullptr || opt == nullptr || !pat->is_string() || !opt->is_string()) return false;
      // BSON stores both as C strings: a NUL cannot be written, and cutting the value there would alter it.
      if (pat->as_string().find('\0') != std::string_view::npos) {
        return serialization_error(key, "a regular expression pattern with a NUL byte (BSON cannot hold it)");
      }
      if (opt->as_string().find('\0') != std::string_view::npos) {
        return serialization_error(key, "regular expression options with a NUL byte (BSON cannot hold them)");
      }
      std::string payload(pat->as_string());
      payload += '\0';
      payload += opt->as_string();
      payload += '\0';
      if (!append_raw_element(out, BSON_TYPE_REGEX, key, payload)) return serialization_error(key, "too large");
      return true;
    }
    if (name == "$dbPointer" && inner.is_object() && inner.size() == 2) {
      const Value* ref = inner.find("$ref");
      const Value* id = inner.find("$id");
      if (ref == nullptr || id == nullptr || !ref->is_string() || !id->is_object()) return false;
      const Value* hex = only_field(*id, "$oid");
      if (hex == nullptr || !hex->is_string() || !is_hex_oid(hex->as_string())) return false;
      bson_oid_t oid;
      const std::string h(hex->as_string());
      bson_oid_init_from_string(&oid, h.c_str());
      // Written as raw bytes: bson_append_dbpointer takes a C string and would cut a namespace at a NUL, which a
      // BSON string (length-prefixed) can hold.
      std::string payload = bson_string_bytes(ref->as_string());
      payload.append(reinterpret_cast<const char*>(oid.bytes), sizeof(oid.bytes));
      if (!append_raw_element(out, BSON_TYPE_DBPOINTER, key, payload)) {
        return serialization_error(key, "the document is too large");
      }
      return true;
    }
    if ((name == "$code" || name == "$symbol") && inner.is_string()) {
      if (!append_raw_element(out, name == "$code" ? BSON_TYPE_CODE : BSON_TYPE_SYMBOL, key,
                              bson_string_bytes(inner.as_string()))) {
        return serialization_error(key, "the document is too large");
      }
      return true;
    }
    if (name == "$timestamp" && inner.is_object() && inner.size() == 2) {
      const Value* t = inner.find("t");
      const Value* i = inner.find("i");
      if (t == nullptr || i == nullptr || !t->is_int64() || !i->is_int64()) return false;
      if (t->as_int64() < 0 || t->as_int64() > UINT32_MAX || i->as_int64() < 0 || i->as_int64() > UINT32_MAX)
        return false;
      return bson_append_timestamp(&out, k, kl, static_cast<uint32_t>(t->as_int64()),
                                   static_cast<uint32_t>(i->as_int64()));
    }
    if ((name == "$minKey" || name == "$maxKey") && inner.is_int64() && inner.as_int64() == 1) {
      return name == "$minKey" ? bson_append_minkey(&out, k, kl) : bson_append_maxkey(&out, k, kl);
    }
    return false;
  }
};

}  // namespace

Result<Value> bson_to_value(const bson_t& doc, const BsonToValueOptions& options) {
  bson_iter_t it;
  if (!bson_iter_init(&it, &doc)) return serialization_error("", "corrupt document (bad length or terminator)");
  Reader r(options);
  return r.document(it, "", 0, false);
}

Result<Value> bson_to_value(const uint8_t* data, size_t len, const BsonToValueOptions& options) {
  bson_t doc;
  if (data == nullptr || len < 5 || !bson_init_static(&doc, data, len)) {
    return serialization_error("", fmt::format("corrupt document of {} bytes (bad length or terminator)", len));
  }
  return bson_to_value(doc, options);
}

Result<Value> bson_iter_to_value(const bson_iter_t& iter, const BsonToValueOptions& options) {
  Reader r(options);
  return r.value(iter, bson_iter_key(&iter), 0);
}

Status append_value_fields(const Value& object, bson_t& out) {
  if (!object.is_object()) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("BSON: a document must be an object, got {}", value_kind_name(object.kind())));
  }
  Writer w;
  return w.fields(object, out, 0);
}

Status append_value(bson_t& out, std::string_view key, const Value& value) {
  Writer w;
  return w.field(out, key, value, 0);
}

Result<std::string> value_to_bson(const Value& object) {
  bson_t doc = BSON_INITIALIZER;
  Status st = append_value_fields(object, doc);
  if (!st.ok()) {
    bson_destroy(&doc);
    return st.error();
  }
  std::string out(reinterpret_cast<const char*>(bson_get_data(&doc)), doc.len);
  bson_destroy(&doc);
  return out;
}

std::string bson_to_canonical_json(const uint8_t* data, size_t len) {
  bson_t doc;
  if (data == nullptr || len < 5 || !bson_init_static(&doc, data, len)) return {};
  return bson_to_canonical_json(doc);
}

std::string bson_to_canonical_json(const bson_t& doc) {
  size_t n = 0;
  char* s = bson_as_canonical_extended_json(&doc, &n);
  if (s == nullptr) return {};
  std::string out(s, n);
  bson_free(s);
  return out;
}

}  // namespace sluice::mongodb
