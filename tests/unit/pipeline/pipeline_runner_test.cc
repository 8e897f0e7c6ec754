// PipelineRunner end to end on the local mini-cluster, with files in and out (no external service): domain
// events and their ids, dead letters, failures, health, metrics, resuming from a checkpoint.
#include "sluice/pipeline/pipeline_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "integration/test_util/polling.h"
#include "sluice/core/logging.h"
#include "sluice/graph/job_graph.h"
#include "sluice/web/metrics_server.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

class PipelineRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-pipeline-runner-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "in");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // One change event line in the envelope of docs/cdc.md.
  static std::string change(const std::string& op, const std::string& id, const std::string& status, int lsn, int seq) {
    const std::string row = fmt::format(R"({{"id":"{}","status":"{}","amount":{}}})", id, status, 100 + seq);
    return fmt::format(
        R"({{"op":"{}","key":{{"id":"{}"}},"before":{},"after":{},"source":{{"connector":"postgres","db":"payments",)"
        R"("collection":"public.charges","position":"0/{:X}","ts_ms":1790000000000,"snapshot":false,"txn_id":{},)"
        R"("sequence":{}}}}})",
        op, id, op == "d" ? fmt::format(R"({{"id":"{}"}})", id) : "null", op == "d" ? "null" : row, lsn, lsn, seq);
  }

  // Per entity ch_0 .. ch_<entities-1>: created, then paid, then deleted for every `delete_every`th; in
  // source order (growing LSN), the sequence e * 10 + step.
  static std::vector<std::string> entity_lifecycles(int entities, int delete_every) {
    std::vector<std::string> lines;
    int lsn = 100;
    for (int e = 0; e < entities; ++e) {
      const std::string id = fmt::format("ch_{}", e);
      lines.push_back(change("c", id, "created", lsn++, e * 10));
      lines.push_back(change("u", id, "paid", lsn++, e * 10 + 1));
      if (e % delete_every == 0) lines.push_back(change("d", id, "", lsn++, e * 10 + 2));
    }
    return lines;
  }

  void write_input(const std::vector<std::string>& lines, const std::string& name = "changes.jsonl") {
    std::ofstream out(dir_ / "in" / name);
    for (const auto& l : lines)
      out << l << "\n";
  }

  std::string pipeline(const std::string& extra_pipeline = "", const std::string& transform_extra = "",
                       const std::string& out = "out") const {
    return fmt::format(R"(pipeline:
  name: test
  parallelism: 2
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
{1}
source:
  type: files
  path: {0}/in
transform:
  - match: "payments.public.charges"
    key: id
    event:
      type: "CASE op WHEN 'd' THEN 'charge.deleted' ELSE 'charge.' || after.status END"
      payload: "after.id, after.amount AS amount_cents"
{2}
  - match: "*.*.*"
    key: key.id
sink:
  events: {{ type: files, path: "{0}/{3}" }}
)",
                       dir_.string(), extra_pipeline, transform_extra, out);
  }

  static std::vector<Value> read_events(const fs::path& d) {
    std::vector<Value> out;
    if (!fs::exists(d)) return out;
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(d))
      if (f.path().filename().string().starts_with("part-")) files.push_back(f.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::string line;
      while (std::getline(in, line))
        out.push_back(Value::from_json(line).value_or_throw());
    }
    return out;
  }

  static std::unique_ptr<PipelineRunner> runner_for(const std::string& yaml) {
    Result<PipelineSpec> spec = parse_pipeline(yaml, "test.yaml");
    EXPECT_TRUE(spec.ok()) << spec.error().message();
    Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*spec);
    EXPECT_TRUE(r.ok()) << r.error().message();
    return std::move(*r);
  }

  fs::path dir_;
};

TEST_F(PipelineRunnerTest, ChangesBecomeDomainEventsWithStableIdsInEntityOrder) {
  const std::vector<std::string> lines = entity_lifecycles(50, 5);
  write_input(lines);
  std::vector<Value> runs[2];
  for (int run = 0; run < 2; ++run) {
    auto runner = runner_for(pipeline("", "", fmt::format("out{}", run)));
    ASSERT_TRUE(runner->start().ok());
    JobResult r = runner->wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
    runs[run] = read_events(dir_ / fmt::format("out{}", run));
    EXPECT_NE(runner->summary(r).find("charge.paid"), std::string::npos) << runner->summary(r);
    // A FINISHED job delivered what its sinks received.
    EXPECT_NE(runner->summary(r).find(fmt::format("delivered by the sinks: 'events' {}", lines.size())),
              std::string::npos)
        << runner->summary(r);
  }
  ASSERT_EQ(runs[0].size(), lines.size());
  std::map<std::string, Value> by_id[2];
  for (int run = 0; run < 2; ++run) {
    for (const Value& v : runs[run])
      by_id[run][std::string(v.find("id")->as_string())] = v;
  }
  EXPECT_EQ(by_id[0].size(), lines.size()) << "event ids are unique";
  EXPECT_EQ(by_id[0], by_id[1]) << "a second run over the same changes yields the same events and ids";

  // Per entity, events come in source order (the sequence grows), and the types follow the transform.
  std::map<std::string, int64_t> last_seq;
  std::map<std::string, int> types;
  for (const Value& v : runs[0]) {
    const std::string entity(v.find("entity")->as_string());
    const int64_t seq = v.find("source")->find("sequence")->as_int64();
    EXPECT_GT(seq, last_seq.count(entity) ? last_seq[entity] : -1) << v.to_json();
    last_seq[entity] = seq;
    ++types[std::string(v.find("type")->as_string())];
  }
  EXPECT_EQ(types["charge.created"], 50);
  EXPECT_EQ(types["charge.paid"], 50);
  EXPECT_EQ(types["charge.deleted"], 10);
}

