#include "sluice/state/timer_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Fired = std::tuple<std::string, int64_t, TimestampMs>;  // key, namespace, timestamp

// A fresh RocksDB database in the temp directory (removed when the instance goes).
std::shared_ptr<RocksDBInstance> open_temp_database() {
  static std::atomic<int> counter{0};
  return RocksDBInstance::open(std::filesystem::temp_directory_path() /
                               ("sluice-timer-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)));
}

// Each test runs with the timers on the heap and in RocksDB (state.backend.rocksdb.timer-service.factory).
class TimerServiceTest : public ::testing::TestWithParam<std::string> {
 protected:
  TimerServiceTest() {
    if (in_rocksdb()) {
      db_ = open_temp_database();
      timers_.use_rocksdb(*db_);
    }
  }
  bool in_rocksdb() const { return GetParam() == "rocksdb"; }

  // A second service, in RocksDB (its own database) or on the heap.
  struct Service {
    std::shared_ptr<RocksDBInstance> db;
    std::unique_ptr<InternalTimerService<std::string, int64_t>> timers;
  };
  static Service make_service(HeapKeyedStateBackend<std::string>& backend, bool rocksdb) {
    Service s;
    s.timers = std::make_unique<InternalTimerService<std::string, int64_t>>(backend);
    if (rocksdb) {
      s.db = open_temp_database();
      s.timers->use_rocksdb(*s.db);
    }
    return s;
  }

  // Records each firing and checks that the backend's current key is the timer's key.
  auto recorder() {
    return [this](const std::string& key, const int64_t& ns, TimestampMs ts) {
      EXPECT_EQ(backend_.current_key(), key);
      fired_.emplace_back(key, ns, ts);
    };
  }

  ManualClock clock_{0};
  HeapKeyedStateBackend<std::string> backend_{KeyGroupRange(0, 127), 128, clock_};
  std::shared_ptr<RocksDBInstance> db_;  // with RocksDB timers; outlives timers_
  InternalTimerService<std::string, int64_t> timers_{backend_};
  std::vector<Fired> fired_;
};

TEST_P(TimerServiceTest, FiresInTimestampOrderWithTheKeySet) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 30);
  timers_.register_event_time_timer(0, 10);
  backend_.set_current_key("b");
  timers_.register_event_time_timer(0, 20);
  timers_.register_event_time_timer(0, 10);  // same time, other key: a separate timer, after a's (ties by
                                             // insertion on the heap, by key bytes in RocksDB: a < b either way)
  EXPECT_EQ(timers_.current_watermark(), (InternalTimerService<std::string, int64_t>::kInitialWatermark));
  EXPECT_EQ(timers_.next_event_time(), 10);

  timers_.advance_watermark(20, recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 10}, Fired{"b", 0, 10}, Fired{"b", 0, 20}));
  EXPECT_EQ(timers_.current_watermark(), 20);
  EXPECT_EQ(timers_.num_event_time_timers(), 1u);
  fired_.clear();
  timers_.advance_watermark(100, recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 30}));
}

TEST_P(TimerServiceTest, DeduplicatesByKeyNamespaceAndTimestamp) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(1, 10);
  timers_.register_event_time_timer(1, 10);
  timers_.register_event_time_timer(2, 10);  // other namespace
  backend_.set_current_key("b");
  timers_.register_event_time_timer(1, 10);  // other key
  EXPECT_EQ(timers_.num_event_time_timers(), 3u);
  timers_.advance_watermark(10, recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 1, 10}, Fired{"a", 2, 10}, Fired{"b", 1, 10}));
}

TEST_P(TimerServiceTest, FiresOnlyOnce) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 5);
  timers_.advance_watermark(5, recorder());
  timers_.advance_watermark(6, recorder());
  timers_.advance_watermark(100, recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 5}));
  EXPECT_EQ(timers_.num_event_time_timers(), 0u);
}

