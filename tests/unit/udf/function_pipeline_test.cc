// Functions in pipelines (issue 17, docs/functions.md) end to end on the local mini-cluster with files in and out:
// the machine's Node.js runs the functions in out-of-process workers. Results equal a direct Node call, order per
// key holds at parallelism 4, thrown errors follow the bad-record policy with the JavaScript stack, a hung, a
// crashed and an out-of-memory worker fail the task with a clear message and the job recovers from its checkpoint
// with every event exactly once (the files sink commits with checkpoints), a slow function holds the source back
// within the in-flight bounds (counted, not timed), and a TypeScript module is bundled with esbuild from npm.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "sluice/core/logging.h"
#include "sluice/pipeline/pipeline_runner.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class FunctionPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-function-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "in");
    init_logging();
    log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
    spdlog::default_logger()->sinks().push_back(log_);
  }
  void TearDown() override {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
    fs::remove_all(dir_);
  }

  // `n` changes of public.charges over `entities` entities, in `files` input files (an entity's changes all in
  // one file, in order: the files source reads a file in order, one split per file).
  void write_changes(int n, int entities, int files) {
    std::vector<std::ofstream> out;
    for (int f = 0; f < files; ++f)
      out.emplace_back(dir_ / "in" / fmt::format("changes-{}.jsonl", f));
    for (int i = 0; i < n; ++i) {
      const int e = i % entities;
      out[static_cast<size_t>(e % files)] << fmt::format(
          R"({{"op":"{}","key":{{"id":"ch_{}"}},"before":null,"after":{{"id":"ch_{}","status":"{}","amount":{},)"
          R"("customer":"cüstomer-{}","note":"line\n\"{}\""}},"source":{{"connector":"postgres","db":"payments",)"
          R"("collection":"public.charges","position":"0/{:X}","ts_ms":1790000000000,"snapshot":false,"txn_id":{},)"
          R"("sequence":0}}}})"
          "\n",
          i < entities ? "c" : "u", e, e, i % 3 == 0 ? "paid" : "pending", 100 + i, e % 7, i, i + 1, i);
    }
  }

  void write_module(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  std::string pipeline(const std::string& function, const std::string& extra_pipeline = "", int parallelism = 4,
                       const std::string& transform_extra = "") const {
    return fmt::format(R"(pipeline:
  name: fn
  parallelism: {4}
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
{1}
source:
  type: files
  path: {0}/in
transform:
  - match: "payments.public.charges"
    key: key.id
    function: {2}
{3}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                       dir_.string(), extra_pipeline, function, transform_extra, parallelism);
  }

  // Writes the pipeline into the test folder (modules are relative to it) and runs it to its end.
  JobResult run(const std::string& yaml, std::unique_ptr<PipelineRunner>* keep = nullptr) {
    const fs::path file = dir_ / "pipeline.yaml";
    std::ofstream(file) << yaml;
    Result<PipelineSpec> spec = load_pipeline(file);
    EXPECT_TRUE(spec.ok()) << spec.error().message();
    if (!spec.ok()) return {};
    Result<std::unique_ptr<PipelineRunner>> r = PipelineRunner::create(*spec);
    EXPECT_TRUE(r.ok()) << r.error().message();
    if (!r.ok()) return {};
    EXPECT_TRUE((*r)->start().ok());
    JobResult result = (*r)->wait();
    if (keep != nullptr) *keep = std::move(*r);
    return result;
  }

  // The events in the sink, per part file in order.
  std::vector<Value> events() const {
    std::vector<Value> out;
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(dir_ / "out"))
      if (f.path().filename().string().starts_with("part-")) files.push_back(f.path());
    std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
      // part-<subtask>-<n>: numeric order of n within a subtask
      auto key = [](const fs::path& p) {
        int s = 0, n = 0;
        std::sscanf(p.filename().c_str(), "part-%d-%d", &s, &n);
        return std::pair(s, n);
      };
      return key(a) < key(b);
    });
    for (const auto& f : files) {
      std::ifstream in(f);
      std::string line;
      while (std::getline(in, line))
        out.push_back(Value::from_json(line).value_or_throw());
    }
    return out;
  }

  std::string logs() const {
    std::string out;
    for (const auto& l : log_->last_formatted())
      out += l;
    return out;
  }

  // Runs `node` on `script` in the test folder; its stdout.
  std::string node(const std::string& script) const {
    const fs::path js = dir_ / "direct.js";
    std::ofstream(js) << script;
    const std::string cmd = fmt::format("cd '{}' && node direct.js", dir_.string());
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr);
    std::array<char, 65536> buf{};
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
      out.append(buf.data(), n);
    EXPECT_EQ(::pclose(p), 0);
    return out;
  }

  fs::path dir_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_;
};

