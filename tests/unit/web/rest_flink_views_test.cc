// The REST API's Flink-shaped views read as a Flink script or the web UI reads them, for a running C++ job
// (RestServer::execute) and a running pipeline (PipelineRunner with its registry): /overview, /config,
// /jobs/overview, /jobs/:id (vertices with IO metrics, the plan's edges), /jobs/:id/vertices/:vid (per-subtask
// state, host, metrics), .../backpressure (a slow operator turns its upstream vertex "high"), the metric
// endpoints with and without ?get=, and 404s. Values change while the jobs run, so checks are polled.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "integration/test_util/polling.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/value.h"
#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/web/rest_server.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
constexpr auto kDeadline = std::chrono::seconds(60);  // a loaded machine

struct Answer {
  int status = 0;
  Value body;
  std::string text;
};

Answer get(httplib::Client& http, const std::string& path) {
  httplib::Result r = http.Get(path);
  if (!r) {
    ADD_FAILURE() << "GET " << path << ": " << httplib::to_string(r.error());
    return {};
  }
  Answer a{r->status, Value(), r->body};
  auto v = Value::from_json(r->body);
  EXPECT_TRUE(v.ok()) << "GET " << path << " answered non-JSON: " << r->body;
  if (v.ok()) a.body = std::move(*v);
  return a;
}

std::string str(const Value& v, std::string_view path) {
  const Value* f = v.at_path(path);
  return f != nullptr && f->is_string() ? std::string(f->as_string()) : std::string();
}
int64_t num(const Value& v, std::string_view path) {
  const Value* f = v.at_path(path);
  return f != nullptr && f->is_int64() ? f->as_int64() : -1;
}
double real(const Value& v, std::string_view path) {
  const Value* f = v.at_path(path);
  if (f == nullptr) return -1;
  if (f->is_double()) return f->as_double();
  if (f->is_int64()) return static_cast<double>(f->as_int64());
  return -1;
}

/// The ids of a metric list answer ([{"id": ...}]).
std::set<std::string> ids(const Value& list) {
  std::set<std::string> out;
  if (!list.is_array()) return out;
  for (const Value& e : list.as_array())
    out.insert(std::string(e.find("id")->as_string()));
  return out;
}

/// The value of the first series of `name` in Prometheus `text` whose labels contain `labels` ("absent" if none).
std::string series(const std::string& text, const std::string& name, const std::string& labels) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with(name + "{")) continue;
    const size_t end = line.rfind("} ");
    if (end == std::string::npos || line.substr(0, end).find(labels) == std::string::npos) continue;
    return line.substr(end + 2);
  }
  return "absent";
}

