// Kafka -> map -> Kafka end to end against the real broker (docs/services.md): 1 M keyed records read by the
// KafkaSource (bounded), passed through a map that throws after seeded record counts (10 failures in all,
// restart strategy fixed-delay 0 ms, as tests/unit/cluster/checkpointing_test.cc does), and written by the
// KafkaSink. Then a plain librdkafka consumer reads the output:
//  * at-least-once: every input record (topic partition and offset) appears at least once, and per key the
//    records first appear in input order (repeats after a restart replay an earlier stretch);
//  * exactly-once: a read_committed reader sees every input record exactly once, per key in input order.
// Run: scripts/services/run-with kafka -- build/<dir>/tests/kafka_end_to_end_test
// The failure points come from a fixed seed (SLUICE_TEST_SEED overrides it), printed by each test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "integration/test_util/failures.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/kafka/kafka_source.h"

namespace e2e {
/// What the map writes: the input's key, and "<input partition>:<input offset>:<value>".
struct Out {
  std::string key;
  std::string value;
};
SLUICE_FIELDS(Out, key, value);
}  // namespace e2e

namespace sluice {
namespace {

using sluice::testing::test_seed;

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using namespace std::chrono_literals;
using e2e::Out;
using Rec = KafkaRecord<std::string>;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kRecords = 100'000;
#else
constexpr int64_t kRecords = 1'000'000;
#endif
constexpr int kFailures = 10;
constexpr int kPartitions = 4;
constexpr int64_t kKeys = 1000;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Injects the seeded failures and turns a consumed record into its output.
struct FailingMap {
  sluice::testing::InjectedFailures failures;
  Out operator()(const Rec& r) {
    failures.on_record();
    return Out{r.key.value_or(""), std::to_string(r.partition) + ":" + std::to_string(r.offset) + ":" + r.value};
  }
};

/// One output record as the verifier read it.
struct Read {
  std::string key;
  int32_t in_partition = 0;
  int64_t in_offset = 0;
  int64_t value = 0;
};

class KafkaEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bootstrap_ = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    if (bootstrap_.empty()) return;
    dir_ = fs::temp_directory_path() /
           ("sluice-kafka-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(wall_ms()));
    fs::create_directories(dir_);
    input_ = input_topic(bootstrap_);
    output_ = tk::unique_topic("e2e-out");
    ASSERT_TRUE(tk::create_topic(bootstrap_, output_, kPartitions));
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  /// The input topic, created and filled once per process: value i (0..kRecords-1) under key "k<i % kKeys>".
  static std::string input_topic(const std::string& bootstrap) {
    static std::string topic;
    if (!topic.empty()) return topic;
    const std::string name = tk::unique_topic("e2e-in");
    EXPECT_TRUE(tk::create_topic(bootstrap, name, kPartitions));
    tk::Client p = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap},
                                                       {"linger.ms", "20"},
                                                       // Retries on a fresh broker must not reorder the input.
                                                       {"enable.idempotence", "true"},
                                                       {"batch.num.messages", "10000"},
                                                       {"queue.buffering.max.messages", "500000"},
                                                       {"log_level", "3"}});
    for (int64_t i = 0; i < kRecords; ++i) {
      const std::string key = "k" + std::to_string(i % kKeys);
      const std::string value = std::to_string(i);
      for (;;) {
        rd_kafka_resp_err_t err =
            rd_kafka_producev(p.get(), RD_KAFKA_V_TOPIC(name.c_str()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
                              RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
          rd_kafka_poll(p.get(), 50);
          continue;
        }
        EXPECT_EQ(err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(err);
        break;
      }
    }
    EXPECT_EQ(rd_kafka_flush(p.get(), 120'000), RD_KAFKA_RESP_ERR_NO_ERROR);
    topic = name;
    return topic;
  }

  Configuration job_config() const {
    Configuration c;
    c.set(options::kParallelism, 2);
    c.set_string(std::string(options::kCheckpointInterval.key), "200ms");
    c.set(options::kCheckpointDir, "file://" + (dir_ / "checkpoints").string());
    c.set(options::kCheckpointMode, std::string("EXACTLY_ONCE"));
    c.set(options::kRestartStrategy, std::string("fixed-delay"));
    c.set(options::kFixedDelayAttempts, 1000);
    c.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
    c.set(options::kTolerableFailedCheckpoints, 1000);
    return c;
  }

  /// Runs input -> failing map -> output with `guarantee`; returns the job's result.
  JobResult run(DeliveryGuarantee guarantee, uint64_t seed, std::shared_ptr<std::atomic<int>> fired) {
    std::mt19937_64 rng(seed);
    auto thresholds = std::make_shared<std::vector<int64_t>>();
    // Each map subtask reads about kRecords / 2 records per attempt; a failure comes within its first fifth.
    for (int i = 0; i < kFailures; ++i)
      thresholds->push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(kRecords / 10)) + 1);
    StreamEnvironment env(job_config());
    auto source = KafkaSource<Rec>::builder()
                      .bootstrap_servers(bootstrap_)
                      .topics({input_})
                      .group_id(tk::unique_topic("e2e-group"))
                      .bounded()
                      .deserializer(kafka::record(kafka::string_value()))
                      .property("log_level", "4")
                      .build();
    auto sink = KafkaSink<Out>::builder()
                    .bootstrap_servers(bootstrap_)
                    .topic(output_)
                    .key_serializer([](const Out& o) { return o.key; })
                    .value_serializer([](const Out& o) { return o.value; })
                    .delivery_guarantee(guarantee)
                    .transactional_id_prefix(tk::unique_topic("e2e-tx"))
                    .property("log_level", "4")
                    .build();
    env.from_source(source, "kafka-in")
        .uid("kafka-in")
        .map(FailingMap{std::move(fired), std::move(thresholds)})
        .uid("failing-map")
        .sink_to(sink)
        .uid("kafka-out");
    return env.execute("kafka end to end");
  }

  /// Reads the whole output topic with `isolation` (after the job ended).
  std::vector<Read> read_output(const std::string& isolation) {
    tk::Client c = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstrap_},
                                                       {"group.id", tk::unique_topic("verifier")},
                                                       {"enable.auto.commit", "false"},
                                                       {"enable.partition.eof", "true"},
                                                       {"isolation.level", isolation},
                                                       {"log_level", "3"}});
    tk::PartitionList parts(rd_kafka_topic_partition_list_new(kPartitions));
    for (int p = 0; p < kPartitions; ++p)
      rd_kafka_topic_partition_list_add(parts.get(), output_.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    EXPECT_EQ(rd_kafka_assign(c.get(), parts.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
    std::vector<Read> out;
    std::vector<bool> at_end(kPartitions, false);
    const auto deadline = std::chrono::steady_clock::now() + 300s;
    while (std::count(at_end.begin(), at_end.end(), true) < kPartitions &&
           std::chrono::steady_clock::now() < deadline) {
      tk::Message m(rd_kafka_consumer_poll(c.get(), 500));
      if (!m) continue;
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        at_end[static_cast<size_t>(m->partition)] = true;
        continue;
      }
      EXPECT_EQ(m->err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_message_errstr(m.get());
      if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
      at_end[static_cast<size_t>(m->partition)] = false;
      Read r;
      r.key.assign(static_cast<const char*>(m->key), m->key_len);
      const std::string v(static_cast<const char*>(m->payload), m->len);
      const size_t a = v.find(':');
      const size_t b = v.find(':', a + 1);
      r.in_partition = std::stoi(v.substr(0, a));
      r.in_offset = std::stoll(v.substr(a + 1, b - a - 1));
      r.value = std::stoll(v.substr(b + 1));
      out.push_back(std::move(r));
    }
    rd_kafka_consumer_close(c.get());
    EXPECT_EQ(std::count(at_end.begin(), at_end.end(), true), kPartitions) << "the output was not read to its end";
    return out;
  }

  /// The input's end offsets (its records are at offsets 0..end-1: no transactions).
  std::vector<int64_t> input_end_offsets() {
    tk::Client c = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstrap_}, {"log_level", "3"}});
    std::vector<int64_t> ends;
    for (int p = 0; p < kPartitions; ++p) {
      int64_t lo = 0, hi = 0;
      EXPECT_EQ(rd_kafka_query_watermark_offsets(c.get(), input_.c_str(), p, &lo, &hi, 30'000),
                RD_KAFKA_RESP_ERR_NO_ERROR);
      ends.push_back(hi);
    }
    return ends;
  }

  /// Checks coverage (every input offset and value) and per-key order; `exactly_once` forbids repeats.
  void verify(const std::vector<Read>& out, bool exactly_once) {
    const std::vector<int64_t> ends = input_end_offsets();
    int64_t total = 0;
    std::vector<std::vector<int32_t>> seen_offsets(kPartitions);
    for (int p = 0; p < kPartitions; ++p) {
      total += ends[static_cast<size_t>(p)];
      seen_offsets[static_cast<size_t>(p)].assign(static_cast<size_t>(ends[static_cast<size_t>(p)]), 0);
    }
    ASSERT_EQ(total, kRecords);
    std::vector<int32_t> seen_values(static_cast<size_t>(kRecords), 0);
    // Per key: the input offset of the last record seen for the first time. A key's records share one input
    // partition (the producer places by key), so input order is offset order.
    std::map<std::string, int64_t> last_new_offset;
    int64_t out_of_order = 0;
    for (const Read& r : out) {
      ASSERT_LT(r.in_partition, kPartitions);
      ASSERT_LT(r.in_offset, ends[static_cast<size_t>(r.in_partition)]);
      ASSERT_LT(r.value, kRecords);
      ++seen_offsets[static_cast<size_t>(r.in_partition)][static_cast<size_t>(r.in_offset)];
      const bool first = seen_values[static_cast<size_t>(r.value)]++ == 0;
      EXPECT_EQ(r.key, "k" + std::to_string(r.value % kKeys));
      if (!first) continue;  // a repeat after a restart replays an earlier stretch of its key
      auto [it, fresh] = last_new_offset.try_emplace(r.key, r.in_offset);
      if (!fresh) {
        if (r.in_offset <= it->second) ++out_of_order;
        it->second = r.in_offset;
      }
    }
    EXPECT_EQ(out_of_order, 0) << "records of a key came out of input order";
    int64_t missing = 0, repeated = 0;
    for (const auto& per_partition : seen_offsets) {
      for (int32_t n : per_partition) {
        if (n == 0) ++missing;
        if (n > 1) ++repeated;
      }
    }
    EXPECT_EQ(missing, 0) << "input offsets missing from the output";
    for (int32_t n : seen_values)
      ASSERT_GT(n, 0) << "a value is missing";
    if (exactly_once) {
      EXPECT_EQ(repeated, 0) << "input records written more than once";
      EXPECT_EQ(static_cast<int64_t>(out.size()), kRecords);
    }
    std::printf("%s: %zu output records for %lld inputs, %lld inputs repeated\n",
                exactly_once ? "exactly-once" : "at-least-once", out.size(), static_cast<long long>(kRecords),
                static_cast<long long>(repeated));
  }

  std::string bootstrap_;
  fs::path dir_;
  std::string input_;
  std::string output_;
};

TEST_F(KafkaEndToEndTest, AtLeastOnceUnderInjectedFailures) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  auto fired = std::make_shared<std::atomic<int>>(0);
  JobResult r = run(DeliveryGuarantee::kAtLeastOnce, seed, fired);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(fired->load(), kFailures);
  EXPECT_GE(r.restarts, 1);
  std::printf("%d failures, %d restarts, %lld checkpoints\n", fired->load(), r.restarts,
              static_cast<long long>(r.completed_checkpoints));
  verify(read_output("read_uncommitted"), /*exactly_once=*/false);
}

TEST_F(KafkaEndToEndTest, ExactlyOnceUnderInjectedFailures) {
  const uint64_t seed = test_seed() + 1;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  auto fired = std::make_shared<std::atomic<int>>(0);
  JobResult r = run(DeliveryGuarantee::kExactlyOnce, seed, fired);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(fired->load(), kFailures);
  EXPECT_GE(r.restarts, 1);
  std::printf("%d failures, %d restarts, %lld checkpoints\n", fired->load(), r.restarts,
              static_cast<long long>(r.completed_checkpoints));
  verify(read_output("read_committed"), /*exactly_once=*/true);
}

}  // namespace
}  // namespace sluice
