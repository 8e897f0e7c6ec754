// KafkaSinkWriterCore, the type-independent part of a Kafka sink writer: produce, flush on checkpoints, the
// transaction per checkpoint epoch with its recovery copy and marker, re-publication of restored transactions,
// dead letters (kafka_sink.h's file comment describes the design).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "kafka_producer_pool.h"
#include "kafka_recovery_copy.h"
#include "kafka_sink_internals.h"
#include "sluice/api/operator.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/value.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace detail {

using kafka_sink_internal::fail;
using kafka_sink_internal::producer_properties;
using kafka_sink_internal::wall_ms;

struct KafkaSinkWriterCore::Impl {
  Impl(const KafkaSinkSettings& s, RuntimeContext& ctx, std::shared_ptr<KafkaProducerPool> p,
       std::shared_ptr<DeadLetterFile> dlq)
      : settings(s), pool(std::move(p)), dead_letter(std::move(dlq)) {
    auto& state = ctx.operator_state().get_union_list_state<KafkaSinkWriterState>(kWriterStateName);
    state.update({KafkaSinkWriterState{ctx.subtask_index(), std::max(ctx.parallelism(), 1), settings.pool_size,
                                       settings.transactional_id_prefix}});
    if (settings.liveness_timeout_ms > 0) {
      liveness = kafka::KafkaLivenessProbe::start(RD_KAFKA_PRODUCER, producer_properties(settings, ""),
                                                  std::chrono::milliseconds(settings.liveness_timeout_ms), pool->who)
                     .value_or_throw();
      pool->watchdog = [probe = liveness] {
        if (std::optional<std::string> f = probe->failure()) fail(*f);
      };
    }
    if (!pool->transactional) pool->plain = pool->make_producer("");
    // A topic that does not exist fails at open, naming it (not after a delivery or transaction timeout).
    std::vector<std::string> topics;
    if (!settings.topic.empty()) topics.push_back(settings.topic);
    if (!settings.marker_topic.empty() && settings.marker_topic != settings.topic) {
      topics.push_back(settings.marker_topic);
    }
    if (!topics.empty()) {
      std::unique_ptr<Producer> checker = pool->transactional ? pool->make_producer("") : nullptr;
      Producer& p = checker ? *checker : *pool->plain;
      for (const std::string& t : topics)
        p.check_topic(t, std::min<int64_t>(settings.operation_timeout_ms, kTopicCheckMs));
    }
  }

  // The longest wait for the broker's answer about the sink's topic at open.
  static constexpr int64_t kTopicCheckMs = 10'000;

  // Fails the task when no broker answered for the liveness timeout (checked at records and checkpoints).
  void check_liveness() const {
    if (!liveness) return;
    if (std::optional<std::string> f = liveness->failure()) fail(*f);
  }

  // The restored transactions abort_lingering found not committed, produced again from their recovery copies, in
  // checkpoint order, into this writer's first transaction ahead of any new record (per-key order) and into its
  // recovery copy (a loss of this transaction re-publishes them again).
  void republish_restored() {
    if (pool->to_republish.empty()) return;
    Producer& p = open_transaction();
    KafkaProducerRecord rec;
    for (const auto& [c, evidence] : pool->to_republish) {
      RecoveryCopyReader reader(c.records);
      RecoveryRecord r;
      int64_t n = 0;
      while (reader.next(r)) {
        if (std::optional<std::string> rejected =
                p.produce(r.topic, r.partition, r.key, r.value, r.headers.empty() ? nullptr : &r.headers, nullptr,
                          r.timestamp_ms)) {
          fail(pool->who + ": re-publishing transaction " + c.transactional_id + ": record " + std::to_string(n) +
               " of its recovery copy (topic '" + std::string(r.topic) + "') was refused: " + *rejected +
               " (was message.max.bytes lowered since it was written?)");
        }
        rec.clear();
        rec.topic.assign(r.topic);
        if (r.key) {
          rec.set_key(*r.key);
        } else {
          rec.set_null_key();
        }
        if (r.value) {
          rec.set_value(*r.value);
        } else {
          rec.set_null_value();
        }
        for (const auto& [name, v] : r.headers)
          rec.headers.push_back(KafkaHeader{std::string(name), v ? std::optional<std::string>(*v) : std::nullopt});
        copy.append(rec, r.partition, r.timestamp_ms);
        // A sink with a topic selector and no default topic has no marker topic before its first record.
        if (marker_topic.empty()) marker_topic = rec.topic;
        ++n;
      }
      spdlog::info(
          "{}: transaction {} (token {}) was not committed before the restart ({}): its {} records are re-published "
          "in transaction {} (token {}), committed with the next checkpoint",
          pool->who, c.transactional_id, c.token, evidence, n, p.transactional_id(),
          pool->slots[static_cast<size_t>(current)].token);
    }
    pool->to_republish.clear();
    republished_bytes = copy.bytes();
  }

