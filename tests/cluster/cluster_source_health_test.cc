// The JobManager's /health names a source that lost its server in cluster mode (issue 16 item 5), with real
// processes: `sluice jobmanager` + 2 `sluice taskmanager`s of 2 slots (tests/cluster/cluster_harness.h) run a
// pipeline at parallelism 4 reading 2 Kafka readers from a PRIVATE broker (test_util/private_kafka.h: the shared
// broker other tests use is never paused) into files. The TaskManagers report their readers' connections with
// their heartbeats (a change at once), and:
//  * before the pause the JobManager's /health answers 200, and its /metrics has `sourceConnected` 1 per reader;
//  * within 5 s of the broker's SIGSTOP it answers 503 with a `source-disconnected` reason naming the source, its
//    connector, the subtask and the TaskManager that runs it (one of GET /taskmanagers), the job still RUNNING,
//    and the JobManager's log says so once per reader; `sourceConnected` is 0;
//  * after the SIGCONT it answers 200 again (the gauge 1), and the log says each reader is connected again;
//  * every record written before and after the pause is in the output, counted by id (none missing, none twice);
//  * with the broker paused again, the TaskManager of the disconnected readers is SIGKILLed: once the JobManager
//    declares it lost (heartbeat.timeout), /health no longer names it (no stale "disconnected"), the gauge is -1
//    (no stale 0 or 1), and the log says its readers' states were forgotten.
// Needs no shared service (a private broker, about 15-40 s for its JVM). Timings are printed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cluster/cluster_harness.h"
#include "integration/test_util/files_output.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/private_kafka.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using SteadyClock = std::chrono::steady_clock;

// heartbeat.interval at its default (1 s): a disconnection must not wait for it. A short timeout keeps the
// TaskManager-loss part short.
const std::vector<std::string> kOptions = {"heartbeat.interval=1s", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};

int64_t ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

std::string change_line(int i) {
  return fmt::format(
      R"({{"op":"c","key":{{"id":"r{0:05d}"}},"before":null,"after":{{"id":"r{0:05d}"}},"source":{{"connector":"test",)"
      R"("db":"d","collection":"s.t","position":"{0}","ts_ms":{1},"snapshot":false}}}})",
      i,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

/// The JobManager's `sourceConnected` series, by subtask index.
std::map<int, double> source_connected(const ClusterHarness& c) {
  std::map<int, double> out;
  const std::string body = c.http_get("/metrics").second;
  static const std::regex re(R"(flink_taskmanager_job_task_operator_sourceConnected\{([^}]*)\} (\S+))");
  static const std::regex subtask(R"re(subtask_index="(\d+)")re");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), re); it != std::sregex_iterator(); ++it) {
    std::smatch m;
    const std::string labels = (*it)[1];
    if (std::regex_search(labels, m, subtask)) out[std::stoi(m[1])] = std::stod((*it)[2]);
  }
  return out;
}

