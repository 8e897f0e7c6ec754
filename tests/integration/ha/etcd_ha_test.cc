// Leader election, the HA store and fencing against a real three-member etcd 3.4 cluster (scripts/services/etcd,
// started privately for this binary with its own SLUICE_SERVICES_DIR, because the tests stop and restart members).
// Contenders are child processes (etcd_ha_contender) that are SIGKILLed and SIGSTOPped as a JobManager would be.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integration/test_util/child_process.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/private_etcd.h"
#include "integration/test_util/private_kafka.h"  // run_command
#include "integration/test_util/services.h"       // unique_name
#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_store.h"
#include "sluice/cluster/ha/leader_election.h"

namespace sluice::ha {
namespace {

using namespace std::chrono_literals;
using sluice::testing::ChildProcess;
using sluice::testing::poll_until;
using sluice::testing::run_command;

using sluice::testing::PrivateEtcd;

PrivateEtcd* etcd = nullptr;

class EtcdHaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (etcd == nullptr) etcd = new PrivateEtcd();  // kept for the whole binary; stopped at exit below
  }
  void SetUp() override {
    ASSERT_FALSE(etcd->endpoints().empty()) << "the private etcd cluster did not start";
    auto eps = parse_etcd_endpoints(etcd->endpoints());
    ASSERT_TRUE(eps.ok());
    ASSERT_EQ(eps->size(), 3U);
    auto c = EtcdClient::create(EtcdClientOptions{*eps, 2000ms, 1000ms});
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
    cluster_id_ = sluice::testing::unique_name("ha");
  }

  std::unique_ptr<ChildProcess> contender(const std::string& address, int ttl_s, int write_interval_ms = 100) {
    return std::make_unique<ChildProcess>(
        SLUICE_HA_CONTENDER, std::vector<std::string>{etcd->endpoints(), cluster_id_, address, std::to_string(ttl_s),
                                                      std::to_string(write_interval_ms)});
  }

  static std::vector<std::string> lines_starting(const std::string& out, const std::string& prefix) {
    std::vector<std::string> found;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(prefix, 0) == 0) found.push_back(line);
    return found;
  }
  static bool has_line(ChildProcess& p, const std::string& prefix) { return !lines_starting(p.out(), prefix).empty(); }
  static int64_t last_applied(ChildProcess& p) {
    auto l = lines_starting(p.out(), "APPLIED ");
    return l.empty() ? 0 : std::stoll(l.back().substr(8));
  }

  std::optional<LeaderInfo> leader() {
    auto l = read_leader(*client_, HaKeys(cluster_id_).leader());
    EXPECT_TRUE(l.ok()) << l.error().to_string();
    return l.ok() ? *l : std::nullopt;
  }

  std::unique_ptr<EtcdClient> client_;
  std::string cluster_id_;
};

// The client's own operations on the real cluster: put/get/prefix, a transaction's both branches, leases.
TEST_F(EtcdHaTest, ClientSpeaksTheV3GatewayKvTxnAndLeases) {
  const std::string k = "/sluice-test/" + cluster_id_ + "/a";
  auto rev = client_->put(k, std::string("v\0\xff", 3));
  ASSERT_TRUE(rev.ok()) << rev.error().to_string();
  auto got = client_->get(k);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, std::string("v\0\xff", 3));
  EXPECT_EQ((*got)->create_revision, *rev);
  ASSERT_TRUE(client_->put(k + "b", "w").ok());
  auto all = client_->get_prefix("/sluice-test/" + cluster_id_ + "/");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2U);
  auto t = client_->txn({EtcdCompare{k, EtcdCompare::Target::kCreateRevision, EtcdCompare::Op::kEqual, 0, {}}},
                        {EtcdOp::put(k, "x")}, {EtcdOp::range(k)});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_FALSE(t->succeeded);
  ASSERT_EQ(t->ranges.size(), 1U);
  ASSERT_EQ(t->ranges[0].size(), 1U);
  auto lease = client_->grant_lease(2s);
  ASSERT_TRUE(lease.ok()) << lease.error().to_string();
  EXPECT_EQ(lease->ttl_s, 2);
  ASSERT_TRUE(client_->put(k + "l", "leased", lease->id).ok());
  auto ka = client_->keep_alive_once(lease->id);
  ASSERT_TRUE(ka.ok()) << ka.error().to_string();
  EXPECT_EQ(*ka, 2);
  ASSERT_TRUE(client_->revoke_lease(lease->id).ok());
  auto gone = client_->get(k + "l");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value()) << "a revoked lease deletes its keys";
  auto ka2 = client_->keep_alive_once(lease->id);
  ASSERT_TRUE(ka2.ok()) << ka2.error().to_string();
  EXPECT_EQ(*ka2, 0) << "keep-alive of a revoked lease reports TTL 0";
  auto bad = client_->put(k, "v", 12345);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("lease not found"), std::string::npos) << bad.error().message();
}