// Where one transform subtask feeds one subtask of each sink, the sinks are chained to the transform (one vertex,
// no exchange) and give the same events, in entity order, as at parallelism 2, where the events are keyed by
// entity first; entity-version keeps the key_by at parallelism 1 (its counts are keyed state).
TEST_F(PipelineRunnerTest, AtParallelismOneTheSinksAreChainedToTheTransformAndGiveTheSameEvents) {
  const std::vector<std::string> lines = entity_lifecycles(20, 4);
  write_input(lines);
  struct Case {
    int parallelism;
    std::string extra;
    bool keyed;
  };
  const std::vector<Case> cases = {{1, "", false}, {2, "", true}, {1, "  entity-version: true", true}};
  std::vector<std::map<std::string, Value>> by_id(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(fmt::format("parallelism {}{}", cases[c].parallelism, cases[c].extra));
    std::string yaml = pipeline(cases[c].extra, "", fmt::format("out{}", c));
    yaml.replace(yaml.find("parallelism: 2"), 14, fmt::format("parallelism: {}", cases[c].parallelism));
    auto runner = runner_for(yaml);
    StreamGraph graph = runner->stream_graph();
    Result<JobGraph> job = build_job_graph(graph, false);
    ASSERT_TRUE(job.ok()) << job.error().message();
    const bool keyed = std::any_of(job->edges.begin(), job->edges.end(),
                                   [](const JobEdge& e) { return e.partitioner == PartitionerKind::kKeyGroup; });
    EXPECT_EQ(keyed, cases[c].keyed);
    if (!cases[c].keyed) {
      EXPECT_EQ(job->vertices.size(), 1u) << "source, transform and sink in one chain";
    }
    ASSERT_TRUE(runner->start().ok());
    JobResult r = runner->wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
    const std::vector<Value> events = read_events(dir_ / fmt::format("out{}", c));
    ASSERT_EQ(events.size(), lines.size());
    std::map<std::string, int64_t> last_seq;
    for (const Value& v : events) {
      const std::string entity(v.find("entity")->as_string());
      const int64_t seq = v.find("source")->find("sequence")->as_int64();
      EXPECT_GT(seq, last_seq.count(entity) ? last_seq[entity] : -1) << v.to_json();
      last_seq[entity] = seq;
      by_id[c][std::string(v.find("id")->as_string())] = v;
    }
  }
  EXPECT_EQ(by_id[0], by_id[1]) << "chained at parallelism 1 and keyed at 2: the same events";
  EXPECT_EQ(by_id[0].size(), by_id[2].size());
}

TEST_F(PipelineRunnerTest, BadLinesAndTransformFailuresGoToTheDeadLetterSinkAndTheRestGoesOn) {
  write_input(
      {change("c", "ch_1", "created", 1, 1), "{not json", change("c", "ch_2", "created", 2, 2),
       // the key expression gives NULL: no entity
       R"({"op":"c","key":{"id":"x"},"before":null,"after":{"status":"created"},"source":{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/3","ts_ms":1,"snapshot":false,"sequence":3}})",
       change("c", "ch_4", "created", 4, 4)});
  auto runner = runner_for(pipeline(fmt::format("  dead-letter: {{ type: files, path: \"{}/dlq\" }}", dir_.string())));
  ASSERT_TRUE(runner->start().ok());
  JobResult r = runner->wait();
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(read_events(dir_ / "out").size(), 3u);
  // The transform's dead letters: part files of the dead-letter sink, naming position and reason.
  std::vector<Value> dead = read_events(dir_ / "dlq");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].find("stage")->as_string(), "transform");
  EXPECT_EQ(dead[0].find("reason")->as_string(), "expression");
  EXPECT_EQ(dead[0].find("position")->as_string(), "0/3");
  EXPECT_NE(dead[0].find("error")->as_string().find("NULL"), std::string_view::npos) << dead[0].to_json();
  // The source's dead letters: the line that is not JSON, with file and line number.
  std::ifstream src(dir_ / "dlq" / "source-files.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(src, line));
  Value entry = Value::from_json(line).value_or_throw();
  EXPECT_EQ(entry.find("line")->as_int64(), 2);
  EXPECT_EQ(entry.find("record")->as_string(), "{not json");
  EXPECT_EQ(entry.find("reason")->as_string(), "undecodable");
  const std::string metrics = runner->metrics_text();
  EXPECT_NE(metrics.find("sluice_pipeline_dead_letters_total{job=\"test\"} 1"), std::string::npos);
  // Per reason: the transform's two reasons always, the source's as they occur.
  auto by_reason = [&](const std::string& stage, const std::string& reason) -> std::string {
    const std::regex series("flink_jobmanager_job_deadLetters_numRecordsByReason\\{[^}]*stage=\"" + stage +
                            "\"[^}]*reason=\"" + reason + "\"\\} (\\S+)");
    std::smatch m;
    return std::regex_search(metrics, m, series) ? m[1].str() : "absent";
  };
  EXPECT_EQ(by_reason("transform", "expression"), "1") << metrics;
  EXPECT_EQ(by_reason("transform", "function"), "0") << metrics;
  EXPECT_EQ(by_reason("source", "undecodable"), "1") << metrics;
  EXPECT_EQ(by_reason("source", "line-too-long"), "absent") << metrics;
}

