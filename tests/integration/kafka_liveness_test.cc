// Liveness of the Kafka connectors against a private broker this test starts (test_util/private_kafka.h:
// scripts/services/kafka with its own SLUICE_SERVICES_DIR, so the shared broker other tests use is never paused or
// stopped):
//  * a Kafka sink while no record flows, its broker paused (SIGSTOP: connections stay open, nothing answers): the
//    job fails within the liveness timeout plus a checkpoint interval, naming the bootstrap servers;
//  * a Kafka source on a quiet topic, its broker gone (stopped): the same.
// Before the change both stayed RUNNING (healthy) until a record flowed.
//  * a Kafka sink with a record in flight when its broker is paused: fails within the liveness timeout (the flush
//    used to wait 60 s); a cancel while it waits ends the job within seconds (it took 33 s);
//  * an exactly-once sink whose SASL handshake the (plaintext) shared broker refuses, and one whose topic does not
//    exist: each fails within 5 s of the start naming the cause (they took 60 s).
// Run: scripts/services/run-with kafka -- build/<dir>/tests/kafka_liveness_test (about a minute: a broker start).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/private_kafka.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/kafka/kafka_source.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr auto kLiveness = 3s;

using sluice::testing::PrivateKafka;

class KafkaLivenessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { broker_ = new PrivateKafka(); }
  static void TearDownTestSuite() {
    delete broker_;
    broker_ = nullptr;
  }
  void SetUp() override {
    shared_ = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
    ASSERT_FALSE(shared_.empty());
    ASSERT_FALSE(broker_->bootstrap().empty()) << "the private broker did not start";
    char tmpl[] = "/tmp/sluice-liveness-chk-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Configuration config() const {
    Configuration c;
    c.set(options::kParallelism, 1);
    c.set_string(std::string(options::kCheckpointInterval.key), "200ms");
    c.set(options::kCheckpointDir, "file://" + dir_.string());
    c.set(options::kRestartStrategy, std::string("none"));
    return c;
  }

  // Waits until the job runs and has completed a checkpoint (its connectors are connected and checked).
  static void wait_running(JobClient& client) {
    ASSERT_TRUE(sluice::testing::poll_until([&] { return client.status() == JobStatus::kRunning; }, 60s));
    std::this_thread::sleep_for(kLiveness + 1s);  // one liveness timeout of a healthy broker: no false alarm
    ASSERT_EQ(client.status(), JobStatus::kRunning) << "the job failed while its broker answered";
  }

  // Waits for the job to fail and returns how long it took from `since`, and its error.
  static std::pair<std::chrono::milliseconds, std::string> wait_failed(JobClient& client,
                                                                       std::chrono::steady_clock::time_point since) {
    const bool failed = client.wait_for(60s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
    if (!failed) {
      client.cancel();
      client.wait();
      ADD_FAILURE() << "the job stayed " << job_status_name(client.status()) << " for 60 s";
      return {took, ""};
    }
    JobResult r = client.wait();
    EXPECT_EQ(r.status, JobStatus::kFailed);
    return {took, r.error ? r.error->to_string() : std::string()};
  }

  static PrivateKafka* broker_;
  std::string shared_;
  fs::path dir_;
};

PrivateKafka* KafkaLivenessTest::broker_ = nullptr;

