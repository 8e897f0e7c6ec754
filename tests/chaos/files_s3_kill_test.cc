// Chaos test of the files sink on S3 (issue 15 item 3): `sluice run` of a datagen -> files pipeline with
// `delivery: exactly-once` writing part files to s3://<bucket>/<prefix> on moto (scripts/services/s3) is SIGKILLed
// three times at seeded moments after a completed checkpoint, and once by itself at the fault point
// `files.s3.after-complete` (CompleteMultipartUpload done, the process dies before the commit is recorded, so the
// restore completes the same upload again: S3 no longer knows it, the object must be the one its parts make).
// Each run restores from the local checkpoints. When the last run has finished, the test reads every object under
// the prefix as a consumer does (a subtask's part files in sequence order) and checks, for every (entity, revision)
// the source generated: 0 missing, 0 duplicated, each entity's revisions in order; and that no multipart upload is
// left under the prefix (ListMultipartUploads: 0), so nothing a crash left is billed on.
//
// About 20-30 s on two busy cores. The seed is printed; SLUICE_TEST_SEED replays a run; SLUICE_CHAOS_SCALE=<factor>
// multiplies the records and the kills. Needs the s3 service: scripts/services/run-with s3 -- ctest -R files_s3.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

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
#include "integration/test_util/s3.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;

constexpr int kEntities = 300;
constexpr auto kStartDeadline = 90s;
constexpr auto kFinishDeadline = 150s;
constexpr const char* kBucket = "sluice-test";

class FilesS3KillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = testing::require_service("s3").get("S3_ENDPOINT");
    ::setenv("AWS_ACCESS_KEY_ID", "sluice-test-key", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "sluice-test-secret", 1);
    dir_ = chaos::make_test_dir("sluice-files-s3-chaos");
    prefix_ = fmt::format("files-s3-{}-{}", ::getpid(),
                          std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1));
    client_ = testing::s3_test_client(endpoint_);
    ASSERT_TRUE(client_->create_bucket(kBucket).ok());
  }
  void TearDown() override { chaos::keep_or_remove(dir_, HasFailure()); }

  // `records` datagen charges at `rate` per second, exactly once into s3://<bucket>/<prefix>, checkpoints to a local
  // directory every 200 ms, no restart inside the process (a failure ends the run loudly).
  fs::path write_pipeline(int64_t records, int64_t rate, uint64_t seed) {
    const fs::path file = dir_ / "pipeline.yaml";
    std::ofstream(file) << "pipeline:\n"
                        << "  name: files-s3-chaos\n"
                        << "  parallelism: 2\n"
                        << "  checkpoint: { interval: 200ms, storage: \"" << (dir_ / "checkpoints").string() << "\" }\n"
                        << "  delivery: exactly-once\n"
                        << "  restart: { strategy: none }\n"
                        << "  config:\n"
                        << "    s3.endpoint: \"" << endpoint_ << "\"\n"
                        << "    s3.path-style-access: true\n"
                        << "source: { type: datagen, count: " << records << ", rate: " << rate
                        << ", entities: " << kEntities << ", seed: " << (seed % 1'000'000) << " }\n"
                        << "transform:\n"
                        << "  - match: \"*.*.*\"\n"
                        << "    key: after.id\n"
                        << "    event:\n"
                        << "      payload: \"after.id AS id, after.revision AS revision\"\n"
                        << "sink:\n"
                        << "  out:\n"
                        << "    type: files\n"
                        << "    path: \"s3://" << kBucket << "/" << prefix_ << "\"\n"
                        << "    rolling-policy: { part-size: 24kb }\n";
    return file;
  }

  // Reads every committed object under the prefix and checks it against records 0..records-1.
  void check_output(int64_t records) {
    const std::vector<testing::S3PartObject> parts = testing::list_s3_part_files(*client_, kBucket, prefix_);
    std::map<std::string, std::vector<int64_t>> seen;
    int64_t lines = 0;
    for (const testing::S3PartObject& part : parts) {
      auto body = client_->get_object(kBucket, part.key);
      ASSERT_TRUE(body.ok()) << body.error().to_string();
      size_t at = 0;
      while (at < body->size()) {
        size_t nl = body->find('\n', at);
        ASSERT_NE(nl, std::string::npos) << part.key << " does not end with a line break";
        const std::string line = body->substr(at, nl - at);
        at = nl + 1;
        ++lines;
        Result<Value> v = Value::from_json(line);
        ASSERT_TRUE(v.ok()) << part.key << ": " << line;
        const Value* payload = v->find("payload");
        ASSERT_TRUE(payload != nullptr && payload->find("id") != nullptr && payload->find("revision") != nullptr)
            << line;
        seen[std::string(payload->find("id")->as_string())].push_back(payload->find("revision")->as_int64());
      }
    }
    std::map<std::string, std::vector<int64_t>> want;
    for (int64_t e = 0; e < kEntities; ++e) {
      const int64_t rounds = records / kEntities + (e < records % kEntities ? 1 : 0);
      std::vector<int64_t>& revisions = want[fmt::format("ch_{:08d}", e)];
      for (int64_t r = 0; r < rounds; ++r)
        revisions.push_back(r);
    }
    const chaos::SequenceTally t = chaos::compare_sequences(want, seen);
    auto uploads = client_->list_multipart_uploads(kBucket, prefix_ + "/");
    ASSERT_TRUE(uploads.ok()) << uploads.error().to_string();
    std::cout << "objects " << parts.size() << ", lines " << lines << " (expected " << records << "): missing "
              << t.missing << ", duplicated " << t.duplicated << ", out of order " << t.out_of_order << ", unexpected "
              << t.unexpected << "; multipart uploads left " << uploads->size() << "\n";
    EXPECT_EQ(lines, records);
    EXPECT_EQ(t.missing, 0u) << t.first_problem;
    EXPECT_EQ(t.duplicated, 0u) << t.first_problem;
    EXPECT_EQ(t.out_of_order, 0u) << t.first_problem;
    EXPECT_EQ(t.unexpected, 0u) << t.first_problem;
    EXPECT_EQ(uploads->size(), 0u) << "e.g. " << (uploads->empty() ? "" : uploads->front().key);
  }

  std::string endpoint_, prefix_;
  std::shared_ptr<S3Client> client_;
  fs::path dir_;
};

