// MongoCdcSourceMetrics: positions, lag and rate of a MongoDB CDC source (mongodb_cdc_source.h).
#include <map>
#include <mutex>
#include <string>

#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

namespace sluice {

void MongoCdcSourceMetrics::record_position(const std::string& split_id, const std::string& position,
                                            int64_t cluster_time_ms) {
  {
    std::lock_guard lock(mu_);
    positions_[split_id] = position;
    SplitTimes& t = split_times_[split_id];
    t.event_ms = std::max(t.event_ms, cluster_time_ms);
  }
  int64_t prev = last_event_time_ms.load(std::memory_order_relaxed);
  while (cluster_time_ms > prev && !last_event_time_ms.compare_exchange_weak(prev, cluster_time_ms)) {
  }
}

std::map<std::string, std::string> MongoCdcSourceMetrics::positions() const {
  std::lock_guard lock(mu_);
  return positions_;
}

void MongoCdcSourceMetrics::record_caught_up(const std::string& split_id, int64_t now_ms) {
  std::lock_guard lock(mu_);
  split_times_[split_id].caught_up_ms = now_ms;
}

int64_t MongoCdcSourceMetrics::lag_ms(int64_t now_ms) const noexcept {
  std::lock_guard lock(mu_);
  int64_t lag = 0;
  for (const auto& [id, t] : split_times_) {
    const int64_t at = std::max(t.event_ms, t.caught_up_ms);
    if (at > 0) lag = std::max(lag, now_ms - at);
  }
  return lag;
}

double MongoCdcSourceMetrics::events_per_second(int64_t now_monotonic_ns) {
  std::lock_guard lock(mu_);
  const int64_t n = events.load(std::memory_order_relaxed);
  if (rate_last_ns_ < 0 || now_monotonic_ns <= rate_last_ns_) {
    rate_last_ns_ = now_monotonic_ns;
    rate_last_events_ = n;
    return 0.0;
  }
  const double rate =
      static_cast<double>(n - rate_last_events_) * 1e9 / static_cast<double>(now_monotonic_ns - rate_last_ns_);
  rate_last_ns_ = now_monotonic_ns;
  rate_last_events_ = n;
  return rate;
}

}  // namespace sluice
