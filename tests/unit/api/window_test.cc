// Windows in real jobs with scripted event time: tumbling, sliding, session merging, allowed lateness, late
// side output, count triggers and aggregate + process combinations.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "sluice/api/stream_environment.h"
#include "test_util/collect_sink.h"
#include "test_util/scripted_source.h"
#include "test_util/state_backends.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using testing::CollectedRecords;
using testing::CollectSink;
using S = testing::Step<std::pair<std::string, int64_t>>;
using KV = std::pair<std::string, int64_t>;

/// (key, window start, window end, value) as emitted by the tests' window functions.
struct Result {
  std::string key;
  int64_t start = 0;
  int64_t end = 0;
  int64_t value = 0;
  friend bool operator==(const Result&, const Result&) = default;
  friend auto operator<=>(const Result&, const Result&) = default;
};
SLUICE_FIELDS(Result, key, start, end, value);

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "(" << r.key << " [" << r.start << "," << r.end << ") " << r.value << ")";
}

/// Sums the window's (already reduced) values and reports the window.
class SumWindow final : public ProcessWindowFunction<KV, Result, std::string, TimeWindow> {
 public:
  void process(const std::string& key, Context& ctx, const std::vector<KV>& elements, Collector<Result>& out) override {
    int64_t sum = 0;
    for (const auto& e : elements)
      sum += e.second;
    out.collect(Result{key, ctx.window().start, ctx.window().end, sum});
  }
};

JobResult run(StreamEnvironment& env) {
  JobResult r = env.execute("window test");
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  return r;
}

/// Runs on both keyed state backends (test_util/state_backends.h).
class WindowTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowTest, TumblingEventTimeWithOutOfOrderInput) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<Result>>();
  std::vector<S> script{S::rec({"a", 1}, 1),
                        S::rec({"b", 10}, 3),
                        S::rec({"a", 2}, 12),
                        S::rec({"a", 4}, 9),
                        S::wm(9),
                        S::rec({"a", 8}, 19),
                        S::rec({"b", 20}, 15),
                        S::wm(25),
                        S::rec({"a", 16}, 27)};
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .set_parallelism(1)
      .key_by([](const KV& kv) { return kv.first; })
      .window(TumblingEventTimeWindows::of(10ms))
      .process(SumWindow{})
      .sink_to(std::make_shared<CollectSink<Result>>(out));
  run(env);
  auto got = out->all();
  std::sort(got.begin(), got.end());
  std::vector<Result> expected{
      {"a", 0, 10, 5}, {"a", 10, 20, 10}, {"a", 20, 30, 16}, {"b", 0, 10, 10}, {"b", 10, 20, 20}};
  EXPECT_EQ(got, expected);
}

TEST_P(WindowTest, ReduceAndAggregateGiveTheSameSums) {
  struct SumAgg final : AggregateFunction<KV, int64_t, int64_t> {
    int64_t create_accumulator() override { return 0; }
    void add(const KV& v, int64_t& acc) override { acc += v.second; }
    int64_t get_result(const int64_t& acc) override { return acc; }
    int64_t merge(int64_t a, const int64_t& b) override { return a + b; }
  };
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto reduced = std::make_shared<CollectedRecords<KV>>();
  auto aggregated = std::make_shared<CollectedRecords<int64_t>>();
  std::vector<S> script;
  for (int i = 0; i < 100; ++i)
    script.push_back(S::rec({i % 2 ? "x" : "y", i}, i));
  auto keyed =
      env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script").key_by([](const KV& kv) {
        return kv.first;
      });
  keyed.window(TumblingEventTimeWindows::of(50ms))
      .reduce([](const KV& a, const KV& b) {
        return KV{a.first, a.second + b.second};
      })
      .sink_to(std::make_shared<CollectSink<KV>>(reduced));
  keyed.window(TumblingEventTimeWindows::of(50ms))
      .aggregate(SumAgg{})
      .sink_to(std::make_shared<CollectSink<int64_t>>(aggregated));
  run(env);
  int64_t total_r = 0, total_a = 0;
  for (const auto& kv : reduced->all())
    total_r += kv.second;
  for (int64_t v : aggregated->all())
    total_a += v;
  EXPECT_EQ(total_r, 4950);
  EXPECT_EQ(total_a, 4950);
  EXPECT_EQ(reduced->size(), 4u);  // 2 keys x 2 windows
  EXPECT_EQ(aggregated->size(), 4u);
}

TEST_P(WindowTest, SlidingWindowsCountEachRecordInEveryWindow) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto out = std::make_shared<CollectedRecords<Result>>();
  std::vector<S> script{S::rec({"k", 1}, 2), S::rec({"k", 10}, 7), S::rec({"k", 100}, 12)};
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .key_by([](const KV& kv) { return kv.first; })
      .window(SlidingEventTimeWindows::of(10ms, 5ms))
      .process(SumWindow{})
      .sink_to(std::make_shared<CollectSink<Result>>(out));
  run(env);
  auto got = out->all();
  std::sort(got.begin(), got.end());
  std::vector<Result> expected{{"k", -5, 5, 1}, {"k", 0, 10, 11}, {"k", 5, 15, 110}, {"k", 10, 20, 100}};
  EXPECT_EQ(got, expected);
}