// Issue 14: a size taken from the record (LPAD to 9e18 characters) allocated until bad_alloc and failed the job
// even with a dead-letter sink; a long value made std::regex recurse per character until SIGSEGV.
TEST_F(PipelineRunnerTest, ARecordOverTheSizeLimitIsDeadLetteredAndALongValueIsMatched) {
  auto line = [](const std::string& id, const std::string& width, const std::string& note, int lsn) {
    return fmt::format(
        R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}","width":{1},"note":"{2}"}},)"
        R"("source":{{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/{3:X}",)"
        R"("ts_ms":1790000000000,"snapshot":false,"txn_id":{3},"sequence":{3}}}}})",
        id, width, note, lsn);
  };
  write_input({line("ch_1", "6", "paid", 1), line("ch_2", "9000000000000000000", "paid", 2),
               line("ch_3", "4", std::string(300000, 'a'), 3), line("ch_4", "5", "x", 4)});
  const std::string yaml = fmt::format(R"(pipeline:
  name: test
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
  dead-letter: {{ type: files, path: "{0}/dlq" }}
source:
  type: files
  path: {0}/in
transform:
  - match: "*.*.*"
    key: after.id
    event:
      type: "'charge.seen'"
      payload: "LPAD(after.id, after.width, '0') AS padded, REGEXP(after.note, '(a|b)*c') AS has_c"
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  auto runner = runner_for(yaml);
  ASSERT_TRUE(runner->start().ok());
  JobResult r = runner->wait();
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  std::map<std::string, Value> out;
  for (const Value& v : read_events(dir_ / "out"))
    out[std::string(v.find("entity")->as_string())] = *v.find("payload");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out["ch_1"].find("padded")->as_string(), "00ch_1");
  EXPECT_EQ(out["ch_3"].find("padded")->as_string(), "ch_3");
  EXPECT_EQ(*out["ch_3"].find("has_c"), Value(false));
  EXPECT_EQ(out["ch_4"].find("padded")->as_string(), "0ch_4");
  std::vector<Value> dead = read_events(dir_ / "dlq");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].find("position")->as_string(), "0/2");
  EXPECT_NE(dead[0].find("error")->as_string().find("LPAD: length 9000000000000000000 is over the limit"),
            std::string_view::npos)
      << dead[0].find("error")->as_string();
}

TEST_F(PipelineRunnerTest, WithoutDeadLetterSinkABadChangeFailsTheJobNamingItAndHealthTurnsUnhealthy) {
  write_input(
      {change("c", "ch_1", "created", 1, 1),
       R"({"op":"c","key":{"id":"x"},"before":null,"after":{"status":"created"},"source":{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/2A","ts_ms":1,"snapshot":false,"sequence":42}})"});
  auto runner = runner_for(pipeline("  restart: { strategy: none }"));
  auto http = MetricsServer::start(
      "127.0.0.1", 0, [&] { return runner->metrics_text(); },
      [&] {
        HealthReport h = runner->health();
        return HealthResponse{h.healthy, h.to_json()};
      });
  ASSERT_TRUE(http.ok()) << http.error().message();
  ASSERT_TRUE(runner->start().ok());
  JobResult r = runner->wait();
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("public.charges at position 0/2A (sequence 42)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("entity id is NULL"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dead-letter"), std::string::npos) << msg;

  // /health answers 503 once the job failed (the bound of the issue is 5 s; it is immediate).
  httplib::Client client("127.0.0.1", (*http)->port());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int status = 0;
  std::string body;
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = client.Get("/health");
    ASSERT_TRUE(res) << "no answer from /health";
    status = res->status;
    body = res->body;
    if (status == 503) break;
  }
  EXPECT_EQ(status, 503) << body;
  EXPECT_NE(body.find("\"status\":\"FAILED\""), std::string::npos) << body;
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("sluice_job_running{job=\"test\",status=\"FAILED\"} 0"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("# TYPE sluice_operator_records_in_total counter"), std::string::npos);
}

