// The control plane over real gRPC in one process (also run under ThreadSanitizer: gRPC's threads, the
// JobManager's heartbeat monitor and the TaskExecutors' connection threads share the registry):
// registration and slots, a refused job graph, stale registrations, TaskManager loss on a ManualClock,
// JobManager loss and re-registration, disconnect, and the calls this build answers UNIMPLEMENTED.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "integration/test_util/polling.h"
#include "sluice/api/stream_environment.h"
#include "sluice/cluster/jobmanager/job_master.h"
#include "sluice/cluster/jobmanager/jobmanager_server.h"
#include "sluice/cluster/taskmanager/task_executor.h"
#include "sluice/cluster/v1/jobmanager.grpc.pb.h"
#include "sluice/cluster/v1/taskmanager.grpc.pb.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/clock.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

namespace v1 = ::sluice::cluster::v1;
using namespace std::chrono_literals;

const JobGraphIdentity kJob{"0123456789abcdef0123456789abcdef", "job", "0.1.0"};
constexpr auto kDeadline = 20s;

/// Waits for `pred` with a deadline: the state lives on other threads that offer nothing to block on.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = kDeadline) {
  return sluice::testing::poll_until(pred, timeout, std::chrono::milliseconds(5));
}

std::unique_ptr<JobManagerServer> start_jm(const Clock& clock, HeartbeatOptions hb, bool monitor, int port = 0) {
  JobManagerServerOptions o;
  o.port = port;
  o.heartbeat = hb;
  o.job = kJob;
  o.monitor_thread = monitor;
  auto jm = JobManagerServer::start(o, clock);
  EXPECT_TRUE(jm.ok()) << jm.error().to_string();
  return jm.ok() ? std::move(*jm) : nullptr;
}

std::unique_ptr<TaskExecutor> start_tm(const std::string& jm, int slots, HeartbeatOptions hb,
                                       JobGraphIdentity job = kJob) {
  TaskExecutorOptions o;
  o.jobmanager = jm;
  o.slots = slots;
  o.job = std::move(job);
  o.heartbeat = hb;
  o.backoff = RegistrationBackoff{20, 200};
  auto tm = TaskExecutor::start(o, SystemClock::instance());
  EXPECT_TRUE(tm.ok()) << tm.error().to_string();
  return tm.ok() ? std::move(*tm) : nullptr;
}

std::unique_ptr<v1::JobManagerService::Stub> jm_stub(const std::string& target) {
  return v1::JobManagerService::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

/// Registers TaskManager "tm-raw" of 1 slot over the raw RPC (a test then sends its heartbeats by hand).
void register_raw(v1::JobManagerService::Stub& stub, v1::RegisterTaskManagerResponse& resp) {
  v1::RegisterTaskManagerRequest req;
  req.set_resource_id("tm-raw");
  req.set_rpc_address("127.0.0.1:1");
  req.set_slots(1);
  req.mutable_job()->set_fingerprint(kJob.fingerprint);
  req.mutable_job()->set_job_name(kJob.job_name);
  req.mutable_job()->set_build_version(kJob.build_version);
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub.RegisterTaskManager(&ctx, req, &resp).ok());
}

/// A heartbeat of register_raw's TaskManager, its slot in use.
v1::TaskManagerHeartbeat raw_heartbeat(const v1::RegisterTaskManagerResponse& resp) {
  v1::TaskManagerHeartbeat beat;
  beat.set_registration_id(resp.registration_id());
  beat.set_resource_id("tm-raw");
  beat.mutable_slot_report()->set_slots_total(1);
  beat.mutable_slot_report()->set_slots_free(0);
  return beat;
}

TEST(ControlPlaneTest, TaskManagersRegisterWithTheirSlotsAndLeaveOnStop) {
  const HeartbeatOptions hb{50, 2000};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  auto a = start_tm(jm->target(), 1, hb);
  auto b = start_tm(jm->target(), 2, hb);
  auto c = start_tm(jm->target(), 3, hb);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(eventually([&] { return jm->slots().task_managers == 3; }));
  EXPECT_EQ(jm->slots().slots_total, 6);
  EXPECT_EQ(jm->slots().slots_free, 6);
  std::vector<TaskManagerRegistration> tms = jm->task_managers();
  ASSERT_EQ(tms.size(), 3u);
  for (const auto& t : tms) {
    EXPECT_FALSE(t.rpc_address.empty());
    EXPECT_GT(t.pid, 0);
  }
  // Heartbeats arrive.
  const TimestampMs registered = tms[0].last_heartbeat_ms;
  ASSERT_TRUE(eventually([&] {
    for (const auto& t : jm->task_managers()) {
      if (t.registration_id == tms[0].registration_id) return t.last_heartbeat_ms > registered;
    }
    return false;
  }));
  EXPECT_TRUE(b->status().registered);
  b->stop();  // disconnects: its slots go at once, not after heartbeat.timeout
  EXPECT_EQ(jm->slots().task_managers, 2);
  EXPECT_EQ(jm->slots().slots_total, 4);
}

