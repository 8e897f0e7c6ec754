// KafkaProducerPool (see kafka_producer_pool.h), the confirmation of committed transactions, and the
// transactional ids of a subtask.
#include "kafka_producer_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <thread>

#include "sluice/core/cancellation.h"

namespace sluice {
namespace detail {

using kafka_sink_internal::deadline_after;
using kafka_sink_internal::describe;
using kafka_sink_internal::fail;
using kafka_sink_internal::hanging_transaction_text;
using kafka_sink_internal::remaining_ms;
using kafka_sink_internal::wall_ms;

namespace {

// How long a checkpoint waits for each committed transaction's probe record before it carries it on as pending.
constexpr int64_t kConfirmWaitMs = 200;
// How long committing a transaction waits for the confirmation of this subtask's earlier commits (in all), and
// how long the last commits of a subtask whose input ended wait for theirs.
constexpr int64_t kConfirmBeforeCommitMs = 5000;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string transactional_id(std::string_view prefix, int subtask, int k) {
  return std::string(prefix) + "-" + std::to_string(subtask) + "-" + std::to_string(k);
}

std::vector<std::string> lingering_transactional_ids(std::string_view prefix, int subtask, int parallelism,
                                                     int old_parallelism, int pool_size, int old_pool_size,
                                                     const std::vector<std::string>& skip) {
  std::vector<std::string> ids;
  if (prefix.empty() || parallelism <= 0) return ids;
  const std::set<std::string> skipped(skip.begin(), skip.end());
  const int subtasks = std::max(old_parallelism, parallelism);
  const int pool = std::max(old_pool_size, pool_size);
  for (int j = subtask; j < subtasks; j += parallelism) {
    for (int k = 0; k < pool; ++k) {
      std::string id = transactional_id(prefix, j, k);
      if (!skipped.contains(id)) ids.push_back(std::move(id));
    }
  }
  return ids;
}

KafkaProducerPool::KafkaProducerPool(const KafkaSinkSettings& settings, RuntimeContext& ctx)
    : settings(settings),
      who(describe(ctx)),
      subtask(ctx.subtask_index()),
      parallelism(std::max(ctx.parallelism(), 1)),
      transactional(settings.guarantee == DeliveryGuarantee::kExactlyOnce && ctx.is_checkpointing_enabled()) {
  if (transactional) slots.resize(static_cast<size_t>(settings.pool_size));
  cancelled = current_task_cancel_flag();
  std::random_device rd;
  token_base = hex64((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(wall_ms()));
}

int KafkaProducerPool::index_of(const std::string& id) const {
  for (size_t k = 0; k < slots.size(); ++k) {
    if (own_id(static_cast<int>(k)) == id) return static_cast<int>(k);
  }
  return -1;
}

std::vector<KafkaCommittable> KafkaProducerPool::confirm_commits(ConfirmWait wait) {
  const bool before_commit = wait != ConfirmWait::kCheckpoint;
  std::vector<KafkaCommittable> pending;
  if (committed_unconfirmed.empty()) return pending;
  if (!marker_reader) marker_reader = make_producer("");
  const Clock::time_point deadline =
      deadline_after(before_commit ? std::min<int64_t>(settings.operation_timeout_ms, kConfirmBeforeCommitMs) : 0);
  for (auto it = committed_unconfirmed.begin(); it != committed_unconfirmed.end();) {
    const KafkaCommittable& c = it->committable;
    if (c.probe_offset < 0) {  // no record: nothing to lose
      it = committed_unconfirmed.erase(it);
      continue;
    }
    // The data decides, not the marker group: after a broker restart a marker group's offsets were seen to stay
    // pending for minutes both for a commit the broker lost and for one it made (docs/benchmarks.md).
    const Producer::Probe probe =
        marker_reader->probe_visibility(c.probe_topic, c.probe_partition, c.probe_offset,
                                        before_commit ? std::max(remaining_ms(deadline), 1) : kConfirmWaitMs);
    if (probe.visibility == Producer::Visibility::kCommitted) {
      it = committed_unconfirmed.erase(it);
      continue;
    }
    std::string message;
    if (probe.visibility == Producer::Visibility::kAborted) {
      message = who + ": transaction " + c.transactional_id + " (token " + c.token + ", " +
                std::to_string(c.record_count) + " records) was acknowledged as committed but its records are not " +
                "visible: the broker lost the commit (seen when it restarted right after; its record " + c.probe_topic +
                " [" + std::to_string(c.probe_partition) + "] offset " + std::to_string(c.probe_offset) +
                " was skipped as aborted). The checkpoint fails; the restore of the last completed checkpoint, "
                "which holds the transaction, re-publishes it";
    } else {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - it->since).count();
      if (waited < settings.operation_timeout_ms && !before_commit) {
        pending.push_back(c);
        pending.back().committed = true;
        ++it;
        continue;
      }
      if (waited < settings.operation_timeout_ms) {
        message = who + ": transaction " + c.transactional_id + " (token " + c.token + ", " +
                  std::to_string(c.record_count) + " records), committed " + std::to_string(waited) +
                  " ms ago, is not confirmed yet: its record " + c.probe_topic + " [" +
                  std::to_string(c.probe_partition) + "] offset " + std::to_string(c.probe_offset) +
                  " is not readable by read_committed readers (the partition's last stable offset is " +
                  std::to_string(probe.last_stable_offset) +
                  (wait == ConfirmWait::kInputEnded
                       ? "). The input ended and no later checkpoint would carry it: the task fails and the restore "
                         "of the last checkpoint settles it"
                       : "). This subtask's next transaction is not committed before it (per-key order); the task "
                         "fails and the restore settles both in order");
      } else {
        message = who + ": " +
                  hanging_transaction_text("transaction " + c.transactional_id + " (token " + c.token + ", " +
                                               std::to_string(c.record_count) +
                                               " records) was acknowledged as committed but is not visible",
                                           c.transactional_id, c.probe_topic, c.probe_partition, c.probe_offset,
                                           probe.last_stable_offset, probe.leader, waited, marker_reader->bootstrap());
      }
    }
    committed_unconfirmed.clear();
    spdlog::error("{}", message);
    fail(message);
  }
  return pending;
}

void KafkaProducerPool::note_committed(const KafkaCommittable& c) {
  for (const Unconfirmed& u : committed_unconfirmed) {
    if (u.committable.token == c.token) return;
  }
  committed_unconfirmed.push_back(Unconfirmed{c, Clock::now()});
}

void KafkaProducerPool::close() {
  std::vector<std::thread> threads;
  for (Slot& slot : slots) {
    if (slot.producer) threads.emplace_back([p = std::move(slot.producer)]() mutable { p.reset(); });
  }
  slots.clear();
  plain.reset();
  marker_reader.reset();
  for (std::thread& t : threads)
    t.join();
}

std::shared_ptr<KafkaProducerPool> make_producer_pool(const KafkaSinkSettings& settings, RuntimeContext& ctx) {
  return std::make_shared<KafkaProducerPool>(settings, ctx);
}

}  // namespace detail
}  // namespace sluice
