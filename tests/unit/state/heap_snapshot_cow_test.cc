// Copy-on-write captures of the heap backend and timers: a capture keeps writing the bytes a synchronous
// snapshot wrote at capture time whatever the task does afterwards (writes of every state kind, TTL reads
// and cleanup, restores, timers), also while another thread writes it; and the keyed operator blob round
// trips, also into other key-group ranges.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_operator_snapshot.h"
#include "sluice/state/state.h"
#include "sluice/state/timer_service.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Window {
  int64_t start = 0;
  int64_t end = 0;
  friend bool operator==(const Window&, const Window&) = default;
};
SLUICE_FIELDS(Window, start, end);

constexpr int kMaxP = 128;
constexpr int64_t kTtl = 100;
constexpr int kKeys = 300;

int add_ints(const int& a, const int& b) {
  return a + b;
}

auto count_fn() {
  return make_aggregate_function<int, int64_t, int64_t>(
      [] { return int64_t{0}; }, [](const int&, int64_t& acc) { ++acc; }, [](const int64_t& acc) { return acc; },
      [](int64_t a, const int64_t& b) { return a + b; });
}

// TTL refreshed by reads too, so reads of TTL states write; incremental cleanup on, so accesses scan others.
StateTtlConfig ttl() {
  return StateTtlConfig::of(kTtl).with_update_type(StateTtlConfig::UpdateType::kOnReadAndWrite);
}

std::string key(int i) {
  return "key-" + std::to_string(i);
}

// One state of every kind, without and with TTL, plus namespaced ones.
struct States {
  explicit States(HeapKeyedStateBackend<std::string>& b)
      : value(b.get_state(ValueStateDescriptor<std::string>{"value", "none"})),
        list(b.get_state(ListStateDescriptor<int>{"list"})),
        map(b.get_state(MapStateDescriptor<std::string, double>{"map"})),
        sum(b.get_state(ReducingStateDescriptor<int>{"sum", add_ints})),
        count(b.get_state(AggregatingStateDescriptor<int, int64_t, int64_t>{"count", count_fn()})),
        ttl_value(b.get_state(ValueStateDescriptor<int>{"ttl_value", -1, ttl()})),
        ttl_list(b.get_state(ListStateDescriptor<int>{"ttl_list", ttl()})),
        ttl_map(b.get_state(MapStateDescriptor<int, int>{"ttl_map", ttl()})),
        ttl_sum(b.get_state(ReducingStateDescriptor<int>{"ttl_sum", add_ints, ttl()})),
        ttl_count(b.get_state(AggregatingStateDescriptor<int, int64_t, int64_t>{"ttl_count", count_fn(), ttl()})),
        win_list(b.get_partitioned_state<Window>(ListStateDescriptor<int>{"win_list"})),
        win_sum(b.get_partitioned_state<Window>(ReducingStateDescriptor<int>{"win_sum", add_ints})),
        win_ttl(b.get_partitioned_state<Window>(ValueStateDescriptor<int>{"win_ttl", -1, ttl()})) {}

  HeapValueState<std::string, VoidNamespace, std::string>& value;
  HeapListState<std::string, VoidNamespace, int>& list;
  HeapMapState<std::string, VoidNamespace, std::string, double>& map;
  HeapReducingState<std::string, VoidNamespace, int>& sum;
  HeapAggregatingState<std::string, VoidNamespace, int, int64_t, int64_t>& count;
  HeapValueState<std::string, VoidNamespace, int>& ttl_value;
  HeapListState<std::string, VoidNamespace, int>& ttl_list;
  HeapMapState<std::string, VoidNamespace, int, int>& ttl_map;
  HeapReducingState<std::string, VoidNamespace, int>& ttl_sum;
  HeapAggregatingState<std::string, VoidNamespace, int, int64_t, int64_t>& ttl_count;
  HeapListState<std::string, Window, int>& win_list;
  HeapReducingState<std::string, Window, int>& win_sum;
  HeapValueState<std::string, Window, int>& win_ttl;
};

