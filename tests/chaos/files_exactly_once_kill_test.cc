// Chaos test of the files sink's exactly-once delivery (issue 14): `sluice run` of a datagen -> files pipeline
// with `delivery: exactly-once` is SIGKILLed, by the test at seeded random moments and by itself at the crash
// fault points of the files sink's commit (SLUICE_FAULT_POINTS='files.before-rename=crash@k', the crash between
// the write and the rename, and 'files.after-rename=crash@k'), and restarted each time from its checkpoints.
// When the last run has finished, the test reads the output as a consumer does (only committed files: names not
// starting with '.'; a subtask's files in sequence order) and checks, for every (entity, revision) the source
// generated: zero missing, zero duplicates, and per entity the revisions in order. No service is needed.
//
// The datagen source is deterministic (record i is revision i / entities of charge i % entities), so a restart
// from a checkpoint regenerates exactly the records after the checkpointed position.
//
// Scale: CI runs 4 random kills and the two crash points over 20,000 records at 1,500 a second (about 30 s on two
// busy cores; a kill comes within 1.5 s of a run's first checkpoint, so the runs never reach the end early);
// SLUICE_CHAOS_SCALE=<factor> multiplies the records and the random kills (e.g. 10 for a long run). The seed is
// printed; SLUICE_TEST_SEED replays a run.
// Run: build/release/tests/files_exactly_once_kill_test
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/failures.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;

constexpr int kEntities = 500;
constexpr auto kStartDeadline = 60s;
constexpr auto kFinishDeadline = 150s;

// Waits until this start of `p` completed a checkpoint (a failure when it exited first).
::testing::AssertionResult wait_checkpoint(SluiceProcess& p) {
  return p.wait_log([](const std::string& log) { return count_of(log, "completed checkpoint") >= 1; },
                    "completed checkpoint", kStartDeadline);
}

class FilesExactlyOnceKillTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = chaos::make_test_dir("sluice-files-chaos"); }
  void TearDown() override { chaos::keep_or_remove(dir_, HasFailure()); }

  // Writes the pipeline file: `records` datagen charges on kEntities entities at `rate` per second, exactly once
  // into <dir>/out (part files rolled at 24 KiB or 900 ms), checkpoints every 200 ms, no restart inside the
  // process (a failure ends the run loudly).
  fs::path write_pipeline(int64_t records, int64_t rate, uint64_t seed) {
    const fs::path file = dir_ / "pipeline.yaml";
    std::ofstream(file)
        << "pipeline:\n"
        << "  name: files-exactly-once-chaos\n"
        << "  parallelism: 2\n"
        << "  checkpoint: { interval: 200ms, storage: \"" << (dir_ / "checkpoints").string() << "\" }\n"
        << "  delivery: exactly-once\n"
        << "  restart: { strategy: none }\n"
        << "source: { type: datagen, count: " << records << ", rate: " << rate << ", entities: " << kEntities
        << ", seed: " << (seed % 1'000'000) << " }\n"
        << "transform:\n"
        << "  - match: \"*.*.*\"\n"
        << "    key: after.id\n"
        << "    event:\n"
        << "      payload: \"after.id AS id, after.revision AS revision\"\n"
        << "sink:\n"
        << "  out:\n"
        << "    type: files\n"
        << "    path: \"" << (dir_ / "out").string()
        << "\"\n"
        // Part files roll by size and time, independent of the checkpoints: kills land while
        // in-progress files go on across checkpoints, so restores truncate and write on.
        << "    rolling-policy: { part-size: 24kb, rollover-interval: 900ms, inactivity-interval: 400ms }\n";
    return file;
  }

  // Runs the pipeline to its end (no fault); expects exit code 0. `records` at `rate` per second bound how long
  // the last run may take: a long run (SLUICE_CHAOS_SCALE) leaves most of its records to it.
  void finish(SluiceProcess& p, int64_t records = 0, int64_t rate = 1) {
    ASSERT_TRUE(p.start());
    const auto deadline =
        std::max<std::chrono::milliseconds>(kFinishDeadline, std::chrono::seconds(2 * records / rate));
    ASSERT_TRUE(p.wait_exit(deadline)) << "the last run did not finish\n" << tail(p.log());
    ASSERT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0)
        << "the last run ended with status " << p.status() << "\n"
        << tail(p.log());
  }

  // Starts a run with the crash fault point `point` armed after `skip` hits and waits for it to die of it.
  void crash_at(SluiceProcess& p, const std::string& point, int skip) {
    std::cout << "crash at " << point << " after " << skip << " hit(s)\n";
    ASSERT_TRUE(p.start(point + "=crash@" + std::to_string(skip)));
    ASSERT_TRUE(p.wait_exit(kFinishDeadline)) << "no crash at " << point << "\n" << tail(p.log());
    ASSERT_TRUE(WIFSIGNALED(p.status()) && WTERMSIG(p.status()) == SIGKILL)
        << "the run armed with " << point << " ended with status " << p.status() << "\n"
        << tail(p.log());
    EXPECT_NE(read_file(p.log()).find("fault point '" + point + "' fired: SIGKILL"), std::string::npos)
        << tail(p.log());
  }

  // Reads the committed output as a consumer does and checks it against the records 0..records-1: every
  // (entity, revision) once, each entity's revisions in order. Prints the counts.
  void check_output(int64_t records) {
    const fs::path out = dir_ / "out";
    struct Part {
      int subtask;
      int64_t sequence;
      fs::path path;
    };
    std::vector<Part> parts;
    std::vector<std::string> hidden;
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with('.')) {
        hidden.push_back(name);
        continue;
      }
      // part-<subtask>-<sequence>.jsonl
      int subtask = -1;
      int64_t sequence = -1;
      const char* b = name.data() + 5;
      const char* end = name.data() + name.size();
      auto r1 = std::from_chars(b, end, subtask);
      ASSERT_TRUE(name.starts_with("part-") && r1.ec == std::errc() && *r1.ptr == '-') << name;
      auto r2 = std::from_chars(r1.ptr + 1, end, sequence);
      ASSERT_TRUE(r2.ec == std::errc() && std::string_view(r2.ptr, end) == ".jsonl") << name;
      parts.push_back(Part{subtask, sequence, e.path()});
    }
    std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
      return std::tie(a.subtask, a.sequence) < std::tie(b.subtask, b.sequence);
    });
    EXPECT_TRUE(hidden.empty()) << "in-progress files left after the job finished: " << hidden.size() << ", e.g. "
                                << hidden.front();

    std::map<std::string, std::vector<int64_t>> seen;  // entity id -> revisions in consumption order
    int64_t lines = 0;
    for (const Part& part : parts) {
      std::ifstream in(part.path);
      std::string line;
      while (std::getline(in, line)) {
        ++lines;
        Result<Value> v = Value::from_json(line);
        ASSERT_TRUE(v.ok()) << part.path << ": " << line;
        const Value* payload = v->find("payload");
        ASSERT_TRUE(payload != nullptr && payload->find("id") != nullptr && payload->find("revision") != nullptr)
            << line;
        seen[std::string(payload->find("id")->as_string())].push_back(payload->find("revision")->as_int64());
      }
    }
    // Every entity's revisions 0..rounds-1, once each, in order.
    std::map<std::string, std::vector<int64_t>> want;
    for (int64_t e = 0; e < kEntities; ++e) {
      char id[16];
      std::snprintf(id, sizeof id, "ch_%08lld", static_cast<long long>(e));
      const int64_t rounds = records / kEntities + (e < records % kEntities ? 1 : 0);
      std::vector<int64_t>& revisions = want[id];
      for (int64_t r = 0; r < rounds; ++r)
        revisions.push_back(r);
    }
    const chaos::SequenceTally t = chaos::compare_sequences(want, seen);
    const size_t missing = t.missing, duplicates = t.duplicated, out_of_order = t.out_of_order,
                 unexpected = t.unexpected;
    const std::string& first_problem = t.first_problem;
    std::cout << "committed files " << parts.size() << ", lines " << lines << " (expected " << records << "): missing "
              << missing << ", duplicates " << duplicates << ", entities out of order " << out_of_order
              << ", unexpected " << unexpected << "\n";
    EXPECT_EQ(lines, records);
    EXPECT_EQ(missing, 0u) << first_problem;
    EXPECT_EQ(duplicates, 0u) << first_problem;
    EXPECT_EQ(out_of_order, 0u) << first_problem;
    EXPECT_EQ(unexpected, 0u) << first_problem;
  }

  fs::path dir_;
};

