// Connector TLS and authentication against the real services configured for them (issue 16 item 6), each a private
// instance of this test (the shared ones are never reconfigured):
//  * Postgres with `ssl = on`, a certificate from a CA this test makes with the openssl CLI, and pg_hba allowing
//    only TLS connections with a password (scram-sha-256): a pipeline's CDC source with `sslmode=verify-full
//    sslrootcert=<ca>` and the password from the environment streams every row (the replication connection is
//    TLS, pg_stat_ssl says so); the same source trusting another CA fails naming the certificate check;
//  * a Kafka broker with a SASL_PLAINTEXT listener (mechanism PLAIN): a pipeline whose Kafka source and
//    exactly-once Kafka sink authenticate moves every record, read back read_committed through the same listener;
//    a wrong password fails the job within seconds naming the SASL authentication failure;
//  * the passwords appear in no log line of the runs, nor on /health or /metrics.
// Run: scripts/services/run-with kafka -- build/<dir>/tests/connector_security_test (a broker's JVM start and an
// initdb: about 40 s).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/postgres.h"
#include "integration/test_util/private_kafka.h"
#include "integration/test_util/private_postgres.h"
#include "sluice/core/logging.h"
#include "sluice/core/value.h"
#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/pipeline/pipeline_spec.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using namespace std::chrono_literals;
using sluice::testing::poll_until;
using sluice::testing::run_command;

constexpr const char* kPgPassword = "pg-Secret-7f3a9c";
constexpr const char* kKafkaPassword = "kafka-Secret-51be20";

/// Captures the log lines of a run (the logger the job uses).
class LogCapture {
 public:
  LogCapture() {
    init_logging();
    sink_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(50'000);
    spdlog::default_logger()->sinks().push_back(sink_);
    // librdkafka's and libpq's debug chatter is where a secret would leak: capture everything.
    previous_ = spdlog::default_logger()->level();
    spdlog::default_logger()->set_level(spdlog::level::debug);
  }
  ~LogCapture() {
    spdlog::default_logger()->set_level(previous_);
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::vector<std::string> lines() const { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  spdlog::level::level_enum previous_ = spdlog::level::info;
};

std::unique_ptr<pipeline::PipelineRunner> runner_for(const std::string& yaml) {
  Result<pipeline::PipelineSpec> spec = pipeline::parse_pipeline(yaml, "security.yaml");
  EXPECT_TRUE(spec.ok()) << spec.error().message();
  if (!spec.ok()) return nullptr;
  Result<std::unique_ptr<pipeline::PipelineRunner>> r = pipeline::PipelineRunner::create(*spec);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? std::move(*r) : nullptr;
}

/// The ids in the files sink's committed part files, with how often each appears.
std::map<std::string, int> output_ids(const fs::path& dir) {
  std::map<std::string, int> out;
  if (!fs::exists(dir)) return out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (!f.path().filename().string().starts_with("part-")) continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      Result<Value> v = Value::from_json(line);
      if (!v.ok()) continue;
      const Value* payload = v->find("payload");
      const Value* id = payload != nullptr ? payload->find("id") : nullptr;
      if (id != nullptr && id->is_string()) ++out[std::string(id->as_string())];
    }
  }
  return out;
}

/// Every place a secret must not appear: the log lines, /health and /metrics of the runner.
void expect_no_secret(const std::string& secret, const std::vector<std::string>& log_lines,
                      pipeline::PipelineRunner* runner) {
  int hits = 0;
  for (const std::string& l : log_lines) {
    if (l.find(secret) != std::string::npos) {
      ++hits;
      ADD_FAILURE() << "the secret is in a log line: " << l;
    }
  }
  std::printf("%zu log lines checked for the secret: %d contain it\n", log_lines.size(), hits);
  if (runner != nullptr) {
    EXPECT_EQ(runner->health().to_json().find(secret), std::string::npos);
    EXPECT_EQ(runner->metrics_text().find(secret), std::string::npos);
  }
}

class ConnectorSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-connector-security-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string pipeline_yaml(const std::string& name, const std::string& source, const std::string& sink) const {
    return fmt::format(R"(pipeline:
  name: {1}
  checkpoint: {{ interval: 200ms, storage: "{0}/checkpoints-{1}" }}
  restart: {{ strategy: none }}
  delivery: exactly-once
source:
{2}
transform:
  - match: "*.*.*"
    key: key.id
    event:
      type: "'row.' || op"
      payload: "after.id AS id"
sink:
  events:
{3}
)",
                       dir_.string(), name, source, sink);
  }

  /// A CA (its certificate in `<name>-ca.crt`) and, with `server`, a server certificate and key for 127.0.0.1 and
  /// localhost signed by it (`<name>-server.crt`, `<name>-server.key`), made with the openssl CLI.
  void make_ca(const std::string& name, bool server) const {
    const std::string d = dir_.string() + "/" + name;
    run_command(
        fmt::format("openssl req -x509 -newkey rsa:2048 -nodes -keyout '{0}-ca.key' -out '{0}-ca.crt' -days 1 "
                    "-subj '/CN=sluice test CA {1}' 2>&1",
                    d, name));
    if (!server) return;
    std::ofstream(d + "-ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    run_command(
        fmt::format("openssl req -newkey rsa:2048 -nodes -keyout '{0}-server.key' -out '{0}-server.csr' "
                    "-subj '/CN=127.0.0.1' 2>&1 && openssl x509 -req -in '{0}-server.csr' -CA '{0}-ca.crt' "
                    "-CAkey '{0}-ca.key' -CAcreateserial -out '{0}-server.crt' -days 1 -extfile '{0}-ext.cnf' 2>&1",
                    d));
  }

  fs::path dir_;
};

