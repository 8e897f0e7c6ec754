// The keyed-state suite run against both backends (heap and rocksdb), plus what only concerns their
// exchange: canonical key-group snapshots that restore across backends (savepoints stay canonical) and
// rescaling 2 -> 3 -> 1 by key-group ranges.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/config.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_state_store.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

struct Window {
  int64_t start = 0;
  int64_t end = 0;
  friend bool operator==(const Window&, const Window&) = default;
};
SLUICE_FIELDS(Window, start, end);

template <class Fn>
ErrorCode code_of(Fn&& fn) {
  try {
    fn();
  } catch (const SluiceException& e) {
    return e.error().code();
  }
  return ErrorCode::kOk;
}

template <class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const SluiceException& e) {
    return e.error().message();
  }
  return "";
}

std::filesystem::path fresh_dir() {
  static std::atomic<int> counter{0};
  return std::filesystem::path(::testing::TempDir()) /
         ("sluice-rocksdb-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
}

struct Heap {
  template <class K>
  using Backend = HeapKeyedStateBackend<K>;
  template <class K>
  static std::unique_ptr<Backend<K>> make(KeyGroupRange range, int max_parallelism, const Clock& clock) {
    return std::make_unique<Backend<K>>(range, max_parallelism, clock);
  }
};

struct RocksDB {
  template <class K>
  using Backend = RocksDBKeyedStateBackend<K>;
  template <class K>
  static std::unique_ptr<Backend<K>> make(KeyGroupRange range, int max_parallelism, const Clock& clock) {
    return std::make_unique<Backend<K>>(range, max_parallelism, clock, fresh_dir());
  }
};

KeyGroupRange full_range() {
  return KeyGroupRange(0, kDefaultMaxParallelism - 1);
}

// Average of ints: accumulator (sum, count).
class Average final : public AggregateFunction<int, std::pair<int64_t, int64_t>, double> {
 public:
  std::pair<int64_t, int64_t> create_accumulator() override { return {0, 0}; }
  void add(const int& v, std::pair<int64_t, int64_t>& acc) override {
    acc.first += v;
    ++acc.second;
  }
  double get_result(const std::pair<int64_t, int64_t>& acc) override {
    return static_cast<double>(acc.first) / static_cast<double>(acc.second);
  }
  std::pair<int64_t, int64_t> merge(std::pair<int64_t, int64_t> a, const std::pair<int64_t, int64_t>& b) override {
    return {a.first + b.first, a.second + b.second};
  }
};

template <class B>
class KeyedStateBackendTest : public ::testing::Test {
 protected:
  ManualClock clock_{1000};
  std::unique_ptr<typename B::template Backend<std::string>> backend_ =
      B::template make<std::string>(full_range(), kDefaultMaxParallelism, clock_);
};

using Backends = ::testing::Types<Heap, RocksDB>;
class BackendNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, Heap> ? "heap" : "rocksdb";
  }
};
TYPED_TEST_SUITE(KeyedStateBackendTest, Backends, BackendNames);

TYPED_TEST(KeyedStateBackendTest, ValueStateIsPerKey) {
  auto& b = *this->backend_;
  auto& count = b.get_state(ValueStateDescriptor<int64_t>{"count", -1});
  b.set_current_key("a");
  EXPECT_FALSE(count.has_value());
  EXPECT_EQ(count.value(), -1);  // the descriptor's default
  count.update(1);
  b.set_current_key("b");
  EXPECT_EQ(count.value(), -1);
  count.update(count.value() + 10);
  b.set_current_key("a");
  EXPECT_TRUE(count.has_value());
  EXPECT_EQ(count.value(), 1);
  count.clear();
  EXPECT_FALSE(count.has_value());
  b.set_current_key("b");
  EXPECT_EQ(count.value(), 9);
  EXPECT_EQ(b.num_entries("count"), 1u);
  EXPECT_EQ(b.current_key(), "b");
}

TYPED_TEST(KeyedStateBackendTest, UserFacingInterfaceWorks) {
  auto& b = *this->backend_;
  ValueState<std::string>& s = b.get_state(ValueStateDescriptor<std::string>{"s"});
  b.set_current_key("k");
  EXPECT_EQ(s.value(), "");
  std::string long_value(100, 'x');
  s.update(long_value);
  EXPECT_EQ(s.value(), long_value);
  s.update(std::string("moved"));
  EXPECT_EQ(s.value(), "moved");
}

TYPED_TEST(KeyedStateBackendTest, SameNameReturnsSameObjectAndMismatchesThrow) {
  auto& b = *this->backend_;
  auto& x1 = b.get_state(ValueStateDescriptor<int>{"x"});
  auto& x2 = b.get_state(ValueStateDescriptor<int>{"x"});
  EXPECT_EQ(&x1, &x2);
  std::string kind_msg = message_of([&] { b.get_state(ListStateDescriptor<int>{"x"}); });
  EXPECT_THAT(kind_msg, HasSubstr("'x'"));
  EXPECT_THAT(kind_msg, HasSubstr("value state"));
  EXPECT_THAT(kind_msg, HasSubstr("list state"));
  EXPECT_EQ(code_of([&] { b.get_state(ValueStateDescriptor<std::string>{"x"}); }), ErrorCode::kState);
  EXPECT_EQ(code_of([&] { b.template get_partitioned_state<Window>(ValueStateDescriptor<int>{"x"}); }),
            ErrorCode::kState);
  EXPECT_EQ(code_of([&] { b.get_state(ValueStateDescriptor<int>{""}); }), ErrorCode::kConfiguration);
  EXPECT_EQ(code_of([&] { b.get_state(ReducingStateDescriptor<int>{"r", nullptr}); }), ErrorCode::kConfiguration);
}