TEST_P(TimerServiceTest, TimersRegisteredWhileFiringFireInTheSameAdvanceWhenDue) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 10);
  timers_.advance_watermark(20, [&](const std::string& key, const int64_t& ns, TimestampMs ts) {
    fired_.emplace_back(key, ns, ts);
    if (ts == 10) {
      timers_.register_event_time_timer(0, 15);  // due: fires now
      timers_.register_event_time_timer(0, 25);  // not due
      backend_.set_current_key("b");             // timers belong to the key that is current
      timers_.register_event_time_timer(0, 12);
    }
  });
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 10}, Fired{"b", 0, 12}, Fired{"a", 0, 15}));
  EXPECT_EQ(timers_.next_event_time(), 25);
}

TEST_P(TimerServiceTest, ReRegisteringTheFiringTimerCreatesANewOne) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 10);
  timers_.advance_watermark(10, [&](const std::string&, const int64_t&, TimestampMs ts) {
    fired_.emplace_back("a", 0, ts);
    if (fired_.size() == 1) timers_.register_event_time_timer(0, 10);
  });
  EXPECT_EQ(fired_.size(), 2u);  // fired, re-registered at a due time, fired again (as in Flink)
}

TEST_P(TimerServiceTest, DeletedTimersDoNotFire) {
  backend_.set_current_key("a");
  for (TimestampMs ts : {10, 20, 30, 40, 50})
    timers_.register_event_time_timer(0, ts);
  timers_.delete_event_time_timer(0, 30);
  timers_.delete_event_time_timer(0, 10);  // the head of the queue
  timers_.delete_event_time_timer(0, 99);  // absent: no-op
  timers_.delete_event_time_timer(1, 20);  // other namespace: no-op
  backend_.set_current_key("b");
  timers_.delete_event_time_timer(0, 20);  // other key: no-op
  EXPECT_EQ(timers_.num_event_time_timers(), 3u);
  timers_.advance_watermark(100, recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 20}, Fired{"a", 0, 40}, Fired{"a", 0, 50}));
}

TEST_P(TimerServiceTest, DeleteDuringFiring) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 10);
  timers_.register_event_time_timer(0, 20);
  timers_.advance_watermark(100, [&](const std::string& key, const int64_t& ns, TimestampMs ts) {
    fired_.emplace_back(key, ns, ts);
    timers_.delete_event_time_timer(0, 20);
  });
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 10}));
}

TEST_P(TimerServiceTest, ProcessingTimeTimers) {
  EXPECT_EQ(timers_.next_processing_time(), std::nullopt);
  backend_.set_current_key("a");
  timers_.register_processing_time_timer(0, 200);
  timers_.register_processing_time_timer(0, 100);
  timers_.register_event_time_timer(0, 50);  // another domain
  EXPECT_EQ(timers_.next_processing_time(), 100);
  clock_.set(150);
  EXPECT_EQ(timers_.current_processing_time(), 150);
  timers_.on_processing_time(clock_.now_ms(), recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, 100}));
  EXPECT_EQ(timers_.next_processing_time(), 200);
  timers_.delete_processing_time_timer(0, 200);
  EXPECT_EQ(timers_.next_processing_time(), std::nullopt);
  EXPECT_EQ(timers_.num_event_time_timers(), 1u);
}

TEST_P(TimerServiceTest, RegisteringWithoutACurrentKeyThrows) {
  try {
    timers_.register_event_time_timer(0, 1);
    FAIL() << "expected kState";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
  }
}

