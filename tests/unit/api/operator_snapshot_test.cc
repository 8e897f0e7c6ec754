// Checkpoint hooks of the built-in operators, driven by hand: keyed operators capture their keyed state and
// timers (snapshot_keyed_state), the capture is written to bytes key group by key group, and a fresh operator
// restored from those bytes (set_restored_keyed_state, then open) continues as if the run had never stopped —
// also into two subtasks with different key-group ranges (rescaling). Operators forward the RichFunction
// checkpoint hooks to their functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/joins.h"
#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/api/windowing.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"
#include "sluice/operators/keyed_operators.h"
#include "sluice/operators/operators.h"
#include "sluice/operators/window_operator.h"
#include "sluice/runtime/task.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using KV = std::pair<std::string, int64_t>;
using KeySel = std::function<std::string(const KV&)>;

constexpr int kMaxParallelism = 128;
constexpr TimestampMs kStartTime = 1000;

/// TaskServices of a hand-driven operator: a manual clock and the task timers, run by advance_to().
class TestServices final : public TaskServices {
 public:
  explicit TestServices(ManualClock& clock) : clock_(clock) {}
  void post_mail(std::function<void()> mail) override { mail(); }
  void wakeup() override {}
  void wakeup_at(TimestampMs) override {}
  void register_processing_timer(TimestampMs time_ms, std::function<void(TimestampMs)> callback) override {
    timers_.emplace(time_ms, std::move(callback));
  }
  const Clock& processing_clock() const override { return clock_; }
  bool is_cancelled() const override { return false; }
  const std::atomic<bool>& cancelled_flag() const override { return cancelled_; }

  /// Moves the clock to `t` and runs the task timers due by then, in time order (as the task loop does).
  void advance_to(TimestampMs t) {
    clock_.set(t);
    while (!timers_.empty() && timers_.begin()->first <= t) {
      auto node = timers_.extract(timers_.begin());
      node.mapped()(node.key());
    }
  }
  size_t armed_timers() const { return timers_.size(); }

 private:
  ManualClock& clock_;
  std::multimap<TimestampMs, std::function<void(TimestampMs)>> timers_;
  std::atomic<bool> cancelled_{false};
};

/// Records what an operator emits on its main output.
template <class T>
class CollectingOutput final : public Output<T> {
 public:
  void collect(T&& record, TimestampMs) override { records.push_back(std::move(record)); }
  void emit_watermark(TimestampMs) override {}
  void emit_watermark_status(bool) override {}
  std::vector<T> records;
};

/// One hand-driven subtask of a one-input operator Op with main output type Out.
template <class Op, class Out>
struct Subtask {
  Subtask(std::unique_ptr<Op> o, int index, int parallelism, std::shared_ptr<const KeyedStateRestore> restore,
          ManualClock& clock)
      : ctx("test-operator", index, parallelism, kMaxParallelism, 0, clock), services(clock), op(std::move(o)) {
    op->setup(&ctx, &services, {{"", &out}});
    if (restore != nullptr) op->set_restored_keyed_state(std::move(restore));
    op->open();
  }
  ~Subtask() { op->close(); }
  Subtask(const Subtask&) = delete;
  Subtask& operator=(const Subtask&) = delete;

  template <class In>
  void record(In value, TimestampMs ts) {
    op->process_element(std::move(value), ts);
  }
  void watermark(TimestampMs wm) { op->process_watermark(wm); }

  TaskRuntimeContext ctx;
  TestServices services;
  CollectingOutput<Out> out;
  std::unique_ptr<Op> op;
};

/// The bytes of every key group of a capture, as checkpoint storage would keep them.
using KeyGroupBytes = std::map<int32_t, std::string>;

KeyGroupBytes write_all_key_groups(const KeyedStateSnapshot& snapshot) {
  KeyGroupBytes bytes;
  const KeyGroupRange range = snapshot.key_group_range();
  for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
    DataOutput out;
    snapshot.write_key_group(KeyGroup{kg}, out);
    bytes[kg] = std::string(out.view());
  }
  return bytes;
}

