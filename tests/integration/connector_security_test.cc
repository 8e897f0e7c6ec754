// Connector TLS and authentication against the real services configured for them (issue 16 item 6), each a private
// instance of this test (the shared ones are never reconfigured):
//  * Postgres with `ssl = on`, a certificate from a CA this test makes with the openssl CLI, and pg_hba allowing
//    only TLS connections with a password (scram-sha-256): a pipeline's CDC source with `sslmode=verify-full
//    sslrootcert=<ca>` and the password from the environment streams every row (the replication connection is
//    TLS, pg_stat_ssl says so); the same source trusting another CA fails naming the certificate check;
//  * a Kafka broker with a SASL_PLAINTEXT listener (mechanism PLAIN): a pipeline whose Kafka source and
//    exactly-once Kafka sink authenticate moves every record, read back read_committed through the same listener;
//    a wrong password fails the job within seconds naming the SASL authentication failure;
//  * a Kafka broker with an SSL listener (a PEM keystore of the test's CA) that requires a client certificate: a
//    pipeline whose Kafka source and exactly-once Kafka sink use security.protocol=SSL, ssl.ca.location and a client
//    certificate whose key is encrypted (ssl.key.password from the environment) moves every record, read back
//    read_committed through the SSL listener; trusting another CA fails the job within seconds naming the
//    certificate check, for the whole job (the source's enumerator) and for the sink alone;
//  * the MongoDB CDC source over TLS (tls=true&tlsCAFile=... in the URI, passed to libmongoc): the server here is
//    not a mongod but the wire-protocol emulator mongo-java-server (scripts/services/mongodb; no mongod package is
//    available to this machine), which speaks TLS only when started with a certificate (its enableSsl, Netty's TLS
//    handler: a plaintext client is refused, as by mongod --tlsMode requireTLS). Snapshot and change stream deliver
//    every document; another CA fails the source naming the certificate check. The emulator has no
//    authentication, so no MongoDB password is tested;
//  * an OpenSearch node with the security plugin (scripts/services/opensearch with SLUICE_OPENSEARCH_TLS_* and
//    SLUICE_OPENSEARCH_USERS: opensearch-security 2.19.4.0 from Maven Central, HTTPS only, basic authentication, no
//    anonymous access): a pipeline's OpenSearch sink with an https URL, `ca-file` and the password from the
//    environment indexes every document (counted through the same HTTPS and user); a wrong password and a CA that
//    did not sign the node's certificate each fail the job at once naming the cause, without retries or restarts;
//  * the passwords and the private keys appear in no log line of the runs, nor on /health or /metrics.
// Run: scripts/services/run-with kafka -- build/<dir>/tests/connector_security_test (two private brokers' JVM
// starts, an initdb and an emulator: about 60 s).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>
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
#include "integration/test_util/mongodb.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/postgres.h"
#include "integration/test_util/private_kafka.h"
#include "integration/test_util/private_mongodb.h"
#include "integration/test_util/private_opensearch.h"
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
constexpr const char* kKafkaKeyPassword = "kafka-KeyPass-9c41d7";
constexpr const char* kOpenSearchPassword = "os-Secret-4d2e8b";

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

