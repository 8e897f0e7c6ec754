// Private to src/sluice/connectors/kafka/: the recovery copy of an exactly-once Kafka sink's transaction (the
// encoded records a committable carries, so that a restore can publish them again; kafka_sink.h's file comment).
// Implemented in kafka_recovery_copy.cc. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/data_io.h"

namespace sluice {
namespace detail {

/// One record of a recovery copy, as decoded (views into the copy's bytes).
struct RecoveryRecord {
  std::string_view topic;
  int32_t partition = KafkaProducerRecord::kAnyPartition;
  int64_t timestamp_ms = 0;  ///< 0: none
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;
  std::vector<std::pair<std::string_view, std::optional<std::string_view>>> headers;
};

/// Appends records to a recovery copy: per record a flags byte (key present, value present, topic repeated),
/// the topic (omitted when it repeats the previous record's), signed-varint partition and timestamp, key,
/// value, and headers as varint-length strings (docs/serialization.md primitives). Not thread-safe.
class RecoveryCopyWriter {
 public:
  void append(const KafkaProducerRecord& record, int32_t partition, int64_t timestamp_ms);
  int64_t count() const noexcept { return count_; }
  size_t bytes() const noexcept { return out_.size(); }
  /// Returns the encoded copy and resets the writer (keeping its capacity).
  std::string take();

 private:
  DataOutput out_;
  std::string last_topic_;
  int64_t count_ = 0;
};

/// Reads a recovery copy written by RecoveryCopyWriter. Throws SluiceException (kSerialization) on corrupt
/// bytes. The copy must outlive the reader and the records it returns.
class RecoveryCopyReader {
 public:
  explicit RecoveryCopyReader(std::string_view bytes) : in_(bytes) {}
  /// Decodes the next record into `out`; false at the end.
  bool next(RecoveryRecord& out);

 private:
  DataInput in_;
  std::string_view last_topic_;
};

}  // namespace detail
}  // namespace sluice
