// Job-level tests of the local runtime: per-key order, backpressure bounds, failures and cancellation.
#include "sluice/cluster/local_cluster.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/runtime/buffer_pool.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

using testing::CollectedRecords;
using testing::CollectSink;

struct Event {
  int64_t key = 0;
  int64_t seq = 0;
};
SLUICE_FIELDS(Event, key, seq);

/// Threads of this process named "sluice-task" (task threads name themselves; sanitizer runtimes may add
/// threads of their own, which are not counted).
int thread_count() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "sluice-task") ++n;
  }
  closedir(d);
  return n;
}

class PerKeyOrderTest : public ::testing::TestWithParam<int> {};

TEST_P(PerKeyOrderTest, EachKeysSequenceArrivesInOrder) {
  const int p = GetParam();
  constexpr int64_t kKeys = 97;
  constexpr int64_t kRecords = 200'000;
  StreamEnvironment env;
  env.set_parallelism(p);
  // Record i belongs to key i % kKeys and is that key's (i / kKeys)-th record.
  auto source = std::make_shared<DataGeneratorSource<Event>>(
      [](int64_t i) {
        return Event{i % kKeys, i / kKeys};
      },
      kRecords);
  auto out = std::make_shared<CollectedRecords<Event>>();
  // One source subtask keeps a single total order per key at the source; key_by must preserve it.
  env.from_source(source, "events")
      .set_parallelism(1)
      .map([](Event e) { return e; })
      .set_parallelism(1)
      .key_by(&Event::key)
      .map([](Event e) { return e; })
      .sink_to(std::make_shared<CollectSink<Event>>(out));
  JobResult r = env.execute("per-key order");
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  std::map<int64_t, int64_t> next;
  std::map<int64_t, int> subtask_of_key;
  auto per_subtask = out->per_subtask();
  size_t total = 0;
  for (size_t s = 0; s < per_subtask.size(); ++s) {
    for (const Event& e : per_subtask[s]) {
      ++total;
      auto [it, inserted] = subtask_of_key.emplace(e.key, static_cast<int>(s));
      ASSERT_EQ(it->second, static_cast<int>(s)) << "key " << e.key << " reached two subtasks";
      ASSERT_EQ(next[e.key], e.seq) << "key " << e.key << " out of order";
      next[e.key] = e.seq + 1;
    }
  }
  EXPECT_EQ(total, static_cast<size_t>(kRecords));
}

INSTANTIATE_TEST_SUITE_P(Parallelism, PerKeyOrderTest, ::testing::Values(1, 2, 4, 8));

/// Opens the gate when the test leaves scope, also on a failed assertion, so no task stays blocked.
struct OpenOnExit {
  std::shared_ptr<testing::Gate> gate;
  ~OpenOnExit() { gate->open_fully(); }
};

TEST(BackpressureTest, InFlightBuffersStayWithinTheConfiguredBoundAndNothingIsLost) {
  constexpr int64_t kRecords = 300'000;
  constexpr int kCredits = 2;
  StreamEnvironment env;
  // One subtask per operator, so every channel has exactly one sender and the pipeline fills every credit
  // deterministically (with several channels per sender, a blocked sender may leave other channels' credit
  // unused).
  env.set_parallelism(1);
  env.config().set(options::kBuffersPerChannel, kCredits);
  env.config().set(options::kBufferSize, int64_t{4096});
  std::atomic<int64_t> generated{0};
  auto source = std::make_shared<DataGeneratorSource<Event>>(
      [&generated](int64_t i) {
        generated.fetch_add(1, std::memory_order_relaxed);
        return Event{i % 1000, i};
      },
      kRecords);
  auto gate = std::make_shared<testing::Gate>();
  OpenOnExit open_on_exit{gate};
  auto out = std::make_shared<CollectedRecords<Event>>();
  env.from_source(source, "fast")
      .key_by(&Event::key)
      .map([](Event e) { return e; })
      .disable_chaining()
      .sink_to(std::make_shared<testing::GatedSink<Event>>(gate, out));
  LocalJobProbe probe;
  JobClient client = env.execute_async("backpressure", &probe);
  const NetworkBufferPool& pool = *probe.buffer_pool;
  // Two exchanges (source -> map by hash, map -> sink forward), one channel each.
  const int64_t bound = static_cast<int64_t>(pool.max_buffers());
  EXPECT_EQ(bound, 2 * kCredits);
  // With the sink closed the pipeline fills every credit and then the source must stop.
  ASSERT_TRUE(testing::wait_until([&] { return pool.in_flight() == bound; }))
      << "in flight " << pool.in_flight() << " of " << bound;
  const int64_t stalled_at = generated.load();
  // Every buffer holds at most 4096 / 21 records; plus one record per task blocked mid-write.
  const int64_t max_buffered = bound * (4096 / 21 + 1) + 16;
  EXPECT_LT(stalled_at, max_buffered) << "the source kept producing while the sink was blocked";
  gate->open_fully();
  JobResult r = client.wait();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(out->size(), static_cast<size_t>(kRecords));
  EXPECT_LE(pool.peak_in_flight(), bound);
  EXPECT_EQ(pool.allocated(), static_cast<size_t>(bound));
  EXPECT_EQ(pool.in_flight(), 0);
}

