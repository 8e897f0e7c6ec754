#include "sluice/core/value.h"

#include <absl/container/flat_hash_map.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <iterator>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <system_error>

#include "sluice/core/utf8.h"
#include "sluice/core/value_json.h"

namespace sluice {
namespace {

__extension__ typedef unsigned __int128 uint128_t;

constexpr std::array<uint128_t, 39> kPow10 = [] {
  std::array<uint128_t, 39> t{};
  t[0] = 1;
  for (size_t i = 1; i < t.size(); ++i)
    t[i] = t[i - 1] * 10;
  return t;
}();
constexpr uint128_t kMaxUnscaledMagnitude = kPow10[Decimal::kMaxPrecision] - 1;

uint128_t magnitude(int128_t v) noexcept {
  return v < 0 ? uint128_t{0} - static_cast<uint128_t>(v) : static_cast<uint128_t>(v);
}

int digit_count(uint128_t m) noexcept {
  int d = 1;
  while (d < 39 && m >= kPow10[static_cast<size_t>(d)])
    ++d;
  return d;
}

bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

template <class T>
int three_way(T a, T b) noexcept {
  return (a > b) - (a < b);
}

int compare_bytes(std::string_view a, std::string_view b) noexcept {
  // char_traits<char> compares as unsigned char, so this is bytewise (and code point order for UTF-8).
  int c = a.compare(b);
  return (c > 0) - (c < 0);
}

int compare_doubles(double a, double b) noexcept {
  bool na = std::isnan(a);
  bool nb = std::isnan(b);
  if (na || nb) return static_cast<int>(na) - static_cast<int>(nb);
  return three_way(a, b);
}

detail::HeapBytes* allocate_heap_bytes(size_t capacity) {
  void* p = ::operator new(sizeof(detail::HeapBytes) + capacity);
  return new (p) detail::HeapBytes{0, capacity};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Decimal

Result<Decimal> Decimal::of(int128_t unscaled, int32_t scale) {
  if (magnitude(unscaled) > kMaxUnscaledMagnitude) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("decimal unscaled value has more than {} digits", kMaxPrecision));
  }
  if (scale < kMinScale || scale > kMaxScale) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("decimal scale {} is outside [{}, {}]", scale, kMinScale, kMaxScale));
  }
  return Decimal(unscaled, scale);
}

namespace {

// Parses a JSON number literal into (unscaled, scale); on failure returns false with `reason` set.
bool parse_decimal(std::string_view text, int128_t& unscaled_out, int32_t& scale_out, std::string& reason) {
  auto fail = [&](std::string why) {
    reason = std::move(why);
    return false;
  };
  // JSON number grammar (RFC 8259 §6): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  size_t i = 0;
  const size_t n = text.size();
  bool negative = false;
  if (i < n && text[i] == '-') {
    negative = true;
    ++i;
  }
  if (i >= n || !is_digit(text[i])) return fail("expected a digit");
  const size_t int_begin = i;
  if (text[i] == '0') {
    ++i;
    if (i < n && is_digit(text[i])) return fail("leading zeros are not allowed");
  } else {
    while (i < n && is_digit(text[i]))
      ++i;
  }
  const size_t int_end = i;
  size_t frac_begin = i;
  size_t frac_end = i;
  if (i < n && text[i] == '.') {
    ++i;
    frac_begin = i;
    while (i < n && is_digit(text[i]))
      ++i;
    frac_end = i;
    if (frac_end == frac_begin) return fail("expected a digit after '.'");
  }
  int64_t exponent = 0;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < n && (text[i] == '+' || text[i] == '-')) {
      exp_negative = text[i] == '-';
      ++i;
    }
    if (i >= n || !is_digit(text[i])) return fail("expected a digit in the exponent");
    while (i < n && is_digit(text[i])) {
      // Saturate: anything this large is out of the scale range anyway.
      if (exponent < 1'000'000'000) exponent = exponent * 10 + (text[i] - '0');
      ++i;
    }
    if (exp_negative) exponent = -exponent;
  }
  if (i != n) return fail(fmt::format("unexpected character at position {}", i));

