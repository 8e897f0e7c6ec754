// Chaos test of exactly-once from MongoDB (issue 14): `sluice run` of a pipeline MongoDB -> Kafka with
// `delivery: exactly-once` and 200 ms checkpoints is SIGKILLed at seeded random moments (one of them during the
// initial snapshot, after a checkpoint of that snapshot completed) and restarted from its checkpoints each time,
// while a seeded workload of inserts, replaces and deletes runs. Then a read_committed consumer reads the topic:
//  (a) zero duplicates: every event id (domain event ids derive from the source position and the key) appears once;
//  (b) zero missing, zero extra stream events: the positions of the committed c/u/d events are exactly the change
//      stream of the collection from the snapshot's resume point T0 (read by the test with its own change stream);
//  (c) the snapshot: every `r` read has the same T0 (one snapshot, resumed across the kill, not restarted), no
//      document is read twice, and every document the workload never touched is read once;
//  (d) per-key order: the stream events of each entity come in change-stream order (one entity, one partition);
//  (e) the run after the kill during the snapshot resumed the scan after the last document of the checkpoint,
//      and every restart resumed from a checkpoint;
//  (f) tombstones (the Kafka sink's tombstones-on-delete, default true): per entity, every delete is followed by
//      one tombstone (its key, a null value, in the same transaction) and every tombstone follows a delete.
// Scale: SLUICE_CHAOS_SCALE (a factor, default 1: 20,000 documents, 2,000 changes, 1 + 3 kills, 1-2.5 minutes on
// two busy cores: the emulator slows down as its oplog grows). By hand, e.g. SLUICE_CHAOS_SCALE=20: 40,000
// changes, 1 + 60 kills.
// The seed is printed; SLUICE_TEST_SEED replays it.
// Run: scripts/services/run-with mongodb kafka -- build/<preset>/tests/mongodb_exactly_once_kill_test
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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
#include "chaos/mongodb_workload.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace kafka = sluice::testing::kafka;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;
using sluice::testing::poll_until;
using sluice::testing::unique_name;
using namespace sluice::chaos::mongo;  // NOLINT(google-build-using-namespace): the workload of this test

constexpr int kDocuments = 50'000;  // in the collection before the job starts: the initial snapshot
constexpr int kChanges = 2'000;     // the workload while the job runs
constexpr int kStreamKills = 3;
constexpr int kBatch = 100;             // changes per bulk write
constexpr int kChangesPerSecond = 600;  // the workload's pace: the kills spread over some seconds
constexpr int kPartitions = 3;
constexpr auto kStartDeadline = 90s;
constexpr auto kCatchUpDeadline = 120s;

class MongoExactlyOnceKillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* s : {"kafka", "mongodb"}) {
      if (!testing::require_service(s).available) return;
    }
    bootstrap_ = testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    mongo_ = std::make_unique<Mongo>(testing::require_service("mongodb").get("MONGODB_URI"));
    dir_ = chaos::make_test_dir("sluice-eo-chaos");
  }
  void TearDown() override {
    if (job_) job_->stop();
    if (HasFailure() && job_) std::cout << job_->tails();
    chaos::keep_or_remove(dir_, HasFailure());
    mongo_.reset();
  }

  std::string pipeline_yaml(const std::string& topic) const {
    return chaos::pipeline_section("eo-chaos-" + dir_.filename().string(), dir_ / "checkpoints", "200ms",
                                   "exactly-once") +
           cdc_source_to_events(*mongo_, bootstrap_, topic);
  }

  std::string bootstrap_;
  std::unique_ptr<Mongo> mongo_;
  fs::path dir_;
  std::unique_ptr<SluiceProcess> job_;
};

