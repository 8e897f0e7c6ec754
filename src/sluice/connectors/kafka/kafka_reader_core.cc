// KafkaReaderCore: a KafkaSource reader's consumer, assignment, positions, errors, offset commits and dead letters.
#include "sluice/connectors/kafka/kafka_reader_core.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <mutex>

#include "kafka_source_internals.h"
#include "kafka_source_stats.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/clock.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/utf8.h"
#include "sluice/core/value.h"

namespace sluice {

using kafka::KafkaClientPtr;
using kafka::KafkaPartitionListPtr;
using kafka::KafkaProperties;
using kafka_source_internal::consumer_properties;
using kafka_source_internal::kRateWindowMs;
using kafka_source_internal::kRole;
using kafka_source_internal::RateLimitedLog;
using kafka_source_internal::steady_ms;

namespace {

// Completed-checkpoint commits remembered at most (older ones are dropped: a newer commit supersedes them).
constexpr size_t kMaxPendingCommits = 64;
// How long close() waits for dead letters in flight to a dead-letter topic.
constexpr int kCloseFlushMs = 10'000;
// How long a checkpoint waits for dead letters in flight to a dead-letter topic.
constexpr int kSnapshotFlushMs = 60'000;

KafkaTimestampType timestamp_type_of(rd_kafka_timestamp_type_t t) {
  switch (t) {
    case RD_KAFKA_TIMESTAMP_CREATE_TIME:
      return KafkaTimestampType::kCreateTime;
    case RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME:
      return KafkaTimestampType::kLogAppendTime;
    default:
      return KafkaTimestampType::kNone;
  }
}

}  // namespace

namespace detail {

namespace {

/// What librdkafka's queue callback reaches: the reader's context while the reader is open.
struct WakeupHook {
  std::mutex mu;
  SourceReaderContext* ctx = nullptr;
};

// Called by librdkafka from its threads when the consumer queue becomes non-empty.
void on_queue_event(rd_kafka_t* /*rk*/, void* opaque) {
  auto* hook = static_cast<WakeupHook*>(opaque);
  std::lock_guard lock(hook->mu);
  if (hook->ctx != nullptr) hook->ctx->wakeup();
}

}  // namespace

struct KafkaReaderCore::Impl {
  KafkaSourceSettings settings;
  int subtask = 0;
  std::string name;  // "Kafka source subtask 2" for log lines
  bool commit = false;
  WakeupHook wakeup;  // outlives the clients (declared first, destroyed last)
  KafkaClientPtr consumer;
  kafka::KafkaQueuePtr queue;
  KafkaClientPtr dead_letter_producer;
  std::unique_ptr<kafka::KafkaLivenessProbe> liveness;  // stopped in close(), before the wakeup hook goes
  // Set by librdkafka callbacks, which run on the task thread while poll() consumes the queue.
  std::string fatal_error;
  std::string dead_letter_error;
  int64_t dead_letters_in_flight = 0;
  RateLimitedLog transient_log{std::chrono::seconds(10)};
  RateLimitedLog commit_failure_log{std::chrono::seconds(60)};
  // For metrics (set by the core; the callbacks run on the task thread).
  KafkaSourceStats* stats = nullptr;
  KafkaReaderStats* reader_stats = nullptr;
  // Last lookup of poll(): messages come in runs of one partition.
  const rd_kafka_topic_t* cached_rkt = nullptr;
  int32_t cached_partition = -1;
  Partition* cached = nullptr;
  bool closed = false;

  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    const auto code = static_cast<rd_kafka_resp_err_t>(err);
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
      char buf[512];
      const rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof buf);
      if (self->fatal_error.empty()) self->fatal_error = fmt::format("{}: {}", rd_kafka_err2name(orig), buf);
      return;
    }
    if (kafka::is_permanent_kafka_error(code)) {
      if (self->fatal_error.empty()) self->fatal_error = fmt::format("{}: {}", rd_kafka_err2name(code), reason);
      return;
    }
    int64_t suppressed = 0;
    if (self->transient_log.allow(suppressed)) {
      spdlog::warn("{}: Kafka client error, retrying ({} similar not logged): {}: {}", self->name, suppressed,
                   rd_kafka_err2name(code), reason);
    }
  }

  static void offset_commit_cb(rd_kafka_t* /*rk*/, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                               void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    std::string failed;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && offsets != nullptr) {
      for (int i = 0; i < offsets->cnt; ++i) {
        const rd_kafka_topic_partition_t& p = offsets->elems[i];
        if (p.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
          if (failed.empty()) {
            failed = fmt::format("topic '{}' partition {}: {}", p.topic, p.partition, kafka::kafka_error_text(p.err));
          }
        } else if (p.offset >= 0) {
          self->record_committed(p.topic, p.partition, p.offset);
        }
      }
    } else if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failed = kafka::kafka_error_text(err);
    }
    if (failed.empty()) {
      spdlog::debug("{}: committed offsets to group '{}'", self->name, self->settings.group_id());
      return;
    }
    int64_t suppressed = 0;
    if (self->commit_failure_log.allow(suppressed)) {
      spdlog::warn(
          "{}: committing offsets to group '{}' failed ({} more failures not logged); the job goes on, its "
          "positions are in its checkpoints: {}",
          self->name, self->settings.group_id(), suppressed, failed);
    }
  }

  static void dead_letter_delivery_cb(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    --self->dead_letters_in_flight;
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR && self->dead_letter_error.empty()) {
      self->dead_letter_error = kafka::kafka_error_text(m->err);
    }
  }

  // The broker acknowledged `offset` for a partition: shows it in metrics() while the partition is assigned.
  void record_committed(const char* topic, int32_t partition, int64_t offset) {
    if (stats == nullptr || reader_stats == nullptr) return;
    std::lock_guard lock(stats->mu);
    auto it = reader_stats->partitions.find(KafkaTopicPartition{topic, partition});
    if (it != reader_stats->partitions.end()) it->second->committed_offset.store(offset, std::memory_order_relaxed);
  }

  void throw_if_failed() const {
    if (liveness) {
      if (std::optional<std::string> f = liveness->failure()) throw SluiceException(Error(ErrorCode::kConnector, *f));
    }
    if (!fatal_error.empty()) {
      throw SluiceException(
          Error(ErrorCode::kConnector, fmt::format("{}: the Kafka consumer failed (bootstrap servers '{}'): {}", name,
                                                   settings.bootstrap_servers(), fatal_error)));
    }
    if (!dead_letter_error.empty()) {
      throw SluiceException(
          Error(ErrorCode::kConnector, fmt::format("{}: writing a bad record to the dead-letter topic '{}' failed: {}",
                                                   name, settings.dead_letter_topic, dead_letter_error)));
    }
  }

  // Waits for dead letters in flight to the dead-letter topic; throws when one failed or the wait timed out.
  void flush_dead_letters(int timeout_ms) {
    if (!dead_letter_producer) return;
    const rd_kafka_resp_err_t err = rd_kafka_flush(dead_letter_producer.get(), timeout_ms);
    throw_if_failed();
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw SluiceException(kafka::kafka_error(
          ErrorCode::kConnector,
          fmt::format("{}: bad records could not be written to the dead-letter topic '{}' within {} ms", name,
                      settings.dead_letter_topic, timeout_ms),
          err));
    }
  }
};

