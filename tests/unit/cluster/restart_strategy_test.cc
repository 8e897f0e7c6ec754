// Restart strategies driven by failures at manual times: the delays of each strategy, jitter bounds, the
// backoff reset, the failure-rate window, the configured defaults and configuration errors; handle_failure()
// with failures marked non-recoverable.
#include "sluice/cluster/restart_strategy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace {

constexpr int64_t kSecond = 1000;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kHour = 60 * kMinute;

ExponentialDelayOptions no_jitter(int64_t initial, double multiplier, int64_t max) {
  ExponentialDelayOptions o;
  o.initial_backoff_ms = initial;
  o.backoff_multiplier = multiplier;
  o.max_backoff_ms = max;
  o.jitter_factor = 0;
  return o;
}

/// Fails `s` at `now` and returns the backoff it asks for (or -1 when it refuses to restart).
int64_t fail(RestartBackoffTimeStrategy& s, TimestampMs now) {
  s.notify_failure(now);
  return s.can_restart() ? s.backoff_time_ms() : -1;
}

TEST(RestartStrategyTest, NoneNeverRestarts) {
  NoRestartBackoffTimeStrategy s;
  EXPECT_EQ(fail(s, 0), -1);
  EXPECT_EQ(s.describe(), "none (no restarts)");
}

TEST(RestartStrategyTest, FixedDelayRestartsAttemptsTimesWithTheSameDelay) {
  FixedDelayRestartBackoffTimeStrategy s(3, 10 * kSecond);
  EXPECT_TRUE(s.can_restart());
  EXPECT_EQ(fail(s, 0), 10 * kSecond);
  EXPECT_EQ(fail(s, 20 * kSecond), 10 * kSecond);
  EXPECT_EQ(fail(s, 5 * kHour), 10 * kSecond);  // no reset however long the job ran
  EXPECT_EQ(fail(s, 6 * kHour), -1);
  EXPECT_EQ(s.describe(), "fixed-delay (attempts 3, delay 10s)");
}

TEST(RestartStrategyTest, FixedDelayWithZeroAttemptsFailsOnTheFirstFailure) {
  FixedDelayRestartBackoffTimeStrategy s(0, 0);
  EXPECT_EQ(fail(s, 0), -1);
}

TEST(RestartStrategyTest, FailureRateFailsWhenMoreThanMaxFailuresFallInOneInterval) {
  FailureRateRestartBackoffTimeStrategy s(3, kMinute, 2 * kSecond);
  EXPECT_EQ(fail(s, 0), 2 * kSecond);
  EXPECT_EQ(fail(s, 10 * kSecond), 2 * kSecond);
  EXPECT_EQ(fail(s, 20 * kSecond), 2 * kSecond);
  EXPECT_EQ(fail(s, 30 * kSecond), -1);  // the fourth failure within one minute
  EXPECT_EQ(s.describe(), "failure-rate (max 3 failures per 1min, delay 2s)");
}

TEST(RestartStrategyTest, FailureRateWindowSlides) {
  FailureRateRestartBackoffTimeStrategy s(2, kMinute, 0);
  EXPECT_EQ(fail(s, 0), 0);
  EXPECT_EQ(fail(s, 30 * kSecond), 0);
  EXPECT_EQ(fail(s, kMinute + 1), 0);              // the failure at 0 has left the window
  EXPECT_EQ(fail(s, kMinute + 10 * kSecond), -1);  // 30 s, 60.001 s and 70 s lie within one minute
  EXPECT_EQ(fail(s, 3 * kMinute), 0);              // the window of the latest three is 2 min wide again
}

TEST(RestartStrategyTest, FailureRateIntervalBoundaryIsInclusive) {
  FailureRateRestartBackoffTimeStrategy s(1, kMinute, 0);
  EXPECT_EQ(fail(s, 0), 0);
  EXPECT_EQ(fail(s, kMinute), -1);  // exactly one interval apart still counts as within it (as Flink)
  FailureRateRestartBackoffTimeStrategy t(1, kMinute, 0);
  EXPECT_EQ(fail(t, 0), 0);
  EXPECT_EQ(fail(t, kMinute + 1), 0);
}

