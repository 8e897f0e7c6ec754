// Restart strategies (Flink's RestartBackoffTimeStrategy implementations) and their factory.
#include "sluice/cluster/restart_strategy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cmath>

#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace {

/// Renders a duration as the largest whole unit Flink's docs use: "1h", "1min", "10s", "1500ms".
std::string format_duration(int64_t ms) {
  if (ms != 0 && ms % 3'600'000 == 0) return fmt::format("{}h", ms / 3'600'000);
  if (ms != 0 && ms % 60'000 == 0) return fmt::format("{}min", ms / 60'000);
  if (ms != 0 && ms % 1000 == 0) return fmt::format("{}s", ms / 1000);
  return fmt::format("{}ms", ms);
}

Error config_error(std::string_view key, std::string_view problem, std::string_view fix) {
  return Error(ErrorCode::kConfiguration, fmt::format("option '{}' {}; {}", key, problem, fix));
}

/// Fails when option `key` holds `value` below `min`.
template <class T>
Status check_at_least(std::string_view key, T value, T min, std::string_view unit) {
  if (value >= min) return ok_status();
  return config_error(key, fmt::format("is {}{} but must be at least {}{}", value, unit, min, unit),
                      fmt::format("set it to {}{} or more", min, unit));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

// --- none ---

std::string NoRestartBackoffTimeStrategy::describe() const {
  return "none (no restarts)";
}

// --- fixed-delay ---

FixedDelayRestartBackoffTimeStrategy::FixedDelayRestartBackoffTimeStrategy(int32_t attempts, int64_t delay_ms)
    : attempts_(attempts), delay_ms_(delay_ms) {
  assert(attempts >= 0 && delay_ms >= 0);
}

bool FixedDelayRestartBackoffTimeStrategy::notify_failure(TimestampMs) {
  ++failures_;
  return true;
}

std::string FixedDelayRestartBackoffTimeStrategy::describe() const {
  return fmt::format("fixed-delay (attempts {}, delay {})", attempts_, format_duration(delay_ms_));
}

// --- failure-rate ---

FailureRateRestartBackoffTimeStrategy::FailureRateRestartBackoffTimeStrategy(int32_t max_failures, int64_t interval_ms,
                                                                             int64_t delay_ms)
    : max_failures_(max_failures), interval_ms_(interval_ms), delay_ms_(delay_ms) {
  assert(max_failures >= 1 && interval_ms >= 1 && delay_ms >= 0);
}

bool FailureRateRestartBackoffTimeStrategy::notify_failure(TimestampMs now_ms) {
  if (failures_.size() > static_cast<size_t>(max_failures_)) failures_.pop_front();
  failures_.push_back(now_ms);
  return true;
}

bool FailureRateRestartBackoffTimeStrategy::can_restart() const {
  // Flink keeps the latest max_failures + 1 failure times; the job fails when all of them fall within one
  // interval, judged at the time of the latest failure.
  if (failures_.size() <= static_cast<size_t>(max_failures_)) return true;
  return failures_.back() - failures_.front() > interval_ms_;
}

std::string FailureRateRestartBackoffTimeStrategy::describe() const {
  return fmt::format("failure-rate (max {} failures per {}, delay {})", max_failures_, format_duration(interval_ms_),
                     format_duration(delay_ms_));
}

// --- exponential-delay ---

ExponentialDelayRestartBackoffTimeStrategy::ExponentialDelayRestartBackoffTimeStrategy(
    const ExponentialDelayOptions& options, uint64_t seed)
    : options_(options), random_(seed) {
  assert(options.initial_backoff_ms >= 1 && options.max_backoff_ms >= options.initial_backoff_ms);
  assert(options.backoff_multiplier > 1.0);
  assert(options.reset_backoff_threshold_ms >= 1);
  assert(options.jitter_factor >= 0.0 && options.jitter_factor <= 1.0);
  assert(options.attempts_before_reset_backoff >= 1);
}

bool ExponentialDelayRestartBackoffTimeStrategy::notify_failure(TimestampMs now_ms) {
  last_failure_ms_ = now_ms;
  // A failure while a restart is pending joins that restart. From the restart time on it is a failure of the
  // restarted job (a deployment that fails within the millisecond of the restart included): joining it would
  // ask for no backoff, and a job that fails at once on deployment would restart in a tight loop.
  if (next_restart_ms_ && now_ms < *next_restart_ms_) return false;
  // Running reset_backoff_threshold_ms since the last restart without a failure resets the backoff.
  if (!next_restart_ms_ || now_ms - *next_restart_ms_ >= options_.reset_backoff_threshold_ms) attempt_ = 0;
  next_restart_ms_ = now_ms + next_backoff_ms();
  ++attempt_;
  return true;
}

int64_t ExponentialDelayRestartBackoffTimeStrategy::backoff_time_ms() const {
  if (!next_restart_ms_) return 0;
  return std::max<int64_t>(0, *next_restart_ms_ - last_failure_ms_);
}

int64_t ExponentialDelayRestartBackoffTimeStrategy::next_backoff_ms() {
  // initial * multiplier^attempt, truncated as Flink's (long) cast; capped well inside int64 so that adding the
  // jitter cannot overflow (any value that large ends up at max_backoff_ms anyway).
  constexpr double kCap = 1e18;
  double exact = static_cast<double>(options_.initial_backoff_ms) *
                 std::pow(options_.backoff_multiplier, static_cast<double>(attempt_));
  auto backoff = static_cast<int64_t>(std::min(exact, kCap));
  int64_t jitter = 0;
  if (options_.jitter_factor > 0.0) {
    auto offset = static_cast<int64_t>(static_cast<double>(backoff) * options_.jitter_factor);
    jitter = std::uniform_int_distribution<int64_t>(-offset, offset)(random_);
  }
  return std::max(options_.initial_backoff_ms, std::min(backoff + jitter, options_.max_backoff_ms));
}

std::string ExponentialDelayRestartBackoffTimeStrategy::describe() const {
  return fmt::format(
      "exponential-delay (initial {}, max {}, multiplier {}, jitter {}, reset after {}, attempts before reset {})",
      format_duration(options_.initial_backoff_ms), format_duration(options_.max_backoff_ms),
      options_.backoff_multiplier, options_.jitter_factor, format_duration(options_.reset_backoff_threshold_ms),
      options_.attempts_before_reset_backoff);
}

// --- failure handling ---

FailureHandling handle_failure(RestartBackoffTimeStrategy& strategy, const Error& error, TimestampMs now_ms) {
  FailureHandling h;
  if (std::string reason = non_recoverable_reason(error); !reason.empty()) {
    h.unrecoverable = true;
    h.reason = fmt::format("not recoverable by a restart: {}", reason);
    return h;
  }
  strategy.notify_failure(now_ms);
  if (strategy.can_restart()) {
    h.restart = true;
    h.backoff_ms = strategy.backoff_time_ms();
  } else {
    h.reason = fmt::format("no more restarts allowed by the restart strategy, {}", strategy.describe());
  }
  return h;
}

// --- factory ---

namespace {

Result<std::unique_ptr<RestartBackoffTimeStrategy>> make_from_config(const Configuration& config, uint64_t seed) {
  namespace o = options;
  const std::string raw_type = config.get(o::kRestartStrategy);
  std::string type = lower(raw_type);
  if (type.empty()) type = config.get(o::kCheckpointInterval) > 0 ? "exponential-delay" : "none";

  if (type == "none" || type == "off" || type == "disable") {
    return std::unique_ptr<RestartBackoffTimeStrategy>(std::make_unique<NoRestartBackoffTimeStrategy>());
  }
  if (type == "fixed-delay" || type == "fixeddelay") {
    int32_t attempts = config.get(o::kFixedDelayAttempts);
    int64_t delay = config.get(o::kFixedDelayDelay);
    SLUICE_RETURN_IF_ERROR(check_at_least<int32_t>(o::kFixedDelayAttempts.key, attempts, 0, ""));
    SLUICE_RETURN_IF_ERROR(check_at_least<int64_t>(o::kFixedDelayDelay.key, delay, 0, " ms"));
    return std::unique_ptr<RestartBackoffTimeStrategy>(
        std::make_unique<FixedDelayRestartBackoffTimeStrategy>(attempts, delay));
  }
  if (type == "failure-rate" || type == "failurerate") {
    int32_t max_failures = config.get(o::kFailureRateMaxFailures);
    int64_t interval = config.get(o::kFailureRateInterval);
    int64_t delay = config.get(o::kFailureRateDelay);
    SLUICE_RETURN_IF_ERROR(check_at_least<int32_t>(o::kFailureRateMaxFailures.key, max_failures, 1, ""));
    SLUICE_RETURN_IF_ERROR(check_at_least<int64_t>(o::kFailureRateInterval.key, interval, 1, " ms"));
    SLUICE_RETURN_IF_ERROR(check_at_least<int64_t>(o::kFailureRateDelay.key, delay, 0, " ms"));
    return std::unique_ptr<RestartBackoffTimeStrategy>(
        std::make_unique<FailureRateRestartBackoffTimeStrategy>(max_failures, interval, delay));
  }
  if (type == "exponential-delay" || type == "exponentialdelay") {
    ExponentialDelayOptions e;
    e.initial_backoff_ms = config.get(o::kExpDelayInitialBackoff);
    e.max_backoff_ms = config.get(o::kExpDelayMaxBackoff);
    e.backoff_multiplier = config.get(o::kExpDelayMultiplier);
    e.reset_backoff_threshold_ms = config.get(o::kExpDelayResetThreshold);
    e.jitter_factor = config.get(o::kExpDelayJitter);
    e.attempts_before_reset_backoff = config.get(o::kExpDelayAttempts);
    SLUICE_RETURN_IF_ERROR(check_at_least<int64_t>(o::kExpDelayInitialBackoff.key, e.initial_backoff_ms, 1, " ms"));
    SLUICE_RETURN_IF_ERROR(check_at_least<int64_t>(o::kExpDelayMaxBackoff.key, e.max_backoff_ms, 1, " ms"));
    if (e.initial_backoff_ms > e.max_backoff_ms) {
      return config_error(o::kExpDelayInitialBackoff.key,
                          fmt::format("({}) is above {} ({})", format_duration(e.initial_backoff_ms),
                                      o::kExpDelayMaxBackoff.key, format_duration(e.max_backoff_ms)),
                          "lower the initial backoff or raise the max backoff");
    }
    if (!(e.backoff_multiplier > 1.0)) {  // also rejects NaN
      return config_error(o::kExpDelayMultiplier.key,
                          fmt::format("is {} but must be greater than 1", e.backoff_multiplier),
                          "set a factor such as 1.5 or 2");
    }
    SLUICE_RETURN_IF_ERROR(
        check_at_least<int64_t>(o::kExpDelayResetThreshold.key, e.reset_backoff_threshold_ms, 1, " ms"));
    if (!(e.jitter_factor >= 0.0 && e.jitter_factor <= 1.0)) {
      return config_error(o::kExpDelayJitter.key, fmt::format("is {} but must lie in [0, 1]", e.jitter_factor),
                          "set a fraction such as 0.1 (0 disables jitter)");
    }
    SLUICE_RETURN_IF_ERROR(check_at_least<int32_t>(o::kExpDelayAttempts.key, e.attempts_before_reset_backoff, 1, ""));
    return std::unique_ptr<RestartBackoffTimeStrategy>(
        std::make_unique<ExponentialDelayRestartBackoffTimeStrategy>(e, seed));
  }
  return config_error(o::kRestartStrategy.key, fmt::format("has the unknown value '{}'", raw_type),
                      "use none, fixed-delay, failure-rate or exponential-delay");
}

}  // namespace

Result<std::unique_ptr<RestartBackoffTimeStrategy>> make_restart_strategy(const Configuration& config, uint64_t seed) {
  try {
    return make_from_config(config, seed);
  } catch (const SluiceException& e) {  // Configuration::get throws on a value that does not parse
    return e.error();
  }
}

}  // namespace sluice