// A job in a restart loop (here under the default restart strategy, which never gives up) is RESTARTING on
// /health (503, with the restart count and the failure's cause), on /metrics and in the logs within 5 s of
// the failure, never RUNNING (issue 14, "no silent failure").
TEST_F(PipelineRunnerTest, ARestartLoopIsUnhealthyRestartingOnHealthMetricsAndLogsWithin5Seconds) {
  write_input(
      {R"({"op":"c","key":{"id":"x"},"before":null,"after":{"status":"created"},"source":{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/2A","ts_ms":1,"snapshot":false,"sequence":42}})"});
  // Sluice installs its logger on first use: install it now, so the sink is added to the logger the job uses
  // (alone in a process, as ctest runs it, the runner would replace the default logger after the sink was added).
  init_logging();
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  spdlog::default_logger()->sinks().push_back(log);
  struct RemoveSink {
    std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink;
    ~RemoveSink() {
      auto& sinks = spdlog::default_logger()->sinks();
      sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
    }
  } remove_sink{log};
  auto runner = runner_for(pipeline());  // the default restart strategy
  auto http = MetricsServer::start(
      "127.0.0.1", 0, [&] { return runner->metrics_text(); },
      [&] {
        HealthReport h = runner->health();
        return HealthResponse{h.healthy, h.to_json()};
      });
  ASSERT_TRUE(http.ok()) << http.error().message();
  ASSERT_TRUE(runner->start().ok());
  const auto start = std::chrono::steady_clock::now();
  // The first record fails the job at once, so the failure is within a few ms of the start.
  const auto deadline = start + std::chrono::seconds(5);
  httplib::Client client("127.0.0.1", (*http)->port());
  int status = 0;
  std::string body;
  std::string metrics;
  bool logged = false;
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = client.Get("/health");
    ASSERT_TRUE(res) << "no answer from /health";
    status = res->status;
    body = res->body;
    auto m = client.Get("/metrics");
    ASSERT_TRUE(m);
    metrics = m->body;
    for (const std::string& line : log->last_formatted()) {
      logged = logged ||
               (line.find("RESTARTING") != std::string::npos && line.find("entity id is NULL") != std::string::npos);
    }
    if (status == 503 && body.find("RESTARTING") != std::string::npos &&
        metrics.find("sluice_job_restarting{job=\"test\"} 1") != std::string::npos && logged) {
      break;
    }
  }
  EXPECT_EQ(status, 503) << body;
  EXPECT_NE(body.find("\"status\":\"RESTARTING\""), std::string::npos) << body;
  EXPECT_NE(body.find("the job is RESTARTING (restart "), std::string::npos) << body;
  EXPECT_NE(body.find("entity id is NULL"), std::string::npos) << body;
  EXPECT_NE(metrics.find("sluice_job_running{job=\"test\",status=\"RESTARTING\"} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("sluice_job_restarting{job=\"test\"} 1"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("sluice_job_last_failure_timestamp_ms{job=\"test\"} -1"), std::string::npos) << metrics;
  EXPECT_TRUE(logged) << "no RESTARTING line with the cause in the log";
  EXPECT_EQ(runner->status(), JobStatus::kRestarting);
  runner->cancel();
  JobResult r = runner->wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled);
  // Nothing was delivered: the summary does not call anything "out" or "delivered".
  const std::string summary = runner->summary(r);
  EXPECT_EQ(summary.find(" out "), std::string::npos) << summary;
  EXPECT_EQ(summary.find("delivered by the sinks"), std::string::npos) << summary;
  EXPECT_NE(summary.find("received by the sinks (not all delivered: the job is CANCELED"), std::string::npos)
      << summary;
}

// A restart loop whose attempts run for a while before failing again (a trial: TRUNCATE with `truncate: fail`,
// ~20 s of WAL re-decoding per attempt) was RUNNING and /health 200 between attempts (17 of 40 samples). A job
// that failed less than health.restart-grace ago is unhealthy, with the restart count and the cause, also while
// an attempt runs. Here each attempt runs about a second (charge 0 turns 'paid' at record 1000, at 1000 records a
// second, and its NULL entity id fails the job) and restarts from the start (no checkpoint completes before).
TEST_F(PipelineRunnerTest, ARestartLoopStaysUnhealthyWhileAnAttemptRunsBetweenFailures) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: loop
  checkpoint: {{ interval: 60s, storage: "{0}/checkpoints" }}
  restart: {{ strategy: fixed-delay, attempts: 1000, delay: 100ms }}
source: {{ type: datagen, count: 0, rate: 1000, entities: 1000 }}
transform:
  - match: "**"
    key: "CASE WHEN after.status = 'paid' THEN NULL ELSE after.id END"
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  auto runner = runner_for(yaml);
  ASSERT_TRUE(runner->start().ok());
  // Until the first failure the job is healthy (nothing failed yet).
  ASSERT_TRUE(sluice::testing::poll_until([&] { return runner->health().restarts > 0; }, std::chrono::seconds(30),
                                          std::chrono::milliseconds(10)))
      << "the job never failed";
  // Then sample for 4 s (several attempts): never healthy; RUNNING samples carry the grace reason and the cause.
  int samples = 0, running = 0, healthy = 0;
  std::string running_reason, healthy_json;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (std::chrono::steady_clock::now() < until) {
    HealthReport h = runner->health();
    ++samples;
    if (h.healthy) {
      ++healthy;
      healthy_json = h.to_json();
    }
    if (h.status == "RUNNING") {
      ++running;
      running_reason = h.reason;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sampling pace over a fixed 4 s, not a wait
  }
  std::printf("%d samples: %d RUNNING, %d healthy\n", samples, running, healthy);
  EXPECT_GT(running, 0) << "no sample saw an attempt running: the test cannot tell";
  EXPECT_EQ(healthy, 0) << healthy_json;
  EXPECT_NE(running_reason.find("counts as healthy only after 60000 ms without a failure (health.restart-grace)"),
            std::string::npos)
      << running_reason;
  EXPECT_NE(running_reason.find("entity id is NULL"), std::string::npos) << running_reason;
  EXPECT_NE(running_reason.find("(restart "), std::string::npos) << running_reason;
  runner->cancel();
  EXPECT_EQ(runner->wait().status, JobStatus::kCanceled);
}

