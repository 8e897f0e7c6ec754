// Tombstones after deletes (the Kafka sink's tombstones-on-delete, Debezium's tombstones.on.delete) through a
// pipeline from a real Postgres to the real broker, in-process (PipelineRunner):
//  * exactly-once and at-least-once: deleted rows and a primary-key update come out, per key and read back with
//    read_committed, as exactly the records Debezium writes: the delete, then a null value with the same key on the
//    same partition; the key change's create on the new key's own partition; a re-inserted key goes on after its
//    tombstone; the counter on /metrics; with tombstones-on-delete: false, no tombstone;
//  * a compacted topic (cleanup.policy=compact, segment.ms / min.cleanable.dirty.ratio / delete.retention.ms set
//    low): the broker's cleaner removes the deleted keys entirely (their records and then their tombstones) while
//    the live keys keep their last record. The broker's cleaner looks for work every log.cleaner.backoff.ms (15 s
//    by default) and needs two passes (the first keeps the tombstones and starts their delete.retention.ms), so
//    the test waits for it with a 120 s deadline, writing updates meanwhile so that segments roll.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/postgres.h"
#include "integration/test_util/services.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/pipeline/pipeline_runner.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kPartitions = 3;

struct Record {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;
  std::optional<std::string> value;  // nullopt: a tombstone
};

// Reads every partition of `topic` from the start with read_committed until each reached its high watermark (as
// of the call), and returns the records in partition order.
std::vector<Record> read_all(const std::string& servers, const std::string& topic, const std::string& group) {
  tk::Client c = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", servers},
                                                     {"group.id", group},
                                                     {"isolation.level", "read_committed"},
                                                     {"enable.auto.commit", "false"},
                                                     {"enable.partition.eof", "true"}});
  std::vector<Record> out;
  if (!c) return out;
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(kPartitions);
  for (int p = 0; p < kPartitions; ++p)
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  EXPECT_EQ(rd_kafka_assign(c.get(), parts), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(parts);
  std::vector<bool> at_end(kPartitions, false);
  const auto deadline = Clock::now() + 30s;
  auto all_at_end = [&] {
    for (bool e : at_end)
      if (!e) return false;
    return true;
  };
  while (!all_at_end() && Clock::now() < deadline) {
    tk::Message m(rd_kafka_consumer_poll(c.get(), 100));
    if (!m) continue;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      at_end[static_cast<size_t>(m->partition)] = true;
      continue;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    Record r;
    r.partition = m->partition;
    r.offset = m->offset;
    if (m->key != nullptr) r.key.assign(static_cast<const char*>(m->key), m->key_len);
    if (m->payload != nullptr) r.value.emplace(static_cast<const char*>(m->payload), m->len);
    out.push_back(std::move(r));
  }
  EXPECT_TRUE(all_at_end()) << "the partitions of " << topic << " were not read to their end within 30 s";
  rd_kafka_consumer_close(c.get());
  return out;
}

// "op" of an event record, "tombstone" for a null value.
std::string what(const Record& r) {
  if (!r.value) return "tombstone";
  Result<Value> v = Value::from_json(*r.value);
  if (!v.ok() || v->find("op") == nullptr) return "bad: " + *r.value;
  return std::string(v->find("op")->as_string());
}

class PipelineKafkaTombstoneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    servers_ = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    url_ = sluice::testing::require_service("postgres").get("POSTGRES_URL");
    ASSERT_FALSE(servers_.empty());
    ASSERT_FALSE(url_.empty());
    pg_ = std::make_unique<sluice::testing::PgClient>(url_);
    char tmpl[] = "/tmp/sluice-tombstone-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (runner_) {
      runner_->cancel();
      runner_->wait();
      runner_.reset();
    }
    for (const std::string& t : tables_) {
      sluice::testing::drop_slot_and_publication(*pg_, t);
      pg_->exec("DROP TABLE IF EXISTS public." + t);
    }
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A new table (id int PRIMARY KEY, v text) holding ids 1, 2, 3; also the slot's and publication's name.
  std::string make_table() {
    const std::string t = fmt::format("tomb_{}_{}", ::getpid(), tables_.size());
    tables_.push_back(t);
    pg_->exec("DROP TABLE IF EXISTS public." + t);
    pg_->exec("CREATE TABLE public." + t + " (id int PRIMARY KEY, v text)");
    pg_->exec("INSERT INTO public." + t + " VALUES (1, 'a'), (2, 'b'), (3, 'c')");
    return t;
  }

  // Starts a pipeline from `table` (snapshot first) to `topic`.
  void start(const std::string& table, const std::string& topic, const std::string& delivery,
             const std::string& sink_extra) {
    const std::string yaml = fmt::format(R"(pipeline:
  name: {0}
  parallelism: 2
  checkpoint: {{ interval: 200ms, storage: "{1}/{0}/checkpoints" }}
  delivery: {2}
source:
  type: postgres
  conninfo: "{3}"
  tables: [public.{0}]
  slot: {0}
  publication: {0}
  start: initial
transform:
  - match: "**"
    key: key.id
    event:
      payload: "id, v"
sink:
  events:
    type: kafka
    bootstrap-servers: "{4}"
    topic: {5}
    properties: {{ transaction.timeout.ms: "60000" }}{6}
)",
                                         table, dir_.string(), delivery, url_, servers_, topic, sink_extra);
    Result<PipelineSpec> spec = parse_pipeline(yaml, table + ".yaml");
    ASSERT_TRUE(spec.ok()) << spec.error().message();
    Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
    ASSERT_TRUE(runner.ok()) << runner.error().message();
    runner_ = std::move(*runner);
    ASSERT_TRUE(runner_->start().ok());
  }

  // Waits until `topic` holds at least `n` records (read_committed).
  std::vector<Record> wait_for(const std::string& topic, size_t n, std::chrono::seconds deadline = 60s) {
    std::vector<Record> got;
    sluice::testing::poll_until(
        [&] {
          got = read_all(servers_, topic, topic + "-reader");
          return got.size() >= n;
        },
        deadline);
    return got;
  }

  // A key (an id above 3) whose partition differs from key "1"'s, so the key change crosses partitions.
  static int other_partition_id() {
    for (int id = 10; id < 100; ++id) {
      if (kafka_default_partition(std::to_string(id), kPartitions) != kafka_default_partition("1", kPartitions)) {
        return id;
      }
    }
    return -1;
  }

  // Runs the workload on `table` after its snapshot reached `topic`; returns the new id of row 1.
  int run_workload(const std::string& table, const std::string& topic) {
    // The snapshot's three rows in the topic: the slot exists, so every later change is streamed.
    EXPECT_EQ(wait_for(topic, 3).size(), 3u);
    const int moved = other_partition_id();
    pg_->exec("DELETE FROM public." + table + " WHERE id = 2");
    pg_->exec(fmt::format("UPDATE public.{} SET id = {}, v = 'a2' WHERE id = 1", table, moved));  // key change
    pg_->exec("UPDATE public." + table + " SET v = 'c2' WHERE id = 3");                           // no key change
    pg_->exec("INSERT INTO public." + table + " VALUES (2, 'b2')");                               // key 2 again
    return moved;
  }

  // The records per key, in offset order (one partition per key), as "op" / "tombstone"; checks each record is on
  // its key's partition.
  static std::map<std::string, std::vector<std::string>> per_key(const std::vector<Record>& records) {
    std::map<std::string, std::vector<std::string>> out;
    for (const Record& r : records) {
      EXPECT_EQ(r.partition, kafka_default_partition(r.key, kPartitions)) << "key " << r.key << " " << what(r);
      out[r.key].push_back(what(r));
    }
    return out;
  }

  double metric(const std::string& name) {
    const std::string text = runner_->metrics_text();
    const size_t at = text.find(name + "{");
    if (at == std::string::npos) return -1;
    const size_t sp = text.find(' ', at);
    return std::stod(text.substr(sp + 1));
  }

  std::string servers_, url_;
  std::unique_ptr<sluice::testing::PgClient> pg_;
  fs::path dir_;
  std::vector<std::string> tables_;
  std::unique_ptr<PipelineRunner> runner_;
};

using V = std::vector<std::string>;

TEST_F(PipelineKafkaTombstoneTest, DeletesAndKeyChangesAreFollowedByTombstonesExactlyOnceAndAtLeastOnce) {
  for (const std::string delivery : {"exactly-once", "at-least-once"}) {
    SCOPED_TRACE(delivery);
    const std::string table = make_table();
    const std::string topic = tk::unique_topic("tombstones");
    ASSERT_TRUE(tk::create_topic(servers_, topic, kPartitions));
    ASSERT_NO_FATAL_FAILURE(start(table, topic, delivery, ""));
    const int moved = run_workload(table, topic);
    ASSERT_GT(moved, 3);
    // 3 snapshot rows, d + tombstone of 2, d + tombstone of 1 and c of the new key, u of 3, c of 2.
    std::vector<Record> got = wait_for(topic, 10);
    EXPECT_EQ(got.size(), 10u);
    auto keys = per_key(got);
    EXPECT_EQ(keys["1"], (V{"r", "d", "tombstone"}));
    EXPECT_EQ(keys["2"], (V{"r", "d", "tombstone", "c"}));
    EXPECT_EQ(keys["3"], (V{"r", "u"}));
    EXPECT_EQ(keys[std::to_string(moved)], (V{"c"}));
    EXPECT_EQ(keys.size(), 4u);
    EXPECT_NE(kafka_default_partition("1", kPartitions), kafka_default_partition(std::to_string(moved), kPartitions));
    EXPECT_EQ(metric("sluice_pipeline_kafka_tombstones_total"), 2);
    runner_->cancel();
    runner_->wait();
    runner_.reset();
  }
}