TEST_P(TimerServiceTest, ManyTimersFireInOrder) {
  // A pseudo-random but fixed sequence of registrations and deletions against a sorted reference.
  std::set<std::tuple<TimestampMs, std::string>> expected;
  uint64_t x = 12345;
  for (int i = 0; i < 5000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::string key = "k" + std::to_string((x >> 33) % 50);
    TimestampMs ts = static_cast<TimestampMs>((x >> 20) % 1000);
    backend_.set_current_key(key);
    if ((x >> 60) < 3) {
      timers_.delete_event_time_timer(0, ts);
      expected.erase({ts, key});
    } else {
      timers_.register_event_time_timer(0, ts);
      expected.insert({ts, key});
    }
  }
  EXPECT_EQ(timers_.num_event_time_timers(), expected.size());
  timers_.advance_watermark(1000, recorder());
  ASSERT_EQ(fired_.size(), expected.size());
  auto it = expected.begin();
  for (size_t i = 0; i < fired_.size(); ++i, ++it) {
    EXPECT_EQ(std::get<2>(fired_[i]), std::get<0>(*it)) << i;
    if (i > 0) {
      EXPECT_LE(std::get<2>(fired_[i - 1]), std::get<2>(fired_[i]));
    }
  }
}

TEST_P(TimerServiceTest, TimersOfOneTimestampFireInRegistrationOrderThroughDeletesAndReRegistrations) {
  // Window operators put thousands of timers on few timestamps and delete some: the exact order, within a
  // timestamp, is registration order on the heap (a timer deleted and registered again goes last) and key order
  // in RocksDB (its keys are (timestamp, key, namespace)), checked against a reference list per timestamp. Most
  // of each timestamp's timers are deleted, so its bucket is compacted (heap) or refilled from RocksDB.
  std::map<TimestampMs, std::vector<std::string>> expected;
  uint64_t x = 99;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int i = 0; i < 20000; ++i) {
    const TimestampMs ts = static_cast<TimestampMs>(next() % 4) * 100;
    std::string key = "k" + std::to_string(next() % 300);
    backend_.set_current_key(key);
    std::vector<std::string>& list = expected[ts];
    auto at = std::find(list.begin(), list.end(), key);
    if (next() % 3 != 0) {
      if (at != list.end()) list.erase(at);
      timers_.delete_event_time_timer(0, ts);
    } else if (at == list.end()) {
      timers_.register_event_time_timer(0, ts);
      list.push_back(key);
    }
  }
  size_t total = 0;
  for (const auto& [ts, list] : expected)
    total += list.size();
  ASSERT_EQ(timers_.num_event_time_timers(), total);
  // Fire the first two timestamps, register more on the third meanwhile, then fire the rest.
  timers_.advance_watermark(100, recorder());
  backend_.set_current_key("late");
  timers_.register_event_time_timer(0, 200);
  expected[200].push_back("late");
  timers_.advance_watermark(1000, recorder());
  std::vector<Fired> want;
  for (auto& [ts, list] : expected) {
    // RocksDB order: by key group (the key's prefix), then the serialized key (its length, then its bytes).
    if (in_rocksdb()) {
      std::sort(list.begin(), list.end(), [this](const std::string& a, const std::string& b) {
        const int32_t ga = backend_.key_group_of(a).value;
        const int32_t gb = backend_.key_group_of(b).value;
        if (ga != gb) return ga < gb;
        return a.size() != b.size() ? a.size() < b.size() : a < b;
      });
    }
    for (const std::string& key : list)
      want.emplace_back(key, 0, ts);
  }
  EXPECT_EQ(fired_, want);
  EXPECT_EQ(timers_.num_event_time_timers(), 0u);
  EXPECT_FALSE(timers_.next_event_time().has_value());
}

