// Channels: the path of network buffers from one producer subtask to one consumer subtask, with credit-based
// flow control (the model of Flink's credit-based network stack, FLINK-7282).
//
// The receiver owns `credits` buffers per channel. A sender may only fill a buffer the receiver granted
// (try_acquire); it sends the filled buffer, and the receiver recycles it after reading, which returns the
// credit. With no credit the sender blocks, which stops its task from taking input: backpressure reaches the
// source, and memory per channel stays at `credits` buffers.
//
// ChannelSender / ChannelReceiver are the seam for the TCP data plane: LocalChannel is the in-process
// implementation (two single-producer/single-consumer rings of buffer pointers, no copies).
#pragma once

#include <atomic>
#include <cassert>
#include <memory>
#include <vector>

#include "sluice/runtime/buffer_pool.h"
#include "sluice/runtime/wakeup.h"

namespace sluice {

/// The producer's end. Used by one thread (the producing task).
class ChannelSender {
 public:
  virtual ~ChannelSender() = default;
  /// A granted, empty buffer, or nullptr when the receiver has granted none (no credit).
  virtual NetworkBuffer* try_acquire() = 0;
  /// Hands a filled buffer to the receiver.
  virtual void send(NetworkBuffer* buffer) = 0;
  /// The signal notified when credit returns.
  virtual void set_sender_wakeup(WakeupSignal* signal) = 0;
};

/// The consumer's end. Used by one thread (the consuming task).
class ChannelReceiver {
 public:
  virtual ~ChannelReceiver() = default;
  /// The next filled buffer, or nullptr.
  virtual NetworkBuffer* poll() = 0;
  /// Returns a read buffer to the sender as credit.
  virtual void recycle(NetworkBuffer* buffer) = 0;
  /// The signal notified when data arrives.
  virtual void set_receiver_wakeup(WakeupSignal* signal) = 0;
};

/// A bounded single-producer/single-consumer ring of pointers (Lamport's queue with cached indices).
class SpscRing {
 public:
  explicit SpscRing(size_t capacity) {
    size_t c = 1;
    while (c < capacity)
      c <<= 1;
    slots_.resize(c);
    mask_ = c - 1;
  }
  bool push(NetworkBuffer* b) noexcept {
    size_t t = tail_.load(std::memory_order_relaxed);
    if (t - head_cache_ > mask_) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (t - head_cache_ > mask_) return false;
    }
    slots_[t & mask_] = b;
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }
  NetworkBuffer* pop() noexcept {
    size_t h = head_.load(std::memory_order_relaxed);
    if (h == tail_cache_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (h == tail_cache_) return nullptr;
    }
    NetworkBuffer* b = slots_[h & mask_];
    head_.store(h + 1, std::memory_order_release);
    return b;
  }

 private:
  std::vector<NetworkBuffer*> slots_;
  size_t mask_ = 0;
  alignas(64) std::atomic<size_t> head_{0};
  size_t tail_cache_ = 0;  // consumer's view of tail
  alignas(64) std::atomic<size_t> tail_{0};
  size_t head_cache_ = 0;  // producer's view of head
};

/// An in-process channel: `credits` buffers circulate between a free ring and a data ring.
class LocalChannel final : public ChannelSender, public ChannelReceiver {
 public:
  /// Takes the receiver's exclusive buffers; they start as credit for the sender.
  LocalChannel(NetworkBufferPool& pool, std::vector<NetworkBuffer*> credits)
      : pool_(pool), free_(credits.size()), data_(credits.size()), owned_(credits) {
    for (auto* b : credits) {
      bool ok = free_.push(b);
      assert(ok);
      (void)ok;
    }
  }
  /// Gives every buffer back to the pool, wherever it is (both ends must be gone).
  ~LocalChannel() override { pool_.release(owned_); }
  LocalChannel(const LocalChannel&) = delete;
  LocalChannel& operator=(const LocalChannel&) = delete;

  NetworkBuffer* try_acquire() override {
    NetworkBuffer* b = free_.pop();
    if (b != nullptr) {
      b->size = 0;
      pool_.on_acquire();
    }
    return b;
  }
  void send(NetworkBuffer* buffer) override {
    bool ok = data_.push(buffer);
    assert(ok);
    (void)ok;
    if (receiver_wakeup_ != nullptr) receiver_wakeup_->notify();
  }
  NetworkBuffer* poll() override { return data_.pop(); }
  void recycle(NetworkBuffer* buffer) override {
    pool_.on_release();
    bool ok = free_.push(buffer);
    assert(ok);
    (void)ok;
    if (sender_wakeup_ != nullptr) sender_wakeup_->notify();
  }
  void set_sender_wakeup(WakeupSignal* s) override { sender_wakeup_ = s; }
  void set_receiver_wakeup(WakeupSignal* s) override { receiver_wakeup_ = s; }

 private:
  NetworkBufferPool& pool_;
  SpscRing free_;
  SpscRing data_;
  std::vector<NetworkBuffer*> owned_;
  WakeupSignal* sender_wakeup_ = nullptr;
  WakeupSignal* receiver_wakeup_ = nullptr;
};

}  // namespace sluice
