// Checkpoints across processes: `sluice jobmanager` + `sluice taskmanager` children (tests/cluster/cluster_harness.h)
// running a pipeline with checkpointing. The JobManager's checkpoint coordinator triggers the source's TaskManager
// over gRPC, each TaskManager writes its tasks' state files into the shared checkpoint directory and acknowledges
// with their handles, the JobManager writes `_metadata`, and NotifyCheckpointComplete lets the exactly-once files
// sink commit its part files.
//  * datagen -> transform -> key_by -> files (exactly-once) at parallelism 4 on 2 TaskManagers of 2 slots:
//    checkpoints complete (their `_metadata` read back: every sink subtask's state, from both TaskManagers), the
//    committed output equals `sluice run`'s, every record once and each key in order;
//  * the same job restarted from the cluster's latest checkpoint by `sluice run` (execution.state-recovery.path):
//    local mode reads the cluster's `_metadata` and state files;
//  * a restore from a checkpoint with a corrupted state file: the JobManager checks existence and size only, the
//    TaskManager reading the file finds the checksum mismatch and the job fails naming the file; a truncated file
//    is refused by the JobManager before any deployment;
//  * state locality: the `_metadata` names the TaskManager that wrote each state file, and after a SIGKILLed
//    JobManager's successor sees the TaskManagers register in the other order, each subtask goes back to it;
//  * task-local recovery (execution.state-recovery.from-local): a task failure restarts the job on the same
//    TaskManagers, which restore their state from their local copies, none from the checkpoint storage.
//  * taskmanager.state.local.root-dirs as a list: the copies go to its first usable directory;
//  * incremental rocksdb checkpoints: after a TaskManager SIGKILL every entity's keyed count (entity_version)
//    continues from the checkpoint on the other TaskManagers;
// Heartbeats: interval 250 ms, timeout 3 s. About 20-40 s on a loaded two-core machine.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "cluster/cluster_harness.h"
#include "sluice/checkpoint/checkpoint_storage.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;
constexpr auto kFinish = 90s;
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};
constexpr int64_t kEntities = 97;

class ClusterCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice-cluster-ckpt-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(Clock::now().time_since_epoch().count()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure() && harness_) std::cerr << harness_->logs();
    harness_.reset();
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }

  /// datagen (`count` charges on kEntities entities at `rate`/s, 0 = unlimited) -> transform keyed by the charge
  /// id -> files (exactly-once) in <dir>/<out>, at `parallelism`, checkpoints every 200 ms into <dir>/<out>-chk.
  /// `pipeline_extra` is more YAML of the `pipeline:` mapping (indented lines).
  std::string pipeline(const std::string& out, int parallelism, int64_t count, int64_t rate,
                       const std::string& pipeline_extra = "") {
    const fs::path path = dir_ / (out + ".yaml");
    std::ofstream f(path);
    f << "pipeline:\n  name: cluster-ckpt-test\n  parallelism: " << parallelism << "\n"
      << "  delivery: exactly-once\n"
      << "  checkpoint: { interval: 200ms, storage: \"file://" << (dir_ / (out + "-chk")).string() << "\" }\n"
      << pipeline_extra << "source: { type: datagen, count: " << count << ", rate: " << rate
      << ", entities: " << kEntities << ", seed: 11 }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: files\n    path: \"" << (dir_ / out).string() << "\"\n"
      << "    rolling-policy: { inactivity-interval: 100ms, rollover-interval: 500ms }\n";
    return path.string();
  }

  /// Every line of the committed part files under dir_/out (in-progress and pending files start with '.').
  std::map<std::string, std::vector<std::string>> read_parts(const std::string& out) {
    std::map<std::string, std::vector<std::string>> parts;
    if (!fs::exists(dir_ / out)) return parts;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / out)) {
      if (!e.is_regular_file()) continue;
      if (e.path().filename().string().starts_with('.')) continue;
      std::ifstream in(e.path());
      std::string line;
      auto& lines = parts[fs::relative(e.path(), dir_ / out).string()];
      while (std::getline(in, line)) {
        if (!line.empty()) lines.push_back(line);
      }
    }
    return parts;
  }

  /// Every committed line, sorted, without "occurred_at" (the processing time of the run).
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

  /// Counts missing and duplicated records of 0..count-1 and revisions out of order per entity (part files are
  /// per sink subtask, rolled in order: names sort by subtask, then by their counter).
  void check_records(const std::map<std::string, std::vector<std::string>>& parts, int64_t count) {
    const std::regex rec(R"re("payload":\{"id":"ch_(\d+)","revision":(\d+)\})re");
    std::map<int64_t, std::set<int64_t>> seen;
    std::map<int64_t, int64_t> last;
    int64_t records = 0, duplicated = 0, out_of_order = 0;
    // Part files of one subtask in roll order: part-<subtask>-<n>.jsonl with n increasing.
    std::vector<std::pair<std::pair<std::string, int64_t>, const std::vector<std::string>*>> ordered;
    const std::regex part_name(R"re((part-\d+)-(\d+)\.jsonl)re");
    for (const auto& [name, lines] : parts) {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(name, m, part_name)) << name;
      ordered.push_back({{m[1], std::stoll(m[2])}, &lines});
    }
    std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [key, lines] : ordered) {
      for (const auto& line : *lines) {
        std::smatch m;
        ASSERT_TRUE(std::regex_search(line, m, rec)) << "unexpected line: " << line;
        const int64_t entity = std::stoll(m[1]);
        const int64_t revision = std::stoll(m[2]);
        ++records;
        if (!seen[entity].insert(revision).second) ++duplicated;
        auto it = last.find(entity);
        if (it != last.end() && revision <= it->second) ++out_of_order;
        last[entity] = revision;
      }
    }
    const int64_t distinct = [&] {
      int64_t n = 0;
      for (const auto& [e, revs] : seen)
        n += static_cast<int64_t>(revs.size());
      return n;
    }();
    std::cout << records << " records of " << count << ": " << (count - distinct) << " missing, " << duplicated
              << " duplicated, " << out_of_order << " out of order\n";
    EXPECT_EQ(distinct, count);
    EXPECT_EQ(duplicated, 0);
    EXPECT_EQ(out_of_order, 0);
  }

  /// See KillingTheSourcesTaskManagerCostsOneRestartWhenASpareTakesItsSlots.
  void kill_a_busy_taskmanager_with_a_spare(ClusterHarness& c, bool the_source_one, int64_t count) {
    ChildProcess* jm = c.start_jobmanager();
    ASSERT_NE(jm, nullptr);
    std::vector<ChildProcess*> tms;
    for (int i = 0; i < 3; ++i)
      tms.push_back(c.start_taskmanager(2));
    ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") >= 3; }, kStart)) << jm->output();
    ChildProcess* victim = nullptr;
    for (ChildProcess* tm : tms) {
      if (tm->count(the_source_one ? "3 task(s) in 2 slot(s)" : "2 task(s) in 2 slot(s)") > 0) victim = tm;
    }
    ASSERT_NE(victim, nullptr) << "no TaskManager runs " << (the_source_one ? 3 : 2) << " tasks";
    victim->signal(SIGKILL);
    const std::optional<int> code = jm->wait_exit(kFinish);
    ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
    ASSERT_EQ(*code, 0) << jm->output();
    EXPECT_EQ(jm->count("RESTARTING (restart "), 1) << jm->output();
    check_records(read_parts("spare"), count);
  }

  ClusterHarness& cluster(const std::string& file, std::vector<std::string> extra = {}) {
    std::vector<std::string> options = kOptions;
    options.insert(options.end(), extra.begin(), extra.end());
    harness_ = std::make_unique<ClusterHarness>(file, options);
    return *harness_;
  }

  fs::path dir_;
  std::unique_ptr<ClusterHarness> harness_;
};

void run_local(const std::string& file, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"run", file};
  for (auto& e : extra) {
    args.push_back("-D");
    args.push_back(e);
  }
  ChildProcess run("run", args);
  const std::optional<int> code = run.wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "sluice run did not finish:\n" << run.output();
  ASSERT_EQ(*code, 0) << run.output();
}

