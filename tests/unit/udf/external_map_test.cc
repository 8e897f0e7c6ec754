// map_external (issue 17, docs/functions.md "From the C++ API"): a DataStream mapped through a JavaScript and a
// Python function on out-of-process workers. Results equal the function's own computation, in input order per
// subtask; a 34-digit decimal goes through Python and back exactly; a throw fails the job naming the function and
// its stack and the record's position; with on_error = kDeadLetter, each record the function throws on is a dead
// letter on the side output (record, position, error, stack) and the others go on; a missing module is refused
// while the job is built; at a trickle the operator keeps at most one timer of each kind, and the timeout timer
// alone finds a batch that hangs when no further record arrives.
#include "sluice/udf/external_map.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/logging.h"
#include "test_util/collect_sink.h"

namespace sluice::udf {
namespace {

namespace fs = std::filesystem;
using testing::CollectedRecords;
using testing::CollectSink;

class ExternalMapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-external-map-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Adds a ring buffer to the default logger for this test (removed when the returned handle goes).
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> capture_log() {
    init_logging();
    auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
    spdlog::default_logger()->sinks().push_back(sink);
    return std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt>(sink.get(), [sink](auto*) {
      auto& sinks = spdlog::default_logger()->sinks();
      sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
    });
  }
  static std::string logs(spdlog::sinks::ringbuffer_sink_mt& sink) {
    std::string out;
    for (const auto& l : sink.last_formatted())
      out += l;
    return out;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

struct Scored {
  int64_t n = 0;
  std::string label;
  friend bool operator==(const Scored&, const Scored&) = default;
};
SLUICE_FIELDS(Scored, n, label);

TEST_F(ExternalMapTest, ANodeFunctionMapsEveryRecordInOrderPerSubtask) {
  ExternalFunction fn;
  fn.runtime = "node";
  fn.module = write("score.js", "exports.score = (r) => ({ n: r.n, label: `n${r.n * 3}:${'x'.repeat(r.n % 5)}` });\n");
  fn.export_name = "score";
  fn.batch_size = 64;
  StreamEnvironment env;
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<Scored>>();
  auto numbers = env.from_source(datagen::sequence(1, 6000), "n");
  map_external<Scored>(
      numbers, fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) {
        return Scored{r.find("n")->as_int64(), std::string(r.find("label")->as_string())};
      })
      .sink_to(std::make_shared<CollectSink<Scored>>(out));
  JobResult r = env.execute();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  std::vector<Scored> all = out->all();
  ASSERT_EQ(all.size(), 6000u);
  std::vector<bool> seen(6001, false);
  for (const Scored& s : all) {
    ASSERT_GE(s.n, 1);
    ASSERT_LE(s.n, 6000);
    EXPECT_FALSE(seen[static_cast<size_t>(s.n)]) << "duplicate " << s.n;
    seen[static_cast<size_t>(s.n)] = true;
    EXPECT_EQ(s.label, "n" + std::to_string(s.n * 3) + ":" + std::string(static_cast<size_t>(s.n % 5), 'x'));
  }
  // The map is chained to the source (forward): each subtask's outputs keep its source split's order.
  for (const auto& part : out->per_subtask()) {
    for (size_t i = 1; i < part.size(); ++i)
      EXPECT_LT(part[i - 1].n, part[i].n) << "out of order";
  }
}

TEST_F(ExternalMapTest, APythonFunctionGetsAndReturnsExactDecimals) {
  ExternalFunction fn;
  fn.runtime = "python";
  fn.module = write("dec.py", "def f(r):\n    return {'d': r['d'] + r['d'], 'text': str(r['d'])}\n");
  fn.export_name = "f";
  StreamEnvironment env;
  env.set_parallelism(1);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  auto numbers = env.from_source(datagen::sequence(1, 300), "n");
  map_external<std::string>(
      numbers, fn,
      [](const int64_t& n) {
        // 34 significant digits: 1234567890123456789012345678.90123n
        return Value::object(
            {{"d", Value(Decimal::parse(fmt::format("1234567890123456789012345678.{:05}", n)).value_or_throw())}});
      },
      [](const Value& r) {
        return r.find("d")->as_decimal().to_string() + "|" + std::string(r.find("text")->as_string());
      })
      .sink_to(std::make_shared<CollectSink<std::string>>(out));
  JobResult r = env.execute();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  const std::vector<std::string> all = out->all();
  ASSERT_EQ(all.size(), 300u);
  for (size_t i = 0; i < all.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(all[i], fmt::format("2469135780246913578024691356.{:05}|1234567890123456789012345678.{:05}", 2 * n, n));
  }
}

TEST_F(ExternalMapTest, AThrowFailsTheJobNamingTheFunctionAndAMissingModuleIsRefusedWhenTheJobIsBuilt) {
  ExternalFunction fn;
  fn.module = write("bad.js",
                    "function check(r) { if (r.n === 77) throw new RangeError('no 77'); return r; }\n"
                    "exports.f = (r) => check(r);\n");
  fn.export_name = "f";
  StreamEnvironment env;
  env.set_parallelism(1);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  map_external<int64_t>(
      env.from_source(datagen::sequence(1, 100), "n"), fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) { return r.find("n")->as_int64(); }, [](const int64_t& n) { return fmt::format("n={}", n); })
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute();
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("function f ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("threw on the record at n=77: RangeError: no 77"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RangeError: no 77"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at check ("), std::string::npos) << msg;

  ExternalFunction missing = fn;
  missing.module = (dir_ / "nope.js").string();
  StreamEnvironment env2;
  auto s = env2.from_source(datagen::sequence(1, 10), "n");
  try {
    map_external<int64_t>(
        s, missing, [](const int64_t& n) { return Value(n); }, [](const Value& v) { return v.as_int64(); });
    FAIL() << "a missing module was accepted";
  } catch (const SluiceException& e) {
    EXPECT_NE(std::string(e.what()).find("nope.js does not exist"), std::string::npos) << e.what();
  }
}

TEST_F(ExternalMapTest, WithDeadLettersAThrowOnOneRecordGoesToTheSideOutputWithPositionAndStackAndTheRestGoOn) {
  ExternalFunction fn;
  fn.module = write("some_bad.js",
                    "function check(r) { if (r.n % 100 === 77) throw new TypeError(`bad ${r.n}`); return r; }\n"
                    "exports.f = (r) => ({ n: check(r).n * 2 });\n");
  fn.export_name = "f";
  fn.batch_size = 32;
  fn.on_error = BadRecordPolicy::kDeadLetter;
  StreamEnvironment env;
  env.set_parallelism(2);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  auto letters = std::make_shared<CollectedRecords<Value>>();
  DataStream<int64_t> doubled = map_external<int64_t>(
      env.from_source(datagen::sequence(1, 3000), "n"), fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) { return r.find("n")->as_int64(); }, [](const int64_t& n) { return fmt::format("n={}", n); });
  doubled.sink_to(std::make_shared<CollectSink<int64_t>>(out));
  doubled.get_side_output(dead_letters(fn)).sink_to(std::make_shared<CollectSink<Value>>(letters));
  JobResult r = env.execute();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");

  std::vector<int64_t> all = out->all();
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected;
  for (int64_t n = 1; n <= 3000; ++n)
    if (n % 100 != 77) expected.push_back(2 * n);
  EXPECT_EQ(all, expected);

  std::vector<Value> dead = letters->all();
  ASSERT_EQ(dead.size(), 30u);
  std::vector<int64_t> dead_n;
  for (const Value& d : dead) {
    const int64_t n = d.find("record")->find("n")->as_int64();
    dead_n.push_back(n);
    EXPECT_EQ(d.find("position")->as_string(), fmt::format("n={}", n)) << d.to_json();
    EXPECT_EQ(d.find("error")->as_string(), fmt::format("bad {}", n)) << d.to_json();
    EXPECT_NE(d.find("stack")->as_string().find("TypeError: bad"), std::string::npos) << d.to_json();
    EXPECT_NE(d.find("stack")->as_string().find("at check ("), std::string::npos) << d.to_json();
    EXPECT_NE(d.find("function")->as_string().find("f ("), std::string::npos) << d.to_json();
    EXPECT_TRUE(d.find("subtask")->is_int64());
  }
  std::sort(dead_n.begin(), dead_n.end());
  for (size_t i = 0; i < dead_n.size(); ++i)
    EXPECT_EQ(dead_n[i], static_cast<int64_t>(i) * 100 + 77);

  // Dead letters nobody reads would be lost: the job is refused when it opens.
  StreamEnvironment env2;
  env2.set_parallelism(1);
  map_external<int64_t>(
      env2.from_source(datagen::sequence(1, 10), "n"), fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& v) { return v.find("n")->as_int64(); })
      .sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>()));
  JobResult r2 = env2.execute();
  ASSERT_FALSE(r2.ok());
  ASSERT_TRUE(r2.error.has_value());
  EXPECT_NE(r2.error->to_string().find("on_error is dead-letter but the job reads no side output"), std::string::npos)
      << r2.error->to_string();
}

