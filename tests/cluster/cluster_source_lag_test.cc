// The JobManager's /health says `source-lag` in cluster mode (issue 16 item 5), with real processes:
// `sluice jobmanager` + 2 `sluice taskmanager`s of 2 slots (tests/cluster/cluster_harness.h) run a pipeline with
// `health.max-source-lag: 2s` reading 2 Kafka readers into a deliberately slow files sink (`throttle: 1ms` per
// record and subtask, about 2,000 records/s). The TaskManagers report their source's lag with every heartbeat
// (the Kafka source's own: now minus the timestamp of the last record read from a partition that still lags,
// 0 when all are caught up), and:
//  * before any record the JobManager's /health answers 200 and its /metrics has `sluice_source_lag_ms` (the name
//    `sluice run` uses) and `sluice_health_source_lag_bound_ms` 2000;
//  * 20,000 records are produced at once with a CreateTime a minute old (a backlog, as after an outage): while the
//    readers work through it (about 10 s, backpressured by the sink) /health answers 503 with `source-lag` naming
//    the kafka source and its topic, the job RUNNING, and /metrics shows the lag over the bound;
//  * once the readers caught up /health answers 200 again, the gauge is 0, and every record is in the output
//    (counted by id: none missing, none twice).
// Without the TaskManagers' lag in the heartbeat the JobManager's lag stays unknown (-1) and the 503 never comes.
// Needs Kafka (scripts/services/run-with kafka -- ...); about 30 s. Timings are printed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "cluster/cluster_harness.h"
#include "integration/test_util/files_output.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using SteadyClock = std::chrono::steady_clock;

