// Chaos test of `sluice run` (issue 7): a CDC pipeline process is SIGKILLed 5 times while a workload runs and is
// restarted each time from its checkpoints; its output must equal that of a reference pipeline that is never
// killed. Parameterised over the source (Postgres, the MongoDB-wire emulator).
//
// Two pipeline files, identical except name / slot / topic / index / checkpoint dir, read the same (empty at
// start) table or collection: A (killed; sinks Kafka at-least-once and OpenSearch, id = entity) and B
// (reference; Kafka only). Both have a files dead-letter sink. The test writes 50,000 changes on 5,000 entities
// (inserts, several updates per entity, deletes and re-inserts, in batches; seeded by SLUICE_TEST_SEED), with
// one malformed row whose `amount` is not a number, so the transform's CAST fails for it. Meanwhile it kills A
// at 5 seeded random moments (each after A completed a checkpoint since its last start) and restarts it. Then:
//  (a) every change has its domain event in A's topic at least once (B's events, per entity, match the
//      workload's changes in order and count, and A holds every id of B);
//  (b) deduplicated by event id, A's events equal B's (id, type, entity, op, occurred_at, payload, source);
//  (c) per entity, the first occurrences of A's events come in B's (= source) order;
//  (d) A's OpenSearch index holds exactly the final state of every entity (deleted ones absent);
//  (e) the malformed change is in A's (and B's) dead-letter files, with stage, position and error, and the
//      changes after it have their events;
//  (f) tombstones (the Kafka sink's tombstones-on-delete, default true): in both topics each tombstone (a null
//      value) comes right after a delete of its key, and B (never killed) has one after each of its deletes.
// MongoDB: the emulator looks `fullDocument` of an update up when the event is read (docs/services.md), so the
// payload of an update depends on when it was read: for updates (b) compares everything but the payload, and
// the per-entity check against the workload compares the event types only. Updates are replaces that carry
// the `_id` (the emulator's `documentKey` of an update is the new document), so an update read after the
// document's deletion still has its key.
//
// Scale: 50,000 changes for both sources: about 20 s for Postgres and 2-2.5 min for the MongoDB emulator on two
// busy cores (its writes slow down while two change streams filter its whole, growing oplog on every poll).
// SLUICE_CHAOS_SCALE (a factor, default 1 = full) scales the MongoDB workload only, e.g. 0.2 for a quick run.
// Run: scripts/services/run-with postgres mongodb kafka opensearch -- build/<preset>/tests/pipeline_kill_test
#include <gtest/gtest.h>
#include <httplib.h>
#include <libpq-fe.h>
#include <mongoc/mongoc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace kafka = sluice::testing::kafka;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kChanges = 50'000;
constexpr int kEntities = 5'000;
constexpr int kKills = 5;
constexpr int kBatch = 500;               // changes per transaction / bulk write
constexpr int kChangesPerSecond = 5'000;  // the workload's pace, so that the kills spread over some seconds
constexpr int kPartitions = 4;
constexpr auto kStartDeadline = 60s;
constexpr auto kCatchUpDeadline = 120s;

using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;
using sluice::testing::poll_until;
using sluice::testing::unique_name;

// ---------------------------------------------------------------------------------------------------------------
// The workload: a seeded sequence of changes on entities 0..kEntities-1, plus one malformed insert.

struct Row {
  std::string status;
  std::string amount;  // text: the transform casts it to BIGINT
  int64_t revision = 0;
};

struct Change {
  enum Kind { kInsert, kUpdate, kDelete } kind;
  int64_t id;
  Row row;  // the new row (insert, update)
};

struct Workload {
  std::vector<Change> changes;
  size_t malformed = 0;                                     // index of the malformed change
  int64_t malformed_id = 0;                                 // its entity (never changed again)
  std::map<int64_t, Row> final_rows;                        // the state after all changes, malformed entity excluded
  std::map<int64_t, std::vector<const Change*>> by_entity;  // well-formed changes per entity, in order
};