KafkaReaderCore::KafkaReaderCore(const KafkaSourceSettings& settings, std::shared_ptr<DeadLetterFile> dead_letter,
                                 std::shared_ptr<KafkaSourceStats> stats)
    : dead_letter_(std::move(dead_letter)),
      stats_(std::move(stats)),
      reader_stats_(std::make_shared<KafkaReaderStats>()),
      impl_(std::make_unique<Impl>()) {
  impl_->settings = settings;
  impl_->stats = stats_.get();
  impl_->reader_stats = reader_stats_.get();
}

Result<std::unique_ptr<KafkaReaderCore>> KafkaReaderCore::create(const KafkaSourceSettings& settings,
                                                                 SourceReaderContext& ctx,
                                                                 std::shared_ptr<DeadLetterFile> dead_letter,
                                                                 std::shared_ptr<KafkaSourceStats> stats) {
  std::unique_ptr<KafkaReaderCore> core(new KafkaReaderCore(settings, std::move(dead_letter), std::move(stats)));
  Impl& impl = *core->impl_;
  impl.subtask = ctx.subtask_index();
  impl.name = fmt::format("{} subtask {} ({})", kRole, impl.subtask, settings.describe_topics());
  impl.commit = settings.commit_offsets_on_checkpoint && !settings.group_id().empty();

  SLUICE_ASSIGN_OR_RETURN(
      kafka::KafkaConfPtr conf,
      kafka::make_kafka_conf(
          consumer_properties(settings, fmt::format("{}-{}", settings.client_id_prefix, impl.subtask)), kRole));
  rd_kafka_conf_set_opaque(conf.get(), &impl);
  rd_kafka_conf_set_error_cb(conf.get(), &Impl::error_cb);
  rd_kafka_conf_set_offset_commit_cb(conf.get(), &Impl::offset_commit_cb);
  SLUICE_ASSIGN_OR_RETURN(KafkaClientPtr consumer, kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf), kRole));
  impl.consumer = std::move(consumer);
  // Everything (errors, commit results) arrives on the consumer queue, which poll() serves.
  if (rd_kafka_resp_err_t err = rd_kafka_poll_set_consumer(impl.consumer.get())) {
    return kafka::kafka_error(ErrorCode::kConnector, fmt::format("{}: setting up the consumer", impl.name), err);
  }
  impl.queue.reset(rd_kafka_queue_get_consumer(impl.consumer.get()));
  if (!impl.queue) {
    return Error(ErrorCode::kInternal, fmt::format("{}: the consumer has no consumer queue", impl.name));
  }
  impl.wakeup.ctx = &ctx;
  rd_kafka_queue_cb_event_enable(impl.queue.get(), &on_queue_event, &impl.wakeup);
  {
    // A quiet topic calls poll() only when the consumer queue has something: the probe wakes the task itself.
    // Also with the liveness timeout off, the probe watches the connection for /health (connections()).
    Result<std::unique_ptr<kafka::KafkaLivenessProbe>> probe = kafka::KafkaLivenessProbe::start(
        RD_KAFKA_CONSUMER, settings.properties, std::chrono::milliseconds(settings.liveness_timeout_ms), impl.name,
        [hook = &impl.wakeup] {
          std::lock_guard lock(hook->mu);
          if (hook->ctx != nullptr) hook->ctx->wakeup();
        },
        kafka::KafkaLivenessProbe::ConnectionWatch{core->stats_->connections, impl.subtask});
    if (!probe.ok()) return probe.error();
    impl.liveness = std::move(probe).value();
  }
  {
    // From now on metrics() reads this reader (close() takes it out before destroying the consumer).
    std::lock_guard lock(core->stats_->mu);
    core->reader_stats_->consumer = impl.consumer.get();
    core->stats_->readers.push_back(core->reader_stats_);
  }

  if (settings.bad_record_policy == BadRecordPolicy::kDeadLetter && !settings.dead_letter_topic.empty()) {
    KafkaProperties props = settings.properties;
    for (const char* consumer_only : {"group.id", "isolation.level", "auto.offset.reset", "queued.min.messages"})
      props.erase(consumer_only);
    if (props.find("client.id") == props.end()) {
      props["client.id"] = fmt::format("{}-dead-letters-{}", settings.client_id_prefix, impl.subtask);
    }
    SLUICE_ASSIGN_OR_RETURN(kafka::KafkaConfPtr pconf, kafka::make_kafka_conf(props, kRole));
    rd_kafka_conf_set_opaque(pconf.get(), &impl);
    rd_kafka_conf_set_dr_msg_cb(pconf.get(), &Impl::dead_letter_delivery_cb);
    SLUICE_ASSIGN_OR_RETURN(KafkaClientPtr producer,
                            kafka::make_kafka_client(RD_KAFKA_PRODUCER, std::move(pconf), kRole));
    impl.dead_letter_producer = std::move(producer);
  }
  return core;
}

