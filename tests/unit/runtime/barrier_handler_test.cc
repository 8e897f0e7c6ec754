// CheckpointBarrierHandler (include/sluice/runtime/barrier_handler.h): aligned (exactly-once) and unaligned
// (at-least-once) barriers over several channels, superseded and aborted checkpoints, stale barriers, and
// channels that reach end of input before or during an alignment.
#include "sluice/runtime/barrier_handler.h"

#include <gtest/gtest.h>

#include <vector>

namespace sluice {
namespace {

CheckpointBarrier barrier(int64_t id, CheckpointingMode mode = CheckpointingMode::kExactlyOnce) {
  CheckpointBarrier b;
  b.checkpoint_id = id;
  b.timestamp = 1000 * id;
  b.mode = mode;
  return b;
}

// Records each alignment, and which channels were still blocked while its callback ran.
struct Aligned {
  explicit Aligned(size_t n) : channels(n) {}
  std::vector<CheckpointBarrier> barriers;
  std::vector<int64_t> alignment_ns;
  std::vector<bool> any_blocked_in_callback;
  CheckpointBarrierHandler* handler = nullptr;
  size_t channels = 0;

  CheckpointBarrierHandler::AlignedCallback callback() {
    return [this](const CheckpointBarrier& b, int64_t ns) {
      barriers.push_back(b);
      alignment_ns.push_back(ns);
      bool any = false;
      for (size_t c = 0; c < channels; ++c)
        any = any || handler->is_blocked(c);
      any_blocked_in_callback.push_back(any);
    };
  }
  std::vector<int64_t> ids() const {
    std::vector<int64_t> out;
    for (const auto& b : barriers)
      out.push_back(b.checkpoint_id);
    return out;
  }
};

struct Fixture {
  explicit Fixture(size_t n) : aligned(n), handler(n, aligned.callback()) { aligned.handler = &handler; }
  Aligned aligned;
  CheckpointBarrierHandler handler;
};

TEST(BarrierHandlerTest, OneChannelAlignsAtOnce) {
  Fixture f(1);
  f.handler.on_barrier(0, barrier(1));
  ASSERT_EQ(f.aligned.ids(), std::vector<int64_t>{1});
  EXPECT_EQ(f.aligned.barriers[0].timestamp, 1000);
  EXPECT_GE(f.aligned.alignment_ns[0], 0);
  EXPECT_FALSE(f.handler.is_blocked(0));
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
}

TEST(BarrierHandlerTest, ExactlyOnceBlocksEachChannelUntilEveryChannelDeliveredTheBarrier) {
  Fixture f(3);
  f.handler.on_barrier(0, barrier(7));
  EXPECT_TRUE(f.aligned.barriers.empty());
  EXPECT_EQ(f.handler.pending_checkpoint(), 7);
  EXPECT_TRUE(f.handler.is_blocked(0));
  EXPECT_FALSE(f.handler.is_blocked(1));
  EXPECT_FALSE(f.handler.is_blocked(2));

  f.handler.on_barrier(2, barrier(7));
  EXPECT_TRUE(f.aligned.barriers.empty());
  EXPECT_TRUE(f.handler.is_blocked(2));
  EXPECT_FALSE(f.handler.is_blocked(1));

  f.handler.on_barrier(1, barrier(7));
  ASSERT_EQ(f.aligned.ids(), std::vector<int64_t>{7});
  // The channels are unblocked before the callback runs (the snapshot forwards the barrier; what waited
  // belongs to the next checkpoint).
  EXPECT_FALSE(f.aligned.any_blocked_in_callback[0]);
  for (size_t c = 0; c < 3; ++c)
    EXPECT_FALSE(f.handler.is_blocked(c)) << c;
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);

  // The next checkpoint aligns the same way.
  f.handler.on_barrier(1, barrier(8));
  f.handler.on_barrier(0, barrier(8));
  f.handler.on_barrier(2, barrier(8));
  EXPECT_EQ(f.aligned.ids(), (std::vector<int64_t>{7, 8}));
}

TEST(BarrierHandlerTest, AtLeastOnceNeverBlocksAndCompletesOnTheLastBarrier) {
  Fixture f(2);
  f.handler.on_barrier(1, barrier(3, CheckpointingMode::kAtLeastOnce));
  EXPECT_FALSE(f.handler.is_blocked(1));
  EXPECT_FALSE(f.handler.is_blocked(0));
  EXPECT_EQ(f.handler.pending_checkpoint(), 3);
  EXPECT_TRUE(f.aligned.barriers.empty());
  f.handler.on_barrier(0, barrier(3, CheckpointingMode::kAtLeastOnce));
  ASSERT_EQ(f.aligned.ids(), std::vector<int64_t>{3});
  EXPECT_EQ(f.aligned.barriers[0].mode, CheckpointingMode::kAtLeastOnce);
}

TEST(BarrierHandlerTest, ABarrierOfACompletedCheckpointOrAnOlderOneIsIgnored) {
  Fixture f(1);
  f.handler.on_barrier(0, barrier(5));
  f.handler.on_barrier(0, barrier(5));  // again
  f.handler.on_barrier(0, barrier(4));  // older
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{5});
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
  EXPECT_FALSE(f.handler.is_blocked(0));
}