TEST_F(PipelineRunnerTest, ExactlyOnceWithCheckpointingDisabledByAnOverrideIsRefusedNamingTheKey) {
  Result<PipelineSpec> spec = parse_pipeline(pipeline("  delivery: exactly-once"), "test.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Configuration overrides;
  overrides.set_string("execution.checkpointing.interval", "0");
  Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*spec, overrides);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(r.error().message().find("'pipeline.delivery: exactly-once' needs checkpoints, but "
                                     "execution.checkpointing.interval is 0"),
            std::string::npos)
      << r.error().message();
}

TEST_F(PipelineRunnerTest, ARunningPipelineIsHealthyAndARestartResumesFromItsLatestCheckpoint) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: endless
  checkpoint: {{ interval: 50ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  auto wait_for = [](auto cond) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!cond()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  };
  {
    auto runner = runner_for(yaml);
    ASSERT_TRUE(runner->start().ok());
    EXPECT_TRUE(runner->restored_from().empty());
    ASSERT_TRUE(wait_for([&] { return !find_latest_checkpoint(dir_.string() + "/checkpoints").empty(); }));
    HealthReport h = runner->health();
    EXPECT_TRUE(h.healthy) << h.to_json();
    EXPECT_EQ(h.status, "RUNNING");
    const std::string metrics = runner->metrics_text();
    EXPECT_NE(metrics.find("uid=\"transform\""), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("sluice_checkpoint_age_ms{job=\"endless\"}"), std::string::npos) << metrics;
    runner->cancel();
    EXPECT_EQ(runner->wait().status, JobStatus::kCanceled);
  }
  const std::string latest = find_latest_checkpoint(dir_.string() + "/checkpoints");
  ASSERT_FALSE(latest.empty());
  auto again = runner_for(yaml);
  ASSERT_TRUE(again->start().ok());
  EXPECT_EQ(again->restored_from(), latest);
  again->cancel();
  EXPECT_EQ(again->wait().status, JobStatus::kCanceled);
}