TEST(BackpressureTest, PeakInFlightStaysWithinTheBoundAtParallelismTwo) {
  constexpr int64_t kRecords = 200'000;
  StreamEnvironment env;
  env.set_parallelism(2);
  env.config().set(options::kBuffersPerChannel, 2);
  env.config().set(options::kBufferSize, int64_t{4096});
  auto source = std::make_shared<DataGeneratorSource<Event>>([](int64_t i) { return Event{i % 1000, i}; }, kRecords);
  auto out = std::make_shared<CollectedRecords<Event>>();
  // A slow sink (a lock and a vector append per record) behind two exchanges.
  env.from_source(source, "fast")
      .key_by(&Event::key)
      .map([](Event e) { return e; })
      .disable_chaining()
      .sink_to(std::make_shared<CollectSink<Event>>(out));
  LocalJobProbe probe;
  JobClient client = env.execute_async("backpressure p2", &probe);
  JobResult r = client.wait();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(out->size(), static_cast<size_t>(kRecords));
  EXPECT_LE(probe.buffer_pool->peak_in_flight(), static_cast<int64_t>(probe.buffer_pool->max_buffers()));
  EXPECT_EQ(probe.buffer_pool->allocated(), (2u * 2u + 2u) * 2u);
}

TEST(FailureTest, ExceptionInMapFailsTheJobNamingOperatorAndSubtask) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, 100'000), "numbers")
      .rebalance()
      .map([](int64_t v) -> int64_t {
        if (v == 4242) throw std::runtime_error("bad record 4242");
        return v;
      })
      .name("Explode")
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute("failing");
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("operator 'Explode'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("subtask "), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad record 4242"), std::string::npos) << msg;
}

/// Delegates to `inner`, but its enumerator cannot be created on calls 2 .. 1 + failures (a source whose system is
/// still unreachable when a restart deploys it), as a Kafka source whose broker is down; `unrecoverable` marks
/// that failure as no restart can cure.
template <class S>
class FlakyEnumeratorSource final : public Source<typename S::RecordType, typename S::SplitType> {
 public:
  using SplitT = typename S::SplitType;
  FlakyEnumeratorSource(std::shared_ptr<S> inner, int failures, bool unrecoverable)
      : inner_(std::move(inner)), failures_(failures), unrecoverable_(unrecoverable) {}
  Boundedness boundedness() const override { return inner_->boundedness(); }
  std::unique_ptr<SplitEnumerator<SplitT>> create_enumerator(SplitEnumeratorContext<SplitT>& ctx) const override {
    const int n = calls_.fetch_add(1);
    if (n >= 1 && n <= failures_) {
      Error e(ErrorCode::kConnector,
              "cannot reach the cluster at 'broker:9092' within 30000 ms (call " + std::to_string(n) + ")");
      throw SluiceException(unrecoverable_ ? mark_non_recoverable(e, "the test says so") : e);
    }
    return inner_->create_enumerator(ctx);
  }
  std::unique_ptr<SourceReader<typename S::RecordType, SplitT>> create_reader(SourceReaderContext& ctx) const override {
    return inner_->create_reader(ctx);
  }
  int calls() const { return calls_.load(); }

