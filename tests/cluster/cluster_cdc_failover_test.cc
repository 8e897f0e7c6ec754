// Change data capture across processes, the users' pipeline in cluster mode: Postgres CDC -> Kafka with
// `delivery: exactly-once` on `sluice jobmanager` + 3 `sluice taskmanager`s of 2 slots (tests/cluster/
// cluster_harness.h), parallelism 4 (the source's reader, then a key_by to four Kafka sink subtasks), checkpoints
// every 200 ms. A seeded workload (tests/chaos/postgres_workload.h: transactions of 1 to 20,000 rows, upserts and
// deletes) runs against the table; after the commit of one of a burst of large transactions, at a seeded delay,
// the TaskManager running the source's reader is SIGKILLed. The JobManager restarts the job from its latest
// checkpoint on the remaining slots: the reader resumes from the checkpoint's position in the replication slot
// (the slot's confirmed position moved only with completed checkpoints) and the sinks' transactions of the lost
// attempt are aborted. The rest of the workload runs while the job recovers. A read_committed reader then finds, per
// entity, every change exactly once and in order, a tombstone after each delete, and no event id twice.
// Seed printed (SLUICE_TEST_SEED replays). Needs Postgres and Kafka. About 30-60 s on a loaded two-core machine.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "chaos/postgres_workload.h"
#include "cluster/cluster_harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace pg = sluice::chaos::pg;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;
constexpr auto kCatchUp = 180s;
constexpr int kPartitions = 4;
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};

