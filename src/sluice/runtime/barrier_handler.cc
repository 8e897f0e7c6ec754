#include "sluice/runtime/barrier_handler.h"

#include <chrono>

namespace sluice {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CheckpointBarrierHandler::CheckpointBarrierHandler(size_t num_channels, AlignedCallback on_aligned)
    : on_aligned_(std::move(on_aligned)),
      arrived_(num_channels, false),
      blocked_(num_channels, false),
      finished_(num_channels, false) {}

void CheckpointBarrierHandler::on_barrier(size_t channel, const CheckpointBarrier& barrier) {
  if (barrier.checkpoint_id < last_seen_id_ || (!pending_ && barrier.checkpoint_id == last_seen_id_)) {
    return;  // stale: its checkpoint completed here already or was superseded
  }
  if (pending_ && barrier.checkpoint_id > barrier_.checkpoint_id) reset();  // the older one was aborted
  if (!pending_) {
    pending_ = true;
    barrier_ = barrier;
    last_seen_id_ = barrier.checkpoint_id;
    first_barrier_ns_ = steady_ns();
  }
  arrived_[channel] = true;
  if (barrier.mode == CheckpointingMode::kExactlyOnce) blocked_[channel] = true;
  maybe_complete();
}

void CheckpointBarrierHandler::on_channel_finished(size_t channel) {
  finished_[channel] = true;
  blocked_[channel] = false;
  if (pending_) maybe_complete();
}

void CheckpointBarrierHandler::abort(int64_t checkpoint_id) {
  if (pending_ && barrier_.checkpoint_id == checkpoint_id) reset();
}

void CheckpointBarrierHandler::maybe_complete() {
  for (size_t c = 0; c < arrived_.size(); ++c) {
    if (!arrived_[c] && !finished_[c]) return;
  }
  const CheckpointBarrier barrier = barrier_;
  const int64_t alignment = steady_ns() - first_barrier_ns_;
  // Unblock before the callback: the snapshot forwards the barrier, after which the blocked elements belong
  // to the next checkpoint and may flow.
  reset();
  on_aligned_(barrier, alignment);
}

void CheckpointBarrierHandler::reset() {
  pending_ = false;
  std::fill(arrived_.begin(), arrived_.end(), false);
  std::fill(blocked_.begin(), blocked_.end(), false);
}

}  // namespace sluice