// Writes round `r` of every state for keys [0, kKeys).
void fill(HeapKeyedStateBackend<std::string>& b, States& s, int r) {
  for (int i = 0; i < kKeys; ++i) {
    b.set_current_key(key(i));
    s.value.update("v" + std::to_string(i) + "/" + std::to_string(r));
    s.list.add(i + r);
    s.map.put("m" + std::to_string(r), i * 0.5);
    s.sum.add(i + r);
    s.count.add(i);
    s.ttl_value.update(i + r);
    s.ttl_list.add(r);
    s.ttl_map.put(r, i);
    s.ttl_sum.add(1);
    s.ttl_count.add(1);
    s.win_list.set_current_namespace(Window{r, r + 10});
    s.win_list.add(i);
    s.win_sum.set_current_namespace(Window{r, r + 10});
    s.win_sum.add(i);
    s.win_ttl.set_current_namespace(Window{r, r + 10});
    s.win_ttl.update(i);
  }
}

// Every other kind of mutation: removals, clears, merges, overwrites, clears of other keys.
void mutate_more(HeapKeyedStateBackend<std::string>& b, States& s) {
  for (int i = 0; i < kKeys; ++i) {
    b.set_current_key(key(i));
    switch (i % 4) {
      case 0:
        s.value.clear();
        s.list.update({7, 8, 9});
        s.map.remove("m0");
        s.sum.clear();
        s.count.clear();
        break;
      case 1:
        s.value.update(s.value.value());  // a reference into a captured group, passed to a write of the same state
        s.list.add_all({1, 2});
        s.map.put_all({{"a", 1.0}, {"b", 2.0}});
        s.ttl_map.remove(0);
        break;
      case 2: {
        std::vector<Window> sources = {Window{0, 10}, Window{1, 11}};
        b.merge_namespaces(s.win_list, Window{5, 15}, std::span<const Window>(sources));
        b.merge_namespaces(s.win_sum, Window{5, 15}, std::span<const Window>(sources));
        s.ttl_list.clear();
        break;
      }
      default:
        b.clear(s.win_ttl, key(i), Window{0, 10});
        s.map.clear();
        break;
    }
  }
}

// Reads every TTL state of every key (refreshing it) and, with the clock past the TTL, drops it; the
// incremental cleanup of each access scans and drops entries of other keys too.
void read_ttl_states(HeapKeyedStateBackend<std::string>& b, States& s) {
  for (int i = 0; i < kKeys; ++i) {
    b.set_current_key(key(i));
    s.ttl_value.value();
    s.ttl_list.get();
    s.ttl_map.get(0);
    s.ttl_map.is_empty();
    s.ttl_sum.get();
    s.ttl_count.get();
    s.win_ttl.set_current_namespace(Window{0, 10});
    s.win_ttl.value();
  }
}

// The synchronous snapshot of every key group.
std::vector<std::string> sync_groups(const HeapKeyedStateBackend<std::string>& b) {
  std::vector<std::string> out;
  for (int32_t kg = b.key_group_range().start(); kg <= b.key_group_range().end(); ++kg) {
    DataOutput o;
    b.snapshot_key_group(KeyGroup{kg}, o);
    out.emplace_back(o.view());
  }
  return out;
}

// What a capture writes for every key group.
std::vector<std::string> written_groups(const KeyedStateSnapshot& snap) {
  std::vector<std::string> out;
  for (int32_t kg = snap.key_group_range().start(); kg <= snap.key_group_range().end(); ++kg) {
    DataOutput o;
    snap.write_key_group(KeyGroup{kg}, o);
    out.emplace_back(o.view());
  }
  return out;
}

std::vector<std::string> written_groups(const TimerServiceSnapshot& snap, const KeyGroupRange& range) {
  std::vector<std::string> out;
  for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
    DataOutput o;
    snap.write_timers(KeyGroup{kg}, o);
    out.emplace_back(o.view());
  }
  return out;
}

std::string whole(const HeapKeyedStateBackend<std::string>& b) {
  DataOutput o;
  b.snapshot(o);
  return std::string(o.view());
}

class HeapSnapshotCowTest : public ::testing::Test {
 protected:
  ManualClock clock_{1000};
  HeapKeyedStateBackend<std::string> backend_{KeyGroupRange(0, kMaxP - 1), kMaxP, clock_};
  States s_{backend_};
};