TYPED_TEST(KeyedStateBackendTest, AccessWithoutCurrentKeyThrows) {
  auto& s = this->backend_->get_state(ValueStateDescriptor<int>{"v"});
  EXPECT_THAT(message_of([&] { s.value(); }), HasSubstr("no current key"));
  EXPECT_EQ(code_of([&] { s.update(1); }), ErrorCode::kState);
}

TYPED_TEST(KeyedStateBackendTest, KeyOutsideRangeThrowsNamingGroupAndRange) {
  ManualClock clock;
  KeyGroupRange range = KeyGroupRange::for_operator_index(128, 2, 0);  // [0, 63]
  auto backend = TypeParam::template make<int64_t>(range, 128, clock);
  int64_t outside = 0;
  while (range.contains(backend->key_group_of(outside)))
    ++outside;
  int64_t inside = 0;
  while (!range.contains(backend->key_group_of(inside)))
    ++inside;
  backend->set_current_key(inside);
  std::string msg = message_of([&] { backend->set_current_key(outside); });
  EXPECT_THAT(msg, HasSubstr("key group " + std::to_string(backend->key_group_of(outside).value)));
  EXPECT_THAT(msg, HasSubstr("[0, 63]"));
  EXPECT_EQ(backend->current_key(), inside);
}

TYPED_TEST(KeyedStateBackendTest, NamespacesSeparateValuesOfOneKey) {
  auto& b = *this->backend_;
  auto& sum = b.template get_partitioned_state<Window>(ValueStateDescriptor<int64_t>{"sum"});
  b.set_current_key("k");
  sum.set_current_namespace(Window{0, 10});
  sum.update(5);
  sum.set_current_namespace(Window{10, 20});
  EXPECT_FALSE(sum.has_value());
  sum.update(7);
  sum.set_current_namespace(Window{0, 10});
  EXPECT_EQ(sum.value(), 5);
  EXPECT_EQ(sum.current_namespace(), (Window{0, 10}));
  b.set_current_key("other");
  EXPECT_FALSE(sum.has_value());
  b.set_current_key("k");
  EXPECT_EQ(sum.value(), 5);  // the namespace stays set across key changes
  EXPECT_EQ(b.num_entries("sum"), 2u);
}

TYPED_TEST(KeyedStateBackendTest, ListState) {
  auto& b = *this->backend_;
  auto& list = b.get_state(ListStateDescriptor<std::string>{"list"});
  b.set_current_key("k");
  EXPECT_THAT(list.get(), IsEmpty());
  list.add("a");
  list.add(std::string("b"));
  list.add_all({"c", "d"});
  list.add_all({});
  EXPECT_THAT(list.get(), ElementsAre("a", "b", "c", "d"));
  b.set_current_key("j");
  EXPECT_THAT(list.get(), IsEmpty());
  list.update({"x"});
  EXPECT_THAT(list.get(), ElementsAre("x"));
  list.update({});  // an empty update clears, as in Flink
  EXPECT_EQ(b.num_entries("list"), 1u);
  b.set_current_key("k");
  list.clear();
  EXPECT_THAT(list.get(), IsEmpty());
  EXPECT_EQ(b.num_entries("list"), 0u);
}

TYPED_TEST(KeyedStateBackendTest, MapState) {
  auto& b = *this->backend_;
  auto& map = b.get_state(MapStateDescriptor<std::string, int>{"map"});
  b.set_current_key("k");
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(map.get("a"), std::nullopt);
  EXPECT_EQ(map.find("a"), nullptr);
  map.put("a", 1);
  map.put("b", 2);
  map.put_all({{"c", 3}, {"a", 10}});
  EXPECT_FALSE(map.is_empty());
  EXPECT_EQ(map.get("a"), 10);
  ASSERT_NE(map.find("b"), nullptr);
  EXPECT_EQ(*map.find("b"), 2);
  EXPECT_TRUE(map.contains("c"));
  EXPECT_FALSE(map.contains("z"));
  EXPECT_THAT(map.keys(), UnorderedElementsAre("a", "b", "c"));
  EXPECT_THAT(map.values(), UnorderedElementsAre(10, 2, 3));
  EXPECT_THAT(map.entries(),
              UnorderedElementsAre(std::pair<std::string, int>{"a", 10}, std::pair<std::string, int>{"b", 2},
                                   std::pair<std::string, int>{"c", 3}));
  int total = 0;
  map.for_each([&](const std::string&, const int& v) { total += v; });
  EXPECT_EQ(total, 15);

  // A key whose bytes start with the other key's bytes: its entries stay apart.
  b.set_current_key("kk");
  EXPECT_TRUE(map.is_empty());
  map.put("only", 1);
  map.remove("only");  // the last user key removes the entry
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(b.num_entries("map"), 1u);

  b.set_current_key("k");
  map.remove("a");
  EXPECT_FALSE(map.contains("a"));
  map.clear();
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(b.num_entries("map"), 0u);
}

