// Jobs on state.backend.type: rocksdb (issue 18) on the local mini-cluster: keyed process functions (state and
// event-time timers) and keyed reduce give the same output as on the heap; exactly-once state and file output
// under injected failures with checkpoints and restores on RocksDB; savepoints moved heap -> rocksdb -> heap
// while rescaling 2 -> 3 -> 1; each subtask's database lives under state.backend.rocksdb.localdir and is
// removed when the job ends; windows keep exactly-once state on RocksDB under failures and move between the
// backends through savepoints; functions written against the heap's typed states refuse the backend with a reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sluice/api/keyed_process_function.h"
#include "sluice/api/stream_environment.h"
#include "sluice/api/windowed_stream.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/files.h"
#include "test_util/collect_sink.h"
#include "test_util/counting_job.h"
#include "test_util/window_sum_job.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::CollectedRecords;
using testing::CollectSink;
using ::testing::HasSubstr;

constexpr int64_t kKeys = 1'000;

fs::path fresh_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("sluice-rocksjob-test-" + name + "-" + std::to_string(::getpid()) + "-" +
                                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Instance directories (one per subtask database) under a localdir.
size_t database_dirs(const fs::path& localdir) {
  size_t n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(localdir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it.depth() == 1 && it->is_directory()) ++n;
  }
  return n;
}

Configuration backend_config(const std::string& backend, const fs::path& localdir) {
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set(options::kStateBackendType, backend);
  c.set(options::kRocksDBLocalDir, localdir.string());
  c.set_string(std::string(options::kRocksDBMemoryFixedPerSlot.key), "8mb");
  return c;
}

/// The integer mean of the values (sum, count) -> sum / count.
struct Mean final : AggregateFunction<int64_t, std::pair<int64_t, int64_t>, int64_t> {
  std::pair<int64_t, int64_t> create_accumulator() override { return {0, 0}; }
  void add(const int64_t& v, std::pair<int64_t, int64_t>& acc) override {
    acc.first += v;
    ++acc.second;
  }
  int64_t get_result(const std::pair<int64_t, int64_t>& acc) override {
    return acc.second == 0 ? 0 : acc.first / acc.second;
  }
  std::pair<int64_t, int64_t> merge(std::pair<int64_t, int64_t> a, const std::pair<int64_t, int64_t>& b) override {
    return {a.first + b.first, a.second + b.second};
  }
};

/// Per key: a count and a list of the values in ValueState / ListState, a MapState of value parity, and an
/// ReducingState (max) and AggregatingState (mean), and an event-time timer (one per key) that emits
/// "key:count:list-size:odd:max:mean@t". Records which backend it ran on.
class StateAndTimers final : public KeyedProcessFunction<int64_t, int64_t, std::string> {
 public:
  explicit StateAndTimers(std::shared_ptr<std::atomic<int>> rocksdb_subtasks) : rocksdb_(std::move(rocksdb_subtasks)) {}
  void open(RuntimeContext&) override {
    if (keyed_state().rocksdb() != nullptr) rocksdb_->fetch_add(1);
    count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0});
    values_ = &keyed_state().get_state(ListStateDescriptor<int64_t>{"values"});
    parity_ = &keyed_state().get_state(MapStateDescriptor<bool, int64_t>{"parity"});
    max_ = &keyed_state().get_state(
        ReducingStateDescriptor<int64_t>{"max", [](const int64_t& a, const int64_t& b) { return std::max(a, b); }});
    mean_ = &keyed_state().get_state(
        AggregatingStateDescriptor<int64_t, std::pair<int64_t, int64_t>, int64_t>{"mean", std::make_shared<Mean>()});
  }
  void process_element(const int64_t& v, Context& ctx, Collector<std::string>& out) override {
    count_->update(count_->value() + 1);
    values_->add(v);
    parity_->put(v % 2 == 1, parity_->get(v % 2 == 1).value_or(0) + 1);
    max_->add(v);
    mean_->add(v);
    // Beyond every record's timestamp: it fires at the final watermark, on the key's final state (a timer
    // within the stream would see a count that depends on when periodic watermarks happen to arrive).
    ctx.timer_service().register_event_time_timer(1'000'000 + ctx.current_key());
    out.collect(std::to_string(ctx.current_key()) + "=" + std::to_string(count_->value()));
  }
  void on_timer(TimestampMs t, OnTimerContext& ctx, Collector<std::string>& out) override {
    out.collect(std::to_string(ctx.current_key()) + ":" + std::to_string(count_->value()) + ":" +
                std::to_string(values_->get().size()) + ":" + std::to_string(parity_->get(true).value_or(0)) + ":" +
                std::to_string(max_->get().value_or(-1)) + ":" + std::to_string(mean_->get().value_or(-1)) + "@" +
                std::to_string(t));
  }

 private:
  std::shared_ptr<std::atomic<int>> rocksdb_;
  ValueState<int64_t>* count_ = nullptr;
  ListState<int64_t>* values_ = nullptr;
  MapState<bool, int64_t>* parity_ = nullptr;
  ReducingState<int64_t>* max_ = nullptr;
  AggregatingState<int64_t, int64_t>* mean_ = nullptr;
};

