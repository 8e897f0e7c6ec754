// Records read from Kafka and how their bytes become values (Flink's KafkaRecordDeserializationSchema).
//
// A KafkaSource<T> turns each consumed message into one T with a KafkaDeserializer<T>: a callable that gets
// a KafkaMessageView (key, value, headers, topic, partition, offset, timestamp; borrowed for the call) and
// fills a default-constructed T, or returns an error whose message is the reason the message is bad. An
// exception thrown by a deserializer counts as such an error (its what() is the reason). What happens to a
// bad message is the source's BadRecordPolicy (kafka_source.h).
//
// Provided deserializers (namespace sluice::kafka):
//   bytes_value()      the value's bytes as a std::string, unchecked; a null value (tombstone) reads as ""
//   string_value()     the value as UTF-8 text (std::string); invalid UTF-8 is a bad record; null reads as ""
//   json_value<T>()    the value parsed as one JSON document into a Value (the default T), or into any
//                      JsonMappable type (SLUICE_FIELDS structs) with from_json (json_mapping.h), which is
//                      strict: a missing/mistyped field is a bad record naming the field. A null value reads
//                      as Value::null() for Value and is a bad record for other types
//   record(d)          wraps a value deserializer `d` into a KafkaRecord<V>: the value plus key, headers,
//                      topic, partition, offset and timestamp
//
// Thread-safety: a deserializer is copied into every reader subtask and called on that subtask's task thread
// only; a user deserializer must not share mutable state between copies without synchronization.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/core/json_mapping.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"

struct rd_kafka_message_s;

namespace sluice {

/// What a message's timestamp means (Kafka's `message.timestamp.type` of the topic).
enum class KafkaTimestampType : int8_t {
  kNone = 0,           ///< the message has no timestamp (timestamp_ms is -1)
  kCreateTime = 1,     ///< set by the producer
  kLogAppendTime = 2,  ///< set by the broker when it appended the message
};

/// One message header. Kafka allows duplicate keys; order is kept.
struct KafkaHeader {
  std::string key;
  std::optional<std::string> value;  ///< nullopt for a null header value
  friend bool operator==(const KafkaHeader&, const KafkaHeader&) = default;
};
SLUICE_FIELDS(KafkaHeader, key, value);

/// A consumed message, borrowed from the consumer for the duration of a deserializer call (its string_views
/// are invalid afterwards).
struct KafkaMessageView {
  std::string_view topic;
  int32_t partition = 0;
  int64_t offset = 0;
  /// Milliseconds since the Unix epoch, or -1 when the message has none.
  TimestampMs timestamp_ms = -1;
  KafkaTimestampType timestamp_type = KafkaTimestampType::kNone;
  /// nullopt for a null key.
  std::optional<std::string_view> key;
  /// nullopt for a null value (a tombstone).
  std::optional<std::string_view> value;
  /// The librdkafka message (nullptr in tests), read by headers().
  const rd_kafka_message_s* raw = nullptr;
  /// Headers used by headers() when `raw` is nullptr (tests, non-librdkafka callers).
  std::span<const KafkaHeader> fixed_headers;

  /// The message's headers in order (parsed on each call; empty when it has none).
  std::vector<KafkaHeader> headers() const;
};

/// A message's value of type T with its key, headers and position. Serializable (between tasks, in state)
/// when T is; JSON-mappable when T is.
template <class T>
struct KafkaRecord {
  std::optional<std::string> key;  ///< the key's bytes; nullopt for a null key
  T value{};
  std::vector<KafkaHeader> headers;
  std::string topic;
  int32_t partition = 0;
  int64_t offset = 0;
  TimestampMs timestamp_ms = -1;  ///< ms since the Unix epoch; -1 when the message has none
  KafkaTimestampType timestamp_type = KafkaTimestampType::kNone;
  friend bool operator==(const KafkaRecord&, const KafkaRecord&) = default;
};

/// The field list of KafkaRecord<T> (what SLUICE_FIELDS declares for non-template structs).
template <class T>
constexpr auto sluice_fields(FieldsTag<KafkaRecord<T>>) {
  using R = KafkaRecord<T>;
  return std::make_tuple(field("key", &R::key), field("value", &R::value), field("headers", &R::headers),
                         field("topic", &R::topic), field("partition", &R::partition), field("offset", &R::offset),
                         field("timestamp_ms", &R::timestamp_ms), field("timestamp_type", &R::timestamp_type));
}

/// Turns a message into a T (see the file comment). `out` is default-constructed; a returned error's message
/// is the reason the message is bad.
template <class T>
using KafkaDeserializer = std::function<Status(const KafkaMessageView& message, T& out)>;

namespace kafka {

/// The value's bytes, unchecked ("" for a null value).
KafkaDeserializer<std::string> bytes_value();

/// The value as UTF-8 text ("" for a null value); invalid UTF-8 is an error naming the first bad byte.
KafkaDeserializer<std::string> string_value();

/// Parses `bytes` as one JSON document into `out` (a Value, or a JsonMappable type through from_json).
template <JsonMappable T>
Status parse_json_bytes(std::string_view bytes, T& out) {
  if constexpr (std::is_same_v<T, Value>) {
    Result<Value> v = Value::from_json(bytes);
    if (!v.ok()) return v.error();
    out = std::move(v).value();
    return ok_status();
  } else {
    return from_json(bytes, out);
  }
}

/// The value parsed as JSON into T (Value by default; see the file comment for null values).
template <JsonMappable T = Value>
KafkaDeserializer<T> json_value() {
  return [](const KafkaMessageView& m, T& out) -> Status {
    if (!m.value) {
      if constexpr (std::is_same_v<T, Value>) {
        out = Value::null();
        return ok_status();
      } else {
        return Error(ErrorCode::kSerialization, "the value is null (a tombstone), expected a JSON document");
      }
    }
    return parse_json_bytes(*m.value, out);
  };
}

/// Copies key, headers, topic, partition, offset and timestamp of `m` into `out` (not the value).
template <class V>
void copy_metadata(const KafkaMessageView& m, KafkaRecord<V>& out) {
  if (m.key) {
    out.key.emplace(*m.key);
  } else {
    out.key.reset();
  }
  out.headers = m.headers();
  out.topic.assign(m.topic);
  out.partition = m.partition;
  out.offset = m.offset;
  out.timestamp_ms = m.timestamp_ms;
  out.timestamp_type = m.timestamp_type;
}

/// Wraps a value deserializer: the value and the message's metadata as a KafkaRecord<V>.
template <class V>
KafkaDeserializer<KafkaRecord<V>> record(KafkaDeserializer<V> value_deserializer) {
  return [d = std::move(value_deserializer)](const KafkaMessageView& m, KafkaRecord<V>& out) -> Status {
    Status st = d(m, out.value);
    if (!st.ok()) return st;
    copy_metadata(m, out);
    return ok_status();
  };
}

/// Calls `d` and turns an exception into an error whose message is its what() (for the bad-record policy).
template <class T>
Status deserialize_message(const KafkaDeserializer<T>& d, const KafkaMessageView& m, T& out) {
  try {
    return d(m, out);
  } catch (const SluiceException& e) {
    return e.error();
  } catch (const std::exception& e) {
    return Error(ErrorCode::kSerialization, std::string("the deserializer threw: ") + e.what());
  } catch (...) {
    return Error(ErrorCode::kSerialization, "the deserializer threw an exception that is not a std::exception");
  }
}

}  // namespace kafka

}  // namespace sluice
