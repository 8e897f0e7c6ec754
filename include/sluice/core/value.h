// Value: the dynamic, document-shaped value used for CDC events, YAML pipelines and JSON/BSON (DESIGN.md §4).
//
// A Value is one of ten kinds: null, bool, int64, double, decimal, string, bytes, timestamp, array, object.
// The full contract (JSON mapping, binary encoding byte by byte, equality, order and hash rules) is in
// docs/value.md; the short version:
//  * decimal: exact, up to 38 significant digits (see Decimal);
//  * string: UTF-8 text; bytes: arbitrary binary, a distinct kind with the same storage;
//  * timestamp: int64 microseconds since 1970-01-01T00:00:00Z (UTC). Microseconds because Postgres
//    timestamps have microsecond precision, so CDC values survive unchanged, and int64 µs still spans
//    ±292,000 years;
//  * array: std::vector<Value>; object: fields in insertion order with unique keys (Value::Object).
// A Value is 16 bytes. bool/int64/double/timestamp, strings and bytes up to 14 bytes and decimals whose
// unscaled value fits in int64 are stored inline; longer strings, big decimals, arrays and objects are
// heap-allocated and owned (copy is deep, move is a noexcept 16-byte copy).
//
// Thread-safety: a Value is a plain value type; concurrent reads of one Value are safe, writes are not.
// Recursive operations (copy, compare, hash, to_json, destruction) use stack proportional to the nesting
// depth; the decoders (from_json, TypeSerializer<Value>) reject nesting deeper than kMaxValueDepth.
#pragma once

#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iosfwd>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// Signed 128-bit integer (a GCC/Clang extension; __extension__ keeps -Wpedantic quiet).
__extension__ typedef __int128 int128_t;

/// Containers may nest at most this deep in from_json and binary decoding (a scalar at the top is depth 0,
/// `[[1]]` is depth 2). Deeper input is rejected with ErrorCode::kSerialization instead of risking a
/// stack overflow on untrusted bytes.
inline constexpr int kMaxValueDepth = 128;

/// An exact decimal number: unscaled * 10^-scale, e.g. 123.4500 is (1234500, 4).
///
/// Limits: |unscaled| < 10^38 (38 significant digits: Postgres numeric up to precision 38 and every
/// MongoDB Decimal128, which has 34) and kMinScale <= scale <= kMaxScale (covers Decimal128 exponents
/// -6176..6111 and Postgres display scales). A negative scale means trailing zeros before the point
/// (12E+3 is (12, -3)). Numbers beyond the limits are rejected with an error, never rounded.
/// The scale is kept (1.50 prints as "1.50"), but comparison is numeric: 1.5 == 1.50.
/// Decimal is immutable and thread-safe.
class Decimal {
 public:
  static constexpr int kMaxPrecision = 38;
  static constexpr int32_t kMinScale = -16383;
  static constexpr int32_t kMaxScale = 16383;

  /// Zero with scale 0.
  constexpr Decimal() noexcept = default;

  /// Returns unscaled * 10^-scale, or a kSerialization error when it exceeds the limits above.
  [[nodiscard]] static Result<Decimal> of(int128_t unscaled, int32_t scale);

  /// Parses a JSON number literal exactly: "-123.4500" is (-1234500, 4), "1.5e3" is (15, -2), "42" is
  /// (42, 0). The scale is the number of fraction digits minus the exponent. Returns a kSerialization
  /// error naming the text for bad syntax (leading '+', leading zeros, "NaN"), more than 38 significant
  /// digits (leading zeros do not count, trailing zeros do) or a scale out of range.
  [[nodiscard]] static Result<Decimal> parse(std::string_view text);

  /// The integer significand: the value is unscaled() * 10^-scale().
  constexpr int128_t unscaled() const noexcept { return unscaled_; }
  /// Digits after the decimal point (negative: trailing zeros before it).
  constexpr int32_t scale() const noexcept { return scale_; }

  /// Number of digits of |unscaled| (1 for zero).
  int precision() const noexcept;

  /// Returns the text form keeping the scale: "123.4500", "-0.005", "0.00"; a negative scale prints in
  /// exponent form, "12E+3". Always a valid JSON number that parse() reads back to the same decimal.
  std::string to_string() const;
  /// Appends to_string() to `out`.
  void append_to(std::string& out) const;

