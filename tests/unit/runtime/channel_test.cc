// SpscRing and LocalChannel (include/sluice/runtime/channel.h): ring order and bounds, credits, wakeups, buffer
// ownership, and a producer and a consumer thread through credited channels (run under TSan by scripts/test).
#include "sluice/runtime/channel.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>

#include "sluice/runtime/input_processor.h"
#include "sluice/runtime/record_writer.h"
#include "unit/runtime/runtime_test_util.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using testing::CollectingInput;
using testing::SignalCreditWaiter;

std::vector<NetworkBuffer*> allocate(NetworkBufferPool& pool, size_t n) {
  return pool.allocate(n).value();
}

// True when `signal` was notified since its last clear(): a notified wait returns without sleeping, an
// unnotified one sleeps until the deadline.
bool was_notified(WakeupSignal& signal) {
  const auto start = std::chrono::steady_clock::now();
  signal.wait_until(start + 2s);
  return std::chrono::steady_clock::now() - start < 1s;
}

TEST(SpscRingTest, PopsInPushOrderAndRefusesWhenFull) {
  std::array<NetworkBuffer, 5> b{};
  SpscRing ring(4);
  EXPECT_EQ(ring.pop(), nullptr);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(ring.push(&b[i])) << i;
  EXPECT_FALSE(ring.push(&b[4]));  // full: the element is not taken
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(ring.pop(), &b[i]) << i;
  EXPECT_EQ(ring.pop(), nullptr);
}

TEST(SpscRingTest, CapacityIsRoundedUpToAPowerOfTwo) {
  std::array<NetworkBuffer, 5> b{};
  SpscRing ring(3);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(ring.push(&b[i])) << i;
  EXPECT_FALSE(ring.push(&b[4]));
}

TEST(SpscRingTest, KeepsOrderAcrossManyWrapArounds) {
  std::array<NetworkBuffer, 3> b{};
  SpscRing ring(2);
  for (int round = 0; round < 1000; ++round) {
    ASSERT_TRUE(ring.push(&b[round % 3]));
    if (round % 2 == 1) {
      ASSERT_EQ(ring.pop(), &b[(round - 1) % 3]);
      ASSERT_EQ(ring.pop(), &b[round % 3]);
      ASSERT_EQ(ring.pop(), nullptr);
    }
  }
}

TEST(SpscRingTest, OneProducerThreadAndOneConsumerThreadSeeEveryElementInOrder) {
  constexpr size_t kCount = 200'000;
  std::vector<NetworkBuffer> elements(kCount);
  SpscRing ring(8);
  std::thread producer([&] {
    for (size_t i = 0; i < kCount; ++i) {
      while (!ring.push(&elements[i]))
        std::this_thread::yield();
    }
  });
  size_t next = 0;
  size_t out_of_order = 0;
  while (next < kCount) {
    NetworkBuffer* b = ring.pop();
    if (b == nullptr) {
      std::this_thread::yield();
      continue;
    }
    if (b != &elements[next]) ++out_of_order;
    ++next;
  }
  producer.join();
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(ring.pop(), nullptr);
}

TEST(LocalChannelTest, TheSenderFillsOnlyTheBuffersTheReceiverGranted) {
  NetworkBufferPool pool(64, 4);
  LocalChannel channel(pool, allocate(pool, 2));
  NetworkBuffer* first = channel.try_acquire();
  NetworkBuffer* second = channel.try_acquire();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(channel.try_acquire(), nullptr);  // no credit left
  EXPECT_EQ(pool.in_flight(), 2);

  first->size = 10;
  second->size = 20;
  channel.send(first);
  channel.send(second);
  EXPECT_EQ(channel.try_acquire(), nullptr);  // sent is not recycled
  ASSERT_EQ(channel.poll(), first);           // FIFO
  EXPECT_EQ(first->size, 10u);

  channel.recycle(first);
  EXPECT_EQ(pool.in_flight(), 1);
  NetworkBuffer* again = channel.try_acquire();
  ASSERT_EQ(again, first);
  EXPECT_EQ(again->size, 0u);  // handed out empty
  EXPECT_EQ(channel.poll(), second);
  EXPECT_EQ(channel.poll(), nullptr);
  EXPECT_EQ(pool.peak_in_flight(), 2);
}

TEST(LocalChannelTest, SendWakesTheReceiverAndRecycleWakesTheSender) {
  NetworkBufferPool pool(64, 1);
  LocalChannel channel(pool, allocate(pool, 1));
  WakeupSignal receiver;
  WakeupSignal sender;
  channel.set_receiver_wakeup(&receiver);
  channel.set_sender_wakeup(&sender);

  receiver.clear();
  sender.clear();
  NetworkBuffer* b = channel.try_acquire();
  ASSERT_NE(b, nullptr);
  channel.send(b);
  EXPECT_TRUE(was_notified(receiver));

  sender.clear();
  ASSERT_EQ(channel.poll(), b);
  channel.recycle(b);
  EXPECT_TRUE(was_notified(sender));

  // With the wakeups cleared from the channel, nothing is notified (and nothing dangles).
  channel.set_receiver_wakeup(nullptr);
  channel.set_sender_wakeup(nullptr);
  receiver.clear();
  b = channel.try_acquire();
  channel.send(b);
  EXPECT_FALSE(was_notified(receiver));
}