// numbers (p=1) -> rebalance -> slow filter (p=2) -> sink: two vertices, the second chained to its sink; the
// slow filter backpressures the source.
TEST(RestFlinkViewsTest, ACppJobsVerticesSubtasksBackpressureAndMetrics) {
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  RestServer& rest = **server;
  StreamEnvironment env;
  env.set_parallelism(2);
  auto out = std::make_shared<testing::CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, std::numeric_limits<int64_t>::max() - 1), "numbers")
      .set_parallelism(1)
      .uid("numbers")
      .rebalance()
      .filter([](int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow operator: ~5,000 records/s
        return false;
      })
      .name("slow")
      .uid("slow")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(out), "out")
      .uid("out");
  JobClient client = rest.execute(env, "viewed");
  const std::string id = client.job_id();
  httplib::Client http(rest.address(), rest.port());

  // /overview and /config.
  ASSERT_TRUE(testing::poll_until([&] { return client.status() == JobStatus::kRunning; }, kDeadline));
  Answer overview = get(http, "/overview");
  ASSERT_EQ(overview.status, 200);
  EXPECT_EQ(num(overview.body, "jobs-running"), 1) << overview.text;
  EXPECT_EQ(num(overview.body, "jobs-finished"), 0);
  EXPECT_EQ(num(overview.body, "jobs-cancelled"), 0);
  EXPECT_EQ(num(overview.body, "jobs-failed"), 0);
  EXPECT_EQ(num(overview.body, "taskmanagers"), 1);
  EXPECT_EQ(num(overview.body, "slots-total"), 2) << overview.text;  // one slot sharing group, parallelism 2
  EXPECT_EQ(num(overview.body, "slots-available"), 0);
  EXPECT_EQ(str(overview.body, "flink-version").rfind("sluice-", 0), 0u) << overview.text;
  Answer config = get(http, "/config");
  ASSERT_EQ(config.status, 200);
  EXPECT_EQ(num(config.body, "refresh-interval"), 3000);
  EXPECT_FALSE(str(config.body, "timezone-name").empty());
  EXPECT_NE(config.body.at_path("timezone-offset"), nullptr);
  EXPECT_TRUE(config.body.at_path("features.web-cancel")->as_bool());
  EXPECT_FALSE(config.body.at_path("features.web-submit")->as_bool());

  // /jobs/overview: 3 subtasks, all RUNNING.
  Answer jobs;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        jobs = get(http, "/jobs/overview");
        return num(jobs.body, "jobs[0].tasks.running") == 3;
      },
      kDeadline))
      << jobs.text;
  EXPECT_EQ(str(jobs.body, "jobs[0].jid"), id);
  EXPECT_EQ(str(jobs.body, "jobs[0].name"), "viewed");
  EXPECT_EQ(str(jobs.body, "jobs[0].state"), "RUNNING");
  EXPECT_EQ(num(jobs.body, "jobs[0].tasks.total"), 3);
  EXPECT_EQ(num(jobs.body, "jobs[0].end-time"), -1);
  EXPECT_GE(num(jobs.body, "jobs[0].duration"), 0);

  // /jobs/:id: Flink's JobDetailsInfo, vertices in topological order with 32-hex ids, and the plan's edge.
  Answer details = get(http, "/jobs/" + id);
  ASSERT_EQ(details.status, 200);
  EXPECT_EQ(str(details.body, "jid"), id);
  EXPECT_EQ(str(details.body, "state"), "RUNNING");
  EXPECT_EQ(str(details.body, "job-type"), "STREAMING");
  EXPECT_GT(num(details.body, "now"), 0);
  EXPECT_GT(num(details.body, "timestamps.RUNNING"), 0);
  ASSERT_EQ(details.body.find("vertices")->size(), 2u) << details.text;
  const std::string source_vid = str(details.body, "vertices[0].id");
  const std::string slow_vid = str(details.body, "vertices[1].id");
  EXPECT_TRUE(std::regex_match(source_vid, std::regex("[0-9a-f]{32}"))) << source_vid;
  EXPECT_NE(source_vid, slow_vid);
  EXPECT_EQ(str(details.body, "vertices[0].name"), "Source: numbers");
  EXPECT_EQ(str(details.body, "vertices[1].name"), "slow -> out");
  EXPECT_EQ(num(details.body, "vertices[1].parallelism"), 2);
  EXPECT_EQ(num(details.body, "vertices[1].maxParallelism"), 128);
  EXPECT_EQ(str(details.body, "vertices[1].status"), "RUNNING");
  EXPECT_EQ(num(details.body, "vertices[1].tasks.RUNNING"), 2);
  EXPECT_EQ(str(details.body, "vertices[1].operators[1].uid"), "out");
  EXPECT_EQ(num(details.body, "status-counts.RUNNING"), 3);
  ASSERT_EQ(details.body.at_path("plan.nodes")->size(), 2u);
  EXPECT_EQ(str(details.body, "plan.nodes[1].id"), slow_vid);
  EXPECT_EQ(details.body.at_path("plan.nodes[0].inputs"), nullptr);  // a source has none, as in Flink
  EXPECT_EQ(str(details.body, "plan.nodes[1].inputs[0].id"), source_vid);
  EXPECT_EQ(str(details.body, "plan.nodes[1].inputs[0].ship_strategy"), "REBALANCE");
  ASSERT_TRUE(testing::poll_until(
      [&] {
        details = get(http, "/jobs/" + id);
        return num(details.body, "vertices[0].metrics.write-records") > 0 &&
               num(details.body, "vertices[1].metrics.read-records") > 0 &&
               num(details.body, "vertices[0].metrics.write-bytes") > 0;
      },
      kDeadline))
      << details.text;
  EXPECT_EQ(details.body.at_path("vertices[0].metrics.write-records-complete")->as_bool(), false);

  // /jobs/:id/vertices/:vid: each subtask with its state, host and metrics.
  Answer vertex;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        vertex = get(http, "/jobs/" + id + "/vertices/" + slow_vid);
        return real(vertex.body, "subtasks[1].metrics.busyTimeMsPerSecond") > 0;
      },
      kDeadline))
      << vertex.text;
  EXPECT_EQ(str(vertex.body, "id"), slow_vid);
  EXPECT_EQ(str(vertex.body, "name"), "slow -> out");
  ASSERT_EQ(vertex.body.find("subtasks")->size(), 2u);
  for (const char* i : {"0", "1"}) {
    const std::string s = fmt::format("subtasks[{}].", i);
    EXPECT_EQ(num(vertex.body, s + "subtask"), std::stoi(i));
    EXPECT_EQ(str(vertex.body, s + "status"), "RUNNING");
    EXPECT_FALSE(str(vertex.body, s + "host").empty());
    EXPECT_EQ(str(vertex.body, s + "endpoint"), str(vertex.body, s + "host"));
    EXPECT_GE(num(vertex.body, s + "metrics.read-records"), 0);
    EXPECT_GE(num(vertex.body, s + "duration"), 0);
  }

  // Backpressure: the source waits for credit most of the time ("high"), the slow vertex is busy, not
  // backpressured ("ok").
  Answer bp;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        bp = get(http, "/jobs/" + id + "/vertices/" + source_vid + "/backpressure");
        return str(bp.body, "backpressure-level") == "high";
      },
      kDeadline, std::chrono::milliseconds(200)))
      << bp.text;
  EXPECT_EQ(str(bp.body, "status"), "ok");
  EXPECT_EQ(str(bp.body, "backpressureLevel"), "high");
  EXPECT_GT(num(bp.body, "end-timestamp"), 0);
  ASSERT_EQ(bp.body.find("subtasks")->size(), 1u);
  EXPECT_GT(real(bp.body, "subtasks[0].ratio"), 0.5);
  EXPECT_LE(real(bp.body, "subtasks[0].ratio"), 1.0);
  EXPECT_EQ(str(bp.body, "subtasks[0].backpressure-level"), "high");
  EXPECT_EQ(num(bp.body, "subtasks[0].subtask"), 0);
  EXPECT_EQ(num(bp.body, "subtasks[0].attempt-number"), 0);
  EXPECT_GE(real(bp.body, "subtasks[0].idleRatio"), 0);
  EXPECT_GE(real(bp.body, "subtasks[0].busyRatio"), 0);
  Answer slow_bp = get(http, "/jobs/" + id + "/vertices/" + slow_vid + "/backpressure");
  EXPECT_EQ(str(slow_bp.body, "backpressure-level"), "ok") << slow_bp.text;
  ASSERT_EQ(slow_bp.body.find("subtasks")->size(), 2u);

  // Vertex metrics: the list of ids, then values as strings.
  Answer list = get(http, "/jobs/" + id + "/vertices/" + slow_vid + "/metrics");
  ASSERT_EQ(list.status, 200);
  const std::set<std::string> vertex_ids = ids(list.body);
  for (const char* m : {"0.numRecordsIn", "1.numRecordsIn", "0.backPressuredTimeMsPerSecond", "1.busyTimeMsPerSecond",
                        "0.slow.numRecordsIn", "1.out.numRecordsIn", "0.slow.currentInputWatermark"}) {
    EXPECT_TRUE(vertex_ids.count(m)) << m << " not in " << list.text;
  }
  Answer values =
      get(http, "/jobs/" + id + "/vertices/" + slow_vid + "/metrics?get=0.numRecordsIn,nope,1.slow.numRecordsIn");
  ASSERT_EQ(values.body.size(), 2u) << values.text;  // unknown ids are left out, as in Flink
  EXPECT_EQ(str(values.body, "[0].id"), "0.numRecordsIn");
  EXPECT_GT(std::stoll(str(values.body, "[0].value")), 0) << values.text;
  EXPECT_EQ(str(values.body, "[1].id"), "1.slow.numRecordsIn");
  Answer agg = get(http, "/jobs/" + id + "/vertices/" + slow_vid + "/subtasks/metrics?get=numRecordsIn&agg=sum,max");
  ASSERT_EQ(agg.body.size(), 1u) << agg.text;
  EXPECT_EQ(str(agg.body, "[0].id"), "numRecordsIn");
  EXPECT_GT(real(agg.body, "[0].sum"), 0);
  EXPECT_GE(real(agg.body, "[0].sum"), real(agg.body, "[0].max"));
  EXPECT_EQ(agg.body.at_path("[0].min"), nullptr);  // not asked for
  Answer watermarks = get(http, "/jobs/" + id + "/vertices/" + slow_vid + "/watermarks");
  EXPECT_EQ(watermarks.body.size(), 2u) << watermarks.text;

  // Job metrics.
  Answer job_list = get(http, "/jobs/" + id + "/metrics");
  const std::set<std::string> job_ids = ids(job_list.body);
  for (const char* m : {"numRestarts", "numberOfCompletedCheckpoints", "numberOfFailedCheckpoints",
                        "lastCheckpointDuration", "lastCheckpointSize"}) {
    EXPECT_TRUE(job_ids.count(m)) << m << " not in " << job_list.text;
  }
  Answer restarts = get(http, "/jobs/" + id + "/metrics?get=numRestarts,lastCheckpointDuration");
  ASSERT_EQ(restarts.body.size(), 2u) << restarts.text;
  EXPECT_EQ(str(restarts.body, "[0].id"), "numRestarts");
  EXPECT_EQ(str(restarts.body, "[0].value"), "0");
  EXPECT_EQ(str(restarts.body, "[1].value"), "-1");  // no checkpoint configured

  // /metrics without a provider has the registry's Flink-named metrics of the job.
  httplib::Result scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape);
  EXPECT_NE(scrape->body.find("flink_taskmanager_job_task_operator_numRecordsIn{"), std::string::npos);
  EXPECT_NE(scrape->body.find("flink_taskmanager_job_task_backPressuredTimeMsPerSecond{"), std::string::npos);
  EXPECT_NE(scrape->body.find("sluice_job_running{job=\"viewed\",status=\"RUNNING\"} 1"), std::string::npos);

  // Unknown vertices and jobs.
  Answer missing = get(http, "/jobs/" + id + "/vertices/0123456789abcdef0123456789abcdef");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(str(missing.body, "errors[0]").find(source_vid), std::string::npos) << missing.text;
  EXPECT_EQ(get(http, "/jobs/nope/vertices/" + slow_vid + "/backpressure").status, 404);
  EXPECT_EQ(get(http, "/jobs/nope/metrics").status, 404);

  // Once cancelled: CANCELED everywhere, and the final counters stay.
  client.cancel();
  client.wait();
  Answer ended = get(http, "/jobs/" + id);
  EXPECT_EQ(str(ended.body, "state"), "CANCELED");
  EXPECT_EQ(str(ended.body, "vertices[1].status"), "CANCELED");
  EXPECT_GT(num(ended.body, "vertices[0].metrics.write-records"), 0);
  EXPECT_GT(num(ended.body, "end-time"), 0);
  EXPECT_GT(num(ended.body, "timestamps.CANCELED"), 0);
  Answer ended_overview = get(http, "/overview");
  EXPECT_EQ(num(ended_overview.body, "jobs-cancelled"), 1);
  EXPECT_EQ(num(ended_overview.body, "jobs-running"), 0);
  rest.stop();
}

