// The shipped alert rules (deploy/monitoring/sluice-alerts.yml) against a real Prometheus server
// (scripts/services/prometheus) scraping a real `sluice run`: a Kafka -> files pipeline runs with checkpoints, the
// server scrapes it and no alert of it is pending or firing; then a record that is not a change event fails the job
// (restart strategy none, no dead-letter sink): /health answers 503 naming job-not-running within 5 s, and the
// server fires SluiceJobNotRunning (status FAILED) and SluiceCheckpointTooOld while the process lingers; once the
// process is SIGKILLed, SluiceDown fires for its target. The rules are the shipped file with every `for:` set to 1s
// (the only change), so the test takes seconds instead of minutes. A second test checks that every expression of
// the Grafana dashboard (deploy/monitoring/sluice-dashboard.json) is valid PromQL for the server.
//
// Needs the services kafka and prometheus (scripts/services/run-with kafka prometheus -- ...).
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/core/value.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using sluice::Value;
using sluice::testing::poll_until;
using namespace std::chrono_literals;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file_atomically(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, p);
}

/// http://HOST:PORT -> an httplib client.
httplib::Client client_for(const std::string& url) {
  httplib::Client c(url);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(5, 0);
  return c;
}

/// A `sluice run FILE --linger 300s` child; SIGKILLed by the destructor when still running.
class SluiceChild {
 public:
  SluiceChild(const fs::path& file, const fs::path& log) : log_(log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::string binary = SLUICE_BINARY, run = "run", f = file.string(), linger = "--linger", d = "300s";
    char* argv[] = {binary.data(), run.data(), f.data(), linger.data(), d.data(), nullptr};
    const int rc = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) pid_ = -1;
  }
  ~SluiceChild() { kill_now(); }
  SluiceChild(const SluiceChild&) = delete;
  SluiceChild& operator=(const SluiceChild&) = delete;

  bool started() const { return pid_ > 0; }
  std::string log() const { return read_file(log_); }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
};

/// GET `path` from Prometheus' API as JSON; a null Value when the request fails or the answer is not "success".
Value prometheus_get(const std::string& url, const std::string& path, const httplib::Params& params = {}) {
  httplib::Client c = client_for(url);
  auto res = c.Get(path, params, httplib::Headers{});
  if (!res || res->status != 200) return Value();
  auto v = Value::from_json(res->body);
  if (!v.ok() || !v->is_object()) return Value();
  const Value* status = v->find("status");
  if (status == nullptr || !status->is_string() || status->as_string() != "success") return Value();
  return std::move(*v);
}

/// The value of an instant query's first sample, or nullopt when the query has no result.
std::optional<double> query_scalar(const std::string& url, const std::string& expr) {
  Value v = prometheus_get(url, "/api/v1/query", {{"query", expr}});
  if (v.is_null()) return std::nullopt;
  const Value* data = v.find("data");
  const Value* result = data ? data->find("result") : nullptr;
  if (result == nullptr || !result->is_array() || result->size() == 0) return std::nullopt;
  const Value* sample = result->at(0).find("value");
  if (sample == nullptr || !sample->is_array() || sample->size() != 2) return std::nullopt;
  return std::stod(std::string(sample->at(1).as_string()));
}

/// One alert of /api/v1/alerts.
struct Alert {
  std::string name, state, job, instance, status;
  std::string to_string() const {
    return fmt::format("{}[{}] job={} instance={} status={}", name, state, job, instance, status);
  }
};