  uint128_t value = 0;
  int significant = 0;
  auto add_digits = [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      int d = text[k] - '0';
      if (significant == 0 && d == 0) continue;  // leading zeros carry no precision
      if (++significant > Decimal::kMaxPrecision) return false;
      value = value * 10 + static_cast<uint128_t>(d);
    }
    return true;
  };
  if (!add_digits(int_begin, int_end) || !add_digits(frac_begin, frac_end)) {
    return fail(fmt::format("more than {} significant digits", Decimal::kMaxPrecision));
  }
  const int64_t scale = static_cast<int64_t>(frac_end - frac_begin) - exponent;
  if (scale < Decimal::kMinScale || scale > Decimal::kMaxScale) {
    return fail(fmt::format("scale {} is outside [{}, {}]", scale, Decimal::kMinScale, Decimal::kMaxScale));
  }
  const auto unscaled = static_cast<int128_t>(value);
  unscaled_out = negative ? -unscaled : unscaled;
  scale_out = static_cast<int32_t>(scale);
  return true;
}

}  // namespace

Result<Decimal> Decimal::parse(std::string_view text) {
  int128_t unscaled = 0;
  int32_t scale = 0;
  std::string reason;
  if (!parse_decimal(text, unscaled, scale, reason)) {
    return Error(ErrorCode::kSerialization, fmt::format("invalid decimal '{}': {}", text, reason));
  }
  return Decimal(unscaled, scale);
}

int Decimal::precision() const noexcept {
  return digit_count(magnitude(unscaled_));
}

void Decimal::append_to(std::string& out) const {
  char digits[40];
  int len = 0;
  uint128_t m = magnitude(unscaled_);
  do {
    digits[len++] = static_cast<char>('0' + static_cast<int>(m % 10));
    m /= 10;
  } while (m != 0);
  if (unscaled_ < 0) out.push_back('-');
  auto put_digits = [&](int from, int to) {  // digits[from-1] down to digits[to], most significant first
    for (int k = from - 1; k >= to; --k)
      out.push_back(digits[k]);
  };
  if (scale_ <= 0) {
    put_digits(len, 0);
    if (scale_ < 0) {
      out += "E+";
      out += std::to_string(-static_cast<int64_t>(scale_));
    }
  } else if (len > scale_) {
    put_digits(len, scale_);
    out.push_back('.');
    put_digits(scale_, 0);
  } else {
    out += "0.";
    out.append(static_cast<size_t>(scale_ - len), '0');
    put_digits(len, 0);
  }
}

std::string Decimal::to_string() const {
  std::string s;
  append_to(s);
  return s;
}

double Decimal::to_double() const {
  // Going through the exact text lets from_chars round correctly, which scaling in floating point does
  // not.
  const std::string text = to_string();
  double d = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), d);
  if (r.ec == std::errc::result_out_of_range) {
    // from_chars reports both overflow and underflow this way; the exponent tells which.
    bool overflow = precision() - scale_ > 0;
    if (!overflow) return unscaled_ < 0 ? -0.0 : 0.0;
    return unscaled_ < 0 ? -HUGE_VAL : HUGE_VAL;
  }
  return d;
}

Decimal Decimal::normalized() const noexcept {
  if (unscaled_ == 0) return Decimal();
  int128_t u = unscaled_;
  int32_t s = scale_;
  while (s > kMinScale && u % 10 == 0) {
    u /= 10;
    --s;
  }
  return Decimal(u, s);
}

int Decimal::compare(const Decimal& a, const Decimal& b) noexcept {
  const int sa = three_way(a.unscaled_, int128_t{0});
  const int sb = three_way(b.unscaled_, int128_t{0});
  if (sa != sb) return three_way(sa, sb);
  if (sa == 0) return 0;
  uint128_t ma = magnitude(a.unscaled_);
  uint128_t mb = magnitude(b.unscaled_);
  // The position of the leading digit decides unless it is the same; then the scales differ by at most
  // 37 and aligning the smaller-scale magnitude yields at most 38 digits, which fits in 128 bits.
  const int64_t ea = static_cast<int64_t>(digit_count(ma)) - a.scale_;
  const int64_t eb = static_cast<int64_t>(digit_count(mb)) - b.scale_;
  int mag;
  if (ea != eb) {
    mag = three_way(ea, eb);
  } else {
    if (a.scale_ < b.scale_) {
      ma *= kPow10[static_cast<size_t>(b.scale_ - a.scale_)];
    } else {
      mb *= kPow10[static_cast<size_t>(a.scale_ - b.scale_)];
    }
    mag = three_way(ma, mb);
  }
  return sa > 0 ? mag : -mag;
}

