// Mailbox: how other threads hand actions to a task thread (Flink's TaskMailbox). Checkpoint triggers and
// notifications, timers registered from other threads and anything else that must run where the operators run
// are posted as mails; the task thread takes them in batches between units of input (Task::process_mails).
//
// Thread-safety: put() and has_mail() from any thread; take_all() from the task thread only (one consumer).
#pragma once

#include <atomic>
#include <deque>
#include <functional>

#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

class Mailbox {
 public:
  /// An action to run on the task thread.
  using Mail = std::function<void()>;

  /// Any thread: appends `mail` after every mail put before it. Does not wake the task; the caller does.
  void put(Mail mail) SLUICE_EXCLUDES(mu_);
  /// Any thread: whether a mail waits. Lock-free (one acquire load), for the task's check between units of input;
  /// a mail put before this returns false is seen by the next call.
  bool has_mail() const noexcept { return has_mail_.load(std::memory_order_acquire); }
  /// Task thread: takes every waiting mail, oldest first (empty when none). Mails put while the batch runs wait for
  /// the next call, so a mail that posts another cannot keep the task from its input.
  std::deque<Mail> take_all() SLUICE_EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::deque<Mail> mails_ SLUICE_GUARDED_BY(mu_);
  // True while mails_ is not empty; written under mu_, read without it.
  std::atomic<bool> has_mail_{false};
};

}  // namespace sluice
