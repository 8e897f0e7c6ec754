// Smoke test of the service harness against a real Kafka 4 broker (scripts/services/kafka): plain produce and
// consume, and the transactional features the exactly-once connectors rely on (read_committed isolation,
// commit and abort, offsets stored with a transaction), which librdkafka's mock cluster does not implement.
// Run: scripts/services/run-with kafka -- ctest --test-dir build/release -R services_smoke --output-on-failure
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using kafka::Client;
using kafka::Config;

struct Record {
  int32_t partition;
  int64_t offset;
  std::string value;
};

// Counts delivery reports; the opaque of the producer's conf points at it.
struct Deliveries {
  int ok = 0;
  int failed = 0;
  std::string first_error;
};

void on_delivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* d = static_cast<Deliveries*>(opaque);
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    ++d->ok;
  } else {
    if (d->failed++ == 0) d->first_error = rd_kafka_err2str(m->err);
  }
}

class ServicesSmokeTest : public ::testing::Test {
 protected:
  void SetUp() override { bootstrap_ = require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS"); }

  Client producer(Deliveries& d, const Config& extra = {}) {
    Config c{{"bootstrap.servers", bootstrap_}, {"enable.idempotence", "true"}, {"acks", "all"}, {"linger.ms", "5"}};
    for (const auto& [k, v] : extra)
      c[k] = v;
    auto conf = kafka::make_conf(c);
    if (!conf) return nullptr;
    rd_kafka_conf_set_dr_msg_cb(conf.get(), on_delivery);
    rd_kafka_conf_set_opaque(conf.get(), &d);
    return kafka::make_client(RD_KAFKA_PRODUCER, std::move(conf));
  }

  Client consumer(const std::string& group, const std::string& isolation) {
    return kafka::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstrap_},
                                                  {"group.id", group},
                                                  {"auto.offset.reset", "earliest"},
                                                  {"enable.auto.commit", "false"},
                                                  {"isolation.level", isolation}});
  }

  static void produce(rd_kafka_t* p, const std::string& topic, const std::string& value, int32_t partition) {
    rd_kafka_resp_err_t err = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    ASSERT_EQ(err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(err);
  }

  // Subscribes to TOPIC and polls until DONE says so or TIMEOUT passes; returns every record seen.
  static std::vector<Record> consume_until(rd_kafka_t* c, const std::string& topic,
                                           const std::function<bool(const std::vector<Record>&)>& done,
                                           std::chrono::milliseconds timeout = 60s) {
    kafka::PartitionList subs(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(subs.get(), topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_poll_set_consumer(c);
    EXPECT_EQ(rd_kafka_subscribe(c, subs.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
    std::vector<Record> out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done(out) && std::chrono::steady_clock::now() < deadline) {
      kafka::Message m(rd_kafka_consumer_poll(c, 200));
      if (!m) continue;
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) continue;
      if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ADD_FAILURE() << "consume: " << rd_kafka_message_errstr(m.get());
        break;
      }
      out.push_back({m->partition, m->offset, std::string(static_cast<const char*>(m->payload), m->len)});
    }
    return out;
  }

  static bool contains(const std::vector<Record>& rs, const std::string& value) {
    for (const auto& r : rs)
      if (r.value == value) return true;
    return false;
  }

  std::string bootstrap_;
};

TEST_F(ServicesSmokeTest, ProduceAndConsumeThousandMessages) {
  const std::string topic = kafka::unique_topic("smoke");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, 3));

  constexpr int kCount = 1000;
  Deliveries d;
  Client p = producer(d);
  ASSERT_TRUE(p);
  for (int i = 0; i < kCount; ++i) {
    ASSERT_NO_FATAL_FAILURE(produce(p.get(), topic, "m" + std::to_string(i), i % 3));
    rd_kafka_poll(p.get(), 0);
  }
  ASSERT_EQ(rd_kafka_flush(p.get(), 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
  EXPECT_EQ(d.ok, kCount);
  EXPECT_EQ(d.failed, 0) << d.first_error;

  Client c = consumer(kafka::unique_topic("group"), "read_committed");
  ASSERT_TRUE(c);
  auto records = consume_until(c.get(), topic, [&](const auto& rs) { return rs.size() >= kCount; });
  ASSERT_EQ(records.size(), static_cast<size_t>(kCount));

  // Every message exactly once, each partition in produce order with contiguous offsets.
  std::set<std::string> values;
  std::map<int32_t, std::vector<const Record*>> by_partition;
  for (const auto& r : records) {
    values.insert(r.value);
    by_partition[r.partition].push_back(&r);
  }
  EXPECT_EQ(values.size(), static_cast<size_t>(kCount));
  ASSERT_EQ(by_partition.size(), 3u);
  for (const auto& [partition, rs] : by_partition) {
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(rs[i]->offset, static_cast<int64_t>(i)) << "partition " << partition;
      EXPECT_EQ(rs[i]->value, "m" + std::to_string(static_cast<int>(i) * 3 + partition));
    }
  }

  // The group coordinator stores offsets.
  kafka::PartitionList positions(nullptr);
  {
    rd_kafka_topic_partition_list_t* assigned = nullptr;
    ASSERT_EQ(rd_kafka_assignment(c.get(), &assigned), RD_KAFKA_RESP_ERR_NO_ERROR);
    positions.reset(assigned);
  }
  ASSERT_EQ(rd_kafka_position(c.get(), positions.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(rd_kafka_commit(c.get(), positions.get(), 0), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(rd_kafka_committed(c.get(), positions.get(), 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  int64_t committed_total = 0;
  for (int i = 0; i < positions->cnt; ++i)
    committed_total += positions->elems[i].offset;
  EXPECT_EQ(committed_total, kCount);
  rd_kafka_consumer_close(c.get());
}

TEST_F(ServicesSmokeTest, CommittedTransactionVisibleAbortedTransactionNot) {
  const std::string topic = kafka::unique_topic("smoke-txn");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, 1));

  Deliveries d;
  Client p = producer(d, {{"transactional.id", kafka::unique_topic("txn")}, {"transaction.timeout.ms", "60000"}});
  ASSERT_TRUE(p);
  ASSERT_EQ(kafka::error_text(rd_kafka_init_transactions(p.get(), 30000)), "");

  // Committed: visible to read_committed consumers.
  ASSERT_EQ(kafka::error_text(rd_kafka_begin_transaction(p.get())), "");
  for (int i = 0; i < 10; ++i)
    ASSERT_NO_FATAL_FAILURE(produce(p.get(), topic, "committed-" + std::to_string(i), 0));
  ASSERT_EQ(kafka::error_text(rd_kafka_commit_transaction(p.get(), 30000)), "");

  // Aborted: written to the log, but invisible to read_committed consumers.
  ASSERT_EQ(kafka::error_text(rd_kafka_begin_transaction(p.get())), "");
  for (int i = 0; i < 10; ++i)
    ASSERT_NO_FATAL_FAILURE(produce(p.get(), topic, "aborted-" + std::to_string(i), 0));
  ASSERT_EQ(rd_kafka_flush(p.get(), 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(kafka::error_text(rd_kafka_abort_transaction(p.get(), 30000)), "");

  // A last committed marker, so a consumer knows when it has read past the aborted transaction.
  ASSERT_EQ(kafka::error_text(rd_kafka_begin_transaction(p.get())), "");
  ASSERT_NO_FATAL_FAILURE(produce(p.get(), topic, "marker", 0));
  ASSERT_EQ(kafka::error_text(rd_kafka_commit_transaction(p.get(), 30000)), "");
  EXPECT_EQ(d.ok, 21);  // the aborted messages were acknowledged too
  EXPECT_EQ(d.failed, 0) << d.first_error;

  auto until_marker = [](const std::vector<Record>& rs) { return contains(rs, "marker"); };

  Client committed = consumer(kafka::unique_topic("group"), "read_committed");
  ASSERT_TRUE(committed);
  auto rc = consume_until(committed.get(), topic, until_marker);
  rd_kafka_consumer_close(committed.get());
  std::vector<std::string> values;
  values.reserve(rc.size());
  for (const auto& r : rc)
    values.push_back(r.value);
  std::vector<std::string> expected;
  expected.reserve(11);
  for (int i = 0; i < 10; ++i)
    expected.push_back("committed-" + std::to_string(i));
  expected.push_back("marker");
  EXPECT_EQ(values, expected);

  // read_uncommitted sees the aborted messages: the abort above really wrote something to hide.
  Client uncommitted = consumer(kafka::unique_topic("group"), "read_uncommitted");
  ASSERT_TRUE(uncommitted);
  auto ru = consume_until(uncommitted.get(), topic, until_marker);
  rd_kafka_consumer_close(uncommitted.get());
  EXPECT_EQ(ru.size(), 21u);
  EXPECT_TRUE(contains(ru, "aborted-0"));
}

TEST_F(ServicesSmokeTest, OffsetsStoredWithTransaction) {
  // An exactly-once pipeline commits its source offsets inside the sink's transaction.
  const std::string topic = kafka::unique_topic("smoke-offsets");
  ASSERT_TRUE(kafka::create_topic(bootstrap_, topic, 2));
  const std::string group = kafka::unique_topic("group");

  Deliveries d;
  Client p = producer(d, {{"transactional.id", kafka::unique_topic("txn")}});
  ASSERT_TRUE(p);
  ASSERT_EQ(kafka::error_text(rd_kafka_init_transactions(p.get(), 30000)), "");

  auto send_offsets = [&](int64_t offset) {
    kafka::PartitionList offsets(rd_kafka_topic_partition_list_new(2));
    rd_kafka_topic_partition_list_add(offsets.get(), topic.c_str(), 0)->offset = offset;
    rd_kafka_topic_partition_list_add(offsets.get(), topic.c_str(), 1)->offset = offset + 1;
    std::unique_ptr<rd_kafka_consumer_group_metadata_t, kafka::KafkaDeleter> meta(
        rd_kafka_consumer_group_metadata_new(group.c_str()));
    return kafka::error_text(rd_kafka_send_offsets_to_transaction(p.get(), offsets.get(), meta.get(), 30000));
  };

  ASSERT_EQ(kafka::error_text(rd_kafka_begin_transaction(p.get())), "");
  ASSERT_EQ(send_offsets(7), "");
  ASSERT_EQ(kafka::error_text(rd_kafka_commit_transaction(p.get(), 30000)), "");

  ASSERT_EQ(kafka::error_text(rd_kafka_begin_transaction(p.get())), "");
  ASSERT_EQ(send_offsets(100), "");
  ASSERT_EQ(kafka::error_text(rd_kafka_abort_transaction(p.get(), 30000)), "");

  Client c = consumer(group, "read_committed");
  ASSERT_TRUE(c);
  kafka::PartitionList query(rd_kafka_topic_partition_list_new(2));
  rd_kafka_topic_partition_list_add(query.get(), topic.c_str(), 0);
  rd_kafka_topic_partition_list_add(query.get(), topic.c_str(), 1);
  ASSERT_EQ(rd_kafka_committed(c.get(), query.get(), 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  EXPECT_EQ(query->elems[0].offset, 7);  // the aborted transaction's offsets (100, 101) were discarded
  EXPECT_EQ(query->elems[1].offset, 8);
}

}  // namespace
}  // namespace sluice::testing