Workload make_workload(uint64_t seed, int changes, int entities) {
  static const char* kStatuses[] = {"created", "authorized", "paid", "settled", "refunded", "disputed"};
  std::mt19937_64 rnd(seed);
  Workload w;
  w.malformed = static_cast<size_t>(changes / 2 + static_cast<int>(rnd() % 97));
  w.malformed_id = entities;  // outside the range of the others
  std::vector<std::optional<Row>> state(static_cast<size_t>(entities));
  auto amount = [&] { return std::to_string(100 + rnd() % 1'000'000); };
  for (int i = 0; i < changes; ++i) {
    if (static_cast<size_t>(i) == w.malformed) {
      w.changes.push_back({Change::kInsert, w.malformed_id, Row{"created", "n/a", 0}});
      continue;
    }
    const auto id = static_cast<int64_t>(rnd() % static_cast<uint64_t>(entities));
    std::optional<Row>& s = state[static_cast<size_t>(id)];
    if (!s) {
      s = Row{"created", amount(), 0};
      w.changes.push_back({Change::kInsert, id, *s});
    } else if (rnd() % 100 < 8) {
      w.changes.push_back({Change::kDelete, id, Row{}});
      s.reset();
    } else {
      s = Row{kStatuses[rnd() % 6], amount(), s->revision + 1};
      w.changes.push_back({Change::kUpdate, id, *s});
    }
  }
  for (int id = 0; id < entities; ++id) {
    if (state[static_cast<size_t>(id)]) w.final_rows[id] = *state[static_cast<size_t>(id)];
  }
  for (size_t i = 0; i < w.changes.size(); ++i) {
    if (i != w.malformed) w.by_entity[w.changes[i].id].push_back(&w.changes[i]);
  }
  return w;
}

const char* op_of(Change::Kind k) {
  return k == Change::kInsert ? "c" : k == Change::kUpdate ? "u" : "d";
}

// ---------------------------------------------------------------------------------------------------------------
// The sources: where the changes are written, and the final state read back.

class SourceDb {
 public:
  virtual ~SourceDb() = default;
  virtual void setup() = 0;
  virtual void teardown() = 0;
  /// Applies changes[begin, end) as one transaction / bulk write.
  virtual void apply(const std::vector<Change>& changes, size_t begin, size_t end) = 0;
  /// The rows now: id -> row.
  virtual std::map<int64_t, Row> rows() = 0;
  /// The `source:` section and the id field of the key.
  virtual std::string source_yaml(const std::string& pipeline) = 0;
  virtual std::string key_field() const = 0;
};

class PostgresDb final : public SourceDb {
 public:
  explicit PostgresDb(const testing::ServiceEnv& env) : url_(env.get("POSTGRES_URL")) {
    table_ = unique_name("chaos_charges");
  }
  ~PostgresDb() override {
    if (c_ != nullptr) PQfinish(c_);
  }
  void setup() override {
    c_ = PQconnectdb(url_.c_str());
    ASSERT_EQ(PQstatus(c_), CONNECTION_OK) << PQerrorMessage(c_);
    exec("CREATE TABLE public." + table_ +
         " (id BIGINT PRIMARY KEY, status TEXT NOT NULL, amount TEXT NOT NULL, revision BIGINT NOT NULL)");
  }
  void teardown() override {
    if (c_ == nullptr) return;
    for (const std::string& p : {std::string("a"), std::string("b")}) {
      exec_quiet("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + table_ +
                 "_" + p + "'");
      exec_quiet("DROP PUBLICATION IF EXISTS " + table_ + "_" + p);
    }
    exec_quiet("DROP TABLE IF EXISTS public." + table_);
  }
  void apply(const std::vector<Change>& changes, size_t begin, size_t end) override {
    std::string sql = "BEGIN;";
    for (size_t i = begin; i < end; ++i) {
      const Change& c = changes[i];
      const std::string id = std::to_string(c.id);
      if (c.kind == Change::kInsert) {
        sql += "INSERT INTO public." + table_ + " VALUES (" + id + ", '" + c.row.status + "', '" + c.row.amount +
               "', " + std::to_string(c.row.revision) + ");";
      } else if (c.kind == Change::kUpdate) {
        sql += "UPDATE public." + table_ + " SET status = '" + c.row.status + "', amount = '" + c.row.amount +
               "', revision = " + std::to_string(c.row.revision) + " WHERE id = " + id + ";";
      } else {
        sql += "DELETE FROM public." + table_ + " WHERE id = " + id + ";";
      }
    }
    sql += "COMMIT;";
    exec(sql);
  }
  std::map<int64_t, Row> rows() override {
    std::map<int64_t, Row> out;
    PGresult* r = PQexec(c_, ("SELECT id, status, amount, revision FROM public." + table_).c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      ADD_FAILURE() << PQresultErrorMessage(r);
    } else {
      for (int i = 0; i < PQntuples(r); ++i) {
        out[std::stoll(PQgetvalue(r, i, 0))] =
            Row{PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), std::stoll(PQgetvalue(r, i, 3))};
      }
    }
    PQclear(r);
    return out;
  }
  std::string source_yaml(const std::string& pipeline) override {
    return "source:\n  type: postgres\n  conninfo: \"" + url_ + "\"\n  tables: [public." + table_ +
           "]\n  slot: " + table_ + "_" + pipeline + "\n  publication: " + table_ + "_" + pipeline +
           "\n  start: initial\n";
  }
  std::string key_field() const override { return "id"; }

 private:
  void exec(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const auto st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      ADD_FAILURE() << sql.substr(0, 200) << ": " << PQresultErrorMessage(r);
    }
    PQclear(r);
  }
  void exec_quiet(const std::string& sql) { PQclear(PQexec(c_, sql.c_str())); }

  std::string url_;
  std::string table_;
  PGconn* c_ = nullptr;
};