// `sluice stop` ends the job FINISHED with a savepoint: a pause, not the end. A plain next run resumes from that
// savepoint (before, it started over: a CDC source took a new snapshot and every row came out again), and a run
// whose savepoint is gone fails naming it instead of starting over.
TEST_F(PipelineRunnerTest, AStoppedPipelineResumesFromItsSavepointAndAMissingOneFailsLoudly) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: paused
  checkpoint: {{ interval: 50ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  const fs::path savepoints = dir_ / "savepoints";
  std::string savepoint;
  {
    auto runner = runner_for(yaml);
    ASSERT_TRUE(runner->start().ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (find_latest_checkpoint(dir_.string() + "/checkpoints").empty()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no checkpoint completed";
      std::this_thread::yield();
    }
    std::optional<JobClient> client = runner->client();
    ASSERT_TRUE(client.has_value());
    auto stopped = client->stop_with_savepoint(savepoints.string());
    ASSERT_EQ(stopped.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    Result<std::string> path = stopped.get();
    ASSERT_TRUE(path.ok()) << path.error().message();
    savepoint = *path;
    ASSERT_EQ(runner->wait().status, JobStatus::kFinished);
  }
  EXPECT_EQ(find_latest_checkpoint(dir_.string() + "/checkpoints"), savepoint);
  {
    auto again = runner_for(yaml);
    ASSERT_TRUE(again->start().ok());
    EXPECT_EQ(again->restored_from(), savepoint);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (find_latest_checkpoint(dir_.string() + "/checkpoints") == savepoint) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the resumed run completed no checkpoint";
      std::this_thread::yield();
    }
    again->cancel();
    EXPECT_EQ(again->wait().status, JobStatus::kCanceled);
  }
  // The canceled run left checkpoints of its own, newer than the stop: the next run resumes from those.
  const std::string latest = find_latest_checkpoint(dir_.string() + "/checkpoints");
  EXPECT_NE(latest, savepoint);
  EXPECT_TRUE(fs::exists(fs::path(latest) / "_metadata")) << latest;

  // A stop whose savepoint was deleted: refused, naming it.
  fs::remove_all(dir_ / "checkpoints");
  {
    auto runner = runner_for(yaml);
    ASSERT_TRUE(runner->start().ok());
    std::optional<JobClient> client = runner->client();
    ASSERT_TRUE(client.has_value());
    auto stopped = client->stop_with_savepoint(savepoints.string());
    ASSERT_EQ(stopped.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    Result<std::string> path = stopped.get();
    ASSERT_TRUE(path.ok()) << path.error().message();
    savepoint = *path;
    ASSERT_EQ(runner->wait().status, JobStatus::kFinished);
  }
  fs::remove_all(savepoint);
  auto refused = runner_for(yaml);
  Status st = refused->start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("was stopped with a savepoint at " + savepoint + " (sluice stop), which is gone"),
            std::string::npos)
      << st.error().message();
}

// A savepoint of the chained graph (parallelism 1) restores at parallelism 2, where the events are keyed before
// the sinks again (operators match by uid), and back: every event of the earlier runs is committed exactly once.
TEST_F(PipelineRunnerTest, ASavepointOfTheChainedPipelineRestoresKeyedAtParallelismTwoAndBack) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: rechained
  parallelism: 1
  delivery: exactly-once
  checkpoint: {{ interval: 50ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{0}/out", rolling-policy: {{ rollover-interval: 100ms, inactivity-interval: 100ms }} }}
)",
                                       dir_.string());
  Result<PipelineSpec> spec = parse_pipeline(yaml, "rechained.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  std::string savepoint;
  int64_t delivered_before_last = 0;
  const std::vector<int> runs = {1, 2, 1};
  for (size_t run = 0; run < runs.size(); ++run) {
    const int parallelism = runs[run];
    SCOPED_TRACE(fmt::format("run {} at parallelism {}", run + 1, parallelism));
    Configuration overrides;
    overrides.set(options::kParallelism, parallelism);
    Result<std::unique_ptr<PipelineRunner>> created = PipelineRunner::create(*spec, overrides);
    ASSERT_TRUE(created.ok()) << created.error().message();
    PipelineRunner& runner = **created;
    StreamGraph graph = runner.stream_graph();
    Result<JobGraph> job = build_job_graph(graph, false);
    ASSERT_TRUE(job.ok()) << job.error().message();
    EXPECT_EQ(job->vertices.size(), parallelism == 1 ? 1u : 2u);
    ASSERT_TRUE(runner.start().ok());
    if (!savepoint.empty()) {
      EXPECT_EQ(runner.restored_from(), savepoint);
    }
    // Eight checkpoints of this run (about 400 ms): a part file is committed by the first checkpoint after the
    // rolling policy (100 ms) finished it, so the restored in-progress files of the run before are committed by then.
    std::string seen = find_latest_checkpoint(dir_.string() + "/checkpoints");
    int completed = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (completed < 8) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no eight checkpoints completed";
      const std::string latest = find_latest_checkpoint(dir_.string() + "/checkpoints");
      if (latest != seen) {
        seen = latest;
        ++completed;
      }
      std::this_thread::yield();
    }
    std::optional<JobClient> client = runner.client();
    ASSERT_TRUE(client.has_value());
    auto stopped = client->stop_with_savepoint((dir_ / "savepoints").string());
    ASSERT_EQ(stopped.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    Result<std::string> path = stopped.get();
    ASSERT_TRUE(path.ok()) << path.error().message();
    savepoint = *path;
    const JobResult r = runner.wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
    if (run + 1 < runs.size()) {
      // What the runs before the last one generated: datagen positions 0 .. (the last run's offset - 1).
      const std::string summary = runner.summary(r);
      static const std::regex delivered(R"(delivered by the sinks: 'events' (\d+))");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(summary, m, delivered)) << summary;
      delivered_before_last += std::stoll(m[1]);
    }
  }
  std::map<int64_t, int> positions;
  for (const Value& v : read_events(dir_ / "out"))
    ++positions[std::stoll(std::string(v.find("source")->find("position")->as_string()))];
  int64_t duplicated = 0;
  for (const auto& [position, n] : positions)
    duplicated += n - 1;
  EXPECT_EQ(duplicated, 0);
  ASSERT_GT(delivered_before_last, 0);
  int64_t missing = 0;
  for (int64_t i = 0; i < delivered_before_last; ++i)
    missing += positions.count(i) == 0 ? 1 : 0;
  EXPECT_EQ(missing, 0) << "of the first " << delivered_before_last << " events";
}

TEST_F(PipelineRunnerTest, AFinishedPipelineIsNotResumedByTheNextRun) {
  write_input({change("c", "ch_1", "created", 1, 1)});
  auto runner = runner_for(pipeline());
  ASSERT_TRUE(runner->start().ok());
  ASSERT_EQ(runner->wait().status, JobStatus::kFinished);
  EXPECT_EQ(find_latest_checkpoint(dir_.string() + "/checkpoints"), "");
  // While a runner lives it holds the storage's lock: a second run of the same pipeline is refused.
  auto concurrent = runner_for(pipeline());
  Status refused = concurrent->start();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("another `sluice run` uses the checkpoint storage"), std::string::npos)
      << refused.error().message();
  concurrent.reset();
  runner.reset();
  auto again = runner_for(pipeline());
  ASSERT_TRUE(again->start().ok());
  EXPECT_EQ(again->restored_from(), "");
  ASSERT_EQ(again->wait().status, JobStatus::kFinished);
}

