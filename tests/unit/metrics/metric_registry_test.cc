#include "sluice/metrics/metric_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/prometheus_text.h"

namespace sluice::metrics {
namespace {

ParsedExposition parse(const std::string& text) {
  Result<ParsedExposition> p = parse_prometheus_text(text);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().to_string()) << "\n" << text;
  return p.ok() ? *p : ParsedExposition{};
}

TEST(MetricRegistryTest, ScopesMakeFlinkPrometheusNamesAndLabels) {
  MetricRegistry r;
  MetricGroup& op = r.root()
                        .add_group("taskmanager")
                        .add_group("job", {{"job_id", "j1"}, {"job_name", "orders"}})
                        .add_group("task", {{"task_name", "Source: k -> Map"}, {"subtask_index", "3"}})
                        .add_group("operator", {{"operator_name", "Map"}});
  op.counter("numRecordsIn").inc(7);
  // The same scope and labels are the same group.
  r.root()
      .add_group("taskmanager")
      .add_group("job", {{"job_id", "j1"}, {"job_name", "orders"}})
      .add_group("task", {{"task_name", "Source: k -> Map"}, {"subtask_index", "3"}})
      .add_group("operator", {{"operator_name", "Map"}})
      .counter("numRecordsOut")
      .inc(2);
  const std::string text = r.prometheus_text();
  EXPECT_NE(text.find("flink_taskmanager_job_task_operator_numRecordsIn{job_id=\"j1\",job_name=\"orders\",task_name="
                      "\"Source: k -> Map\",subtask_index=\"3\",operator_name=\"Map\"} 7\n"),
            std::string::npos)
      << text;
  ParsedExposition p = parse(text);
  EXPECT_EQ(p.types["flink_taskmanager_job_task_operator_numRecordsIn"], "counter");
  EXPECT_EQ(p.sum("flink_taskmanager_job_task_operator_numRecordsOut", {{"subtask_index", "3"}}), 2.0);
  EXPECT_EQ(p.samples.size(), 2u);
}

TEST(MetricRegistryTest, EveryTypeIsExposedAndParsesBack) {
  MetricRegistry r;
  int64_t now_ms = 1'000'000;
  MetricGroup& g = r.root().add_group("jobmanager").add_group("job", {{"job_name", "j"}});
  Counter& c = g.counter("numRestarts", "Restarts.");
  c.inc();
  c.inc(4);
  g.gauge("lastCheckpointSize", [] { return 1234.5; });
  g.gauge("currentInputWatermark", [] { return static_cast<double>(std::numeric_limits<int64_t>::min()); });
  g.gauge("notANumber", [] { return std::nan(""); });
  Histogram& h = g.histogram("checkpointDuration", {10, 100, 1000});
  for (double v : {5.0, 10.0, 50.0, 500.0, 5000.0})
    h.update(v);
  ParsedExposition p = parse(r.prometheus_text());
  EXPECT_EQ(p.types["flink_jobmanager_job_numRestarts"], "counter");
  EXPECT_EQ(p.help["flink_jobmanager_job_numRestarts"], "Restarts.");
  EXPECT_EQ(p.sum("flink_jobmanager_job_numRestarts"), 5.0);
  EXPECT_EQ(p.types["flink_jobmanager_job_lastCheckpointSize"], "gauge");
  EXPECT_EQ(p.sum("flink_jobmanager_job_lastCheckpointSize"), 1234.5);
  EXPECT_EQ(p.sum("flink_jobmanager_job_currentInputWatermark"),
            static_cast<double>(std::numeric_limits<int64_t>::min()));
  EXPECT_TRUE(std::isnan(*p.sum("flink_jobmanager_job_notANumber")));
  EXPECT_EQ(p.types["flink_jobmanager_job_checkpointDuration"], "histogram");
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_bucket", {{"le", "10"}}), 2.0);  // le is inclusive
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_bucket", {{"le", "100"}}), 3.0);
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_bucket", {{"le", "1000"}}), 4.0);
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_bucket", {{"le", "+Inf"}}), 5.0);
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_count"), 5.0);
  EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_sum"), 5565.0);

  // A meter: the rate over its window from samples taken when it is read.
  uint64_t count = 0;
  Meter m([&] { return static_cast<double>(count); }, 60, [&] { return now_ms; });
  EXPECT_EQ(m.rate(), 0.0);
  count = 500;
  now_ms += 5'000;
  EXPECT_DOUBLE_EQ(m.rate(), 100.0);
  count = 1500;
  now_ms += 5'000;
  EXPECT_DOUBLE_EQ(m.rate(), 150.0);  // (1500 - 0) / 10 s: the window is 60 s
  now_ms += 100'000;                  // nothing for 100 s: the window slides past the events
  EXPECT_DOUBLE_EQ(m.rate(), 0.0);
}

TEST(MetricRegistryTest, LabelValuesAreEscapedAndNamesSanitized) {
  MetricRegistry r;
  const std::string nasty = "a \"quoted\" back\\slash and a\nnewline";
  r.root().add_group("job", {{"job_name", nasty}}).gauge("records-lag-max", [] { return 3; });
  ParsedExposition p = parse(r.prometheus_text());
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].name, "flink_job_records_lag_max");
  EXPECT_EQ(p.samples[0].labels.at("job_name"), nasty);
}

