// Heap-only cases of the keyed state backend. The cases every backend must pass (value, list, map, reducing,
// aggregating state, namespaces, merging, errors) run against the heap and RocksDB in keyed_state_backend_test.cc.
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

TEST(HeapBackendRangeTest, BadRangeIsAConfigurationError) {
  ManualClock clock;
  EXPECT_EQ(code_of([&] { HeapKeyedStateBackend<int> b(KeyGroupRange(0, 128), 128, clock); }),
            ErrorCode::kConfiguration);
  EXPECT_EQ(code_of([&] { HeapKeyedStateBackend<int> b(KeyGroupRange(), 128, clock); }), ErrorCode::kConfiguration);
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
