// Checkpoints and savepoints on an S3-compatible object store (scripts/services/s3: moto's server on 127.0.0.1),
// through real `sluice run` children:
//  * the S3 client itself: objects, listings, a multipart upload of a state-sized object, 404s;
//  * a datagen -> files exactly-once pipeline checkpointing to s3://, SIGKILLed at seeded moments after
//    checkpoints and restarted from the newest checkpoint in the bucket: 0 missing, 0 duplicated, in order; old
//    checkpoints and superseded jobs deleted from the bucket; the secret key appears in no log;
//  * `sluice stop` writes a savepoint to S3, the next run restores it at parallelism 3 instead of 2;
//  * a checkpoint whose state file is larger than s3.multipart.threshold goes up as a multipart upload;
//  * a store that fails (paused: timeouts; killed: refused connections; restarted empty: refused writes) fails
//    checkpoints with the reason in the REST history and the metrics, /health turns unhealthy, and checkpoints
//    complete again when the store is back.
// Seeds are printed (SLUICE_TEST_SEED replays). Needs the s3 service (scripts/services/run-with s3 -- ...).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/child_process.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/s3.h"
#include "integration/test_util/services.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/core/config.h"
#include "sluice/core/s3_client.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;
using sluice::testing::poll_until;
using sluice::testing::PrivateS3Server;

constexpr int kEntities = 300;
constexpr auto kStartDeadline = 90s;
constexpr auto kFinishDeadline = 150s;
// Given to every child as its secret key: no log may contain it.
constexpr const char* kSecret = "sluiceS3secretNeverLogged0123456789";

std::string unique_name(const std::string& prefix) {
  return fmt::format("{}-{}-{}", prefix, ::getpid(),
                     std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1));
}

std::shared_ptr<S3Client> client_for(const std::string& endpoint, int64_t threshold = 64LL << 20) {
  return sluice::testing::s3_test_client(endpoint, threshold);
}

