// The seeded MongoDB workload of the exactly-once chaos tests and its check (mongodb_exactly_once_kill_test.cc kills
// `sluice run`; tests/cluster/cluster_cdc_failover_test.cc kills a TaskManager): a collection of its own in a database
// of its own, documents inserted before the job starts (the initial snapshot), seeded inserts, replaces and deletes
// while it runs, the collection's change stream read back by the test, and the comparison of a read_committed
// reading of the topic with it.
//
// Header-only test code; not thread-safe (one test thread).
#pragma once

#include <bson/bson.h>
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/services.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/core/value.h"

namespace sluice::chaos::mongo {

using sluice::testing::unique_name;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

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

inline Workload make_workload(uint64_t seed, int documents, int changes) {
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
inline std::optional<Event> parse_event(const chaos::KafkaRecord& r, const std::string& topic) {
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

/// The `source:`, `transform:` and `sink:` sections of the tests' pipeline: `mongo`'s collection (an initial
/// snapshot first), one event per change keyed by the document's _id (type charge.<op>; payload id, status and
/// revision), into `topic` (chaos::kafka_events_sink).
inline std::string cdc_source_to_events(const Mongo& mongo, const std::string& bootstrap, const std::string& topic) {
  std::string y = mongo.source_yaml();
  y += "transform:\n";
  y += "  - match: \"**\"\n";
  y += "    key: key._id\n";
  y += "    event:\n";
  y += "      type: \"'charge.' || op\"\n";
  y += "      payload: \"key._id AS id, after.status AS status, after.revision AS revision\"\n";
  y += "sink:\n";
  y += chaos::kafka_events_sink(bootstrap, topic);
  return y;
}

/// The snapshot's resume point: the position of the committed snapshot reads ("" while none was read).
inline std::string snapshot_resume_point(const std::vector<Event>& events) {
  std::string t0;
  for (const Event& e : events) {
    if (e.op == "r") t0 = e.position;
  }
  return t0;
}

/// The positions of the stream events read (neither snapshot reads nor tombstones).
inline std::set<std::string> stream_positions(const std::vector<Event>& events) {
  std::set<std::string> got;
  for (const Event& e : events) {
    if (e.op != "r" && e.op != "tombstone") got.insert(e.position);
  }
  return got;
}

/// The positions of `changes`.
inline std::set<std::string> positions_of(const std::vector<Mongo::StreamChange>& changes) {
  std::set<std::string> out;
  for (const Mongo::StreamChange& c : changes)
    out.insert(c.position);
  return out;
}

/// The positions in `a` that are not in `b`, in order.
inline std::vector<std::string> positions_missing(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

/// What expect_exactly_once() counted, for the tests' summary lines.
struct Checked {
  size_t duplicates = 0;
  size_t out_of_order = 0;
  size_t snapshot_reads = 0;
  size_t tombstones = 0;
};

/// Checks a read_committed reading (`events`) against the collection's change stream from the snapshot's resume
/// point (`expected`; `missing` and `extra`: its positions never read, and the stream positions read beyond it) for a
/// job that snapshotted `documents` documents while workload `w` ran:
///  (a) zero duplicates by event id; (b) zero missing, zero extra stream changes; (c) one snapshot: one resume
///  point, each document read at most once, every untouched document read; (d) per entity, the stream events are
///  its changes of the change stream in their order; (f) per entity, each delete followed by one tombstone and
///  each tombstone after a delete. Failures are reported as test failures.
inline Checked expect_exactly_once(const std::vector<Event>& events, const std::vector<Mongo::StreamChange>& expected,
                                   const std::vector<std::string>& missing, const std::vector<std::string>& extra,
                                   int documents, const Workload& w) {
  Checked checked;
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

  checked.duplicates = duplicates;
  checked.out_of_order = out_of_order;
  checked.snapshot_reads = reads.size();
  checked.tombstones = tombstones;
  return checked;
}

}  // namespace sluice::chaos::mongo
