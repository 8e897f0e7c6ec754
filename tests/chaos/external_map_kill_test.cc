// Chaos test of the C++ API's udf::map_external (issue 17): a C++ job (datagen sequence -> map_external through a
// JavaScript function on Node.js workers -> KafkaSink exactly-once) runs in a child process (this binary
// re-executed with SLUICE_EXTERNAL_MAP_CHAOS_CHILD set) with 200 ms checkpoints and a fixed-delay restart strategy.
// The test SIGKILLs the job's Node.js workers (kill -9 of the worker process, not of the job) at seeded moments in
// the middle of their batches; each kill fails the task and the job restarts from its last completed checkpoint
// with fresh workers, in the same process. When the job has finished, a read_committed consumer reads the topic
// from the start and the test counts, per input number: zero missing, zero duplicated, and every result equal to
// the function's own computation.
//
// The function takes ~0.2 ms a record, so a worker is inside a batch whenever it is killed, and batches are in
// flight at every checkpoint barrier (the operator answers them all before the barrier passes). Each kill waits
// for two completed checkpoints since the last restart, so restores are from checkpoints taken with batches in
// flight.
//
// Scale: CI kills 4 workers over 20,000 records at parallelism 2 (about 20-40 s on two busy cores);
// SLUICE_CHAOS_SCALE=<factor> multiplies the records and the kills. The seed is printed; SLUICE_TEST_SEED replays.
// Run: scripts/services/run-with kafka -- build/release/tests/external_map_kill_test
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/udf/external_map.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chaos::count_of;
using chaos::read_file;

constexpr const char* kChildEnv = "SLUICE_EXTERNAL_MAP_CHAOS_CHILD";
constexpr int kPartitions = 2;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

/// The child: the job, until the end of its input (exit 0) or until the job fails (exit 1).
int run_child() {
  const fs::path dir = env_or_empty("SLUICE_EXTERNAL_MAP_CHAOS_DIR");
  const int64_t records = std::strtoll(env_or_empty("SLUICE_EXTERNAL_MAP_CHAOS_RECORDS").c_str(), nullptr, 10);
  const std::string bootstrap = env_or_empty("SLUICE_EXTERNAL_MAP_CHAOS_BOOTSTRAP");
  const std::string topic = env_or_empty("SLUICE_EXTERNAL_MAP_CHAOS_TOPIC");
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set_string(std::string(options::kCheckpointInterval.key), "200ms");
  c.set(options::kCheckpointDir, "file://" + (dir / "checkpoints").string());
  c.set(options::kCheckpointMode, std::string("EXACTLY_ONCE"));
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 1000);
  c.set_string(std::string(options::kFixedDelayDelay.key), "200ms");
  c.set(options::kTolerableFailedCheckpoints, 1000);
  StreamEnvironment env(c);

  udf::ExternalFunction fn;
  fn.runtime = "node";
  fn.module = (dir / "square.js").string();
  fn.export_name = "square";
  fn.batch_size = 64;
  auto sink = KafkaSink<std::string>::builder()
                  .bootstrap_servers(bootstrap)
                  .topic(topic)
                  .key_serializer([](const std::string& s) { return s.substr(0, s.find(',')); })
                  .value_serializer([](const std::string& s) { return s; })
                  .delivery_guarantee(DeliveryGuarantee::kExactlyOnce)
                  .transactional_id_prefix(topic + "-tx")
                  .property("log_level", "4")
                  .build();
  // Slow enough for the kills to land while the job runs (the workers' ~0.2 ms a record is the other bound).
  auto numbers = env.from_source(datagen::sequence(0, records - 1, 2'500), "numbers").uid("numbers");
  udf::map_external<std::string>(
      numbers, fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) { return fmt::format("{},{}", r.find("n")->as_int64(), r.find("square")->as_int64()); })
      .uid("square")
      .sink_to(sink)
      .uid("kafka-out");
  JobResult r = env.execute("external map chaos");
  if (!r.ok()) {
    std::fprintf(stderr, "job failed: %s\n", r.error ? r.error->to_string().c_str() : "?");
    return 1;
  }
  return 0;
}

