// JSON mapping for typed records: C++ values to JSON text and JSON (or a Value) back to C++ values.
//
// Used by the JSON-lines file format, the print and file sinks, and by any connector that reads or writes
// JSON documents as typed records (DESIGN.md §11: `SLUICE_FIELDS(Charge, ...)` gives a struct its
// serializer and its JSON mapping).
//
// Supported types and their JSON form:
//   bool                                  true / false
//   integers (char included), enums       a number (an enum as its underlying integer)
//   float, double                         the shortest text that reads back to the same value (fmt's `{}`);
//                                         integral values keep ".0" (1.0), as Value::to_json; NaN and
//                                         ±infinity become "NaN", "Infinity", "-Infinity", as Value::to_json
//   std::string (std::string_view,        a string; control characters, '"' and '\' escaped; invalid UTF-8
//   const char* when writing)             replaced by U+FFFD, exactly as Value::to_json
//   Value                                 Value::to_json (decimals exact, timestamps ISO-8601, bytes base64)
//   std::optional<T>                      null when empty, else T
//   std::vector<T>, std::array<T, N>      an array (writing also accepts any other range, e.g. std::set)
//   std::map / std::unordered_map         an object; keys must be strings (std::unordered_map in its
//     with std::string keys               iteration order, which is unspecified: use std::map for stable text)
//   std::pair, std::tuple                 an array of their elements
//   SLUICE_FIELDS structs                 an object with the declared member names, in declaration order
// long double, raw pointers, std::variant and types not listed fail to compile with a static_assert.
//
// Reading (from_value, from_json) is strict, so bad data is reported rather than guessed at:
//  * integers accept an int64, a decimal with an integral value (JSON integers beyond int64 parse as
//    decimals) or a double with an integral value (1.0, 1e3; 1.5 is an error), and fail when the value
//    does not fit the target type;
//  * floating point accepts double, int64, decimal and the strings "NaN", "Infinity", "-Infinity" (the inverse
//    of writing); null reads as NaN (what earlier releases wrote for all three);
//  * strings accept only strings, bools only bools; null is accepted only by std::optional (-> empty),
//    Value and floating point;
//  * std::array, std::pair and std::tuple need an array of exactly their size;
//  * structs: fields absent from the object keep the value they have in `out` (their defaults when `out`
//    was default-constructed); fields that are not declared are ignored;
//  * elements of vectors and maps and the content of an optional are default-constructed before they are
//    read, so nothing of `out`'s previous content survives in them.
// A mismatch returns an Error with ErrorCode::kSerialization whose message names the path of the offending
// field in Value::at_path syntax (`customer.id`, `items[2].sku`) and the expected and actual kinds, e.g.
//   field 'customer.id': expected string, found int64 42
// If reading fails, `out` is valid but partly overwritten.
//
// Thread-safety: all functions are reentrant and thread-safe (no shared state).
#pragma once

#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"