class S3CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto s3 = sluice::testing::require_service("s3");
    endpoint_ = s3.get("S3_ENDPOINT");
    server_bin_ = s3.get("S3_SERVER_BIN");
    ::setenv("AWS_ACCESS_KEY_ID", "sluice-test-key", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", kSecret, 1);
    dir_ = chaos::make_test_dir("sluice-s3");
    bucket_ = "sluice-test";
    prefix_ = unique_name("ckpt");
    client_ = client_for(endpoint_);
    ASSERT_TRUE(client_->create_bucket(bucket_).ok());
  }
  void TearDown() override { chaos::keep_or_remove(dir_, HasFailure()); }

  std::string storage() const { return fmt::format("s3://{}/{}", bucket_, prefix_); }

  // datagen -> files exactly-once, checkpoints to `storage` every 200 ms; `extra_config` lines go under config:.
  fs::path write_pipeline(int64_t records, int64_t rate, uint64_t seed, int parallelism, const std::string& store,
                          const std::string& endpoint, const std::string& extra_config = "",
                          const std::string& extra_pipeline = "") {
    const fs::path file = dir_ / "pipeline.yaml";
    std::ofstream(file) << "pipeline:\n"
                        << "  name: s3-checkpoints\n"
                        << "  parallelism: " << parallelism << "\n"
                        << "  checkpoint: { interval: 200ms, storage: \"" << store << "\" }\n"
                        << "  delivery: exactly-once\n"
                        << "  restart: { strategy: none }\n"
                        << "  http: { port: 0 }\n"
                        << extra_pipeline << "  config:\n"
                        << "    s3.endpoint: \"" << endpoint << "\"\n"
                        << "    s3.path-style-access: true\n"
                        << extra_config << "source: { type: datagen, count: " << records << ", rate: " << rate
                        << ", entities: " << kEntities << ", seed: " << (seed % 1'000'000) << " }\n"
                        << "transform:\n"
                        << "  - match: \"*.*.*\"\n"
                        << "    key: after.id\n"
                        << "    event:\n"
                        << "      payload: \"after.id AS id, after.revision AS revision\"\n"
                        << "sink:\n"
                        << "  out:\n"
                        << "    type: files\n"
                        << "    path: \"" << (dir_ / "out").string() << "\"\n"
                        << "    rolling-policy: { part-size: 24kb, rollover-interval: 900ms, inactivity-interval: "
                           "400ms }\n";
    return file;
  }

  void finish(SluiceProcess& p) {
    ASSERT_TRUE(p.start());
    ASSERT_TRUE(p.wait_exit(kFinishDeadline)) << "the last run did not finish\n" << tail(p.log());
    ASSERT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0)
        << "the last run ended with status " << p.status() << "\n"
        << tail(p.log());
  }

  // The committed output (files not starting with '.') against records 0..records-1: each (entity, revision)
  // once, each entity's revisions in order.
  void check_output(int64_t records) {
    std::map<std::pair<int, int64_t>, fs::path> parts;
    for (const auto& e : fs::directory_iterator(dir_ / "out")) {
      const std::string name = e.path().filename().string();
      if (name.starts_with('.')) continue;
      int subtask = -1;
      int64_t sequence = -1;
      const char* end = name.data() + name.size();
      auto r1 = std::from_chars(name.data() + 5, end, subtask);
      ASSERT_TRUE(name.starts_with("part-") && r1.ec == std::errc() && *r1.ptr == '-') << name;
      auto r2 = std::from_chars(r1.ptr + 1, end, sequence);
      ASSERT_TRUE(r2.ec == std::errc()) << name;
      parts[{subtask, sequence}] = e.path();
    }
    std::map<std::string, std::vector<int64_t>> seen;
    int64_t lines = 0;
    for (const auto& [order, path] : parts) {
      std::ifstream in(path);
      std::string line;
      while (std::getline(in, line)) {
        ++lines;
        Result<Value> v = Value::from_json(line);
        ASSERT_TRUE(v.ok()) << path << ": " << line;
        const Value* payload = v->find("payload");
        ASSERT_TRUE(payload != nullptr && payload->find("id") != nullptr) << line;
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
    std::cout << "committed files " << parts.size() << ", lines " << lines << " (expected " << records << "): missing "
              << t.missing << ", duplicates " << t.duplicated << ", out of order " << t.out_of_order << ", unexpected "
              << t.unexpected << "\n";
    EXPECT_EQ(lines, records);
    EXPECT_TRUE(t.clean()) << t.first_problem;
  }

  // The keys under the storage prefix.
  std::vector<std::string> keys_under(const std::string& prefix) {
    auto listing = client_->list(bucket_, prefix);
    EXPECT_TRUE(listing.ok()) << listing.error().to_string();
    std::vector<std::string> keys;
    if (listing.ok()) {
      for (const auto& o : listing->objects)
        keys.push_back(o.key);
    }
    return keys;
  }

  void expect_no_secret(const std::string& logs) {
    EXPECT_EQ(logs.find(kSecret), std::string::npos) << "the secret key appears in a log";
  }

  std::string endpoint_, server_bin_, bucket_, prefix_;
  std::shared_ptr<S3Client> client_;
  fs::path dir_;
};

TEST_F(S3CheckpointTest, ClientPutsGetsListsDeletesAndUploadsInParts) {
  const std::string base = unique_name("client");
  ASSERT_TRUE(client_->put_object(bucket_, base + "/a/one", "first").ok());
  ASSERT_TRUE(client_->put_object(bucket_, base + "/a/two", "second").ok());
  ASSERT_TRUE(client_->put_object(bucket_, base + "/b/three", "").ok());
  auto one = client_->get_object(bucket_, base + "/a/one");
  ASSERT_TRUE(one.ok()) << one.error().to_string();
  EXPECT_EQ(*one, "first");
  bool found = true;
  auto absent = client_->get_object(bucket_, base + "/nothing", &found);
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(found);
  auto missing = client_->get_object(bucket_, base + "/nothing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("HTTP 404"), std::string::npos) << missing.error().message();
  auto there = client_->exists(bucket_, base + "/a/two");
  ASSERT_TRUE(there.ok() && *there);

  auto dirs = client_->list(bucket_, base + "/", "/");
  ASSERT_TRUE(dirs.ok()) << dirs.error().to_string();
  EXPECT_EQ(dirs->common_prefixes, (std::vector<std::string>{base + "/a/", base + "/b/"}));

  // 12 MiB of seeded bytes with a 6 MiB threshold and 5 MiB parts: 3 parts, read back whole.
  auto parted = client_for(endpoint_, 6LL << 20);
  std::string big(12 << 20, '\0');
  std::mt19937_64 rnd(sluice::testing::test_seed());
  for (char& c : big)
    c = static_cast<char>(rnd());
  {
    S3ObjectWriter w(parted, bucket_, base + "/big");
    for (size_t off = 0; off < big.size(); off += 100'000)
      ASSERT_TRUE(w.append(big.data() + off, std::min<size_t>(100'000, big.size() - off)).ok());
    ASSERT_TRUE(w.finish().ok());
    EXPECT_EQ(w.parts(), 3);
  }
  auto back = client_->get_object(bucket_, base + "/big");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(*back == big) << "the multipart object differs (" << back->size() << " bytes)";
  {
    // Not finished: aborted, nothing appears.
    S3ObjectWriter w(parted, bucket_, base + "/aborted");
    ASSERT_TRUE(w.append(big.data(), big.size()).ok());
  }
  auto aborted = client_->exists(bucket_, base + "/aborted");
  ASSERT_TRUE(aborted.ok());
  EXPECT_FALSE(*aborted);

  auto deleted = client_->delete_prefix(bucket_, base + "/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 4);
  EXPECT_TRUE(keys_under(base + "/").empty());
}

// What a JobManager checks before a restore on S3: one HEAD per state file (exists, size), no download; the
// TaskManager's read of the file checks the checksum and names the file.
TEST_F(S3CheckpointTest, TheSizeCheckIsAHeadAndTheReaderChecksTheChecksum) {
  Configuration config;
  config.set(options::kS3Endpoint, endpoint_);
  config.set(options::kS3PathStyleAccess, true);
  ASSERT_TRUE(S3Client::configure(config).ok());
  auto storage = FileCheckpointStorage::create(this->storage(), "size-check");
  ASSERT_TRUE(storage.ok()) << storage.error().to_string();
  auto dir = storage->init_checkpoint(1);
  ASSERT_TRUE(dir.ok()) << dir.error().to_string();
  auto handle = storage->write_subtask_state(*dir, "op", 0, std::string(1000, 'x'), nullptr);
  ASSERT_TRUE(handle.ok()) << handle.error().to_string();
  const std::string path = dir->native() + "/" + handle->file;
  const std::string key = prefix_ + "/size-check/chk-1/" + handle->file;
  EXPECT_TRUE(FileCheckpointStorage::check_state_file_size(*dir, *handle).ok());

  auto bytes = client_->get_object(bucket_, key);
  ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
  ASSERT_EQ(bytes->size(), handle->file_size);
  std::string corrupted = *bytes;
  corrupted[500] ^= 0x01;
  ASSERT_TRUE(client_->put_object(bucket_, key, corrupted).ok());
  Status size_only = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  EXPECT_TRUE(size_only.ok()) << size_only.error().to_string();
  auto read = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.error().message().find(path), std::string::npos) << read.error().message();
  EXPECT_NE(read.error().message().find("checksum mismatch"), std::string::npos) << read.error().message();

  ASSERT_TRUE(client_->put_object(bucket_, key, corrupted.substr(0, 10)).ok());
  Status truncated = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message().find(path), std::string::npos) << truncated.error().message();
  EXPECT_NE(truncated.error().message().find("is truncated"), std::string::npos) << truncated.error().message();

  ASSERT_TRUE(client_->delete_object(bucket_, key).ok());
  Status missing = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("is missing"), std::string::npos) << missing.error().message();
  EXPECT_TRUE(client_->delete_prefix(bucket_, prefix_ + "/").ok());
}

// A state file larger than the reader keeps in memory (64 MiB) is downloaded into an unlinked temporary file and
// mapped (a savepoint of state larger than memory can be restored from S3): the bytes read back whole without the
// process's anonymous memory growing by the file; a corrupted, truncated or missing object is still reported.
TEST_F(S3CheckpointTest, ALargeStateFileIsDownloadedToDiskNotMemory) {
  Configuration config;
  config.set(options::kS3Endpoint, endpoint_);
  config.set(options::kS3PathStyleAccess, true);
  ASSERT_TRUE(S3Client::configure(config).ok());
  auto storage = FileCheckpointStorage::create(this->storage(), "large-read");
  ASSERT_TRUE(storage.ok()) << storage.error().to_string();
  auto dir = storage->init_checkpoint(1);
  ASSERT_TRUE(dir.ok()) << dir.error().to_string();
  std::string state(80 << 20, '\0');
  for (size_t i = 0; i < state.size(); i += 4096)
    state[i] = static_cast<char>(i / 4096);
  auto handle = storage->write_subtask_state(*dir, "op", 0, state, nullptr);
  ASSERT_TRUE(handle.ok()) << handle.error().to_string();
  auto anon = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("RssAnon:", 0) == 0) return std::strtoull(line.c_str() + 8, nullptr, 10) << 10;
    }
    return 0ULL;
  };
  {
    const uint64_t before = anon();
    auto read = FileCheckpointStorage::read_state_file(*dir, *handle);
    const uint64_t after = anon();
    ASSERT_TRUE(read.ok()) << read.error().to_string();
    EXPECT_TRUE((*read)->view().substr(handle->operator_state_offset, handle->operator_state_length) == state);
    // Anonymous memory is what a download into memory would take (80 MiB); curl's buffers are far smaller.
    EXPECT_LT(after - std::min(after, before), uint64_t{16} << 20) << "RssAnon " << before << " -> " << after;
  }
  const std::string key = prefix_ + "/large-read/chk-1/" + handle->file;
  auto bytes = client_->get_object(bucket_, key);
  ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
  (*bytes)[bytes->size() - 10] ^= 0x01;
  ASSERT_TRUE(client_->put_object(bucket_, key, *bytes).ok());
  auto corrupted = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(corrupted.ok());
  EXPECT_NE(corrupted.error().message().find("checksum mismatch"), std::string::npos) << corrupted.error().message();
  ASSERT_TRUE(client_->put_object(bucket_, key, bytes->substr(0, 70 << 20)).ok());
  auto truncated = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message().find("is truncated"), std::string::npos) << truncated.error().message();
  ASSERT_TRUE(client_->delete_object(bucket_, key).ok());
  auto missing = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("is missing"), std::string::npos) << missing.error().message();
  EXPECT_TRUE(client_->delete_prefix(bucket_, prefix_ + "/").ok());
}