TEST(RestartStrategyTest, ExponentialDelayDoublesUpToTheMaxAsInFlinksExample) {
  // Flink docs' example: initial 1 s, multiplier 2, max 10 s, no jitter -> 1, 2, 4, 8, 10, 10 s.
  ExponentialDelayRestartBackoffTimeStrategy s(no_jitter(kSecond, 2.0, 10 * kSecond), 42);
  std::vector<int64_t> delays;
  TimestampMs now = 0;
  for (int i = 0; i < 6; ++i) {
    delays.push_back(fail(s, now));
    now += delays.back() + 500;  // the restarted job fails again 500 ms after it restarts
  }
  EXPECT_EQ(delays, (std::vector<int64_t>{1000, 2000, 4000, 8000, 10000, 10000}));
  EXPECT_EQ(s.current_attempt(), 6);
}

TEST(RestartStrategyTest, ExponentialDelayTruncatesFractionalBackoffs) {
  ExponentialDelayRestartBackoffTimeStrategy s(no_jitter(kSecond, 1.5, kMinute), 1);
  std::vector<int64_t> delays;
  TimestampMs now = 0;
  for (int i = 0; i < 5; ++i) {
    delays.push_back(fail(s, now));
    now += delays.back() + 1;
  }
  EXPECT_EQ(delays, (std::vector<int64_t>{1000, 1500, 2250, 3375, 5062}));
}

TEST(RestartStrategyTest, ExponentialDelayMergesFailuresWhileARestartIsPending) {
  ExponentialDelayRestartBackoffTimeStrategy s(no_jitter(kSecond, 2.0, 10 * kSecond), 1);
  EXPECT_TRUE(s.notify_failure(0));
  EXPECT_EQ(s.backoff_time_ms(), 1000);
  EXPECT_FALSE(s.notify_failure(400));  // another task of the job failed before the restart
  EXPECT_TRUE(s.can_restart());
  EXPECT_EQ(s.backoff_time_ms(), 600);  // the rest of the pending wait
  EXPECT_FALSE(s.notify_failure(999));  // a millisecond before the restart: still the same restart
  EXPECT_EQ(s.backoff_time_ms(), 1);
  EXPECT_EQ(s.current_attempt(), 1);
  EXPECT_TRUE(s.notify_failure(1001));
  EXPECT_EQ(s.backoff_time_ms(), 2000);
}

TEST(RestartStrategyTest, ExponentialDelayCountsAFailureAtTheRestartTimeAsANewOne) {
  // A deployment that fails within the millisecond of its restart (a job whose every deployment is refused):
  // a failure of the restarted job with the next, longer backoff, never a restart without delay.
  ExponentialDelayRestartBackoffTimeStrategy s(no_jitter(kSecond, 2.0, 10 * kSecond), 1);
  TimestampMs now = 0;
  std::vector<int64_t> delays;
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(s.notify_failure(now));
    delays.push_back(s.backoff_time_ms());
    now += delays.back();  // restarted exactly at the restart time, and failed at once
  }
  EXPECT_EQ(delays, (std::vector<int64_t>{1000, 2000, 4000, 8000, 10000}));
}

TEST(RestartStrategyTest, ExponentialDelayResetsAfterRunningForTheThreshold) {
  ExponentialDelayOptions o = no_jitter(kSecond, 2.0, 10 * kSecond);  // threshold: the default 1 h
  ExponentialDelayRestartBackoffTimeStrategy s(o, 1);
  EXPECT_EQ(fail(s, 0), 1000);                 // restart at 1 s
  EXPECT_EQ(fail(s, 2000), 2000);              // restart at 4 s
  EXPECT_EQ(fail(s, 4000 + kHour - 1), 4000);  // ran 1 h - 1 ms after the restart: no reset
  const TimestampMs restart = 4000 + kHour - 1 + 4000;
  EXPECT_EQ(fail(s, restart + kHour), 1000);  // ran 1 h after the restart: back to the initial backoff
  EXPECT_EQ(s.current_attempt(), 1);
  EXPECT_EQ(fail(s, restart + kHour + 1001), 2000);
}

TEST(RestartStrategyTest, ExponentialDelayFailsAfterAttemptsBeforeResetBackoff) {
  ExponentialDelayOptions o = no_jitter(kSecond, 2.0, 10 * kSecond);
  o.attempts_before_reset_backoff = 2;
  o.reset_backoff_threshold_ms = kMinute;
  ExponentialDelayRestartBackoffTimeStrategy s(o, 1);
  EXPECT_EQ(fail(s, 0), 1000);
  EXPECT_EQ(fail(s, 1001), 2000);
  EXPECT_EQ(fail(s, 3002), -1);  // a third attempt in a row
  // A fresh strategy that runs a minute between failures never runs out: each failure resets the count.
  ExponentialDelayRestartBackoffTimeStrategy t(o, 1);
  TimestampMs now = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(fail(t, now), 1000);
    now += 1000 + kMinute;
  }
}

