// PostgresUpsertSink against a real Postgres (scripts/services/postgres):
//  * upserts, updates and deletes end in the expected table state; replaying the same records is idempotent;
//  * a batch collapses per key (last write wins, partial rows merge, delete-then-insert); composite keys;
//  * types: numeric precision, jsonb, timestamptz, bytea, bool, int[], text with quotes and unicode, NULL;
//  * bad records: kFail names the record, the table and Postgres's error; kDeadLetter diverts them and writes
//    the rest; a missing table or key without a unique index fails create_writer;
//  * flush_interval on a manual clock; a reconnect after pg_terminate_backend of the sink's backend;
//  * a checkpointed job writing 20 k records (5 k keys, 4 versions each) at parallelism 2.
// Writers are driven directly (write / flush on the test thread) except in the job test.
// Run: scripts/services/run-with postgres -- build/<dir>/tests/postgres_upsert_sink_test
#include "sluice/connectors/postgres/postgres_upsert_sink.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/polling.h"
#include "integration/test_util/postgres.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/clock.h"
#include "sluice/core/value_json.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Waits until `pred` holds or the deadline passes (a condition owned by another process).
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds deadline = 30s) {
  return sluice::testing::poll_until(pred, deadline);
}

class TestContext final : public RuntimeContext {
 public:
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  int max_parallelism() const override { return 128; }
  int attempt_number() const override { return 0; }
  const Clock& clock() const override { return clock_; }
  OperatorStateStore& operator_state() override { return store_; }
  ManualClock& manual_clock() { return clock_; }

 private:
  std::string name_ = "Sink: pg";
  ManualClock clock_;
  OperatorStateStore store_;
};

class NoContext final : public SinkWriterContext {
 public:
  TimestampMs timestamp() const override { return kNoTimestamp; }
  TimestampMs current_watermark() const override { return kNoTimestamp; }
};

Value obj(std::initializer_list<std::pair<std::string_view, Value>> fields) {
  return Value::object(fields);
}

class PostgresUpsertSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = sluice::testing::require_service("postgres").get("POSTGRES_URL");
    if (url_.empty()) return;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string n = info->name();
    std::transform(n.begin(), n.end(), n.begin(),
                   [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : '_'; });
    static int run = 0;
    name_ = "u" + std::to_string(::getpid()) + "_" + std::to_string(++run) + "_" + n.substr(0, 36);
    dir_ = fs::temp_directory_path() / ("sluice-pgsink-" + name_ + "-" + std::to_string(wall_ms()));
    fs::create_directories(dir_);
    pg_ = std::make_unique<sluice::testing::PgClient>(url_);
  }
  void TearDown() override {
    if (!pg_) return;
    pg_->exec(
        "DO $$DECLARE r record; BEGIN FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
        "starts_with(tablename, '" +
        name_ +
        "_') LOOP EXECUTE 'DROP TABLE ' || quote_ident(r.tablename); END LOOP; "
        "END$$");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string table(const std::string& suffix) const { return name_ + "_" + suffix; }

  PostgresUpsertSink::Builder sink(const std::string& t, std::vector<std::string> keys) const {
    return PostgresUpsertSink::builder()
        .conninfo(url_)
        .table(t)
        .key_columns(std::move(keys))
        .is_delete([](const Value& r) { return r.find("_deleted") != nullptr; })
        .row([](const Value& r) {
          Value row = r;
          if (row.is_object()) row.as_object().erase("_deleted");
          return row;
        });
  }

  /// Writes `records` through a fresh writer and flushes once.
  void write_all(const PostgresUpsertSink& s, const std::vector<Value>& records) {
    auto w = s.create_writer(ctx_);
    for (const auto& r : records)
      w->write(r, no_ctx_);
    w->flush(false);
    w->close();
  }

  std::string url_;
  std::string name_;
  fs::path dir_;
  std::unique_ptr<sluice::testing::PgClient> pg_;
  TestContext ctx_;
  NoContext no_ctx_;
};

Value del(Value key) {
  key.set("_deleted", Value(true));
  return key;
}

TEST_F(PostgresUpsertSinkTest, UpsertsUpdatesAndDeletesGiveTheFinalState) {
  const std::string t = table("items");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, name text, qty int DEFAULT 7)");
  pg_->exec("INSERT INTO " + t + " VALUES (100, 'pre', 1), (101, 'gone', 1)");
  auto s = sink(t, {"id"}).batch_size(2).build();
  write_all(*s, {obj({{"id", 1}, {"name", "a"}, {"qty", 1}}), obj({{"id", 2}, {"name", "b"}, {"qty", 2}}),
                 obj({{"id", 3}, {"name", "c"}}), obj({{"id", 1}, {"name", "a2"}, {"qty", 10}}),
                 obj({{"id", 100}, {"name", "updated"}}),  // partial update: qty stays
                 del(obj({{"id", 2}})), del(obj({{"id", 101}})), del(obj({{"id", 999}}))});
  EXPECT_EQ(pg_->lines("SELECT id, name, qty FROM " + t + " ORDER BY id"),
            (std::vector<std::string>{"1|a2|10", "3|c|7", "100|updated|1"}));
  EXPECT_EQ(s->stats()->rows_deleted.load(), 2);
  EXPECT_EQ(s->stats()->failed.load(), 0);
  EXPECT_GE(s->stats()->batches.load(), 4);
}