TYPED_TEST(KeyedStateBackendTest, ReducingState) {
  auto& b = *this->backend_;
  auto& sum =
      b.get_state(ReducingStateDescriptor<int64_t>{"sum", [](const int64_t& x, const int64_t& y) { return x + y; }});
  b.set_current_key("k");
  EXPECT_EQ(sum.get(), std::nullopt);
  sum.add(3);
  sum.add(4);
  EXPECT_EQ(sum.get(), 7);
  b.set_current_key("j");
  sum.add(1);
  EXPECT_EQ(sum.get(), 1);
  sum.clear();
  EXPECT_EQ(sum.get(), std::nullopt);
  b.set_current_key("k");
  EXPECT_EQ(sum.get(), 7);
}

TYPED_TEST(KeyedStateBackendTest, AggregatingState) {
  auto& b = *this->backend_;
  auto& avg = b.get_state(
      AggregatingStateDescriptor<int, std::pair<int64_t, int64_t>, double>{"avg", std::make_shared<Average>()});
  b.set_current_key("k");
  EXPECT_EQ(avg.get(), std::nullopt);
  avg.add(1);
  avg.add(2);
  EXPECT_DOUBLE_EQ(*avg.get(), 1.5);
  b.set_current_key("j");
  EXPECT_EQ(avg.get(), std::nullopt);
  avg.add(10);
  EXPECT_DOUBLE_EQ(*avg.get(), 10.0);
  avg.clear();
  EXPECT_EQ(avg.get(), std::nullopt);
}

TYPED_TEST(KeyedStateBackendTest, MergeNamespacesOfListReducingAndAggregatingState) {
  auto& b = *this->backend_;
  auto& list = b.template get_partitioned_state<Window>(ListStateDescriptor<int>{"list"});
  auto& sum = b.template get_partitioned_state<Window>(
      ReducingStateDescriptor<int>{"sum", [](const int& x, const int& y) { return x + y; }});
  auto& avg = b.template get_partitioned_state<Window>(
      AggregatingStateDescriptor<int, std::pair<int64_t, int64_t>, double>{"avg", std::make_shared<Average>()});
  const Window w1{0, 10}, w2{5, 15}, w3{12, 20}, merged{0, 20};
  b.set_current_key("k");
  int v = 1;
  for (const Window& w : {w1, w2, w3}) {
    list.set_current_namespace(w);
    sum.set_current_namespace(w);
    avg.set_current_namespace(w);
    list.add(v);
    sum.add(v);
    avg.add(v);
    ++v;
  }
  std::vector<Window> sources{w1, w2, w3};
  list.merge_namespaces(merged, sources);
  sum.merge_namespaces(merged, sources);
  avg.merge_namespaces(merged, sources);
  list.set_current_namespace(merged);
  sum.set_current_namespace(merged);
  avg.set_current_namespace(merged);
  EXPECT_THAT(list.get(), ElementsAre(1, 2, 3));
  EXPECT_EQ(sum.get(), 6);
  EXPECT_DOUBLE_EQ(*avg.get(), 2.0);
  for (const Window& w : sources) {
    list.set_current_namespace(w);
    EXPECT_THAT(list.get(), IsEmpty());
  }
  EXPECT_EQ(b.num_entries("list") + b.num_entries("sum") + b.num_entries("avg"), 3u);

  list.set_current_namespace(w1);
  list.add(9);
  std::vector<Window> more{w1};
  list.merge_namespaces(merged, more);
  list.set_current_namespace(merged);
  EXPECT_THAT(list.get(), ElementsAre(1, 2, 3, 9));
}

// ---------------------------------------------------------------------------------------------------------
// Snapshots: the same canonical key-group blobs from both backends
// ---------------------------------------------------------------------------------------------------------

using Acc = std::pair<int64_t, int64_t>;
auto plus = [](const int64_t& x, const int64_t& y) { return x + y; };

// Registers one state of each kind (two with a window namespace).
template <class Backend>
struct AllStates {
  explicit AllStates(Backend& b)
      : value(b.get_state(ValueStateDescriptor<std::string>{"value"})),
        list(b.template get_partitioned_state<Window>(ListStateDescriptor<int64_t>{"list"})),
        map(b.get_state(MapStateDescriptor<std::string, int64_t>{"map"})),
        reducing(b.template get_partitioned_state<Window>(ReducingStateDescriptor<int64_t>{"reducing", plus})),
        aggregating(
            b.get_state(AggregatingStateDescriptor<int, Acc, double>{"aggregating", std::make_shared<Average>()})) {}
  decltype(std::declval<Backend&>().get_state(ValueStateDescriptor<std::string>{})) value;
  decltype(std::declval<Backend&>().template get_partitioned_state<Window>(ListStateDescriptor<int64_t>{})) list;
  decltype(std::declval<Backend&>().get_state(MapStateDescriptor<std::string, int64_t>{})) map;
  decltype(std::declval<Backend&>().template get_partitioned_state<Window>(
      ReducingStateDescriptor<int64_t>{})) reducing;
  decltype(std::declval<Backend&>().get_state(AggregatingStateDescriptor<int, Acc, double>{})) aggregating;
};

// Writes a deterministic content for keys [first, last) (only those the backend owns).
template <class Backend>
void fill(Backend& b, int64_t first, int64_t last) {
  AllStates<Backend> s(b);
  for (int64_t k = first; k < last; ++k) {
    if (!b.key_group_range().contains(b.key_group_of(k))) continue;
    b.set_current_key(k);
    s.value.update("v" + std::to_string(k));
    s.list.set_current_namespace(Window{k, k + 10});
    for (int64_t e = 0; e <= k % 3; ++e)
      s.list.add(k * 10 + e);
    for (int64_t e = 0; e <= k % 4; ++e)
      s.map.put("m" + std::to_string(e), k + e);
    s.reducing.set_current_namespace(Window{0, k % 2});
    s.reducing.add(k);
    s.reducing.add(1);
    s.aggregating.add(static_cast<int>(k));
    s.aggregating.add(static_cast<int>(k) + 2);
  }
}

