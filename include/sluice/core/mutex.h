// Mutex and MutexLock: std::mutex and its RAII lock with the annotations clang's thread-safety analysis needs
// (core/thread_annotations.h), so that members guarded by a Mutex are checked at compile time. Same cost as
// std::mutex / std::unique_lock: the wrappers are inline and add no state.
//
// Thread-safety: a Mutex is what makes other state thread-safe; a MutexLock belongs to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "sluice/core/thread_annotations.h"

namespace sluice {

/// A std::mutex the analysis knows as a capability. Lock it with MutexLock.
class SLUICE_CAPABILITY Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() SLUICE_ACQUIRE() { mu_.lock(); }
  void unlock() SLUICE_RELEASE() { mu_.unlock(); }
  bool try_lock() SLUICE_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

/// Holds a Mutex from construction to destruction, as std::unique_lock: it may be released and taken again
/// within its scope (unlock(), lock()), and waits on a std::condition_variable, which releases the mutex while
/// it waits and holds it again when the wait returns. A wait with a condition is a loop at the call site
/// (`while (!ready_) lock.wait(cv_);`), where the analysis sees that the condition is read under the mutex.
class SLUICE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) SLUICE_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() SLUICE_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  /// Releases the mutex before the end of the scope (take it again with lock()).
  void unlock() SLUICE_RELEASE() { lock_.unlock(); }
  /// Takes the mutex again after unlock().
  void lock() SLUICE_ACQUIRE() { lock_.lock(); }

  /// Waits for a notification of `cv` (or a spurious wake-up); the mutex is held again on return.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  /// As wait(), for at most `timeout`.
  template <class Rep, class Period>
  std::cv_status wait_for(std::condition_variable& cv, const std::chrono::duration<Rep, Period>& timeout) {
    return cv.wait_for(lock_, timeout);
  }
  /// As wait(), until `deadline`.
  template <class Clock, class Duration>
  std::cv_status wait_until(std::condition_variable& cv, const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv.wait_until(lock_, deadline);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace sluice
