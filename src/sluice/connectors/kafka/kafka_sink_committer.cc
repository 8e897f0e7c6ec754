// KafkaSinkCommitter: commits the pre-committed transactions, settles restored ones (committed, or re-published
// from their recovery copies) and aborts lingering ones; resolve_marker, the decision for committables without a
// probe record (kafka_sink.h's file comment describes the design).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "kafka_producer_pool.h"
#include "kafka_recovery_copy.h"
#include "kafka_sink_internals.h"
#include "sluice/api/operator.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace detail {

using kafka_sink_internal::fail;
using kafka_sink_internal::hanging_transaction_text;
using kafka_sink_internal::wall_ms;

std::optional<std::string> resolve_marker(const std::function<MarkerReading(bool require_stable)>& fetch,
                                          std::string_view token, int64_t timeout_ms, int64_t retry_ms,
                                          std::string_view who, std::string_view group,
                                          const std::function<void()>& interrupt) {
  const auto start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(timeout_ms);
  std::string last;
  bool unstable = false;
  while (true) {
    MarkerReading r = fetch(true);
    if (r.kind == MarkerReading::Kind::kOffset) return std::move(r.metadata);
    if (r.kind == MarkerReading::Kind::kNoOffset) return std::nullopt;
    last = r.error;
    unstable = r.kind == MarkerReading::Kind::kUnstable;
    {
      // No stable reading: the broker holds pending transactional offsets for the group although init_transactions
      // completed the transaction (or it did not answer in time, which a consumer's read_committed fetch also does
      // while offsets are pending). The materialized offsets hold only what committed transactions wrote: our
      // token there is proof of the commit. Another token or none proves nothing (the commit may be pending).
      MarkerReading m = fetch(false);
      if (m.kind == MarkerReading::Kind::kOffset && m.metadata == token) {
        spdlog::info(
            "{}: no stable reading of marker group '{}' ({}), but its committed offset carries token {}: that "
            "transaction was committed",
            who, group, last, token);
        return std::string(token);
      }
    }
    if (Clock::now() >= deadline) break;
    if (interrupt) interrupt();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(retry_ms, 1)));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  if (unstable) {
    fail(std::string(who) + ": cannot tell whether the transaction with token " + std::string(token) +
         " was committed: for " + std::to_string(waited) + " ms the broker answered UNSTABLE_OFFSET_COMMIT (" + last +
         ") for marker group '" + std::string(group) +
         "' although init_transactions completed the transaction, and its committed offset does not carry the "
         "token. Re-publishing could publish the transaction twice and skipping it could lose it, so the task "
         "fails and the restore asks again after the restart. Kafka 4.4 was seen to do this after a broker "
         "restart; if it persists, look at the group with kafka-consumer-groups.sh --describe --group '" +
         std::string(group) + "' and at the broker's group coordinator log");
  }
  fail(std::string(who) + ": reading the committed offset of marker group '" + std::string(group) + "' failed for " +
       std::to_string(waited) + " ms: " + last);
}

namespace {

// Makes sure committable `c` is visible exactly once (see the file comment of kafka_sink.h), with `producer`, of
// c's transactional id, on which init_transactions completed: either "already committed" (its probe record is
// visible; for a version-1 committable, the marker carries its token) or a re-publication of its recovery copy,
// after which `c`'s probe record is the re-published one. Leaves the producer without an open transaction.
// Whether restored transaction `c` was committed (true), or not (false: `evidence` says why). Call after
// init_transactions on its id, which completed the id's transactions. Fails the task when it cannot tell.
bool restored_transaction_committed(const KafkaProducerPool& pool, Producer& producer, const KafkaCommittable& c,
                                    std::string& evidence) {
  Producer* p = &producer;
  if (c.probe_offset >= 0) {
    // The data decides (see confirm_commits): init_transactions completed every transaction of the id the broker
    // knows, so the record is readable, or skipped as aborted.
    const auto start = Clock::now();
    const Producer::Probe probe =
        p->probe_visibility(c.probe_topic, c.probe_partition, c.probe_offset, pool.settings.operation_timeout_ms);
    p->drop_probe_consumer();
    const std::string record =
        c.probe_topic + " [" + std::to_string(c.probe_partition) + "] offset " + std::to_string(c.probe_offset);
    if (probe.visibility == Producer::Visibility::kCommitted) {
      spdlog::info("{}: transaction {} ({} records) was committed before the restart (its record {} is visible)",
                   pool.who, c.transactional_id, c.record_count, record);
      return true;
    }
    if (probe.visibility == Producer::Visibility::kPending) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      const std::string message =
          pool.who + ": " +
          hanging_transaction_text("cannot tell whether restored transaction " + c.transactional_id + " (token " +
                                       c.token + ", " + std::to_string(c.record_count) +
                                       " records) was committed, although init_transactions completed its id's "
                                       "transactions",
                                   c.transactional_id, c.probe_topic, c.probe_partition, c.probe_offset,
                                   probe.last_stable_offset, probe.leader, waited, p->bootstrap());
      spdlog::error("{}", message);
      fail(message);
    }
    evidence = "its record " + record + " is skipped as aborted";
  } else {
    // A committable of format version 1 (no probe record): its marker group decides, as it did then.
    std::optional<std::string> marker = p->read_marker(c.marker_topic, c.token);
    if (marker && *marker == c.token) {
      spdlog::info("{}: transaction {} ({} records) was committed before the restart", pool.who, c.transactional_id,
                   c.record_count);
      return true;
    }
    evidence = "its marker group holds " + (marker ? "token " + *marker : std::string("no offset"));
  }
  return false;
}