/// What a fake job's source readers say of their connections, set by the test, read by the connection thread.
class FakeSources {
 public:
  void set(std::vector<SourceConnectionReport> r) {
    std::lock_guard lock(mu_);
    reports_ = std::move(r);
  }
  std::vector<SourceConnectionReport> get() const {
    std::lock_guard lock(mu_);
    return reports_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<SourceConnectionReport> reports_;
};

TEST(ControlPlaneTest, SourceConnectionsReachTheJobManagerAtOnceAndLeaveWithTheTaskManager) {
  // Heartbeats every 10 s: a change that arrives within 5 s came with the early heartbeat a change sends.
  const HeartbeatOptions hb{10'000, 30'000};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  FakeSources sources;
  sources.set({{"kafka", "orders", 0, true, 0, ""}, {"kafka", "orders", 1, true, 0, ""}});
  TaskExecutorOptions o;
  o.jobmanager = jm->target();
  o.slots = 2;
  o.job = kJob;
  o.heartbeat = hb;
  o.backoff = RegistrationBackoff{20, 200};
  o.source_connections = [&sources] { return sources.get(); };
  auto made = TaskExecutor::start(o, SystemClock::instance());
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  std::unique_ptr<TaskExecutor> tm = std::move(*made);
  auto reported = [&](int subtask) -> std::optional<ReportedSourceConnection> {
    for (auto& r : jm->source_connections()) {
      if (r.connection.subtask == subtask) return r;
    }
    return std::nullopt;
  };
  // Reported right after the registration, not one interval later.
  ASSERT_TRUE(eventually([&] { return jm->source_connections().size() == 2; }, 5s));
  EXPECT_TRUE(reported(0)->connection.connected);
  EXPECT_EQ(reported(0)->task_manager, tm->resource_id());

  const auto lost_at = std::chrono::steady_clock::now();
  sources.set({{"kafka", "orders", 0, true, 0, ""}, {"kafka", "orders", 1, false, 3000, "no broker answered"}});
  ASSERT_TRUE(eventually([&] { return !reported(1)->connection.connected; }, 5s));
  std::printf(
      "the disconnection reached the JobManager after %lld ms (heartbeat.interval 10000 ms)\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - lost_at).count()));
  const ReportedSourceConnection r = *reported(1);
  EXPECT_EQ(r.task_manager, tm->resource_id());
  EXPECT_EQ(r.connection.source, "kafka");
  EXPECT_EQ(r.connection.description, "orders");
  EXPECT_EQ(r.connection.reason, "no broker answered");
  EXPECT_GE(r.connection.disconnected_ms, 3000);  // grown by the time since the heartbeat
  EXPECT_TRUE(reported(0)->connection.connected);

  sources.set({{"kafka", "orders", 0, true, 0, ""}, {"kafka", "orders", 1, true, 0, ""}});
  ASSERT_TRUE(eventually([&] { return reported(1)->connection.connected; }, 5s));
  // A reader that closes is no longer reported.
  sources.set({{"kafka", "orders", 0, true, 0, ""}});
  ASSERT_TRUE(eventually([&] { return jm->source_connections().size() == 1; }, 5s));

  // A TaskManager that leaves takes its readers' states with it: no stale "disconnected" (nor "connected").
  sources.set({{"kafka", "orders", 0, false, 3500, "no broker answered"}});
  ASSERT_TRUE(eventually([&] { return !reported(0)->connection.connected; }, 5s));
  tm->stop();
  EXPECT_TRUE(jm->source_connections().empty());
}

TEST(ControlPlaneTest, ALostTaskManagersSourceConnectionsAgeOnTheJobManagersClockAndAreForgotten) {
  ManualClock clock(1'000'000);
  const HeartbeatOptions hb{1000, 5000};
  auto jm = start_jm(clock, hb, /*monitor=*/false);
  ASSERT_TRUE(jm);
  auto stub = jm_stub(jm->target());
  v1::RegisterTaskManagerResponse resp;
  ASSERT_NO_FATAL_FAILURE(register_raw(*stub, resp));
  v1::TaskManagerHeartbeat beat = raw_heartbeat(resp);
  v1::SourceConnectionStatus* c = beat.add_source_connections();
  c->set_source("postgres");
  c->set_description("slot s");
  c->set_subtask(0);
  c->set_connected(false);
  c->set_disconnected_ms(4000);
  c->set_reason("no message on the replication connection");
  {
    v1::JobManagerHeartbeat reply;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Heartbeat(&ctx, beat, &reply).ok());
  }
  clock.advance(2000);
  std::vector<ReportedSourceConnection> now = jm->source_connections();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].task_manager, "tm-raw");
  EXPECT_EQ(now[0].registration_id, resp.registration_id());
  EXPECT_FALSE(now[0].connection.connected);
  EXPECT_EQ(now[0].connection.disconnected_ms, 6000);  // 4000 when sent, 2000 since on the JobManager's clock
  EXPECT_EQ(now[0].connection.reason, "no message on the replication connection");
  // It stops reporting: declared lost at heartbeat.timeout, and its "disconnected" goes with it.
  clock.advance(3000);
  ASSERT_EQ(jm->check_heartbeats().size(), 1u);
  EXPECT_TRUE(jm->source_connections().empty());
}