// The one escaping every /metrics writer uses (the registry, sluice run's sluice_* families, the REST server):
// exactly backslash, double quote and line feed are escaped, and the parser reads the value back unchanged.
TEST(MetricRegistryTest, EscapeLabelValueEscapesBackslashQuoteAndNewlineOnly) {
  EXPECT_EQ(escape_label_value("plain ünïcode\ttab"), "plain ünïcode\ttab");  // a tab is kept
  EXPECT_EQ(escape_label_value("a\"b\nc\\"), "a\\\"b\\nc\\\\");
  EXPECT_EQ(escape_label_value(std::string_view("\0\r", 2)), std::string("\0\r", 2));
  std::string appended = "x=";
  append_escaped_label_value(appended, "\"");
  EXPECT_EQ(appended, "x=\\\"");
  const std::string nasty = "q\" b\\ n\n";
  ParsedExposition p = parse("# TYPE x gauge\nx{l=\"" + escape_label_value(nasty) + "\"} 1\n");
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].labels.at("l"), nasty);
}

TEST(MetricRegistryTest, RemovingAGroupRemovesItsSeries) {
  MetricRegistry r;
  MetricGroup& tm = r.root().add_group("taskmanager");
  MetricGroup& a = tm.add_group("job", {{"job_name", "a"}});
  MetricGroup& b = tm.add_group("job", {{"job_name", "b"}});
  a.counter("numRecordsIn").inc();
  b.counter("numRecordsIn").inc(2);
  tm.remove_group(a);
  ParsedExposition p = parse(r.prometheus_text());
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].labels.at("job_name"), "b");
}

TEST(MetricRegistryTest, TheParserRefusesWhatAScraperWould) {
  EXPECT_FALSE(parse_prometheus_text("x 1\n").ok());                             // no TYPE
  EXPECT_FALSE(parse_prometheus_text("# TYPE x gauge\nx 1\nx 2\n").ok());        // a series twice
  EXPECT_FALSE(parse_prometheus_text("# TYPE x gauge\nx{a=\"\\q\"} 1\n").ok());  // bad escape
  EXPECT_FALSE(parse_prometheus_text("# TYPE x gauge\nx{a=\"b} 1\n").ok());      // unterminated
  EXPECT_FALSE(parse_prometheus_text("# TYPE x gauge\nx one\n").ok());           // bad value
  EXPECT_FALSE(parse_prometheus_text("# TYPE x gauge\nx 1\n# TYPE x gauge\n").ok());
  EXPECT_TRUE(parse_prometheus_text("# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"2\"} -Inf 123\n").ok());
}

// The hot path: one writer thread increments, a reader (the scraper) sees a non-decreasing value, the final
// one exact. Run under tsan in CI's tsan subset this checks that no lock is needed.
TEST(MetricRegistryTest, ASingleWriterCounterIsReadSafelyWhileWritten) {
  MetricRegistry r;
  Counter& c = r.root().counter("numRecordsIn");
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 1'000'000; ++i)
      c.inc();
    done = true;
  });
  double last = 0;
  int reads = 0;
  while (!done.load() || reads < 3) {
    ParsedExposition p = parse(r.prometheus_text());
    const double v = *p.sum("flink_numRecordsIn");
    EXPECT_GE(v, last);
    last = v;
    ++reads;
  }
  writer.join();
  EXPECT_EQ(c.get(), 1'000'000u);
}