namespace sluice {

// ---------------------------------------------------------------------------------------------------------
// Non-template building blocks (json_mapping.cc)
// ---------------------------------------------------------------------------------------------------------

// append_json_string (quoted, escaped JSON strings) is declared in value.h.

/// Appends the shortest decimal text that reads back to `d` ("0.1", "1e+300"), with ".0" added to integral
/// values ("3.0"); NaN and ±infinity as the strings "NaN", "Infinity", "-Infinity" (JSON has no literal).
void append_json_number(double d, std::string& out);
/// As above for a float: the shortest text that reads back to the same float ("0.1", not "0.10000000149").
void append_json_number(float f, std::string& out);

/// As append_json_number, but NaN and ±infinity print as "NaN", "Infinity" and "-Infinity" (for humans).
void append_display_number(double d, std::string& out);
void append_display_number(float f, std::string& out);

namespace detail {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class T, class A>
struct IsVector<std::vector<T, A>> : std::true_type {};

template <class T>
struct IsStdArray : std::false_type {};
template <class T, size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {};

template <class T>
struct IsStringMap : std::false_type {};
template <class V, class C, class A>
struct IsStringMap<std::map<std::string, V, C, A>> : std::true_type {};
template <class V, class H, class E, class A>
struct IsStringMap<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};

template <class T>
struct IsPairOrTuple : std::false_type {};
template <class A, class B>
struct IsPairOrTuple<std::pair<A, B>> : std::true_type {};
template <class... Ts>
struct IsPairOrTuple<std::tuple<Ts...>> : std::true_type {};

/// Written as a JSON string: std::string, std::string_view, const char*, char arrays.
template <class T>
concept JsonStringLike = std::is_convertible_v<const T&, std::string_view> && !std::is_same_v<T, Value>;

/// Written as a JSON object: a map whose keys convert to std::string_view.
template <class T>
concept JsonObjectLike = requires(const T& m) {
  typename T::key_type;
  typename T::mapped_type;
  { m.begin()->first } -> std::convertible_to<std::string_view>;
  m.begin()->second;
};

template <class T>
concept JsonFloat = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// Why reading a Value into a C++ value failed: the path from the root (built innermost first as the
/// failure returns up the recursion) and the reason.
struct JsonReadError {
  std::string path;
  std::string reason;
};

/// Records "expected <expected>, found <kind> <excerpt of actual>" in `err`; returns false.
bool fail_kind(JsonReadError& err, std::string_view expected, const Value& actual);
/// Records "<actual> is out of range for <type_name>" in `err`; returns false.
bool fail_range(JsonReadError& err, const Value& actual, std::string_view type_name);
/// Prefixes the path with an object key (`key.` or `["k.ey"]` when the key has '.', '[', ']' or '"').
void prepend_key(JsonReadError& err, std::string_view key);
/// Prefixes the path with an array index (`[i]`).
void prepend_index(JsonReadError& err, size_t index);
/// Turns a read failure into the kSerialization Error described in the file comment.
Error to_error(const JsonReadError& err);

enum class DecimalToInteger { kOk, kNotIntegral, kTooLarge };
/// Converts a decimal with an integral value (1.00, 12E+3) to an int128.
DecimalToInteger decimal_to_integer(const Decimal& d, int128_t& out) noexcept;

template <class T>
constexpr std::string_view integer_type_name() {
  constexpr bool s = std::is_signed_v<T>;
  switch (sizeof(T)) {
    case 1:
      return s ? "int8" : "uint8";
    case 2:
      return s ? "int16" : "uint16";
    case 4:
      return s ? "int32" : "uint32";
    default:
      return s ? "int64" : "uint64";
  }
}

template <class T>
void append_integer(T v, std::string& out) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

}  // namespace detail

/// True when T has a JSON mapping (see the file comment). Struct members and container elements are
/// checked when the mapping is used; an unsupported one fails to compile naming its type.
template <class T>
concept JsonMappable = std::is_same_v<T, bool> || std::is_integral_v<T> || std::is_enum_v<T> || detail::JsonFloat<T> ||
    std::is_same_v<T, Value> || std::is_same_v<T, std::string> || detail::IsOptional<T>::value || HasFields<T> ||
    detail::IsVector<T>::value || detail::IsStdArray<T>::value || detail::IsStringMap<T>::value ||
    detail::IsPairOrTuple<T>::value;

#define SLUICE_DETAIL_NO_JSON_MAPPING                                                                       \
  "sluice: this type has no JSON mapping (see the 'with T = ...' line). Supported: bool, integers, enums, " \
  "float, double, std::string, Value, std::optional, std::vector, std::array, std::map/unordered_map with " \
  "std::string keys, std::pair, std::tuple and structs declared with SLUICE_FIELDS (json_mapping.h)"

// ---------------------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------------------

/// Appends the compact JSON text of `v` to `out` (no whitespace between tokens). Allocation-free apart from
/// growing `out`.
template <class T>
void append_json(const T& v, std::string& out) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out += v ? "true" : "false";
  } else if constexpr (std::is_integral_v<U>) {
    detail::append_integer(v, out);
  } else if constexpr (std::is_enum_v<U>) {
    detail::append_integer(static_cast<std::underlying_type_t<U>>(v), out);
  } else if constexpr (detail::JsonFloat<U>) {
    append_json_number(v, out);
  } else if constexpr (std::is_same_v<U, Value>) {
    v.write_json(out);
  } else if constexpr (detail::JsonStringLike<U>) {
    append_json_string(std::string_view(v), out);
  } else if constexpr (detail::IsOptional<U>::value) {
    if (v.has_value()) {
      append_json(*v, out);
    } else {
      out += "null";
    }
  } else if constexpr (HasFields<U>) {
    out.push_back('{');
    bool first = true;
    for_each_field(v, [&](std::string_view name, const auto& member) {
      if (!first) out.push_back(',');
      first = false;
      append_json_string(name, out);
      out.push_back(':');
      append_json(member, out);
    });
    out.push_back('}');
  } else if constexpr (detail::JsonObjectLike<U>) {
    out.push_back('{');
    bool first = true;
    for (const auto& [key, value] : v) {
      if (!first) out.push_back(',');
      first = false;
      append_json_string(std::string_view(key), out);
      out.push_back(':');
      append_json(value, out);
    }
    out.push_back('}');
  } else if constexpr (detail::IsPairOrTuple<U>::value) {
    out.push_back('[');
    bool first = true;
    std::apply([&](const auto&... e) { ((out.append(first ? "" : ","), first = false, append_json(e, out)), ...); }, v);
    out.push_back(']');
  } else if constexpr (std::ranges::input_range<const U>) {
    using E = std::ranges::range_value_t<const U>;
    out.push_back('[');
    bool first = true;
    for (auto&& e : v) {
      if (!first) out.push_back(',');
      first = false;
      append_json(static_cast<const E&>(e), out);  // a cast, for std::vector<bool>'s proxy references
    }
    out.push_back(']');
  } else {
    static_assert(kDependentFalse<U>, SLUICE_DETAIL_NO_JSON_MAPPING);
  }
}

