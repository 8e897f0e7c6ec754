// TypeSerializer<T>: how a record, key or state value of type T becomes bytes and back.
//
// Used between tasks (records in network buffers), for key-group hashing (the serialized key bytes) and in
// checkpoints, so the format is documented and versioned: docs/serialization.md, format version
// kSerializationFormatVersion. Changing an encoding requires a new version.
//
// A specialization provides:
//   static void serialize(const T& value, DataOutput& out);
//   static void deserialize(T& target, DataInput& in);  // overwrites target, reusing its storage
//   static constexpr size_t min_encoded_size();         // optional; fewest bytes a value encodes to (default 1)
// and may throw SluiceException (ErrorCode::kSerialization) on corrupt input. Serializers are stateless and
// thread-safe. A type without a serializer fails to compile with a static_assert naming TypeSerializer<T>.
//
// Provided here: arithmetic types (not long double), bool, enums, std::string, std::vector, std::array,
// std::optional, std::pair, std::tuple, std::variant, std::monostate, std::map, std::unordered_map, and
// structs whose members are declared with SLUICE_FIELDS:
//
//   namespace shop {
//   struct Charge { std::string id, customer, status; int64_t amount_cents; int64_t ts_ms; };
//   SLUICE_FIELDS(Charge, id, customer, status, amount_cents, ts_ms);
//   }
//
// Deserialization reuses the target: strings and vectors keep their capacity, engaged optionals and the
// active variant alternative are overwritten in place, and map nodes are recycled. Container element types
// must be default-constructible. If deserialization throws, the target is valid but unspecified.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"

namespace sluice {

/// Version of the binary format written by all TypeSerializers (stored in checkpoints and savepoints).
inline constexpr uint32_t kSerializationFormatVersion = 1;

template <class T>
inline constexpr bool kDependentFalse = false;

// A macro because a static_assert message must be a string literal.
#define SLUICE_DETAIL_NO_SERIALIZER                                                                          \
  "sluice::TypeSerializer<T> has no specialization for this type (see the 'with T = ...' line; a container " \
  "is serializable only if its element types are): declare the struct's members with "                       \
  "SLUICE_FIELDS(Type, member, ...) or specialize sluice::TypeSerializer<T>"

/// Primary template: no serializer. Specialize it, or declare a struct's members with SLUICE_FIELDS.
///
/// The static_assert sits in the member functions rather than the class body so that the Serializable
/// concept can instantiate the class to look for the `Unsupported` marker without firing it; any real use
/// (calling serialize or deserialize) still fails to compile with this message.
template <class T, class Enable = void>
struct TypeSerializer {
  /// Marks "no serializer"; specializations must not declare it.
  using Unsupported = void;