// In one process: the epoch of a resigned leader is fenced; the next leader's writes apply; the pointer never goes
// back.
TEST_F(EtcdHaTest, WritesWithAFormerLeadersEpochAreFenced) {
  const HaKeys keys(cluster_id_);
  EtcdHaStore store(*client_, keys);
  LeaderElectionOptions o{keys.leader(), "jm-a:6123", 5s, 50ms, {}};
  EtcdLeaderElection a(*client_, o);
  auto ea = a.campaign(10s);
  ASSERT_TRUE(ea.ok() && ea->has_value());
  EXPECT_TRUE(a.is_leader());
  auto w = store.put_job(**ea, HaJobRecord{"j1", "name", "pipeline: {}", "pipeline"}, "RUNNING");
  ASSERT_TRUE(w.ok() && *w == FencedWrite::kApplied);
  w = store.set_latest_checkpoint(**ea, "j1", CheckpointPointer{7, "file:///c/chk-7", 1, 0});
  ASSERT_TRUE(w.ok() && *w == FencedWrite::kApplied);
  auto back = store.set_latest_checkpoint(**ea, "j1", CheckpointPointer{6, "file:///c/chk-6", 1, 0});
  ASSERT_FALSE(back.ok()) << "the pointer moved back";
  auto none = store.attempt("j1");
  ASSERT_TRUE(none.ok()) << none.error().to_string();
  EXPECT_FALSE(none->has_value());
  for (int n : {0, 1, 2, 2}) {  // the same attempt again applies (a retry after a lost answer)
    auto a_w = store.set_attempt(**ea, "j1", n);
    ASSERT_TRUE(a_w.ok() && *a_w == FencedWrite::kApplied) << n;
  }
  auto attempt_back = store.set_attempt(**ea, "j1", 1);
  ASSERT_FALSE(attempt_back.ok()) << "the attempt went back";

  o.address = "jm-b:6123";
  EtcdLeaderElection b(*client_, o);
  auto not_yet = b.campaign(300ms);
  ASSERT_TRUE(not_yet.ok());
  EXPECT_FALSE(not_yet->has_value()) << "two leaders at once";
  ASSERT_TRUE(a.resign().ok());
  auto eb = b.campaign(10s);
  ASSERT_TRUE(eb.ok() && eb->has_value());
  EXPECT_GT((*eb)->create_revision, (*ea)->create_revision) << "epochs increase";
  auto l = leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->address, "jm-b:6123");
  EXPECT_EQ(l->epoch, **eb);

  auto fenced = store.set_latest_checkpoint(**ea, "j1", CheckpointPointer{8, "file:///c/chk-8", 1, 0});
  ASSERT_TRUE(fenced.ok()) << fenced.error().to_string();
  EXPECT_EQ(*fenced, FencedWrite::kFenced);
  auto fenced_status = store.set_job_status(**ea, "j1", "CANCELED");
  ASSERT_TRUE(fenced_status.ok());
  EXPECT_EQ(*fenced_status, FencedWrite::kFenced);
  auto applied = store.set_latest_checkpoint(**eb, "j1", CheckpointPointer{8, "file:///c/chk-8", 1, 0});
  ASSERT_TRUE(applied.ok() && *applied == FencedWrite::kApplied);
  auto fenced_attempt = store.set_attempt(**ea, "j1", 7);
  ASSERT_TRUE(fenced_attempt.ok()) << fenced_attempt.error().to_string();
  EXPECT_EQ(*fenced_attempt, FencedWrite::kFenced);
  auto last = store.attempt("j1");
  ASSERT_TRUE(last.ok() && last->has_value());
  EXPECT_EQ(**last, 2) << "a former leader's attempt was recorded";
  auto next_attempt = store.set_attempt(**eb, "j1", **last + 1);
  ASSERT_TRUE(next_attempt.ok() && *next_attempt == FencedWrite::kApplied);

  auto p = store.latest_checkpoint("j1");
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ((*p)->checkpoint_id, 8);
  EXPECT_EQ((*p)->external_path, "file:///c/chk-8");
  EXPECT_EQ((*p)->leader_epoch, (*eb)->create_revision);
  auto status = store.job_status("j1");
  ASSERT_TRUE(status.ok() && status->has_value());
  EXPECT_EQ(**status, "RUNNING");
  auto job = store.job("j1");
  ASSERT_TRUE(job.ok() && job->has_value());
  EXPECT_EQ((*job)->graph, "pipeline: {}");
  auto ids = store.job_ids();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{"j1"});
  ASSERT_TRUE(store.remove_job(**eb, "j1").ok());
  ids = store.job_ids();
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
  auto removed_attempt = store.attempt("j1");
  ASSERT_TRUE(removed_attempt.ok());
  EXPECT_FALSE(removed_attempt->has_value());
}