class MongoDb final : public SourceDb {
 public:
  explicit MongoDb(const testing::ServiceEnv& env) : uri_(env.get("MONGODB_URI")) {
    db_ = unique_name("chaos");
    mongoc_init();
  }
  ~MongoDb() override {
    if (coll_ != nullptr) mongoc_collection_destroy(coll_);
    if (client_ != nullptr) mongoc_client_destroy(client_);
  }
  void setup() override {
    client_ = mongoc_client_new(uri_.c_str());
    ASSERT_NE(client_, nullptr) << uri_;
    mongoc_database_t* db = mongoc_client_get_database(client_, db_.c_str());
    bson_error_t e;
    mongoc_collection_t* created = mongoc_database_create_collection(db, "charges", nullptr, &e);
    ASSERT_NE(created, nullptr) << e.message;
    mongoc_collection_destroy(created);
    mongoc_database_destroy(db);
    coll_ = mongoc_client_get_collection(client_, db_.c_str(), "charges");
  }
  void teardown() override {
    if (client_ == nullptr) return;
    mongoc_database_t* db = mongoc_client_get_database(client_, db_.c_str());
    mongoc_database_drop(db, nullptr);
    mongoc_database_destroy(db);
  }
  void apply(const std::vector<Change>& changes, size_t begin, size_t end) override {
    mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(coll_, nullptr);
    bson_error_t e;
    for (size_t i = begin; i < end; ++i) {
      const Change& c = changes[i];
      bson_t* filter = BCON_NEW("_id", BCON_INT64(c.id));
      if (c.kind == Change::kDelete) {
        EXPECT_TRUE(mongoc_bulk_operation_remove_one_with_opts(bulk, filter, nullptr, &e)) << e.message;
      } else {
        bson_t* doc = BCON_NEW("_id", BCON_INT64(c.id), "status", BCON_UTF8(c.row.status.c_str()), "amount",
                               BCON_UTF8(c.row.amount.c_str()), "revision", BCON_INT64(c.row.revision));
        if (c.kind == Change::kInsert) {
          EXPECT_TRUE(mongoc_bulk_operation_insert_with_opts(bulk, doc, nullptr, &e)) << e.message;
        } else {
          EXPECT_TRUE(mongoc_bulk_operation_replace_one_with_opts(bulk, filter, doc, nullptr, &e)) << e.message;
        }
        bson_destroy(doc);
      }
      bson_destroy(filter);
    }
    bson_t reply;
    EXPECT_NE(mongoc_bulk_operation_execute(bulk, &reply, &e), 0u) << e.message;
    bson_destroy(&reply);
    mongoc_bulk_operation_destroy(bulk);
  }
  std::map<int64_t, Row> rows() override {
    std::map<int64_t, Row> out;
    bson_t filter = BSON_INITIALIZER;
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll_, &filter, nullptr, nullptr);
    const bson_t* doc = nullptr;
    while (mongoc_cursor_next(cur, &doc)) {
      bson_iter_t it;
      Row row;
      int64_t id = -1;
      if (bson_iter_init_find(&it, doc, "_id")) id = bson_iter_as_int64(&it);
      if (bson_iter_init_find(&it, doc, "status")) row.status = bson_iter_utf8(&it, nullptr);
      if (bson_iter_init_find(&it, doc, "amount")) row.amount = bson_iter_utf8(&it, nullptr);
      if (bson_iter_init_find(&it, doc, "revision")) row.revision = bson_iter_as_int64(&it);
      out[id] = row;
    }
    bson_error_t e;
    EXPECT_FALSE(mongoc_cursor_error(cur, &e)) << e.message;
    mongoc_cursor_destroy(cur);
    bson_destroy(&filter);
    return out;
  }
  std::string source_yaml(const std::string&) override {
    return "source:\n  type: mongodb\n  uri: \"" + uri_ + "\"\n  database: " + db_ +
           "\n  collections: [charges]\n  start: initial\n";
  }
  std::string key_field() const override { return "_id"; }

 private:
  std::string uri_;
  std::string db_;
  mongoc_client_t* client_ = nullptr;
  mongoc_collection_t* coll_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// Reading a topic: an assigned consumer that reads every partition up to its high watermark.