KafkaReaderCore::~KafkaReaderCore() {
  close();
}

void KafkaReaderCore::add_splits(std::vector<KafkaPartitionSplit> splits) {
  KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(splits.size())));
  for (KafkaPartitionSplit& s : splits) {
    KafkaTopicPartition tp = s.topic_partition();
    if (s.assigned || partitions_.count(tp) != 0) {
      spdlog::warn("{}: ignoring a split for topic '{}' partition {}: {}", impl_->name, s.topic, s.partition,
                   s.assigned ? "it is an enumerator marker" : "this reader already reads it");
      continue;
    }
    if (s.stopping_offset && s.starting_offset >= *s.stopping_offset) {
      finished_offsets_[tp] = s.starting_offset;  // nothing to read in bounded mode
      continue;
    }
    auto p = std::make_unique<Partition>();
    p->topic = s.topic;
    p->partition = s.partition;
    p->split_id = s.split_id();
    p->next_offset = s.starting_offset;
    p->stopping_offset = s.stopping_offset;
    p->stats = std::make_shared<KafkaPartitionStats>(s.topic, s.partition);
    p->stats->current_offset.store(s.starting_offset, std::memory_order_relaxed);
    {
      std::lock_guard lock(stats_->mu);
      reader_stats_->partitions[tp] = p->stats;
    }
    rd_kafka_topic_partition_list_add(list.get(), s.topic.c_str(), s.partition)->offset = s.starting_offset;
    new_partitions_.push_back(p.get());
    finished_offsets_.erase(tp);
    partitions_.emplace(std::move(tp), std::move(p));
  }
  if (list->cnt == 0) return;
  kafka::KafkaErrorPtr error(rd_kafka_incremental_assign(impl_->consumer.get(), list.get()));
  if (error) {
    throw SluiceException(
        Error(ErrorCode::kConnector, fmt::format("{}: assigning {} partition(s) failed: {}", impl_->name, list->cnt,
                                                 kafka::kafka_error_text(error.get()))));
  }
  impl_->cached = nullptr;
  impl_->cached_rkt = nullptr;
}

