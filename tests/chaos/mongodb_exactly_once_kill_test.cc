// Chaos test of exactly-once from MongoDB (issue 14): `sluice run` of a pipeline MongoDB -> Kafka with
// `delivery: exactly-once` and 200 ms checkpoints is SIGKILLed at seeded random moments (one of them during the
// initial snapshot, after a checkpoint of that snapshot completed) and restarted from its checkpoints each time,
// while a seeded workload of inserts, replaces and deletes runs. Then a read_committed consumer reads the topic:
//  (a) zero duplicates: every event id (domain event ids derive from the source position and the key) appears once;
//  (b) zero missing, zero extra stream events: the positions of the committed c/u/d events are exactly the change
//      stream of the collection from the snapshot's resume point T0 (read by the test with its own change stream);
//  (c) the snapshot: every `r` read has the same T0 (one snapshot, resumed across the kill, not restarted), no
//      document is read twice, and every document the workload never touched is read once;
//  (d) per-key order: the stream events of each entity come in change-stream order (one entity, one partition);
//  (e) the run after the kill during the snapshot resumed the scan after the last document of the checkpoint,
//      and every restart resumed from a checkpoint;
//  (f) tombstones (the Kafka sink's tombstones-on-delete, default true): per entity, every delete is followed by
//      one tombstone (its key, a null value, in the same transaction) and every tombstone follows a delete.
// Scale: SLUICE_CHAOS_SCALE (a factor, default 1: 20,000 documents, 2,000 changes, 1 + 3 kills, 1-2.5 minutes on
// two busy cores: the emulator slows down as its oplog grows). By hand, e.g. SLUICE_CHAOS_SCALE=20: 40,000
// changes, 1 + 60 kills.
// The seed is printed; SLUICE_TEST_SEED replays it.
// Run: scripts/services/run-with mongodb kafka -- build/<preset>/tests/mongodb_exactly_once_kill_test
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace kafka = sluice::testing::kafka;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;
using sluice::testing::poll_until;
using sluice::testing::unique_name;

constexpr int kDocuments = 50'000;  // in the collection before the job starts: the initial snapshot
constexpr int kChanges = 2'000;     // the workload while the job runs
constexpr int kStreamKills = 3;
constexpr int kBatch = 100;             // changes per bulk write
constexpr int kChangesPerSecond = 600;  // the workload's pace: the kills spread over some seconds
constexpr int kPartitions = 3;
constexpr auto kStartDeadline = 90s;
constexpr auto kCatchUpDeadline = 120s;

// ---------------------------------------------------------------------------------------------------------------
// The workload: seeded inserts (new ids), replaces and deletes over the snapshot's documents and the new ones.

struct Change {
  enum Kind { kInsert, kReplace, kDelete } kind;
  int64_t id;
  int64_t revision;
};

struct Workload {
  std::vector<Change> changes;
  std::set<int64_t> touched;  // ids the workload changes (their snapshot read may or may not exist)
};

Workload make_workload(uint64_t seed, int documents, int changes) {
  std::mt19937_64 rnd(seed);
  Workload w;
  std::map<int64_t, int64_t> live;  // id -> revision
  for (int64_t id = 0; id < documents; ++id)
    live[id] = 0;
  int64_t next_id = documents;
  // Changes go to a window of "hot" ids so that entities get several changes each (order per key matters).
  const int64_t hot = std::max<int64_t>(50, changes / 8);
  for (int i = 0; i < changes; ++i) {
    const int64_t id = static_cast<int64_t>(rnd() % static_cast<uint64_t>(hot)) * (documents / hot + 1);
    const int64_t target = rnd() % 4 == 0 ? next_id++ : id;
    auto it = live.find(target);
    if (it == live.end()) {
      live[target] = 0;
      w.changes.push_back({Change::kInsert, target, 0});
    } else if (rnd() % 100 < 10) {
      live.erase(it);
      w.changes.push_back({Change::kDelete, target, 0});
    } else {
      w.changes.push_back({Change::kReplace, target, ++it->second});
    }
    w.touched.insert(target);
  }
  return w;
}

