#include "sluice/checkpoint/checkpoint_coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A job of one task that never acknowledges: every checkpoint stays pending until the coordinator stops. With
// `first_trigger_fails`, the first trigger does not reach every TaskManager (cluster mode: the TriggerCheckpoint RPC
// failed).
class SilentJob final : public CheckpointJobHooks {
 public:
  explicit SilentJob(bool first_trigger_fails = false) : first_trigger_fails_(first_trigger_fails) {}
  bool ready_for_checkpoint() override { return true; }
  Triggered trigger(const CheckpointBarrier& barrier) override {
    std::lock_guard lock(mu_);
    triggered_.push_back(barrier.checkpoint_id);
    cv_.notify_all();
    Triggered t{{}, {CheckpointTaskKey{0, 0}}, std::nullopt};
    if (first_trigger_fails_ && triggered_.size() == 1) t.failure = "TriggerCheckpoint at 127.0.0.1:1: UNAVAILABLE";
    return t;
  }
  void trigger_task(const CheckpointTaskKey&, const CheckpointBarrier&) override {}
  void notify_complete(int64_t) override {}
  void notify_aborted(int64_t id) override {
    std::lock_guard lock(mu_);
    aborted_.push_back(id);
  }
  void fail_job(const Error&) override {}

  bool wait_triggered(std::chrono::milliseconds timeout, size_t n = 1) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return triggered_.size() >= n; });
  }
  std::vector<int64_t> aborted() {
    std::lock_guard lock(mu_);
    return aborted_;
  }

 private:
  const bool first_trigger_fails_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> triggered_;
  std::vector<int64_t> aborted_;
};

// A job whose trigger blocks until released, as a TriggerCheckpoint RPC to a paused TaskManager does until its
// deadline (seconds).
class StalledTriggerJob final : public CheckpointJobHooks {
 public:
  bool ready_for_checkpoint() override { return true; }
  Triggered trigger(const CheckpointBarrier&) override {
    std::unique_lock lock(mu_);
    ++in_trigger_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    return Triggered{{}, {CheckpointTaskKey{0, 0}}, std::nullopt};
  }
  void trigger_task(const CheckpointTaskKey&, const CheckpointBarrier&) override {}
  void notify_complete(int64_t) override {}
  void notify_aborted(int64_t) override {}
  void fail_job(const Error&) override {}

  bool wait_in_trigger(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return in_trigger_ > 0; });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int in_trigger_ = 0;
  bool released_ = false;
};

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice-coordinator-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    auto storage = FileCheckpointStorage::create(dir_.string(), "job");
    ASSERT_TRUE(storage.ok()) << storage.error().to_string();
    storage_.emplace(std::move(*storage));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<CheckpointVertexInfo> vertices() const {
    CheckpointVertexInfo v;
    v.vertex = 0;
    v.name = "Source: s";
    v.uids = {"s"};
    v.max_parallelism = {128};
    return {v};
  }

  fs::path dir_;
  std::optional<FileCheckpointStorage> storage_;
  SilentJob job_;
};

// A bounded job that finishes while a periodic checkpoint is pending: the checkpoint is discarded, not failed
// (it was shown as FAILED "the job ended", and /health's failed_checkpoints_in_a_row was 1).
TEST_F(CheckpointCoordinatorTest, CheckpointPendingWhenTheJobEndsIsDiscardedNotFailed) {
  CheckpointCoordinatorOptions options;
  options.interval_ms = 10;
  CheckpointCoordinator coordinator(options, *storage_, vertices(), job_, SystemClock::instance(), 1);
  coordinator.start();
  ASSERT_TRUE(job_.wait_triggered(10s));
  coordinator.stop();
  EXPECT_EQ(coordinator.failed_count(), 0);
  EXPECT_EQ(coordinator.completed_count(), 0);
  for (const CheckpointStats& s : coordinator.stats()) {
    ADD_FAILURE() << "checkpoint " << s.checkpoint_id << " in the history: " << (s.completed ? "completed" : s.failure);
  }
  // Its directory is gone all the same.
  EXPECT_FALSE(fs::exists(dir_ / "job" / "chk-1"));
}

