// StreamInputProcessor (include/sluice/runtime/input_processor.h): records and their timestamps, round robin
// over channels, records spanning buffers, the watermark valve (minimum, finished and idle channels), barrier
// alignment over one or several inputs (a buffer held at a blocking barrier), end of input, corrupt buffers, and
// credit returned whatever happens.
#include "sluice/runtime/input_processor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "sluice/runtime/record_writer.h"
#include "sluice/runtime/stream_element.h"
#include "unit/runtime/runtime_test_util.h"

namespace sluice {
namespace {

using testing::bytes_of;
using testing::CollectingInput;
using Status = StreamInputProcessor::Status;

// Single-threaded tests give every channel enough credit: a writer that had to wait would wait forever.
class NeverWaits final : public CreditWaiter {
 public:
  void prepare_wait_for_credit() override {}
  void wait_for_credit() override { throw std::logic_error("test channel out of credit"); }
};

// `n` LocalChannels with a RecordWriter each (so a test writes a watermark or a barrier on one channel).
struct Channels {
  Channels(size_t n, uint32_t segment_size = 256, size_t credits = 8) : pool(segment_size, n * credits) {
    for (size_t c = 0; c < n; ++c) {
      local.push_back(std::make_unique<LocalChannel>(pool, pool.allocate(credits).value()));
      receivers.push_back(local.back().get());
      writers.push_back(std::make_unique<RecordWriter>(std::vector<ChannelSender*>{local.back().get()}, waiter));
    }
  }
  RecordWriter& operator[](size_t c) { return *writers[c]; }
  void record(size_t c, const std::string& payload, TimestampMs ts = kNoTimestamp) {
    writers[c]->write_record(0, bytes_of(payload), ts);
  }
  void flush() {
    for (auto& w : writers)
      w->flush_all();
  }
  // Sends a buffer with exactly these bytes on channel `c` (for element layouts the writer never produces).
  void raw(size_t c, const std::vector<uint8_t>& bytes) {
    NetworkBuffer* b = local[c]->try_acquire();
    ASSERT_NE(b, nullptr);
    ASSERT_LE(bytes.size(), b->capacity);
    std::memcpy(b->data, bytes.data(), bytes.size());
    b->size = static_cast<uint32_t>(bytes.size());
    local[c]->send(b);
  }

