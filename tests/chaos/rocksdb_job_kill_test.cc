// Chaos test of a C++ job on the rocksdb state backend (issue 18): the keyed counting job (datagen sequence ->
// key_by(v % 1000) -> CountPerKey in RocksDB ValueState -> exactly-once files) runs in a child process (this
// binary re-executed with SLUICE_ROCKSDB_CHAOS_CHILD set) with state.backend.type: rocksdb and 200 ms
// checkpoints. The test SIGKILLs the child at seeded moments, each after a checkpoint of that run completed, and
// restarts it from the newest completed checkpoint; the last run reaches the end of input. It then reads the
// committed files as a consumer does and compares them with the failure-free output: every "key,count" line
// exactly once (a lost or replayed record shifts every later count of its key). It also checks that the RocksDB
// directories the killed processes left behind were removed by the next process.
//
// The incremental variant (state.backend.incremental, 3 retained checkpoints) kills each run only after a chain
// of 10 checkpoints of its own, and checks that every checkpoint it restored from referenced shared SST files.
// The windows variant does the same with an event-time window job whose timers are in RocksDB too
// (timer-service.factory: rocksdb): 1-second tumbling windows summing each of 50 keys, event time = value, every
// "key,window start,sum" line exactly once.
//
// Scale: CI runs 3 kills over 60,000 records at 4,000 a second (about 30 s each variant); SLUICE_CHAOS_SCALE
// multiplies records and kills. The seed is printed; SLUICE_TEST_SEED replays a run.
// Run: build/release/tests/rocksdb_job_kill_test
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/failures.h"
#include "integration/test_util/polling.h"
#include "sluice/api/keyed_process_function.h"
#include "sluice/api/stream_environment.h"
#include "sluice/api/windowed_stream.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/files.h"
#include "test_util/counting_job.h"
#include "test_util/window_sum_job.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int64_t kKeys = 1'000;
constexpr int64_t kWindowKeys = 50;

// Small local helpers (the shared chaos harness drives `sluice run` and Kafka, which this test does not need).

/// SLUICE_CHAOS_SCALE, the factor of a long run by hand; 1 when unset or not positive.
double chaos_scale() {
  const char* v = std::getenv("SLUICE_CHAOS_SCALE");
  const double f = v == nullptr ? 0 : std::strtod(v, nullptr);
  return f > 0 ? f : 1;
}

/// The last lines of a log file, for failure messages.
std::string tail(const fs::path& p, size_t lines = 30) {
  std::ifstream in(p);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);)
    all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += all[i] + "\n";
  return out;
}
constexpr const char* kChildEnv = "SLUICE_ROCKSDB_CHAOS_CHILD";

std::string self_path() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).string();
}

/// The child: runs the job until the end of input (exit 0) or until it is killed.
int run_child() {
  const fs::path dir = std::getenv("SLUICE_ROCKSDB_CHAOS_DIR");
  const int64_t records = std::strtoll(std::getenv("SLUICE_ROCKSDB_CHAOS_RECORDS"), nullptr, 10);
  const double rate = std::strtod(std::getenv("SLUICE_ROCKSDB_CHAOS_RATE"), nullptr);
  const char* recovery = std::getenv("SLUICE_ROCKSDB_CHAOS_RECOVERY");
  const char* incremental = std::getenv("SLUICE_ROCKSDB_CHAOS_INCREMENTAL");
  const char* windows = std::getenv("SLUICE_ROCKSDB_CHAOS_WINDOWS");
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set(options::kStateBackendType, std::string("rocksdb"));
  c.set(options::kRocksDBLocalDir, (dir / "rocksdb").string());
  c.set_string(std::string(options::kRocksDBMemoryFixedPerSlot.key), "8mb");
  c.set_string(std::string(options::kCheckpointInterval.key), "200ms");
  c.set(options::kCheckpointDir, "file://" + (dir / "checkpoints").string());
  c.set(options::kRestartStrategy, std::string("none"));
  if (incremental != nullptr && *incremental == '1') {
    c.set(options::kStateBackendIncremental, true);
    c.set(options::kCheckpointsRetained, 3);
  }
  if (recovery != nullptr && *recovery != '\0') c.set(options::kStateRecoveryPath, std::string(recovery));
  if (windows != nullptr && *windows == '1') {
    c.set_string(std::string(options::kRocksDBTimerServiceFactory.key), "rocksdb");
    StreamEnvironment env(c);
    env.from_source(datagen::sequence(0, records - 1, rate),
                    WatermarkStrategy<int64_t>::for_monotonous_timestamps().with_timestamp_assigner(
                        [](const int64_t& v, TimestampMs) { return v; }),
                    "numbers")
        .uid("numbers")
        .key_by([](const int64_t& v) { return v % kWindowKeys; })
        .window(TumblingEventTimeWindows::of(std::chrono::milliseconds(1000)))
        .reduce([](int64_t a, int64_t b) { return a + b; }, testing::WindowSumLine{})
        .uid("window")
        .sink_to(FileSink<std::string>::text((dir / "out").string()))
        .uid("sink");
    JobResult r = env.execute("rocksdb chaos windows");
    if (!r.ok()) {
      std::fprintf(stderr, "job failed: %s\n", r.error ? r.error->to_string().c_str() : "?");
      return 1;
    }
    return 0;
  }
  StreamEnvironment env(c);
  env.from_source(datagen::sequence(0, records - 1, rate), "numbers")
      .uid("numbers")
      .key_by([](const int64_t& v) { return v % kKeys; })
      .process(testing::CountPerKey(kKeys))
      .uid("count")
      .sink_to(FileSink<std::string>::text((dir / "out").string()))
      .uid("sink");
  JobResult r = env.execute("rocksdb chaos counting");
  if (!r.ok()) {
    std::fprintf(stderr, "job failed: %s\n", r.error ? r.error->to_string().c_str() : "?");
    return 1;
  }
  return 0;
}