struct KeyedOutputs {
  std::vector<std::string> process;
  std::vector<std::pair<int64_t, int64_t>> reduced;
  int rocksdb_subtasks = 0;
};

KeyedOutputs run_keyed_jobs(const std::string& backend, const fs::path& localdir) {
  StreamEnvironment env(backend_config(backend, localdir));
  auto processed = std::make_shared<CollectedRecords<std::string>>();
  auto reduced = std::make_shared<CollectedRecords<std::pair<int64_t, int64_t>>>();
  auto rocksdb_subtasks = std::make_shared<std::atomic<int>>(0);
  auto numbers = env.from_source(datagen::sequence(0, 19'999), "numbers")
                     .assign_timestamps_and_watermarks(
                         WatermarkStrategy<int64_t>::for_monotonous_timestamps().with_timestamp_assigner(
                             [](const int64_t& v, TimestampMs) { return v / 10; }));
  numbers.key_by([](const int64_t& v) { return v % kKeys; })
      .process(StateAndTimers(rocksdb_subtasks))
      .sink_to(std::make_shared<CollectSink<std::string>>(processed));
  numbers.map([](const int64_t& v) {
           return std::pair<int64_t, int64_t>{v % kKeys, v};
         })
      .key_by([](const std::pair<int64_t, int64_t>& p) { return p.first; })
      .sum<1>()
      .sink_to(std::make_shared<CollectSink<std::pair<int64_t, int64_t>>>(reduced));
  JobResult r = env.execute(backend + " keyed jobs");
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  KeyedOutputs o{processed->all(), reduced->all(), rocksdb_subtasks->load()};
  std::sort(o.process.begin(), o.process.end());
  std::sort(o.reduced.begin(), o.reduced.end());
  return o;
}

TEST(RocksDBBackendJobTest, KeyedProcessAndReduceGiveTheHeapsResults) {
  const fs::path root = fresh_dir("same");
  KeyedOutputs heap = run_keyed_jobs("hashmap", root / "heap-local");
  KeyedOutputs rocks = run_keyed_jobs("rocksdb", root / "rocks-local");
  EXPECT_EQ(heap.rocksdb_subtasks, 0);
  EXPECT_EQ(rocks.rocksdb_subtasks, 2);  // both subtasks of the process function ran on RocksDB
  // 20,000 per-record lines + one timer line per key; the reduce emits one sum per record.
  ASSERT_EQ(heap.process.size(), 20'000u + kKeys);
  EXPECT_EQ(heap.process, rocks.process);
  // The rolling sums depend on the order in which the two source subtasks' records interleave; the number of
  // sums and each key's final sum (its largest: the values are not negative) do not.
  ASSERT_EQ(heap.reduced.size(), 20'000u);
  ASSERT_EQ(rocks.reduced.size(), 20'000u);
  std::map<int64_t, int64_t> heap_final, rocks_final;
  for (const auto& [k, sum] : heap.reduced)
    heap_final[k] = std::max(heap_final[k], sum);
  for (const auto& [k, sum] : rocks.reduced)
    rocks_final[k] = std::max(rocks_final[k], sum);
  ASSERT_EQ(heap_final.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(heap_final[7], 20 * 7 + 1000 * (19 * 20 / 2));  // 7 + 1007 + ... + 19007
  EXPECT_EQ(heap_final, rocks_final);
  // Every database was removed when the job finished (the per-process directory may stay, empty).
  EXPECT_EQ(database_dirs(root / "rocks-local"), 0u);
  EXPECT_FALSE(fs::exists(root / "heap-local" / ("sluice-rocksdb-" + std::to_string(::getpid())) / "x"));
  fs::remove_all(root);
}

/// Fails after a seeded number of records, `failures` times over the whole job.
struct FailingMap {
  std::shared_ptr<std::atomic<int>> fired;
  std::shared_ptr<const std::vector<int64_t>> thresholds;
  int64_t seen = 0;
  int64_t operator()(int64_t v) {
    int k = fired->load();
    if (k < static_cast<int>(thresholds->size()) && ++seen >= (*thresholds)[static_cast<size_t>(k)]) {
      if (fired->compare_exchange_strong(k, k + 1))
        throw std::runtime_error("injected failure " + std::to_string(k + 1));
    }
    return v;
  }
};

Configuration checkpointing_config(const std::string& backend, const fs::path& root, int parallelism) {
  Configuration c = backend_config(backend, root / "local");
  c.set(options::kParallelism, parallelism);
  c.set_string(std::string(options::kCheckpointInterval.key), "30ms");
  c.set(options::kCheckpointDir, "file://" + (root / "checkpoints").string());
  c.set(options::kSavepointDir, (root / "savepoints").string());
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 1000);
  c.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
  return c;
}

void build_counting_job(StreamEnvironment& env, const fs::path& out, int64_t records,
                        std::shared_ptr<std::atomic<int>> fired, std::shared_ptr<const std::vector<int64_t>> thresholds,
                        double rate = 0) {
  env.from_source(datagen::sequence(0, records - 1, rate), "numbers")
      .uid("numbers")
      .map(FailingMap{std::move(fired), std::move(thresholds)})
      .uid("failing-map")
      .key_by([](const int64_t& v) { return v % kKeys; })
      .process(testing::CountPerKey(kKeys))
      .uid("count")
      .sink_to(FileSink<std::string>::text(out.string()))
      .uid("sink");
}

// Every failure restarts the job from its last checkpoint: the RocksDB state is restored from the checkpoint
// into fresh databases, and the committed output equals a failure-free run's, line for line. With incremental
// checkpoints the restore opens the checkpoint's own RocksDB files.
void exactly_once_under_injected_failures(bool incremental) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu (failures after seeded record counts)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  constexpr int64_t kRecords = 200'000;
  constexpr int kFailures = 5;
  auto thresholds = std::make_shared<std::vector<int64_t>>();
  for (int i = 0; i < kFailures; ++i)
    thresholds->push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(kRecords / kFailures / 4)) + 1);
  const fs::path root = fresh_dir("eo");
  auto fired = std::make_shared<std::atomic<int>>(0);
  Configuration c = checkpointing_config("rocksdb", root, 2);
  c.set(options::kStateBackendIncremental, incremental);
  c.set(options::kCheckpointsRetained, 3);
  StreamEnvironment env(c);
  build_counting_job(env, root / "out", kRecords, fired, thresholds);
  JobResult r;
  std::vector<CheckpointStats> stats;
  {
    JobClient client = env.execute_async("rocksdb exactly-once counting");
    r = client.wait();
    stats = client.checkpoint_stats();
  }  // the job's released state (its databases) is freed with it
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  if (incremental) {
    // Later checkpoints wrote less than the state they reference (the shared SST files of earlier ones).
    int smaller = 0;
    for (const CheckpointStats& st : stats)
      smaller += st.completed && st.checkpointed_bytes < st.state_bytes ? 1 : 0;
    std::printf("%d of %zu checkpoints wrote less than their state\n", smaller, stats.size());
    EXPECT_GT(smaller, 0);
    EXPECT_FALSE(fs::is_empty(root / "checkpoints" / r.job_id / "shared"));
  }
  // Each failure fires after its seeded count of one subtask's records; a run that ends first leaves the rest.
  std::printf("%d injected failures, %d restarts\n", fired->load(), r.restarts);
  EXPECT_GE(fired->load(), 1);
  EXPECT_GE(r.restarts, 1);
  EXPECT_GT(r.completed_checkpoints, 0);
  EXPECT_TRUE(testing::read_committed(root / "out") == testing::expected_counts(kRecords, kKeys))
      << "output differs from the failure-free run (seed " << seed << ")";
  EXPECT_EQ(database_dirs(root / "local"), 0u);
  fs::remove_all(root);
}

TEST(RocksDBBackendJobTest, ExactlyOnceStateUnderInjectedFailuresOnRocksDB) {
  exactly_once_under_injected_failures(/*incremental=*/false);
}

TEST(RocksDBBackendJobTest, ExactlyOnceStateUnderInjectedFailuresWithIncrementalCheckpoints) {
  exactly_once_under_injected_failures(/*incremental=*/true);
}

/// Runs the job of `env` named `name`: to its end when `to_the_end`, else until three checkpoints completed,
/// then cancels it and sets `checkpoint` to its latest completed one (the committed output matches it).
void run_or_cancel_after_checkpoints(StreamEnvironment& env, const std::string& name, bool to_the_end,
                                     std::string& checkpoint) {
  JobClient client = env.execute_async(name);
  if (to_the_end) {
    JobResult r = client.wait();
    ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
    return;
  }
  ASSERT_TRUE(testing::wait_until([&] { return client.checkpoint_stats().size() >= 3; }, 60s));
  client.cancel();
  JobResult r = client.wait();
  ASSERT_FALSE(r.latest_checkpoint_path.empty());
  checkpoint = r.latest_checkpoint_path;
}

// Incremental checkpoints restore at another parallelism (2 -> 3 -> 1): each new subtask opens the old database
// sharing most of its key groups and clips it, and ingests the others' key groups; the heap refuses such a checkpoint
// with the way out (a savepoint).
TEST(RocksDBBackendJobTest, IncrementalCheckpointsRescaleTwoThreeOne) {
  const int64_t records = 60'000;
  const fs::path root = fresh_dir("rescale-incremental");
  auto fired = std::make_shared<std::atomic<int>>(0);
  auto no_failures = std::make_shared<const std::vector<int64_t>>();
  std::string checkpoint;
  for (int parallelism : {2, 3, 1}) {
    Configuration c = checkpointing_config("rocksdb", root, parallelism);
    c.set(options::kStateBackendIncremental, true);
    if (!checkpoint.empty()) c.set(options::kStateRecoveryPath, checkpoint);
    StreamEnvironment env(c);
    build_counting_job(env, root / "out", records, fired, no_failures, /*rate=*/15'000);
    run_or_cancel_after_checkpoints(env, "incremental p=" + std::to_string(parallelism), parallelism == 1, checkpoint);
    if (HasFatalFailure()) return;
    if (parallelism == 2) {
      // The heap cannot read RocksDB's files: the job fails with the way out.
      Configuration h = checkpointing_config("hashmap", root / "heap", 2);
      h.set(options::kStateRecoveryPath, checkpoint);
      h.set(options::kRestartStrategy, std::string("none"));
      StreamEnvironment heap_env(h);
      build_counting_job(heap_env, root / "heap-out", records, fired, no_failures);
      JobResult hr = heap_env.execute("heap from an incremental checkpoint");
      ASSERT_FALSE(hr.ok());
      ASSERT_TRUE(hr.error.has_value());
      EXPECT_THAT(hr.error->to_string(), HasSubstr("through a savepoint"));
    }
  }
  EXPECT_TRUE(testing::read_committed(root / "out") == testing::expected_counts(records, kKeys));
  fs::remove_all(root);
}

/// Runs the job `build` makes on heap p2, then rocksdb p3, then heap p1, each started from the savepoint the one
/// before was stopped with (after two checkpoints); the last runs to its end. `build(env, parallelism)` adds the
/// job to `env`; its sources must still be running after two checkpoints on a loaded machine. With
/// `rocksdb_timers` the rocksdb run keeps its timers in RocksDB (its savepoint writes them from there).
void run_through_savepoints_heap_rocksdb_heap(const fs::path& root,
                                              const std::function<void(StreamEnvironment&, int)>& build,
                                              bool rocksdb_timers = false) {
  std::string savepoint;
  const std::vector<std::pair<std::string, int>> runs{{"hashmap", 2}, {"rocksdb", 3}, {"hashmap", 1}};
  for (const auto& [backend, parallelism] : runs) {
    Configuration c = checkpointing_config(backend, root, parallelism);
    if (!savepoint.empty()) c.set(options::kStateRecoveryPath, savepoint);
    if (backend == "rocksdb" && rocksdb_timers) {
      c.set_string(std::string(options::kRocksDBTimerServiceFactory.key), "rocksdb");
    }
    StreamEnvironment env(c);
    build(env, parallelism);
    JobClient client = env.execute_async(backend + " p=" + std::to_string(parallelism));
    if (parallelism == 1) {
      JobResult r = client.wait();
      ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
      return;
    }
    ASSERT_TRUE(testing::wait_until([&] { return client.checkpoint_stats().size() >= 2; }, 60s));
    Result<std::string> sp = client.stop_with_savepoint().get();
    ASSERT_TRUE(sp.ok()) << sp.error().to_string();
    JobResult r = client.wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
    savepoint = *sp;
  }
}

// Snapshots are canonical: a savepoint of the heap restores into RocksDB and back, across rescaling.
TEST(RocksDBBackendJobTest, SavepointsMoveHeapToRocksDBToHeapWhileRescaling) {
  const int64_t records = 60'000;
  const fs::path root = fresh_dir("cross");
  auto fired = std::make_shared<std::atomic<int>>(0);
  auto no_failures = std::make_shared<const std::vector<int64_t>>();
  run_through_savepoints_heap_rocksdb_heap(root, [&](StreamEnvironment& env, int) {
    // Slow enough (4 s per run) that a run is still going when its checkpoints complete on a loaded machine.
    build_counting_job(env, root / "out", records, fired, no_failures, /*rate=*/15'000);
  });
  if (HasFatalFailure()) return;
  EXPECT_TRUE(testing::read_committed(root / "out") == testing::expected_counts(records, kKeys));
  fs::remove_all(root);
}

// Window contents (an aggregate per key and window), trigger state and the cleanup timers of a window operator
// on rocksdb survive failures: every restart restores them from an incremental checkpoint into fresh databases,
// and the committed sums equal a failure-free run's. The window's state is in RocksDB: the checkpoints upload SST
// files to shared/, and restarts open them. With `rocksdb_timers` the window timers are in RocksDB too
// (timer-service.factory: rocksdb), so they come back from the checkpoint's files rather than its key-group blobs.
void window_exactly_once_under_injected_failures(bool rocksdb_timers) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu (failures after seeded record counts)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  constexpr int64_t kRecords = 100'000;
  constexpr int64_t kWindowKeys = 50;
  auto thresholds = std::make_shared<std::vector<int64_t>>();
  for (int i = 0; i < 4; ++i)
    thresholds->push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(kRecords / 16)) + 1);
  const fs::path root = fresh_dir("window-eo");
  auto fired = std::make_shared<std::atomic<int>>(0);
  Configuration c = checkpointing_config("rocksdb", root, 2);
  c.set(options::kStateBackendIncremental, true);
  if (rocksdb_timers) c.set_string(std::string(options::kRocksDBTimerServiceFactory.key), "rocksdb");
  StreamEnvironment env(c);
  env.from_source(datagen::sequence(0, kRecords - 1, /*rate=*/40'000),
                  WatermarkStrategy<int64_t>::for_monotonous_timestamps().with_timestamp_assigner(
                      [](const int64_t& v, TimestampMs) { return v; }),
                  "numbers")
      .uid("numbers")
      .map(FailingMap{fired, thresholds})
      .uid("failing-map")
      .key_by([](const int64_t& v) { return v % kWindowKeys; })
      .window(TumblingEventTimeWindows::of(1000ms))
      .reduce([](int64_t a, int64_t b) { return a + b; }, testing::WindowSumLine{})
      .uid("window")
      .sink_to(FileSink<std::string>::text((root / "out").string()))
      .uid("sink");
  JobResult r = env.execute("rocksdb windows exactly-once");
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  std::printf("%d injected failures, %d restarts, %lld checkpoints\n", fired->load(), r.restarts,
              static_cast<long long>(r.completed_checkpoints));
  EXPECT_GE(r.restarts, 1);
  EXPECT_GT(r.completed_checkpoints, 0);
  EXPECT_FALSE(fs::is_empty(root / "checkpoints" / r.job_id / "shared"));
  EXPECT_TRUE(testing::read_committed(root / "out") == testing::expected_window_sums(kRecords, kWindowKeys))
      << "window sums differ from the failure-free run (seed " << seed << ")";
  EXPECT_EQ(database_dirs(root / "local"), 0u);
  fs::remove_all(root);
}

TEST(RocksDBBackendJobTest, WindowStateIsExactlyOnceUnderInjectedFailuresWithIncrementalCheckpoints) {
  window_exactly_once_under_injected_failures(/*rocksdb_timers=*/false);
}

TEST(RocksDBBackendJobTest, WindowStateAndTimersInRocksDBAreExactlyOnceUnderInjectedFailures) {
  window_exactly_once_under_injected_failures(/*rocksdb_timers=*/true);
}

/// The session-window job of the savepoint tests below: `records` records over `keys` keys, event time = value,
/// each key's session open until the end of input; the sources run at `rate` per second (0: unpaced).
void build_session_job(StreamEnvironment& env, const fs::path& root, int64_t records, int64_t keys, double rate) {
  // Watermarks per split, in the source (FLIP-27): after a rescale one reader holds several splits and reads
  // them one after the other, so the stream it emits is not in timestamp order, while each split is.
  env.from_source(datagen::sequence(0, records - 1, rate),
                  WatermarkStrategy<int64_t>::for_monotonous_timestamps().with_timestamp_assigner(
                      [](const int64_t& v, TimestampMs) { return v; }),
                  "numbers")
      .uid("numbers")
      .key_by([keys](const int64_t& v) { return v % keys; })
      .window(EventTimeSessionWindows::with_gap(100ms))
      .reduce([](int64_t a, int64_t b) { return a + b; }, testing::WindowSumLine{})
      .uid("sessions")
      .sink_to(FileSink<std::string>::text((root / "out").string()))
      .uid("sink");
}

/// Checks that the committed output holds one session per key over all its records (window start = the key).
void expect_one_session_per_key(const fs::path& root, int64_t records, int64_t keys) {
  std::map<std::string, int64_t> expected;
  for (int64_t k = 0; k < keys; ++k) {
    int64_t sum = 0;
    for (int64_t v = k; v < records; v += keys)
      sum += v;
    ++expected[std::to_string(k) + "," + std::to_string(k) + "," + std::to_string(sum)];
  }
  const std::map<std::string, int64_t> got = testing::read_committed(root / "out");
  EXPECT_TRUE(got == expected);
  for (const auto& [line, n] : got) {
    if (expected.count(line) == 0 || expected.at(line) != n) ADD_FAILURE() << "unexpected: " << line << " x" << n;
  }
  for (const auto& [line, n] : expected) {
    if (got.count(line) == 0) ADD_FAILURE() << "missing: " << line;
  }
}

// Timers move between the heap and RocksDB through incremental checkpoints while rescaling: open session windows
// (their end-of-window timers) checkpointed with heap timers at p2 restore into RocksDB timers at p3 (the timers
// come from the checkpoint's key-group blobs into the new databases' timer column families), whose checkpoint
// restores into heap timers at p1 (the timers come out of the restored databases' column families, which are then
// dropped). Every session fires once, at the end of input.
TEST(RocksDBBackendJobTest, TimersMoveBetweenHeapAndRocksDBThroughIncrementalCheckpointsWhileRescaling) {
  constexpr int64_t kRecords = 300'000;
  constexpr int64_t kSessionKeys = 20;
  const fs::path root = fresh_dir("timers-cross");
  std::string checkpoint;
  const std::vector<std::pair<std::string, int>> runs{{"heap", 2}, {"rocksdb", 3}, {"heap", 1}};
  for (const auto& [timers, parallelism] : runs) {
    Configuration c = checkpointing_config("rocksdb", root, parallelism);
    c.set(options::kStateBackendIncremental, true);
    c.set_string(std::string(options::kRocksDBTimerServiceFactory.key), timers);
    if (!checkpoint.empty()) c.set(options::kStateRecoveryPath, checkpoint);
    StreamEnvironment env(c);
    build_session_job(env, root, kRecords, kSessionKeys, /*rate=*/parallelism == 1 ? 0 : 15'000);
    run_or_cancel_after_checkpoints(env, "timers " + timers + " p=" + std::to_string(parallelism), parallelism == 1,
                                    checkpoint);
    if (HasFatalFailure()) return;
  }
  expect_one_session_per_key(root, kRecords, kSessionKeys);
  EXPECT_EQ(database_dirs(root / "local"), 0u);
  fs::remove_all(root);
}

// The window operator's state moves between the backends and parallelisms through savepoints: session windows
// (merging-window sets, merged contents, their timers) open on the heap at p2 are closed on rocksdb at p3 (timers
// in RocksDB: its savepoint writes them canonically from there) and the heap at p1.
TEST(RocksDBBackendJobTest, OpenSessionWindowsMoveHeapToRocksDBToHeapThroughSavepoints) {
  // Runs 1 and 2 are stopped by stop-with-savepoint after two checkpoints: their sources are slow enough (20 s for
  // all records) that a loaded machine still finds them running; the last run reads the rest at full speed.
  constexpr int64_t kRecords = 300'000;
  constexpr int64_t kSessionKeys = 20;
  const fs::path root = fresh_dir("window-cross");
  run_through_savepoints_heap_rocksdb_heap(
      root,
      [&](StreamEnvironment& env, int parallelism) {
        build_session_job(env, root, kRecords, kSessionKeys, /*rate=*/parallelism == 1 ? 0 : 15'000);
      },
      /*rocksdb_timers=*/true);
  if (HasFatalFailure()) return;
  expect_one_session_per_key(root, kRecords, kSessionKeys);
  fs::remove_all(root);
}

/// Sums per key in the heap's typed state (keyed_state().heap()): refused on rocksdb.
struct HeapTypedSum final : KeyedProcessFunction<int64_t, int64_t, int64_t> {
  void open(RuntimeContext&) override {
    sum_ = &keyed_state().heap().get_state(ValueStateDescriptor<int64_t>{"sum", 0});
  }
  void process_element(const int64_t& v, Context&, Collector<int64_t>& out) override {
    sum_->update(sum_->value() + v);
    out.collect(sum_->value());
  }
  HeapValueState<int64_t, VoidNamespace, int64_t>* sum_ = nullptr;
};

// A function written against the heap's typed states fails the job at open on rocksdb with the way out, never
// runs on the heap silently.
TEST(RocksDBBackendJobTest, HeapTypedStatesRefuseRocksDBWithAReason) {
  const fs::path root = fresh_dir("heap-typed");
  StreamEnvironment env(backend_config("rocksdb", root / "local"));
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, 999), "numbers")
      .key_by([](const int64_t& v) { return v % 10; })
      .process(HeapTypedSum{})
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute("heap-typed state on rocksdb");
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(r.error.has_value());
  EXPECT_THAT(r.error->to_string(), HasSubstr("use keyed_state().get_state()"));
  fs::remove_all(root);
}

TEST(RocksDBBackendJobTest, UnknownOptionValuesAreRefusedAtExecute) {
  const fs::path root = fresh_dir("refused");
  for (const auto& [key, value, reason] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"state.backend.rocksdb.timer-service.factory", "disk", "expected heap or rocksdb"},
           {"state.backend.type", "forst", "expected hashmap or rocksdb"}}) {
    Configuration c = backend_config("rocksdb", root / "local");
    c.set_string(key, value);
    StreamEnvironment env(c);
    env.from_source(datagen::sequence(0, 9), "numbers")
        .key_by([](const int64_t& v) { return v % 2; })
        .process(testing::CountPerKey(2))
        .sink_to(std::make_shared<CollectSink<std::string>>(std::make_shared<CollectedRecords<std::string>>()));
    JobResult r = env.execute("refused");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_THAT(r.error->to_string(), HasSubstr(reason));
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace sluice