  NeverWaits waiter;
  NetworkBufferPool pool;
  std::vector<std::unique_ptr<LocalChannel>> local;
  std::vector<ChannelReceiver*> receivers;
  std::vector<std::unique_ptr<RecordWriter>> writers;
};

// Element encoders after runtime/stream_element.h, independent of RecordWriter.
void put_record(std::vector<uint8_t>& out, const std::string& payload) {
  out.push_back(static_cast<uint8_t>(ElementTag::kRecord));
  uint32_t len = static_cast<uint32_t>(payload.size());
  const auto* l = reinterpret_cast<const uint8_t*>(&len);
  out.insert(out.end(), l, l + 4);
  out.insert(out.end(), payload.begin(), payload.end());
}
void put_barrier(std::vector<uint8_t>& out, int64_t id, CheckpointingMode mode = CheckpointingMode::kExactlyOnce) {
  out.push_back(static_cast<uint8_t>(ElementTag::kBarrier));
  const int64_t ts = 77;
  const auto* i = reinterpret_cast<const uint8_t*>(&id);
  const auto* t = reinterpret_cast<const uint8_t*>(&ts);
  out.insert(out.end(), i, i + 8);
  out.insert(out.end(), t, t + 8);
  out.push_back(static_cast<uint8_t>(SnapshotType::kCheckpoint));
  out.push_back(static_cast<uint8_t>(mode));
}

// Runs process_next() until nothing is available or the input ended.
Status drain(StreamInputProcessor& p) {
  for (;;) {
    Status s = p.process_next();
    if (s != Status::kProcessed) return s;
  }
}

TEST(InputProcessorTest, RecordsArriveWithTheirTimestampsInChannelOrder) {
  Channels ch(2);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  EXPECT_EQ(p.num_channels(), 2u);
  EXPECT_EQ(p.process_next(), Status::kNothingAvailable);

  ch.record(0, "a1", 100);
  ch.record(0, "a2");
  ch.record(1, "b1", -5);
  ch.flush();
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  ASSERT_EQ(input.records.size(), 3u);
  EXPECT_EQ(input.payloads(), (std::vector<std::string>{"a1", "a2", "b1"}));
  EXPECT_EQ(input.records[0].timestamp, 100);
  EXPECT_EQ(input.records[1].timestamp, kNoTimestamp);
  EXPECT_EQ(input.records[2].timestamp, -5);
  EXPECT_EQ(ch.pool.in_flight(), 0);  // every buffer went back as credit
}

TEST(InputProcessorTest, EachCallProcessesOneBufferRoundRobinOverTheChannels) {
  Channels ch(2);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  ch.record(0, "a1");
  ch.record(1, "b1");
  ch.flush();
  ch.record(0, "a2");
  ch.record(1, "b2");
  ch.flush();
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(p.process_next(), Status::kProcessed) << i;
  EXPECT_EQ(input.payloads(), (std::vector<std::string>{"a1", "b1", "a2", "b2"}));
  EXPECT_EQ(p.process_next(), Status::kNothingAvailable);
}

TEST(InputProcessorTest, ARecordSpanningBuffersIsReassembled) {
  Channels ch(1, /*segment_size=*/64, /*credits=*/40);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  std::string big(1000, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>(i * 7 + 3);
  ch.record(0, "before", 1);
  ch.record(0, big, 2);
  ch.record(0, "after", 3);
  ch.flush();
  EXPECT_GT(ch[0].buffers_sent(), 1000u / 64);
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  ASSERT_EQ(input.records.size(), 3u);
  EXPECT_EQ(input.records[0].bytes, "before");
  EXPECT_EQ(input.records[1].bytes, big);
  EXPECT_EQ(input.records[1].timestamp, 2);
  EXPECT_EQ(input.records[2].bytes, "after");
  EXPECT_EQ(ch.pool.in_flight(), 0);
}

TEST(InputProcessorTest, TheWatermarkIsTheMinimumOverTheChannelsThatHaveNotFinished) {
  Channels ch(2);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  ch[0].broadcast_watermark(10);
  ch.flush();
  drain(p);
  EXPECT_TRUE(input.watermarks.empty());  // channel 1 has no watermark yet
  ch[1].broadcast_watermark(5);
  ch.flush();
  drain(p);
  ch[1].broadcast_watermark(20);
  ch[1].broadcast_watermark(15);  // a watermark never goes back
  ch.flush();
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{5, 10}));
  ch[0].finish();  // a finished channel no longer holds the watermark back
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{5, 10, 20}));
}

TEST(InputProcessorTest, IdleChannelsDoNotHoldTheWatermarkAndAWakingChannelCannotMoveItBack) {
  Channels ch(2);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  ch[0].broadcast_watermark(10);
  ch[1].broadcast_watermark_status(true);
  ch.flush();
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{10}));
  EXPECT_TRUE(input.idleness.empty());  // channel 0 is active: the input is not idle

  ch[0].broadcast_watermark_status(true);
  ch.flush();
  drain(p);
  EXPECT_EQ(input.idleness, std::vector<bool>{true});  // every channel idle

  // Channel 1 wakes behind the combined watermark: it rejoins only once it has caught up.
  ch[1].broadcast_watermark(7);
  ch.flush();
  drain(p);
  EXPECT_EQ(input.idleness, (std::vector<bool>{true, false}));
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{10}));
  ch[0].broadcast_watermark(30);  // wakes channel 0
  ch.flush();
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{10, 30}));
  ch[1].broadcast_watermark(12);  // still behind the combined watermark (30): not counted
  ch.flush();
  drain(p);
  ch[0].broadcast_watermark(40);
  ch.flush();
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{10, 30, 40}));
  ch[1].broadcast_watermark(41);  // caught up: it holds the watermark from now on
  ch.flush();
  drain(p);
  ch[0].broadcast_watermark(60);
  ch.flush();
  drain(p);
  EXPECT_EQ(input.watermarks, (std::vector<TimestampMs>{10, 30, 40, 41}));
}