/// The Node.js workers among the children of `pid` (every thread's children: a task thread starts its worker).
std::vector<pid_t> workers_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& t : fs::directory_iterator(fmt::format("/proc/{}/task", pid), ec)) {
    std::istringstream children(read_file(t.path() / "children"));
    for (pid_t c = 0; children >> c;) {
      if (read_file(fmt::format("/proc/{}/cmdline", c)).find("worker.js") != std::string::npos) out.push_back(c);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ExternalMapKillTest, KilledWorkersOfACppJobLoseAndDuplicateNothingInKafkaReadCommitted) {
  const uint64_t seed = testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int64_t records = static_cast<int64_t>(20'000 * scale);
  const int kills = std::max(1, static_cast<int>(4 * scale));
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED replays), " << records << " records, " << kills << " worker kills"
            << std::endl;
  std::mt19937_64 rng(seed);
  const std::string bootstrap = testing::kafka_bootstrap_servers();
  const fs::path dir = chaos::make_test_dir("external_map_kill");
  std::ofstream(dir / "square.js") << R"(
exports.square = (r) => {
  const until = process.hrtime.bigint() + 200000n;  // ~0.2 ms of work a record
  while (process.hrtime.bigint() < until) {}
  return { n: r.n, square: r.n * r.n };
};
)";
  const std::string topic = testing::kafka::unique_topic("extmap-kill");
  ASSERT_TRUE(testing::kafka::create_topic(bootstrap, topic, kPartitions));

  const fs::path log = dir / "child.log";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv(kChildEnv, "1", 1);
    ::setenv("SLUICE_EXTERNAL_MAP_CHAOS_DIR", dir.c_str(), 1);
    ::setenv("SLUICE_EXTERNAL_MAP_CHAOS_RECORDS", std::to_string(records).c_str(), 1);
    ::setenv("SLUICE_EXTERNAL_MAP_CHAOS_BOOTSTRAP", bootstrap.c_str(), 1);
    ::setenv("SLUICE_EXTERNAL_MAP_CHAOS_TOPIC", topic.c_str(), 1);
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    std::error_code ec;
    const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
    ::execl(self.c_str(), self.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  struct Reaper {
    pid_t pid;
    bool done = false;
    ~Reaper() {
      if (!done) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};

  int done = 0;
  bool exited = false;
  int status = 0;
  for (int k = 0; k < kills && !exited; ++k) {
    const size_t checkpoints_before = count_of(read_file(log), "completed checkpoint");
    // Two checkpoints since the last restart (the first is often taken while the workers start, with nothing in
    // flight) and both workers running.
    const bool ready = testing::poll_until(
        [&] {
          if (::waitpid(pid, &status, WNOHANG) == pid) {
            exited = true;
            return true;
          }
          return count_of(read_file(log), "completed checkpoint") >= checkpoints_before + 2 &&
                 workers_of(pid).size() == 2;
        },
        90s, 20ms);
    if (exited) break;  // the input ran out before every kill was made
    ASSERT_TRUE(ready) << "the job did not run with two workers and checkpoints within 90 s\n" << chaos::tail(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));  // the kill's moment (not a wait)
    const std::vector<pid_t> workers = workers_of(pid);
    if (workers.empty()) continue;
    const pid_t victim = workers[rng() % workers.size()];
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    ++done;
    std::cout << "killed worker " << victim << " (kill " << done << ")" << std::endl;
    // The failure is seen (and the region restarted) before the next kill. A kill that lands after the worker's
    // last batch, while the job finishes, fails nothing: the job then ends without a failure for it.
    auto failures = [&] { return count_of(read_file(log), "restarting region"); };
    ASSERT_TRUE(testing::poll_until(
        [&] {
          if (failures() >= static_cast<size_t>(done)) return true;
          if (::waitpid(pid, &status, WNOHANG) == pid) exited = true;
          return exited;
        },
        60s))
        << chaos::tail(log);
    if (exited && failures() < static_cast<size_t>(done)) {
      --done;
      std::cout << "(that kill came after the worker's last batch: no failure, not counted)" << std::endl;
    }
  }
  if (!exited) {
    ASSERT_TRUE(testing::poll_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 180s))
        << "the job did not finish\n"
        << chaos::tail(log);
  }
  reaper.done = true;
  const std::string text = read_file(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << chaos::tail(log, 60);
  EXPECT_GE(done, 1) << "no worker was killed";
  EXPECT_GE(count_of(text, "restarting region"), static_cast<size_t>(done)) << "each kill fails the task";
  // The task finds the death while it waits for a reply ("the worker died") or, when the kill lands while it is
  // sending a batch, as a broken socket ("the worker stopped reading its input"); both name the pid and signal.
  EXPECT_GE(count_of(text, "the worker died: the worker (pid") +
                count_of(text, "the worker stopped reading its input: the worker (pid"),
            static_cast<size_t>(done))
      << chaos::tail(log, 60);
  EXPECT_GE(count_of(text, "was killed by signal 9"), static_cast<size_t>(done)) << "the message names the signal";

  // The topic as a consumer reads it: read_committed, every partition from the start.
  std::map<int64_t, int> seen;
  size_t wrong = 0;
  chaos::CommittedReader reader(bootstrap, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    const size_t comma = r.value.find(',');
    const int64_t n = std::stoll(r.value.substr(0, comma));
    if (std::stoll(r.value.substr(comma + 1)) != n * n) ++wrong;
    ++seen[n];
  });
  ASSERT_TRUE(reader.drain(90s, 2s)) << "the topic could not be read to its end";
  size_t missing = 0, duplicated = 0;
  for (int64_t n = 0; n < records; ++n) {
    auto it = seen.find(n);
    if (it == seen.end()) {
      ++missing;
    } else if (it->second > 1) {
      duplicated += static_cast<size_t>(it->second - 1);
    }
  }
  std::cout << "kills " << done << ", records read " << reader.count() << ", missing " << missing << ", duplicated "
            << duplicated << ", wrong results " << wrong << " (seed " << seed << ")" << std::endl;
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(reader.count(), static_cast<size_t>(records));
  chaos::keep_or_remove(dir, ::testing::Test::HasFailure());
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  if (std::getenv(sluice::kChildEnv) != nullptr) return sluice::run_child();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