// The statistics answer while a trigger is stuck in its RPCs (found by a fresh-user trial: the JobManager's /health and
// /metrics took 4 s while a TaskManager was paused, past a Kubernetes probe's 1 s timeout).
TEST_F(CheckpointCoordinatorTest, StatisticsAnswerWhileATriggerIsStuck) {
  StalledTriggerJob job;
  CheckpointCoordinatorOptions options;
  options.interval_ms = 10;
  CheckpointCoordinator coordinator(options, *storage_, vertices(), job, SystemClock::instance(), 1);
  coordinator.start();
  ASSERT_TRUE(job.wait_in_trigger(10s));
  auto read = std::async(std::launch::async, [&] {
    return std::make_tuple(coordinator.stats().size(), coordinator.completed_count(), coordinator.failed_count());
  });
  const bool answered = read.wait_for(5s) == std::future_status::ready;
  job.release();
  EXPECT_TRUE(answered) << "stats(), completed_count() and failed_count() waited for the stuck trigger";
  EXPECT_EQ(std::get<1>(read.get()), 0);
  coordinator.stop();
}

// A savepoint someone asked for that the job's end overtook still fails, with the reason.
TEST_F(CheckpointCoordinatorTest, SavepointPendingWhenTheJobEndsFails) {
  CheckpointCoordinatorOptions options;  // no periodic checkpoints
  options.savepoint_dir = (dir_ / "savepoints").string();
  CheckpointCoordinator coordinator(options, *storage_, vertices(), job_, SystemClock::instance(), 1);
  coordinator.start();
  std::future<Result<std::string>> savepoint = coordinator.trigger_savepoint("", false);
  ASSERT_TRUE(job_.wait_triggered(10s));
  coordinator.stop();
  ASSERT_EQ(savepoint.wait_for(10s), std::future_status::ready);
  Result<std::string> r = savepoint.get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("the job ended"), std::string::npos) << r.error().to_string();
  EXPECT_EQ(coordinator.failed_count(), 1);
  ASSERT_EQ(coordinator.stats().size(), 1u);
  EXPECT_EQ(coordinator.stats()[0].failure, "the job ended");
}

// A checkpoint whose trigger did not reach every TaskManager fails at once with the reason (counted as a failed
// checkpoint, the tasks told to abort it) and the next one is triggered on time: it used to stay pending until
// execution.checkpointing.timeout, so a TaskManager that missed one trigger stalled checkpointing for 30 s.
TEST_F(CheckpointCoordinatorTest, CheckpointWhoseTriggerFailedIsAbortedAtOnce) {
  SilentJob job(/*first_trigger_fails=*/true);
  CheckpointCoordinatorOptions options;
  options.interval_ms = 10;
  options.timeout_ms = 600'000;  // the abort must not come from the timeout
  options.tolerable_failures = 10;
  CheckpointCoordinator coordinator(options, *storage_, vertices(), job, SystemClock::instance(), 1);
  coordinator.start();
  ASSERT_TRUE(job.wait_triggered(10s, 2)) << "no checkpoint was triggered after the one whose trigger failed";
  coordinator.stop();
  EXPECT_EQ(job.aborted(), std::vector<int64_t>{1});
  const std::vector<CheckpointStats> stats = coordinator.stats();
  auto first = std::find_if(stats.begin(), stats.end(), [](const CheckpointStats& s) { return s.checkpoint_id == 1; });
  ASSERT_NE(first, stats.end()) << "checkpoint 1 is not in the history";
  EXPECT_FALSE(first->completed);
  EXPECT_NE(first->failure.find("UNAVAILABLE"), std::string::npos) << first->failure;
}

}  // namespace
}  // namespace sluice
