// REST security end to end (issue 16 item 6; docs/operations.md, "Security"): a real `sluice run` (datagen -> the
// real Kafka broker) serving its REST API and web UI over HTTPS with an admin and a read-only bearer token.
// Certificates are made by the openssl command for each run (a CA, a server certificate for 127.0.0.1 signed by
// it, its key encrypted with a password); nothing private is committed.
//   * without a token: 401 with WWW-Authenticate and Flink's {"errors": [...]}; /health and the UI's files open;
//   * the read token reads, its actions are answered 403; the admin token may do everything;
//   * the sluice command (list, savepoint, stop) with --ca-file and --token-file / --token-env; a wrong CA or a
//     missing token fail with a clear message;
//   * plain HTTP to the TLS port gets no answer;
//   * five known secrets (both tokens, the key's password, an s3.secret-key and a Kafka sasl.password in the
//     pipeline) appear in no log line (debug level), no REST answer (every GET endpoint, /jobmanager/config and
//     /jobs/:id/config included), /metrics, nor the UI's files.
//
// Needs the kafka service (scripts/services/run-with kafka -- ...).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "integration/test_util/child_process.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/private_kafka.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using sluice::Value;
using sluice::testing::ChildProcess;
using sluice::testing::poll_until;
using sluice::testing::run_command;
using sluice::testing::run_to_end;
using namespace std::chrono_literals;

const std::string kAdminToken = "adm1n-T0ken-5f0c3a9e7d2b4c61a8e9";
const std::string kReadToken = "r3ad-T0ken-b7e24c90d1f63a5e8c2d";
const std::string kKeyPassword = "K3yPassw0rd-e81f";
const std::string kS3Secret = "S3cr3tAcc3ssK3y-4b9d2e";
const std::string kKafkaPassword = "K4fkaSasl-Pw-7c3e1a";

class RestSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);  // httplib's SSLClient writes with OpenSSL, which may raise it
    char tmpl[] = "/tmp/sluice-rest-security-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // A CA, and a server certificate for 127.0.0.1 signed by it whose key is encrypted with kKeyPassword.
    const std::string d = dir_.string();
    run_command(fmt::format(
        "cd {0} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj '/CN=Sluice "
        "test CA' 2>&1 && openssl req -newkey rsa:2048 -nodes -keyout plain.key -out server.csr -subj '/CN=127.0.0.1' "
        "2>&1 && printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && openssl x509 -req -in server.csr -CA ca.pem "
        "-CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile ext.cnf 2>&1 && openssl pkcs8 -topk8 -v2 "
        "aes-256-cbc -in plain.key -out server.key -passout pass:{1} 2>&1 && rm plain.key && openssl req -x509 "
        "-newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 1 -subj '/CN=Another CA' 2>&1",
        d, kKeyPassword));
    ASSERT_TRUE(fs::exists(dir_ / "server.key") && fs::exists(dir_ / "server.pem")) << "openssl failed";
    std::ofstream(dir_ / "admin.token") << kAdminToken << "\n";
    fs::permissions(dir_ / "admin.token", fs::perms::owner_read | fs::perms::owner_write);
    ::setenv("SLUICE_TEST_READ_TOKEN", kReadToken.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("SLUICE_TEST_READ_TOKEN");
    if (!HasFailure()) {
      fs::remove_all(dir_);
    } else {
      std::printf("kept the test directory %s\n", dir_.c_str());
    }
  }

  /// An HTTPS client of `port` verifying the server against `ca`, sending `token` when not empty.
  std::unique_ptr<httplib::SSLClient> client(int port, const std::string& token, const std::string& ca = "ca.pem") {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
    c->set_ca_cert_path((dir_ / ca).c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(10, 0);
    if (!token.empty()) c->set_bearer_token_auth(token.c_str());
    return c;
  }

  fs::path dir_;
};

