// The state shared by a remote channel's public end (task thread) and its connection's I/O thread.
// Private to net/.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "sluice/net/floating_buffer_pool.h"
#include "sluice/net/wire_format.h"
#include "sluice/runtime/channel.h"

namespace sluice::net::detail {

class Connection;

/// The failure of one channel: set once (the first error wins), read by the task thread when it throws.
class ChannelFailure {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// Records `error` unless a failure was recorded already; returns true when this call recorded it.
  bool set(const Error& error);
  Error error() const;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::optional<Error> error_;
};

/// The task's WakeupSignal as set on a channel. Notified under a lock, so that once set(nullptr) returns no
/// notification of the old signal is in flight and the task may destroy it.
class TaskWakeup {
 public:
  void set(WakeupSignal* s) {
    std::lock_guard lock(mu_);
    signal_ = s;
  }
  void notify() {
    std::lock_guard lock(mu_);
    if (signal_ != nullptr) signal_->notify();
  }

 private:
  std::mutex mu_;
  WakeupSignal* signal_ = nullptr;
};

/// The producer's end. The task fills buffers from free_ring and pushes them onto queue; the I/O thread
/// writes them against credit and gives them back through free_ring.
struct OutputChannelState {
  OutputChannelState(const ChannelId& id, NetworkBufferPool& pool, std::vector<NetworkBuffer*> buffers,
                     std::shared_ptr<Connection> conn);
  ~OutputChannelState();

  const ChannelId id;
  NetworkBufferPool& pool;
  const std::vector<NetworkBuffer*> owned;
  SpscRing free_ring;  // I/O thread -> task
  SpscRing queue;      // task -> I/O thread
  std::atomic<int64_t> queued{0};
  // True while the I/O thread knows of queued data (in its active list, waiting for credit, or posted).
  std::atomic<bool> scheduled{false};
  std::atomic<bool> released{false};  // the public end is gone: drop from the connection once drained
  TaskWakeup wakeup;
  ChannelFailure failure;
  const std::shared_ptr<Connection> conn;
  // Credit the receiver announced before this end was registered (moved here under the connection's lock).
  std::atomic<int64_t> early_credit{0};

  // I/O thread only.
  int64_t credit = 0;
  bool active = false;
  int64_t announced_backlog = 0;  // the backlog last sent in a kBacklog frame

  std::atomic<int64_t> credit_received{0};
  std::atomic<int64_t> buffers_sent{0};

  /// I/O thread: a buffer was written to the socket (or dropped at a failure): it becomes free again.
  void on_written(NetworkBuffer* b);
  /// Any thread: fails the channel and wakes its task.
  void fail(const Error& e);
};

/// The consumer's end. The I/O thread takes a free (credited) buffer per incoming frame, reads the bytes into
/// it and pushes it onto `data`; the task polls and recycles, which makes the buffer credit again.
struct InputChannelState final : FloatingBufferPool::Listener, std::enable_shared_from_this<InputChannelState> {
  InputChannelState(const ChannelId& id, NetworkBufferPool& pool, std::vector<NetworkBuffer*> exclusive,
                    std::shared_ptr<FloatingBufferPool> floating, std::shared_ptr<Connection> conn);
  ~InputChannelState() override;

  const ChannelId id;
  NetworkBufferPool& pool;
  const std::shared_ptr<FloatingBufferPool> floating;
  const std::vector<NetworkBuffer*> exclusive;
  SpscRing data;  // I/O thread -> task
  TaskWakeup wakeup;
  ChannelFailure failure;
  const std::shared_ptr<Connection> conn;

  std::atomic<int64_t> announced{0};
  std::atomic<int64_t> received{0};
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> peak_held{0};
  std::atomic<int64_t> floating_count{0};

  /// I/O thread: the buffer for an incoming frame (a credited one), or nullptr when the sender had no credit.
  NetworkBuffer* take_credited();
  /// I/O thread: a frame's bytes are in `b`; `backlog` buffers wait behind it at the sender.
  void on_received(NetworkBuffer* b, uint32_t backlog);
  /// I/O thread: the sender ran out of credit with `backlog` buffers queued.
  void on_backlog(uint32_t backlog);
  /// I/O thread: a frame could not be read into `b` (the connection failed): `b` is credit again.
  void return_credited(NetworkBuffer* b);
  /// I/O thread: takes the credit not yet announced (0 after release or failure).
  uint32_t take_unannounced();
  /// Task thread.
  void recycle(NetworkBuffer* b);
  /// Task thread: the public end is gone.
  void release();
  bool on_floating_buffer(NetworkBuffer* b) override;
  void fail(const Error& e);

 private:
  bool is_floating_locked(NetworkBuffer* b) const;
  /// Asks for floating buffers while the backlog exceeds the free credit; schedules an announcement.
  void request_floating_locked();
  void schedule_credit_locked();

  std::mutex mu_;
  std::vector<NetworkBuffer*> free_;           // credited (announced or about to be)
  std::vector<NetworkBuffer*> floating_held_;  // floating buffers assigned to this channel, wherever they are
  uint32_t unannounced_ = 0;
  uint32_t backlog_ = 0;
  bool credit_scheduled_ = false;
  bool released_ = false;
};

}  // namespace sluice::net::detail
