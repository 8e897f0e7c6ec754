// Restart strategies: whether a failed job (or failover region) may restart, and after how long (DESIGN.md §7).
//
// Modelled on Flink's RestartBackoffTimeStrategy and its implementations in
// flink-runtime/.../executiongraph/failover/, with the semantics documented in Flink's "Task Failure Recovery"
// (docs/ops/state/task_failure_recovery) and the restart-strategy.* options (Flink 1.19+ / 2.x):
//   none               never restarts.
//   fixed-delay        restarts `attempts` times, waiting `delay` before each restart.
//   failure-rate       restarts unless more than `max-failures-per-interval` failures fall within one
//                      `failure-rate-interval`, waiting `delay` before each restart.
//   exponential-delay  the default when checkpointing is on: waits initial-backoff, then multiplies the wait by
//                      backoff-multiplier per attempt up to max-backoff, each with a random +/- jitter-factor;
//                      running reset-backoff-threshold without a failure resets the wait; more than
//                      attempts-before-reset-backoff attempts in a row fail the job.
//
// Protocol (as Flink's ExecutionFailureHandler): on each failure the scheduler calls notify_failure(now), then
// can_restart(); if it may restart, it waits backoff_time_ms() and restarts. Time is injected as the `now_ms`
// argument (ms since the epoch, from the scheduler's Clock), so tests drive a strategy with manual times.
//
// Thread-safety: not thread-safe; a strategy belongs to one scheduler (JobManager) thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "sluice/core/clock.h"
#include "sluice/core/config.h"
#include "sluice/core/error.h"

namespace sluice {

/// Decides whether a job may restart after a failure and how long to wait first (Flink's
/// RestartBackoffTimeStrategy).
class RestartBackoffTimeStrategy {
 public:
  virtual ~RestartBackoffTimeStrategy() = default;

  /// Records a failure at `now_ms` (ms since the epoch; non-decreasing across calls). Returns whether it
  /// counts as a new restart attempt: exponential-delay merges a failure that arrives while a restart is
  /// still pending into that restart (returns false); the other strategies count every failure.
  virtual bool notify_failure(TimestampMs now_ms) = 0;

  /// Returns whether the job may restart after the failures recorded so far (judged at the time of the
  /// latest notify_failure).
  virtual bool can_restart() const = 0;

  /// Returns the wait in ms before the restart, measured from the latest notify_failure. Meaningful only after
  /// a notify_failure for which can_restart() holds; 0 before the first failure.
  virtual int64_t backoff_time_ms() const = 0;

  /// Describes the strategy and its parameters for logs and the web UI, e.g.
  /// "fixed-delay (attempts 3, delay 10s)".
  virtual std::string describe() const = 0;
};

/// Never restarts (restart-strategy.type: none). Source: Flink's NoRestartBackoffTimeStrategy.
class NoRestartBackoffTimeStrategy final : public RestartBackoffTimeStrategy {
 public:
  bool notify_failure(TimestampMs) override { return true; }
  bool can_restart() const override { return false; }
  int64_t backoff_time_ms() const override { return 0; }
  std::string describe() const override;
};

/// Restarts at most `attempts` times, each after `delay_ms` (restart-strategy.type: fixed-delay). The
/// (attempts + 1)-th failure fails the job. Source: Flink's FixedDelayRestartBackoffTimeStrategy.
class FixedDelayRestartBackoffTimeStrategy final : public RestartBackoffTimeStrategy {
 public:
  /// Requires attempts >= 0 and delay_ms >= 0 (make_restart_strategy checks both).
  FixedDelayRestartBackoffTimeStrategy(int32_t attempts, int64_t delay_ms);

  bool notify_failure(TimestampMs now_ms) override;
  bool can_restart() const override { return failures_ <= attempts_; }
  int64_t backoff_time_ms() const override { return delay_ms_; }
  std::string describe() const override;

 private:
  int32_t attempts_;
  int64_t delay_ms_;
  int64_t failures_ = 0;
};

/// Restarts, each after `delay_ms`, as long as the latest `max_failures + 1` failures did not all fall within
/// `interval_ms` (restart-strategy.type: failure-rate): with max_failures = 3 and interval 1 min, the fourth
/// failure within one minute fails the job. Source: Flink's FailureRateRestartBackoffTimeStrategy.
class FailureRateRestartBackoffTimeStrategy final : public RestartBackoffTimeStrategy {
 public:
  /// Requires max_failures >= 1, interval_ms >= 1 and delay_ms >= 0 (make_restart_strategy checks them).
  FailureRateRestartBackoffTimeStrategy(int32_t max_failures, int64_t interval_ms, int64_t delay_ms);

  bool notify_failure(TimestampMs now_ms) override;
  bool can_restart() const override;
  int64_t backoff_time_ms() const override { return delay_ms_; }
  std::string describe() const override;