TEST_F(PipelineRunnerTest, ALaterRunRemovesTheCheckpointsItSupersedesOnceItHasItsOwn) {
  const fs::path storage = dir_ / "checkpoints";
  auto yaml = [&](const std::string& interval) {
    return fmt::format(R"(pipeline:
  name: endless
  checkpoint: {{ interval: {1}, storage: "{0}" }}
source: {{ type: datagen, count: 0, rate: 2000, entities: 100 }}
sink:
  events: {{ type: files, path: "{2}/out" }}
)",
                       storage.string(), interval, dir_.string());
  };
  auto wait_for = [](auto cond) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!cond()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls the runner's own job, no other process
    }
    return true;
  };
  auto job_dirs = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(storage))
      names.insert(e.path().filename().string());
    return names;
  };
  auto job_of = [](const std::string& checkpoint) { return fs::path(checkpoint).parent_path().filename().string(); };
  // What must stay: a savepoint and a user's directory in the storage, neither named like a job.
  fs::create_directories(storage / "savepoint-0123ab-456789abcdef");
  std::ofstream(storage / "savepoint-0123ab-456789abcdef" / "_metadata") << "x";
  fs::create_directories(storage / "backups");
  // An earlier run's finished job (never resumed).
  const std::string finished_job = "00000000000000000000000000000abc";
  fs::create_directories(storage / finished_job / "chk-3");
  std::ofstream(storage / finished_job / "_finished");

  // Run 1 completes checkpoints; the finished job's directory is superseded by them.
  std::string job1;
  {
    auto runner = runner_for(yaml("50ms"));
    ASSERT_TRUE(runner->start().ok());
    ASSERT_TRUE(wait_for([&] { return runner->remove_superseded_checkpoints() > 0; }));
    EXPECT_EQ(runner->remove_superseded_checkpoints(), 0);  // once per run
    job1 = job_of(find_latest_checkpoint(storage.string()));
    runner->cancel();
    EXPECT_EQ(runner->wait().status, JobStatus::kCanceled);
  }
  EXPECT_EQ(job_dirs(), (std::set<std::string>{".lock", "backups", "savepoint-0123ab-456789abcdef", job1}));

  // Run 2 completes no checkpoint (a long interval): it supersedes nothing, so run 1's stays to resume from.
  {
    auto runner = runner_for(yaml("1h"));
    ASSERT_TRUE(runner->start().ok());
    EXPECT_EQ(job_of(runner->restored_from()), job1);
    EXPECT_EQ(runner->remove_superseded_checkpoints(), 0);
    runner->cancel();
    runner->wait();
    EXPECT_EQ(runner->remove_superseded_checkpoints(), 0);
  }
  EXPECT_TRUE(job_dirs().contains(job1));

  // Run 3 resumes from run 1's checkpoint; after its own first checkpoint runs 1 and 2 are gone.
  std::string job3;
  {
    auto runner = runner_for(yaml("50ms"));
    ASSERT_TRUE(runner->start().ok());
    EXPECT_EQ(job_of(runner->restored_from()), job1);
    ASSERT_TRUE(wait_for([&] { return runner->remove_superseded_checkpoints() > 0; }));
    job3 = job_of(find_latest_checkpoint(storage.string()));
    runner->cancel();
    runner->wait();
  }
  EXPECT_NE(job3, job1);
  EXPECT_EQ(job_dirs(), (std::set<std::string>{".lock", "backups", "savepoint-0123ab-456789abcdef", job3}));

  // A checkpoint chosen with execution.state-recovery.path is the user's: its job directory stays.
  const std::string chosen = find_latest_checkpoint(storage.string());
  const std::string other_job = "00000000000000000000000000000def";
  fs::create_directories(storage / other_job / "chk-1");
  {
    Result<PipelineSpec> spec = parse_pipeline(yaml("50ms"), "test.yaml");
    ASSERT_TRUE(spec.ok());
    Configuration overrides;
    overrides.set_string("execution.state-recovery.path", chosen);
    Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec, overrides);
    ASSERT_TRUE(runner.ok());
    ASSERT_TRUE((*runner)->start().ok());
    ASSERT_TRUE(wait_for([&] { return (*runner)->remove_superseded_checkpoints() > 0; }));
    (*runner)->cancel();
    (*runner)->wait();
  }
  EXPECT_TRUE(job_dirs().contains(job3));
  EXPECT_FALSE(job_dirs().contains(other_job));
}

TEST_F(PipelineRunnerTest, TheFilesSinksRollingPolicyRollsIndependentlyOfCheckpoints) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: rolling
  checkpoint: {{ interval: 20ms, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 3000, rate: 3000, entities: 10 }}
sink:
  events:
    type: files
    path: "{0}/out"
    rolling-policy: {{ part-size: 1gb, rollover-interval: 1h, inactivity-interval: 1h }}
)",
                                       dir_.string());
  auto runner = runner_for(yaml);
  ASSERT_TRUE(runner->start().ok());
  const JobResult r = runner->wait();
  ASSERT_EQ(r.status, JobStatus::kFinished);
  // About 50 checkpoints, one file: nothing rolled before the end of the input.
  std::vector<std::string> names;
  for (const auto& f : fs::directory_iterator(dir_ / "out"))
    names.push_back(f.path().filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"part-0-0.jsonl"}));
  EXPECT_EQ(read_events(dir_ / "out").size(), 3000U);
}

// `throttle` slows a files or print sink by its duration per record and subtask (the web UI's backpressure test
// uses it); the dead-letter sink refuses it.
TEST_F(PipelineRunnerTest, AThrottledSinkWaitsPerRecordAndTheDeadLetterSinkRefusesThrottle) {
  const std::string yaml = fmt::format(R"(pipeline:
  name: throttled
  checkpoint: {{ interval: 1s, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 100, entities: 10 }}
sink:
  events: {{ type: files, path: "{0}/out", throttle: 10ms }}
)",
                                       dir_.string());
  auto runner = runner_for(yaml);
  const auto start = std::chrono::steady_clock::now();
  const Status started = runner->start();
  ASSERT_TRUE(started.ok()) << started.error().to_string();
  const JobResult r = runner->wait();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.status, JobStatus::kFinished);
  EXPECT_EQ(read_events(dir_ / "out").size(), 100U);
  EXPECT_GE(took, std::chrono::milliseconds(1000)) << "100 records at 10 ms each";

  Result<PipelineSpec> spec = parse_pipeline(fmt::format(R"(pipeline:
  name: throttled-dead-letters
  checkpoint: {{ interval: 1s, storage: "{0}/checkpoints2" }}
  dead-letter: {{ type: files, path: "{0}/dlq", throttle: 10ms }}
source: {{ type: datagen, count: 10 }}
sink:
  events: {{ type: files, path: "{0}/out2" }}
)",
                                                         dir_.string()),
                                             "test.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> refused = PipelineRunner::create(*spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("throttle applies to the pipeline's sinks, not to the dead-letter sink"),
            std::string::npos)
      << refused.error().message();
}