class Mongo {
 public:
  explicit Mongo(std::string uri) : uri_(std::move(uri)), db_(unique_name("eo_chaos")) {
    mongoc_init();
    client_ = mongoc_client_new(uri_.c_str());
    coll_ = mongoc_client_get_collection(client_, db_.c_str(), "charges");
  }
  ~Mongo() {
    mongoc_database_t* db = mongoc_client_get_database(client_, db_.c_str());
    mongoc_database_drop(db, nullptr);
    mongoc_database_destroy(db);
    mongoc_collection_destroy(coll_);
    mongoc_client_destroy(client_);
  }
  const std::string& db() const { return db_; }

  void insert_documents(int n) {
    for (int begin = 0; begin < n; begin += 1000) {
      mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(coll_, nullptr);
      for (int id = begin; id < std::min(n, begin + 1000); ++id) {
        bson_t* doc = BCON_NEW("_id", BCON_INT64(id), "status", BCON_UTF8("created"), "revision", BCON_INT64(0));
        mongoc_bulk_operation_insert(bulk, doc);
        bson_destroy(doc);
      }
      execute(bulk);
    }
  }

  void apply(const std::vector<Change>& changes, size_t begin, size_t end) {
    mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(coll_, nullptr);
    bson_error_t e;
    for (size_t i = begin; i < end; ++i) {
      const Change& c = changes[i];
      bson_t* filter = BCON_NEW("_id", BCON_INT64(c.id));
      if (c.kind == Change::kDelete) {
        EXPECT_TRUE(mongoc_bulk_operation_remove_one_with_opts(bulk, filter, nullptr, &e)) << e.message;
      } else {
        // Replaces carry the _id (the emulator's documentKey of an update is the new document).
        bson_t* doc = BCON_NEW("_id", BCON_INT64(c.id), "status", BCON_UTF8(c.kind == Change::kInsert ? "new" : "set"),
                               "revision", BCON_INT64(c.revision));
        if (c.kind == Change::kInsert) {
          EXPECT_TRUE(mongoc_bulk_operation_insert_with_opts(bulk, doc, nullptr, &e)) << e.message;
        } else {
          EXPECT_TRUE(mongoc_bulk_operation_replace_one_with_opts(bulk, filter, doc, nullptr, &e)) << e.message;
        }
        bson_destroy(doc);
      }
      bson_destroy(filter);
    }
    execute(bulk);
  }

  /// One change of the collection as the source sees it: its resume token (canonical Extended JSON, the
  /// envelope's source.position) and its document _id.
  struct StreamChange {
    std::string position;
    std::string id;
    std::string op;
  };
  /// Every change from cluster time (t, i) inclusive (startAtOperationTime, as the source streams after its
  /// snapshot), read with a raw change stream until it is drained twice in a row.
  std::vector<StreamChange> changes_from(uint32_t t, uint32_t i) {
    std::vector<StreamChange> out;
    bson_t pipeline = BSON_INITIALIZER;
    bson_t* opts = BCON_NEW("startAtOperationTime", BCON_TIMESTAMP(t, i), "batchSize", BCON_INT32(10000));
    mongoc_change_stream_t* cs = mongoc_collection_watch(coll_, &pipeline, opts);
    int empty = 0;
    const auto deadline = Clock::now() + 120s;
    while (empty < 2 && Clock::now() < deadline) {
      const bson_t* doc = nullptr;
      bool any = false;
      while (mongoc_change_stream_next(cs, &doc)) {
        any = true;
        bson_iter_t it;
        StreamChange ch;
        uint32_t len = 0;
        const uint8_t* data = nullptr;
        if (bson_iter_init_find(&it, doc, "_id")) bson_iter_document(&it, &len, &data);
        ch.position = mongodb::bson_to_canonical_json(data, len);
        if (bson_iter_init_find(&it, doc, "operationType")) ch.op = bson_iter_utf8(&it, nullptr);
        if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "documentKey._id", &it)) {
          ch.id = std::to_string(bson_iter_as_int64(&it));
        } else if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "fullDocument._id", &it)) {
          ch.id = std::to_string(bson_iter_as_int64(&it));
        }
        out.push_back(std::move(ch));
      }
      bson_error_t e;
      const bson_t* reply = nullptr;
      if (mongoc_change_stream_error_document(cs, &e, &reply)) {
        ADD_FAILURE() << "the test's change stream failed: " << e.message;
        break;
      }
      empty = any ? 0 : empty + 1;
    }
    mongoc_change_stream_destroy(cs);
    bson_destroy(opts);
    return out;
  }

  std::string source_yaml() const {
    return "source:\n  type: mongodb\n  uri: \"" + uri_ + "\"\n  database: " + db_ +
           "\n  collections: [charges]\n  start: initial\n";
  }

 private:
  static void execute(mongoc_bulk_operation_t* bulk) {
    bson_error_t e;
    bson_t reply;
    EXPECT_NE(mongoc_bulk_operation_execute(bulk, &reply, &e), 0u) << e.message;
    bson_destroy(&reply);
    mongoc_bulk_operation_destroy(bulk);
  }

  std::string uri_;
  std::string db_;
  mongoc_client_t* client_ = nullptr;
  mongoc_collection_t* coll_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// The topic, read as a consumer of the job's output would: read_committed, every partition from the start.

