// State TTL on the heap backend, driven by a ManualClock (Flink's "State TTL" semantics).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "sluice/core/clock.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using UpdateType = StateTtlConfig::UpdateType;
using Visibility = StateTtlConfig::Visibility;

constexpr int64_t kTtl = 100;

class StateTtlTest : public ::testing::Test {
 protected:
  ManualClock clock_{1000};
  HeapKeyedStateBackend<std::string> backend_{KeyGroupRange(0, 127), 128, clock_};
};

TEST_F(StateTtlTest, OnCreateAndWriteReadsDoNotRefresh) {
  auto& v = backend_.get_state(ValueStateDescriptor<int>{"v", -1, StateTtlConfig::of(kTtl)});
  backend_.set_current_key("k");
  v.update(7);
  clock_.set(1099);
  EXPECT_EQ(v.value(), 7);  // a read, not a refresh
  clock_.set(1100);         // last write + ttl
  EXPECT_EQ(v.value(), -1);
  EXPECT_FALSE(v.has_value());
  EXPECT_EQ(backend_.num_entries(), 0u);  // removed on access
}

TEST_F(StateTtlTest, WritesRefresh) {
  auto& v = backend_.get_state(ValueStateDescriptor<int>{"v", -1, StateTtlConfig::of(kTtl)});
  backend_.set_current_key("k");
  v.update(1);
  clock_.set(1080);
  v.update(2);
  clock_.set(1179);
  EXPECT_EQ(v.value(), 2);
  clock_.set(1180);
  EXPECT_EQ(v.value(), -1);
}

TEST_F(StateTtlTest, OnReadAndWriteReadsRefresh) {
  auto ttl = StateTtlConfig::of(kTtl).with_update_type(UpdateType::kOnReadAndWrite);
  auto& v = backend_.get_state(ValueStateDescriptor<int>{"v", -1, ttl});
  backend_.set_current_key("k");
  v.update(7);
  clock_.set(1050);
  EXPECT_EQ(v.value(), 7);  // refreshes to 1050
  clock_.set(1149);
  EXPECT_TRUE(v.has_value());  // has_value does not refresh
  clock_.set(1150);
  EXPECT_EQ(v.value(), -1);
}

TEST_F(StateTtlTest, ExpiredValuesAreNeverReturnedEvenIfStillStored) {
  auto ttl = StateTtlConfig::of(kTtl).without_incremental_cleanup();
  auto& v = backend_.get_state(ValueStateDescriptor<std::string>{"v", "none", ttl});
  backend_.set_current_key("k");
  v.update("x");
  clock_.advance(kTtl);
  EXPECT_EQ(backend_.num_entries(), 1u);  // still stored...
  EXPECT_EQ(v.value(), "none");           // ...but never returned
  EXPECT_EQ(backend_.num_entries(), 0u);
}

TEST_F(StateTtlTest, ReturnExpiredIfNotCleanedUpReturnsOnceThenRemoves) {
  auto ttl =
      StateTtlConfig::of(kTtl).with_visibility(Visibility::kReturnExpiredIfNotCleanedUp).without_incremental_cleanup();
  auto& v = backend_.get_state(ValueStateDescriptor<std::string>{"v", "none", ttl});
  auto& r =
      backend_.get_state(ReducingStateDescriptor<int>{"r", [](const int& a, const int& b) { return a + b; }, ttl});
  backend_.set_current_key("k");
  v.update("stale");
  r.add(4);
  clock_.advance(kTtl + 1);
  EXPECT_TRUE(v.has_value());
  EXPECT_EQ(v.value(), "stale");
  EXPECT_EQ(v.value(), "none");
  EXPECT_EQ(r.get(), 4);
  EXPECT_EQ(r.get(), std::nullopt);
}

TEST_F(StateTtlTest, IncrementalCleanupRemovesExpiredEntriesWithoutAccessingThem) {
  auto& v = backend_.get_state(ValueStateDescriptor<int>{"v", 0, StateTtlConfig::of(kTtl)});  // 5 per access
  auto& keep = backend_.get_state(ValueStateDescriptor<int>{"keep", 0, StateTtlConfig::of(10 * kTtl)});
  for (int i = 0; i < 200; ++i) {
    backend_.set_current_key("key-" + std::to_string(i));
    v.update(i);
    keep.update(i);
  }
  clock_.advance(kTtl);
  backend_.set_current_key("fresh");
  for (int i = 0; i < 100; ++i)
    v.update(i);                             // 100 accesses check up to 500 entries of "v"
  EXPECT_EQ(backend_.num_entries("v"), 1u);  // only "fresh" is left
  EXPECT_EQ(backend_.num_entries("keep"), 200u);
  EXPECT_EQ(v.value(), 99);
}

TEST_F(StateTtlTest, WithoutIncrementalCleanupExpiredEntriesStayUntilRead) {
  auto& v =
      backend_.get_state(ValueStateDescriptor<int>{"v", 0, StateTtlConfig::of(kTtl).without_incremental_cleanup()});
  for (int i = 0; i < 50; ++i) {
    backend_.set_current_key("key-" + std::to_string(i));
    v.update(i);
  }
  clock_.advance(kTtl);
  backend_.set_current_key("fresh");
  for (int i = 0; i < 100; ++i)
    v.update(i);
  EXPECT_EQ(backend_.num_entries("v"), 51u);
}

TEST_F(StateTtlTest, IncrementalCleanupKeepsLiveEntries) {
  auto& v = backend_.get_state(ValueStateDescriptor<int>{"v", 0, StateTtlConfig::of(kTtl)});
  for (int i = 0; i < 40; ++i) {
    backend_.set_current_key("key-" + std::to_string(i));
    v.update(i);
  }
  clock_.advance(kTtl - 1);
  backend_.set_current_key("key-0");
  for (int i = 0; i < 100; ++i)
    v.value();
  EXPECT_EQ(backend_.num_entries("v"), 40u);
}

