// Private to src/sluice/connectors/kafka/: how the KafkaSourceEnumerator finds partitions and resolves their
// offsets (KafkaPartitionDiscoverer), and its librdkafka implementation (kafka_partition_discoverer.cc).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/connectors/kafka/kafka_source_settings.h"
#include "sluice/connectors/kafka/kafka_starting_offsets.h"
#include "sluice/core/error.h"

namespace sluice {

namespace detail {

/// Finds partitions and resolves offsets for the enumerator. The librdkafka implementation talks to the
/// cluster; tests pass fakes. Called under the source coordinator's lock (never concurrently).
class KafkaPartitionDiscoverer {
 public:
  virtual ~KafkaPartitionDiscoverer() = default;
  /// The partitions of the subscribed topics, sorted. Errors (kConnector): cluster unreachable within
  /// `timeout`, a listed topic missing, authorization.
  [[nodiscard]] virtual Result<std::vector<KafkaTopicPartition>> discover(std::chrono::milliseconds timeout) = 0;
  /// One split per partition, in the same order, starting at `starting`; with `bounded` also the stopping
  /// offsets (latest, or last stable under read_committed). Errors (kConnector): offset lookups failed, no
  /// committed offset under KafkaOffsetReset::kNone.
  [[nodiscard]] virtual Result<std::vector<KafkaPartitionSplit>> make_splits(
      const std::vector<KafkaTopicPartition>& partitions, const KafkaStartingOffsets& starting, bool bounded,
      std::chrono::milliseconds timeout) = 0;
};

/// The librdkafka-backed discoverer (one consumer-type client, no group membership). Errors: kConfiguration.
[[nodiscard]] Result<std::unique_ptr<KafkaPartitionDiscoverer>> make_kafka_discoverer(
    const KafkaSourceSettings& settings);

}  // namespace detail

}  // namespace sluice
