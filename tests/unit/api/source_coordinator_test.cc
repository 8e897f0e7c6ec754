// SourceCoordinator's periodic enumerator work: call_async runs its work without the coordinator's lock, so a
// slow discovery (a broker that does not answer) does not hold up checkpoints, and its handler runs under the
// lock only while the coordinator is open.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/operators/source_operator.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

struct IntSplit {
  int64_t value = 0;
};
SLUICE_FIELDS(IntSplit, value);

/// What the test and the enumerator's periodic work share: the work blocks on `release` once it has said it
/// started; the handler counts its runs.
struct Probe {
  std::promise<void> started;
  std::shared_future<void> release;
  std::atomic<int> work_runs{0};
  std::atomic<int> handler_runs{0};
  std::atomic<int> handler_runs_after_close{0};
  std::atomic<bool> closed{false};
};

class AsyncEnumerator final : public SplitEnumerator<IntSplit> {
 public:
  AsyncEnumerator(SplitEnumeratorContext<IntSplit>& ctx, std::shared_ptr<Probe> probe)
      : ctx_(ctx), probe_(std::move(probe)) {}
  void start() override {
    ctx_.call_async(
        [probe = probe_]() -> std::function<void()> {
          if (probe->work_runs.fetch_add(1) == 0) {
            probe->started.set_value();
            probe->release.wait();
          }
          return [probe] {
            probe->handler_runs.fetch_add(1);
            if (probe->closed.load()) probe->handler_runs_after_close.fetch_add(1);
          };
        },
        /*period_ms=*/1);
  }
  void handle_split_request(int) override {}
  void add_splits_back(std::vector<IntSplit>, int) override {}
  std::vector<IntSplit> snapshot_state(int64_t) override { return {IntSplit{42}}; }
  void restore_state(std::vector<IntSplit>) override {}
  /// The coordinator calls this under its lock once it has marked itself closed.
  void close() override { probe_->closed.store(true); }

 private:
  SplitEnumeratorContext<IntSplit>& ctx_;
  std::shared_ptr<Probe> probe_;
};

class AsyncSource final : public Source<int64_t, IntSplit> {
 public:
  explicit AsyncSource(std::shared_ptr<Probe> probe) : probe_(std::move(probe)) {}
  Boundedness boundedness() const override { return Boundedness::kContinuousUnbounded; }
  std::unique_ptr<SplitEnumerator<IntSplit>> create_enumerator(SplitEnumeratorContext<IntSplit>& ctx) const override {
    return std::make_unique<AsyncEnumerator>(ctx, probe_);
  }
  std::unique_ptr<SourceReader<int64_t, IntSplit>> create_reader(SourceReaderContext&) const override {
    return nullptr;  // the coordinator alone is under test
  }

 private:
  std::shared_ptr<Probe> probe_;
};

TEST(SourceCoordinatorTest, CheckpointCompletesWhileAsyncWorkBlocks) {
  auto probe = std::make_shared<Probe>();
  std::promise<void> release;
  probe->release = release.get_future().share();
  std::future<void> started = probe->started.get_future();
  AsyncSource source(probe);
  SourceCoordinator<int64_t, IntSplit> coordinator(source, /*parallelism=*/1, /*restored=*/nullptr);

  ASSERT_EQ(started.wait_for(30s), std::future_status::ready) << "the periodic work never ran";
  // The work is blocked now. A checkpoint takes the coordinator's lock: it must not wait for the work.
  auto checkpoint = std::async(std::launch::async, [&] {
    bool injected = false;
    std::string state = coordinator.checkpoint(1, [&] { injected = true; });
    return injected && !state.empty();
  });
  const bool completed = checkpoint.wait_for(30s) == std::future_status::ready;
  release.set_value();  // unblock before asserting, so a failure does not hang the test
  ASSERT_TRUE(completed) << "the checkpoint waited for the enumerator's off-lock work";
  EXPECT_TRUE(checkpoint.get());

  // The handler of the released round runs under the lock, then the schedule goes on.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (probe->handler_runs.load() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_GE(probe->handler_runs.load(), 2);
  EXPECT_GE(probe->work_runs.load(), 2);

  coordinator.close();
  EXPECT_EQ(probe->handler_runs_after_close.load(), 0);
}

TEST(SourceCoordinatorTest, CloseWhileAsyncWorkBlocksSkipsItsHandler) {
  auto probe = std::make_shared<Probe>();
  std::promise<void> release;
  probe->release = release.get_future().share();
  std::future<void> started = probe->started.get_future();
  AsyncSource source(probe);
  auto coordinator = std::make_unique<SourceCoordinator<int64_t, IntSplit>>(source, 1, nullptr);
  ASSERT_EQ(started.wait_for(30s), std::future_status::ready);

  // close() joins the worker, which is inside the work: release the work once close() has marked the
  // coordinator closed (the enumerator's close() says so), then close() can return.
  auto closer = std::async(std::launch::async, [&] { coordinator->close(); });
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!probe->closed.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_TRUE(probe->closed.load()) << "close() did not reach the enumerator";
  EXPECT_EQ(closer.wait_for(0ms), std::future_status::timeout) << "close() returned while the work still ran";
  release.set_value();
  ASSERT_EQ(closer.wait_for(30s), std::future_status::ready);
  closer.get();
  EXPECT_EQ(probe->handler_runs.load(), 0) << "the handler of work that finished after close() ran";
}

}  // namespace
}  // namespace sluice