 private:
  std::shared_ptr<S> inner_;
  int failures_;
  bool unrecoverable_;
  mutable std::atomic<int> calls_{0};
};

// A restart whose source enumerator cannot reach its system (a broker still down when the backoff ended) is one more
// failure for the restart strategy, not the end of the job (found bouncing a Kafka broker under a Kafka-source
// pipeline: "region 0 cannot restart: restoring the split enumerator ..." and the job FAILED with restarts left).
// A failure marked non-recoverable there still fails the job at once.
TEST(RestartTest, ASourceThatCannotBeRestoredYetIsRetriedByTheRestartStrategy) {
  for (bool unrecoverable : {false, true}) {
    SCOPED_TRACE(unrecoverable ? "marked non-recoverable" : "transient");
    Configuration c;
    c.set(options::kRestartStrategy, std::string("fixed-delay"));
    c.set(options::kFixedDelayAttempts, 5);
    c.set(options::kFixedDelayDelay, int64_t{0});
    StreamEnvironment env(c);
    env.set_parallelism(1);
    auto failed = std::make_shared<std::atomic<bool>>(false);
    auto out = std::make_shared<CollectedRecords<int64_t>>();
    auto source = std::make_shared<FlakyEnumeratorSource<DataGeneratorSource<int64_t>>>(
        std::make_shared<DataGeneratorSource<int64_t>>([](int64_t i) { return i; }, 100), 2, unrecoverable);
    env.from_source(source, "numbers")
        .map([failed](int64_t v) -> int64_t {
          if (v == 50 && !failed->exchange(true)) throw std::runtime_error("one failure");
          return v;
        })
        .sink_to(std::make_shared<CollectSink<int64_t>>(out));
    JobResult r = env.execute("flaky enumerator");
    const std::string err = r.error ? r.error->to_string() : "";
    if (!unrecoverable) {
      EXPECT_EQ(r.status, JobStatus::kFinished) << err;
      EXPECT_EQ(r.restarts, 3) << "the task's failure, then two restarts that could not deploy the source";
      EXPECT_EQ(source->calls(), 4);
    } else {
      EXPECT_EQ(r.status, JobStatus::kFailed);
      EXPECT_EQ(r.restarts, 1) << err;
      EXPECT_NE(err.find("not recoverable by a restart: the test says so"), std::string::npos) << err;
    }
  }
}