// Two contender processes: exactly one leads, and etcd publishes its address.
TEST_F(EtcdHaTest, OneOfTwoContenderProcessesIsElected) {
  auto a = contender("jm-a:1", 3);
  auto b = contender("jm-b:1", 3);
  ASSERT_TRUE(poll_until([&] { return has_line(*a, "ELECTED") || has_line(*b, "ELECTED"); }, 30s))
      << a->err() << b->err();
  ChildProcess& winner = has_line(*a, "ELECTED") ? *a : *b;
  ChildProcess& standby = &winner == a.get() ? *b : *a;
  ASSERT_TRUE(poll_until([&] { return last_applied(winner) >= 5; }, 30s)) << winner.out() << winner.err();
  EXPECT_FALSE(has_line(standby, "ELECTED")) << "both contenders were elected:\n" << standby.out();
  auto l = leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->address, &winner == a.get() ? "jm-a:1" : "jm-b:1");
}

// kill -9 of the leader: the standby leads within TTL + 2 s and resumes after the leader's last pointer.
TEST_F(EtcdHaTest, StandbyLeadsWithinTtlPlusTwoSecondsAfterTheLeaderIsKilled) {
  constexpr int kTtl = 3;
  auto a = contender("jm-a:2", kTtl);
  ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= 3; }, 30s)) << a->out() << a->err();
  auto b = contender("jm-b:2", kTtl);
  // The standby is campaigning once it has read the leader key at least once; give it a moment without a signal.
  ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= 6; }, 30s));
  EXPECT_FALSE(has_line(*b, "ELECTED"));
  const auto killed = std::chrono::steady_clock::now();
  a->signal(SIGKILL);
  ASSERT_TRUE(poll_until([&] { return has_line(*b, "ELECTED"); }, 30s)) << b->out() << b->err();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed);
  std::printf("failover: leader SIGKILLed -> standby elected in %lld ms (TTL %d s)\n",
              static_cast<long long>(took.count()), kTtl);
  EXPECT_LE(took, std::chrono::milliseconds(kTtl * 1000 + 2000));
  a->wait(10s);
  const int64_t a_last = last_applied(*a);
  const auto elected = lines_starting(b->out(), "ELECTED ");
  ASSERT_EQ(elected.size(), 1U);
  std::istringstream fields(elected[0].substr(8));
  int64_t rev = 0;
  std::string lease;
  int64_t first = 0;
  fields >> rev >> lease >> first;
  // The new leader resumes after the latest completed checkpoint: a_last, or one more when the killed leader's last
  // write committed before it could print APPLIED.
  EXPECT_GE(first, a_last + 1);
  EXPECT_LE(first, a_last + 2);
  ASSERT_TRUE(poll_until([&] { return last_applied(*b) >= first + 2; }, 30s)) << b->out();
  auto l = leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->address, "jm-b:2");
}

