// Change data capture across processes, the users' pipeline in cluster mode: Postgres CDC -> Kafka with
// `delivery: exactly-once` on `sluice jobmanager` + 3 `sluice taskmanager`s of 2 slots (tests/cluster/
// cluster_harness.h), parallelism 4 (the source's reader, then a key_by to four Kafka sink subtasks), checkpoints
// every 200 ms. A seeded workload (tests/chaos/postgres_workload.h: transactions of 1 to 20,000 rows, upserts and
// deletes) runs against the table; while one of a burst of large transactions streams (its first events committed,
// the rest still coming), the TaskManager running the source's reader is SIGKILLed. The JobManager restarts the job
// from its latest checkpoint on the remaining slots: the reader resumes from the checkpoint's position in the
// replication slot (the slot's confirmed position moved only with completed checkpoints) and the sinks' transactions of
// the lost attempt are aborted. The rest of the workload runs while the job recovers. A read_committed reader then
// finds, per entity, every change exactly once and in order, a tombstone after each delete, and no event id twice. The
// same for MongoDB CDC (tests/chaos/mongodb_workload.h), checked against the collection's own change stream. Seed
// printed (SLUICE_TEST_SEED replays). Needs Postgres, MongoDB and Kafka. About 30-90 s on a loaded two-core machine.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "chaos/mongodb_workload.h"
#include "chaos/postgres_workload.h"
#include "cluster/cluster_harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace pg = sluice::chaos::pg;
namespace mongo = sluice::chaos::mongo;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;
constexpr auto kCatchUp = 180s;
constexpr int kPartitions = 4;
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};

// The TaskManager running subtask 0 of the source (its reader of the table or collection), as the JobManager's REST
// API places it (GET /jobs/:id/vertices/:vid, each subtask's taskmanager-id). Null when none is found.
ChildProcess* reader_taskmanager(const ClusterHarness& c, const std::vector<ChildProcess*>& tms) {
  const auto job = c.get("/jobs/" + c.job_id());
  const Value* vertices = job ? job->find("vertices") : nullptr;
  if (vertices == nullptr || !vertices->is_array()) return nullptr;
  std::string id;
  for (const Value& v : vertices->as_array()) {
    const Value* name = v.find("name");
    const Value* vid = v.find("id");
    if (name == nullptr || !name->is_string() || vid == nullptr || !vid->is_string()) continue;
    if (!std::string(name->as_string()).starts_with("Source")) continue;
    const auto vertex = c.get("/jobs/" + c.job_id() + "/vertices/" + std::string(vid->as_string()));
    const Value* tm = vertex ? vertex->at_path("subtasks[0].taskmanager-id") : nullptr;
    if (tm != nullptr && tm->is_string()) id = std::string(tm->as_string());
  }
  for (ChildProcess* tm : tms) {
    if (!id.empty() && tm->count("TaskManager " + id + " with") > 0) return tm;
  }
  return nullptr;
}

// A JobManager and 3 TaskManagers of 2 slots on `file`.
void start_cluster(const fs::path& file, std::unique_ptr<ClusterHarness>& c, ChildProcess*& jm,
                   std::vector<ChildProcess*>& tms) {
  c = std::make_unique<ClusterHarness>(file.string(), kOptions);
  jm = c->start_jobmanager();
  ASSERT_NE(jm, nullptr);
  for (int i = 0; i < 3; ++i)
    tms.push_back(c->start_taskmanager(2));
}

