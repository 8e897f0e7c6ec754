// The MongoDB CDC source against the MongoDB-wire emulator of scripts/services/mongodb (mongo-java-server with
// its oplog; docs/services.md):
//  * insert / update / replace / delete produce exactly the expected envelopes (golden);
//  * ObjectId, Decimal128 (extreme exponents), dates, binary, int32/int64, nested documents and arrays
//    round-trip through the server: document -> server -> change stream -> Value -> BSON is the same document,
//    and the key as a filter finds it;
//  * stop with a savepoint, write while no job runs, restore: the stored resume token continues without loss;
//  * an initial snapshot under concurrent inserts/replaces/deletes: the final state per key equals the
//    collection's;
//  * a drop fails the job naming the collection (on-drop: fail);
//  * a collection pattern spreads collections over 2 subtasks and a collection created while the job runs is
//    discovered and read;
//  * changes read under 10 seeded failures (a map that throws; restarts from checkpoints): every change at
//    least once, per key first seen in source order;
//  * a snapshot checkpointed half-way resumes after the last _id emitted, across _id types (numbers, strings,
//    ObjectIds), at the first snapshot's resume point;
//  * a server paused with SIGSTOP (a private emulator this test starts) fails the reader within its socket
//    timeout instead of hanging.
// The history-lost path (error 286) cannot be produced by the emulator: see mongodb_change_mapping_test.
// Run: scripts/services/run-with mongodb -- build/<dir>/tests/mongodb_cdc_integration_test
// The failure points come from a fixed seed (SLUICE_TEST_SEED overrides it), printed by the test.
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/change_events.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace {

using sluice::testing::test_seed;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cdc::ChangeEvent;
using cdc::ChangeOp;

constexpr auto kDeadline = 90s;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using sluice::testing::unique_name;

/// A fresh directory under /tmp, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / unique_name("sluice-mongodb-cdc");
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Envelopes a sink received, waited on for up to kDeadline (the emulator is slow under load). Thread-safe.
struct Received : sluice::testing::ReceivedEvents {
  Received() : ReceivedEvents(kDeadline) {}
};
using sluice::testing::receiving_sink;

/// A plain libmongoc client for the test's writes and checks (one per thread).
class Client {
 public:
  explicit Client(const std::string& uri) {
    mongoc_init();
    client_ = mongoc_client_new(uri.c_str());
  }
  ~Client() { mongoc_client_destroy(client_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  mongoc_collection_t* coll(const std::string& db, const std::string& name) {
    return mongoc_client_get_collection(client_, db.c_str(), name.c_str());
  }
  void insert(const std::string& db, const std::string& name, const bson_t& doc) {
    mongoc_collection_t* c = coll(db, name);
    bson_error_t e;
    EXPECT_TRUE(mongoc_collection_insert_one(c, &doc, nullptr, nullptr, &e)) << e.message;
    mongoc_collection_destroy(c);
  }
  /// Inserts make(0) .. make(n - 1) in one bulk write (make returns a new bson_t, destroyed here).
  template <class Make>
  void insert_many(const std::string& db, const std::string& name, int64_t n, Make make) {
    mongoc_collection_t* c = coll(db, name);
    mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(c, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      bson_t* d = make(i);
      mongoc_bulk_operation_insert(bulk, d);
      bson_destroy(d);
    }
    bson_error_t e;
    EXPECT_NE(mongoc_bulk_operation_execute(bulk, nullptr, &e), 0u) << e.message;
    mongoc_bulk_operation_destroy(bulk);
    mongoc_collection_destroy(c);
  }
  void update(const std::string& db, const std::string& name, const bson_t& filter, const bson_t& update) {
    mongoc_collection_t* c = coll(db, name);
    bson_error_t e;
    EXPECT_TRUE(mongoc_collection_update_one(c, &filter, &update, nullptr, nullptr, &e)) << e.message;
    mongoc_collection_destroy(c);
  }
  void replace(const std::string& db, const std::string& name, const bson_t& filter, const bson_t& doc) {
    mongoc_collection_t* c = coll(db, name);
    bson_error_t e;
    EXPECT_TRUE(mongoc_collection_replace_one(c, &filter, &doc, nullptr, nullptr, &e)) << e.message;
    mongoc_collection_destroy(c);
  }
  void remove(const std::string& db, const std::string& name, const bson_t& filter) {
    mongoc_collection_t* c = coll(db, name);
    bson_error_t e;
    EXPECT_TRUE(mongoc_collection_delete_one(c, &filter, nullptr, nullptr, &e)) << e.message;
    mongoc_collection_destroy(c);
  }
  /// Every document of db.name as a Value (int32 tagged), by canonical _id JSON.
  std::map<std::string, Value> all(const std::string& db, const std::string& name) {
    std::map<std::string, Value> out;
    mongoc_collection_t* c = coll(db, name);
    bson_t filter = BSON_INITIALIZER;
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(c, &filter, nullptr, nullptr);
    const bson_t* doc = nullptr;
    while (mongoc_cursor_next(cur, &doc)) {
      Result<Value> v = mongodb::bson_to_value(*doc);
      EXPECT_TRUE(v.ok());
      out[v->find("_id")->to_json()] = *v;
    }
    bson_error_t e;
    EXPECT_FALSE(mongoc_cursor_error(cur, &e)) << e.message;
    mongoc_cursor_destroy(cur);
    mongoc_collection_destroy(c);
    bson_destroy(&filter);
    return out;
  }
  /// The change documents of db.name from cluster time `from` (inclusive) up to now, read with a raw change
  /// stream: (canonical resume token, _id JSON, cluster time) per change, for the at-least-once check.
  struct Change {
    std::string position;
    std::string id;
    MongoClusterTime time = 0;
  };
  std::vector<Change> changes(const std::string& db, const std::string& name, MongoClusterTime from, size_t expected) {
    std::vector<Change> out;
    mongoc_collection_t* c = coll(db, name);
    bson_t pipeline = BSON_INITIALIZER;
    bson_t* opts =
        BCON_NEW("startAtOperationTime", BCON_TIMESTAMP(static_cast<uint32_t>(from >> 32), static_cast<uint32_t>(from)),
                 "batchSize", BCON_INT32(10000));
    mongoc_change_stream_t* cs = mongoc_collection_watch(c, &pipeline, opts);
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (out.size() < expected && std::chrono::steady_clock::now() < deadline) {
      const bson_t* doc = nullptr;
      while (mongoc_change_stream_next(cs, &doc)) {
        bson_iter_t it;
        Change ch;
        uint32_t len = 0;
        const uint8_t* data = nullptr;
        if (bson_iter_init_find(&it, doc, "_id")) bson_iter_document(&it, &len, &data);
        ch.position = mongodb::bson_to_canonical_json(data, len);
        uint32_t t = 0;
        uint32_t i = 0;
        if (bson_iter_init_find(&it, doc, "clusterTime")) bson_iter_timestamp(&it, &t, &i);
        ch.time = mongo_cluster_time(t, i);
        if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "documentKey._id", &it)) {
          ch.id = mongodb::bson_iter_to_value(it)->to_json();
        }
        out.push_back(std::move(ch));
      }
      bson_error_t e;
      const bson_t* reply = nullptr;
      if (mongoc_change_stream_error_document(cs, &e, &reply)) {
        ADD_FAILURE() << e.message;
        break;
      }
    }
    mongoc_change_stream_destroy(cs);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
    return out;
  }

 private:
  mongoc_client_t* client_;
};

/// The cluster time now, as the source reads it.
MongoClusterTime cluster_time(const std::string& uri) {
  auto driver = mongodb::make_libmongoc_driver(uri).value_or_throw();
  MongoClusterTime t = 0;
  mongodb::DriverError e;
  EXPECT_TRUE(driver->cluster_time("admin", t, e)) << e.message;
  return t;
}

/// start_timestamp_ms() for a cluster time (whole seconds, so it may include earlier changes of the same second;
/// the tests use fresh collections). A fresh emulator has no oplog entry yet (time 0): start at 1 s.
int64_t start_ms(MongoClusterTime t) {
  return std::max<int64_t>(1000, static_cast<int64_t>(static_cast<uint64_t>(t) >> 32) * 1000);
}

bson_t* id_filter(int64_t id) {
  return BCON_NEW("_id", BCON_INT64(id));
}

class MongoCdcIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uri_ = sluice::testing::require_service("mongodb").get("MONGODB_URI");
    if (uri_.empty()) return;
    db_ = unique_name("sluice_it");
    client_ = std::make_unique<Client>(uri_);
  }

  static Configuration config(int parallelism) {
    Configuration c;
    c.set(options::kParallelism, parallelism);
    c.set(options::kRestartStrategy, std::string("none"));
    return c;
  }
  static Configuration checkpointing(int parallelism, const fs::path& dir, const std::string& interval) {
    Configuration c = config(parallelism);
    c.set_string(std::string(options::kCheckpointInterval.key), interval);
    c.set(options::kCheckpointDir, "file://" + dir.string());
    return c;
  }

  MongoCdcSourceBuilder source(const std::string& coll) const {
    MongoCdcSourceBuilder b = MongoCdcSource::builder();
    b.uri(uri_).database(db_).collections({coll}).poll_interval(5ms);
    return b;
  }

  std::string uri_;
  std::string db_;
  std::unique_ptr<Client> client_;
};