// ---------------------------------------------------------------------------------------------------------
// Representation helpers

/// Access to the representation for the codecs and the JSON reader in this file.
class ValueInternals {
 public:
  static std::vector<Value::Object::Field>& fields(Value::Object& o) noexcept { return o.fields_; }

  static Decimal decimal_of(int128_t unscaled, int32_t scale) noexcept { return Decimal(unscaled, scale); }

  static void reset(Value& v) noexcept {
    v.release();
    std::memset(v.rep_, 0, sizeof(v.rep_));
  }

  /// Makes v a string or bytes value holding b, reusing v's heap block when it is big enough.
  static void assign_bytes(Value& v, Value::Kind k, std::string_view b) {
    if ((v.kind() == Value::Kind::kString || v.kind() == Value::Kind::kBytes) && v.rep_[1] == Value::kHeapMarker &&
        b.size() > Value::kInlineCapacity) {
      auto* h = v.load<detail::HeapBytes*>(8);
      if (h->capacity >= b.size()) {
        std::memcpy(h->data(), b.data(), b.size());
        h->size = b.size();
        v.rep_[0] = static_cast<uint8_t>(k);
        return;
      }
    }
    reset(v);
    v.init_bytes(k, b);
  }

  /// Makes v a decimal, reusing its heap box when it has one and d needs one.
  static void assign_decimal(Value& v, const Decimal& d) {
    if (v.kind() == Value::Kind::kDecimal && v.rep_[1] == Value::kHeapMarker && !fits_inline(d)) {
      *v.load<Decimal*>(8) = d;
      return;
    }
    reset(v);
    init_decimal(v, d);
  }

  static bool fits_inline(const Decimal& d) noexcept {
    return d.unscaled_ >= std::numeric_limits<int64_t>::min() && d.unscaled_ <= std::numeric_limits<int64_t>::max();
  }

  static void init_decimal(Value& v, const Decimal& d) {
    if (fits_inline(d)) {
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kDecimal);
      v.rep_[1] = 0;
      v.store<int32_t>(4, d.scale_);
      v.store<int64_t>(8, static_cast<int64_t>(d.unscaled_));
    } else {
      auto* p = new Decimal(d);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kDecimal);
      v.rep_[1] = Value::kHeapMarker;
      v.store(8, p);
    }
  }

  static Decimal decimal(const Value& v) noexcept {
    if (v.rep_[1] == Value::kHeapMarker) return *v.load<const Decimal*>(8);
    return Decimal(v.load<int64_t>(8), v.load<int32_t>(4));
  }

  static std::string_view payload(const Value& v) noexcept { return v.payload_bytes(); }
  static bool bool_of(const Value& v) noexcept { return v.rep_[8] != 0; }
  static int64_t int_of(const Value& v) noexcept { return v.load<int64_t>(8); }
  static double double_of(const Value& v) noexcept { return v.load<double>(8); }
  static const Value::Array& array_of(const Value& v) noexcept { return *v.load<const Value::Array*>(8); }
  static const Value::Object& object_of(const Value& v) noexcept { return *v.load<const Value::Object*>(8); }

  /// Makes v an array; an existing array is kept with its elements, whose storage the caller may reuse.
  static Value::Array& make_array(Value& v) {
    if (v.kind() != Value::Kind::kArray) {
      auto* p = new Value::Array();
      reset(v);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kArray);
      v.store(8, p);
    }
    return *v.load<Value::Array*>(8);
  }

  /// Makes v an object; an existing object is kept with its fields, whose storage the caller may reuse.
  static Value::Object& make_object(Value& v) {
    if (v.kind() != Value::Kind::kObject) {
      auto* p = new Value::Object();
      reset(v);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kObject);
      v.store(8, p);
    }
    return *v.load<Value::Object*>(8);
  }

  /// Merges repeated keys in `f`: the first position keeps the last value (JavaScript's JSON.parse
  /// semantics). Moves the surviving fields, in order, to the front and returns their count.
  static size_t merge_duplicate_keys(std::span<Value::Object::Field> f) {
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
};