// Settles restored transaction `c` at once: committed, nothing to do; not committed, its recovery copy is produced
// again in a new transaction on `producer` with the marker, and committed. For a committer used without its writer
// only: abort_lingering leaves the re-publication to the writer's first transaction instead (see there).
void settle(const KafkaProducerPool& pool, Producer& producer, KafkaCommittable& c) {
  Producer* p = &producer;
  std::string evidence;
  if (restored_transaction_committed(pool, producer, c, evidence)) return;
  p->begin_transaction();
  RecoveryCopyReader reader(c.records);
  RecoveryRecord r;
  int64_t n = 0;
  while (reader.next(r)) {
    if (std::optional<std::string> rejected = p->produce(
            r.topic, r.partition, r.key, r.value, r.headers.empty() ? nullptr : &r.headers, nullptr, r.timestamp_ms)) {
      fail(pool.who + ": re-publishing transaction " + c.transactional_id + ": record " + std::to_string(n) +
           " of its recovery copy (topic '" + std::string(r.topic) + "') was refused: " + *rejected +
           " (was message.max.bytes lowered since it was written?)");
    }
    ++n;
  }
  p->flush();
  p->fill_probe(c);  // the copy's records as now placed: what the next checkpoint confirms
  p->send_marker(c.marker_topic, wall_ms(), c.token);
  p->commit_transaction();
  spdlog::info("{}: transaction {} (token {}) was not committed before the restart ({}): re-published its {} records",
               pool.who, c.transactional_id, c.token, evidence, n);
}

