// Chaos test of exactly-once from Postgres to Kafka through real crashes (issue 14): `sluice run` of a pipeline
// Postgres CDC -> Kafka with `delivery: exactly-once` and 200 ms checkpoints is SIGKILLed at seeded random
// moments while a workload of transactions of 1 to 20,000 rows runs, and restarted each time from its
// checkpoints. The topic, read back with a read_committed consumer, must hold every change exactly once, in
// per-key order.
//
// The workload (seeded by SLUICE_TEST_SEED, printed): transactions over entities 0..19,999, each one statement
// over a range of ids: an upsert (INSERT ... ON CONFLICT DO UPDATE: a create for an absent id, an update with
// revision + 1 for a present one) or a delete of the present ids of the range. Sizes: mostly 1-20 rows, some
// 21-1,500 and some 1,500-20,000. At each of the seeded kill points comes a burst of three large transactions
// (3,000-20,000 rows) and the kill falls at a random delay (0-400 ms) after the commit of the burst's first or
// second one, while the job streams them: checkpoints fall inside transactions, and the restore resumes inside one
// (the log says "resumes inside the transaction"; the count is printed).
//
// Checks, per entity: the events in topic order (one entity lives in one partition) equal the workload's changes
// of that entity (op and revision) — no missing, no duplicate, no reordering; and globally: no event id twice.
// Each delete is followed by its tombstone (the Kafka sink's tombstones-on-delete, default true: the same key, a
// null value, in the same transaction), so a tombstone lost or written twice by a crash shows as a change of its
// entity missing or extra.
//
// Scale: SLUICE_CHAOS_SCALE (a factor, default 1: 6 kills, about 60 transactions, under a minute here) multiplies
// the transactions and the kills, e.g. SLUICE_CHAOS_SCALE=40 for a long run (about 240 kills).
// Run: scripts/services/run-with postgres kafka -- build/<preset>/tests/postgres_exactly_once_kill_test
// (SLUICE_CHAOS_BINARY=/path/to/sluice runs another build of sluice, e.g. one without a fix.)
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "chaos/postgres_workload.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace kafka = sluice::testing::kafka;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chaos::count_of;
using chaos::SluiceProcess;
using sluice::testing::unique_name;
using namespace sluice::chaos::pg;  // NOLINT(google-build-using-namespace): the workload of this test

constexpr int kPartitions = 4;
constexpr int kBaseTransactions = 40;
constexpr int kBaseKills = 6;
constexpr auto kStartDeadline = 90s;
constexpr auto kCatchUpDeadline = 180s;

// ---------------------------------------------------------------------------------------------------------------

class PostgresExactlyOnceKillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* s : {"kafka", "postgres"}) {
      if (!testing::require_service(s).available) return;
    }
    bootstrap_ = testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    db_ = std::make_unique<Db>(testing::require_service("postgres").get("POSTGRES_URL"));
    dir_ = chaos::make_test_dir("sluice-pg-eo");
    ASSERT_NO_FATAL_FAILURE(db_->setup());
  }
  void TearDown() override {
    if (run_) run_->stop();
    if (HasFailure() && run_) std::cout << run_->tails(15);
    chaos::keep_or_remove(dir_, HasFailure());
    if (db_) db_->teardown();
  }

  std::string pipeline_yaml(const std::string& topic, const std::string& interval = "200ms") {
    return chaos::pipeline_section(db_->table(), dir_ / "checkpoints", interval, "exactly-once", "", parallelism_) +
           cdc_source_to_events(*db_, bootstrap_, topic);
  }

  // A kill while the initial snapshot has emitted nothing yet (see the tests below); `crash_at_slot`: the child
  // crashes itself right after CREATE_REPLICATION_SLOT (no checkpoint yet: the restart has no state), else its
  // reader thread is held there while checkpoints complete and the test SIGKILLs it (the restart restores one).
  void slot_creation_kill(bool crash_at_slot);
  // SIGKILLs the job at random moments of a workload (seeded) and checks the topic read_committed: every change
  // exactly once.
  void killed_at_random_moments();

  std::string bootstrap_;
  std::unique_ptr<Db> db_;
  fs::path dir_;
  std::unique_ptr<SluiceProcess> run_;
  int parallelism_ = 2;
};