std::vector<KafkaReaderCore::Partition*> KafkaReaderCore::take_new_partitions() {
  return std::exchange(new_partitions_, {});
}

KafkaReaderCore::Partition* KafkaReaderCore::find_partition(const rd_kafka_message_t& m) {
  if (m.rkt == nullptr) return nullptr;
  if (impl_->cached != nullptr && impl_->cached_rkt == m.rkt && impl_->cached_partition == m.partition) {
    return impl_->cached;
  }
  auto it = partitions_.find(KafkaTopicPartition{rd_kafka_topic_name(m.rkt), m.partition});
  if (it == partitions_.end()) return nullptr;
  impl_->cached_rkt = m.rkt;
  impl_->cached_partition = m.partition;
  impl_->cached = it->second.get();
  return impl_->cached;
}

void KafkaReaderCore::finish_partition(Partition& p, Handler& handler) {
  KafkaTopicPartition tp{p.topic, p.partition};
  finished_offsets_[tp] = p.next_offset;
  handler.on_finished(p);
  KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), p.topic.c_str(), p.partition);
  kafka::KafkaErrorPtr error(rd_kafka_incremental_unassign(impl_->consumer.get(), list.get()));
  if (error) {
    spdlog::warn("{}: unassigning finished partition {} failed: {}", impl_->name, p.split_id,
                 kafka::kafka_error_text(error.get()));
  }
  std::erase(new_partitions_, &p);
  impl_->cached = nullptr;
  impl_->cached_rkt = nullptr;
  unregister_partition(tp);
  partitions_.erase(tp);
}

void KafkaReaderCore::set_next_offset(Partition& p, int64_t offset) {
  p.next_offset = offset;
  p.stats->current_offset.store(offset, std::memory_order_relaxed);
}

void KafkaReaderCore::unregister_partition(const KafkaTopicPartition& tp) {
  std::lock_guard lock(stats_->mu);
  reader_stats_->partitions.erase(tp);
}

void KafkaReaderCore::handle_event(const rd_kafka_message_t& m, Handler& handler) {
  if (m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    // The end of the partition (the last stable offset under read_committed): every message before it has
    // been delivered, so the position moves past trailing transaction markers and aborted records.
    Partition* p = find_partition(m);
    if (p == nullptr) return;
    set_next_offset(*p, std::max(p->next_offset, m.offset));
    if (p->stopping_offset && p->next_offset >= *p->stopping_offset) finish_partition(*p, handler);
    return;
  }
  const std::string where =
      m.rkt != nullptr ? fmt::format(" (topic '{}' partition {})", rd_kafka_topic_name(m.rkt), m.partition) : "";
  if (kafka::is_permanent_kafka_error(m.err)) {
    throw SluiceException(
        Error(ErrorCode::kConnector,
              fmt::format("{}: the Kafka consumer failed{} (bootstrap servers '{}'): {}: {}", impl_->name, where,
                          impl_->settings.bootstrap_servers(), rd_kafka_err2name(m.err), rd_kafka_message_errstr(&m))));
  }
  int64_t suppressed = 0;
  if (impl_->transient_log.allow(suppressed)) {
    spdlog::warn("{}: Kafka consumer error{}, retrying ({} similar not logged): {}: {}", impl_->name, where, suppressed,
                 rd_kafka_err2name(m.err), rd_kafka_message_errstr(&m));
  }
}