  // The producer of the open transaction (opens one on the lowest idle producer when there is none).
  Producer& open_transaction() {
    if (current >= 0) return *pool->slots[static_cast<size_t>(current)].producer;
    int k = -1;
    for (size_t i = 0; i < pool->slots.size(); ++i) {
      if (pool->slots[i].state == KafkaProducerPool::SlotState::kIdle) {
        k = static_cast<int>(i);
        break;
      }
    }
    if (k < 0) {
      fail(pool->who + ": all " + std::to_string(pool->slots.size()) +
           " transactional producers hold pre-committed transactions whose checkpoints have not completed yet; "
           "raise producer_pool_size() or make checkpoints complete (too many failing or slow checkpoints)");
    }
    KafkaProducerPool::Slot& slot = pool->slots[static_cast<size_t>(k)];
    if (!slot.producer) {
      slot.producer = pool->make_producer(pool->own_id(k));
      slot.producer->init_transactions();
    }
    slot.producer->begin_transaction();
    slot.state = KafkaProducerPool::SlotState::kOpen;
    slot.token = pool->next_token();
    current = k;
    marker_topic = settings.marker_topic.empty() ? settings.topic : settings.marker_topic;
    return *slot.producer;
  }

  Producer& metadata_producer() { return pool->transactional ? open_transaction() : *pool->plain; }

  // fdatasync()s the dead letters written so far: before a checkpoint records positions past them.
  void sync_dead_letters() {
    if (dead_letter && dead_letters_unsynced) {
      dead_letter->sync().value_or_throw();
      dead_letters_unsynced = false;
    }
  }

  KafkaSinkSettings settings;
  std::shared_ptr<KafkaProducerPool> pool;
  std::shared_ptr<DeadLetterFile> dead_letter;
  std::shared_ptr<kafka::KafkaLivenessProbe> liveness;
  bool dead_letters_unsynced = false;
  int64_t dead_letters = 0;
  int current = -1;  // slot of the open transaction
  std::string marker_topic;
  RecoveryCopyWriter copy;
  // Bytes of `copy` that republish_restored() put there: not counted against max_transaction_bytes, which bounds
  // what the open epoch adds (restored copies of several lost transactions may sum above it, and counting them would
  // fail every restart at its first record).
  size_t republished_bytes = 0;
  struct CachedCount {
    int32_t count;
    Clock::time_point fetched;
  };
  std::unordered_map<std::string, CachedCount> partition_counts;
};

KafkaSinkWriterCore::KafkaSinkWriterCore(const KafkaSinkSettings& settings, RuntimeContext& ctx,
                                         std::shared_ptr<KafkaProducerPool> pool,
                                         std::shared_ptr<DeadLetterFile> dead_letter)
    : impl_(std::make_unique<Impl>(settings, ctx, std::move(pool), std::move(dead_letter))) {
  if (impl_->settings.on_bad_record == BadRecordPolicy::kDeadLetter && !impl_->dead_letter) {
    fail(impl_->pool->who + ": on_bad_record(kDeadLetter) without a dead-letter file");
  }
  if (impl_->pool->transactional) impl_->republish_restored();
}

KafkaSinkWriterCore::~KafkaSinkWriterCore() = default;

bool KafkaSinkWriterCore::transactional() const noexcept {
  return impl_->pool->transactional;
}

std::optional<std::string> KafkaSinkWriterCore::write(const KafkaProducerRecord& record, int64_t event_timestamp) {
  Impl& s = *impl_;
  if (record.topic.empty()) fail(s.pool->who + ": a record has no topic (the serializer or topic selector gave none)");
  s.check_liveness();
  int64_t ts = 0;
  if (record.timestamp_ms) {
    ts = *record.timestamp_ms;
  } else if (event_timestamp != kNoTimestamp && event_timestamp > 0) {
    ts = event_timestamp;
  }
  std::optional<std::string_view> key;
  if (record.has_key()) key = record.key();
  std::optional<std::string_view> value;
  if (record.has_value()) value = record.value();
  const std::vector<KafkaHeader>* headers = record.headers.empty() ? nullptr : &record.headers;
  if (!s.pool->transactional) {
    return s.pool->plain->produce(record.topic, record.partition, key, value, nullptr, headers, ts);
  }
  // The recovery copy is freed only by the pre-commit at the next checkpoint barrier: bound it, failing (the task
  // restarts from the last checkpoint) rather than growing until the process dies. Blocking here instead would
  // hold back the very barrier that frees it.
  const size_t record_bytes = record.topic.size() + record.key().size() + record.value().size() + 16;
  if (static_cast<int64_t>(s.copy.bytes() - s.republished_bytes + record_bytes) > s.settings.max_transaction_bytes) {
    fail(s.pool->who + ": the open transaction holds " + std::to_string(s.copy.count()) + " records (" +
         std::to_string(s.copy.bytes()) +
         " bytes in its recovery copy) and the next record would exceed "
         "max_transaction_bytes (" +
         std::to_string(s.settings.max_transaction_bytes) +
         " bytes; pipelines: max-transaction-bytes): no checkpoint barrier reached the sink to pre-commit it. Are "
         "checkpoints stalled or their interval too long for this output rate? Raise the bound or shorten the "
         "checkpoint interval");
  }
  Producer& p = s.open_transaction();
  if (s.marker_topic.empty()) s.marker_topic = record.topic;
  std::optional<std::string> rejected = p.produce(record.topic, record.partition, key, value, nullptr, headers, ts);
  if (!rejected) s.copy.append(record, record.partition, ts);
  return rejected;
}