// SIGKILLs the TaskManager running the source's reader and reaps it; `committed` is what the test has read so far.
void kill_reader_taskmanager(const ClusterHarness& c, ChildProcess& jm, const std::vector<ChildProcess*>& tms,
                             size_t committed) {
  ChildProcess* victim = reader_taskmanager(c, tms);
  ASSERT_NE(victim, nullptr) << c.logs();
  const int checkpoints = jm.count("completed checkpoint ");
  victim->signal(SIGKILL);
  ASSERT_TRUE(victim->wait_exit(10s).has_value());
  std::cout << "SIGKILLed the reader's TaskManager (pid " << victim->pid() << ") after " << checkpoints
            << " completed checkpoint(s), " << committed << " committed events read\n";
}

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
  const int64_t kill_delay_ms = static_cast<int64_t>(rnd() % 100);
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED to replay): " << w.txns.size() << " transactions, " << w.changes
            << " changes (" << w.deletes << " deletes); the source's TaskManager SIGKILLed " << kill_delay_ms
            << " ms after the first committed events of transaction " << kill_txn << " (" << w.txns[kill_txn].rows
            << " rows)\n";

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
  std::unique_ptr<ClusterHarness> c;
  ChildProcess* jm = nullptr;
  std::vector<ChildProcess*> tms;
  ASSERT_NO_FATAL_FAILURE(start_cluster(file, c, jm, tms));
  // 5 tasks (the reader with its transform, 4 sink subtasks) in 4 slots, so on 2 of the 3 TaskManagers.
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c->logs();

  // The workload starts once the source made its slot (the changes before its snapshot would be snapshot reads) and
  // a checkpoint completed.
  ASSERT_TRUE(poll_until([&] { return db.has_slot() && jm->count("completed checkpoint ") > 0; }, kStart)) << c->logs();
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
    const size_t committed_before = events.size();
    ASSERT_NO_FATAL_FAILURE(db.apply(w.txns[i]));
    if (i != kill_txn) continue;
    // The next two transactions (up to 40,000 rows) are committed at once behind it, so the job streams for a while.
    size_t events_after = 0;
    for (size_t k = i; k < std::min(w.txns.size(), i + 3); ++k)
      events_after += w.txns[k].rows * (w.txns[k].remove ? 2 : 1);
    for (; i + 1 < std::min(w.txns.size(), kill_txn + 3); ++i)
      ASSERT_NO_FATAL_FAILURE(db.apply(w.txns[i + 1]));
    // The kill moment: once the first events of the transaction are committed (a checkpoint inside the stream
    // completed), while the rest are still coming, some of them in Kafka transactions that never commit.
    const auto until = Clock::now() + kStart;
    while (events.size() == committed_before && Clock::now() < until)
      reader.read_for(10ms);
    ASSERT_GT(events.size(), committed_before) << c->logs();
    reader.read_for(std::chrono::milliseconds(kill_delay_ms));
    std::cout << events.size() - committed_before << " of the " << events_after
              << " events of the transaction and the two after it committed at the kill\n";
    ASSERT_NO_FATAL_FAILURE(kill_reader_taskmanager(*c, *jm, tms, events.size()));
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

