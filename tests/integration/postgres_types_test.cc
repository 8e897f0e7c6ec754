// Every Postgres type the CDC source maps, round-tripped through a real Postgres 15 (scripts/services/postgres):
//  * rows at the ends of each type's range (int2/4/8 and oid limits, float4/float8 limits and subnormals, NaN,
//    ±Infinity and -0, 38-digit numerics and numeric NaN/±Infinity, 4713 BC and the year 294247, 'infinity'
//    and '-infinity' dates and timestamps, empty and Unicode strings, bytea, uuid, json/jsonb, arrays with
//    NULLs and quotes, and the types kept as text: time, timetz, interval, enum, money, inet, "char", name,
//    arrays of unmapped types) are read by the snapshot and again by the stream;
//  * each decoded value is written back as the Postgres upsert sink writes it (append_text_parameter) and the
//    server compares it with the stored one: value -> Sluice -> Postgres gives the same value, in text form
//    (so 1.50 stays 1.50, -0 stays -0 and 'infinity' stays 'infinity');
//  * no non-NULL value becomes JSON null; the specials have a fixed JSON text ("NaN", "Infinity", "infinity");
//  * dates and timestamps beyond the Sluice range (after 294247-01-10T04:00:54.775806Z) are not wrapped
//    around: the change goes to the dead-letter file naming table, LSN and column (snapshot and stream).
// Run: scripts/services/run-with postgres -- build/<dir>/tests/postgres_types_test
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "integration/test_util/change_events.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/postgres.h"
#include "integration/test_util/services.h"
#include "sluice/api/sink.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"
#include "sluice/connectors/postgres/postgres_upsert_sink.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cdc::ChangeEvent;
using cdc::ChangeOp;

constexpr auto kDeadline = 60s;

using Received = sluice::testing::ReceivedEvents;
using sluice::testing::receiving_sink;

/// A column: its name, its SQL type (as declared, also used to cast the written-back text) and whether the
/// type is an array (the upsert sink writes Value arrays as array literals then).
struct Column {
  std::string name;
  std::string type;
  bool array = false;
};

class PostgresTypesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = sluice::testing::require_service("postgres").get("POSTGRES_URL");
    if (url_.empty()) return;
    name_ = sluice::testing::test_object_name("ty", 30);
    dir_ = fs::temp_directory_path() / ("sluice-pgtypes-" + name_);
    fs::create_directories(dir_);
    pg_ = std::make_unique<sluice::testing::PgClient>(url_);
    conn_ = PQconnectdb(url_.c_str());
    ASSERT_EQ(PQstatus(conn_), CONNECTION_OK) << PQerrorMessage(conn_);
    // The session settings of the source's own connections, so both sides print values alike.
    exec_raw("SET DateStyle = ISO; SET TimeZone = UTC; SET extra_float_digits = 3; SET IntervalStyle = postgres");
  }
  void TearDown() override {
    if (conn_ != nullptr) PQfinish(conn_);
    if (!pg_) return;
    sluice::testing::drop_slot_and_publication(*pg_, name_, kDeadline);
    pg_->exec("DROP TABLE IF EXISTS " + name_ + "_t");
    pg_->exec("DROP TYPE IF EXISTS " + name_ + "_mood");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void exec_raw(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    EXPECT_TRUE(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK)
        << sql << ": " << PQresultErrorMessage(r);
    PQclear(r);
  }

  std::string table() const { return name_ + "_t"; }

  PostgresCdcSourceBuilder source() const {
    return PostgresCdcSource::builder()
        .conninfo(url_)
        .tables({table()})
        .slot_name(name_)
        .publication_name(name_)
        .status_interval(200ms);
  }

  Configuration config() const {
    Configuration c;
    c.set(options::kParallelism, 1);
    c.set_string(std::string(options::kCheckpointInterval.key), "3600s");
    c.set(options::kCheckpointDir, "file://" + (dir_ / "checkpoints").string());
    c.set(options::kRestartStrategy, std::string("none"));
    return c;
  }

  bool slot_active() {
    return sluice::testing::poll_until(
        [&] {
          return pg_->scalar(
                     "SELECT count(*) FROM pg_replication_slots WHERE active AND confirmed_flush_lsn IS NOT NULL "
                     "AND slot_name = '" +
                     name_ + "'") == "1";
        },
        kDeadline);
  }

  /// Writes `v` back as the upsert sink would and asks the server whether it equals the stored value of
  /// `col` in row `id`; returns "" when equal, else what differs.
  // The column's type as the upsert sink reads it from the catalog (the declared numeric(p,s) included).
  static postgres::PgColumnType column_type(const Column& col) {
    std::string base = col.type;
    int typmod = -1;
    if (base.ends_with("[]")) base.resize(base.size() - 2);
    if (const size_t p = base.find('('); p != std::string::npos) {
      int precision = 0, scale = 0;
      if (std::sscanf(base.c_str() + p, "(%d,%d)", &precision, &scale) == 2) typmod = ((precision << 16) | scale) + 4;
      base.resize(p);
    }
    return postgres::PgColumnType::from_catalog(base, typmod, col.array, 1);
  }

  std::string round_trip(const Column& col, int64_t id, const Value& v) {
    std::string param;
    const Status st = postgres::append_text_parameter(v, column_type(col), param);
    if (!st.ok()) return "append_text_parameter: " + st.error().message();
    // json and jsonb compare as jsonb: the same document, whitespace, key order and a number's spelling (2.50
    // vs 2.5, the same JSON number) aside; json has no equality operator of its own. Every other type compares
    // by its text, which is stricter than = (numeric 1.50 vs 1.5, float -0 vs 0).
    const bool json = col.type == "json" || col.type == "jsonb";
    const std::string cmp =
        json ? "(" + col.name + ")::jsonb = ($1::jsonb)" : "(" + col.name + ")::text = ($1::" + col.type + ")::text";
    const std::string sql =
        "SELECT " + cmp + ", (" + col.name + ")::text, ($1::" + col.type + ")::text FROM " + table() + " WHERE id = $2";
    const std::string ids = std::to_string(id);
    const char* params[2] = {param.c_str(), ids.c_str()};
    PGresult* r = PQexecParams(conn_, sql.c_str(), 2, nullptr, params, nullptr, nullptr, 0);
    std::string out;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      out = "the server refused the written-back text '" + param + "': " + PQresultErrorMessage(r);
    } else if (PQntuples(r) != 1) {
      out = "row not found";
    } else if (std::string_view(PQgetvalue(r, 0, 0)) != "t") {
      out = "stored " + std::string(PQgetvalue(r, 0, 1)) + ", written back as '" + param + "' reads " +
            PQgetvalue(r, 0, 2);
    }
    PQclear(r);
    return out;
  }

  std::string url_;
  std::string name_;
  fs::path dir_;
  std::unique_ptr<sluice::testing::PgClient> pg_;
  PGconn* conn_ = nullptr;
};

