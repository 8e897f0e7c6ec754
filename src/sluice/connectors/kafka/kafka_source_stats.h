// Private to src/sluice/connectors/kafka/: the counters a KafkaSource's readers share (KafkaSourceStats), read by
// KafkaSource<T>::metrics() from any thread. Implemented in kafka_source_stats.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/connectors/kafka/kafka_source_metrics.h"
#include "sluice/connectors/source_connection.h"

namespace sluice {

namespace detail {

/// The live position of one assigned partition: written by its reader's task thread, read by metrics().
struct KafkaPartitionStats {
  KafkaPartitionStats(std::string t, int32_t p) : topic(std::move(t)), partition(p) {}
  const std::string topic;
  const int32_t partition;
  std::atomic<int64_t> current_offset{-1};
  std::atomic<int64_t> committed_offset{-1};
  std::atomic<int64_t> last_timestamp_ms{-1};  ///< Kafka timestamp of the last record read; -1 none
};

/// One reader's part of KafkaSourceStats.
struct KafkaReaderStats {
  /// The rate window (task thread writes, metrics() reads): steady-clock start (ms), records since then, and
  /// the rate of the last completed window.
  std::atomic<int64_t> window_start_ms{-1};
  std::atomic<int64_t> window_records{0};
  std::atomic<double> records_per_second{0};
  /// Guarded by KafkaSourceStats::mu: the reader's consumer (nullptr once it closes; metrics() reads
  /// librdkafka's cached high watermarks through it) and its assigned partitions.
  rd_kafka_t* consumer = nullptr;
  std::map<KafkaTopicPartition, std::shared_ptr<KafkaPartitionStats>> partitions;
};

/// The counters of one KafkaSource, shared by all its readers in this process and readable from any thread
/// while the job runs. Readers publish their counters once per poll batch; the registry of readers and
/// partitions changes only on assignment, finish and close (under `mu`), never per record.
struct KafkaSourceStats {
  std::atomic<int64_t> records_read{0};
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int64_t> last_timestamp_ms{-1};  ///< Kafka timestamp of the last record any reader read
  std::shared_ptr<BadRecordStats> bad = std::make_shared<BadRecordStats>();
  /// Each open reader's connection to the cluster, reported by its liveness probe (kafka_common.h).
  std::shared_ptr<SourceConnectionBoard> connections = std::make_shared<SourceConnectionBoard>("Kafka source");
  mutable std::mutex mu;
  std::vector<std::shared_ptr<KafkaReaderStats>> readers;  // guarded by mu

  /// The snapshot at wall time `now_ms` (ms since epoch) and steady time `steady_now_ms`.
  KafkaSourceMetrics metrics(int64_t now_ms, int64_t steady_now_ms) const;
  /// The snapshot now.
  KafkaSourceMetrics metrics() const;
};

}  // namespace detail

}  // namespace sluice
