// Issue 14, "Secrets": a password in a connection string (MongoDB URI, Postgres conninfo or URI, OpenSearch URL,
// Kafka's sasl.password) never appears in an error message, the job's failure cause (as `sluice run` prints it
// and as the REST API serves it: GET /jobs, /jobs/:id and /jobs/:id/exceptions), /health or the logs. Each case
// provokes a connector's error with a known secret and greps all of them for it; none needs a running service
// (the errors come from parsing or from a refused connection). Each case fails when its connector's redaction
// is removed (checked by hand with redact_secrets() returning its input).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/pipeline/pipeline_spec.h"
#include "sluice/web/rest_server.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

class SecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-secrets-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "in");
    std::ofstream(dir_ / "in" / "changes.jsonl")
        << R"({"op":"c","key":{"id":"a"},"before":null,"after":{"id":"a","n":1},"source":{"connector":"postgres",)"
           R"("db":"d","collection":"public.t","position":"0/1","ts_ms":1,"snapshot":false,"sequence":1}})"
        << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string pipeline(const std::string& source, const std::string& sink) const {
    return fmt::format(R"(pipeline:
  name: secrets
  checkpoint: {{ interval: 100ms, storage: "{0}/checkpoints" }}
  restart: {{ strategy: none }}
source:
{1}
sink:
  out:
{2}
)",
                       dir_.string(), source, sink);
  }
  std::string files_source() const { return fmt::format("  type: files\n  path: {}/in", dir_.string()); }
  std::string files_sink() const { return fmt::format("    type: files\n    path: {}/out", dir_.string()); }

  // Parses, builds and runs the pipeline (bounded: cancelled after 60 s); returns every error text it produced,
  // what the REST API serves about the job once it ended, and everything written to stdout and stderr (the logs)
  // meanwhile.
  std::string run(const std::string& yaml) {
    std::string text;
    std::string rest_problem;  // reported after the capture ends (a failure printed meanwhile would be captured)
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    Result<PipelineSpec> spec = parse_pipeline(yaml, "secrets.yaml");
    if (!spec.ok()) {
      text += spec.error().to_string();
    } else if (Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec); !runner.ok()) {
      text += runner.error().to_string();
    } else if (Status started = (*runner)->start(); !started.ok()) {
      text += started.error().to_string();
    } else {
      Result<std::unique_ptr<RestServer>> rest = RestServer::start(RestServerOptions{});
      if (!rest.ok()) rest_problem += "RestServer::start: " + rest.error().to_string() + "\n";
      std::optional<JobClient> client = (*runner)->client();
      if (rest.ok() && client) (*rest)->register_job("secrets", *client, {});
      std::thread watchdog([&, deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60)] {
        while ((*runner)->status() == JobStatus::kRunning || (*runner)->status() == JobStatus::kCreated) {
          if (std::chrono::steady_clock::now() > deadline) {
            (*runner)->cancel();
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
      JobResult r = (*runner)->wait();
      watchdog.join();
      if (r.error) text += r.error->to_string();
      text += "\n" + (*runner)->health().to_json();
      if (rest.ok() && client) {
        httplib::Client http("127.0.0.1", (*rest)->port());
        const std::string job = "/jobs/" + client->job_id();
        bool failure_served = false;
        for (const std::string& path : {std::string("/jobs"), job, job + "/exceptions"}) {
          auto res = http.Get(path);
          if (!res || res->status != 200) {
            rest_problem +=
                "GET " + path + ": " + (res ? std::to_string(res->status) + " " + res->body : "no answer") + "\n";
          }
          if (!res) continue;
          text += "\n" + res->body;
          failure_served =
              failure_served || (path == job + "/exceptions" &&
                                 res->body.find("\"exceptionHistory\":{\"entries\":[{") != std::string::npos);
        }
        // The REST API serves the failure (else a leak there could not be seen).
        if (r.error && !failure_served) rest_problem += "the failure is not in GET " + job + "/exceptions\n";
      }
    }
    text += "\n" + testing::internal::GetCapturedStdout();
    text += "\n" + testing::internal::GetCapturedStderr();
    EXPECT_TRUE(rest_problem.empty()) << rest_problem << text;
    return text;
  }

  static void expect_redacted(const std::string& text, const std::string& secret, const std::string& expected) {
    EXPECT_EQ(text.find(secret), std::string::npos) << "the secret leaked:\n" << text;
    EXPECT_NE(text.find(expected), std::string::npos) << "the error is not there:\n" << text;
  }

  fs::path dir_;
};

TEST_F(SecretsTest, PostgresSourceConninfoUri) {
  // libpq quotes a malformed URI whole in its error.
  const std::string text =
      run(pipeline("  type: postgres\n  conninfo: \"postgresql://sluice:PgS3cretSrc@[::1:5432/db\"", files_sink()));
  expect_redacted(text, "PgS3cretSrc", "postgresql://sluice:****@");
}

TEST_F(SecretsTest, PostgresSinkConninfoUri) {
  const std::string text = run(pipeline(
      files_source(),
      "    type: postgres\n    conninfo: \"postgresql://sluice:PgS3cretSink@[::1:5432/db\"\n    table: public.t\n"
      "    key-columns: [id]"));
  expect_redacted(text, "PgS3cretSink", "postgresql://sluice:****@");
}

TEST_F(SecretsTest, MongoDbUri) {
  const std::string text =
      run(pipeline("  type: mongodb\n  uri: \"mongodb://app:MgS3cret@/?replicaSet=rs0\"\n  database: d\n"
                   "  collections: [c]",
                   files_sink()));
  expect_redacted(text, "MgS3cret", "mongodb://app:****@");
}

TEST_F(SecretsTest, OpenSearchUrlWithCredentials) {
  // Nothing listens on port 1: the refused connection's error names the URL.
  const std::string text = run(pipeline(
      files_source(),
      "    type: opensearch\n    url: \"http://admin:OsS3cret@127.0.0.1:1\"\n    index: t\n    max-retries: 0"));
  expect_redacted(text, "OsS3cret", "http://admin:****@127.0.0.1:1");
}

TEST_F(SecretsTest, KafkaSaslPassword) {
  // A misspelled secret property is refused naming it; its value stays hidden.
  std::string text =
      run(pipeline(files_source(),
                   "    type: kafka\n    bootstrap-servers: 127.0.0.1:1\n    topic: t\n    properties:\n"
                   "      security.protocol: SASL_PLAINTEXT\n      sasl.mechanism: PLAIN\n      sasl.username: u\n"
                   "      sasl.passwd: K4fkaS3cretA"));
  expect_redacted(text, "K4fkaS3cretA", "sasl.passwd");
  // An unsupported mechanism next to a password: the error is about the mechanism, the password stays hidden.
  text = run(pipeline(files_source(),
                      "    type: kafka\n    bootstrap-servers: 127.0.0.1:1\n    topic: t\n    properties:\n"
                      "      security.protocol: SASL_PLAINTEXT\n      sasl.mechanism: BOGUS\n      sasl.username: u\n"
                      "      sasl.password: K4fkaS3cretB\n      debug: conf,security"));
  expect_redacted(text, "K4fkaS3cretB", "BOGUS");
}

TEST_F(SecretsTest, KafkaSourceSaslPassword) {
  // The source's consumer takes librdkafka properties as the sink's producer does: a misspelled secret property is
  // refused naming it, its value hidden.
  const std::string text =
      run(pipeline("  type: kafka\n  bootstrap-servers: 127.0.0.1:1\n  topics: [t]\n  properties:\n"
                   "    security.protocol: SASL_PLAINTEXT\n    sasl.mechanism: PLAIN\n    sasl.username: u\n"
                   "    sasl.passwd: K4fkaS3cretC",
                   files_sink()));
  expect_redacted(text, "K4fkaS3cretC", "sasl.passwd");
}

TEST_F(SecretsTest, KafkaDeadLetterSinkSaslPassword) {
  // The dead-letter Kafka sink (pipeline.dead-letter) is built from its own properties, ${VAR} expanded.
  ::setenv("SLUICE_SECRETS_TEST_KAFKA_PASSWORD", "K4fkaS3cretD", 1);
  std::string yaml = pipeline(files_source(), files_sink());
  const std::string dead_letter =
      "  dead-letter:\n    type: kafka\n    bootstrap-servers: 127.0.0.1:1\n    topic: dlq\n    properties:\n"
      "      security.protocol: SASL_PLAINTEXT\n      sasl.mechanism: PLAIN\n      sasl.username: u\n"
      "      sasl.passwd: ${SLUICE_SECRETS_TEST_KAFKA_PASSWORD}\n";
  yaml.insert(yaml.find("  restart:"), dead_letter);
  const std::string text = run(yaml);
  ::unsetenv("SLUICE_SECRETS_TEST_KAFKA_PASSWORD");
  expect_redacted(text, "K4fkaS3cretD", "sasl.passwd");
}

}  // namespace
}  // namespace sluice::pipeline
