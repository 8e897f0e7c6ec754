// The cancellation flag of the task running on the current thread, for blocking calls deep inside connectors
// (a Kafka flush, init_transactions) that have no RuntimeContext or TaskServices at hand: they wait in bounded
// slices and stop waiting once the flag is set, so `sluice cancel` and SIGTERM end a task within a slice
// instead of the call's full timeout.
//
// In cluster mode a task thread also knows its TaskManager's lease (task_lease.h): a task of a TaskManager that
// the JobManager may have declared lost (it was paused, or cut off) is stale and counts as cancelled here, so
// that a sink that checks before each write with effects outside the process writes nothing once woken.
//
// Thread-safety: the pointers are thread-local (set by the runtime on each task thread, before its operators
// open); the flag they point to is set from any thread and read with acquire ordering.
#pragma once

#include <atomic>

#include "sluice/core/task_lease.h"

namespace sluice {

/// Thrown inside a task thread to unwind it when the task is cancelled or stale (deliberately not a
/// std::exception, so user code that catches std::exception does not swallow it).
struct TaskCancelledException {};

namespace detail {
inline thread_local const std::atomic<bool>* tls_task_cancel_flag = nullptr;
inline thread_local const TaskLease* tls_task_lease = nullptr;
}  // namespace detail

/// Makes `flag` the current thread's cancellation flag (nullptr: none). Called by the runtime's task thread.
inline void set_current_task_cancel_flag(const std::atomic<bool>* flag) noexcept {
  detail::tls_task_cancel_flag = flag;
}

/// The current thread's cancellation flag (nullptr on a thread that is not a task thread). Capture it to check
/// from helper threads the task waits for.
inline const std::atomic<bool>* current_task_cancel_flag() noexcept {
  return detail::tls_task_cancel_flag;
}

/// Makes `lease` the current thread's TaskManager lease (nullptr: none, as in local mode). Called by the
/// runtime's task thread.
inline void set_current_task_lease(const TaskLease* lease) noexcept {
  detail::tls_task_lease = lease;
}

/// The current thread's TaskManager lease (nullptr on a thread that is not a task thread, or in local mode).
/// Capture it to check from helper threads that send for the task.
inline const TaskLease* current_task_lease() noexcept {
  return detail::tls_task_lease;
}

/// True when this thread's task holds a lease that has lapsed (false without a lease). One clock read.
inline bool current_task_stale() noexcept {
  const TaskLease* l = detail::tls_task_lease;
  return l != nullptr && l->lapsed();
}

/// True when the task running on this thread was asked to stop, or is stale (false on other threads).
inline bool current_task_cancelled() noexcept {
  const std::atomic<bool>* f = detail::tls_task_cancel_flag;
  return (f != nullptr && f->load(std::memory_order_acquire)) || current_task_stale();
}

/// Throws TaskCancelledException when current_task_cancelled(). A sink calls it right before each write with
/// effects outside the process (a file write, a request), so a cancelled or stale task writes nothing more.
inline void throw_if_current_task_cancelled() {
  if (current_task_cancelled()) throw TaskCancelledException{};
}

}  // namespace sluice