/// The envelope as JSON with the variable source fields (position, ts_ms) blanked.
std::string golden(const ChangeEvent& e) {
  ChangeEvent c = e;
  c.source.position = c.source.position.empty() ? "<none>" : "<token>";
  c.source.ts_ms = c.source.ts_ms > 0 ? 1 : 0;
  return c.to_value().to_json();
}

TEST_F(MongoCdcIntegrationTest, GoldenEnvelopesForInsertUpdateReplaceDelete) {
  const std::string coll = unique_name("golden");
  const MongoClusterTime start = cluster_time(uri_);
  StreamEnvironment env(config(1));
  auto out = std::make_shared<Received>();
  env.from_source(source(coll).start_mode(MongoStartMode::kTimestamp).start_timestamp_ms(start_ms(start)).build(),
                  "mongo")
      .uid("mongo")
      .sink_to(receiving_sink(out))
      .uid("sink");
  JobClient job = env.execute_async("golden");
  // One write at a time, each waited for: updateLookup reads the document when the change is read.
  bson_t* doc =
      BCON_NEW("_id", BCON_INT64(1), "name", BCON_UTF8("ada"), "n", BCON_INT32(1), "tags", "[", BCON_UTF8("a"), "]");
  client_->insert(db_, coll, *doc);
  ASSERT_TRUE(out->wait_for(1)) << "no insert event";
  bson_t* f = id_filter(1);
  bson_t* upd = BCON_NEW("$set", "{", "n", BCON_INT32(2), "}");
  client_->update(db_, coll, *f, *upd);
  ASSERT_TRUE(out->wait_for(2)) << "no update event";
  bson_t* rep = BCON_NEW("_id", BCON_INT64(1), "name", BCON_UTF8("grace"));
  client_->replace(db_, coll, *f, *rep);
  ASSERT_TRUE(out->wait_for(3)) << "no replace event";
  client_->remove(db_, coll, *f);
  ASSERT_TRUE(out->wait_for(4)) << "no delete event";
  for (bson_t* b : {doc, f, upd, rep})
    bson_destroy(b);
  job.cancel();
  job.wait();

  const std::vector<ChangeEvent> got = out->all();
  ASSERT_EQ(got.size(), 4u);
  const std::string src = R"("source":{"connector":"mongodb","db":")" + db_ + R"(","collection":")" + coll +
                          R"(","position":"<token>","ts_ms":1,"snapshot":false}})";
  EXPECT_EQ(golden(got[0]),
            R"({"op":"c","key":{"_id":1},"before":null,"after":{"_id":1,"name":"ada","n":1,"tags":["a"]},)" + src);
  EXPECT_EQ(golden(got[1]),
            R"({"op":"u","key":{"_id":1},"before":null,"after":{"_id":1,"name":"ada","n":2,"tags":["a"]},)" + src);
  EXPECT_EQ(golden(got[2]), R"({"op":"u","key":{"_id":1},"before":null,"after":{"_id":1,"name":"grace"},)" + src);
  EXPECT_EQ(golden(got[3]), R"({"op":"d","key":{"_id":1},"before":null,"after":null,)" + src);
  // Positions are the resume tokens, distinct and increasing; ts_ms is the cluster time.
  std::set<std::string> positions;
  for (const ChangeEvent& e : got) {
    positions.insert(e.source.position);
    EXPECT_NE(e.source.position.find("_data"), std::string::npos) << e.source.position;
    EXPECT_NEAR(static_cast<double>(e.source.ts_ms), static_cast<double>(wall_ms()), 120'000.0);
  }
  EXPECT_EQ(positions.size(), 4u);
}

