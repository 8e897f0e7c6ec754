// ThreadChecker: a checked form of the comment "task thread only" (Chromium's base::ThreadChecker, WebRTC's
// SequenceChecker). An object binds the thread that owns it (a task binds its thread when it starts running);
// SLUICE_DCHECK_ON_THREAD at the top of a member then aborts, naming the member, when another thread calls it.
// The check runs where asserts do (the debug, asan and tsan presets, which CI's TSan stage runs); release builds
// (NDEBUG) compile it out, so it costs nothing on the hot path there.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <thread>

namespace sluice {

class ThreadChecker {
 public:
  /// Makes the calling thread the owner (a task's thread, at its start).
  void bind() noexcept { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  /// Drops the owner: until the next bind() every thread passes (set-up before the owner runs, tear-down after).
  void detach() noexcept { owner_.store(std::thread::id(), std::memory_order_relaxed); }
  /// True when no thread is bound or the caller is the bound thread.
  [[nodiscard]] bool is_current() const noexcept {
    const std::thread::id owner = owner_.load(std::memory_order_relaxed);
    return owner == std::thread::id() || owner == std::this_thread::get_id();
  }

 private:
  std::atomic<std::thread::id> owner_{};
};

/// Prints "<file>:<line>: <what> called on a thread that does not own it" to stderr and aborts.
[[noreturn]] void thread_check_failed(const char* what, const char* file, int line) noexcept;

}  // namespace sluice

#ifdef NDEBUG
#define SLUICE_DCHECK_ON_THREAD(checker, what) static_cast<void>(0)
#else
/// Aborts naming `what` (a string literal: the member) unless `checker` is unbound or bound to the calling thread.
#define SLUICE_DCHECK_ON_THREAD(checker, what) \
  ((checker).is_current() ? static_cast<void>(0) : ::sluice::thread_check_failed(what, __FILE__, __LINE__))
#endif
