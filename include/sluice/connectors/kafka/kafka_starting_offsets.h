// Where a KafkaSource (kafka_source.h) starts the partitions it finds: KafkaStartingOffsets (Flink's
// OffsetsInitializer) and KafkaOffsetReset. Immutable values, thread-safe to share.
#pragma once

#include <map>
#include <string>

#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/core/clock.h"

namespace sluice {

/// Where to start a partition that has no usable committed or explicit offset (Kafka's OffsetResetStrategy).
enum class KafkaOffsetReset {
  kEarliest,  ///< the partition's earliest offset
  kLatest,    ///< the partition's latest offset (only new records)
  kNone,      ///< fail the job naming the partition
};

/// Where a KafkaSource starts reading the partitions it finds at start (Flink's OffsetsInitializer).
class KafkaStartingOffsets {
 public:
  enum class Kind { kEarliest, kLatest, kCommitted, kTimestamp, kSpecific };

  /// Each partition's earliest offset (the default).
  static KafkaStartingOffsets earliest() { return KafkaStartingOffsets(Kind::kEarliest); }
  /// Each partition's latest offset: only records written after the start.
  static KafkaStartingOffsets latest() { return KafkaStartingOffsets(Kind::kLatest); }
  /// The group's committed offsets (needs a group id); `reset` for partitions without one.
  static KafkaStartingOffsets committed(KafkaOffsetReset reset = KafkaOffsetReset::kEarliest) {
    KafkaStartingOffsets s(Kind::kCommitted);
    s.reset_ = reset;
    return s;
  }
  /// The first offset whose timestamp is >= `timestamp_ms` (ms since epoch); the latest offset when no record
  /// is that recent.
  static KafkaStartingOffsets timestamp(TimestampMs timestamp_ms) {
    KafkaStartingOffsets s(Kind::kTimestamp);
    s.timestamp_ms_ = timestamp_ms;
    return s;
  }
  /// Explicit next offsets per partition; `reset` for partitions not listed.
  static KafkaStartingOffsets offsets(std::map<KafkaTopicPartition, int64_t> offsets,
                                      KafkaOffsetReset reset = KafkaOffsetReset::kEarliest) {
    KafkaStartingOffsets s(Kind::kSpecific);
    s.offsets_ = std::move(offsets);
    s.reset_ = reset;
    return s;
  }

  Kind kind() const noexcept { return kind_; }
  KafkaOffsetReset reset() const noexcept { return reset_; }
  TimestampMs timestamp_ms() const noexcept { return timestamp_ms_; }
  const std::map<KafkaTopicPartition, int64_t>& specific_offsets() const noexcept { return offsets_; }
  /// "earliest", "latest", "committed (reset earliest)", "timestamp 1700000000000", "specific offsets".
  std::string describe() const;

 private:
  explicit KafkaStartingOffsets(Kind k) : kind_(k) {}
  Kind kind_;
  KafkaOffsetReset reset_ = KafkaOffsetReset::kEarliest;
  TimestampMs timestamp_ms_ = 0;
  std::map<KafkaTopicPartition, int64_t> offsets_;
};

}  // namespace sluice