// ---------------------------------------------------------------------------------------------------------
// Value: lifetime and construction

Value::Value(const Decimal& d) {
  ValueInternals::init_decimal(*this, d);
}

void Value::init_bytes(Kind k, std::string_view b) {
  if (b.size() <= kInlineCapacity) {
    rep_[0] = static_cast<uint8_t>(k);
    rep_[1] = static_cast<uint8_t>(b.size());
    if (!b.empty()) std::memcpy(rep_ + 2, b.data(), b.size());
    return;
  }
  detail::HeapBytes* h = allocate_heap_bytes(b.size());
  std::memcpy(h->data(), b.data(), b.size());
  h->size = b.size();
  rep_[0] = static_cast<uint8_t>(k);
  rep_[1] = kHeapMarker;
  store(8, h);
}

void Value::init_big_unsigned(uint64_t v) {
  ValueInternals::init_decimal(*this, ValueInternals::decimal_of(static_cast<int128_t>(v), 0));
}

Value::Value(const Value& other) {
  switch (other.kind()) {
    case Kind::kDecimal:
      ValueInternals::init_decimal(*this, ValueInternals::decimal(other));
      break;
    case Kind::kString:
    case Kind::kBytes:
      init_bytes(other.kind(), other.payload_bytes());
      break;
    case Kind::kArray: {
      auto* p = new Array(*other.load<const Array*>(8));
      rep_[0] = static_cast<uint8_t>(Kind::kArray);
      store(8, p);
      break;
    }
    case Kind::kObject: {
      auto* p = new Object(*other.load<const Object*>(8));
      rep_[0] = static_cast<uint8_t>(Kind::kObject);
      store(8, p);
      break;
    }
    default:
      std::memcpy(rep_, other.rep_, sizeof(rep_));
      break;
  }
}

Value& Value::operator=(const Value& other) {
  if (this != &other) {
    Value copy(other);
    *this = std::move(copy);
  }
  return *this;
}

void Value::release_heap() noexcept {
  switch (kind()) {
    case Kind::kDecimal:
      if (rep_[1] == kHeapMarker) delete load<Decimal*>(8);
      break;
    case Kind::kString:
    case Kind::kBytes:
      if (rep_[1] == kHeapMarker) ::operator delete(load<detail::HeapBytes*>(8));
      break;
    case Kind::kArray:
      delete load<Array*>(8);
      break;
    case Kind::kObject:
      delete load<Object*>(8);
      break;
    default:
      break;
  }
}

Value Value::bytes(std::string_view b) {
  Value v;
  v.init_bytes(Kind::kBytes, b);
  return v;
}

