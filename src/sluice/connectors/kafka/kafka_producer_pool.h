// Private to src/sluice/connectors/kafka/: KafkaProducerPool, the producers of one Kafka sink subtask shared by its
// writer and committer (transactional producers and their states, the plain producer, the committed transactions
// still to be confirmed, the restored ones to re-publish). Implemented in kafka_producer_pool.cc. Not installed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kafka_producer.h"
#include "kafka_sink_internals.h"
#include "sluice/api/functions.h"
#include "sluice/connectors/kafka/kafka_sink.h"

namespace sluice {
namespace detail {

using kafka_sink_internal::Clock;
using kafka_sink_internal::Producer;

// What confirm_commits waits for (see there).
enum class ConfirmWait {
  kCheckpoint,    ///< at a checkpoint: briefly; what is not confirmed yet goes into the checkpoint
  kBeforeCommit,  ///< before this subtask's next commit: everything, or the task fails
  kInputEnded,    ///< after the last commits of a subtask whose input ended: everything, or the task fails
};

/// The producers of one subtask, shared by its writer and committer (see the file comment).
class KafkaProducerPool {
 public:
  enum class SlotState { kIdle, kOpen, kPrecommitted };
  struct Slot {
    std::unique_ptr<Producer> producer;
    SlotState state = SlotState::kIdle;
    std::string token;
  };

  KafkaProducerPool(const KafkaSinkSettings& settings, RuntimeContext& ctx);

  std::string own_id(int k) const { return transactional_id(settings.transactional_id_prefix, subtask, k); }

  /// The pool index of `id` when it is one of this subtask's current ids, else -1.
  int index_of(const std::string& id) const;

  std::unique_ptr<Producer> make_producer(const std::string& txid) const {
    return std::make_unique<Producer>(settings, txid, who, watchdog, cancelled);
  }

  std::string next_token() { return token_base + "-" + std::to_string(++token_counter); }

  /// Confirms the transactions committed and not yet confirmed from their probe records, and returns those still
  /// pending, as committables marked `committed`, for the checkpoint being taken. Called at each checkpoint,
  /// before the pre-commit: a commit the broker acknowledged can still be lost when the broker shuts down right
  /// after it (the chaos suite lost checkpoint 12's three transactions, committed 85 ms before a broker restart).
  /// So a committed transaction stays in every checkpoint until its record is seen; one the broker aborted fails
  /// this checkpoint, and the restore of the last completed one, which holds it, re-publishes it.
  /// The check waits briefly (kConfirmWaitMs per transaction): the record is readable only once the partition's
  /// last stable offset is past it, which other subtasks' transactions, open until their own checkpoint
  /// notification, can hold back for a while; blocking the task for them could wait on a subtask that waits for
  /// this one. Pending for longer than the operation timeout fails the task naming the transaction that holds
  /// the partition and the remedy (hanging_transaction_text).
  /// With kBeforeCommit (called before this subtask commits its next transaction) nothing may stay pending:
  /// it waits up to kConfirmBeforeCommitMs in all, then fails the task. A later transaction of this subtask can
  /// hold the same keys (keyed input goes to one subtask), and committing it while an earlier one might still
  /// turn out aborted would put the earlier one's re-publication after it: per-key order broken (seen in a chaos
  /// run before this wait: revisions 13-18 of a key after 19-22). The restore after the failure settles both in
  /// checkpoint order. kInputEnded (after the commits of the checkpoint that follows the end of the input) waits
  /// the same way: no checkpoint comes after it to carry a pending transaction, so a commit the broker lost would
  /// otherwise go unnoticed as the task finishes; failing the task instead makes the restore of that checkpoint
  /// re-publish it.
  std::vector<KafkaCommittable> confirm_commits(ConfirmWait wait = ConfirmWait::kCheckpoint);

  /// Notes a committed transaction (or a restored one, settled) for confirm_commits; `c.committed` ones that are
  /// noted already are not noted twice.
  void note_committed(const KafkaCommittable& c);

  /// Destroys the producers, in parallel (each may abort an open transaction, which takes a round trip or, with
  /// the broker away, up to 5 s).
  void close();

  const KafkaSinkSettings settings;
  const std::string who;
  const int subtask;
  const int parallelism;
  const bool transactional;
  std::vector<Slot> slots;          // transactional producers (exactly-once)
  std::unique_ptr<Producer> plain;  // the producer of none / at-least-once
  // Committed and not yet confirmed (confirm_commits), with the time of the commit; task thread only.
  struct Unconfirmed {
    KafkaCommittable committable;
    Clock::time_point since;
  };
  std::vector<Unconfirmed> committed_unconfirmed;
  std::unique_ptr<Producer> marker_reader;  // non-transactional: reads marker groups
  bool input_ended = false;                 // the writer was flushed at the end of the input (task thread)
  // Restored transactions that were not committed (abort_lingering), with the evidence, in checkpoint order: the
  // writer re-publishes them in its first transaction (republish_restored). Task thread.
  std::vector<std::pair<KafkaCommittable, std::string>> to_republish;
  std::string token_base;
  int64_t token_counter = 0;
  // Checked between the slices of the producers' blocking waits: the writer's liveness probe (set by the writer;
  // holds the probe) and the cancellation flag of the task that made the pool.
  std::function<void()> watchdog;
  const std::atomic<bool>* cancelled = nullptr;
};

}  // namespace detail
}  // namespace sluice
