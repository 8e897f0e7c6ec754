// The Kafka sink (DESIGN.md §8): writes records to Kafka topics through librdkafka, with delivery guarantee
// `none`, `at-least-once` or `exactly-once` (Flink's KafkaSink, built on librdkafka instead of the Java client).
//
//   auto sink = KafkaSink<Order>::builder()
//                   .bootstrap_servers(brokers)
//                   .topic("orders")                                   // or .topic_selector(fn)
//                   .key_serializer([](const Order& o) { return o.id; })
//                   .value_serializer([](const Order& o) { return to_json_string(o); })
//                   .delivery_guarantee(DeliveryGuarantee::kExactlyOnce)
//                   .transactional_id_prefix("orders-job")
//                   .build();
//   stream.sink_to(sink).uid("orders-sink");
//
// Records. A KafkaRecordSerializer<T> fills a KafkaProducerRecord per record: key, value (either may be null),
// headers, and optionally topic, partition and timestamp. The topic is the builder's topic, or the
// topic_selector's choice, unless the serializer sets one. Without a timestamp the record's event timestamp is
// used, and without one librdkafka stamps the produce time. Defaults: a std::string record is the value as is;
// a JsonMappable record (json_mapping.h) is its JSON text; other types need a value or record serializer.
//
// Partitioning. A record with a partition set goes there. Otherwise a custom KafkaPartitioner<T> (if given)
// chooses from the topic's partition count (read from the broker's metadata, cached for a minute); otherwise
// librdkafka's `murmur2_random` partitioner places it: a keyed record lands where the Java client's default
// partitioner puts it (toPositive(murmur2(key)) % partitions, kafka_default_partition() below; key "a" over 10
// partitions goes to partition 4, pinned in tests against Kafka's own Utils.murmur2), a record without a key on a
// random partition (Java spreads those "sticky" per batch; neither keeps an order for them).
//
// Delivery guarantees (Flink's DeliveryGuarantee):
//  * kNone: records are handed to librdkafka and never waited for (except at the end of a bounded input).
//    Delivery failures still fail the task: they are never silent.
//  * kAtLeastOnce (the default): an idempotent producer (per-partition order survives retries); every
//    checkpoint flushes it and waits for every delivery report, so what a completed checkpoint covers is in
//    Kafka. A failed delivery fails the checkpoint and the task with librdkafka's error naming topic and
//    partition. After a restore the records since the checkpoint are written again (duplicates, never loss).
//  * kExactlyOnce (needs checkpointing and a transactional_id_prefix): Kafka transactions, committed when the
//    checkpoint that covers them completes; readers with isolation.level=read_committed see every record
//    exactly once, and none before its checkpoint completed. Without checkpointing the sink logs a warning and
//    runs at-least-once. Use checkpointing mode EXACTLY_ONCE (aligned barriers) for end-to-end exactly-once.
//
// Exactly-once with librdkafka. librdkafka cannot resume a transaction another producer instance opened
// (Flink's Java sink does that by setting producerId/epoch through reflection), so a transaction left open by a
// crash can only be aborted (init_transactions), never committed. This sink therefore keeps a *recovery copy*:
//  * Each subtask i has a pool of `producer_pool_size` (default 5) transactional producers with
//    transactional.id `<prefix>-<i>-<k>`. Records are produced eagerly into the open transaction of the current
//    checkpoint epoch (so the commit is quick) and also appended, encoded, to the epoch's recovery copy.
//  * At a checkpoint, prepare_commit flushes the producer (every record acknowledged), adds a *marker* to the
//    transaction with rd_kafka_send_offsets_to_transaction: group `<transactional.id>-marker`, partition 0 of
//    the marker topic (transaction_marker_topic(), else the fixed topic, else the topic of the epoch's first
//    record), offset = pre-commit time in ms, metadata = a random token unique to this transaction; and returns
//    the committable {transactional id, subtask, token, marker topic, recovery copy}, which the operator keeps
//    in the checkpoint. The next epoch uses another producer of the pool (one open transaction per producer).
//  * notify_checkpoint_complete commits the producer's transaction. Retriable errors are retried up to the
//    operation timeout; any other failure fails the task, and the restore below re-publishes the copy.
//  * On restore, every restored committable is settled by the subtask that owns its transactional id (old
//    subtask j goes to new subtask j % parallelism, so one subtask handles one id, in checkpoint order): a
//    producer with that transactional.id runs init_transactions, which aborts the transaction if it was still
//    open and waits for one whose commit was in flight; then the marker group's committed offset is read
//    (OffsetFetch by a consumer of the group that never joins it, read_committed). If its metadata equals the
//    committable's token the transaction was committed before the failure and nothing is done; otherwise the recovery
//    copy is produced again in a new transaction, with the marker, and committed. Each transaction is thus visible
//    exactly once. (The marker is a token, not the checkpoint id: prepare_commit() does not learn the id, and a token
//    stays unambiguous when a prefix is reused by a new job whose checkpoint ids start again at 1.)
//  * Lingering transactions (Committer::abort_lingering): every transactional id `<prefix>-<j>-<k>` of the
//    subtasks this subtask owns (j < max(old, new parallelism), k < max(old, new pool size), from the writer
//    state in the checkpoint) that no restored committable names gets init_transactions, which aborts what a
//    killed run left open and unblocks read_committed readers.
// Why it holds: a committable is dropped from the operator state only after its commit returned; the marker is
// written in the same transaction as the records, so "marker has my token" <=> "my records are committed";
// init_transactions fences every older producer instance of the id, so no commit can land after the check.
// A broker-side abort (transaction.timeout.ms expired) therefore costs a task restart and a re-publication,
// not data. A writer that is closed after a failure aborts its open transactions (bounded by 5 s each, in
// parallel), which unblocks readers at once; a pre-committed one is then re-published by the restore.
// Costs and limits (docs/connectors.md):
//  * State: each checkpoint holds the encoded records of every pre-committed, not yet committed epoch
//    (roughly one checkpoint interval of output per subtask); memory holds the open epoch's copy too.
//  * `transaction.timeout.ms` (default 900000 here) should be well above checkpoint interval + the longest
//    restart (DESIGN §10): give max_commit_delay() (or max_commit_delay_from(job config)) and the sink warns
//    at start when the timeout is less than twice that. Too low means broker aborts, restarts and
//    re-publication; the broker caps it at transaction.max.timeout.ms.
//  * The prefix must be unique per job and stable across its restarts; two running jobs with one prefix fence
//    each other. Reusing a prefix for a new job is safe (tokens, not checkpoint ids, identify transactions).
//  * A transaction that a killed run left open on a subtask >= the parallelism recorded in the restored
//    checkpoint (or any, on a fresh start at lower parallelism) is not found; it blocks read_committed readers
//    of its partitions until transaction.timeout.ms aborts it. No data is lost.
//  * Restoring an older checkpoint than the latest completed one (restore-fallback, an old savepoint) may
//    publish again what a later checkpoint committed, as with any two-phase-commit sink. Marker offsets expire
//    with offsets.retention.minutes (7 days by default): a committable restored after that is published again
//    (a duplicate, never a loss).
//  * More than pool size - 1 pre-committed transactions waiting for their checkpoints (checkpoints that keep
//    failing or are very slow to complete) fail the task with an error naming the pool size.
//  * A commit the broker acknowledged can be lost: Kafka 4.4 restarting right after commit_transaction returned
//    left the transaction aborted, or its marker group's offsets pending for minutes (committed or not), or the
//    transaction hanging. So the committable keeps the first record of its transaction as the broker placed it
//    (probe_topic/partition/offset, from the delivery report), and a read_committed consumer reading from there
//    decides: the record means committed, a later record or the end of the partition past it means aborted,
//    nothing yet (the partition's last stable offset is not past it) means pending. Every committed transaction
//    is checked so at the next checkpoint's pre-commit (confirm_commits, briefly: other subtasks' transactions,
//    open until their own notification, can hold the last stable offset back) and stays in every checkpoint,
//    marked `committed`, until its record is seen; the subtask's next commit waits for it (up to 5 s, else the
//    task fails): a later transaction committed first would put the earlier one's re-publication after it
//    (per-key order). One found aborted fails the task, and the restore of the last completed checkpoint, which
//    holds it, re-publishes it. A restore first runs init_transactions on all the
//    subtask's ids, then decides each restored committable the same way; a committable of format version 1
//    (written before the probe record) by its marker group (resolve_marker).
//  * A record still not readable after the operation timeout (since its commit, or in a restore) sits behind a
//    transaction open on the broker (the last stable offset stays at its start). When no producer will end it (a
//    hanging transaction), only an admin can abort it (kafka-transactions.sh find-hanging / abort, KIP-664; librdkafka
//    has no API for it): the task fails naming the transactional id, topic, partition, offsets, leader and these
//    commands, on every restart until it is aborted.
//  * Memory: the open epoch's recovery copy is bounded by max_transaction_bytes (default 512 MiB per subtask):
//    past it the task fails (a checkpoint barrier that never comes would otherwise grow it until the process
//    dies; blocking instead would also hold back that barrier).
//
// Tombstones (Debezium's tombstones.on.delete): with tombstone_after(is_delete), a record for which is_delete
// returns true and that has a key is followed by a second record with the same topic, partition, key and timestamp
// and a null value (no headers), written by the same write() call: so it is in the same transaction as its delete
// (exactly-once), in its recovery copy, and on the same partition right after it (no other record of that key can
// come between). Compaction then removes the key from a compacted topic once delete.retention.ms has passed. A
// delete the producer refuses (too large, below) still gets its tombstone: the deletion reaches the topic while the
// delete event goes to the dead-letter file.
//
// Records too large (above the producer's message.max.bytes) fail the task naming topic, key, size and source
// position (position()), or go to a dead-letter file (on_bad_record(kDeadLetter, path)) and stay out of the
// transaction. Liveness: a probe thread (kafka_common.h KafkaLivenessProbe) fails the next record or checkpoint
// when no broker answered for liveness_timeout (default 30 s), also while no record flows; a flush, a full queue or
// init_transactions waits in 200 ms slices that check the probe, fatal broker errors (authentication,
// authorization, an unknown topic) and the task's cancellation, so neither a hang nor a cancel waits for 60 s.
//
// Threading: KafkaSink and its builder are configured on one thread before the job starts; the sink is then a
// thread-safe factory. Writers and committers belong to one subtask and run on its task thread (librdkafka's
// delivery reports are served there by rd_kafka_poll). Errors: librdkafka failures throw SluiceException
// (ErrorCode::kConnector) naming the operator, subtask, topic/partition or transactional id and librdkafka's
// error, which fails the task; invalid builder settings are ErrorCode::kConfiguration errors from try_build().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/sink.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_record.h"
#include "sluice/core/config.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/json_mapping.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// What a sink promises about its output after failures (Flink's DeliveryGuarantee).
enum class DeliveryGuarantee : uint8_t {
  kNone,         ///< best effort: nothing waited for at checkpoints
  kAtLeastOnce,  ///< flush on snapshot: nothing lost, duplicates after a restore
  kExactlyOnce,  ///< transactions committed with checkpoints: nothing lost, no duplicates for read_committed
};