// Opens once (open() or the destructor, so that a failed assertion does not leave a task blocked).
class Gate {
 public:
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }
  ~Gate() { open(); }
  std::shared_future<void> future() const { return future_; }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  std::atomic<bool> opened_{false};
};

// The metric views of a job that has just ended answer its final counts, the same as /jobs/:id: they used to
// answer the REST sampler's latest samples, up to a second old, so a job that ended within that second showed
// the counts of while it ran (numRecordsIn 1 of 1,000). numbers (p=1) -> rebalance -> gate -> out: the gate
// holds its first record until the views have answered and the sampler has sampled the held job.
TEST(RestFlinkViewsTest, AnEndedJobsMetricViewsAnswerItsFinalCounts) {
  constexpr int64_t kRecords = 1000;
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  RestServer& rest = **server;
  auto gate = std::make_shared<Gate>();
  StreamEnvironment env;
  env.set_parallelism(1);
  auto out = std::make_shared<testing::CollectedRecords<int64_t>>();
  env.from_source(datagen::sequence(0, kRecords - 1), "numbers")
      .uid("numbers")
      .rebalance()
      .map([opened = gate->future()](const int64_t& n) {
        opened.wait();
        return n;
      })
      .name("gate")
      .uid("gate")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(out), "out")
      .uid("out");
  JobClient client = rest.execute(env, "gated");
  const std::string id = client.job_id();
  httplib::Client http(rest.address(), rest.port());
  Answer details;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        details = get(http, "/jobs/" + id);
        return details.body.find("vertices") != nullptr && details.body.find("vertices")->size() == 2;
      },
      kDeadline))
      << details.text;
  ASSERT_EQ(str(details.body, "vertices[1].name"), "gate -> out") << details.text;
  const std::string source_vid = str(details.body, "vertices[0].id");
  const std::string gate_vid = str(details.body, "vertices[1].id");
  // While the gate holds: the views know the gate's subtask, it has not read every record, and the job has run
  // past a tick of the REST server's once-a-second metric sampler (which answered every view before the fix).
  Answer held;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        held = get(http, "/jobs/" + id + "/vertices/" + gate_vid + "/subtasks/metrics?get=numRecordsIn");
        details = get(http, "/jobs/" + id);
        return held.body.size() == 1 && num(details.body, "duration") >= 1500;
      },
      kDeadline))
      << held.text << details.text;
  EXPECT_LT(real(held.body, "[0].sum"), kRecords) << held.text;

  gate->open();
  ASSERT_EQ(client.wait().status, JobStatus::kFinished);
  // At once, without polling: every view has the final counts.
  details = get(http, "/jobs/" + id);
  EXPECT_EQ(num(details.body, "vertices[0].metrics.write-records"), kRecords) << details.text;
  EXPECT_EQ(num(details.body, "vertices[1].metrics.read-records"), kRecords) << details.text;
  const int64_t bytes_sent = num(details.body, "vertices[0].metrics.write-bytes");
  const int64_t bytes_read = num(details.body, "vertices[1].metrics.read-bytes");
  EXPECT_GT(bytes_sent, 0) << details.text;
  EXPECT_EQ(bytes_read, bytes_sent) << details.text;

  Answer source_agg =
      get(http, "/jobs/" + id + "/vertices/" + source_vid + "/subtasks/metrics?get=numRecordsOut,numBytesOut&agg=sum");
  ASSERT_EQ(source_agg.body.size(), 2u) << source_agg.text;
  EXPECT_EQ(real(source_agg.body, "[0].sum"), kRecords) << source_agg.text;
  EXPECT_EQ(real(source_agg.body, "[1].sum"), static_cast<double>(bytes_sent)) << source_agg.text;
  Answer gate_agg =
      get(http, "/jobs/" + id + "/vertices/" + gate_vid + "/subtasks/metrics?get=numRecordsIn,numBytesIn&agg=sum");
  ASSERT_EQ(gate_agg.body.size(), 2u) << gate_agg.text;
  EXPECT_EQ(real(gate_agg.body, "[0].sum"), kRecords) << gate_agg.text;
  EXPECT_EQ(real(gate_agg.body, "[1].sum"), static_cast<double>(bytes_read)) << gate_agg.text;
  const std::string all = std::to_string(kRecords);
  Answer values =
      get(http, "/jobs/" + id + "/vertices/" + gate_vid +
                    "/metrics?get=0.numRecordsIn,0.gate.numRecordsIn,0.gate.numRecordsOut,0.out.numRecordsIn");
  ASSERT_EQ(values.body.size(), 4u) << values.text;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(str(values.body, fmt::format("[{}].value", i)), all) << values.text;
  }
  Answer vertex = get(http, "/jobs/" + id + "/vertices/" + gate_vid);
  EXPECT_EQ(num(vertex.body, "subtasks[0].metrics.read-records"), kRecords) << vertex.text;

  // Prometheus: the registry's task and operator counters, the same.
  httplib::Result scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape);
  EXPECT_EQ(series(scrape->body, "flink_taskmanager_job_task_numRecordsOut", "task_name=\"Source: numbers\""), all)
      << scrape->body;
  EXPECT_EQ(series(scrape->body, "flink_taskmanager_job_task_numRecordsIn", "task_name=\"gate -> out\""), all)
      << scrape->body;
  EXPECT_EQ(series(scrape->body, "flink_taskmanager_job_task_operator_numRecordsIn", "operator_name=\"out\""), all)
      << scrape->body;
  EXPECT_EQ(series(scrape->body, "flink_taskmanager_job_task_numBytesIn", "task_name=\"gate -> out\""),
            std::to_string(bytes_read))
      << scrape->body;
  EXPECT_EQ(out->size(), static_cast<size_t>(kRecords));
  rest.stop();
}