// A restart loop is never RUNNING: from the failure on the job is RESTARTING, with each failure (cause, time,
// task) in its exception history and the restart count, within 5 s (issue 14, "no silent failure"). The restart
// waits on the job's Clock: a ManualClock that does not move holds it back, and advancing it restarts the job.
TEST(RestartTest, ARestartLoopIsRestartingWithItsFailuresAndTheInjectedClockDrivesTheRestarts) {
  constexpr TimestampMs kStart = 1'790'000'000'000;
  ManualClock clock(kStart);
  Configuration c;
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 5);
  c.set(options::kFixedDelayDelay, int64_t{60'000});
  StreamEnvironment env(c);
  env.set_clock(clock);
  env.set_parallelism(1);
  auto failures = std::make_shared<std::atomic<int>>(0);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  // Rate-limited on the ManualClock: one record per attempt until the clock moves.
  auto source = std::make_shared<DataGeneratorSource<int64_t>>([](int64_t i) { return i; },
                                                               DataGeneratorSource<int64_t>::kUnbounded, 1.0);
  env.from_source(source, "numbers")
      .map([failures](int64_t v) -> int64_t {
        if (failures->load() < 2) {
          failures->fetch_add(1);
          throw std::runtime_error("database unreachable");
        }
        return v;
      })
      .name("Connect")
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobClient client = env.execute_async("restart loop");
  auto within_5s = [](auto pred) { return testing::wait_until(pred, std::chrono::seconds(5)); };

  ASSERT_TRUE(within_5s([&] { return client.status() == JobStatus::kRestarting; })) << job_status_name(client.status());
  ASSERT_TRUE(within_5s([&] { return client.exceptions().size() == 1; }));
  std::vector<JobExceptionInfo> ex = client.exceptions();
  EXPECT_EQ(ex[0].exception_name, "runtime");
  EXPECT_NE(ex[0].message.find("database unreachable"), std::string::npos) << ex[0].message;
  EXPECT_NE(ex[0].stacktrace.find("operator 'Connect'"), std::string::npos) << ex[0].stacktrace;
  EXPECT_NE(ex[0].task_name.find("Connect"), std::string::npos) << ex[0].task_name;
  EXPECT_EQ(ex[0].timestamp_ms, kStart);  // the job's Clock, not the system's
  EXPECT_TRUE(ex[0].restarted);
  EXPECT_EQ(client.restarts(), 1);

  // The 60 s backoff is on the ManualClock: without it moving the job keeps waiting (checked for a while).
  EXPECT_FALSE(testing::wait_until([&] { return failures->load() > 1; }, std::chrono::milliseconds(500)));
  EXPECT_EQ(client.status(), JobStatus::kRestarting);

  clock.advance(60'000);  // the second attempt starts and fails at once
  ASSERT_TRUE(within_5s([&] { return client.exceptions().size() == 2; }));
  EXPECT_EQ(client.exceptions()[0].timestamp_ms, kStart + 60'000);  // newest first
  EXPECT_EQ(client.restarts(), 2);
  EXPECT_EQ(client.status(), JobStatus::kRestarting);

  clock.advance(60'000);  // the third attempt runs
  ASSERT_TRUE(within_5s([&] { return client.status() == JobStatus::kRunning; })) << job_status_name(client.status());
  ASSERT_TRUE(within_5s([&] { return out->size() >= 1; }));
  client.cancel();
  JobResult r = client.wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled);
  EXPECT_EQ(r.restarts, 2);
}

// One clock (issue 19): the checkpoint interval and the restart delay are both read on the job's injected Clock.
// With a 50 ms interval the system clock would take ~20 checkpoints in the first second; a ManualClock that stands
// still takes none, and each 50 ms it moves takes one. A failure then waits for the 30 s restart delay on the same
// clock: the job stays RESTARTING until the test moves it.
TEST(RestartTest, CheckpointIntervalAndRestartDelayFollowTheInjectedManualClock) {
  constexpr TimestampMs kStart = 1'790'000'000'000;
  ManualClock clock(kStart);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("sluice-manual-clock-" + std::to_string(::getpid()) + "-" +
                                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  Configuration c;
  c.set(options::kCheckpointInterval, int64_t{50});
  c.set(options::kCheckpointDir, "file://" + dir.string());
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 5);
  c.set(options::kFixedDelayDelay, int64_t{30'000});
  StreamEnvironment env(c);
  env.set_clock(clock);
  env.set_parallelism(1);
  auto fail = std::make_shared<std::atomic<bool>>(false);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  // Rate-limited on the ManualClock: one record per 1000 ms the clock moves.
  auto source = std::make_shared<DataGeneratorSource<int64_t>>([](int64_t i) { return i; },
                                                               DataGeneratorSource<int64_t>::kUnbounded, 1.0);
  env.from_source(source, "numbers")
      .uid("numbers")
      .map([fail](int64_t v) -> int64_t {
        if (fail->exchange(false)) throw std::runtime_error("injected failure");
        return v;
      })
      .uid("maybe-fail")
      .sink_to(std::make_shared<CollectSink<int64_t>>(out))
      .uid("sink");
  JobClient client = env.execute_async("manual clock");
  auto within_10s = [](auto pred) { return testing::wait_until(pred, std::chrono::seconds(10)); };
  auto completed = [&] { return client.checkpoint_counts().completed; };

  ASSERT_TRUE(within_10s([&] { return client.status() == JobStatus::kRunning; })) << job_status_name(client.status());
  // The clock stands still: no checkpoint, however long the real wait (1 s = 20 intervals of the system clock).
  EXPECT_FALSE(testing::wait_until([&] { return completed() > 0; }, std::chrono::milliseconds(1000)));
  clock.advance(50);
  ASSERT_TRUE(within_10s([&] { return completed() == 1; })) << completed();
  EXPECT_FALSE(testing::wait_until([&] { return completed() > 1; }, std::chrono::milliseconds(500)));
  clock.advance(50);
  ASSERT_TRUE(within_10s([&] { return completed() == 2; })) << completed();
  const std::vector<CheckpointStats> stats = client.checkpoint_stats();
  ASSERT_FALSE(stats.empty());
  EXPECT_EQ(stats.back().trigger_time_ms, kStart + 100);  // triggered on the ManualClock's time

  // A failure: the restart waits 30 s of the job's clock.
  fail->store(true);
  clock.advance(1'000);  // the source emits a record, the map throws
  ASSERT_TRUE(within_10s([&] { return client.restarts() == 1; }));
  EXPECT_EQ(client.status(), JobStatus::kRestarting);
  EXPECT_FALSE(
      testing::wait_until([&] { return client.status() == JobStatus::kRunning; }, std::chrono::milliseconds(500)));
  clock.advance(30'000);
  ASSERT_TRUE(within_10s([&] { return client.status() == JobStatus::kRunning; })) << job_status_name(client.status());
  EXPECT_EQ(client.restarts(), 1);
  // Checkpoints go on after the restart, on the same clock.
  const int64_t before = completed();
  clock.advance(50);
  ASSERT_TRUE(within_10s([&] { return completed() > before; })) << completed();
  client.cancel();
  JobResult r = client.wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled);
  EXPECT_EQ(r.restarts, 1);
  std::filesystem::remove_all(dir);
}

TEST(RestartTest, WhenTheStrategyGivesUpTheJobFailsWithTheLastFailure) {
  Configuration c;
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 2);
  c.set(options::kFixedDelayDelay, int64_t{0});
  StreamEnvironment env(c);
  env.set_parallelism(1);
  env.from_source(datagen::sequence(0, 10), "numbers")
      .map([](int64_t) -> int64_t { throw std::runtime_error("always"); })
      .name("Always")
      .sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>()));
  JobClient client = env.execute_async("gives up");
  JobResult r = client.wait();
  EXPECT_EQ(r.status, JobStatus::kFailed);
  EXPECT_EQ(r.restarts, 2);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_NE(r.error->to_string().find("no more restarts allowed"), std::string::npos) << r.error->to_string();
  std::vector<JobExceptionInfo> ex = client.exceptions();
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_FALSE(ex[0].restarted);  // the third failure ended the job
  EXPECT_TRUE(ex[1].restarted);
  EXPECT_TRUE(ex[2].restarted);
}

TEST(CancelTest, CancelStopsAnUnboundedJobAndLeavesNoThread) {
  const int before = thread_count();
  {
    StreamEnvironment env;
    env.set_parallelism(4);
    auto source = std::make_shared<DataGeneratorSource<int64_t>>([](int64_t i) { return i; },
                                                                 DataGeneratorSource<int64_t>::kUnbounded);
    std::atomic<int64_t> seen{0};
    env.from_source(source, "endless")
        .key_by([](int64_t v) { return v % 10; })
        .filter([&seen](int64_t) {
          seen.fetch_add(1, std::memory_order_relaxed);
          return false;
        })
        .sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>()));
    JobClient client = env.execute_async("endless");
    ASSERT_TRUE(testing::wait_until([&] { return seen.load() > 10'000; }));
    EXPECT_EQ(client.status(), JobStatus::kRunning);
    // Counted before cancel(): the task threads may all be gone a few microseconds after it (a race seen in CI).
    EXPECT_GT(thread_count(), before);  // the task threads are running (and counted)
    client.cancel();
    JobResult r = client.wait();
    EXPECT_EQ(r.status, JobStatus::kCanceled);
  }
  EXPECT_EQ(thread_count(), before);
}

TEST(CancelTest, CancellingABackpressuredJobReportsCanceledNotFailed) {
  StreamEnvironment env;
  env.set_parallelism(1);  // one channel: its credits fill deterministically
  auto source = std::make_shared<DataGeneratorSource<Event>>(
      [](int64_t i) {
        return Event{i % 100, i};
      },
      DataGeneratorSource<Event>::kUnbounded);
  auto gate = std::make_shared<testing::Gate>();
  OpenOnExit open_on_exit{gate};
  auto out = std::make_shared<CollectedRecords<Event>>();
  env.from_source(source, "endless")
      .key_by(&Event::key)
      .sink_to(std::make_shared<testing::GatedSink<Event>>(gate, out));
  LocalJobProbe probe;
  JobClient client = env.execute_async("backpressured", &probe);
  // Every credit is taken: the sources are blocked waiting for buffers.
  ASSERT_TRUE(testing::wait_until(
      [&] { return probe.buffer_pool->in_flight() == static_cast<int64_t>(probe.buffer_pool->max_buffers()); }));
  client.cancel();
  gate->open_fully();  // the sink's user code returns; its task then sees the cancellation
  JobResult r = client.wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled) << (r.error ? r.error->to_string() : "");
  EXPECT_FALSE(r.error.has_value());
}

TEST(GraphTest, AnOperatorWithoutDownstreamRunsAndDiscards) {
  StreamEnvironment env;
  env.from_source(datagen::sequence(1, 1000), "n").map([](int64_t v) { return v + 1; }).name("Dangling");
  JobResult r = env.execute("no sink");
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(r.find("Dangling")->records_in, 1000u);
}

TEST(GraphErrorTest, InvalidGraphReturnsAFailedResultWithTheReason) {
  StreamEnvironment env;
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, 10), "n")
      .set_parallelism(2)
      .forward()
      .map([](int64_t v) { return v; })
      .set_parallelism(3);
  JobResult r = env.execute("bad");
  ASSERT_EQ(r.status, JobStatus::kFailed);
  EXPECT_EQ(r.error->code(), ErrorCode::kGraph);
  EXPECT_NE(r.error->message().find("forward()"), std::string::npos) << r.error->message();
}

TEST(ConfigErrorTest, MalformedOptionsAndOversizedNetworkMemoryFailTheJobWithTheKey) {
  {
    StreamEnvironment env;
    env.config().set_string("pipeline.auto-watermark-interval", "abc");
    env.from_source(datagen::sequence(0, 10), "n").map([](int64_t v) { return v; });
    JobResult r = env.execute("bad option");
    ASSERT_EQ(r.status, JobStatus::kFailed);
    EXPECT_NE(r.error->message().find("pipeline.auto-watermark-interval"), std::string::npos) << r.error->message();
  }
  {
    StreamEnvironment env;
    env.set_parallelism(64);
    env.from_source(datagen::sequence(0, 10), "n").rebalance().map([](int64_t v) { return v; });
    JobResult r = env.execute("too much network memory");  // 64 x 64 channels x 4 x 32 KiB = 512 MiB
    ASSERT_EQ(r.status, JobStatus::kFailed);
    EXPECT_EQ(r.error->code(), ErrorCode::kConfiguration);
    EXPECT_NE(r.error->message().find("taskmanager.memory.network.max"), std::string::npos) << r.error->message();
  }
}

TEST(SlotsTest, TooFewSlotsIsAConfigurationError) {
  StreamEnvironment env;
  env.set_parallelism(4);
  env.config().set(options::kTaskSlots, 2);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, 10), "n").sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute("slots");
  ASSERT_EQ(r.status, JobStatus::kFailed);
  EXPECT_EQ(r.error->code(), ErrorCode::kConfiguration);
}

TEST(RecordCountsTest, JobResultReportsPerOperatorCounts) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(1, 1000), "n")
      .filter([](int64_t v) { return v % 2 == 0; })
      .name("Evens")
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute("counts");
  ASSERT_TRUE(r.ok());
  const OperatorStats* f = r.find("Evens");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->records_in, 1000u);
  EXPECT_EQ(f->records_out, 500u);
  EXPECT_EQ(f->parallelism, 2);
  EXPECT_EQ(out->size(), 500u);
}

}  // namespace
}  // namespace sluice
