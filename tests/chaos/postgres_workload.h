// The seeded Postgres workload of the exactly-once chaos tests and its check (postgres_exactly_once_kill_test.cc
// kills `sluice run`; tests/cluster/cluster_cdc_failover_test.cc kills a TaskManager): transactions of upserts and
// deletes over ranges of entities of a table of its own, the changes each entity must show in the topic, and the
// comparison of a read_committed reading with them (per entity, in offset order; event ids over the whole topic).
//
// Header-only test code; not thread-safe (one test thread).
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

namespace sluice::chaos::pg {

using sluice::testing::unique_name;

/// The entities' ids: 0 .. kEntities - 1.
constexpr int64_t kEntities = 20'000;

// ---------------------------------------------------------------------------------------------------------------
// The workload.

struct Txn {
  bool remove = false;  // delete the present ids of [lo, hi); else upsert [lo, hi)
  int64_t lo = 0, hi = 0;
  size_t rows = 0;  // the changes it makes
};

struct Workload {
  std::vector<Txn> txns;
  std::vector<size_t> kill_after;                        // transaction indexes, in order
  std::map<int64_t, std::vector<std::string>> expected;  // entity -> "c/0", "u/3", "d", "tombstone", in order
  size_t changes = 0;
  size_t deletes = 0;  // each is followed by a tombstone in the topic
};

// Applies one transaction to `revision` (the model) and records its changes.
inline Txn model(Workload& w, std::vector<int64_t>& revision, int64_t lo, int64_t size, bool remove) {
  Txn x;
  x.lo = lo;
  x.hi = lo + size;
  x.remove = remove;
  for (int64_t id = x.lo; id < x.hi; ++id) {
    int64_t& r = revision[static_cast<size_t>(id)];
    if (x.remove) {
      if (r < 0) continue;
      w.expected[id].push_back("d");
      w.expected[id].push_back("tombstone");
      ++w.deletes;
      r = -1;
    } else if (r < 0) {
      r = 0;
      w.expected[id].push_back("c/0");
    } else {
      ++r;
      w.expected[id].push_back("u/" + std::to_string(r));
    }
    ++x.rows;
  }
  w.changes += x.rows;
  return x;
}

// `transactions` of mixed sizes; before each of `kills` seeded positions a burst of 3 large transactions (3,000 to
// 20,000 rows) with a kill planned after its 1st or 2nd one (see the file comment).
inline Workload make_workload(uint64_t seed, int transactions, int kills, std::mt19937_64& rnd) {
  rnd.seed(seed);
  Workload w;
  std::vector<int64_t> revision(kEntities, -1);  // -1: absent
  std::set<int> bursts;
  while (static_cast<int>(bursts.size()) < std::min(kills, transactions))
    bursts.insert(1 + static_cast<int>(rnd() % static_cast<uint64_t>(transactions)));
  for (int t = 0; t < transactions; ++t) {
    if (bursts.count(t) != 0) {
      const int kill_after = static_cast<int>(rnd() % 2);
      for (int b = 0; b < 3; ++b) {
        const int64_t size = 3000 + static_cast<int64_t>(rnd() % 17'001);
        const int64_t lo = static_cast<int64_t>(rnd() % static_cast<uint64_t>(kEntities - size + 1));
        w.txns.push_back(model(w, revision, lo, size, rnd() % 100 < 15));
        if (b == kill_after) w.kill_after.push_back(w.txns.size() - 1);
      }
    }
    const uint64_t dice = rnd() % 100;
    int64_t size = dice < 55   ? 1 + static_cast<int64_t>(rnd() % 20)
                   : dice < 85 ? 21 + static_cast<int64_t>(rnd() % 1480)
                               : 1500 + static_cast<int64_t>(rnd() % 18'501);
    size = std::min(size, kEntities);
    const int64_t lo = static_cast<int64_t>(rnd() % static_cast<uint64_t>(kEntities - size + 1));
    w.txns.push_back(model(w, revision, lo, size, rnd() % 100 < 20));
  }
  return w;
}

class Db {
 public:
  explicit Db(std::string url) : url_(std::move(url)), table_(unique_name("pg_eo")) {}
  ~Db() {
    if (c_ != nullptr) PQfinish(c_);
  }
  void setup() {
    c_ = PQconnectdb(url_.c_str());
    ASSERT_EQ(PQstatus(c_), CONNECTION_OK) << PQerrorMessage(c_);
    exec("CREATE TABLE public." + table_ + " (id BIGINT PRIMARY KEY, revision BIGINT NOT NULL)");
  }
  void teardown() {
    if (c_ == nullptr) return;
    // The walsender of a process killed just before may hold the slot a moment longer: an active slot cannot be
    // dropped, and one left behind would keep WAL on the shared server.
    testing::poll_until([&] { return !has_slot(true); }, std::chrono::seconds(10));
    quiet("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + table_ + "'");
    quiet("DROP PUBLICATION IF EXISTS " + table_);
    quiet("DROP TABLE IF EXISTS public." + table_);
  }
  void apply(const Txn& x) {
    const std::string lo = std::to_string(x.lo);
    const std::string hi = std::to_string(x.hi);
    if (x.remove) {
      exec("DELETE FROM public." + table_ + " WHERE id >= " + lo + " AND id < " + hi);
    } else {
      // generate_series in id order: the changes of one transaction come in this order, per entity one.
      exec("INSERT INTO public." + table_ + " (id, revision) SELECT g, 0 FROM generate_series(" + lo + ", " + hi +
           " - 1) g ON CONFLICT (id) DO UPDATE SET revision = " + table_ + ".revision + 1");
    }
  }
  const std::string& table() const { return table_; }
  const std::string& url() const { return url_; }

  void exec(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const auto st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) ADD_FAILURE() << sql << ": " << PQresultErrorMessage(r);
    PQclear(r);
  }
  void quiet(const std::string& sql) { PQclear(PQexec(c_, sql.c_str())); }
  /// Whether this table's slot exists (any, or only when a walsender streams from it now: `active`).
  bool has_slot(bool active = false) {
    const std::string sql = "SELECT 1 FROM pg_replication_slots WHERE slot_name = '" + table_ + "'" +
                            (active ? std::string(" AND active") : std::string());
    PGresult* r = PQexec(c_, sql.c_str());
    const bool found = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0;
    PQclear(r);
    return found;
  }

 private:
  std::string url_;
  std::string table_;
  PGconn* c_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// The topic, read as a consumer of the pipeline's output would: read_committed, every partition from the start.

struct Event {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string id;
  int64_t entity = -1;
  std::string change;  // "c/0", "u/3", "d"
};

// Parses one record of the topic into an Event (a test failure when it is not one of the pipeline's events).
inline std::optional<Event> parse_event(const chaos::KafkaRecord& r, const std::string& topic) {
  if (r.tombstone) {  // a tombstone: the entity is its key; its id is its place (never a duplicate)
    Event e;
    e.partition = r.partition;
    e.offset = r.offset;
    e.id = "tombstone@" + std::to_string(r.partition) + ":" + std::to_string(r.offset);
    e.entity = std::stoll(r.key);
    e.change = "tombstone";
    return e;
  }
  std::optional<Value> v = chaos::json_object(r, topic);
  if (!v) return std::nullopt;
  const Value* id = v->find("id");
  const Value* op = v->find("op");
  const Value* payload = v->find("payload");
  const Value* entity = payload != nullptr ? payload->find("id") : nullptr;
  const Value* revision = payload != nullptr ? payload->find("revision") : nullptr;
  if (id == nullptr || !id->is_string() || op == nullptr || !op->is_string() || entity == nullptr ||
      !entity->is_int64()) {
    ADD_FAILURE() << "unexpected event: " << r.value;
    return std::nullopt;
  }
  Event e;
  e.partition = r.partition;
  e.offset = r.offset;
  e.id = std::string(id->as_string());
  e.entity = entity->as_int64();
  e.change = std::string(op->as_string());
  if (e.change != "d") e.change += "/" + (revision != nullptr ? revision->to_json() : std::string("?"));
  return e;
}

/// The `source:`, `transform:` and `sink:` sections of the tests' pipeline: `db`'s table through its own slot and
/// publication (an initial snapshot first), one event per change keyed by the row's id (type row.created,
/// row.updated, row.deleted or row.read; payload id and revision), into `topic` (chaos::kafka_events_sink).
inline std::string cdc_source_to_events(const Db& db, const std::string& bootstrap, const std::string& topic) {
  std::string y;
  y += "source:\n  type: postgres\n  conninfo: \"" + db.url() + "\"\n  tables: [public." + db.table() +
       "]\n  slot: " + db.table() + "\n  publication: " + db.table() + "\n  start: initial\n";
  y += "transform:\n";
  y += "  - match: \"**\"\n";
  y += "    key: key.id\n";
  y += "    event:\n";
  y += "      type: \"CASE op WHEN 'c' THEN 'row.created' WHEN 'u' THEN 'row.updated' WHEN 'd' THEN "
       "'row.deleted' ELSE 'row.read' END\"\n";
  y += "      payload: \"key.id AS id, after.revision AS revision\"\n";
  y += "sink:\n";
  y += chaos::kafka_events_sink(bootstrap, topic);
  return y;
}

struct Tally {
  size_t records = 0, distinct_ids = 0, duplicate_ids = 0;
  chaos::SequenceTally per_entity;
};

// Per entity, the topic's events in offset order against the workload's changes; event ids over the whole topic.
inline Tally tally(const std::vector<Event>& events, const Workload& w) {
  Tally t;
  t.records = events.size();
  std::vector<std::string> ids;
  for (const Event& e : events)
    ids.push_back(e.id);
  t.duplicate_ids = chaos::count_duplicates(ids);
  t.distinct_ids = ids.size() - t.duplicate_ids;
  std::vector<const Event*> sorted;
  for (const Event& e : events)
    sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    return a->partition != b->partition ? a->partition < b->partition : a->offset < b->offset;
  });
  std::map<int64_t, std::vector<std::string>> got;
  for (const Event* e : sorted)
    got[e->entity].push_back(e->change);
  t.per_entity = chaos::compare_sequences(w.expected, got);
  return t;
}

}  // namespace sluice::chaos::pg
