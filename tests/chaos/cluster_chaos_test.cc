// The chaos suite with a data-level check (issue 15 item 5): a cluster of real processes under a seeded schedule
// of faults, its output read back as a consumer reads it.
//
// The cluster: two `sluice jobmanager`s (high-availability.type: etcd, lease TTL 3 s) on a private three-member
// etcd (test_util/private_etcd.h), three `sluice taskmanager`s of one slot each that find the leader through etcd,
// checkpoints every 500 ms on a private S3 server (moto, test_util/s3.h) and the output in a private Kafka broker
// (test_util/private_kafka.h). All three services are this binary's own: the schedule restarts and pauses them,
// which must never happen to the shared instances other tests use.
//
// The workload: datagen (entity i % 97 gets revision i / 97, so every key has the sequence 0, 1, 2, ...) ->
// transform keyed by entity (pipeline.entity-version: keyed state counting each entity's events) -> Kafka, once
// with delivery exactly-once and once with at-least-once.
//
// The schedule (std::mt19937_64 from the printed seed): rounds of every fault kind in a seeded order: kill -9 of
// the leader JobManager (restarted as the new standby), of the standby, of one, two or all three TaskManagers
// (restarted), a SIGSTOP of the leader until the standby has taken over (then SIGCONT: it must exit without
// completing a checkpoint; restarted), a restart (or kill + start) of one etcd member of three, a restart of the
// Kafka broker, and the S3 server paused (SIGSTOP) for 3-10 s. After each fault the test waits, with a deadline, for
// the cluster to be healthy again: a leader, a standby campaigning, the job RUNNING again when the fault restarted
// it, and a checkpoint completed after that. Each fault is logged with its time and recovery time. Faults stop
// when the schedule is done or the source is near its end; then the bounded source finishes (the leader exits 0,
// FINISHED in etcd) and the checker reads the topic read_committed: compare_sequences against the exact expected
// per-key sequences (nothing lost in both modes, no duplicate with exactly-once, every key in order) and
// `sluice verify` on the same topic (its report asserted). A summary line gives the figures.
//
// CI runs the short version: 6 faults exactly-once, 4 at-least-once (the two tests take the first ten of the same
// seeded sequence, so each CI run covers every kind), about 1.5-2 minutes per test with the services' start. By
// hand: SLUICE_CHAOS_FAULTS=N (faults per test) or SLUICE_CHAOS_SCALE=F (multiplies the faults); the source's
// record count grows with the fault count. SLUICE_TEST_SEED replays a schedule; SLUICE_TEST_LOGS=1 keeps every
// process's log of a passing run (a failing one's are always kept). Needs S3_SERVER_BIN
// (scripts/services/run-with s3 -- ...); Kafka, etcd and moto are started privately.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "cluster/cluster_harness.h"
#include "integration/test_util/child_process.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/private_etcd.h"
#include "integration/test_util/private_kafka.h"
#include "integration/test_util/s3.h"
#include "integration/test_util/services.h"
#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_store.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using Clock = std::chrono::steady_clock;

constexpr int64_t kEntities = 97;
constexpr int64_t kRate = 1000;  // records per second
constexpr int kTaskManagers = 3;
constexpr int kPartitions = 4;
constexpr int kLeaseTtlS = 3;
constexpr auto kRecoveryDeadline = 150s;
// The source's length is planned from the fault count: this many seconds of records per fault, plus kTailSeconds.
constexpr int64_t kSecondsPerFault = 8;
constexpr int64_t kTailSeconds = 30;
// No fault starts once fewer than this many seconds of records are left to read back: the rest of the run shows
// the job RUNNING with checkpoints completing after the last fault.
constexpr int64_t kLastFaultSecondsLeft = 25;

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

