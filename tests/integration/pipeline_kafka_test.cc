// A pipeline from Kafka to Kafka through `sluice run`'s job, against the real broker: change events read from a
// topic (with a poison message), domain events written exactly once (transactions per checkpoint) and read back
// with read_committed: every change once, per-entity order, the poison message in the source's dead-letter file
// with its partition and offset; the source's metrics on /metrics. A change whose domain event is larger than the
// producer's message.max.bytes (1 MB against the default 1,000,000): to the sink's dead-letter file with the reason
// and its source position while the rest is delivered, or, without a dead-letter sink, the job fails naming it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
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

// Writes `lines` (key = the change's key.id) to `topic`.
void produce_lines(const std::string& servers, const std::string& topic, const std::vector<std::string>& lines) {
  tk::Client producer = tk::make_client(
      RD_KAFKA_PRODUCER, {{"bootstrap.servers", servers}, {"message.max.bytes", "4000000"}, {"log_level", "3"}});
  ASSERT_TRUE(producer);
  for (const std::string& value : lines) {
    Value e = Value::from_json(value).value_or_throw();
    const std::string key(e.find("key")->find("id")->as_string());
    ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

std::string charge_change(const std::string& id, const std::string& status, int lsn) {
  return fmt::format(
      R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}","amount_cents":100,"status":"{1}"}},)"
      R"("source":{{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/{2:X}",)"
      R"("ts_ms":1790000000000,"snapshot":false,"txn_id":{2},"sequence":1}}}})",
      id, status, lsn);
}

std::string oversize_yaml(const fs::path& dir, const std::string& in, const std::string& out, bool dead_letter) {
  return fmt::format(
      R"(pipeline:
  name: kafka-oversize
  checkpoint: {{ interval: 200ms, storage: "{0}/checkpoints" }}
  delivery: exactly-once
  restart: {{ strategy: none }}
{3}
source:
  type: kafka
  bootstrap-servers: "${{KAFKA_BOOTSTRAP_SERVERS}}"
  topics: [{1}]
  start: earliest
  properties: {{ fetch.max.bytes: "8000000", max.partition.fetch.bytes: "8000000" }}
transform:
  - match: "*.public.charges"
    key: key.id
    event:
      type: "'charge.' || after.status"
      payload: "after.id, after.status"
sink:
  events:
    type: kafka
    bootstrap-servers: "${{KAFKA_BOOTSTRAP_SERVERS}}"
    topic: {2}
    properties: {{ transaction.timeout.ms: "60000" }}
)",
      dir.string(), in, out,
      dead_letter ? fmt::format("  dead-letter: {{ type: files, path: \"{}/dlq\" }}", dir.string()) : "");
}

class PipelineKafkaOversizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    servers_ = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    ASSERT_FALSE(servers_.empty());
    in_ = tk::unique_topic("oversize-in");
    out_ = tk::unique_topic("oversize-out");
    ASSERT_TRUE(tk::create_topic(servers_, in_, 1, {{"max.message.bytes", "4000000"}}));
    ASSERT_TRUE(tk::create_topic(servers_, out_, 1));
    char tmpl[] = "/tmp/sluice-pipeline-oversize-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // The second change carries a 1 MiB status: its event is above the producer's message.max.bytes.
    lines_ = {charge_change("ch_1", "ok", 0x10), charge_change("ch_2", std::string(1 << 20, 's'), 0x20),
              charge_change("ch_3", "ok", 0x30)};
    produce_lines(servers_, in_, lines_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string servers_, in_, out_;
  fs::path dir_;
  std::vector<std::string> lines_;
};

