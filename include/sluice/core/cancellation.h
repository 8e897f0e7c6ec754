// The cancellation flag of the task running on the current thread, for blocking calls deep inside connectors
// (a Kafka flush, init_transactions) that have no RuntimeContext or TaskServices at hand: they wait in bounded
// slices and stop waiting once the flag is set, so `sluice cancel` and SIGTERM end a task within a slice
// instead of the call's full timeout.
//
// Thread-safety: the pointer is thread-local (set by the runtime on each task thread, before its operators
// open); the flag it points to is set from any thread and read with acquire ordering.
#pragma once

#include <atomic>

namespace sluice {

namespace detail {
inline thread_local const std::atomic<bool>* tls_task_cancel_flag = nullptr;
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

/// True when the task running on this thread was asked to stop (false on other threads).
inline bool current_task_cancelled() noexcept {
  const std::atomic<bool>* f = detail::tls_task_cancel_flag;
  return f != nullptr && f->load(std::memory_order_acquire);
}

}  // namespace sluice