// Runs init_transactions for each id (aborting what is open), at most 8 at a time. Returns the producers.
std::vector<std::unique_ptr<Producer>> init_all(const KafkaProducerPool& pool, const std::vector<std::string>& ids) {
  std::vector<std::unique_ptr<Producer>> producers(ids.size());
  std::vector<std::exception_ptr> errors(ids.size());
  constexpr size_t kConcurrency = 8;
  for (size_t begin = 0; begin < ids.size(); begin += kConcurrency) {
    std::vector<std::thread> threads;
    const size_t end = std::min(ids.size(), begin + kConcurrency);
    for (size_t i = begin; i < end; ++i) {
      threads.emplace_back([&, i] {
        try {
          producers[i] = pool.make_producer(ids[i]);
          producers[i]->init_transactions();
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (std::thread& t : threads)
      t.join();
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return producers;
}

}  // namespace

KafkaSinkCommitter::KafkaSinkCommitter(KafkaSinkSettings settings, std::shared_ptr<KafkaProducerPool> pool)
    : settings_(std::move(settings)), pool_(std::move(pool)) {}

KafkaSinkCommitter::~KafkaSinkCommitter() = default;

void KafkaSinkCommitter::commit(std::vector<KafkaCommittable>& committables) {
  if (!restore_done_) return;  // restored committables: abort_lingering settles them (by owner, in order)
  // This subtask's earlier commits are confirmed first (per-key order, see confirm_commits).
  if (pool_->transactional &&
      std::any_of(committables.begin(), committables.end(), [](const KafkaCommittable& c) { return !c.committed; })) {
    pool_->confirm_commits(ConfirmWait::kBeforeCommit);
  }
  for (const KafkaCommittable& c : committables) {
    // Committed already, carried on until confirmed (confirm_commits), which may have happened by now (a later
    // checkpoint's pre-commit can come before this notification): nothing to commit. A restore settles these.
    if (c.committed) continue;
    const int k = pool_->index_of(c.transactional_id);
    KafkaProducerPool::Slot* slot = k >= 0 ? &pool_->slots[static_cast<size_t>(k)] : nullptr;
    if (slot != nullptr && slot->producer && slot->state == KafkaProducerPool::SlotState::kPrecommitted &&
        slot->token == c.token) {
      try {
        slot->producer->commit_transaction();
      } catch (const SluiceException& e) {
        slot->producer.reset();
        slot->state = KafkaProducerPool::SlotState::kIdle;
        throw SluiceException(
            Error(ErrorCode::kConnector, e.error().message() +
                                             "; the task restarts and the restore re-publishes this transaction's "
                                             "records from the checkpoint"));
      }
      slot->state = KafkaProducerPool::SlotState::kIdle;
      slot->token.clear();
      pool_->note_committed(c);
      continue;
    }
    // Not held by this subtask's writer (a committer used without its writer): settle it like a restored one.
    KafkaCommittable settled = c;
    std::unique_ptr<Producer> p = pool_->make_producer(c.transactional_id);
    p->init_transactions();
    settle(*pool_, *p, settled);
    pool_->note_committed(settled);
    if (k >= 0 && slot != nullptr && slot->state == KafkaProducerPool::SlotState::kIdle) slot->producer = std::move(p);
  }
  // After the end of the input no checkpoint follows to confirm these commits: confirmed now (see confirm_commits).
  if (pool_->transactional && pool_->input_ended) pool_->confirm_commits(ConfirmWait::kInputEnded);
}

void KafkaSinkCommitter::abort_lingering(RuntimeContext& ctx, const std::vector<KafkaCommittable>& restored) {
  const int subtask = ctx.subtask_index();
  const int parallelism = std::max(ctx.parallelism(), 1);
  const std::string& prefix = settings_.transactional_id_prefix;

  // Ids and pool sizes of the run that took the restored checkpoint (this run's when there is none).
  int old_parallelism = parallelism;
  int old_pool = settings_.pool_size;
  auto& writers = ctx.operator_state().get_union_list_state<KafkaSinkWriterState>(kWriterStateName);
  bool found = false;
  for (const KafkaSinkWriterState& w : writers.get()) {
    if (w.transactional_id_prefix != prefix) continue;
    old_parallelism = found ? std::max(old_parallelism, w.parallelism) : w.parallelism;
    old_pool = found ? std::max(old_pool, w.pool_size) : w.pool_size;
    found = true;
  }

  // 1. init_transactions on every id this subtask succeeds: the restored committables' ids and the rest of the
  // range, which aborts what a previous run left open. All before any record is read back: a record is readable
  // only once every transaction that started before it on its partition ended, and those of the other subtasks'
  // ids end when those subtasks run this step, which they do without waiting for anyone.
  std::vector<const KafkaCommittable*> mine;
  std::vector<std::string> ids;
  for (const KafkaCommittable& c : restored) {
    if (!owns_committable(c.subtask, subtask, parallelism)) continue;
    mine.push_back(&c);
    if (std::find(ids.begin(), ids.end(), c.transactional_id) == ids.end()) ids.push_back(c.transactional_id);
  }
  const std::vector<std::string> settled_ids = ids;
  for (std::string& id : lingering_transactional_ids(prefix, subtask, parallelism, old_parallelism, settings_.pool_size,
                                                     old_pool, settled_ids)) {
    ids.push_back(std::move(id));
  }
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Producer>> producers = init_all(*pool_, ids);

  // 2. The restored committables, in checkpoint order: committed, or to be re-published from their recovery copies.
  // Not re-published and committed here: a failure before the next checkpoint completes restores the same
  // checkpoint, whose committable still names the aborted original, and would publish the copy a second time. The
  // writer's first transaction carries the copies instead (republish_restored), committed with the next checkpoint:
  // lost with that transaction when the task fails before, published once when it completes.
  for (const KafkaCommittable* c : mine) {
    const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), c->transactional_id) - ids.begin());
    std::string evidence;
    if (!restored_transaction_committed(*pool_, *producers[i], *c, evidence)) {
      pool_->to_republish.emplace_back(*c, std::move(evidence));
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int k = pool_->index_of(ids[i]);
    if (k >= 0) pool_->slots[static_cast<size_t>(k)].producer = std::move(producers[i]);
  }
  spdlog::debug("{}: initialized {} transactional ids and settled {} restored transactions in {} ms", pool_->who,
                ids.size(), mine.size(),
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  // Producers kept for the writer's pool only make sense for a transactional writer.
  if (!pool_->transactional) pool_->slots.clear();
  restore_done_ = true;
}

}  // namespace detail
}  // namespace sluice