TEST_F(StateTtlTest, ListElementsExpireIndividually) {
  auto& list = backend_.get_state(ListStateDescriptor<std::string>{"l", StateTtlConfig::of(kTtl)});
  backend_.set_current_key("k");
  list.add("a");  // at 1000
  clock_.set(1060);
  list.add_all({"b", "c"});  // at 1060
  clock_.set(1120);
  EXPECT_THAT(list.get(), ElementsAre("b", "c"));
  clock_.set(1160);
  EXPECT_THAT(list.get(), IsEmpty());
  EXPECT_EQ(backend_.num_entries(), 0u);
}

TEST_F(StateTtlTest, ListReadsRefreshElementsWithOnReadAndWrite) {
  auto ttl = StateTtlConfig::of(kTtl).with_update_type(UpdateType::kOnReadAndWrite);
  auto& list = backend_.get_state(ListStateDescriptor<int>{"l", ttl});
  backend_.set_current_key("k");
  list.add(1);
  clock_.set(1090);
  EXPECT_THAT(list.get(), ElementsAre(1));
  clock_.set(1180);
  EXPECT_THAT(list.get(), ElementsAre(1));
  clock_.set(1280);
  EXPECT_THAT(list.get(), IsEmpty());
}

TEST_F(StateTtlTest, ListReturnExpiredReturnsExpiredElementsOnce) {
  auto ttl =
      StateTtlConfig::of(kTtl).with_visibility(Visibility::kReturnExpiredIfNotCleanedUp).without_incremental_cleanup();
  auto& list = backend_.get_state(ListStateDescriptor<int>{"l", ttl});
  backend_.set_current_key("k");
  list.add(1);
  clock_.set(1050);
  list.add(2);
  clock_.set(1100);
  EXPECT_THAT(list.get(), ElementsAre(1, 2));
  EXPECT_THAT(list.get(), ElementsAre(2));
}

TEST_F(StateTtlTest, MapEntriesExpireIndividually) {
  auto& map = backend_.get_state(MapStateDescriptor<std::string, int>{"m", StateTtlConfig::of(kTtl)});
  backend_.set_current_key("k");
  map.put("a", 1);
  clock_.set(1060);
  map.put("b", 2);
  clock_.set(1120);
  EXPECT_EQ(map.get("a"), std::nullopt);
  EXPECT_FALSE(map.contains("a"));
  EXPECT_EQ(map.get("b"), 2);
  EXPECT_THAT(map.keys(), UnorderedElementsAre("b"));
  EXPECT_FALSE(map.is_empty());
  clock_.set(1160);
  EXPECT_TRUE(map.is_empty());
  EXPECT_THAT(map.entries(), IsEmpty());
  EXPECT_EQ(backend_.num_entries(), 0u);
}

TEST_F(StateTtlTest, MapReadsRefreshWithOnReadAndWrite) {
  auto ttl = StateTtlConfig::of(kTtl).with_update_type(UpdateType::kOnReadAndWrite);
  auto& map = backend_.get_state(MapStateDescriptor<int, int>{"m", ttl});
  backend_.set_current_key("k");
  map.put(1, 10);
  map.put(2, 20);
  clock_.set(1090);
  EXPECT_EQ(map.get(1), 10);  // refreshes user key 1 only
  clock_.set(1150);
  EXPECT_THAT(map.keys(), UnorderedElementsAre(1));
}

TEST_F(StateTtlTest, ReducingAndAggregatingDropExpiredAccumulators) {
  auto ttl = StateTtlConfig::of(kTtl);
  auto& sum =
      backend_.get_state(ReducingStateDescriptor<int>{"sum", [](const int& a, const int& b) { return a + b; }, ttl});
  auto count = make_aggregate_function<int, int64_t, int64_t>(
      [] { return int64_t{0}; }, [](const int&, int64_t& acc) { ++acc; }, [](const int64_t& acc) { return acc; },
      [](int64_t a, const int64_t& b) { return a + b; });
  auto& n = backend_.get_state(AggregatingStateDescriptor<int, int64_t, int64_t>{"n", count, ttl});
  backend_.set_current_key("k");
  sum.add(5);
  n.add(5);
  clock_.set(1050);
  sum.add(1);  // refreshes
  n.add(1);
  clock_.set(1149);
  EXPECT_EQ(sum.get(), 6);
  EXPECT_EQ(n.get(), 2);
  clock_.set(1150);
  sum.add(3);  // the expired 6 is dropped, not reduced with
  n.add(3);
  EXPECT_EQ(sum.get(), 3);
  EXPECT_EQ(n.get(), 1);
  clock_.set(1250);
  EXPECT_EQ(sum.get(), std::nullopt);
  EXPECT_EQ(n.get(), std::nullopt);
}

TEST_F(StateTtlTest, MergeNamespacesSkipsExpiredSources) {
  auto& list = backend_.get_partitioned_state<int64_t>(ListStateDescriptor<int>{"l", StateTtlConfig::of(kTtl)});
  backend_.set_current_key("k");
  list.set_current_namespace(1);
  list.add(1);  // at 1000
  clock_.set(1050);
  list.set_current_namespace(2);
  list.add(2);
  clock_.set(1100);
  std::vector<int64_t> sources{1, 2};
  list.merge_namespaces(3, sources);
  list.set_current_namespace(3);
  EXPECT_THAT(list.get(), ElementsAre(2));
  EXPECT_EQ(backend_.num_entries(), 1u);
}

}  // namespace
}  // namespace sluice