// Writes `value` to `topic` of `bootstrap` (a record for the job's source).
void produce_one(const std::string& bootstrap, const std::string& topic, const std::string& value) {
  tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, tk::Config{{"bootstrap.servers", bootstrap}});
  ASSERT_TRUE(producer);
  ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                              RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
            RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(rd_kafka_flush(producer.get(), 30'000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

TEST_F(KafkaLivenessTest, IdleSinkFailsWithinTheLivenessTimeoutWhenItsBrokerIsPaused) {
  // Source: an empty topic of the shared broker (no record ever flows). Sink: the private broker.
  const std::string in = tk::unique_topic("liveness-in");
  const std::string out = tk::unique_topic("liveness-out");
  ASSERT_TRUE(tk::create_topic(shared_, in, 1));
  ASSERT_TRUE(tk::create_topic(broker_->bootstrap(), out, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(shared_)
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .property("log_level", "3")
                      .build(),
                  "quiet")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(broker_->bootstrap())
                   .topic(out)
                   .liveness_timeout(kLiveness)
                   .property("log_level", "0")
                   .build(),
               "Kafka");
  JobClient client = env.execute_async("idle sink, paused broker");
  wait_running(client);
  const auto paused = std::chrono::steady_clock::now();
  broker_->pause();
  auto [took, error] = wait_failed(client, paused);
  broker_->resume();
  std::printf("idle sink: failed %lld ms after its broker was paused: %s\n", static_cast<long long>(took.count()),
              error.c_str());
  EXPECT_THAT(error, HasSubstr("Kafka sink 'Kafka'"));
  EXPECT_THAT(error, HasSubstr("no broker of '" + broker_->bootstrap() + "' answered for"));
  EXPECT_GE(took, kLiveness);
  EXPECT_LE(took, kLiveness + 7s) << "liveness timeout + a probe interval + a checkpoint interval, with slack";
}

// A record in flight when the broker stops answering: the checkpoint's flush used to block for the whole operation
// timeout (60 s, RUNNING and healthy meanwhile); it now waits in slices that check the liveness probe.
TEST_F(KafkaLivenessTest, SinkWithARecordInFlightFailsWithinTheLivenessTimeoutWhenItsBrokerIsPaused) {
  const std::string in = tk::unique_topic("liveness-flight-in");
  const std::string out = tk::unique_topic("liveness-flight-out");
  ASSERT_TRUE(tk::create_topic(shared_, in, 1));
  ASSERT_TRUE(tk::create_topic(broker_->bootstrap(), out, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(shared_)
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .property("log_level", "3")
                      .build(),
                  "one")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(broker_->bootstrap())
                   .topic(out)
                   .delivery_guarantee(DeliveryGuarantee::kAtLeastOnce)
                   .liveness_timeout(kLiveness)
                   .property("log_level", "0")
                   .build(),
               "Kafka");
  JobClient client = env.execute_async("record in flight, paused broker");
  wait_running(client);
  broker_->pause();
  const auto paused = std::chrono::steady_clock::now();
  produce_one(shared_, in, "in flight");
  auto [took, error] = wait_failed(client, paused);
  broker_->resume();
  std::printf("record in flight: failed %lld ms after its broker was paused: %s\n",
              static_cast<long long>(took.count()), error.c_str());
  EXPECT_THAT(error, HasSubstr("no broker of '" + broker_->bootstrap() + "' answered for"));
  EXPECT_LE(took, kLiveness + 7s) << "liveness timeout + a probe interval + a checkpoint interval, with slack";
}

// Cancelling a job whose sink waits for a paused broker (liveness off, so only the cancel can end the wait): the
// flush used to hold the task for the operation timeout (SIGTERM took 34 s); it now stops within a slice.
TEST_F(KafkaLivenessTest, CancelEndsASinkWaitingForAPausedBrokerWithinSeconds) {
  const std::string in = tk::unique_topic("liveness-cancel-in");
  const std::string out = tk::unique_topic("liveness-cancel-out");
  ASSERT_TRUE(tk::create_topic(shared_, in, 1));
  ASSERT_TRUE(tk::create_topic(broker_->bootstrap(), out, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(shared_)
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .property("log_level", "3")
                      .build(),
                  "one")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(broker_->bootstrap())
                   .topic(out)
                   .delivery_guarantee(DeliveryGuarantee::kAtLeastOnce)
                   .liveness_timeout(0ms)
                   .property("log_level", "0")
                   .build(),
               "Kafka");
  JobClient client = env.execute_async("cancel while the sink waits");
  ASSERT_TRUE(sluice::testing::poll_until([&] { return client.status() == JobStatus::kRunning; }, 60s));
  broker_->pause();
  produce_one(shared_, in, "in flight");
  // Wait until the record is in the sink, unacknowledged by the paused broker: the next checkpoint (every 200 ms)
  // blocks in its flush, which the cancel below must interrupt (the bound asserted holds wherever the task is).
  ASSERT_TRUE(sluice::testing::poll_until(
      [&] {
        for (const OperatorStats& o : client.operator_stats()) {
          if (o.name.find("Kafka") != std::string::npos && o.records_in >= 1) return true;
        }
        return false;
      },
      60s))
      << "the record never reached the sink";
  // Then until checkpoints (every 200 ms) have stopped completing for a second: the sink is stuck in a flush.
  ASSERT_TRUE(sluice::testing::poll_until(
      [&] {
        int64_t last = 0;
        for (const CheckpointStats& c : client.checkpoint_stats()) {
          if (c.completed) last = std::max<int64_t>(last, c.trigger_time_ms + c.duration_ms);
        }
        const int64_t now =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        return last > 0 && now - last > 1000;
      },
      60s))
      << "checkpoints kept completing: the sink is not waiting for the paused broker";
  const auto cancelled = std::chrono::steady_clock::now();
  client.cancel();
  const bool ended = client.wait_for(30s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - cancelled);
  broker_->resume();
  ASSERT_TRUE(ended) << "the job did not end within 30 s of cancel";
  std::printf("cancel while the sink waits: ended %lld ms after cancel\n", static_cast<long long>(took.count()));
  EXPECT_LE(took, 7s) << "a wait slice, plus closing the producers (an abort of at most 5 s is not needed here)";
}

// Exactly-once with credentials the broker cannot accept (SASL against a plaintext listener): librdkafka retries
// for ever and init_transactions waited 60 s while the job looked healthy; the authentication error now fails the
// sink at once with that reason.
TEST_F(KafkaLivenessTest, ExactlyOnceSinkFailsAtOnceOnAuthenticationErrors) {
  const std::string in = tk::unique_topic("auth-in");
  ASSERT_TRUE(tk::create_topic(shared_, in, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(shared_)
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .property("log_level", "3")
                      .build(),
                  "quiet")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(shared_)
                   .topic(in)
                   .delivery_guarantee(DeliveryGuarantee::kExactlyOnce)
                   .transactional_id_prefix(tk::unique_topic("auth-tx"))
                   .property("security.protocol", "SASL_PLAINTEXT")
                   .property("sasl.mechanism", "PLAIN")
                   .property("sasl.username", "nobody")
                   .property("sasl.password", "wrong")
                   .property("log_level", "0")
                   .build(),
               "Kafka");
  const auto start = std::chrono::steady_clock::now();
  JobClient client = env.execute_async("exactly-once, bad credentials");
  auto [took, error] = wait_failed(client, start);
  std::printf("bad credentials: failed %lld ms after start: %s\n", static_cast<long long>(took.count()), error.c_str());
  EXPECT_THAT(error, HasSubstr("the broker refused the sink"));
  EXPECT_LE(took, 5s);
}

// Exactly-once to a topic that does not exist (the broker does not auto-create): the cause used to appear 31 s
// after start; the sink now checks the topic's metadata at open and fails naming it.
TEST_F(KafkaLivenessTest, SinkFailsAtOnceWhenItsTopicDoesNotExist) {
  const std::string in = tk::unique_topic("notopic-in");
  const std::string missing = tk::unique_topic("notopic-missing");
  ASSERT_TRUE(tk::create_topic(shared_, in, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(shared_)
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .property("log_level", "3")
                      .build(),
                  "quiet")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(shared_)
                   .topic(missing)
                   .delivery_guarantee(DeliveryGuarantee::kExactlyOnce)
                   .transactional_id_prefix(tk::unique_topic("notopic-tx"))
                   .property("log_level", "0")
                   .build(),
               "Kafka");
  const auto start = std::chrono::steady_clock::now();
  JobClient client = env.execute_async("exactly-once, missing topic");
  auto [took, error] = wait_failed(client, start);
  std::printf("missing topic: failed %lld ms after start: %s\n", static_cast<long long>(took.count()), error.c_str());
  EXPECT_THAT(error, HasSubstr("topic '" + missing + "' does not exist on " + shared_ + " (auto-creation off?)"));
  EXPECT_LE(took, 5s);
}

TEST_F(KafkaLivenessTest, SourceOnAQuietTopicFailsWithinTheLivenessTimeoutWhenItsBrokerIsGone) {
  // Runs last: it stops the private broker.
  const std::string in = tk::unique_topic("liveness-src");
  ASSERT_TRUE(tk::create_topic(broker_->bootstrap(), in, 1));
  const std::string out = tk::unique_topic("liveness-src-out");
  ASSERT_TRUE(tk::create_topic(shared_, out, 1));  // the sink checks at open that its topic exists
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(broker_->bootstrap())
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .liveness_timeout(kLiveness)
                      .property("log_level", "0")
                      .build(),
                  "quiet")
      .sink_to(
          KafkaSink<std::string>::builder().bootstrap_servers(shared_).topic(out).property("log_level", "0").build(),
          "Kafka");
  JobClient client = env.execute_async("quiet source, broker gone");
  wait_running(client);
  const auto gone = std::chrono::steady_clock::now();
  broker_->stop();
  auto [took, error] = wait_failed(client, gone);
  std::printf("quiet source: failed %lld ms after its broker stopped: %s\n", static_cast<long long>(took.count()),
              error.c_str());
  EXPECT_THAT(error, HasSubstr("Kafka source subtask 0"));
  EXPECT_THAT(error, HasSubstr("no broker of '" + broker_->bootstrap() + "' answered for"));
  EXPECT_LE(took, kLiveness + 15s) << "the stop itself takes seconds (SIGTERM, the broker's shutdown)";
}

}  // namespace
}  // namespace sluice
