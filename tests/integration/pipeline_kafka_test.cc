// A pipeline from Kafka to Kafka through `sluice run`'s job, against the real broker: change events read from a
// topic (with a poison message), domain events written exactly once (transactions per checkpoint) and read back
// with read_committed: every change once, per-entity order, the poison message in the source's dead-letter file
// with its partition and offset; the source's metrics on /metrics.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/pipeline/pipeline_runner.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;

TEST(PipelineKafkaTest, ChangeEventsFromATopicBecomeDomainEventsExactlyOnce) {
  const std::string servers = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  ASSERT_FALSE(servers.empty());
  const std::string in = tk::unique_topic("pipeline-in"), out = tk::unique_topic("pipeline-out");
  ASSERT_TRUE(tk::create_topic(servers, in, 2));
  ASSERT_TRUE(tk::create_topic(servers, out, 2));

  // The first 3,000 charge changes of the bundled data, keyed by charge (so each charge's changes share a
  // partition and stay in order), and one message that is not a change event.
  std::vector<std::pair<std::string, std::string>> msgs;
  {
    std::ifstream data(fs::path(SLUICE_EXAMPLES_DATA_DIR) / "payments" / "charges.jsonl");
    std::string line;
    while (msgs.size() < 3000 && std::getline(data, line)) {
      Value e = Value::from_json(line).value_or_throw();
      msgs.emplace_back(std::string(e.find("key")->find("id")->as_string()), line);
    }
    msgs.insert(msgs.begin() + 1500, {"poison", "{\"op\": \"c\", truncated"});
  }
  {
    tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", servers}});
    ASSERT_TRUE(producer);
    for (const auto& [key, value] : msgs) {
      ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(in.c_str()),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                  RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END),
                RD_KAFKA_RESP_ERR_NO_ERROR);
      rd_kafka_poll(producer.get(), 0);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }

  char tmpl[] = "/tmp/sluice-pipeline-kafka-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string yaml = fmt::format(R"(pipeline:
  name: kafka-to-kafka
  parallelism: 2
  checkpoint: {{ interval: 200ms, storage: "{0}/checkpoints" }}
  delivery: exactly-once
  dead-letter: {{ type: files, path: "{0}/dlq" }}
source:
  type: kafka
  bootstrap-servers: "${{KAFKA_BOOTSTRAP_SERVERS}}"
  topics: [{1}]
  start: earliest
transform:
  - match: "*.public.charges"
    key: key.id
    event:
      type: "'charge.' || after.status"
      payload: "after.id, after.amount_cents, after.status"
sink:
  events:
    type: kafka
    bootstrap-servers: "${{KAFKA_BOOTSTRAP_SERVERS}}"
    topic: {2}
    properties: {{ transaction.timeout.ms: "60000" }}
)",
                                       dir.string(), in, out);
  Result<PipelineSpec> spec = parse_pipeline(yaml, "kafka.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
  ASSERT_TRUE(runner.ok()) << runner.error().message();
  ASSERT_TRUE((*runner)->start().ok());

  // Read the output with read_committed until every change has its event (the source is unbounded).
  tk::Client consumer = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", servers},
                                                            {"group.id", out + "-verifier"},
                                                            {"isolation.level", "read_committed"},
                                                            {"auto.offset.reset", "earliest"},
                                                            {"enable.partition.eof", "false"}});
  ASSERT_TRUE(consumer);
  rd_kafka_poll_set_consumer(consumer.get());
  rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, out.c_str(), RD_KAFKA_PARTITION_UA);
  ASSERT_EQ(rd_kafka_subscribe(consumer.get(), topics), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(topics);
  std::vector<Value> events;
  const size_t expected = msgs.size() - 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (events.size() < expected && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), 200);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      events.push_back(
          Value::from_json(std::string_view(static_cast<const char*>(m->payload), m->len)).value_or_throw());
      EXPECT_EQ(std::string(static_cast<const char*>(m->key), m->key_len),
                std::string(events.back().find("entity")->as_string()))
          << "events are keyed by entity";
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer.get());
  // /metrics shows the Kafka source's gauges: every message read (the poison one too), the bad record, no lag.
  // (At least: a restart would read some again.)
  std::string text;
  auto gauge = [&](const std::string& name) {
    const std::string prefix = name + "{job=\"kafka-to-kafka\",source=\"kafka\"} ";
    const size_t at = text.find(prefix);
    return at == std::string::npos ? -2.0 : std::stod(text.substr(at + prefix.size()));
  };
  const bool metrics_shown = sluice::testing::poll_until(
      [&] {
        text = (*runner)->metrics_text();
        return gauge("sluice_source_events_total") >= static_cast<double>(msgs.size()) &&
               gauge("sluice_source_kafka_records_lag_max") == 0;
      },
      std::chrono::seconds(60));
  EXPECT_TRUE(metrics_shown) << text;
  EXPECT_GE(gauge("sluice_source_bad_records_total"), 1) << text;
  EXPECT_EQ(gauge("sluice_source_kafka_pending_records"), 0) << text;
  EXPECT_EQ(gauge("sluice_source_kafka_assigned_partitions"), 2) << text;
  EXPECT_EQ(gauge("sluice_source_lag_ms"), 0) << text;
  EXPECT_GT(gauge("sluice_source_kafka_bytes_total"), 0) << text;
  EXPECT_GE(gauge("sluice_source_events_per_second"), 0) << text;
  (*runner)->cancel();
  JobResult r = (*runner)->wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled) << (r.error ? r.error->to_string() : "");

  ASSERT_EQ(events.size(), expected);
  std::set<std::string> ids;
  std::map<std::string, int64_t> last_sequence;
  for (const Value& e : events) {
    EXPECT_TRUE(ids.insert(std::string(e.find("id")->as_string())).second) << "a duplicate: " << e.to_json();
    const std::string entity(e.find("entity")->as_string());
    const int64_t seq = e.find("source")->find("sequence")->as_int64();
    EXPECT_GT(seq, last_sequence.count(entity) ? last_sequence[entity] : -1) << "out of order: " << e.to_json();
    last_sequence[entity] = seq;
    EXPECT_TRUE(std::string_view(e.find("type")->as_string()).starts_with("charge.")) << e.to_json();
  }
  // The poison message: in the source's dead-letter file with topic, partition, offset and the reason.
  std::ifstream dlq(dir / "dlq" / "source-kafka.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(dlq, line)) << "no dead letter";
  Value entry = Value::from_json(line).value_or_throw();
  EXPECT_EQ(entry.find("topic")->as_string(), in) << line;
  EXPECT_NE(entry.find("offset"), nullptr) << line;
  EXPECT_NE(line.find("truncated"), std::string::npos) << line;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice::pipeline