// A function with strings (non-ASCII, escapes), doubles, nested lists, a drop (null) and a fan-out (a list).
constexpr const char* kChargeModule = R"(
exports.chargeEvent = function (change) {
  const a = change.after;
  if (a.amount % 11 === 0) return null;
  const out = {
    id: a.id,
    cents: a.amount * 100,
    ratio: a.amount / 7,
    label: `${a.status}:${a.customer}:${a.note}`.toUpperCase(),
    tags: [a.status.length, [change.op, change.source.position]],
  };
  if (a.amount % 13 === 0) return [out, { id: a.id, extra: true }];
  return out;
};
)";

TEST_F(FunctionPipelineTest, ResultsEqualADirectNodeCallFor10000EventsAndOrderPerKeyHoldsAtParallelism4) {
  write_changes(10'000, 200, 4);
  write_module("charges.js", kChargeModule);
  JobResult r = run(pipeline("{ runtime: node, module: ./charges.js, export: chargeEvent, batch-size: 100 }", "", 4));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");

  // The same function called directly by Node over the same input: position -> [results].
  const std::string direct = node(R"(
const fs = require('fs');
const { chargeEvent } = require('./charges.js');
for (const f of fs.readdirSync('in').sort()) {
  for (const line of fs.readFileSync('in/' + f, 'utf8').split('\n')) {
    if (!line) continue;
    const c = JSON.parse(line);
    let r = chargeEvent(c);
    if (r === null) r = [];
    if (!Array.isArray(r)) r = [r];
    process.stdout.write(JSON.stringify({ position: c.source.position, results: r }) + '\n');
  }
}
)");
  std::map<std::string, std::vector<Value>> expected;
  size_t expected_events = 0;
  std::istringstream lines(direct);
  for (std::string line; std::getline(lines, line);) {
    Value v = Value::from_json(line).value_or_throw();
    for (const Value& x : v.find("results")->as_array())
      expected[std::string(v.find("position")->as_string())].push_back(x);
    expected_events += v.find("results")->as_array().size();
  }
  ASSERT_GT(expected_events, 9000u);

  const std::vector<Value> got = events();
  ASSERT_EQ(got.size(), expected_events);
  std::map<std::string, std::vector<Value>> actual;
  std::set<std::string> ids;
  std::map<std::string, int64_t> last_position_per_entity;
  for (const Value& e : got) {
    const std::string position(e.find("source")->find("position")->as_string());
    actual[position].push_back(*e.find("payload"));
    EXPECT_TRUE(ids.insert(std::string(e.find("id")->as_string())).second) << "duplicate id " << e.to_json();
    // Per entity, events come in source order (positions increase; the two events of a fan-out share one).
    const std::string entity(e.find("entity")->as_string());
    const int64_t pos = std::stoll(position.substr(2), nullptr, 16);
    auto [it, fresh] = last_position_per_entity.emplace(entity, pos);
    if (!fresh) {
      EXPECT_GE(pos, it->second) << "entity " << entity << " out of order";
      it->second = pos;
    }
  }
  EXPECT_EQ(actual.size(), expected.size());
  for (const auto& [position, results] : expected) {
    ASSERT_EQ(actual[position], results) << "at position " << position;
  }
  EXPECT_EQ(last_position_per_entity.size(), 200u);
}

TEST_F(FunctionPipelineTest, AThrownErrorFailsTheJobNamingThePositionTheFunctionAndTheJavaScriptStack) {
  write_changes(50, 5, 1);
  write_module("throws.js", R"(
function check(a) {
  if (a.amount === 120) throw new TypeError('amount 120 is not allowed');
  return { ok: a.amount };
}
exports.validate = (change) => check(change.after);
)");
  JobResult r =
      run(pipeline("{ runtime: node, module: ./throws.js, export: validate }", "  restart: { strategy: none }", 1));
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("public.charges at position 0/15"), std::string::npos) << msg;  // change 20: 0x15
  EXPECT_NE(msg.find("function validate (./throws.js) threw: TypeError: amount 120 is not allowed"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("at check ("), std::string::npos) << msg;  // the JavaScript stack, with the user's frames
  EXPECT_NE(msg.find("throws.js:3:"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("worker.js"), std::string::npos) << "the worker's own frames are cut: " << msg;
}

TEST_F(FunctionPipelineTest, AThrownErrorGoesToTheDeadLetterSinkWithThePositionAndTheStackAndTheRestGoesOn) {
  write_changes(50, 5, 1);
  write_module("throws.js", R"(
exports.validate = async (change) => {
  if (change.after.amount === 120) throw new RangeError('amount 120 is not allowed');
  return { ok: change.after.amount };
};
)");
  JobResult r = run(pipeline("{ runtime: node, module: ./throws.js, export: validate }",
                             fmt::format("  dead-letter: {{ type: files, path: {}/dl }}", dir_.string()), 1));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(events().size(), 49u);
  std::string dl;
  for (const auto& f : fs::recursive_directory_iterator(dir_ / "dl"))
    if (f.is_regular_file()) dl += slurp(f.path());
  std::istringstream lines(dl);
  std::string line;
  ASSERT_TRUE(std::getline(lines, line)) << "no dead letter";
  const Value entry = Value::from_json(line).value_or_throw();
  EXPECT_EQ(entry.find("stage")->as_string(), "function");
  EXPECT_EQ(entry.find("position")->as_string(), "0/15");
  EXPECT_EQ(entry.find("function")->as_string(), "validate (./throws.js)");
  EXPECT_EQ(entry.find("message")->as_string(), "amount 120 is not allowed");
  EXPECT_NE(entry.find("stack")->as_string().find("RangeError: amount 120 is not allowed\n    at "), std::string::npos)
      << line;
  EXPECT_NE(entry.find("stack")->as_string().find("throws.js:3:"), std::string::npos) << line;
  EXPECT_EQ(entry.find("record")->find("after")->find("amount")->as_int64(), 120);
  EXPECT_FALSE(std::getline(lines, line));
}

// Each failure happens once (a marker file), so the restarted job gets past it: it must then deliver every event
// exactly once (the files sink commits with checkpoints; the worker held no record across a checkpoint).
void expect_exactly_once(const std::vector<Value>& got, size_t n) {
  std::map<std::string, int> count;
  for (const Value& e : got)
    ++count[std::string(e.find("source")->find("position")->as_string())];
  EXPECT_EQ(count.size(), n) << "missing events";
  size_t dup = 0;
  for (const auto& [p, c] : count)
    dup += c > 1 ? 1 : 0;
  EXPECT_EQ(dup, 0u) << "positions delivered more than once";
  EXPECT_EQ(got.size(), n);
}

TEST_F(FunctionPipelineTest, ANeverReturningFunctionFailsTheTaskAtTheBatchTimeoutAndTheJobRecovers) {
  write_changes(3000, 30, 2);
  write_module("hangs.js", fmt::format(R"(
const fs = require('fs');
exports.f = (change) => {{
  if (change.after.amount === 2100 && !fs.existsSync('{0}/hung')) {{
    fs.writeFileSync('{0}/hung', '');
    for (;;) {{}}
  }}
  return {{ n: change.after.amount }};
}};
)",
                                       dir_.string()));
  std::unique_ptr<PipelineRunner> runner;
  JobResult r =
      run(pipeline("{ runtime: node, module: ./hangs.js, export: f, timeout: 1s, batch-size: 50 }",
                   "  delivery: exactly-once\n  restart: { strategy: fixed-delay, attempts: 3, delay: 100ms }", 2),
          &runner);
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_TRUE(fs::exists(dir_ / "hung"));
  EXPECT_GE(r.restarts, 1);
  const std::vector<JobExceptionInfo> failures = runner->client()->exceptions();
  ASSERT_FALSE(failures.empty());
  EXPECT_NE(failures.back().message.find("was not answered within 1000 ms (function.timeout"), std::string::npos)
      << failures.back().message;
  expect_exactly_once(events(), 3000);
}

TEST_F(FunctionPipelineTest, AWorkerKilledMidBatchOrOutOfMemoryFailsTheTaskClearlyAndTheJobRecoversExactlyOnce) {
  write_changes(3000, 30, 2);
  write_module("dies.js", fmt::format(R"(
const fs = require('fs');
exports.f = (change) => {{
  const a = change.after.amount;
  // ~0.3 ms a record: batches are in flight whenever a checkpoint barrier passes, so the test fails if they are
  // not answered and emitted before it (their changes would be lost on restore).
  const until = process.hrtime.bigint() + 300000n;
  while (process.hrtime.bigint() < until) {{}}
  if (a === 1300 && !fs.existsSync('{0}/killed')) {{
    fs.writeFileSync('{0}/killed', '');
    process.kill(process.pid, 'SIGKILL');
  }}
  if (a === 2500 && !fs.existsSync('{0}/oom')) {{
    fs.writeFileSync('{0}/oom', '');
    const hog = [];
    for (;;) hog.push(new Array(1e6).fill(a));
  }}
  return {{ n: a }};
}};
)",
                                      dir_.string()));
  std::unique_ptr<PipelineRunner> runner;
  JobResult r =
      run(pipeline("{ runtime: node, module: ./dies.js, export: f, memory: 64, batch-size: 50 }",
                   "  delivery: exactly-once\n  restart: { strategy: fixed-delay, attempts: 4, delay: 100ms }", 2),
          &runner);
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_GE(r.restarts, 2);
  std::string all;
  for (const JobExceptionInfo& e : runner->client()->exceptions())
    all += e.message + "\n";
  EXPECT_NE(all.find("function f (./dies.js) subtask"), std::string::npos) << all;
  EXPECT_NE(all.find("was killed by signal 9"), std::string::npos) << all;
  EXPECT_NE(all.find("ran out of memory (its limit is 64 MiB"), std::string::npos) << all;
  expect_exactly_once(events(), 3000);
}