/// The restore of a subtask owning `range`: only the key groups of that range, from every old subtask's bytes
/// (what the JobManager assigns on a restore, possibly at another parallelism).
std::shared_ptr<const KeyedStateRestore> restore_for(const std::vector<KeyGroupBytes>& parts, KeyGroupRange range) {
  auto restore = std::make_shared<KeyedStateRestore>();
  restore->max_parallelism = kMaxParallelism;
  for (const KeyGroupBytes& part : parts) {
    for (const auto& [kg, bytes] : part) {
      if (range.contains(KeyGroup{kg})) restore->add_copy(kg, bytes);
    }
  }
  return restore;
}

/// Captures `op`'s keyed state and writes it to bytes.
template <class Op>
KeyGroupBytes checkpoint(Op& op) {
  std::unique_ptr<KeyedStateSnapshot> snapshot = op.snapshot_keyed_state();
  EXPECT_NE(snapshot, nullptr);
  if (snapshot == nullptr) return {};
  EXPECT_EQ(snapshot->max_parallelism(), kMaxParallelism);
  return write_all_key_groups(*snapshot);
}

/// The subtask (of `parallelism`) that owns `key`.
int owner_of(const std::string& key, int parallelism) {
  DataOutput buf;
  TypeSerializer<std::string>::serialize(key, buf);
  return operator_index_for_key_group(kMaxParallelism, parallelism, assign_to_key_group(buf.bytes(), kMaxParallelism));
}

/// One step of a scripted input: a record or a watermark.
struct Step {
  std::optional<KV> record;
  TimestampMs ts = 0;  ///< the record's timestamp, or the watermark
  static Step rec(std::string key, int64_t value, TimestampMs ts) { return {KV{std::move(key), value}, ts}; }
  static Step wm(TimestampMs w) { return {std::nullopt, w}; }
};

