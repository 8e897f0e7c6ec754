// KafkaReaderCore: the non-template part of a KafkaSource reader (kafka_source.h; Flink's KafkaSourceReader with
// its KafkaPartitionSplitReader). Public only because KafkaSource<T>'s typed reader drives it; implemented in
// kafka_reader_core.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/connectors/kafka/kafka_record.h"
#include "sluice/connectors/kafka/kafka_source_settings.h"
#include "sluice/core/error.h"

namespace sluice {

namespace detail {

// The source's shared counters (kafka_source_stats.h, private to src/sluice/connectors/kafka/).
struct KafkaPartitionStats;
struct KafkaReaderStats;
struct KafkaSourceStats;

/// The non-template part of a KafkaSource reader: the consumer, its assignment, positions, EOF and stop
/// handling, errors, offset commits and dead letters. Runs on the reader's task thread only (except the
/// queue wakeup, which librdkafka calls from its threads). Lifecycle: create() -> add_splits()/poll()/
/// snapshot()/notify_checkpoint_complete() ... -> close() (idempotent; also run by the destructor).
class KafkaReaderCore {
 public:
  /// One assigned partition.
  struct Partition {
    std::string topic;
    int32_t partition = 0;
    std::string split_id;
    int64_t next_offset = 0;
    std::optional<int64_t> stopping_offset;
    /// The typed reader's output for this partition (a ReaderOutput<T>*), set after take_new_partitions().
    void* output = nullptr;
    /// Its entry in the source's metrics.
    std::shared_ptr<KafkaPartitionStats> stats;
  };

  /// What poll() hands each message to (the typed reader).
  class Handler {
   public:
    virtual ~Handler() = default;
    /// A data message of `partition` at or past its next offset and before its stopping offset. May call
    /// bad_record(); may throw (fails the task).
    virtual void on_message(Partition& partition, const KafkaMessageView& message) = 0;
    /// `partition` reached its stopping offset; it is removed after this call.
    virtual void on_finished(Partition& partition) = 0;
  };

  /// Creates the consumer (and the dead-letter producer). Errors: kConfiguration.
  [[nodiscard]] static Result<std::unique_ptr<KafkaReaderCore>> create(const KafkaSourceSettings& settings,
                                                                       SourceReaderContext& ctx,
                                                                       std::shared_ptr<DeadLetterFile> dead_letter,
                                                                       std::shared_ptr<KafkaSourceStats> stats);
  ~KafkaReaderCore();
  KafkaReaderCore(const KafkaReaderCore&) = delete;
  KafkaReaderCore& operator=(const KafkaReaderCore&) = delete;

  /// Starts reading the splits (incremental assign). Throws SluiceException (kConnector) when the consumer
  /// refuses the assignment.
  void add_splits(std::vector<KafkaPartitionSplit> splits);
  void notify_no_more_splits() noexcept { no_more_splits_ = true; }
  /// Partitions added since the last call, for the typed reader to create their outputs.
  std::vector<Partition*> take_new_partitions();
  /// Takes up to `max_messages` messages from the consumer without blocking and dispatches them; returns how
  /// many it took (data, EOF and error events). Throws SluiceException (kConnector) on a permanent consumer
  /// error and under BadRecordPolicy::kFail on a bad record.
  size_t poll(Handler& handler, size_t max_messages);
  /// True when no partition is left and no more splits will come.
  bool finished() const noexcept { return no_more_splits_ && partitions_.empty(); }
  /// Handles a message the deserializer rejected (see BadRecordPolicy). Throws SluiceException under kFail
  /// and when the dead letter cannot be written.
  void bad_record(const KafkaMessageView& message, std::string_view reason);

  /// The splits with their next offsets; remembers them for the commit of `checkpoint_id`. Makes dead
  /// letters durable first (throws SluiceException when that fails).
  std::vector<KafkaPartitionSplit> snapshot(int64_t checkpoint_id);
  /// Commits the offsets of `checkpoint_id` to the group (async; failures logged).
  void notify_checkpoint_complete(int64_t checkpoint_id);
  /// Stops the wakeups, flushes dead letters (bounded wait) and destroys the clients.
  void close() noexcept;

  /// Number of assigned partitions (for tests).
  size_t partition_count() const noexcept { return partitions_.size(); }

  struct Impl;  // librdkafka callbacks and state (kafka_reader_core.cc)

 private:
  KafkaReaderCore(const KafkaSourceSettings& settings, std::shared_ptr<DeadLetterFile> dead_letter,
                  std::shared_ptr<KafkaSourceStats> stats);
  Partition* find_partition(const rd_kafka_message_t& m);
  void finish_partition(Partition& p, Handler& handler);
  void handle_event(const rd_kafka_message_t& m, Handler& handler);

  void set_next_offset(Partition& p, int64_t offset);
  // Adds a poll batch's counts to the source's metrics and moves this reader's rate window.
  void publish_batch(int64_t records, int64_t bytes, int64_t last_timestamp_ms);
  void unregister_partition(const KafkaTopicPartition& tp);

  std::shared_ptr<DeadLetterFile> dead_letter_;
  std::shared_ptr<KafkaSourceStats> stats_;
  std::shared_ptr<KafkaReaderStats> reader_stats_;  // this reader's entry in stats_->readers
  std::unique_ptr<Impl> impl_;
  std::map<KafkaTopicPartition, std::unique_ptr<Partition>> partitions_;
  std::vector<Partition*> new_partitions_;
  std::map<KafkaTopicPartition, int64_t> finished_offsets_;                    // final offsets of finished partitions
  std::map<int64_t, std::map<KafkaTopicPartition, int64_t>> pending_commits_;  // by checkpoint id
  std::vector<rd_kafka_message_t*> batch_;
  bool no_more_splits_ = false;
  bool logged_dead_letter_ = false;
  bool unsynced_dead_letters_ = false;
};

}  // namespace detail

}  // namespace sluice
