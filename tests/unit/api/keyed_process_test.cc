// KeyedProcessFunction with keyed state and timers (event time and processing time on a manual clock), and an
// idle split that must not hold back event time.
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "test_util/collect_sink.h"
#include "test_util/scripted_source.h"
#include "test_util/state_backends.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using testing::CollectedRecords;
using testing::CollectSink;
using KV = std::pair<std::string, int64_t>;
using S = testing::Step<KV>;

/// Counts per key in ValueState; emits "key:count@timer" when the event-time timer at ts+10 fires.
class CountWithTimeout final : public KeyedProcessFunction<std::string, KV, std::string> {
 public:
  void open(RuntimeContext&) override { count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0}); }
  void process_element(const KV&, Context& ctx, Collector<std::string>&) override {
    count_->update(count_->value() + 1);
    ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10);
  }
  void on_timer(TimestampMs t, OnTimerContext& ctx, Collector<std::string>& out) override {
    EXPECT_EQ(ctx.time_domain(), TimeDomain::kEventTime);
    out.collect(ctx.current_key() + ":" + std::to_string(count_->value()) + "@" + std::to_string(t));
  }

 private:
  ValueState<int64_t>* count_ = nullptr;
};

/// Runs on both keyed state backends (test_util/state_backends.h).
class KeyedProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KeyedProcessTest, StateAndEventTimeTimersPerKey) {
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  // Two records of "a" at ts 1 register the same timer (11) once: deduplicated.
  std::vector<S> script{S::rec({"a", 0}, 1), S::rec({"a", 0}, 1), S::rec({"b", 0}, 5), S::wm(11), S::rec({"a", 0}, 20)};
  env.from_source(std::make_shared<testing::ScriptedSource<KV>>(script), "script")
      .set_parallelism(1)
      .key_by([](const KV& kv) { return kv.first; })
      .process(CountWithTimeout{})
      .sink_to(std::make_shared<CollectSink<std::string>>(out));
  JobResult r = env.execute();
  ASSERT_TRUE(r.ok()) << r.error->to_string();
  auto got = out->all();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"a:2@11", "a:3@30", "b:1@15"}));
}

std::atomic<int> g_processed{0};

/// Registers processing-time timers at now+100 and now+50 for every record; emits "key@t" on each firing.
class ProcessingTimers final : public KeyedProcessFunction<std::string, KV, std::string> {
 public:
  void process_element(const KV&, Context& ctx, Collector<std::string>&) override {
    TimestampMs now = ctx.timer_service().current_processing_time();
    ctx.timer_service().register_processing_time_timer(now + 100);
    ctx.timer_service().register_processing_time_timer(now + 50);
    ctx.timer_service().register_processing_time_timer(now + 100);  // duplicate: fires once
    g_processed++;  // last: the test moves the clock only after the timers are registered
  }
  void on_timer(TimestampMs t, OnTimerContext& ctx, Collector<std::string>& out) override {
    EXPECT_EQ(ctx.time_domain(), TimeDomain::kProcessingTime);
    out.collect(ctx.current_key() + "@" + std::to_string(t));
  }
};

TEST_P(KeyedProcessTest, ProcessingTimeTimersFireOnceInOrderOnAManualClock) {
  ManualClock clock(1000);
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  env.set_clock(clock);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  // An endless, slow source keeps the job running while the test moves the clock.
  auto source = std::make_shared<DataGeneratorSource<KV>>(
      [](int64_t) {
        return KV{"k", 0};
      },
      DataGeneratorSource<KV>::kUnbounded, 1.0);
  env.from_source(source, "one per second")
      .key_by([](const KV& kv) { return kv.first; })
      .process(ProcessingTimers{})
      .sink_to(std::make_shared<CollectSink<std::string>>(out));
  g_processed = 0;
  JobClient client = env.execute_async("processing timers");
  // The rate-limited source emits its first record at once (clock 1000): timers at 1050 and 1100.
  ASSERT_TRUE(testing::wait_until([&] { return g_processed.load() == 1; }));
  clock.advance(60);  // 1060: the 1050 timer is due; the source may emit a second record (rate 1/s: not yet)
  ASSERT_TRUE(testing::wait_until([&] { return out->size() == 1; }));
  clock.advance(40);  // 1100
  ASSERT_TRUE(testing::wait_until([&] { return out->size() == 2; }));
  client.cancel();
  client.wait();
  EXPECT_EQ(out->all(), (std::vector<std::string>{"k@1050", "k@1100"}));
  EXPECT_EQ(g_processed.load(), 1);
}

/// A source with two splits: split 0 emits records with rising timestamps forever, split 1 never emits.
struct TwoSplits {
  int64_t index = 0;
};
SLUICE_FIELDS(TwoSplits, index);

class OneIdleSplitSource final : public Source<KV, TwoSplits> {
 public:
  Boundedness boundedness() const override { return Boundedness::kContinuousUnbounded; }
  std::unique_ptr<SplitEnumerator<TwoSplits>> create_enumerator(SplitEnumeratorContext<TwoSplits>& ctx) const override {
    return std::make_unique<StaticSplitEnumerator<TwoSplits>>(ctx, std::vector<TwoSplits>{{0}, {1}});
  }
  std::unique_ptr<SourceReader<KV, TwoSplits>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx);
  }

 private:
  class Reader final : public SourceReader<KV, TwoSplits> {
   public:
    explicit Reader(SourceReaderContext& ctx) : ctx_(ctx) {}
    void start() override {
      ctx_.send_split_request();
      ctx_.send_split_request();
    }
    InputStatus poll_next(ReaderOutput<KV>& out) override {
      for (const auto& s : splits_) {
        ReaderOutput<KV>& split_out = out.output_for_split(std::to_string(s.index));
        if (s.index == 0 && next_ts_ < 100'000) {
          split_out.collect(KV{"k", next_ts_}, next_ts_);
          next_ts_ += 10;
        }
      }
      ctx_.wakeup_at(ctx_.clock().now_ms() + 5);
      return InputStatus::kNothingAvailable;
    }
    void add_splits(std::vector<TwoSplits> s) override { splits_.insert(splits_.end(), s.begin(), s.end()); }
    void notify_no_more_splits() override {}

   private:
    SourceReaderContext& ctx_;
    std::vector<TwoSplits> splits_;
    int64_t next_ts_ = 0;
  };
};