TEST_F(MongoCdcIntegrationTest, ObjectIdDecimal128AndOtherTypesRoundTripThroughTheServer) {
  const std::string coll = unique_name("types");
  const MongoClusterTime start = cluster_time(uri_);
  StreamEnvironment env(config(1));
  auto out = std::make_shared<Received>();
  env.from_source(source(coll)
                      .start_mode(MongoStartMode::kTimestamp)
                      .start_timestamp_ms(start_ms(start))
                      .int32_mapping(mongodb::Int32Mapping::kTagged)
                      .build(),
                  "mongo")
      .uid("mongo")
      .sink_to(receiving_sink(out))
      .uid("sink");
  JobClient job = env.execute_async("types");
  std::vector<std::string> inserted;
  const char* decimals[] = {"1.50",    "-9999999999999999999999999999999999",       "1E+6111",
                            "1E-6176", "9.999999999999999999999999999999999E+6144", "0.000"};
  for (int k = 0; k < 6; ++k) {
    bson_oid_t oid;
    bson_oid_init(&oid, nullptr);
    bson_decimal128_t d;
    ASSERT_TRUE(bson_decimal128_from_string(decimals[k], &d));
    const uint8_t uuid[16] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, static_cast<uint8_t>(k)};
    bson_t* doc = BCON_NEW("_id", BCON_OID(&oid), "amount", BCON_DECIMAL128(&d), "at",
                           BCON_DATE_TIME(int64_t{1'700'000'000'123} + k), "uuid",
                           BCON_BIN(BSON_SUBTYPE_UUID, uuid, 16), "raw", BCON_BIN(BSON_SUBTYPE_BINARY, uuid, 3), "i32",
                           BCON_INT32(-7 - k), "i64", BCON_INT64(int64_t{1} << 40), "nested", "{", "list", "[",
                           BCON_INT32(1), "{", "deep", BCON_UTF8("x"), "}", "]", "}", "f", BCON_DOUBLE(0.5));
    inserted.push_back(mongodb::bson_to_canonical_json(*doc));
    client_->insert(db_, coll, *doc);
    bson_destroy(doc);
  }
  ASSERT_TRUE(out->wait_for(6)) << "got " << out->size();
  job.cancel();
  job.wait();
  const std::vector<ChangeEvent> got = out->all();
  ASSERT_EQ(got.size(), 6u);
  for (size_t k = 0; k < 6; ++k) {
    SCOPED_TRACE(k);
    ASSERT_EQ(got[k].op, ChangeOp::kCreate);
    EXPECT_EQ(got[k].after.find("_id")->find("$oid")->as_string().size(), 24u);
    EXPECT_TRUE(got[k].after.find("amount")->is_decimal()) << got[k].after.to_json();
    // Value -> BSON gives back the inserted document, byte for byte (canonical Extended JSON compared).
    Result<std::string> back = mongodb::value_to_bson(got[k].after);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(mongodb::bson_to_canonical_json(reinterpret_cast<const uint8_t*>(back->data()), back->size()),
              inserted[k]);
    // The key as a filter finds the document on the server.
    Result<std::string> filter = mongodb::value_to_bson(got[k].key);
    ASSERT_TRUE(filter.ok());
    bson_t fb;
    ASSERT_TRUE(bson_init_static(&fb, reinterpret_cast<const uint8_t*>(filter->data()), filter->size()));
    mongoc_collection_t* c = client_->coll(db_, coll);
    bson_error_t e;
    EXPECT_EQ(mongoc_collection_count_documents(c, &fb, nullptr, nullptr, nullptr, &e), 1) << e.message;
    mongoc_collection_destroy(c);
  }
}