// A JobClient whose metrics the test sets.
class FakeJob final : public JobClient::Impl {
 public:
  const std::string& job_id() const override { return id_; }
  JobStatus status() const override { return JobStatus::kRunning; }
  void cancel() override {}
  JobResult wait() override { return {}; }
  bool wait_for(std::chrono::milliseconds) override { return false; }
  std::future<Result<std::string>> trigger_savepoint(std::string, bool) override { return {}; }
  std::vector<CheckpointStats> checkpoint_stats() const override {
    std::lock_guard lock(mu);
    return checkpoints;
  }
  int restarts() const override { return 2; }
  std::vector<SubtaskMetrics> subtask_metrics() const override {
    std::lock_guard lock(mu);
    return subtasks;
  }
  CheckpointCounts checkpoint_counts() const override { return {7, 1}; }

  mutable std::mutex mu;
  std::vector<SubtaskMetrics> subtasks;
  std::vector<CheckpointStats> checkpoints;

 private:
  std::string id_ = "0123abcd";
};

TEST(JobMetricsTest, AJobsCountersAppearUnderFlinksNames) {
  auto job = std::make_shared<FakeJob>();
  for (int i = 0; i < 2; ++i) {
    SubtaskMetrics m;
    m.vertex_id = 1;
    m.task_name = "Source: gen -> Map";
    m.subtask_index = i;
    m.parallelism = 2;
    m.bytes_out = 1000 * (i + 1);
    m.operators.push_back({"Source: gen", "source", 0, 10u * (i + 1), false, 5, 5});
    m.operators.push_back({"Map", "map", 10u * (i + 1), 9u * (i + 1), false, 5, 4});
    job->subtasks.push_back(m);
  }
  CheckpointStats cp;
  cp.checkpoint_id = 3;
  cp.completed = true;
  cp.duration_ms = 40;
  cp.state_bytes = 4096;
  cp.trigger_time_ms = 1'000;
  job->checkpoints.push_back(cp);
  MetricRegistry r;
  {
    JobMetrics jm(r, JobClient(job), "orders");
    ParsedExposition p = parse(r.prometheus_text());
    const std::map<std::string, std::string> sub1{{"job_name", "orders"}, {"subtask_index", "1"}};
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_operator_numRecordsOut", {{"operator_name", "Map"}}), 27.0);
    EXPECT_EQ(
        p.sum("flink_taskmanager_job_task_operator_numRecordsIn", {{"operator_name", "Map"}, {"subtask_index", "1"}}),
        20.0);
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_numRecordsOut", sub1), 18.0);  // the chain's tail
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_numBytesOut", sub1), 2000.0);
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_operator_currentOutputWatermark", {{"operator_name", "Map"}}), 8.0);
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_operator_numRecordsOut", {{"operator_id", "source"}}), 30.0);
    for (const char* n : {"busyTimeMsPerSecond", "idleTimeMsPerSecond", "backPressuredTimeMsPerSecond",
                          "numRecordsInPerSecond", "numRecordsOutPerSecond", "numBytesInPerSecond"}) {
      EXPECT_EQ(p.find(std::string("flink_taskmanager_job_task_") + n).size(), 2u) << n;
    }
    EXPECT_EQ(p.sum("flink_jobmanager_job_numRestarts", {{"job_id", "0123abcd"}}), 2.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_numberOfCompletedCheckpoints"), 7.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_numberOfFailedCheckpoints"), 1.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_lastCheckpointDuration"), 40.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_lastCheckpointSize"), 4096.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_lastCheckpointCompletedTimestamp"), 1040.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_count"), 1.0);
    // Counters move with the job; a second scrape does not count a checkpoint twice.
    {
      std::lock_guard lock(job->mu);
      job->subtasks[0].operators[1].records_out = 100;
    }
    p = parse(r.prometheus_text());
    EXPECT_EQ(p.sum("flink_taskmanager_job_task_operator_numRecordsOut", {{"operator_name", "Map"}}), 118.0);
    EXPECT_EQ(p.sum("flink_jobmanager_job_checkpointDuration_count"), 1.0);
  }
  // The job's series go with its JobMetrics.
  EXPECT_TRUE(parse(r.prometheus_text()).samples.empty());
}

}  // namespace
}  // namespace sluice::metrics