/// "none", "at-least-once" or "exactly-once".
std::string_view delivery_guarantee_name(DeliveryGuarantee guarantee) noexcept;

/// Parses "none", "at-least-once" / "at_least_once", "exactly-once" / "exactly_once" (any case). kConfiguration
/// error naming the text otherwise.
[[nodiscard]] Result<DeliveryGuarantee> parse_delivery_guarantee(std::string_view text);

/// The Kafka record a serializer makes of one stream record. The sink reuses one object per writer: clear()
/// keeps the buffers' capacity, so serializers that assign through set_key/set_value (or append to
/// mutable_key()/mutable_value()) do not allocate per record. Not thread-safe.
class KafkaProducerRecord {
 public:
  /// "Let the partitioner choose."
  static constexpr int32_t kAnyPartition = -1;

  std::string topic;                    ///< target topic; prefilled with the sink's topic (or selector's)
  int32_t partition = kAnyPartition;    ///< explicit partition, or kAnyPartition
  std::optional<int64_t> timestamp_ms;  ///< record timestamp; unset: the event timestamp, else produce time
  std::vector<KafkaHeader> headers;     ///< in order; keys may repeat (KafkaHeader of kafka_record.h)

  void set_key(std::string_view key) {
    key_.assign(key);
    has_key_ = true;
  }
  /// The key buffer to append to (marks the key as present).
  std::string& mutable_key() {
    has_key_ = true;
    return key_;
  }
  void set_null_key() noexcept { has_key_ = false; }
  bool has_key() const noexcept { return has_key_; }
  /// The key bytes ("" when null: check has_key()).
  std::string_view key() const noexcept { return has_key_ ? std::string_view(key_) : std::string_view(); }