TEST_F(FunctionPipelineTest, ASlowFunctionHoldsTheSourceBackWithinTheInFlightBounds) {
  write_changes(2000, 20, 1);
  // About 1 ms per record: the source could read the 2,000 changes in a few ms, so without the bound the queue
  // would hold nearly all of them.
  write_module("slow.js", R"(
exports.f = (change) => {
  const until = Date.now() + 1;
  while (Date.now() < until) {}
  return { n: change.after.amount };
};
)");
  JobResult r =
      run(pipeline("{ runtime: node, module: ./slow.js, export: f, batch-size: 20, max-in-flight: 2 }", "", 1));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(events().size(), 2000u);
  // The operator's counters at close: batches in flight never above max-in-flight, the queue of changes never
  // above (max-in-flight + 1) x batch-size + 1 = 61, so the source was held back (it read at most that far ahead).
  const std::string l = logs();
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(l, m,
                        std::regex(R"(function f \(\./slow\.js\) subtask 0: (\d+) records in (\d+) batches, at )"
                                   R"(most (\d+) batches in flight \(bound 2\), at most (\d+) changes queued )"
                                   R"(\(bound (\d+)\))")))
      << l;
  EXPECT_EQ(std::stoi(m[1]), 2000);
  EXPECT_GE(std::stoi(m[2]), 100);
  EXPECT_EQ(std::stoi(m[3]), 2);
  EXPECT_LE(std::stoi(m[4]), 61);
  EXPECT_EQ(std::stoi(m[5]), 61);
}