void KafkaSinkWriterCore::bad_record(const KafkaProducerRecord& record, const std::string& reason,
                                     const std::string& position) {
  Impl& s = *impl_;
  const size_t size = record.key().size() + record.value().size();
  std::string key_text(record.key().substr(0, 200));
  if (s.settings.on_bad_record == BadRecordPolicy::kFail || !s.dead_letter) {
    fail(s.pool->who + ": cannot write a record to topic '" + record.topic + "' (key " +
         (record.has_key() ? "'" + key_text + "'" : std::string("null")) + ", " + std::to_string(size) +
         " bytes of key and value" + (position.empty() ? std::string() : ", source position " + position) +
         "): " + reason +
         ". Set a dead-letter sink (pipelines: pipeline.dead-letter) to divert such records, or "
         "raise message.max.bytes (and the topic's max.message.bytes)");
  }
  Value entry = Value::object();
  entry.set("sink", Value::string("kafka"));
  entry.set("operator", Value::string(s.pool->who));
  entry.set("topic", Value::string(record.topic));
  if (record.partition != KafkaProducerRecord::kAnyPartition) entry.set("partition", Value(record.partition));
  entry.set("key", record.has_key() ? Value::string(record.key()) : Value());
  entry.set("position", Value::string(position));
  entry.set("reason", Value::string(dead_letter_reason::kTooLarge));  // the producer's only content refusal
  entry.set("error", Value::string(reason));
  entry.set("size", Value(static_cast<int64_t>(size)));
  entry.set("record", record.has_value() ? Value::string(record.value()) : Value());
  s.dead_letter->append(entry).value_or_throw();
  s.dead_letters_unsynced = true;
  if (s.dead_letters++ == 0) {
    spdlog::warn("{}: a record for topic '{}' ({} bytes{}) was refused and written to the dead-letter file {}: {}",
                 s.pool->who, record.topic, size, position.empty() ? std::string() : ", source position " + position,
                 s.dead_letter->path(), reason);
  }
}

int64_t KafkaSinkWriterCore::dead_letters() const noexcept {
  return impl_->dead_letters;
}

int32_t KafkaSinkWriterCore::partition_count(const std::string& topic) {
  Impl& s = *impl_;
  auto it = s.partition_counts.find(topic);
  if (it != s.partition_counts.end() && Clock::now() - it->second.fetched < std::chrono::minutes(1)) {
    return it->second.count;
  }
  const int32_t count = s.metadata_producer().fetch_partition_count(topic);
  s.partition_counts[topic] = Impl::CachedCount{count, Clock::now()};
  return count;
}

void KafkaSinkWriterCore::flush(bool end_of_input) {
  Impl& s = *impl_;
  s.sync_dead_letters();
  s.check_liveness();
  if (!s.pool->transactional) {
    if (s.settings.guarantee == DeliveryGuarantee::kNone && !end_of_input) {
      s.pool->plain->poll();
    } else {
      s.pool->plain->flush();
    }
    return;
  }
  if (s.current >= 0) s.pool->slots[static_cast<size_t>(s.current)].producer->flush();
  if (end_of_input) s.pool->input_ended = true;
}

std::vector<KafkaCommittable> KafkaSinkWriterCore::prepare_commit() {
  Impl& s = *impl_;
  s.sync_dead_letters();
  s.check_liveness();
  if (!s.pool->transactional) return {};
  // Committed transactions not confirmed yet go into this checkpoint again (first: a restore settles them first).
  std::vector<KafkaCommittable> out = s.pool->confirm_commits();
  if (s.current < 0) return out;
  KafkaProducerPool::Slot& slot = s.pool->slots[static_cast<size_t>(s.current)];
  // Every record of this epoch is acknowledged before the next epoch's producer writes to the same partitions:
  // otherwise a later epoch's record can take a lower offset, and read_committed readers see the key's records
  // out of order (commit_transaction would flush too, but after the next epoch started; measured: per-key order
  // violations in KafkaSinkIntegrationTest.ExactlyOnceUnderInjectedFailures).
  slot.producer->flush();
  KafkaCommittable c;
  c.transactional_id = slot.producer->transactional_id();
  c.subtask = s.pool->subtask;
  c.token = slot.token;
  c.marker_topic = s.marker_topic;
  c.precommit_time_ms = wall_ms();
  slot.producer->send_marker(c.marker_topic, c.precommit_time_ms, c.token);
  c.record_count = s.copy.count();
  c.records = s.copy.take();
  s.republished_bytes = 0;
  slot.producer->fill_probe(c);
  slot.state = KafkaProducerPool::SlotState::kPrecommitted;
  s.current = -1;
  out.push_back(std::move(c));
  return out;
}

void KafkaSinkWriterCore::close() {
  impl_->pool->watchdog = nullptr;
  impl_->liveness.reset();
  impl_->current = -1;
  impl_->pool->close();
}

}  // namespace detail
}  // namespace sluice