TEST_F(ClusterCheckpointTest, CheckpointsCompleteAcrossTaskManagersAndTheOutputEqualsLocalMode) {
  constexpr int64_t kCount = 30'000;
  constexpr int kParallelism = 4;
  run_local(pipeline("local", kParallelism, kCount, 10'000));
  const auto local = read_parts("local");
  ASSERT_FALSE(local.empty());

  // 10,000 records/s: the job runs about 3 s, so several checkpoints complete while records flow.
  ClusterHarness& c = cluster(pipeline("cluster", kParallelism, kCount, 10'000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* a = c.start_taskmanager(2);
  ChildProcess* b = c.start_taskmanager(2);
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  EXPECT_NE(jm->output().find("RUNNING: 5 task(s) on 2 TaskManager(s)"), std::string::npos) << jm->output();

  // Checkpoints completed on the JobManager; the retained ones are readable, with every sink subtask's state
  // (written by both TaskManagers) and the source's.
  const int completed = jm->count("completed checkpoint ");
  std::cout << completed << " checkpoints completed in the cluster\n";
  EXPECT_GE(completed, 3) << jm->output();
  const fs::path job_dir = dir_ / "cluster-chk" / c.job_id();
  ASSERT_TRUE(fs::exists(job_dir)) << job_dir;
  int metadata_files = 0;
  for (const auto& e : fs::directory_iterator(job_dir)) {
    if (FileCheckpointStorage::checkpoint_id_of(e.path()) < 0 || !fs::exists(e.path() / kMetadataFileName)) continue;
    ++metadata_files;
    auto meta = FileCheckpointStorage::load_metadata(e.path());
    ASSERT_TRUE(meta.ok()) << meta.error().to_string();
    EXPECT_EQ(meta->job_id, c.job_id());
    std::map<std::string, std::set<int>> subtasks;
    for (const auto& op : meta->operators) {
      for (const auto& s : op.subtasks) {
        subtasks[op.uid].insert(s.subtask);
        EXPECT_TRUE(FileCheckpointStorage::verify_state_file(e.path(), s).ok()) << op.uid << " " << s.file;
      }
    }
    std::string summary;
    for (const auto& [uid, s] : subtasks)
      summary += uid + ":" + std::to_string(s.size()) + " ";
    std::cout << e.path().filename().string() << ": " << summary << "\n";
    // The sink's 4 subtasks run on both TaskManagers: all 4 wrote their state into this checkpoint.
    bool sink_complete = false;
    for (const auto& [uid, s] : subtasks)
      sink_complete = sink_complete || s.size() == static_cast<size_t>(kParallelism);
    EXPECT_TRUE(sink_complete) << summary;
    EXPECT_FALSE(meta->coordinator_state.empty()) << "no split enumerator state in " << e.path();
  }
  EXPECT_GE(metadata_files, 1);

  // The committed output is the local run's (the files sink commits on NotifyCheckpointComplete).
  const auto clustered = read_parts("cluster");
  EXPECT_EQ(all_lines(clustered), all_lines(local)) << "the cluster's output differs from the local run's";
  check_records(clustered, kCount);
  for (ChildProcess* tm : {a, b})
    EXPECT_EQ(tm->count("declining checkpoint"), 0) << tm->output();
}

TEST_F(ClusterCheckpointTest, LocalModeResumesFromACheckpointTheClusterTookExactlyOnce) {
  // 100,000 records at 3,000/s: the JobManager is stopped (SIGTERM cancels the job) once part files were
  // committed, long before the end; `sluice run` then resumes from the cluster's latest checkpoint and writes the rest.
  constexpr int64_t kCount = 100'000;
  ClusterHarness& c = cluster(pipeline("out", 4, kCount, 3'000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  c.start_taskmanager(2);
  c.start_taskmanager(2);
  // Some part files committed (on NotifyCheckpointComplete), then one more checkpoint: the one to resume from
  // has both committed and pending output behind it.
  ASSERT_TRUE(poll_until([&] { return !read_parts("out").empty(); }, kStart)) << jm->output();
  const int before = jm->count("completed checkpoint ");
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") > before; }, kStart)) << jm->output();
  jm->signal(SIGTERM);
  ASSERT_TRUE(jm->wait_exit(30s).has_value());
  auto latest = FileCheckpointStorage::resolve_restore_path((dir_ / "out-chk" / c.job_id()).string());
  ASSERT_TRUE(latest.ok()) << latest.error().to_string();
  auto meta = FileCheckpointStorage::load_metadata(*latest);
  ASSERT_TRUE(meta.ok());
  const size_t committed_by_cluster = all_lines(read_parts("out")).size();
  std::cout << "the cluster committed " << committed_by_cluster << " records; resuming from " << latest->string()
            << " in local mode\n";
  ASSERT_GT(committed_by_cluster, 0u);
  ASSERT_LT(committed_by_cluster, static_cast<size_t>(kCount));
  harness_.reset();

  // The same pipeline without the rate limit, from the cluster's checkpoint: local mode reads its `_metadata`
  // and the state files both TaskManagers wrote, commits what the checkpoint had pending, and writes the rest.
  const std::string file = pipeline("out", 4, kCount, 0);
  ChildProcess run("run", {"run", file, "-D", "execution.state-recovery.path=" + latest->string()});
  const std::optional<int> code = run.wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << run.output();
  EXPECT_EQ(*code, 0) << run.output();
  EXPECT_NE(run.output().find("starts from checkpoint " + std::to_string(meta->checkpoint_id)), std::string::npos)
      << run.output();
  // Cluster and local output together: every record exactly once, each key in order.
  check_records(read_parts("out"), kCount);
}

TEST_F(ClusterCheckpointTest, ACorruptedStateFileFailsTheRestoreOnTheTaskManagerNamingTheFile) {
  // A checkpoint of the cluster, the JobManager then stopped (as above).
  ClusterHarness& c = cluster(pipeline("out", 4, 100'000, 3'000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  c.start_taskmanager(2);
  c.start_taskmanager(2);
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") > 0; }, kStart)) << jm->output();
  jm->signal(SIGTERM);
  ASSERT_TRUE(jm->wait_exit(30s).has_value());
  auto latest = FileCheckpointStorage::resolve_restore_path((dir_ / "out-chk" / c.job_id()).string());
  ASSERT_TRUE(latest.ok()) << latest.error().to_string();
  auto meta = FileCheckpointStorage::load_metadata(*latest);
  ASSERT_TRUE(meta.ok()) << meta.error().to_string();
  harness_.reset();

  // One byte of a state file flipped: the size is right, so the JobManager (which checks existence and size only)
  // deploys the restore; the task that reads the file as it initialises finds the checksum mismatch and fails,
  // naming the file, on every attempt until the restart strategy gives up.
  fs::path broken;
  uint64_t broken_size = 0;
  for (const auto& op : meta->operators) {
    for (const auto& h : op.subtasks) {
      if (h.operator_state_length > 0 && h.file_size > broken_size) {
        broken = *latest / h.file;
        broken_size = h.file_size;
      }
    }
  }
  ASSERT_FALSE(broken.empty()) << "no state file with operator state in " << *latest;
  std::string bytes;
  {
    std::ifstream in(broken, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_EQ(bytes.size(), broken_size);
  bytes[bytes.size() - 1] ^= 0x01;
  std::ofstream(broken, std::ios::binary | std::ios::trunc) << bytes;
  std::cout << "flipped the last byte of " << broken.string() << " (" << broken_size << " bytes)\n";

  const std::string recovery = "execution.state-recovery.path=" + latest->string();
  ClusterHarness& c2 = cluster(pipeline("out", 4, 100'000, 3'000),
                               {"restart-strategy.type=fixed-delay", "restart-strategy.fixed-delay.attempts=1",
                                "restart-strategy.fixed-delay.delay=100ms"});
  ChildProcess* jm2 = c2.start_jobmanager(0, 60s, {"-D", recovery});
  ASSERT_NE(jm2, nullptr);
  ChildProcess* a = c2.start_taskmanager(2);
  ChildProcess* b = c2.start_taskmanager(2);
  const std::optional<int> code = jm2->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the job did not fail\n" << c2.logs();
  EXPECT_NE(*code, 0) << jm2->output();
  EXPECT_NE(jm2->output().find("starts from checkpoint " + std::to_string(meta->checkpoint_id)), std::string::npos)
      << jm2->output();
  EXPECT_NE(jm2->output().find("FAILED"), std::string::npos) << jm2->output();
  EXPECT_NE(jm2->output().find(broken.string()), std::string::npos) << jm2->output();
  EXPECT_NE(jm2->output().find("checksum mismatch"), std::string::npos) << jm2->output();
  EXPECT_GE(a->count("checksum mismatch") + b->count("checksum mismatch"), 1) << c2.logs();
  // The state is read by the tasks, not in the deployment call: every deployment succeeded, a task failed.
  EXPECT_NE(jm2->output().find("deployed "), std::string::npos) << jm2->output();
  EXPECT_EQ(jm2->output().find("deploying "), std::string::npos) << jm2->output();
  EXPECT_NE(jm2->output().find("restoring the state of "), std::string::npos) << jm2->output();
  harness_.reset();

  // Truncated: the JobManager's size check refuses it before any deployment, naming the file.
  std::ofstream(broken, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  ChildProcess refused("jobmanager", {"jobmanager", pipeline("out", 4, 100'000, 3'000), "--rpc-port", "0",
                                      "--rest-port", "0", "-D", recovery});
  const std::optional<int> refused_code = refused.wait_exit(kStart);
  ASSERT_TRUE(refused_code.has_value()) << refused.output();
  EXPECT_NE(*refused_code, 0) << refused.output();
  EXPECT_NE(refused.output().find(broken.string()), std::string::npos) << refused.output();
  EXPECT_NE(refused.output().find("is truncated"), std::string::npos) << refused.output();
}

// Flink's state locality on a JobManager failover: 2 TaskManagers of 1 slot, parallelism 2 (shared slot 0 holds the
// source and subtask 0 of the keyed vertex, slot 1 subtask 1), registered A then B. The `_metadata` names the
// TaskManager that wrote each state file. A is SIGSTOPped, the JobManager SIGKILLed, and its successor (same RPC
// port, restoring the latest checkpoint) sees B register first and A (SIGCONT) second: in registration order slot 0
// would now go to B; each subtask goes back to the TaskManager its state names instead, and the output is complete.
TEST_F(ClusterCheckpointTest, AfterAJobManagerFailoverSubtasksGoBackToTheTaskManagerThatWroteTheirState) {
  // 20,000 records at 2,000/s: the job runs about 10 s, long enough to fail over in the middle.
  constexpr int64_t kCount = 20'000;
  const std::string file = pipeline("locality", 2, kCount, 2'000);
  ClusterHarness& c = cluster(file);
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  const int port = c.rpc_port();
  auto resource_id = [](ChildProcess* tm) {
    auto line = tm->await_line(std::regex(R"(TaskManager (\S+) with 1 slots)"), kStart);
    return line ? (*line)[1] : std::string();
  };
  ChildProcess* a = c.start_taskmanager(1);
  const std::string a_id = resource_id(a);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, kStart));
  ChildProcess* b = c.start_taskmanager(1);
  const std::string b_id = resource_id(b);
  ASSERT_FALSE(a_id.empty() || b_id.empty()) << c.logs();
  std::cout << "TaskManager A " << a_id << ", B " << b_id << "\n";
  ASSERT_TRUE(jm->await_line(std::regex(R"(RUNNING: 3 task\(s\) on 2 TaskManager\(s\))"), kStart)) << jm->output();

  // Where each subtask runs: {vertex, subtask} -> TaskManager resource id (GET /jobs/:id/vertices/:vid).
  auto placement = [&] {
    std::map<std::pair<int, int>, std::string> out;
    for (int vertex : {0, 1}) {
      const auto v = c.get("/jobs/" + c.job_id() + "/vertices/" + std::to_string(vertex));
      const Value* subtasks = v ? v->find("subtasks") : nullptr;
      if (subtasks == nullptr || !subtasks->is_array()) return out;
      for (const Value& st : subtasks->as_array())
        out[{vertex, static_cast<int>(num(st, "subtask"))}] = str(st, "taskmanager-id");
    }
    return out;
  };
  const std::map<std::pair<int, int>, std::string> first = placement();
  const std::map<std::pair<int, int>, std::string> registration_order = {
      {{0, 0}, a_id}, {{1, 0}, a_id}, {{1, 1}, b_id}};
  ASSERT_EQ(first, registration_order) << "the first deployment fills the TaskManagers in registration order";
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") >= 2; }, kStart)) << jm->output();

  a->signal(SIGSTOP);
  jm->signal(SIGKILL);
  ASSERT_TRUE(jm->wait_exit(10s).has_value());
  const fs::path job_dir = dir_ / "locality-chk" / c.job_id();
  auto latest = FileCheckpointStorage::resolve_restore_path(job_dir.string());
  ASSERT_TRUE(latest.ok()) << latest.error().to_string();
  auto meta = FileCheckpointStorage::load_metadata(*latest);
  ASSERT_TRUE(meta.ok()) << meta.error().to_string();
  // The metadata records, per state file, the TaskManager that wrote it: the one that ran the subtask.
  int handles = 0;
  for (const auto& op : meta->operators) {
    for (const auto& h : op.subtasks) {
      ++handles;
      const int vertex = op.parallelism == 1 ? 0 : 1;
      EXPECT_EQ(h.location, first.at({vertex, h.subtask})) << op.uid << " subtask " << h.subtask << " " << h.file;
    }
  }
  std::cout << "resuming from " << latest->string() << " (checkpoint " << meta->checkpoint_id << ", " << handles
            << " state handles)\n";
  ASSERT_GE(handles, 2) << "the keyed vertex's subtasks have state";

  // The successor, with B registered first and A (woken) second.
  ChildProcess* jm2 = c.start_jobmanager(port, 60s, {"-D", "execution.state-recovery.path=" + latest->string()});
  ASSERT_NE(jm2, nullptr);
  ASSERT_TRUE(c.await_task_managers(
      [&](const std::vector<Value>& t) { return t.size() == 1 && num(t[0], "pid") == b->pid(); }, kStart))
      << c.logs();
  a->signal(SIGCONT);
  ASSERT_TRUE(jm2->await_line(std::regex(R"(RUNNING: 3 task\(s\) on 2 TaskManager\(s\))"), kStart)) << c.logs();
  const std::vector<Value> tms = c.task_managers();
  ASSERT_EQ(tms.size(), 2u);
  EXPECT_EQ(str(tms[0], "id"), b_id) << "B registered first with the new JobManager";
  EXPECT_EQ(str(tms[1], "id"), a_id);
  const std::map<std::pair<int, int>, std::string> second = placement();
  EXPECT_EQ(second, first) << "each subtask back on the TaskManager that wrote its state";
  const auto placed = jm2->await_line(
      std::regex(R"(placed (\d+) of (\d+) subtasks on the TaskManager that wrote their state \(checkpoint (\d+)\))"),
      1s);
  ASSERT_TRUE(placed.has_value()) << jm2->output();
  std::cout << "the new JobManager placed " << (*placed)[1] << " of " << (*placed)[2]
            << " subtasks with state on the TaskManager that wrote it\n";
  EXPECT_EQ((*placed)[1], (*placed)[2]);
  EXPECT_GE(std::stoi((*placed)[2]), 2);
  EXPECT_EQ(std::stoll((*placed)[3]), meta->checkpoint_id);

  const std::optional<int> code = jm2->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the restored job did not finish\n" << c.logs();
  ASSERT_EQ(*code, 0) << jm2->output();
  check_records(read_parts("locality"), kCount);
}

// The JobManager's /health applies the pipeline's health.* bounds (issue 16), as `sluice run`'s does: with
// health.max-checkpoint-age 1500ms and health.max-failed-checkpoints 0 (off), a job whose checkpoints cannot be
// written (the checkpoint directory replaced by a file: root ignores permissions) answers 503 with the reason
// checkpoint-age, not failed-checkpoints (the default bound of 3 a JobManager applied before, which ignored the
// file's), while the job keeps RUNNING (execution.checkpointing.tolerable-failed-checkpoints); once checkpoints
// complete again it answers 200.
TEST_F(ClusterCheckpointTest, ARestartReadsTheStateFromTheTaskManagersLocalCopies) {
  // Task-local recovery: each TaskManager keeps a copy of the state files it writes; a task failure on one of them
  // (an injected throw in its sink after 8,000 records, about 1.6 s of records and several checkpoints in) restarts
  // the job from the latest checkpoint on the same TaskManagers, which read their own copies, none from the storage.
  constexpr int64_t kCount = 30'000;
  ClusterHarness& c = cluster(pipeline("lr", 2, kCount, 10'000), {"execution.state-recovery.from-local=true"});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ::setenv("SLUICE_FAULT_POINTS", "operator.process:Sink: out=throw@8000", 1);
  ChildProcess* a = c.start_taskmanager(1);
  ::unsetenv("SLUICE_FAULT_POINTS");
  ChildProcess* b = c.start_taskmanager(1);
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  ASSERT_NE(jm->output().find("RESTARTING"), std::string::npos) << "the injected failure did not restart the job";

  // Each TaskManager restored its own subtasks' files from its local copies. A subtask also reads the operator state
  // of every old subtask of its operator (list state is redistributed, union state goes to all): the files sink's
  // other subtask wrote its file on the other TaskManager, so each sink restore reads at most that one from the
  // checkpoint storage.
  static const std::regex restore_line(
      R"(restoring vertex (\d+) from checkpoint (\d+): (\d+) state file\(s\) \((\d+) bytes\) read from local copies in (\S+), (\d+) \((\d+) bytes\) from)");
  int local_files = 0;
  int remote_files = 0;
  for (ChildProcess* tm : {a, b}) {
    const std::string out = tm->output();
    int restores = 0;
    for (std::sregex_iterator it(out.begin(), out.end(), restore_line), end; it != end; ++it) {
      ++restores;
      const int local = std::stoi((*it)[3]);
      const int remote = std::stoi((*it)[6]);
      local_files += local;
      remote_files += remote;
      EXPECT_GE(local, 1) << "vertex " << (*it)[1] << " read no local copy:\n" << out;
      EXPECT_LE(remote, 1) << "vertex " << (*it)[1] << " read its own files from the checkpoint storage:\n" << out;
      EXPECT_NE((*it)[5].str().find("sluice-localState-"), std::string::npos) << (*it)[5];
    }
    EXPECT_GE(restores, 1) << tm->role() << " restored nothing:\n" << out;
    EXPECT_NE(out.find("restored from checkpoint"), std::string::npos) << out;
  }
  std::cout << local_files << " state files restored from local copies, " << remote_files
            << " from the checkpoint storage\n";
  EXPECT_GE(local_files, 3);  // the source's, and both sink subtasks'
  EXPECT_LE(remote_files, 2);

  // Every record once in the committed output, across the restart.
  check_records(read_parts("lr"), kCount);

  // The copies live in a directory of the TaskManager's own (its resource id), removed when it stops.
  static const std::regex root_line(R"(local copies of checkpoint state in (\S+) \(read by restores\))");
  std::smatch m;
  const std::string out = b->output();
  ASSERT_TRUE(std::regex_search(out, m, root_line)) << out;
  const fs::path root = m[1].str();
  EXPECT_TRUE(fs::exists(root)) << root;
  b->signal(SIGTERM);
  ASSERT_TRUE(b->wait_exit(30s).has_value()) << b->output();
  EXPECT_FALSE(fs::exists(root)) << root << " is left after the TaskManager stopped";
}

TEST_F(ClusterCheckpointTest, ALocalRootListKeepsTheCopiesInItsFirstUsableDirectory) {
  // taskmanager.state.local.root-dirs in Flink's list form: the first entry cannot be a directory (a regular file is
  // in the way), so the copies go to the second, and the log says which.
  const fs::path blocker = dir_ / "blocker";
  std::ofstream(blocker) << "not a directory";
  const fs::path usable = dir_ / "local-root";
  ClusterHarness& c =
      cluster(pipeline("lrl", 1, 0, 1'000),
              {"execution.checkpointing.local-backup.enabled=true",
               "taskmanager.state.local.root-dirs=" + (blocker / "x").string() + ", " + usable.string()});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* tm = c.start_taskmanager(1);
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") >= 2; }, kStart)) << jm->output();
  EXPECT_GE(
      tm->count("lists 2 directories; this TaskManager keeps its local copies in one of them, " + usable.string()), 1)
      << tm->output();
  EXPECT_GE(tm->count("local copies of checkpoint state in " + usable.string() + " "), 1) << tm->output();
  // Copies of a checkpoint: <root>/<job-id>/chk-<n>/<file>.
  bool copied = false;
  ASSERT_TRUE(poll_until(
      [&] {
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(usable, ec); !ec && it != fs::recursive_directory_iterator();
             it.increment(ec)) {
          if (it->is_regular_file() && it->path().parent_path().filename().string().starts_with("chk-")) copied = true;
        }
        return copied;
      },
      kStart))
      << "no local copy under " << usable;
  EXPECT_FALSE(fs::exists(blocker / "x"));
  jm->signal(SIGTERM);
  EXPECT_TRUE(jm->wait_exit(30s).has_value());
}

TEST_F(ClusterCheckpointTest, AJobManagerStartedAgainWithoutHighAvailabilityResumesFromTheLatestCheckpoint) {
  // No HA: the JobManager is SIGKILLed and started again with the same command (no -s). As `sluice run`, it
  // resumes from the latest checkpoint in the pipeline's storage: the exactly-once output holds every record once
  // (before: the job started over under a new id and the output held thousands of records twice). Once it finished,
  // its job directory is marked `_finished`, so that a third start would be a new job.
  constexpr int64_t kCount = 30'000;
  ClusterHarness& c = cluster(pipeline("again", 2, kCount, 5'000));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  const int port = c.rpc_port();
  const std::string first_job = c.job_id();
  c.start_taskmanager(1);
  c.start_taskmanager(1);
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") >= 3; }, kStart)) << jm->output();
  jm->signal(SIGKILL);
  ASSERT_TRUE(jm->wait_exit(10s).has_value());

  ChildProcess* jm2 = c.start_jobmanager(port, 60s);
  ASSERT_NE(jm2, nullptr);
  const auto resumed = jm2->await_line(
      std::regex("resumes from (\\S+/" + first_job + "/chk-\\d+), the latest checkpoint of an earlier run"), 10s);
  ASSERT_TRUE(resumed.has_value()) << jm2->output();
  std::cout << "the second JobManager resumes from " << (*resumed)[1] << "\n";
  const std::optional<int> code = jm2->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the resumed job did not finish\n" << c.logs();
  ASSERT_EQ(*code, 0) << jm2->output();
  check_records(read_parts("again"), kCount);
  EXPECT_TRUE(fs::exists(dir_ / "again-chk" / c.job_id() / "_finished")) << "the finished job is marked";
  EXPECT_NE(c.job_id(), first_job) << "a new job id, restored from the first job's checkpoint";
}

// 3 TaskManagers of 2 slots for a job at parallelism 4: one is a spare. The TaskManager holding the source (3
// tasks) or the other one running tasks (2 sink subtasks) is SIGKILLed; the first redeployment can still include
// it (not declared lost yet) and fails on it, and the survivor's tasks of that aborted deployment report CANCELED
// while the JobManager places the job without it. Neither is a failure of the job: with `fixed-delay, attempts: 1`
// the job must restart once and finish, every record once. (Before: the survivor's SubmitTasks failing on the
// dead peer's data-plane connection counted as the job's failure, and its CANCELED reports of the aborted
// deployment failed the next one: 4 of 6 such jobs FAILED with "allows no more restarts".)
TEST_F(ClusterCheckpointTest, KillingTheSourcesTaskManagerCostsOneRestartWhenASpareTakesItsSlots) {
  constexpr int64_t kCount = 30'000;
  ClusterHarness& c =
      cluster(pipeline("spare", 4, kCount, 5'000, "  restart: { strategy: fixed-delay, attempts: 1, delay: 300ms }\n"));
  kill_a_busy_taskmanager_with_a_spare(c, true, kCount);
}

TEST_F(ClusterCheckpointTest, KillingASinkOnlyTaskManagerCostsOneRestartWhenASpareTakesItsSlots) {
  constexpr int64_t kCount = 30'000;
  ClusterHarness& c =
      cluster(pipeline("spare", 4, kCount, 5'000, "  restart: { strategy: fixed-delay, attempts: 1, delay: 300ms }\n"));
  kill_a_busy_taskmanager_with_a_spare(c, false, kCount);
}

TEST_F(ClusterCheckpointTest, IncrementalRocksdbStateSurvivesATaskManagerKill) {
  // Incremental rocksdb checkpoints in cluster mode: a TaskManager's acknowledgement must carry the database's files
  // (the shared SSTs and the ones inside the state file), or `_metadata` names only the state file and a restore
  // opens an empty database: every entity's count started again at 1 after a restore. A TaskManager running tasks
  // is killed (SIGKILL) after some checkpoints; the job restarts on the other two from the latest checkpoint, and
  // every event's entity_version (the keyed count in rocksdb) must still be its revision + 1.
  constexpr int64_t kCount = 30'000;
  ClusterHarness& c = cluster(pipeline("rdb", 2, kCount, 5'000,
                                       "  entity-version: true\n"
                                       "  config:\n"
                                       "    state.backend.type: rocksdb\n"
                                       "    state.backend.incremental: \"true\"\n"));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::vector<ChildProcess*> tms;
  for (int i = 0; i < 3; ++i)
    tms.push_back(c.start_taskmanager(1));
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") >= 4; }, kStart)) << jm->output();
  ChildProcess* victim = nullptr;
  for (ChildProcess* tm : tms) {
    if (tm->count("attempt 0 deployed") > 0) victim = tm;
  }
  ASSERT_NE(victim, nullptr) << "no TaskManager runs tasks";
  victim->signal(SIGKILL);
  const std::optional<int> code = jm->wait_exit(kFinish);
  ASSERT_TRUE(code.has_value()) << "the cluster's job did not finish";
  ASSERT_EQ(*code, 0) << jm->output();
  ASSERT_NE(jm->output().find("RESTARTING"), std::string::npos) << "the kill did not restart the job";

  const auto parts = read_parts("rdb");
  check_records(parts, kCount);
  const std::regex revision_re(R"re("revision":(\d+))re");
  const std::regex version_re(R"re("entity_version":(\d+))re");
  int64_t checked = 0, wrong = 0;
  std::string first_wrong;
  for (const auto& [name, lines] : parts) {
    for (const auto& line : lines) {
      std::smatch r, v;
      ASSERT_TRUE(std::regex_search(line, r, revision_re)) << line;
      ASSERT_TRUE(std::regex_search(line, v, version_re)) << line;
      ++checked;
      if (std::stoll(v[1]) != std::stoll(r[1]) + 1) {
        if (wrong++ == 0) first_wrong = line;
      }
    }
  }
  std::cout << checked << " events checked: " << wrong << " with entity_version != revision + 1\n";
  EXPECT_EQ(wrong, 0) << "first: " << first_wrong;
}

TEST_F(ClusterCheckpointTest, TheJobManagersHealthAppliesThePipelinesHealthBounds) {
  ClusterHarness& c =
      cluster(pipeline("out", 2, 0, 2'000, "  health: { max-checkpoint-age: 1500ms, max-failed-checkpoints: 0 }\n"),
              {"execution.checkpointing.tolerable-failed-checkpoints=1000000"});
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  c.start_taskmanager(1);
  c.start_taskmanager(1);
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") > 0; }, kStart)) << jm->output();
  std::pair<int, std::string> h;
  ASSERT_TRUE(poll_until(
      [&] {
        h = c.http_get("/health");
        return h.first == 200;
      },
      10s))
      << h.first << " " << h.second;

  const fs::path job_dir = dir_ / "out-chk" / c.job_id();
  const fs::path moved = dir_ / "out-chk-moved";
  fs::rename(job_dir, moved);
  std::ofstream(job_dir) << "not a directory\n";
  const auto broken_at = Clock::now();
  const bool unhealthy = poll_until(
      [&] {
        h = c.http_get("/health");
        return h.first == 503;
      },
      20s);
  std::cout << "/health answered " << h.first << " "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - broken_at).count()
            << " ms after the checkpoint directory broke: " << h.second << "\n";
  ASSERT_TRUE(unhealthy) << h.second;
  EXPECT_NE(h.second.find("\"checkpoint-age\""), std::string::npos) << h.second;
  EXPECT_NE(h.second.find("health.max-checkpoint-age"), std::string::npos) << h.second;
  EXPECT_EQ(h.second.find("failed-checkpoints"), std::string::npos) << h.second;
  EXPECT_NE(h.second.find("RUNNING"), std::string::npos) << h.second;
  // Its /metrics carries what the alert rules compare (deploy/monitoring/sluice-alerts.yml), as `sluice run`'s does.
  const std::string metrics = c.http_get("/metrics").second;
  std::smatch m;
  static const std::regex age(R"(sluice_checkpoint_age_ms\{job="cluster-ckpt-test"\} (\d+))");
  ASSERT_TRUE(std::regex_search(metrics, m, age)) << metrics;
  EXPECT_GT(std::stoll(m[1]), 1500) << metrics;
  EXPECT_NE(metrics.find("sluice_health_checkpoint_age_bound_ms{job=\"cluster-ckpt-test\"} 1500\n"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("sluice_health_failed_checkpoints_bound{"), std::string::npos) << metrics;  // 0 = off
  EXPECT_NE(metrics.find("sluice_job_healthy{job=\"cluster-ckpt-test\"} 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("sluice_job_restarting{job=\"cluster-ckpt-test\"} 0\n"), std::string::npos) << metrics;

  fs::remove(job_dir);
  fs::rename(moved, job_dir);
  const int completed = jm->count("completed checkpoint ");
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") > completed; }, kStart)) << jm->output();
  EXPECT_TRUE(poll_until(
      [&] {
        h = c.http_get("/health");
        return h.first == 200;
      },
      10s))
      << h.first << " " << h.second;
  EXPECT_TRUE(poll_until(
      [&] {
        return c.http_get("/metrics").second.find("sluice_job_healthy{job=\"cluster-ckpt-test\"} 1\n") !=
               std::string::npos;
      },
      10s))
      << c.http_get("/metrics").second;
}

}  // namespace
}  // namespace sluice::testing::cluster