// A trickle: the datagen source at 400 records/s, so the worker is idle at nearly every record and nearly every
// record is a batch of its own. The operator keeps at most one timeout timer and one batch-max-delay timer per
// function (a timer per batch kept ~60,000 pending at 2,000 records/s with the default 30 s timeout); with both
// durations an hour long none fires during the run, so at most 2 are ever registered (it was 2 per batch).
TEST_F(FunctionPipelineTest, ATrickleOfRecordsKeepsAtMostOneTimeoutAndOneDelayTimerPerFunction) {
  write_module("fast.js", "exports.f = (change) => ({ n: change.after.amount_cents });\n");
  const std::string yaml = fmt::format(R"(pipeline:
  name: fn
  parallelism: 1
  checkpoint: {{ interval: 1s, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 600, rate: 400, entities: 50 }}
transform:
  - match: "payments.public.charges"
    key: key.id
    function: {{ runtime: node, module: ./fast.js, export: f, timeout: 1h, batch-max-delay: 1h }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  JobResult r = run(yaml);
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(events().size(), 600u);
  const std::string l = logs();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      l, m, std::regex(R"(function f \(\./fast\.js\) subtask 0: (\d+) records in (\d+) batches, .*, (\d+) timers)")))
      << l;
  EXPECT_EQ(std::stoi(m[1]), 600);
  // Nearly 600 on a quiet machine; at least 20 even when the worker answers slowly (a timer per batch: 40 and more).
  EXPECT_GE(std::stoi(m[2]), 20) << "not a trickle: most records should go to an idle worker alone";
  EXPECT_LE(std::stoi(m[3]), 2);
}

// The timeout timer alone finds a hung batch: no checkpoint flushes the batches, and the batch behind it grows
// slowly and is not sent before it is full (batch-size 1000 at 50 records/s, batch-max-delay 1h, max-in-flight 2),
// so without the timer the task would notice only ~40 s later, when two more batches were full. Earlier batches
// were answered, so the timer was re-armed for later ones.
TEST_F(FunctionPipelineTest, ABatchThatHangsWithNoFurtherInputFailsTheTaskAtItsTimeout) {
  write_module("hangs.js", R"(
exports.f = (change) => {
  if (change.source.position === '40') for (;;) {}
  return { n: change.after.amount_cents };
};
)");
  const std::string yaml = fmt::format(R"(pipeline:
  name: fn
  parallelism: 1
  restart: {{ strategy: none }}
  checkpoint: {{ interval: 0, storage: "{0}/checkpoints" }}
source: {{ type: datagen, count: 0, rate: 50, entities: 10 }}
transform:
  - match: "payments.public.charges"
    key: key.id
    function: {{ runtime: node, module: ./hangs.js, export: f, timeout: 300ms, batch-size: 1000,
                batch-max-delay: 1h }}
sink:
  events: {{ type: files, path: "{0}/out" }}
)",
                                       dir_.string());
  const fs::path file = dir_ / "pipeline.yaml";
  std::ofstream(file) << yaml;
  Result<PipelineSpec> spec = load_pipeline(file);
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
  ASSERT_TRUE(runner.ok()) << runner.error().message();
  ASSERT_TRUE((*runner)->start().ok());
  // A deadline for a condition, not a timing assertion: 15 s is far above the ~1.1 s the timer needs (record 40
  // at 0.8 s, then 300 ms) and far below the ~40 s two more full batches would take.
  // The job has no restart strategy: its failure ends it, which wait_for returns on.
  std::optional<JobClient> client = (*runner)->client();
  ASSERT_TRUE(client.has_value());
  client->wait_for(std::chrono::seconds(15));
  const JobStatus status = (*runner)->status();
  if (status != JobStatus::kFailed) (*runner)->cancel();
  JobResult r = (*runner)->wait();
  ASSERT_EQ(status, JobStatus::kFailed) << "the hung batch was not noticed within 15 s";
  ASSERT_TRUE(r.error.has_value());
  EXPECT_NE(r.error->to_string().find("was not answered within 300 ms (function.timeout"), std::string::npos)
      << r.error->to_string();
}