// Checks what fill() wrote for keys [first, last) that the backend owns; returns how many keys it owns.
template <class Backend>
int64_t verify(Backend& b, int64_t first, int64_t last) {
  AllStates<Backend> s(b);
  int64_t owned = 0;
  for (int64_t k = first; k < last; ++k) {
    if (!b.key_group_range().contains(b.key_group_of(k))) continue;
    ++owned;
    SCOPED_TRACE("key " + std::to_string(k));
    b.set_current_key(k);
    EXPECT_EQ(s.value.value(), "v" + std::to_string(k));
    s.list.set_current_namespace(Window{k, k + 10});
    std::vector<int64_t> expected_list;
    for (int64_t e = 0; e <= k % 3; ++e)
      expected_list.push_back(k * 10 + e);
    EXPECT_EQ(s.list.get(), expected_list);
    std::vector<std::pair<std::string, int64_t>> expected_map;
    for (int64_t e = 0; e <= k % 4; ++e)
      expected_map.emplace_back("m" + std::to_string(e), k + e);
    auto entries = s.map.entries();
    std::sort(entries.begin(), entries.end());
    EXPECT_EQ(entries, expected_map);
    s.reducing.set_current_namespace(Window{0, k % 2});
    EXPECT_EQ(s.reducing.get(), k + 1);
    EXPECT_DOUBLE_EQ(*s.aggregating.get(), static_cast<double>(k) + 1.0);
  }
  return owned;
}

// Every key group of `b` as a KeyedStateRestore-like map.
template <class Backend>
std::map<int32_t, std::string> snapshot_groups(const Backend& b) {
  std::map<int32_t, std::string> groups;
  for (int32_t kg = b.key_group_range().start(); kg <= b.key_group_range().end(); ++kg) {
    DataOutput out;
    b.snapshot_key_group(KeyGroup{kg}, out);
    groups[kg] = std::string(out.view());
  }
  return groups;
}

template <class Backend>
void restore_groups(Backend& b, const std::map<int32_t, std::string>& groups) {
  for (const auto& [kg, bytes] : groups) {
    if (!b.key_group_range().contains(KeyGroup{kg})) continue;
    DataInput in(bytes);
    Status st = b.restore_key_group(KeyGroup{kg}, in);
    ASSERT_TRUE(st.ok()) << st.error().message();
  }
}

TYPED_TEST(KeyedStateBackendTest, SnapshotRestoresBeforeAndAfterRegistration) {
  ManualClock clock;
  auto source = TypeParam::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  fill(*source, 0, 300);
  auto groups = snapshot_groups(*source);

  auto registered_first = TypeParam::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  { AllStates<typename TypeParam::template Backend<int64_t>> s(*registered_first); }
  restore_groups(*registered_first, groups);
  EXPECT_EQ(verify(*registered_first, 0, 300), 300);

  auto lazy = TypeParam::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  restore_groups(*lazy, groups);
  EXPECT_EQ(lazy->state_names(), (std::vector<std::string>{"aggregating", "list", "map", "reducing", "value"}));
  // Not registered yet: written back unchanged by the next snapshot.
  EXPECT_EQ(snapshot_groups(*lazy), groups);
  EXPECT_EQ(verify(*lazy, 0, 300), 300);
}

template <class From, class To>
void check_cross_backend() {
  ManualClock clock;
  auto source = From::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  fill(*source, 0, 500);
  auto groups = snapshot_groups(*source);
  auto target = To::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  restore_groups(*target, groups);
  EXPECT_EQ(verify(*target, 0, 500), 500);
  // And back: the restored state snapshots to blobs the first backend reads.
  auto back = From::template make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  { AllStates<typename To::template Backend<int64_t>> s(*target); }
  restore_groups(*back, snapshot_groups(*target));
  EXPECT_EQ(verify(*back, 0, 500), 500);
}

TEST(CrossBackendTest, HeapSnapshotRestoresIntoRocksDBAndBack) {
  check_cross_backend<Heap, RocksDB>();
}

TEST(CrossBackendTest, RocksDBSnapshotRestoresIntoHeapAndBack) {
  check_cross_backend<RocksDB, Heap>();
}

TEST(CrossBackendTest, ValueStateKeyGroupBytesAreIdentical) {
  // The documented example of docs/state-format.md: both backends write the same bytes.
  ManualClock clock;
  Heap::Backend<int32_t> heap(full_range(), kDefaultMaxParallelism, clock);
  auto rocks = RocksDB::make<int32_t>(full_range(), kDefaultMaxParallelism, clock);
  heap.set_current_key(7);
  heap.get_state(ValueStateDescriptor<int32_t>{"v"}).update(42);
  rocks->set_current_key(7);
  rocks->get_state(ValueStateDescriptor<int32_t>{"v"}).update(42);
  KeyGroup kg = heap.key_group_of(7);
  DataOutput a;
  DataOutput b;
  heap.snapshot_key_group(kg, a);
  rocks->snapshot_key_group(kg, b);
  EXPECT_EQ(a.view(), b.view());
  EXPECT_EQ(b.size(), 3u + 2u + 3u + 8u + 8u);  // header, name, kind/flags/count, length, entry
}