TEST_F(PostgresUpsertSinkTest, ReplayingTheSameRecordsIsIdempotent) {
  const std::string t = table("replay");
  pg_->exec("CREATE TABLE " + t + " (id bigint PRIMARY KEY, v text)");
  std::vector<Value> records;
  for (int i = 0; i < 500; ++i)
    records.push_back(i % 7 == 6 ? del(obj({{"id", i - 3}})) : obj({{"id", i}, {"v", "v" + std::to_string(i)}}));
  auto s = sink(t, {"id"}).batch_size(64).build();
  write_all(*s, records);
  const auto first = pg_->lines("SELECT id, v FROM " + t + " ORDER BY id");
  write_all(*s, records);  // a restore replays everything since the checkpoint
  write_all(*s, records);
  EXPECT_EQ(pg_->lines("SELECT id, v FROM " + t + " ORDER BY id"), first);
  // Deleted: every i % 7 == 6 (replaced by its delete) and every i % 7 == 3 below 497 (deleted by i + 3).
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), std::to_string(500 - 71 - 71));
}

TEST_F(PostgresUpsertSinkTest, CollapsesABatchPerKeyKeepingTheLastWrite) {
  const std::string t = table("collapse");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, a text DEFAULT 'da', b text DEFAULT 'db')");
  pg_->exec("INSERT INTO " + t + " VALUES (3, 'old3', 'old3'), (4, 'old4', 'old4')");
  auto s = sink(t, {"id"}).batch_size(1000).build();
  write_all(*s, {
                    obj({{"id", 1}, {"a", "1"}}),
                    obj({{"id", 1}, {"a", "2"}}),
                    obj({{"id", 1}, {"a", "3"}}),
                    // partial rows merge: a from the first, b from the second
                    obj({{"id", 2}, {"a", "x"}}),
                    obj({{"id", 2}, {"b", "y"}}),
                    // delete then insert: the old b is gone (default), not kept
                    del(obj({{"id", 3}})),
                    obj({{"id", 3}, {"a", "new3"}}),
                    // insert then delete: gone
                    obj({{"id", 4}, {"a", "x"}}),
                    del(obj({{"id", 4}})),
                    obj({{"id", 5}, {"a", "keep"}}),
                    del(obj({{"id", 5}})),
                    obj({{"id", 5}, {"a", "back"}}),
                });
  EXPECT_EQ(pg_->lines("SELECT id, a, b FROM " + t + " ORDER BY id"),
            (std::vector<std::string>{"1|3|db", "2|x|y", "3|new3|db", "5|back|db"}));
  EXPECT_EQ(s->stats()->batches.load(), 1);
  EXPECT_EQ(s->stats()->rows_upserted.load(), 4);  // one row per key
}

TEST_F(PostgresUpsertSinkTest, CompositeKeys) {
  const std::string t = table("comp");
  pg_->exec("CREATE TABLE " + t + " (tenant text, id int, v int, extra text, PRIMARY KEY (tenant, id))");
  auto s = sink(t, {"id", "tenant"}).build();  // key order need not match the constraint's
  write_all(*s, {obj({{"tenant", "a"}, {"id", 1}, {"v", 1}}), obj({{"tenant", "b"}, {"id", 1}, {"v", 2}}),
                 obj({{"tenant", "a"}, {"id", 2}, {"v", 3}}), obj({{"tenant", "a"}, {"id", 1}, {"v", 4}}),
                 del(obj({{"tenant", "a"}, {"id", 2}})), obj({{"tenant", "c"}, {"id", 9}})});
  EXPECT_EQ(pg_->lines("SELECT tenant, id, v FROM " + t + " ORDER BY tenant, id"),
            (std::vector<std::string>{"a|1|4", "b|1|2", "c|9|<null>"}));
  write_all(*s, {del(obj({{"tenant", "b"}, {"id", 1}})), del(obj({{"tenant", "c"}, {"id", 9}}))});
  EXPECT_EQ(pg_->lines("SELECT tenant, id, v FROM " + t + " ORDER BY tenant, id"), (std::vector<std::string>{"a|1|4"}));
}