TEST_F(FunctionPipelineTest, ATypeScriptModuleIsBundledWithEsbuildFromNpmAndItsStackNamesTheTsLines) {
  const fs::path data = fs::path(SLUICE_SOURCE_DIR) / "tests" / "data" / "functions";
  fs::copy_file(data / "package.json", dir_ / "package.json");
  fs::copy_file(data / "package-lock.json", dir_ / "package-lock.json");
  fs::create_directories(dir_ / "domain");
  std::ofstream(dir_ / "domain" / "charges.ts")
      << fmt::format(R"(import type {{ ChangeEvent, FunctionResult }} from "{}/runtime/node/sluice";

interface Charge {{ id: string; status: string; amount: number; [k: string]: unknown }}

export function chargeEvent(change: ChangeEvent): FunctionResult {{
  const charge = change.after as unknown as Charge;
  if (charge.amount === 107) throw new Error(`bad charge ${{charge.id}}`);
  return {{ chargeId: charge.id, amountCents: charge.amount * 100 }};
}}
)",
                     SLUICE_SOURCE_DIR);
  write_changes(20, 4, 1);
  JobResult r = run(pipeline("{ runtime: node, module: ./domain/charges.ts, export: chargeEvent }",
                             fmt::format("  dead-letter: {{ type: files, path: {}/dl }}", dir_.string()), 1,
                             "    event: { type: \"'charge.' || after.status\" }"));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  const std::vector<Value> got = events();
  ASSERT_EQ(got.size(), 19u);
  EXPECT_EQ(got[0].find("payload")->to_json(), R"({"chargeId":"ch_0","amountCents":10000})");
  EXPECT_EQ(got[0].find("type")->as_string(), "charge.paid");
  std::string dl;
  for (const auto& f : fs::recursive_directory_iterator(dir_ / "dl"))
    if (f.is_regular_file()) dl += slurp(f.path());
  // The inline source map points the stack at the TypeScript source's line.
  EXPECT_NE(dl.find("domain/charges.ts:7:"), std::string::npos) << dl;

  // A module that does not compile names the file and line, before the job starts.
  std::ofstream(dir_ / "domain" / "charges.ts") << "export function chargeEvent(change) {\n  return {;\n}\n";
  const fs::path file = dir_ / "pipeline.yaml";
  Result<PipelineSpec> spec = load_pipeline(file);
  ASSERT_TRUE(spec.ok());
  Result<std::unique_ptr<PipelineRunner>> bad = PipelineRunner::create(*spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("does not compile"), std::string::npos) << bad.error().message();
  EXPECT_NE(bad.error().message().find("charges.ts:2:"), std::string::npos) << bad.error().message();
}

TEST_F(FunctionPipelineTest, AMissingExportOrModuleIsAClearErrorNamingIt) {
  write_changes(5, 1, 1);
  write_module("m.js", "exports.other = () => ({});\n");
  JobResult r = run(pipeline("{ runtime: node, module: ./m.js, export: missing }", "  restart: { strategy: none }", 1));
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_NE(r.error->to_string().find("has no exported function 'missing' (exports: other)"), std::string::npos)
      << r.error->to_string();

  const fs::path file = dir_ / "pipeline.yaml";
  std::ofstream(file) << pipeline("{ runtime: node, module: ./nope.ts, export: f }");
  Result<PipelineSpec> spec = load_pipeline(file);
  ASSERT_TRUE(spec.ok());
  Result<std::unique_ptr<PipelineRunner>> bad = PipelineRunner::create(*spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("pipeline.yaml:12:"), std::string::npos) << bad.error().message();
  EXPECT_NE(bad.error().message().find("nope.ts' does not exist"), std::string::npos) << bad.error().message();
}

