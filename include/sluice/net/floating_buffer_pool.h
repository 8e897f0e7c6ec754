// FloatingBufferPool: the floating buffers of one input gate (Flink's gate-level LocalBufferPool under
// credit-based flow control, FLINK-7282).
//
// Each remote input channel owns a few exclusive buffers; the floating buffers are shared by the remote
// channels of a gate and go to the channels whose sender reports a backlog larger than their free credit.
// A channel that finds none registers as a listener and is offered the next buffer given back.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/runtime/buffer_pool.h"

namespace sluice::net {

/// Thread-safe. Must outlive every channel using it (channels hold a shared_ptr).
class FloatingBufferPool {
 public:
  /// Told that a buffer is available; returns true when it took the buffer.
  class Listener {
   public:
    virtual ~Listener() = default;
    /// Called without any lock of the pool held.
    virtual bool on_floating_buffer(NetworkBuffer* buffer) = 0;
  };

  /// Takes `count` buffers from `pool` (fails as NetworkBufferPool::allocate does).
  static Result<std::shared_ptr<FloatingBufferPool>> create(NetworkBufferPool& pool, size_t count);
  /// Gives every buffer back to `pool` (all must have been given back here first).
  ~FloatingBufferPool();
  FloatingBufferPool(const FloatingBufferPool&) = delete;
  FloatingBufferPool& operator=(const FloatingBufferPool&) = delete;

  /// A free buffer, or nullptr; with nullptr, `listener` (nullable) is offered the next one given back.
  NetworkBuffer* take(const std::weak_ptr<Listener>& listener);
  /// Returns a buffer: offered to waiting listeners first, else kept free.
  void give_back(NetworkBuffer* buffer);

  size_t size() const { return all_.size(); }
  /// Buffers currently free in the pool.
  size_t available() const;

 private:
  FloatingBufferPool(NetworkBufferPool& pool, std::vector<NetworkBuffer*> buffers);

  NetworkBufferPool& pool_;
  const std::vector<NetworkBuffer*> all_;
  mutable std::mutex mu_;
  std::vector<NetworkBuffer*> free_;               // guarded by mu_
  std::deque<std::weak_ptr<Listener>> listeners_;  // guarded by mu_
};

}  // namespace sluice::net
