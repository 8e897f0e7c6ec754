// Keyed state snapshots: round trips, the documented bytes, rescaling by key groups, and restore errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

struct Window {
  int64_t start = 0;
  int64_t end = 0;
  friend bool operator==(const Window&, const Window&) = default;
};
SLUICE_FIELDS(Window, start, end);

constexpr int kMaxP = 128;
constexpr int64_t kTtl = 100;

int add_ints(const int& a, const int& b) {
  return a + b;
}

auto count_fn() {
  return make_aggregate_function<int, int64_t, int64_t>(
      [] { return int64_t{0}; }, [](const int&, int64_t& acc) { ++acc; }, [](const int64_t& acc) { return acc; },
      [](int64_t a, const int64_t& b) { return a + b; });
}

// Registers one state of every kind (plus a windowed and a TTL state) on `b`.
struct States {
  explicit States(HeapKeyedStateBackend<std::string>& b)
      : value(b.get_state(ValueStateDescriptor<std::string>{"value", "none"})),
        list(b.get_state(ListStateDescriptor<int>{"list"})),
        map(b.get_state(MapStateDescriptor<std::string, double>{"map"})),
        sum(b.get_state(ReducingStateDescriptor<int>{"sum", add_ints})),
        count(b.get_state(AggregatingStateDescriptor<int, int64_t, int64_t>{"count", count_fn()})),
        windowed(b.get_partitioned_state<Window>(ValueStateDescriptor<int>{"windowed", -1})),
        ttl(b.get_state(ValueStateDescriptor<int>{"ttl", -1, StateTtlConfig::of(kTtl).without_incremental_cleanup()})) {
  }
  HeapValueState<std::string, VoidNamespace, std::string>& value;
  HeapListState<std::string, VoidNamespace, int>& list;
  HeapMapState<std::string, VoidNamespace, std::string, double>& map;
  HeapReducingState<std::string, VoidNamespace, int>& sum;
  HeapAggregatingState<std::string, VoidNamespace, int, int64_t, int64_t>& count;
  HeapValueState<std::string, Window, int>& windowed;
  HeapValueState<std::string, VoidNamespace, int>& ttl;
};

void fill(HeapKeyedStateBackend<std::string>& b, ManualClock& clock) {
  States s(b);
  for (int i = 0; i < 50; ++i) {
    b.set_current_key("key-" + std::to_string(i));
    s.value.update("v" + std::to_string(i));
    s.list.add(i);
    s.list.add(i + 1);
    s.map.put("x", i * 0.5);
    s.sum.add(i);
    s.sum.add(1);
    s.count.add(i);
    s.windowed.set_current_namespace(Window{i, i + 10});
    s.windowed.update(i);
    clock.set(1000 + i);  // every key's TTL entry has its own timestamp
    s.ttl.update(i);
  }
}

void check(HeapKeyedStateBackend<std::string>& b) {
  States s(b);
  for (int i = 0; i < 50; ++i) {
    SCOPED_TRACE(i);
    b.set_current_key("key-" + std::to_string(i));
    EXPECT_EQ(s.value.value(), "v" + std::to_string(i));
    EXPECT_THAT(s.list.get(), ElementsAre(i, i + 1));
    EXPECT_EQ(s.map.get("x"), i * 0.5);
    EXPECT_EQ(s.sum.get(), i + 1);
    EXPECT_EQ(s.count.get(), 1);
    s.windowed.set_current_namespace(Window{i, i + 10});
    EXPECT_EQ(s.windowed.value(), i);
    s.windowed.set_current_namespace(Window{i, i + 11});
    EXPECT_FALSE(s.windowed.has_value());
  }
}

std::string snapshot_of(const HeapKeyedStateBackend<std::string>& b) {
  DataOutput out;
  b.snapshot(out);
  return std::string(out.view());
}

class SnapshotTest : public ::testing::Test {
 protected:
  ManualClock clock_{1000};
  HeapKeyedStateBackend<std::string> source_{KeyGroupRange(0, kMaxP - 1), kMaxP, clock_};
};

TEST_F(SnapshotTest, RoundTripIntoRegisteredStates) {
  fill(source_, clock_);
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  States registered(target);
  DataInput in(bytes);
  ASSERT_TRUE(target.restore(in).ok());
  check(target);
  EXPECT_EQ(target.num_entries(), source_.num_entries());
}

TEST_F(SnapshotTest, RoundTripBeforeRegistrationDecodesLazily) {
  fill(source_, clock_);
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in(bytes);
  ASSERT_TRUE(target.restore(in).ok());
  EXPECT_EQ(target.num_entries(), source_.num_entries());
  EXPECT_THAT(target.state_names(), ElementsAre("count", "list", "map", "sum", "ttl", "value", "windowed"));
  check(target);
}