// A pipeline (PipelineRunner) served as `sluice run` serves it: the metric views read the pipeline's own
// registry, so its own metrics (dead letters, connector metrics) and checkpoint metrics are there.
TEST(RestFlinkViewsTest, APipelinesViewsReadItsRegistry) {
  char tmpl[] = "/tmp/sluice-rest-views-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string yaml = fmt::format(R"(pipeline:
  name: viewed-pipeline
  parallelism: 2
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir.string());
  Result<pipeline::PipelineSpec> spec = pipeline::parse_pipeline(yaml, "viewed.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<pipeline::PipelineRunner>> created = pipeline::PipelineRunner::create(*spec);
  ASSERT_TRUE(created.ok()) << created.error().message();
  pipeline::PipelineRunner& runner = **created;
  const JobPlan plan = job_plan_of(runner.stream_graph());
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok());
  RestServer& rest = **server;
  rest.serve_metric_samples([&runner] { return runner.metric_samples(); });
  ASSERT_TRUE(runner.start().ok());
  rest.register_job("viewed-pipeline", *runner.client(), plan);
  const std::string id = runner.client()->job_id();
  httplib::Client http(rest.address(), rest.port());

  Answer details = get(http, "/jobs/" + id);
  ASSERT_EQ(details.status, 200) << details.text;
  ASSERT_GE(details.body.find("vertices")->size(), 2u) << details.text;
  // Every vertex but the first has an input in the plan, naming a vertex of the job.
  std::set<std::string> vids;
  for (const Value& v : details.body.find("vertices")->as_array())
    vids.insert(std::string(v.find("id")->as_string()));
  const auto& nodes = details.body.at_path("plan.nodes")->as_array();
  for (size_t i = 1; i < nodes.size(); ++i) {
    ASSERT_NE(nodes[i].find("inputs"), nullptr) << details.text;
    EXPECT_TRUE(vids.count(std::string(nodes[i].find("inputs")->as_array()[0].find("id")->as_string())));
  }
  const std::string source_vid = str(details.body, "vertices[0].id");
  Answer source_metrics;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        source_metrics = get(http, "/jobs/" + id + "/vertices/" + source_vid + "/metrics");
        return ids(source_metrics.body).count("0.numRecordsOut") > 0;
      },
      kDeadline))
      << source_metrics.text;
  // The pipeline's own metrics (dead letters per stage) are in its registry only.
  Answer job_list = get(http, "/jobs/" + id + "/metrics");
  EXPECT_TRUE(ids(job_list.body).count("transform.deadLetters_numRecords")) << job_list.text;
  Answer checkpoints;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        checkpoints = get(http, "/jobs/" + id + "/metrics?get=numberOfCompletedCheckpoints");
        return checkpoints.body.size() == 1 && std::stoll(str(checkpoints.body, "[0].value")) >= 1;
      },
      kDeadline))
      << checkpoints.text;
  // Flink's checkpoint statistics.
  Answer cps = get(http, "/jobs/" + id + "/checkpoints");
  EXPECT_GE(num(cps.body, "counts.completed"), 1) << cps.text;
  EXPECT_EQ(num(cps.body, "counts.in_progress"), 0);
  EXPECT_GE(num(cps.body, "summary.end_to_end_duration.max"), num(cps.body, "summary.end_to_end_duration.min"));
  EXPECT_GT(num(cps.body, "summary.state_size.max"), 0);
  EXPECT_EQ(str(cps.body, "history[0].className"), ".CompletedCheckpointStatistics");
  EXPECT_EQ(str(cps.body, "history[0].status"), "COMPLETED");
  EXPECT_GE(num(cps.body, "history[0].latest_ack_timestamp"), num(cps.body, "history[0].trigger_timestamp"));
  EXPECT_GT(num(cps.body, "history[0].num_subtasks"), 0);
  Answer bp = get(http, "/jobs/" + id + "/vertices/" + source_vid + "/backpressure");
  EXPECT_EQ(bp.status, 200);
  EXPECT_FALSE(str(bp.body, "backpressure-level").empty()) << bp.text;
  rest.stop();
  runner.cancel();
  runner.wait();
  fs::remove_all(dir);
}

