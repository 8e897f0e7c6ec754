#include "sluice/state/heap_keyed_state_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// A window-like namespace without absl hashing (hashed through its serialized bytes).
struct Window {
  int64_t start = 0;
  int64_t end = 0;
  friend bool operator==(const Window&, const Window&) = default;
};
SLUICE_FIELDS(Window, start, end);

KeyGroupRange full_range() {
  return KeyGroupRange(0, kDefaultMaxParallelism - 1);
}

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

class HeapBackendTest : public ::testing::Test {
 protected:
  ManualClock clock_{1000};
  HeapKeyedStateBackend<std::string> backend_{full_range(), kDefaultMaxParallelism, clock_};
};

TEST_F(HeapBackendTest, ValueStateIsPerKey) {
  auto& count = backend_.get_state(ValueStateDescriptor<int64_t>{"count", -1});
  backend_.set_current_key("a");
  EXPECT_FALSE(count.has_value());
  EXPECT_EQ(count.value(), -1);  // the descriptor's default
  count.update(1);
  backend_.set_current_key("b");
  EXPECT_EQ(count.value(), -1);
  count.update(count.value() + 10);
  backend_.set_current_key("a");
  EXPECT_TRUE(count.has_value());
  EXPECT_EQ(count.value(), 1);
  count.clear();
  EXPECT_FALSE(count.has_value());
  backend_.set_current_key("b");
  EXPECT_EQ(count.value(), 9);
  EXPECT_EQ(backend_.num_entries(), 1u);
  EXPECT_EQ(backend_.current_key(), "b");
}

TEST_F(HeapBackendTest, UserFacingInterfaceWorks) {
  ValueState<std::string>& s = backend_.get_state(ValueStateDescriptor<std::string>{"s"});
  backend_.set_current_key("k");
  EXPECT_EQ(s.value(), "");
  std::string long_value(100, 'x');
  s.update(long_value);
  EXPECT_EQ(s.value(), long_value);
  s.update(std::string("moved"));
  EXPECT_EQ(s.value(), "moved");
}

TEST_F(HeapBackendTest, SameNameReturnsSameObjectAndMismatchesThrow) {
  auto& a = backend_.get_state(ValueStateDescriptor<int>{"x"});
  auto& b = backend_.get_state(ValueStateDescriptor<int>{"x"});
  EXPECT_EQ(&a, &b);
  std::string kind_msg = message_of([&] { backend_.get_state(ListStateDescriptor<int>{"x"}); });
  EXPECT_THAT(kind_msg, HasSubstr("'x'"));
  EXPECT_THAT(kind_msg, HasSubstr("value state"));
  EXPECT_THAT(kind_msg, HasSubstr("list state"));
  EXPECT_EQ(code_of([&] { backend_.get_state(ValueStateDescriptor<std::string>{"x"}); }), ErrorCode::kState);
  EXPECT_EQ(code_of([&] { backend_.get_partitioned_state<Window>(ValueStateDescriptor<int>{"x"}); }),
            ErrorCode::kState);
  EXPECT_EQ(code_of([&] { backend_.get_state(ValueStateDescriptor<int>{""}); }), ErrorCode::kConfiguration);
  EXPECT_EQ(code_of([&] {
              backend_.get_state(ReducingStateDescriptor<int>{"r", nullptr});
            }),
            ErrorCode::kConfiguration);
  EXPECT_EQ(code_of([&] {
              backend_.get_state(ValueStateDescriptor<int>{"t", 0, StateTtlConfig::of(-5)});
            }),
            ErrorCode::kConfiguration);
}

TEST_F(HeapBackendTest, AccessWithoutCurrentKeyThrows) {
  auto& s = backend_.get_state(ValueStateDescriptor<int>{"v"});
  std::string msg = message_of([&] { s.value(); });
  EXPECT_THAT(msg, HasSubstr("no current key"));
  EXPECT_EQ(code_of([&] { s.update(1); }), ErrorCode::kState);
}

TEST(HeapBackendRangeTest, KeyOutsideRangeThrowsNamingGroupAndRange) {
  ManualClock clock;
  KeyGroupRange range = KeyGroupRange::for_operator_index(128, 2, 0);  // [0, 63]
  HeapKeyedStateBackend<int64_t> backend(range, 128, clock);
  int64_t outside = 0;
  while (range.contains(backend.key_group_of(outside)))
    ++outside;
  int64_t inside = 0;
  while (!range.contains(backend.key_group_of(inside)))
    ++inside;
  backend.set_current_key(inside);
  try {
    backend.set_current_key(outside);
    FAIL() << "expected a kState error";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
    EXPECT_THAT(e.error().message(), HasSubstr("key group " + std::to_string(backend.key_group_of(outside).value)));
    EXPECT_THAT(e.error().message(), HasSubstr("[0, 63]"));
  }
  EXPECT_EQ(backend.current_key(), inside);  // unchanged after the failed call
  EXPECT_EQ(backend.current_key_group(), backend.key_group_of(inside));
}

TEST(HeapBackendRangeTest, BadRangeIsAConfigurationError) {
  ManualClock clock;
  EXPECT_EQ(code_of([&] { HeapKeyedStateBackend<int> b(KeyGroupRange(0, 128), 128, clock); }),
            ErrorCode::kConfiguration);
  EXPECT_EQ(code_of([&] { HeapKeyedStateBackend<int> b(KeyGroupRange(), 128, clock); }), ErrorCode::kConfiguration);
}

TEST_F(HeapBackendTest, NamespacesSeparateValuesOfOneKey) {
  auto& sum = backend_.get_partitioned_state<Window>(ValueStateDescriptor<int64_t>{"sum"});
  backend_.set_current_key("k");
  sum.set_current_namespace(Window{0, 10});
  sum.update(5);
  sum.set_current_namespace(Window{10, 20});
  EXPECT_FALSE(sum.has_value());
  sum.update(7);
  sum.set_current_namespace(Window{0, 10});
  EXPECT_EQ(sum.value(), 5);
  EXPECT_EQ(sum.current_namespace(), (Window{0, 10}));
  backend_.set_current_key("other");
  EXPECT_FALSE(sum.has_value());
  EXPECT_EQ(backend_.num_entries("sum"), 2u);

  backend_.clear(sum, "k", Window{10, 20});  // another key's window; the current key stays
  EXPECT_EQ(backend_.current_key(), "other");
  backend_.set_current_key("k");
  sum.set_current_namespace(Window{10, 20});
  EXPECT_FALSE(sum.has_value());
  EXPECT_EQ(backend_.num_entries("sum"), 1u);
}

TEST_F(HeapBackendTest, ListState) {
  auto& list = backend_.get_state(ListStateDescriptor<std::string>{"list"});
  backend_.set_current_key("k");
  EXPECT_THAT(list.get(), IsEmpty());
  list.add("a");
  list.add(std::string("b"));
  list.add_all({"c", "d"});
  list.add_all({});
  EXPECT_THAT(list.get(), ElementsAre("a", "b", "c", "d"));
  backend_.set_current_key("j");
  EXPECT_THAT(list.get(), IsEmpty());
  list.update({"x"});
  EXPECT_THAT(list.get(), ElementsAre("x"));
  list.update({});  // an empty update clears, as in Flink
  EXPECT_EQ(backend_.num_entries("list"), 1u);
  backend_.set_current_key("k");
  list.clear();
  EXPECT_THAT(list.get(), IsEmpty());
  EXPECT_EQ(backend_.num_entries(), 0u);
}

TEST_F(HeapBackendTest, MapState) {
  auto& map = backend_.get_state(MapStateDescriptor<std::string, int>{"map"});
  backend_.set_current_key("k");
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

  backend_.set_current_key("j");
  EXPECT_TRUE(map.is_empty());
  map.put("only", 1);
  map.remove("only");  // the last user key removes the entry
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(backend_.num_entries("map"), 1u);

  backend_.set_current_key("k");
  map.remove("a");
  EXPECT_FALSE(map.contains("a"));
  map.clear();
  EXPECT_TRUE(map.is_empty());
  EXPECT_EQ(backend_.num_entries(), 0u);
}