TEST(RestartStrategyTest, ExponentialDelayJitterStaysWithinBoundsAndIsSeeded) {
  ExponentialDelayOptions o;  // Flink's defaults: 1 s, x1.5, max 1 min, jitter 0.1
  auto run = [&o](uint64_t seed) {
    ExponentialDelayRestartBackoffTimeStrategy s(o, seed);
    std::vector<int64_t> delays;
    TimestampMs now = 0;
    for (int i = 0; i < 14; ++i) {
      delays.push_back(fail(s, now));
      now += delays.back() + 1;
    }
    return delays;
  };
  std::vector<int64_t> a = run(7);
  bool jittered = false;
  double base = 1000;
  for (int64_t d : a) {
    auto b = static_cast<int64_t>(base);
    auto offset = static_cast<int64_t>(static_cast<double>(b) * 0.1);
    EXPECT_GE(d, std::clamp<int64_t>(b - offset, 1000, 60'000));
    EXPECT_LE(d, std::clamp<int64_t>(b + offset, 1000, 60'000));
    jittered |= d != std::min<int64_t>(b, 60'000);
    base *= 1.5;
  }
  EXPECT_TRUE(jittered);
  EXPECT_EQ(a.back(), 60'000);  // 1000 * 1.5^13 = 194 s: capped, jitter or not
  EXPECT_EQ(run(7), a);         // the same seed gives the same delays
  EXPECT_NE(run(8), a);
}

TEST(RestartStrategyTest, ExponentialDelayFullJitterNeverGoesBelowTheInitialBackoff) {
  ExponentialDelayOptions o = no_jitter(100, 2.0, 100'000);
  o.jitter_factor = 1.0;
  ExponentialDelayRestartBackoffTimeStrategy s(o, 3);
  TimestampMs now = 0;
  for (int i = 0; i < 50; ++i) {
    int64_t d = fail(s, now);
    EXPECT_GE(d, 100);
    EXPECT_LE(d, 100'000);
    now += d + 1;
  }
}

TEST(RestartStrategyTest, ExponentialDelaySurvivesManyAttempts) {
  ExponentialDelayRestartBackoffTimeStrategy s(ExponentialDelayOptions{}, 5);
  TimestampMs now = 0;
  for (int i = 0; i < 3000; ++i) {  // 1.5^3000 overflows a double: the backoff must stay at the max
    int64_t d = fail(s, now);
    ASSERT_GE(d, 1000);
    ASSERT_LE(d, 60'000);
    now += d + 1;
  }
  EXPECT_EQ(s.backoff_time_ms(), 60'000);
}

// --- make_restart_strategy ---

std::string describe(const Configuration& c) {
  auto s = make_restart_strategy(c, 1);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return s.ok() ? (*s)->describe() : "";
}

TEST(RestartStrategyTest, DefaultIsNoneWithoutCheckpointingAndExponentialDelayWithIt) {
  Configuration c;
  EXPECT_EQ(describe(c), "none (no restarts)");
  c.set_string("execution.checkpointing.interval", "10s");
  EXPECT_EQ(describe(c),
            "exponential-delay (initial 1s, max 1min, multiplier 1.5, jitter 0.1, reset after 1h, attempts before "
            "reset 2147483647)");
  c.set(options::kRestartStrategy, std::string("none"));
  EXPECT_EQ(describe(c), "none (no restarts)");
}

TEST(RestartStrategyTest, FactoryReadsEachStrategysOptions) {
  Configuration c;
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  EXPECT_EQ(describe(c), "fixed-delay (attempts 1, delay 1s)");  // Flink's defaults
  c.set_string("restart-strategy.fixed-delay.attempts", "3");
  c.set_string("restart-strategy.fixed-delay.delay", "10 s");
  EXPECT_EQ(describe(c), "fixed-delay (attempts 3, delay 10s)");

  c.set(options::kRestartStrategy, std::string("failure-rate"));
  EXPECT_EQ(describe(c), "failure-rate (max 1 failures per 1min, delay 1s)");
  c.set_string("restart-strategy.failure-rate.max-failures-per-interval", "5");
  c.set_string("restart-strategy.failure-rate.failure-rate-interval", "5min");
  c.set_string("restart-strategy.failure-rate.delay", "1500ms");
  EXPECT_EQ(describe(c), "failure-rate (max 5 failures per 5min, delay 1500ms)");

  c.set(options::kRestartStrategy, std::string("exponential-delay"));
  c.set_string("restart-strategy.exponential-delay.initial-backoff", "2s");
  c.set_string("restart-strategy.exponential-delay.max-backoff", "2h");
  c.set_string("restart-strategy.exponential-delay.backoff-multiplier", "2");
  c.set_string("restart-strategy.exponential-delay.jitter-factor", "0");
  c.set_string("restart-strategy.exponential-delay.reset-backoff-threshold", "30min");
  c.set_string("restart-strategy.exponential-delay.attempts-before-reset-backoff", "4");
  EXPECT_EQ(describe(c),
            "exponential-delay (initial 2s, max 2h, multiplier 2, jitter 0, reset after 30min, attempts before "
            "reset 4)");
}

TEST(RestartStrategyTest, FactoryAcceptsFlinksAliasesInAnyCase) {
  for (const char* type : {"off", "disable", "NONE"}) {
    Configuration c;
    c.set_string("restart-strategy.type", type);
    EXPECT_EQ(describe(c), "none (no restarts)") << type;
  }
  Configuration c;
  c.set_string("restart-strategy.type", "FixedDelay");
  EXPECT_EQ(describe(c), "fixed-delay (attempts 1, delay 1s)");
  c.set_string("restart-strategy.type", "failurerate");
  EXPECT_EQ(describe(c), "failure-rate (max 1 failures per 1min, delay 1s)");
  c.set_string("restart-strategy.type", "Exponential-Delay");
  EXPECT_EQ(describe(c).rfind("exponential-delay (", 0), 0u);
}

TEST(RestartStrategyTest, FactoryStrategyBehavesAsConfigured) {
  Configuration c;
  c.set_string("restart-strategy.type", "fixed-delay");
  c.set_string("restart-strategy.fixed-delay.attempts", "2");
  c.set_string("restart-strategy.fixed-delay.delay", "3s");
  auto s = make_restart_strategy(c, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(fail(**s, 0), 3000);
  EXPECT_EQ(fail(**s, 4000), 3000);
  EXPECT_EQ(fail(**s, 8000), -1);
}

TEST(RestartStrategyTest, FactorySeedMakesJitterReproducible) {
  Configuration c;
  c.set_string("restart-strategy.type", "exponential-delay");
  c.set_string("restart-strategy.exponential-delay.jitter-factor", "1");
  auto delays = [&c](uint64_t seed) {
    auto s = make_restart_strategy(c, seed).value_or_throw();
    std::vector<int64_t> d;
    TimestampMs now = 0;
    for (int i = 0; i < 8; ++i) {
      d.push_back(fail(*s, now));
      now += d.back() + 1;
    }
    return d;
  };
  EXPECT_EQ(delays(11), delays(11));
  EXPECT_NE(delays(11), delays(12));
}

/// Expects make_restart_strategy to fail with kConfiguration naming `key`.
void expect_error(const std::string& type, const std::string& key, const std::string& value) {
  Configuration c;
  c.set_string("restart-strategy.type", type);
  c.set_string(key, value);
  auto s = make_restart_strategy(c, 1);
  ASSERT_FALSE(s.ok()) << key << "=" << value;
  EXPECT_EQ(s.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(s.error().message().find(key), std::string::npos) << s.error().to_string();
}

TEST(RestartStrategyTest, FactoryRejectsValuesOutOfRangeNamingTheKey) {
  expect_error("fixed-delay", "restart-strategy.fixed-delay.attempts", "-1");
  expect_error("fixed-delay", "restart-strategy.fixed-delay.delay", "-5");
  expect_error("fixed-delay", "restart-strategy.fixed-delay.delay", "-5s");
  expect_error("failure-rate", "restart-strategy.failure-rate.max-failures-per-interval", "0");
  expect_error("failure-rate", "restart-strategy.failure-rate.failure-rate-interval", "0");
  expect_error("failure-rate", "restart-strategy.failure-rate.delay", "-1");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.initial-backoff", "0");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.initial-backoff", "2min");  // > max
  expect_error("exponential-delay", "restart-strategy.exponential-delay.max-backoff", "-1");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.backoff-multiplier", "0.5");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.backoff-multiplier", "1");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.backoff-multiplier", "nan");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.jitter-factor", "1.5");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.jitter-factor", "-0.1");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.reset-backoff-threshold", "0");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.attempts-before-reset-backoff", "0");
}

TEST(RestartStrategyTest, FactoryRejectsUnparsableValuesAndUnknownTypes) {
  expect_error("fixed-delay", "restart-strategy.fixed-delay.attempts", "three");
  expect_error("fixed-delay", "restart-strategy.fixed-delay.delay", "10 fortnights");
  expect_error("exponential-delay", "restart-strategy.exponential-delay.jitter-factor", "a bit");
  Configuration c;
  c.set_string("restart-strategy.type", "sometimes");
  auto s = make_restart_strategy(c, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(s.error().message().find("restart-strategy.type"), std::string::npos);
  EXPECT_NE(s.error().message().find("sometimes"), std::string::npos);
  // An unparsable checkpoint interval is reported when it decides the default.
  Configuration d;
  d.set_string("execution.checkpointing.interval", "often");
  auto t = make_restart_strategy(d, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message().find("execution.checkpointing.interval"), std::string::npos);
}

// The options of strategies other than the configured one are not read, so a bad value there is ignored.
TEST(RestartStrategyTest, OptionsOfOtherStrategiesAreIgnored) {
  Configuration c;
  c.set_string("restart-strategy.type", "fixed-delay");
  c.set_string("restart-strategy.exponential-delay.jitter-factor", "7");
  EXPECT_EQ(describe(c), "fixed-delay (attempts 1, delay 1s)");
}

// --- failures no restart can cure (mark_non_recoverable; Flink's SuppressRestartsException) ---

// A marked failure is never restarted, whatever the strategy allows, and counts as no attempt: a fixed-delay
// strategy with attempts left still has them all afterwards.
TEST(RestartStrategyTest, ANonRecoverableFailureIsNeverRestartedAndCountsAsNoAttempt) {
  FixedDelayRestartBackoffTimeStrategy s(2, 10 * kSecond);
  const Error lost = mark_non_recoverable(Error(ErrorCode::kConnector, "slot s1: the slot no longer exists"), "gone");
  for (int i = 0; i < 5; ++i) {
    FailureHandling h = handle_failure(s, lost, i * kSecond);
    EXPECT_FALSE(h.restart);
    EXPECT_TRUE(h.unrecoverable);
    EXPECT_EQ(h.backoff_ms, 0);
    EXPECT_EQ(h.reason, "not recoverable by a restart: gone");
  }
  // Both attempts are still there for failures a restart may cure.
  const Error transient(ErrorCode::kConnector, "connection refused");
  FailureHandling a = handle_failure(s, transient, 10 * kSecond);
  EXPECT_TRUE(a.restart);
  EXPECT_FALSE(a.unrecoverable);
  EXPECT_EQ(a.backoff_ms, 10 * kSecond);
  EXPECT_TRUE(handle_failure(s, transient, 20 * kSecond).restart);
  FailureHandling c = handle_failure(s, transient, 30 * kSecond);
  EXPECT_FALSE(c.restart);
  EXPECT_FALSE(c.unrecoverable);
  EXPECT_EQ(c.reason, "no more restarts allowed by the restart strategy, fixed-delay (attempts 2, delay 10s)");
}

// The default of a CDC job (exponential-delay without an attempt bound) restarts a transient failure for ever but a
// marked one never, also when the mark is on a cause, or the marked message has been wrapped as the task and the
// job wrap it (context prefixes, an OperatorException that keeps only message and code).
TEST(RestartStrategyTest, ExponentialDelayWithoutBoundStillHonoursTheMarkThroughWrapping) {
  ExponentialDelayRestartBackoffTimeStrategy s(no_jitter(1 * kSecond, 2.0, 60 * kSecond), 7);
  const Error transient(ErrorCode::kConnector, "timeout");
  TimestampMs now = 0;
  for (int i = 0; i < 50; ++i) {
    FailureHandling h = handle_failure(s, transient, now);
    ASSERT_TRUE(h.restart) << "failure " << i;
    now += h.backoff_ms + 1;
  }
  const Error marked =
      mark_non_recoverable(Error(ErrorCode::kConnector, "slot s2: snapshot interrupted"), "the snapshot cannot resume");
  const auto root = std::make_shared<const Error>(marked);
  const Error as_cause =
      Error(ErrorCode::kRuntime, "task 'Source' failed", root).with_context("job 'j'").with_context("region 0");
  FailureHandling h = handle_failure(s, as_cause, now);
  EXPECT_FALSE(h.restart);
  EXPECT_TRUE(h.unrecoverable);
  EXPECT_EQ(h.reason, "not recoverable by a restart: the snapshot cannot resume");
  // As the task reports it: the operator's exception keeps the message and code only.
  try {
    call_user_function("Source: pg", [&] { throw SluiceException(marked); });
    FAIL() << "no exception";
  } catch (const OperatorException& e) {
    const Error described(e.code(), std::string("operator 'Source: pg' failed in subtask 1/2: ") + e.what());
    EXPECT_EQ(non_recoverable_reason(described), "the snapshot cannot resume");
    EXPECT_FALSE(handle_failure(s, described, now + 1).restart);
  }
  EXPECT_EQ(s.current_attempt(), 50) << "the marked failures counted as no attempt";
}

// The mark is the marked message itself, remembered by the process: the same words written by anything else (a
// record's value quoted in an error) do not suppress restarts.
TEST(RestartStrategyTest, TextThatOnlyLooksMarkedDoesNotSuppressRestarts) {
  const Error marked = mark_non_recoverable(Error(ErrorCode::kConnector, "bad password for user u3"),
                                            "the server refused the credentials");
  EXPECT_EQ(marked.message(),
            "bad password for user u3 (not recoverable by a restart: the server refused the credentials)");
  EXPECT_EQ(marked.code(), ErrorCode::kConnector);
  EXPECT_EQ(non_recoverable_reason(marked.with_context("task 'Source' failed")), "the server refused the credentials");
  const Error forged(ErrorCode::kRuntime,
                     "record {\"v\": \"x (not recoverable by a restart: the server refused the credentials)\"} failed");
  EXPECT_EQ(non_recoverable_reason(forged), "");
  FixedDelayRestartBackoffTimeStrategy s(1, 0);
  EXPECT_TRUE(handle_failure(s, forged, 0).restart);
  EXPECT_EQ(non_recoverable_reason(Error(ErrorCode::kConnector, "bad password for user u3")), "")
      << "the unmarked message is not marked";
  EXPECT_EQ(non_recoverable_reason(mark_non_recoverable(Error(ErrorCode::kConnector, "e"), "")),
            "marked non-recoverable");
}

// A TaskManager's report carries the reason beside the message (its own process holds the mark): the JobManager
// adopts the received message as marked, unchanged, and a failure wrapping it is then not restarted. Without a
// reason nothing is marked, so a task's message alone never suppresses restarts.
TEST(RestartStrategyTest, AMarkAdoptedFromAnotherProcessSuppressesRestartsOfItsMessageOnly) {
  const std::string received =
      "configuration error: operator 'Sink: out' failed in subtask 1/2: the module is missing (not recoverable by a "
      "restart: a restart loads the same files)";
  const Error unmarked = adopt_non_recoverable(Error(ErrorCode::kRuntime, received + " [no reason]"), "");
  EXPECT_EQ(non_recoverable_reason(unmarked), "");
  const Error adopted = adopt_non_recoverable(Error(ErrorCode::kRuntime, received), "a restart loads the same files");
  EXPECT_EQ(adopted.message(), received) << "the message is not marked twice";
  FixedDelayRestartBackoffTimeStrategy s(3, 0);
  FailureHandling h = handle_failure(s, adopted.with_context("task 'Sink: out (1/2)' on TaskManager r-1"), 0);
  EXPECT_FALSE(h.restart);
  EXPECT_TRUE(h.unrecoverable);
  EXPECT_EQ(h.reason, "not recoverable by a restart: a restart loads the same files");
  EXPECT_TRUE(
      handle_failure(s, Error(ErrorCode::kRuntime, "operator 'Sink: out' failed: connection refused"), 0).restart);
  EXPECT_EQ(non_recoverable_reason(adopt_non_recoverable(Error(ErrorCode::kRuntime, ""), "r")), "")
      << "an empty message, found in every text, is never adopted";
  EXPECT_EQ(non_recoverable_reason(Error(ErrorCode::kRuntime, "anything")), "");
}

}  // namespace
}  // namespace sluice
