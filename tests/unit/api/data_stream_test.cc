// DataStream API behaviour in real jobs: side outputs, union, broadcast, rescale, keyed aggregations,
// process functions, rich function lifecycle and records larger than a network buffer.
#include "sluice/api/data_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/state/operator_state.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

using testing::CollectedRecords;
using testing::CollectSink;

template <class T>
std::pair<std::shared_ptr<CollectedRecords<T>>, std::shared_ptr<CollectSink<T>>> collector() {
  auto out = std::make_shared<CollectedRecords<T>>();
  return {out, std::make_shared<CollectSink<T>>(out)};
}

template <class T>
std::vector<T> sorted(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v;
}

void expect_ok(const JobResult& r) {
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
}

struct Sale {
  std::string shop;
  int64_t amount = 0;
  friend bool operator<(const Sale& a, const Sale& b) {
    return std::tie(a.shop, a.amount) < std::tie(b.shop, b.amount);
  }
};
SLUICE_FIELDS(Sale, shop, amount);

class SplitEvenOdd final : public ProcessFunction<int64_t, int64_t> {
 public:
  inline static const OutputTag<std::string> kOdd{"odd"};
  void process_element(const int64_t& v, Context& ctx, Collector<int64_t>& out) override {
    if (v % 2 == 0) {
      out.collect(v);
    } else {
      ctx.output(kOdd, "odd-" + std::to_string(v));
    }
  }
};

TEST(DataStreamTest, SideOutputsReachTheirOwnStream) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto [evens, evens_sink] = collector<int64_t>();
  auto [odds, odds_sink] = collector<std::string>();
  auto main = env.from_source(datagen::sequence(1, 10), "n").process(SplitEvenOdd{});
  main.sink_to(evens_sink);
  main.get_side_output(SplitEvenOdd::kOdd).rebalance().sink_to(odds_sink);
  expect_ok(env.execute());
  EXPECT_EQ(sorted(evens->all()), (std::vector<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(sorted(odds->all()), (std::vector<std::string>{"odd-1", "odd-3", "odd-5", "odd-7", "odd-9"}));
}

TEST(DataStreamTest, UnionMergesStreams) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto [out, sink] = collector<int64_t>();
  auto a = env.from_source(datagen::sequence(1, 100), "a");
  auto b = env.from_source(datagen::sequence(1001, 1100), "b").map([](int64_t v) { return v; });
  a.union_with(b).map([](int64_t v) { return v; }).sink_to(sink);
  expect_ok(env.execute());
  auto all = sorted(out->all());
  ASSERT_EQ(all.size(), 200u);
  EXPECT_EQ(all.front(), 1);
  EXPECT_EQ(all.back(), 1100);
}

TEST(DataStreamTest, BroadcastReachesEverySubtask) {
  StreamEnvironment env;
  auto [out, sink] = collector<int64_t>();
  env.from_source(datagen::sequence(1, 50), "n")
      .broadcast()
      .map([](int64_t v) { return v; })
      .set_parallelism(3)
      .sink_to(sink)
      .set_parallelism(3);
  expect_ok(env.execute());
  auto per = out->per_subtask();
  ASSERT_EQ(per.size(), 3u);
  for (const auto& s : per)
    EXPECT_EQ(s.size(), 50u);
}