TEST_F(MongoCdcIntegrationTest, ResumesFromTheStoredTokenAfterARestart) {
  const std::string coll = unique_name("resume");
  TempDir dir;
  const MongoClusterTime start = cluster_time(uri_);
  auto build = [&] {
    return source(coll).start_mode(MongoStartMode::kTimestamp).start_timestamp_ms(start_ms(start)).build();
  };
  auto insert_range = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      bson_t* d = BCON_NEW("_id", BCON_INT64(i), "v", BCON_INT64(i));
      client_->insert(db_, coll, *d);
      bson_destroy(d);
    }
  };
  std::string savepoint;
  auto first = std::make_shared<Received>();
  {
    StreamEnvironment env(checkpointing(1, dir.path() / "checkpoints", "3600s"));
    env.from_source(build(), "mongo").uid("mongo").sink_to(receiving_sink(first)).uid("sink");
    JobClient job = env.execute_async("before the restart");
    insert_range(0, 300);
    ASSERT_TRUE(first->wait_for(300)) << "got " << first->size();
    Result<std::string> sp = job.stop_with_savepoint((dir.path() / "savepoints").string()).get();
    ASSERT_TRUE(sp.ok()) << sp.error().to_string();
    savepoint = *sp;
    JobResult r = job.wait();
    ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  }
  insert_range(300, 500);  // while no job runs
  Configuration c = checkpointing(1, dir.path() / "checkpoints", "200ms");
  c.set(options::kStateRecoveryPath, savepoint);
  StreamEnvironment env(c);
  auto second = std::make_shared<Received>();
  env.from_source(build(), "mongo").uid("mongo").sink_to(receiving_sink(second)).uid("sink");
  JobClient job = env.execute_async("after the restart");
  insert_range(500, 600);  // while the restored job runs
  ASSERT_TRUE(second->wait_for(300)) << "got " << second->size();
  job.cancel();
  job.wait();
  // The first job saw 0..299, the restored one exactly 300..599 in order: no loss, and (stop-with-savepoint
  // records the exact position) no repeat. The second job's start would have replayed from 0 without the token.
  std::vector<ChangeEvent> a = first->all();
  std::vector<ChangeEvent> b = second->all();
  ASSERT_EQ(a.size(), 300u);
  ASSERT_EQ(b.size(), 300u);
  for (int64_t i = 0; i < 300; ++i) {
    EXPECT_EQ(a[static_cast<size_t>(i)].key.find("_id")->as_int64(), i);
    EXPECT_EQ(b[static_cast<size_t>(i)].key.find("_id")->as_int64(), 300 + i);
  }
}