std::string label(const Value& labels, std::string_view key) {
  const Value* v = labels.find(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : std::string();
}

/// The server's alerts (pending and firing) whose job or instance label is one of ours.
std::vector<Alert> alerts_of(const std::string& url, const std::string& job, const std::string& instance) {
  std::vector<Alert> out;
  Value v = prometheus_get(url, "/api/v1/alerts");
  const Value* data = v.is_null() ? nullptr : v.find("data");
  const Value* alerts = data ? data->find("alerts") : nullptr;
  if (alerts == nullptr || !alerts->is_array()) return out;
  for (size_t i = 0; i < alerts->size(); ++i) {
    const Value& a = alerts->at(i);
    const Value* labels = a.find("labels");
    const Value* state = a.find("state");
    if (labels == nullptr || state == nullptr) continue;
    Alert al{label(*labels, "alertname"), std::string(state->as_string()), label(*labels, "job"),
             label(*labels, "instance"), label(*labels, "status")};
    if (al.job == job || al.instance == instance) out.push_back(std::move(al));
  }
  return out;
}

std::string describe(const std::vector<Alert>& alerts) {
  std::string s;
  for (const auto& a : alerts)
    s += (s.empty() ? "" : ", ") + a.to_string();
  return s.empty() ? "(none)" : s;
}

bool firing(const std::vector<Alert>& alerts, const std::string& name) {
  for (const auto& a : alerts) {
    if (a.name == name && a.state == "firing") return true;
  }
  return false;
}

/// The shipped rules with every `for:` shortened to 1s and the group renamed (unique on the shared server).
std::string test_rules(const std::string& group) {
  std::string rules = read_file(fs::path(SLUICE_SOURCE_DIR) / "deploy/monitoring/sluice-alerts.yml");
  rules = std::regex_replace(rules, std::regex(R"(\bfor: \S+)"), "for: 1s");
  rules = std::regex_replace(rules, std::regex(R"(- name: sluice\n)"), "- name: " + group + "\n");
  return rules;
}

bool reload(const std::string& url) {
  httplib::Client c = client_for(url);
  auto res = c.Post("/-/reload");
  return res && res->status == 200;
}

class PrometheusAlertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto prom = sluice::testing::require_service("prometheus");
    url_ = prom.get("PROMETHEUS_URL");
    targets_ = prom.get("PROMETHEUS_TARGETS_DIR");
    rules_ = prom.get("PROMETHEUS_RULES_DIR");
    unique_ = fmt::format("alerts_{}_{}", ::getpid(),
                          std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1));
    dir_ = fs::temp_directory_path() / unique_;
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove(target_file(), ec);
    if (fs::remove(rules_file(), ec)) reload(url_);
    if (!HasFailure()) {
      fs::remove_all(dir_, ec);
    } else {
      std::printf("kept the test directory %s\n", dir_.c_str());
    }
  }
  fs::path target_file() const { return fs::path(targets_) / (unique_ + ".json"); }
  fs::path rules_file() const { return fs::path(rules_) / (unique_ + ".yml"); }

  std::string url_, targets_, rules_, unique_;
  fs::path dir_;
};

