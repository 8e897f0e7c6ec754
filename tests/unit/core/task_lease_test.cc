// TaskLease and the current task's cancellation as a sink sees it (core/cancellation.h).
#include "sluice/core/task_lease.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "sluice/core/cancellation.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace {

// Sets this thread's cancel flag and lease for one test and clears them after, as a task thread does.
struct CurrentTask {
  CurrentTask(const std::atomic<bool>* flag, const TaskLease* lease) {
    set_current_task_cancel_flag(flag);
    set_current_task_lease(lease);
  }
  ~CurrentTask() {
    set_current_task_cancel_flag(nullptr);
    set_current_task_lease(nullptr);
  }
};

TEST(TaskLeaseTest, LapsedUntilExtendedThenAtTheDeadline) {
  ManualClock clock(1'000);
  TaskLease lease(clock);
  EXPECT_TRUE(lease.lapsed()) << "no heartbeat answered yet";
  lease.extend_until(4'000);
  EXPECT_EQ(lease.deadline_ms(), 4'000);
  EXPECT_FALSE(lease.lapsed());
  clock.set(3'999);
  EXPECT_FALSE(lease.lapsed());
  clock.set(4'000);
  EXPECT_TRUE(lease.lapsed()) << "the JobManager may declare the TaskManager lost from the deadline on";
}

TEST(TaskLeaseTest, AnEarlierDeadlineNeverShortensTheLease) {
  ManualClock clock(0);
  TaskLease lease(clock);
  lease.extend_until(5'000);
  lease.extend_until(3'000);  // the answer to an older heartbeat, arriving late
  EXPECT_EQ(lease.deadline_ms(), 5'000);
}

TEST(TaskLeaseTest, ExtensionsFromOneThreadAreSeenByAnother) {
  ManualClock clock(0);
  TaskLease lease(clock);
  std::thread writer([&] {
    for (TimestampMs t = 1; t <= 10'000; ++t)
      lease.extend_until(t);
  });
  TimestampMs last = 0;
  for (int i = 0; i < 10'000; ++i) {
    const TimestampMs d = lease.deadline_ms();
    ASSERT_GE(d, last) << "a deadline went back";
    last = d;
  }
  writer.join();
  EXPECT_EQ(lease.deadline_ms(), 10'000);
}

TEST(TaskLeaseTest, AStaleTaskCountsAsCancelledOnItsThreadOnly) {
  ManualClock clock(0);
  TaskLease lease(clock);
  lease.extend_until(3'000);
  std::atomic<bool> cancelled{false};
  CurrentTask current(&cancelled, &lease);
  EXPECT_FALSE(current_task_stale());
  EXPECT_FALSE(current_task_cancelled());
  EXPECT_NO_THROW(throw_if_current_task_cancelled());

  clock.set(3'000);  // a process woken from SIGSTOP after heartbeat.timeout
  EXPECT_TRUE(current_task_stale());
  EXPECT_TRUE(current_task_cancelled());
  EXPECT_THROW(throw_if_current_task_cancelled(), TaskCancelledException);
  bool elsewhere = true;
  std::thread([&] { elsewhere = current_task_cancelled(); }).join();
  EXPECT_FALSE(elsewhere) << "a thread that is not the task's has no lease";

  lease.extend_until(9'000);  // registered again (a new deployment's tasks hold the same lease)
  EXPECT_FALSE(current_task_cancelled());
  cancelled.store(true);
  EXPECT_TRUE(current_task_cancelled()) << "the cancel flag counts without a lapsed lease";
}

TEST(TaskLeaseTest, WithoutALeaseOnlyTheCancelFlagCounts) {
  std::atomic<bool> cancelled{false};
  CurrentTask current(&cancelled, nullptr);  // local mode: no TaskManager, no lease
  EXPECT_FALSE(current_task_stale());
  EXPECT_FALSE(current_task_cancelled());
  cancelled.store(true);
  EXPECT_THROW(throw_if_current_task_cancelled(), TaskCancelledException);
}

}  // namespace
}  // namespace sluice