TEST_F(HeapBackendTest, ReducingState) {
  auto& sum = backend_.get_state(
      ReducingStateDescriptor<int64_t>{"sum", [](const int64_t& a, const int64_t& b) { return a + b; }});
  backend_.set_current_key("k");
  EXPECT_EQ(sum.get(), std::nullopt);
  sum.add(3);
  sum.add(4);
  EXPECT_EQ(sum.get(), 7);
  backend_.set_current_key("j");
  sum.add(1);
  EXPECT_EQ(sum.get(), 1);
  sum.clear();
  EXPECT_EQ(sum.get(), std::nullopt);
  backend_.set_current_key("k");
  EXPECT_EQ(sum.get(), 7);
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

TEST_F(HeapBackendTest, AggregatingState) {
  auto& avg = backend_.get_state(
      AggregatingStateDescriptor<int, std::pair<int64_t, int64_t>, double>{"avg", std::make_shared<Average>()});
  backend_.set_current_key("k");
  EXPECT_EQ(avg.get(), std::nullopt);
  avg.add(1);
  avg.add(2);
  EXPECT_DOUBLE_EQ(*avg.get(), 1.5);
  backend_.set_current_key("j");
  EXPECT_EQ(avg.get(), std::nullopt);
  avg.add(10);
  EXPECT_DOUBLE_EQ(*avg.get(), 10.0);
  avg.clear();
  EXPECT_EQ(avg.get(), std::nullopt);
}

TEST_F(HeapBackendTest, AggregatingStateFromLambdas) {
  auto count_chars = make_aggregate_function<std::string, int64_t, int64_t>(
      [] { return int64_t{0}; }, [](const std::string& s, int64_t& acc) { acc += static_cast<int64_t>(s.size()); },
      [](const int64_t& acc) { return acc; }, [](int64_t a, const int64_t& b) { return a + b; });
  auto& chars = backend_.get_state(AggregatingStateDescriptor<std::string, int64_t, int64_t>{"chars", count_chars});
  backend_.set_current_key("k");
  chars.add("abc");
  chars.add("de");
  EXPECT_EQ(chars.get(), 5);
}

TEST_F(HeapBackendTest, MergeNamespacesOfListReducingAndAggregatingState) {
  auto& list = backend_.get_partitioned_state<Window>(ListStateDescriptor<int>{"list"});
  auto& sum = backend_.get_partitioned_state<Window>(
      ReducingStateDescriptor<int>{"sum", [](const int& a, const int& b) { return a + b; }});
  auto& avg = backend_.get_partitioned_state<Window>(
      AggregatingStateDescriptor<int, std::pair<int64_t, int64_t>, double>{"avg", std::make_shared<Average>()});
  const Window w1{0, 10}, w2{5, 15}, w3{12, 20}, merged{0, 20};
  backend_.set_current_key("k");
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
  // Target w1 is also a source (as merging windows do); w2 and w3 go away.
  std::vector<Window> sources{w1, w2, w3};
  list.merge_namespaces(merged, sources);
  backend_.merge_namespaces(sum, merged, std::span<const Window>(sources));
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
  EXPECT_EQ(backend_.num_entries(), 3u);

  // Merging into an existing target keeps the target's value first.
  list.set_current_namespace(w1);
  list.add(9);
  std::vector<Window> more{w1};
  list.merge_namespaces(merged, more);
  list.set_current_namespace(merged);
  EXPECT_THAT(list.get(), ElementsAre(1, 2, 3, 9));
}

TEST_F(HeapBackendTest, ForEachKeyAndApplyToAllKeys) {
  auto& count = backend_.get_state(ValueStateDescriptor<int>{"count"});
  for (const char* k : {"a", "b", "c"}) {
    backend_.set_current_key(k);
    count.update(1);
  }
  std::set<std::string> seen;
  backend_.for_each_key("count", [&](const std::string& k) { seen.insert(k); });
  EXPECT_THAT(seen, UnorderedElementsAre("a", "b", "c"));
  EXPECT_EQ(code_of([&] { backend_.for_each_key("nope", [](const std::string&) {}); }), ErrorCode::kState);

  backend_.apply_to_all_keys(VoidNamespace{}, ValueStateDescriptor<int>{"count"},
                             [&](const std::string& key, auto& state) {
                               EXPECT_EQ(backend_.current_key(), key);
                               if (key == "b") {
                                 state.clear();
                               } else {
                                 state.update(state.value() + 1);
                               }
                             });
  backend_.set_current_key("a");
  EXPECT_EQ(count.value(), 2);
  backend_.set_current_key("b");
  EXPECT_FALSE(count.has_value());
  EXPECT_EQ(backend_.num_entries(), 2u);
  EXPECT_THAT(backend_.state_names(), ElementsAre("count"));
}

TEST_F(HeapBackendTest, CompositeKeysAndMapKeysWithoutAbslHash) {
  using Key = std::pair<std::string, int64_t>;
  HeapKeyedStateBackend<Key> backend(full_range(), kDefaultMaxParallelism, clock_);
  auto& windows = backend.get_state(MapStateDescriptor<Window, int>{"per-window"});
  backend.set_current_key({"user", 1});
  windows.put(Window{0, 10}, 1);
  windows.put(Window{10, 20}, 2);
  backend.set_current_key({"user", 2});
  windows.put(Window{0, 10}, 3);
  backend.set_current_key({"user", 1});
  EXPECT_EQ(windows.get(Window{0, 10}), 1);
  EXPECT_EQ(windows.get(Window{10, 20}), 2);
  backend.set_current_key({"user", 2});
  EXPECT_EQ(windows.get(Window{0, 10}), 3);
  EXPECT_FALSE(windows.contains(Window{10, 20}));
}

TEST_F(HeapBackendTest, ManyKeysSurviveGrowthAndErasure) {
  HeapKeyedStateBackend<int64_t> backend(full_range(), kDefaultMaxParallelism, clock_);
  auto& v = backend.get_state(ValueStateDescriptor<int64_t>{"v"});
  constexpr int64_t kKeys = 20000;
  for (int64_t k = 0; k < kKeys; ++k) {
    backend.set_current_key(k);
    v.update(k * 2);
  }
  for (int64_t k = 0; k < kKeys; k += 2) {
    backend.set_current_key(k);
    v.clear();
  }
  EXPECT_EQ(backend.num_entries(), static_cast<size_t>(kKeys / 2));
  for (int64_t k = 0; k < kKeys; ++k) {
    backend.set_current_key(k);
    if (k % 2 == 0) {
      ASSERT_FALSE(v.has_value()) << k;
    } else {
      ASSERT_EQ(v.value(), k * 2) << k;
    }
  }
}

}  // namespace
}  // namespace sluice