// Python (runtime: python): the same protocol and semantics, a .py module loaded as it is.
constexpr const char* kChargePython = R"(
def charge_event(change):
    a = change["after"]
    if a["amount"] % 11 == 0:
        return None
    out = {"id": a["id"], "cents": a["amount"] * 100, "label": f"{a['status']}:{a['customer']}:{a['note']}".upper(),
           "tags": [len(a["status"]), [change["op"], change["source"]["position"]]]}
    if a["amount"] % 13 == 0:
        return [out, {"id": a["id"], "extra": True}]
    if a["amount"] == 120:
        raise ValueError("amount 120 is not allowed")
    return out
)";

TEST_F(FunctionPipelineTest,
       PythonResultsEqualADirectPythonCallOrderPerKeyHoldsAndAThrowIsDeadLetteredWithItsTraceback) {
  write_changes(4000, 100, 4);
  write_module("charges.py", kChargePython);
  JobResult r = run(pipeline("{ runtime: python, module: ./charges.py, export: charge_event, batch-size: 100 }",
                             fmt::format("  dead-letter: {{ type: files, path: {}/dl }}", dir_.string()), 4));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  const fs::path script = dir_ / "direct.py";
  std::ofstream(script) << R"(
import json, os, sys
sys.path.insert(0, '.')
from charges import charge_event
for f in sorted(os.listdir('in')):
    for line in open('in/' + f, encoding='utf-8'):
        c = json.loads(line)
        try:
            r = charge_event(c)
        except ValueError:
            continue
        r = [] if r is None else (r if isinstance(r, list) else [r])
        print(json.dumps({"position": c["source"]["position"], "results": r}, ensure_ascii=False))
)";
  std::string direct;
  {
    FILE* p = ::popen(fmt::format("cd '{}' && python3 direct.py", dir_.string()).c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::array<char, 65536> buf{};
    for (size_t n = 0; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;)
      direct.append(buf.data(), n);
    ASSERT_EQ(::pclose(p), 0);
  }
  std::map<std::string, std::vector<Value>> expected;
  size_t expected_events = 0;
  std::istringstream lines(direct);
  for (std::string line; std::getline(lines, line);) {
    Value v = Value::from_json(line).value_or_throw();
    for (const Value& x : v.find("results")->as_array())
      expected[std::string(v.find("position")->as_string())].push_back(x);
    expected_events += v.find("results")->as_array().size();
  }
  const std::vector<Value> got = events();
  ASSERT_EQ(got.size(), expected_events);
  std::map<std::string, std::vector<Value>> actual;
  std::map<std::string, int64_t> last_position_per_entity;
  for (const Value& e : got) {
    const std::string position(e.find("source")->find("position")->as_string());
    actual[position].push_back(*e.find("payload"));
    const int64_t pos = std::stoll(position.substr(2), nullptr, 16);
    auto [it, fresh] = last_position_per_entity.emplace(std::string(e.find("entity")->as_string()), pos);
    if (!fresh) {
      EXPECT_GE(pos, it->second) << "out of order";
      it->second = pos;
    }
  }
  for (const auto& [position, results] : expected)
    ASSERT_EQ(actual[position], results) << "at position " << position;
  std::string dl;
  for (const auto& f : fs::recursive_directory_iterator(dir_ / "dl"))
    if (f.is_regular_file()) dl += slurp(f.path());
  const Value entry = Value::from_json(dl.substr(0, dl.find('\n'))).value_or_throw();
  EXPECT_EQ(entry.find("position")->as_string(), "0/15");
  EXPECT_EQ(entry.find("message")->as_string(), "ValueError: amount 120 is not allowed");
  EXPECT_NE(entry.find("stack")->as_string().find("charges.py\", line 11, in charge_event"), std::string::npos) << dl;
  EXPECT_EQ(entry.find("stack")->as_string().find("worker.py"), std::string::npos) << dl;
}

TEST_F(FunctionPipelineTest, APythonExceptionFailsTheJobNamingThePositionTheFunctionAndThePythonTraceback) {
  write_changes(50, 5, 1);
  write_module("throws.py", R"(
def check(a):
    if a["amount"] == 120:
        raise ValueError("amount 120 is not allowed")
    return {"ok": a["amount"]}

def validate(change):
    return check(change["after"])
)");
  JobResult r =
      run(pipeline("{ runtime: python, module: ./throws.py, export: validate }", "  restart: { strategy: none }", 1));
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("public.charges at position 0/15"), std::string::npos) << msg;  // change 20: 0x15
  EXPECT_NE(msg.find("function validate (./throws.py) threw:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ValueError: amount 120 is not allowed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in check"), std::string::npos) << msg;  // the traceback names the user's frames
  EXPECT_NE(msg.find("throws.py\", line 4"), std::string::npos) << msg;
}