  static void serialize(const T&, DataOutput&) { static_assert(kDependentFalse<T>, SLUICE_DETAIL_NO_SERIALIZER); }
  static void deserialize(T&, DataInput&) { static_assert(kDependentFalse<T>, SLUICE_DETAIL_NO_SERIALIZER); }
};

/// True when TypeSerializer<T> is specialized (usable in requires-clauses without triggering the
/// primary template's static_assert). Containers are Serializable only when their element types are.
/// A SLUICE_FIELDS struct is Serializable even if a member is not; using its serializer then fails to
/// compile naming the member's type.
template <class T>
concept Serializable = std::is_object_v<T> && !requires {
  typename TypeSerializer<T>::Unsupported;
}
&&requires(const T& v, T& t, DataOutput& o, DataInput& i) {
  TypeSerializer<T>::serialize(v, o);
  TypeSerializer<T>::deserialize(t, i);
};

/// Serializes `value` with its TypeSerializer, appending to `out`.
template <class T>
void serialize(const T& value, DataOutput& out) {
  TypeSerializer<T>::serialize(value, out);
}

/// Deserializes into `target` with its TypeSerializer, reusing target's storage.
/// Throws SluiceException (ErrorCode::kSerialization) on truncated or corrupt input.
template <class T>
void deserialize(T& target, DataInput& in) {
  TypeSerializer<T>::deserialize(target, in);
}

// ---------------------------------------------------------------------------------------------------------
// Struct field lists (SLUICE_FIELDS)
// ---------------------------------------------------------------------------------------------------------

/// One declared member of a struct: its name as written in SLUICE_FIELDS and its member pointer.
/// A literal type, so whole field lists are compile-time constants.
template <class Class, class Member>
struct Field {
  using ClassType = Class;
  using MemberType = Member;
  std::string_view name;
  Member Class::*pointer;
};

/// Makes a Field; used by SLUICE_FIELDS and by hand-written StructFields specializations.
template <class Class, class Member>
constexpr Field<Class, Member> field(std::string_view name, Member Class::*pointer) noexcept {
  return {name, pointer};
}

/// ADL tag for the `sluice_fields` function that SLUICE_FIELDS defines in the struct's namespace. A tag
/// (rather than a `const T*`) keeps a derived struct from silently using its base's field list.
template <class T>
struct FieldsTag {};

/// The declared fields of T: `static constexpr auto fields()` returns a std::tuple of Field<T, M>, in
/// declaration order. By default it finds the list SLUICE_FIELDS declared; it may also be specialized
/// directly (at namespace sluice scope) for a type whose namespace cannot be reopened.
template <class T>
struct StructFields {
  static constexpr auto fields() requires requires { sluice_fields(FieldsTag<T>{}); }
  { return sluice_fields(FieldsTag<T>{}); }
};

/// True when T has a field list (SLUICE_FIELDS or a StructFields specialization).
template <class T>
concept HasFields = std::is_class_v<T> && requires {
  StructFields<T>::fields();
};

/// The field list of T as a compile-time tuple of Field<T, M>, in declaration order.
template <HasFields T>
inline constexpr auto kFieldsOf = StructFields<T>::fields();

/// The number of declared fields of T.
template <HasFields T>
inline constexpr size_t kFieldCount = std::tuple_size_v<std::remove_const_t<decltype(kFieldsOf<T>)>>;

/// The declared field names of T, in declaration order.
template <HasFields T>
constexpr std::array<std::string_view, kFieldCount<T>> field_names() noexcept {
  return std::apply([](const auto&... f) { return std::array<std::string_view, sizeof...(f)>{f.name...}; },
                    kFieldsOf<T>);
}

/// Calls `fn(std::string_view name, Member& member)` for each declared field of `obj`, in declaration
/// order (`const Member&` when obj is const).
template <class T, class Fn>
requires HasFields<std::remove_const_t<T>>
constexpr void for_each_field(T& obj, Fn&& fn) {
  std::apply([&](const auto&... f) { (fn(f.name, obj.*(f.pointer)), ...); }, kFieldsOf<std::remove_const_t<T>>);
}

namespace detail {

template <class T>
constexpr bool field_names_unique() {
  constexpr auto names = field_names<T>();
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j]) return false;
    }
  }
  return true;
}

// A lower bound on the encoded size of one T; bounds a decoded element count by the bytes left, so a
// corrupt count cannot make deserialization allocate more than a small multiple of its input.
template <class T>
constexpr size_t min_encoded_size() {
  if constexpr (requires { TypeSerializer<T>::min_encoded_size(); }) {
    return TypeSerializer<T>::min_encoded_size();
  } else {
    return 1;
  }
}

// Reads a varint element count and rejects one the remaining bytes cannot hold.
inline size_t read_count(DataInput& in, size_t min_element_size) {
  uint64_t n = in.read_varint();
  if (n > in.remaining() / min_element_size) {
    in.fail("element count " + std::to_string(n) + " exceeds what the " + std::to_string(in.remaining()) +
            " remaining bytes can hold");
  }
  return static_cast<size_t>(n);
}

template <class T>
concept FixedWidthArithmetic = std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, long double>;

