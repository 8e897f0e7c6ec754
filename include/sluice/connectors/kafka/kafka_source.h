// KafkaSource<T>: reads Kafka topics as a split-based source (DESIGN.md §8; the model is Flink's KafkaSource,
// "Apache Kafka Connector" in Flink's docs, built on librdkafka instead of the Java client).
//
//   auto source = KafkaSource<Charge>::builder()
//                     .bootstrap_servers("127.0.0.1:9092")
//                     .topics({"charges"})
//                     .group_id("revenue")
//                     .starting_offsets(KafkaStartingOffsets::committed(KafkaOffsetReset::kEarliest))
//                     .deserializer(kafka::json_value<Charge>())
//                     .build();
//   env.from_source(source, WatermarkStrategy<Charge>::for_bounded_out_of_orderness(5s), "charges");
//
// Splits. Every topic partition is one split (KafkaPartitionSplit): topic, partition, the next offset to read
// and, in bounded mode, the offset to stop before. Checkpoints hold each reader's splits with their next
// offsets (the SourceOperator's "SourceReaderState" list state, redistributed round robin on rescaling), so a
// restore resumes exactly where the checkpoint was taken: records are emitted once per checkpointed run.
//
// Topics: a list (each must exist: a missing topic fails the job at start naming it) or a regular expression
// (ECMAScript std::regex, matched against the whole name like Java's Pattern.matches; topics starting with
// "__" — Kafka's internal ones — never match; no match is not an error). Partitions are discovered at start
// and then every `partition.discovery.interval.ms` (default 30 s, 0 = off; never in bounded mode) by the
// enumerator, so new partitions and, with a pattern, new topics are read while the job runs. Partitions found
// after the start are read from their earliest offset (their records all arrived after the job started, as in
// Flink since FLINK-28303).
//
// Assignment. Partitions are pushed to reader subtasks by Flink's KafkaSourceEnumerator rule:
//   owner(topic, partition) = (((java_hash(topic) * 31) & 0x7FFFFFFF) + partition) % parallelism
// where java_hash is Java's String.hashCode (int32, wrapping: h = 31 * h + c over the name's characters;
// Kafka topic names are ASCII). Consecutive partitions of a topic go to consecutive subtasks from a
// topic-dependent start, so several topics spread over all subtasks. kafka::split_owner() computes it.
// The enumerator checkpoints its unassigned splits *and* a marker (`assigned == true`) for every partition a
// reader already owns; on restore it never hands those out again (the readers restore them from their own
// state), and discovery only adds partitions it has never seen. A reader ignores (and logs) a split for a
// partition it already reads.
//
// Starting offsets (KafkaStartingOffsets, resolved by the enumerator when a partition is first discovered):
// earliest (the default), latest, committed offsets of the group (with a reset strategy for partitions
// without one: earliest, latest or none = fail), the first offset whose timestamp is >= a time (latest when
// none is), or explicit offsets per partition (the reset strategy for the others).
//
// Bounded mode (`bounded()`): each partition stops before the offset that was the latest when the job
// started (the last stable offset under read_committed); the source ends when all its partitions have.
//
// Reading. Each reader subtask runs one librdkafka consumer with manual assignment
// (rd_kafka_incremental_assign; no group membership, no rebalances). poll_next takes up to 1024 messages
// from the consumer's queue without blocking; when the queue is empty it returns kNothingAvailable and
// librdkafka's queue event callback wakes the task when messages arrive. Each partition emits through its own
// split output (ReaderOutput::output_for_split, split id "<topic>-<partition>"), so watermarks are generated
// per partition and a partition without records turns idle under the WatermarkStrategy's idleness (without
// idleness an empty partition holds the watermark back, as in Flink). Records carry the message timestamp
// (ms) as their event timestamp.
//
// Offsets are committed to the consumer group only when a checkpoint completes
// (notify_checkpoint_complete), with the offsets of that checkpoint, asynchronously; a failed commit is
// logged and never fails the job (the checkpoint, not the group, is the source of truth). So lag tools
// (kafka-consumer-groups.sh) see the group's progress. Nothing is committed without a group id, without
// checkpointing, or with `commit.offsets.on.checkpoint=false`.
//
// Client properties are passed through to librdkafka (SASL, TLS, fetch sizes, ...; kafka_common.h). The
// source sets: `enable.auto.commit=false`, `enable.auto.offset.store=false`, `enable.partition.eof=true`
// (always), and by default `isolation.level=read_committed`, `auto.offset.reset=earliest` (used when a
// checkpointed or explicit offset no longer exists) and `client.id=<client.id.prefix>-<subtask>`. Sluice's
// own keys, accepted by property() too: `partition.discovery.interval.ms`, `commit.offsets.on.checkpoint`
// (true/false), `client.id.prefix` (default "sluice-kafka-source"), `startup.timeout.ms` (default 30000:
// how long the enumerator waits for the cluster at start) and `liveness.timeout.ms` (default 30000, 0 = off: see
// Errors).
//
// Bad records (DESIGN.md §7): a message the deserializer rejects fails the job by default
// (BadRecordPolicy::kFail; ErrorCode::kConnector naming topic, partition, offset and the reason). With
// kDeadLetter it goes to a dead-letter file (the shared DeadLetterFile of bad_record.h) as the JSON line
//   {"source":"kafka","topic":..,"partition":..,"offset":..,"timestamp":..,"error":..,"key":..,"record":..}
// ("key"/"record" hold the bytes as text; "key_base64"/"record_base64" are added when they are not UTF-8;
// null key or value are JSON null), or to a dead-letter topic (same key, value and headers, plus headers
// `sluice.dlq.topic`, `sluice.dlq.partition`, `sluice.dlq.offset`, `sluice.dlq.error`), is counted in
// stats()->bad_records (and metrics().bad_records) and reading goes on with the next message. Dead letters are made
// durable (file sync, producer flush) before a checkpoint records offsets past them.
//
// Errors. At start the enumerator fails the job (SluiceException, kConnector) when the cluster cannot be
// reached within `startup.timeout.ms`, at once when its client's error callback reports an authentication or TLS
// failure (kafka::KafkaPermanentErrorCapture), or when a listed topic does not exist; invalid client properties fail
// build() (kConfiguration). While reading, permanent client errors (authentication, authorization, TLS,
// librdkafka fatal errors, a failed offset reset with `auto.offset.reset=error`) fail the task with
// librdkafka's error text (the job then restarts under its restart strategy); transient ones (broker down,
// leader changes, timeouts) are logged at most every 10 s per kind while librdkafka retries. Liveness: each
// reader runs a kafka::KafkaLivenessProbe (kafka_common.h; a metadata round trip every timeout / 4, at most 5 s,
// off the task thread); when no broker answered for `liveness.timeout.ms` (a broker that is gone, paused or
// unreachable, also on a quiet topic) it wakes the task, which fails naming the bootstrap servers, the time
// without an answer and librdkafka's last error, and the restart strategy takes over. Before that (and with the
// liveness timeout off too) the probe reports the reader disconnected once no broker answered for 3 s
// (connections(), source_connection.h: /health's `source-disconnected`, the `sourceConnected` gauge, one log
// line when lost and one when back); the job stays RUNNING and librdkafka keeps retrying.
//
// Metrics (KafkaSourceMetrics, from metrics(); Flink's KafkaSource metrics): records and bytes read, bad
// records, records per second, and per assigned partition the current offset (next to read), the committed
// offset, the high watermark and the lag in records, with records-lag-max, pending records and the timestamp
// lag in ms. Readers publish counters once per poll batch and position and timestamp with two relaxed stores
// per record; the high watermark is librdkafka's cached value from its last fetch response
// (rd_kafka_get_watermark_offsets, read when metrics() is called: no broker request).
//
// Threading: KafkaSource is an immutable, thread-safe factory. The enumerator runs in the source coordinator
// (its discovery blocks the coordinator for at most a few seconds per round); each reader runs on its task
// thread. stats() and metrics() may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_record.h"
#include "sluice/core/error.h"
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