TEST_F(ConnectorSecurityTest, PostgresCdcSourceOverTlsWithVerifyFullAndAPassword) {
  sluice::testing::PrivatePostgres server;
  ASSERT_FALSE(server.conninfo().empty()) << "the private server did not start";
  make_ca("pg", true);
  make_ca("other", false);
  // The server's certificate and key in its data directory (the key private to the server's user), TLS on, and
  // only TLS connections with a password from 127.0.0.1 (the local socket stays trusted for the script's tools).
  const std::string data = server.data_dir();
  fs::copy_file(dir_ / "pg-server.crt", data + "/server.crt");
  fs::copy_file(dir_ / "pg-server.key", data + "/server.key");
  server.give_to_server(data + "/server.crt", "644");
  server.give_to_server(data + "/server.key", "600");
  {
    sluice::testing::PgClient pg(server.conninfo());
    pg.exec(fmt::format("ALTER ROLE sluice PASSWORD '{}'", kPgPassword));
    pg.exec("CREATE TABLE items (id text PRIMARY KEY)");
    std::ofstream(data + "/postgresql.conf", std::ios::app)
        << "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n";
    std::ofstream(data + "/pg_hba.conf", std::ios::trunc)
        << "local all all trust\nlocal replication all trust\n"
        << "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 scram-sha-256\n"
        << "hostnossl all all 127.0.0.1/32 reject\nhostnossl replication all 127.0.0.1/32 reject\n";
    pg.exec("SELECT pg_reload_conf()");
  }
  const std::string base = "host=127.0.0.1 port=" + server.port() + " dbname=sluice user=sluice";
  // Without TLS the server refuses; with it and the password it answers over TLS.
  ASSERT_TRUE(poll_until(
      [&] {
        PGconn* c = PQconnectdb((base + " sslmode=disable password=" + kPgPassword).c_str());
        const bool refused = PQstatus(c) != CONNECTION_OK;
        PQfinish(c);
        return refused;
      },
      10s))
      << "the server still accepts connections without TLS";
  const std::string tls = fmt::format("{} sslmode=verify-full sslrootcert={}/pg-ca.crt", base, dir_.string());
  {
    sluice::testing::PgClient pg(tls + " password=" + kPgPassword);
    EXPECT_EQ(pg.rows("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()").at(0).at(0), "true");
    pg.exec("INSERT INTO items SELECT 'r' || lpad(i::text, 5, '0') FROM generate_series(0, 199) i");
  }

  ::setenv("SLUICE_TEST_PG_PASSWORD", kPgPassword, 1);
  LogCapture log;
  {
    auto runner = runner_for(pipeline_yaml(
        "pg-tls",
        fmt::format("  type: postgres\n  conninfo: \"{} password=${{SLUICE_TEST_PG_PASSWORD}}\"\n  tables: "
                    "[public.items]\n  slot: tls_slot\n  publication: tls_pub\n",
                    tls),
        fmt::format("    type: files\n    path: \"{}/out\"\n    rolling-policy: {{ rollover-interval: 100ms, "
                    "inactivity-interval: 100ms }}",
                    dir_.string())));
    ASSERT_TRUE(runner);
    ASSERT_TRUE(runner->start().ok());
    ASSERT_TRUE(poll_until([&] { return output_ids(dir_ / "out").size() >= 200; }, 60s))
        << output_ids(dir_ / "out").size() << " of 200 snapshot rows";
    {
      sluice::testing::PgClient pg(tls + " password=" + kPgPassword);
      pg.exec("INSERT INTO items SELECT 'r' || lpad(i::text, 5, '0') FROM generate_series(200, 399) i");
      // The source's replication connection is encrypted.
      EXPECT_EQ(pg.rows("SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s ON s.pid = r.pid WHERE s.ssl")
                    .at(0)
                    .at(0),
                "1");
    }
    ASSERT_TRUE(poll_until([&] { return output_ids(dir_ / "out").size() >= 400; }, 60s))
        << output_ids(dir_ / "out").size() << " of 400 rows";
    const std::map<std::string, int> ids = output_ids(dir_ / "out");
    int duplicated = 0;
    for (const auto& [id, n] : ids)
      duplicated += n - 1;
    std::printf("postgres over TLS: %zu distinct rows of 400, %d duplicated\n", ids.size(), duplicated);
    EXPECT_EQ(ids.size(), 400u);
    EXPECT_EQ(duplicated, 0);
    EXPECT_EQ(runner->status(), JobStatus::kRunning);
    expect_no_secret(kPgPassword, log.lines(), runner.get());
    runner->cancel();
    runner->wait();
  }
  // A server certificate that the configured CA did not sign: the source fails naming the certificate check.
  {
    auto runner = runner_for(pipeline_yaml(
        "pg-wrong-ca",
        fmt::format("  type: postgres\n  conninfo: \"{} sslmode=verify-full sslrootcert={}/other-ca.crt "
                    "password=${{SLUICE_TEST_PG_PASSWORD}}\"\n  tables: [public.items]\n  slot: tls_slot2\n  "
                    "publication: tls_pub\n",
                    base, dir_.string()),
        fmt::format("    type: files\n    path: \"{}/out2\"", dir_.string())));
    ASSERT_TRUE(runner);
    const auto started = std::chrono::steady_clock::now();
    ASSERT_TRUE(runner->start().ok());
    JobResult r = runner->wait();
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    ASSERT_EQ(r.status, JobStatus::kFailed);
    ASSERT_TRUE(r.error.has_value());
    const std::string err = r.error->to_string();
    std::printf("wrong CA: failed after %lld ms: %s\n", static_cast<long long>(took), err.c_str());
    EXPECT_NE(err.find("certificate verify failed"), std::string::npos) << err;
    EXPECT_EQ(err.find(kPgPassword), std::string::npos) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(kPgPassword, log.lines(), nullptr);
  ::unsetenv("SLUICE_TEST_PG_PASSWORD");
}

TEST_F(ConnectorSecurityTest, KafkaSourceAndExactlyOnceSinkAuthenticateWithSaslPlain) {
  sluice::testing::PrivateKafka broker(fmt::format("SLUICE_KAFKA_SASL_PLAIN_USERS='sluice:{}'", kKafkaPassword));
  ASSERT_FALSE(broker.sasl_bootstrap().empty()) << "the private broker did not start with a SASL listener";
  const std::string in = tk::unique_topic("sasl-in");
  const std::string out = tk::unique_topic("sasl-out");
  ASSERT_TRUE(tk::create_topic(broker.bootstrap(), in, 2));
  ASSERT_TRUE(tk::create_topic(broker.bootstrap(), out, 2));
  const tk::Config sasl{{"bootstrap.servers", broker.sasl_bootstrap()},
                        {"security.protocol", "SASL_PLAINTEXT"},
                        {"sasl.mechanisms", "PLAIN"},
                        {"sasl.username", "sluice"},
                        {"sasl.password", kKafkaPassword}};
  constexpr int kRecords = 300;
  {
    tk::Config c = sasl;
    tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, c);
    ASSERT_TRUE(producer);
    for (int i = 0; i < kRecords; ++i) {
      const std::string key = fmt::format("r{:05d}", i);
      const std::string value = fmt::format(
          R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}"}},"source":{{"connector":"test",)"
          R"("db":"d","collection":"s.t","position":"{1}","ts_ms":1790000000000,"snapshot":false}}}})",
          key, i);
      ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(in.c_str()),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                  RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END),
                RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  auto properties = [](const std::string& password_var) {
    return fmt::format(
        "{{ security.protocol: SASL_PLAINTEXT, sasl.mechanisms: PLAIN, sasl.username: sluice, sasl.password: "
        "\"${{{}}}\" }}",
        password_var);
  };
  ::setenv("SLUICE_TEST_KAFKA_PASSWORD", kKafkaPassword, 1);
  ::setenv("SLUICE_TEST_KAFKA_WRONG", "not-the-password", 1);
  LogCapture log;
  {
    auto runner = runner_for(pipeline_yaml(
        "kafka-sasl",
        fmt::format("  type: kafka\n  bootstrap-servers: \"{}\"\n  topics: [{}]\n  start: earliest\n  properties: {}\n",
                    broker.sasl_bootstrap(), in, properties("SLUICE_TEST_KAFKA_PASSWORD")),
        fmt::format("    type: kafka\n    bootstrap-servers: \"{}\"\n    topic: {}\n    properties: {}",
                    broker.sasl_bootstrap(), out,
                    properties("SLUICE_TEST_KAFKA_PASSWORD").insert(1, " transaction.timeout.ms: \"60000\","))));
    ASSERT_TRUE(runner);
    ASSERT_TRUE(runner->start().ok());
    tk::Config c = sasl;
    c["group.id"] = out + "-verifier";
    c["isolation.level"] = "read_committed";
    c["auto.offset.reset"] = "earliest";
    tk::Client consumer = tk::make_client(RD_KAFKA_CONSUMER, c);
    ASSERT_TRUE(consumer);
    rd_kafka_poll_set_consumer(consumer.get());
    rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, out.c_str(), RD_KAFKA_PARTITION_UA);
    ASSERT_EQ(rd_kafka_subscribe(consumer.get(), topics), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(topics);
    std::map<std::string, int> ids;
    size_t events = 0;
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    while (ids.size() < static_cast<size_t>(kRecords) && std::chrono::steady_clock::now() < deadline) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), 200);
      if (m == nullptr) continue;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        Value v = Value::from_json(std::string_view(static_cast<const char*>(m->payload), m->len)).value_or_throw();
        ++ids[std::string(v.find("payload")->find("id")->as_string())];
        ++events;
      }
      rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(consumer.get());
    int duplicated = 0;
    for (const auto& [id, n] : ids)
      duplicated += n - 1;
    std::printf("kafka over SASL: %zu distinct of %d read_committed, %d duplicated\n", ids.size(), kRecords,
                duplicated);
    EXPECT_EQ(ids.size(), static_cast<size_t>(kRecords));
    EXPECT_EQ(duplicated, 0);
    EXPECT_EQ(runner->status(), JobStatus::kRunning);
    expect_no_secret(kKafkaPassword, log.lines(), runner.get());
    runner->cancel();
    runner->wait();
  }
  // A wrong password: the job fails within seconds naming the authentication failure.
  {
    auto runner = runner_for(pipeline_yaml(
        "kafka-sasl-wrong",
        fmt::format("  type: kafka\n  bootstrap-servers: \"{}\"\n  topics: [{}]\n  start: earliest\n  properties: {}\n",
                    broker.sasl_bootstrap(), in, properties("SLUICE_TEST_KAFKA_WRONG")),
        fmt::format("    type: kafka\n    bootstrap-servers: \"{}\"\n    topic: {}\n    properties: {}",
                    broker.sasl_bootstrap(), out, properties("SLUICE_TEST_KAFKA_WRONG"))));
    ASSERT_TRUE(runner);
    const auto started = std::chrono::steady_clock::now();
    // The source's enumerator fails while the job starts (start() returns the error), or a task fails the job.
    std::string err;
    if (Status st = runner->start(); !st.ok()) {
      err = st.error().to_string();
    } else {
      JobResult r = runner->wait();
      ASSERT_EQ(r.status, JobStatus::kFailed);
      ASSERT_TRUE(r.error.has_value());
      err = r.error->to_string();
    }
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    std::printf("wrong SASL password: failed after %lld ms: %s\n", static_cast<long long>(took), err.c_str());
    EXPECT_NE(err.find("SASL authentication"), std::string::npos) << err;
    EXPECT_EQ(err.find("not-the-password"), std::string::npos) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(kKafkaPassword, log.lines(), nullptr);
  expect_no_secret("not-the-password", log.lines(), nullptr);
  ::unsetenv("SLUICE_TEST_KAFKA_PASSWORD");
  ::unsetenv("SLUICE_TEST_KAFKA_WRONG");
}

}  // namespace
}  // namespace sluice