TEST(ClusterSourceHealthTest, APausedBrokerMakesTheJobManagerUnhealthyWithin5sNamingSourceSubtaskAndTaskManager) {
  sluice::testing::PrivateKafka broker;
  ASSERT_FALSE(broker.bootstrap().empty()) << "the private broker did not start";
  const std::string topic = tk::unique_topic("cluster-health-in");
  ASSERT_TRUE(tk::create_topic(broker.bootstrap(), topic, 2));
  const ScopedTempDir temp("sluice-cluster-source-health-");
  const fs::path& dir = temp.path();
  const fs::path file = dir / "health.yaml";
  {
    std::ofstream f(file);
    // Both readers in the first TaskManager's slots (a checkpointed Kafka source's readers run in one process).
    f << "pipeline:\n  name: cluster-source-health\n  parallelism: 4\n"
      << "  checkpoint: { interval: 200ms, storage: \"file://" << (dir / "chk").string() << "\" }\n"
      << "  restart: { strategy: fixed-delay, attempts: 100, delay: 200ms }\n"
      << "source:\n  type: kafka\n  bootstrap-servers: \"" << broker.bootstrap() << "\"\n  topics: [" << topic
      << "]\n  group-id: " << topic << "\n  start: earliest\n  parallelism: 2\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      type: \"'row.' || op\"\n      payload: \"after.id AS id\"\n"
      << "sink:\n  events: { type: files, path: \"" << (dir / "out").string()
      << "\", rolling-policy: { rollover-interval: 100ms, inactivity-interval: 100ms } }\n";
  }
  auto write = [&](int from, int to) {
    tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", broker.bootstrap()}});
    ASSERT_TRUE(producer);
    for (int i = from; i < to; ++i) {
      const std::string value = change_line(i);
      const std::string key = fmt::format("r{:05d}", i);
      ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                  RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END),
                RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  };

  ClusterHarness c(file.string(), kOptions);
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::vector<ChildProcess*> tms = {c.start_taskmanager(2), c.start_taskmanager(2)};
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 6 task\\(s\\) on 2 TaskManager\\(s\\)"), 60s)) << c.logs();
  auto health = [&] { return c.http_get("/health"); };

  constexpr int kBefore = 300, kAfter = 300;
  write(0, kBefore);
  ASSERT_TRUE(poll_until([&] { return static_cast<int>(files_sink_ids(dir / "out").size()) >= kBefore; }, 60s))
      << files_sink_ids(dir / "out").size() << " of " << kBefore << " records in the output\n"
      << c.logs();
  std::pair<int, std::string> h;
  ASSERT_TRUE(poll_until(
      [&] {
        h = health();
        return h.first == 200;
      },
      15s))
      << h.second;
  // The gauge on the JobManager's /metrics: both readers connected.
  EXPECT_TRUE(poll_until(
      [&] {
        return source_connected(c) == std::map<int, double>{{0, 1.0}, {1, 1.0}};
      },
      5s))
      << c.http_get("/metrics").second;
  std::set<std::string> resource_ids;
  for (const Value& t : c.task_managers())
    resource_ids.insert(str(t, "id"));
  ASSERT_EQ(resource_ids.size(), 2u) << c.logs();

  // 1. The broker stops answering: 503 within 5 s, naming the source, the subtask and the TaskManager.
  broker.pause();
  const auto paused_at = SteadyClock::now();
  const bool unhealthy = poll_until(
      [&] {
        h = health();
        return h.first == 503;
      },
      15s, 50ms);
  const int64_t took = ms_since(paused_at);
  std::printf("the JobManager's /health answered 503 %lld ms after the broker's SIGSTOP: %s\n",
              static_cast<long long>(took), h.second.c_str());
  ASSERT_TRUE(unhealthy) << h.second << c.logs();
  EXPECT_LE(took, 5000) << h.second;
  EXPECT_NE(h.second.find("\"code\":\"source-disconnected\""), std::string::npos) << h.second;
  EXPECT_NE(h.second.find(fmt::format("source '{}' (kafka) disconnected for", topic)), std::string::npos) << h.second;
  EXPECT_NE(h.second.find("\"status\":\"RUNNING\""), std::string::npos) << h.second;
  static const std::regex named(R"(\(subtask ([01]) on TaskManager ([^)]+)\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h.second, m, named)) << h.second;
  const std::string readers_tm = m[2];
  EXPECT_TRUE(resource_ids.contains(readers_tm)) << readers_tm << " is not a registered TaskManager: " << h.second;
  static const std::regex code_re(R"re("code":"([^"]+)")re");
  const auto other_reasons =
      std::count_if(std::sregex_iterator(h.second.begin(), h.second.end(), code_re), std::sregex_iterator(),
                    [](const std::smatch& x) { return x[1] != "source-disconnected"; });
  EXPECT_EQ(other_reasons, 0) << h.second;
  EXPECT_TRUE(poll_until(
      [&] {
        for (const auto& [subtask, v] : source_connected(c))
          if (v == 0.0) return true;
        return false;
      },
      5s))
      << c.http_get("/metrics").second;
  // The JobManager's log says it once per reader, naming the TaskManager (heartbeats repeat; the log does not).
  ASSERT_TRUE(jm->await_line(
      std::regex("source '" + topic + "' \\(kafka\\) subtask [01] on TaskManager " + readers_tm + ": disconnected for"),
      5s))
      << jm->output();
  // Still disconnected seconds later: the duration grows and the log has not repeated.
  ASSERT_TRUE(poll_until([&] { return health().second.find("disconnected for 6.") != std::string::npos; }, 15s))
      << health().second;
  const int lost_lines = jm->count("(reported by its heartbeat; /health says source-disconnected)");
  EXPECT_GE(lost_lines, 1);
  EXPECT_LE(lost_lines, 2);

  // 2. The broker answers again: 200 again.
  broker.resume();
  const auto resumed_at = SteadyClock::now();
  const bool healthy = poll_until(
      [&] {
        h = health();
        return h.first == 200;
      },
      30s, 50ms);
  std::printf("the JobManager's /health answered 200 %lld ms after the broker's SIGCONT\n",
              static_cast<long long>(ms_since(resumed_at)));
  ASSERT_TRUE(healthy) << h.second << c.logs();
  EXPECT_EQ(source_connected(c), (std::map<int, double>{{0, 1.0}, {1, 1.0}}));
  ASSERT_TRUE(poll_until([&] { return jm->count("connected again (reported by its heartbeat)") == lost_lines; }, 5s))
      << jm->output();

  // 3. Nothing lost, nothing twice.
  write(kBefore, kBefore + kAfter);
  ASSERT_TRUE(poll_until([&] { return static_cast<int>(files_sink_ids(dir / "out").size()) >= kBefore + kAfter; }, 60s))
      << files_sink_ids(dir / "out").size() << " of " << kBefore + kAfter << " records in the output\n"
      << c.logs();
  const std::map<std::string, int> ids = files_sink_ids(dir / "out");
  int missing = 0, duplicated = 0;
  for (int i = 0; i < kBefore + kAfter; ++i) {
    auto it = ids.find(fmt::format("r{:05d}", i));
    if (it == ids.end()) {
      ++missing;
    } else if (it->second > 1) {
      duplicated += it->second - 1;
    }
  }
  std::printf("%d records written, %zu distinct in the output, %d missing, %d duplicated\n", kBefore + kAfter,
              ids.size(), missing, duplicated);
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(ids.size(), static_cast<size_t>(kBefore + kAfter));
  EXPECT_EQ(jm->count("RESTARTING"), 0) << jm->output();

  // 4. A TaskManager that stops reporting leaves no stale "disconnected": pause the broker again, kill the
  // TaskManager of the disconnected readers; once it is lost, /health (503: the job restarts and lacks its slots)
  // no longer names it.
  broker.pause();
  ASSERT_TRUE(
      poll_until([&] { return health().second.find("on TaskManager " + readers_tm) != std::string::npos; }, 15s))
      << health().second;
  ChildProcess* victim = nullptr;
  for (ChildProcess* tm : tms) {
    if (tm->output().find("TaskManager " + readers_tm + " with 2 slots") != std::string::npos) victim = tm;
  }
  ASSERT_NE(victim, nullptr) << "no TaskManager logged the id " << readers_tm << "\n" << c.logs();
  victim->signal(SIGKILL);
  const auto killed_at = SteadyClock::now();
  const bool forgotten = poll_until(
      [&] {
        h = health();
        // (The job's failure, which /health quotes, may name the TaskManager; no reader of it may be named.)
        return h.first == 503 && h.second.find("on TaskManager " + readers_tm) == std::string::npos &&
               h.second.find("source-disconnected") == std::string::npos;
      },
      15s, 50ms);
  std::printf("/health stopped naming the killed TaskManager %lld ms after its SIGKILL (heartbeat.timeout 3 s): %s\n",
              static_cast<long long>(ms_since(killed_at)), h.second.c_str());
  ASSERT_TRUE(forgotten) << h.second << "\n" << jm->output();
  EXPECT_TRUE(jm->await_line(std::regex("TaskManager " + readers_tm + ": forgotten while disconnected"), 5s))
      << jm->output();
  // No TaskManager reports the readers now: -1, neither a stale 1 nor a stale 0.
  EXPECT_EQ(source_connected(c), (std::map<int, double>{{0, -1.0}, {1, -1.0}}));
  broker.resume();
}

}  // namespace
}  // namespace sluice::testing::cluster