TEST_F(PostgresUpsertSinkTest, TypesSurviveInMultiRowStatements) {
  const std::string t = table("types");
  pg_->exec("CREATE TABLE " + t +
            " (id int PRIMARY KEY, amount numeric(38,10), f float8, doc jsonb, j json, at timestamptz, "
            "raw bytea, flag bool, s text, ints int[], tags text[], big bigint, d date)");
  const Value doc = Value::from_json(R"({"k":[1,2.5,"x"],"n":null,"q":"a\"b"})").value();
  Value ts = Value::timestamp_micros(1704164645123456);  // 2024-01-02T03:04:05.123456Z
  std::vector<Value> records;
  records.push_back(obj({{"id", 1},
                         {"amount", Value(Decimal::parse("1234567890123456789012345678.0123456789").value())},
                         {"f", 0.1},
                         {"doc", doc},
                         {"j", Value::array({1, "two"})},
                         {"at", ts},
                         {"raw", Value::bytes(std::string_view("\x00\xff\x10", 3))},
                         {"flag", true},
                         {"s", "it's \"quoted\" \\ and ünïcödé ✓ 🚀"},
                         {"ints", Value::array({1, Value(), 3})},
                         {"tags", Value::array({"a b", "c,d", "e\"f", ""})},
                         {"big", int64_t{9007199254740993}},
                         {"d", "2024-02-29"}}));
  // A second row in the same statement with the other values (type inference over multi-row VALUES).
  records.push_back(obj({{"id", 2},
                         {"amount", Value(Decimal::parse("-0.0000000001").value())},
                         {"f", -1e300},
                         {"doc", Value::array()},
                         {"j", Value::object()},
                         {"at", Value::timestamp_micros(0)},
                         {"raw", Value::bytes(std::string_view())},
                         {"flag", false},
                         {"s", ""},
                         {"ints", Value::array()},
                         {"tags", Value()},
                         {"big", Value()},
                         {"d", Value()}}));
  auto s = sink(t, {"id"}).build();
  write_all(*s, records);
  const auto rows = pg_->lines(
      "SELECT id, amount::text, f, doc::text, j::text, at AT TIME ZONE 'UTC', encode(raw, 'hex'), flag, s, ints, "
      "tags, big, d FROM " +
      t + " ORDER BY id");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0],
            "1|1234567890123456789012345678.0123456789|0.1|"
            R"({"k": [1, 2.5, "x"], "n": null, "q": "a\"b"}|[1,"two"]|2024-01-02 03:04:05.123456|00ff10|t|)"
            "it's \"quoted\" \\ and ünïcödé ✓ 🚀|{1,NULL,3}|{\"a b\",\"c,d\",\"e\\\"f\",\"\"}|9007199254740993|"
            "2024-02-29");
  EXPECT_EQ(rows[1], "2|-0.0000000001|-1e+300|[]|{}|1970-01-01 00:00:00||f||{}|<null>|<null>|<null>");
}

TEST_F(PostgresUpsertSinkTest, BadRecordFailsNamingRecordTableAndPostgresError) {
  const std::string t = table("bad");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, n int, CHECK (n >= 0))");
  auto s = sink(t, {"id"}).build();
  {
    auto w = s->create_writer(ctx_);
    w->write(obj({{"id", 1}, {"n", 1}}), no_ctx_);
    w->write(obj({{"id", 2}, {"n", "not a number"}}), no_ctx_);
    w->write(obj({{"id", 3}, {"n", 3}}), no_ctx_);
    try {
      w->flush(false);
      FAIL() << "flush succeeded";
    } catch (const SluiceException& e) {
      const std::string m = e.error().message();
      EXPECT_EQ(e.error().code(), ErrorCode::kConnector);
      EXPECT_NE(m.find(R"({"id":2,"n":"not a number"})"), std::string::npos) << m;
      EXPECT_NE(m.find(t), std::string::npos) << m;
      EXPECT_NE(m.find("22P02"), std::string::npos) << m;
      EXPECT_NE(m.find("invalid input syntax"), std::string::npos) << m;
    }
    w->close();
  }
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), "0");  // the batch was rolled back
  // Problems found before Postgres sees the row: write() throws.
  auto expect_write_error = [&](const Value& record, const std::string& want) {
    auto w = s->create_writer(ctx_);
    try {
      w->write(record, no_ctx_);
      w->flush(false);
      ADD_FAILURE() << "no error for " << record;
    } catch (const SluiceException& e) {
      EXPECT_NE(e.error().message().find(want), std::string::npos) << e.error().message();
      EXPECT_NE(e.error().message().find(t), std::string::npos) << e.error().message();
    }
  };
  expect_write_error(Value::array({1, 2}), "not an object but a array");
  expect_write_error(obj({{"n", 1}}), "key column 'id' is missing or null");
  expect_write_error(obj({{"id", 5}, {"nope", 1}}), "column 'nope' does not exist");
  expect_write_error(obj({{"id", 5}, {"n", -1}}), "23514");  // check constraint
  expect_write_error(obj({{"id", 5}, {"n", std::string_view("a\0b", 3)}}), "NUL byte");
  EXPECT_EQ(s->stats()->failed.load(), 6);
}

