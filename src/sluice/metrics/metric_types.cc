#include "sluice/metrics/metric_types.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace sluice::metrics {
namespace {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Samples closer together than this are not kept: a scrape every few ms must not grow the history.
constexpr int64_t kMinSampleIntervalMs = 1000;

}  // namespace

const char* metric_type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kMeter:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

Meter::Meter(int span_s, Clock clock)
    : span_ms_(static_cast<int64_t>(std::max(1, span_s)) * 1000), clock_(clock ? std::move(clock) : Clock(steady_ms)) {
  samples_.emplace_back(clock_(), 0.0);
}

Meter::Meter(std::function<double()> count, int span_s, Clock clock) : Meter(span_s, std::move(clock)) {
  count_fn_ = std::move(count);
  samples_.front().second = count_fn_();
}

double Meter::count() const {
  return count_fn_ ? count_fn_() : static_cast<double>(own_.get());
}

double Meter::rate() const {
  const double c = count();
  const int64_t now = clock_();
  std::lock_guard lock(mu_);
  if (samples_.empty() || now - samples_.back().first >= kMinSampleIntervalMs) samples_.emplace_back(now, c);
  // Keep the newest sample at least span old (the window's start), drop older ones.
  while (samples_.size() > 2 && now - samples_[1].first >= span_ms_)
    samples_.pop_front();
  const auto& [t0, c0] = samples_.front();
  if (now <= t0) return 0;
  return std::max(0.0, (c - c0) * 1000.0 / static_cast<double>(now - t0));
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1) {
  std::sort(bounds_.begin(), bounds_.end());
}

std::vector<double> Histogram::exponential_bounds(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor)
    b.push_back(v);
  return b;
}

void Histogram::update(double value) noexcept {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i])
    ++i;
  auto& b = buckets_[i];
  b.store(b.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  sum_.store(sum_.load(std::memory_order_relaxed) + value, std::memory_order_relaxed);
  // The count last: a reader that sees it sees a bucket at least as full (the counts are only hints of
  // a moment anyway; Prometheus tolerates a bucket briefly above _count).
  count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(buckets_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    out[i] = acc;
  }
  return out;
}

}  // namespace sluice::metrics
