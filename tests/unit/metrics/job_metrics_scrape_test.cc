// Flink-named metrics of running jobs, read as a scraper reads them: a C++ job behind a slow operator shows
// backpressure upstream and busy time downstream; a pipeline's /metrics (over HTTP) has per-subtask records,
// bytes, time and checkpoint metrics that move while it runs. The scrapes are polled: the values change
// continuously and a scraper has nothing else to wait on.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "integration/test_util/polling.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/prometheus_text.h"
#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/web/metrics_server.h"
#include "test_util/collect_sink.h"

namespace sluice::metrics {
namespace {

namespace fs = std::filesystem;
using Labels = std::map<std::string, std::string>;

// Scrapes `scrape` every 200 ms until `pred` holds for a parse of it, or 60 s passed (a loaded machine).
template <class Scrape, class Pred>
bool scrape_until(Scrape&& scrape, Pred&& pred, ParsedExposition* last = nullptr) {
  bool held = false;
  sluice::testing::poll_until(
      [&] {
        Result<ParsedExposition> p = parse_prometheus_text(scrape());
        EXPECT_TRUE(p.ok()) << p.error().to_string();
        if (!p.ok()) return true;  // a bad exposition ends the wait, failed
        if (last != nullptr) *last = *p;
        held = pred(*p);
        return held;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(200));  // the pace of a scraper
  return held;
}

double value(const ParsedExposition& p, const std::string& name, const Labels& match) {
  return p.sum(name, match).value_or(-1);
}

TEST(JobMetricsScrapeTest, ASlowOperatorShowsBusyDownstreamAndBackpressureUpstream) {
  StreamEnvironment env;
  env.set_parallelism(1);
  auto out = std::make_shared<testing::CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, std::numeric_limits<int64_t>::max() - 1), "numbers")
      .rebalance()
      .filter([](int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow operator: ~5,000 records/s
        return false;
      })
      .name("slow")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(out));
  JobClient client = env.execute_async("backpressured");
  MetricRegistry registry;
  auto jm = std::make_unique<JobMetrics>(registry, client, "backpressured");
  const std::string task = "flink_taskmanager_job_task_";
  ParsedExposition p;
  const bool seen =
      scrape_until([&] { return registry.prometheus_text(); },
                   [&](const ParsedExposition& e) {
                     const auto src = e.find(task + "backPressuredTimeMsPerSecond", {{"task_name", "Source: numbers"}});
                     const auto slow = e.find(task + "busyTimeMsPerSecond");
                     double slow_busy = 0;
                     for (const auto* s : slow) {
                       if (s->labels.at("task_name") != "Source: numbers") slow_busy = s->value;
                     }
                     return src.size() == 1 && src[0]->value > 500 && slow_busy > 500;
                   },
                   &p);
  EXPECT_TRUE(seen) << registry.prometheus_text();
  // The source's records and bytes: it fills the channel, then waits for credit.
  EXPECT_GT(value(p, task + "numRecordsOut", {{"task_name", "Source: numbers"}}), 0);
  EXPECT_GT(value(p, task + "numBytesOut", {{"task_name", "Source: numbers"}}), 0);
  EXPECT_GT(value(p, task + "operator_numRecordsIn", {{"operator_name", "slow"}}), 0);
  EXPECT_LT(value(p, task + "idleTimeMsPerSecond", {{"task_name", "Source: numbers"}}), 500);
  client.cancel();
  client.wait();
}

class PipelineScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-metrics-scrape-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PipelineScrapeTest, MetricsOverHttpCarryFlinksNamesPerSubtaskAndMove) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: scraped
  parallelism: 2
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  Result<pipeline::PipelineSpec> spec = pipeline::parse_pipeline(yaml, "scraped.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<pipeline::PipelineRunner>> runner = pipeline::PipelineRunner::create(*spec);
  ASSERT_TRUE(runner.ok()) << runner.error().message();
  ASSERT_TRUE((*runner)->start().ok());
  pipeline::PipelineRunner& r = **runner;
  auto http = MetricsServer::start(
      "127.0.0.1", 0, [&] { return r.metrics_text(); },
      [&] {
        return HealthResponse{true, "{}"};
      });
  ASSERT_TRUE(http.ok()) << http.error().message();
  httplib::Client c("127.0.0.1", (*http)->port());
  auto scrape = [&] {
    auto res = c.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    return res ? res->body : std::string();
  };
  const std::string op = "flink_taskmanager_job_task_operator_";
  const std::string task = "flink_taskmanager_job_task_";
  const std::string job = "flink_jobmanager_job_";
  // The source and the transform run at parallelism 1 (datagen), the routed sink chain at 2.
  const Labels sink{{"job_name", "scraped"}, {"operator_id", "sink-events"}};
  ParsedExposition first;
  ASSERT_TRUE(scrape_until(
      scrape,
      [&](const ParsedExposition& e) {
        return value(e, op + "numRecordsIn", sink) > 0 && value(e, job + "numberOfCompletedCheckpoints", {}) >= 1;
      },
      &first))
      << scrape();
  // Per subtask (parallelism 2), with Flink's labels.
  EXPECT_EQ(first.find(op + "numRecordsIn", sink).size(), 2u) << scrape();
  for (const char* sub : {"0", "1"}) {
    Labels l = sink;
    l["subtask_index"] = sub;
    EXPECT_EQ(first.find(op + "numRecordsIn", l).size(), 1u) << sub;
  }
  EXPECT_EQ(first.types[op + "numRecordsIn"], "counter");
  EXPECT_GT(value(first, job + "lastCheckpointCompletedTimestamp", {{"job_name", "scraped"}}), 1.7e12);
  EXPECT_GE(value(first, job + "lastCheckpointDuration", {{"job_name", "scraped"}}), 0);
  EXPECT_EQ(value(first, job + "numRestarts", {{"job_name", "scraped"}}), 0);
  EXPECT_EQ(first.find(op + "numRecordsOut", {{"operator_id", "transform"}, {"subtask_index", "0"}}).size(), 1u);
  // The pipeline's own families stay (alert rules use them).
  EXPECT_TRUE(first.sum("sluice_checkpoint_age_ms").has_value());
  EXPECT_TRUE(first.sum("sluice_operator_records_in_total").has_value());

  // They move: records, bytes through the keyed exchange, rates, idle time of a job at 2,000 records/s.
  const double records0 = *first.sum(op + "numRecordsIn", sink);
  const double checkpoints0 = *first.sum(job + "numberOfCompletedCheckpoints");
  ParsedExposition later;
  EXPECT_TRUE(scrape_until(
      scrape,
      [&](const ParsedExposition& e) {
        return value(e, op + "numRecordsIn", sink) > records0 + 1000 &&
               value(e, job + "numberOfCompletedCheckpoints", {}) > checkpoints0 &&
               value(e, op + "numRecordsInPerSecond", sink) > 100 && value(e, task + "numBytesOut", {}) > 0 &&
               value(e, task + "numBytesIn", {}) > 0 && value(e, task + "idleTimeMsPerSecond", {}) > 0;
      },
      &later))
      << scrape();
  for (const auto* s : later.find(task + "busyTimeMsPerSecond")) {
    EXPECT_GE(s->value, 0);
    EXPECT_LE(s->value, 1000);
  }
  (*http)->stop();
  r.cancel();
  r.wait();
}

}  // namespace
}  // namespace sluice::metrics