template <class T>
struct IsBitwise : std::bool_constant<FixedWidthArithmetic<T>> {};
template <class T>
requires std::is_enum_v<T>
struct IsBitwise<T> : std::bool_constant<FixedWidthArithmetic<std::underlying_type_t<T>>> {
};
template <class T, size_t N>
struct IsBitwise<std::array<T, N>>
    : std::bool_constant<IsBitwise<T>::value && sizeof(std::array<T, N>) == N * sizeof(T)> {};

// True when T's encoding is exactly its in-memory bytes (little-endian hosts), so arrays of T can be
// copied with one memcpy. bool is excluded because a byte other than 0/1 must be rejected, not stored.
template <class T>
inline constexpr bool kBitwise = IsBitwise<T>::value;

template <class T>
constexpr void check_countable() {
  static_assert(min_encoded_size<T>() > 0,
                "sluice::TypeSerializer: containers of elements that encode to zero bytes (std::tuple<>, "
                "std::monostate, std::array<T, 0>) are not supported: their element count could not be "
                "bounds-checked against the input");
}

// Shared by std::map and std::unordered_map: recycles the target's nodes (and the strings or vectors in
// them) by extracting each, decoding into its key and value, and reinserting it.
template <class Map>
void read_map(Map& target, DataInput& in) {
  using K = typename Map::key_type;
  using V = typename Map::mapped_type;
  size_t n = read_count(in, min_encoded_size<K>() + min_encoded_size<V>());
  Map spare = std::move(target);
  target.clear();
  if constexpr (requires { target.reserve(n); }) target.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!spare.empty()) {
      auto node = spare.extract(spare.begin());
      ::sluice::deserialize(node.key(), in);
      ::sluice::deserialize(node.mapped(), in);
      if (!target.insert(std::move(node)).inserted) in.fail("duplicate map key");
    } else {
      K key{};
      ::sluice::deserialize(key, in);
      auto [it, inserted] = target.try_emplace(std::move(key));
      if (!inserted) in.fail("duplicate map key");
      ::sluice::deserialize(it->second, in);
    }
  }
}