TEST_F(PostgresTypesTest, EveryMappedTypeRoundTripsWithItsExtremesThroughSnapshotAndStream) {
  const std::string mood = name_ + "_mood";
  pg_->exec("CREATE TYPE " + mood + " AS ENUM ('sad', 'ok', 'happy ü')");
  const std::vector<Column> cols = {
      {"b", "bool"},
      {"i2", "int2"},
      {"i4", "int4"},
      {"i8", "int8"},
      {"o", "oid"},
      {"f4", "float4"},
      {"f8", "float8"},
      {"n", "numeric"},
      {"n2", "numeric(10,4)"},
      {"t", "text"},
      {"vc", "varchar(12)"},
      {"bc", "char(5)"},
      {"nm", "name"},
      {"ch", "\"char\""},
      {"by", "bytea"},
      {"d", "date"},
      {"ts", "timestamp"},
      {"tz", "timestamptz"},
      {"tm", "time"},
      {"ttz", "timetz"},
      {"iv", "interval"},
      {"u", "uuid"},
      {"j", "json"},
      {"jb", "jsonb"},
      {"e", mood},
      {"m", "money"},
      {"ip", "inet"},
      {"ia", "int4[]", true},
      {"ia2", "int4[]", true},
      {"i8a", "int8[]", true},
      {"ta", "text[]", true},
      {"na", "numeric[]", true},
      {"fa", "float8[]", true},
      {"f4a", "float4[]", true},
      {"da", "date[]", true},
      {"tsa", "timestamp[]", true},
      {"tza", "timestamptz[]", true},
      {"ba", "bool[]", true},
      {"bya", "bytea[]", true},
      {"ua", "uuid[]", true},
      {"jba", "jsonb[]", true},
      {"vca", "varchar[]", true},
      {"tma", "time[]", true},
      {"ea", mood + "[]", true},
  };
  // One row per entry: column name -> SQL literal (absent: NULL).
  using Row = std::map<std::string, std::string>;
  const std::vector<Row> rows = {
      // Lower ends.
      {{"b", "false"},
       {"i2", "-32768"},
       {"i4", "-2147483648"},
       {"i8", "-9223372036854775808"},
       {"o", "0"},
       {"f4", "'-3.4028235e+38'"},
       {"f8", "'-1.7976931348623157e+308'"},
       {"n", "-99999999999999999999999999999999999999"},
       {"n2", "-999999.9999"},
       {"t", "''"},
       {"vc", "''"},
       {"bc", "''"},
       {"nm", "''"},
       {"ch", "''"},
       {"by", "'\\x'"},
       {"d", "'4714-11-24 BC'"},
       {"ts", "'4714-11-24 00:00:00 BC'"},
       {"tz", "'4714-11-24 00:00:00+00 BC'"},
       {"tm", "'00:00:00'"},
       {"ttz", "'00:00:00+15:59'"},
       {"iv", "'-178000000 years'"},
       {"u", "'00000000-0000-0000-0000-000000000000'"},
       {"j", "'{}'"},
       {"jb", "'[]'"},
       {"e", "'sad'"},
       {"m", "'-92233720368547758.08'"},
       {"ip", "'0.0.0.0/0'"},
       {"ia", "'{}'"},
       {"ia2", "'{{1,2},{3,NULL}}'"},
       {"i8a", "'{-9223372036854775808,9223372036854775807}'"},
       {"ta", "'{}'"},
       {"na", "'{}'"},
       {"fa", "'{}'"},
       {"f4a", "'{}'"},
       {"da", "'{\"4714-11-24 BC\"}'"},
       {"tsa", "'{}'"},
       {"tza", "'{}'"},
       {"ba", "'{}'"},
       {"bya", "'{}'"},
       {"ua", "'{}'"},
       {"jba", "'{}'"},
       {"vca", "'{}'"},
       {"tma", "'{}'"},
       {"ea", "'{}'"}},
      // Upper ends, Unicode, quoting.
      {{"b", "true"},
       {"i2", "32767"},
       {"i4", "2147483647"},
       {"i8", "9223372036854775807"},
       {"o", "4294967295"},
       {"f4", "'3.4028235e+38'"},
       {"f8", "'1.7976931348623157e+308'"},
       {"n", "12345678901234567890.123456789012345678"},
       {"n2", "999999.9999"},
       {"t", "E'Zo\\u00eb \\U0001F600 \"q\" \\\\ tab\\there\\nline'"},
       {"vc", "'ünïcødé✓'"},
       {"bc", "'ab'"},
       {"nm", "'a name'"},
       {"ch", "'z'"},
       {"by", "'\\x00ff7f80'"},
       {"d", "'294247-01-10'"},
       {"ts", "'294247-01-10 04:00:54.775806'"},
       {"tz", "'294247-01-10 04:00:54.775806+00'"},
       {"tm", "'24:00:00'"},
       {"ttz", "'24:00:00-15:59'"},
       {"iv", "'178000000 years 11 mons 30 days 23:59:59.999999'"},
       {"u", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"},
       {"j", "'{\"a\": [1, 2.5, \"x\", null, true], \"ü\": {\"n\": -1e-5, \"big\": 123456789012345678901234567890}}'"},
       {"jb", "'{\"a\": [1, 2.50, \"x\", null, false], \"😀\": {\"n\": 1e-400, \"p\": 12345678901234567890.123}}'"},
       {"e", "'happy ü'"},
       {"m", "'92233720368547758.07'"},
       {"ip", "'2001:db8::1/128'"},
       {"ia", "'{2147483647,-2147483648,NULL}'"},
       {"ia2", "'{{-1,0},{NULL,NULL}}'"},
       {"i8a", "'{NULL}'"},
       {"ta", "'{\"\",\"a,b\",\"q\\\"uote\",\"back\\\\slash\",NULL,\"NULL\",\"ü 😀\",\" sp \",\"{x}\",\"}\"}'"},
       {"na", "'{1.50,-0.001,NaN,Infinity,-Infinity,99999999999999999999999999999999999999}'"},
       {"fa", "'{NaN,Infinity,-Infinity,-0,5e-324,1.7976931348623157e+308}'"},
       {"f4a", "'{NaN,-Infinity,1e-45,0.1}'"},
       {"da", "'{infinity,-infinity,2024-02-29,294247-01-10}'"},
       {"tsa", "'{\"2024-01-02 03:04:05.123456\",infinity,\"0001-01-01 00:00:00 BC\"}'"},
       {"tza", "'{\"2024-01-02 03:04:05.123456+00\",-infinity}'"},
       {"ba", "'{t,f,NULL}'"},
       {"bya", "'{\"\\\\x00ff\",NULL,\"\\\\x\"}'"},
       {"ua", "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'"},
       // jsonb elements of every kind: strings that look like a number, null or an array literal; a JSON array
       // (one element of this 1-D array); NULL.
       {"jba",
        R"(ARRAY['{"a": 1}'::jsonb, '{"b": [2.5, "x"]}'::jsonb, '"x,y {z} \"q\" \\ NULL"'::jsonb, '"123"'::jsonb, )"
        R"('"null"'::jsonb, '"{1,2}"'::jsonb, '[1, "a,b", []]'::jsonb, '42'::jsonb, 'true'::jsonb, NULL])"},
       {"vca", "'{\"\",é}'"},
       {"tma", "'{00:00:00,24:00:00,NULL}'"},
       {"ea", "'{sad,\"happy ü\"}'"}},
      // The specials.
      {{"f4", "'NaN'"},
       {"f8", "'Infinity'"},
       {"n", "'NaN'"},
       {"d", "'infinity'"},
       {"ts", "'-infinity'"},
       {"tz", "'infinity'"}},
      {{"f4", "'-Infinity'"},
       {"f8", "'-0'"},
       {"n", "'Infinity'"},
       {"n2", "0"},
       {"d", "'-infinity'"},
       {"ts", "'infinity'"},
       {"tz", "'-infinity'"}},
      {{"f4", "'1e-45'"},
       {"f8", "'NaN'"},
       {"n", "'-Infinity'"},
       {"d", "'0001-01-01 BC'"},
       {"ts", "'1970-01-01 00:00:00'"},
       {"tz", "'1969-12-31 23:59:59.999999+00'"}},
      {{"f4", "'-0'"}, {"f8", "'5e-324'"}, {"n", "'0.000000000000000000000000000000000000000000001'"}},
      // Everything NULL.
      {},
  };
  std::string ddl = "CREATE TABLE " + table() + " (id int PRIMARY KEY";
  for (const Column& c : cols)
    ddl += ", " + c.name + " " + c.type;
  pg_->exec(ddl + ")");
  auto insert = [&](int64_t id, const Row& row) {
    std::string sql = "INSERT INTO " + table() + " VALUES (" + std::to_string(id);
    for (const Column& c : cols) {
      auto it = row.find(c.name);
      sql += ", " + (it == row.end() ? std::string("NULL") : it->second);
    }
    pg_->exec(sql + ")");
  };
  // Rows 1..n before the job starts (read by the snapshot), 101..100+n after (read from the stream).
  for (size_t i = 0; i < rows.size(); ++i)
    insert(static_cast<int64_t>(i + 1), rows[i]);

  auto out = std::make_shared<Received>();
  auto src = source().build();
  StreamEnvironment env(config());
  env.from_source(src, "pg").uid("pg").sink_to(receiving_sink(out)).uid("sink");
  JobClient job = env.execute_async("types");
  ASSERT_TRUE(out->wait_for(rows.size())) << out->size();
  ASSERT_TRUE(slot_active());
  for (size_t i = 0; i < rows.size(); ++i)
    insert(static_cast<int64_t>(i + 101), rows[i]);
  ASSERT_TRUE(out->wait_for(2 * rows.size())) << out->size();
  job.cancel();
  job.wait();
  EXPECT_EQ(src->metrics().bad_records, 0);

  const std::vector<ChangeEvent> got = out->all();
  ASSERT_EQ(got.size(), 2 * rows.size());
  std::map<int64_t, const ChangeEvent*> by_id;
  for (const ChangeEvent& e : got)
    by_id[e.key.find("id")->as_int64()] = &e;
  int checked = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const int64_t id : {static_cast<int64_t>(i + 1), static_cast<int64_t>(i + 101)}) {
      SCOPED_TRACE("row " + std::to_string(id));
      ASSERT_TRUE(by_id.count(id)) << "no event for row " << id;
      const ChangeEvent& e = *by_id[id];
      EXPECT_EQ(e.op, id > 100 ? ChangeOp::kCreate : ChangeOp::kRead);
      // The event as JSON and back: a non-NULL column never reads null.
      auto reread = Value::from_json(e.after.to_json());
      ASSERT_TRUE(reread.ok()) << reread.error().message();
      for (const Column& c : cols) {
        SCOPED_TRACE(c.name);
        const Value* v = e.after.find(c.name);
        ASSERT_NE(v, nullptr);
        const bool is_null = !rows[i].count(c.name);
        EXPECT_EQ(v->is_null(), is_null) << v->to_json();
        EXPECT_EQ(reread->find(c.name)->is_null(), is_null) << e.after.to_json();
        if (is_null) continue;
        EXPECT_EQ(round_trip(c, id, *v), "") << rows[i].at(c.name) << " decoded as " << v->to_json();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 150);
  // The JSON text of the specials and the ends of the range, as documented in docs/cdc.md.
  auto json = [&](int64_t id, const std::string& c) { return by_id.at(id)->after.find(c)->to_json(); };
  for (const int64_t base : {0, 100}) {
    EXPECT_EQ(json(base + 3, "f4"), "\"NaN\"");
    EXPECT_EQ(json(base + 3, "f8"), "\"Infinity\"");
    EXPECT_EQ(json(base + 3, "n"), "\"NaN\"");
    EXPECT_EQ(json(base + 3, "d"), "\"infinity\"");
    EXPECT_EQ(json(base + 3, "ts"), "\"-infinity\"");
    EXPECT_EQ(json(base + 4, "f4"), "\"-Infinity\"");
    EXPECT_EQ(json(base + 4, "f8"), "-0.0");
    EXPECT_EQ(json(base + 4, "n"), "\"Infinity\"");
    EXPECT_EQ(json(base + 4, "tz"), "\"-infinity\"");
    EXPECT_EQ(json(base + 5, "n"), "\"-Infinity\"");
    EXPECT_EQ(json(base + 5, "d"), "\"0000-01-01T00:00:00.000000Z\"");  // 1 BC is ISO year 0
    EXPECT_EQ(json(base + 1, "d"), "\"-4713-11-24T00:00:00.000000Z\"");
    EXPECT_EQ(json(base + 1, "i8"), "-9223372036854775808");
    EXPECT_EQ(json(base + 1, "n"), "-99999999999999999999999999999999999999");
    EXPECT_EQ(json(base + 2, "ts"), "\"+294247-01-10T04:00:54.775806Z\"");
    EXPECT_EQ(json(base + 2, "fa"), "[\"NaN\",\"Infinity\",\"-Infinity\",-0.0,5e-324,1.7976931348623157e+308]");
    EXPECT_EQ(json(base + 2, "da"),
              "[\"infinity\",\"-infinity\",\"2024-02-29T00:00:00.000000Z\",\"+294247-01-10T00:00:00.000000Z\"]");
    EXPECT_EQ(json(base + 2, "bc"), "\"ab   \"");
    EXPECT_EQ(json(base + 6, "f8"), "5e-324");
    EXPECT_EQ(json(base + 6, "n"), "0.000000000000000000000000000000000000000000001");
  }
}

TEST_F(PostgresTypesTest, DatesAndTimestampsBeyondTheRangeAreDeadLettersNotWrappedValues) {
  pg_->exec("CREATE TABLE " + table() + " (id int PRIMARY KEY, d date, ts timestamptz)");
  // Snapshot: row 2 is beyond the range.
  pg_->exec("INSERT INTO " + table() + " VALUES (1, '2024-01-01', '2024-01-01 00:00:00+00')");
  pg_->exec("INSERT INTO " + table() + " VALUES (2, '5874897-12-31', NULL)");
  const fs::path dlq = dir_ / "dead" / "letters.jsonl";
  auto out = std::make_shared<Received>();
  auto src = source().on_bad_record(BadRecordPolicy::kDeadLetter, dlq.string()).build();
  StreamEnvironment env(config());
  env.from_source(src, "pg").uid("pg").sink_to(receiving_sink(out)).uid("sink");
  JobClient job = env.execute_async("beyond");
  ASSERT_TRUE(out->wait_for(1));
  ASSERT_TRUE(slot_active());
  // Stream: the last microsecond of Postgres' range, then one past Sluice's last finite instant.
  pg_->exec("INSERT INTO " + table() + " VALUES (3, NULL, '294276-12-31 23:59:59.999999+00')");
  pg_->exec("INSERT INTO " + table() + " VALUES (4, NULL, '294247-01-10 04:00:54.775807+00')");
  pg_->exec("INSERT INTO " + table() + " VALUES (5, '294247-01-10', '294247-01-10 04:00:54.775806+00')");
  ASSERT_TRUE(out->wait_for(2));
  ASSERT_TRUE(sluice::testing::poll_until([&] { return src->metrics().bad_records == 3; }, kDeadline))
      << src->metrics().bad_records;
  job.cancel();
  job.wait();
  const auto ev = out->all();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].key.find("id")->as_int64(), 1);
  EXPECT_EQ(ev[1].key.find("id")->as_int64(), 5);
  EXPECT_EQ(ev[1].after.find("ts")->as_timestamp_micros(), std::numeric_limits<int64_t>::max() - 1);
  std::ifstream in(dlq);
  std::vector<Value> letters;
  for (std::string line; std::getline(in, line);) {
    auto v = Value::from_json(line);
    ASSERT_TRUE(v.ok()) << line;
    letters.push_back(*v);
  }
  ASSERT_EQ(letters.size(), 3u);
  const std::vector<std::string> columns = {"column d", "column ts", "column ts"};
  const std::vector<std::string> texts = {"5874897-12-31", "294276-12-31 23:59:59.999999",
                                          "294247-01-10 04:00:54.775807"};
  for (size_t i = 0; i < letters.size(); ++i) {
    SCOPED_TRACE(i);
    const std::string err(letters[i].find("error")->as_string());
    EXPECT_NE(err.find("public." + table()), std::string::npos) << err;
    EXPECT_NE(err.find(columns[i]), std::string::npos) << err;
    EXPECT_NE(err.find(texts[i]), std::string::npos) << err;
    EXPECT_NE(err.find("outside the range of a Sluice timestamp"), std::string::npos) << err;
    EXPECT_TRUE(postgres::parse_lsn(letters[i].find("lsn")->as_string()).ok());
  }
}