struct Event {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string id;
  std::string type;
  std::string entity;  // JSON
  std::string op;
  std::string payload;  // JSON
  std::string rest;     // occurred_at and source, JSON
  std::string json;
};

// A topic's events, read through the harness's reader (the sink is at-least-once: its records are committed as
// they are written); drain() reads everything the topic holds now.
class TopicReader {
 public:
  TopicReader(const std::string& bootstrap, std::string topic)
      : topic_(std::move(topic)),
        reader_(bootstrap, topic_, kPartitions, [this](const chaos::KafkaRecord& r) { add(r); }) {}

  /// Reads everything the topic holds now; returns false when that took longer than `deadline`.
  bool drain(std::chrono::milliseconds deadline = 60s) { return reader_.drain_to_watermarks(deadline); }

  const std::vector<Event>& events() const { return events_; }
  size_t distinct() const {
    std::set<std::string> ids;
    for (const Event& e : events_)
      ids.insert(e.id);
    return ids.size();
  }
  /// Tombstones read, and those that did not come right after a delete of their key.
  size_t tombstones() const { return tombstones_; }
  int tombstone_problems() const { return tombstone_problems_; }

 private:
  void add(const chaos::KafkaRecord& r) {
    if (r.tombstone) {  // a tombstone: right after a delete of its key (one key, one partition)
      std::string& prev = last_op_[r.key];
      if (prev != "d" && ++tombstone_problems_ <= 5) {
        ADD_FAILURE() << "a tombstone of key " << r.key << " in " << topic_ << " at " << r.partition << "/" << r.offset
                      << " after " << (prev.empty() ? "nothing" : prev) << ", not after a delete";
      }
      prev = "tombstone";
      ++tombstones_;
      return;
    }
    std::optional<Value> v = chaos::json_object(r, topic_);
    if (!v) return;
    auto field = [&](const char* k) {
      const Value* f = v->find(k);
      return f == nullptr ? std::string("<absent>") : f->is_string() ? std::string(f->as_string()) : f->to_json();
    };
    Event e;
    e.partition = r.partition;
    e.offset = r.offset;
    e.json = r.value;
    e.id = field("id");
    e.type = field("type");
    e.op = field("op");
    e.entity = v->find("entity") != nullptr ? v->find("entity")->to_json() : "<absent>";
    e.payload = v->find("payload") != nullptr ? v->find("payload")->to_json() : "<absent>";
    e.rest = field("occurred_at") + " " + (v->find("source") != nullptr ? v->find("source")->to_json() : "");
    last_op_[e.entity] = e.op;
    events_.push_back(std::move(e));
  }

  std::string topic_;
  std::vector<Event> events_;
  std::map<std::string, std::string> last_op_;  // key (the entity's JSON) -> op of its last record, "tombstone"
  size_t tombstones_ = 0;
  int tombstone_problems_ = 0;
  chaos::CommittedReader reader_;  // last: its callback appends to events_
};

