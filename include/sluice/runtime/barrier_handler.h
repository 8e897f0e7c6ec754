// CheckpointBarrierHandler: what a task does with the checkpoint barriers arriving on its input channels
// (Flink's SingleCheckpointBarrierHandler in aligned mode and CheckpointBarrierTracker in at-least-once mode).
//
// Exactly-once (aligned): a channel that delivered barrier n is blocked (its later elements are not
// processed) until every channel that has not finished delivered barrier n; then the task snapshots, forwards
// the barrier and unblocks all channels. At-least-once: nothing blocks; the task snapshots when the last
// barrier n arrives. A channel that reached end-of-partition counts as having delivered every barrier
// (its producer finished before the checkpoint and snapshots its final state).
//
// Channels are numbered across all inputs of the task (input 0's channels first). A barrier with an id
// newer than the alignment in progress abandons it (that checkpoint was aborted); older ones are ignored.
//
// Threading: the task thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sluice/runtime/checkpoint_barrier.h"

namespace sluice {

class CheckpointBarrierHandler {
 public:
  /// `on_aligned(barrier, alignment_ns)` runs on the task thread inside on_barrier()/on_channel_finished() when
  /// checkpoint barrier.checkpoint_id is aligned; alignment_ns is the time from its first barrier.
  using AlignedCallback = std::function<void(const CheckpointBarrier&, int64_t alignment_ns)>;

  CheckpointBarrierHandler(size_t num_channels, AlignedCallback on_aligned);

  /// A barrier arrived on `channel`.
  void on_barrier(size_t channel, const CheckpointBarrier& barrier);
  /// `channel` delivered end-of-partition.
  void on_channel_finished(size_t channel);
  /// True while the channel's elements must wait (exactly-once alignment in progress).
  bool is_blocked(size_t channel) const { return blocked_[channel]; }
  /// The id of the alignment in progress, or -1.
  int64_t pending_checkpoint() const { return pending_ ? barrier_.checkpoint_id : -1; }
  /// Drops an alignment in progress for `checkpoint_id` (it was aborted) and unblocks every channel.
  void abort(int64_t checkpoint_id);

 private:
  void maybe_complete();
  void reset();

  AlignedCallback on_aligned_;
  std::vector<bool> arrived_;
  std::vector<bool> blocked_;
  std::vector<bool> finished_;
  bool pending_ = false;
  CheckpointBarrier barrier_;
  int64_t first_barrier_ns_ = 0;
  int64_t last_seen_id_ = 0;  // the newest id started or completed: older barriers are stale
};

}  // namespace sluice