TEST(ControlPlaneTest, SourceLagsComeWithTheHeartbeatsAndAreForgottenWithTheRegistration) {
  // A TaskExecutor sends what its source_lags hook says with its heartbeats (every 100 ms here).
  const HeartbeatOptions fast{100, 3000};
  auto jm = start_jm(SystemClock::instance(), fast, true);
  ASSERT_TRUE(jm);
  std::atomic<int64_t> lag{-1};
  TaskExecutorOptions o;
  o.jobmanager = jm->target();
  o.slots = 1;
  o.job = kJob;
  o.heartbeat = fast;
  o.backoff = RegistrationBackoff{20, 200};
  o.source_lags = [&lag] { return std::vector<SourceLagReport>{{"kafka", "orders", lag.load()}}; };
  auto made = TaskExecutor::start(o, SystemClock::instance());
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  std::unique_ptr<TaskExecutor> tm = std::move(*made);
  auto reported = [&]() -> int64_t {
    const std::vector<ReportedSourceLag> now = jm->source_lags();
    return now.size() == 1 ? now[0].lag.lag_ms : -2;
  };
  ASSERT_TRUE(eventually([&] { return reported() == -1; }, 5s));  // unknown is reported as such
  lag = 61'234;
  ASSERT_TRUE(eventually([&] { return reported() == 61'234; }, 5s));
  const ReportedSourceLag r = jm->source_lags().at(0);
  EXPECT_EQ(r.task_manager, tm->resource_id());
  EXPECT_EQ(r.lag.source, "kafka");
  EXPECT_EQ(r.lag.description, "orders");
  lag = 0;
  ASSERT_TRUE(eventually([&] { return reported() == 0; }, 5s));
  tm->stop();
  EXPECT_TRUE(jm->source_lags().empty());

  // On a ManualClock over the raw RPC: a heartbeat without lags (a TaskManager of an older build) reports none, and
  // a registration declared lost takes its lag with it.
  ManualClock clock(1'000'000);
  const HeartbeatOptions hb{1000, 5000};
  auto jm2 = start_jm(clock, hb, /*monitor=*/false);
  ASSERT_TRUE(jm2);
  auto stub = jm_stub(jm2->target());
  v1::RegisterTaskManagerResponse resp;
  ASSERT_NO_FATAL_FAILURE(register_raw(*stub, resp));
  v1::TaskManagerHeartbeat beat = raw_heartbeat(resp);
  auto send = [&] {
    v1::JobManagerHeartbeat reply;
    grpc::ClientContext ctx;
    return stub->Heartbeat(&ctx, beat, &reply).ok();
  };
  ASSERT_TRUE(send());
  EXPECT_TRUE(jm2->source_lags().empty());
  v1::SourceLagStatus* l = beat.add_source_lags();
  l->set_source("postgres");
  l->set_description("slot s");
  l->set_lag_ms(7000);
  ASSERT_TRUE(send());
  std::vector<ReportedSourceLag> now = jm2->source_lags();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].task_manager, "tm-raw");
  EXPECT_EQ(now[0].registration_id, resp.registration_id());
  EXPECT_EQ(now[0].lag, (SourceLagReport{"postgres", "slot s", 7000}));
  clock.advance(5001);
  ASSERT_EQ(jm2->check_heartbeats().size(), 1u);
  EXPECT_TRUE(jm2->source_lags().empty());
}

TEST(ControlPlaneTest, HeartbeatsGoOnWhileADeploymentRestoresState) {
  // A deployment that restores a large checkpoint holds the TaskManager's deployment for seconds (512 MiB from S3:
  // 5-7 s); its heartbeats must go on meanwhile, or the JobManager declares it lost after heartbeat.timeout and the
  // job restarts in a loop. The test hook stalls the deployment for 3 heartbeat.timeouts.
  const HeartbeatOptions hb{50, 500};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  StreamEnvironment env;
  env.from_source(datagen::sequence(0, 9), "n")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(std::make_shared<testing::CollectedRecords<int64_t>>()));
  StreamGraph graph = env.stream_graph();
  auto jg = build_job_graph(graph);
  ASSERT_TRUE(jg.ok()) << jg.error().to_string();

  std::mutex mu;
  std::condition_variable cv;
  bool stalled = false;
  bool released = false;
  TaskExecutorOptions o;
  o.jobmanager = jm->target();
  o.slots = 1;
  o.job = kJob;
  o.heartbeat = hb;
  o.backoff = RegistrationBackoff{20, 200};
  o.graph = &graph;
  o.job_graph = &*jg;
  o.on_deploy = [&] {
    std::unique_lock lock(mu);
    stalled = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  };
  auto started = TaskExecutor::start(o, SystemClock::instance());
  ASSERT_TRUE(started.ok()) << started.error().to_string();
  std::unique_ptr<TaskExecutor> tm = std::move(*started);
  ASSERT_TRUE(eventually([&] { return tm->status().registered; }));
  const TaskExecutorStatus registered = tm->status();

  v1::SubmitTasksRequest req;
  req.set_jobmanager_id(registered.jobmanager_id);
  req.set_registration_id(registered.registration_id);
  req.set_attempt(1);
  req.set_self(0);
  v1::TaskManagerPeer* peer = req.add_peers();
  peer->set_resource_id(tm->resource_id());
  peer->set_data_address(tm->data_address());
  for (const JobVertex& v : jg->vertices) {
    for (int i = 0; i < v.parallelism; ++i) {
      v1::SubtaskPlacement* pl = req.add_placement();
      pl->set_vertex_id(v.id);
      pl->set_subtask_index(i);
      pl->set_peer(0);
      pl->set_slot_index(0);
    }
  }
  auto tm_stub =
      v1::TaskManagerService::NewStub(grpc::CreateChannel(tm->rpc_address(), grpc::InsecureChannelCredentials()));
  grpc::Status submitted;
  std::thread deploy([&] {
    grpc::ClientContext ctx;
    v1::Acknowledgement resp;
    submitted = tm_stub->SubmitTasks(&ctx, req, &resp);
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kDeadline, [&] { return stalled; }));
  }
  const TimestampMs stalled_at = SystemClock::instance().now_ms();
  // Heartbeats of the same registration keep arriving for 3 heartbeat.timeouts of the stalled deployment.
  auto last_heartbeat = [&]() -> TimestampMs {
    for (const auto& t : jm->task_managers()) {
      if (t.registration_id == registered.registration_id) return t.last_heartbeat_ms;
    }
    return -1;  // closed: declared lost
  };
  const bool alive = eventually([&] { return last_heartbeat() >= stalled_at + 3 * hb.timeout_ms; }, 10s);
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
  deploy.join();
  EXPECT_TRUE(alive) << "the JobManager's last heartbeat from the registration: " << last_heartbeat()
                     << " (-1: declared lost), the deployment stalled at " << stalled_at;
  EXPECT_TRUE(tm->status().registered);
  EXPECT_EQ(tm->status().registrations, 1);
  EXPECT_TRUE(submitted.ok()) << submitted.error_message();
}