TEST_F(RestSecurityTest, TokensAndTlsGuardTheApiAndNoSecretIsShown) {
  const std::string bootstrap = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  const std::string topic = tk::unique_topic("rest-security");
  ASSERT_TRUE(tk::create_topic(bootstrap, topic, 1));
  const std::string d = dir_.string();
  const fs::path file = dir_ / "pipeline.yaml";
  // The Kafka sink's password is set although the broker here speaks PLAINTEXT (librdkafka keeps it unused): what
  // matters is that it is in the job's configuration.
  std::ofstream(file) << fmt::format(R"(pipeline:
  name: secured
  checkpoint: {{ interval: 300ms, storage: "{0}/checkpoints" }}
  delivery: at-least-once
  restart: {{ strategy: none }}
  http: {{ port: 0 }}
  config:
    rest.auth.admin-token-file: "{0}/admin.token"
    rest.auth.read-token-env: SLUICE_TEST_READ_TOKEN
    security.ssl.rest.enabled: true
    security.ssl.rest.certificate: "{0}/server.pem"
    security.ssl.rest.key: "{0}/server.key"
    security.ssl.rest.key-password: {5}
    execution.checkpointing.savepoint-dir: "{0}/savepoints"
    s3.access-key: AKIDEXAMPLE
    s3.secret-key: {1}
source:
  type: datagen
  count: 0
  rate: 200
sink:
  out:
    type: kafka
    bootstrap-servers: "{2}"
    topic: {3}
    properties:
      sasl.username: sluice
      sasl.password: {4}
)",
                                     d, kS3Secret, bootstrap, topic, kKafkaPassword, kKeyPassword);
  ChildProcess run(SLUICE_BINARY, {"--log-level", "debug", "run", file.string(), "--linger", "60s"});
  std::smatch m;
  const std::regex url_re(R"(REST API, /metrics and /health at https://127\.0\.0\.1:([0-9]+), job id ([0-9a-f]+))");
  std::string log;
  ASSERT_TRUE(poll_until(
      [&] {
        log = run.err() + run.out();
        return std::regex_search(log, m, url_re) || !run.running();
      },
      60s))
      << log;
  ASSERT_TRUE(std::regex_search(log, m, url_re)) << "sluice run did not serve HTTPS:\n" << log;
  const int port = std::stoi(m[1]);
  const std::string job = m[2];
  const std::string base = fmt::format("https://127.0.0.1:{}", port);

  // Without a token: 401 with WWW-Authenticate and Flink's error body; /health and the UI stay open.
  {
    auto c = client(port, "");
    auto r = c->Get("/jobs");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), R"(Bearer realm="sluice")");
    auto body = Value::from_json(r->body);
    ASSERT_TRUE(body.ok() && body->find("errors") != nullptr) << r->body;
    EXPECT_NE(r->body.find("bearer token"), std::string::npos) << r->body;
    for (const char* path : {"/metrics", "/jobmanager/config", "/overview"}) {
      auto x = c->Get(path);
      ASSERT_TRUE(x);
      EXPECT_EQ(x->status, 401) << path;
    }
    auto patch = c->Patch(fmt::format("/jobs/{}?mode=cancel", job));
    ASSERT_TRUE(patch);
    EXPECT_EQ(patch->status, 401);
    auto health = c->Get("/health");
    ASSERT_TRUE(health);
    EXPECT_TRUE(health->status == 200 || health->status == 503) << health->status;
    EXPECT_NE(health->body.find("healthy"), std::string::npos);
    auto ui = c->Get("/");
    ASSERT_TRUE(ui);
    EXPECT_NE(ui->status, 401) << "the UI's page must load without a token (it asks for one)";
    // A wrong token.
    auto wrong = client(port, kReadToken + "x")->Get("/jobs");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
  }
  // Plain HTTP to the TLS port gets no HTTP answer; a client trusting another CA refuses the server.
  {
    httplib::Client plain("127.0.0.1", port);
    plain.set_connection_timeout(2, 0);
    plain.set_read_timeout(3, 0);
    auto r = plain.Get("/health");
    EXPECT_TRUE(!r || r->status == 400) << (r ? r->body : "");
    auto other = client(port, kAdminToken, "other-ca.pem")->Get("/jobs");
    EXPECT_FALSE(other) << "a certificate not signed by the trusted CA was accepted";
  }
  // The read token reads; its actions are refused with 403.
  auto reader = client(port, kReadToken);
  ASSERT_TRUE(poll_until(
      [&] {
        auto r = reader->Get(fmt::format("/jobs/{}/checkpoints", job));
        return r && r->status == 200 && r->body.find("\"COMPLETED\"") != std::string::npos;
      },
      60s))
      << "no completed checkpoint";
  {
    auto r = reader->Post(fmt::format("/jobs/{}/savepoints", job), "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403);
    EXPECT_NE(r->body.find("admin token"), std::string::npos) << r->body;
    auto cancel = reader->Patch(fmt::format("/jobs/{}?mode=cancel", job));
    ASSERT_TRUE(cancel);
    EXPECT_EQ(cancel->status, 403);
  }

  // Every answer of the API, as the read token sees it, for the secrets check below.
  std::string answers;
  std::vector<std::string> paths = {"/jobs",
                                    "/jobs/overview",
                                    "/overview",
                                    "/config",
                                    "/jobmanager/config",
                                    "/metrics",
                                    "/health",
                                    "/taskmanagers",
                                    "/",
                                    "/app.js",
                                    "/app.css",
                                    "/index.html",
                                    "/jobs/" + job,
                                    "/jobs/" + job + "/config",
                                    "/jobs/" + job + "/exceptions",
                                    "/jobs/" + job + "/checkpoints",
                                    "/jobs/" + job + "/metrics",
                                    "/jobs/" + job + "/metrics?get=numRestarts,lastCheckpointDuration"};
  {
    auto details = reader->Get("/jobs/" + job);
    ASSERT_TRUE(details && details->status == 200);
    auto v = Value::from_json(details->body);
    ASSERT_TRUE(v.ok());
    const Value* vertices = v->find("vertices");
    ASSERT_TRUE(vertices != nullptr && vertices->is_array() && vertices->size() > 0) << details->body;
    for (size_t i = 0; i < vertices->size(); ++i) {
      const std::string vid(vertices->at(i).find("id")->as_string());
      for (const char* suffix : {"", "/backpressure", "/metrics", "/watermarks", "/subtasks/metrics"})
        paths.push_back(fmt::format("/jobs/{}/vertices/{}{}", job, vid, suffix));
    }
  }
  for (const auto& p : paths) {
    auto r = reader->Get(p);
    ASSERT_TRUE(r) << p;
    answers += fmt::format("== GET {} -> {}\n{}\n", p, r->status, r->body);
  }
  // /jobmanager/config lists the keys, hiding the secret values as Flink does.
  EXPECT_NE(answers.find(R"({"key":"s3.secret-key","value":"******"})"), std::string::npos) << answers;
  EXPECT_NE(answers.find(R"({"key":"security.ssl.rest.key-password","value":"******"})"), std::string::npos);
  EXPECT_NE(answers.find(R"("s3.access-key":"AKIDEXAMPLE")"), std::string::npos) << "user-config of /jobs/:id/config";

  // The sluice command: list with the read token from the environment, savepoint refused with it, then savepoint
  // and stop with the admin token's file; without --ca-file or without a token, clear errors.
  const std::string sluice = SLUICE_BINARY;
  auto no_ca = run_to_end(sluice, {"list", "-m", base, "--token-env", "SLUICE_TEST_READ_TOKEN"});
  EXPECT_EQ(no_ca.code, 1);
  EXPECT_NE(no_ca.err.find("--ca-file"), std::string::npos) << no_ca.err;
  auto no_token = run_to_end(sluice, {"list", "-m", base, "--ca-file", d + "/ca.pem"});
  EXPECT_EQ(no_token.code, 1);
  EXPECT_NE(no_token.err.find("HTTP 401"), std::string::npos) << no_token.err;
  auto list =
      run_to_end(sluice, {"list", "-m", base, "--ca-file", d + "/ca.pem", "--token-env", "SLUICE_TEST_READ_TOKEN"});
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find(job), std::string::npos) << list.out;
  auto refused = run_to_end(sluice, {"savepoint", "-m", base, "--ca-file", d + "/ca.pem", "--token-env",
                                     "SLUICE_TEST_READ_TOKEN", job, d + "/sp-refused"});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("HTTP 403"), std::string::npos) << refused.err;
  auto savepoint = run_to_end(sluice, {"savepoint", "-m", base, "--ca-file", d + "/ca.pem", "--token-file",
                                       d + "/admin.token", job, d + "/sp", "--timeout", "60"});
  EXPECT_EQ(savepoint.code, 0) << savepoint.out << savepoint.err;
  EXPECT_NE(savepoint.out.find(d + "/sp"), std::string::npos) << savepoint.out;
  auto stopped = run_to_end(sluice, {"stop", "-m", base, "--ca-file", d + "/ca.pem", "--token-file", d + "/admin.token",
                                     job, "--timeout", "60"});
  EXPECT_EQ(stopped.code, 0) << stopped.out << stopped.err;
  ASSERT_TRUE(poll_until(
      [&] {
        auto r = reader->Get("/jobs/" + job);
        return r && r->status == 200 && r->body.find("\"FINISHED\"") != std::string::npos;
      },
      30s));
  for (const auto& p : {"/jobs/" + job, "/jobs/" + job + "/exceptions", std::string("/metrics")}) {
    auto r = reader->Get(p);
    ASSERT_TRUE(r) << p;
    answers += fmt::format("== GET {} (finished) -> {}\n{}\n", p, r->status, r->body);
  }
  run.signal(SIGTERM);
  run.wait(30s);
  log = run.err() + run.out();
  const std::string cli = no_ca.err + no_token.err + list.out + list.err + refused.err + savepoint.out + savepoint.err +
                          stopped.out + stopped.err;
  ASSERT_GT(log.size(), 1000u) << "the debug log is suspiciously short:\n" << log;
  for (const std::string& secret : {kAdminToken, kReadToken, kKeyPassword, kS3Secret, kKafkaPassword}) {
    EXPECT_EQ(log.find(secret), std::string::npos) << "secret " << secret << " in the log";
    EXPECT_EQ(answers.find(secret), std::string::npos) << "secret " << secret << " in a REST answer:\n" << answers;
    EXPECT_EQ(cli.find(secret), std::string::npos) << "secret " << secret << " in the sluice command's output";
  }
}

}  // namespace
