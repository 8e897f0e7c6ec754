// The sink operators (run a SinkWriter) and the generic operator factory used by the DataStream API.
//
// * SinkOperator<T> runs a Sink<T>: flush(false) at every checkpoint ("flush on snapshot", at-least-once),
//   flush(true) at the end of a bounded input.
// * TwoPhaseCommitSinkOperator<T, CommT> runs a TwoPhaseCommittingSink<T, CommT> (sink.h, DESIGN.md §7):
//   pre-commit on snapshot, commit on notify_checkpoint_complete, and on restore commit what the restored
//   checkpoint pre-committed and abort the rest.
//
// Threading: every method runs on the task thread (StreamOperatorBase). Errors: exceptions of the sink's
// writer and committer become an OperatorException naming the operator, which fails the task.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/api/sink.h"
#include "sluice/core/fault_points.h"
#include "sluice/graph/stream_graph.h"
#include "sluice/state/operator_state.h"

namespace sluice {

/// Writes every record with the subtask's SinkWriter; flushes it at every checkpoint and at the end of a
/// bounded input.
template <class T>
class SinkOperator final : public OneInputOperator<T>, SinkWriterContext {
 public:
  explicit SinkOperator(std::shared_ptr<const Sink<T>> sink) : sink_(std::move(sink)) {}
  void open() override {
    writer_ = call_user_function(this->name(), [&] { return sink_->create_writer(*this->ctx_); });
  }
  void process_element(T&& record, TimestampMs ts) override {
    ts_ = ts;
    call_user_function(this->name(), [&] { writer_->write(record, *this); });
    arm_timer();
  }
  /// Flush on snapshot: what was written before the barrier is durable once the checkpoint completes.
  void snapshot_state(int64_t /*checkpoint_id*/) override {
    call_user_function(this->name(), [&] { writer_->flush(false); });
  }
  void finish() override {
    call_user_function(this->name(), [&] { writer_->flush(true); });
  }
  void close() override {
    closed_ = true;
    if (writer_) writer_->close();
  }

 private:
  /// Registers a processing-time timer for the writer's next_timer_ms() unless one at that time or earlier is
  /// registered already (timers cannot be deleted: a later one left behind finds nothing due and re-arms).
  void arm_timer() {
    const TimestampMs at = writer_->next_timer_ms();
    if (at == SinkWriter<T>::kNoTimer || at >= armed_ms_) return;
    armed_ms_ = at;
    this->services_->register_processing_timer(at, [this](TimestampMs time) {
      if (time == armed_ms_) armed_ms_ = SinkWriter<T>::kNoTimer;
      if (closed_ || !writer_) return;
      const TimestampMs now = this->services_->processing_clock().now_ms();
      if (writer_->next_timer_ms() <= now) {
        call_user_function(this->name(), [&] { writer_->on_processing_time(now); });
      }
      arm_timer();
    });
  }

  TimestampMs timestamp() const override { return ts_; }
  TimestampMs current_watermark() const override { return this->current_watermark_; }
  std::shared_ptr<const Sink<T>> sink_;
  std::unique_ptr<SinkWriter<T>> writer_;
  TimestampMs ts_ = kNoTimestamp;
  TimestampMs armed_ms_ = SinkWriter<T>::kNoTimer;  ///< the earliest timer registered and not yet fired
  bool closed_ = false;
};

/// Runs a TwoPhaseCommittingSink (Flink's SinkWriterOperator and CommitterOperator in one operator).
///
/// * open(): creates the committer; reads the restored union list state "committables" (pairs of checkpoint
///   id and committable: everything the restored checkpoint had pre-committed and not yet seen committed, of
///   every old subtask, in old-subtask order); commits its share of them in checkpoint-id order (element k
///   of the list is committed by subtask k % parallelism, so each is committed once even after a change of
///   parallelism); calls Committer::abort_lingering with all of them; clears the state; creates the writer.
///   A union list (rather than an even-split list) lets abort_lingering of every subtask see every
///   committable still to be committed, so no subtask aborts what another one commits.
/// * snapshot_state(n): writer flush(false) (not after finish(), which flushed with end_of_input = true),
///   prepare_commit(); the committables join the pending ones as checkpoint n's, and every pending entry is
///   written to the state.
/// * notify_checkpoint_complete(n): commits the pending committables of checkpoints <= n, one
///   Committer::commit call per checkpoint in id order, and drops them (fault point
///   "sink.after-precommit:<operator name>" right before, when there is something to commit).
/// * notify_checkpoint_aborted(n): nothing; checkpoint n's committables are committed with the next
///   completed checkpoint.
/// * finish(): flush(true). Without checkpointing it also pre-commits and commits everything. With
///   checkpointing it does not commit: the runtime takes one more checkpoint whose snapshot pre-commits the
///   rest and whose completion commits it.
template <class T, class CommT>
class TwoPhaseCommitSinkOperator final : public OneInputOperator<T>, SinkWriterContext {
 public:
  /// One state element: the id of the checkpoint that pre-committed the committable, and the committable.
  using StateEntry = std::pair<int64_t, CommT>;
  /// The name of the operator's union list state of StateEntry.
  static constexpr const char* kStateName = "committables";

  explicit TwoPhaseCommitSinkOperator(std::shared_ptr<const TwoPhaseCommittingSink<T, CommT>> sink)
      : sink_(std::move(sink)) {}