size_t KafkaReaderCore::poll(Handler& handler, size_t max_messages) {
  Impl& impl = *impl_;
  impl.throw_if_failed();
  if (impl.dead_letter_producer) rd_kafka_poll(impl.dead_letter_producer.get(), 0);
  if (batch_.size() < max_messages) batch_.resize(max_messages);
  const ssize_t got = rd_kafka_consume_batch_queue(impl.queue.get(), 0, batch_.data(), max_messages);
  if (got < 0) {
    throw SluiceException(kafka::kafka_error(ErrorCode::kConnector, fmt::format("{}: consuming failed", impl.name),
                                             rd_kafka_last_error()));
  }
  const auto n = static_cast<size_t>(got);
  size_t i = 0;
  int64_t records = 0;
  int64_t bytes = 0;
  int64_t last_timestamp_ms = -1;
  // Messages not handled yet when a handler throws are destroyed too.
  struct DestroyRest {
    std::vector<rd_kafka_message_t*>& batch;
    size_t& i;
    size_t n;
    ~DestroyRest() {
      for (; i < n; ++i)
        rd_kafka_message_destroy(batch[i]);
    }
  } destroy_rest{batch_, i, n};
  for (; i < n; ++i) {
    rd_kafka_message_t& m = *batch_[i];
    if (m.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      handle_event(m, handler);
    } else if (Partition* p = find_partition(m); p != nullptr && m.offset >= p->next_offset) {
      // (Messages of partitions no longer assigned, or before the position, are left over from an earlier
      // assignment: skipped.)
      if (p->stopping_offset && m.offset >= *p->stopping_offset) {
        finish_partition(*p, handler);
      } else {
        KafkaMessageView view;
        view.topic = p->topic;
        view.partition = m.partition;
        view.offset = m.offset;
        rd_kafka_timestamp_type_t ts_type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        view.timestamp_ms = rd_kafka_message_timestamp(&m, &ts_type);
        view.timestamp_type = timestamp_type_of(ts_type);
        if (m.key != nullptr) view.key.emplace(static_cast<const char*>(m.key), m.key_len);
        if (m.payload != nullptr) view.value.emplace(static_cast<const char*>(m.payload), m.len);
        view.raw = &m;
        handler.on_message(*p, view);
        ++records;
        bytes += static_cast<int64_t>(m.key_len + m.len);
        if (view.timestamp_ms >= 0) {
          last_timestamp_ms = view.timestamp_ms;
          p->stats->last_timestamp_ms.store(view.timestamp_ms, std::memory_order_relaxed);
        }
        set_next_offset(*p, m.offset + 1);
        if (p->stopping_offset && p->next_offset >= *p->stopping_offset) finish_partition(*p, handler);
      }
    }
    rd_kafka_message_destroy(batch_[i]);
  }
  publish_batch(records, bytes, last_timestamp_ms);
  impl.throw_if_failed();
  return n;
}