TEST_P(WindowTest, SessionWindowsMergeUnderOutOfOrderInput) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto out = std::make_shared<CollectedRecords<Result>>();
  // Gap 5: 1 and 10 start two sessions; 5 arrives late (before the watermark) and bridges them into one.
  // 30 is a separate session; for key b a single element.
  std::vector<S> script{S::rec({"a", 1}, 1), S::rec({"a", 10}, 10),  S::rec({"b", 7}, 4), S::rec({"a", 100}, 5),
                        S::wm(12),           S::rec({"a", 1000}, 30)};
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .key_by([](const KV& kv) { return kv.first; })
      .window(EventTimeSessionWindows::with_gap(5ms))
      .process(SumWindow{})
      .sink_to(std::make_shared<CollectSink<Result>>(out));
  run(env);
  auto got = out->all();
  std::sort(got.begin(), got.end());
  std::vector<Result> expected{{"a", 1, 15, 111}, {"a", 30, 35, 1000}, {"b", 4, 9, 7}};
  EXPECT_EQ(got, expected);
}

TEST_P(WindowTest, SessionMergingWithIncrementalAggregation) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto out = std::make_shared<CollectedRecords<KV>>();
  std::vector<S> script{S::rec({"a", 1}, 1), S::rec({"a", 2}, 20), S::rec({"a", 4}, 8), S::rec({"a", 8}, 14)};
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .key_by([](const KV& kv) { return kv.first; })
      .window(EventTimeSessionWindows::with_gap(7ms))
      .reduce([](const KV& a, const KV& b) {
        return KV{a.first, a.second + b.second};
      })
      .sink_to(std::make_shared<CollectSink<KV>>(out));
  run(env);
  EXPECT_EQ(out->all(), (std::vector<KV>{{"a", 15}}));  // 1, 8, 14, 20 chain into one session
}

TEST_P(WindowTest, AllowedLatenessFiresAgainAndTooLateGoesToSideOutput) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto out = std::make_shared<CollectedRecords<Result>>();
  auto late = std::make_shared<CollectedRecords<KV>>();
  const OutputTag<KV> late_tag("late");
  std::vector<S> script{S::rec({"a", 1}, 2), S::wm(10),               // window [0,10) fires: 1
                        S::rec({"a", 2}, 5), S::wm(12),               // late but within 5ms lateness: fires 3
                        S::rec({"a", 4}, 3), S::wm(15),               // still within lateness (cleanup at 14): 7
                        S::rec({"a", 8}, 4), S::rec({"a", 16}, 16)};  // beyond lateness: side output
  auto windows = env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
                     .key_by([](const KV& kv) { return kv.first; })
                     .window(TumblingEventTimeWindows::of(10ms));
  windows.allowed_lateness(5ms).side_output_late_data(late_tag);
  auto results = windows.process(SumWindow{});
  results.sink_to(std::make_shared<CollectSink<Result>>(out));
  results.get_side_output(late_tag).sink_to(std::make_shared<CollectSink<KV>>(late));
  run(env);
  std::vector<Result> expected{{"a", 0, 10, 1}, {"a", 0, 10, 3}, {"a", 10, 20, 16}};
  auto got = out->all();
  // Record 4 at ts 3 arrives at watermark 12 < cleanup time 14: the window fires a third time with 7.
  expected.insert(expected.begin() + 2, Result{"a", 0, 10, 7});
  EXPECT_EQ(got, expected);
  EXPECT_EQ(late->all(), (std::vector<KV>{{"a", 8}}));
}

TEST_P(WindowTest, CountTriggerOnGlobalWindows) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  auto out = std::make_shared<CollectedRecords<KV>>();
  std::vector<S> script;
  for (int i = 1; i <= 7; ++i)
    script.push_back(S::rec({"k", i}, i));
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .key_by([](const KV& kv) { return kv.first; })
      .window(GlobalWindows::create())
      .trigger(PurgingTrigger<KV, GlobalWindow>::of(CountTrigger<KV, GlobalWindow>::of(3)))
      .reduce([](const KV& a, const KV& b) {
        return KV{a.first, a.second + b.second};
      })
      .sink_to(std::make_shared<CollectSink<KV>>(out));
  run(env);
  EXPECT_EQ(out->all(), (std::vector<KV>{{"k", 6}, {"k", 15}}));  // 1+2+3, 4+5+6; 7 never fires
}

INSTANTIATE_TEST_SUITE_P(Backends, WindowTest, testing::kStateBackends, testing::backend_name);

}  // namespace
}  // namespace sluice