  void open() override {
    RuntimeContext& ctx = *this->ctx_;
    call_user_function(this->name(), [&] {
      committer_ = sink_->create_committer(ctx);
      state_ = &ctx.operator_state().template get_union_list_state<StateEntry>(kStateName);
      std::vector<StateEntry> restored = state_->get();
      state_->clear();
      const size_t parallelism = static_cast<size_t>(std::max(ctx.parallelism(), 1));
      const size_t subtask = static_cast<size_t>(ctx.subtask_index());
      std::vector<StateEntry> mine;
      for (size_t k = subtask; k < restored.size(); k += parallelism)
        mine.push_back(restored[k]);
      std::stable_sort(mine.begin(), mine.end(),
                       [](const StateEntry& a, const StateEntry& b) { return a.first < b.first; });
      for (size_t i = 0; i < mine.size();) {
        std::vector<CommT> batch;
        const int64_t id = mine[i].first;
        for (; i < mine.size() && mine[i].first == id; ++i)
          batch.push_back(std::move(mine[i].second));
        commit_checkpoint(id, batch);
      }
      std::vector<CommT> all;
      all.reserve(restored.size());
      for (StateEntry& e : restored)
        all.push_back(std::move(e.second));
      committer_->abort_lingering(ctx, all);
      writer_ = sink_->create_precommitting_writer(ctx);
    });
  }

  void process_element(T&& record, TimestampMs ts) override {
    ts_ = ts;
    call_user_function(this->name(), [&] { writer_->write(record, *this); });
  }

  void snapshot_state(int64_t checkpoint_id) override {
    call_user_function(this->name(), [&] {
      if (!ended_) writer_->flush(false);  // after finish() the writer was flushed with end_of_input = true
      std::vector<CommT> committables = writer_->prepare_commit();
      if (!committables.empty()) pending_.push_back(Pending{checkpoint_id, std::move(committables)});
      std::vector<StateEntry> entries;
      for (const Pending& p : pending_) {
        for (const CommT& c : p.committables)
          entries.emplace_back(p.checkpoint_id, c);
      }
      state_->update(std::move(entries));
    });
  }

  void notify_checkpoint_complete(int64_t checkpoint_id) override {
    if (pending_.empty() || pending_.front().checkpoint_id > checkpoint_id) return;
    call_user_function(this->name(), [&] {
      SLUICE_FAULT_POINT("sink.after-precommit:" + this->name());
      commit_up_to(checkpoint_id);
    });
  }

  /// Keeps the aborted checkpoint's committables: the next completed checkpoint commits them.
  void notify_checkpoint_aborted(int64_t /*checkpoint_id*/) override {}

  void finish() override {
    ended_ = true;
    call_user_function(this->name(), [&] {
      writer_->flush(true);
      if (this->ctx_->is_checkpointing_enabled()) return;
      std::vector<CommT> committables = writer_->prepare_commit();
      if (!committables.empty()) pending_.push_back(Pending{kNoCheckpoint, std::move(committables)});
      commit_up_to(kNoCheckpoint);
    });
  }

  void close() override {
    if (writer_) writer_->close();
  }

  /// The checkpoint ids of the committables pre-committed and not yet committed, oldest first (for tests).
  std::vector<int64_t> pending_checkpoint_ids() const {
    std::vector<int64_t> ids;
    for (const Pending& p : pending_)
      ids.push_back(p.checkpoint_id);
    return ids;
  }

 private:
  // The id under which finish() files what it commits without checkpointing (after every real id).
  static constexpr int64_t kNoCheckpoint = std::numeric_limits<int64_t>::max();

  struct Pending {
    int64_t checkpoint_id;
    std::vector<CommT> committables;
  };

  // Commits what checkpoint `checkpoint_id` pre-committed; a committer's error gets the checkpoint's id in front,
  // so a failed commit names both the committable (the committer's message) and its checkpoint.
  void commit_checkpoint(int64_t checkpoint_id, std::vector<CommT>& committables) {
    try {
      committer_->commit(committables);
    } catch (const SluiceException& e) {
      throw SluiceException(e.error().with_context(checkpoint_id == kNoCheckpoint
                                                       ? std::string("committing at the end of the input")
                                                       : "committing what checkpoint " + std::to_string(checkpoint_id) +
                                                             " pre-committed"));
    }
  }

  // Commits the pending entries of checkpoints <= checkpoint_id in id order; an entry is dropped only after
  // its commit returned, so a failed commit is retried from the state after the restore.
  void commit_up_to(int64_t checkpoint_id) {
    while (!pending_.empty() && pending_.front().checkpoint_id <= checkpoint_id) {
      commit_checkpoint(pending_.front().checkpoint_id, pending_.front().committables);
      pending_.erase(pending_.begin());
    }
  }

  TimestampMs timestamp() const override { return ts_; }
  TimestampMs current_watermark() const override { return this->current_watermark_; }

  std::shared_ptr<const TwoPhaseCommittingSink<T, CommT>> sink_;
  std::unique_ptr<PrecommittingSinkWriter<T, CommT>> writer_;
  std::unique_ptr<Committer<CommT>> committer_;
  ListState<StateEntry>* state_ = nullptr;
  std::vector<Pending> pending_;  // by checkpoint id, ascending
  bool ended_ = false;
  TimestampMs ts_ = kNoTimestamp;
};

/// An OperatorFactory from a callable that builds a fresh operator (copying the user function into it).
class LambdaOperatorFactory final : public OperatorFactory {
 public:
  LambdaOperatorFactory(std::function<std::unique_ptr<StreamOperatorBase>()> make, bool stateful)
      : make_(std::move(make)), stateful_(stateful) {}
  std::unique_ptr<StreamOperatorBase> create(SourceCoordinatorBase* /*coordinator*/) const override { return make_(); }
  bool is_stateful() const override { return stateful_; }

 private:
  std::function<std::unique_ptr<StreamOperatorBase>()> make_;
  bool stateful_;
};

}  // namespace sluice