// SIGKILL at seeded moments after checkpoints to S3; every restart resumes from the newest checkpoint in the bucket.
TEST_F(S3CheckpointTest, SigkilledRunsResumeFromS3CheckpointsLosingAndRepeatingNothing) {
  const uint64_t seed = sluice::testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int64_t records = static_cast<int64_t>(9'000 * scale);
  const int kills = std::max(1, static_cast<int>(3 * scale));
  constexpr int64_t kRate = 1200;
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), scale " << scale << ": " << records << " records, " << kills
            << " kills\n";
  std::mt19937_64 rnd(seed);
  SluiceProcess p("run", write_pipeline(records, kRate, seed, 2, storage(), endpoint_), dir_);
  bool finished_early = false;
  for (int k = 0; k < kills; ++k) {
    ASSERT_TRUE(p.start());
    ASSERT_TRUE(p.wait_log([](const std::string& log) { return count_of(log, "completed checkpoint") >= 1; },
                           "completed checkpoint", kStartDeadline));
    if (k > 0) {
      EXPECT_NE(read_file(p.log()).find("resuming from checkpoint s3://" + bucket_ + "/" + prefix_), std::string::npos)
          << tail(p.log());
    }
    const auto delay = std::chrono::milliseconds(rnd() % 1200);
    std::this_thread::sleep_for(delay);  // the kill moment (seeded), not a synchronisation
    if (!p.alive()) {
      finished_early = true;
      break;
    }
    std::cout << "SIGKILL " << delay.count() << " ms after the first checkpoint of run " << k << "\n";
    p.kill_now();
  }
  if (!finished_early) {
    ASSERT_NO_FATAL_FAILURE(finish(p));
  }
  check_output(records);
  expect_no_secret(p.all_logs());

  // Retention: one job prefix left (earlier runs' removed as superseded), holding at most one chk-<n>.
  std::set<std::string> jobs, checkpoints;
  for (const std::string& key : keys_under(prefix_ + "/")) {
    std::string_view rest = std::string_view(key).substr(prefix_.size() + 1);
    jobs.insert(std::string(rest.substr(0, rest.find('/'))));
    if (size_t c = rest.find("/chk-"); c != std::string_view::npos)
      checkpoints.insert(std::string(rest.substr(0, rest.find('/', c + 1))));
  }
  EXPECT_EQ(jobs.size(), 1u) << "job prefixes left: " << jobs.size();
  EXPECT_LE(checkpoints.size(), 1u) << "checkpoints left: " << checkpoints.size();
}