  /// Returns the nearest double (correctly rounded; ±infinity beyond the double range).
  double to_double() const;

  /// Returns the same number with trailing fraction zeros removed (1.500 -> 1.5, 100 -> 1E+2, 0.00 -> 0).
  Decimal normalized() const noexcept;

  /// Numeric order: -1, 0 or 1. Exact for all decimals (no rounding, no overflow).
  static int compare(const Decimal& a, const Decimal& b) noexcept;

  friend bool operator==(const Decimal& a, const Decimal& b) noexcept { return compare(a, b) == 0; }
  /// Weak, not strong: 1.5 and 1.50 are equivalent yet print differently.
  friend std::weak_ordering operator<=>(const Decimal& a, const Decimal& b) noexcept { return compare(a, b) <=> 0; }

 private:
  friend class ValueInternals;
  constexpr Decimal(int128_t unscaled, int32_t scale) noexcept : unscaled_(unscaled), scale_(scale) {}

  int128_t unscaled_ = 0;
  int32_t scale_ = 0;
};

namespace detail {
/// Heap block of a long string or bytes value: this header, then `capacity` bytes.
struct HeapBytes {
  size_t size;
  size_t capacity;
  char* data() noexcept { return reinterpret_cast<char*>(this + 1); }
  const char* data() const noexcept { return reinterpret_cast<const char*>(this + 1); }
};
}  // namespace detail

/// A dynamically typed document value. See the file comment for the data model; docs/value.md for details.
///
/// Accessors that name a kind (as_int64(), as_object(), ...) throw SluiceException with
/// ErrorCode::kRuntime ("expected int64, found string \"abc\"") on a different kind: a mismatch is a bug
/// or bad data met inside a user function, which the task turns into a failure at its boundary.
class Value {
 public:
  /// The kinds, in the order compare() ranks them.
  enum class Kind : uint8_t {
    kNull = 0,
    kBool = 1,
    kInt64 = 2,
    kDouble = 3,
    kDecimal = 4,
    kString = 5,
    kBytes = 6,
    kTimestamp = 7,
    kArray = 8,
    kObject = 9,
  };

  using Array = std::vector<Value>;
  class Object;

