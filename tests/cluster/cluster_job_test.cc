// A pipeline running across processes: `sluice jobmanager` + `sluice taskmanager` children of the built binary
// (tests/cluster/cluster_harness.h), the job's subtasks deployed into the TaskManagers' slots and its keyed
// exchange crossing the TCP data plane between them.
//  * datagen -> transform -> key_by -> files at parallelism 4 on 2 TaskManagers of 2 slots (and at parallelism 7
//    on 3, with cluster.evenly-spread-out-slots): the same lines as `sluice run` of the same pipeline, every
//    record once, and each key's records in the order their source subtask emitted them;
//  * too few slots: the job fails after slot.request.timeout with "needs 4 slots, 2 registered";
//  * a failure marked non-recoverable on a TaskManager (its RocksDB module missing) fails the job on the JobManager
//    at once, although the restart strategy allows 1,000 restarts;
//  * a SIGKILLed TaskManager fails the job (restart strategy none; cluster_failover_test restarts) instead of hanging,
//  and the
//    surviving TaskManager's tasks are cancelled;
//  * a SIGSTOPped TaskManager is declared lost after heartbeat.timeout, the job fails naming it, and when it wakes
//    (SIGCONT) it cancels its stale tasks at once: no output file changes after the wake;
//  * the JobManager's REST API counts the records of the TaskManagers' tasks, while the job runs and at its end.
// Heartbeats: interval 250 ms, timeout 3 s. About 30-60 s in all on a loaded two-core machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "cluster/cluster_harness.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;   // process start on a loaded two-core machine
constexpr auto kFinish = 90s;  // a bounded job's whole run
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};
constexpr int64_t kEntities = 97;

class ClusterJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice-cluster-job-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(Clock::now().time_since_epoch().count()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure() && harness_) std::cerr << harness_->logs();
    harness_.reset();
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }

  /// datagen (`count` charges on kEntities entities; 0 = unbounded at `rate`/s) -> transform keyed by the
  /// charge id -> files in <dir>/<out>, at `parallelism`, without checkpoints.
  std::string pipeline(const std::string& out, int parallelism, int64_t count, int64_t rate = 0,
                       const std::string& sink_extra = "") {
    const fs::path path = dir_ / (out + ".yaml");
    std::ofstream f(path);
    f << "pipeline:\n  name: cluster-job-test\n  parallelism: " << parallelism << "\n"
      << "  checkpoint: { interval: 0 }\n"
      // A failure fails the job here (what these tests check); cluster_failover_test restarts.
      << "  restart: { strategy: none }\n"
      << "source: { type: datagen, count: " << count << ", rate: " << rate << ", entities: " << kEntities
      << ", seed: 7 }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: files\n    path: \"" << (dir_ / out).string() << "\"\n"
      << sink_extra;
    return path.string();
  }

  ClusterHarness& cluster(const std::string& file, std::vector<std::string> extra = {}) {
    std::vector<std::string> options = kOptions;
    options.insert(options.end(), extra.begin(), extra.end());
    harness_ = std::make_unique<ClusterHarness>(file, options);
    return *harness_;
  }

  /// Every line of the part files under dir_/out, per part file in name order.
  std::map<std::string, std::vector<std::string>> read_parts(const std::string& out) {
    std::map<std::string, std::vector<std::string>> parts;
    if (!fs::exists(dir_ / out)) return parts;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / out)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().filename().string();
      if (name.starts_with('.')) continue;
      std::ifstream in(e.path());
      std::string line;
      auto& lines = parts[fs::relative(e.path(), dir_ / out).string()];
      while (std::getline(in, line)) {
        if (!line.empty()) lines.push_back(line);
      }
    }
    return parts;
  }

  /// Every line of every part file, sorted, without "occurred_at" (the processing time of the run).
  static std::vector<std::string> all_lines(const std::map<std::string, std::vector<std::string>>& parts) {
    static const std::regex occurred_at(R"re("occurred_at":"[^"]*",)re");
    std::vector<std::string> out;
    for (const auto& [name, lines] : parts) {
      for (const auto& line : lines)
        out.push_back(std::regex_replace(line, occurred_at, ""));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Checks that every record (entity, revision) of `count` is there once and that each entity's records are
  /// in one part file (its sink subtask's) in the order the source emitted them: revisions 0, 1, 2, ... (the
  /// pipeline's datagen source runs at parallelism 1, so each entity's revisions leave it in order).
  void check_records(const std::map<std::string, std::vector<std::string>>& parts, int64_t count) {
    const std::regex rec(R"re("payload":\{"id":"ch_(\d+)","revision":(\d+)\})re");
    std::map<int64_t, std::pair<std::string, int64_t>> last;  // entity -> (part file, last revision)
    int64_t records = 0;
    int64_t out_of_order = 0;
    int64_t split = 0;
    for (const auto& [name, lines] : parts) {
      for (const auto& line : lines) {
        std::smatch m;
        ASSERT_TRUE(std::regex_search(line, m, rec)) << "unexpected line in " << name << ": " << line;
        const int64_t entity = std::stoll(m[1]);
        const int64_t revision = std::stoll(m[2]);
        ++records;
        auto [it, fresh] = last.emplace(entity, std::make_pair(name, revision));
        if (fresh) {
          if (revision != 0) ++out_of_order;
          continue;
        }
        if (it->second.first != name) ++split;
        if (revision != it->second.second + 1) ++out_of_order;
        it->second = {name, revision};
      }
    }
    std::cout << records << " records of " << count << ", " << last.size() << " entities, " << out_of_order
              << " out of order or missing, " << split << " in another subtask's file\n";
    EXPECT_EQ(records, count);
    EXPECT_EQ(static_cast<int64_t>(last.size()), kEntities);
    EXPECT_EQ(out_of_order, 0);
    EXPECT_EQ(split, 0);
  }

  fs::path dir_;
  std::unique_ptr<ClusterHarness> harness_;
};

/// Runs `sluice run FILE` to its end.
void run_local(const std::string& file) {
  ChildProcess run("run", {"run", file});
  const std::optional<int> code = run.wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "sluice run did not finish:\n" << run.output();
  ASSERT_EQ(*code, 0) << run.output();
}

TEST_F(ClusterJobTest, AKeyedPipelineOnTwoTaskManagersWritesWhatALocalRunWrites) {
  constexpr int64_t kCount = 40'000;
  constexpr int kParallelism = 4;
  run_local(pipeline("local", kParallelism, kCount));
  const auto local = read_parts("local");
  ASSERT_FALSE(local.empty());

  ClusterHarness& c = cluster(pipeline("cluster", kParallelism, kCount));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* a = c.start_taskmanager(2);
  ChildProcess* b = c.start_taskmanager(2);
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  // The source (parallelism 1) and sink subtasks 0 and 1 share the first TaskManager's 2 slots, sink subtasks 2
  // and 3 the second's: the keyed exchange to 2 and 3 crosses the TCP data plane.
  EXPECT_NE(jm->output().find("RUNNING: 5 task(s) on 2 TaskManager(s)"), std::string::npos) << jm->output();
  EXPECT_NE(jm->output().find("deployed 3 task(s) to TaskManager"), std::string::npos) << jm->output();
  EXPECT_NE(jm->output().find("deployed 2 task(s) to TaskManager"), std::string::npos) << jm->output();
  for (ChildProcess* tm : {a, b})
    EXPECT_NE(tm->output().find("attempt 0 deployed"), std::string::npos) << tm->output();
  const auto clustered = read_parts("cluster");
  EXPECT_EQ(all_lines(clustered), all_lines(local)) << "the cluster's output differs from the local run's";
  for (const std::string remote : {"part-2.jsonl", "part-3.jsonl"}) {
    ASSERT_TRUE(clustered.count(remote)) << remote;
    EXPECT_GT(clustered.at(remote).size(), 1000u) << "too few records crossed the TCP exchange to " << remote;
  }
  check_records(clustered, kCount);
  check_records(local, kCount);
}

TEST_F(ClusterJobTest, ParallelismSevenOnThreeTaskManagersSpreadEvenly) {
  // Parallelism 7 on 3 TaskManagers of 3 slots: two of them (6 slots) are not enough, so the JobManager waits
  // for the third (with 6, it deployed on the first two when the third registered late: a flaky test), and
  // spreading evenly (3, 2, 2 slots) differs from filling (3, 3, 1).
  constexpr int64_t kCount = 30'000;
  constexpr int kParallelism = 7;
  run_local(pipeline("local", kParallelism, kCount));
  const auto local = read_parts("local");

  ClusterHarness& c = cluster(pipeline("cluster", kParallelism, kCount), {"cluster.evenly-spread-out-slots=true"});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::vector<ChildProcess*> tms;
  for (int i = 0; i < 3; ++i)
    tms.push_back(c.start_taskmanager(3));
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  // Evenly spread: 3, 2 and 2 slots; the first TaskManager holds the source and sink subtasks 0, 3 and 6.
  int three = 0;
  int two = 0;
  for (ChildProcess* tm : tms) {
    three += tm->count("4 task(s) in 3 slot(s)");
    two += tm->count("2 task(s) in 2 slot(s)");
  }
  EXPECT_EQ(three, 1) << c.logs();
  EXPECT_EQ(two, 2) << c.logs();
  EXPECT_NE(jm->output().find("RUNNING: 8 task(s) on 3 TaskManager(s)"), std::string::npos) << jm->output();
  const auto clustered = read_parts("cluster");
  EXPECT_EQ(clustered.size(), 7u);
  EXPECT_EQ(all_lines(clustered), all_lines(local));
  check_records(clustered, kCount);
}

TEST_F(ClusterJobTest, TooFewSlotsFailTheJobAfterTheSlotRequestTimeoutNamingWhatItNeeds) {
  ClusterHarness& c = cluster(pipeline("out", 4, 1000), {"slot.request.timeout=3s"});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  // /health says what the job waits for, not only that it is not running (before any TaskManager: the JobManager
  // serves from its start, well within the 3 s).
  std::string health;
  EXPECT_TRUE(poll_until(
      [&] {
        health = c.http_get("/health").second;
        return health.find("the job is CREATED; waiting for TaskManagers: needs 4 slots, 0 registered") !=
               std::string::npos;
      },
      2s))
      << health;
  c.start_taskmanager(2);
  EXPECT_TRUE(jm->await_line(std::regex("needs 4 slots, 2 registered \\(on 1 TaskManager\\(s\\)\\)"), kStart))
      << jm->output();
  const std::optional<int> code = jm->wait_exit(kStart);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(jm->output().find("did not get the slots it needs within slot.request.timeout = 3000 ms: needs 4 slots, "
                              "2 registered (on 1 TaskManager(s))"),
            std::string::npos)
      << jm->output();
}

TEST_F(ClusterJobTest, ANonRecoverableFailureOnATaskManagerFailsTheJobAtOnceInsteadOfRestarting) {
  // The TaskManager cannot load the RocksDB module (SLUICE_ROCKSDB_MODULE names a missing file), a failure that
  // no restart cures: its tasks fail with the mark, and the JobManager, another process, must fail the job at
  // once instead of restarting it into the same failure until the strategy's 1,000 attempts run out.
  const fs::path file = dir_ / "rocks.yaml";
  {
    std::ofstream f(file);
    f << "pipeline:\n  name: cluster-rocks\n  parallelism: 2\n"
      << "  entity-version: true\n"  // keyed state, in RocksDB
      << "  checkpoint: { interval: 200ms, storage: \"" << (dir_ / "checkpoints").string() << "\" }\n"
      << "  restart: { strategy: fixed-delay, attempts: 1000, delay: 100ms }\n"
      << "  config:\n    state.backend.type: rocksdb\n"
      << "source: { type: datagen, count: 0, rate: 1000, entities: " << kEntities << ", seed: 7 }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id\"\n"
      << "sink:\n  out:\n    type: files\n    path: \"" << (dir_ / "out").string() << "\"\n";
  }
  ClusterHarness& c = cluster(file.string());
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  const std::string missing = (dir_ / "nowhere" / "libsluice_rocksdb.so").string();
  const char* before = std::getenv("SLUICE_ROCKSDB_MODULE");
  const std::optional<std::string> saved = before != nullptr ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("SLUICE_ROCKSDB_MODULE", missing.c_str(), 1);  // the TaskManager inherits it; the JobManager did not
  ChildProcess* tm = c.start_taskmanager(2);
  if (saved) {
    ::setenv("SLUICE_ROCKSDB_MODULE", saved->c_str(), 1);
  } else {
    ::unsetenv("SLUICE_ROCKSDB_MODULE");
  }
  const std::optional<int> code = jm->wait_exit(kStart);
  ASSERT_TRUE(code.has_value()) << "the job did not fail:\n" << c.logs();
  EXPECT_EQ(*code, 1) << jm->output();
  const std::string out = jm->output();
  EXPECT_NE(out.find("needs Sluice's RocksDB module libsluice_rocksdb.so, which could not be loaded; tried: " +
                     missing + " (no such file)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("not recoverable by a restart"), std::string::npos) << out;
  EXPECT_EQ(jm->count("RESTARTING"), 0) << out;
  EXPECT_EQ(jm->count("(attempt 1)"), 0) << out;
  EXPECT_FALSE(tm->exited());
}

TEST_F(ClusterJobTest, AKilledTaskManagerFailsTheJobAndTheOtherTaskManagersTasksAreCancelled) {
  // Unbounded at 2,000 records/s: the job runs until the kill.
  ClusterHarness& c = cluster(pipeline("out", 4, 0, 2000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* victim = c.start_taskmanager(2);
  ChildProcess* survivor = c.start_taskmanager(2);
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << jm->output();
  // Records flow through both TaskManagers before the kill.
  ASSERT_TRUE(poll_until([&] { return !read_parts("out").empty(); }, kStart));
  victim->signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_TRUE(victim->wait_exit(10s).has_value());
  const std::optional<int> code = jm->wait_exit(30s);
  ASSERT_TRUE(code.has_value()) << "the JobManager hangs after a TaskManager was killed";
  EXPECT_EQ(*code, 1);
  std::cout << "the job failed " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count()
            << " ms after the kill\n";
  EXPECT_NE(jm->output().find("FAILED"), std::string::npos) << jm->output();
  // The survivor's tasks end (they fail on the lost connection or are cancelled), and it keeps running.
  EXPECT_TRUE(poll_until([&] { return survivor->count("lost") > 0 || survivor->count("cancelling") > 0; }, 30s))
      << survivor->output();
  EXPECT_FALSE(survivor->exited());
}

/// The numbers of a TaskManager's "attempt N ended: network buffers: ..." line (DeployedTasks::data_plane_summary).
struct DataPlaneEnd {
  int64_t pool = 0, segment = 0, allocated = 0, peak_in_flight = 0;
  int64_t senders = 0, sender_buffers = 0, credit_received = 0, sent = 0;
  int64_t inputs = 0, exclusive = 0, credit_announced = 0, received = 0, peak_held = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> backpressured;  // task -> (backpressured ms, run ms)
};

std::optional<DataPlaneEnd> data_plane_end(ChildProcess& tm) {
  const auto m = tm.await_line(
      std::regex(
          R"(attempt 0 ended: network buffers: pool of (\d+) x (\d+) bytes, (\d+) allocated, peak in flight )"
          R"((\d+); remote output channels (\d+): (\d+) own buffers, credit received (\d+), buffers sent (\d+); )"
          R"(remote input channels (\d+): (\d+) exclusive buffers, credit announced (\d+), buffers received )"
          R"((\d+), peak held by one channel (\d+)(.*))"),
      kFinish);
  if (!m) return std::nullopt;
  const auto& g = *m;
  DataPlaneEnd d{std::stoll(g[1]),  std::stoll(g[2]),
                 std::stoll(g[3]),  std::stoll(g[4]),
                 std::stoll(g[5]),  std::stoll(g[6]),
                 std::stoll(g[7]),  std::stoll(g[8]),
                 std::stoll(g[9]),  std::stoll(g[10]),
                 std::stoll(g[11]), std::stoll(g[12]),
                 std::stoll(g[13]), {}};
  const std::regex task(R"(; task '([^']*)' \((\d+)/\d+\) backpressured (\d+) ms of (\d+) ms)");
  const std::string rest = g[14];
  for (auto it = std::sregex_iterator(rest.begin(), rest.end(), task); it != std::sregex_iterator(); ++it)
    d.backpressured[(*it)[1].str() + "/" + (*it)[2].str()] = {std::stoll((*it)[3]), std::stoll((*it)[4])};
  return d;
}

TEST_F(ClusterJobTest, ASlowSinkAcrossTheNetworkSlowsTheSourceWithinTheNetworkMemory) {
  // Parallelism 2 on two TaskManagers of one slot: the first holds the source and sink subtask 0, the second
  // sink subtask 1, so half the keyed records cross TCP to a sink that takes 1 ms per record. 8,000 records
  // (about 1 MB) are far more than the buffers in flight can hold (4 per channel of 32 KiB), so the source
  // must wait for credit most of its run, and no side may hold more buffers than its pool.
  constexpr int64_t kCount = 8'000;
  const int64_t network_max = 8LL << 20;
  ClusterHarness& c =
      cluster(pipeline("out", 2, kCount, 0, "    throttle: 1ms\n"), {"taskmanager.memory.network.max=8mb"});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* a = c.start_taskmanager(1);
  ChildProcess* b = c.start_taskmanager(1);
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  check_records(read_parts("out"), kCount);  // nothing lost, nothing twice, per key in order

  const auto ea = data_plane_end(*a);
  const auto eb = data_plane_end(*b);
  ASSERT_TRUE(ea.has_value() && eb.has_value()) << c.logs();
  // The source's task (its chain "Source: datagen -> Transform", subtask 1).
  auto source_of = [](const DataPlaneEnd& d) {
    for (const auto& [task, bp] : d.backpressured) {
      if (task.starts_with("Source: datagen")) return std::optional<std::pair<int64_t, int64_t>>(bp);
    }
    return std::optional<std::pair<int64_t, int64_t>>();
  };
  const DataPlaneEnd& src = source_of(*ea) ? *ea : *eb;
  const DataPlaneEnd& dst = &src == &*ea ? *eb : *ea;
  ASSERT_TRUE(source_of(src).has_value()) << c.logs();
  for (const DataPlaneEnd* d : {&src, &dst}) {
    // Memory: never more buffers in flight than the pool, whose bytes are within the configured bound.
    EXPECT_GT(d->peak_in_flight, 0);
    EXPECT_LE(d->peak_in_flight, d->pool);
    EXPECT_LE(d->allocated, d->pool);
    EXPECT_LE(d->pool * d->segment, network_max);
  }
  // Credit: the sender wrote only against credit; the receiver never held more than a channel's exclusive
  // buffers (no floating buffers in cluster mode), and everything sent arrived.
  EXPECT_EQ(src.senders, 1);
  EXPECT_EQ(dst.inputs, 1);
  EXPECT_LE(src.sent, src.credit_received);
  EXPECT_LE(dst.received, dst.credit_announced);
  EXPECT_EQ(dst.received, src.sent);
  EXPECT_LE(dst.peak_held, dst.exclusive);
  // Far more buffers crossed than fit in flight at once: the exchange ran on returned credit.
  EXPECT_GT(src.sent, 4 * src.sender_buffers) << "too few buffers crossed to show flow control";
  // The source slowed down: it spent most of its run waiting for credit.
  const auto [bp_ms, run_ms] = *source_of(src);
  std::cout << "source backpressured " << bp_ms << " ms of " << run_ms << " ms; " << src.sent
            << " buffers sent on credit " << src.credit_received << "; peak in flight " << src.peak_in_flight << "/"
            << src.pool << " (sender side), " << dst.peak_in_flight << "/" << dst.pool << " (receiver side)\n";
  EXPECT_GE(run_ms, kCount / 2 / 2) << "the source ran at the sinks' pace (1 ms per record per sink subtask)";
  EXPECT_GE(bp_ms * 2, run_ms) << "the source was not held back by the slow sinks";
}

/// Size and content of every file under dir (hidden in-progress files too), by relative path.
std::map<std::string, std::string> snapshot_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[fs::relative(e.path(), dir).string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// The JobManager's REST API counts the records of the TaskManagers' tasks (Flink's vertex and subtask metrics):
// while the job runs from each heartbeat's counters (a RUNNING sink subtask with records read), and once it ended
// from each task's final counters: the source vertex wrote every record into the keyed exchange, the sink vertex
// read every one, its subtasks' counts add up to that, and /metrics has the task series. The JobManager lingers
// after the job (--linger) to be asked.
TEST_F(ClusterJobTest, TheJobManagerCountsTheRecordsOfTheTaskManagersTasks) {
  constexpr int64_t kCount = 6'000;
  ClusterHarness& c = cluster(pipeline("out", 4, kCount, 2000));
  ChildProcess* jm = c.start_jobmanager(0, kStart, {"--linger", "120s"});
  ASSERT_NE(jm, nullptr);
  c.start_taskmanager(2);
  c.start_taskmanager(2);
  auto sink_subtasks = [&]() -> std::vector<Value> {
    const auto sink = c.get("/jobs/" + c.job_id() + "/vertices/1");
    const Value* list = sink ? sink->find("subtasks") : nullptr;
    return list != nullptr && list->is_array() ? list->as_array() : std::vector<Value>{};
  };
  auto records = [](const Value& v, const char* key) {
    const Value* m = v.find("metrics");
    const Value* n = m != nullptr ? m->find(key) : nullptr;
    return n != nullptr && n->is_int64() ? n->as_int64() : int64_t{-1};
  };
  // While it runs: a sink subtask the JobManager calls RUNNING with records read (a heartbeat's counters).
  ASSERT_TRUE(poll_until(
      [&] {
        for (const Value& st : sink_subtasks()) {
          if (str(st, "status") == "RUNNING" && records(st, "read-records") > 0) return true;
        }
        return false;
      },
      kStart, 50ms))
      << c.logs();
  ASSERT_TRUE(jm->await_line(std::regex("job 'cluster-job-test' FINISHED"), kFinish)) << jm->output();
  ASSERT_TRUE(jm->await_line(std::regex("serves the ended job for"), 10s)) << jm->output();
  const auto details = c.get("/jobs/" + c.job_id());
  ASSERT_TRUE(details.has_value());
  EXPECT_EQ(str(*details, "state"), "FINISHED");
  const Value* vertices = details->find("vertices");
  ASSERT_TRUE(vertices != nullptr && vertices->as_array().size() == 2) << details->to_json();
  const Value& source = vertices->as_array()[0];
  const Value& sink = vertices->as_array()[1];
  std::cout << "source vertex: " << source.find("metrics")->to_json()
            << "\nsink vertex: " << sink.find("metrics")->to_json() << "\n";
  EXPECT_EQ(records(source, "write-records"), kCount) << source.to_json();
  EXPECT_EQ(records(sink, "read-records"), kCount) << sink.to_json();
  EXPECT_GT(records(sink, "read-bytes"), 0) << "the keyed exchange's bytes: " << sink.to_json();
  int64_t sum = 0;
  const std::vector<Value> subtasks = sink_subtasks();
  ASSERT_EQ(subtasks.size(), 4u);
  for (const Value& st : subtasks) {
    EXPECT_EQ(str(st, "status"), "FINISHED") << st.to_json();
    EXPECT_GT(records(st, "read-records"), 0) << st.to_json();
    sum += records(st, "read-records");
  }
  EXPECT_EQ(sum, kCount);
  // /metrics: the Flink-named task series of the TaskManagers' tasks, on the JobManager.
  const auto [status, text] = c.http_get("/metrics");
  ASSERT_EQ(status, 200);
  EXPECT_NE(text.find("flink_taskmanager_job_task_numRecordsIn"), std::string::npos) << text.substr(0, 2000);
}

TEST_F(ClusterJobTest, AStoppedTaskManagerIsDeclaredLostAndItsStaleTasksWriteNothingAfterItWakes) {
  // Unbounded at 2,000 records/s: the job runs until the TaskManager holding the source stops.
  ClusterHarness& c = cluster(pipeline("out", 4, 0, 2000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* a = c.start_taskmanager(2);
  ChildProcess* b = c.start_taskmanager(2);
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << jm->output();
  // The victim is the TaskManager with the source (3 tasks): after it wakes, its source and its local sink
  // subtasks could go on writing without any network peer; they must not.
  ASSERT_TRUE(
      poll_until([&] { return a->count("3 task(s) in 2 slot(s)") + b->count("3 task(s) in 2 slot(s)") > 0; }, kStart));
  ChildProcess* victim = a->count("3 task(s) in 2 slot(s)") > 0 ? a : b;
  ChildProcess* survivor = victim == a ? b : a;
  const auto id_line = victim->await_line(std::regex("TaskManager (\\S+) with 2 slots"), 1s);
  ASSERT_TRUE(id_line.has_value()) << victim->output();
  const std::string victim_id = std::regex_replace((*id_line)[1], std::regex(R"([.])"), R"(\.)");
  ASSERT_TRUE(poll_until([&] { return read_parts("out").size() == 4; }, kStart)) << "every sink subtask writes";

  // The REST API: GET /taskmanagers (Flink's shape) and each subtask's TaskManager in
  // GET /jobs/:id/vertices/:vid (vertex 0: the source at parallelism 1, vertex 1: the sink at 4).
  const std::string victim_raw = (*id_line)[1];
  // freeSlots comes with each TaskManager's next heartbeat after its deployment.
  ASSERT_TRUE(c.await_task_managers(
      [](const std::vector<Value>& t) {
        return t.size() == 2 && num(t[0], "freeSlots") == 0 && num(t[1], "freeSlots") == 0;
      },
      30s))
      << "both slots of each TaskManager run tasks";
  const std::vector<Value> tms = c.task_managers();
  ASSERT_EQ(tms.size(), 2u);
  std::map<std::string, std::string> path_of;
  for (const Value& t : tms) {
    EXPECT_EQ(num(t, "slotsNumber"), 2);
    EXPECT_GT(num(t, "timeSinceLastHeartbeat"), 0);
    EXPECT_LT(num(t, "ms-since-last-heartbeat"), 3000);
    EXPECT_FALSE(str(t, "path").empty());
    EXPECT_FALSE(str(t, "data-address").empty());
    path_of[str(t, "id")] = str(t, "path");
  }
  ASSERT_TRUE(path_of.count(victim_raw)) << victim_raw;
  const auto source = c.get("/jobs/" + c.job_id() + "/vertices/0");
  const auto sink = c.get("/jobs/" + c.job_id() + "/vertices/1");
  ASSERT_TRUE(source.has_value() && sink.has_value());
  const Value* source_subtasks = source->find("subtasks");
  const Value* sink_subtasks = sink->find("subtasks");
  ASSERT_TRUE(source_subtasks != nullptr && sink_subtasks != nullptr);
  ASSERT_EQ(source_subtasks->as_array().size(), 1u);
  // The running tasks are RUNNING (before: DEPLOYING, the JobManager has no metrics of the TaskManagers' tasks).
  const auto details = c.get("/jobs/" + c.job_id());
  ASSERT_TRUE(details.has_value() && details->find("vertices") != nullptr);
  for (const Value& v : details->find("vertices")->as_array())
    EXPECT_EQ(str(v, "status"), "RUNNING") << v.to_json();
  EXPECT_EQ(str(source_subtasks->as_array()[0], "status"), "RUNNING");
  for (const Value& st : sink_subtasks->as_array())
    EXPECT_EQ(str(st, "status"), "RUNNING");
  EXPECT_EQ(str(source_subtasks->as_array()[0], "taskmanager-id"), victim_raw);
  EXPECT_EQ(str(source_subtasks->as_array()[0], "host"), path_of[victim_raw]);
  ASSERT_EQ(sink_subtasks->as_array().size(), 4u);
  std::map<std::string, std::set<int64_t>> slots;  // TaskManager -> slots of the sink's subtasks
  for (const Value& st : sink_subtasks->as_array()) {
    EXPECT_EQ(str(st, "host"), path_of[str(st, "taskmanager-id")]);
    slots[str(st, "taskmanager-id")].insert(num(st, "slot"));
  }
  EXPECT_EQ(slots.size(), 2u) << "the sink's subtasks run on both TaskManagers";
  for (const auto& [tm, s] : slots)
    EXPECT_EQ(s, (std::set<int64_t>{0, 1})) << tm;
  EXPECT_EQ(str(sink_subtasks->as_array()[0], "taskmanager-id"), victim_raw) << "slot sharing: sink 0 with the source";
  EXPECT_FALSE(c.get("/jobs/" + c.job_id() + "/vertices/7").has_value()) << "no such vertex: 404";

  victim->signal(SIGSTOP);
  const auto stopped = Clock::now();
  // The JobManager declares it lost after heartbeat.timeout and its tasks are cancelled with that reason.
  const auto lost = jm->await_line(
      std::regex("TaskManager " + victim_id + " .*lost: no heartbeat for (\\d+) ms \\(heartbeat\\.timeout 3000 ms\\)"),
      std::chrono::milliseconds(3000 + 10'000));
  ASSERT_TRUE(lost.has_value()) << "a SIGSTOPped TaskManager was not declared lost\n" << jm->output();
  const auto lost_after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped).count();
  std::cout << "declared lost " << lost_after << " ms after SIGSTOP (" << (*lost)[1] << " ms without heartbeat)\n";
  EXPECT_GE(std::stoll((*lost)[1]), 3000);
  EXPECT_GE(lost_after, 3000 - 250 - 100);
  // The survivor holds 2 sink subtasks: the JobManager asks it to cancel those 2, and it says how many still ran.
  EXPECT_TRUE(
      jm->await_line(std::regex("asking TaskManager \\S+ to cancel the 2 task\\(s\\) of attempt 0 deployed to it: "
                                ".*TaskManager " +
                                victim_id + ".*no heartbeat for \\d+ ms"),
                     30s))
      << jm->output();
  const auto survivor_cancel = survivor->await_line(
      std::regex("cancelling the (\\d+) running task\\(s\\) of attempt 0 \\(2 deployed here, (\\d+) already ended\\): "
                 ".*TaskManager " +
                 victim_id + ".*no heartbeat for \\d+ ms"),
      30s);
  ASSERT_TRUE(survivor_cancel.has_value()) << survivor->output();
  EXPECT_EQ(std::stoi((*survivor_cancel)[1]) + std::stoi((*survivor_cancel)[2]), 2) << (*survivor_cancel)[0];
  // The job failed (no failover across processes in this build): the JobManager exits once the survivor's
  // tasks were cancelled and joined, so nothing but the stopped TaskManager can still write.
  const std::optional<int> code = jm->wait_exit(60s);
  ASSERT_TRUE(code.has_value()) << "the JobManager hangs after a TaskManager stopped answering";
  EXPECT_EQ(*code, 1);
  EXPECT_NE(jm->output().find("FAILED"), std::string::npos) << jm->output();
  const auto before = snapshot_files(dir_ / "out");
  ASSERT_FALSE(before.empty());

  victim->signal(SIGCONT);
  // Woken, it finds its lease expired and its stale tasks stop before they write anything: each task reads the
  // lease itself (the process resumes every thread at once, the task threads may run first), and the connection
  // thread cancels those still running. Of its 3 tasks, those that already ended (stopped as stale, or failed on
  // the lost connections) are not counted as cancelled there.
  ASSERT_TRUE(victim->await_line(std::regex("the tasks of attempt 0 are cancelled and released"), 30s))
      << victim->output();
  const int stopped_as_stale =
      victim->count("(attempt 0) stops as stale: its TaskManager's lease on the JobManager lapsed");
  const auto victim_cancel = victim->await_line(
      std::regex("cancelling the (\\d+) running task\\(s\\) of attempt 0 \\(3 deployed here, (\\d+) already ended\\): "
                 "no heartbeat reply for \\d+ ms \\(heartbeat\\.timeout 3000 ms\\).*stale"),
      1s);  // logged before "released" when a task still ran, so it is there by now
  std::cout << "after SIGCONT: " << stopped_as_stale << " task(s) stopped as stale by themselves; the fence cancelled "
            << (victim_cancel ? (*victim_cancel)[1] : std::string("none")) << "\n";
  EXPECT_LE(stopped_as_stale, 3);
  if (victim_cancel.has_value()) {
    EXPECT_EQ(std::stoi((*victim_cancel)[1]) + std::stoi((*victim_cancel)[2]), 3) << (*victim_cancel)[0];
  } else {
    EXPECT_GE(stopped_as_stale, 1) << "no task was stopped as stale\n" << victim->output();
  }
  const auto after = snapshot_files(dir_ / "out");
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [name, content] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    EXPECT_EQ(after.at(name).size(), content.size()) << name << " changed after the stale TaskManager woke";
    EXPECT_TRUE(after.at(name) == content) << name << " changed after the stale TaskManager woke";
  }
  // Its stale registration is gone with the JobManager; it reports no task end of the old attempt and keeps
  // running, trying to register again.
  EXPECT_FALSE(victim->exited());
  EXPECT_EQ(victim->count("UpdateTaskExecutionState"), 0) << victim->output();
}

}  // namespace
}  // namespace sluice::testing::cluster