  void set_value(std::string_view value) {
    value_.assign(value);
    has_value_ = true;
  }
  /// The value buffer to append to (marks the value as present).
  std::string& mutable_value() {
    has_value_ = true;
    return value_;
  }
  /// A null value (a tombstone on compacted topics).
  void set_null_value() noexcept { has_value_ = false; }
  bool has_value() const noexcept { return has_value_; }
  std::string_view value() const noexcept { return has_value_ ? std::string_view(value_) : std::string_view(); }

  /// Resets every field (key and value become null, buffers keep their capacity).
  void clear() {
    topic.clear();
    partition = kAnyPartition;
    timestamp_ms.reset();
    headers.clear();
    key_.clear();
    value_.clear();
    has_key_ = has_value_ = false;
  }

 private:
  std::string key_;
  std::string value_;
  bool has_key_ = false;
  bool has_value_ = false;
};

/// Fills `out` (cleared and prefilled with the topic) from `record`. Runs on the task thread; may throw to fail
/// the task.
template <class T>
using KafkaRecordSerializer = std::function<void(const T& record, KafkaProducerRecord& out)>;

/// Chooses the partition, in [0, num_partitions), of a record whose serializer set none. Runs on the task thread.
template <class T>
using KafkaPartitioner =
    std::function<int32_t(const T& record, const KafkaProducerRecord& out, int32_t num_partitions)>;

