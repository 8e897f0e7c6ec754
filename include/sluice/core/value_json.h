// The JSON text of values JSON has no literal for, and the choices a writer has for them (docs/value.md).
//
// Value::to_json() writes a double NaN as "NaN" and ±infinity as "Infinity" / "-Infinity" (strings: what
// Postgres prints, what Debezium's and Flink's JSON formats write), never as null, which would turn a value
// into "no value". A timestamp of INT64_MAX / INT64_MIN microseconds is +/- infinity (Postgres' own
// representation of 'infinity'::timestamp, which the CDC source maps to it) and is written "infinity" /
// "-infinity"; every finite timestamp lies strictly between them. write_json() below lets a caller choose
// null (the lossy behaviour of JSON.stringify) or an error instead of the strings.
//
// Thread-safety: free functions on values the caller owns; safe to call concurrently.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice {

/// The timestamp (µs) that stands for +infinity ('infinity'::timestamp in Postgres).
inline constexpr int64_t kTimestampInfinity = std::numeric_limits<int64_t>::max();
/// The timestamp (µs) that stands for -infinity.
inline constexpr int64_t kTimestampMinusInfinity = std::numeric_limits<int64_t>::min();

/// True when a timestamp of `micros` is one of the two infinities.
constexpr bool is_infinite_timestamp(int64_t micros) noexcept {
  return micros == kTimestampInfinity || micros == kTimestampMinusInfinity;
}

/// How a double NaN or ±infinity is written as JSON.
enum class NonFiniteFloats : uint8_t {
  kString,  ///< "NaN", "Infinity", "-Infinity" (the default of Value::to_json)
  kNull,    ///< null (loses the value: reads back as "no value")
  kFail,    ///< a kSerialization error naming the value
};

/// Options of write_json().
struct JsonWriteOptions {
  NonFiniteFloats non_finite_floats = NonFiniteFloats::kString;
};

/// Appends the JSON text of `value` to `out`, as Value::write_json() does except for the options. Returns a
/// kSerialization error (and leaves `out` as it was) when a non-finite double is met under kFail.
[[nodiscard]] Status write_json(const Value& value, std::string& out, const JsonWriteOptions& options);

}  // namespace sluice
