// Mailbox (include/sluice/runtime/mailbox.h): order, batches, has_mail(), and several producer threads against
// one consumer (run under TSan by scripts/test).
#include "sluice/runtime/mailbox.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace sluice {
namespace {

// Runs every mail of one take_all() and returns how many there were.
size_t run_batch(Mailbox& mailbox) {
  auto batch = mailbox.take_all();
  for (auto& m : batch)
    m();
  return batch.size();
}

TEST(MailboxTest, AnEmptyMailboxHasNoMailAndTakesNothing) {
  Mailbox mailbox;
  EXPECT_FALSE(mailbox.has_mail());
  EXPECT_TRUE(mailbox.take_all().empty());
  EXPECT_FALSE(mailbox.has_mail());
}

TEST(MailboxTest, MailsRunInTheOrderTheyWerePut) {
  Mailbox mailbox;
  std::vector<int> ran;
  for (int i = 0; i < 5; ++i)
    mailbox.put([&ran, i] { ran.push_back(i); });
  EXPECT_TRUE(mailbox.has_mail());
  EXPECT_EQ(run_batch(mailbox), 5u);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(mailbox.has_mail());
  EXPECT_EQ(run_batch(mailbox), 0u);
}

TEST(MailboxTest, AMailPutByARunningMailWaitsForTheNextBatch) {
  Mailbox mailbox;
  std::vector<std::string> ran;
  mailbox.put([&] {
    ran.push_back("first");
    mailbox.put([&] { ran.push_back("posted by first"); });
  });
  mailbox.put([&] { ran.push_back("second"); });
  EXPECT_EQ(run_batch(mailbox), 2u);
  EXPECT_EQ(ran, (std::vector<std::string>{"first", "second"}));
  EXPECT_TRUE(mailbox.has_mail());
  EXPECT_EQ(run_batch(mailbox), 1u);
  EXPECT_EQ(ran.back(), "posted by first");
  EXPECT_FALSE(mailbox.has_mail());
}

TEST(MailboxTest, ManyProducerThreadsLoseNoMailAndKeepEachThreadsOrder) {
  constexpr int kProducers = 4;
  constexpr int kMailsEach = 5'000;
  Mailbox mailbox;
  // Written by the consumer only (mails run on the thread that takes them).
  std::vector<std::vector<int>> seen(kProducers);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&mailbox, &seen, p] {
      for (int i = 0; i < kMailsEach; ++i)
        mailbox.put([&seen, p, i] { seen[static_cast<size_t>(p)].push_back(i); });
    });
  }
  // The consumer checks has_mail() first, as the task does between units of input.
  size_t taken = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (taken < static_cast<size_t>(kProducers * kMailsEach) && std::chrono::steady_clock::now() < deadline) {
    if (mailbox.has_mail()) {
      taken += run_batch(mailbox);
    } else {
      std::this_thread::yield();
    }
  }
  for (auto& t : producers)
    t.join();
  ASSERT_EQ(taken, static_cast<size_t>(kProducers * kMailsEach));
  EXPECT_FALSE(mailbox.has_mail());
  for (int p = 0; p < kProducers; ++p) {
    const auto& s = seen[static_cast<size_t>(p)];
    ASSERT_EQ(s.size(), static_cast<size_t>(kMailsEach)) << "producer " << p;
    for (int i = 0; i < kMailsEach; ++i)
      ASSERT_EQ(s[static_cast<size_t>(i)], i) << "producer " << p;
  }
}

}  // namespace
}  // namespace sluice