  /// Null.
  Value() noexcept = default;
  Value(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor)
  Value(bool b) noexcept {           // NOLINT(google-explicit-constructor)
    rep_[0] = static_cast<uint8_t>(Kind::kBool);
    rep_[8] = b ? 1 : 0;
  }
  /// Any integer becomes int64, except unsigned values above INT64_MAX, which become a decimal so that
  /// nothing is lost (as in from_json).
  template <std::integral T>
  requires(!std::same_as<T, bool>) Value(T v) {  // NOLINT(google-explicit-constructor)
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<int64_t>::max())) {
        init_big_unsigned(static_cast<uint64_t>(v));
        return;
      }
    }
    init_scalar(Kind::kInt64, static_cast<int64_t>(v));
  }
  Value(double d) noexcept { init_scalar(Kind::kDouble, d); }  // NOLINT(google-explicit-constructor)
  /// A string (UTF-8 text) value.
  Value(const char* s) : Value(std::string_view(s)) {}         // NOLINT(google-explicit-constructor)
  Value(std::string_view s) { init_bytes(Kind::kString, s); }  // NOLINT(google-explicit-constructor)
  Value(const std::string& s) : Value(std::string_view(s)) {}  // NOLINT(google-explicit-constructor)
  Value(const Decimal& d);                                     // NOLINT(google-explicit-constructor)
  /// Pointers other than const char* would silently become bool.
  template <class T>
  requires(!std::same_as<std::remove_cv_t<T>, char>) Value(T*)
  = delete;

  /// Copies deeply (arrays and objects included).
  Value(const Value& other);
  /// Takes over other's payload without allocating; other becomes null.
  Value(Value&& other) noexcept {
    std::memcpy(rep_, other.rep_, sizeof(rep_));
    other.rep_[0] = static_cast<uint8_t>(Kind::kNull);
  }
  Value& operator=(const Value& other);
  Value& operator=(Value&& other) noexcept {
    if (this != &other) {
      release();
      std::memcpy(rep_, other.rep_, sizeof(rep_));
      other.rep_[0] = static_cast<uint8_t>(Kind::kNull);
    }
    return *this;
  }
  ~Value() { release(); }

  /// Factories. string() holds UTF-8 text (not validated here; to_json replaces invalid sequences);
  /// bytes() holds arbitrary binary data and is a different kind from a string with the same bytes.
  static Value null() noexcept { return Value(); }
  static Value string(std::string_view s) { return Value(s); }
  static Value bytes(std::string_view b);
  static Value bytes(std::span<const uint8_t> b);
  /// A timestamp: microseconds since the Unix epoch, UTC; INT64_MAX/INT64_MIN are ±infinity (value_json.h).
  static Value timestamp_micros(int64_t micros) noexcept;
  static Value decimal(const Decimal& d) { return Value(d); }
  /// An empty array, or one holding `elements`.
  static Value array();
  static Value array(std::initializer_list<Value> elements);
  static Value array(Array elements);
  /// An empty object, or one with `fields` in order (a repeated key keeps its first position and its
  /// last value, as set()).
  static Value object();
  static Value object(std::initializer_list<std::pair<std::string_view, Value>> fields);

  /// The kind, and one predicate per kind.
  Kind kind() const noexcept { return static_cast<Kind>(rep_[0]); }
  bool is_null() const noexcept { return kind() == Kind::kNull; }
  bool is_bool() const noexcept { return kind() == Kind::kBool; }
  bool is_int64() const noexcept { return kind() == Kind::kInt64; }
  bool is_double() const noexcept { return kind() == Kind::kDouble; }
  bool is_decimal() const noexcept { return kind() == Kind::kDecimal; }
  /// int64, double or decimal.
  bool is_number() const noexcept { return is_int64() || is_double() || is_decimal(); }
  bool is_string() const noexcept { return kind() == Kind::kString; }
  bool is_bytes() const noexcept { return kind() == Kind::kBytes; }
  bool is_timestamp() const noexcept { return kind() == Kind::kTimestamp; }
  bool is_array() const noexcept { return kind() == Kind::kArray; }
  bool is_object() const noexcept { return kind() == Kind::kObject; }

  /// Typed accessors; each throws SluiceException (kRuntime) when the kind differs. No conversions:
  /// as_double() on an int64 throws. The string_views and references stay valid until this Value is
  /// modified or destroyed.
  bool as_bool() const {
    check_kind(Kind::kBool);
    return rep_[8] != 0;
  }
  int64_t as_int64() const {
    check_kind(Kind::kInt64);
    return load<int64_t>(8);
  }
  double as_double() const {
    check_kind(Kind::kDouble);
    return load<double>(8);
  }
  Decimal as_decimal() const;
  std::string_view as_string() const {
    check_kind(Kind::kString);
    return payload_bytes();
  }
  std::string_view as_bytes() const {
    check_kind(Kind::kBytes);
    return payload_bytes();
  }
  /// Microseconds since the Unix epoch, UTC.
  int64_t as_timestamp_micros() const {
    check_kind(Kind::kTimestamp);
    return load<int64_t>(8);
  }
  const Array& as_array() const {
    check_kind(Kind::kArray);
    return *load<Array*>(8);
  }
  Array& as_array() {
    check_kind(Kind::kArray);
    return *load<Array*>(8);
  }
  const Object& as_object() const {
    check_kind(Kind::kObject);
    return *load<Object*>(8);
  }
  Object& as_object() {
    check_kind(Kind::kObject);
    return *load<Object*>(8);
  }

  /// Object field lookup: nullptr when absent or when this is not an object. Linear in the field count
  /// (see Value::Object for why).
  const Value* find(std::string_view key) const noexcept;
  Value* find(std::string_view key) noexcept;
  /// Returns the field `key`, inserting a null field when absent. A null Value first becomes an empty
  /// object; any other non-object throws kRuntime. The reference is invalidated by the next insertion.
  Value& operator[](std::string_view key);
  /// Sets field `key`: replaces the value in place when present, else appends. Null becomes an object
  /// first; any other non-object throws kRuntime.
  Value& set(std::string_view key, Value value);
  /// Appends to an array. Null becomes an empty array first; any other non-array throws kRuntime.
  void push_back(Value element);
  /// Array element `index`; throws kRuntime when this is not an array or index >= size().
  const Value& at(size_t index) const;
  Value& at(size_t index);
  /// Number of array elements or object fields; throws kRuntime for other kinds.
  size_t size() const;

  /// Returns the value at `path`, or nullptr when absent (a missing key, an index out of range, a step
  /// into a scalar, or a malformed path). Paths: `after.customer.id`, `items[2].sku`, `[0]`, and
  /// `["key.with.dots"]` for keys containing '.', '[' or ']' (with \" and \\ escapes). "" is this value.
  /// Allocation-free unless a quoted key contains escapes.
  const Value* at_path(std::string_view path) const;
  /// As at_path(), for modification in place.
  Value* mutable_at_path(std::string_view path);

  /// Deep equality. Different kinds are never equal (int64 1 != double 1.0 != decimal 1); doubles compare
  /// numerically except that NaN equals NaN (so equality is an equivalence); decimals compare by value
  /// (1.5 == 1.50); objects are equal when they have the same fields in the same order.
  friend bool operator==(const Value& a, const Value& b) noexcept;
  /// Total order consistent with ==: kind rank first (the Kind order), then by value: false < true;
  /// numbers numerically, with NaN above +infinity; strings and bytes bytewise (code point order for
  /// UTF-8); arrays lexicographically; objects lexicographically over (key, value) pairs in field order.
  /// Returns -1, 0 or 1.
  static int compare(const Value& a, const Value& b) noexcept;
  friend std::weak_ordering operator<=>(const Value& a, const Value& b) noexcept { return compare(a, b) <=> 0; }

  /// Stable 64-bit hash: XXH3-64 (seed 0) of the canonical binary encoding (docs/value.md), identical
  /// on every machine and release with the same format version. Equal values hash equally.
  uint64_t hash() const;

  /// Parses one JSON document (RFC 8259) with simdjson. Integers become int64 (decimal beyond int64), other
  /// numbers double, or decimal where a double would alter them (1e400, 1e-999, 0.1000000000000000001); order
  /// is kept; a repeated key keeps its first position and its last value (as JavaScript's JSON.parse).
  /// Returns a kSerialization error naming the byte offset, line and column and the reason for invalid
  /// JSON or UTF-8, trailing content, nesting deeper than kMaxValueDepth, or a number with more than 38
  /// significant digits. Thread-safe: uses a per-thread parser and input buffer, which keep the capacity of
  /// the largest document parsed on that thread.
  [[nodiscard]] static Result<Value> from_json(std::string_view json);

  /// Returns compact JSON. Non-JSON kinds: decimal as a number literal with its scale, timestamp as an
  /// ISO-8601 string ("2024-01-02T03:04:05.123456Z", or "infinity"/"-infinity"), bytes as base64 (padded);
  /// NaN, ±infinity as "NaN", "Infinity", "-Infinity" (value_json.h); invalid UTF-8 as U+FFFD. Integral
  /// doubles keep a ".0" so they parse back as doubles.
  std::string to_json() const;
  /// Appends to_json() to `out`.
  void write_json(std::string& out) const;

  /// Appends the binary encoding (docs/value.md, format version kSerializationFormatVersion).
  void write_binary(DataOutput& out) const;
  /// Decodes one value from `in` into `target`, reusing its heap storage where the shapes match. Throws
  /// SluiceException (kSerialization) on truncated or corrupt input or nesting deeper than kMaxValueDepth;
  /// `target` then holds a valid but unspecified value. Key uniqueness and UTF-8 are not re-checked (the
  /// encoder writes only what a Value holds).
  static void read_binary(Value& target, DataInput& in);

 private:
  friend class ValueInternals;

  static constexpr uint8_t kHeapMarker = 0xFF;
  static constexpr size_t kInlineCapacity = 14;

  template <class T>
  T load(size_t offset) const noexcept {
    T v;
    std::memcpy(&v, rep_ + offset, sizeof(T));
    return v;
  }
  template <class T>
  void store(size_t offset, T v) noexcept {
    std::memcpy(rep_ + offset, &v, sizeof(T));
  }
  template <class T>
  void init_scalar(Kind k, T v) noexcept {
    rep_[0] = static_cast<uint8_t>(k);
    store(8, v);
  }
  void init_bytes(Kind k, std::string_view b);
  void init_big_unsigned(uint64_t v);
  std::string_view payload_bytes() const noexcept {
    if (rep_[1] != kHeapMarker) return {reinterpret_cast<const char*>(rep_ + 2), rep_[1]};
    const auto* h = load<const detail::HeapBytes*>(8);
    return {h->data(), h->size};
  }
  void check_kind(Kind expected) const {
    if (kind() != expected) [[unlikely]]
      throw_kind_mismatch(expected);
  }
  [[noreturn]] void throw_kind_mismatch(Kind expected) const;
  void release() noexcept {
    if (kind() >= Kind::kDecimal) release_heap();
  }
  void release_heap() noexcept;

  // Byte 0: kind. Byte 1: inline length of a string/bytes (or kHeapMarker), or kHeapMarker for a heap
  // decimal. Bytes 2..15: inline string bytes. Bytes 4..7: inline decimal scale. Bytes 8..15: bool,
  // int64, double, timestamp, inline decimal unscaled, or the owning pointer to the heap payload.
  // Accessed with memcpy only, so there is no type punning.
  alignas(8) unsigned char rep_[16] = {};
};