TEST_F(FilesS3KillTest, SigkilledRunsLoseAndRepeatNothingAndLeaveNoUpload) {
  const uint64_t seed = testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int64_t records = static_cast<int64_t>(12'000 * scale);
  const int kills = std::max(1, static_cast<int>(3 * scale));
  constexpr int64_t kRate = 1200;
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), scale " << scale << " (SLUICE_CHAOS_SCALE): " << records
            << " records, " << kills << " SIGKILLs, prefix s3://" << kBucket << "/" << prefix_ << "\n";
  std::mt19937_64 rnd(seed);
  SluiceProcess p("run", write_pipeline(records, kRate, seed), dir_);
  // The crash after a CompleteMultipartUpload goes at a seeded place among the kills.
  std::vector<std::string> plan(static_cast<size_t>(kills), "kill");
  plan.insert(plan.begin() + static_cast<std::ptrdiff_t>(rnd() % (plan.size() + 1)), "files.s3.after-complete");
  bool finished_early = false;
  for (const std::string& step : plan) {
    if (step != "kill") {
      const int skip = static_cast<int>(rnd() % 4);
      std::cout << "crash at " << step << " after " << skip << " hit(s)\n";
      ASSERT_TRUE(p.start(step + "=crash@" + std::to_string(skip)));
      ASSERT_TRUE(p.wait_exit(kFinishDeadline)) << "no crash at " << step << "\n" << tail(p.log());
      ASSERT_TRUE(WIFSIGNALED(p.status()) && WTERMSIG(p.status()) == SIGKILL) << tail(p.log());
      continue;
    }
    ASSERT_TRUE(p.start());
    ASSERT_TRUE(p.wait_log([](const std::string& log) { return count_of(log, "completed checkpoint") >= 1; },
                           "completed checkpoint", kStartDeadline));
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
    ASSERT_TRUE(p.start());
    ASSERT_TRUE(p.wait_exit(kFinishDeadline)) << "the last run did not finish\n" << tail(p.log());
    ASSERT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0) << tail(p.log());
    EXPECT_NE(read_file(p.log()).find("resuming from checkpoint"), std::string::npos) << tail(p.log());
  }
  std::cout << "starts that aborted uploads a crashed run left: "
            << count_of(p.all_logs(), "multipart upload(s) that no checkpoint commits") << "\n";
  check_output(records);
}

}  // namespace
}  // namespace sluice
