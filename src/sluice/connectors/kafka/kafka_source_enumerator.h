// Private to src/sluice/connectors/kafka/: KafkaSourceEnumerator, the split enumerator of KafkaSource (Flink's
// KafkaSourceEnumerator; kafka_source.h's file comment describes discovery, the owner rule and the checkpoint
// markers). Implemented in kafka_source_enumerator.cc.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/kafka/kafka_partition_discoverer.h"
#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/connectors/kafka/kafka_starting_offsets.h"
#include "sluice/core/error.h"

namespace sluice {

namespace detail {

/// The split enumerator of KafkaSource (see the file comment: discovery, owner rule, checkpoint markers).
/// Its methods run serialized under the source coordinator's lock. Periodic discovery asks the broker for
/// metadata off that lock (SplitEnumeratorContext::call_async), so an unreachable broker does not hold up
/// checkpoints; only resolving the offsets of partitions that are actually new runs under it.
class KafkaSourceEnumerator final : public SplitEnumerator<KafkaPartitionSplit> {
 public:
  struct Options {
    bool bounded = false;
    int64_t discovery_interval_ms = 30'000;  ///< <= 0: no periodic discovery
    std::chrono::milliseconds startup_timeout{30'000};
    KafkaStartingOffsets starting = KafkaStartingOffsets::earliest();
    std::string description;  ///< the topics, for log lines
  };

  KafkaSourceEnumerator(SplitEnumeratorContext<KafkaPartitionSplit>& ctx,
                        std::unique_ptr<KafkaPartitionDiscoverer> discoverer, Options options);

  /// Fresh start: discovers the partitions and resolves their starting offsets; throws SluiceException
  /// (kConnector) when that fails, which fails the job at start. Restored: assigns the restored unassigned
  /// splits and (unbounded) discovers partitions it has never seen; failures are logged and retried by the
  /// periodic discovery. Then schedules periodic discovery (unbounded, interval > 0).
  void start() override;
  /// Splits are pushed to their owners; requests are ignored.
  void handle_split_request(int /*subtask*/) override {}
  /// Takes back splits of a failed reader; they go to their owners when those (re-)register.
  void add_splits_back(std::vector<KafkaPartitionSplit> splits, int subtask) override;
  /// Assigns the reader's pending splits; without discovery also tells it no more splits follow.
  void add_reader(int subtask) override;
  /// Unassigned splits plus one `assigned` marker per partition a reader owns.
  std::vector<KafkaPartitionSplit> snapshot_state(int64_t checkpoint_id) override;
  void restore_state(std::vector<KafkaPartitionSplit> splits) override;
  void close() override;

  /// One discovery round: finds partitions never seen, resolves their offsets (`starting` of the options when
  /// `initial`, else earliest) and assigns them to registered owners (others wait for add_reader).
  [[nodiscard]] Status discover_and_assign(bool initial, std::chrono::milliseconds timeout);
  /// The second half of a round, given the partitions a discovery found: new ones get splits and owners.
  [[nodiscard]] Status assign_discovered(const std::vector<KafkaTopicPartition>& found, bool initial,
                                         std::chrono::milliseconds timeout);

  /// Partitions owned by readers, and splits waiting for their owner to register (for tests).
  const std::set<KafkaTopicPartition>& assigned_partitions() const noexcept { return assigned_; }
  size_t pending_count() const noexcept;

 private:
  void add_pending(KafkaPartitionSplit split);
  void assign_pending(int subtask);
  bool discovery_enabled() const noexcept { return !options_.bounded && options_.discovery_interval_ms > 0; }

  SplitEnumeratorContext<KafkaPartitionSplit>& ctx_;
  /// Shared with the periodic discovery's off-lock work, which may still be running when close() drops it.
  std::shared_ptr<KafkaPartitionDiscoverer> discoverer_;
  Options options_;
  bool restored_ = false;
  std::set<KafkaTopicPartition> assigned_;
  std::map<int, std::vector<KafkaPartitionSplit>> pending_;  // by owner subtask
  std::set<int> registered_;
};

}  // namespace detail

}  // namespace sluice