// A leader SIGSTOPped past its TTL wakes up still believing it leads: its next pointer write is refused by etcd
// (fenced), it learns it lost leadership, and the pointer holds only the new leader's writes.
TEST_F(EtcdHaTest, APausedLeaderThatWakesAfterItsTtlIsFenced) {
  constexpr int kTtl = 3;
  auto a = contender("jm-a:3", kTtl);
  ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= 3; }, 30s)) << a->out() << a->err();
  auto b = contender("jm-b:3", kTtl);
  ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= 6; }, 30s));
  a->signal(SIGSTOP);
  ASSERT_TRUE(poll_until([&] { return has_line(*b, "ELECTED"); }, 30s)) << b->out() << b->err();
  const std::string elected = lines_starting(b->out(), "ELECTED ").at(0);
  const int64_t b_first = std::stoll(elected.substr(elected.rfind(' ') + 1));
  ASSERT_TRUE(poll_until([&] { return last_applied(*b) >= b_first + 5; }, 30s)) << b->out();
  a->signal(SIGCONT);
  ASSERT_TRUE(poll_until([&] { return has_line(*a, "LOST"); }, 30s)) << a->out() << a->err();
  const std::string out = a->out();
  EXPECT_EQ(lines_starting(out, "FENCED ").size(), 1U) << out;
  // No write of the former leader applied once the new one was elected (its ids start at b_first).
  EXPECT_LT(last_applied(*a), b_first) << "the former leader moved the pointer after its lease expired:\n" << out;
  std::printf("paused leader on waking: %s\n", lines_starting(out, "LOST ").at(0).c_str());
  // The former leader is a standby again: it does not lead while b renews.
  const int64_t b_now = last_applied(*b);
  ASSERT_TRUE(poll_until([&] { return last_applied(*b) >= b_now + 5; }, 30s));
  EXPECT_EQ(lines_starting(a->out(), "ELECTED ").size(), 1U);
  const HaKeys keys(cluster_id_);
  EtcdHaStore store(*client_, keys);
  auto p = store.latest_checkpoint("job-1");
  ASSERT_TRUE(p.ok() && p->has_value());
  auto l = leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->address, "jm-b:3");
  EXPECT_EQ((*p)->leader_epoch, l->epoch.create_revision);
}

// One etcd member restarted (SIGTERM, then SIGKILL of another) mid-run: the leader keeps leading (its keep-alives
// and writes fail over to the other members); never two leaders; writes go on.
TEST_F(EtcdHaTest, TheLeaderKeepsLeadingWhileOneEtcdMemberRestarts) {
  constexpr int kTtl = 3;
  auto a = contender("jm-a:4", kTtl);
  ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= 3; }, 30s)) << a->out() << a->err();
  auto b = contender("jm-b:4", kTtl);
  for (const char* action : {"member-restart 0", "member-kill 1", "member-start 1", "member-restart 2"}) {
    const int64_t before = last_applied(*a);
    etcd->script(action);
    ASSERT_TRUE(poll_until([&] { return last_applied(*a) >= before + 3 || has_line(*b, "ELECTED"); }, 30s))
        << action << "\n"
        << a->out() << a->err();
  }
  EXPECT_FALSE(has_line(*a, "LOST")) << a->out();
  EXPECT_FALSE(has_line(*b, "ELECTED")) << b->out();
  EXPECT_TRUE(lines_starting(a->out(), "FENCED").empty());
  auto l = leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->address, "jm-a:4");
}

// `sluice ha status` prints the leader and what the HA store holds, as an operator reads it.
TEST_F(EtcdHaTest, SluiceHaStatusPrintsTheLeaderAndTheStoredJobs) {
  const HaKeys keys(cluster_id_);
  EtcdHaStore store(*client_, keys);
  auto none = sluice::testing::run_to_end(
      SLUICE_BINARY, {"ha", "status", "--endpoints", etcd->endpoints(), "--cluster-id", cluster_id_});
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out, "leader: none\njobs: none\n");
  EtcdLeaderElection e(*client_, LeaderElectionOptions{keys.leader(), "jm-a:6123", 5s, 50ms, {}});
  auto epoch = e.campaign(10s);
  ASSERT_TRUE(epoch.ok() && epoch->has_value());
  ASSERT_TRUE(store.put_job(**epoch, HaJobRecord{"j7", "payments", "pipeline: {}", "pipeline"}, "RUNNING").ok());
  ASSERT_TRUE(store.set_latest_checkpoint(**epoch, "j7", CheckpointPointer{12, "file:///c/j7/chk-12", 1, 0}).ok());
  ASSERT_TRUE(store.set_attempt(**epoch, "j7", 3).ok());
  auto r = sluice::testing::run_to_end(SLUICE_BINARY,
                                       {"ha", "status", "--endpoints", etcd->endpoints(), "--cluster-id", cluster_id_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("leader: jm-a:6123 (epoch " + std::to_string((*epoch)->create_revision)), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("job j7 (payments): status RUNNING, latest checkpoint 12 at file:///c/j7/chk-12 (written by "
                       "epoch " +
                       std::to_string((*epoch)->create_revision) + "), deployment attempt 3\n"),
            std::string::npos)
      << r.out;
  auto down = sluice::testing::run_to_end(SLUICE_BINARY, {"ha", "status", "--endpoints", "http://127.0.0.1:1"});
  EXPECT_EQ(down.code, 2);
  EXPECT_NE(down.err.find("no endpoint answered"), std::string::npos) << down.err;
}