/// The ids in the files sink's committed part files, with how often each appears: the payload's id (the source's
/// row or document), or with `event_ids` the event's own id (derived from the source position and the key).
std::map<std::string, int> output_ids(const fs::path& dir, bool event_ids = false) {
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
      const Value* id = event_ids ? v->find("id") : payload != nullptr ? payload->find("id") : nullptr;
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

/// Writes `n` change envelopes (ids r00000...) to `topic` with a producer of `config`.
void produce_envelopes(const tk::Config& config, const std::string& topic, int n) {
  tk::Config c = config;
  tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, c);
  ASSERT_TRUE(producer);
  for (int i = 0; i < n; ++i) {
    const std::string key = fmt::format("r{:05d}", i);
    const std::string value = fmt::format(
        R"({{"op":"c","key":{{"id":"{0}"}},"before":null,"after":{{"id":"{0}"}},"source":{{"connector":"test",)"
        R"("db":"d","collection":"s.t","position":"{1}","ts_ms":1790000000000,"snapshot":false}}}})",
        key, i);
    ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  ASSERT_EQ(rd_kafka_flush(producer.get(), 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

/// The payload ids of the events in `topic`, read read_committed with a consumer of `config` until `n` distinct ids
/// arrived or 90 s passed, with how often each appears.
std::map<std::string, int> read_committed_ids(const tk::Config& config, const std::string& topic, int n) {
  std::map<std::string, int> ids;
  tk::Config c = config;
  c["group.id"] = topic + "-verifier";
  c["isolation.level"] = "read_committed";
  c["auto.offset.reset"] = "earliest";
  tk::Client consumer = tk::make_client(RD_KAFKA_CONSUMER, c);
  EXPECT_TRUE(consumer);
  if (!consumer) return ids;
  rd_kafka_poll_set_consumer(consumer.get());
  rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
  EXPECT_EQ(rd_kafka_subscribe(consumer.get(), topics), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(topics);
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  while (ids.size() < static_cast<size_t>(n) && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), 200);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      Value v = Value::from_json(std::string_view(static_cast<const char*>(m->payload), m->len)).value_or_throw();
      ++ids[std::string(v.find("payload")->find("id")->as_string())];
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer.get());
  return ids;
}

int duplicates(const std::map<std::string, int>& ids) {
  int n = 0;
  for (const auto& [id, count] : ids)
    n += count - 1;
  return n;
}

/// A piece of a PEM key file's body (its second line): what a leaked key would show in a log line.
std::string key_material(const fs::path& pem) {
  std::ifstream in(pem);
  std::string line;
  std::getline(in, line);
  std::getline(in, line);
  EXPECT_GE(line.size(), 40u) << pem;
  return line.substr(0, 40);
}

/// Starts `runner` and returns the error that ends it: start()'s (a source's enumerator fails while the job starts)
/// or the failed job's, with the milliseconds it took in `took_ms`. "" (and a test failure) when it did not fail.
std::string failure_of(pipeline::PipelineRunner* runner, long long* took_ms) {
  const auto started = std::chrono::steady_clock::now();
  std::string err;
  if (Status st = runner->start(); !st.ok()) {
    err = st.error().to_string();
  } else {
    JobResult r = runner->wait();
    EXPECT_EQ(r.status, JobStatus::kFailed);
    if (r.error.has_value()) err = r.error->to_string();
  }
  *took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  EXPECT_FALSE(err.empty()) << "the job did not fail";
  return err;
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
    key: after.id
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

  /// A client certificate (`<name>-client.crt`) signed by the CA `<ca>` of make_ca, its key (`<name>-client.key`)
  /// encrypted with `password` (PKCS#8, AES-256).
  void make_client_cert(const std::string& name, const std::string& ca, const std::string& password) const {
    const std::string d = dir_.string() + "/";
    run_command(fmt::format(
        "openssl req -newkey rsa:2048 -keyout '{0}{1}-client.key' -passout 'pass:{3}' -out '{0}{1}-client.csr' "
        "-subj '/CN=sluice-{1}' 2>&1 && openssl x509 -req -in '{0}{1}-client.csr' -CA '{0}{2}-ca.crt' "
        "-CAkey '{0}{2}-ca.key' -CAcreateserial -out '{0}{1}-client.crt' -days 1 2>&1",
        d, name, ca, password));
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
  produce_envelopes(sasl, in, kRecords);
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
    const std::map<std::string, int> ids = read_committed_ids(sasl, out, kRecords);
    const int duplicated = duplicates(ids);
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
    long long took = 0;
    const std::string err = failure_of(runner.get(), &took);
    std::printf("wrong SASL password: failed after %lld ms: %s\n", took, err.c_str());
    EXPECT_NE(err.find("SASL authentication"), std::string::npos) << err;
    EXPECT_EQ(err.find("not-the-password"), std::string::npos) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(kKafkaPassword, log.lines(), nullptr);
  expect_no_secret("not-the-password", log.lines(), nullptr);
  ::unsetenv("SLUICE_TEST_KAFKA_PASSWORD");
  ::unsetenv("SLUICE_TEST_KAFKA_WRONG");
}

TEST_F(ConnectorSecurityTest, KafkaSourceAndExactlyOnceSinkOverSslWithAClientCertificate) {
  make_ca("kafka", true);
  make_ca("other", false);
  make_client_cert("sluice", "kafka", kKafkaKeyPassword);
  const std::string d = dir_.string();
  // The SSL listener presents a certificate of the test's CA and requires a client certificate of the same CA.
  sluice::testing::PrivateKafka broker(
      fmt::format("SLUICE_KAFKA_SSL_CERT='{0}/kafka-server.crt' SLUICE_KAFKA_SSL_KEY='{0}/kafka-server.key' "
                  "SLUICE_KAFKA_SSL_CLIENT_CA='{0}/kafka-ca.crt'",
                  d));
  ASSERT_FALSE(broker.ssl_bootstrap().empty()) << "the private broker did not start with an SSL listener";
  const std::string in = tk::unique_topic("ssl-in");
  const std::string out = tk::unique_topic("ssl-out");
  ASSERT_TRUE(tk::create_topic(broker.bootstrap(), in, 2));
  ASSERT_TRUE(tk::create_topic(broker.bootstrap(), out, 2));
  const tk::Config ssl{
      {"bootstrap.servers", broker.ssl_bootstrap()},  {"security.protocol", "SSL"},
      {"ssl.ca.location", d + "/kafka-ca.crt"},       {"ssl.certificate.location", d + "/sluice-client.crt"},
      {"ssl.key.location", d + "/sluice-client.key"}, {"ssl.key.password", kKafkaKeyPassword}};
  constexpr int kRecords = 300;
  produce_envelopes(ssl, in, kRecords);
  auto properties = [&](const std::string& ca, const std::string& extra) {
    return fmt::format(
        "{{ {}security.protocol: SSL, ssl.ca.location: \"{}/{}-ca.crt\", ssl.certificate.location: "
        "\"{}/sluice-client.crt\", ssl.key.location: \"{}/sluice-client.key\", ssl.key.password: "
        "\"${{SLUICE_TEST_KAFKA_KEY_PASSWORD}}\" }}",
        extra, d, ca, d, d);
  };
  auto yaml = [&](const std::string& name, const std::string& source_ca, const std::string& sink_ca) {
    return pipeline_yaml(
        name,
        fmt::format("  type: kafka\n  bootstrap-servers: \"{}\"\n  topics: [{}]\n  start: earliest\n  properties: {}\n",
                    broker.ssl_bootstrap(), in, properties(source_ca, "")),
        fmt::format("    type: kafka\n    bootstrap-servers: \"{}\"\n    topic: {}\n    properties: {}",
                    broker.ssl_bootstrap(), out, properties(sink_ca, "transaction.timeout.ms: \"60000\", ")));
  };
  ::setenv("SLUICE_TEST_KAFKA_KEY_PASSWORD", kKafkaKeyPassword, 1);
  const std::string key = key_material(dir_ / "sluice-client.key");
  LogCapture log;
  {
    auto runner = runner_for(yaml("kafka-ssl", "kafka", "kafka"));
    ASSERT_TRUE(runner);
    ASSERT_TRUE(runner->start().ok());
    const std::map<std::string, int> ids = read_committed_ids(ssl, out, kRecords);
    const int duplicated = duplicates(ids);
    std::printf("kafka over SSL: %zu distinct of %d read_committed, %d duplicated\n", ids.size(), kRecords, duplicated);
    EXPECT_EQ(ids.size(), static_cast<size_t>(kRecords));
    EXPECT_EQ(duplicated, 0);
    EXPECT_EQ(runner->status(), JobStatus::kRunning);
    expect_no_secret(kKafkaKeyPassword, log.lines(), runner.get());
    expect_no_secret(key, log.lines(), runner.get());
    runner->cancel();
    runner->wait();
  }
  // Trusting another CA: the broker's certificate fails the check. First for the whole job (the source's
  // enumerator meets it first), then for the sink alone (the source trusts the right CA).
  for (const auto& [name, source_ca] : {std::pair<std::string, std::string>{"kafka-ssl-wrong-ca", "other"},
                                        std::pair<std::string, std::string>{"kafka-ssl-sink-wrong-ca", "kafka"}}) {
    auto runner = runner_for(yaml(name, source_ca, "other"));
    ASSERT_TRUE(runner);
    long long took = 0;
    const std::string err = failure_of(runner.get(), &took);
    std::printf("%s: failed after %lld ms: %s\n", name.c_str(), took, err.c_str());
    EXPECT_NE(err.find("certificate verify failed"), std::string::npos) << err;
    EXPECT_EQ(err.find(kKafkaKeyPassword), std::string::npos) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(kKafkaKeyPassword, log.lines(), nullptr);
  expect_no_secret(key, log.lines(), nullptr);
  ::unsetenv("SLUICE_TEST_KAFKA_KEY_PASSWORD");
}

TEST_F(ConnectorSecurityTest, MongoCdcSourceOverTls) {
  make_ca("mongo", true);
  make_ca("other", false);
  const std::string d = dir_.string();
  // The emulator (mongo-java-server, scripts/services/mongodb) speaking TLS only with a certificate of the test's CA.
  sluice::testing::PrivateMongoDb server(
      fmt::format("SLUICE_MONGODB_TLS_CERT='{0}/mongo-server.crt' SLUICE_MONGODB_TLS_KEY='{0}/mongo-server.key' "
                  "SLUICE_MONGODB_TLS_CA='{0}/mongo-ca.crt'",
                  d));
  const std::string uri = server.uri();
  ASSERT_NE(uri.find("tls=true"), std::string::npos) << "the private server did not start with TLS: " << uri;
  const std::string address = uri.substr(0, uri.find("/?"));  // mongodb://127.0.0.1:PORT
  mongoc_init();
  auto ping = [](const std::string& u, std::string* why) {
    mongoc_client_t* client = mongoc_client_new(u.c_str());
    if (client == nullptr) return false;
    bson_t* cmd = BCON_NEW("ping", BCON_INT32(1));
    bson_error_t e;
    const bool ok = mongoc_client_command_simple(client, "admin", cmd, nullptr, nullptr, &e);
    if (!ok) *why = e.message;
    bson_destroy(cmd);
    mongoc_client_destroy(client);
    return ok;
  };
  std::string why;
  EXPECT_FALSE(ping(address + "/?serverSelectionTimeoutMS=3000&connectTimeoutMS=3000", &why))
      << "the server answers without TLS";
  std::printf("without TLS: %s\n", why.c_str());
  ASSERT_TRUE(ping(uri, &why)) << why;
  auto insert = [&](int from, int to) { sluice::testing::insert_items(uri, from, to); };
  insert(0, 200);
  const std::string key = key_material(dir_ / "mongo-server.key");
  LogCapture log;
  {
    auto runner = runner_for(pipeline_yaml(
        "mongo-tls",
        fmt::format("  type: mongodb\n  uri: \"{}\"\n  database: shop\n  collections: [items]\n  start: initial\n",
                    uri),
        fmt::format("    type: files\n    path: \"{}/out\"\n    rolling-policy: {{ rollover-interval: 100ms, "
                    "inactivity-interval: 100ms }}",
                    d)));
    ASSERT_TRUE(runner);
    ASSERT_TRUE(runner->start().ok());
    ASSERT_TRUE(poll_until([&] { return output_ids(dir_ / "out").size() >= 200; }, 60s))
        << output_ids(dir_ / "out").size() << " of 200 snapshot documents";
    insert(200, 400);  // after the snapshot: read by the change stream
    ASSERT_TRUE(poll_until([&] { return output_ids(dir_ / "out").size() >= 400; }, 60s))
        << output_ids(dir_ / "out").size() << " of 400 documents";
    // Exactly once by event id; a document may come twice, from the snapshot and from a stream change at the
    // snapshot's start time, with two event ids (docs/pipelines.md, "Delivery").
    const std::map<std::string, int> ids = output_ids(dir_ / "out");
    const std::map<std::string, int> events = output_ids(dir_ / "out", true);
    std::string twice;
    for (const auto& [id, n] : ids)
      if (n > 1) twice += " " + id;
    std::printf(
        "mongodb over TLS: %zu distinct documents of 400 in %zu events, %d duplicated event ids; documents "
        "emitted by both the snapshot and the stream:%s\n",
        ids.size(), events.size() + duplicates(events), duplicates(events), twice.c_str());
    EXPECT_EQ(ids.size(), 400u);
    EXPECT_GE(events.size(), 400u);
    EXPECT_EQ(duplicates(events), 0);
    EXPECT_EQ(runner->status(), JobStatus::kRunning);
    expect_no_secret(key, log.lines(), runner.get());
    runner->cancel();
    runner->wait();
  }
  // A server certificate that the configured CA did not sign: the source fails naming the certificate check.
  {
    auto runner = runner_for(pipeline_yaml(
        "mongo-wrong-ca",
        fmt::format("  type: mongodb\n  uri: \"{}/?tls=true&tlsCAFile={}/other-ca.crt\"\n  database: shop\n  "
                    "collections: [items]\n  start: initial\n",
                    address, d),
        fmt::format("    type: files\n    path: \"{}/out2\"", d)));
    ASSERT_TRUE(runner);
    long long took = 0;
    const std::string err = failure_of(runner.get(), &took);
    std::printf("mongodb, wrong CA: failed after %lld ms: %s\n", took, err.c_str());
    EXPECT_NE(err.find("certificate verify failed"), std::string::npos) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(key, log.lines(), nullptr);
}

TEST_F(ConnectorSecurityTest, OpenSearchSinkOverHttpsWithBasicAuthentication) {
  make_ca("os", true);
  make_ca("other", false);
  const std::string d = dir_.string();
  sluice::testing::PrivateOpenSearch node(
      fmt::format("SLUICE_OPENSEARCH_TLS_CERT='{0}/os-server.crt' SLUICE_OPENSEARCH_TLS_KEY='{0}/os-server.key' "
                  "SLUICE_OPENSEARCH_TLS_CA='{0}/os-ca.crt' SLUICE_OPENSEARCH_USERS='sluice:{1}'",
                  d, kOpenSearchPassword));
  const std::string url = node.url();
  ASSERT_TRUE(url.starts_with("https://")) << "the private node did not start with TLS: " << url;
  // What a client without the CA, without credentials, with a wrong password, or over plain HTTP gets.
  auto status_of = [&](const std::string& args) {
    return run_command(fmt::format("curl -s -o /dev/null -w '%{{http_code}}' {} '{}/' 2>&1; true", args, url));
  };
  EXPECT_EQ(status_of(fmt::format("--cacert '{}/os-ca.crt'", d)), "401") << "anonymous access";
  EXPECT_EQ(status_of(fmt::format("--cacert '{}/os-ca.crt' -u sluice:wrong", d)), "401");
  EXPECT_EQ(status_of(""), "000") << "a client trusting only the system's CAs";
  EXPECT_EQ(status_of(fmt::format("--cacert '{}/os-ca.crt' -u 'sluice:{}'", d, kOpenSearchPassword)), "200");
  auto count = [&](const std::string& index) {
    const std::string out =
        run_command(fmt::format("curl -s --cacert '{}/os-ca.crt' -u 'sluice:{}' '{}/{}/_count' 2>&1; true", d,
                                kOpenSearchPassword, url, index));
    Result<Value> v = Value::from_json(out);
    const Value* n = v.ok() ? v->find("count") : nullptr;
    return n != nullptr && n->is_int64() ? n->as_int64() : int64_t{-1};
  };
  auto yaml = [&](const std::string& name, const std::string& password_env, const std::string& ca) {
    return fmt::format(R"(pipeline:
  name: {1}
  checkpoint: {{ interval: 200ms, storage: "{0}/checkpoints-{1}" }}
  restart: {{ strategy: fixed-delay, attempts: 3, delay: 100ms }}
source: {{ type: datagen, count: 300, entities: 300 }}
transform:
  - match: "payments.public.charges"
    key: key.id
sink:
  events:
    type: opensearch
    url: "{2}"
    index: {1}
    username: sluice
    password: "${{{3}}}"
    ca-file: "{4}"
    flush-interval: 100ms
)",
                       d, name, url, password_env, ca);
  };
  ::setenv("SLUICE_TEST_OS_PASSWORD", kOpenSearchPassword, 1);
  ::setenv("SLUICE_TEST_OS_WRONG", "not-the-password", 1);
  LogCapture log;
  {
    auto runner = runner_for(yaml("charges", "SLUICE_TEST_OS_PASSWORD", d + "/os-ca.crt"));
    ASSERT_TRUE(runner);
    ASSERT_TRUE(runner->start().ok());
    JobResult r = runner->wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
    run_command(fmt::format("curl -s --cacert '{}/os-ca.crt' -u 'sluice:{}' -X POST '{}/charges/_refresh' 2>&1; true",
                            d, kOpenSearchPassword, url));
    const int64_t n = count("charges");
    std::printf("opensearch over HTTPS with basic authentication: %lld of 300 documents\n", static_cast<long long>(n));
    EXPECT_EQ(n, 300);
    expect_no_secret(kOpenSearchPassword, log.lines(), runner.get());
  }
  // A wrong password: HTTP 401, the job fails at once (no restart: the same request fails the same way).
  {
    auto runner = runner_for(yaml("wrong-password", "SLUICE_TEST_OS_WRONG", d + "/os-ca.crt"));
    ASSERT_TRUE(runner);
    long long took = 0;
    const std::string err = failure_of(runner.get(), &took);
    std::printf("opensearch, wrong password: failed after %lld ms: %s\n", took, err.c_str());
    EXPECT_NE(err.find("HTTP 401"), std::string::npos) << err;
    EXPECT_NE(err.find("the cluster refused the sink's credentials"), std::string::npos) << err;
    EXPECT_EQ(runner->client()->restarts(), 0) << err;
    EXPECT_EQ(err.find("not-the-password"), std::string::npos) << err;
  }
  // A node certificate that the configured CA did not sign: no retry, no restart, the certificate check named.
  {
    auto runner = runner_for(yaml("wrong-ca", "SLUICE_TEST_OS_PASSWORD", d + "/other-ca.crt"));
    ASSERT_TRUE(runner);
    long long took = 0;
    const std::string err = failure_of(runner.get(), &took);
    std::printf("opensearch, wrong CA: failed after %lld ms: %s\n", took, err.c_str());
    EXPECT_NE(err.find("certificate"), std::string::npos) << err;
    EXPECT_NE(err.find("not recoverable by a restart"), std::string::npos) << err;
    EXPECT_EQ(runner->client()->restarts(), 0) << err;
    EXPECT_LE(took, 15'000);
  }
  expect_no_secret(kOpenSearchPassword, log.lines(), nullptr);
  ::unsetenv("SLUICE_TEST_OS_PASSWORD");
  ::unsetenv("SLUICE_TEST_OS_WRONG");
}

}  // namespace
}  // namespace sluice