TEST(ControlPlaneTest, TheJobMasterDeploysToEveryTaskManagerAtOnce) {
  // A SubmitTasks returns once its TaskManager restored its subtasks' state (seconds for hundreds of MiB from S3):
  // deployed one after the other, the restores add up. Each TaskManager's deployment hook waits (up to 10 s) until
  // the other TaskManager's deployment has begun too: one after the other, the first would wait out the 10 s while
  // the second had not been called.
  const HeartbeatOptions hb{50, 2000};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  auto records = std::make_shared<testing::CollectedRecords<int64_t>>();
  StreamEnvironment env;
  env.from_source(datagen::sequence(0, 999), "n")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(records))
      .set_parallelism(2);
  StreamGraph graph = env.stream_graph();
  auto jg = build_job_graph(graph);
  ASSERT_TRUE(jg.ok()) << jg.error().to_string();

  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  int met = 0;
  TaskExecutorOptions o;
  o.jobmanager = jm->target();
  o.slots = 1;
  o.job = kJob;
  o.heartbeat = hb;
  o.backoff = RegistrationBackoff{20, 200};
  o.graph = &graph;
  o.job_graph = &*jg;
  o.on_deploy = [&] {
    std::unique_lock lock(mu);
    ++entered;
    cv.notify_all();
    if (cv.wait_for(lock, 10s, [&] { return entered >= 2; })) ++met;
  };
  std::vector<std::unique_ptr<TaskExecutor>> tms;
  for (int i = 0; i < 2; ++i) {
    auto started = TaskExecutor::start(o, SystemClock::instance());
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    tms.push_back(std::move(*started));
  }
  ASSERT_TRUE(eventually([&] { return jm->slots().task_managers == 2; }));

  JobMasterOptions mo;
  mo.job_id = kJob.fingerprint;
  mo.job_name = "parallel-deployment";
  mo.slot_request_timeout_ms = 20'000;
  auto master = std::make_shared<JobMaster>(mo, *jg, *jm, SystemClock::instance());
  const auto started = std::chrono::steady_clock::now();
  master->start();
  const JobResult result = master->wait();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  std::printf("both deployments under way at once: %d of 2; the job took %lld ms\n", met,
              static_cast<long long>(took.count()));
  EXPECT_EQ(result.status, JobStatus::kFinished) << (result.error ? result.error->to_string() : "");
  EXPECT_EQ(met, 2) << "a TaskManager's deployment began only after the other's had ended";
  EXPECT_LT(took, 10s);
  EXPECT_EQ(records->all().size(), 1000u);
}