// A trickle (400 records/s): the worker is idle at nearly every record, so nearly every record is a batch of its
// own. The operator keeps at most one timeout timer and one batch-max-delay timer; with both durations an hour
// long none fires during the run, so at most 2 are ever registered (it was one delay timer per batch).
TEST_F(ExternalMapTest, ATrickleOfRecordsKeepsAtMostOneTimeoutAndOneDelayTimer) {
  auto log = capture_log();
  ExternalFunction fn;
  fn.module = write("id.js", "exports.f = (r) => r;\n");
  fn.export_name = "f";
  fn.batch_max_delay_ms = 3'600'000;
  fn.timeout_ms = 3'600'000;
  StreamEnvironment env;
  env.set_parallelism(1);
  auto out = std::make_shared<CollectedRecords<int64_t>>();
  map_external<int64_t>(
      env.from_source(datagen::sequence(1, 600, 400), "n"), fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) { return r.find("n")->as_int64(); })
      .sink_to(std::make_shared<CollectSink<int64_t>>(out));
  JobResult r = env.execute();
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(out->all().size(), 600u);
  const std::string l = logs(*log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(l, m, std::regex(R"(subtask 0: (\d+) records in (\d+) batches, (\d+) timers)"))) << l;
  EXPECT_EQ(std::stoi(m[1]), 600);
  // Nearly 600 on a quiet machine; at least 20 even when the worker answers slowly (a timer per batch: 40 and more).
  EXPECT_GE(std::stoi(m[2]), 20) << "not a trickle: most records should go to an idle worker alone";
  EXPECT_LE(std::stoi(m[3]), 2);
}