/// Runs on both keyed state backends (test_util/state_backends.h).
class WatermarkTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WatermarkTest, AnIdleSplitDoesNotHoldBackWindows) {
  for (bool with_idleness : {false, true}) {
    StreamEnvironment env(testing::backend_configuration(GetParam()));
    env.config().set(options::kAutoWatermarkInterval, int64_t{20});
    auto out = std::make_shared<CollectedRecords<KV>>();
    auto strategy = WatermarkStrategy<KV>::for_monotonous_timestamps();
    if (with_idleness) strategy = strategy.with_idleness(100ms);
    env.from_source(std::make_shared<OneIdleSplitSource>(), strategy, "two splits")
        .key_by([](const KV& kv) { return kv.first; })
        .window(TumblingEventTimeWindows::of(100ms))
        .reduce([](const KV& a, const KV& b) {
          return KV{a.first, a.second + b.second};
        })
        .sink_to(std::make_shared<CollectSink<KV>>(out));
    JobClient client = env.execute_async("idle split");
    if (with_idleness) {
      // Split 1 turns idle after 100 ms without events; windows then fire on split 0's watermark alone.
      EXPECT_TRUE(testing::wait_until([&] { return out->size() >= 3; }, std::chrono::seconds(20)));
    } else {
      // Without idleness the empty split holds the watermark at its start: no window can fire. Give the job
      // time to run many watermark intervals, bounded by a deadline (this is the negative control).
      EXPECT_FALSE(testing::wait_until([&] { return out->size() > 0; }, std::chrono::milliseconds(500)));
    }
    client.cancel();
    client.wait();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KeyedProcessTest, testing::kStateBackends, testing::backend_name);

INSTANTIATE_TEST_SUITE_P(Backends, WatermarkTest, testing::kStateBackends, testing::backend_name);

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

std::atomic<int> g_seen{0};

/// The processing-time trigger, counting the elements the window operator has taken in.
class CountingProcessingTimeTrigger final : public Trigger<KV, TimeWindow> {
 public:
  TriggerResult on_element(const KV& e, TimestampMs ts, const TimeWindow& w, TriggerContext<TimeWindow>& ctx) override {
    TriggerResult r = inner_.on_element(e, ts, w, ctx);
    g_seen++;
    return r;
  }
  TriggerResult on_event_time(TimestampMs t, const TimeWindow& w, TriggerContext<TimeWindow>& ctx) override {
    return inner_.on_event_time(t, w, ctx);
  }
  TriggerResult on_processing_time(TimestampMs t, const TimeWindow& w, TriggerContext<TimeWindow>& ctx) override {
    return inner_.on_processing_time(t, w, ctx);
  }
  void clear(const TimeWindow& w, TriggerContext<TimeWindow>& ctx) override { inner_.clear(w, ctx); }

 private:
  ProcessingTimeTrigger<KV, TimeWindow> inner_;
};

/// Runs on both keyed state backends (test_util/state_backends.h).
class ProcessingTimeWindowTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessingTimeWindowTest, TumblingProcessingTimeWindowsFireOnTheManualClock) {
  ManualClock clock(10'000);
  StreamEnvironment env(testing::backend_configuration(GetParam()));
  env.set_clock(clock);
  auto out = std::make_shared<CollectedRecords<KV>>();
  g_seen = 0;
  // One record per 1000 ms of (manual) processing time.
  auto source = std::make_shared<DataGeneratorSource<KV>>(
      [](int64_t i) {
        return KV{"k", i + 1};
      },
      DataGeneratorSource<KV>::kUnbounded, 1.0);
  env.from_source(source, "slow")
      .key_by([](const KV& kv) { return kv.first; })
      .window(TumblingProcessingTimeWindows::of(std::chrono::milliseconds(1000)))
      .trigger(std::make_shared<CountingProcessingTimeTrigger>())
      .reduce([](const KV& a, const KV& b) {
        return KV{a.first, a.second + b.second};
      })
      .sink_to(std::make_shared<CollectSink<KV>>(out));
  JobClient client = env.execute_async("processing-time windows");
  // The window operator has taken record 1 into window [10000, 11000).
  ASSERT_TRUE(testing::wait_until([&] { return g_seen.load() == 1; }));
  clock.set(11'000);  // window [10000, 11000) ends; the source may emit record 2 into [11000, 12000)
  ASSERT_TRUE(testing::wait_until([&] { return out->size() == 1; }));
  ASSERT_TRUE(testing::wait_until([&] { return g_seen.load() == 2; }));
  clock.set(12'000);
  ASSERT_TRUE(testing::wait_until([&] { return out->size() == 2; }));
  client.cancel();
  client.wait();
  EXPECT_EQ(out->all(), (std::vector<KV>{{"k", 1}, {"k", 2}}));
}

INSTANTIATE_TEST_SUITE_P(Backends, ProcessingTimeWindowTest, testing::kStateBackends, testing::backend_name);

}  // namespace
}  // namespace sluice