TEST_F(PrometheusAlertsTest, AFailedJobFiresJobNotRunningAndCheckpointAgeThenSluiceDownWhenTheProcessDies) {
  const std::string bootstrap = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  const std::string topic = tk::unique_topic("alerts");
  ASSERT_TRUE(tk::create_topic(bootstrap, topic, 1));
  const std::string job = "alerts-" + unique_.substr(7);
  const fs::path file = dir_ / "pipeline.yaml";
  std::ofstream(file) << fmt::format(R"(pipeline:
  name: {0}
  checkpoint: {{ interval: 200ms, storage: "{1}/checkpoints" }}
  delivery: at-least-once
  restart: {{ strategy: none }}
  health: {{ max-checkpoint-age: 2s }}
  http: {{ port: 0 }}
source:
  type: kafka
  bootstrap-servers: "{2}"
  topics: [{3}]
  start: earliest
sink:
  out: {{ type: files, path: "{1}/out" }}
)",
                                     job, dir_.string(), bootstrap, topic);
  SluiceChild sluice(file, dir_ / "sluice.log");
  ASSERT_TRUE(sluice.started());
  std::smatch m;
  std::string log;
  const std::regex endpoint(R"(/metrics and /health at http://([0-9.]+):([0-9]+))");
  ASSERT_TRUE(poll_until([&] { return std::regex_search(log = sluice.log(), m, endpoint); }, 60s)) << log;
  const std::string instance = m[1].str() + ":" + m[2].str();
  httplib::Client health = client_for("http://" + instance);

  // The shipped rules (short `for:`), then the target: Prometheus reads the rules on reload and the target file
  // within a second (file_sd).
  write_file_atomically(rules_file(), test_rules("sluice-" + unique_));
  ASSERT_TRUE(reload(url_)) << "POST " << url_ << "/-/reload failed";
  write_file_atomically(target_file(), fmt::format(R"([{{"targets": ["{}"]}}])", instance));

  // Scraped while RUNNING with checkpoints completing: nothing of this job is pending or firing.
  const std::string sel = fmt::format(R"(job="{}")", job);
  ASSERT_TRUE(poll_until(
      [&] {
        return query_scalar(url_, fmt::format(R"(sluice_job_running{{{},status="RUNNING"}})", sel)) == 1.0 &&
               query_scalar(url_, fmt::format("sluice_checkpoints_completed{{{}}}", sel)).value_or(0) >= 2 &&
               query_scalar(url_, fmt::format("sluice_health_checkpoint_age_bound_ms{{{}}}", sel)) == 2000.0;
      },
      90s, 200ms))
      << "Prometheus never scraped the running job with completed checkpoints; alerts: "
      << describe(alerts_of(url_, job, instance)) << "\n"
      << sluice.log();
  // At least two evaluations of the rules over the scraped series (every second).
  const auto evaluated = std::chrono::steady_clock::now() + 2500ms;
  poll_until([&] { return std::chrono::steady_clock::now() >= evaluated; }, 5s, 100ms);
  EXPECT_EQ(describe(alerts_of(url_, job, instance)), "(none)") << "alerts of a healthy job";
  auto res = health.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;

  // A record that is not a change event: no dead-letter sink, so the job fails; restart strategy none: FAILED.
  {
    tk::Client producer = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}});
    ASSERT_TRUE(producer);
    const std::string value = "this is not a change event";
    ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_EQ(rd_kafka_flush(producer.get(), 30'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  const auto produced = std::chrono::steady_clock::now();

  // /health: 503 naming the reason, within 5 s of the failure (measured from the produce, which comes before it).
  std::string body;
  ASSERT_TRUE(poll_until(
      [&] {
        auto r = health.Get("/health");
        if (!r || r->status != 503) return false;
        body = r->body;
        return true;
      },
      30s, 50ms))
      << sluice.log();
  const auto unhealthy_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - produced).count();
  std::printf("/health answered 503 %lld ms after the bad record was produced: %s\n",
              static_cast<long long>(unhealthy_ms), body.c_str());
  EXPECT_LT(unhealthy_ms, 5000);
  EXPECT_NE(body.find("bad record"), std::string::npos) << body;
  // The first 503 may be FAILING (the failure is being handled: tasks cancelling); FAILED follows.
  EXPECT_TRUE(poll_until(
      [&] {
        auto r = health.Get("/health");
        if (!r || r->status != 503) return false;
        body = r->body;
        return body.find("the job is FAILED") != std::string::npos;
      },
      10s, 50ms))
      << body;
  EXPECT_NE(body.find(R"("code":"job-not-running")"), std::string::npos) << body;

  // The server fires the job-down and checkpoint-age alerts of the failed, lingering job.
  std::vector<Alert> alerts;
  ASSERT_TRUE(poll_until(
      [&] {
        alerts = alerts_of(url_, job, instance);
        return firing(alerts, "SluiceJobNotRunning") && firing(alerts, "SluiceCheckpointTooOld");
      },
      60s, 200ms))
      << "alerts: " << describe(alerts) << "\n"
      << sluice.log();
  const auto fired_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - produced).count();
  std::printf("SluiceJobNotRunning and SluiceCheckpointTooOld firing %lld ms after the bad record: %s\n",
              static_cast<long long>(fired_ms), describe(alerts).c_str());
  for (const auto& a : alerts) {
    if (a.name == "SluiceJobNotRunning") {
      EXPECT_EQ(a.status, "FAILED") << a.to_string();
    }
  }

  // The process dies: the scrape fails and SluiceDown fires for its target.
  sluice.kill_now();
  ASSERT_TRUE(poll_until(
      [&] {
        alerts = alerts_of(url_, job, instance);
        return firing(alerts, "SluiceDown");
      },
      60s, 200ms))
      << "alerts: " << describe(alerts);
}

// Every expression of the Grafana dashboard parses and evaluates on the server ($job as ".*").
TEST_F(PrometheusAlertsTest, EveryDashboardExpressionIsValidPromQL) {
  auto dashboard = Value::from_json(read_file(fs::path(SLUICE_SOURCE_DIR) / "deploy/monitoring/sluice-dashboard.json"));
  ASSERT_TRUE(dashboard.ok()) << dashboard.error().to_string();
  std::vector<std::string> exprs;
  const Value* panels = dashboard->find("panels");
  ASSERT_NE(panels, nullptr);
  for (size_t i = 0; i < panels->size(); ++i) {
    const Value* targets = panels->at(i).find("targets");
    ASSERT_NE(targets, nullptr);
    for (size_t j = 0; j < targets->size(); ++j)
      exprs.emplace_back(targets->at(j).find("expr")->as_string());
  }
  const Value* annotations = dashboard->find("annotations")->find("list");
  for (size_t i = 0; i < annotations->size(); ++i)
    exprs.emplace_back(annotations->at(i).find("expr")->as_string());
  ASSERT_GE(exprs.size(), 15u);
  for (std::string e : exprs) {
    e = std::regex_replace(e, std::regex(R"(\$job)"), ".*");
    httplib::Client c = client_for(url_);
    auto res = c.Get("/api/v1/query", httplib::Params{{"query", e}}, httplib::Headers{});
    ASSERT_TRUE(res) << e;
    EXPECT_EQ(res->status, 200) << e << ": " << res->body;
  }
}

}  // namespace