// Events per entity in topic order (one entity lives in one partition), first occurrences only.
std::map<std::string, std::vector<const Event*>> first_by_entity(const std::vector<Event>& events) {
  std::vector<const Event*> sorted;
  for (const Event& e : events)
    sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    return a->partition != b->partition ? a->partition < b->partition : a->offset < b->offset;
  });
  std::set<std::string> seen;
  std::map<std::string, std::vector<const Event*>> out;
  for (const Event* e : sorted) {
    if (seen.insert(e->id).second) out[e->entity].push_back(e);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// OpenSearch reads.

class Search {
 public:
  explicit Search(const std::string& url) : client_(url) {
    client_.set_connection_timeout(10);
    client_.set_read_timeout(60);
  }
  /// id -> _source of every document (scrolling), or nullopt on an error.
  std::optional<std::map<std::string, Value>> all(const std::string& index) {
    auto r = client_.Post("/" + index + "/_refresh", "", "application/json");
    if (!r || r->status != 200) return std::nullopt;
    std::map<std::string, Value> docs;
    r = client_.Post("/" + index + "/_search?scroll=1m", R"({"size":5000,"query":{"match_all":{}}})",
                     "application/json");
    while (r && r->status == 200) {
      Result<Value> v = Value::from_json(r->body);
      if (!v.ok()) return std::nullopt;
      const Value& hits = *v->find("hits")->find("hits");
      if (hits.as_array().empty()) break;
      for (const Value& hit : hits.as_array())
        docs[std::string(hit.find("_id")->as_string())] = *hit.find("_source");
      const std::string scroll = std::string(v->find("_scroll_id")->as_string());
      r = client_.Post("/_search/scroll",
                       Value::object({{"scroll", Value("1m")}, {"scroll_id", Value(scroll)}}).to_json(),
                       "application/json");
    }
    if (!r || r->status != 200) return std::nullopt;
    return docs;
  }
  void drop(const std::string& index) { client_.Delete("/" + index); }

 private:
  httplib::Client client_;
};

// ---------------------------------------------------------------------------------------------------------------

enum class Source { kPostgres, kMongoDb };

std::string source_name(const ::testing::TestParamInfo<Source>& info) {
  return info.param == Source::kPostgres ? "Postgres" : "MongoDb";
}

class PipelineKillTest : public ::testing::TestWithParam<Source> {
 protected:
  void SetUp() override {
    const bool mongo = GetParam() == Source::kMongoDb;
    for (const char* s : {"kafka", "opensearch", mongo ? "mongodb" : "postgres"}) {
      if (!testing::require_service(s).available) return;
    }
    bootstrap_ = testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    opensearch_ = testing::require_service("opensearch").get("OPENSEARCH_URL");
    if (mongo) {
      db_ = std::make_unique<MongoDb>(testing::require_service("mongodb"));
    } else {
      db_ = std::make_unique<PostgresDb>(testing::require_service("postgres"));
    }
    dir_ = chaos::make_test_dir("sluice-chaos");
    ASSERT_NO_FATAL_FAILURE(db_->setup());
  }

  void TearDown() override {
    if (a_) a_->stop();
    if (b_) b_->stop();
    if (HasFailure()) {
      if (a_) std::cout << a_->tails();
      if (b_) std::cout << b_->tails();
    }
    chaos::keep_or_remove(dir_, HasFailure());
    if (db_) db_->teardown();
    if (!index_.empty()) Search(opensearch_).drop(index_);
  }

  std::string pipeline_yaml(const std::string& which, const std::string& topic, const std::string& index) {
    const std::string name = "chaos-" + which + "-" + fs::path(dir_).filename().string();
    const std::string k = db_->key_field();
    std::string y;
    y += chaos::pipeline_section(
        name, dir_ / ("checkpoints-" + which), "500ms", "at-least-once",
        "  dead-letter: { type: files, path: \"" + (dir_ / ("dead-letter-" + which)).string() + "\" }\n");
    y += db_->source_yaml(which);
    y += "transform:\n";
    y += "  - match: \"**\"\n";
    y += "    key: key." + k + "\n";
    y += "    event:\n";
    y += "      type: \"CASE op WHEN 'c' THEN 'charge.created' WHEN 'u' THEN 'charge.updated' WHEN 'd' THEN "
         "'charge.deleted' ELSE 'charge.read' END\"\n";
    y += "      payload: \"key." + k +
         " AS id, after.status AS status, CAST(after.amount AS BIGINT) AS amount, after.revision AS revision\"\n";
    y += "sink:\n";
    y += chaos::kafka_events_sink(bootstrap_, topic);
    if (!index.empty()) {
      y += "  search: { type: opensearch, url: \"" + opensearch_ + "\", index: " + index +
           ", id: entity, flush-interval: 200ms }\n";
    }
    return y;
  }

  std::string bootstrap_;
  std::string opensearch_;
  std::unique_ptr<SourceDb> db_;
  fs::path dir_;
  std::string index_;
  std::unique_ptr<SluiceProcess> a_;
  std::unique_ptr<SluiceProcess> b_;
};

// Dead-letter entries of the transform: the JSON lines of the committed (non-hidden) files under `dir`.
std::vector<Value> transform_dead_letters(const fs::path& dir) {
  std::vector<Value> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& f : fs::recursive_directory_iterator(dir, ec)) {
    if (!f.is_regular_file() || f.path().filename().string().starts_with(".")) continue;
    std::istringstream in(read_file(f.path()));
    for (std::string line; std::getline(in, line);) {
      Result<Value> v = Value::from_json(line);
      if (!v.ok() || !v->is_object()) continue;
      const Value* stage = v->find("stage");
      if (stage != nullptr && stage->is_string() && stage->as_string() == "transform") out.push_back(*v);
    }
  }
  return out;
}