TEST_F(PostgresUpsertSinkTest, BadRecordsGoToTheDeadLetterFileAndTheRestIsWritten) {
  const std::string t = table("dlq");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, n int, at timestamptz)");
  const std::string path = (dir_ / "dead" / "letters.jsonl").string();
  auto s = sink(t, {"id"}).on_bad_record(BadRecordPolicy::kDeadLetter, path).build();
  std::vector<Value> records;
  for (int i = 0; i < 100; ++i)
    records.push_back(obj({{"id", i}, {"n", i}}));
  records[10] = obj({{"id", 10}, {"n", "ten"}});             // 22P02 from Postgres
  records[20] = obj({{"id", 20}, {"n", int64_t{1} << 40}});  // 22003 out of range
  records[30] = obj({{"id", 30}, {"zzz", 1}});               // unknown column, found by write()
  records[40] = obj({{"n", 40}});                            // no key
  records[50] = obj({{"id", 50}, {"at", "yesterday-ish"}});  // 22007
  write_all(*s, records);
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), "95");
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t + " WHERE id IN (10, 20, 30, 40, 50)"), "0");
  EXPECT_EQ(s->stats()->dead_letters.load(), 5);
  EXPECT_EQ(s->stats()->failed.load(), 5);
  std::ifstream in(path);
  std::vector<Value> letters;
  for (std::string line; std::getline(in, line);)
    letters.push_back(Value::from_json(line).value());
  ASSERT_EQ(letters.size(), 5u);
  std::vector<std::string> states;
  for (const auto& l : letters) {
    EXPECT_EQ(l.find("sink")->as_string(), "postgres");
    EXPECT_EQ(l.find("table")->as_string(), t);
    EXPECT_FALSE(l.find("error")->as_string().empty());
    states.push_back(std::string(l.find("sqlstate")->as_string()));
  }
  std::sort(states.begin(), states.end());
  EXPECT_EQ(states, (std::vector<std::string>{"", "", "22003", "22007", "22P02"}));
  EXPECT_EQ(letters[0].find("record")->as_string(), R"({"id":30,"zzz":1})");  // client-side first, at write()
}

// Array elements that an unquoted array literal would misread (a comma, a brace, a quote, a backslash, spaces, the
// text NULL, an empty string) and json/jsonb elements of every JSON kind (a string that looks like a number, like
// null, like an array literal; a JSON array as one element of a 1-D jsonb[]; a 2-D jsonb[][]): each round-trips
// exactly, read back by Postgres itself.
TEST_F(PostgresUpsertSinkTest, ArrayElementsRoundTripExactly) {
  const std::string t = table("arrays");
  pg_->exec("CREATE TABLE " + t +
            " (id int PRIMARY KEY, tags text[], grid text[][], docs jsonb[], js json[], cube jsonb[][], doc jsonb, "
            "nums numeric[])");
  const std::vector<Value> nasty = {"a,b",  "{x}", "}",  "{",    "q\"uote", "back\\slash", " sp ", "NULL",
                                    "null", "",    "é😀", "\\\"", Value(),   "tab\there",   "\"",   "a b,c{d}\\e"};
  const Value json_elements = Value::array({
      "x,y {z} \"q\" \\ NULL",  // a JSON string with every special character
      "123",                    // a string, not the number 123
      "null",                   // a string, not null
      "{1,2}",                  // a string, not an array literal
      int64_t{42}, 2.5, true,   // numbers and booleans
      Value(Decimal::parse("12345678901234567890.123").value()),
      Value::array({1, "a,b", Value::array()}),  // a JSON array: one element of the 1-D column
      Value::object({{"k", "v\"}"}, {"n", Value()}}),
      Value(),  // SQL NULL element
  });
  std::vector<Value> records;
  records.push_back(obj({{"id", 1},
                         {"tags", Value::array(std::vector<Value>(nasty))},
                         {"grid", Value::array({Value::array({"a,b", "NULL"}), Value::array({Value(), "}{"})})},
                         {"docs", json_elements},
                         {"js", json_elements},
                         {"cube", Value::array({Value::array({1, "x"}), Value::array({Value::object(), "[1]"})})},
                         {"doc", "just a string"},
                         {"nums", Value::array({Value(Decimal::parse("1.50").value()), Value(), int64_t{-7}})}}));
  auto s = sink(t, {"id"}).build();
  write_all(*s, records);
  EXPECT_EQ(s->stats()->failed.load(), 0);
  // Postgres's own reading of what was written, element by element.
  std::vector<std::string> want_tags;
  for (const Value& v : nasty)
    want_tags.push_back(v.is_null() ? "<null>" : std::string(v.as_string()));
  std::vector<std::string> got_tags;
  for (auto& row : pg_->rows("SELECT e FROM " + t + ", unnest(tags) WITH ORDINALITY AS u(e, i) ORDER BY i"))
    got_tags.push_back(row[0]);
  EXPECT_EQ(got_tags, want_tags);
  EXPECT_EQ(pg_->scalar("SELECT array_length(tags, 1) = " + std::to_string(nasty.size()) +
                        " AND tags[13] IS NULL AND tags[8] = 'NULL' FROM " + t),
            "t");
  EXPECT_EQ(pg_->scalar("SELECT grid::text FROM " + t), R"({{"a,b","NULL"},{NULL,"}{"}})");
  EXPECT_EQ(pg_->scalar("SELECT array_ndims(docs) || ' ' || array_length(docs, 1) FROM " + t), "1 11");
  const std::vector<std::string> want_docs = {R"("x,y {z} \"q\" \\ NULL")",
                                              R"("123")",
                                              R"("null")",
                                              R"("{1,2}")",
                                              "42",
                                              "2.5",
                                              "true",
                                              "12345678901234567890.123",
                                              R"([1, "a,b", []])",
                                              R"({"k": "v\"}", "n": null})",
                                              "<null>"};
  for (const char* col : {"docs", "js"}) {
    std::vector<std::string> got;
    for (auto& row : pg_->rows(std::string("SELECT e::jsonb::text FROM ") + t + ", unnest(" + col +
                               ") WITH ORDINALITY AS u(e, i) ORDER BY i"))
      got.push_back(row[0]);
    EXPECT_EQ(got, want_docs) << col;
  }
  EXPECT_EQ(pg_->scalar("SELECT jsonb_typeof(docs[2]) || ' ' || jsonb_typeof(docs[3]) FROM " + t), "string string");
  EXPECT_EQ(pg_->scalar("SELECT cube::text FROM " + t), R"({{1,"\"x\""},{"{}","\"[1]\""}})");
  EXPECT_EQ(pg_->scalar("SELECT doc::text FROM " + t), R"("just a string")");
  EXPECT_EQ(pg_->scalar("SELECT nums::text FROM " + t), "{1.50,NULL,-7}");
}