TEST(RocksDBBackendTest, RescaleTwoToThreeToOne) {
  ManualClock clock;
  constexpr int kMaxp = 128;
  constexpr int64_t kKeys = 600;
  std::map<int32_t, std::string> groups;
  for (int i = 0; i < 2; ++i) {
    auto b = RocksDB::make<int64_t>(KeyGroupRange::for_operator_index(kMaxp, 2, i), kMaxp, clock);
    fill(*b, 0, kKeys);
    groups.merge(snapshot_groups(*b));
  }
  ASSERT_EQ(groups.size(), static_cast<size_t>(kMaxp));
  std::map<int32_t, std::string> groups3;
  int64_t owned = 0;
  for (int i = 0; i < 3; ++i) {
    auto b = RocksDB::make<int64_t>(KeyGroupRange::for_operator_index(kMaxp, 3, i), kMaxp, clock);
    restore_groups(*b, groups);
    owned += verify(*b, 0, kKeys);
    groups3.merge(snapshot_groups(*b));
  }
  EXPECT_EQ(owned, kKeys);
  auto one = RocksDB::make<int64_t>(KeyGroupRange(0, kMaxp - 1), kMaxp, clock);
  restore_groups(*one, groups3);
  EXPECT_EQ(verify(*one, 0, kKeys), kKeys);
  EXPECT_EQ(one->num_entries("value"), static_cast<size_t>(kKeys));
}

TEST(RocksDBBackendTest, CaptureIsConsistentWhileTheTaskWritesAndOutlivesTheBackend) {
  ManualClock clock;
  auto b = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  fill(*b, 0, 200);
  std::unique_ptr<KeyedStateSnapshot> capture = b->capture();
  auto expected = snapshot_groups(*b);
  // Writes after the capture are not in it.
  fill(*b, 200, 400);
  auto& value = b->get_state(ValueStateDescriptor<std::string>{"value"});
  b->set_current_key(int64_t{3});
  value.update("changed");
  const std::filesystem::path dir = b->directory();
  b.reset();  // the task ends; the capture keeps the database open
  EXPECT_TRUE(std::filesystem::exists(dir));
  for (int32_t kg = 0; kg < kDefaultMaxParallelism; ++kg) {
    DataOutput out;
    capture->write_key_group(KeyGroup{kg}, out);
    EXPECT_EQ(std::string(out.view()), expected[kg]) << "key group " << kg;
  }
  capture.reset();
  EXPECT_FALSE(std::filesystem::exists(dir));  // the working directory goes with the last user
}

TEST(RocksDBBackendTest, TtlReturnExpiredIfNotCleanedUpIsRefusedWithAClearError) {
  ManualClock clock;
  auto b = RocksDB::make<std::string>(full_range(), kDefaultMaxParallelism, clock);
  auto ttl = StateTtlConfig::of(1000).with_visibility(StateTtlConfig::Visibility::kReturnExpiredIfNotCleanedUp);
  std::string msg = message_of([&] { b->get_state(ValueStateDescriptor<int>{"t", 0, ttl}); });
  EXPECT_THAT(msg, HasSubstr("'t'"));
  EXPECT_THAT(msg, HasSubstr("ReturnExpiredIfNotCleanedUp is not supported by the rocksdb state backend"));
  EXPECT_EQ(code_of([&] { b->get_state(MapStateDescriptor<int, int>{"m", ttl}); }), ErrorCode::kConfiguration);
}

// TTL on both backends: never return expired, per element for lists and maps, refresh on read.
TYPED_TEST(KeyedStateBackendTest, TtlNeverReturnsExpiredValues) {
  auto& b = *this->backend_;
  auto& clock = this->clock_;
  const auto ttl = StateTtlConfig::of(100);
  auto& value = b.get_state(ValueStateDescriptor<int>{"value", -1, ttl});
  auto& list = b.get_state(ListStateDescriptor<int>{"list", ttl});
  auto& map = b.get_state(MapStateDescriptor<std::string, int>{"map", ttl});
  auto& sum = b.get_state(ReducingStateDescriptor<int>{"sum", [](const int& x, const int& y) { return x + y; }, ttl});
  auto& avg = b.get_state(AggregatingStateDescriptor<int, Acc, double>{"avg", std::make_shared<Average>(), ttl});
  b.set_current_key("k");
  value.update(1);
  list.add(1);
  map.put("a", 1);
  sum.add(1);
  avg.add(1);
  clock.set(1050);
  list.add(2);
  map.put("b", 2);
  EXPECT_EQ(value.value(), 1);
  clock.set(1100);  // written at 1000: expired now (last access + ttl <= now)
  EXPECT_FALSE(value.has_value());
  EXPECT_EQ(value.value(), -1);
  EXPECT_THAT(list.get(), ElementsAre(2));
  EXPECT_EQ(map.get("a"), std::nullopt);
  EXPECT_THAT(map.keys(), ElementsAre("b"));
  EXPECT_EQ(sum.get(), std::nullopt);
  EXPECT_EQ(avg.get(), std::nullopt);
  sum.add(5);  // an expired value is absent for add too
  EXPECT_EQ(sum.get(), 5);
  clock.set(1150);
  EXPECT_THAT(list.get(), IsEmpty());
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(b.num_entries("list") + b.num_entries("map") + b.num_entries("value"), 0u);

  // OnReadAndWrite: a read refreshes.
  auto& touched = b.get_state(ValueStateDescriptor<int>{
      "touched", 0, StateTtlConfig::of(100).with_update_type(StateTtlConfig::UpdateType::kOnReadAndWrite)});
  touched.update(7);
  clock.set(1240);
  EXPECT_EQ(touched.value(), 7);
  clock.set(1300);
  EXPECT_EQ(touched.value(), 7);  // 1240 + 100 > 1300
  clock.set(1400);
  EXPECT_FALSE(touched.has_value());
}