void KafkaReaderCore::publish_batch(int64_t records, int64_t bytes, int64_t last_timestamp_ms) {
  if (records > 0) {
    stats_->records_read.fetch_add(records, std::memory_order_relaxed);
    stats_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (last_timestamp_ms >= 0) stats_->last_timestamp_ms.store(last_timestamp_ms, std::memory_order_relaxed);
  // The rate over windows of at least a second (a window ends at the first poll after its second).
  KafkaReaderStats& r = *reader_stats_;
  const int64_t now = steady_ms();
  const int64_t start = r.window_start_ms.load(std::memory_order_relaxed);
  const int64_t in_window = r.window_records.load(std::memory_order_relaxed) + records;
  if (start < 0) {
    r.window_start_ms.store(now, std::memory_order_relaxed);
    r.window_records.store(records, std::memory_order_relaxed);
  } else if (now - start >= kRateWindowMs) {
    r.records_per_second.store(static_cast<double>(in_window) * 1000.0 / static_cast<double>(now - start),
                               std::memory_order_relaxed);
    r.window_records.store(0, std::memory_order_relaxed);
    r.window_start_ms.store(now, std::memory_order_relaxed);
  } else if (records > 0) {
    r.window_records.store(in_window, std::memory_order_relaxed);
  }
}

void KafkaReaderCore::bad_record(const KafkaMessageView& m, std::string_view reason) {
  Impl& impl = *impl_;
  if (impl_->settings.bad_record_policy == BadRecordPolicy::kFail) {
    std::string_view why = reason;
    while (why.ends_with('.'))
      why.remove_suffix(1);
    throw SluiceException(Error(
        ErrorCode::kConnector,
        fmt::format(
            "{}: bad record in topic '{}' partition {} at offset {}: {}. Fix the producer, or divert bad "
            "records with on_bad_record(BadRecordPolicy::kDeadLetter, path) or dead_letter_topic(name) (in a pipeline "
            "file: set pipeline.dead-letter)",
            kRole, m.topic, m.partition, m.offset, why)));
  }
  if (dead_letter_) {
    Value entry = Value::object({{"source", Value("kafka")},
                                 {"topic", Value(m.topic)},
                                 {"partition", Value(m.partition)},
                                 {"offset", Value(m.offset)},
                                 {"timestamp", Value(m.timestamp_ms)},
                                 {"reason", Value(dead_letter_reason::kUndecodable)},
                                 {"error", Value(reason)},
                                 {"key", m.key ? Value(*m.key) : Value::null()},
                                 {"record", m.value ? Value(*m.value) : Value::null()}});
    // JSON strings hold UTF-8 text only: keep the exact bytes of a key or value that is not.
    if (m.key && !is_valid_utf8(*m.key)) entry.set("key_base64", Value::bytes(*m.key));
    if (m.value && !is_valid_utf8(*m.value)) entry.set("record_base64", Value::bytes(*m.value));
    dead_letter_->append(entry).value_or_throw();
    unsynced_dead_letters_ = true;
  }
  if (impl.dead_letter_producer) {
    kafka::KafkaHeadersPtr headers;
    if (m.raw != nullptr) {
      rd_kafka_headers_t* original = nullptr;
      if (rd_kafka_message_headers(m.raw, &original) == RD_KAFKA_RESP_ERR_NO_ERROR && original != nullptr) {
        headers.reset(rd_kafka_headers_copy(original));
      }
    }
    if (!headers) headers.reset(rd_kafka_headers_new(4));
    const std::string partition = std::to_string(m.partition);
    const std::string offset = std::to_string(m.offset);
    rd_kafka_header_add(headers.get(), "sluice.dlq.topic", -1, m.topic.data(), static_cast<ssize_t>(m.topic.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.partition", -1, partition.data(),
                        static_cast<ssize_t>(partition.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.offset", -1, offset.data(), static_cast<ssize_t>(offset.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.error", -1, reason.data(), static_cast<ssize_t>(reason.size()));
    void* key = m.key ? const_cast<char*>(m.key->data()) : nullptr;
    const size_t key_len = m.key ? m.key->size() : 0;
    void* value = m.value ? const_cast<char*>(m.value->data()) : nullptr;
    const size_t value_len = m.value ? m.value->size() : 0;
    for (;;) {
      rd_kafka_headers_t* h = headers.get();
      const rd_kafka_resp_err_t err = rd_kafka_producev(
          impl.dead_letter_producer.get(), RD_KAFKA_V_TOPIC(impl_->settings.dead_letter_topic.c_str()),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE(value, value_len),
          RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        (void)headers.release();  // owned by the message now
        ++impl.dead_letters_in_flight;
        break;
      }
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        throw SluiceException(
            kafka::kafka_error(ErrorCode::kConnector,
                               fmt::format("{}: writing a bad record to the dead-letter topic '{}' failed", impl.name,
                                           impl_->settings.dead_letter_topic),
                               err));
      }
      rd_kafka_poll(impl.dead_letter_producer.get(), 100);  // the producer's queue is full: let it drain
    }
  }
  stats_->bad->bad_records.fetch_add(1, std::memory_order_relaxed);
  if (!logged_dead_letter_) {
    logged_dead_letter_ = true;
    spdlog::warn(
        "{}: the record at topic '{}' partition {} offset {} could not be read and went to the dead letters ({}); "
        "further bad records of this reader go there without a log line (count: BadRecordStats::bad_records): {}",
        impl.name, m.topic, m.partition, m.offset,
        dead_letter_ ? "file '" + dead_letter_->path() + "'" : "topic '" + impl_->settings.dead_letter_topic + "'",
        reason);
  }
}

std::vector<KafkaPartitionSplit> KafkaReaderCore::snapshot(int64_t checkpoint_id) {
  if (unsynced_dead_letters_) {
    dead_letter_->sync().value_or_throw();
    unsynced_dead_letters_ = false;
  }
  impl_->flush_dead_letters(kSnapshotFlushMs);
  std::vector<KafkaPartitionSplit> out;
  out.reserve(partitions_.size());
  for (const auto& [tp, p] : partitions_)
    out.push_back(KafkaPartitionSplit{p->topic, p->partition, p->next_offset, p->stopping_offset, false});
  if (impl_->commit) {
    std::map<KafkaTopicPartition, int64_t> offsets = finished_offsets_;
    for (const auto& [tp, p] : partitions_)
      offsets[tp] = p->next_offset;
    pending_commits_[checkpoint_id] = std::move(offsets);
    while (pending_commits_.size() > kMaxPendingCommits)
      pending_commits_.erase(pending_commits_.begin());
  }
  return out;
}

void KafkaReaderCore::notify_checkpoint_complete(int64_t checkpoint_id) {
  auto it = pending_commits_.find(checkpoint_id);
  if (it != pending_commits_.end() && !it->second.empty() && !impl_->closed) {
    KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(it->second.size())));
    for (const auto& [tp, offset] : it->second)
      rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition)->offset = offset;
    const rd_kafka_resp_err_t err = rd_kafka_commit(impl_->consumer.get(), list.get(), /*async=*/1);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      int64_t suppressed = 0;
      if (impl_->commit_failure_log.allow(suppressed)) {
        spdlog::warn("{}: committing the offsets of checkpoint {} failed ({} more failures not logged): {}",
                     impl_->name, checkpoint_id, suppressed, kafka::kafka_error_text(err));
      }
    }
  }
  // A completed checkpoint supersedes every earlier one.
  pending_commits_.erase(pending_commits_.begin(), pending_commits_.upper_bound(checkpoint_id));
}

