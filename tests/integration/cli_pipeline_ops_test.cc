// One operations surface for `sluice run`, end to end with the built binary: a pipeline (datagen -> files, no
// service needed) serves the jobs REST API, /metrics and /health on one port; `sluice list`, `savepoint`,
// `stop` and `cancel` work against it; `-p` overrides the file's parallelism; a stopped job stays listed as
// FINISHED while the process lingers.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>

#include "integration/test_util/child_process.h"
#include "sluice/core/value.h"

#ifndef SLUICE_BINARY
#error "SLUICE_BINARY must name the built sluice executable"
#endif

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::Ran;
constexpr auto kDeadline = std::chrono::seconds(60);

struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("sluice-ops-test-" + name + "-" + std::to_string(::getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path path;
};

Ran sluice(std::vector<std::string> args) {
  return testing::run_to_end(SLUICE_BINARY, std::move(args));
}

/// An endless pipeline (datagen at 300 records/s) with checkpoints under `dir`, parallelism 1 in the file.
fs::path write_pipeline(const fs::path& dir) {
  const fs::path file = dir / "p.yaml";
  std::ofstream(file) << "pipeline:\n"
                         "  name: ops-test\n"
                         "  parallelism: 1\n"
                         "  checkpoint:\n"
                         "    interval: 200ms\n"
                         "    storage: \""
                      << (dir / "checkpoints").string()
                      << "\"\n"
                         "  delivery: exactly-once\n"
                         "source:\n"
                         "  type: datagen\n"
                         "  count: 0\n"
                         "  rate: 300\n"
                         "transform:\n"
                         "  - match: \"*.public.charges\"\n"
                         "    key: after.id\n"
                         "    event:\n"
                         "      type: \"'charge'\"\n"
                         "      payload: \"after.id, after.amount_cents\"\n"
                         "sink:\n"
                         "  out:\n"
                         "    type: files\n"
                         "    path: \""
                      << (dir / "out").string() << "\"\n";
  return file;
}

struct Served {
  std::string host_port;
  std::string job_id;
};
/// The line `sluice run` logs once the job runs: "REST API, /metrics and /health at http://H:P, job id ID".
Served await_served(const ChildProcess& p) {
  static const std::regex line(R"(REST API, /metrics and /health at http://([0-9.]+:[0-9]+), job id ([0-9a-f]+))");
  std::smatch m;
  std::string err;
  const bool found = testing::poll_until(
      [&] {
        err = p.err();
        return std::regex_search(err, m, line);
      },
      kDeadline);
  EXPECT_TRUE(found) << "no REST line on stderr:\n" << err;
  return found ? Served{m[1], m[2]} : Served{};
}

struct Got {
  int status = -1;
  std::string body;
};
Got get(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  httplib::Client c(host_port.substr(0, colon), std::stoi(host_port.substr(colon + 1)));
  c.set_read_timeout(10, 0);
  auto r = c.Get(path);
  return r ? Got{r->status, r->body} : Got{};
}

std::string savepoint_path(const std::string& out) {
  static const std::regex line(R"(Savepoint completed\. Path: (\S+))");
  std::smatch m;
  return std::regex_search(out, m, line) ? std::string(m[1]) : std::string();
}

TEST(CliPipelineOpsTest, OnePortServesTheJobsApiMetricsAndHealthAndTheClientCommandsWork) {
  const TempDir tmp("one-port");
  const fs::path file = write_pipeline(tmp.path);
  ChildProcess job(SLUICE_BINARY, {"run", file.string(), "--http-port", "0", "-p", "2", "--linger", "60s"});
  const Served s = await_served(job);
  ASSERT_FALSE(s.job_id.empty());

  // The jobs API, /metrics and /health on the one port.
  Ran list = sluice({"list", "-m", s.host_port});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find(s.job_id + " : ops-test (RUNNING)"), std::string::npos) << list.out;
  ASSERT_TRUE(testing::poll_until([&] { return get(s.host_port, "/health").status == 200; }, kDeadline))
      << get(s.host_port, "/health").body;
  const Got metrics = get(s.host_port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("sluice_job_running{job=\"ops-test\",status=\"RUNNING\"} 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("sluice_pipeline_changes_total{job=\"ops-test\"}"), std::string::npos);

  // -p 2 overrides the file's parallelism 1: the sink runs 2 subtasks.
  const Got details = get(s.host_port, "/jobs/" + s.job_id);
  ASSERT_EQ(details.status, 200);
  Result<Value> v = Value::from_json(details.body);
  ASSERT_TRUE(v.ok()) << details.body;
  bool sink_seen = false;
  for (const Value& vertex : v->find("vertices")->as_array()) {  // job vertices, each with its chain's operators
    for (const Value& op : vertex.find("operators")->as_array()) {
      if (op.find("uid")->as_string() != "sink-out") continue;
      sink_seen = true;
      EXPECT_EQ(vertex.find("parallelism")->as_int64(), 2) << details.body;
    }
  }
  EXPECT_TRUE(sink_seen) << details.body;

  // A savepoint into the default directory (<checkpoint storage>/savepoints), then a stop with a savepoint.
  Ran savepoint = sluice({"savepoint", "-m", s.host_port, s.job_id});
  ASSERT_EQ(savepoint.code, 0) << savepoint.out << savepoint.err;
  const std::string sp = savepoint_path(savepoint.out);
  EXPECT_TRUE(fs::exists(fs::path(sp) / "_metadata")) << savepoint.out;
  EXPECT_EQ(fs::path(sp).parent_path(), tmp.path / "checkpoints" / "savepoints") << sp;
  Ran stop = sluice({"stop", "-m", s.host_port, "--savepoint-dir", (tmp.path / "final").string(), s.job_id});
  ASSERT_EQ(stop.code, 0) << stop.out << stop.err;
  EXPECT_TRUE(fs::exists(fs::path(savepoint_path(stop.out)) / "_metadata")) << stop.out;

  // The job ended; the process lingers and still lists it with its final state.
  ASSERT_TRUE(testing::poll_until(
      [&] { return get(s.host_port, "/jobs/" + s.job_id).body.find("\"state\":\"FINISHED\"") != std::string::npos; },
      kDeadline))
      << job.err();
  ASSERT_TRUE(testing::poll_until([&] { return job.out().find("pipeline 'ops-test' FINISHED") != std::string::npos; },
                                  kDeadline))
      << job.out();  // the summary, printed (and flushed) before the linger
  EXPECT_TRUE(job.running());
  Ran ended = sluice({"list", "-m", s.host_port});
  ASSERT_EQ(ended.code, 0) << ended.err;
  EXPECT_NE(ended.out.find("Terminated Jobs"), std::string::npos) << ended.out;
  EXPECT_NE(ended.out.find(s.job_id + " : ops-test (FINISHED)"), std::string::npos) << ended.out;
  const Got health = get(s.host_port, "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("FINISHED"), std::string::npos) << health.body;
  EXPECT_NE(get(s.host_port, "/metrics").body.find("status=\"FINISHED\"} 0"), std::string::npos);
  job.signal(SIGTERM);  // ends the linger
  EXPECT_EQ(job.wait(), 0) << job.err();
}

TEST(CliPipelineOpsTest, CancelEndsARunningPipelineAndTheNextRunResumesFromTheStop) {
  const TempDir tmp("cancel");
  const fs::path file = write_pipeline(tmp.path);
  // --rest-port is the same one port as --http-port.
  ChildProcess first(SLUICE_BINARY, {"run", file.string(), "--rest-port", "0"});
  const Served a = await_served(first);
  ASSERT_FALSE(a.job_id.empty());
  Ran stop = sluice({"stop", "-m", a.host_port, a.job_id});
  ASSERT_EQ(stop.code, 0) << stop.out << stop.err;
  const std::string sp = savepoint_path(stop.out);
  EXPECT_EQ(first.wait(), 0) << first.err();

  ChildProcess second(SLUICE_BINARY, {"run", file.string(), "--http-port", "0"});
  const Served b = await_served(second);
  ASSERT_FALSE(b.job_id.empty());
  EXPECT_NE(second.err().find("resuming from checkpoint " + sp), std::string::npos) << second.err();
  Ran cancel = sluice({"cancel", "-m", b.host_port, b.job_id});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_NE(cancel.out.find("Cancelled job " + b.job_id), std::string::npos) << cancel.out;
  EXPECT_EQ(second.wait(), 1);  // cancelled through the API, not by a signal: not a success
  EXPECT_NE(second.err().find("CANCELED"), std::string::npos) << second.err();

  Ran unknown = sluice({"cancel", "-m", b.host_port, "0123456789abcdef"});
  EXPECT_EQ(unknown.code, 1);  // the process has exited: nothing listens any more
}

/// A pipeline with `filter` on the charges: `source` is the source mapping's body, `health` the health keys.
fs::path write_filter_pipeline(const fs::path& dir, const std::string& source, const std::string& filter,
                               const std::string& health) {
  const fs::path file = dir / "f.yaml";
  std::ofstream(file) << "pipeline:\n  name: filter-test\n  parallelism: 1\n  checkpoint:\n    interval: 1s\n"
                      << "    storage: \"" << (dir / "checkpoints").string() << "\"\n"
                      << (health.empty() ? "" : "  health:\n") << health << "source:\n"
                      << source
                      << "transform:\n"
                         "  - match: \"*.public.charges\"\n"
                         "    key: after.id\n"
                         "    filter: \""
                      << filter
                      << "\"\n"
                         "sink:\n  out:\n    type: files\n    path: \""
                      << (dir / "out").string() << "\"\n";
  return file;
}

Got await_health_containing(const std::string& host_port, const std::string& what) {
  Got h;
  testing::poll_until(
      [&] {
        h = get(host_port, "/health");
        return h.body.find(what) != std::string::npos;
      },
      kDeadline);
  return h;
}

TEST(CliPipelineOpsTest, AFilterReadingAFieldNoRecordHasIsReportedInTheLogAndInHealth) {
  const TempDir tmp("typo");
  const fs::path file = write_filter_pipeline(tmp.path, "  type: datagen\n  count: 0\n  rate: 400\n",
                                              "after.amout_cents >= 10000", "    filter-window: 1s\n");
  ChildProcess job(SLUICE_BINARY, {"run", file.string(), "--http-port", "0"});
  const Served s = await_served(job);
  ASSERT_FALSE(s.job_id.empty());
  const Got absent = await_health_containing(s.host_port, "absent from all");
  EXPECT_NE(absent.body.find("the filter 'after.amout_cents >= 10000' reads 'after.amout_cents', which is absent "
                             "from all"),
            std::string::npos)
      << absent.body;
  EXPECT_NE(absent.body.find("amount_cents"), std::string::npos) << absent.body;  // the fields the records have
  EXPECT_EQ(absent.status, 200) << absent.body;                                   // a warning, not a verdict
  const Got dropped = await_health_containing(s.host_port, "dropped all");
  EXPECT_NE(dropped.body.find("records of the last 1 s (health.filter-window)"), std::string::npos) << dropped.body;
  ASSERT_TRUE(testing::poll_until([&] { return job.err().find("dropped all") != std::string::npos; }, kDeadline))
      << job.err();
  EXPECT_NE(job.err().find("[warning] pipeline 'filter-test': transform #1 (match '*.public.charges', line"),
            std::string::npos)
      << job.err();
  job.signal(SIGTERM);
  EXPECT_EQ(job.wait(), 0) << job.err();
}

TEST(CliPipelineOpsTest, AFilterThatKeepsRecordsHasNoWarnings) {
  const TempDir tmp("no-typo");
  const fs::path file = write_filter_pipeline(tmp.path, "  type: datagen\n  count: 0\n  rate: 400\n",
                                              "after.amount_cents >= 5000", "    filter-window: 1s\n");
  ChildProcess job(SLUICE_BINARY, {"run", file.string(), "--http-port", "0"});
  const Served s = await_served(job);
  ASSERT_FALSE(s.job_id.empty());
  // Past 100 records and two windows: still no warning.
  static const std::regex changes(R"(sluice_pipeline_changes_total\{job="filter-test"\} ([0-9]+))");
  ASSERT_TRUE(testing::poll_until(
      [&] {
        const std::string m = get(s.host_port, "/metrics").body;
        std::smatch x;
        return std::regex_search(m, x, changes) && std::stoll(x[1]) >= 1000;
      },
      kDeadline));
  const Got h = get(s.host_port, "/health");
  EXPECT_NE(h.body.find("\"warnings\":[]"), std::string::npos) << h.body;
  job.signal(SIGTERM);
  EXPECT_EQ(job.wait(), 0) << job.err();
  EXPECT_EQ(job.err().find("[warning]"), std::string::npos) << job.err();
}

TEST(CliPipelineOpsTest, ABoundedRunWhoseFilterDroppedEverythingSaysSo) {
  const TempDir tmp("bounded");
  {
    std::ofstream in(tmp.path / "charges.jsonl");
    for (int i = 0; i < 150; ++i) {
      in << R"({"op":"c","key":{"id":"ch_)" << i << R"("},"before":null,"after":{"id":"ch_)" << i
         << R"(","amount_cents":)" << 100 * i
         << R"(},"source":{"connector":"postgres","db":"payments","collection":"public.charges","position":")" << i
         << R"(","ts_ms":1793606554071,"snapshot":false}})"
         << "\n";
    }
  }
  const fs::path file =
      write_filter_pipeline(tmp.path, "  type: files\n  path: \"" + (tmp.path / "charges.jsonl").string() + "\"\n",
                            "after.amout_cents >= 10000", "    restart-grace: 0s\n");
  Ran ran = sluice({"run", file.string()});
  EXPECT_EQ(ran.code, 0) << ran.err;
  // Logged once, when first seen: by the periodic check during the run (with the count seen then, e.g. 112) or at
  // the end (150), whichever comes first on this machine.
  static const std::regex absent(R"(reads 'after\.amout_cents', which is absent from all ([0-9]+) records)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ran.err, m, absent)) << ran.err;
  EXPECT_GE(std::stoll(m[1]), 100);  // the check waits for kMinRecords before it speaks
  EXPECT_LE(std::stoll(m[1]), 150);
  EXPECT_NE(ran.err.find("after: id amount_cents"), std::string::npos) << ran.err;
  EXPECT_NE(ran.err.find("dropped all 150 records of the run"), std::string::npos) << ran.err;
}