// TTL timestamps travel in snapshots in both directions: an entry expires at the same time after a
// heap -> rocksdb -> heap round trip.
TEST(CrossBackendTest, TtlTimestampsSurviveBackendChanges) {
  ManualClock clock(1000);
  const auto ttl = StateTtlConfig::of(100);
  Heap::Backend<int64_t> heap(full_range(), kDefaultMaxParallelism, clock);
  auto& hv = heap.get_state(ValueStateDescriptor<int64_t>{"v", -1, ttl});
  auto& hl = heap.get_state(ListStateDescriptor<int64_t>{"l", ttl});
  auto& hm = heap.get_state(MapStateDescriptor<int64_t, int64_t>{"m", ttl});
  for (int64_t k = 0; k < 100; ++k) {
    clock.set(1000 + k);  // key k written at 1000 + k: expires at 1100 + k
    heap.set_current_key(k);
    hv.update(k);
    hl.add(k);
    hm.put(k, k);
  }
  auto rocks = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  restore_groups(*rocks, snapshot_groups(heap));
  auto& rv = rocks->get_state(ValueStateDescriptor<int64_t>{"v", -1, ttl});
  auto& rl = rocks->get_state(ListStateDescriptor<int64_t>{"l", ttl});
  auto& rm = rocks->get_state(MapStateDescriptor<int64_t, int64_t>{"m", ttl});
  Heap::Backend<int64_t> back(full_range(), kDefaultMaxParallelism, clock);
  restore_groups(back, snapshot_groups(*rocks));
  auto& bv = back.get_state(ValueStateDescriptor<int64_t>{"v", -1, ttl});
  clock.set(1150);  // keys <= 50 expired
  for (int64_t k = 0; k < 100; ++k) {
    rocks->set_current_key(k);
    back.set_current_key(k);
    const bool live = k > 50;  // key k expires at 1100 + k (last access + ttl <= now)
    EXPECT_EQ(rv.value(), live ? k : -1) << k;
    EXPECT_EQ(rl.get().size(), live ? 1u : 0u) << k;
    EXPECT_EQ(rm.contains(k), live) << k;
    EXPECT_EQ(bv.value(), live ? k : -1) << k;
  }
}

// Expired entries nobody reads are dropped by compaction (the TTL compaction filter); list elements one by one.
TEST(RocksDBBackendTest, CompactionDropsExpiredEntries) {
  ManualClock clock(1000);
  auto b = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  const auto ttl = StateTtlConfig::of(100);
  auto& value = b->get_state(ValueStateDescriptor<int64_t>{"value", 0, ttl});
  auto& list = b->get_state(ListStateDescriptor<int64_t>{"list", ttl});
  auto& map = b->get_state(MapStateDescriptor<int64_t, int64_t>{"map", ttl});
  for (int64_t k = 0; k < 200; ++k) {
    b->set_current_key(k);
    value.update(k);
    list.add(k);
    map.put(k, k);
  }
  clock.set(1060);
  for (int64_t k = 0; k < 200; k += 2) {  // even keys get a later list element and a later value
    b->set_current_key(k);
    list.add(k + 1000);
    value.update(k);
  }
  b->instance().compact();
  EXPECT_EQ(b->num_entries("value"), 200u);  // nothing expired yet
  clock.set(1100);                           // the writes at 1000 expire
  b->instance().compact();
  EXPECT_EQ(b->num_entries("value"), 100u);
  EXPECT_EQ(b->num_entries("map"), 0u);
  EXPECT_EQ(b->num_entries("list"), 100u);
  // The compaction rewrote the even keys' lists to their live element: what is stored (restored into a
  // heap backend whose clock says nothing has expired) no longer holds the expired elements.
  ManualClock before(1000);
  Heap::Backend<int64_t> stored(full_range(), kDefaultMaxParallelism, before);
  restore_groups(stored, snapshot_groups(*b));
  auto& stored_list = stored.get_state(ListStateDescriptor<int64_t>{"list", ttl});
  for (int64_t k = 0; k < 200; ++k) {
    stored.set_current_key(k);
    if (k % 2 == 0) {
      EXPECT_THAT(stored_list.get(), ElementsAre(k + 1000)) << k;
    } else {
      EXPECT_THAT(stored_list.get(), IsEmpty()) << k;
    }
  }
}

TEST(RocksDBBackendTest, RestoreErrorsNameTheProblem) {
  ManualClock clock;
  auto source = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  fill(*source, 0, 50);
  auto groups = snapshot_groups(*source);
  // A key group whose blob says another key group.
  auto target = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  int32_t kg = source->key_group_of(int64_t{1}).value;
  DataInput wrong(groups[kg]);
  Status st = target->restore_key_group(KeyGroup{(kg + 1) % kDefaultMaxParallelism}, wrong);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message(), HasSubstr("hold key group " + std::to_string(kg)));
  // A kind that does not match the registration.
  auto& as_value = target->get_state(ValueStateDescriptor<int64_t>{"list"});
  (void)as_value;
  DataInput kind(groups[kg]);
  st = target->restore_key_group(KeyGroup{kg}, kind);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kState);
  EXPECT_THAT(st.error().message(), HasSubstr("'list'"));
  // Truncated bytes: an error, never a crash.
  auto fresh = RocksDB::make<int64_t>(full_range(), kDefaultMaxParallelism, clock);
  { AllStates<RocksDB::Backend<int64_t>> s(*fresh); }
  const std::string& full = groups[kg];
  for (size_t cut : {size_t{1}, full.size() / 2, full.size() - 1}) {
    DataInput in(std::string_view(full).substr(0, cut));
    EXPECT_FALSE(fresh->restore_key_group(KeyGroup{kg}, in).ok()) << "cut at " << cut;
  }
}