void PostgresExactlyOnceKillTest::killed_at_random_moments() {
  if (db_ == nullptr) GTEST_SKIP() << "services not available";
  const auto t0 = Clock::now();
  const uint64_t seed = testing::test_seed();
  const double scale = std::max(chaos::chaos_scale(), 0.1);
  const int transactions = std::max(10, static_cast<int>(kBaseTransactions * scale));
  const int kills = std::max(2, static_cast<int>(kBaseKills * scale));
  std::mt19937_64 rnd;
  const Workload w = make_workload(seed, transactions, kills, rnd);
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), scale " << scale << ": " << w.txns.size() << " transactions, "
            << w.changes << " changes (" << w.deletes << " deletes), " << w.kill_after.size() << " kills\n";
  // The kill moments: a random delay (0-400 ms) after the commit of a transaction of a burst, while the job
  // streams the burst's large transactions (so the last completed checkpoint lies inside one of them).
  std::map<size_t, int64_t> kill_after;  // transaction index -> delay (ms)
  for (size_t i : w.kill_after)
    kill_after[i] = static_cast<int64_t>(rnd() % 400);

  const std::string topic = kafka::unique_topic("pg-eo");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "p.yaml") << pipeline_yaml(topic);
  run_ = std::make_unique<SluiceProcess>("run", dir_ / "p.yaml", dir_);
  ASSERT_TRUE(run_->start());
  ASSERT_TRUE(run_->wait_running(1, kStartDeadline));

  int killed = 0;
  for (size_t i = 0; i < w.txns.size(); ++i) {
    auto it = kill_after.find(i);
    if (it != kill_after.end()) {
      // Kill only a run that made progress since its start (completed a checkpoint), so that every restart
      // restores from a checkpoint of the run before it; wait before the burst's transaction, not after it.
      ASSERT_TRUE(run_->wait_running(1, kStartDeadline)) << run_->tails(15);
    }
    ASSERT_NO_FATAL_FAILURE(db_->apply(w.txns[i]));
    if (it == kill_after.end()) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(it->second));  // the kill moment, not synchronisation
    std::cout << "kill " << (killed + 1) << " after transaction " << i << " (" << w.txns[i].rows << " rows) + "
              << it->second << " ms\n";
    run_->kill_now();
    ++killed;
    ASSERT_TRUE(run_->start());
  }
  ASSERT_TRUE(run_->wait_running(1, kStartDeadline)) << run_->tails(15);

  // Read until as many records as changes are there (or the deadline: longer for a long run), then a little
  // longer for anything after them; then compare (once: the comparison sorts everything read).
  std::vector<Event> events;
  chaos::CommittedReader reader(bootstrap_, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<Event> e = parse_event(r, topic)) events.push_back(std::move(*e));
  });
  const auto end =
      Clock::now() + std::max<std::chrono::milliseconds>(kCatchUpDeadline, std::chrono::milliseconds(w.changes / 5));
  while (Clock::now() < end && events.size() < w.changes + w.deletes) {
    reader.read_for(1s);
    ASSERT_TRUE(run_->alive()) << run_->tails(15);
  }
  reader.read_for(2s);
  const Tally t = tally(events, w);
  const chaos::SequenceTally& e = t.per_entity;
  const std::string logs = run_->all_logs();
  const size_t resumed = count_of(logs, "resuming from checkpoint");
  const size_t inside = count_of(logs, "resumes inside the transaction");
  std::cout << "Postgres -> Kafka exactly-once: " << w.changes << " changes, " << killed << " kills, " << run_->starts()
            << " starts (" << resumed << " from a checkpoint, " << inside
            << " inside a transaction); topic: " << t.records << " records, " << t.distinct_ids << " distinct ids, "
            << t.duplicate_ids << " duplicated, " << e.missing << " missing, " << e.duplicated + e.unexpected
            << " extra, " << e.out_of_order << " entities out of order; "
            << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";
  EXPECT_EQ(e.missing, 0u) << e.first_problem;
  EXPECT_EQ(t.duplicate_ids, 0u) << e.first_problem;
  EXPECT_EQ(e.duplicated, 0u) << e.first_problem;
  EXPECT_EQ(e.unexpected, 0u) << e.first_problem;
  EXPECT_EQ(e.out_of_order, 0u) << e.first_problem;
  EXPECT_EQ(t.records, w.changes + w.deletes) << "every change, and a tombstone after each delete";
  EXPECT_EQ(resumed, static_cast<size_t>(killed)) << "every restart resumes from a checkpoint";
  EXPECT_TRUE(run_->alive()) << run_->tails();
}