TEST_P(TimerServiceTest, SnapshotAndRestoreRoundTrip) {
  for (const char* key : {"a", "b", "c", "d"}) {
    backend_.set_current_key(key);
    timers_.register_event_time_timer(1, 10);
    timers_.register_event_time_timer(2, 20);
    timers_.register_processing_time_timer(1, 300);
  }
  DataOutput out;
  timers_.snapshot(out);

  ManualClock clock;
  HeapKeyedStateBackend<std::string> backend(KeyGroupRange(0, 127), 128, clock);
  Service service = make_service(backend, in_rocksdb());
  InternalTimerService<std::string, int64_t>& restored = *service.timers;
  DataInput in(out.bytes());
  ASSERT_TRUE(restored.restore(in).ok());
  EXPECT_EQ(restored.num_event_time_timers(), 8u);
  EXPECT_EQ(restored.num_processing_time_timers(), 4u);
  EXPECT_EQ(restored.next_processing_time(), 300);
  std::vector<Fired> fired;
  restored.advance_watermark(15, [&](const std::string& key, const int64_t& ns, TimestampMs ts) {
    EXPECT_EQ(backend.current_key(), key);
    fired.emplace_back(key, ns, ts);
  });
  EXPECT_EQ(fired.size(), 4u);
  restored.on_processing_time(
      300, [&](const std::string& key, const int64_t& ns, TimestampMs ts) { fired.emplace_back(key, ns, ts); });
  EXPECT_EQ(fired.size(), 8u);
  EXPECT_EQ(restored.num_event_time_timers(), 4u);

  // Restoring the same timers again does not duplicate them.
  DataInput again(out.bytes());
  ASSERT_TRUE(restored.restore(again).ok());
  EXPECT_EQ(restored.num_event_time_timers(), 8u);
}

TEST_P(TimerServiceTest, ManyTimersOfOneKeyGroupFireInOrderThroughCacheRefills) {
  // One key's timers all share a key group: thousands of them overflow RocksDB's per-key-group cache, so
  // deletes of cached and uncached timers, registrations below and above the cache, and pops that empty it
  // (refills) are all exercised, against a sorted reference. Firing goes in steps with registrations between.
  std::set<std::tuple<TimestampMs, int64_t>> expected;  // (timestamp, namespace)
  uint64_t x = 777;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  backend_.set_current_key("one");
  auto churn = [&](TimestampMs from, int n) {
    for (int i = 0; i < n; ++i) {
      const TimestampMs ts = from + static_cast<TimestampMs>(next() % 5000);
      const auto ns = static_cast<int64_t>(next() % 3);
      if (next() % 4 == 0) {
        timers_.delete_event_time_timer(ns, ts);
        expected.erase({ts, ns});
      } else {
        timers_.register_event_time_timer(ns, ts);
        expected.insert({ts, ns});
      }
    }
  };
  churn(0, 6000);
  ASSERT_EQ(timers_.num_event_time_timers(), expected.size());
  std::vector<Fired> want;
  for (TimestampMs watermark = 500; watermark <= 10000; watermark += 500) {
    timers_.advance_watermark(watermark, [&](const std::string& key, const int64_t& ns, TimestampMs ts) {
      EXPECT_EQ(backend_.current_key(), key);
      fired_.emplace_back(key, ns, ts);
    });
    while (!expected.empty() && std::get<0>(*expected.begin()) <= watermark) {
      want.emplace_back("one", std::get<1>(*expected.begin()), std::get<0>(*expected.begin()));
      expected.erase(expected.begin());
    }
    // Timestamp order; within a timestamp registration order (heap) or namespace order (RocksDB, one key).
    for (size_t i = 1; i < fired_.size(); ++i)
      ASSERT_LE(std::get<2>(fired_[i - 1]), std::get<2>(fired_[i])) << "watermark " << watermark;
    std::vector<Fired> got = fired_;
    auto by_time = [](const Fired& a, const Fired& b) {
      return std::tie(std::get<2>(a), std::get<1>(a)) < std::tie(std::get<2>(b), std::get<1>(b));
    };
    std::sort(got.begin(), got.end(), by_time);
    ASSERT_EQ(got, want) << "watermark " << watermark;
    backend_.set_current_key("one");
    churn(watermark + 1, 300);  // only timers after the watermark, as an operator registers them
  }
  EXPECT_EQ(timers_.num_event_time_timers(), expected.size());
  EXPECT_EQ(timers_.next_event_time(),
            expected.empty() ? std::nullopt : std::optional<TimestampMs>(std::get<0>(*expected.begin())));
}