TEST(ControlPlaneTest, ADifferentJobGraphIsRefusedAndTheTaskManagerStops) {
  const HeartbeatOptions hb{50, 2000};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  JobGraphIdentity other{"fedcba9876543210fedcba9876543210", "job", "0.1.0"};
  auto tm = start_tm(jm->target(), 2, hb, other);
  ASSERT_TRUE(tm);
  Status st = tm->wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kGraph);
  EXPECT_NE(st.error().message().find(kJob.fingerprint), std::string::npos) << st.error().message();
  EXPECT_NE(st.error().message().find(other.fingerprint), std::string::npos) << st.error().message();
  EXPECT_EQ(jm->slots().task_managers, 0);
}

TEST(ControlPlaneTest, ManualClockDeclaresASilentTaskManagerLostAndRefusesItsStaleRegistration) {
  ManualClock clock(1'000'000);
  const HeartbeatOptions hb{1000, 5000};
  auto jm = start_jm(clock, hb, /*monitor=*/false);
  ASSERT_TRUE(jm);
  auto stub = jm_stub(jm->target());
  v1::RegisterTaskManagerRequest req;
  req.set_resource_id("tm-raw");
  req.set_rpc_address("127.0.0.1:1");
  req.set_slots(4);
  req.mutable_job()->set_fingerprint(kJob.fingerprint);
  req.mutable_job()->set_job_name(kJob.job_name);
  req.mutable_job()->set_build_version(kJob.build_version);
  v1::RegisterTaskManagerResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->RegisterTaskManager(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.heartbeat_timeout_ms(), 5000);
  EXPECT_EQ(resp.jobmanager_id(), jm->jobmanager_id());
  clock.advance(4999);
  EXPECT_TRUE(jm->check_heartbeats().empty());
  clock.advance(1);
  auto lost = jm->check_heartbeats();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].registration.resource_id, "tm-raw");
  EXPECT_EQ(jm->slots().slots_total, 0);

  v1::TaskManagerHeartbeat beat;
  beat.set_registration_id(resp.registration_id());
  beat.set_resource_id("tm-raw");
  beat.mutable_slot_report()->set_slots_total(4);
  beat.mutable_slot_report()->set_slots_free(4);
  v1::JobManagerHeartbeat reply;
  grpc::ClientContext ctx;
  grpc::Status st = stub->Heartbeat(&ctx, beat, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("no heartbeat for 5000 ms"), std::string::npos) << st.error_message();
  EXPECT_EQ(jm->slots().task_managers, 0);
}