TEST_F(MongoCdcIntegrationTest, SnapshotWithConcurrentWritesEndsInTheCollectionsState) {
  const std::string coll = unique_name("snapshot");
  constexpr int64_t kInitial = 3000;
  constexpr int64_t kKeys = 4000;
  client_->insert_many(db_, coll, kInitial,
                       [](int64_t i) { return BCON_NEW("_id", BCON_INT64(i), "v", BCON_INT64(0)); });
  StreamEnvironment env(config(1));
  auto out = std::make_shared<Received>();
  env.from_source(source(coll).start_mode(MongoStartMode::kInitial).batch_size(256).build(), "mongo")
      .uid("mongo")
      .sink_to(receiving_sink(out))
      .uid("sink");
  JobClient job = env.execute_async("snapshot");
  // Concurrent writes from the start of the job until the snapshot is well under way and a while after.
  std::mt19937_64 rng(test_seed());
  std::set<int64_t> present;
  for (int64_t i = 0; i < kInitial; ++i)
    present.insert(i);
  Client writer(uri_);
  int64_t writes = 0;
  for (; writes < 3000; ++writes) {
    const int64_t k = static_cast<int64_t>(rng() % kKeys);
    bson_t* f = id_filter(k);
    if (present.count(k) == 0) {
      bson_t* d = BCON_NEW("_id", BCON_INT64(k), "v", BCON_INT64(writes + 1));
      writer.insert(db_, coll, *d);
      bson_destroy(d);
      present.insert(k);
    } else if (rng() % 4 == 0) {
      writer.remove(db_, coll, *f);
      present.erase(k);
    } else {
      bson_t* d = BCON_NEW("_id", BCON_INT64(k), "v", BCON_INT64(writes + 1));
      writer.replace(db_, coll, *f, *d);
      bson_destroy(d);
    }
    bson_destroy(f);
  }
  // A marker written last: once it arrives, every earlier change has (one stream, one order).
  bson_t* marker = BCON_NEW("_id", BCON_INT64(-1), "v", BCON_INT64(-1));
  writer.insert(db_, coll, *marker);
  bson_destroy(marker);
  ASSERT_TRUE(out->wait_until([](const std::vector<ChangeEvent>& ev) {
    return std::any_of(ev.begin(), ev.end(), [](const ChangeEvent& e) {
      return e.op != ChangeOp::kRead && e.key.find("_id")->as_int64() == -1;
    });
  })) << "the marker did not arrive; got "
      << out->size();
  job.cancel();
  job.wait();
  const std::vector<ChangeEvent> got = out->all();
  std::map<std::string, Value> state;
  size_t reads = 0;
  size_t overlap = 0;
  for (const ChangeEvent& e : got) {
    const std::string id = e.key.find("_id")->to_json();
    if (e.op == ChangeOp::kRead) ++reads;
    if (e.op != ChangeOp::kRead && e.source.snapshot) ++overlap;
    if (e.op == ChangeOp::kDelete) {
      state.erase(id);
    } else if (!e.after.is_null()) {
      state[id] = e.after;
    }
  }
  std::printf("snapshot: %zu reads, %zu stream events (%zu marked as overlapping the snapshot), %lld writes\n", reads,
              got.size() - reads, overlap, static_cast<long long>(writes));
  EXPECT_GE(reads, 1u);
  const std::map<std::string, Value> truth = client_->all(db_, coll);
  EXPECT_EQ(state.size(), truth.size());
  size_t mismatches = 0;
  for (const auto& [id, doc] : truth) {
    auto it = state.find(id);
    if (it == state.end() || it->second != doc) {
      if (++mismatches <= 5)
        ADD_FAILURE() << "key " << id << ": collection " << doc.to_json() << ", envelopes "
                      << (it == state.end() ? "absent" : it->second.to_json());
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(MongoCdcIntegrationTest, DropFailsTheJobNamingTheCollection) {
  const std::string coll = unique_name("drop");
  const MongoClusterTime start = cluster_time(uri_);
  StreamEnvironment env(config(1));
  auto out = std::make_shared<Received>();
  env.from_source(source(coll).start_mode(MongoStartMode::kTimestamp).start_timestamp_ms(start_ms(start)).build(),
                  "mongo")
      .uid("mongo")
      .sink_to(receiving_sink(out))
      .uid("sink");
  JobClient job = env.execute_async("drop");
  bson_t* d = BCON_NEW("_id", BCON_INT64(1));
  client_->insert(db_, coll, *d);
  bson_destroy(d);
  ASSERT_TRUE(out->wait_for(1));
  mongoc_collection_t* c = client_->coll(db_, coll);
  bson_error_t e;
  ASSERT_TRUE(mongoc_collection_drop(c, &e)) << e.message;
  mongoc_collection_destroy(c);
  ASSERT_TRUE(job.wait_for(kDeadline)) << "the drop did not end the job";
  JobResult r = job.wait();
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_NE(msg.find("'" + db_ + "." + coll + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("drop"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on_drop(MongoOnDrop::kEndSplit)"), std::string::npos) << msg;
}

TEST_F(MongoCdcIntegrationTest, CollectionsByPatternAreSpreadAndDiscoveredWhileRunning) {
  const std::string prefix = unique_name("disc");
  auto insert = [&](const std::string& coll, int64_t from, int64_t to) {
    client_->insert_many(db_, coll, to - from, [from](int64_t i) { return BCON_NEW("_id", BCON_INT64(from + i)); });
  };
  insert(prefix + "_a", 0, 50);
  insert(prefix + "_b", 0, 50);
  insert(unique_name("other"), 0, 10);  // does not match
  StreamEnvironment env(config(2));
  auto out = std::make_shared<Received>();
  MongoCdcSourceBuilder b = MongoCdcSource::builder();
  b.uri(uri_)
      .database(db_)
      .collection_pattern(prefix + "_.*")
      .start_mode(MongoStartMode::kInitial)
      .discovery_interval(200ms)
      .poll_interval(5ms);
  env.from_source(b.build(), "mongo").uid("mongo").sink_to(receiving_sink(out)).uid("sink");
  JobClient job = env.execute_async("pattern");
  ASSERT_TRUE(out->wait_for(100)) << "got " << out->size();
  insert(prefix + "_a", 50, 60);   // streamed
  insert(prefix + "_new", 0, 30);  // a new collection: discovered, snapshotted or streamed
  auto count = [&](const std::vector<ChangeEvent>& ev, const std::string& coll) {
    std::set<int64_t> ids;
    for (const ChangeEvent& e : ev) {
      if (e.source.collection == coll) ids.insert(e.key.find("_id")->as_int64());
    }
    return ids.size();
  };
  const bool all = out->wait_until([&](const std::vector<ChangeEvent>& ev) {
    return count(ev, prefix + "_a") == 60 && count(ev, prefix + "_b") == 50 && count(ev, prefix + "_new") == 30;
  });
  job.cancel();
  job.wait();
  const std::vector<ChangeEvent> got = out->all();
  ASSERT_TRUE(all) << "a " << count(got, prefix + "_a") << "/60, b " << count(got, prefix + "_b") << "/50, new "
                   << count(got, prefix + "_new") << "/30";
  for (const ChangeEvent& e : got)
    EXPECT_TRUE(e.source.collection.starts_with(prefix)) << e.source.collection;
  // Where the owner rule puts the collections (parallelism 2): printed for the record.
  std::printf("owners: _a -> %d, _b -> %d, _new -> %d\n", mongodb::collection_split_owner(db_ + "." + prefix + "_a", 2),
              mongodb::collection_split_owner(db_ + "." + prefix + "_b", 2),
              mongodb::collection_split_owner(db_ + "." + prefix + "_new", 2));
}

using FailingMap = sluice::testing::FailingIdentity<ChangeEvent>;

// Measured on the 2-core development machine (2026-11-30, release build, fresh emulator, writes in bulk batches
// of 1000): with moderate load the 100 k writes took 4.7 s and the job read the ~108 k envelopes (replays after
// the 10 restarts included) in 13.2 s (~8 k events/s), 19.5 s for the test and 23 s for the whole suite; with
// three other builds running (load average 8-9) 33 s + 53 s (~2 k events/s: the emulator filters its whole oplog
// on every getMore), 93 s for the test. The timings are printed on every run.
TEST_F(MongoCdcIntegrationTest, ChangesUnderTenSeededFailuresAreAllSeenInPerKeyOrder) {
  constexpr int64_t kChanges = 100'000;
  constexpr int64_t kKeys = 1000;
  constexpr int kFailures = 10;
  const std::string coll = unique_name("failures");
  TempDir dir;
  const MongoClusterTime start = cluster_time(uri_);
  const auto t0 = std::chrono::steady_clock::now();
  // Writes: each key inserted once, then replaced with increasing versions (replace events carry the _id in
  // the emulator's documentKey; no deletes, whose earlier updates the emulator could not key when re-read).
  client_->insert_many(db_, coll, kKeys, [](int64_t k) { return BCON_NEW("_id", BCON_INT64(k), "v", BCON_INT64(0)); });
  {
    // Replaces in ordered bulk writes of 1000 (one oplog entry, so one change event, per replace).
    mongoc_collection_t* c = client_->coll(db_, coll);
    for (int64_t from = kKeys; from < kChanges; from += 1000) {
      mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(c, nullptr);
      for (int64_t i = from; i < std::min(kChanges, from + 1000); ++i) {
        bson_t* f = id_filter(i % kKeys);
        bson_t* d = BCON_NEW("_id", BCON_INT64(i % kKeys), "v", BCON_INT64(i));
        bson_error_t e;
        ASSERT_TRUE(mongoc_bulk_operation_replace_one_with_opts(bulk, f, d, nullptr, &e)) << e.message;
        bson_destroy(f);
        bson_destroy(d);
      }
      bson_error_t e;
      ASSERT_NE(mongoc_bulk_operation_execute(bulk, nullptr, &e), 0u) << e.message;
      mongoc_bulk_operation_destroy(bulk);
    }
    mongoc_collection_destroy(c);
  }
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<Client::Change> truth = client_->changes(db_, coll, start, kChanges);
  ASSERT_EQ(truth.size(), static_cast<size_t>(kChanges));

  const uint64_t seed = test_seed();
  std::printf("seed %llu (SLUICE_TEST_SEED overrides it)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto thresholds = std::make_shared<std::vector<int64_t>>();
  for (int i = 0; i < kFailures; ++i)
    thresholds->push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(kChanges / 12)) + 1);
  auto fired = std::make_shared<std::atomic<int>>(0);
  Configuration c = checkpointing(1, dir.path() / "checkpoints", "200ms");
  c.set(options::kCheckpointMode, std::string("AT_LEAST_ONCE"));
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 1000);
  c.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
  c.set(options::kTolerableFailedCheckpoints, 1000);
  StreamEnvironment env(c);
  auto out = std::make_shared<Received>();
  auto src = source(coll).start_mode(MongoStartMode::kTimestamp).start_timestamp_ms(start_ms(start)).build();
  env.from_source(src, "mongo")
      .uid("mongo")
      .map(FailingMap{fired, thresholds})
      .uid("failing-map")
      .sink_to(receiving_sink(out))
      .uid("sink");
  const auto t1 = std::chrono::steady_clock::now();
  JobClient job = env.execute_async("failures");
  const std::string last = truth.back().position;
  const bool done = out->wait_until(
      [&](const std::vector<ChangeEvent>& ev) {
        return fired->load() == kFailures && !ev.empty() && ev.back().source.position == last;
      },
      150s);
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const int restarts = job.restarts();
  job.cancel();
  job.wait();
  ASSERT_TRUE(done) << "failures fired " << fired->load() << ", received " << out->size();
  const std::vector<ChangeEvent> got = out->all();
  std::printf("%lld changes written in %.1f s; read %zu envelopes (%d restarts) in %.1f s: %.0f events/s\n",
              static_cast<long long>(kChanges), write_s, got.size(), restarts, read_s,
              static_cast<double>(got.size()) / read_s);
  EXPECT_EQ(restarts, kFailures);
  // Every change at least once.
  std::set<std::string> seen;
  for (const ChangeEvent& e : got)
    seen.insert(e.source.position);
  size_t missing = 0;
  for (const Client::Change& ch : truth) {
    if (seen.count(ch.position) == 0 && ++missing <= 5) ADD_FAILURE() << "change " << ch.position << " is missing";
  }
  EXPECT_EQ(missing, 0u);
  // Per key, changes first appear in source order (repeats after a restart replay an earlier stretch).
  std::map<std::string, MongoClusterTime> time_of;
  for (const Client::Change& ch : truth)
    time_of[ch.position] = ch.time;
  std::set<std::string> first_seen;
  std::map<std::string, MongoClusterTime> last_first;
  size_t disorder = 0;
  for (const ChangeEvent& e : got) {
    if (!first_seen.insert(e.source.position).second) continue;
    const std::string key = e.key.to_json();
    const MongoClusterTime t = time_of[e.source.position];
    auto [it, fresh] = last_first.emplace(key, t);
    if (!fresh) {
      if (t < it->second && ++disorder <= 5) ADD_FAILURE() << "key " << key << " out of order at " << e.source.position;
      it->second = std::max(it->second, t);
    }
  }
  EXPECT_EQ(disorder, 0u);
  EXPECT_GT(got.size(), static_cast<size_t>(kChanges));  // restarts replayed something
}

/// What a reader driven by the test needs from its task.
class ReaderContext final : public SourceReaderContext {
 public:
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  void send_split_request() override {}
  void wakeup() override {}
  void wakeup_at(TimestampMs) override {}
  const Clock& clock() const override { return clock_; }

 private:
  SystemClock clock_;
};

/// Collects a reader's records.
class CollectingOutput final : public ReaderOutput<ChangeEvent> {
 public:
  void collect(ChangeEvent&& r) override { events.push_back(std::move(r)); }
  void collect(ChangeEvent&& r, TimestampMs) override { events.push_back(std::move(r)); }
  void emit_watermark(TimestampMs) override {}
  void release_output_for_split(const std::string&) override {}
  std::vector<ChangeEvent> events;
};

TEST_F(MongoCdcIntegrationTest, SnapshotCheckpointedHalfWayResumesAfterTheLastIdAcrossIdTypes) {
  const std::string coll = unique_name("snapresume");
  // _ids of three types: MongoDB sorts numbers, then strings, then ObjectIds.
  for (int64_t i = 1; i <= 5; ++i) {
    bson_t* d = BCON_NEW("_id", BCON_INT64(i), "v", BCON_INT64(0));
    client_->insert(db_, coll, *d);
    bson_destroy(d);
  }
  for (const char* s : {"a", "b"}) {
    bson_t* d = BCON_NEW("_id", BCON_UTF8(s), "v", BCON_INT64(0));
    client_->insert(db_, coll, *d);
    bson_destroy(d);
  }
  for (const char* hex : {"5f1e2d3c4b5a69788796a5b4", "5f1e2d3c4b5a69788796a5b5"}) {
    bson_oid_t oid;
    bson_oid_init_from_string(&oid, hex);
    bson_t* d = BCON_NEW("_id", BCON_OID(&oid), "v", BCON_INT64(0));
    client_->insert(db_, coll, *d);
    bson_destroy(d);
  }
  ReaderContext ctx;
  auto src = source(coll).batch_size(3).build();
  MongoCollectionSplit split;
  split.database = db_;
  split.collection = coll;
  split.snapshot_pending = true;
  std::vector<MongoCollectionSplit> state;
  CollectingOutput first;
  {
    auto r = src->create_reader(ctx);
    r->add_splits({split});
    r->poll_next(first);
    ASSERT_EQ(first.events.size(), 3u);
    state = r->snapshot_state(1);
    r->close();
  }
  ASSERT_EQ(state.size(), 1u);
  ASSERT_TRUE(state[0].snapshot_pending);
  const MongoClusterTime t0 = state[0].start_at;
  // A change after T0 to a document the first reader already emitted: the restore must still stream it.
  bson_t* f = id_filter(2);
  bson_t* u = BCON_NEW("$set", "{", "v", BCON_INT64(1), "}");
  client_->update(db_, coll, *f, *u);
  bson_destroy(f);
  bson_destroy(u);

  CollectingOutput second;
  auto r = src->create_reader(ctx);
  r->add_splits(std::move(state));
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  auto has_update = [&] {
    return std::any_of(second.events.begin(), second.events.end(),
                       [](const ChangeEvent& e) { return e.op == ChangeOp::kUpdate; });
  };
  while (!has_update() && std::chrono::steady_clock::now() < deadline)
    r->poll_next(second);
  r->close();
  std::vector<std::string> ids;
  for (const auto* out : {&first, &second}) {
    for (const ChangeEvent& e : out->events) {
      if (e.op == ChangeOp::kRead) ids.push_back(e.key.find("_id")->to_json());
    }
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"1", "2", "3", "4", "5", R"("a")", R"("b")",
                                           R"({"$oid":"5f1e2d3c4b5a69788796a5b4"})",
                                           R"({"$oid":"5f1e2d3c4b5a69788796a5b5"})"}))
      << "every document once, in _id order";
  // 6 reads, the insert at T0 itself (the stream starts at T0 inclusive: an overlap, marked as such), the update.
  ASSERT_EQ(second.events.size(), 8u);
  EXPECT_EQ(second.events[6].op, ChangeOp::kCreate);
  EXPECT_TRUE(second.events[6].source.snapshot);
  EXPECT_EQ(second.events.back().op, ChangeOp::kUpdate);
  EXPECT_EQ(second.events.back().key.to_json(), R"({"_id":2})");
  EXPECT_GE(cluster_time(uri_), t0);
}

/// A private emulator (scripts/services/mongodb with its own SLUICE_SERVICES_DIR) that the test may pause;
/// SIGCONT and stop on every exit.
class PrivateMongo {
 public:
  PrivateMongo() {
    dir_ = fs::temp_directory_path() / unique_name("sluice-private-mongo");
    fs::create_directories(dir_);
    const std::string out = run("start");
    const auto at = out.find("MONGODB_URI=");
    if (at != std::string::npos) uri_ = out.substr(at + 12, out.find('\n', at) - at - 12);
    std::ifstream pid_file(dir_ / "mongodb" / "pid");
    pid_file >> pid_;
  }
  ~PrivateMongo() {
    resume();
    run("stop");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& uri() const { return uri_; }
  pid_t pid() const { return pid_; }
  void pause() {
    if (pid_ > 0 && ::kill(pid_, SIGSTOP) == 0) paused_ = true;
  }
  void resume() {
    if (paused_ && pid_ > 0) ::kill(pid_, SIGCONT);
    paused_ = false;
  }

 private:
  std::string run(const std::string& verb) {
    const std::string cmd = "SLUICE_SERVICES_DIR='" + dir_.string() +
                            "' '" SLUICE_SOURCE_DIR "/scripts/services/mongodb' " + verb + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr)
      out += buf;
    ::pclose(p);
    return out;
  }
  fs::path dir_;
  std::string uri_;
  pid_t pid_ = -1;
  bool paused_ = false;
};

TEST_F(MongoCdcIntegrationTest, PausedServerFailsTheReaderWithinItsSocketTimeout) {
  PrivateMongo mongo;
  ASSERT_FALSE(mongo.uri().empty()) << "the private emulator did not start";
  ASSERT_GT(mongo.pid(), 0);
  const std::string coll = unique_name("paused");
  Client client(mongo.uri());
  constexpr auto kSocketTimeout = 2s;
  auto src = MongoCdcSource::builder()
                 .uri(mongo.uri())
                 .database(db_)
                 .collections({coll})
                 .start_mode(MongoStartMode::kLatest)
                 .socket_timeout(kSocketTimeout)
                 .build();
  ReaderContext ctx;
  CollectingOutput out;
  auto r = src->create_reader(ctx);
  MongoCollectionSplit split;
  split.database = db_;
  split.collection = coll;
  split.start_at = cluster_time(mongo.uri()) + 1;
  r->add_splits({split});
  bson_t* d = BCON_NEW("_id", BCON_INT64(1));
  client.insert(db_, coll, *d);
  bson_destroy(d);
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (out.events.empty() && std::chrono::steady_clock::now() < deadline)
    r->poll_next(out);
  ASSERT_EQ(out.events.size(), 1u) << "the stream works before the pause";

  // Paused: every read now waits for a reply that does not come. The reader must fail, not poll for ever.
  mongo.pause();
  const auto paused_at = std::chrono::steady_clock::now();
  std::string failure;
  while (failure.empty() && std::chrono::steady_clock::now() < paused_at + 60s) {
    try {
      r->poll_next(out);
    } catch (const SluiceException& e) {
      failure = e.error().message();
    }
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - paused_at);
  mongo.resume();
  std::printf("a paused server failed the reader after %lld ms (socket timeout %lld ms): %s\n",
              static_cast<long long>(took.count()), static_cast<long long>(kSocketTimeout / 1ms), failure.c_str());
  ASSERT_FALSE(failure.empty()) << "the reader did not fail within 60 s of the pause";
  // One read times out after the socket timeout, then libmongoc's one resume attempt: its handshake times out
  // after connectTimeoutMS (= the socket timeout here).
  EXPECT_LE(took, 2 * kSocketTimeout + 3s);
  EXPECT_NE(failure.find(coll), std::string::npos) << failure;
  EXPECT_NE(failure.find("did not answer within the socket timeout (2000 ms"), std::string::npos) << failure;
  r->close();
}

// health.max-source-lag on an idle, caught-up collection returned 503 five seconds after the last change: the lag
// was the age of the last change. It is now measured against the server's position: an empty getMore batch says
// the stream had nothing newer, so the split is caught up then. Run against the emulator: its change streams
// answer an idle getMore with an empty batch after maxAwaitTimeMS, which is what this relies on (a real server
// does the same and also advances the postBatchResumeToken, which the reader adopts).
TEST_F(MongoCdcIntegrationTest, AnIdleCaughtUpCollectionDoesNotLag) {
  const std::string coll = unique_name("idlelag");
  auto src = source(coll).start_mode(MongoStartMode::kLatest).max_await(200ms).build();
  ReaderContext ctx;
  CollectingOutput out;
  auto r = src->create_reader(ctx);
  MongoCollectionSplit split;
  split.database = db_;
  split.collection = coll;
  split.start_at = cluster_time(uri_) + 1;
  r->add_splits({split});
  bson_t* d = BCON_NEW("_id", BCON_INT64(1));
  client_->insert(db_, coll, *d);
  bson_destroy(d);
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (out.events.empty() && std::chrono::steady_clock::now() < deadline)
    r->poll_next(out);
  ASSERT_EQ(out.events.size(), 1u);
  // Idle for 3 s after the change, polling as the task does: the lag stays within a poll of the server's answer.
  const auto wall_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  int64_t max_lag = 0;
  const auto idle_until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < idle_until) {
    r->poll_next(out);
    max_lag = std::max(max_lag, src->metrics()->lag_ms(wall_ms()));
  }
  std::printf("idle, caught-up collection: largest lag over 3 s without changes: %lld ms\n",
              static_cast<long long>(max_lag));
  EXPECT_EQ(out.events.size(), 1u);
  EXPECT_LE(max_lag, 1500) << "the lag grew with the age of the last change";
  r->close();
}

}  // namespace
}  // namespace sluice