struct Event {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string id;
  std::string op;
  std::string entity;
  std::string position;
  std::string json;
};

// One record of the topic as an Event (nullopt and a test failure when it is not a JSON object).
std::optional<Event> parse_event(const chaos::KafkaRecord& r, const std::string& topic) {
  if (r.tombstone) {  // a tombstone: the entity is its key; its id is its place (never a duplicate)
    Event e;
    e.partition = r.partition;
    e.offset = r.offset;
    e.op = "tombstone";
    e.entity = r.key;
    e.id = "tombstone@" + std::to_string(r.partition) + ":" + std::to_string(r.offset);
    e.json = "null";
    return e;
  }
  std::optional<Value> v = chaos::json_object(r, topic);
  if (!v) return std::nullopt;
  auto text = [](const Value* f) {
    return f == nullptr ? std::string("<absent>") : f->is_string() ? std::string(f->as_string()) : f->to_json();
  };
  Event e;
  e.partition = r.partition;
  e.offset = r.offset;
  e.json = r.value;
  e.id = text(v->find("id"));
  e.op = text(v->find("op"));
  e.entity = text(v->find("entity"));
  const Value* source = v->find("source");
  e.position = text(source != nullptr ? source->find("position") : nullptr);
  return e;
}

class MongoExactlyOnceKillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* s : {"kafka", "mongodb"}) {
      if (!testing::require_service(s).available) return;
    }
    bootstrap_ = testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    mongo_ = std::make_unique<Mongo>(testing::require_service("mongodb").get("MONGODB_URI"));
    dir_ = chaos::make_test_dir("sluice-eo-chaos");
  }
  void TearDown() override {
    if (job_) job_->stop();
    if (HasFailure() && job_) std::cout << job_->tails();
    chaos::keep_or_remove(dir_, HasFailure());
    mongo_.reset();
  }

  std::string pipeline_yaml(const std::string& topic) const {
    std::string y;
    y += chaos::pipeline_section("eo-chaos-" + dir_.filename().string(), dir_ / "checkpoints", "200ms", "exactly-once");
    y += mongo_->source_yaml();
    y += "transform:\n";
    y += "  - match: \"**\"\n";
    y += "    key: key._id\n";
    y += "    event:\n";
    y += "      type: \"'charge.' || op\"\n";
    y += "      payload: \"key._id AS id, after.status AS status, after.revision AS revision\"\n";
    y += "sink:\n";
    y += chaos::kafka_events_sink(bootstrap_, topic);
    return y;
  }

  std::string bootstrap_;
  std::unique_ptr<Mongo> mongo_;
  fs::path dir_;
  std::unique_ptr<SluiceProcess> job_;
};