TEST(ControlPlaneTest, TaskManagerDeclaresALostJobManagerAndRegistersWithItsSuccessor) {
  const HeartbeatOptions hb{50, 500};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  const int port = jm->port();
  auto tm = start_tm(jm->target(), 2, hb);
  ASSERT_TRUE(tm);
  ASSERT_TRUE(eventually([&] { return tm->status().registered; }));
  const std::string first = tm->status().registration_id;
  jm->stop();
  jm.reset();
  ASSERT_TRUE(eventually([&] { return tm->status().jobmanager_losses >= 1 && tm->status().failed_attempts >= 2; }))
      << "losses " << tm->status().jobmanager_losses << ", failed attempts " << tm->status().failed_attempts;
  EXPECT_FALSE(tm->status().registered);
  auto successor = start_jm(SystemClock::instance(), hb, true, port);
  ASSERT_TRUE(successor);
  ASSERT_TRUE(eventually([&] { return successor->slots().task_managers == 1; }));
  EXPECT_TRUE(eventually([&] { return tm->status().registered; }));
  EXPECT_NE(tm->status().registration_id, first);
  EXPECT_EQ(tm->status().jobmanager_id, successor->jobmanager_id());
  EXPECT_GE(tm->status().registrations, 2);
}

TEST(ControlPlaneTest, UnservedCallsAnswerUnimplementedAndCheckpointCallsCheckTheirCaller) {
  const HeartbeatOptions hb{50, 2000};
  auto jm = start_jm(SystemClock::instance(), hb, true);
  ASSERT_TRUE(jm);
  auto stub = jm_stub(jm->target());
  {
    grpc::ClientContext ctx;
    v1::OfferSlotsRequest req;
    v1::OfferSlotsResponse resp;
    grpc::Status st = stub->OfferSlots(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    EXPECT_NE(st.error_message().find("does not serve it yet"), std::string::npos) << st.error_message();
  }
  {
    // A checkpoint acknowledgement needs its subtask, and one from a registration the JobManager does not know
    // is refused.
    grpc::ClientContext ctx;
    v1::AcknowledgeCheckpointRequest req;
    v1::Acknowledgement resp;
    EXPECT_EQ(stub->AcknowledgeCheckpoint(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    grpc::ClientContext ctx2;
    req.mutable_subtask()->set_vertex_id(0);
    req.set_registration_id("not-registered");
    grpc::Status st = stub->AcknowledgeCheckpoint(&ctx2, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(st.error_message().find("not known to this JobManager"), std::string::npos) << st.error_message();
  }
  auto tm = start_tm(jm->target(), 1, hb);
  ASSERT_TRUE(tm);
  auto tm_stub =
      v1::TaskManagerService::NewStub(grpc::CreateChannel(tm->rpc_address(), grpc::InsecureChannelCredentials()));
  {
    // A checkpoint trigger from a JobManager this TaskManager is not registered with is refused.
    grpc::ClientContext ctx;
    v1::TriggerCheckpointRequest req;
    req.set_jobmanager_id("not-this-one");
    v1::TriggerCheckpointResponse resp;
    grpc::Status st = tm_stub->TriggerCheckpoint(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(st.error_message().find("not 'not-this-one'"), std::string::npos) << st.error_message();
  }
  // A deployment from a JobManager this TaskManager is not registered with is refused as stale.
  grpc::ClientContext ctx;
  v1::SubmitTasksRequest req;
  req.set_jobmanager_id("not-this-one");
  v1::Acknowledgement resp;
  grpc::Status st = tm_stub->SubmitTasks(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("the deployment is stale"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace sluice