static_assert(sizeof(Value) == 16);

/// The fields of an object value, in insertion order, with unique keys.
///
/// Lookup is a linear scan: CDC rows have tens of columns, a scan over them costs about as much as one
/// hash probe, and an index would have to be built for every decoded record, which costs more than the
/// few lookups a record usually gets. Building an object with set() is therefore quadratic in its size;
/// from_json and the binary decoder do not use set() and stay linear.
class Value::Object {
 public:
  using Field = std::pair<std::string, Value>;
  using const_iterator = std::vector<Field>::const_iterator;

  Object() = default;

  /// Number of fields.
  size_t size() const noexcept { return fields_.size(); }
  bool empty() const noexcept { return fields_.empty(); }
  /// Iterates (key, value) pairs in insertion order. Read-only: keys must stay unique; modify values
  /// through value_at(), find() or operator[].
  const_iterator begin() const noexcept { return fields_.begin(); }
  const_iterator end() const noexcept { return fields_.end(); }
  /// The field at position `index` (insertion order); index must be < size().
  const Field& field_at(size_t index) const { return fields_[index]; }
  /// The value at position `index`, for modification; index must be < size().
  Value& value_at(size_t index) { return fields_[index].second; }

  /// The value of `key`, or nullptr when absent.
  const Value* find(std::string_view key) const noexcept;
  Value* find(std::string_view key) noexcept;
  bool contains(std::string_view key) const noexcept { return find(key) != nullptr; }
  /// The value of `key`, appending a null field when absent. Invalidated by the next insertion.
  Value& operator[](std::string_view key);
  /// Replaces the value of `key` in place when present (keeping its position), else appends.
  Value& set(std::string_view key, Value value);
  /// Removes `key`, keeping the order of the others; returns whether it was present.
  bool erase(std::string_view key);
  /// Reserves room for n fields; removes all fields.
  void reserve(size_t n) { fields_.reserve(n); }
  void clear() noexcept { fields_.clear(); }