TEST_F(PipelineKafkaOversizeTest, TooLargeEventGoesToTheSinksDeadLetterFileWithItsPosition) {
  Result<PipelineSpec> spec = parse_pipeline(oversize_yaml(dir_, in_, out_, true), "oversize.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
  ASSERT_TRUE(runner.ok()) << runner.error().message();
  ASSERT_TRUE((*runner)->start().ok());
  // The other two changes arrive, read_committed.
  tk::Client consumer = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", servers_},
                                                            {"group.id", out_ + "-verifier"},
                                                            {"isolation.level", "read_committed"},
                                                            {"auto.offset.reset", "earliest"}});
  ASSERT_TRUE(consumer);
  rd_kafka_poll_set_consumer(consumer.get());
  rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, out_.c_str(), RD_KAFKA_PARTITION_UA);
  ASSERT_EQ(rd_kafka_subscribe(consumer.get(), topics), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(topics);
  std::vector<std::string> entities;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (entities.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), 200);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) entities.emplace_back(static_cast<const char*>(m->key), m->key_len);
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer.get());
  const fs::path dlq = dir_ / "dlq" / "sink-events.jsonl";
  std::string line;
  const bool dead_lettered = sluice::testing::poll_until(
      [&] {
        std::ifstream f(dlq);
        return static_cast<bool>(std::getline(f, line));
      },
      std::chrono::seconds(30));
  EXPECT_EQ((*runner)->status(), JobStatus::kRunning)
      << "the job fails on a too large record although a dead-letter sink is set";
  // /metrics counts what the sink dead-lettered (the trial's summary said 0 to the dead-letter sink).
  const std::string metrics = (*runner)->metrics_text();
  EXPECT_NE(metrics.find("sluice_sink_dead_letters_total{job=\"kafka-oversize\",sink=\"events\"} 1"), std::string::npos)
      << metrics;
  // And per reason, in the sink stage's series of the running job (issue 16).
  const std::regex too_large(R"(flink_jobmanager_job_deadLetters_numRecordsByReason\{[^}]*stage="sink"[^}]*)"
                             R"(sink_name="events"[^}]*reason="too-large"\} 1\n)");
  EXPECT_TRUE(std::regex_search(metrics, too_large)) << metrics;
  (*runner)->cancel();
  JobResult r = (*runner)->wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled) << (r.error ? r.error->to_string() : "");
  const std::string summary = (*runner)->summary(r);
  EXPECT_NE(
      summary.find("; 1 record refused by sink 'events' went to " + (dir_ / "dlq" / "sink-events.jsonl").string()),
      std::string::npos)
      << summary;
  EXPECT_NE(summary.find("'events' 3 (1 of them to its dead-letter file)"), std::string::npos) << summary;
  EXPECT_EQ(entities, (std::vector<std::string>{"ch_1", "ch_3"}));
  ASSERT_TRUE(dead_lettered) << "no dead letter in " << dlq;
  Value entry = Value::from_json(line).value_or_throw();
  EXPECT_EQ(entry.find("sink")->as_string(), "kafka") << line.substr(0, 400);
  EXPECT_EQ(entry.find("topic")->as_string(), out_);
  EXPECT_EQ(entry.find("key")->as_string(), "ch_2");
  EXPECT_EQ(entry.find("position")->as_string(), "0/20");
  EXPECT_NE(std::string(entry.find("error")->as_string()).find("MSG_SIZE_TOO_LARGE"), std::string::npos);
  EXPECT_GT(entry.find("record")->as_string().size(), size_t{1} << 20) << "the whole event";
}

TEST_F(PipelineKafkaOversizeTest, WithoutDeadLetterSinkTheJobFailsNamingTheRecordAndPosition) {
  Result<PipelineSpec> spec = parse_pipeline(oversize_yaml(dir_, in_, out_, false), "oversize.yaml");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
  ASSERT_TRUE(runner.ok()) << runner.error().message();
  ASSERT_TRUE((*runner)->start().ok());
  const bool ended =
      sluice::testing::poll_until([&] { return (*runner)->status() == JobStatus::kFailed; }, std::chrono::seconds(90));
  if (!ended) (*runner)->cancel();
  JobResult r = (*runner)->wait();
  ASSERT_TRUE(ended) << "the job kept running";
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error.has_value());
  const std::string m = r.error->to_string();
  EXPECT_NE(m.find("topic '" + out_ + "' (key 'ch_2'"), std::string::npos) << m;
  EXPECT_NE(m.find("source position 0/20"), std::string::npos) << m;
  EXPECT_NE(m.find("MSG_SIZE_TOO_LARGE"), std::string::npos) << m;
}

}  // namespace
}  // namespace sluice::pipeline