// Text from databases whose encoding is not UTF8: the source's connections ask for client_encoding UTF8, so a
// LATIN1 database's text arrives converted (snapshot and stream, arrays too), never as bytes that JSON sinks would
// replace with U+FFFD; a SQL_ASCII database (which Postgres does not convert) holding bytes that are not UTF-8 fails
// the job with Postgres's error naming the table, never an altered string.
TEST_F(PostgresTypesTest, TextFromNonUtf8DatabasesIsConvertedOrFailsTheJob) {
  const std::string base = url_.substr(0, url_.rfind('/') + 1);
  struct Db {
    std::string name, encoding;
  };
  const std::vector<Db> dbs = {{name_ + "_l1", "LATIN1"}, {name_ + "_sa", "SQL_ASCII"}};
  for (const Db& db : dbs) {
    pg_->exec("DROP DATABASE IF EXISTS " + db.name + " WITH (FORCE)");
    pg_->exec("CREATE DATABASE " + db.name + " ENCODING '" + db.encoding +
              "' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
  }
  auto run = [&](const Db& db, const std::vector<std::string>& snapshot, const std::vector<std::string>& stream,
                 size_t events, int64_t bad_records, const fs::path& dlq) {
    sluice::testing::PgClient c(base + db.name);
    c.exec("SET client_encoding = 'UTF8'");  // this file's literals are UTF-8
    c.exec("CREATE TABLE " + table() + " (id int PRIMARY KEY, s text, a text[])");
    for (const std::string& row : snapshot)
      c.exec("INSERT INTO " + table() + " VALUES " + row);
    auto out = std::make_shared<Received>();
    auto src = PostgresCdcSource::builder()
                   .conninfo(base + db.name)
                   .tables({table()})
                   .slot_name(db.name)
                   .publication_name(db.name)
                   .status_interval(200ms)
                   .on_bad_record(BadRecordPolicy::kDeadLetter, dlq.string())
                   .build();
    StreamEnvironment env(config());
    env.from_source(src, "pg").uid("pg").sink_to(receiving_sink(out)).uid("sink");
    JobClient job = env.execute_async("encodings");
    const bool snapshot_read = sluice::testing::poll_until(
        [&] {
          return pg_->scalar(
                     "SELECT count(*) FROM pg_replication_slots WHERE active AND confirmed_flush_lsn IS NOT "
                     "NULL AND slot_name = '" +
                     db.name + "'") == "1";
        },
        kDeadline);
    EXPECT_TRUE(snapshot_read);
    for (const std::string& row : stream)
      c.exec("INSERT INTO " + table() + " VALUES " + row);
    EXPECT_TRUE(out->wait_for(events)) << out->size();
    EXPECT_TRUE(sluice::testing::poll_until([&] { return src->metrics().bad_records == bad_records; }, kDeadline))
        << src->metrics().bad_records;
    job.cancel();
    job.wait();
    sluice::testing::drop_slot(*pg_, db.name, kDeadline);
    return out->all();
  };

  // LATIN1: é, ü, ß, ï are one byte each there; the events hold their UTF-8.
  const std::vector<ChangeEvent> latin =
      run(dbs[0], {"(1, 'café', ARRAY['é', 'ü'])"}, {"(2, 'naïve', ARRAY['ß', NULL])"}, 2, 0, dir_ / "l1.jsonl");
  ASSERT_EQ(latin.size(), 2u);
  EXPECT_EQ(latin[0].after.to_json(), R"({"id":1,"s":"café","a":["é","ü"]})");
  EXPECT_EQ(latin[1].after.to_json(), R"({"id":2,"s":"naïve","a":["ß",null]})");

  // SQL_ASCII: any bytes, which Postgres does not convert but checks against the client encoding UTF8 when it sends
  // them: a row that is not UTF-8 fails the job naming the table and Postgres's error, never an altered string.
  {
    sluice::testing::PgClient c(base + dbs[1].name);
    c.exec("CREATE TABLE " + table() + " (id int PRIMARY KEY, s text)");
    c.exec("INSERT INTO " + table() + R"( VALUES (1, 'plain'), (2, E'caf\xe9'))");
    auto out = std::make_shared<Received>();
    auto src = PostgresCdcSource::builder()
                   .conninfo(base + dbs[1].name)
                   .tables({table()})
                   .slot_name(dbs[1].name)
                   .publication_name(dbs[1].name)
                   .build();
    StreamEnvironment env(config());
    env.from_source(src, "pg").uid("pg").sink_to(receiving_sink(out)).uid("sink");
    JobResult r = env.execute("encodings");
    EXPECT_EQ(r.status, JobStatus::kFailed);
    ASSERT_TRUE(r.error.has_value());
    EXPECT_NE(r.error->message().find("invalid byte sequence for encoding \"UTF8\": 0xe9"), std::string::npos)
        << r.error->message();
    EXPECT_NE(r.error->message().find("public." + table()), std::string::npos) << r.error->message();
    for (const ChangeEvent& e : out->all())
      EXPECT_NE(e.after.find("id")->as_int64(), 2) << e.after.to_json();
    sluice::testing::drop_slot(*pg_, dbs[1].name, kDeadline);
  }
  // The same bytes in the stream (after a clean snapshot): the job fails with Postgres's error (or the decoder's,
  // naming the byte), never an event with an altered string. No restart can pass the same WAL record, so the
  // failure is marked not recoverable by a restart: the job fails at once even under a restart strategy.
  {
    sluice::testing::PgClient c(base + dbs[1].name);
    const std::string t = table() + "_st";
    c.exec("CREATE TABLE " + t + " (id int PRIMARY KEY, s text)");
    c.exec("INSERT INTO " + t + " VALUES (1, 'plain')");
    auto out = std::make_shared<Received>();
    auto src = PostgresCdcSource::builder()
                   .conninfo(base + dbs[1].name)
                   .tables({t})
                   .slot_name(dbs[1].name + "_st")
                   .publication_name(dbs[1].name + "_st")
                   .status_interval(200ms)
                   .build();
    Configuration conf = config();
    conf.set(options::kRestartStrategy, std::string("fixed-delay"));
    conf.set(options::kFixedDelayAttempts, 1000);
    conf.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
    StreamEnvironment env(conf);
    env.from_source(src, "pg").uid("pg").sink_to(receiving_sink(out)).uid("sink");
    JobClient job = env.execute_async("encodings-stream");
    ASSERT_TRUE(out->wait_for(1)) << out->size();
    EXPECT_TRUE(sluice::testing::poll_until(
        [&] {
          return pg_->scalar(
                     "SELECT count(*) FROM pg_replication_slots WHERE active AND confirmed_flush_lsn IS NOT "
                     "NULL AND slot_name = '" +
                     dbs[1].name + "_st'") == "1";
        },
        kDeadline));
    c.exec("INSERT INTO " + t + R"( VALUES (2, 'fine'))");
    c.exec("INSERT INTO " + t + R"( VALUES (3, E'caf\xe9'))");
    const bool ended = job.wait_for(std::chrono::seconds(60));
    if (!ended) job.cancel();
    JobResult r = job.wait();
    ASSERT_TRUE(ended) << "the job did not end; restarts: " << job.restarts();
    EXPECT_EQ(r.status, JobStatus::kFailed);
    ASSERT_TRUE(r.error.has_value());
    const std::string m = r.error->message();
    std::printf("stream, SQL_ASCII, byte 0xe9: %s after %d restarts: %s\n", job_status_name(r.status), r.restarts,
                m.c_str());
    EXPECT_TRUE(m.find("0xe9") != std::string::npos) << m;
    EXPECT_EQ(r.restarts, 0) << m;
    EXPECT_NE(m.find("not recoverable by a restart"), std::string::npos) << m;
    bool saw_two = false;
    for (const ChangeEvent& e : out->all()) {
      EXPECT_NE(e.after.find("id")->as_int64(), 3) << e.after.to_json();
      saw_two = saw_two || e.after.find("id")->as_int64() == 2;
    }
    EXPECT_TRUE(saw_two) << "the valid change before it was delivered";
    sluice::testing::drop_slot(*pg_, dbs[1].name + "_st", kDeadline);
  }
  for (const Db& db : dbs)
    pg_->exec("DROP DATABASE IF EXISTS " + db.name + " WITH (FORCE)");
}

}  // namespace
}  // namespace sluice