enum class Fault {
  kKillLeader,
  kKillStandby,
  kKillOneTaskManager,
  kKillTwoTaskManagers,
  kKillAllTaskManagers,
  kPauseLeader,
  kRestartEtcdMember,
  kRestartKafka,
  kPauseS3,
};
constexpr int kFaultKinds = 9;

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKillLeader:
      return "kill -9 leader JobManager";
    case Fault::kKillStandby:
      return "kill -9 standby JobManager";
    case Fault::kKillOneTaskManager:
      return "kill -9 one TaskManager";
    case Fault::kKillTwoTaskManagers:
      return "kill -9 two TaskManagers";
    case Fault::kKillAllTaskManagers:
      return "kill -9 all TaskManagers";
    case Fault::kPauseLeader:
      return "SIGSTOP leader past its lease";
    case Fault::kRestartEtcdMember:
      return "restart one etcd member";
    case Fault::kRestartKafka:
      return "restart the Kafka broker";
    case Fault::kPauseS3:
      return "S3 server paused";
  }
  return "?";
}

/// The seeded fault sequence: rounds of every kind, each round in a seeded order, so any `kFaultKinds`
/// consecutive faults from a round's start cover every kind.
std::vector<Fault> fault_sequence(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<Fault> out;
  while (out.size() < n) {
    std::vector<Fault> round;
    for (int k = 0; k < kFaultKinds; ++k)
      round.push_back(static_cast<Fault>(k));
    std::shuffle(round.begin(), round.end(), rng);
    out.insert(out.end(), round.begin(), round.end());
  }
  out.resize(n);
  return out;
}

/// Faults per test: SLUICE_CHAOS_FAULTS, else `ci` times SLUICE_CHAOS_SCALE.
size_t fault_budget(size_t ci) {
  if (const char* s = std::getenv("SLUICE_CHAOS_FAULTS"); s != nullptr && *s != '\0') return std::stoul(s);
  return static_cast<size_t>(static_cast<double>(ci) * chaos::chaos_scale() + 0.5);
}

struct FaultRecord {
  Fault kind;
  double at_s = 0;          // since the job started
  int64_t duration_ms = 0;  // how long the fault itself lasted (a pause, a restart), 0 for a kill
  int64_t recovery_ms = 0;  // from the fault's start to the cluster healthy again
  std::string detail;
};

// The private services, started once per test binary process and stopped after its last test.
PrivateEtcd* etcd = nullptr;
PrivateKafka* kafka = nullptr;
PrivateS3Server* s3 = nullptr;

class ClusterChaosTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // moto accepts any key; every child inherits these (the S3 client signs with them).
    ::setenv("AWS_ACCESS_KEY_ID", "sluice-chaos-key", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "sluice-chaos-secret", 1);
    if (etcd == nullptr) etcd = new PrivateEtcd();
    if (kafka == nullptr) kafka = new PrivateKafka();
    const char* bin = std::getenv("S3_SERVER_BIN");
    if (s3 == nullptr && bin != nullptr && *bin != '\0') {
      s3 = new PrivateS3Server(bin);
      if (!s3->start(0, "chaos")) {
        delete s3;
        s3 = nullptr;
      }
    }
  }

  static void TearDownTestSuite() {
    delete s3;
    s3 = nullptr;
    delete kafka;
    kafka = nullptr;
    delete etcd;
    etcd = nullptr;
  }

  void SetUp() override {
    sluice::testing::require_service("s3");  // for S3_SERVER_BIN, the moto server started privately above
    ASSERT_NE(s3, nullptr) << "the private S3 server (S3_SERVER_BIN) did not start";
    ASSERT_FALSE(etcd->endpoints().empty()) << "the private etcd cluster did not start";
    ASSERT_FALSE(kafka->bootstrap().empty()) << "the private Kafka broker did not start";
    seed_ = sluice::testing::test_seed();
    rng_.seed(seed_ ^ 0x5eed);
    cluster_id_ = sluice::testing::unique_name("chaos");
    dir_ = chaos::make_test_dir("sluice-cluster-chaos");
    auto eps = ha::parse_etcd_endpoints(etcd->endpoints());
    ASSERT_TRUE(eps.ok());
    auto c = ha::EtcdClient::create(ha::EtcdClientOptions{*eps, 2000ms, 1000ms});
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }

  void TearDown() override {
    const bool failed = HasFailure();
    // SLUICE_TEST_LOGS keeps the logs of a run that passed too (a slow recovery in a long run by hand).
    const bool keep = failed || std::getenv("SLUICE_TEST_LOGS") != nullptr;
    if (keep) {
      // Every process's whole output into the kept test directory; on failure the current ones' tails on stderr.
      int n = 0;
      for (const auto& p : all_)
        std::ofstream(dir_ / fmt::format("{:02d}-{}-{}.log", n++, p->role(), p->pid())) << p->output();
      std::cerr << "logs of all " << all_.size() << " processes in " << dir_.string() << "\n";
      if (failed) std::cerr << tails();
    }
    all_.clear();
    chaos::keep_or_remove(dir_, keep);
  }

  // ---- the cluster -----------------------------------------------------------------------------------------

  void write_pipeline(const std::string& delivery, int64_t count) {
    topic_ = tk::unique_topic("chaos-" + delivery);
    ASSERT_TRUE(tk::create_topic(kafka->bootstrap(), topic_, kPartitions));
    file_ = (dir_ / "chaos.yaml").string();
    std::ofstream f(file_);
    f << "pipeline:\n  name: cluster-chaos\n  parallelism: " << kTaskManagers << "\n  delivery: " << delivery << "\n"
      << "  entity-version: true\n"
      << "  checkpoint: { interval: 500ms, storage: \"s3://chaos/" << cluster_id_ << "\" }\n"
      << "  restart: { strategy: fixed-delay, attempts: 100000, delay: 500ms }\n"
      << "  config:\n"
      << "    s3.endpoint: \"" << s3->endpoint() << "\"\n"
      << "    s3.path-style-access: true\n"
      << "    s3.request-timeout: 2s\n"
      << "    s3.max-attempts: 3\n"
      << "    execution.checkpointing.timeout: 30s\n"
      << "    execution.checkpointing.tolerable-failed-checkpoints: 20\n"
      << "source: { type: datagen, count: " << count << ", rate: " << kRate << ", entities: " << kEntities
      << ", seed: " << (seed_ % 1'000'000) << " }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: kafka\n    bootstrap-servers: \"" << kafka->bootstrap() << "\"\n"
      << "    topic: " << topic_ << "\n    transactional-id-prefix: " << topic_ << "\n"
      << "    properties: { transaction.timeout.ms: \"120000\" }\n";
  }

  std::vector<std::string> with_options(std::vector<std::string> args) const {
    for (const std::string& o :
         {std::string("heartbeat.interval=250ms"), std::string("heartbeat.timeout=3s"),
          std::string("cluster.registration.initial-timeout=50ms"),
          std::string("cluster.registration.max-timeout=500ms"), std::string("high-availability.type=etcd"),
          "high-availability.etcd.endpoints=" + etcd->endpoints(), "high-availability.cluster-id=" + cluster_id_,
          "high-availability.etcd.lease-ttl=" + std::to_string(kLeaseTtlS) + "s"}) {
      args.push_back("-D");
      args.push_back(o);
    }
    return args;
  }
  ChildProcess* spawn(const std::string& role, std::vector<std::string> args) {
    all_.push_back(std::make_unique<ChildProcess>(role, with_options(std::move(args))));
    return all_.back().get();
  }
  ChildProcess* spawn_jobmanager() {
    return spawn("jobmanager", {"jobmanager", file_, "--rpc-port", "0", "--rest-port", "0"});
  }
  ChildProcess* spawn_taskmanager() { return spawn("taskmanager", {"taskmanager", file_, "--slots", "1"}); }

  /// The epoch a JobManager logged when it became the leader, -1 before.
  static int64_t epoch_of(const ChildProcess& jm) {
    const std::string out = jm.output();
    const size_t at = out.find("is the leader of cluster");
    if (at == std::string::npos) return -1;
    const size_t e = out.find("(epoch ", at);
    return e == std::string::npos ? -1 : std::atoll(out.c_str() + e + 7);
  }
  /// The live JobManager that leads with the highest epoch (a paused former leader still believes it leads).
  ChildProcess* leader() {
    ChildProcess* best = nullptr;
    int64_t best_epoch = -1;
    for (ChildProcess* jm : jms_) {
      if (jm->exited()) continue;
      const int64_t e = epoch_of(*jm);
      if (e > best_epoch) {
        best = jm;
        best_epoch = e;
      }
    }
    return best;
  }
  ChildProcess* standby() {
    ChildProcess* l = leader();
    for (ChildProcess* jm : jms_)
      if (jm != l && !jm->exited()) return jm;
    return nullptr;
  }
  static size_t count_from(const std::string& out, const std::string& what, size_t from) {
    size_t n = 0;
    for (size_t p = out.find(what, from); p != std::string::npos; p = out.find(what, p + 1))
      ++n;
    return n;
  }

  /// Restarts, as a supervisor (systemd, Kubernetes) would, a process that exited on its own: a JobManager that
  /// exited non-zero (e.g. it lost its lease while etcd elected a leader of its own), any TaskManager. A
  /// JobManager that exits 0 ended its job (or found it ended): the run is over.
  void supervise() {
    for (ChildProcess*& jm : jms_) {
      if (!jm->exited()) continue;
      const int code = *jm->wait_exit(1s);
      if (code == 0) {
        finished_ = true;
        continue;
      }
      if (finished_) continue;
      ++unplanned_;
      std::cout << fmt::format("[{:7.1f} s] unplanned: a JobManager (pid {}) exited with code {}; restarted\n", secs(),
                               jm->pid(), code);
      jm = spawn_jobmanager();
    }
    for (ChildProcess*& tm : tms_) {
      if (finished_ || !tm->exited()) continue;
      ++unplanned_;
      std::cout << fmt::format("[{:7.1f} s] unplanned: a TaskManager (pid {}) exited with code {}; restarted\n", secs(),
                               tm->pid(), *tm->wait_exit(1s));
      tm = spawn_taskmanager();
    }
  }

  using Marks = std::map<const ChildProcess*, size_t>;
  Marks marks() const {
    Marks m;
    for (const ChildProcess* jm : jms_)
      m[jm] = jm->output().size();
    return m;
  }

  /// Healthy after a fault whose marks are `m`: a leader of epoch >= `min_epoch`, a standby campaigning, and on
  /// the leader after the mark: when the job restarted (or `restart` says it must), RUNNING after the last
  /// RESTARTING, then a completed checkpoint after that. A finished job is healthy too.
  bool healthy(const Marks& m, bool restart, int64_t min_epoch) {
    if (finished_) return true;
    ChildProcess* l = leader();
    ChildProcess* s = standby();
    if (l == nullptr || s == nullptr || epoch_of(*l) < min_epoch) return false;
    if (s->output().find("campaigns for the leadership") == std::string::npos) return false;
    const std::string out = l->output();
    auto it = m.find(l);
    size_t from = it == m.end() ? 0 : it->second;
    const size_t r = out.rfind("RESTARTING");
    if (r != std::string::npos && r >= from) {
      from = r;
      restart = true;
    }
    if (restart) {
      from = out.find(") RUNNING: ", from);
      if (from == std::string::npos) return false;
    }
    return out.find("completed checkpoint", from) != std::string::npos;
  }

  /// Waits for `pred` while reading the topic and supervising the processes.
  bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds deadline) {
    return poll_until(
        [&] {
          reader_->read_for(30ms);
          supervise();
          return pred();
        },
        deadline, 1ms);
  }

  double secs() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }

  std::string tails() const {
    std::string out;
    auto tail_of = [&](const ChildProcess* p) {
      const std::string o = p->output();
      size_t pos = o.size();
      for (int n = 0; n < 40 && pos > 0; ++n)
        pos = o.rfind('\n', pos - 1) == std::string::npos ? 0 : o.rfind('\n', pos - 1);
      out += "---- " + p->role() + " (pid " + std::to_string(p->pid()) + ", tail) ----\n" + o.substr(pos) + "\n";
    };
    for (const ChildProcess* p : jms_)
      tail_of(p);
    for (const ChildProcess* p : tms_)
      tail_of(p);
    return out;
  }

  // ---- the faults ------------------------------------------------------------------------------------------

  FaultRecord inject(Fault f) {
    FaultRecord rec{f};
    rec.at_s = secs();
    const auto t0 = Clock::now();
    Marks m = marks();
    bool restart = false;
    int64_t min_epoch = -1;
    switch (f) {
      case Fault::kKillLeader: {
        ChildProcess* l = leader();
        if (l == nullptr) break;
        const int64_t e = epoch_of(*l);
        l->signal(SIGKILL);
        EXPECT_TRUE(l->wait_exit(10s).has_value());
        *std::find(jms_.begin(), jms_.end(), l) = spawn_jobmanager();
        rec.detail = fmt::format("epoch {} killed", e);
        restart = true;
        min_epoch = e + 1;
        break;
      }
      case Fault::kKillStandby: {
        ChildProcess* s = standby();
        if (s == nullptr) break;
        s->signal(SIGKILL);
        EXPECT_TRUE(s->wait_exit(10s).has_value());
        *std::find(jms_.begin(), jms_.end(), s) = spawn_jobmanager();
        min_epoch = leader() == nullptr ? -1 : epoch_of(*leader());
        break;
      }
      case Fault::kKillOneTaskManager:
      case Fault::kKillTwoTaskManagers:
      case Fault::kKillAllTaskManagers: {
        const size_t n = f == Fault::kKillOneTaskManager ? 1 : f == Fault::kKillTwoTaskManagers ? 2 : tms_.size();
        std::vector<size_t> which(tms_.size());
        for (size_t i = 0; i < which.size(); ++i)
          which[i] = i;
        std::shuffle(which.begin(), which.end(), rng_);
        which.resize(n);
        for (size_t i : which)
          tms_[i]->signal(SIGKILL);
        for (size_t i : which) {
          EXPECT_TRUE(tms_[i]->wait_exit(10s).has_value());
          tms_[i] = spawn_taskmanager();
        }
        rec.detail = fmt::format("TaskManager(s) {}", fmt::join(which, ","));
        restart = true;
        min_epoch = leader() == nullptr ? -1 : epoch_of(*leader());
        break;
      }
      case Fault::kPauseLeader: {
        ChildProcess* l = leader();
        if (l == nullptr) break;
        const int64_t e = epoch_of(*l);
        l->signal(SIGSTOP);
        const bool taken_over = wait_for(
            [&] {
              ChildProcess* n = leader();
              return n != nullptr && n != l && epoch_of(*n) > e;
            },
            60s);
        EXPECT_TRUE(taken_over) << "the standby did not take over from the paused leader\n" << tails();
        // The paused process wrote nothing since SIGSTOP: its log is complete up to the pause.
        const size_t done_before = count_from(l->output(), "completed checkpoint", 0);
        rec.duration_ms = ms_since(t0);
        l->signal(SIGCONT);
        const std::optional<int> code = l->wait_exit(30s);
        EXPECT_TRUE(code.has_value()) << "the former leader did not exit after SIGCONT\n" << l->output();
        if (code) {
          EXPECT_NE(*code, 0) << l->output();
          EXPECT_GE(l->count("no longer the leader"), 1) << l->output();
        }
        EXPECT_EQ(count_from(l->output(), "completed checkpoint", 0), done_before)
            << "the paused former leader completed a checkpoint after waking\n"
            << l->output();
        *std::find(jms_.begin(), jms_.end(), l) = spawn_jobmanager();
        rec.detail = fmt::format("epoch {} paused {} ms, exited with code {}", e, rec.duration_ms, code.value_or(-1));
        restart = true;
        min_epoch = e + 1;
        break;
      }
      case Fault::kRestartEtcdMember: {
        const int member = static_cast<int>(rng_() % 3);
        if (rng_() % 2 == 0) {
          etcd->script("member-restart " + std::to_string(member));
          rec.detail = fmt::format("member {} restarted", member);
        } else {
          etcd->script("member-kill " + std::to_string(member));
          etcd->script("member-start " + std::to_string(member));
          rec.detail = fmt::format("member {} killed and started", member);
        }
        rec.duration_ms = ms_since(t0);
        m = marks();
        break;
      }
      case Fault::kRestartKafka: {
        EXPECT_TRUE(kafka->restart());
        rec.duration_ms = ms_since(t0);
        m = marks();
        break;
      }
      case Fault::kPauseS3: {
        const auto pause = std::chrono::milliseconds(3000 + static_cast<int64_t>(rng_() % 7000));
        ChildProcess* before = leader();
        const size_t aborted_before = before == nullptr ? 0 : count_from(before->output(), "aborted", 0);
        s3->pause();
        // The outage's length is the fault's parameter (not a synchronisation): the output is read meanwhile.
        const auto until = Clock::now() + pause;
        while (Clock::now() < until) {
          reader_->read_for(50ms);
          supervise();
        }
        s3->resume();
        rec.duration_ms = ms_since(t0);
        rec.detail = fmt::format("{} checkpoint abort(s) logged meanwhile",
                                 before == nullptr ? 0 : count_from(before->output(), "aborted", 0) - aborted_before);
        m = marks();
        break;
      }
    }
    const bool ok = wait_for([&] { return healthy(m, restart, min_epoch); }, kRecoveryDeadline);
    rec.recovery_ms = ms_since(t0);
    EXPECT_TRUE(ok) << "not healthy " << kRecoveryDeadline.count() << " s after the fault '" << fault_name(f)
                    << "' (seed " << seed_ << ")\n"
                    << tails();
    return rec;
  }

  // ---- one run ---------------------------------------------------------------------------------------------

  void run(const std::string& delivery, size_t first, size_t faults) {
    const bool exactly_once = delivery == "exactly-once";
    const std::vector<Fault> schedule = [&] {
      std::vector<Fault> all = fault_sequence(seed_, first + faults);
      std::vector<Fault> mine(all.begin() + static_cast<std::ptrdiff_t>(first), all.end());
      // This suite found exactly-once losing the transactions committed just before a broker restart (seed 4242,
      // about one run in ten, with the TaskManager kills that bring that timing about). The sink now confirms every
      // commit from its first record read back and re-publishes a lost one (docs/connectors.md; docs/benchmarks.md,
      // "A loss found"), so CI's exactly-once run keeps the TaskManager kills too.
      return mine;
    }();
    faults = schedule.size();
    const int64_t rounds = (kRate * (static_cast<int64_t>(faults) * kSecondsPerFault + kTailSeconds)) / kEntities + 1;
    const int64_t count = rounds * kEntities;  // every key gets revisions 0..rounds-1
    std::cout << fmt::format(
        "seed {} (SLUICE_TEST_SEED replays): {} faults, {} with {} records at {}/s over {} keys; schedule:", seed_,
        faults, delivery, count, kRate, kEntities);
    for (Fault f : schedule)
      std::cout << " [" << fault_name(f) << "]";
    std::cout << std::endl;
    ASSERT_NO_FATAL_FAILURE(write_pipeline(delivery, count));

    reader_ = std::make_unique<chaos::CommittedReader>(
        kafka->bootstrap(), topic_, kPartitions, [this](const chaos::KafkaRecord& r) {
          std::optional<Value> v = chaos::json_object(r, topic_);
          const Value* id = v ? v->find("id") : nullptr;
          const Value* payload = v ? v->find("payload") : nullptr;
          const Value* entity = payload != nullptr ? payload->find("id") : nullptr;
          const Value* revision = payload != nullptr ? payload->find("revision") : nullptr;
          if (id == nullptr || entity == nullptr || revision == nullptr) {
            ++malformed_;
            return;
          }
          got_[std::string(entity->as_string())].push_back(revision->as_int64());
          distinct_.emplace(std::string(entity->as_string()), revision->as_int64());
          ids_.emplace_back(id->as_string());
        });

    started_ = Clock::now();
    jms_ = {spawn_jobmanager(), spawn_jobmanager()};
    for (int i = 0; i < kTaskManagers; ++i)
      tms_.push_back(spawn_taskmanager());
    ASSERT_TRUE(wait_for(
        [&] {
          ChildProcess* l = leader();
          return l != nullptr && l->count(") RUNNING: ") > 0 && l->count("completed checkpoint") > 0 &&
                 standby() != nullptr && standby()->count("campaigns for the leadership") > 0;
        },
        120s))
        << "the cluster did not start\n"
        << tails();
    std::cout << fmt::format("[{:7.1f} s] job RUNNING on {} TaskManagers, leader epoch {}, first checkpoint done\n",
                             secs(), kTaskManagers, epoch_of(*leader()))
              << std::flush;

    std::vector<FaultRecord> done;
    for (Fault f : schedule) {
      if (finished_ || count - static_cast<int64_t>(distinct_.size()) < kLastFaultSecondsLeft * kRate) {
        std::cout << fmt::format("[{:7.1f} s] no more faults: {} of {} records read back already\n", secs(),
                                 distinct_.size(), count)
                  << std::flush;
        break;
      }
      FaultRecord rec = inject(f);
      std::cout << fmt::format(
                       "[{:7.1f} s] fault {}/{}: {}{}{}; healthy again after {} ms\n", rec.at_s, done.size() + 1,
                       schedule.size(), fault_name(f), rec.detail.empty() ? "" : " (" + rec.detail + ")",
                       rec.duration_ms > 0 ? fmt::format(", lasted {} ms", rec.duration_ms) : "", rec.recovery_ms)
                << std::flush;
      done.push_back(rec);
      if (HasFailure()) return;
    }
    // After the last fault: the job runs on and checkpoints until the bounded source ends; the leader ends the job
    // FINISHED and exits 0.
    const Marks after_last = marks();
    ChildProcess* final_leader = leader();
    ASSERT_NE(final_leader, nullptr);
    const auto finish_deadline = std::chrono::seconds(180 + count / kRate);
    ASSERT_TRUE(wait_for([&] { return finished_; }, finish_deadline))
        << "the job did not finish after the faults (seed " << seed_ << ")\n"
        << tails();
    // The leader that finished the job is the one after the last fault (no leader change since).
    size_t completed_after = 0;
    for (ChildProcess* jm : jms_) {
      auto it = after_last.find(jm);
      completed_after += count_from(jm->output(), "completed checkpoint", it == after_last.end() ? 0 : it->second);
    }
    EXPECT_GE(completed_after, 2u) << "checkpoints must go on completing after the last fault";
    ha::EtcdHaStore store(*client_, ha::HaKeys(cluster_id_));
    const std::string job_id = [&] {
      const std::string out = final_leader->output();
      const std::string key = ", job id ";
      const size_t at = out.find(key);
      return at == std::string::npos
                 ? std::string()
                 : out.substr(at + key.size(), out.find_first_of("\n ", at + key.size()) - at - key.size());
    }();
    auto status = store.job_status(job_id);
    ASSERT_TRUE(status.ok()) << status.error().to_string();
    EXPECT_EQ(status->value_or(""), "FINISHED") << "job " << job_id;

    // The data-level check: the whole topic, read_committed, against the exact per-key sequences.
    ASSERT_TRUE(reader_->drain(120s)) << "the topic could not be read to its end";
    std::map<std::string, std::vector<int64_t>> want;
    for (int64_t e = 0; e < kEntities; ++e) {
      std::vector<int64_t>& revs = want[fmt::format("ch_{:08d}", e)];
      for (int64_t r = 0; r < rounds; ++r)
        revs.push_back(r);
    }
    const chaos::SequenceTally t = chaos::compare_sequences(want, got_);
    const size_t duplicate_ids = chaos::count_duplicates(ids_);

    // `sluice verify` on the same topic, as a user would check it: revisions 0..rounds-1 of every key, event ids.
    std::vector<std::string> args = {"verify",
                                     "--bootstrap-servers",
                                     kafka->bootstrap(),
                                     "--topic",
                                     topic_,
                                     "--id-field",
                                     "id",
                                     "--key-field",
                                     "payload.id",
                                     "--seq-field",
                                     "payload.revision",
                                     "--seq-start",
                                     "0",
                                     "--seq-end",
                                     std::to_string(rounds - 1)};
    if (!exactly_once) args.push_back("--allow-duplicates");
    const sluice::testing::Ran verify = sluice::testing::run_to_end(SLUICE_BINARY, args);
    std::cout << "sluice verify " << fmt::format("{}", fmt::join(args.begin() + 1, args.end(), " ")) << ":\n"
              << verify.out << verify.err;
    EXPECT_EQ(verify.code, 0) << "sluice verify found a violation";
    EXPECT_NE(verify.out.find(fmt::format("records:       {}\n", reader_->count())), std::string::npos)
        << "sluice verify read another number of records than the test's reader (" << reader_->count() << ")";
    EXPECT_NE(verify.out.find("missing:       0 "), std::string::npos);
    EXPECT_NE(verify.out.find("result:        OK"), std::string::npos);
    if (exactly_once) {
      // The keyed state too: entity_version counts each entity's events 1, 2, 3, ... exactly once.
      const sluice::testing::Ran versions =
          sluice::testing::run_to_end(SLUICE_BINARY, {"verify", "--bootstrap-servers", kafka->bootstrap(), "--topic",
                                                      topic_, "--key-field", "entity", "--seq-field", "entity_version",
                                                      "--seq-start", "1", "--seq-end", std::to_string(rounds)});
      EXPECT_EQ(versions.code, 0) << "sluice verify of entity_version:\n" << versions.out << versions.err;
    }

    std::vector<int64_t> recoveries;
    std::map<std::string, int> by_kind;
    for (const FaultRecord& r : done) {
      recoveries.push_back(r.recovery_ms);
      ++by_kind[fault_name(r.kind)];
    }
    std::sort(recoveries.begin(), recoveries.end());
    std::string kinds;
    for (const auto& [k, n] : by_kind)
      kinds += fmt::format("{}{} x{}", kinds.empty() ? "" : ", ", k, n);
    std::cout << fmt::format(
        "SUMMARY {} seed {}: {} faults injected ({}), {} unplanned process exits restarted; {} records checked "
        "({} expected, {} keys): {} lost, {} duplicated ({} duplicate event ids), {} out of order, {} unexpected, {} "
        "malformed; recovery median {} ms, max {} ms; {} s in all\n",
        delivery, seed_, done.size(), kinds, unplanned_, reader_->count(), count, kEntities, t.missing, t.duplicated,
        duplicate_ids, t.out_of_order, t.unexpected, malformed_,
        recoveries.empty() ? 0 : recoveries[recoveries.size() / 2], recoveries.empty() ? 0 : recoveries.back(),
        static_cast<int64_t>(secs()));
    EXPECT_EQ(t.missing, 0u) << t.first_problem;
    EXPECT_EQ(t.unexpected, 0u) << t.first_problem;
    EXPECT_EQ(t.out_of_order, 0u) << t.first_problem;
    EXPECT_EQ(malformed_, 0u);
    if (exactly_once) {
      EXPECT_EQ(t.duplicated, 0u) << t.first_problem;
      EXPECT_EQ(duplicate_ids, 0u);
    }
    EXPECT_GE(done.size(), std::min<size_t>(faults, 3)) << "too few faults were injected before the source's end";
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string cluster_id_;
  std::unique_ptr<ha::EtcdClient> client_;
  fs::path dir_;
  std::string topic_;
  std::string file_;
  Clock::time_point started_ = Clock::now();
  std::unique_ptr<chaos::CommittedReader> reader_;
  std::vector<std::unique_ptr<ChildProcess>> all_;  // every process started, for the logs
  std::vector<ChildProcess*> jms_;                  // the two JobManager contenders now
  std::vector<ChildProcess*> tms_;                  // the TaskManagers now
  bool finished_ = false;
  int unplanned_ = 0;
  // What the reader read: entity -> revisions in the order read, the distinct (entity, revision) pairs, event ids.
  std::map<std::string, std::vector<int64_t>> got_;
  std::set<std::pair<std::string, int64_t>> distinct_;
  std::vector<std::string> ids_;
  size_t malformed_ = 0;
};

// The two tests take consecutive parts of one seeded fault sequence, so together they cover every kind.
TEST_F(ClusterChaosTest, ExactlyOnceThroughASeededFaultSchedule) {
  run("exactly-once", 0, fault_budget(6));
}

TEST_F(ClusterChaosTest, AtLeastOnceThroughASeededFaultSchedule) {
  run("at-least-once", fault_budget(6), fault_budget(4));
}

}  // namespace
}  // namespace sluice::testing::cluster