TEST_F(PostgresExactlyOnceKillTest, KilledAtRandomMomentsDeliversEveryChangeOnce) {
  killed_at_random_moments();
}

// At parallelism 1 the sink runs in the transform's task, chained, without the key_by (PipelineRunner::create):
// the same kills, the same check.
TEST_F(PostgresExactlyOnceKillTest, KilledAtRandomMomentsWithTheSinkChainedDeliversEveryChangeOnce) {
  parallelism_ = 1;
  killed_at_random_moments();
}

// A kill while the initial snapshot has emitted nothing yet (found by a fresh-user trial: checkpoint 1 completed
// while the slot was being created; the restart found the slot, read a snapshot the slot had not exported and
// streamed from the slot's older position: the changes in between came twice, in committed exactly-once output).
// After the kill rows change, and the job restarts: the topic (read_committed) must hold each row once as a
// snapshot read of its current state, then the later changes, nothing twice.
void PostgresExactlyOnceKillTest::slot_creation_kill(bool crash_at_slot) {
  constexpr int64_t kRows = 300;
  db_->exec("INSERT INTO public." + db_->table() + " SELECT g, 0 FROM generate_series(0, " + std::to_string(kRows - 1) +
            ") g");
  const std::string topic = kafka::unique_topic("pg-eo-slot");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "p.yaml") << pipeline_yaml(topic, "300ms");
  run_ = std::make_unique<SluiceProcess>("run", dir_ / "p.yaml", dir_);
  if (crash_at_slot) {
    ASSERT_TRUE(run_->start("postgres.after-create-slot=crash"));
    ASSERT_TRUE(run_->wait_exit(kStartDeadline)) << run_->tails(15);
    ASSERT_NE(chaos::read_file(run_->log()).find("fault point 'postgres.after-create-slot' fired: SIGKILL"),
              std::string::npos)
        << run_->tails(15);
  } else {
    ASSERT_TRUE(run_->start("postgres.after-create-slot=hang"));
    ASSERT_TRUE(run_->wait_log(
        [](const std::string& log) {
          return log.find("'postgres.after-create-slot' fired: hang") != std::string::npos;
        },
        "the reader held after creating the slot", kStartDeadline));
    const size_t before = count_of(chaos::read_file(run_->log()), "completed checkpoint");
    ASSERT_TRUE(run_->wait_running(before + 2, kStartDeadline));
    run_->kill_now();
  }

  // Changes after the slot's consistent point, before the restart: the restart's snapshot has them.
  std::map<int64_t, std::vector<std::string>> expected;
  db_->exec("UPDATE public." + db_->table() + " SET revision = revision + 1 WHERE id < 100");
  db_->exec("INSERT INTO public." + db_->table() + " SELECT g, 0 FROM generate_series(" + std::to_string(kRows) + ", " +
            std::to_string(kRows + 49) + ") g");
  db_->exec("DELETE FROM public." + db_->table() + " WHERE id >= 100 AND id < 120");
  for (int64_t id = 0; id < kRows + 50; ++id) {
    if (id >= 100 && id < 120) continue;
    expected[id].push_back(id < 100 ? "r/1" : "r/0");
  }
  ASSERT_TRUE(run_->start());
  ASSERT_TRUE(run_->wait_running(1, kStartDeadline));
  // Changes after the restart: streamed once.
  db_->exec("UPDATE public." + db_->table() + " SET revision = revision + 1 WHERE id >= 200 AND id < 210");
  for (int64_t id = 200; id < 210; ++id)
    expected[id].push_back("u/1");
  db_->exec("DELETE FROM public." + db_->table() + " WHERE id = 0");
  expected[0].push_back("d");
  expected[0].push_back("tombstone");
  Workload w;
  w.expected = expected;
  size_t want = 0;
  for (const auto& [id, l] : expected)
    want += l.size();

  std::vector<Event> events;
  chaos::CommittedReader reader(bootstrap_, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<Event> e = parse_event(r, topic)) events.push_back(std::move(*e));
  });
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end && events.size() < want) {
    reader.read_for(1s);
    ASSERT_TRUE(run_->alive()) << run_->tails(15);
  }
  reader.read_for(2s);
  const Tally t = tally(events, w);
  const chaos::SequenceTally& e = t.per_entity;
  const std::string logs = run_->all_logs();
  std::cout << "kill after slot creation: " << want << " records expected; topic: " << t.records << " records, "
            << t.duplicate_ids << " duplicated ids, " << e.missing << " missing, " << e.duplicated + e.unexpected
            << " extra\n";
  EXPECT_EQ(e.missing, 0u) << e.first_problem;
  EXPECT_EQ(t.duplicate_ids, 0u) << e.first_problem;
  EXPECT_EQ(e.duplicated, 0u) << e.first_problem;
  EXPECT_EQ(e.unexpected, 0u) << e.first_problem;
  EXPECT_EQ(e.out_of_order, 0u) << e.first_problem;
  EXPECT_EQ(t.records, want);
  if (!crash_at_slot) {
    EXPECT_NE(logs.find("resuming from checkpoint"), std::string::npos) << "the restart restores a checkpoint";
  }
  EXPECT_NE(logs.find("dropping and re-creating it"), std::string::npos);
  EXPECT_TRUE(run_->alive()) << run_->tails();
}

