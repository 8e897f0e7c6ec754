// The metrics of a KafkaSource (KafkaSource<T>::metrics(), kafka_source.h): plain snapshot values, named after
// Flink's Kafka connector metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

/// The metrics of one assigned partition (see KafkaSourceMetrics).
struct KafkaPartitionMetrics {
  std::string topic;
  int32_t partition = 0;
  /// The next offset to read: the reader's position (Flink's `currentOffset`). An offset.
  int64_t current_offset = -1;
  /// The offset last committed to the consumer group for this partition, as acknowledged by the broker after
  /// a completed checkpoint (Flink's `committedOffset`); -1 when none was committed by this reader. An offset.
  int64_t committed_offset = -1;
  /// The partition's log end offset (high watermark) as librdkafka last saw it in a fetch response (cached,
  /// never a broker request); -1 unknown (no fetch response yet). An offset.
  int64_t high_watermark = -1;
  /// high_watermark − current_offset, ≥ 0: records written but not read yet; -1 unknown. Records. Unlike Kafka's
  /// `records-lag`, which uses the last stable offset under read_committed, an open transaction's records count
  /// here until it ends (a topic written by an exactly-once job seldom shows 0).
  int64_t lag = -1;
  friend bool operator==(const KafkaPartitionMetrics&, const KafkaPartitionMetrics&) = default;
};

/// A snapshot of a KafkaSource's metrics, summed over its reader subtasks in this process (KafkaSource<T>::
/// metrics()). Names follow Flink's Kafka connector metrics. Counters count since the source object was
/// created (the records replayed after a restart included); per-partition values cover the partitions the
/// running readers are assigned (a finished partition of bounded mode and a closed reader's partitions drop out).
struct KafkaSourceMetrics {
  /// Data messages the readers took from Kafka (those that went to the dead letters included; Flink's
  /// `numRecordsIn`). Records.
  int64_t records_read = 0;
  /// Key plus value bytes of those messages (Flink's `numBytesIn`). Bytes.
  int64_t bytes_read = 0;
  /// Messages the deserializer rejected that went to the dead letters (BadRecordPolicy::kDeadLetter). Records.
  int64_t bad_records = 0;
  /// Records read per second over the last completed window of about one second per reader, summed over the
  /// readers (Flink's `numRecordsInPerSecond`); decays towards 0 while nothing is read. Records/s.
  double records_per_second = 0;
  /// The largest `lag` of the assigned partitions (Flink's / Kafka's `records-lag-max`); -1 when no lag is
  /// known. Records.
  int64_t records_lag_max = -1;
  /// The sum of the known `lag`s of the assigned partitions (Flink's `pendingRecords`); -1 when no lag is
  /// known. Records.
  int64_t pending_records = -1;
  /// Now (wall clock) minus the Kafka timestamp of the last record read from the partitions known to lag (the
  /// oldest such partition); 0 once every assigned partition is caught up (lag 0); -1 when unknown: before any
  /// record was read, without assigned partitions (a restart), or when no lagging partition has read a record.
  /// Milliseconds.
  int64_t lag_ms = -1;
  /// One entry per assigned partition, sorted by topic and partition.
  std::vector<KafkaPartitionMetrics> partitions;
};

}  // namespace sluice
