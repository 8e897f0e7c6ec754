// Cluster mode's control plane with real processes: `sluice jobmanager` and `sluice taskmanager` children of
// the built binary on free ports (tests/cluster/cluster_harness.h), observed through the JobManager's REST API
// (GET /taskmanagers, GET /jobs/:id) and the processes' logs, and signalled by pid:
//  * 3 TaskManagers register with their slots; the job says "needs 8 slots, 6 registered"; one leaves with
//    SIGTERM at once; with 8 slots the job is deployed, finishes and the JobManager exits with 0;
//  * a TaskManager built from a different pipeline is refused naming both fingerprints and exits non-zero;
//  * a SIGKILLed TaskManager is declared lost within heartbeat.timeout plus a margin;
//  * a SIGSTOPped TaskManager is declared lost after the timeout; after SIGCONT its stale registration is
//    refused and it comes back as a new registration;
//  * a SIGKILLed JobManager: the TaskManagers declare it lost, retry, and register with its successor.
// Heartbeats here: interval 250 ms, timeout 3 s (docs/cluster.md has the defaults). About 30 s in all.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "cluster/cluster_harness.h"

#ifndef SLUICE_EXAMPLES_DATA_DIR
#error "SLUICE_EXAMPLES_DATA_DIR must name examples/data"
#endif

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kIntervalMs = 250;
constexpr int64_t kTimeoutMs = 3000;
constexpr auto kStart = 60s;  // process start on a loaded two-core machine
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};

class ClusterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice-cluster-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(Clock::now().time_since_epoch().count()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure() && harness_) std::cerr << harness_->logs();
    harness_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Writes a pipeline file (files -> transform -> files; never started) of `parallelism`.
  std::string pipeline(const std::string& name, int parallelism, const std::string& key = "after.id") {
    const fs::path path = dir_ / (name + ".yaml");
    std::ofstream f(path);
    f << "pipeline:\n  name: cluster-test\n  parallelism: " << parallelism << "\n  checkpoint: { interval: 0 }\n"
      << "source:\n  type: files\n  path: " << SLUICE_EXAMPLES_DATA_DIR << "/payments\n  format: json-changes\n"
      << "transform:\n  - match: \"*.public.charges\"\n    key: " << key << "\n"
      << "    event:\n      type: \"'charge.' || after.status\"\n      payload: \"after.id, after.amount_cents\"\n"
      << "route:\n  - { match: \"*.public.charges\", sink: out }\n"
      << "sink:\n  out:\n    type: files\n    path: " << (dir_ / "out").string() << "\n";
    return path.string();
  }

  ClusterHarness& cluster(const std::string& file) {
    harness_ = std::make_unique<ClusterHarness>(file, kOptions);
    return *harness_;
  }

  std::string job_field(const std::string& field) {
    auto job = harness_->get("/jobs/" + harness_->job_id());
    return job ? str(*job, field) : std::string();
  }

  fs::path dir_;
  std::unique_ptr<ClusterHarness> harness_;
};

bool has_registration(const std::vector<Value>& tms, const std::string& registration_id) {
  for (const auto& t : tms) {
    if (str(t, "registration-id") == registration_id) return true;
  }
  return false;
}

TEST_F(ClusterProcessTest, ThreeTaskManagersRegisterWithTheirSlotsAndTheJobSaysWhatItWaitsFor) {
  ClusterHarness& c = cluster(pipeline("p8", 8));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  EXPECT_EQ(job_field("state"), "CREATED");
  EXPECT_NE(job_field("status-message").find("needs 8 slots, 0 registered"), std::string::npos)
      << job_field("status-message");
  std::vector<ChildProcess*> tms;
  for (int i = 0; i < 3; ++i)
    tms.push_back(c.start_taskmanager(2));
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 3; }, kStart)) << c.logs();
  std::set<int64_t> pids;
  std::set<std::string> ids;
  for (const auto& t : c.task_managers()) {
    EXPECT_EQ(num(t, "slotsNumber"), 2);
    EXPECT_EQ(num(t, "freeSlots"), 2);
    EXPECT_FALSE(str(t, "path").empty());
    EXPECT_GE(num(t, "ms-since-last-heartbeat"), 0);
    pids.insert(num(t, "pid"));
    ids.insert(str(t, "id"));
  }
  EXPECT_EQ(pids, (std::set<int64_t>{tms[0]->pid(), tms[1]->pid(), tms[2]->pid()}));
  EXPECT_EQ(ids.size(), 3u);
  // Heartbeats keep arriving: every TaskManager's last heartbeat is younger than two timeouts... and moves.
  const int64_t first = num(c.task_managers()[0], "timeSinceLastHeartbeat");
  EXPECT_TRUE(c.await_task_managers(
      [&](const std::vector<Value>& t) { return !t.empty() && num(t[0], "timeSinceLastHeartbeat") > first; }, 10s));

  EXPECT_EQ(job_field("state"), "CREATED") << "the job must never claim to run";
  EXPECT_NE(job_field("status-message").find("needs 8 slots, 6 registered"), std::string::npos)
      << job_field("status-message");
  EXPECT_TRUE(jm->await_line(std::regex("needs 8 slots, 6 registered"), 5s)) << jm->output();

  // A TaskManager stopped with SIGTERM leaves at once (its slots do not wait for heartbeat.timeout).
  const auto t0 = Clock::now();
  tms[0]->signal(SIGTERM);
  EXPECT_EQ(tms[0]->wait_exit(10s), 0);
  EXPECT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 2; }, 10s));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(kTimeoutMs)) << "a clean shutdown waited for the timeout";
  EXPECT_TRUE(jm->await_line(std::regex("needs 8 slots, 4 registered"), 5s)) << jm->output();

  // With 8 slots the job is deployed, runs its bounded source to the end and the JobManager exits with 0.
  c.start_taskmanager(2);
  c.start_taskmanager(2);
  EXPECT_TRUE(jm->await_line(std::regex("RUNNING: \\d+ task\\(s\\) on 4 TaskManager\\(s\\)"), kStart)) << jm->output();
  EXPECT_EQ(jm->wait_exit(kStart), 0) << jm->output();
  EXPECT_NE(jm->output().find("FINISHED"), std::string::npos) << jm->output();
}