TEST_P(PipelineKillTest, KilledPipelineEqualsReference) {
  const bool mongo = GetParam() == Source::kMongoDb;
  const auto t0 = Clock::now();
  const uint64_t seed = testing::test_seed();
  const double scale = mongo ? chaos::chaos_scale() : 1.0;  // SLUICE_CHAOS_SCALE scales the MongoDB workload only
  const int changes = std::max(2 * kBatch, static_cast<int>(kChanges * scale));
  const int entities = std::max(100, static_cast<int>(kEntities * scale));
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), " << changes << " changes on " << entities << " entities\n";
  const Workload w = make_workload(seed, changes, entities);

  const std::string topic_a = kafka::unique_topic("chaos-a");
  const std::string topic_b = kafka::unique_topic("chaos-b");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic_a, kPartitions));
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic_b, kPartitions));
  index_ = unique_name("chaos-a");
  std::transform(index_.begin(), index_.end(), index_.begin(), [](char c) { return c == '_' ? '-' : c; });
  {
    std::ofstream(dir_ / "a.yaml") << pipeline_yaml("a", topic_a, index_);
    std::ofstream(dir_ / "b.yaml") << pipeline_yaml("b", topic_b, "");
  }
  a_ = std::make_unique<SluiceProcess>("a", dir_ / "a.yaml", dir_);
  b_ = std::make_unique<SluiceProcess>("b", dir_ / "b.yaml", dir_);
  ASSERT_TRUE(a_->start());
  ASSERT_TRUE(b_->start());
  // The workload starts once both initial snapshots of the (empty) table or collection are done: a completed
  // checkpoint alone does not mean the snapshot has run, and one that reads the workload's first writes gives `r`
  // events the reference's per-entity check does not expect (seen with a fresh, fast emulator).
  const auto snapshot_done = [](const std::string& log) {
    return log.find("' done; stream events up to") != std::string::npos ||  // MongoDB
           (log.find("snapshot of slot") != std::string::npos && log.find(" rows from ") != std::string::npos);
  };
  for (SluiceProcess* p : {a_.get(), b_.get()}) {
    ASSERT_TRUE(p->wait_running(1, kStartDeadline));
    ASSERT_TRUE(p->wait_log(snapshot_done, "end of the initial snapshot", kStartDeadline));
  }

  // The kills: one at a random batch boundary within each fifth of the workload (never at the very start).
  const size_t batches = (w.changes.size() + kBatch - 1) / kBatch;
  std::mt19937_64 rnd(seed ^ 0x5deece66dULL);
  std::vector<size_t> kill_at;
  for (int k = 0; k < kKills; ++k) {
    const size_t lo = batches * static_cast<size_t>(k) / kKills + 1;
    const size_t hi = std::max(lo + 1, batches * static_cast<size_t>(k + 1) / kKills);
    kill_at.push_back(lo + rnd() % (hi - lo));
  }
  std::cout << "kills before batches";
  for (size_t b : kill_at)
    std::cout << " " << b;
  std::cout << " of " << batches << "\n";

  int kills = 0;
  const auto workload_start = Clock::now();
  for (size_t batch = 0; batch < batches; ++batch) {
    if (std::find(kill_at.begin(), kill_at.end(), batch) != kill_at.end()) {
      // Only kill an A that made progress since its start: it completed a checkpoint of this run.
      ASSERT_TRUE(a_->wait_running(1, kStartDeadline));
      a_->kill_now();
      ++kills;
      ASSERT_TRUE(a_->start());
    }
    const size_t begin = batch * kBatch;
    const size_t end = std::min(w.changes.size(), begin + kBatch);
    ASSERT_NO_FATAL_FAILURE(db_->apply(w.changes, begin, end));
    // Pace the workload (not synchronisation: the kills should spread over some seconds of streaming).
    std::this_thread::sleep_until(workload_start +
                                  std::chrono::milliseconds(1000 * static_cast<int64_t>(end) / kChangesPerSecond));
    ASSERT_TRUE(b_->alive()) << "the reference pipeline ended\n" << b_->tails();
  }
  const double workload_s = std::chrono::duration<double>(Clock::now() - workload_start).count();
  ASSERT_TRUE(a_->wait_running(1, kStartDeadline));
  std::cout << "workload done in " << workload_s << " s; " << kills << " kills\n";

  // Catch up: B's topic holds an event per change (the malformed one excepted), A's the same distinct ids.
  const size_t expected = w.changes.size() - 1;
  TopicReader ra(bootstrap_, topic_a);
  TopicReader rb(bootstrap_, topic_b);
  const bool b_done = poll_until([&] { return rb.drain() && rb.distinct() >= expected; }, kCatchUpDeadline);
  ASSERT_TRUE(b_done) << "B's topic has " << rb.distinct() << " distinct events of " << expected << "\n" << b_->tails();
  std::set<std::string> b_ids;
  for (const Event& e : rb.events())
    b_ids.insert(e.id);
  auto a_has_all = [&] {
    if (!ra.drain()) return false;
    std::set<std::string> a_ids;
    for (const Event& e : ra.events())
      a_ids.insert(e.id);
    return std::includes(a_ids.begin(), a_ids.end(), b_ids.begin(), b_ids.end());
  };
  const bool a_done = poll_until(a_has_all, kCatchUpDeadline);
  EXPECT_EQ(rb.distinct(), expected);
  ASSERT_TRUE(a_done) << "A's topic has " << ra.distinct() << " distinct events, B's " << b_ids.size() << "\n"
                      << a_->tails();
  EXPECT_TRUE(a_->alive()) << a_->tails();
  EXPECT_TRUE(b_->alive()) << b_->tails();

  // (a) B's events per entity are the workload's changes of that entity, in order; A holds every id of B
  // (checked above). The malformed entity has no event.
  const auto by_a = first_by_entity(ra.events());
  const auto by_b = first_by_entity(rb.events());
  EXPECT_EQ(by_b.count(std::to_string(w.malformed_id)), 0u);
  EXPECT_EQ(by_a.count(std::to_string(w.malformed_id)), 0u);
  int entity_mismatches = 0;
  for (const auto& [id, list] : w.by_entity) {
    auto it = by_b.find(std::to_string(id));
    std::vector<std::string> want;
    std::vector<std::string> got;
    for (const Change* c : list)
      want.push_back(std::string(op_of(c->kind)) +
                     (mongo || c->kind == Change::kDelete ? std::string() : "/" + std::to_string(c->row.revision)));
    if (it != by_b.end()) {
      for (const Event* e : it->second) {
        std::string s = e->op;
        if (!mongo && e->op != "d") {
          Result<Value> p = Value::from_json(e->payload);
          s += "/" + (p.ok() && p->find("revision") != nullptr ? p->find("revision")->to_json() : "?");
        }
        got.push_back(s);
      }
    }
    if (want != got && ++entity_mismatches <= 5) {
      ADD_FAILURE() << "entity " << id << ": B's events (op/revision) differ from the workload's changes:\n  want "
                    << ::testing::PrintToString(want) << "\n  got  " << ::testing::PrintToString(got);
    }
  }
  EXPECT_EQ(entity_mismatches, 0);

  // (b) Deduplicated by id, A's events equal B's; duplicates within A are identical.
  std::map<std::string, const Event*> a_first;
  for (const Event& e : ra.events()) {
    auto [it, fresh] = a_first.emplace(e.id, &e);
    if (!fresh && !(mongo && e.op == "u")) {
      EXPECT_EQ(it->second->json, e.json) << "a duplicate of " << e.id << " differs";
    }
  }
  EXPECT_EQ(a_first.size(), b_ids.size()) << "A has events B does not have";
  int event_mismatches = 0;
  for (const Event& eb : rb.events()) {
    auto it = a_first.find(eb.id);
    if (it == a_first.end()) continue;
    const Event& ea = *it->second;
    const bool same = ea.type == eb.type && ea.entity == eb.entity && ea.op == eb.op && ea.rest == eb.rest &&
                      (ea.payload == eb.payload || (mongo && eb.op == "u"));
    if (!same && ++event_mismatches <= 5) {
      ADD_FAILURE() << "event " << eb.id << " differs:\n  A: " << ea.json << "\n  B: " << eb.json;
    }
  }
  EXPECT_EQ(event_mismatches, 0);

  // (c) Per entity, A's first occurrences in B's order.
  int order_mismatches = 0;
  for (const auto& [entity, list_b] : by_b) {
    auto it = by_a.find(entity);
    std::vector<std::string> ids_a;
    std::vector<std::string> ids_b;
    for (const Event* e : list_b)
      ids_b.push_back(e->id);
    if (it != by_a.end()) {
      for (const Event* e : it->second)
        ids_a.push_back(e->id);
    }
    if (ids_a != ids_b && ++order_mismatches <= 5) {
      std::string a_text;
      std::string b_text;
      for (const Event* e : list_b)
        b_text += "\n    " + e->json;
      if (it != by_a.end()) {
        for (const Event* e : it->second)
          a_text += "\n    " + e->json;
      }
      ADD_FAILURE() << "entity " << entity << ": A's events are not in source order\n  A:" << a_text
                    << "\n  B:" << b_text;
    }
  }
  EXPECT_EQ(order_mismatches, 0);

  // (d) A's index holds the final state: every row of the table / collection (but the malformed one), nothing
  // else.
  std::map<int64_t, Row> rows = db_->rows();
  ASSERT_EQ(rows.count(w.malformed_id), 1u);
  rows.erase(w.malformed_id);
  EXPECT_EQ(rows.size(), w.final_rows.size());
  Search search(opensearch_);
  std::string index_problem;
  auto index_matches = [&] {
    std::optional<std::map<std::string, Value>> docs = search.all(index_);
    if (!docs) {
      index_problem = "cannot read the index";
      return false;
    }
    if (docs->size() != rows.size()) {
      index_problem = std::to_string(docs->size()) + " documents for " + std::to_string(rows.size()) + " rows;";
      int shown = 0;
      for (const auto& [id, doc] : *docs) {
        if (rows.count(std::stoll(id)) == 0 && ++shown <= 5) index_problem += " extra " + id + ": " + doc.to_json();
      }
      for (const auto& [id, row] : rows) {
        if (docs->count(std::to_string(id)) == 0 && ++shown <= 10) index_problem += " missing " + std::to_string(id);
      }
      return false;
    }
    for (const auto& [id, row] : rows) {
      auto it = docs->find(std::to_string(id));
      const Value want = Value::object({{"id", Value(id)},
                                        {"status", Value(row.status)},
                                        {"amount", Value(static_cast<int64_t>(std::stoll(row.amount)))},
                                        {"revision", Value(row.revision)}});
      if (it == docs->end() || it->second.to_json() != want.to_json()) {
        index_problem = "document " + std::to_string(id) + " is " +
                        (it == docs->end() ? std::string("absent") : it->second.to_json()) + ", expected " +
                        want.to_json();
        return false;
      }
    }
    return true;
  };
  EXPECT_TRUE(poll_until(index_matches, 60s)) << index_problem;

  // (e) The malformed change is in the dead-letter files of A and B (committed at a checkpoint), with its
  // position and error; the change after it has its event (the counts above cover all later ones).
  auto find_malformed = [&](const fs::path& dir, std::string* why) {
    for (const Value& v : transform_dead_letters(dir)) {
      const Value* record = v.find("record");
      const Value* key = record != nullptr ? record->find("key") : nullptr;
      const Value* id = key != nullptr ? key->find(db_->key_field()) : nullptr;
      if (id == nullptr || id->to_json() != std::to_string(w.malformed_id)) continue;
      const Value* position = v.find("position");
      const Value* error = v.find("error");
      if (position == nullptr || !position->is_string() || position->as_string().empty() || error == nullptr ||
          !error->is_string() || error->as_string().empty()) {
        *why = "entry without position or with an unexpected error: " + v.to_json();
        return false;
      }
      std::cout << "dead letter under " << dir.filename().string() << ": " << v.find("error")->as_string() << " at "
                << position->as_string() << "\n";
      return true;
    }
    *why = "no transform dead letter for entity " + std::to_string(w.malformed_id) + " under " + dir.string();
    return false;
  };
  std::string why_a;
  std::string why_b;
  EXPECT_TRUE(poll_until([&] { return find_malformed(dir_ / "dead-letter-a", &why_a); }, 30s)) << why_a;
  EXPECT_TRUE(poll_until([&] { return find_malformed(dir_ / "dead-letter-b", &why_b); }, 30s)) << why_b;
  const Change& next = w.changes[w.malformed + 1];
  auto next_events = by_a.find(std::to_string(next.id));
  EXPECT_TRUE(next_events != by_a.end()) << "no event of entity " << next.id << " (changed after the malformed row)";

  // A restarted from its checkpoints every time.
  for (int i = 1; i < a_->starts(); ++i) {
    const fs::path p = a_->log_for(i);
    EXPECT_NE(read_file(p).find("resuming from checkpoint"), std::string::npos) << p << "\n" << tail(p);
  }

  // (f) Tombstones: each right after a delete of its key (checked while reading); B, never killed, has one per
  // delete (the last one may still be on its way: read again until the deadline).
  auto deletes_of = [](const TopicReader& r) {
    size_t n = 0;
    for (const Event& e : r.events())
      n += e.op == "d" ? 1 : 0;
    return n;
  };
  EXPECT_TRUE(poll_until([&] { return rb.drain() && rb.tombstones() == deletes_of(rb); }, 30s))
      << "B: " << rb.tombstones() << " tombstones, " << deletes_of(rb) << " deletes";
  EXPECT_GT(rb.tombstones(), 0u);
  EXPECT_EQ(ra.tombstone_problems(), 0);
  EXPECT_EQ(rb.tombstone_problems(), 0);

  const size_t duplicates = ra.events().size() - ra.distinct();
  std::cout << (mongo ? "MongoDB" : "Postgres") << ": " << w.changes.size() << " changes, " << expected
            << " events; A: " << ra.events().size() << " records, " << ra.distinct() << " distinct, " << duplicates
            << " duplicates, " << ra.tombstones() << " tombstones, " << kills
            << " kills/restarts; B: " << rb.events().size() << " records, " << rb.tombstones() << " tombstones; "
            << rows.size() << " documents; " << std::chrono::duration<double>(Clock::now() - t0).count()
            << " s in all\n";
}

INSTANTIATE_TEST_SUITE_P(Sources, PipelineKillTest, ::testing::Values(Source::kPostgres, Source::kMongoDb),
                         source_name);

}  // namespace
}  // namespace sluice