/// Completed checkpoints (chk-N directories holding _metadata) under `root`, newest last (by _metadata mtime).
std::vector<fs::path> completed_checkpoints(const fs::path& root) {
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == "_metadata" && it->path().parent_path().filename().string().rfind("chk-", 0) == 0) {
      std::error_code e2;
      found.emplace_back(fs::last_write_time(it->path(), e2), it->path().parent_path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [t, p] : found)
    out.push_back(p);
  return out;
}

/// Directories of databases (one per subtask) under the localdir, of any process.
size_t database_dirs(const fs::path& localdir) {
  size_t n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(localdir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it.depth() == 1 && it->is_directory()) ++n;
  }
  return n;
}

/// The highest id of a completed checkpoint in a job directory not in `known` (this run's job), or -1.
int64_t newest_in_new_job(const fs::path& root, const std::set<fs::path>& known) {
  int64_t newest = -1;
  std::error_code ec;
  for (fs::directory_iterator job(root, ec), end; !ec && job != end; job.increment(ec)) {
    if (known.contains(job->path())) continue;
    std::error_code ec2;
    for (fs::directory_iterator c(job->path(), ec2), e2; !ec2 && c != e2; c.increment(ec2)) {
      const int64_t id = FileCheckpointStorage::checkpoint_id_of(c->path());
      std::error_code ec3;
      if (id > newest && fs::exists(c->path() / "_metadata", ec3)) newest = id;
    }
  }
  return newest;
}

std::set<fs::path> job_dirs(const fs::path& root) {
  std::set<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator job(root, ec), end; !ec && job != end; job.increment(ec))
    out.insert(job->path());
  return out;
}