// Memory: with a managed-memory budget, memtables and block cache together stay near the budget while the
// state grows past it; without one, the memtable alone grows past it (so the check can fail).
uint64_t peak_memory_writing(const RocksDBMemoryOptions& memory, uint64_t state_bytes) {
  ManualClock clock;
  RocksDB::Backend<int64_t> b(full_range(), kDefaultMaxParallelism, clock, fresh_dir(), memory);
  auto& value = b.get_state(ValueStateDescriptor<std::string>{"payload"});
  const std::string payload(1024, 'p');
  const int64_t keys = static_cast<int64_t>(state_bytes / payload.size());
  uint64_t peak = 0;
  for (int64_t k = 0; k < keys; ++k) {
    b.set_current_key(k);
    value.update(payload);
    if (k % 512 == 0) peak = std::max(peak, b.instance().memory_usage());
  }
  // Everything is still there, larger than the budget.
  for (int64_t k = 0; k < keys; k += 997) {
    b.set_current_key(k);
    EXPECT_EQ(value.value(), payload) << "key " << k;
  }
  return peak;
}

TEST(RocksDBBackendTest, ManagedMemoryBoundsMemtablesAndCache) {
  constexpr uint64_t kBudget = 4ULL << 20;
  constexpr uint64_t kState = 24ULL << 20;
  RocksDBMemoryOptions bounded;
  bounded.managed_bytes = kBudget;
  uint64_t with_budget = peak_memory_writing(bounded, kState);
  uint64_t without = peak_memory_writing(RocksDBMemoryOptions{}, kState);
  std::printf("peak RocksDB memory writing %llu MiB of state: %llu KiB with a %llu KiB budget, %llu KiB without\n",
              static_cast<unsigned long long>(kState >> 20), static_cast<unsigned long long>(with_budget >> 10),
              static_cast<unsigned long long>(kBudget >> 10), static_cast<unsigned long long>(without >> 10));
  EXPECT_LE(with_budget, kBudget + kBudget / 4);
  EXPECT_GT(without, kBudget * 2);
}

// A slot's budget (state.backend.rocksdb.memory.fixed-per-slot, as Flink): the databases of one shared scope draw on
// one block cache and write buffer manager, so together they stay near one budget; another slot has its own.
TEST(RocksDBBackendTest, TheDatabasesOfOneSlotShareOneBudget) {
  constexpr uint64_t kBudget = 4ULL << 20;
  constexpr uint64_t kStatePerDatabase = 8ULL << 20;
  ManualClock clock;
  RocksDBMemoryOptions slot0;
  slot0.managed_bytes = kBudget;
  slot0.shared_scope = "job j, slot 0";
  RocksDBMemoryOptions slot1 = slot0;
  slot1.shared_scope = "job j, slot 1";
  std::vector<std::unique_ptr<RocksDB::Backend<int64_t>>> shared;
  for (int i = 0; i < 3; ++i) {
    shared.push_back(
        std::make_unique<RocksDB::Backend<int64_t>>(full_range(), kDefaultMaxParallelism, clock, fresh_dir(), slot0));
  }
  RocksDB::Backend<int64_t> other(full_range(), kDefaultMaxParallelism, clock, fresh_dir(), slot1);
  EXPECT_EQ(shared[0]->instance().databases_sharing_budget(), 3u);
  EXPECT_EQ(other.instance().databases_sharing_budget(), 1u);

  const std::string payload(1024, 'p');
  // Half a memtable into the first database: the idle second one sees its reservation in their common cache,
  // the other slot's database does not.
  auto& first = shared[0]->get_state(ValueStateDescriptor<std::string>{"payload"});
  const uint64_t idle_before = shared[1]->instance().memory_usage();
  const uint64_t other_before = other.instance().memory_usage();
  for (int64_t k = 0; k < 600; ++k) {
    shared[0]->set_current_key(k);
    first.update(payload);
  }
  std::printf(
      "an idle database's accounted memory after 600 KiB into another: %llu -> %llu KiB in its slot, "
      "%llu -> %llu KiB in another slot\n",
      static_cast<unsigned long long>(idle_before >> 10),
      static_cast<unsigned long long>(shared[1]->instance().memory_usage() >> 10),
      static_cast<unsigned long long>(other_before >> 10),
      static_cast<unsigned long long>(other.instance().memory_usage() >> 10));
  EXPECT_GE(shared[1]->instance().memory_usage(), idle_before + (256u << 10))
      << "the memtable of a database of the same slot is charged to their common budget";
  EXPECT_EQ(other.instance().memory_usage(), other_before) << "a database of another slot";

  // All three written past the budget, in turns: their common cache, charged with every memtable of the three,
  // stays near one budget. (With a budget each, each cache would stay near its own budget too: the check above
  // is the one that tells sharing apart.)
  using State = std::remove_reference_t<decltype(first)>;
  std::vector<State*> values;
  for (auto& b : shared)
    values.push_back(&b->get_state(ValueStateDescriptor<std::string>{"payload"}));
  const int64_t keys = static_cast<int64_t>(kStatePerDatabase / payload.size());
  uint64_t peak = 0;
  for (int64_t k = 0; k < keys; ++k) {
    for (size_t i = 0; i < shared.size(); ++i) {
      shared[i]->set_current_key(k);
      values[i]->update(payload);
    }
    if (k % 256 == 0) peak = std::max(peak, shared[2]->instance().memory_usage());
  }
  std::printf("peak memory of a slot of 3 RocksDB databases writing %llu MiB each: %llu KiB, budget %llu KiB\n",
              static_cast<unsigned long long>(kStatePerDatabase >> 20), static_cast<unsigned long long>(peak >> 10),
              static_cast<unsigned long long>(kBudget >> 10));
  EXPECT_LE(peak, kBudget + kBudget / 4);
  for (size_t i = 0; i < shared.size(); ++i) {
    shared[i]->set_current_key(keys - 1);
    EXPECT_EQ(values[i]->value(), payload) << "database " << i;
  }
  shared.resize(1);
  EXPECT_EQ(shared[0]->instance().databases_sharing_budget(), 1u);
}