 private:
  friend class ValueInternals;
  std::vector<Field> fields_;
};

/// Returns the stable lower-case name of a kind ("int64", "timestamp", ...).
std::string_view value_kind_name(Value::Kind kind) noexcept;

/// Appends `s` as a quoted JSON string (RFC 8259): '"', '\' and control characters escaped, invalid UTF-8
/// replaced by U+FFFD. Value::to_json writes strings with it, so typed records and Values give the same text.
void append_json_string(std::string_view s, std::string& out);

/// Appends `micros` (µs since the Unix epoch, UTC) as ISO-8601, six fraction digits: "2024-01-02T03:04:05.123456Z",
/// years outside 0000..9999 signed ("+10000-...", "-0001-..."); INT64_MAX/MIN as "infinity"/"-infinity".
void append_iso8601_micros(int64_t micros, std::string& out);

/// Writes value.to_json() (for test failure messages and logs).
std::ostream& operator<<(std::ostream& os, const Value& value);

/// Hash functor for unordered containers keyed by Value (Value::hash(); std::hash is not specialized).
struct ValueHash {
  size_t operator()(const Value& v) const { return static_cast<size_t>(v.hash()); }
};

/// Value as a record, key or state type: the binary encoding of docs/value.md.
template <>
struct TypeSerializer<Value> {
  static void serialize(const Value& v, DataOutput& out) { v.write_binary(out); }
  static void deserialize(Value& target, DataInput& in) { Value::read_binary(target, in); }
};

}  // namespace sluice