pid_t start_child(const fs::path& dir, int64_t records, double rate, const std::string& recovery, int run,
                  bool incremental, bool windows) {
  const std::string log = (dir / ("run-" + std::to_string(run) + ".log")).string();
  std::fflush(stdout);  // or the child writes the parent's buffered lines again
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv(kChildEnv, "1", 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_DIR", dir.c_str(), 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_RECORDS", std::to_string(records).c_str(), 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_RATE", std::to_string(rate).c_str(), 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_RECOVERY", recovery.c_str(), 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_INCREMENTAL", incremental ? "1" : "0", 1);
    ::setenv("SLUICE_ROCKSDB_CHAOS_WINDOWS", windows ? "1" : "0", 1);
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    const std::string self = self_path();
    ::execl(self.c_str(), self.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  return pid;
}

/// Waits (deadline) until `pred` holds or the child exits; true when `pred` held. Sets `exited`/`status`.
template <class Pred>
bool wait_for(pid_t pid, Pred pred, std::chrono::seconds deadline, bool& exited, int& status) {
  exited = false;
  bool held = false;
  sluice::testing::poll_until(
      [&] {
        held = pred();
        if (held) return true;
        if (::waitpid(pid, &status, WNOHANG) == pid) {
          exited = true;
          held = pred();
          return true;
        }
        return false;
      },
      deadline);
  return held;
}

/// `windows`: the window job with RocksDB timers (incremental must be set too).
void exactly_once_across_sigkills(bool incremental, bool windows) {
  const uint64_t seed = testing::test_seed();
  std::printf("seed %llu (SLUICE_TEST_SEED replays)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const double scale = chaos_scale();
  const int64_t records = static_cast<int64_t>(60'000 * scale);
  const int kills = static_cast<int>(3 * scale);
  const double rate = 4'000;
  const fs::path dir = fs::temp_directory_path() /
                       ("sluice-rocksdb-chaos-" + std::to_string(::getpid()) + "-" + std::to_string(seed % 1'000'000));
  fs::remove_all(dir);
  fs::create_directories(dir);

  int killed = 0;
  int run = 0;
  bool finished = false;
  while (!finished) {
    ASSERT_LT(run, kills + 10) << "too many runs";
    std::vector<fs::path> before = completed_checkpoints(dir / "checkpoints");
    const std::string recovery = before.empty() ? "" : before.back().string();
    const std::set<fs::path> known_jobs = job_dirs(dir / "checkpoints");
    if (incremental && !recovery.empty()) {
      // The checkpoint this run restores from is incremental: its SST files are shared files.
      auto m = FileCheckpointStorage::load_metadata(recovery);
      ASSERT_TRUE(m.ok()) << m.error().to_string();
      const size_t shared = shared_files_of(*m).size();
      std::printf("run %d restores %s, which references %zu shared files\n", run, recovery.c_str(), shared);
      EXPECT_GT(shared, 0u);
    }
    pid_t pid = start_child(dir, records, rate, recovery, run, incremental, windows);
    ASSERT_GT(pid, 0);
    bool exited = false;
    int status = 0;
    if (killed < kills) {
      // Kill once this run completed a checkpoint of its own, after a seeded extra delay of up to 600 ms.
      const size_t n = before.size();
      // Incremental: a chain of 10 checkpoints of this run (ids continue after the restored one).
      const int64_t restored_id = recovery.empty() ? 0 : FileCheckpointStorage::checkpoint_id_of(recovery);
      bool ok = wait_for(
          pid,
          [&] {
            return incremental ? newest_in_new_job(dir / "checkpoints", known_jobs) >= restored_id + 10
                               : completed_checkpoints(dir / "checkpoints").size() > n;
          },
          120s, exited, status);
      ASSERT_TRUE(ok && !exited) << "run " << run << " did not checkpoint before exiting or the deadline; log:\n"
                                 << tail(dir / ("run-" + std::to_string(run) + ".log"));
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 600));  // a random moment, not a wait
      ASSERT_EQ(::kill(pid, SIGKILL), 0);
      ::waitpid(pid, &status, 0);
      ++killed;
      std::printf("run %d: SIGKILL after %zu completed checkpoints in total\n", run,
                  completed_checkpoints(dir / "checkpoints").size());
    } else {
      bool ok = wait_for(
          pid, [] { return false; }, 180s, exited, status);
      (void)ok;
      ASSERT_TRUE(exited) << "the last run did not finish in time";
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "last run failed; log:\n"
                                                                 << tail(dir / ("run-" + std::to_string(run) + ".log"));
      finished = true;
    }
    ++run;
  }
  // The killed processes' databases were removed by the last process; its own when its subtasks ended.
  EXPECT_EQ(database_dirs(dir / "rocksdb"), 0u);
  std::map<std::string, int64_t> got = testing::read_committed(dir / "out");
  std::map<std::string, int64_t> want =
      windows ? testing::expected_window_sums(records, kWindowKeys) : testing::expected_counts(records, kKeys);
  int64_t missing = 0, duplicated = 0, unexpected = 0;
  for (const auto& [line, n] : want) {
    auto it = got.find(line);
    const int64_t g = it == got.end() ? 0 : it->second;
    if (g < n) missing += n - g;
    if (g > n) duplicated += g - n;
  }
  for (const auto& [line, n] : got) {
    if (want.find(line) == want.end()) unexpected += n;
  }
  std::printf("rocksdb chaos%s: %d SIGKILLs, %lld records: %lld missing, %lld duplicated, %lld unexpected\n",
              windows ? " (windows, timers in RocksDB)" : "", killed, static_cast<long long>(records),
              static_cast<long long>(missing), static_cast<long long>(duplicated), static_cast<long long>(unexpected));
  EXPECT_EQ(killed, kills);
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(unexpected, 0);
  if (::testing::Test::HasFailure()) {
    std::printf("kept %s for inspection\n", dir.c_str());
  } else {
    fs::remove_all(dir);
  }
}

TEST(RocksDBJobKillTest, CountsAreExactlyOnceAcrossSigkills) {
  exactly_once_across_sigkills(/*incremental=*/false, /*windows=*/false);
}

TEST(RocksDBJobKillTest, IncrementalCheckpointChainsOfTenSurviveSigkills) {
  exactly_once_across_sigkills(/*incremental=*/true, /*windows=*/false);
}

TEST(RocksDBJobKillTest, WindowsWithTimersInRocksDBSurviveSigkills) {
  exactly_once_across_sigkills(/*incremental=*/true, /*windows=*/true);
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  if (std::getenv(sluice::kChildEnv) != nullptr) return sluice::run_child();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