namespace kafka {

/// Java's String.hashCode of an ASCII string: h = 31 * h + c, wrapping in int32.
int32_t java_string_hash(std::string_view s) noexcept;

/// The reader subtask that owns a partition (Flink's KafkaSourceEnumerator.getSplitOwner, see the file
/// comment). `num_readers` >= 1.
int split_owner(std::string_view topic, int32_t partition, int num_readers) noexcept;

}  // namespace kafka

namespace detail {

/// Everything a KafkaSource is configured with, validated by KafkaSourceBuilder::try_build().
struct KafkaSourceSettings {
  /// librdkafka properties (bootstrap.servers and group.id included; Sluice's own keys removed).
  kafka::KafkaProperties properties;
  std::vector<std::string> topics;
  std::string topic_pattern;
  KafkaStartingOffsets starting = KafkaStartingOffsets::earliest();
  bool bounded = false;
  int64_t discovery_interval_ms = 30'000;
  bool commit_offsets_on_checkpoint = true;
  std::string client_id_prefix = "sluice-kafka-source";
  int64_t startup_timeout_ms = 30'000;
  int64_t liveness_timeout_ms = 30'000;  ///< no broker answered for this long: the reader fails; 0 = off
  BadRecordPolicy bad_record_policy = BadRecordPolicy::kFail;
  std::string dead_letter_path;
  std::string dead_letter_topic;