// state.backend.type: rocksdb from `sluice run`: the RocksDB module is loaded when the first keyed operator opens
// (the binary does not link RocksDB), and without it the job fails at once naming what it tried, instead of
// restarting for ever.
TEST(CliPipelineOpsTest, APipelineOnRocksDBLoadsItsModuleAndFailsAtOnceWithoutIt) {
  const TempDir tmp("rocksdb");
  const fs::path file = tmp.path / "rocks.yaml";
  {
    std::ofstream out(file);
    out << "pipeline:\n"
        << "  name: rocks\n"
        << "  parallelism: 2\n"
        << "  entity-version: true\n"  // keyed state: the per-entity counts, in RocksDB
        << "  checkpoint: { interval: 200ms, storage: \"" << (tmp.path / "checkpoints").string() << "\" }\n"
        << "  config:\n"
        << "    state.backend.type: rocksdb\n"
        << "    state.backend.rocksdb.localdir: \"" << (tmp.path / "local").string() << "\"\n"
        << "source: { type: datagen, count: 2000, rate: 2000, entities: 10, seed: 1 }\n"
        << "transform:\n"
        << "  - match: \"*.*.*\"\n"
        << "    key: after.id\n"
        << "    event:\n"
        << "      payload: \"after.id AS id\"\n"
        << "sink:\n"
        << "  out:\n"
        << "    type: print\n";
  }
  Ran ran = sluice({"run", file.string()});
  ASSERT_EQ(ran.code, 0) << ran.err;
  size_t versions = 0;
  for (size_t at = ran.out.find("\"entity_version\""); at != std::string::npos;
       at = ran.out.find("\"entity_version\"", at + 1))
    ++versions;
  EXPECT_EQ(versions, 2000u);
  // A clean run leaves nothing in state.backend.rocksdb.localdir: each database removes its directory when it
  // closes, and the process its sluice-rocksdb-<pid> directory at exit.
  ASSERT_TRUE(fs::exists(tmp.path / "local"));
  for (const auto& e : fs::directory_iterator(tmp.path / "local"))
    ADD_FAILURE() << "left behind: " << e.path();

  const std::string missing = (tmp.path / "nowhere" / "libsluice_rocksdb.so").string();
  const char* before = std::getenv("SLUICE_ROCKSDB_MODULE");
  const std::optional<std::string> saved = before != nullptr ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("SLUICE_ROCKSDB_MODULE", missing.c_str(), 1);
  Ran failed = sluice({"run", file.string()});
  if (saved) {
    ::setenv("SLUICE_ROCKSDB_MODULE", saved->c_str(), 1);
  } else {
    ::unsetenv("SLUICE_ROCKSDB_MODULE");
  }
  EXPECT_EQ(failed.code, 1) << failed.err;
  EXPECT_NE(failed.err.find("state.backend.type 'rocksdb' needs Sluice's RocksDB module libsluice_rocksdb.so, which "
                            "could not be loaded; tried: " +
                            missing + " (no such file)"),
            std::string::npos)
      << failed.err;
  EXPECT_NE(failed.err.find("restart suppressed"), std::string::npos) << failed.err;
}

