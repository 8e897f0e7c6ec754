// Private to src/sluice/connectors/kafka/: the few helpers more than one file of the Kafka source needs (the
// settings, the discoverer, the enumerator, the reader and the stats). Not installed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_source_settings.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace kafka_source_internal {

inline constexpr const char* kRole = "Kafka source";
// The shortest window of a reader's records-per-second rate; metrics() treats a window open for twice as long
// (the reader was not polled: nothing to read) as ending now.
inline constexpr int64_t kRateWindowMs = 1'000;

// Steady-clock milliseconds (the rate windows).
inline int64_t steady_ms() {
  return SystemClock::instance().monotonic_ns() / 1'000'000;
}

/// Logs a kind of event at most once per interval, with the number of suppressed repeats.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::seconds interval) : interval_(interval) {}
  /// True when the caller should log now; `suppressed` then holds the repeats skipped since the last one.
  bool allow(int64_t& suppressed) {
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++suppressed_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  std::chrono::seconds interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_once_ = false;
  int64_t suppressed_ = 0;
};

/// The properties of a source's consumer: the user's, the defaults normalize_and_validate added, and the
/// ones the source owns. Defined in kafka_source_settings.cc.
kafka::KafkaProperties consumer_properties(const detail::KafkaSourceSettings& s, const std::string& client_id);

}  // namespace kafka_source_internal
}  // namespace sluice