const std::vector<std::string> kOptions = {"heartbeat.interval=500ms", "heartbeat.timeout=5s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};

int64_t ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The JobManager's `name{job="cluster-source-lag"[,source="kafka"]}` gauge; nullopt when absent.
std::optional<double> gauge(const ClusterHarness& c, const std::string& name, bool with_source) {
  const std::string body = c.http_get("/metrics").second;
  const std::string prefix =
      name + (with_source ? R"({job="cluster-source-lag",source="kafka"} )" : R"({job="cluster-source-lag"} )");
  const size_t at = body.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  return std::stod(body.substr(at + prefix.size()));
}

TEST(ClusterSourceLagTest, ABacklogBeyondMaxSourceLagMakesTheJobManagerUnhealthyNamingTheSourceUntilCaughtUp) {
  const std::string servers = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  ASSERT_FALSE(servers.empty());
  const std::string topic = tk::unique_topic("cluster-lag-in");
  ASSERT_TRUE(tk::create_topic(servers, topic, 2));
  const ScopedTempDir temp("sluice-cluster-source-lag-");
  const fs::path& dir = temp.path();
  const fs::path file = dir / "lag.yaml";
  {
    std::ofstream f(file);
    f << "pipeline:\n  name: cluster-source-lag\n  parallelism: 2\n"
      << "  checkpoint: { interval: 500ms, storage: \"file://" << (dir / "chk").string() << "\" }\n"
      << "  restart: { strategy: fixed-delay, attempts: 100, delay: 200ms }\n"
      << "  health: { max-source-lag: 2s }\n"
      << "source:\n  type: kafka\n  bootstrap-servers: \"" << servers << "\"\n  topics: [" << topic
      << "]\n  group-id: " << topic << "\n  start: earliest\n  parallelism: 2\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      type: \"'row.' || op\"\n      payload: \"after.id AS id\"\n"
      << "sink:\n  events: { type: files, path: \"" << (dir / "out").string()
      << "\", throttle: 1ms, rolling-policy: { rollover-interval: 200ms, inactivity-interval: 200ms } }\n";
  }

  ClusterHarness c(file.string(), kOptions);
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  c.start_taskmanager(2);
  c.start_taskmanager(2);
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: \\d+ task\\(s\\) on \\d TaskManager\\(s\\)"), 60s)) << c.logs();
  std::pair<int, std::string> h;
  auto health = [&] {
    h = c.http_get("/health");
    return h;
  };

  // 1. Nothing to read: healthy; the gauges `sluice run` exports are there (the lag unknown or 0).
  ASSERT_TRUE(poll_until([&] { return health().first == 200; }, 15s)) << h.second << c.logs();
  std::optional<double> lag;
  ASSERT_TRUE(poll_until([&] { return (lag = gauge(c, "sluice_source_lag_ms", true)).has_value(); }, 5s))
      << c.http_get("/metrics").second;
  EXPECT_LE(*lag, 0.0);
  EXPECT_EQ(gauge(c, "sluice_health_source_lag_bound_ms", false), std::optional<double>(2000.0))
      << c.http_get("/metrics").second;

  // 2. A backlog a minute old, read at the sink's pace.
  constexpr int kRecords = 20'000;
  const int64_t created_ms = wall_now_ms() - 60'000;
  {
    tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", servers}, {"linger.ms", "20"}});
    ASSERT_TRUE(producer);
    for (int i = 0; i < kRecords; ++i) {
      const std::string key = fmt::format("r{:05d}", i);
      const std::string value = fmt::format(
          R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}"}},"source":{{"connector":"test",)"
          R"("db":"d","collection":"s.t","position":"{1}","ts_ms":{2},"snapshot":false}}}})",
          key, i, created_ms);
      rd_kafka_resp_err_t err;
      while ((err = rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                      RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                      RD_KAFKA_V_TIMESTAMP(created_ms), RD_KAFKA_V_END)) ==
             RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        rd_kafka_poll(producer.get(), 100);  // the local queue drains as the broker acknowledges
      }
      ASSERT_EQ(err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(err);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  const auto produced_at = SteadyClock::now();
  const bool unhealthy = poll_until([&] { return health().first == 503; }, 15s, 50ms);
  std::printf("the JobManager's /health answered %d %lld ms after %d records a minute old were produced: %s\n", h.first,
              static_cast<long long>(ms_since(produced_at)), kRecords, h.second.c_str());
  ASSERT_TRUE(unhealthy) << h.second << "\n" << c.logs();
  EXPECT_NE(h.second.find(R"("code":"source-lag")"), std::string::npos) << h.second;
  EXPECT_NE(h.second.find(fmt::format("the kafka source '{}' lags ", topic)), std::string::npos) << h.second;
  EXPECT_NE(h.second.find("(bound 2000 ms, health.max-source-lag)"), std::string::npos) << h.second;
  EXPECT_NE(h.second.find(R"("status":"RUNNING")"), std::string::npos) << h.second;
  static const std::regex lag_re(R"(lags (\d+) ms behind)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h.second, m, lag_re)) << h.second;
  EXPECT_GE(std::stoll(m[1]), 60'000) << "the records are a minute old: " << h.second;
  lag = gauge(c, "sluice_source_lag_ms", true);
  ASSERT_TRUE(lag.has_value()) << c.http_get("/metrics").second;
  const size_t read_when_unhealthy = files_sink_ids(dir / "out").size();
  std::printf("then /metrics said sluice_source_lag_ms %.0f; %zu of %d records were in the output\n", *lag,
              read_when_unhealthy, kRecords);
  EXPECT_GT(*lag, 2000.0);
  EXPECT_LT(read_when_unhealthy, static_cast<size_t>(kRecords)) << "the backlog was read before /health said so";

  // 3. Caught up: healthy again, the lag 0, every record once.
  const auto unhealthy_at = SteadyClock::now();
  const bool healthy = poll_until([&] { return health().first == 200; }, 60s, 50ms);
  const size_t read_when_healthy = files_sink_ids(dir / "out").size();
  std::printf("the JobManager's /health answered %d %lld ms later; %zu records in the output then\n", h.first,
              static_cast<long long>(ms_since(unhealthy_at)), read_when_healthy);
  ASSERT_TRUE(healthy) << h.second << "\n" << c.logs();
  EXPECT_TRUE(poll_until([&] { return gauge(c, "sluice_source_lag_ms", true) == std::optional<double>(0.0); }, 5s))
      << c.http_get("/metrics").second;
  ASSERT_TRUE(poll_until([&] { return static_cast<int>(files_sink_ids(dir / "out").size()) >= kRecords; }, 60s))
      << files_sink_ids(dir / "out").size() << " of " << kRecords << " records in the output\n"
      << c.logs();
  const std::map<std::string, int> ids = files_sink_ids(dir / "out");
  int missing = 0, duplicated = 0;
  for (int i = 0; i < kRecords; ++i) {
    auto it = ids.find(fmt::format("r{:05d}", i));
    if (it == ids.end()) {
      ++missing;
    } else if (it->second > 1) {
      duplicated += it->second - 1;
    }
  }
  std::printf("%d records written, %zu distinct in the output, %d missing, %d duplicated\n", kRecords, ids.size(),
              missing, duplicated);
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(jm->count("RESTARTING"), 0) << jm->output();
}

}  // namespace
}  // namespace sluice::testing::cluster