TEST_F(MongoExactlyOnceKillTest, SigkilledRunsLoseNothingAndDuplicateNothing) {
  const auto t_start = Clock::now();
  const uint64_t seed = testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int documents = std::max(5'000, static_cast<int>(kDocuments * std::min(scale, 3.0)));
  const int changes = std::max(kBatch, static_cast<int>(kChanges * scale));
  const int stream_kills = std::max(1, static_cast<int>(kStreamKills * scale));
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), " << documents << " documents, " << changes << " changes, "
            << stream_kills << " kills while streaming + 1 during the snapshot\n";
  const Workload w = make_workload(seed, documents, changes);
  mongo_->insert_documents(documents);

  const std::string topic = kafka::unique_topic("eo-chaos");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "pipeline.yaml") << pipeline_yaml(topic);
  job_ = std::make_unique<SluiceProcess>("run", dir_ / "pipeline.yaml", dir_);

  // 1. The kill during the initial snapshot: after a checkpoint completed while the scan ran.
  ASSERT_TRUE(job_->start());
  size_t checkpoints_before = 0;
  ASSERT_TRUE(job_->wait_log(
      [&](const std::string& log) {
        const size_t at = log.find("snapshot of '");
        if (at == std::string::npos) return false;
        // Two: the first may have been taken before the scan emitted anything.
        const size_t n = count_of(log.substr(at), "completed checkpoint");
        checkpoints_before = n;
        return n >= 2;
      },
      "completed checkpoint during the snapshot", kStartDeadline));
  job_->kill_now();
  const std::string first_log = read_file(job_->log());
  ASSERT_EQ(first_log.find("' done;"), std::string::npos)
      << "the snapshot ended before the kill: raise the document count so that the kill hits it\n"
      << tail(job_->log());
  std::cout << "killed during the snapshot after " << checkpoints_before << " checkpoint(s) of it\n";
  int kills = 1;
  ASSERT_TRUE(job_->start());
  const fs::path after_snapshot_kill = job_->log();
  ASSERT_TRUE(job_->wait_running(1, kStartDeadline));

  // 2. The workload, with kills at seeded batch boundaries (each once the run completed a checkpoint), a seeded
  // moment after the batch.
  const size_t batches = (w.changes.size() + kBatch - 1) / kBatch;
  std::mt19937_64 rnd(seed ^ 0x5deece66dULL);
  std::map<size_t, int> kill_at;  // batch -> delay in ms after it
  for (int k = 0; k < stream_kills; ++k) {
    const size_t lo = batches * static_cast<size_t>(k) / static_cast<size_t>(stream_kills);
    const size_t hi = std::max(lo + 1, batches * static_cast<size_t>(k + 1) / static_cast<size_t>(stream_kills));
    kill_at[lo + rnd() % (hi - lo)] = static_cast<int>(rnd() % 400);
  }
  std::cout << "kills after batches";
  for (const auto& [b, ms] : kill_at)
    std::cout << " " << b << "+" << ms << "ms";
  std::cout << " of " << batches << "\n";
  const auto workload_start = Clock::now();
  for (size_t batch = 0; batch < batches; ++batch) {
    const size_t begin = batch * kBatch;
    const size_t end = std::min(w.changes.size(), begin + kBatch);
    ASSERT_NO_FATAL_FAILURE(mongo_->apply(w.changes, begin, end));
    if (auto k = kill_at.find(batch); k != kill_at.end()) {
      ASSERT_TRUE(job_->wait_running(1, kStartDeadline));
      std::this_thread::sleep_for(std::chrono::milliseconds(k->second));  // the seeded kill moment, not a wait
      job_->kill_now();
      ++kills;
      ASSERT_TRUE(job_->start());
    }
    // Pace the workload so that the kills spread over seconds of streaming.
    std::this_thread::sleep_until(workload_start +
                                  std::chrono::milliseconds(1000 * static_cast<int64_t>(end) / kChangesPerSecond));
  }
  ASSERT_TRUE(job_->wait_running(1, kStartDeadline));
  const double workload_s = std::chrono::duration<double>(Clock::now() - workload_start).count();

  // 3. The snapshot's resume point, from the committed snapshot reads, and the changes the stream must carry.
  std::vector<Event> events;
  chaos::CommittedReader reader(bootstrap_, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<Event> e = parse_event(r, topic)) events.push_back(std::move(*e));
  });
  std::string t0;
  ASSERT_TRUE(poll_until(
      [&] {
        if (!reader.drain()) return false;
        t0 = snapshot_resume_point(events);
        return !t0.empty();
      },
      kCatchUpDeadline))
      << "no snapshot read in the topic\n"
      << job_->tails();
  unsigned t = 0;
  unsigned i = 0;
  ASSERT_EQ(std::sscanf(t0.c_str(), "Timestamp(%u, %u)", &t, &i), 2) << t0;
  const std::vector<Mongo::StreamChange> expected = mongo_->changes_from(t, i);
  const std::set<std::string> expected_positions = positions_of(expected);
  ASSERT_EQ(expected_positions.size(), expected.size()) << "the change stream repeated a token";

  // 4. Catch up: every expected stream position committed; then stop the job and read everything once more.
  const bool caught_up = poll_until(
      [&] {
        if (!reader.drain()) return false;
        const std::set<std::string> got = stream_positions(events);
        return std::includes(got.begin(), got.end(), expected_positions.begin(), expected_positions.end());
      },
      kCatchUpDeadline, 200ms);
  job_->stop();
  ASSERT_TRUE(reader.drain());
  const std::set<std::string> got = stream_positions(events);
  const std::vector<std::string> missing = positions_missing(expected_positions, got);
  const std::vector<std::string> extra = positions_missing(got, expected_positions);
  EXPECT_TRUE(caught_up) << missing.size() << " stream changes never arrived";

  const Checked checked = expect_exactly_once(events, expected, missing, extra, documents, w);

  // (e) The run after the kill during the snapshot went on after the checkpoint's last document; every restart
  // resumed from a checkpoint.
  EXPECT_NE(read_file(after_snapshot_kill).find("' resumes after "), std::string::npos)
      << "the snapshot did not resume after the checkpoint's last document\n"
      << tail(after_snapshot_kill);
  for (int s = 1; s < job_->starts(); ++s) {
    EXPECT_NE(read_file(job_->log_for(s)).find("resuming from checkpoint"), std::string::npos)
        << job_->log_for(s) << "\n"
        << tail(job_->log_for(s));
  }

  std::cout << "MongoDB exactly-once: " << documents << " documents, " << w.changes.size() << " changes ("
            << expected.size() << " in the stream from T0 " << t0 << "), " << kills
            << " kills; topic: " << events.size() << " records, " << checked.snapshot_reads << " snapshot reads, "
            << got.size() << " stream events, " << checked.tombstones << " tombstones; missing " << missing.size()
            << ", extra " << extra.size() << ", duplicates " << checked.duplicates << ", out of order "
            << checked.out_of_order << "; workload " << workload_s << " s, "
            << std::chrono::duration<double>(Clock::now() - t_start).count() << " s in all\n";
}

}  // namespace
}  // namespace sluice