TEST(CliPipelineOpsTest, ValidateSampleRunsTheTransformOverTheFirstRecordsOfAFilesSource) {
  const TempDir tmp("sample");
  {
    std::ofstream in(tmp.path / "charges.jsonl");
    for (int i = 1; i <= 5; ++i) {
      in << R"({"op":"c","key":{"id":"ch_)" << i << R"("},"before":null,"after":{"id":"ch_)" << i
         << R"(","amount_cents":)" << 5000 * i
         << R"(},"source":{"connector":"postgres","db":"payments","collection":"public.charges","position":")" << i
         << R"(","ts_ms":1793606554071,"snapshot":false}})"
         << "\n";
    }
  }
  const std::string source = "  type: files\n  path: \"" + (tmp.path / "charges.jsonl").string() + "\"\n";
  Ran typo = sluice({"validate", write_filter_pipeline(tmp.path, source, "after.amout_cents >= 10000", "").string(),
                     "--sample", "3"});
  EXPECT_EQ(typo.code, 0) << typo.err;
  EXPECT_NE(typo.out.find("record 3 (payments.public.charges"), std::string::npos) << typo.out;
  EXPECT_EQ(typo.out.find("record 4 ("), std::string::npos) << typo.out;  // only the first 3
  EXPECT_NE(typo.out.find("filter -> null: dropped"), std::string::npos) << typo.out;
  EXPECT_NE(typo.out.find("3 records: 3 changes in, 0 events out, 3 filtered"), std::string::npos) << typo.out;
  EXPECT_NE(typo.out.find("reads 'after.amout_cents', which is absent from all 3 records"), std::string::npos)
      << typo.out;

  Ran right = sluice({"validate", write_filter_pipeline(tmp.path, source, "after.amount_cents >= 10000", "").string(),
                      "--sample", "5"});
  EXPECT_EQ(right.code, 0) << right.err;
  EXPECT_NE(right.out.find("record 1 (payments.public.charges, op \"c\", position 1): transform #1 (match "
                           "'*.public.charges'); filter -> false: dropped"),
            std::string::npos)
      << right.out;
  EXPECT_NE(right.out.find("filter -> true: kept; entity ch_2, event"), std::string::npos) << right.out;
  EXPECT_NE(right.out.find("-> out"), std::string::npos) << right.out;
  EXPECT_NE(right.out.find("5 records: 5 changes in, 4 events out, 1 filtered"), std::string::npos) << right.out;
  EXPECT_EQ(right.out.find("warning"), std::string::npos) << right.out;

  // validate checks what run checks before it starts: engine options and the job graph (both passed validate and
  // then failed or warned in run).
  const std::string file = write_filter_pipeline(tmp.path, source, "TRUE", "").string();
  Ran zero = sluice({"validate", file, "-D", "parallelism.default=0"});
  EXPECT_EQ(zero.code, 2) << zero.out << zero.err;
  EXPECT_NE(zero.err.find("parallelism 0"), std::string::npos) << zero.err;
  EXPECT_EQ(zero.out.find("valid;"), std::string::npos) << zero.out;
  Ran unknown = sluice({"validate", file, "-D", "state.backend.typo=1"});
  EXPECT_EQ(unknown.code, 0) << unknown.err;
  EXPECT_NE(unknown.err.find("'state.backend.typo' is not an engine option"), std::string::npos) << unknown.err;

  Ran not_files =
      sluice({"validate", write_filter_pipeline(tmp.path, "  type: datagen\n", "TRUE", "").string(), "--sample", "3"});
  EXPECT_EQ(not_files.code, 2);
  EXPECT_NE(not_files.err.find("--sample reads a `files` source"), std::string::npos) << not_files.err;
}

TEST(CliPipelineOpsTest, AnExampleJobServesMetricsAndHealthOnItsRestPort) {
  ChildProcess job(SLUICE_BINARY, {"example", "running-sum", "--rate", "200", "--rest-port", "0"});
  static const std::regex line(R"(REST API at http://([0-9.]+:[0-9]+), job id ([0-9a-f]+))");
  std::smatch m;
  std::string err;
  ASSERT_TRUE(testing::poll_until(
      [&] {
        err = job.err();
        return std::regex_search(err, m, line);
      },
      kDeadline))
      << err;
  const std::string host_port = m[1];
  ASSERT_TRUE(testing::poll_until([&] { return get(host_port, "/health").status == 200; }, kDeadline))
      << get(host_port, "/health").body;
  EXPECT_NE(get(host_port, "/health").body.find("\"status\":\"RUNNING\""), std::string::npos);
  const Got metrics = get(host_port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("sluice_job_running{job=\"running sum\",status=\"RUNNING\"} 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("sluice_operator_records_out_total{job=\"running sum\""), std::string::npos)
      << metrics.body;
  Ran cancel = sluice({"cancel", "-m", host_port, std::string(m[2])});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_EQ(job.wait(), 1);
}

}  // namespace
}  // namespace sluice