/// Kafka's murmur2 hash of `bytes` (org.apache.kafka.common.utils.Utils.murmur2, seed 0x9747b28c).
int32_t kafka_murmur2(std::string_view bytes) noexcept;

/// The partition the Java client's default partitioner (and librdkafka's murmur2_random) gives a record with key
/// `key`: (murmur2(key) & 0x7fffffff) % num_partitions. num_partitions must be > 0.
int32_t kafka_default_partition(std::string_view key, int32_t num_partitions) noexcept;

/// What an exactly-once KafkaSink pre-commits at a checkpoint: one transaction and its recovery copy (see the
/// file comment). Kept in the operator state until committed.
struct KafkaCommittable {
  std::string transactional_id;   ///< `<prefix>-<subtask>-<k>`
  int32_t subtask = 0;            ///< the subtask that wrote it (owns the id)
  std::string token;              ///< marker metadata identifying this transaction; unique
  std::string marker_topic;       ///< the marker is on partition 0 of this topic
  int64_t precommit_time_ms = 0;  ///< marker offset (informational)
  int64_t record_count = 0;
  std::string records;  ///< the recovery copy (detail::RecoveryCopyWriter encoding)
  /// One record of the transaction as the broker placed it (from its delivery report): whether a read_committed
  /// reader sees it there tells whether the transaction committed. probe_offset -1: no record.
  std::string probe_topic;
  int32_t probe_partition = -1;
  int64_t probe_offset = -1;
  /// True: committed already, kept in the checkpoint only until its probe record is seen (a commit the broker
  /// acknowledged can still be lost); the runtime does not commit it again, a restore settles it like the others.
  bool committed = false;
  friend bool operator==(const KafkaCommittable&, const KafkaCommittable&) = default;
};
SLUICE_FIELDS(KafkaCommittable, transactional_id, subtask, token, marker_topic, precommit_time_ms, record_count,
              records, probe_topic, probe_partition, probe_offset, committed);

/// The committable's format version written into checkpoints and savepoints (TypeSerializer<KafkaCommittable>).
inline constexpr uint64_t kKafkaCommittableFormatVersion = 2;

/// The serializer of a KafkaCommittable in the sink's operator state. Version 1 (Sluice before the probe record)
/// is the seven fields from transactional_id to records and nothing else; version 2 appends a varint version
/// number, the probe record (topic, partition, offset) and `committed`. A version 1 committable therefore restores with
/// probe_offset -1, and the restore settles it by its marker group as version 1 did. Reading relies on the
/// committable ending its length-delimited operator state element, as it does in the two-phase-commit sink
/// operator's (checkpoint id, committable) pairs. A version this build does not know fails with
/// ErrorCode::kSerialization naming it.
template <>
struct TypeSerializer<KafkaCommittable> {
  static void serialize(const KafkaCommittable& v, DataOutput& out);
  static void deserialize(KafkaCommittable& target, DataInput& in);
  static constexpr size_t min_encoded_size() { return 24; }
};

namespace detail {

/// The type-independent settings of a KafkaSink.
struct KafkaSinkSettings {
  std::string bootstrap_servers;
  BadRecordPolicy on_bad_record = BadRecordPolicy::kFail;  ///< a record the producer rejects for its size
  std::string dead_letter_path;                            ///< kDeadLetter: the JSON-lines file
  int64_t max_transaction_bytes = 512LL << 20;             ///< kDefaultMaxTransactionBytes
  int64_t liveness_timeout_ms = 30'000;                    ///< no broker answered for this long: fail; 0 = off
  std::string topic;                                       ///< fixed topic ("" when chosen per record)
  std::map<std::string, std::string> properties;           ///< librdkafka producer properties, passed through
  DeliveryGuarantee guarantee = DeliveryGuarantee::kAtLeastOnce;
  std::string transactional_id_prefix;
  int32_t pool_size = 5;
  std::optional<int64_t> max_commit_delay_ms;  ///< expected checkpoint interval + longest restart
  int64_t operation_timeout_ms = 60'000;       ///< bound of each blocking librdkafka call
  std::string marker_topic;
};

/// The default bound of an exactly-once subtask's open transaction (its recovery copy), in bytes.
inline constexpr int64_t kDefaultMaxTransactionBytes = 512LL << 20;

/// Checks the settings: kConfiguration error for a missing bootstrap server list, exactly-once without a prefix,
/// a pool size below 2, properties librdkafka rejects, or properties the sink manages (transactional.id;
/// enable.idempotence=false with exactly-once).
[[nodiscard]] Status validate_settings(const KafkaSinkSettings& settings);

/// Checkpoint interval plus the longest restart delay of the job configuration's restart strategy (ms).
int64_t max_commit_delay_from(const Configuration& job_config);

class KafkaProducerPool;

/// The pool of producers of one subtask, shared by its writer and committer. Created by the committer.
std::shared_ptr<KafkaProducerPool> make_producer_pool(const KafkaSinkSettings& settings, RuntimeContext& ctx);

/// The type-independent part of a KafkaSink writer (see the file comment). Task thread only.
class KafkaSinkWriterCore {
 public:
  /// `dead_letter`: the file of records rejected for their size (null unless on_bad_record is kDeadLetter).
  KafkaSinkWriterCore(const KafkaSinkSettings& settings, RuntimeContext& ctx, std::shared_ptr<KafkaProducerPool> pool,
                      std::shared_ptr<DeadLetterFile> dead_letter = nullptr);
  ~KafkaSinkWriterCore();
  KafkaSinkWriterCore(const KafkaSinkWriterCore&) = delete;
  KafkaSinkWriterCore& operator=(const KafkaSinkWriterCore&) = delete;

  /// Produces `record` (topic must be set; partition may be kAnyPartition). `event_timestamp` is used when the
  /// record has no timestamp (kNoTimestamp: none). Blocks while librdkafka's queue is full (backpressure).
  /// Returns why the producer rejected the record for its content (larger than message.max.bytes), nullopt when
  /// it was produced; pass a rejection to bad_record(). Throws when the open transaction's recovery copy would
  /// exceed max_transaction_bytes, when no broker answered for liveness_timeout, and on librdkafka failures.
  [[nodiscard]] std::optional<std::string> write(const KafkaProducerRecord& record, int64_t event_timestamp);
  /// A record write() rejected: throws a kConnector error naming the sink, topic, key, size, `position` (the
  /// record's source position, may be empty) and `reason` (BadRecordPolicy::kFail), or appends it to the
  /// dead-letter file and goes on (kDeadLetter).
  void bad_record(const KafkaProducerRecord& record, const std::string& reason, const std::string& position);
  /// Partition count of `topic` from the broker's metadata (cached for a minute).
  int32_t partition_count(const std::string& topic);
  /// At a checkpoint (at-least-once, exactly-once) and at the end of the input (all guarantees): waits until every
  /// record written so far is acknowledged; throws on a failed delivery or after the operation timeout.
  void flush(bool end_of_input);
  /// Exactly-once: pre-commits the open transaction (flush, marker) and returns its committable; empty otherwise.
  std::vector<KafkaCommittable> prepare_commit();
  /// Releases the producers (open transactions are left to abort_lingering of the next run).
  void close();
  /// Records diverted to the dead-letter file by this writer.
  int64_t dead_letters() const noexcept;
  /// True when this writer uses transactions (exactly-once with checkpointing).
  bool transactional() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Commits and recovers KafkaCommittables (see the file comment). Task thread only.
class KafkaSinkCommitter final : public Committer<KafkaCommittable> {
 public:
  KafkaSinkCommitter(KafkaSinkSettings settings, std::shared_ptr<KafkaProducerPool> pool);
  ~KafkaSinkCommitter() override;
  /// Before abort_lingering (the restore): nothing; abort_lingering settles every restored committable.
  /// After: commits each committable's transaction on the writer's producer; a transaction this process does not
  /// hold (a committer without its writer) is settled like a restored one.
  void commit(std::vector<KafkaCommittable>& committables) override;
  /// Settles the restored committables this subtask owns (in order), then aborts the lingering transactions of
  /// this subtask's id range (detail::lingering_transactional_ids).
  void abort_lingering(RuntimeContext& ctx, const std::vector<KafkaCommittable>& restored_committables) override;

 private:
  KafkaSinkSettings settings_;
  std::shared_ptr<KafkaProducerPool> pool_;
  bool restore_done_ = false;
};

/// Logs, once per job start (subtask 0, first attempt), the transaction timeout warning and the exactly-once
/// without checkpointing warning.
void log_start_warnings(const KafkaSinkSettings& settings, RuntimeContext& ctx);

}  // namespace detail

/// Writes records to Kafka (see the file comment). Build it with KafkaSink<T>::builder(). A thread-safe factory.
template <class T>
class KafkaSink final : public TwoPhaseCommittingSink<T, KafkaCommittable> {
 public:
  class Builder;
  static Builder builder() { return Builder(); }

  const detail::KafkaSinkSettings& settings() const noexcept { return settings_; }

  std::unique_ptr<Committer<KafkaCommittable>> create_committer(RuntimeContext& ctx) const override {
    detail::log_start_warnings(settings_, ctx);
    std::shared_ptr<detail::KafkaProducerPool> pool = detail::make_producer_pool(settings_, ctx);
    {
      std::lock_guard lock(mu_);
      handoff_[&ctx] = pool;
    }
    return std::make_unique<detail::KafkaSinkCommitter>(settings_, std::move(pool));
  }

  std::unique_ptr<PrecommittingSinkWriter<T, KafkaCommittable>> create_precommitting_writer(
      RuntimeContext& ctx) const override {
    std::shared_ptr<detail::KafkaProducerPool> pool;
    {
      std::lock_guard lock(mu_);
      auto it = handoff_.find(&ctx);
      if (it != handoff_.end()) {
        pool = it->second.lock();
        handoff_.erase(it);
      }
    }
    if (!pool) pool = detail::make_producer_pool(settings_, ctx);
    return std::make_unique<Writer>(*this, ctx, std::move(pool));
  }

 private:
  friend class Builder;
  KafkaSink() = default;

  class Writer final : public PrecommittingSinkWriter<T, KafkaCommittable> {
   public:
    Writer(const KafkaSink& sink, RuntimeContext& ctx, std::shared_ptr<detail::KafkaProducerPool> pool)
        : sink_(sink), core_(sink.settings_, ctx, std::move(pool), sink.dead_letter_file()) {}
    void write(const T& record, const SinkWriterContext& ctx) override {
      out_.clear();
      if (sink_.topic_selector_) {
        out_.topic = sink_.topic_selector_(record);
      } else {
        out_.topic.assign(sink_.settings_.topic);
      }
      sink_.serializer_(record, out_);
      if (sink_.partitioner_ && out_.partition == KafkaProducerRecord::kAnyPartition && !out_.topic.empty()) {
        out_.partition = sink_.partitioner_(record, out_, core_.partition_count(out_.topic));
      }
      const bool tombstone = sink_.tombstone_after_ && out_.has_key() && sink_.tombstone_after_(record);
      if (std::optional<std::string> rejected = core_.write(out_, ctx.timestamp())) {
        core_.bad_record(out_, *rejected, sink_.position_ ? sink_.position_(record) : std::string());
      }
      if (tombstone) {
        // Same topic, partition (a custom partitioner's choice included), key and timestamp; no value.
        out_.set_null_value();
        out_.headers.clear();
        if (std::optional<std::string> rejected = core_.write(out_, ctx.timestamp())) {
          core_.bad_record(out_, *rejected, sink_.position_ ? sink_.position_(record) : std::string());
        }
      }
    }
    void flush(bool end_of_input) override { core_.flush(end_of_input); }
    std::vector<KafkaCommittable> prepare_commit() override { return core_.prepare_commit(); }
    void close() override { core_.close(); }

   private:
    const KafkaSink& sink_;
    detail::KafkaSinkWriterCore core_;
    KafkaProducerRecord out_;
  };