// The crash between the write and the rename: the in-progress file is synced and named by a completed checkpoint,
// the process dies before renaming it; the restart renames it (no loss) and writes nothing twice.
TEST_F(FilesExactlyOnceKillTest, ACrashBetweenWriteAndRenameLosesAndRepeatsNothing) {
  const uint64_t seed = testing::test_seed();
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED)\n";
  constexpr int64_t kRecords = 4000;
  SluiceProcess p("run", write_pipeline(kRecords, 1000, seed), dir_);
  ASSERT_NO_FATAL_FAILURE(crash_at(p, "files.before-rename", 2));
  ASSERT_NO_FATAL_FAILURE(crash_at(p, "files.after-rename", 1));
  ASSERT_NO_FATAL_FAILURE(finish(p));
  EXPECT_NE(read_file(p.log()).find("resuming from checkpoint"), std::string::npos) << tail(p.log());
  check_output(kRecords);
}

// SIGKILL at seeded random moments, mixed with crashes at the commit's fault points.
TEST_F(FilesExactlyOnceKillTest, SigkillAtRandomMomentsLosesAndRepeatsNothing) {
  const uint64_t seed = testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int64_t records = static_cast<int64_t>(20'000 * scale);
  const int kills = std::max(1, static_cast<int>(4 * scale));
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), scale " << scale << " (SLUICE_CHAOS_SCALE): " << records
            << " records, " << kills << " random kills\n";
  std::mt19937_64 rnd(seed);
  constexpr int64_t kRate = 1500;
  SluiceProcess p("run", write_pipeline(records, kRate, seed), dir_);
  // The crash points go at seeded places among the random kills.
  std::vector<std::string> plan(static_cast<size_t>(kills), "kill");
  plan.insert(plan.begin() + static_cast<std::ptrdiff_t>(rnd() % (plan.size() + 1)), "files.before-rename");
  plan.insert(plan.begin() + static_cast<std::ptrdiff_t>(rnd() % (plan.size() + 1)), "files.after-rename");
  bool finished_early = false;
  for (const std::string& step : plan) {
    if (step != "kill") {
      ASSERT_NO_FATAL_FAILURE(crash_at(p, step, static_cast<int>(rnd() % 6)));
      continue;
    }
    ASSERT_TRUE(p.start());
    ASSERT_TRUE(wait_checkpoint(p));
    // The kill moment: a seeded delay after the run's first completed checkpoint (not a synchronisation).
    const auto delay = std::chrono::milliseconds(rnd() % 1500);
    std::this_thread::sleep_for(delay);
    if (!p.alive()) {
      ASSERT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0) << tail(p.log());
      std::cout << "the run finished before its kill; the remaining kills are skipped\n";
      finished_early = true;
      break;
    }
    std::cout << "SIGKILL " << delay.count() << " ms after the first checkpoint of run " << &step - plan.data() << "\n";
    p.kill_now();
  }
  if (!finished_early) {
    ASSERT_NO_FATAL_FAILURE(finish(p, records, kRate));
  }
  check_output(records);
}

}  // namespace
}  // namespace sluice