  const std::string& bootstrap_servers() const;
  /// The user's group id ("" when none).
  const std::string& group_id() const;
  /// "topics [a, b]" or "topic pattern 'x.*'" (for messages).
  std::string describe_topics() const;
};

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

/// Applies Sluice's own keys, checks the settings and that librdkafka accepts the properties.
/// Errors: kConfiguration saying what is missing or wrong and how to fix it.
[[nodiscard]] Status normalize_and_validate(KafkaSourceSettings& settings);

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

  struct Impl;  // librdkafka callbacks and state (kafka_source.cc)

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

template <class T>
class KafkaSourceBuilder;

/// A Kafka source of records of type T (see the file comment). Build it with KafkaSource<T>::builder().
template <class T>
class KafkaSource final : public Source<T, KafkaPartitionSplit> {
 public:
  /// A builder; T's deserializer defaults to kafka::bytes_value() for std::string, else must be set.
  static KafkaSourceBuilder<T> builder() { return KafkaSourceBuilder<T>(); }

  /// Use builder(). `settings` must have passed normalize_and_validate.
  KafkaSource(detail::KafkaSourceSettings settings, KafkaDeserializer<T> deserializer)
      : settings_(std::move(settings)), deserializer_(std::move(deserializer)) {
    stats_->connections = std::make_shared<SourceConnectionBoard>("Kafka source (" + settings_.describe_topics() + ")");
  }

  Boundedness boundedness() const override {
    return settings_.bounded ? Boundedness::kBounded : Boundedness::kContinuousUnbounded;
  }

  /// Creates the enumerator with its own client. Throws SluiceException on a configuration error.
  std::unique_ptr<SplitEnumerator<KafkaPartitionSplit>> create_enumerator(
      SplitEnumeratorContext<KafkaPartitionSplit>& ctx) const override {
    dead_letter_file();  // a dead-letter file that cannot be opened fails the job at start
    detail::KafkaSourceEnumerator::Options o;
    o.bounded = settings_.bounded;
    o.discovery_interval_ms = settings_.discovery_interval_ms;
    o.startup_timeout = std::chrono::milliseconds(settings_.startup_timeout_ms);
    o.starting = settings_.starting;
    o.description = settings_.describe_topics();
    return std::make_unique<detail::KafkaSourceEnumerator>(
        ctx, detail::make_kafka_discoverer(settings_).value_or_throw(), std::move(o));
  }

  /// Creates a reader with its own consumer. Throws SluiceException on a configuration error.
  std::unique_ptr<SourceReader<T, KafkaPartitionSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(
        detail::KafkaReaderCore::create(settings_, ctx, dead_letter_file(), stats_).value_or_throw(), deserializer_);
  }

  /// The bad-record counter shared by all readers of this source (also in metrics().bad_records).
  const std::shared_ptr<BadRecordStats>& stats() const noexcept { return stats_->bad; }
  /// The source's metrics now, over its readers in this process (see KafkaSourceMetrics for names and units).
  /// Thread-safe: may be called from any thread while the job runs; never asks the broker (high watermarks
  /// are librdkafka's cached values).
  KafkaSourceMetrics metrics() const { return stats_->metrics(); }
  /// Each open reader subtask's connection to the cluster: disconnected when no broker answered its probe for
  /// KafkaLivenessProbe::kDisconnectedAfter (3 s), naming librdkafka's last error. Thread-safe.
  std::vector<SourceConnection> connections() const {
    return stats_->connections->snapshot(SourceConnectionBoard::steady_now_ms());
  }
  const detail::KafkaSourceSettings& settings() const noexcept { return settings_; }

 private:
  // Opened once and shared by all readers; nullptr unless bad records go to a dead-letter file.
  std::shared_ptr<DeadLetterFile> dead_letter_file() const {
    if (settings_.bad_record_policy != BadRecordPolicy::kDeadLetter || settings_.dead_letter_path.empty()) {
      return nullptr;
    }
    std::lock_guard lock(mu_);
    if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
    return dead_letter_;
  }

  class Reader final : public SourceReader<T, KafkaPartitionSplit>, detail::KafkaReaderCore::Handler {
   public:
    Reader(std::unique_ptr<detail::KafkaReaderCore> core, KafkaDeserializer<T> deserializer)
        : core_(std::move(core)), deserializer_(std::move(deserializer)) {}

    InputStatus poll_next(ReaderOutput<T>& output) override {
      out_ = &output;
      for (detail::KafkaReaderCore::Partition* p : core_->take_new_partitions())
        p->output = &output.output_for_split(p->split_id);
      const size_t n = core_->poll(*this, kMaxBatch);
      if (core_->finished()) return InputStatus::kEndOfInput;
      return n > 0 ? InputStatus::kMoreAvailable : InputStatus::kNothingAvailable;
    }
    void add_splits(std::vector<KafkaPartitionSplit> splits) override { core_->add_splits(std::move(splits)); }
    void notify_no_more_splits() override { core_->notify_no_more_splits(); }
    std::vector<KafkaPartitionSplit> snapshot_state(int64_t checkpoint_id) override {
      return core_->snapshot(checkpoint_id);
    }
    void notify_checkpoint_complete(int64_t checkpoint_id) override {
      core_->notify_checkpoint_complete(checkpoint_id);
    }
    void close() override { core_->close(); }

   private:
    static constexpr size_t kMaxBatch = 1024;

    void on_message(detail::KafkaReaderCore::Partition& p, const KafkaMessageView& m) override {
      T value{};
      Status st = kafka::deserialize_message(deserializer_, m, value);
      if (!st.ok()) {
        core_->bad_record(m, st.error().message());
        return;
      }
      auto* out = static_cast<ReaderOutput<T>*>(p.output);
      out->collect(std::move(value), m.timestamp_ms >= 0 ? m.timestamp_ms : kNoTimestamp);
    }
    void on_finished(detail::KafkaReaderCore::Partition& p) override {
      if (p.output != nullptr && out_ != nullptr) out_->release_output_for_split(p.split_id);
    }

    std::unique_ptr<detail::KafkaReaderCore> core_;
    KafkaDeserializer<T> deserializer_;
    ReaderOutput<T>* out_ = nullptr;
  };

  detail::KafkaSourceSettings settings_;
  KafkaDeserializer<T> deserializer_;
  std::shared_ptr<detail::KafkaSourceStats> stats_ = std::make_shared<detail::KafkaSourceStats>();
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
};

/// Configures a KafkaSource<T>. Not thread-safe; a value type (copy it to derive variants).
template <class T>
class KafkaSourceBuilder {
 public:
  KafkaSourceBuilder() {
    if constexpr (std::is_same_v<T, std::string>) deserializer_ = kafka::bytes_value();
  }

  /// "host:port,host:port" (librdkafka's bootstrap.servers). Required.
  KafkaSourceBuilder& bootstrap_servers(std::string servers) {
    return property("bootstrap.servers", std::move(servers));
  }
  /// Reads these topics (each must exist). Exclusive with topic_pattern().
  KafkaSourceBuilder& topics(std::vector<std::string> topics) {
    s_.topics = std::move(topics);
    return *this;
  }
  /// Reads every topic whose whole name matches `regex` (ECMAScript), found again at every discovery.
  KafkaSourceBuilder& topic_pattern(std::string regex) {
    s_.topic_pattern = std::move(regex);
    return *this;
  }
  /// The consumer group offsets are committed to (and read from with KafkaStartingOffsets::committed()).
  KafkaSourceBuilder& group_id(std::string id) { return property("group.id", std::move(id)); }
  /// Where partitions found at start begin (default earliest).
  KafkaSourceBuilder& starting_offsets(KafkaStartingOffsets offsets) {
    s_.starting = std::move(offsets);
    return *this;
  }
  /// Stops each partition at the offset that was latest at start; the source then ends.
  KafkaSourceBuilder& bounded() {
    s_.bounded = true;
    return *this;
  }
  /// How often (ms) to look for new partitions/topics; 0 turns discovery off. Default 30 s.
  KafkaSourceBuilder& partition_discovery_interval(std::chrono::milliseconds interval) {
    s_.discovery_interval_ms = interval.count();
    return *this;
  }
  /// Whether completed checkpoints commit offsets to the group (default true).
  KafkaSourceBuilder& commit_offsets_on_checkpoint(bool commit) {
    s_.commit_offsets_on_checkpoint = commit;
    return *this;
  }
  /// How long the enumerator waits for the cluster at start before failing the job (default 30 s).
  KafkaSourceBuilder& startup_timeout(std::chrono::milliseconds timeout) {
    s_.startup_timeout_ms = timeout.count();
    return *this;
  }
  /// Fails a reader when no broker answered its liveness probe for `timeout` (default 30 s; 0 turns it off).
  KafkaSourceBuilder& liveness_timeout(std::chrono::milliseconds timeout) {
    s_.liveness_timeout_ms = timeout.count();
    return *this;
  }
  /// How each message becomes a T (kafka_record.h). Required unless T is std::string.
  KafkaSourceBuilder& deserializer(KafkaDeserializer<T> d) {
    deserializer_ = std::move(d);
    return *this;
  }
  /// Same as deserializer() (the name DESIGN.md's sketch uses).
  KafkaSourceBuilder& value_format(KafkaDeserializer<T> d) { return deserializer(std::move(d)); }
  /// A client property for librdkafka, or one of Sluice's own keys (see the file comment).
  KafkaSourceBuilder& property(std::string key, std::string value) {
    s_.properties[std::move(key)] = std::move(value);
    return *this;
  }
  /// Several properties at once (later calls override earlier values).
  KafkaSourceBuilder& properties(const kafka::KafkaProperties& props) {
    for (const auto& [k, v] : props)
      s_.properties[k] = v;
    return *this;
  }
  /// What to do with messages the deserializer rejects. kDeadLetter needs a dead-letter file path or a
  /// dead_letter_topic(); the file is opened (created with its directories) when the job starts.
  KafkaSourceBuilder& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "") {
    s_.bad_record_policy = policy;
    s_.dead_letter_path = std::move(dead_letter_path);
    return *this;
  }
  /// Sends bad records to this topic (on the same cluster, same client properties) under kDeadLetter.
  KafkaSourceBuilder& dead_letter_topic(std::string topic) {
    s_.dead_letter_topic = std::move(topic);
    return *this;
  }

  /// The source, or a kConfiguration error saying what is missing or invalid.
  [[nodiscard]] Result<std::shared_ptr<KafkaSource<T>>> try_build() const {
    if (!deserializer_) {
      return Error(ErrorCode::kConfiguration,
                   "Kafka source: no deserializer: set one with deserializer(kafka::json_value<T>()), "
                   "kafka::string_value(), kafka::bytes_value() or your own callable");
    }
    detail::KafkaSourceSettings s = s_;
    Status st = detail::normalize_and_validate(s);
    if (!st.ok()) return st.error();
    return std::make_shared<KafkaSource<T>>(std::move(s), deserializer_);
  }
  /// As try_build(), throwing SluiceException (kConfiguration) on an error.
  std::shared_ptr<KafkaSource<T>> build() const { return try_build().value_or_throw(); }

 private:
  detail::KafkaSourceSettings s_;
  KafkaDeserializer<T> deserializer_;
};

}  // namespace sluice
