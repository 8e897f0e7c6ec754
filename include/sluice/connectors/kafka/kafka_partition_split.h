// The splits of KafkaSource (kafka_source.h): a topic partition, the split that reads it, and Flink's owner rule
// that pushes each partition to one reader subtask. Plain values, thread-compatible.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/core/type_serializer.h"

namespace sluice {

/// A topic partition.
struct KafkaTopicPartition {
  std::string topic;
  int32_t partition = 0;
  friend auto operator<=>(const KafkaTopicPartition&, const KafkaTopicPartition&) = default;
  friend bool operator==(const KafkaTopicPartition&, const KafkaTopicPartition&) = default;
};
SLUICE_FIELDS(KafkaTopicPartition, topic, partition);

/// One partition to read: the split of a KafkaSource.
struct KafkaPartitionSplit {
  std::string topic;
  int32_t partition = 0;
  /// The next offset to read.
  int64_t starting_offset = 0;
  /// Bounded mode: reading stops before this offset. nullopt = unbounded.
  std::optional<int64_t> stopping_offset;
  /// Only in the enumerator's checkpoint, never in a reader's: the partition is owned by a reader (and in
  /// that reader's checkpointed state, or finished); the offsets are meaningless.
  bool assigned = false;

  /// "<topic>-<partition>" (Flink's split id).
  std::string split_id() const { return topic + "-" + std::to_string(partition); }
  KafkaTopicPartition topic_partition() const { return {topic, partition}; }
  friend bool operator==(const KafkaPartitionSplit&, const KafkaPartitionSplit&) = default;
};
SLUICE_FIELDS(KafkaPartitionSplit, topic, partition, starting_offset, stopping_offset, assigned);

namespace kafka {

/// Java's String.hashCode of an ASCII string: h = 31 * h + c, wrapping in int32.
int32_t java_string_hash(std::string_view s) noexcept;

/// The reader subtask that owns a partition (Flink's KafkaSourceEnumerator.getSplitOwner, see the file
/// comment). `num_readers` >= 1.
int split_owner(std::string_view topic, int32_t partition, int num_readers) noexcept;

}  // namespace kafka

}  // namespace sluice