TEST(LocalChannelTest, DestroyingTheChannelGivesEveryBufferBackToThePool) {
  NetworkBufferPool pool(64, 3);
  {
    LocalChannel channel(pool, allocate(pool, 3));
    NetworkBuffer* sent = channel.try_acquire();
    channel.send(sent);                   // one in the data ring
    (void)channel.try_acquire();          // one taken by the sender
    EXPECT_FALSE(pool.allocate(1).ok());  // the pool is at its cap
  }
  auto again = pool.allocate(3);
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ(pool.allocated(), 3u);  // the same buffers, no new ones
  pool.release(*again);
}

// Payload: u8 channel, u64 sequence number.
std::string record_payload(uint8_t channel, uint64_t seq) {
  std::string s(9, '\0');
  s[0] = static_cast<char>(channel);
  std::memcpy(s.data() + 1, &seq, 8);
  return s;
}

struct Decoded {
  uint8_t channel;
  uint64_t seq;
};
Decoded decode(const std::string& s) {
  Decoded d{static_cast<uint8_t>(s[0]), 0};
  std::memcpy(&d.seq, s.data() + 1, 8);
  return d;
}

// The data path of two tasks without tasks: a RecordWriter on a producer thread and a StreamInputProcessor on a
// consumer thread, through two LocalChannels of two credits each. The consumer starts only once the producer is
// blocked on credit, so backpressure is seen, not assumed; then every record arrives once and in order per
// channel, and no more buffers than the credits are ever in flight.
TEST(LocalChannelTest, ProducerAndConsumerThreadsThroughCreditedChannels) {
  constexpr int kChannels = 2;
  constexpr size_t kCredits = 2;
  constexpr uint64_t kRecordsPerChannel = 20'000;
  NetworkBufferPool pool(256, kChannels * kCredits);
  std::vector<std::unique_ptr<LocalChannel>> channels;
  std::vector<ChannelSender*> senders;
  std::vector<ChannelReceiver*> receivers;
  WakeupSignal producer_wakeup;
  WakeupSignal consumer_wakeup;
  for (int c = 0; c < kChannels; ++c) {
    channels.push_back(std::make_unique<LocalChannel>(pool, allocate(pool, kCredits)));
    channels.back()->set_sender_wakeup(&producer_wakeup);
    channels.back()->set_receiver_wakeup(&consumer_wakeup);
    senders.push_back(channels.back().get());
    receivers.push_back(channels.back().get());
  }
  SignalCreditWaiter waiter(producer_wakeup);

  std::thread producer([&] {
    RecordWriter writer(senders, waiter);
    for (uint64_t i = 0; i < kRecordsPerChannel; ++i) {
      for (int c = 0; c < kChannels; ++c) {
        std::string p = record_payload(static_cast<uint8_t>(c), i);
        writer.write_record(c, testing::bytes_of(p), static_cast<TimestampMs>(i));
      }
      if (i % 1000 == 999) writer.broadcast_watermark(static_cast<TimestampMs>(i));
    }
    writer.finish();
  });

  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (waiter.waits.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_GT(waiter.waits.load(), 0) << "the producer never waited for credit";
  EXPECT_EQ(pool.in_flight(), static_cast<int64_t>(kChannels * kCredits));

  CollectingInput input;
  std::array<uint64_t, kChannels> next{};
  size_t wrong = 0;
  {
    StreamInputProcessor processor(receivers, input);
    for (;;) {
      consumer_wakeup.clear();
      const auto status = processor.process_next();
      if (status == StreamInputProcessor::Status::kNothingAvailable) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the consumer starved";
        consumer_wakeup.wait_until(std::chrono::steady_clock::now() + 100ms);
        continue;
      }
      for (const auto& r : input.records) {
        Decoded d = decode(r.bytes);
        if (d.channel >= kChannels || d.seq != next[d.channel] || r.timestamp != static_cast<TimestampMs>(d.seq)) {
          ++wrong;
        } else {
          ++next[d.channel];
        }
      }
      input.records.clear();
      if (status == StreamInputProcessor::Status::kEndOfInput) break;
    }
  }
  producer.join();
  EXPECT_EQ(wrong, 0u);
  for (int c = 0; c < kChannels; ++c)
    EXPECT_EQ(next[c], kRecordsPerChannel) << "channel " << c;
  EXPECT_LE(pool.peak_in_flight(), static_cast<int64_t>(kChannels * kCredits));
  EXPECT_EQ(pool.in_flight(), 0);
  ASSERT_FALSE(input.watermarks.empty());
  EXPECT_EQ(input.watermarks.back(), static_cast<TimestampMs>(kRecordsPerChannel - 1));
}

}  // namespace
}  // namespace sluice