void KafkaReaderCore::close() noexcept {
  Impl& impl = *impl_;
  if (impl.closed) return;
  impl.closed = true;
  impl.liveness.reset();
  {
    std::lock_guard lock(impl.wakeup.mu);
    impl.wakeup.ctx = nullptr;
  }
  if (impl.queue) rd_kafka_queue_cb_event_enable(impl.queue.get(), nullptr, nullptr);
  {
    // metrics() no longer reads this reader (nor its consumer, destroyed below).
    std::lock_guard lock(stats_->mu);
    std::erase(stats_->readers, reader_stats_);
    reader_stats_->consumer = nullptr;
    reader_stats_->partitions.clear();
  }
  if (impl.dead_letter_producer) {
    const rd_kafka_resp_err_t err = rd_kafka_flush(impl.dead_letter_producer.get(), kCloseFlushMs);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR || impl.dead_letters_in_flight > 0) {
      spdlog::warn("{}: {} bad record(s) may not have reached the dead-letter topic '{}' at close: {}", impl.name,
                   impl.dead_letters_in_flight, impl_->settings.dead_letter_topic, kafka::kafka_error_text(err));
    }
    impl.dead_letter_producer.reset();
  }
  if (unsynced_dead_letters_ && dead_letter_) {
    Status st = dead_letter_->sync();
    if (!st.ok()) spdlog::warn("{}: {}", impl.name, st.error().to_string());
    unsynced_dead_letters_ = false;
  }
  impl.queue.reset();
  if (impl.consumer) {
    // Waits for commits in flight (the last checkpoint's), then leaves; no group membership to give up.
    if (rd_kafka_resp_err_t err = rd_kafka_consumer_close(impl.consumer.get())) {
      spdlog::debug("{}: closing the consumer: {}", impl.name, kafka::kafka_error_text(err));
    }
    impl.consumer.reset();
  }
  partitions_.clear();
  new_partitions_.clear();
  impl.cached = nullptr;
}

}  // namespace detail

}  // namespace sluice