// A chain whose tail is a dead-letter sink (source -> transform, and the transform's dead letters to a chained
// sink; the events go on over the network to the route vertices): the task's write-records and numRecordsOut are
// the transform's records out, not the dead-letter sink's 0.
// entity-version keys the events before the sinks (keyed state), so the pipeline has two vertices at parallelism
// 1; without it the sinks would be chained to the transform (PipelineRunner::create).
TEST(RestFlinkViewsTest, AChainEndingInADeadLetterSinkCountsTheRecordsItSends) {
  char tmpl[] = "/tmp/sluice-rest-views-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  constexpr int kRecords = 600;
  const std::string yaml = fmt::format(R"(pipeline:
  name: dead-letter-tail
  parallelism: 1
  entity-version: true
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
  dead-letter: {{ type: files, path: "{0}/dead" }}
source: {{ type: datagen, count: {1}, entities: 50 }}
transform:
  - match: "*.public.charges"
    key: after.id
    event: {{ type: "'charge.' || after.status", payload: "after.id, after.amount_cents" }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir.string(), kRecords);
  Result<pipeline::PipelineSpec> spec = pipeline::parse_pipeline(yaml, "dead-letter-tail.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<pipeline::PipelineRunner>> created = pipeline::PipelineRunner::create(*spec);
  ASSERT_TRUE(created.ok()) << created.error().message();
  pipeline::PipelineRunner& runner = **created;
  const JobPlan plan = job_plan_of(runner.stream_graph());
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok());
  RestServer& rest = **server;
  rest.serve_metric_samples([&runner] { return runner.metric_samples(); });
  ASSERT_TRUE(runner.start().ok());
  rest.register_job("dead-letter-tail", *runner.client(), plan);
  const std::string id = runner.client()->job_id();
  const JobResult result = runner.wait();
  ASSERT_EQ(result.status, JobStatus::kFinished) << (result.error ? result.error->to_string() : "");
  httplib::Client http(rest.address(), rest.port());

  Answer details = get(http, "/jobs/" + id);
  ASSERT_EQ(details.status, 200) << details.text;
  ASSERT_GE(details.body.find("vertices")->size(), 2u) << details.text;
  const std::string name = str(details.body, "vertices[0].name");
  ASSERT_NE(name.find("Transform"), std::string::npos) << details.text;
  ASSERT_EQ(name.substr(name.size() - std::string("dead-letter").size()), "dead-letter") << name;
  EXPECT_EQ(num(details.body, "vertices[0].metrics.write-records"), kRecords) << details.text;
  // The next vertex read them all.
  EXPECT_EQ(num(details.body, "vertices[1].metrics.read-records"), kRecords) << details.text;
  // The same in the task metrics, summed over the source vertex's subtasks.
  const std::string source_vid = str(details.body, "vertices[0].id");
  Answer agg = get(http, "/jobs/" + id + "/vertices/" + source_vid + "/subtasks/metrics?get=numRecordsOut");
  ASSERT_EQ(agg.status, 200) << agg.text;
  EXPECT_EQ(real(agg.body, "[0].sum"), kRecords) << agg.text;
  rest.stop();
  fs::remove_all(dir);
}

// A pipeline that ended with dead letters at its source (a line that is not JSON) and in its transform (a NULL
// key): right after it ended, its job metrics, task metrics and /metrics (as `sluice run` serves them) count
// them and its records as /jobs/:id does.
// entity-version: two vertices, as above.
TEST(RestFlinkViewsTest, AnEndedPipelinesViewsCountItsRecordsAndDeadLetters) {
  char tmpl[] = "/tmp/sluice-rest-views-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  fs::create_directories(dir / "in");
  {
    std::ofstream in(dir / "in" / "changes.jsonl");
    auto change = [](const std::string& id, int lsn) {
      return fmt::format(
          R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}","status":"created","amount":1}},)"
          R"("source":{{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/{1}",)"
          R"("ts_ms":1790000000000,"snapshot":false,"txn_id":{1},"sequence":{1}}}}})",
          id, lsn);
    };
    in << change("ch_1", 1) << "\n{not json\n" << change("ch_3", 3) << "\n";
    // The key expression gives NULL: no entity.
    in << R"({"op":"c","key":{"id":"x"},"before":null,"after":{"status":"created"},"source":{"connector":"postgres",)"
       << R"("db":"payments","collection":"public.charges","position":"0/4","ts_ms":1,"snapshot":false,"sequence":4}})"
       << "\n"
       << change("ch_5", 5) << "\n";
  }
  const std::string yaml = fmt::format(R"(pipeline:
  name: dead-letters
  parallelism: 1
  entity-version: true
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
  dead-letter: {{ type: files, path: "{0}/dead" }}
source: {{ type: files, path: "{0}/in" }}
transform:
  - match: "payments.public.charges"
    key: id
    event: {{ type: "'charge.' || after.status", payload: "after.id" }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir.string());
  Result<pipeline::PipelineSpec> spec = pipeline::parse_pipeline(yaml, "dead-letters.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<pipeline::PipelineRunner>> created = pipeline::PipelineRunner::create(*spec);
  ASSERT_TRUE(created.ok()) << created.error().message();
  pipeline::PipelineRunner& runner = **created;
  const JobPlan plan = job_plan_of(runner.stream_graph());
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok());
  RestServer& rest = **server;
  rest.serve_metric_samples([&runner] { return runner.metric_samples(); });
  rest.serve_metrics([&runner] { return runner.metrics_text(); });
  ASSERT_TRUE(runner.start().ok());
  rest.register_job("dead-letters", *runner.client(), plan);
  const std::string id = runner.client()->job_id();
  const JobResult result = runner.wait();
  ASSERT_EQ(result.status, JobStatus::kFinished) << (result.error ? result.error->to_string() : "");
  httplib::Client http(rest.address(), rest.port());

  Answer job = get(http, "/jobs/" + id + "/metrics?get=source.deadLetters_numRecords,transform.deadLetters_numRecords");
  ASSERT_EQ(job.body.size(), 2u) << job.text;
  EXPECT_EQ(str(job.body, "[0].value"), "1") << job.text;
  EXPECT_EQ(str(job.body, "[1].value"), "1") << job.text;
  Answer details = get(http, "/jobs/" + id);
  const std::string source_vid = str(details.body, "vertices[0].id");
  const int64_t sent = num(details.body, "vertices[0].metrics.write-records");
  EXPECT_EQ(sent, 3) << details.text;  // the 5 lines but the 2 dead letters
  Answer agg = get(http, "/jobs/" + id + "/vertices/" + source_vid + "/subtasks/metrics?get=numRecordsOut&agg=sum");
  EXPECT_EQ(real(agg.body, "[0].sum"), static_cast<double>(sent)) << agg.text;

  httplib::Result scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape);
  EXPECT_EQ(series(scrape->body, "flink_jobmanager_job_deadLetters_numRecords", "stage=\"source\""), "1")
      << scrape->body;
  EXPECT_EQ(series(scrape->body, "flink_jobmanager_job_deadLetters_numRecords", "stage=\"transform\""), "1")
      << scrape->body;
  EXPECT_EQ(series(scrape->body, "flink_taskmanager_job_task_numRecordsOut",
                   "task_name=\"" + str(details.body, "vertices[0].name") + "\""),
            std::to_string(sent))
      << scrape->body;
  rest.stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice
