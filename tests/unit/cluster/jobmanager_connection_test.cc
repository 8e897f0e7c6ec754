// JobManagerConnection, a TaskManager's thread-free view of its JobManager, driven by a ManualClock:
// registration backoff, the heartbeat schedule, the JobManager declared lost exactly at heartbeat.timeout,
// re-registration after a stale-registration refusal, and the terminal refusal.
#include "sluice/cluster/taskmanager/jobmanager_connection.h"

#include <gtest/gtest.h>

#include "sluice/core/clock.h"

namespace sluice {
namespace {

using Kind = JobManagerConnection::Action::Kind;
constexpr HeartbeatOptions kHeartbeat{1000, 5000};
constexpr RegistrationBackoff kBackoff{100, 1000};

TEST(JobManagerConnectionTest, RegistrationBacksOffExponentiallyUpToTheMax) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  EXPECT_EQ(c.next_action(clock.now_ms()).deadline_ms, 5000);
  std::vector<int64_t> waits;
  for (int i = 0; i < 6; ++i) {
    waits.push_back(c.on_registration_failed(clock.now_ms()));
    auto a = c.next_action(clock.now_ms());
    EXPECT_EQ(a.kind, Kind::kWait);
    EXPECT_EQ(a.wait_until_ms, clock.now_ms() + waits.back());
    clock.advance(waits.back() - 1);
    EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kWait);
    clock.advance(1);
    EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 200, 400, 800, 1000, 1000}));
  EXPECT_EQ(c.failed_attempts(), 6);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  EXPECT_EQ(c.failed_attempts(), 0);
  EXPECT_EQ(c.state(), JobManagerConnection::State::kRegistered);
}

TEST(JobManagerConnectionTest, HeartbeatNowMakesTheNextHeartbeatDueAtOnceOnlyWhenRegistered) {
  ManualClock clock(10'000);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.heartbeat_now(clock.now_ms());  // registering: nothing to send a heartbeat to
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(300);
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kWait);
  c.heartbeat_now(clock.now_ms());  // a source lost its connection 300 ms after the last heartbeat
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kHeartbeat);
  c.on_heartbeat_ok(clock.now_ms());
  EXPECT_EQ(c.next_action(clock.now_ms()).wait_until_ms, 11'300) << "then one interval after it again";
}

TEST(JobManagerConnectionTest, HeartbeatsEveryIntervalAndDeclaresTheJobManagerLostAtTheTimeout) {
  ManualClock clock(10'000);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  auto a = c.next_action(clock.now_ms());
  EXPECT_EQ(a.kind, Kind::kWait);
  EXPECT_EQ(a.wait_until_ms, 11'000);
  clock.advance(1000);
  a = c.next_action(clock.now_ms());
  ASSERT_EQ(a.kind, Kind::kHeartbeat);
  EXPECT_EQ(a.deadline_ms, 1000) << "a heartbeat call lasts at most one interval";
  c.on_heartbeat_failed(clock.now_ms());  // no reply; the last reply stays at 10'000
  for (int i = 0; i < 3; ++i) {
    clock.advance(1000);
    EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
    ASSERT_EQ(c.next_action(clock.now_ms()).kind, Kind::kHeartbeat);
    c.on_heartbeat_failed(clock.now_ms());
  }
  clock.advance(999);  // 14'999: 1 ms before the timeout
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  EXPECT_EQ(c.next_action(clock.now_ms()).wait_until_ms, 15'000);
  clock.advance(1);
  EXPECT_TRUE(c.check_jobmanager(clock.now_ms()));
  EXPECT_EQ(c.jobmanager_losses(), 1);
  EXPECT_EQ(c.state(), JobManagerConnection::State::kRegistering);
  EXPECT_TRUE(c.registration_id().empty());
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister) << "the first attempt after a loss goes at once";
}

TEST(JobManagerConnectionTest, ARepliedHeartbeatPushesTheTimeoutBack) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(4000);
  c.on_heartbeat_ok(clock.now_ms());
  clock.advance(4500);
  c.on_heartbeat_failed(clock.now_ms());
  clock.advance(499);
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  clock.advance(1);
  EXPECT_TRUE(c.check_jobmanager(clock.now_ms()));
}

TEST(JobManagerConnectionTest, FollowsTheJobManagersHeartbeatSettings) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{200, 2000}, clock.now_ms());
  EXPECT_EQ(c.heartbeat().interval_ms, 200);
  EXPECT_EQ(c.next_action(clock.now_ms()).wait_until_ms, 200);
  clock.advance(1800);
  c.on_heartbeat_failed(clock.now_ms());
  clock.advance(200);
  EXPECT_TRUE(c.check_jobmanager(clock.now_ms()));
}