TEST_F(ClusterProcessTest, ATaskManagerWithAnotherJobGraphIsRefusedNamingBothFingerprints) {
  ClusterHarness& c = cluster(pipeline("p4", 4));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  auto jm_fp = jm->await_line(std::regex("job graph fingerprint ([0-9a-f]{32})"), 5s);
  ASSERT_TRUE(jm_fp);
  ChildProcess* other = c.start_taskmanager(2, pipeline("p3", 3));
  const std::optional<int> code = other->wait_exit(kStart);
  ASSERT_TRUE(code.has_value()) << "the refused TaskManager did not exit:\n" << other->output();
  EXPECT_NE(*code, 0);
  auto tm_fp = other->await_line(std::regex("job graph fingerprint ([0-9a-f]{32})"), 1s);
  ASSERT_TRUE(tm_fp);
  EXPECT_NE((*jm_fp)[1], (*tm_fp)[1]);
  const std::string out = other->output();
  EXPECT_NE(out.find("error: TaskManager"), std::string::npos) << out;
  EXPECT_NE(out.find("is refused: its job graph differs from the JobManager's"), std::string::npos) << out;
  EXPECT_NE(out.find("graph fingerprint " + (*jm_fp)[1]), std::string::npos) << out;
  EXPECT_NE(out.find("graph fingerprint " + (*tm_fp)[1]), std::string::npos) << out;
  EXPECT_NE(out.find("sluice "), std::string::npos) << out;
  EXPECT_TRUE(c.task_managers().empty());
  // The same file registers.
  c.start_taskmanager(2);
  EXPECT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, kStart));
}

// A TaskManager started from another file of the same graph (here: another sink path) is refused too (found by a
// fresh-user trial: one with another Kafka topic registered, and the job's output was split between two topics
// without a word).
TEST_F(ClusterProcessTest, ATaskManagerWithAnotherPipelineFileOfTheSameGraphIsRefused) {
  ClusterHarness& c = cluster(pipeline("p4", 4));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::string other_file;
  {
    std::ifstream in(pipeline("p4", 4));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string out = (dir_ / "out").string();
    const size_t at = text.find(out);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, out.size(), (dir_ / "elsewhere").string());
    other_file = (dir_ / "p4-elsewhere.yaml").string();
    std::ofstream(other_file) << text;
  }
  ChildProcess* other = c.start_taskmanager(2, other_file);
  const std::optional<int> code = other->wait_exit(kStart);
  ASSERT_TRUE(code.has_value()) << "the refused TaskManager did not exit:\n" << other->output();
  EXPECT_NE(*code, 0);
  const std::string out = other->output();
  EXPECT_NE(out.find("is refused: its pipeline file differs from the JobManager's, though the job graph is the same"),
            std::string::npos)
      << out;
  EXPECT_NE(jm->output().find("refused the registration of TaskManager"), std::string::npos) << jm->output();
  EXPECT_TRUE(c.task_managers().empty());
  // The JobManager's own file registers.
  c.start_taskmanager(2);
  EXPECT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, kStart));
}

