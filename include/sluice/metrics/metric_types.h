// The four metric types of Flink's metric system (org.apache.flink.metrics): Counter, Gauge, Meter and
// Histogram, made cheap for the hot path.
//
// Thread-safety: a Counter, Meter or Histogram has ONE writer thread (the task thread that owns it) and any
// number of readers (the scraper). The writer uses relaxed loads and stores, never a locked read-modify-write
// or a lock: an increment is a plain add on x86-64. Readers see a value at most a moment old, never a torn
// one. A Meter's rate() and a Histogram's reads may be called from any thread (a Meter's history has its own
// lock, taken only by readers). A Gauge is a function called on the reader's thread: it must be thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace sluice::metrics {

enum class MetricType { kCounter, kGauge, kMeter, kHistogram };
const char* metric_type_name(MetricType t);

/// A monotonically increasing count (Flink's Counter, e.g. numRecordsIn). Single writer, any reader.
class Counter {
 public:
  void inc(uint64_t n = 1) noexcept { v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

/// A value read when the metric is reported (Flink's Gauge, e.g. currentInputWatermark).
using Gauge = std::function<double()>;

/// Events per second over a sliding window (Flink's MeterView: the rate over the last `span_s` seconds, 60
/// by default), computed from a count: its own single-writer counter (mark_event) or a count function (for a
/// count kept elsewhere, e.g. a task's records). The rate is the difference of the count between the oldest
/// sample in the window and now, divided by the time between them; samples are taken when rate() is called
/// (a scrape) at most once per `min_sample_interval_ms`, so nothing runs between scrapes. Until two samples
/// exist the rate is 0.
class Meter {
 public:
  using Clock = std::function<int64_t()>;  ///< milliseconds of a steady clock
  explicit Meter(int span_s = 60, Clock clock = {});
  /// A meter over a count kept elsewhere (must be non-decreasing and thread-safe to call).
  Meter(std::function<double()> count, int span_s = 60, Clock clock = {});

  /// Writer thread only (meters with their own count).
  void mark_event(uint64_t n = 1) noexcept { own_.inc(n); }
  /// The count now (own or external).
  double count() const;
  /// Events per second over the window (any thread).
  double rate() const;

 private:
  Counter own_;
  std::function<double()> count_fn_;
  int64_t span_ms_;
  Clock clock_;
  mutable std::mutex mu_;
  mutable std::deque<std::pair<int64_t, double>> samples_;  // (ms, count), oldest first
};

/// A distribution of values (Flink's Histogram, e.g. checkpoint durations): counts per bucket of fixed upper
/// bounds, plus the sum and count, reported as a Prometheus histogram. update() is single-writer and does not
/// allocate (a linear scan of the bounds, which are few).
class Histogram {
 public:
  /// `upper_bounds` ascending; a last +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  /// Exponential bounds: start, start*factor, ... (count of them).
  static std::vector<double> exponential_bounds(double start, double factor, int count);

  void update(double value) noexcept;

  const std::vector<double>& upper_bounds() const { return bounds_; }
  /// Cumulative counts per bound (Prometheus `le` semantics), the +Inf bucket last.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  double sum() const noexcept { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

}  // namespace sluice::metrics
