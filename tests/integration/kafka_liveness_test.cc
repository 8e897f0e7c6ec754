// Liveness of the Kafka connectors against a private broker this test starts (test_util/private_kafka.h:
// scripts/services/kafka with its own SLUICE_SERVICES_DIR, so the shared broker other tests use is never paused or
// stopped):
//  * a Kafka sink while no record flows, its broker paused (SIGSTOP: connections stay open, nothing answers): the
//    job fails within the liveness timeout plus a checkpoint interval, naming the bootstrap servers;
//  * a Kafka source on a quiet topic, its broker gone (stopped): the same.
// Before the change both stayed RUNNING (healthy) until a record flowed.
// Run: scripts/services/run-with kafka -- build/<dir>/tests/kafka_liveness_test (about a minute: a broker start).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

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

TEST_F(KafkaLivenessTest, SourceOnAQuietTopicFailsWithinTheLivenessTimeoutWhenItsBrokerIsGone) {
  // Runs last: it stops the private broker.
  const std::string in = tk::unique_topic("liveness-src");
  ASSERT_TRUE(tk::create_topic(broker_->bootstrap(), in, 1));
  StreamEnvironment env(config());
  env.from_source(KafkaSource<std::string>::builder()
                      .bootstrap_servers(broker_->bootstrap())
                      .topics({in})
                      .deserializer(kafka::string_value())
                      .liveness_timeout(kLiveness)
                      .property("log_level", "0")
                      .build(),
                  "quiet")
      .sink_to(KafkaSink<std::string>::builder()
                   .bootstrap_servers(shared_)
                   .topic(tk::unique_topic("unused"))
                   .property("log_level", "0")
                   .build(),
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