TEST(DataStreamTest, RescaleAndRebalanceLoseNothing) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto [out, sink] = collector<int64_t>();
  env.from_source(datagen::sequence(1, 10'000), "n")
      .rescale()
      .map([](int64_t v) { return v; })
      .set_parallelism(4)
      .rebalance()
      .map([](int64_t v) { return v * 2; })
      .set_parallelism(3)
      .sink_to(sink)
      .set_parallelism(3);
  expect_ok(env.execute());
  auto all = out->all();
  ASSERT_EQ(all.size(), 10'000u);
  EXPECT_EQ(std::accumulate(all.begin(), all.end(), int64_t{0}), int64_t{10'000} * 10'001);
  for (const auto& s : out->per_subtask())
    EXPECT_GT(s.size(), 2000u);  // spread over all subtasks
}

TEST(DataStreamTest, KeyedSumMinMaxByMember) {
  StreamEnvironment env;
  env.set_parallelism(3);
  std::vector<Sale> sales{{"a", 5}, {"b", 7}, {"a", 2}, {"a", 9}, {"b", 1}};
  auto [sums, sum_sink] = collector<Sale>();
  auto [mins, min_sink] = collector<Sale>();
  auto [maxs, max_sink] = collector<Sale>();
  auto src = env.from_source(datagen::from_collection(sales), "sales").set_parallelism(1);
  src.key_by(&Sale::shop).sum(&Sale::amount).sink_to(sum_sink);
  src.key_by(&Sale::shop).min(&Sale::amount).sink_to(min_sink);
  src.key_by(&Sale::shop).max(&Sale::amount).sink_to(max_sink);
  expect_ok(env.execute());
  auto last_per_shop = [](const std::vector<Sale>& v) {
    std::map<std::string, std::vector<int64_t>> m;
    for (const auto& s : v)
      m[s.shop].push_back(s.amount);
    return m;
  };
  // Rolling aggregates, in per-key order.
  EXPECT_EQ(last_per_shop(sums->all()).at("a"), (std::vector<int64_t>{5, 7, 16}));
  EXPECT_EQ(last_per_shop(sums->all()).at("b"), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(last_per_shop(mins->all()).at("a"), (std::vector<int64_t>{5, 2, 2}));
  EXPECT_EQ(last_per_shop(maxs->all()).at("b"), (std::vector<int64_t>{7, 7}));
}

class CountPerKey final : public KeyedProcessFunction<int64_t, int64_t, std::string> {
 public:
  void process_element(const int64_t& v, Context& ctx, Collector<std::string>& out) override {
    out.collect(std::to_string(ctx.current_key()) + ":" + std::to_string(v));
  }
};

TEST(DataStreamTest, KeyedProcessSeesTheCurrentKey) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto [out, sink] = collector<std::string>();
  env.from_source(datagen::sequence(0, 5), "n")
      .key_by([](int64_t v) { return v % 2; })
      .process(CountPerKey{})
      .sink_to(sink);
  expect_ok(env.execute());
  EXPECT_EQ(sorted(out->all()), (std::vector<std::string>{"0:0", "0:2", "0:4", "1:1", "1:3", "1:5"}));
}

std::atomic<int> g_opened{0};
std::atomic<int> g_closed{0};

class TagWithSubtask final : public MapFunction<int64_t, std::string> {
 public:
  void open(RuntimeContext& ctx) override {
    g_opened++;
    // Operator state is per subtask and per operator: a fresh store for every open().
    seen_ = &ctx.operator_state().get_list_state<int64_t>("seen");
    EXPECT_TRUE(seen_->get().empty());
    prefix_ = std::to_string(ctx.subtask_index()) + "/" + std::to_string(ctx.parallelism()) + "#" +
              std::to_string(ctx.attempt_number());
  }
  void close() override { g_closed++; }
  std::string map(const int64_t& v) override {
    seen_->add(v);
    return prefix_ + ":" + std::to_string(v);
  }

 private:
  std::string prefix_;
  ListState<int64_t>* seen_ = nullptr;
};

TEST(DataStreamTest, RichFunctionsAreOpenedAndClosedPerSubtask) {
  g_opened = 0;
  g_closed = 0;
  StreamEnvironment env;
  env.set_parallelism(3);
  auto [out, sink] = collector<std::string>();
  env.from_source(datagen::sequence(0, 29), "n").set_parallelism(1).rebalance().map(TagWithSubtask{}).sink_to(sink);
  expect_ok(env.execute());
  EXPECT_EQ(g_opened.load(), 3);
  EXPECT_EQ(g_closed.load(), 3);
  auto per = out->per_subtask();
  ASSERT_EQ(per.size(), 3u);
  for (size_t s = 0; s < per.size(); ++s) {
    for (const auto& r : per[s])
      EXPECT_EQ(r.substr(0, 5), std::to_string(s) + "/3#0");
  }
}

TEST(DataStreamTest, RecordsLargerThanABufferSpanBuffers) {
  StreamEnvironment env;
  env.set_parallelism(2);
  env.config().set(options::kBufferSize, int64_t{4096});
  auto [out, sink] = collector<std::string>();
  env.from_source(datagen::sequence(0, 199), "n")
      .map([](int64_t v) { return std::string(static_cast<size_t>(v * 97 % 20'000), static_cast<char>('a' + v % 26)); })
      .key_by([](const std::string& s) { return s.size(); })
      .filter([](const std::string&) { return true; })
      .sink_to(sink);
  expect_ok(env.execute());
  auto all = out->all();
  ASSERT_EQ(all.size(), 200u);
  std::map<size_t, char> seen;
  for (const auto& s : all) {
    if (!s.empty()) {
      EXPECT_EQ(std::count(s.begin(), s.end(), s[0]), static_cast<long>(s.size()));
    }
    seen[s.size()] = s.empty() ? ' ' : s[0];
  }
  EXPECT_EQ(seen.size(), 200u);
}

}  // namespace
}  // namespace sluice