// The timeout timer alone finds a hung batch: no checkpoint flushes it, and the batch behind it is not sent before
// it is full (batch_size 1000 at 50 records/s, batch_max_delay an hour, max_in_flight 2), so without the timer the
// task would notice only ~40 s later. Earlier batches were answered, so the timer was re-armed for later ones.
TEST_F(ExternalMapTest, ABatchThatHangsWithNoFurtherInputFailsTheTaskAtItsTimeout) {
  ExternalFunction fn;
  fn.module = write("hangs.js", "exports.f = (r) => { if (r.n === 40) for (;;) {} return r; };\n");
  fn.export_name = "f";
  fn.batch_size = 1000;
  fn.batch_max_delay_ms = 3'600'000;
  fn.timeout_ms = 300;
  StreamEnvironment env;
  env.set_parallelism(1);
  map_external<int64_t>(
      env.from_source(std::make_shared<DataGeneratorSource<int64_t>>([](int64_t i) { return i + 1; },
                                                                     DataGeneratorSource<int64_t>::kUnbounded, 50),
                      "n"),
      fn,
      [](const int64_t& n) {
        return Value::object({{"n", Value(n)}});
      },
      [](const Value& r) { return r.find("n")->as_int64(); })
      .sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>()));
  JobClient job = env.execute_async("hangs");
  // A deadline for a condition, not a timing assertion: 15 s is far above the ~1.1 s the timer needs (record 40
  // at 0.8 s, then 300 ms) and far below the ~40 s two more full batches would take.
  job.wait_for(std::chrono::seconds(15));  // without checkpointing no restart: the failure ends the job
  const JobStatus status = job.status();
  if (status != JobStatus::kFailed) job.cancel();
  JobResult r = job.wait();
  ASSERT_EQ(status, JobStatus::kFailed) << "the hung batch was not noticed within 15 s";
  ASSERT_TRUE(r.error.has_value());
  EXPECT_NE(r.error->to_string().find("was not answered within 300 ms"), std::string::npos) << r.error->to_string();
}

}  // namespace
}  // namespace sluice::udf