template <class Sub>
void feed(Sub& sub, const std::vector<Step>& steps) {
  for (const Step& s : steps) {
    if (s.record) {
      sub.record(*s.record, s.ts);
    } else {
      sub.watermark(s.ts);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Keyed reduce
// ---------------------------------------------------------------------------------------------------------

auto sum_values = [](const KV& a, const KV& b) { return KV{a.first, a.second + b.second}; };
using SumOp = KeyedReduceOperator<std::string, KV, KeySel, decltype(sum_values)>;
using SumSubtask = Subtask<SumOp, KV>;

std::unique_ptr<SumOp> make_sum() {
  return std::make_unique<SumOp>([](const KV& kv) { return kv.first; }, sum_values);
}

TEST(OperatorSnapshotTest, KeyedReduceRestoresPerKeyAggregates) {
  ManualClock clock(kStartTime);
  const std::vector<Step> before{Step::rec("a", 1, 1), Step::rec("b", 10, 2), Step::rec("a", 2, 3),
                                 Step::rec("c", 100, 4)};
  const std::vector<Step> after{Step::rec("a", 3, 5), Step::rec("b", 20, 6), Step::rec("d", 1000, 7),
                                Step::rec("c", 200, 8)};

  SumSubtask whole(make_sum(), 0, 1, nullptr, clock);
  feed(whole, before);
  feed(whole, after);

  SumSubtask first(make_sum(), 0, 1, nullptr, clock);
  feed(first, before);
  EXPECT_EQ(first.op->key_count(), 3u);
  KeyGroupBytes bytes = checkpoint(*first.op);
  SumSubtask second(make_sum(), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  EXPECT_EQ(second.op->key_count(), 3u);
  feed(second, after);

  std::vector<KV> resumed = first.out.records;
  resumed.insert(resumed.end(), second.out.records.begin(), second.out.records.end());
  EXPECT_EQ(resumed, whole.out.records);
  EXPECT_EQ(second.out.records, (std::vector<KV>{{"a", 6}, {"b", 30}, {"d", 1000}, {"c", 300}}));
  EXPECT_EQ(second.op->key_count(), 4u);
}

TEST(OperatorSnapshotTest, KeyedReduceRescalesToTwoSubtasksEachWithItsKeyGroups) {
  ManualClock clock(kStartTime);
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i)
    keys.push_back("key-" + std::to_string(i));

  SumSubtask old(make_sum(), 0, 1, nullptr, clock);
  for (size_t i = 0; i < keys.size(); ++i)
    old.record(KV{keys[i], static_cast<int64_t>(i)}, 1);
  KeyGroupBytes bytes = checkpoint(*old.op);

  std::vector<std::unique_ptr<SumSubtask>> subtasks;
  size_t expected_keys[2] = {0, 0};
  for (const std::string& k : keys)
    ++expected_keys[owner_of(k, 2)];
  ASSERT_GT(expected_keys[0], 0u);
  ASSERT_GT(expected_keys[1], 0u);
  for (int i = 0; i < 2; ++i) {
    KeyGroupRange range = KeyGroupRange::for_operator_index(kMaxParallelism, 2, i);
    auto restore = restore_for({bytes}, range);
    for (const auto& [kg, b] : restore->key_groups)
      EXPECT_TRUE(range.contains(KeyGroup{kg}));
    subtasks.push_back(std::make_unique<SumSubtask>(make_sum(), i, 2, restore, clock));
    EXPECT_EQ(subtasks[i]->op->key_count(), expected_keys[i]) << "subtask " << i;
  }
  // Every key continues from its restored sum on the subtask that owns it.
  for (size_t i = 0; i < keys.size(); ++i) {
    SumSubtask& owner = *subtasks[owner_of(keys[i], 2)];
    owner.record(KV{keys[i], 1000}, 2);
    ASSERT_FALSE(owner.out.records.empty());
    EXPECT_EQ(owner.out.records.back(), (KV{keys[i], static_cast<int64_t>(i) + 1000}));
  }
  // A subtask does not own the other's keys.
  const std::string& foreign = keys[0];
  SumSubtask& other = *subtasks[1 - owner_of(foreign, 2)];
  try {
    other.record(KV{foreign, 1}, 3);
    FAIL() << "a key of another key-group range was accepted";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
  }
}

TEST(OperatorSnapshotTest, RestoreOfCorruptBytesFailsNamingTheOperator) {
  ManualClock clock(kStartTime);
  auto restore = std::make_shared<KeyedStateRestore>();
  restore->max_parallelism = kMaxParallelism;
  restore->add_copy(3, "\xff\xff\xff not a key group");
  try {
    SumSubtask sub(make_sum(), 0, 1, restore, clock);
    FAIL() << "corrupt keyed state was restored";
  } catch (const SluiceException& e) {
    EXPECT_NE(std::string(e.what()).find("test-operator"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Keyed process function: state and timers
// ---------------------------------------------------------------------------------------------------------

/// Counts per key; at the first record of a key registers an event-time timer at ts + 10 and a
/// processing-time timer at now + 100. Timers emit "key:count@time/e|p". Logs checkpoint hooks into `log`.
class CountWithTimers final : public KeyedProcessFunction<std::string, KV, std::string> {
 public:
  explicit CountWithTimers(std::shared_ptr<std::vector<std::string>> log) : log_(std::move(log)) {}
  void open(RuntimeContext&) override { count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0}); }
  void process_element(const KV& kv, Context& ctx, Collector<std::string>&) override {
    int64_t n = count_->value() + kv.second;
    if (count_->value() == 0) {
      ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10);
      ctx.timer_service().register_processing_time_timer(ctx.timer_service().current_processing_time() + 100);
    }
    count_->update(n);
  }
  void on_timer(TimestampMs t, OnTimerContext& ctx, Collector<std::string>& out) override {
    const char* domain = ctx.time_domain() == TimeDomain::kEventTime ? "e" : "p";
    out.collect(ctx.current_key() + ":" + std::to_string(count_->value()) + "@" + std::to_string(t) + "/" + domain);
  }
  void snapshot_state(int64_t id) override { log_->push_back("snapshot " + std::to_string(id)); }
  void notify_checkpoint_complete(int64_t id) override { log_->push_back("complete " + std::to_string(id)); }
  void notify_checkpoint_aborted(int64_t id) override { log_->push_back("aborted " + std::to_string(id)); }

 private:
  std::shared_ptr<std::vector<std::string>> log_;
  ValueState<int64_t>* count_ = nullptr;
};

using ProcessOp = KeyedProcessOperator<std::string, KV, std::string, KeySel, CountWithTimers>;
using ProcessSubtask = Subtask<ProcessOp, std::string>;

std::unique_ptr<ProcessOp> make_process(std::shared_ptr<std::vector<std::string>> log = nullptr) {
  if (log == nullptr) log = std::make_shared<std::vector<std::string>>();
  return std::make_unique<ProcessOp>([](const KV& kv) { return kv.first; }, CountWithTimers(std::move(log)));
}

TEST(OperatorSnapshotTest, KeyedProcessRestoresStateAndEventTimeTimers) {
  ManualClock clock(kStartTime);
  const std::vector<Step> before{Step::rec("a", 1, 1), Step::rec("b", 1, 2),  Step::rec("a", 1, 5),
                                 Step::wm(11),         Step::rec("c", 1, 15), Step::rec("b", 1, 16)};
  const std::vector<Step> after{Step::rec("c", 1, 20), Step::rec("d", 1, 21), Step::wm(25), Step::rec("a", 1, 30),
                                Step::wm(kMaxWatermark)};

  ProcessSubtask whole(make_process(), 0, 1, nullptr, clock);
  feed(whole, before);
  feed(whole, after);
  ASSERT_EQ(whole.out.records, (std::vector<std::string>{"a:2@11/e", "b:2@12/e", "c:2@25/e", "d:1@31/e"}));

  ProcessSubtask first(make_process(), 0, 1, nullptr, clock);
  feed(first, before);
  KeyGroupBytes bytes = checkpoint(*first.op);
  ProcessSubtask second(make_process(), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  feed(second, after);

  std::vector<std::string> resumed = first.out.records;
  resumed.insert(resumed.end(), second.out.records.begin(), second.out.records.end());
  EXPECT_EQ(resumed, whole.out.records);
}

TEST(OperatorSnapshotTest, KeyedProcessArmsRestoredProcessingTimeTimersWithoutNewInput) {
  ManualClock clock(kStartTime);
  ProcessSubtask first(make_process(), 0, 1, nullptr, clock);
  first.record(KV{"a", 1}, 1);
  first.record(KV{"a", 1}, 2);
  KeyGroupBytes bytes = checkpoint(*first.op);

  ProcessSubtask second(make_process(), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  EXPECT_EQ(second.services.armed_timers(), 1u);
  second.services.advance_to(kStartTime + 99);
  EXPECT_TRUE(second.out.records.empty());
  second.services.advance_to(kStartTime + 100);
  EXPECT_EQ(second.out.records, (std::vector<std::string>{"a:2@1100/p"}));
}

TEST(OperatorSnapshotTest, KeyedProcessTimersMoveWithTheirKeyGroupsOnRescale) {
  ManualClock clock(kStartTime);
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i)
    keys.push_back("k" + std::to_string(i));
  // Three old subtasks, each with the keys of its range, restored into two: each new subtask gets the key
  // groups of its range, parts of them written by different old subtasks, and fires only its keys' timers.
  std::vector<KeyGroupBytes> parts;
  for (int i = 0; i < 3; ++i) {
    ProcessSubtask old(make_process(), i, 3, nullptr, clock);
    for (size_t k = 0; k < keys.size(); ++k) {
      if (owner_of(keys[k], 3) == i) old.record(KV{keys[k], static_cast<int64_t>(k) + 1}, static_cast<TimestampMs>(k));
    }
    parts.push_back(checkpoint(*old.op));
  }
  std::vector<std::string> fired;
  for (int i = 0; i < 2; ++i) {
    KeyGroupRange range = KeyGroupRange::for_operator_index(kMaxParallelism, 2, i);
    ProcessSubtask sub(make_process(), i, 2, restore_for(parts, range), clock);
    sub.watermark(kMaxWatermark);
    for (const std::string& r : sub.out.records) {
      EXPECT_EQ(owner_of(r.substr(0, r.find(':')), 2), i) << r;
      fired.push_back(r);
    }
  }
  std::sort(fired.begin(), fired.end());
  std::vector<std::string> expected;
  for (size_t k = 0; k < keys.size(); ++k)
    expected.push_back(keys[k] + ":" + std::to_string(k + 1) + "@" + std::to_string(k + 10) + "/e");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(fired, expected);
}

// ---------------------------------------------------------------------------------------------------------
// Windows
// ---------------------------------------------------------------------------------------------------------

using ListWindowContents = detail::ListContents<std::string, TimeWindow, KV>;
using WindowOp = WindowOperator<std::string, KV, std::string, TimeWindow, KeySel, ListWindowContents>;
using WindowSubtask = Subtask<WindowOp, std::string>;

/// Emits "key:sum[start,end)" for each firing.
void sum_window(const std::string& key, ProcessWindowFunction<KV, std::string, std::string, TimeWindow>::Context& ctx,
                const std::vector<KV>& elements, Collector<std::string>& out) {
  int64_t sum = 0;
  for (const KV& kv : elements)
    sum += kv.second;
  out.collect(key + ":" + std::to_string(sum) + "[" + std::to_string(ctx.window().start) + "," +
              std::to_string(ctx.window().end) + ")");
}

std::unique_ptr<WindowOp> make_window(std::shared_ptr<const WindowAssigner<TimeWindow>> assigner,
                                      std::shared_ptr<RichFunction> rich = nullptr) {
  WindowSettings<KV, TimeWindow> settings;
  settings.trigger = assigner->default_trigger<KV>();
  settings.assigner = std::move(assigner);
  settings.rich_function = std::move(rich);
  return std::make_unique<WindowOp>([](const KV& kv) { return kv.first; }, ListWindowContents{},
                                    typename WindowOp::WindowFn(sum_window), std::move(settings));
}

/// Runs `before`, checkpoints, restores a new operator and runs `after`; expects the outputs of both to
/// equal an uninterrupted run over `before` and `after`, which must equal `expected`.
void expect_window_resumes(const std::shared_ptr<const WindowAssigner<TimeWindow>>& assigner,
                           const std::vector<Step>& before, const std::vector<Step>& after,
                           const std::vector<std::string>& expected) {
  ManualClock clock(kStartTime);
  WindowSubtask whole(make_window(assigner), 0, 1, nullptr, clock);
  feed(whole, before);
  feed(whole, after);
  EXPECT_EQ(whole.out.records, expected);

  WindowSubtask first(make_window(assigner), 0, 1, nullptr, clock);
  feed(first, before);
  KeyGroupBytes bytes = checkpoint(*first.op);
  WindowSubtask second(make_window(assigner), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  feed(second, after);
  std::vector<std::string> resumed = first.out.records;
  resumed.insert(resumed.end(), second.out.records.begin(), second.out.records.end());
  EXPECT_EQ(resumed, whole.out.records);
}

TEST(OperatorSnapshotTest, TumblingEventTimeWindowRestoresPendingContents) {
  // [0,10) fires before the checkpoint; [10,20) of a and b is pending in it.
  expect_window_resumes(TumblingEventTimeWindows::of(10ms),
                        {Step::rec("a", 1, 1), Step::rec("b", 10, 2), Step::rec("a", 2, 5), Step::wm(9),
                         Step::rec("a", 4, 12), Step::rec("b", 20, 15)},
                        {Step::rec("a", 8, 18), Step::rec("b", 40, 25), Step::wm(19), Step::wm(kMaxWatermark)},
                        {"a:3[0,10)", "b:10[0,10)", "a:12[10,20)", "b:20[10,20)", "b:40[20,30)"});
}

TEST(OperatorSnapshotTest, SessionWindowRestoresItsMergingWindowSet) {
  // a's session [1,15) is open at the checkpoint and merges with a record after it into [1,22); b's session
  // [3,13) stays apart from b's later one.
  expect_window_resumes(EventTimeSessionWindows::with_gap(10ms),
                        {Step::rec("a", 1, 1), Step::rec("b", 10, 3), Step::rec("a", 2, 5)},
                        {Step::rec("a", 4, 12), Step::rec("b", 20, 30), Step::wm(kMaxWatermark)},
                        {"b:10[3,13)", "a:7[1,22)", "b:20[30,40)"});
}

TEST(OperatorSnapshotTest, ProcessingTimeWindowTimersAreArmedAgainAfterRestore) {
  ManualClock clock(kStartTime);
  auto assigner = TumblingProcessingTimeWindows::of(100ms);
  WindowSubtask first(make_window(assigner), 0, 1, nullptr, clock);
  first.record(KV{"a", 1}, kNoTimestamp);
  first.record(KV{"a", 2}, kNoTimestamp);
  KeyGroupBytes bytes = checkpoint(*first.op);

  WindowSubtask second(make_window(assigner), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  second.services.advance_to(kStartTime + 100);
  EXPECT_EQ(second.out.records, (std::vector<std::string>{"a:3[1000,1100)"}));
}

// ---------------------------------------------------------------------------------------------------------
// Interval join (a keyed two-input operator)
// ---------------------------------------------------------------------------------------------------------

/// Emits "key:left+right" for each joined pair; logs checkpoint hooks into `log`.
class PairJoin final : public ProcessJoinFunction<KV, KV, std::string> {
 public:
  explicit PairJoin(std::shared_ptr<std::vector<std::string>> log) : log_(std::move(log)) {}
  void process_element(const KV& l, const KV& r, Context&, Collector<std::string>& out) override {
    out.collect(l.first + ":" + std::to_string(l.second) + "+" + std::to_string(r.second));
  }
  void snapshot_state(int64_t id) override { log_->push_back("snapshot " + std::to_string(id)); }
  void notify_checkpoint_complete(int64_t id) override { log_->push_back("complete " + std::to_string(id)); }
  void notify_checkpoint_aborted(int64_t id) override { log_->push_back("aborted " + std::to_string(id)); }

 private:
  std::shared_ptr<std::vector<std::string>> log_;
};

using JoinOp = IntervalJoinOperator<std::string, KV, KV, std::string, PairJoin>;
using JoinSubtask = Subtask<JoinOp, std::string>;

std::unique_ptr<JoinOp> make_join(std::shared_ptr<std::vector<std::string>> log = nullptr) {
  if (log == nullptr) log = std::make_shared<std::vector<std::string>>();
  auto key = [](const KV& kv) { return kv.first; };
  return std::make_unique<JoinOp>(key, key, -5, 5, PairJoin(std::move(log)));
}

TEST(OperatorSnapshotTest, IntervalJoinRestoresBufferedElementsOfBothSides) {
  ManualClock clock(kStartTime);
  JoinSubtask first(make_join(), 0, 1, nullptr, clock);
  first.op->process_element1(KV{"a", 1}, 10);
  first.op->process_element2(KV{"b", 2}, 20);
  first.op->process_element1(KV{"a", 3}, 40);
  KeyGroupBytes bytes = checkpoint(*first.op);

  JoinSubtask second(make_join(), 0, 1, restore_for({bytes}, KeyGroupRange(0, kMaxParallelism - 1)), clock);
  second.op->process_element2(KV{"a", 4}, 12);  // joins the restored left element of a at 10
  second.op->process_element1(KV{"b", 5}, 17);  // joins the restored right element of b at 20
  // The restored cleanup timer of a@10 (at 15) fires; the buffered a@40 still joins afterwards.
  second.watermark(16);
  second.op->process_element2(KV{"a", 6}, 36);  // a@10 is gone, a@40 joins
  EXPECT_EQ(second.out.records, (std::vector<std::string>{"a:1+4", "b:5+2", "a:3+6"}));
}

// ---------------------------------------------------------------------------------------------------------
// RichFunction checkpoint hooks
// ---------------------------------------------------------------------------------------------------------

/// A map function logging the checkpoint hooks it receives.
class LoggingMap final : public MapFunction<int64_t, int64_t> {
 public:
  explicit LoggingMap(std::shared_ptr<std::vector<std::string>> log) : log_(std::move(log)) {}
  int64_t map(const int64_t& v) override { return v + 1; }
  void snapshot_state(int64_t id) override {
    if (id < 0) throw std::runtime_error("snapshot refused");
    log_->push_back("snapshot " + std::to_string(id));
  }
  void notify_checkpoint_complete(int64_t id) override { log_->push_back("complete " + std::to_string(id)); }
  void notify_checkpoint_aborted(int64_t id) override { log_->push_back("aborted " + std::to_string(id)); }

 private:
  std::shared_ptr<std::vector<std::string>> log_;
};

/// The three hooks in the order a checkpoint that completes and one that is aborted call them.
template <class Op>
void run_hooks(Op& op) {
  op.snapshot_state(7);
  op.notify_checkpoint_complete(7);
  op.snapshot_state(8);
  op.notify_checkpoint_aborted(8);
}
const std::vector<std::string> kHookLog{"snapshot 7", "complete 7", "snapshot 8", "aborted 8"};

TEST(OperatorSnapshotTest, OperatorsForwardCheckpointHooksToRichFunctions) {
  ManualClock clock(kStartTime);
  auto log = std::make_shared<std::vector<std::string>>();
  {
    Subtask<MapOperator<int64_t, int64_t, LoggingMap>, int64_t> map(
        std::make_unique<MapOperator<int64_t, int64_t, LoggingMap>>(LoggingMap(log)), 0, 1, nullptr, clock);
    map.record(int64_t{1}, 0);
    EXPECT_EQ(map.out.records, std::vector<int64_t>{2});
    run_hooks(*map.op);
    EXPECT_EQ(*log, kHookLog);
    // A function that throws in snapshot_state fails the operator, which names itself.
    try {
      map.op->snapshot_state(-1);
      FAIL() << "the exception of snapshot_state was swallowed";
    } catch (const OperatorException& e) {
      EXPECT_EQ(e.operator_name(), "test-operator");
    }
  }
  log->clear();
  {
    ProcessSubtask process(make_process(log), 0, 1, nullptr, clock);
    run_hooks(*process.op);
    EXPECT_EQ(*log, kHookLog);
  }
  log->clear();
  {
    JoinSubtask join(make_join(log), 0, 1, nullptr, clock);
    run_hooks(*join.op);
    EXPECT_EQ(*log, kHookLog);
  }
  log->clear();
  {
    auto fn = std::make_shared<LoggingMap>(log);
    WindowSubtask window(make_window(TumblingEventTimeWindows::of(10ms), fn), 0, 1, nullptr, clock);
    run_hooks(*window.op);
    EXPECT_EQ(*log, kHookLog);
  }
  // Plain callables have no hooks: the calls are no-ops.
  {
    auto plus_one = [](int64_t v) { return v + 1; };
    Subtask<MapOperator<int64_t, int64_t, decltype(plus_one)>, int64_t> map(
        std::make_unique<MapOperator<int64_t, int64_t, decltype(plus_one)>>(plus_one), 0, 1, nullptr, clock);
    run_hooks(*map.op);
    EXPECT_EQ(map.op->snapshot_keyed_state(), nullptr);
  }
}

}  // namespace
}  // namespace sluice