// Values a column's type would alter without an error (Postgres rounds on assignment) are bad records, never
// rounded: decimals beyond a numeric's scale, digits a float4 / float8 cannot hold, fractional seconds beyond a
// timestamp's precision, a time of day for a date (also in arrays and through a domain). Values the type holds
// exactly are written.
TEST_F(PostgresUpsertSinkTest, ValuesTheColumnWouldRoundAreBadRecords) {
  const std::string t = table("exact");
  pg_->exec("CREATE DOMAIN " + t + "_money2 AS numeric(12,2)");
  pg_->exec("CREATE TABLE " + t +
            " (id int PRIMARY KEY, n numeric(10,2), h numeric(5,-2), r real, f float8, ts timestamp(3), "
            "tz timestamptz(0), d date, na numeric(6,1)[], m " +
            t + "_money2)");
  const std::string path = (dir_ / "dead" / "exact.jsonl").string();
  auto s = sink(t, {"id"}).on_bad_record(BadRecordPolicy::kDeadLetter, path).build();
  auto dec = [](const char* text) { return Value(Decimal::parse(text).value()); };
  const int64_t day = 86'400'000'000;
  std::vector<Value> good = {
      obj({{"id", 1}, {"n", dec("1.50")}, {"h", int64_t{1200}}, {"r", 0.1}, {"f", int64_t{9007199254740992}}}),
      obj({{"id", 2},
           {"n", dec("1.230")},
           {"r", -3.4028234663852886e+38},
           {"f", dec("0.1")},
           {"d", Value::timestamp_micros(19'000 * day)}}),
      obj({{"id", 3},
           {"ts", Value::timestamp_micros(1'704'164'645'123'000)},
           {"tz", Value::timestamp_micros(1'704'164'645'000'000)}}),
      obj({{"id", 4}, {"na", Value::array({dec("1.5"), Value(), int64_t{3}})}, {"m", dec("10.25")}, {"r", 1.0}}),
      obj({{"id", 5},
           {"n", 0.25},
           {"r", std::nan("")},
           {"f", -0.0},
           {"d", Value::timestamp_micros(kTimestampInfinity)}}),
  };
  struct Bad {
    Value record;
    std::string reason;
  };
  std::vector<Bad> bad = {
      {obj({{"id", 10}, {"n", dec("1.239")}}), "more decimal places than the column's numeric scale 2"},
      {obj({{"id", 11}, {"n", 0.125}}), "numeric scale 2"},
      {obj({{"id", 12}, {"h", int64_t{1250}}}), "numeric scale -2"},
      {obj({{"id", 13}, {"r", 0.123456789012}}), "no exact float4 (real) value: Postgres would store 0.12345679"},
      {obj({{"id", 14}, {"r", int64_t{16777217}}}), "no exact float4"},
      {obj({{"id", 15}, {"f", int64_t{9007199254740993}}}), "no exact float8 (double precision) value"},
      {obj({{"id", 16}, {"f", dec("0.1000000000000000000001")}}), "no exact float8"},
      {obj({{"id", 17}, {"ts", Value::timestamp_micros(1'704'164'645'123'456)}}), "the column's precision 3"},
      {obj({{"id", 18}, {"tz", Value::timestamp_micros(1'704'164'645'000'001)}}), "the column's precision 0"},
      {obj({{"id", 19}, {"d", Value::timestamp_micros(19'000 * day + 1)}}), "has a time of day"},
      {obj({{"id", 20}, {"na", Value::array({dec("1.5"), dec("2.25")})}}), "numeric scale 1"},
      {obj({{"id", 21}, {"m", dec("10.255")}}), "numeric scale 2"},
  };
  std::vector<Value> records = good;
  for (const Bad& b : bad)
    records.push_back(b.record);
  write_all(*s, records);
  EXPECT_EQ(pg_->lines("SELECT id, n, h, r, f, ts, tz AT TIME ZONE 'UTC', d, na, m FROM " + t + " ORDER BY id"),
            (std::vector<std::string>{
                "1|1.50|1200|0.1|9.007199254740992e+15|<null>|<null>|<null>|<null>|<null>",
                "2|1.23|<null>|-3.4028235e+38|0.1|<null>|<null>|2022-01-08|<null>|<null>",
                "3|<null>|<null>|<null>|<null>|2024-01-02 03:04:05.123|2024-01-02 03:04:05|<null>|<null>|<null>",
                "4|<null>|<null>|1|<null>|<null>|<null>|<null>|{1.5,NULL,3.0}|10.25",
                "5|0.25|<null>|NaN|-0|<null>|<null>|infinity|<null>|<null>",
            }));
  std::ifstream in(path);
  std::map<int64_t, std::string> errors;
  for (std::string line; std::getline(in, line);) {
    Value l = Value::from_json(line).value();
    Value record = Value::from_json(l.find("record")->as_string()).value();
    errors[record.find("id")->as_int64()] = std::string(l.find("error")->as_string());
  }
  ASSERT_EQ(errors.size(), bad.size());
  for (const Bad& b : bad) {
    const int64_t id = b.record.find("id")->as_int64();
    EXPECT_NE(errors[id].find(b.reason), std::string::npos) << "record " << id << ": " << errors[id];
  }
  EXPECT_EQ(s->stats()->dead_letters.load(), static_cast<int64_t>(bad.size()));
}

TEST_F(PostgresUpsertSinkTest, MissingTableOrKeyWithoutUniqueIndexFailsAtOpen) {
  auto open_error = [&](const std::string& t, std::vector<std::string> keys) -> Error {
    auto s = sink(t, std::move(keys)).build();
    try {
      s->create_writer(ctx_);
    } catch (const SluiceException& e) {
      return e.error();
    }
    return Error(ErrorCode::kOk, "no error");
  };
  Error e = open_error(table("nope"), {"id"});
  EXPECT_EQ(e.code(), ErrorCode::kConfiguration);
  EXPECT_NE(e.message().find("does not exist"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find(table("nope")), std::string::npos) << e.message();

  const std::string t = table("nokey");
  pg_->exec("CREATE TABLE " + t + " (id int, v int, w int)");
  pg_->exec("CREATE UNIQUE INDEX ON " + t + " (id, v)");
  pg_->exec("CREATE UNIQUE INDEX ON " + t + " (w) WHERE w > 0");  // partial: no arbiter
  e = open_error(t, {"id"});
  EXPECT_EQ(e.code(), ErrorCode::kConfiguration);
  EXPECT_NE(e.message().find("(id) of table '" + t + "' are not the columns"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("(id, v)"), std::string::npos) << e.message();
  e = open_error(t, {"w"});
  EXPECT_EQ(e.code(), ErrorCode::kConfiguration) << e.message();
  e = open_error(t, {"id", "missing"});
  EXPECT_NE(e.message().find("'missing' do not exist"), std::string::npos) << e.message();
  // The unique index's columns work, in any order.
  auto s = sink(t, {"v", "id"}).build();
  write_all(*s, {obj({{"id", 1}, {"v", 2}, {"w", 3}}), obj({{"id", 1}, {"v", 2}, {"w", 4}})});
  EXPECT_EQ(pg_->lines("SELECT id, v, w FROM " + t), (std::vector<std::string>{"1|2|4"}));
  // Configuration errors of the builder.
  EXPECT_FALSE(PostgresUpsertSink::builder().conninfo(url_).table(t).try_build().ok());
  EXPECT_FALSE(sink(t, {"id"}).batch_size(0).try_build().ok());
  EXPECT_FALSE(sink(t, {"id"}).on_bad_record(BadRecordPolicy::kDeadLetter).try_build().ok());
}

TEST_F(PostgresUpsertSinkTest, FlushIntervalWritesAtTheNextWrite) {
  const std::string t = table("interval");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY)");
  auto s = sink(t, {"id"}).flush_interval(1000ms).build();
  auto w = s->create_writer(ctx_);
  w->write(obj({{"id", 1}}), no_ctx_);
  ctx_.manual_clock().advance(999);
  w->write(obj({{"id", 2}}), no_ctx_);
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), "0");
  ctx_.manual_clock().advance(1);
  w->write(obj({{"id", 3}}), no_ctx_);  // writes 1 and 2 first
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), "2");
  w->flush(true);
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), "3");
  w->close();
}

// flush-interval runs on a processing-time timer of the sink's task: the rows of an idle stream are written
// flush-interval after they were buffered, without another record and without a checkpoint (issue 14; before,
// they waited for the next write).
TEST_F(PostgresUpsertSinkTest, FlushIntervalWritesAnIdleStreamOnATimer) {
  const std::string t = table("idle");
  pg_->exec("CREATE TABLE " + t + " (id bigint PRIMARY KEY)");
  // One record at once, the next one an hour later: an idle stream.
  auto source = std::make_shared<DataGeneratorSource<Value>>(
      [](int64_t i) {
        return obj({{"id", i}});
      },
      DataGeneratorSource<Value>::kUnbounded, 1.0 / 3600);
  auto s = PostgresUpsertSink::builder().conninfo(url_).table(t).key_columns({"id"}).flush_interval(200ms).build();
  Configuration c;
  c.set(options::kParallelism, 1);  // no checkpoints: nothing but the timer flushes
  StreamEnvironment env(c);
  env.from_source(source, "gen").uid("gen").sink_to(s).uid("pg");
  JobClient client = env.execute_async("pg-upsert-idle");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(sluice::testing::poll_until([&] { return pg_->scalar("SELECT count(*) FROM " + t) == "1"; },
                                          std::chrono::seconds(5)))
      << "the buffered row was not written within 5 s on an idle stream";
  const auto written_after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  EXPECT_EQ(client.status(), JobStatus::kRunning);
  client.cancel();
  client.wait();
  std::printf("idle row written %lld ms after the job started (flush-interval 200 ms)\n",
              static_cast<long long>(written_after.count()));
}

TEST_F(PostgresUpsertSinkTest, ReconnectsAfterItsBackendIsTerminated) {
  const std::string t = table("retry");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, v int)");
  const std::string app = name_.substr(0, 60);
  auto s = PostgresUpsertSink::builder()
               .conninfo(url_ + (url_.find('?') == std::string::npos ? "?" : "&") + "application_name=" + app)
               .table(t)
               .key_columns({"id"})
               .batch_size(100)
               .retries(5, 10ms, 100ms)
               .build();
  auto w = s->create_writer(ctx_);
  auto backend_count = [&] {
    return pg_->scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'");
  };
  ASSERT_EQ(backend_count(), "1");
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 250; ++i)
      w->write(obj({{"id", round * 1000 + i}, {"v", round}}), no_ctx_);
    w->flush(false);
    pg_->exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '" + app + "'");
    ASSERT_TRUE(eventually([&] { return backend_count() == "0"; }));
  }
  w->write(obj({{"id", 5000}, {"v", 9}}), no_ctx_);
  w->flush(true);
  w->close();
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), std::to_string(3 * 250 + 1));
  EXPECT_GE(s->stats()->retries.load(), 3);
}

TEST_F(PostgresUpsertSinkTest, RetriesABatchWhoseBackendIsTerminatedInsideItsTransaction) {
  const std::string t = table("midtx");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, v int)");
  pg_->exec("INSERT INTO " + t + " VALUES (1, 0)");
  const std::string app = name_.substr(0, 60);
  auto s = PostgresUpsertSink::builder()
               .conninfo(url_ + (url_.find('?') == std::string::npos ? "?" : "&") + "application_name=" + app)
               .table(t)
               .key_columns({"id"})
               .retries(5, 10ms, 100ms)
               .build();
  auto w = s->create_writer(ctx_);
  for (int i = 0; i < 100; ++i)
    w->write(obj({{"id", i}, {"v", 1}}), no_ctx_);
  // Hold row 1 so that the sink's upsert blocks inside its transaction.
  sluice::testing::PgClient locker(url_);
  locker.exec("BEGIN");
  locker.exec("SELECT * FROM " + t + " WHERE id = 1 FOR UPDATE");
  std::string flush_error;
  std::thread flusher([&] {
    try {
      w->flush(false);
    } catch (const SluiceException& e) {
      flush_error = e.what();
    }
  });
  auto blocked_pid = [&] {
    return pg_->scalar("SELECT pid FROM pg_stat_activity WHERE application_name = '" + app +
                       "' AND wait_event_type = 'Lock'");
  };
  std::string first;
  EXPECT_TRUE(eventually([&] { return !(first = blocked_pid()).empty(); }));
  pg_->exec("SELECT pg_terminate_backend(" + first + ")");
  // The sink reconnects, retries the batch and blocks again on the lock, in a new backend.
  EXPECT_TRUE(eventually([&] {
    const std::string pid = blocked_pid();
    return !pid.empty() && pid != first;
  }));
  locker.exec("COMMIT");
  flusher.join();
  EXPECT_EQ(flush_error, "");
  w->close();
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t + " WHERE v = 1"), "100");
  EXPECT_GE(s->stats()->retries.load(), 1);
  EXPECT_EQ(s->stats()->batches.load(), 1);
}

TEST_F(PostgresUpsertSinkTest, RetriesABatchThatLostADeadlock) {
  const std::string t = table("deadlock");
  pg_->exec("CREATE TABLE " + t + " (id int PRIMARY KEY, v int)");
  pg_->exec("INSERT INTO " + t + " VALUES (1, 0), (2, 0)");
  const std::string app = name_.substr(0, 60);
  auto s = PostgresUpsertSink::builder()
               .conninfo(url_ + (url_.find('?') == std::string::npos ? "?" : "&") + "application_name=" + app)
               .table(t)
               .key_columns({"id"})
               .retries(5, 10ms, 100ms)
               .build();
  auto w = s->create_writer(ctx_);
  w->write(obj({{"id", 1}, {"v", 1}}), no_ctx_);
  w->write(obj({{"id", 2}, {"v", 1}}), no_ctx_);
  sluice::testing::PgClient locker(url_);
  locker.exec("SET deadlock_timeout = '60s'");  // the sink's backend (1 s) detects the deadlock and loses
  locker.exec("BEGIN");
  locker.exec("SELECT * FROM " + t + " WHERE id = 2 FOR UPDATE");
  std::string flush_error;
  std::thread flusher([&] {
    try {
      w->flush(false);
    } catch (const SluiceException& e) {
      flush_error = e.what();
    }
  });
  // The sink's upsert has locked row 1 and waits for row 2; taking row 1 closes the cycle.
  EXPECT_TRUE(eventually([&] {
    return pg_->scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                       "' AND wait_event_type = 'Lock'") == "1";
  }));
  locker.exec("UPDATE " + t + " SET v = 5 WHERE id = 1");  // returns once the sink's transaction is aborted
  locker.exec("COMMIT");
  flusher.join();
  EXPECT_EQ(flush_error, "");
  w->close();
  EXPECT_EQ(pg_->lines("SELECT id, v FROM " + t + " ORDER BY id"), (std::vector<std::string>{"1|1", "2|1"}));
  EXPECT_GE(s->stats()->retries.load(), 1);
}

TEST_F(PostgresUpsertSinkTest, CheckpointedJobWrites20kRecords) {
  const std::string t = table("job");
  pg_->exec("CREATE TABLE " + t + " (id bigint PRIMARY KEY, version int, payload jsonb, at timestamptz)");
  constexpr int64_t kRecords = 20'000;
  // Record i updates key i / 4 (version i % 4); a subtask's split never cuts a key's four records.
  auto source = std::make_shared<DataGeneratorSource<Value>>(
      [](int64_t i) {
        return obj({{"id", i / 4},
                    {"version", i % 4},
                    {"payload", obj({{"i", i}, {"s", "r" + std::to_string(i)}})},
                    {"at", Value::timestamp_micros(i * 1000)}});
      },
      kRecords, 40'000);  // rate-limited so that checkpoints happen while it runs (about 0.5 s)
  auto s = PostgresUpsertSink::builder().conninfo(url_).table(t).key_columns({"id"}).batch_size(500).build();
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set_string(std::string(options::kCheckpointInterval.key), "100ms");
  c.set(options::kCheckpointDir, "file://" + (dir_ / "checkpoints").string());
  StreamEnvironment env(c);
  env.from_source(source, "gen").uid("gen").sink_to(s).uid("pg");
  JobResult r = env.execute("pg-upsert-job");
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_GE(r.completed_checkpoints, 1);
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t), std::to_string(kRecords / 4));
  EXPECT_EQ(pg_->scalar("SELECT count(*) FROM " + t +
                        " WHERE version <> 3 OR (payload->>'i')::bigint <> id * 4 + 3 OR "
                        "at <> 'epoch'::timestamptz + (id * 4 + 3) * interval '1 millisecond'"),
            "0");
  EXPECT_EQ(s->stats()->failed.load(), 0);
  EXPECT_GE(s->stats()->rows_upserted.load(), kRecords / 4);
}

}  // namespace
}  // namespace sluice