TEST_F(PipelineKafkaTombstoneTest, WithoutTombstonesOnDeleteADeleteIsTheKeysLastRecord) {
  const std::string table = make_table();
  const std::string topic = tk::unique_topic("no-tombstones");
  ASSERT_TRUE(tk::create_topic(servers_, topic, kPartitions));
  ASSERT_NO_FATAL_FAILURE(start(table, topic, "exactly-once", "\n    tombstones-on-delete: false"));
  const int moved = run_workload(table, topic);
  std::vector<Record> got = wait_for(topic, 8);
  EXPECT_EQ(got.size(), 8u);
  auto keys = per_key(got);
  EXPECT_EQ(keys["1"], (V{"r", "d"}));
  EXPECT_EQ(keys["2"], (V{"r", "d", "c"}));
  EXPECT_EQ(keys[std::to_string(moved)], (V{"c"}));
  EXPECT_EQ(metric("sluice_pipeline_kafka_tombstones_total"), 0);
}

TEST_F(PipelineKafkaTombstoneTest, CompactionRemovesTheDeletedKeys) {
  const std::string table = make_table();
  const std::string topic = tk::unique_topic("compacted");
  ASSERT_TRUE(tk::create_topic(servers_, topic, kPartitions,
                               {{"cleanup.policy", "compact"},
                                {"segment.ms", "100"},
                                {"min.cleanable.dirty.ratio", "0.001"},
                                {"min.compaction.lag.ms", "0"},
                                {"max.compaction.lag.ms", "1000"},
                                {"delete.retention.ms", "100"}}));
  ASSERT_NO_FATAL_FAILURE(start(table, topic, "exactly-once", ""));
  const int moved = run_workload(table, topic);
  pg_->exec("DELETE FROM public." + table + " WHERE id = 3");
  // One filler row per partition, updated in one transaction per round so that every partition gets appends: a
  // segment rolls (segment.ms) only at an append, and the cleaner never touches the active segment.
  std::vector<int> fillers(kPartitions, -1);
  for (int id = 100, found = 0; found < kPartitions; ++id) {
    int& f = fillers[static_cast<size_t>(kafka_default_partition(std::to_string(id), kPartitions))];
    if (f < 0) {
      f = id;
      ++found;
      pg_->exec(fmt::format("INSERT INTO public.{} VALUES ({}, 'filler')", table, id));
    }
  }
  const std::string filler_ids = fmt::format("{}, {}, {}", fillers[0], fillers[1], fillers[2]);
  // Key 1 moved away and key 3 was deleted: after compaction neither has a record left (their events and then
  // their tombstones are gone); key 2 (deleted, then inserted again) keeps its c, the new key its c.
  const std::string k1 = "1", k3 = "3", k2 = "2", kn = std::to_string(moved);
  std::vector<Record> got;
  std::map<std::string, std::vector<std::string>> keys;
  int revision = 0;
  const auto t0 = Clock::now();
  const bool compacted = sluice::testing::poll_until(
      [&] {
        pg_->exec(fmt::format("UPDATE public.{} SET v = 'r{}' WHERE id IN ({})", table, ++revision, filler_ids));
        got = read_all(servers_, topic, topic + "-reader");
        keys.clear();
        for (const Record& r : got)
          keys[r.key].push_back(what(r));
        return keys.count(k1) == 0 && keys.count(k3) == 0 && keys[k2] == V{"c"};
      },
      120s, 500ms);
  const auto took = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t0).count();
  std::cout << "compaction removed the deleted keys after " << took << " s (" << revision << " updates, " << got.size()
            << " records left)\n";
  EXPECT_TRUE(compacted) << "after 120 s key 1: " << ::testing::PrintToString(keys[k1])
                         << ", key 3: " << ::testing::PrintToString(keys[k3])
                         << ", key 2: " << ::testing::PrintToString(keys[k2]);
  // The live keys keep their last record: the new key its create, the fillers their last update.
  EXPECT_EQ(keys[kn], V{"c"});
  for (int f : fillers)
    EXPECT_EQ(keys[std::to_string(f)].back(), "u") << "filler " << f;
  for (const auto& [key, ops] : keys) {
    for (const std::string& op : ops)
      EXPECT_NE(op, "tombstone") << "key " << key << " was not deleted";
  }
}

}  // namespace
}  // namespace sluice::pipeline