template <class Map>
void write_map(const Map& value, DataOutput& out) {
  out.write_varint(value.size());
  for (const auto& [k, v] : value) {
    ::sluice::serialize(k, out);
    ::sluice::serialize(v, out);
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------------------

/// Arithmetic types: their little-endian bytes, natural width (IEEE-754 for float and double).
/// long double has no portable layout and is not supported.
template <detail::FixedWidthArithmetic T>
struct TypeSerializer<T> {
  static void serialize(const T& v, DataOutput& out) { out.write_fixed(v); }
  static void deserialize(T& target, DataInput& in) { target = in.read_fixed<T>(); }
  static constexpr size_t min_encoded_size() { return sizeof(T); }
};

/// bool: one byte, 0 or 1; any other byte is corrupt input.
template <>
struct TypeSerializer<bool> {
  static void serialize(const bool& v, DataOutput& out) { out.write_u8(v ? 1 : 0); }
  static void deserialize(bool& target, DataInput& in) {
    uint8_t b = in.read_u8();
    if (b > 1) in.fail("bool byte " + std::to_string(b) + " is neither 0 nor 1");
    target = b == 1;
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// Enums: encoded as their underlying integer type.
template <class T>
requires std::is_enum_v<T>
struct TypeSerializer<T> {
  using Underlying = std::underlying_type_t<T>;
  static void serialize(const T& v, DataOutput& out) {
    TypeSerializer<Underlying>::serialize(static_cast<Underlying>(v), out);
  }
  static void deserialize(T& target, DataInput& in) {
    Underlying u{};
    TypeSerializer<Underlying>::deserialize(u, in);
    target = static_cast<T>(u);
  }
  static constexpr size_t min_encoded_size() { return detail::min_encoded_size<Underlying>(); }
};

/// std::string: varint length, then the bytes.
template <>
struct TypeSerializer<std::string> {
  static void serialize(const std::string& v, DataOutput& out) { out.write_string(v); }
  static void deserialize(std::string& target, DataInput& in) { in.read_string(target); }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// std::monostate: no bytes (the empty alternative of a variant).
template <>
struct TypeSerializer<std::monostate> {
  static void serialize(const std::monostate&, DataOutput&) {}
  static void deserialize(std::monostate&, DataInput&) {}
  static constexpr size_t min_encoded_size() { return 0; }
};

// ---------------------------------------------------------------------------------------------------------
// Containers
// ---------------------------------------------------------------------------------------------------------

/// std::vector<T>: varint count, then each element. Vectors of fixed-width arithmetic or enum elements are
/// copied as one block (the same bytes). Deserialization resizes the target and decodes in place.
template <Serializable T, class A>
struct TypeSerializer<std::vector<T, A>> {
  static void serialize(const std::vector<T, A>& v, DataOutput& out) {
    out.write_varint(v.size());
    if constexpr (detail::kBitwise<T>) {
      out.write_bytes(v.data(), v.size() * sizeof(T));
    } else {
      for (const T& e : v)
        ::sluice::serialize(e, out);
    }
  }
  static void deserialize(std::vector<T, A>& target, DataInput& in) {
    detail::check_countable<T>();
    size_t n = detail::read_count(in, detail::min_encoded_size<T>());
    target.resize(n);
    if constexpr (detail::kBitwise<T>) {
      in.read_bytes(target.data(), n * sizeof(T));
    } else {
      for (T& e : target)
        ::sluice::deserialize(e, in);
    }
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// std::vector<bool>: varint count, then one byte (0 or 1) per element.
template <class A>
struct TypeSerializer<std::vector<bool, A>> {
  static void serialize(const std::vector<bool, A>& v, DataOutput& out) {
    out.write_varint(v.size());
    for (bool b : v)
      out.write_u8(b ? 1 : 0);
  }
  static void deserialize(std::vector<bool, A>& target, DataInput& in) {
    size_t n = detail::read_count(in, 1);
    target.resize(n);
    for (size_t i = 0; i < n; ++i) {
      bool b = false;
      TypeSerializer<bool>::deserialize(b, in);
      target[i] = b;
    }
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// std::array<T, N>: the N elements, no count.
template <Serializable T, size_t N>
struct TypeSerializer<std::array<T, N>> {
  static void serialize(const std::array<T, N>& v, DataOutput& out) {
    if constexpr (detail::kBitwise<T>) {
      out.write_bytes(v.data(), N * sizeof(T));
    } else {
      for (const T& e : v)
        ::sluice::serialize(e, out);
    }
  }
  static void deserialize(std::array<T, N>& target, DataInput& in) {
    if constexpr (detail::kBitwise<T>) {
      in.read_bytes(target.data(), N * sizeof(T));
    } else {
      for (T& e : target)
        ::sluice::deserialize(e, in);
    }
  }
  static constexpr size_t min_encoded_size() { return N * detail::min_encoded_size<T>(); }
};

/// std::optional<T>: one byte 0 (empty) or 1 followed by the value. An engaged target is decoded in place.
template <Serializable T>
struct TypeSerializer<std::optional<T>> {
  static void serialize(const std::optional<T>& v, DataOutput& out) {
    out.write_u8(v.has_value() ? 1 : 0);
    if (v) ::sluice::serialize(*v, out);
  }
  static void deserialize(std::optional<T>& target, DataInput& in) {
    uint8_t tag = in.read_u8();
    if (tag == 0) {
      target.reset();
    } else if (tag == 1) {
      if (!target) target.emplace();
      ::sluice::deserialize(*target, in);
    } else {
      in.fail("optional tag " + std::to_string(tag) + " is neither 0 nor 1");
    }
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// std::pair<A, B>: first, then second.
template <Serializable A, Serializable B>
struct TypeSerializer<std::pair<A, B>> {
  static void serialize(const std::pair<A, B>& v, DataOutput& out) {
    ::sluice::serialize(v.first, out);
    ::sluice::serialize(v.second, out);
  }
  static void deserialize(std::pair<A, B>& target, DataInput& in) {
    ::sluice::deserialize(target.first, in);
    ::sluice::deserialize(target.second, in);
  }
  static constexpr size_t min_encoded_size() { return detail::min_encoded_size<A>() + detail::min_encoded_size<B>(); }
};

/// std::tuple<Ts...>: the elements in order, no count.
template <Serializable... Ts>
struct TypeSerializer<std::tuple<Ts...>> {
  static void serialize(const std::tuple<Ts...>& v, DataOutput& out) {
    std::apply([&](const Ts&... e) { (::sluice::serialize(e, out), ...); }, v);
  }
  static void deserialize(std::tuple<Ts...>& target, DataInput& in) {
    std::apply([&](Ts&... e) { (::sluice::deserialize(e, in), ...); }, target);
  }
  static constexpr size_t min_encoded_size() { return (size_t{0} + ... + detail::min_encoded_size<Ts>()); }
};

/// std::variant<Ts...>: varint alternative index, then the alternative. If the target already holds that
/// alternative it is decoded in place; otherwise the alternative is default-constructed first.
/// Serializing a valueless_by_exception variant throws SluiceException (kSerialization).
template <Serializable... Ts>
struct TypeSerializer<std::variant<Ts...>> {
  static void serialize(const std::variant<Ts...>& v, DataOutput& out) {
    if (v.valueless_by_exception()) {
      throw SluiceException(Error(ErrorCode::kSerialization, "cannot serialize a valueless std::variant"));
    }
    out.write_varint(v.index());
    std::visit([&](const auto& alt) { ::sluice::serialize(alt, out); }, v);
  }
  static void deserialize(std::variant<Ts...>& target, DataInput& in) {
    uint64_t index = in.read_varint();
    if (index >= sizeof...(Ts)) {
      in.fail("variant index " + std::to_string(index) + " out of range for " + std::to_string(sizeof...(Ts)) +
              " alternatives");
    }
    [&]<size_t... Is>(std::index_sequence<Is...>) {
      (void)((index == Is && (read_alternative<Is>(target, in), true)) || ...);
    }
    (std::index_sequence_for<Ts...>{});
  }
  static constexpr size_t min_encoded_size() { return 1; }

 private:
  template <size_t I>
  static void read_alternative(std::variant<Ts...>& target, DataInput& in) {
    if (target.index() != I) target.template emplace<I>();
    ::sluice::deserialize(*std::get_if<I>(&target), in);
  }
};

/// std::map<K, V>: varint count, then key and value of each entry in the map's (sorted) order.
/// Deserialization recycles the target's nodes; a repeated key is corrupt input.
template <Serializable K, Serializable V, class C, class A>
struct TypeSerializer<std::map<K, V, C, A>> {
  static void serialize(const std::map<K, V, C, A>& v, DataOutput& out) { detail::write_map(v, out); }
  static void deserialize(std::map<K, V, C, A>& target, DataInput& in) {
    detail::check_countable<std::pair<K, V>>();
    detail::read_map(target, in);
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

/// std::unordered_map<K, V>: like std::map, in iteration order. The bytes are therefore not canonical
/// (equal maps may encode differently), so an unordered_map must never be used as, or inside, a key type:
/// key groups hash the serialized key bytes.
template <Serializable K, Serializable V, class H, class E, class A>
struct TypeSerializer<std::unordered_map<K, V, H, E, A>> {
  static void serialize(const std::unordered_map<K, V, H, E, A>& v, DataOutput& out) { detail::write_map(v, out); }
  static void deserialize(std::unordered_map<K, V, H, E, A>& target, DataInput& in) {
    detail::check_countable<std::pair<K, V>>();
    detail::read_map(target, in);
  }
  static constexpr size_t min_encoded_size() { return 1; }
};

// ---------------------------------------------------------------------------------------------------------
// Structs
// ---------------------------------------------------------------------------------------------------------

/// Structs with a field list (SLUICE_FIELDS): the members in declaration order, no names, no count.
template <HasFields T>
struct TypeSerializer<T> {
  static_assert(detail::field_names_unique<T>(), "SLUICE_FIELDS lists a member twice");

  static void serialize(const T& v, DataOutput& out) {
    std::apply([&](const auto&... f) { (::sluice::serialize(v.*(f.pointer), out), ...); }, kFieldsOf<T>);
  }
  static void deserialize(T& target, DataInput& in) {
    std::apply([&](const auto&... f) { (::sluice::deserialize(target.*(f.pointer), in), ...); }, kFieldsOf<T>);
  }
  static constexpr size_t min_encoded_size() {
    return std::apply(
        [](const auto&... f) {
          return (size_t{0} + ... + detail::min_encoded_size<typename std::remove_cvref_t<decltype(f)>::MemberType>());
        },
        kFieldsOf<T>);
  }
};

}  // namespace sluice

// ---------------------------------------------------------------------------------------------------------
// SLUICE_FIELDS(Type, member...): declares a struct's members (1 to 32, public, in declaration order) for
// serialization and name-based mappings (JSON). Place it at namespace scope in the struct's own namespace,
// right after the struct, and end it with a semicolon. Type must be a plain (possibly qualified) name;
// alias a template specialization first. It defines `constexpr auto sluice_fields(sluice::FieldsTag<Type>)`
// (found by argument-dependent lookup), so it may appear in a header.
// ---------------------------------------------------------------------------------------------------------

#define SLUICE_FIELDS(Type, ...)                                                              \
  [[maybe_unused]] constexpr auto sluice_fields(::sluice::FieldsTag<Type>) {                  \
    return ::std::make_tuple(SLUICE_DETAIL_FOR_EACH(SLUICE_DETAIL_FIELD, Type, __VA_ARGS__)); \
  }                                                                                           \
  static_assert(::std::is_class_v<Type>, "SLUICE_FIELDS(" #Type ", ...) needs a struct or class type")

#define SLUICE_DETAIL_FIELD(Type, member) ::sluice::field(#member, &Type::member)

#define SLUICE_DETAIL_CAT(a, b) SLUICE_DETAIL_CAT_(a, b)
#define SLUICE_DETAIL_CAT_(a, b) a##b

// The trailing 0 keeps the variadic part of SLUICE_DETAIL_COUNT_ non-empty for every supported count.
#define SLUICE_DETAIL_COUNT(...)                                                                                    \
  SLUICE_DETAIL_COUNT_(__VA_ARGS__, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, \
                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define SLUICE_DETAIL_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, \
                             _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, N, ...)              \
  N

#define SLUICE_DETAIL_FOR_EACH(F, T, ...) \
  SLUICE_DETAIL_CAT(SLUICE_DETAIL_FE_, SLUICE_DETAIL_COUNT(__VA_ARGS__))(F, T, __VA_ARGS__)

#define SLUICE_DETAIL_FE_1(F, T, a) F(T, a)
#define SLUICE_DETAIL_FE_2(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_1(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_3(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_2(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_4(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_3(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_5(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_4(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_6(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_5(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_7(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_6(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_8(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_7(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_9(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_8(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_10(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_9(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_11(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_10(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_12(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_11(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_13(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_12(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_14(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_13(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_15(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_14(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_16(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_15(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_17(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_16(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_18(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_17(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_19(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_18(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_20(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_19(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_21(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_20(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_22(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_21(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_23(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_22(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_24(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_23(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_25(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_24(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_26(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_25(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_27(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_26(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_28(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_27(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_29(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_28(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_30(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_29(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_31(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_30(F, T, __VA_ARGS__)
#define SLUICE_DETAIL_FE_32(F, T, a, ...) F(T, a), SLUICE_DETAIL_FE_31(F, T, __VA_ARGS__)