TEST(RocksDBBackendTest, BadMemoryRatiosAreConfigurationErrors) {
  RocksDBMemoryOptions bad;
  bad.managed_bytes = 1 << 20;
  bad.write_buffer_ratio = 1.5;
  EXPECT_THAT(message_of([&] { RocksDBInstance::open(fresh_dir(), bad); }), HasSubstr("write-buffer-ratio"));
  bad.write_buffer_ratio = 0.5;
  bad.high_priority_pool_ratio = -0.1;
  EXPECT_EQ(code_of([&] { RocksDBInstance::open(fresh_dir(), bad); }), ErrorCode::kConfiguration);
}

// state.backend.type: rocksdb and state.backend.incremental are accepted; what is not built (timers in RocksDB)
// is refused with a reason, and so are typos.
TEST(StateBackendConfigTest, RocksDBIsAcceptedAndUnbuiltOptionsAreRefused) {
  Configuration config;
  EXPECT_TRUE(validate_engine_options(config).ok());
  config.set_string("state.backend.type", "hashmap");
  EXPECT_TRUE(validate_engine_options(config).ok());
  config.set_string("state.backend.type", "RocksDB");
  EXPECT_TRUE(validate_engine_options(config).ok());
  config.set_string("state.backend.type", "heap");
  Status st = validate_engine_options(config);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(st.error().message(), HasSubstr("expected hashmap or rocksdb"));
  config.set_string("state.backend.type", "rocksdb");
  config.set_string("state.backend.incremental", "true");
  EXPECT_TRUE(validate_engine_options(config).ok());
  EXPECT_TRUE(StateBackendOptions::from_config(&config).incremental);
  config.set_string("state.backend.incremental", "false");
  EXPECT_TRUE(validate_engine_options(config).ok());
  config.set_string("state.backend.rocksdb.timer-service.factory", "ROCKSDB");
  EXPECT_TRUE(validate_engine_options(config).ok());
  EXPECT_TRUE(StateBackendOptions::from_config(&config).rocksdb_timers);
  config.set_string("state.backend.rocksdb.timer-service.factory", "disk");
  EXPECT_THAT(validate_engine_options(config).error().message(), HasSubstr("expected heap or rocksdb"));
  config.set_string("state.backend.rocksdb.timer-service.factory", "HEAP");
  EXPECT_FALSE(StateBackendOptions::from_config(&config).rocksdb_timers);
  EXPECT_TRUE(validate_engine_options(config).ok());
  config.set_string("state.backend.rocksdb.memory.fixed-per-slot", "0");
  EXPECT_THAT(validate_engine_options(config).error().message(), HasSubstr("expected a positive memory size"));
  config.set_string("state.backend.rocksdb.memory.fixed-per-slot", "16mb");
  config.set_string("state.backend.rocksdb.memory.write-buffer-ratio", "1.5");
  EXPECT_THAT(validate_engine_options(config).error().message(), HasSubstr("expected a ratio in (0, 1)"));
  config.set_string("state.backend.rocksdb.memory.write-buffer-ratio", "0.25");
  EXPECT_TRUE(validate_engine_options(config).ok());
  // One budget per slot: subtask i of every keyed operator of one job (one configuration object) in this process.
  Configuration another_job = config;
  EXPECT_EQ(StateBackendOptions::for_subtask(&config, 0).memory.shared_scope,
            StateBackendOptions::for_subtask(&config, 0).memory.shared_scope);
  EXPECT_FALSE(StateBackendOptions::for_subtask(&config, 0).memory.shared_scope.empty());
  EXPECT_NE(StateBackendOptions::for_subtask(&config, 0).memory.shared_scope,
            StateBackendOptions::for_subtask(&config, 1).memory.shared_scope);
  EXPECT_NE(StateBackendOptions::for_subtask(&config, 0).memory.shared_scope,
            StateBackendOptions::for_subtask(&another_job, 0).memory.shared_scope);
  EXPECT_EQ(StateBackendOptions::for_subtask(&config, 1).memory.managed_bytes, 16u << 20);
  EXPECT_TRUE(StateBackendOptions::for_subtask(nullptr, 0).memory.shared_scope.empty());
}

}  // namespace
}  // namespace sluice
