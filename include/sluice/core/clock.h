// Clock: the injectable source of processing time, so tests advance a ManualClock instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace sluice {

/// Milliseconds since the Unix epoch: the unit of every timestamp and watermark in Sluice (DESIGN.md §5).
using TimestampMs = int64_t;

/// A source of wall-clock (processing) time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Current time in ms since the Unix epoch.
  virtual TimestampMs now_ms() const = 0;
  /// A monotonic reading in nanoseconds, for durations only.
  virtual int64_t monotonic_ns() const = 0;
};

/// The system clock (std::chrono::system_clock / steady_clock).
class SystemClock final : public Clock {
 public:
  TimestampMs now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t monotonic_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  /// The process-wide instance.
  static SystemClock& instance() {
    static SystemClock clock;
    return clock;
  }
};

/// A clock that only moves when a test calls advance() or set(). Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimestampMs start_ms = 0) : now_ms_(start_ms) {}
  TimestampMs now_ms() const override { return now_ms_.load(std::memory_order_acquire); }
  int64_t monotonic_ns() const override { return now_ms() * 1'000'000; }
  void set(TimestampMs t) { now_ms_.store(t, std::memory_order_release); }
  void advance(int64_t delta_ms) { now_ms_.fetch_add(delta_ms, std::memory_order_acq_rel); }

 private:
  std::atomic<TimestampMs> now_ms_;
};

}  // namespace sluice