// A dead-letter path on an object store is refused: the connectors' dead-letter files are local, and "s3://b/dlq"
// would have become a local folder named "s3:".
TEST_F(PipelineRunnerTest, ADeadLetterPathOnAnObjectStoreIsRefused) {
  Result<PipelineSpec> spec = parse_pipeline(fmt::format(R"(pipeline:
  name: s3-dead-letters
  checkpoint: {{ interval: 1s, storage: "{0}/checkpoints" }}
  dead-letter: {{ type: files, path: "s3://bucket/dlq" }}
source: {{ type: datagen, count: 10 }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                                         dir_.string()),
                                             "test.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> refused = PipelineRunner::create(*spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(refused.error().message().find("'s3://bucket/dlq' must be a local directory"), std::string::npos)
      << refused.error().message();
}

TEST_F(PipelineRunnerTest, ABadRollingPolicyNamesTheKey) {
  for (const auto& [policy, expected] : std::vector<std::pair<std::string, std::string>>{
           {"{ part-size: 0 }", "part-size '0' is not a size"},
           {"{ rollover-interval: soon }", "rollover-interval 'soon' is not a duration"},
           {"{ max-size: 1mb }", "unknown key 'max-size'"}}) {
    const std::string yaml = fmt::format(R"(pipeline:
  name: rolling
  checkpoint: {{ interval: 1s, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 10 }}
sink:
  events: {{ type: files, path: "{0}/out", rolling-policy: {1} }}
)",
                                         dir_.string(), policy);
    Result<PipelineSpec> spec = parse_pipeline(yaml, "test.yaml");
    ASSERT_TRUE(spec.ok()) << spec.error().message();
    Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*spec);
    ASSERT_FALSE(r.ok()) << policy;
    EXPECT_NE(r.error().message().find(expected), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("rolling-policy"), std::string::npos) << r.error().message();
  }
}

TEST_F(PipelineRunnerTest, MissingInputsAndConnectionSettingsNameTheFileLocation) {
  Result<PipelineSpec> missing =
      parse_pipeline("source: { type: files, path: /nonexistent }\nsink: { p: { type: print } }\n", "m.yaml");
  ASSERT_TRUE(missing.ok()) << missing.error().message();
  Result<std::unique_ptr<PipelineRunner>> no_input = PipelineRunner::create(*missing);
  ASSERT_FALSE(no_input.ok());
  EXPECT_NE(no_input.error().message().find("m.yaml:1:30: file source: cannot read '/nonexistent'"), std::string::npos)
      << no_input.error().message();

  write_input({change("c", "ch_1", "created", 1, 1)});
  Result<PipelineSpec> spec = parse_pipeline(fmt::format(R"(source: {{ type: files, path: {} }}
sink:
  k: {{ type: kafka, bootstrap-servers: "${{SLUICE_TEST_SURELY_UNSET_VARIABLE}}", topic: t }}
)",
                                                         (dir_ / "in").string()),
                                             "p.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("p.yaml:3:"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("SLUICE_TEST_SURELY_UNSET_VARIABLE is not set"), std::string::npos)
      << r.error().message();
}

// `${VAR}` in a dead-letter Kafka sink's properties is expanded as in the main Kafka sink's (it was passed to the
// broker literally: a SASL password read "${KAFKA_PASSWORD}"). librdkafka rejects a literal "${...}" for
// linger.ms, so the set variable only validates when expanded; the unset one must fail naming itself.
TEST_F(PipelineRunnerTest, DeadLetterKafkaSinkPropertiesExpandEnvironmentVariables) {
  write_input({change("c", "ch_1", "created", 1, 1)});
  auto yaml = [&](const std::string& variable) {
    return fmt::format(R"(pipeline:
  dead-letter:
    type: kafka
    bootstrap-servers: "127.0.0.1:9"
    topic: dlq
    properties: {{ linger.ms: "${{{1}}}" }}
source: {{ type: files, path: {0} }}
sink:
  p: {{ type: print }}
)",
                       (dir_ / "in").string(), variable);
  };
  ASSERT_EQ(::setenv("SLUICE_TEST_DLQ_LINGER_MS", "7", 1), 0);
  Result<PipelineSpec> set = parse_pipeline(yaml("SLUICE_TEST_DLQ_LINGER_MS"), "dlq.yaml");
  ASSERT_TRUE(set.ok()) << set.error().message();
  Result<std::unique_ptr<PipelineRunner>> ok = PipelineRunner::create(*set);
  EXPECT_TRUE(ok.ok()) << ok.error().message();
  ::unsetenv("SLUICE_TEST_DLQ_LINGER_MS");

  Result<PipelineSpec> unset = parse_pipeline(yaml("SLUICE_TEST_SURELY_UNSET_DLQ_PASSWORD"), "dlq.yaml");
  ASSERT_TRUE(unset.ok()) << unset.error().message();
  Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*unset);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("dlq.yaml:"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("SLUICE_TEST_SURELY_UNSET_DLQ_PASSWORD is not set"), std::string::npos)
      << r.error().message();
}

}  // namespace
}  // namespace sluice::pipeline