  // The dead-letter file, opened by the first writer (shared by the subtasks).
  std::shared_ptr<DeadLetterFile> dead_letter_file() const {
    if (settings_.on_bad_record != BadRecordPolicy::kDeadLetter) return nullptr;
    std::lock_guard lock(mu_);
    if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
    return dead_letter_;
  }

  detail::KafkaSinkSettings settings_;
  KafkaRecordSerializer<T> serializer_;
  std::function<std::string(const T&)> topic_selector_;
  KafkaPartitioner<T> partitioner_;
  std::function<std::string(const T&)> position_;
  std::function<bool(const T&)> tombstone_after_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
  // Pools made by create_committer, waiting for create_precommitting_writer of the same subtask (keyed by its
  // RuntimeContext); weak, so a pool whose open() failed in between is not kept alive.
  mutable std::mutex mu_;
  mutable std::map<const RuntimeContext*, std::weak_ptr<detail::KafkaProducerPool>> handoff_;
};

/// Configures a KafkaSink. Methods return *this; try_build() checks the settings.
template <class T>
class KafkaSink<T>::Builder {
 public:
  /// Comma-separated host:port list (librdkafka bootstrap.servers). Required.
  Builder& bootstrap_servers(std::string servers) {
    settings_.bootstrap_servers = std::move(servers);
    return *this;
  }
  /// Writes every record to `topic` (unless the serializer sets another).
  Builder& topic(std::string topic) {
    settings_.topic = std::move(topic);
    return *this;
  }
  /// Chooses the topic per record (replaces topic()).
  Builder& topic_selector(std::function<std::string(const T&)> selector) {
    topic_selector_ = std::move(selector);
    return *this;
  }
  /// The record key (default: no key).
  Builder& key_serializer(std::function<std::string(const T&)> key) {
    key_ = std::move(key);
    return *this;
  }
  /// The record value (default: a std::string as is, a JsonMappable type as JSON).
  Builder& value_serializer(std::function<std::string(const T&)> value) {
    value_ = std::move(value);
    return *this;
  }
  /// Full control over the Kafka record (topic, partition, key, value, headers, timestamp); replaces the key and
  /// value serializers.
  Builder& record_serializer(KafkaRecordSerializer<T> serializer) {
    record_ = std::move(serializer);
    return *this;
  }
  /// A custom partitioner for records whose serializer sets no partition (default: Java-compatible murmur2).
  Builder& partitioner(KafkaPartitioner<T> partitioner) {
    partitioner_ = std::move(partitioner);
    return *this;
  }
  /// A librdkafka producer property (CONFIGURATION.md of librdkafka), e.g. linger.ms, compression.type, acks.
  Builder& property(std::string key, std::string value) {
    settings_.properties[std::move(key)] = std::move(value);
    return *this;
  }
  Builder& delivery_guarantee(DeliveryGuarantee guarantee) {
    settings_.guarantee = guarantee;
    return *this;
  }
  /// Prefix of the transactional ids (exactly-once; required there): unique per job, stable across restarts.
  Builder& transactional_id_prefix(std::string prefix) {
    settings_.transactional_id_prefix = std::move(prefix);
    return *this;
  }
  /// Transactional producers per subtask (exactly-once; default 5, at least 2): allows pool size - 1
  /// pre-committed transactions waiting for their checkpoints.
  Builder& producer_pool_size(int32_t size) {
    settings_.pool_size = size;
    return *this;
  }
  /// The longest expected time from a transaction's first record to its commit: checkpoint interval plus the
  /// longest restart. Used only for the start-up warning about transaction.timeout.ms.
  Builder& max_commit_delay(std::chrono::milliseconds delay) {
    settings_.max_commit_delay_ms = delay.count();
    return *this;
  }
  /// max_commit_delay from the job's configuration: execution.checkpointing.interval plus the longest delay of
  /// its restart strategy.
  Builder& max_commit_delay_from(const Configuration& job_config) {
    settings_.max_commit_delay_ms = detail::max_commit_delay_from(job_config);
    return *this;
  }
  /// Bound of each blocking librdkafka call (flush, init/commit transaction, offset queries); default 60 s.
  Builder& operation_timeout(std::chrono::milliseconds timeout) {
    settings_.operation_timeout_ms = timeout.count();
    return *this;
  }
  /// What to do with a record the producer rejects for its content (key, value and headers larger than the
  /// producer's message.max.bytes, 1,000,000 by default): fail the task naming it (kFail, the default), or append
  /// {"sink":"kafka","operator","topic","partition","key","position","error","size","record"} to the JSON-lines
  /// file `dead_letter_path` and go on (kDeadLetter; the file is fdatasync'ed before each checkpoint completes).
  Builder& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "") {
    settings_.on_bad_record = policy;
    settings_.dead_letter_path = std::move(dead_letter_path);
    return *this;
  }
  /// The record's source position, named by bad-record errors and dead letters (default: none).
  Builder& position(std::function<std::string(const T&)> position) {
    position_ = std::move(position);
    return *this;
  }
  /// Debezium's tombstones.on.delete: after each record for which `is_delete` returns true and whose Kafka record
  /// has a key, writes a tombstone (same topic, partition, key and timestamp, null value) in the same transaction
  /// (see the file comment). Default: none. `is_delete` runs on the task thread.
  Builder& tombstone_after(std::function<bool(const T&)> is_delete) {
    tombstone_after_ = std::move(is_delete);
    return *this;
  }
  /// Exactly-once: the most bytes the open transaction's recovery copy may hold per subtask (default 512 MiB).
  /// The copy is freed only when a checkpoint pre-commits it, so a checkpoint that stalls would grow it without
  /// bound; past this the task fails naming the bound (blocking instead would also block the checkpoint barrier
  /// that frees it). Memory of a subtask is bounded by about producer_pool_size() times this.
  Builder& max_transaction_bytes(int64_t bytes) {
    settings_.max_transaction_bytes = bytes;
    return *this;
  }
  /// Fails the task when no broker of bootstrap_servers() answered a metadata request (sent every
  /// timeout / 4, at most every 5 s, off the task thread) for `timeout`, also while no record flows; checked at
  /// each record and each checkpoint. Default 30 s; 0 turns it off.
  Builder& liveness_timeout(std::chrono::milliseconds timeout) {
    settings_.liveness_timeout_ms = timeout.count();
    return *this;
  }
  /// The topic whose partition 0 carries the exactly-once markers (default: the fixed topic, else the topic of
  /// each transaction's first record). Must exist.
  Builder& transaction_marker_topic(std::string topic) {
    settings_.marker_topic = std::move(topic);
    return *this;
  }