// `sluice stop` takes a savepoint into S3 (under <storage>/savepoints); the next run resumes from it at parallelism 3.
TEST_F(S3CheckpointTest, AStopSavepointOnS3IsRestoredAtAnotherParallelism) {
  const uint64_t seed = sluice::testing::test_seed();
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED)\n";
  constexpr int64_t kRecords = 6000;
  SluiceProcess p("run", write_pipeline(kRecords, 1000, seed, 2, storage(), endpoint_), dir_);
  ASSERT_TRUE(p.start());
  ASSERT_TRUE(p.wait_running(1, kStartDeadline));
  std::smatch m;
  const std::string log = read_file(p.log());
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(health at (http://[0-9.:]+), job id ([0-9a-f]+))"))) << log;
  sluice::testing::ChildProcess stop(SLUICE_BINARY, {"stop", "-m", m[1].str(), m[2].str()});
  ASSERT_EQ(stop.wait(120s), 0) << stop.err() << stop.out();
  ASSERT_TRUE(p.wait_exit(60s)) << tail(p.log());
  const std::string savepoint_prefix = prefix_ + "/savepoints/savepoint-";
  std::string metadata_key;
  for (const std::string& key : keys_under(prefix_ + "/savepoints/")) {
    if (key.starts_with(savepoint_prefix) && key.ends_with("/_metadata")) metadata_key = key;
  }
  ASSERT_FALSE(metadata_key.empty()) << "no savepoint in the bucket\n" << tail(p.log());

  write_pipeline(kRecords, 1000, seed, 3, storage(), endpoint_);
  ASSERT_NO_FATAL_FAILURE(finish(p));
  const std::string savepoint_dir = metadata_key.substr(0, metadata_key.size() - std::string("/_metadata").size());
  EXPECT_NE(read_file(p.log()).find("resuming from checkpoint s3://" + bucket_ + "/" + savepoint_dir),
            std::string::npos)
      << tail(p.log());
  check_output(kRecords);
  expect_no_secret(p.all_logs());
  auto kept = client_->exists(bucket_, metadata_key);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(*kept) << "a completed savepoint must never be deleted";
}

// A state file above s3.multipart.threshold goes up in parts; restoring it gives the same output.
TEST_F(S3CheckpointTest, ALargeStateFileIsUploadedInPartsAndRestored) {
  const uint64_t seed = sluice::testing::test_seed();
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED)\n";
  constexpr int64_t kRecords = 4000;
  // Threshold 1 byte, parts of 5 MiB: every state file is a multipart upload (of one part, S3's minimum rules
  // allow a last part of any size).
  SluiceProcess p("run",
                  write_pipeline(kRecords, 1000, seed, 2, storage(), endpoint_,
                                 "    s3.multipart.threshold: 1b\n    s3.multipart.part-size: 5mb\n"),
                  dir_);
  ASSERT_TRUE(p.start());
  ASSERT_TRUE(p.wait_running(2, kStartDeadline));
  p.kill_now();
  // Every state object of the stored checkpoints is a multipart object (its ETag ends in "-<parts>"), _metadata
  // a single PUT.
  auto listing = client_->list(bucket_, prefix_ + "/");
  ASSERT_TRUE(listing.ok()) << listing.error().to_string();
  int state_objects = 0;
  for (const S3Object& o : listing->objects) {
    if (o.key.find("/chk-") == std::string::npos) continue;
    const bool multipart = std::regex_search(o.etag, std::regex(R"(-[0-9]+"?$)"));
    if (o.key.ends_with("/_metadata")) {
      EXPECT_FALSE(multipart) << o.key << " " << o.etag;
    } else {
      ++state_objects;
      EXPECT_TRUE(multipart) << o.key << " has the ETag " << o.etag << " of a single PUT";
    }
  }
  EXPECT_GT(state_objects, 0);
  ASSERT_NO_FATAL_FAILURE(finish(p));
  EXPECT_NE(read_file(p.log()).find("resuming from checkpoint s3://"), std::string::npos) << tail(p.log());
  check_output(kRecords);
}

// The failing-store test runs its own moto server (to pause and kill it without disturbing other tests).
TEST_F(S3CheckpointTest, AFailingStoreFailsCheckpointsVisiblyAndTheJobRecoversWhenItIsBack) {
  ASSERT_FALSE(server_bin_.empty()) << "S3_SERVER_BIN is not set (scripts/services/s3 env)";
  PrivateS3Server server(server_bin_);
  ASSERT_TRUE(server.start());
  const std::string store = "s3://failing/" + unique_name("ckpt");
  SluiceProcess p("run",
                  write_pipeline(10'000'000, 200, 1, 1, store, server.endpoint(),
                                 "    s3.request-timeout: 1s\n    s3.max-attempts: 2\n"
                                 "    s3.retry.initial-backoff: 50ms\n"
                                 "    s3.secret-key: " +
                                     std::string(kSecret) +
                                     "\n    s3.access-key: failing-key\n"
                                     "    execution.checkpointing.tolerable-failed-checkpoints: 100000\n",
                                 "  health: { max-failed-checkpoints: 2 }\n"),
                  dir_);
  ASSERT_TRUE(p.start());
  ASSERT_TRUE(p.wait_running(1, kStartDeadline));
  std::smatch m;
  const std::string log = read_file(p.log());
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(health at (http://[0-9.:]+), job id ([0-9a-f]+))"))) << log;
  httplib::Client http(m[1].str());
  http.set_read_timeout(10, 0);
  const std::string job = m[2].str();
  auto health = [&] {
    auto r = http.Get("/health");
    return r ? r->status : -1;
  };
  auto failed_in_history = [&](const std::string& reason) {
    auto r = http.Get("/jobs/" + job + "/checkpoints");
    if (!r || r->status != 200) return false;
    auto v = Value::from_json(r->body);
    if (!v.ok()) return false;
    const Value* history = v->find("history");
    if (history == nullptr) return false;
    for (const Value& h : history->as_array()) {
      const Value* status = h.find("status");
      const Value* msg = h.find("failure_message");
      if (status != nullptr && status->as_string() == "FAILED" && msg != nullptr && msg->is_string() &&
          std::string(msg->as_string()).find(reason) != std::string::npos) {
        std::cout << "failed checkpoint in the REST history: " << msg->as_string() << "\n";
        return true;
      }
    }
    return false;
  };
  auto failed_metric = [&] {
    auto r = http.Get("/metrics");
    if (!r) return int64_t{-1};
    std::smatch mm;
    static const std::regex re(R"(numberOfFailedCheckpoints\{[^}]*\} ([0-9.e+]+))");
    return std::regex_search(r->body, mm, re) ? static_cast<int64_t>(std::stod(mm[1].str())) : int64_t{-1};
  };
  auto completed_after = [&](size_t n) { return count_of(read_file(p.log()), "completed checkpoint") > n; };
  ASSERT_TRUE(poll_until([&] { return health() == 200; }, 60s)) << tail(p.log());

  // 1. Paused: every request times out.
  server.pause();
  EXPECT_TRUE(poll_until([&] { return failed_in_history("Timeout"); }, 60s)) << tail(p.log());
  EXPECT_TRUE(poll_until([&] { return health() == 503; }, 60s)) << tail(p.log());
  const int64_t failed = failed_metric();
  std::cout << "numberOfFailedCheckpoints " << failed << "\n";
  EXPECT_GT(failed, 0);
  server.resume();
  size_t done = count_of(read_file(p.log()), "completed checkpoint");
  EXPECT_TRUE(poll_until([&] { return completed_after(done) && health() == 200; }, 90s)) << tail(p.log());

  // 2. Killed: connections refused.
  const int port = server.port();
  server.kill_now();
  EXPECT_TRUE(poll_until([&] { return failed_in_history("connect"); }, 60s)) << tail(p.log());
  EXPECT_TRUE(poll_until([&] { return health() == 503; }, 60s)) << tail(p.log());

  // 3. Back on the same port but empty (moto keeps nothing): writes refused (NoSuchBucket), until the bucket is
  ASSERT_TRUE(server.start(port, /*bucket=*/""));
  EXPECT_TRUE(poll_until([&] { return failed_in_history("NoSuchBucket"); }, 60s)) << tail(p.log());
  ASSERT_TRUE(client_for(server.endpoint())->create_bucket("failing").ok());
  done = count_of(read_file(p.log()), "completed checkpoint");
  EXPECT_TRUE(poll_until([&] { return completed_after(done) && health() == 200; }, 90s)) << tail(p.log());
  EXPECT_TRUE(p.alive()) << tail(p.log());
  p.stop();
  expect_no_secret(p.all_logs());
}

}  // namespace
}  // namespace sluice