TEST(ClusterCdcFailoverTest, PostgresToKafkaExactlyOnceSurvivesTheKillOfTheSourcesTaskManager) {
  const std::string bootstrap = require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  const std::string url = require_service("postgres").get("POSTGRES_URL");
  ASSERT_FALSE(bootstrap.empty());
  ASSERT_FALSE(url.empty());
  const uint64_t seed = test_seed();
  std::mt19937_64 rnd;
  // 16 transactions of mixed sizes and one burst of three large ones, the kill after the burst's 1st or 2nd.
  const pg::Workload w = pg::make_workload(seed, 16, 1, rnd);
  ASSERT_EQ(w.kill_after.size(), 1u);
  const size_t kill_txn = w.kill_after.front();
  const int64_t kill_delay_ms = static_cast<int64_t>(rnd() % 400);
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED to replay): " << w.txns.size() << " transactions, " << w.changes
            << " changes (" << w.deletes << " deletes); the source's TaskManager SIGKILLed " << kill_delay_ms
            << " ms after the commit of transaction " << kill_txn << " (" << w.txns[kill_txn].rows << " rows)\n";

  pg::Db db(url);
  ASSERT_NO_FATAL_FAILURE(db.setup());
  const fs::path dir = chaos::make_test_dir("sluice-cluster-cdc");
  const std::string topic = kafka::unique_topic("cluster-cdc");
  ASSERT_TRUE(kafka::create_topic(bootstrap, topic, kPartitions));
  const fs::path file = dir / "cdc.yaml";
  std::ofstream(file) << chaos::pipeline_section(db.table(), dir / "checkpoints", "200ms", "exactly-once",
                                                 "  restart: { strategy: fixed-delay, attempts: 5, delay: 200ms }\n", 4)
                      << pg::cdc_source_to_events(db, bootstrap, topic);

  std::vector<pg::Event> events;
  chaos::CommittedReader reader(bootstrap, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<pg::Event> e = pg::parse_event(r, topic)) events.push_back(std::move(*e));
  });
  auto c = std::make_unique<ClusterHarness>(file.string(), kOptions);
  ChildProcess* jm = c->start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::vector<ChildProcess*> tms;
  for (int i = 0; i < 3; ++i)
    tms.push_back(c->start_taskmanager(2));
  // 5 tasks (the reader with its transform, 4 sink subtasks) in 4 slots, so on 2 of the 3 TaskManagers.
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c->logs();

  // The workload starts once the source made its slot (the changes before its snapshot would be snapshot reads) and
  // a checkpoint completed.
  ASSERT_TRUE(poll_until([&] { return db.has_slot() && jm->count("completed checkpoint ") > 0; }, kStart)) << c->logs();
  int killed_after_checkpoints = -1;
  for (size_t i = 0; i < w.txns.size(); ++i) {
    if (i == kill_txn) {
      // Before the burst, the changes so far are committed in the topic (so checkpoints completed after them): the
      // restart restores a checkpoint inside the reading of the burst, not the start.
      size_t before = 0;
      for (size_t k = 0; k < i; ++k)
        before += w.txns[k].rows * (w.txns[k].remove ? 2 : 1);  // a delete's event and its tombstone
      const auto until = Clock::now() + kStart;
      while (events.size() < before && Clock::now() < until)
        reader.read_for(100ms);
      ASSERT_GE(events.size(), before) << c->logs();
    }
    ASSERT_NO_FATAL_FAILURE(db.apply(w.txns[i]));
    if (i != kill_txn) continue;
    reader.read_for(std::chrono::milliseconds(kill_delay_ms));  // the kill moment: reading meanwhile
    // The TaskManager holding the reader: the one given 3 tasks (the reader and two sink subtasks share slot 0's
    // TaskManager; the other gets two sink subtasks).
    std::string source_tm;
    {
      const std::regex deployed(R"re(deployed 3 task\(s\) to TaskManager (\S+) \(attempt)re");
      const std::string out = jm->output();
      for (auto it = std::sregex_iterator(out.begin(), out.end(), deployed); it != std::sregex_iterator(); ++it)
        source_tm = (*it)[1];
    }
    ChildProcess* victim = nullptr;
    for (ChildProcess* tm : tms) {
      if (!source_tm.empty() && tm->count("TaskManager " + source_tm + " with") > 0) victim = tm;
    }
    ASSERT_NE(victim, nullptr) << source_tm << "\n" << c->logs();
    killed_after_checkpoints = jm->count("completed checkpoint ");
    victim->signal(SIGKILL);
    ASSERT_TRUE(victim->wait_exit(10s).has_value());
    std::cout << "SIGKILLed the reader's TaskManager (pid " << victim->pid() << ") after " << killed_after_checkpoints
              << " completed checkpoint(s), " << events.size() << " committed events read\n";
  }
  const auto applied = Clock::now();

  // Every change (and a tombstone after each delete) committed, or the deadline; then a little longer, so that
  // anything committed twice after them would be seen.
  const size_t expected = w.changes + w.deletes;
  while (Clock::now() - applied < kCatchUp && events.size() < expected) {
    reader.read_for(1s);
    ASSERT_FALSE(jm->exited()) << "the JobManager ended before the output was complete\n" << c->logs();
  }
  reader.read_for(2s);
  std::cout << "every change read_committed "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - applied).count()
            << " ms after the last transaction\n";

  const pg::Tally t = pg::tally(events, w);
  const chaos::SequenceTally& e = t.per_entity;
  std::cout << "Postgres -> Kafka exactly-once across processes: " << w.changes << " changes; topic: " << t.records
            << " records, " << t.distinct_ids << " distinct ids, " << t.duplicate_ids << " duplicated, " << e.missing
            << " missing, " << e.duplicated + e.unexpected << " extra, " << e.out_of_order
            << " entities out of order (seed " << seed << ")\n";
  EXPECT_EQ(e.missing, 0u) << e.first_problem;
  EXPECT_EQ(t.duplicate_ids, 0u) << e.first_problem;
  EXPECT_EQ(e.duplicated, 0u) << e.first_problem;
  EXPECT_EQ(e.unexpected, 0u) << e.first_problem;
  EXPECT_EQ(e.out_of_order, 0u) << e.first_problem;
  EXPECT_EQ(t.records, expected) << "every change, and a tombstone after each delete";
  // The job restarted once, from a checkpoint, on the TaskManagers that remained.
  EXPECT_GE(jm->count("RESTARTING"), 1) << jm->output();
  EXPECT_GE(jm->count("starts from checkpoint"), 1) << jm->output();
  EXPECT_FALSE(jm->exited()) << jm->output();

  const bool failed = HasFailure();
  if (failed || std::getenv("SLUICE_TEST_LOGS") != nullptr) std::cerr << c->logs();
  c.reset();  // every child SIGKILLed and reaped before the slot is dropped
  db.teardown();
  chaos::keep_or_remove(dir, failed);
}

}  // namespace
}  // namespace sluice::testing::cluster