  /// The sink, or a kConfiguration error (see detail::validate_settings; also: no topic and no way to choose one,
  /// no value serializer for a type without a default).
  [[nodiscard]] Result<std::shared_ptr<KafkaSink<T>>> try_build() const {
    SLUICE_RETURN_IF_ERROR(detail::validate_settings(settings_));
    if (settings_.topic.empty() && !topic_selector_ && !record_) {
      return Error(ErrorCode::kConfiguration,
                   "KafkaSink: no topic: set topic(), topic_selector() or a record_serializer() that sets it");
    }
    std::shared_ptr<KafkaSink<T>> sink(new KafkaSink<T>());
    sink->settings_ = settings_;
    sink->topic_selector_ = topic_selector_;
    sink->partitioner_ = partitioner_;
    sink->position_ = position_;
    sink->tombstone_after_ = tombstone_after_;
    if (record_) {
      sink->serializer_ = record_;
    } else {
      std::function<std::string(const T&)> value = value_;
      if (!value) {
        if constexpr (std::is_convertible_v<const T&, std::string_view>) {
          value = [](const T& r) { return std::string(std::string_view(r)); };
        } else if constexpr (JsonMappable<T>) {
          value = [](const T& r) {
            std::string s;
            append_json(r, s);
            return s;
          };
        } else {
          return Error(ErrorCode::kConfiguration,
                       "KafkaSink: the record type has no default serialization: set value_serializer() or "
                       "record_serializer()");
        }
      }
      sink->serializer_ = [key = key_, value = std::move(value)](const T& r, KafkaProducerRecord& out) {
        if (key) out.set_key(key(r));
        out.set_value(value(r));
      };
    }
    return sink;
  }

  /// try_build(), throwing SluiceException on an invalid configuration.
  std::shared_ptr<KafkaSink<T>> build() const { return try_build().value_or_throw(); }

 private:
  detail::KafkaSinkSettings settings_;
  std::function<std::string(const T&)> topic_selector_;
  std::function<std::string(const T&)> key_;
  std::function<std::string(const T&)> value_;
  KafkaRecordSerializer<T> record_;
  KafkaPartitioner<T> partitioner_;
  std::function<std::string(const T&)> position_;
  std::function<bool(const T&)> tombstone_after_;
};

}  // namespace sluice