TEST(JobManagerConnectionTest, APausedTaskManagerAsksOnceBeforeDeclaringTheJobManagerLost) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(60'000);  // SIGSTOPped for a minute: no heartbeat was sent, so no silence was observed
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  auto a = c.next_action(clock.now_ms());
  ASSERT_EQ(a.kind, Kind::kHeartbeat);
  EXPECT_EQ(a.deadline_ms, 1000) << "the heartbeat after a pause gets one interval to be answered";
  // The JobManager answers NOT_FOUND: it declared this registration lost meanwhile.
  c.on_registration_unknown(clock.now_ms());
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  EXPECT_EQ(c.jobmanager_losses(), 0);

  // The same pause with the JobManager gone: the heartbeat fails, then the JobManager is lost at once.
  c.on_registered("jm-2", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(60'000);
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  ASSERT_EQ(c.next_action(clock.now_ms()).kind, Kind::kHeartbeat);
  const TimestampMs sent = clock.now_ms();
  clock.advance(1000);
  c.on_heartbeat_failed(sent);
  EXPECT_TRUE(c.check_jobmanager(clock.now_ms()));
  EXPECT_EQ(c.jobmanager_losses(), 1);
}

TEST(JobManagerConnectionTest, ACallInFlightDuringAPauseObservesNothing) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(1000);
  const TimestampMs sent = clock.now_ms();  // a heartbeat goes out, then the process is SIGSTOPped
  clock.advance(30'000);
  c.on_heartbeat_failed(sent);  // it wakes up to DEADLINE_EXCEEDED
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kHeartbeat) << "asks again first";
}

TEST(JobManagerConnectionTest, AStaleRegistrationRegistersAgainAtOnce) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(1000);
  c.on_registration_unknown(clock.now_ms());
  EXPECT_EQ(c.state(), JobManagerConnection::State::kRegistering);
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  EXPECT_EQ(c.jobmanager_losses(), 0);
  c.on_registered("jm-2", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  EXPECT_EQ(c.registration_id(), "jm-2");
  EXPECT_EQ(c.registrations(), 2);
}

// A TaskManager that cancelled its tasks on its own (no heartbeat reply for heartbeat.timeout) registers again at
// once, even though the JobManager may still hold its registration: the new one replaces it there, which fails the
// job over instead of leaving it waiting on the cancelled tasks.
TEST(JobManagerConnectionTest, FencedTasksMakeTheTaskManagerRegisterAgainAtOnce) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_registered("jm-1", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  clock.advance(5500);
  c.on_tasks_fenced(clock.now_ms());
  EXPECT_EQ(c.state(), JobManagerConnection::State::kRegistering);
  EXPECT_TRUE(c.registration_id().empty());
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  // Not registered: nothing to do (a second fence before the new registration changes nothing).
  c.on_tasks_fenced(clock.now_ms());
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kRegister);
  c.on_registered("jm-2", "jm", HeartbeatOptions{0, 0}, clock.now_ms());
  EXPECT_EQ(c.registration_id(), "jm-2");
}

TEST(JobManagerConnectionTest, ARefusalStopsForGood) {
  ManualClock clock(0);
  JobManagerConnection c(kHeartbeat, kBackoff);
  c.on_refused();
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kStop);
  clock.advance(1'000'000);
  EXPECT_FALSE(c.check_jobmanager(clock.now_ms()));
  EXPECT_EQ(c.next_action(clock.now_ms()).kind, Kind::kStop);
}

}  // namespace
}  // namespace sluice