Value Value::bytes(std::span<const uint8_t> b) {
  return bytes(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

Value Value::timestamp_micros(int64_t micros) noexcept {
  Value v;
  v.init_scalar(Kind::kTimestamp, micros);
  return v;
}

Value Value::array() {
  Value v;
  ValueInternals::make_array(v);
  return v;
}

Value Value::array(std::initializer_list<Value> elements) {
  return array(Array(elements));
}

Value Value::array(Array elements) {
  Value v;
  ValueInternals::make_array(v) = std::move(elements);
  return v;
}

Value Value::object() {
  Value v;
  ValueInternals::make_object(v);
  return v;
}

Value Value::object(std::initializer_list<std::pair<std::string_view, Value>> fields) {
  Value v;
  Object& o = ValueInternals::make_object(v);
  o.reserve(fields.size());
  for (const auto& [key, value] : fields)
    o.set(key, value);
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// Value: access

std::string_view value_kind_name(Value::Kind kind) noexcept {
  switch (kind) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt64:
      return "int64";
    case Value::Kind::kDouble:
      return "double";
    case Value::Kind::kDecimal:
      return "decimal";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kBytes:
      return "bytes";
    case Value::Kind::kTimestamp:
      return "timestamp";
    case Value::Kind::kArray:
      return "array";
    case Value::Kind::kObject:
      return "object";
  }
  return "unknown";
}

namespace {

// A short rendering of v for error messages: containers by size, long strings cut.
std::string describe(const Value& v) {
  std::string s(value_kind_name(v.kind()));
  switch (v.kind()) {
    case Value::Kind::kNull:
      break;
    case Value::Kind::kArray:
      s += fmt::format(" with {} elements", ValueInternals::array_of(v).size());
      break;
    case Value::Kind::kObject:
      s += fmt::format(" with {} fields", ValueInternals::object_of(v).size());
      break;
    case Value::Kind::kString:
    case Value::Kind::kBytes: {
      constexpr size_t kPreview = 48;
      std::string_view p = ValueInternals::payload(v);
      Value cut = v.is_string() ? Value::string(p.substr(0, kPreview)) : Value::bytes(p.substr(0, kPreview));
      s += ' ';
      cut.write_json(s);
      if (p.size() > kPreview) s += "...";
      break;
    }
    case Value::Kind::kDouble:
      s += fmt::format(" {}", ValueInternals::double_of(v));  // "nan" and "inf", unquoted
      break;
    default:
      s += ' ';
      v.write_json(s);
      break;
  }
  return s;
}

[[noreturn]] void throw_runtime(std::string message) {
  throw SluiceException(Error(ErrorCode::kRuntime, std::move(message)));
}

}  // namespace

void Value::throw_kind_mismatch(Kind expected) const {
  throw_runtime(fmt::format("Value: expected {}, found {}", value_kind_name(expected), describe(*this)));
}

Decimal Value::as_decimal() const {
  check_kind(Kind::kDecimal);
  return ValueInternals::decimal(*this);
}

const Value* Value::Object::find(std::string_view key) const noexcept {
  for (const auto& f : fields_) {
    if (f.first == key) return &f.second;
  }
  return nullptr;
}

Value* Value::Object::find(std::string_view key) noexcept {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::Object::operator[](std::string_view key) {
  if (Value* v = find(key)) return *v;
  fields_.emplace_back(std::string(key), Value());
  return fields_.back().second;
}

Value& Value::Object::set(std::string_view key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return *v;
  }
  fields_.emplace_back(std::string(key), std::move(value));
  return fields_.back().second;
}

bool Value::Object::erase(std::string_view key) {
  for (auto it = fields_.begin(); it != fields_.end(); ++it) {
    if (it->first == key) {
      fields_.erase(it);
      return true;
    }
  }
  return false;
}

const Value* Value::find(std::string_view key) const noexcept {
  if (!is_object()) return nullptr;
  return load<const Object*>(8)->find(key);
}

Value* Value::find(std::string_view key) noexcept {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::operator[](std::string_view key) {
  if (is_null()) ValueInternals::make_object(*this);
  return as_object()[key];
}

Value& Value::set(std::string_view key, Value value) {
  if (is_null()) ValueInternals::make_object(*this);
  return as_object().set(key, std::move(value));
}

void Value::push_back(Value element) {
  if (is_null()) ValueInternals::make_array(*this);
  as_array().push_back(std::move(element));
}

const Value& Value::at(size_t index) const {
  const Array& a = as_array();
  if (index >= a.size()) throw_runtime(fmt::format("Value: index {} out of range for an array of {}", index, a.size()));
  return a[index];
}

Value& Value::at(size_t index) {
  return const_cast<Value&>(std::as_const(*this).at(index));
}

size_t Value::size() const {
  if (is_array()) return load<const Array*>(8)->size();
  if (is_object()) return load<const Object*>(8)->size();
  throw_runtime(fmt::format("Value: size() needs an array or object, found {}", describe(*this)));
}

const Value* Value::at_path(std::string_view path) const {
  const Value* cur = this;
  std::string unescaped;
  size_t i = 0;
  const size_t n = path.size();
  while (i < n) {
    if (path[i] == '[') {
      ++i;
      if (i < n && path[i] == '"') {
        ++i;
        const size_t begin = i;
        bool escaped = false;
        while (i < n && path[i] != '"') {
          if (path[i] == '\\') {
            escaped = true;
            if (++i == n || (path[i] != '"' && path[i] != '\\')) return nullptr;
          }
          ++i;
        }
        if (i + 1 >= n || path[i + 1] != ']') return nullptr;
        std::string_view key = path.substr(begin, i - begin);
        if (escaped) {
          unescaped.clear();
          for (size_t k = 0; k < key.size(); ++k) {
            if (key[k] == '\\') ++k;
            unescaped.push_back(key[k]);
          }
          key = unescaped;
        }
        i += 2;
        cur = cur->find(key);
      } else {
        const size_t begin = i;
        uint64_t index = 0;
        while (i < n && is_digit(path[i])) {
          if (index > (std::numeric_limits<uint64_t>::max() - 9) / 10) return nullptr;
          index = index * 10 + static_cast<uint64_t>(path[i] - '0');
          ++i;
        }
        if (i == begin || i >= n || path[i] != ']') return nullptr;
        ++i;
        if (!cur->is_array()) return nullptr;
        const Array& a = *cur->load<const Array*>(8);
        if (index >= a.size()) return nullptr;
        cur = &a[index];
      }
    } else {
      if (i != 0) {
        if (path[i] != '.') return nullptr;
        ++i;
      }
      const size_t begin = i;
      while (i < n && path[i] != '.' && path[i] != '[')
        ++i;
      if (i == begin) return nullptr;
      cur = cur->find(path.substr(begin, i - begin));
    }
    if (cur == nullptr) return nullptr;
  }
  return cur;
}

Value* Value::mutable_at_path(std::string_view path) {
  return const_cast<Value*>(std::as_const(*this).at_path(path));
}

// ---------------------------------------------------------------------------------------------------------
// Equality and order

bool operator==(const Value& a, const Value& b) noexcept {
  using K = Value::Kind;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kNull:
      return true;
    case K::kBool:
      return ValueInternals::bool_of(a) == ValueInternals::bool_of(b);
    case K::kInt64:
    case K::kTimestamp:
      return ValueInternals::int_of(a) == ValueInternals::int_of(b);
    case K::kDouble:
      return compare_doubles(ValueInternals::double_of(a), ValueInternals::double_of(b)) == 0;
    case K::kDecimal:
      return ValueInternals::decimal(a) == ValueInternals::decimal(b);
    case K::kString:
    case K::kBytes:
      return ValueInternals::payload(a) == ValueInternals::payload(b);
    case K::kArray:
      return ValueInternals::array_of(a) == ValueInternals::array_of(b);
    case K::kObject: {
      const auto& fa = ValueInternals::object_of(a);
      const auto& fb = ValueInternals::object_of(b);
      if (fa.size() != fb.size()) return false;
      for (size_t i = 0; i < fa.size(); ++i) {
        if (fa.field_at(i).first != fb.field_at(i).first || !(fa.field_at(i).second == fb.field_at(i).second)) {
          return false;
        }
      }
      return true;
    }
  }
  return false;
}

int Value::compare(const Value& a, const Value& b) noexcept {
  using K = Value::Kind;
  if (a.kind() != b.kind()) return three_way(static_cast<int>(a.kind()), static_cast<int>(b.kind()));
  switch (a.kind()) {
    case K::kNull:
      return 0;
    case K::kBool:
      return three_way(ValueInternals::bool_of(a), ValueInternals::bool_of(b));
    case K::kInt64:
    case K::kTimestamp:
      return three_way(ValueInternals::int_of(a), ValueInternals::int_of(b));
    case K::kDouble:
      return compare_doubles(ValueInternals::double_of(a), ValueInternals::double_of(b));
    case K::kDecimal:
      return Decimal::compare(ValueInternals::decimal(a), ValueInternals::decimal(b));
    case K::kString:
    case K::kBytes:
      return compare_bytes(ValueInternals::payload(a), ValueInternals::payload(b));
    case K::kArray: {
      const auto& xa = ValueInternals::array_of(a);
      const auto& xb = ValueInternals::array_of(b);
      const size_t n = std::min(xa.size(), xb.size());
      for (size_t i = 0; i < n; ++i) {
        if (int c = compare(xa[i], xb[i]); c != 0) return c;
      }
      return three_way(xa.size(), xb.size());
    }
    case K::kObject: {
      const auto& oa = ValueInternals::object_of(a);
      const auto& ob = ValueInternals::object_of(b);
      const size_t n = std::min(oa.size(), ob.size());
      for (size_t i = 0; i < n; ++i) {
        if (int c = compare_bytes(oa.field_at(i).first, ob.field_at(i).first); c != 0) return c;
        if (int c = compare(oa.field_at(i).second, ob.field_at(i).second); c != 0) return c;
      }
      return three_way(oa.size(), ob.size());
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------------------
// Binary encoding (docs/value.md)

namespace {

enum Tag : uint8_t {
  kTagNull = 0x00,
  kTagFalse = 0x01,
  kTagTrue = 0x02,
  kTagInt64 = 0x03,
  kTagDouble = 0x04,
  kTagDecimal = 0x05,
  kTagString = 0x06,
  kTagBytes = 0x07,
  kTagTimestamp = 0x08,
  kTagArray = 0x09,
  kTagObject = 0x0A,
};

constexpr uint64_t kCanonicalNaNBits = 0x7FF8000000000000ULL;

void write_varint128(DataOutput& out, uint128_t v) {
  while (v >= 0x80) {
    out.write_u8(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out.write_u8(static_cast<uint8_t>(v));
}

uint128_t read_varint128(DataInput& in) {
  uint128_t result = 0;
  for (int shift = 0; shift < 128; shift += 7) {
    const uint8_t b = in.read_u8();
    if (shift == 126 && (b & 0x7C) != 0) in.fail("decimal varint overflows 128 bits");
    result |= static_cast<uint128_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return result;
  }
  in.fail("decimal varint longer than 19 bytes");
}

// Writes to a DataOutput and, for hashing, flushes it into a streaming XXH3 state whenever it grows past
// kFlushBytes, so hashing a huge value needs only a bounded buffer.
class HashSink {
 public:
  static constexpr size_t kFlushBytes = 64 * 1024;

  explicit HashSink(DataOutput& buf) : buf_(buf) {}
  HashSink(const HashSink&) = delete;
  HashSink& operator=(const HashSink&) = delete;
  ~HashSink() {
    if (state_ != nullptr) XXH3_freeState(state_);
  }

  void maybe_flush() {
    if (buf_.size() < kFlushBytes) return;
    if (state_ == nullptr) {
      state_ = XXH3_createState();
      if (state_ == nullptr) throw std::bad_alloc();
      XXH3_64bits_reset(state_);
    }
    XXH3_64bits_update(state_, buf_.data(), buf_.size());
    buf_.clear();
  }

  uint64_t digest() {
    if (state_ == nullptr) return XXH3_64bits(buf_.data(), buf_.size());
    XXH3_64bits_update(state_, buf_.data(), buf_.size());
    return XXH3_64bits_digest(state_);
  }

 private:
  DataOutput& buf_;
  XXH3_state_t* state_ = nullptr;
};

// Encodes v; `canonical` (for hashing) maps values that compare equal to the same bytes: decimals are
// normalized, -0.0 becomes 0.0 and every NaN the same quiet NaN.
void encode(const Value& v, DataOutput& out, bool canonical, HashSink* sink) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kNull:
      out.write_u8(kTagNull);
      break;
    case K::kBool:
      out.write_u8(ValueInternals::bool_of(v) ? kTagTrue : kTagFalse);
      break;
    case K::kInt64:
      out.write_u8(kTagInt64);
      out.write_signed_varint(ValueInternals::int_of(v));
      break;
    case K::kDouble: {
      double d = ValueInternals::double_of(v);
      out.write_u8(kTagDouble);
      if (canonical && std::isnan(d)) {
        out.write_fixed(kCanonicalNaNBits);
      } else {
        if (canonical && d == 0) d = 0.0;
        out.write_fixed(d);
      }
      break;
    }
    case K::kDecimal: {
      Decimal d = ValueInternals::decimal(v);
      if (canonical) d = d.normalized();
      out.write_u8(kTagDecimal);
      out.write_signed_varint(d.scale());
      const int128_t u = d.unscaled();
      write_varint128(out, (static_cast<uint128_t>(u) << 1) ^ static_cast<uint128_t>(u >> 127));
      break;
    }
    case K::kString:
    case K::kBytes:
      out.write_u8(v.is_string() ? kTagString : kTagBytes);
      out.write_string(ValueInternals::payload(v));
      break;
    case K::kTimestamp:
      out.write_u8(kTagTimestamp);
      out.write_signed_varint(ValueInternals::int_of(v));
      break;
    case K::kArray: {
      const auto& a = ValueInternals::array_of(v);
      out.write_u8(kTagArray);
      out.write_varint(a.size());
      for (const Value& e : a) {
        encode(e, out, canonical, sink);
        if (sink != nullptr) sink->maybe_flush();
      }
      break;
    }
    case K::kObject: {
      const auto& o = ValueInternals::object_of(v);
      out.write_u8(kTagObject);
      out.write_varint(o.size());
      for (const auto& [key, value] : o) {
        out.write_string(key);
        encode(value, out, canonical, sink);
        if (sink != nullptr) sink->maybe_flush();
      }
      break;
    }
  }
}

void decode(Value& target, DataInput& in, int depth) {
  const uint8_t tag = in.read_u8();
  switch (tag) {
    case kTagNull:
      ValueInternals::reset(target);
      break;
    case kTagFalse:
    case kTagTrue:
      target = Value(tag == kTagTrue);
      break;
    case kTagInt64:
      target = Value(in.read_signed_varint());
      break;
    case kTagDouble:
      target = Value(in.read_fixed<double>());
      break;
    case kTagDecimal: {
      const int64_t scale = in.read_signed_varint();
      const uint128_t z = read_varint128(in);
      const auto unscaled = static_cast<int128_t>((z >> 1) ^ (uint128_t{0} - (z & 1)));
      if (scale < Decimal::kMinScale || scale > Decimal::kMaxScale) {
        in.fail(fmt::format("decimal scale {} is out of range", scale));
      }
      auto d = Decimal::of(unscaled, static_cast<int32_t>(scale));
      if (!d.ok()) in.fail(d.error().message());
      ValueInternals::assign_decimal(target, *d);
      break;
    }
    case kTagString:
    case kTagBytes: {
      const size_t n = in.read_length();
      ValueInternals::assign_bytes(target, tag == kTagString ? Value::Kind::kString : Value::Kind::kBytes,
                                   in.read_view(n));
      break;
    }
    case kTagTimestamp:
      target = Value::timestamp_micros(in.read_signed_varint());
      break;
    case kTagArray: {
      if (depth >= kMaxValueDepth) in.fail(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
      const uint64_t n = in.read_varint();
      // Every element takes at least one byte, so a larger count is corrupt (and must not be allocated).
      if (n > in.remaining()) in.fail(fmt::format("array of {} elements exceeds the remaining bytes", n));
      Value::Array& a = ValueInternals::make_array(target);
      a.resize(static_cast<size_t>(n));
      for (Value& e : a)
        decode(e, in, depth + 1);
      break;
    }
    case kTagObject: {
      if (depth >= kMaxValueDepth) in.fail(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
      const uint64_t n = in.read_varint();
      // Every field takes at least two bytes (key length and value tag).
      if (n > in.remaining() / 2) in.fail(fmt::format("object of {} fields exceeds the remaining bytes", n));
      auto& fields = ValueInternals::fields(ValueInternals::make_object(target));
      fields.resize(static_cast<size_t>(n));
      for (auto& [key, value] : fields) {
        in.read_string(key);
        decode(value, in, depth + 1);
      }
      break;
    }
    default:
      in.fail(fmt::format("unknown value tag 0x{:02x}", tag));
  }
}

}  // namespace

void Value::write_binary(DataOutput& out) const {
  encode(*this, out, false, nullptr);
}

void Value::read_binary(Value& target, DataInput& in) {
  decode(target, in, 0);
}

uint64_t Value::hash() const {
  // One buffer per thread: hashing runs per record (key-by on a Value) and must not allocate each time.
  thread_local DataOutput buffer(256);
  buffer.clear();
  HashSink sink(buffer);
  encode(*this, buffer, true, &sink);
  return sink.digest();
}

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

  const int64_t secs = rem / 1'000'000;
  auto it = std::back_inserter(out);
  if (year < 0) {
    fmt::format_to(it, "-{:04}", -year);
  } else if (year > 9999) {
    fmt::format_to(it, "+{}", year);
  } else {
    fmt::format_to(it, "{:04}", year);
  }
  fmt::format_to(it, "-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", month, day, secs / 3600, secs / 60 % 60, secs % 60,
                 rem % 1'000'000);
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

// ---------------------------------------------------------------------------------------------------------
// JSON input

namespace {

namespace od = simdjson::ondemand;

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
        const size_t live = ValueInternals::merge_duplicate_keys(std::span(fields_).subspan(base));
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
    if (!parse_decimal(raw, unscaled, scale, reason)) return fail_at(offset, fmt::format("number {}: {}", raw, reason));
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