// The same across processes for MongoDB at parallelism 2 (both readers, one of them idle with one collection, on one
// TaskManager), checkpoints every second: 5,000 documents snapshotted, then 1,200 seeded inserts, replaces and
// deletes in batches of 100, the reader's TaskManager SIGKILLed 0-300 ms after a seeded batch (once a checkpoint
// completed after the snapshot). The check is the local chaos test's (mongodb_workload.h): against the collection's own
// change stream from the snapshot's resume point, no stream change missing, extra or twice, per entity in order, one
// snapshot read per document, a tombstone after each delete.
TEST(ClusterCdcFailoverTest, MongoDbToKafkaExactlyOnceSurvivesTheKillOfTheSourcesTaskManager) {
  const std::string bootstrap = require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  const std::string uri = require_service("mongodb").get("MONGODB_URI");
  ASSERT_FALSE(bootstrap.empty());
  ASSERT_FALSE(uri.empty());
  constexpr int kDocuments = 5'000;
  constexpr int kChanges = 1'200;
  constexpr size_t kBatch = 100;
  const uint64_t seed = test_seed();
  const mongo::Workload w = mongo::make_workload(seed, kDocuments, kChanges);
  std::mt19937_64 rnd(seed ^ 0x5deece66dULL);
  const size_t batches = (w.changes.size() + kBatch - 1) / kBatch;
  const size_t kill_batch = batches / 4 + rnd() % (batches / 2);
  const int64_t kill_delay_ms = static_cast<int64_t>(rnd() % 300);
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED to replay): " << kDocuments << " documents, " << w.changes.size()
            << " changes in " << batches << " batches; the reader's TaskManager SIGKILLed " << kill_delay_ms
            << " ms after batch " << kill_batch << "\n";

  mongo::Mongo m(uri);
  m.insert_documents(kDocuments);
  const fs::path dir = chaos::make_test_dir("sluice-cluster-mongo");
  const std::string topic = kafka::unique_topic("cluster-mongo");
  ASSERT_TRUE(kafka::create_topic(bootstrap, topic, kPartitions));
  const fs::path file = dir / "cdc.yaml";
  // Checkpoints every second: the changes of a batch stay in open Kafka transactions for a while before a checkpoint
  // commits them, and the kill (0-300 ms after a batch) mostly falls there.
  std::ofstream(file) << chaos::pipeline_section(m.db(), dir / "checkpoints", "1s", "exactly-once",
                                                 "  restart: { strategy: fixed-delay, attempts: 5, delay: 200ms }\n", 2)
                      << mongo::cdc_source_to_events(m, bootstrap, topic);

  std::vector<mongo::Event> events;
  chaos::CommittedReader reader(bootstrap, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<mongo::Event> e = mongo::parse_event(r, topic)) events.push_back(std::move(*e));
  });
  std::unique_ptr<ClusterHarness> c;
  ChildProcess* jm = nullptr;
  std::vector<ChildProcess*> tms;
  ASSERT_NO_FATAL_FAILURE(start_cluster(file, c, jm, tms));
  // The source's 2 readers and the 2 sink subtasks in 2 slots of one TaskManager: a checkpointed source runs in one
  // TaskManager in this build (its split enumerator runs there, not on the JobManager).
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 4 task\\(s\\) on 1 TaskManager\\(s\\)"), kStart)) << c->logs();
  ASSERT_TRUE(poll_until([&] { return jm->count("completed checkpoint ") > 0; }, kStart)) << c->logs();

  for (size_t batch = 0; batch < batches; ++batch) {
    const size_t begin = batch * kBatch;
    ASSERT_NO_FATAL_FAILURE(m.apply(w.changes, begin, std::min(w.changes.size(), begin + kBatch)));
    // The workload's pace (reading meanwhile), so that the kill falls while changes stream.
    reader.read_for(batch == kill_batch ? std::chrono::milliseconds(kill_delay_ms) : 150ms);
    if (batch != kill_batch) continue;
    ASSERT_NO_FATAL_FAILURE(kill_reader_taskmanager(*c, *jm, tms, events.size()));
  }
  const auto applied = Clock::now();

  // The snapshot's resume point from its committed reads, then the changes the stream must carry from it.
  std::string t0;
  ASSERT_TRUE(poll_until(
      [&] {
        reader.read_for(200ms);
        t0 = mongo::snapshot_resume_point(events);
        return !t0.empty();
      },
      kCatchUp))
      << "no snapshot read in the topic\n"
      << c->logs();
  unsigned t = 0;
  unsigned i = 0;
  ASSERT_EQ(std::sscanf(t0.c_str(), "Timestamp(%u, %u)", &t, &i), 2) << t0;
  const std::vector<mongo::Mongo::StreamChange> expected = m.changes_from(t, i);
  const std::set<std::string> expected_positions = mongo::positions_of(expected);
  const bool caught_up = poll_until(
      [&] {
        reader.read_for(200ms);
        const std::set<std::string> got = mongo::stream_positions(events);
        return std::includes(got.begin(), got.end(), expected_positions.begin(), expected_positions.end());
      },
      kCatchUp, 200ms);
  reader.read_for(2s);  // anything committed twice after the last change
  std::cout << "every change read_committed "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - applied).count()
            << " ms after the last batch\n";
  const std::set<std::string> got = mongo::stream_positions(events);
  const std::vector<std::string> missing = mongo::positions_missing(expected_positions, got);
  const std::vector<std::string> extra = mongo::positions_missing(got, expected_positions);
  EXPECT_TRUE(caught_up) << missing.size() << " stream changes never arrived";
  const mongo::Checked checked = mongo::expect_exactly_once(events, expected, missing, extra, kDocuments, w);
  std::cout << "MongoDB -> Kafka exactly-once across processes: " << expected.size() << " stream changes from T0 " << t0
            << "; topic: " << events.size() << " records, " << checked.snapshot_reads << " snapshot reads, "
            << got.size() << " stream events, " << checked.tombstones << " tombstones; missing " << missing.size()
            << ", extra " << extra.size() << ", duplicates " << checked.duplicates << ", out of order "
            << checked.out_of_order << " (seed " << seed << ")\n";
  EXPECT_GE(jm->count("RESTARTING"), 1) << jm->output();
  EXPECT_GE(jm->count("starts from checkpoint"), 1) << jm->output();
  EXPECT_FALSE(jm->exited()) << jm->output();

  const bool failed = HasFailure();
  if (failed || std::getenv("SLUICE_TEST_LOGS") != nullptr) std::cerr << c->logs();
  c.reset();
  chaos::keep_or_remove(dir, failed);
}

}  // namespace
}  // namespace sluice::testing::cluster
