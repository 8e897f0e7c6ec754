// TypeSerializer<T>: how a record, key or state value of type T becomes bytes and back.
//
// Used between tasks (records in network buffers), for key-group hashing (the serialized key bytes) and in
// checkpoints, so the format is documented and versioned: docs/serialization.md, format version
// kSerializationFormatVersion. Changing an encoding requires a new version.
//
// A specialization provides:
//   static void serialize(const T& value, DataOutput& out);
//   static void deserialize(T& target, DataInput& in);  // overwrites target, reusing its storage
// and may throw SluiceException (ErrorCode::kSerialization) on corrupt input. Serializers are stateless and
// thread-safe. A type without a serializer fails to compile with a static_assert naming TypeSerializer<T>.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "sluice/core/data_io.h"

namespace sluice {

/// Version of the binary format written by all TypeSerializers (stored in checkpoints and savepoints).
inline constexpr uint32_t kSerializationFormatVersion = 1;

template <class T>
inline constexpr bool kDependentFalse = false;

/// Primary template: no serializer. Specialize it, or declare a struct's members with SLUICE_FIELDS.
template <class T, class Enable = void>
struct TypeSerializer {
  static_assert(kDependentFalse<T>,
                "sluice::TypeSerializer<T> has no specialization for this type (see the 'with T = ...' line): "
                "declare the struct's members with SLUICE_FIELDS(Type, member, ...) or specialize "
                "sluice::TypeSerializer<T>");
};

/// True when TypeSerializer<T> is specialized (usable in requires-clauses).
template <class T>
concept Serializable = requires(const T& v, T& t, DataOutput& o, DataInput& i) {
  TypeSerializer<T>::serialize(v, o);
  TypeSerializer<T>::deserialize(t, i);
};

/// Arithmetic types and enums: their little-endian bytes, natural width. bool is one byte (0 or 1).
template <class T>
struct TypeSerializer<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>>> {
  static void serialize(const T& v, DataOutput& out) { out.write_fixed(v); }
  static void deserialize(T& target, DataInput& in) { target = in.read_fixed<T>(); }
};

/// std::string: varint length, then the bytes.
template <>
struct TypeSerializer<std::string> {
  static void serialize(const std::string& v, DataOutput& out) { out.write_string(v); }
  static void deserialize(std::string& target, DataInput& in) { in.read_string(target); }
};

/// Serializes `value` with its TypeSerializer.
template <class T>
void serialize(const T& value, DataOutput& out) {
  TypeSerializer<T>::serialize(value, out);
}

/// Deserializes into `target` with its TypeSerializer.
template <class T>
void deserialize(T& target, DataInput& in) {
  TypeSerializer<T>::deserialize(target, in);
}

}  // namespace sluice
