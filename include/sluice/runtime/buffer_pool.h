// Network buffers: fixed-size memory segments (default 32 KiB) that carry serialized stream elements between
// tasks. All buffers of a job come from one NetworkBufferPool with a hard cap, so the memory of the data
// exchange is bounded by configuration, not by load (DESIGN.md §4).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

/// One memory segment. `size` bytes of `capacity` hold data. Owned by the pool; a buffer is handed between
/// exactly one sender and one receiver at a time.
struct NetworkBuffer {
  uint8_t* data = nullptr;
  uint32_t size = 0;
  uint32_t capacity = 0;
  uint32_t remaining() const { return capacity - size; }
};

/// Allocates segments up to a fixed count and keeps the counters tests and metrics read.
/// Thread-safe.
class NetworkBufferPool {
 public:
  /// `segment_size` bytes per buffer, at most `max_buffers` buffers.
  NetworkBufferPool(uint32_t segment_size, size_t max_buffers);
  ~NetworkBufferPool();
  NetworkBufferPool(const NetworkBufferPool&) = delete;
  NetworkBufferPool& operator=(const NetworkBufferPool&) = delete;

  /// Hands out `n` buffers (released ones first, then fresh ones), or fails (kNetwork) when that would pass
  /// the cap.
  Result<std::vector<NetworkBuffer*>> allocate(size_t n) SLUICE_EXCLUDES(mu_);
  /// Takes back buffers of channels that were torn down (a failover restarts a region's channels).
  void release(const std::vector<NetworkBuffer*>& buffers) SLUICE_EXCLUDES(mu_);

  uint32_t segment_size() const { return segment_size_; }
  size_t max_buffers() const { return max_buffers_; }
  /// Buffers allocated so far (never above max_buffers()).
  size_t allocated() const SLUICE_EXCLUDES(mu_);

  /// A sender took a buffer to fill / a receiver gave one back: maintains the in-flight counters.
  void on_acquire() noexcept {
    int64_t now = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
    int64_t peak = peak_in_flight_.load(std::memory_order_relaxed);
    while (now > peak && !peak_in_flight_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void on_release() noexcept { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  /// Buffers currently holding data (taken by a sender and not yet recycled by the receiver).
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  /// The largest in_flight() ever seen.
  int64_t peak_in_flight() const { return peak_in_flight_.load(std::memory_order_relaxed); }

 private:
  uint32_t segment_size_;
  size_t max_buffers_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<uint8_t[]>> segments_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<NetworkBuffer>> buffers_ SLUICE_GUARDED_BY(mu_);
  std::vector<NetworkBuffer*> free_ SLUICE_GUARDED_BY(mu_);
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> peak_in_flight_{0};
};

}  // namespace sluice