TEST_P(TimerServiceTest, NegativeTimestampsOrderBeforePositiveOnes) {
  backend_.set_current_key("a");
  timers_.register_event_time_timer(0, 5);
  timers_.register_event_time_timer(0, -5);
  timers_.register_event_time_timer(0, std::numeric_limits<TimestampMs>::min() + 1);
  timers_.register_event_time_timer(0, 0);
  timers_.advance_watermark(std::numeric_limits<TimestampMs>::max(), recorder());
  EXPECT_THAT(fired_, ElementsAre(Fired{"a", 0, std::numeric_limits<TimestampMs>::min() + 1}, Fired{"a", 0, -5},
                                  Fired{"a", 0, 0}, Fired{"a", 0, 5}));
}

TEST_P(TimerServiceTest, SnapshotsOfBothKindsAreTheSameBytesUpToOrderAndRestoreIntoEachOther) {
  for (const char* key : {"a", "b", "c"}) {
    backend_.set_current_key(key);
    timers_.register_event_time_timer(7, 10);
    timers_.register_processing_time_timer(8, 20);
  }
  DataOutput out;
  timers_.snapshot(out);
  // Into the other kind: heap <-> RocksDB.
  ManualClock clock;
  HeapKeyedStateBackend<std::string> backend(KeyGroupRange(0, 127), 128, clock);
  Service service = make_service(backend, !in_rocksdb());
  InternalTimerService<std::string, int64_t>& other = *service.timers;
  DataInput in(out.bytes());
  ASSERT_TRUE(other.restore(in).ok());
  EXPECT_EQ(other.num_event_time_timers(), 3u);
  EXPECT_EQ(other.num_processing_time_timers(), 3u);
  // One timer per key group here, so the bytes are equal whatever the order within a timestamp.
  DataOutput again;
  other.snapshot(again);
  EXPECT_EQ(again.view(), out.view());
  // A capture writes what snapshot_key_group writes, also after later changes.
  auto captured = timers_.capture();
  backend_.set_current_key("a");
  timers_.delete_event_time_timer(7, 10);
  backend_.set_current_key("b");
  const KeyGroup kg = backend_.current_key_group();
  DataOutput from_capture;
  captured->write_timers(kg, from_capture);
  DataOutput from_other;
  other.snapshot_key_group(kg, from_other);
  EXPECT_EQ(from_capture.view(), from_other.view());
}

