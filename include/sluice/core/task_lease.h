// A TaskManager's lease on its registration at the JobManager, as its tasks see it.
//
// The JobManager declares a TaskManager lost heartbeat.timeout after the last heartbeat it received, which it
// received no earlier than the TaskManager sent it. So a TaskManager may act on the job until the send time of
// its last answered heartbeat plus heartbeat.timeout; after that its tasks may be running elsewhere already.
// The TaskManager's connection thread cancels such stale tasks (fence_stale_tasks), but a paused process (SIGSTOP,
// a frozen VM, a long GC-like stall) resumes all its threads at once: a task thread can write before the
// connection thread has run. So tasks read the lease themselves, and a sink checks it right before each write
// with effects outside the process (core/cancellation.h, current_task_cancelled()).
//
// Thread-safety: extend_until() from one thread (the connection thread); lapsed() and deadline_ms() from any.
#pragma once

#include <atomic>
#include <cstdint>

#include "sluice/core/clock.h"

namespace sluice {

class TaskLease {
 public:
  /// A lease that has lapsed until extended. `clock` must be the clock the deadlines are taken on, and
  /// outlive the lease.
  explicit TaskLease(const Clock& clock) noexcept : clock_(clock) {}
  TaskLease(const TaskLease&) = delete;
  TaskLease& operator=(const TaskLease&) = delete;

  /// Moves the deadline to `deadline_ms` (on the lease's clock) unless it is already later.
  void extend_until(TimestampMs deadline_ms) noexcept {
    TimestampMs cur = deadline_ms_.load(std::memory_order_relaxed);
    while (deadline_ms > cur && !deadline_ms_.compare_exchange_weak(cur, deadline_ms, std::memory_order_release,
                                                                    std::memory_order_relaxed)) {
    }
  }
  /// The time from which the JobManager may have declared the TaskManager lost (0 before the first extension).
  TimestampMs deadline_ms() const noexcept { return deadline_ms_.load(std::memory_order_acquire); }
  /// True from the deadline on: the tasks holding this lease are stale. One clock read.
  bool lapsed() const noexcept { return clock_.now_ms() >= deadline_ms(); }
  const Clock& clock() const noexcept { return clock_; }

 private:
  const Clock& clock_;
  std::atomic<TimestampMs> deadline_ms_{0};
};

}  // namespace sluice