TEST(InputProcessorTest, EndOfInputOnceEveryChannelFinished) {
  Channels ch(2);
  CollectingInput input;
  CheckpointBarrierHandler barriers(2, [](const CheckpointBarrier&, int64_t) {});
  StreamInputProcessor p(ch.receivers, input, &barriers);
  ch.record(0, "last of 0");
  ch[0].finish();
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  EXPECT_FALSE(p.finished());
  ch[1].finish();
  EXPECT_EQ(drain(p), Status::kEndOfInput);
  EXPECT_TRUE(p.finished());
  EXPECT_EQ(p.process_next(), Status::kEndOfInput);
  EXPECT_EQ(input.payloads(), std::vector<std::string>{"last of 0"});
  EXPECT_EQ(ch.pool.in_flight(), 0);
}

// Exactly-once: the elements behind barrier n on a channel wait, in the buffer that carried the barrier, until
// every channel delivered barrier n; the snapshot sees exactly the records before the barriers.
TEST(InputProcessorTest, ABarrierBlocksItsChannelMidBufferUntilEveryChannelDeliveredIt) {
  Channels ch(2);
  CollectingInput input;
  std::vector<size_t> records_at_snapshot;
  CheckpointBarrierHandler barriers(2, [&](const CheckpointBarrier& b, int64_t) {
    EXPECT_EQ(b.checkpoint_id, 1);
    EXPECT_EQ(b.timestamp, 77);
    records_at_snapshot.push_back(input.records.size());
  });
  StreamInputProcessor p(ch.receivers, input, &barriers);

  std::vector<uint8_t> zero;
  put_record(zero, "a1");
  put_barrier(zero, 1);
  put_record(zero, "a2");
  ch.raw(0, zero);
  std::vector<uint8_t> one;
  put_record(one, "b1");
  ch.raw(1, one);
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  EXPECT_EQ(input.payloads(), (std::vector<std::string>{"a1", "b1"}));  // a2 waits behind the barrier
  EXPECT_TRUE(barriers.is_blocked(0));
  EXPECT_EQ(ch.pool.in_flight(), 1);  // the held buffer

  ch.record(0, "a3");  // more on the blocked channel: not read either
  ch.flush();
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  EXPECT_EQ(input.records.size(), 2u);

  std::vector<uint8_t> one_more;
  put_barrier(one_more, 1);
  put_record(one_more, "b2");
  ch.raw(1, one_more);
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  EXPECT_EQ(records_at_snapshot, std::vector<size_t>{2});
  ASSERT_EQ(input.records.size(), 5u);
  const std::vector<std::string> all = input.payloads();
  std::vector<std::string> after(all.begin() + 2, all.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, (std::vector<std::string>{"a2", "a3", "b2"}));
  EXPECT_EQ(ch.pool.in_flight(), 0);
}

TEST(InputProcessorTest, AtLeastOnceBarriersBlockNothing) {
  Channels ch(2);
  CollectingInput input;
  std::vector<size_t> records_at_snapshot;
  CheckpointBarrierHandler barriers(
      2, [&](const CheckpointBarrier&, int64_t) { records_at_snapshot.push_back(input.records.size()); });
  StreamInputProcessor p(ch.receivers, input, &barriers);
  std::vector<uint8_t> zero;
  put_barrier(zero, 1, CheckpointingMode::kAtLeastOnce);
  put_record(zero, "a1");
  ch.raw(0, zero);
  EXPECT_EQ(drain(p), Status::kNothingAvailable);
  EXPECT_EQ(input.payloads(), std::vector<std::string>{"a1"});
  EXPECT_TRUE(records_at_snapshot.empty());
  std::vector<uint8_t> one;
  put_barrier(one, 1, CheckpointingMode::kAtLeastOnce);
  ch.raw(1, one);
  drain(p);
  EXPECT_EQ(records_at_snapshot, std::vector<size_t>{1});
}