// The HA options of the cluster commands are checked (the HA runs themselves are in
// tests/chaos/jobmanager_ha_test.cc): a TaskManager with HA finds the leader through etcd and takes no
// --jobmanager, one without HA needs it; an unknown type or a misspelt key is named; `sluice run` refuses HA.
TEST_F(EtcdHaTest, ClusterCommandsCheckHighAvailabilityOptions) {
  // A pipeline of its own: the quickstart's files source needs examples/data/payments, which only its generator
  // writes, and the checks below must not depend on whether someone ran the quickstart in this checkout.
  const std::string pipeline = "/tmp/sluice-ha-options-" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(pipeline) << "pipeline: { name: ha-options }\nsource: { type: datagen, count: 10 }\n"
                             "sink: { out: { type: print } }\n";
  const std::vector<std::string> ha = {"-D", "high-availability.type=etcd", "-D",
                                       "high-availability.etcd.endpoints=" + etcd->endpoints()};
  std::vector<std::string> tm = {"taskmanager", pipeline, "--jobmanager", "127.0.0.1:1"};
  tm.insert(tm.end(), ha.begin(), ha.end());
  auto r = sluice::testing::run_to_end(SLUICE_BINARY, tm);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--jobmanager is not used with high-availability.type: etcd"), std::string::npos) << r.err;
  r = sluice::testing::run_to_end(SLUICE_BINARY, {"taskmanager", pipeline});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--jobmanager HOST:PORT is required"), std::string::npos) << r.err;
  r = sluice::testing::run_to_end(SLUICE_BINARY, {"jobmanager", pipeline, "--rpc-port", "0", "--rest-port", "-1", "-D",
                                                  "high-availability.type=zookeeper"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("high-availability.type: 'zookeeper' is not supported"), std::string::npos) << r.err;
  // A misspelt HA key is named, not ignored (HA keys are not engine options, so nothing else would warn).
  r = sluice::testing::run_to_end(SLUICE_BINARY, {"jobmanager", pipeline, "--rpc-port", "0", "--rest-port", "-1", "-D",
                                                  "high-availability.typ=etcd"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("-D high-availability.typ: unknown high-availability option (known: high-availability.type"),
            std::string::npos)
      << r.err;
  // `sluice run` (one process, no standby) refuses HA options too, before it starts anything; `none` is accepted.
  std::vector<std::string> run = {"run", pipeline};
  run.insert(run.end(), ha.begin(), ha.end());
  r = sluice::testing::run_to_end(SLUICE_BINARY, run);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("-D high-availability.type: high availability is for a cluster's JobManagers"),
            std::string::npos)
      << r.err;
  {
    const std::string file = "/tmp/sluice-ha-none-" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(file) << "pipeline: { name: ha-none }\nsource: { type: datagen, count: 10 }\n"
                           "sink: { out: { type: print } }\n";
    r = sluice::testing::run_to_end(SLUICE_BINARY, {"validate", file, "-D", "high-availability.type=none"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    r = sluice::testing::run_to_end(SLUICE_BINARY, {"validate", file, "-D", "high-availability.type=etcd"});
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    std::remove(file.c_str());
  }
  // A TaskManager given a JobManager address that is no HOST:PORT exits 2 at once instead of registering forever.
  for (const std::string bad : {"nohost", "127.0.0.1:99999", "127.0.0.1:", ":6123"}) {
    r = sluice::testing::run_to_end(SLUICE_BINARY, {"taskmanager", pipeline, "--jobmanager", bad});
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("--jobmanager '" + bad + "' is not HOST:PORT"), std::string::npos) << r.err;
  }
  // A missing required flag is exit code 2 like every malformed command line (not CLI11's 106).
  r = sluice::testing::run_to_end(SLUICE_BINARY, {"ha", "status"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--endpoints is required"), std::string::npos) << r.err;
  std::remove(pipeline.c_str());
}

}  // namespace
}  // namespace sluice::ha

// The private etcd cluster outlives every test; stop it when the binary ends.
namespace {
struct StopEtcdAtExit {
  ~StopEtcdAtExit() {
    delete sluice::ha::etcd;
    sluice::ha::etcd = nullptr;
  }
} stop_etcd_at_exit;
}  // namespace