TEST(BarrierHandlerTest, ANewerBarrierAbandonsTheAlignmentInProgress) {
  Fixture f(2);
  f.handler.on_barrier(0, barrier(1));
  EXPECT_TRUE(f.handler.is_blocked(0));
  // Checkpoint 1 was aborted upstream: channel 1 never delivers barrier 1 and delivers 2 instead.
  f.handler.on_barrier(1, barrier(2));
  EXPECT_EQ(f.handler.pending_checkpoint(), 2);
  EXPECT_FALSE(f.handler.is_blocked(0));  // released: it has not delivered barrier 2 yet
  EXPECT_TRUE(f.handler.is_blocked(1));
  EXPECT_TRUE(f.aligned.barriers.empty());

  f.handler.on_barrier(0, barrier(2));
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{2});
  // A late barrier 1 starts nothing.
  f.handler.on_barrier(1, barrier(1));
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
  EXPECT_FALSE(f.handler.is_blocked(1));
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{2});
}

TEST(BarrierHandlerTest, AbortUnblocksEveryChannelAndTheAbortedCheckpointsLateBarriersAreIgnored) {
  Fixture f(3);
  f.handler.on_barrier(0, barrier(4));
  f.handler.on_barrier(1, barrier(4));
  f.handler.abort(3);  // not the one in progress: no effect
  EXPECT_EQ(f.handler.pending_checkpoint(), 4);
  EXPECT_TRUE(f.handler.is_blocked(0));

  f.handler.abort(4);
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
  for (size_t c = 0; c < 3; ++c)
    EXPECT_FALSE(f.handler.is_blocked(c)) << c;
  f.handler.on_barrier(2, barrier(4));  // the aborted checkpoint's last barrier
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
  EXPECT_FALSE(f.handler.is_blocked(2));
  EXPECT_TRUE(f.aligned.barriers.empty());

  // The next checkpoint needs every channel again.
  f.handler.on_barrier(0, barrier(5));
  f.handler.on_barrier(1, barrier(5));
  EXPECT_TRUE(f.aligned.barriers.empty());
  f.handler.on_barrier(2, barrier(5));
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{5});
}

TEST(BarrierHandlerTest, AFinishedChannelCountsAsHavingDeliveredEveryBarrier) {
  Fixture f(2);
  f.handler.on_channel_finished(1);
  f.handler.on_barrier(0, barrier(1));
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{1});
  f.handler.on_barrier(0, barrier(2));
  EXPECT_EQ(f.aligned.ids(), (std::vector<int64_t>{1, 2}));
}

TEST(BarrierHandlerTest, AChannelFinishingDuringAnAlignmentCompletesIt) {
  Fixture f(3);
  f.handler.on_barrier(0, barrier(9));
  f.handler.on_barrier(1, barrier(9));
  EXPECT_TRUE(f.aligned.barriers.empty());
  f.handler.on_channel_finished(2);  // its producer finished before it saw the checkpoint
  ASSERT_EQ(f.aligned.ids(), std::vector<int64_t>{9});
  EXPECT_FALSE(f.aligned.any_blocked_in_callback[0]);
  EXPECT_FALSE(f.handler.is_blocked(0));
  EXPECT_FALSE(f.handler.is_blocked(1));
}

TEST(BarrierHandlerTest, AFinishedChannelIsNeverBlocked) {
  Fixture f(2);
  f.handler.on_barrier(0, barrier(1));
  EXPECT_TRUE(f.handler.is_blocked(0));
  f.handler.on_channel_finished(0);  // barrier, then end of partition on the same channel
  EXPECT_FALSE(f.handler.is_blocked(0));
  EXPECT_TRUE(f.aligned.barriers.empty());  // channel 1 has not delivered barrier 1
  f.handler.on_barrier(1, barrier(1));
  EXPECT_EQ(f.aligned.ids(), std::vector<int64_t>{1});
}

TEST(BarrierHandlerTest, NoAlignmentWhenEveryChannelFinishedWithoutACheckpointPending) {
  Fixture f(2);
  f.handler.on_channel_finished(0);
  f.handler.on_channel_finished(1);
  EXPECT_TRUE(f.aligned.barriers.empty());
  EXPECT_EQ(f.handler.pending_checkpoint(), -1);
}

}  // namespace
}  // namespace sluice