// An unknown -D option is warned about once per process (it was twice: once when the job graph was fingerprinted
// and once when it was built).
TEST_F(ClusterProcessTest, AnUnknownOptionIsWarnedAboutOncePerProcess) {
  std::vector<std::string> options = kOptions;
  options.push_back("state.backend.typo=1");
  harness_ = std::make_unique<ClusterHarness>(pipeline("p4", 4), options);
  ClusterHarness& c = *harness_;
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* tm = c.start_taskmanager(2);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, kStart)) << c.logs();
  // The warning comes before the JobManager's RPC line and before the TaskManager registers.
  auto count = [](const std::string& out) {
    size_t n = 0;
    for (size_t at = out.find("'state.backend.typo' is not an engine option"); at != std::string::npos;
         at = out.find("'state.backend.typo' is not an engine option", at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count(jm->output()), 1u) << jm->output();
  EXPECT_EQ(count(tm->output()), 1u) << tm->output();
}

// The tests below keep fewer slots registered than the job needs (4), so that it is never deployed and they
// observe the control plane alone (cluster_job_test deploys).
TEST_F(ClusterProcessTest, AKilledTaskManagerIsDeclaredLostWithinTheHeartbeatTimeout) {
  ClusterHarness& c = cluster(pipeline("p4", 4));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* victim = c.start_taskmanager(2);
  c.start_taskmanager(1);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 2; }, kStart));
  victim->signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_TRUE(victim->wait_exit(10s).has_value());
  // Lost no later than the timeout after its last heartbeat (which came before the kill), plus a margin for
  // the monitor and the REST polling on a loaded machine.
  const auto deadline = std::chrono::milliseconds(kTimeoutMs + 2000);
  ASSERT_TRUE(c.await_task_managers([&](const std::vector<Value>& t) { return t.size() == 1; }, deadline))
      << "not declared lost within heartbeat.timeout + 2 s";
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  EXPECT_GE(took.count(), kTimeoutMs - kIntervalMs - 100) << "declared lost before heartbeat.timeout";
  std::cerr << "SIGKILLed TaskManager declared lost after " << took.count() << " ms (heartbeat.timeout " << kTimeoutMs
            << " ms)\n";
  EXPECT_EQ(num(c.task_managers()[0], "slotsNumber"), 1) << "the survivor is not the one that remained";
  EXPECT_TRUE(
      jm->await_line(std::regex(R"(TaskManager .* lost: no heartbeat for \d+ ms \(heartbeat\.timeout 3000 ms\))"), 2s))
      << jm->output();
}

TEST_F(ClusterProcessTest, AStoppedTaskManagerIsLostAfterTheTimeoutAndComesBackAsANewRegistration) {
  ClusterHarness& c = cluster(pipeline("p4", 4));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* sleeper = c.start_taskmanager(2);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, kStart));
  const Value before = c.task_managers()[0];
  const std::string resource_id = str(before, "id");
  const std::string old_registration = str(before, "registration-id");
  sleeper->signal(SIGSTOP);
  const auto stopped = Clock::now();
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.empty(); },
                                    std::chrono::milliseconds(kTimeoutMs + 2000)))
      << "a SIGSTOPped TaskManager was not declared lost within heartbeat.timeout + 2 s";
  EXPECT_GE(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped).count(),
            kTimeoutMs - kIntervalMs - 100);
  // Still stopped: nothing revives it.
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kIntervalMs));  // a window for a wrong revival
  EXPECT_TRUE(c.task_managers().empty());
  sleeper->signal(SIGCONT);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 1; }, 20s))
      << "the woken TaskManager did not register again";
  const Value after = c.task_managers()[0];
  EXPECT_EQ(str(after, "id"), resource_id) << "the same process";
  EXPECT_NE(str(after, "registration-id"), old_registration) << "it must come back as a new registration";
  EXPECT_FALSE(has_registration(c.task_managers(), old_registration));
  // Its stale identity was refused by the JobManager and said so on both sides.
  EXPECT_TRUE(sleeper->await_line(std::regex("refused this TaskManager's registration " + old_registration +
                                             " as stale: .*closed.*no heartbeat for"),
                                  5s))
      << sleeper->output();
  EXPECT_TRUE(jm->await_line(std::regex("refused a heartbeat of TaskManager " +
                                        std::regex_replace(resource_id, std::regex(R"([.])"), R"(\.)")),
                             5s))
      << jm->output();
}

TEST_F(ClusterProcessTest, TaskManagersDeclareAKilledJobManagerLostRetryAndRegisterWithItsSuccessor) {
  ClusterHarness& c = cluster(pipeline("p4", 4));
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  ChildProcess* a = c.start_taskmanager(1);
  ChildProcess* b = c.start_taskmanager(2);
  ASSERT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 2; }, kStart));
  const int port = c.rpc_port();
  jm->signal(SIGKILL);
  ASSERT_TRUE(jm->wait_exit(10s).has_value());
  const std::regex lost("JobManager " + c.rpc_target() + " lost: no heartbeat reply for \\d+ ms");
  for (ChildProcess* tm : {a, b}) {
    EXPECT_TRUE(tm->await_line(lost, std::chrono::milliseconds(kTimeoutMs + 5000))) << tm->output();
    EXPECT_TRUE(poll_until([&] { return tm->count("registration attempt") >= 2; }, 10s))
        << "no retries after the loss:\n"
        << tm->output();
    EXPECT_FALSE(tm->exited()) << "a TaskManager must outlive its JobManager";
  }
  ChildProcess* successor = c.start_jobmanager(port);
  ASSERT_NE(successor, nullptr);
  EXPECT_TRUE(c.await_task_managers([](const std::vector<Value>& t) { return t.size() == 2; }, 20s))
      << "the TaskManagers did not register with the new JobManager";
  std::set<int64_t> pids;
  for (const auto& t : c.task_managers())
    pids.insert(num(t, "pid"));
  EXPECT_EQ(pids, (std::set<int64_t>{a->pid(), b->pid()}));
}

}  // namespace
}  // namespace sluice::testing::cluster