/// Returns the compact JSON text of `v`.
template <class T>
std::string to_json(const T& v) {
  std::string out;
  append_json(v, out);
  return out;
}

/// Appends `v` for humans (the print and text file sinks): strings as they are (no quotes, no escaping),
/// numbers plainly (as in JSON, with NaN, Infinity, -Infinity), bools as true/false, and everything else —
/// Value (a string Value too), optionals, containers, structs — as compact JSON.
template <class T>
void append_display_string(const T& v, std::string& out) {
  using U = std::remove_cvref_t<T>;
  if constexpr (detail::JsonStringLike<U>) {
    out.append(std::string_view(v));
  } else if constexpr (detail::JsonFloat<U>) {
    append_display_number(v, out);
  } else {
    append_json(v, out);
  }
}

/// Returns append_display_string's text of `v`.
template <class T>
std::string to_display_string(const T& v) {
  std::string out;
  append_display_string(v, out);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------------------

namespace detail {

template <class T>
bool read_json_value(const Value& v, T& out, JsonReadError& err);

template <class T>
bool read_json_element(const Value& v, T& out, JsonReadError& err, size_t index) {
  if (read_json_value(v, out, err)) return true;
  prepend_index(err, index);
  return false;
}

template <class T>
bool read_json_field(const Value::Object& obj, std::string_view name, T& member, JsonReadError& err) {
  const Value* fv = obj.find(name);
  if (fv == nullptr) return true;
  if (read_json_value(*fv, member, err)) return true;
  prepend_key(err, name);
  return false;
}

template <class T>
bool read_json_value(const Value& v, T& out, JsonReadError& err) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_bool()) return fail_kind(err, "bool", v);
    out = v.as_bool();
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    int128_t x = 0;
    if (v.is_int64()) {
      x = v.as_int64();
    } else if (v.is_decimal()) {
      switch (decimal_to_integer(v.as_decimal(), x)) {
        case DecimalToInteger::kOk:
          break;
        case DecimalToInteger::kNotIntegral:
          return fail_kind(err, "integer", v);
        case DecimalToInteger::kTooLarge:
          return fail_range(err, v, integer_type_name<T>());
      }
    } else if (v.is_double()) {
      const double d = v.as_double();
      if (!(d >= -0x1p127 && d < 0x1p127)) return fail_range(err, v, integer_type_name<T>());  // also NaN
      x = static_cast<int128_t>(d);
      if (static_cast<double>(x) != d) return fail_kind(err, "integer", v);
    } else {
      return fail_kind(err, "integer", v);
    }
    if (x < static_cast<int128_t>(std::numeric_limits<T>::min()) ||
        x > static_cast<int128_t>(std::numeric_limits<T>::max())) {
      return fail_range(err, v, integer_type_name<T>());
    }
    out = static_cast<T>(x);
    return true;
  } else if constexpr (std::is_enum_v<T>) {
    std::underlying_type_t<T> u{};
    if (!read_json_value(v, u, err)) return false;
    out = static_cast<T>(u);
    return true;
  } else if constexpr (JsonFloat<T>) {
    switch (v.kind()) {
      case Value::Kind::kDouble:
        out = static_cast<T>(v.as_double());
        return true;
      case Value::Kind::kInt64:
        out = static_cast<T>(v.as_int64());
        return true;
      case Value::Kind::kDecimal:
        out = static_cast<T>(v.as_decimal().to_double());
        return true;
      case Value::Kind::kNull:
        out = std::numeric_limits<T>::quiet_NaN();
        return true;
      case Value::Kind::kString:
        if (v.as_string() == "NaN") {
          out = std::numeric_limits<T>::quiet_NaN();
        } else if (v.as_string() == "Infinity") {
          out = std::numeric_limits<T>::infinity();
        } else if (v.as_string() == "-Infinity") {
          out = -std::numeric_limits<T>::infinity();
        } else {
          return fail_kind(err, "number", v);
        }
        return true;
      default:
        return fail_kind(err, "number", v);
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return fail_kind(err, "string", v);
    out.assign(v.as_string());
    return true;
  } else if constexpr (std::is_same_v<T, Value>) {
    out = v;
    return true;
  } else if constexpr (IsOptional<T>::value) {
    if (v.is_null()) {
      out.reset();
      return true;
    }
    out.emplace();
    return read_json_value(v, *out, err);
  } else if constexpr (HasFields<T>) {
    if (!v.is_object()) return fail_kind(err, "object", v);
    const Value::Object& obj = v.as_object();
    return std::apply([&](const auto&... f) { return (read_json_field(obj, f.name, out.*(f.pointer), err) && ...); },
                      kFieldsOf<T>);
  } else if constexpr (IsVector<T>::value) {
    if (!v.is_array()) return fail_kind(err, "array", v);
    const Value::Array& arr = v.as_array();
    out.clear();
    out.resize(arr.size());
    for (size_t i = 0; i < arr.size(); ++i) {
      if constexpr (std::is_same_v<typename T::value_type, bool>) {
        bool b = false;
        if (!read_json_element(arr[i], b, err, i)) return false;
        out[i] = b;
      } else {
        if (!read_json_element(arr[i], out[i], err, i)) return false;
      }
    }
    return true;
  } else if constexpr (IsStdArray<T>::value) {
    constexpr size_t kN = std::tuple_size_v<T>;
    if (!v.is_array() || v.as_array().size() != kN) {
      return fail_kind(err, "array of " + std::to_string(kN) + " elements", v);
    }
    const Value::Array& arr = v.as_array();
    for (size_t i = 0; i < kN; ++i) {
      out[i] = typename T::value_type{};
      if (!read_json_element(arr[i], out[i], err, i)) return false;
    }
    return true;
  } else if constexpr (IsStringMap<T>::value) {
    if (!v.is_object()) return fail_kind(err, "object", v);
    out.clear();
    for (const auto& [key, value] : v.as_object()) {
      auto it = out.try_emplace(key).first;
      if (!read_json_value(value, it->second, err)) {
        prepend_key(err, key);
        return false;
      }
    }
    return true;
  } else if constexpr (IsPairOrTuple<T>::value) {
    constexpr size_t kN = std::tuple_size_v<T>;
    if (!v.is_array() || v.as_array().size() != kN) {
      return fail_kind(err, "array of " + std::to_string(kN) + " elements", v);
    }
    const Value::Array& arr = v.as_array();
    return [&]<size_t... Is>(std::index_sequence<Is...>) {
      return (
          (std::get<Is>(out) = std::tuple_element_t<Is, T>{}, read_json_element(arr[Is], std::get<Is>(out), err, Is)) &&
          ...);
    }
    (std::make_index_sequence<kN>{});
  } else {
    static_assert(kDependentFalse<T>, SLUICE_DETAIL_NO_JSON_MAPPING);
    return false;
  }
}

}  // namespace detail

/// Reads `v` into `out` by the rules in the file comment. Returns a kSerialization error naming the path of
/// the first mismatch.
template <class T>
[[nodiscard]] Status from_value(const Value& v, T& out) {
  detail::JsonReadError err;
  if (detail::read_json_value(v, out, err)) return ok_status();
  return detail::to_error(err);
}

/// Parses one JSON document with Value::from_json and reads it into `out` with from_value. Returns the
/// parse error (kSerialization, with byte offset, line and column) or the mapping error.
template <class T>
[[nodiscard]] Status from_json(std::string_view json, T& out) {
  Result<Value> parsed = Value::from_json(json);
  if (!parsed.ok()) return parsed.error();
  if constexpr (std::is_same_v<T, Value>) {
    out = std::move(parsed).value();
    return ok_status();
  } else {
    return from_value(*parsed, out);
  }
}

}  // namespace sluice