TEST_P(TimerServiceTest, ADatabaseThatHoldsTimersIsReadWhenTheServiceMovesIntoIt) {
  if (!in_rocksdb()) GTEST_SKIP() << "RocksDB timers only";
  // A database restored from an incremental checkpoint holds the timers of the job that wrote it: a new service
  // on it must know its earliest timers and fire them with no further registration (a key that gets no more
  // records still has its windows fire). 300 timers per domain over many key groups, 200 of them in one.
  for (int i = 0; i < 100; ++i) {
    backend_.set_current_key("k" + std::to_string(i));
    timers_.register_event_time_timer(0, 1000 + i);
    timers_.register_processing_time_timer(0, 5000 + i);
  }
  backend_.set_current_key("busy");
  for (int i = 0; i < 200; ++i) {
    timers_.register_event_time_timer(i, 500 + i);
    timers_.register_processing_time_timer(i, 4000 + i);
  }
  ManualClock clock;
  HeapKeyedStateBackend<std::string> backend(KeyGroupRange(0, 127), 128, clock);
  InternalTimerService<std::string, int64_t> restored(backend);
  restored.use_rocksdb(*db_);
  EXPECT_EQ(restored.next_event_time(), 500);
  EXPECT_EQ(restored.next_processing_time(), 4000);
  std::vector<Fired> fired;
  auto record = [&](const std::string& key, const int64_t& ns, TimestampMs ts) {
    EXPECT_EQ(backend.current_key(), key);
    fired.emplace_back(key, ns, ts);
  };
  restored.advance_watermark(std::numeric_limits<TimestampMs>::max(), record);
  ASSERT_EQ(fired.size(), 300u);
  EXPECT_EQ(fired.front(), (Fired{"busy", 0, 500}));
  EXPECT_EQ(fired.back(), (Fired{"k99", 0, 1099}));
  for (size_t i = 1; i < fired.size(); ++i)
    EXPECT_LT(std::get<2>(fired[i - 1]), std::get<2>(fired[i]));
  restored.on_processing_time(std::numeric_limits<TimestampMs>::max(), record);
  EXPECT_EQ(fired.size(), 600u);
  EXPECT_EQ(restored.num_event_time_timers(), 0u);
  EXPECT_EQ(restored.num_processing_time_timers(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Timers, TimerServiceTest, ::testing::Values(std::string("heap"), std::string("rocksdb")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(TimerRescaleTest, KeyGroupsMoveToTheirNewOwnersAndFireOnce) {
  ManualClock clock;
  constexpr int kMaxP = 128;
  constexpr int64_t kKeys = 300;
  std::vector<std::unique_ptr<HeapKeyedStateBackend<int64_t>>> old_backends;
  std::vector<std::unique_ptr<InternalTimerService<int64_t>>> old_timers;
  for (int i = 0; i < 2; ++i) {
    old_backends.push_back(
        std::make_unique<HeapKeyedStateBackend<int64_t>>(KeyGroupRange::for_operator_index(kMaxP, 2, i), kMaxP, clock));
    old_timers.push_back(std::make_unique<InternalTimerService<int64_t>>(*old_backends.back()));
  }
  for (int64_t k = 0; k < kKeys; ++k) {
    int owner = operator_index_for_key_group(kMaxP, 2, old_backends[0]->key_group_of(k));
    old_backends[owner]->set_current_key(k);
    old_timers[owner]->register_event_time_timer(VoidNamespace{}, 1000 + k);
  }

  std::vector<int64_t> fired;
  for (int i = 0; i < 3; ++i) {
    KeyGroupRange range = KeyGroupRange::for_operator_index(kMaxP, 3, i);
    HeapKeyedStateBackend<int64_t> backend(range, kMaxP, clock);
    InternalTimerService<int64_t> timers(backend);
    // Per key group, from whichever old subtask owned it.
    for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
      int old_owner = operator_index_for_key_group(kMaxP, 2, KeyGroup{kg});
      DataOutput out;
      old_timers[old_owner]->snapshot_key_group(KeyGroup{kg}, out);
      DataInput in(out.bytes());
      ASSERT_TRUE(timers.restore_key_group(KeyGroup{kg}, in).ok());
    }
    timers.advance_watermark(std::numeric_limits<TimestampMs>::max(),
                             [&](const int64_t& key, const VoidNamespace&, TimestampMs ts) {
                               EXPECT_EQ(ts, 1000 + key);
                               EXPECT_TRUE(range.contains(backend.key_group_of(key)));
                               fired.push_back(key);
                             });
  }
  std::sort(fired.begin(), fired.end());
  ASSERT_EQ(fired.size(), static_cast<size_t>(kKeys));
  for (int64_t k = 0; k < kKeys; ++k)
    EXPECT_EQ(fired[k], k);
}

TEST(TimerRestoreErrorsTest, WrongKeyGroupAndCorruptBytes) {
  ManualClock clock;
  HeapKeyedStateBackend<int64_t> backend(KeyGroupRange(0, 127), 128, clock);
  InternalTimerService<int64_t> timers(backend);
  backend.set_current_key(1);
  timers.register_event_time_timer(VoidNamespace{}, 5);
  KeyGroup kg = backend.current_key_group();
  DataOutput out;
  timers.snapshot_key_group(kg, out);

  HeapKeyedStateBackend<int64_t> half(KeyGroupRange(0, 63), 128, clock);
  InternalTimerService<int64_t> other(half);
  KeyGroup outside{kg.value < 64 ? 100 : 10};
  DataInput in(out.bytes());
  Status st = other.restore_key_group(outside, in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);

  std::string truncated(out.view().substr(0, out.size() - 2));
  InternalTimerService<int64_t> fresh(backend);
  DataInput cut(truncated);
  Status corrupt = fresh.restore_key_group(kg, cut);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.error().code(), ErrorCode::kSerialization);
}

}  // namespace
}  // namespace sluice