TEST_F(PostgresExactlyOnceKillTest, KilledAfterSlotCreationBeforeTheFirstSnapshotRowRepeatsNothing) {
  if (db_ == nullptr) GTEST_SKIP() << "services not available";
  slot_creation_kill(false);
}

TEST_F(PostgresExactlyOnceKillTest, CrashRightAfterSlotCreationRepeatsNothing) {
  if (db_ == nullptr) GTEST_SKIP() << "services not available";
  slot_creation_kill(true);
}

// A kill during the initial snapshot, after rows were emitted and a checkpoint completed: under exactly-once the
// restore cannot resume the snapshot exactly (snapshot-resume: fail), and no restart from that checkpoint can do
// better. The job must fail once, naming the reason, instead of restarting into the same failure for ever (the
// default restart strategy of a CDC job retries without bound): the restarted process ends by itself with the job
// FAILED, no RESTARTING in its log, and the reason in its failure.
TEST_F(PostgresExactlyOnceKillTest, AnInterruptedSnapshotFailsTheJobOnceInsteadOfRestartingForEver) {
  if (db_ == nullptr) GTEST_SKIP() << "services not available";
  db_->exec("INSERT INTO public." + db_->table() + " SELECT g, 0 FROM generate_series(0, 1999) g");
  const std::string topic = kafka::unique_topic("pg-eo-snapfail");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "p.yaml") << pipeline_yaml(topic, "300ms");
  run_ = std::make_unique<SluiceProcess>("run", dir_ / "p.yaml", dir_);
  // The reader hands over its first 256 snapshot rows, then is held: checkpoints complete with them emitted.
  ASSERT_TRUE(run_->start("postgres.snapshot-push=hang"));
  ASSERT_TRUE(run_->wait_log(
      [](const std::string& log) { return log.find("'postgres.snapshot-push' fired: hang") != std::string::npos; },
      "the reader held inside the snapshot", kStartDeadline));
  const size_t before = count_of(chaos::read_file(run_->log()), "completed checkpoint");
  ASSERT_TRUE(run_->wait_running(before + 2, kStartDeadline));
  run_->kill_now();

  ASSERT_TRUE(run_->start());
  const auto started = Clock::now();
  // Without the mark the job restarts every few seconds (backoff 1 s, x1.5, ...) and never ends.
  ASSERT_TRUE(run_->wait_exit(90s)) << "the job did not end: " << count_of(chaos::read_file(run_->log()), "RESTARTING")
                                    << " restarts so far\n"
                                    << run_->tails(20);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  const std::string log = chaos::read_file(run_->log());
  std::cout << "the restarted job ended after " << took.count() << " ms with " << count_of(log, "RESTARTING")
            << " restarts\n";
  EXPECT_TRUE(WIFEXITED(run_->status()) && WEXITSTATUS(run_->status()) != 0) << "status " << run_->status();
  EXPECT_NE(log.find("resuming from checkpoint"), std::string::npos) << run_->tails(20);
  EXPECT_EQ(count_of(log, "RESTARTING"), 0u) << run_->tails(20);
  // Each failure of a task is logged once as "job '<name>' (<id>): <error>".
  EXPECT_EQ(count_of(log, "): connector error: operator 'Source: postgres' failed"), 1u)
      << "the source failed once, not once per restart\n"
      << run_->tails(20);
  EXPECT_NE(log.find("FAILED"), std::string::npos) << run_->tails(20);
  EXPECT_NE(log.find("not recoverable by a restart: the checkpoint was taken during the initial snapshot"),
            std::string::npos)
      << run_->tails(20);
}