TEST_F(FunctionPipelineTest, ASlowPythonFunctionHoldsTheSourceBackWithinTheInFlightBounds) {
  write_changes(1000, 20, 1);
  // About 1 ms per record: without the bound the queue would hold nearly all of the 1,000 changes.
  write_module("slow.py", R"(
import time
def f(change):
    until = time.perf_counter() + 0.001
    while time.perf_counter() < until:
        pass
    return {"n": change["after"]["amount"]}
)");
  JobResult r =
      run(pipeline("{ runtime: python, module: ./slow.py, export: f, batch-size: 20, max-in-flight: 2 }", "", 1));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(events().size(), 1000u);
  // The operator's counters at close: at most max-in-flight batches unanswered, at most
  // (max-in-flight + 1) x batch-size + 1 = 61 changes queued: the source was held back.
  const std::string l = logs();
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(l, m,
                        std::regex(R"(function f \(\./slow\.py\) subtask 0: (\d+) records in (\d+) batches, at )"
                                   R"(most (\d+) batches in flight \(bound 2\), at most (\d+) changes queued )"
                                   R"(\(bound (\d+)\))")))
      << l;
  EXPECT_EQ(std::stoi(m[1]), 1000);
  EXPECT_GE(std::stoi(m[2]), 50);
  EXPECT_EQ(std::stoi(m[3]), 2);
  EXPECT_LE(std::stoi(m[4]), 61);
  EXPECT_EQ(std::stoi(m[5]), 61);
}

TEST_F(FunctionPipelineTest, APythonFunctionThatNeverReturnsOrAWorkerThatDiesFailsTheTaskAndTheJobRecoversExactlyOnce) {
  write_changes(3000, 30, 2);
  write_module("f.py", fmt::format(R"(
import os, signal, time
def f(change):
    a = change["after"]["amount"]
    until = time.perf_counter() + 0.0003
    while time.perf_counter() < until:
        pass
    if a == 1300 and not os.path.exists("{0}/hung"):
        open("{0}/hung", "w").close()
        while True:
            pass
    if a == 2500 and not os.path.exists("{0}/killed"):
        open("{0}/killed", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return {{"n": a}}
)",
                                   dir_.string()));
  std::unique_ptr<PipelineRunner> runner;
  JobResult r =
      run(pipeline("{ runtime: python, module: ./f.py, export: f, timeout: 1s, batch-size: 50 }",
                   "  delivery: exactly-once\n  restart: { strategy: fixed-delay, attempts: 4, delay: 100ms }", 2),
          &runner);
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_GE(r.restarts, 2);
  std::string all;
  for (const JobExceptionInfo& e : runner->client()->exceptions())
    all += e.message + "\n";
  EXPECT_NE(all.find("was not answered within 1000 ms"), std::string::npos) << all;
  EXPECT_NE(all.find("was killed by signal 9"), std::string::npos) << all;
  expect_exactly_once(events(), 3000);
}

// Decimals travel exactly both ways (protocol version 2): a 32- and a 35-digit decimal reach the function as a
// Decimal (Node.js) or decimal.Decimal (Python), come back unchanged when returned, and a decimal the function
// makes is exact too; a decimal Sluice cannot hold (42 digits, NaN) and an input object that mimics the wire form
// are record errors (dead letters), never altered values.
class FunctionDecimalTest : public FunctionPipelineTest {
 protected:
  static constexpr const char* kA = "12345678901234567890.123456789012";      // 32 significant digits
  static constexpr const char* kB = "-9876543210987654321098765.4321098765";  // 35 significant digits

  void write_decimal_changes() {
    std::ofstream out(dir_ / "in" / "changes-0.jsonl");
    auto line = [&](int i, const std::string& amount) {
      out << fmt::format(R"({{"op":"c","key":{{"id":"d{0}"}},"before":null,"after":{{"id":"d{0}","amount":{1}}},)"
                         R"("source":{{"connector":"postgres","db":"payments","collection":"public.charges",)"
                         R"("position":"0/{0}","ts_ms":1790000000000,"snapshot":false,"txn_id":{0},"sequence":0}}}})",
                         i + 1, amount)
          << "\n";
    };
    line(0, kA);
    line(1, kB);
    line(2, R"({"$decimal":"5"})");  // mimics the wire form: refused, not turned into a decimal
    line(3, "7.5");                  // a double: stays a number
  }

  std::string dead_letters() const {
    std::string dl;
    for (const auto& f : fs::recursive_directory_iterator(dir_ / "dl"))
      if (f.is_regular_file()) dl += slurp(f.path());
    return dl;
  }