TEST_F(HeapSnapshotCowTest, CaptureWritesWhatTheSynchronousSnapshotWrites) {
  fill(backend_, s_, 0);
  auto snap = backend_.capture();
  EXPECT_EQ(snap->key_group_range(), backend_.key_group_range());
  EXPECT_EQ(snap->max_parallelism(), kMaxP);
  EXPECT_EQ(written_groups(*snap), sync_groups(backend_));
  DataOutput all;
  snap->write_all(all);
  EXPECT_EQ(all.view(), whole(backend_));
  EXPECT_EQ(snap->state_names(), backend_.state_names());
}

TEST_F(HeapSnapshotCowTest, EveryKindOfWriteLeavesTheCaptureUnchanged) {
  fill(backend_, s_, 0);
  fill(backend_, s_, 1);
  const std::vector<std::string> before = sync_groups(backend_);
  const std::string before_all = whole(backend_);
  auto snap = backend_.capture();

  fill(backend_, s_, 2);
  mutate_more(backend_, s_);
  clock_.advance(kTtl / 2);
  read_ttl_states(backend_, s_);  // refreshes on read: writes timestamps

  EXPECT_EQ(written_groups(*snap), before);
  DataOutput all;
  snap->write_all(all);
  EXPECT_EQ(all.view(), before_all);
  EXPECT_NE(sync_groups(backend_), before);

  // The live state has the new values.
  backend_.set_current_key(key(5));
  EXPECT_EQ(s_.value.value(), "v5/2");
  EXPECT_THAT(s_.list.get(), ElementsAre(5, 6, 7, 1, 2));
  EXPECT_EQ(s_.sum.get(), 5 + 6 + 7);
  backend_.set_current_key(key(4));
  EXPECT_EQ(s_.value.value(), "none");
  EXPECT_THAT(s_.list.get(), ElementsAre(7, 8, 9));
}

TEST_F(HeapSnapshotCowTest, TtlExpiryAndIncrementalCleanupLeaveTheCaptureUnchanged) {
  fill(backend_, s_, 0);
  const std::vector<std::string> before = sync_groups(backend_);
  const size_t entries_before = backend_.num_entries();
  auto snap = backend_.capture();

  clock_.advance(kTtl + 1);       // every TTL entry has expired
  read_ttl_states(backend_, s_);  // reads drop them, and the cleanup scan drops others
  EXPECT_LT(backend_.num_entries(), entries_before);
  EXPECT_EQ(backend_.num_entries("ttl_value"), 0u);
  EXPECT_EQ(written_groups(*snap), before);

  // Only the cleanup of another state's accesses: a fresh capture, then writes to non-TTL states of a TTL
  // backend do not touch it either.
  fill(backend_, s_, 1);
  const std::vector<std::string> second = sync_groups(backend_);
  auto snap2 = backend_.capture();
  clock_.advance(kTtl + 1);
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < kKeys; ++i) {
      backend_.set_current_key(key(i));
      s_.ttl_sum.add(1);  // each write scans 5 more entries of ttl_sum for expiry
    }
  EXPECT_EQ(written_groups(*snap2), second);
  EXPECT_EQ(written_groups(*snap), before);
}

TEST_F(HeapSnapshotCowTest, ReadsWithoutTtlReturnTheLiveValues) {
  fill(backend_, s_, 0);
  auto snap = backend_.capture();
  backend_.set_current_key(key(3));
  EXPECT_EQ(s_.value.value(), "v3/0");  // read from the shared group
  s_.value.update("new");               // clones it
  EXPECT_EQ(s_.value.value(), "new");
  EXPECT_EQ(s_.map.get("m0"), 1.5);
  s_.map.put("m0", 9.0);
  EXPECT_EQ(s_.map.get("m0"), 9.0);
  EXPECT_THAT(s_.map.keys(), ElementsAre("m0"));
  snap.reset();
  s_.value.update("newer");  // no capture left: in place
  EXPECT_EQ(s_.value.value(), "newer");
}