// Two pipelines given one slot (found by a fresh-user trial: the second, starting without state, waited for the slot
// and dropped it the moment the first job's TaskManager was killed, and the first then failed for good on restore).
// A job that starts without state must never take over a slot another job streams: it fails at once, naming the
// holder, and the first job keeps its slot across a SIGKILL and resumes from its checkpoint.
TEST_F(PostgresExactlyOnceKillTest, AJobStartingWithoutStateNeverTakesOverASlotAnotherJobStreams) {
  if (db_ == nullptr) GTEST_SKIP() << "services not available";
  const std::string topic = kafka::unique_topic("pg-slot-a");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "a.yaml") << pipeline_yaml(topic);
  run_ = std::make_unique<SluiceProcess>("a", dir_ / "a.yaml", dir_);
  ASSERT_TRUE(run_->start());
  ASSERT_TRUE(run_->wait_running(1, kStartDeadline)) << run_->tails(15);
  db_->exec("INSERT INTO public." + db_->table() + " SELECT g, 0 FROM generate_series(0, 99) g");
  // The first job streams from its slot (its walsender holds it) before the second looks.
  ASSERT_TRUE(testing::poll_until([&] { return db_->has_slot(true); }, kStartDeadline)) << run_->tails(15);

  // Another pipeline (its own name and checkpoints), the same slot.
  const std::string other_topic = kafka::unique_topic("pg-slot-b");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, other_topic, kPartitions));
  std::ofstream(dir_ / "b.yaml") << chaos::pipeline_section("other_" + db_->table(), dir_ / "checkpoints-b", "200ms",
                                                            "exactly-once")
                                 << cdc_source_to_events(*db_, bootstrap_, other_topic);
  SluiceProcess other("b", dir_ / "b.yaml", dir_);
  ASSERT_TRUE(other.start());
  ASSERT_TRUE(other.wait_exit(kStartDeadline)) << "the second job did not fail\n" << other.tails(20);
  const std::string log = other.all_logs();
  EXPECT_NE(log.find("slot " + db_->table() + " exists and is streamed by another connection"), std::string::npos)
      << other.tails(20);
  EXPECT_NE(log.find("application_name 'sluice-cdc-replication " + db_->table() + "'"), std::string::npos)
      << other.tails(20);
  EXPECT_NE(log.find("not recoverable by a restart"), std::string::npos) << other.tails(20);
  EXPECT_EQ(log.find("dropping and re-creating it"), std::string::npos) << other.tails(20);
  EXPECT_TRUE(run_->alive()) << run_->tails(15);
  EXPECT_TRUE(db_->has_slot()) << "the slot of the first job is gone";

  // The first job still owns its slot: killed and started again, it resumes from its checkpoint.
  run_->kill_now();
  db_->exec("UPDATE public." + db_->table() + " SET revision = revision + 1 WHERE id < 10");
  ASSERT_TRUE(run_->start());
  ASSERT_TRUE(run_->wait_running(1, kStartDeadline)) << run_->tails(15);
  EXPECT_NE(chaos::read_file(run_->log()).find("resuming from checkpoint"), std::string::npos) << run_->tails(15);
  EXPECT_EQ(chaos::read_file(run_->log()).find("FAILED"), std::string::npos) << run_->tails(15);
  EXPECT_TRUE(run_->alive()) << run_->tails(15);
}

}  // namespace
}  // namespace sluice
