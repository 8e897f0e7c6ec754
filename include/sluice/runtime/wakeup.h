// WakeupSignal: how a task thread sleeps when it has nothing to do and how other threads wake it.
//
// The task clears the signal, looks for work, and waits only if none was found; notify() between the clear
// and the wait makes the wait return at once, so no wakeup is lost. notify() costs one atomic store and, only
// when the task sleeps, a lock and a condition-variable signal.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace sluice {

class WakeupSignal {
 public:
  /// Task thread: forget earlier notifications before looking for work.
  void clear() noexcept { notified_.store(false, std::memory_order_seq_cst); }

  /// Any thread: there may be work for the task.
  void notify() noexcept {
    notified_.store(true, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard lock(mu_);
      cv_.notify_one();
    }
  }

  /// Task thread: waits until notified (since the last clear()) or until `deadline`.
  template <class TimePoint>
  void wait_until(TimePoint deadline) {
    std::unique_lock lock(mu_);
    sleeping_.store(true, std::memory_order_seq_cst);
    cv_.wait_until(lock, deadline, [&] { return notified_.load(std::memory_order_seq_cst); });
    sleeping_.store(false, std::memory_order_seq_cst);
  }

 private:
  std::atomic<bool> notified_{false};
  std::atomic<bool> sleeping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace sluice