TEST_F(HeapSnapshotCowTest, TwoOverlappingCaptures) {
  fill(backend_, s_, 0);
  const std::vector<std::string> first = sync_groups(backend_);
  auto snap1 = backend_.capture();
  fill(backend_, s_, 1);
  const std::vector<std::string> second = sync_groups(backend_);
  auto snap2 = backend_.capture();
  mutate_more(backend_, s_);
  EXPECT_EQ(written_groups(*snap1), first);
  EXPECT_EQ(written_groups(*snap2), second);
  snap1.reset();
  fill(backend_, s_, 2);
  EXPECT_EQ(written_groups(*snap2), second);
  const std::vector<std::string> third = sync_groups(backend_);
  snap2.reset();
  fill(backend_, s_, 3);
  auto snap3 = backend_.capture();
  EXPECT_EQ(written_groups(*snap3), sync_groups(backend_));
  EXPECT_NE(third, sync_groups(backend_));
}

TEST_F(HeapSnapshotCowTest, CaptureOutlivesTheBackend) {
  auto backend = std::make_unique<HeapKeyedStateBackend<std::string>>(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  States s(*backend);
  fill(*backend, s, 0);
  const std::vector<std::string> before = sync_groups(*backend);
  auto snap = backend->capture();
  backend.reset();
  EXPECT_EQ(written_groups(*snap), before);
}

TEST_F(HeapSnapshotCowTest, RestoredButUnregisteredStatesAreCaptured) {
  fill(backend_, s_, 0);
  std::string bytes = whole(backend_);
  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  DataInput in(bytes);
  ASSERT_TRUE(target.restore(in).ok());  // everything pending
  const std::vector<std::string> before = sync_groups(target);
  const std::string before_all = whole(target);
  auto snap = target.capture();

  // Registering a pending state decodes it; restoring more key groups appends to the pending ones.
  auto& value = target.get_state(ValueStateDescriptor<std::string>{"value", "none"});
  target.set_current_key(key(1));
  value.update("changed");
  HeapKeyedStateBackend<std::string> other(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  other.set_current_key("extra");
  other.get_state(ListStateDescriptor<int>{"list"}).add(42);                        // pending in target
  other.get_state(ValueStateDescriptor<std::string>{"value", "none"}).update("x");  // registered in target
  DataOutput group;
  other.snapshot_key_group(other.current_key_group(), group);
  DataInput group_in(group.bytes());
  ASSERT_TRUE(target.restore_key_group(other.current_key_group(), group_in).ok());

  EXPECT_EQ(written_groups(*snap), before);
  DataOutput all;
  snap->write_all(all);
  EXPECT_EQ(all.view(), before_all);
  EXPECT_NE(sync_groups(target), before);
}

TEST_F(HeapSnapshotCowTest, KeyGroupOutsideTheCaptureIsAnError) {
  HeapKeyedStateBackend<std::string> half(KeyGroupRange(0, 63), kMaxP, clock_);
  auto snap = half.capture();
  DataOutput out;
  try {
    snap->write_key_group(KeyGroup{64}, out);
    FAIL() << "expected a kState error";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
    EXPECT_THAT(e.error().message(), HasSubstr("key group 64"));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Another thread writes the capture while the task mutates (run under ThreadSanitizer too)
// ---------------------------------------------------------------------------------------------------------

TEST_F(HeapSnapshotCowTest, WriterThreadWritesWhileTheTaskMutates) {
  fill(backend_, s_, 0);
  const std::vector<std::string> before = sync_groups(backend_);
  std::unique_ptr<const KeyedStateSnapshot> snap = backend_.capture();

  constexpr int kPasses = 3;
  std::atomic<bool> mutating{false};
  std::atomic<bool> done{false};
  std::vector<std::vector<std::string>> passes;
  std::thread writer([&] {
    while (!mutating.load(std::memory_order_acquire)) {
    }
    for (int p = 0; p < kPasses; ++p)
      passes.push_back(written_groups(*snap));
    done.store(true, std::memory_order_release);
  });
  mutating.store(true, std::memory_order_release);
  int round = 1;
  do {  // rounds of writes of every kind until the writer is done
    fill(backend_, s_, round++);
    mutate_more(backend_, s_);
    clock_.advance(kTtl / 3);
    read_ttl_states(backend_, s_);
  } while (!done.load(std::memory_order_acquire));
  writer.join();

  ASSERT_EQ(passes.size(), static_cast<size_t>(kPasses));
  for (const auto& pass : passes)
    EXPECT_EQ(pass, before);
}

TEST_F(HeapSnapshotCowTest, CaptureReleasedOnTheWriterThreadWhileWritesContinue) {
  fill(backend_, s_, 0);
  const std::vector<std::string> before = sync_groups(backend_);
  std::unique_ptr<KeyedStateSnapshot> snap = backend_.capture();

  std::atomic<bool> released{false};
  std::vector<std::string> half;
  std::thread writer([&, snap = std::move(snap)]() mutable {
    for (int32_t kg = 0; kg < kMaxP / 2; ++kg) {
      DataOutput o;
      snap->write_key_group(KeyGroup{kg}, o);
      half.emplace_back(o.view());
    }
    snap.reset();  // the last reference of the groups the task has not touched yet goes here
    released.store(true, std::memory_order_release);
  });
  int round = 1;
  do {
    fill(backend_, s_, round++);
    mutate_more(backend_, s_);
  } while (!released.load(std::memory_order_acquire));
  writer.join();
  fill(backend_, s_, round);  // groups no capture holds any more: written in place

  EXPECT_EQ(half, std::vector<std::string>(before.begin(), before.begin() + kMaxP / 2));
  backend_.set_current_key(key(5));
  EXPECT_EQ(s_.value.value(), "v5/" + std::to_string(round));
  auto snap2 = backend_.capture();
  EXPECT_EQ(written_groups(*snap2), sync_groups(backend_));
}

// ---------------------------------------------------------------------------------------------------------
// Timers and the keyed operator blob
// ---------------------------------------------------------------------------------------------------------

using Timers = InternalTimerService<std::string, Window>;
using Fired = std::tuple<std::string, int64_t, TimestampMs>;  // key, window start, timestamp

void register_timers(HeapKeyedStateBackend<std::string>& b, Timers& t, int r) {
  for (int i = 0; i < kKeys; ++i) {
    b.set_current_key(key(i));
    t.register_event_time_timer(Window{r, r + 10}, 100 * r + i % 7);
    t.register_processing_time_timer(Window{r, r + 10}, 5000 + i);
  }
}

std::vector<std::string> sync_timer_groups(const HeapKeyedStateBackend<std::string>& b, const Timers& t) {
  std::vector<std::string> out;
  for (int32_t kg = b.key_group_range().start(); kg <= b.key_group_range().end(); ++kg) {
    DataOutput o;
    t.snapshot_key_group(KeyGroup{kg}, o);
    out.emplace_back(o.view());
  }
  return out;
}

// The keyed operator blob of every key group from synchronous snapshots.
std::vector<std::string> sync_operator_groups(const HeapKeyedStateBackend<std::string>& b, const Timers* t) {
  std::vector<std::string> state = sync_groups(b);
  std::vector<std::string> timers = t != nullptr ? sync_timer_groups(b, *t) : std::vector<std::string>(state.size());
  std::vector<std::string> out;
  for (size_t i = 0; i < state.size(); ++i) {
    DataOutput o;
    o.write_varint(state[i].size());
    o.write_bytes(state[i].data(), state[i].size());
    o.write_varint(timers[i].size());
    o.write_bytes(timers[i].data(), timers[i].size());
    out.emplace_back(o.view());
  }
  return out;
}

KeyedStateRestore restore_of(const KeyedStateSnapshot& snap, const KeyGroupRange& range) {
  KeyedStateRestore r;
  r.max_parallelism = snap.max_parallelism();
  for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
    DataOutput o;
    snap.write_key_group(KeyGroup{kg}, o);
    r.add_copy(kg, o.view());
  }
  return r;
}

std::vector<Fired> fire_all(HeapKeyedStateBackend<std::string>& b, Timers& t) {
  std::vector<Fired> fired;
  auto record = [&](const std::string& k, const Window& w, TimestampMs ts) {
    EXPECT_EQ(b.current_key(), k);
    fired.emplace_back(k, w.start, ts);
  };
  t.advance_watermark(std::numeric_limits<int64_t>::max(), record);
  t.on_processing_time(std::numeric_limits<int64_t>::max(), record);
  return fired;
}

TEST_F(HeapSnapshotCowTest, TimerCaptureIgnoresLaterTimerChanges) {
  Timers timers(backend_);
  register_timers(backend_, timers, 0);
  const std::vector<std::string> before = sync_timer_groups(backend_, timers);
  auto snap = timers.capture();
  register_timers(backend_, timers, 1);
  backend_.set_current_key(key(0));
  timers.delete_event_time_timer(Window{0, 10}, 0);
  timers.advance_watermark(50, [](const std::string&, const Window&, TimestampMs) {});
  EXPECT_EQ(written_groups(*snap, backend_.key_group_range()), before);
  EXPECT_NE(sync_timer_groups(backend_, timers), before);
}

TEST_F(HeapSnapshotCowTest, OperatorCaptureWritesStateAndTimersAsOfTheCapture) {
  Timers timers(backend_);
  fill(backend_, s_, 0);
  register_timers(backend_, timers, 0);
  const std::vector<std::string> before = sync_operator_groups(backend_, &timers);
  auto snap = capture_keyed_operator(backend_, &timers);
  fill(backend_, s_, 1);
  mutate_more(backend_, s_);
  register_timers(backend_, timers, 1);
  fire_all(backend_, timers);
  EXPECT_EQ(written_groups(*snap), before);

  auto no_timers = capture_keyed_operator(backend_);
  EXPECT_EQ(written_groups(*no_timers), sync_operator_groups(backend_, nullptr));
}

TEST_F(HeapSnapshotCowTest, OperatorRoundTripIntoTheSameRange) {
  Timers timers(backend_);
  fill(backend_, s_, 0);
  register_timers(backend_, timers, 0);
  auto snap = capture_keyed_operator(backend_, &timers);
  KeyedStateRestore restore = restore_of(*snap, snap->key_group_range());
  std::vector<Fired> expected = fire_all(backend_, timers);

  HeapKeyedStateBackend<std::string> target(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
  States s(target);
  Timers target_timers(target);
  ASSERT_TRUE(restore_keyed_operator(target, &target_timers, restore).ok());
  EXPECT_EQ(target.num_entries(), backend_.num_entries());
  for (int i = 0; i < kKeys; ++i) {
    target.set_current_key(key(i));
    EXPECT_EQ(s.value.value(), "v" + std::to_string(i) + "/0");
    EXPECT_THAT(s.list.get(), ElementsAre(i));
    EXPECT_EQ(s.ttl_map.get(0), i);
    s.win_sum.set_current_namespace(Window{0, 10});
    EXPECT_EQ(s.win_sum.get(), i);
  }
  std::vector<Fired> fired = fire_all(target, target_timers);
  // Timers of equal timestamps fire in registration order, which a restore does not keep across keys.
  std::sort(fired.begin(), fired.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(fired, expected);
}

TEST(KeyedOperatorRescaleTest, TwoSubtasksToThree) {
  ManualClock clock(1000);
  std::vector<std::unique_ptr<HeapKeyedStateBackend<std::string>>> old;
  std::vector<std::unique_ptr<Timers>> old_timers;
  for (int i = 0; i < 2; ++i) {
    old.push_back(std::make_unique<HeapKeyedStateBackend<std::string>>(KeyGroupRange::for_operator_index(kMaxP, 2, i),
                                                                       kMaxP, clock));
    old_timers.push_back(std::make_unique<Timers>(*old.back()));
  }
  for (int i = 0; i < kKeys; ++i) {
    auto& b = *old[operator_index_for_key_group(kMaxP, 2, old[0]->key_group_of(key(i)))];
    auto& t = *old_timers[operator_index_for_key_group(kMaxP, 2, old[0]->key_group_of(key(i)))];
    b.set_current_key(key(i));
    b.get_state(ValueStateDescriptor<int>{"v"}).update(i);
    t.register_event_time_timer(Window{0, 10}, i);
  }
  std::vector<std::unique_ptr<KeyedStateSnapshot>> snaps;
  for (int i = 0; i < 2; ++i)
    snaps.push_back(capture_keyed_operator(*old[i], old_timers[i].get()));
  for (int i = 0; i < 2; ++i) {  // the old subtasks go on: nothing of it reaches the snapshots
    for (int k = 0; k < kKeys; ++k) {
      if (operator_index_for_key_group(kMaxP, 2, old[i]->key_group_of(key(k))) != i) continue;
      old[i]->set_current_key(key(k));
      old[i]->get_state(ValueStateDescriptor<int>{"v"}).update(-1);
      old_timers[i]->register_event_time_timer(Window{1, 11}, k);
    }
  }

  size_t total_entries = 0;
  size_t total_timers = 0;
  for (int n = 0; n < 3; ++n) {
    KeyGroupRange range = KeyGroupRange::for_operator_index(kMaxP, 3, n);
    KeyedStateRestore restore;
    restore.max_parallelism = kMaxP;
    for (const auto& snap : snaps) {  // each old subtask contributes the key groups of the new range it owned
      for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
        if (!snap->key_group_range().contains(KeyGroup{kg})) continue;
        DataOutput o;
        snap->write_key_group(KeyGroup{kg}, o);
        restore.add_copy(kg, o.view());
      }
    }
    HeapKeyedStateBackend<std::string> b(range, kMaxP, clock);
    Timers t(b);
    auto& v = b.get_state(ValueStateDescriptor<int>{"v"});
    ASSERT_TRUE(restore_keyed_operator(b, &t, restore).ok());
    total_entries += b.num_entries();
    total_timers += t.num_event_time_timers();
    for (int k = 0; k < kKeys; ++k) {
      if (!range.contains(b.key_group_of(key(k)))) continue;
      b.set_current_key(key(k));
      EXPECT_EQ(v.value(), k);
    }
    for (const Fired& f : fire_all(b, t)) {
      EXPECT_TRUE(range.contains(b.key_group_of(std::get<0>(f))));
      EXPECT_EQ(std::get<1>(f), 0);
    }
  }
  EXPECT_EQ(total_entries, static_cast<size_t>(kKeys));
  EXPECT_EQ(total_timers, static_cast<size_t>(kKeys));
}

TEST_F(HeapSnapshotCowTest, RestoreErrorsNameTheKeyGroup) {
  Timers timers(backend_);
  fill(backend_, s_, 0);
  register_timers(backend_, timers, 0);
  auto snap = capture_keyed_operator(backend_, &timers);
  KeyedStateRestore restore = restore_of(*snap, snap->key_group_range());

  {  // another max parallelism
    HeapKeyedStateBackend<std::string> b(KeyGroupRange(0, 255), 256, clock_);
    Status st = restore_keyed_operator(b, restore);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ErrorCode::kState);
    EXPECT_THAT(st.error().message(), HasSubstr("max parallelism 128"));
  }
  {  // a key group of another subtask
    HeapKeyedStateBackend<std::string> b(KeyGroupRange(0, 63), kMaxP, clock_);
    Timers t(b);
    Status st = restore_keyed_operator(b, &t, restore);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ErrorCode::kState);
    EXPECT_THAT(st.error().message(), HasSubstr("key group 64"));
  }
  {  // timers for an operator without a timer service
    HeapKeyedStateBackend<std::string> b(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
    Status st = restore_keyed_operator(b, restore);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ErrorCode::kState);
    EXPECT_THAT(st.error().message(), HasSubstr("timer service"));
    EXPECT_THAT(st.error().message(), HasSubstr("key group"));
  }
  {  // corrupt bytes
    KeyedStateRestore bad;
    bad.max_parallelism = kMaxP;
    std::string bytes(restore.key_groups.at(7));
    bad.add_copy(7, bytes.substr(0, bytes.size() - 1));
    HeapKeyedStateBackend<std::string> b(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
    Timers t(b);
    Status st = restore_keyed_operator(b, &t, bad);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.error().message(), HasSubstr("key group 7"));
    bad.add_copy(7, bytes + "x");
    st = restore_keyed_operator(b, &t, bad);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ErrorCode::kSerialization);
    EXPECT_THAT(st.error().message(), HasSubstr("key group 7"));
  }
  {  // an operator without timers restores its own blobs
    auto plain = capture_keyed_operator(backend_);
    HeapKeyedStateBackend<std::string> b(KeyGroupRange(0, kMaxP - 1), kMaxP, clock_);
    ASSERT_TRUE(restore_keyed_operator(b, restore_of(*plain, plain->key_group_range())).ok());
    EXPECT_EQ(b.num_entries(), backend_.num_entries());
  }
}

}  // namespace
}  // namespace sluice