TEST_F(MongoExactlyOnceKillTest, SigkilledRunsLoseNothingAndDuplicateNothing) {
  const auto t_start = Clock::now();
  const uint64_t seed = testing::test_seed();
  const double scale = chaos::chaos_scale();
  const int documents = std::max(5'000, static_cast<int>(kDocuments * std::min(scale, 3.0)));
  const int changes = std::max(kBatch, static_cast<int>(kChanges * scale));
  const int stream_kills = std::max(1, static_cast<int>(kStreamKills * scale));
  std::cout << "seed " << seed << " (SLUICE_TEST_SEED), " << documents << " documents, " << changes << " changes, "
            << stream_kills << " kills while streaming + 1 during the snapshot\n";
  const Workload w = make_workload(seed, documents, changes);
  mongo_->insert_documents(documents);

  const std::string topic = kafka::unique_topic("eo-chaos");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, kPartitions));
  std::ofstream(dir_ / "pipeline.yaml") << pipeline_yaml(topic);
  job_ = std::make_unique<SluiceProcess>("run", dir_ / "pipeline.yaml", dir_);

  // 1. The kill during the initial snapshot: after a checkpoint completed while the scan ran.
  ASSERT_TRUE(job_->start());
  size_t checkpoints_before = 0;
  ASSERT_TRUE(job_->wait_log(
      [&](const std::string& log) {
        const size_t at = log.find("snapshot of '");
        if (at == std::string::npos) return false;
        // Two: the first may have been taken before the scan emitted anything.
        const size_t n = count_of(log.substr(at), "completed checkpoint");
        checkpoints_before = n;
        return n >= 2;
      },
      "completed checkpoint during the snapshot", kStartDeadline));
  job_->kill_now();
  const std::string first_log = read_file(job_->log());
  ASSERT_EQ(first_log.find("' done;"), std::string::npos)
      << "the snapshot ended before the kill: raise the document count so that the kill hits it\n"
      << tail(job_->log());
  std::cout << "killed during the snapshot after " << checkpoints_before << " checkpoint(s) of it\n";
  int kills = 1;
  ASSERT_TRUE(job_->start());
  const fs::path after_snapshot_kill = job_->log();
  ASSERT_TRUE(job_->wait_running(1, kStartDeadline));

  // 2. The workload, with kills at seeded batch boundaries (each once the run completed a checkpoint), a seeded
  // moment after the batch.
  const size_t batches = (w.changes.size() + kBatch - 1) / kBatch;
  std::mt19937_64 rnd(seed ^ 0x5deece66dULL);
  std::map<size_t, int> kill_at;  // batch -> delay in ms after it
  for (int k = 0; k < stream_kills; ++k) {
    const size_t lo = batches * static_cast<size_t>(k) / static_cast<size_t>(stream_kills);
    const size_t hi = std::max(lo + 1, batches * static_cast<size_t>(k + 1) / static_cast<size_t>(stream_kills));
    kill_at[lo + rnd() % (hi - lo)] = static_cast<int>(rnd() % 400);
  }
  std::cout << "kills after batches";
  for (const auto& [b, ms] : kill_at)
    std::cout << " " << b << "+" << ms << "ms";
  std::cout << " of " << batches << "\n";
  const auto workload_start = Clock::now();
  for (size_t batch = 0; batch < batches; ++batch) {
    const size_t begin = batch * kBatch;
    const size_t end = std::min(w.changes.size(), begin + kBatch);
    ASSERT_NO_FATAL_FAILURE(mongo_->apply(w.changes, begin, end));
    if (auto k = kill_at.find(batch); k != kill_at.end()) {
      ASSERT_TRUE(job_->wait_running(1, kStartDeadline));
      std::this_thread::sleep_for(std::chrono::milliseconds(k->second));  // the seeded kill moment, not a wait
      job_->kill_now();
      ++kills;
      ASSERT_TRUE(job_->start());
    }
    // Pace the workload so that the kills spread over seconds of streaming.
    std::this_thread::sleep_until(workload_start +
                                  std::chrono::milliseconds(1000 * static_cast<int64_t>(end) / kChangesPerSecond));
  }
  ASSERT_TRUE(job_->wait_running(1, kStartDeadline));
  const double workload_s = std::chrono::duration<double>(Clock::now() - workload_start).count();

  // 3. The snapshot's resume point, from the committed snapshot reads, and the changes the stream must carry.
  std::vector<Event> events;
  chaos::CommittedReader reader(bootstrap_, topic, kPartitions, [&](const chaos::KafkaRecord& r) {
    if (std::optional<Event> e = parse_event(r, topic)) events.push_back(std::move(*e));
  });
  std::string t0;
  ASSERT_TRUE(poll_until(
      [&] {
        if (!reader.drain()) return false;
        for (const Event& e : events) {
          if (e.op == "r") t0 = e.position;
        }
        return !t0.empty();
      },
      kCatchUpDeadline))
      << "no snapshot read in the topic\n"
      << job_->tails();
  unsigned t = 0;
  unsigned i = 0;
  ASSERT_EQ(std::sscanf(t0.c_str(), "Timestamp(%u, %u)", &t, &i), 2) << t0;
  const std::vector<Mongo::StreamChange> expected = mongo_->changes_from(t, i);
  std::set<std::string> expected_positions;
  for (const Mongo::StreamChange& c : expected)
    expected_positions.insert(c.position);
  ASSERT_EQ(expected_positions.size(), expected.size()) << "the change stream repeated a token";

  // 4. Catch up: every expected stream position committed; then stop the job and read everything once more.
  auto stream_positions = [&] {
    std::set<std::string> got;
    for (const Event& e : events) {
      if (e.op != "r" && e.op != "tombstone") got.insert(e.position);
    }
    return got;
  };
  const bool caught_up = poll_until(
      [&] {
        if (!reader.drain()) return false;
        const std::set<std::string> got = stream_positions();
        return std::includes(got.begin(), got.end(), expected_positions.begin(), expected_positions.end());
      },
      kCatchUpDeadline, 200ms);
  job_->stop();
  ASSERT_TRUE(reader.drain());
  const std::set<std::string> got = stream_positions();
  std::vector<std::string> missing;
  std::set_difference(expected_positions.begin(), expected_positions.end(), got.begin(), got.end(),
                      std::back_inserter(missing));
  std::vector<std::string> extra;
  std::set_difference(got.begin(), got.end(), expected_positions.begin(), expected_positions.end(),
                      std::back_inserter(extra));
  EXPECT_TRUE(caught_up) << missing.size() << " stream changes never arrived";

  // (a) Zero duplicates by event id.
  std::map<std::string, int> copies;
  for (const Event& e : events)
    ++copies[e.id];
  size_t duplicates = 0;
  for (const auto& [id, n] : copies) {
    if (n > 1) {
      duplicates += static_cast<size_t>(n - 1);
      if (duplicates <= 5) {
        for (const Event& e : events) {
          if (e.id == id) ADD_FAILURE() << "duplicate at " << e.partition << "/" << e.offset << ": " << e.json;
        }
      }
    }
  }
  EXPECT_EQ(duplicates, 0u);

  // (b) Zero missing and zero extra stream changes.
  EXPECT_TRUE(missing.empty()) << missing.size() << " missing, e.g. " << missing.front();
  EXPECT_TRUE(extra.empty()) << extra.size() << " not in the change stream from T0, e.g. " << extra.front();

  // (c) One snapshot: one T0, each document read at most once, every untouched document read.
  std::set<std::string> snapshot_positions;
  std::map<std::string, int> reads;
  for (const Event& e : events) {
    if (e.op != "r") continue;
    snapshot_positions.insert(e.position);
    ++reads[e.entity];
  }
  EXPECT_EQ(snapshot_positions.size(), 1u) << "snapshot reads at several resume points: the snapshot restarted";
  int read_twice = 0;
  for (const auto& [entity, n] : reads) {
    if (n > 1 && ++read_twice <= 5) ADD_FAILURE() << "document " << entity << " read " << n << " times";
  }
  EXPECT_EQ(read_twice, 0);
  int unread = 0;
  for (int64_t id = 0; id < documents; ++id) {
    if (w.touched.count(id) == 0 && reads.count(std::to_string(id)) == 0 && ++unread <= 5) {
      ADD_FAILURE() << "document " << id << " (never changed) has no snapshot read";
    }
  }
  EXPECT_EQ(unread, 0);

  // (d) Per entity, the stream events are the entity's changes of the change stream, in its order (one entity
  // lives in one partition: topic order is offset order).
  std::map<std::string, std::vector<std::string>> want_by_entity;
  for (const Mongo::StreamChange& c : expected)
    want_by_entity[c.id].push_back(c.position);
  std::vector<const Event*> sorted;
  for (const Event& e : events)
    sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    return a->partition != b->partition ? a->partition < b->partition : a->offset < b->offset;
  });
  std::map<std::string, std::vector<std::string>> got_by_entity;
  for (const Event* e : sorted) {
    if (e->op != "r" && e->op != "tombstone") got_by_entity[e->entity].push_back(e->position);
  }
  const chaos::SequenceTally per_entity = chaos::compare_sequences(want_by_entity, got_by_entity);
  const size_t out_of_order = per_entity.out_of_order;
  EXPECT_EQ(out_of_order, 0u) << per_entity.first_problem;
  EXPECT_EQ(per_entity.missing + per_entity.duplicated + per_entity.unexpected, 0u)
      << "per entity: " << per_entity.missing << " missing, " << per_entity.duplicated << " duplicated, "
      << per_entity.unexpected << " unexpected; " << per_entity.first_problem;

  // (f) Per entity, each delete followed by one tombstone, each tombstone after a delete.
  std::map<std::string, std::string> previous_op;  // entity -> op of its previous record
  int tombstone_problems = 0;
  size_t tombstones = 0;
  for (const Event* e : sorted) {
    std::string& prev = previous_op[e->entity];
    const bool bad = e->op == "tombstone" ? prev != "d" : prev == "d";
    if (bad && ++tombstone_problems <= 5) {
      ADD_FAILURE() << "entity " << e->entity << ": " << e->op << " after " << (prev.empty() ? "nothing" : prev)
                    << " at " << e->partition << "/" << e->offset;
    }
    if (e->op == "tombstone") ++tombstones;
    prev = e->op;
  }
  for (const auto& [entity, op] : previous_op) {
    if (op == "d" && ++tombstone_problems <= 5) ADD_FAILURE() << "entity " << entity << ": a delete without tombstone";
  }
  EXPECT_EQ(tombstone_problems, 0);

  // (e) The run after the kill during the snapshot went on after the checkpoint's last document; every restart
  // resumed from a checkpoint.
  EXPECT_NE(read_file(after_snapshot_kill).find("' resumes after "), std::string::npos)
      << "the snapshot did not resume after the checkpoint's last document\n"
      << tail(after_snapshot_kill);
  for (int s = 1; s < job_->starts(); ++s) {
    EXPECT_NE(read_file(job_->log_for(s)).find("resuming from checkpoint"), std::string::npos)
        << job_->log_for(s) << "\n"
        << tail(job_->log_for(s));
  }

  std::cout << "MongoDB exactly-once: " << documents << " documents, " << w.changes.size() << " changes ("
            << expected.size() << " in the stream from T0 " << t0 << "), " << kills
            << " kills; topic: " << events.size() << " records, " << reads.size() << " snapshot reads, " << got.size()
            << " stream events, " << tombstones << " tombstones; missing " << missing.size() << ", extra "
            << extra.size() << ", duplicates " << duplicates << ", out of order " << out_of_order << "; workload "
            << workload_s << " s, " << std::chrono::duration<double>(Clock::now() - t_start).count() << " s in all\n";
}

}  // namespace
}  // namespace sluice
