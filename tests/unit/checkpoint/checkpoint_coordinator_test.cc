#include "sluice/checkpoint/checkpoint_coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A job of one task that never acknowledges: every checkpoint stays pending until the coordinator stops.
class SilentJob final : public CheckpointJobHooks {
 public:
  bool ready_for_checkpoint() override { return true; }
  Triggered trigger(const CheckpointBarrier& barrier) override {
    std::lock_guard lock(mu_);
    triggered_.push_back(barrier.checkpoint_id);
    cv_.notify_all();
    return Triggered{{}, {CheckpointTaskKey{0, 0}}};
  }
  void trigger_task(const CheckpointTaskKey&, const CheckpointBarrier&) override {}
  void notify_complete(int64_t) override {}
  void notify_aborted(int64_t) override {}
  void fail_job(const Error&) override {}

  bool wait_triggered(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !triggered_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> triggered_;
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

}  // namespace
}  // namespace sluice
