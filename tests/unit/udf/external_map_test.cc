// map_external (issue 17, docs/functions.md "From the C++ API"): a DataStream mapped through a JavaScript and a
// Python function on out-of-process workers. Results equal the function's own computation, in input order per
// subtask; a 34-digit decimal goes through Python and back exactly; a throw fails the job naming the function and
// its stack and the record's position; with on_error = kDeadLetter, each record the function throws on is a dead
// letter on the side output (record, position, error, stack) and the others go on; a missing module is refused
// while the job is built.
#include "sluice/udf/external_map.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
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

}  // namespace
}  // namespace sluice::udf