  // The payload of the event at `position`.
  static const Value* payload_at(const std::vector<Value>& got, const std::string& position) {
    for (const Value& e : got)
      if (e.find("source")->find("position")->as_string() == position) return e.find("payload");
    return nullptr;
  }
};

TEST_F(FunctionDecimalTest, DecimalsOf30PlusDigitsReachANodeFunctionAndComeBackExactly) {
  write_decimal_changes();
  write_module("dec.js", R"(
exports.f = (change) => {
  const a = change.after.amount;
  if (typeof a === 'number') return { double: a };
  if (!(a instanceof SluiceDecimal)) throw new TypeError('not a Decimal: ' + JSON.stringify(a));
  if (a.text.startsWith('-')) return { big: new SluiceDecimal('1' + '0'.repeat(40) + '.5') };
  return { same: a, text: String(a), made: new SluiceDecimal(a.text + '1'), plain: { $decimal: '-0.' + '1'.repeat(33) },
           nested: [a, { a }], approx: a / 1e10 };
};
)");
  JobResult r = run(pipeline("{ runtime: node, module: ./dec.js, export: f }",
                             fmt::format("  dead-letter: {{ type: files, path: {}/dl }}", dir_.string()), 1));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  const std::vector<Value> got = events();
  ASSERT_EQ(got.size(), 2u);
  const Value* a = payload_at(got, "0/1");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->find("same")->is_decimal()) << a->to_json();
  EXPECT_EQ(a->find("same")->as_decimal().to_string(), kA);
  EXPECT_EQ(a->find("text")->as_string(), kA);
  EXPECT_EQ(a->find("made")->as_decimal().to_string(), std::string(kA) + "1");
  EXPECT_EQ(a->find("plain")->as_decimal().to_string(), "-0." + std::string(33, '1'));
  EXPECT_EQ(a->find("nested")->as_array()[0].as_decimal().to_string(), kA);
  EXPECT_EQ(a->find("nested")->as_array()[1].find("a")->as_decimal().to_string(), kA);
  EXPECT_TRUE(a->find("approx")->is_double());  // arithmetic goes through the nearest number, as documented
  const Value* d = payload_at(got, "0/4");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->find("double")->as_double(), 7.5);
  const std::string dl = dead_letters();
  EXPECT_NE(dl.find(R"("position":"0/2")"), std::string::npos) << dl;
  EXPECT_NE(dl.find("which Sluice cannot hold exactly"), std::string::npos) << dl;
  EXPECT_NE(dl.find(R"("position":"0/3")"), std::string::npos) << dl;
  EXPECT_NE(dl.find("reserves for exact decimals"), std::string::npos) << dl;
}

TEST_F(FunctionDecimalTest, DecimalsOf30PlusDigitsReachAPythonFunctionAsDecimalAndComeBackExactly) {
  write_decimal_changes();
  write_module("dec.py", R"(
import decimal

def f(change):
    a = change["after"]["amount"]
    if isinstance(a, float):
        return {"double": a}
    if not isinstance(a, decimal.Decimal):
        raise TypeError(f"not a Decimal: {a!r}")
    if a < 0:
        return {"same": a, "doubled": a + a, "nan": decimal.Decimal("NaN")}
    return {"same": a, "text": str(a), "doubled": a + a, "made": decimal.Decimal(str(a) + "1"), "nested": [a, {"a": a}]}
)");
  JobResult r = run(pipeline("{ runtime: python, module: ./dec.py, export: f }",
                             fmt::format("  dead-letter: {{ type: files, path: {}/dl }}", dir_.string()), 1));
  ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  const std::vector<Value> got = events();
  ASSERT_EQ(got.size(), 2u);
  const Value* a = payload_at(got, "0/1");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->find("same")->is_decimal()) << a->to_json();
  EXPECT_EQ(a->find("same")->as_decimal().to_string(), kA);
  EXPECT_EQ(a->find("text")->as_string(), kA);
  EXPECT_EQ(a->find("doubled")->as_decimal().to_string(), "24691357802469135780.246913578024");
  EXPECT_EQ(a->find("made")->as_decimal().to_string(), std::string(kA) + "1");
  EXPECT_EQ(a->find("nested")->as_array()[1].find("a")->as_decimal().to_string(), kA);
  const Value* d = payload_at(got, "0/4");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->find("double")->as_double(), 7.5);
  const std::string dl = dead_letters();
  EXPECT_NE(dl.find(R"("position":"0/2")"), std::string::npos) << dl;  // NaN: not a decimal Sluice holds
  EXPECT_NE(dl.find("which Sluice cannot hold exactly"), std::string::npos) << dl;
  EXPECT_NE(dl.find(R"("position":"0/3")"), std::string::npos) << dl;
  EXPECT_NE(dl.find("reserves for exact decimals"), std::string::npos) << dl;
}

}  // namespace
}  // namespace sluice::pipeline