// A two-input task: both inputs' processors report to one handler, input 1's channel numbered after input 0's.
TEST(InputProcessorTest, TwoInputsAlignOnOneHandler) {
  Channels left(2);
  Channels right(1);
  CollectingInput left_input;
  CollectingInput right_input;
  int aligned = 0;
  CheckpointBarrierHandler barriers(3, [&](const CheckpointBarrier&, int64_t) { ++aligned; });
  StreamInputProcessor l(left.receivers, left_input, &barriers, 0);
  StreamInputProcessor r(right.receivers, right_input);
  r.set_barrier_handler(&barriers, 2);

  CheckpointBarrier b;
  b.checkpoint_id = 1;
  right[0].broadcast_barrier(b);
  right.record(0, "r1");
  right.flush();
  drain(r);
  EXPECT_TRUE(barriers.is_blocked(2));
  EXPECT_FALSE(barriers.is_blocked(0));
  EXPECT_TRUE(right_input.records.empty());

  left[0].broadcast_barrier(b);
  left.record(1, "l1");
  left.flush();
  drain(l);
  EXPECT_EQ(left_input.payloads(), std::vector<std::string>{"l1"});  // channel 1 has no barrier yet
  EXPECT_EQ(aligned, 0);
  left[1].broadcast_barrier(b);
  drain(l);
  EXPECT_EQ(aligned, 1);
  EXPECT_FALSE(barriers.is_blocked(2));
  drain(r);
  EXPECT_EQ(right_input.payloads(), std::vector<std::string>{"r1"});
}

TEST(InputProcessorTest, ACorruptBufferFailsWithANetworkErrorNamingTheChannel) {
  Channels ch(2);
  CollectingInput input;
  StreamInputProcessor p(ch.receivers, input);
  ch.raw(1, {0x7f, 1, 2});
  try {
    drain(p);
    FAIL() << "a corrupt buffer was accepted";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kNetwork);
    EXPECT_NE(e.error().message().find("input channel 1"), std::string::npos) << e.what();
    EXPECT_NE(e.error().message().find("unknown element tag 127"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ch.pool.in_flight(), 0);  // the bad buffer still went back as credit

  ch.raw(0, {static_cast<uint8_t>(ElementTag::kRecordWithTimestamp), 4, 0, 0});
  try {
    drain(p);
    FAIL() << "a truncated record header was accepted";
  } catch (const SluiceException& e) {
    EXPECT_NE(e.error().message().find("truncated record header"), std::string::npos) << e.what();
  }
}

// A user function that throws mid-buffer must not leave the sender without credit.
TEST(InputProcessorTest, TheBufferGoesBackAsCreditWhenTheInputThrows) {
  class Throwing final : public RecordInput {
   public:
    void process_record(DataInput& in, TimestampMs) override {
      in.skip(in.remaining());
      throw std::runtime_error("user function failed");
    }
    void process_watermark(TimestampMs) override {}
    void process_watermark_status(bool) override {}
  } input;
  Channels ch(1, 256, /*credits=*/1);
  StreamInputProcessor p(ch.receivers, input);
  ch.record(0, "x");
  ch.record(0, "y");
  ch.flush();
  EXPECT_EQ(ch.pool.in_flight(), 1);
  EXPECT_THROW(p.process_next(), std::runtime_error);
  EXPECT_EQ(ch.pool.in_flight(), 0);
  EXPECT_NE(ch.local[0]->try_acquire(), nullptr);
}

TEST(InputProcessorTest, DestroyingTheProcessorReturnsABufferHeldAtABarrier) {
  Channels ch(2);
  CollectingInput input;
  CheckpointBarrierHandler barriers(2, [](const CheckpointBarrier&, int64_t) {});
  {
    StreamInputProcessor p(ch.receivers, input, &barriers);
    std::vector<uint8_t> zero;
    put_barrier(zero, 1);
    put_record(zero, "after");
    ch.raw(0, zero);
    drain(p);
    EXPECT_EQ(ch.pool.in_flight(), 1);
  }
  EXPECT_EQ(ch.pool.in_flight(), 0);
}

}  // namespace
}  // namespace sluice