TEST_F(SnapshotTest, UnregisteredRestoredStateSurvivesTheNextSnapshot) {
  fill(source_, clock_);
  std::string first = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> middle(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in1(first);
  ASSERT_TRUE(middle.restore(in1).ok());
  // Only some states are used before the next checkpoint; the others must be carried over as they are.
  auto& value = middle.get_state(ValueStateDescriptor<std::string>{"value", "none"});
  middle.set_current_key("key-3");
  value.update("changed");
  std::string second = snapshot_of(middle);
  HeapKeyedStateBackend<std::string> last(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in2(second);
  ASSERT_TRUE(last.restore(in2).ok());
  States s(last);
  last.set_current_key("key-3");
  EXPECT_EQ(s.value.value(), "changed");
  EXPECT_THAT(s.list.get(), ElementsAre(3, 4));
  EXPECT_EQ(s.sum.get(), 4);
}

TEST_F(SnapshotTest, TtlTimestampsAreKept) {
  fill(source_, clock_);  // key-i's TTL entry was written at 1000 + i
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in(bytes);
  ASSERT_TRUE(target.restore(in).ok());
  States s(target);
  clock_.set(1000 + kTtl + 10);  // entries 0..10 expired, 11..49 alive
  for (int i = 0; i < 50; ++i) {
    target.set_current_key("key-" + std::to_string(i));
    EXPECT_EQ(s.ttl.value(), i <= 10 ? -1 : i) << i;
  }
}

TEST_F(SnapshotTest, PerKeyGroupRoundTrip) {
  fill(source_, clock_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  for (int kg = 0; kg < kMaxP; ++kg) {
    DataOutput out;
    source_.snapshot_key_group(KeyGroup{kg}, out);
    DataInput in(out.bytes());
    ASSERT_TRUE(target.restore_key_group(KeyGroup{kg}, in).ok()) << kg;
  }
  check(target);
}

TEST(SnapshotFormatTest, KeyGroupBytesAreAsDocumented) {
  ManualClock clock;
  HeapKeyedStateBackend<int32_t> b(KeyGroupRange(0, 127), 128, clock);
  auto& v = b.get_state(ValueStateDescriptor<int32_t>{"v"});
  b.set_current_key(7);
  v.update(42);
  KeyGroup kg = b.current_key_group();
  DataOutput out;
  b.snapshot_key_group(kg, out);
  std::vector<uint8_t> expected = {0x01,                            // format version
                                   static_cast<uint8_t>(kg.value),  // key group (< 128)
                                   0x01,                            // one section
                                   0x01,
                                   'v',   // state name
                                   0x01,  // kind: value
                                   0x00,  // flags: no TTL
                                   0x01,  // one entry
                                   0x08,
                                   0,
                                   0,
                                   0,
                                   0,
                                   0,
                                   0,
                                   0,  // section length
                                   0x07,
                                   0,
                                   0,
                                   0,  // key 7
                                   0x2A,
                                   0,
                                   0,
                                   0};  // value 42
  EXPECT_THAT(std::vector<uint8_t>(out.data(), out.data() + out.size()), ::testing::ElementsAreArray(expected));

  // An empty key group is version, key group, zero sections.
  DataOutput empty;
  b.snapshot_key_group(KeyGroup{(kg.value + 1) % 128}, empty);
  EXPECT_EQ(empty.size(), 3u);
}

TEST(RescaleTest, TwoSubtasksToThree) {
  ManualClock clock;
  constexpr int kKeys = 1000;
  std::vector<std::unique_ptr<HeapKeyedStateBackend<int64_t>>> old;
  for (int i = 0; i < 2; ++i) {
    old.push_back(
        std::make_unique<HeapKeyedStateBackend<int64_t>>(KeyGroupRange::for_operator_index(kMaxP, 2, i), kMaxP, clock));
  }
  for (int64_t k = 0; k < kKeys; ++k) {
    auto& owner = *old[operator_index_for_key_group(kMaxP, 2, old[0]->key_group_of(k))];
    owner.set_current_key(k);
    owner.get_state(ValueStateDescriptor<int64_t>{"v"}).update(k * 10);
    owner.get_state(ListStateDescriptor<int64_t>{"l"}).add(k);
  }
  std::vector<std::string> snapshots;
  for (auto& b : old) {
    DataOutput out;
    b->snapshot(out);
    snapshots.emplace_back(out.view());
  }

  std::vector<std::unique_ptr<HeapKeyedStateBackend<int64_t>>> fresh;
  for (int i = 0; i < 3; ++i) {
    fresh.push_back(
        std::make_unique<HeapKeyedStateBackend<int64_t>>(KeyGroupRange::for_operator_index(kMaxP, 3, i), kMaxP, clock));
    for (const std::string& s : snapshots) {
      DataInput in(s);
      ASSERT_TRUE(fresh.back()->restore(in).ok());
    }
  }
  size_t total = 0;
  for (auto& b : fresh)
    total += b->num_entries("v");
  EXPECT_EQ(total, static_cast<size_t>(kKeys));

  for (int64_t k = 0; k < kKeys; ++k) {
    int owner = operator_index_for_key_group(kMaxP, 3, fresh[0]->key_group_of(k));
    for (int i = 0; i < 3; ++i) {
      auto& b = *fresh[i];
      if (i == owner) {
        b.set_current_key(k);
        auto& v = b.get_state(ValueStateDescriptor<int64_t>{"v"});
        ASSERT_TRUE(v.has_value()) << k;
        EXPECT_EQ(v.value(), k * 10);
        EXPECT_THAT(b.get_state(ListStateDescriptor<int64_t>{"l"}).get(), ElementsAre(k));
      } else {
        EXPECT_THROW(b.set_current_key(k), SluiceException) << k << " must only be readable in subtask " << owner;
      }
    }
  }
}

TEST_F(SnapshotTest, KindMismatchWithRegisteredStateIsAnError) {
  source_.set_current_key("k");
  source_.get_state(ValueStateDescriptor<int>{"s"}).update(1);
  std::string bytes = snapshot_of(source_);

  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  target.get_state(ListStateDescriptor<int>{"s"});
  DataInput in(bytes);
  Status st = target.restore(in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);
  EXPECT_THAT(st.error().message(), HasSubstr("'s'"));
  EXPECT_THAT(st.error().message(), HasSubstr("snapshotted as a value state"));
  EXPECT_THAT(st.error().message(), HasSubstr("registered as a list state"));
}

TEST_F(SnapshotTest, KindMismatchOnLaterRegistrationIsAnError) {
  source_.set_current_key("k");
  source_.get_state(MapStateDescriptor<int, int>{"s"}).put(1, 2);
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in(bytes);
  ASSERT_TRUE(target.restore(in).ok());
  try {
    target.get_state(ValueStateDescriptor<int>{"s"});
    FAIL() << "expected a kState error";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
    EXPECT_THAT(e.error().message(), HasSubstr("'s' was snapshotted as a map state"));
  }
  // The restored entries are still there for the right descriptor.
  target.set_current_key("k");
  EXPECT_EQ(target.get_state(MapStateDescriptor<int, int>{"s"}).get(1), 2);
}

TEST_F(SnapshotTest, KindMismatchInAKeyGroupIsAnError) {
  source_.set_current_key("k");
  source_.get_state(ValueStateDescriptor<int>{"s"}).update(1);
  KeyGroup kg = source_.current_key_group();
  DataOutput out;
  source_.snapshot_key_group(kg, out);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  target.get_state(ReducingStateDescriptor<int>{"s", add_ints});
  DataInput in(out.bytes());
  Status st = target.restore_key_group(kg, in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);
  EXPECT_THAT(st.error().message(), HasSubstr("'s'"));
}

TEST_F(SnapshotTest, TtlMismatchIsAnError) {
  source_.set_current_key("k");
  source_.get_state(ValueStateDescriptor<int>{"s", 0, StateTtlConfig::of(kTtl)}).update(1);
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  target.get_state(ValueStateDescriptor<int>{"s"});
  DataInput in(bytes);
  Status st = target.restore(in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);
  EXPECT_THAT(st.error().message(), HasSubstr("TTL"));
}

TEST_F(SnapshotTest, MaxParallelismChangeIsAnError) {
  fill(source_, clock_);
  std::string bytes = snapshot_of(source_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, 255), 256, clock_);
  DataInput in(bytes);
  Status st = target.restore(in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);
  EXPECT_THAT(st.error().message(), HasSubstr("max parallelism 128"));
}

TEST_F(SnapshotTest, KeyGroupOutsideRangeOrMislabelledIsAnError) {
  fill(source_, clock_);
  HeapKeyedStateBackend<std::string> half(KeyGroupRange(0, 63), kMaxP, clock_);
  DataOutput out;
  source_.snapshot_key_group(KeyGroup{100}, out);
  DataInput in(out.bytes());
  Status outside = half.restore_key_group(KeyGroup{100}, in);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.error().code(), ErrorCode::kState);

  DataInput again(out.bytes());
  Status mislabelled = half.restore_key_group(KeyGroup{5}, again);
  ASSERT_FALSE(mislabelled.ok());
  EXPECT_EQ(mislabelled.error().code(), ErrorCode::kState);
}

TEST_F(SnapshotTest, CorruptBytesAreErrorsNotCrashes) {
  fill(source_, clock_);
  std::string bytes = snapshot_of(source_);
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
    States registered(target);
    DataInput in(std::string_view(bytes).substr(0, cut));
    Status st = target.restore(in);
    ASSERT_FALSE(st.ok()) << cut;
    EXPECT_EQ(st.error().code(), ErrorCode::kSerialization) << st.error().to_string();
  }
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in(bad_magic);
  Status st = target.restore(in);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message(), HasSubstr("magic"));
}

}  // namespace
}  // namespace sluice
