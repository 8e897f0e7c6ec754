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
//
// Files: the splits and the owner rule in kafka_partition_split.h, starting offsets in kafka_starting_offsets.h,
// metrics in kafka_source_metrics.h, the settings the builder fills in kafka_source_settings.h and the reader's
// non-template core in kafka_reader_core.h; the enumerator, the partition discoverer and the shared counters are
// private to src/sluice/connectors/kafka/ (its README lists them).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_partition_split.h"
#include "sluice/connectors/kafka/kafka_reader_core.h"
#include "sluice/connectors/kafka/kafka_record.h"
#include "sluice/connectors/kafka/kafka_source_metrics.h"
#include "sluice/connectors/kafka/kafka_source_settings.h"
#include "sluice/connectors/kafka/kafka_starting_offsets.h"
#include "sluice/core/error.h"

namespace sluice {

namespace detail {

// What KafkaSource<T> reaches of its non-template parts (kafka_source.cc), so that the enumerator and the shared
// counters stay private to src/sluice/connectors/kafka/.

/// The counters shared by a source's readers, with its connection board named after `settings`' topics.
[[nodiscard]] std::shared_ptr<KafkaSourceStats> make_kafka_source_stats(const KafkaSourceSettings& settings);
/// The bad-record counter of `stats`.
const std::shared_ptr<BadRecordStats>& kafka_bad_record_stats(const KafkaSourceStats& stats) noexcept;
/// The metrics snapshot now (KafkaSourceStats::metrics()). Thread-safe.
KafkaSourceMetrics kafka_source_metrics(const KafkaSourceStats& stats);
/// Each open reader's connection (SourceConnectionBoard::snapshot at the steady time now). Thread-safe.
std::vector<SourceConnection> kafka_source_connections(const KafkaSourceStats& stats);
/// The enumerator with its own librdkafka client. Throws SluiceException on a configuration error.
std::unique_ptr<SplitEnumerator<KafkaPartitionSplit>> make_kafka_source_enumerator(
    SplitEnumeratorContext<KafkaPartitionSplit>& ctx, const KafkaSourceSettings& settings);

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
      : settings_(std::move(settings)),
        deserializer_(std::move(deserializer)),
        stats_(detail::make_kafka_source_stats(settings_)) {}

  Boundedness boundedness() const override {
    return settings_.bounded ? Boundedness::kBounded : Boundedness::kContinuousUnbounded;
  }

  /// Creates the enumerator with its own client. Throws SluiceException on a configuration error.
  std::unique_ptr<SplitEnumerator<KafkaPartitionSplit>> create_enumerator(
      SplitEnumeratorContext<KafkaPartitionSplit>& ctx) const override {
    dead_letter_file();  // a dead-letter file that cannot be opened fails the job at start
    return detail::make_kafka_source_enumerator(ctx, settings_);
  }

  /// Creates a reader with its own consumer. Throws SluiceException on a configuration error.
  std::unique_ptr<SourceReader<T, KafkaPartitionSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(
        detail::KafkaReaderCore::create(settings_, ctx, dead_letter_file(), stats_).value_or_throw(), deserializer_);
  }

  /// The bad-record counter shared by all readers of this source (also in metrics().bad_records).
  const std::shared_ptr<BadRecordStats>& stats() const noexcept { return detail::kafka_bad_record_stats(*stats_); }
  /// The source's metrics now, over its readers in this process (see KafkaSourceMetrics for names and units).
  /// Thread-safe: may be called from any thread while the job runs; never asks the broker (high watermarks
  /// are librdkafka's cached values).
  KafkaSourceMetrics metrics() const { return detail::kafka_source_metrics(*stats_); }
  /// Each open reader subtask's connection to the cluster: disconnected when no broker answered its probe for
  /// KafkaLivenessProbe::kDisconnectedAfter (3 s), naming librdkafka's last error. Thread-safe.
  std::vector<SourceConnection> connections() const { return detail::kafka_source_connections(*stats_); }
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
  std::shared_ptr<detail::KafkaSourceStats> stats_;
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