 private:
  int32_t max_failures_;
  int64_t interval_ms_;
  int64_t delay_ms_;
  std::deque<TimestampMs> failures_;  ///< the latest (at most max_failures + 1) failure times, oldest first
};

/// The parameters of exponential-delay; the defaults are Flink's.
struct ExponentialDelayOptions {
  int64_t initial_backoff_ms = 1000;                   ///< wait before the first restart; >= 1
  int64_t max_backoff_ms = 60'000;                     ///< largest wait; >= initial_backoff_ms
  double backoff_multiplier = 1.5;                     ///< factor per attempt; > 1
  int64_t reset_backoff_threshold_ms = 3'600'000;      ///< run this long after a restart to reset; >= 1
  double jitter_factor = 0.1;                          ///< random +/- fraction of each wait; in [0, 1]
  int32_t attempts_before_reset_backoff = 2147483647;  ///< attempts in a row before the job fails; >= 1
};

/// Restarts with an exponentially growing wait (restart-strategy.type: exponential-delay). Source: Flink
/// 1.19+'s ExponentialDelayRestartBackoffTimeStrategy:
///  * Attempt k (k = 0, 1, ... since the last reset) waits initial * multiplier^k plus a jitter drawn uniformly
///    from [-j, j] with j = floor(that wait * jitter_factor), clamped to [initial, max].
///  * A failure while a restart is pending (at or before the scheduled restart time) is merged into it: no new
///    attempt, and backoff_time_ms() is the rest of the pending wait.
///  * A failure at least reset_backoff_threshold_ms after the scheduled restart time (the job ran that long)
///    resets the attempt count, so it waits the initial backoff again.
///  * can_restart() fails once more than attempts_before_reset_backoff attempts happened since the last reset.
/// Jitter comes from a std::mt19937_64 seeded with `seed`, so a run is reproducible.
class ExponentialDelayRestartBackoffTimeStrategy final : public RestartBackoffTimeStrategy {
 public:
  /// Requires the bounds documented on ExponentialDelayOptions (make_restart_strategy checks them).
  ExponentialDelayRestartBackoffTimeStrategy(const ExponentialDelayOptions& options, uint64_t seed);

  bool notify_failure(TimestampMs now_ms) override;
  bool can_restart() const override { return attempt_ <= options_.attempts_before_reset_backoff; }
  int64_t backoff_time_ms() const override;
  std::string describe() const override;

  /// The attempts since the last reset (Flink's currentRestartAttempt).
  int64_t current_attempt() const { return attempt_; }

 private:
  int64_t next_backoff_ms();

  ExponentialDelayOptions options_;
  std::mt19937_64 random_;
  int64_t attempt_ = 0;
  std::optional<TimestampMs> next_restart_ms_;  ///< when the pending or latest restart was scheduled
  TimestampMs last_failure_ms_ = 0;
};

/// What the scheduler does after a failure (Flink's FailureHandlingResult).
struct FailureHandling {
  bool restart = false;        ///< whether the failed job (or region) restarts
  int64_t backoff_ms = 0;      ///< the wait before that restart, from the failure; 0 when !restart
  bool unrecoverable = false;  ///< the failure was marked non-recoverable: the strategy was not asked
  std::string reason;          ///< when !restart: why not (the error's non-recoverable reason, or the strategy's end)
};

/// Decides what follows `error` at `now_ms` (ms since the epoch), as Flink's ExecutionFailureHandler: an error
/// marked non-recoverable (mark_non_recoverable(), core/non_recoverable.h, on it or any cause) is never restarted and
/// is not recorded in `strategy` (it counts as no attempt); any other failure is notify_failure(now_ms), then
/// can_restart() and backoff_time_ms(). Thread-safety: as `strategy` (the scheduler's thread).
FailureHandling handle_failure(RestartBackoffTimeStrategy& strategy, const Error& error, TimestampMs now_ms);

/// Creates the restart strategy configured in `config` (restart-strategy.type and its restart-strategy.*
/// options, Flink's keys and defaults). When the type is unset it is exponential-delay if checkpointing is
/// enabled (execution.checkpointing.interval > 0) and none otherwise, as Flink. Accepts Flink's aliases: none,
/// off, disable; fixed-delay, fixeddelay; failure-rate, failurerate; exponential-delay, exponentialdelay (any
/// case). `seed` seeds the jitter of exponential-delay.
/// Errors: kConfiguration naming the key for an unknown type, an option that does not parse, or a value out
/// of range (a negative delay or attempt count, a non-positive interval or failure count, an initial backoff
/// above the max backoff, a multiplier <= 1, a jitter outside [0, 1]).
[[nodiscard]] Result<std::unique_ptr<RestartBackoffTimeStrategy>> make_restart_strategy(const Configuration& config,
                                                                                        uint64_t seed);

}  // namespace sluice
