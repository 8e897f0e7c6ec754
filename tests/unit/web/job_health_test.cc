// evaluate_job_health() (web/job_health.h), the verdict of /health, over a scripted JobClient: each reason named
// with its code and message, several at once, the bounds and their defaults, and the JSON shape.
#include "sluice/web/job_health.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "sluice/web/rest_server.h"

namespace sluice {
namespace {

/// A JobClient whose status, checkpoint history, restarts and failures the test sets.
class ScriptedJob : public JobClient::Impl {
 public:
  std::string id = "job";
  JobStatus st = JobStatus::kRunning;
  std::vector<CheckpointStats> history;
  int restart_count = 0;
  std::vector<JobExceptionInfo> failures;

  const std::string& job_id() const override { return id; }
  JobStatus status() const override { return st; }
  void cancel() override {}
  JobResult wait() override { return {}; }
  bool wait_for(std::chrono::milliseconds) override { return true; }
  std::future<Result<std::string>> trigger_savepoint(std::string, bool) override { return {}; }
  std::vector<CheckpointStats> checkpoint_stats() const override { return history; }
  int restarts() const override { return restart_count; }
  std::vector<JobExceptionInfo> exceptions() const override { return failures; }
};

CheckpointStats checkpoint(int64_t id, int64_t end_ms, bool completed, std::string type = "checkpoint") {
  CheckpointStats s;
  s.checkpoint_id = id;
  s.type = std::move(type);
  s.trigger_time_ms = end_ms - 10;
  s.duration_ms = 10;
  s.completed = completed;
  if (!completed) s.failure = "checkpoint " + std::to_string(id) + " expired before completing";
  return s;
}

std::vector<std::string> codes(const HealthReport& h) {
  std::vector<std::string> out;
  for (const auto& r : h.reasons)
    out.push_back(r.code);
  return out;
}

constexpr int64_t kStart = 1'000'000;

class JobHealthTest : public ::testing::Test {
 protected:
  std::shared_ptr<ScriptedJob> impl_ = std::make_shared<ScriptedJob>();
  JobClient job_{impl_};
  JobHealthOptions options_ = [] {
    JobHealthOptions o;
    o.checkpoint_interval_ms = 1000;  // default bound: 13 s
    return o;
  }();
};

TEST_F(JobHealthTest, RunningWithRecentCheckpointsIsHealthy) {
  impl_->history = {checkpoint(1, kStart + 1000, true), checkpoint(2, kStart + 2000, true)};
  const HealthReport h = evaluate_job_health(job_, options_, kStart, {{"kafka", 0}}, kStart + 3000);
  EXPECT_TRUE(h.healthy) << h.to_json();
  EXPECT_TRUE(h.reasons.empty());
  EXPECT_EQ(h.reason, "");
  EXPECT_EQ(h.checkpoint_age_ms, 1000);
  EXPECT_EQ(h.source_lag_ms, 0);
  EXPECT_EQ(h.status, "RUNNING");
}

TEST_F(JobHealthTest, FailedJobIsNotRunningWithItsCauseAndItsCheckpointAge) {
  impl_->st = JobStatus::kFailed;
  impl_->history = {checkpoint(1, kStart + 1000, true)};
  impl_->failures = {JobExceptionInfo{"connector", "bad record at offset 7", "", kStart + 1500, "", false}};
  const HealthReport h = evaluate_job_health(job_, options_, kStart, {}, kStart + 20'000);
  EXPECT_FALSE(h.healthy);
  EXPECT_EQ(codes(h), (std::vector<std::string>{"job-not-running", "checkpoint-age"})) << h.to_json();
  EXPECT_EQ(h.reasons[0].message, "the job is FAILED (restart 0) after a failure 18500 ms ago: bad record at offset 7");
  EXPECT_EQ(h.reasons[1].message,
            "the last completed checkpoint is 19000 ms old (bound 13000 ms, health.max-checkpoint-age)");
  EXPECT_EQ(h.reason, h.reasons[0].message + "; " + h.reasons[1].message);
}

TEST_F(JobHealthTest, RestartingNamesTheRestartAndTheFailure) {
  impl_->st = JobStatus::kRestarting;
  impl_->restart_count = 3;
  impl_->failures = {JobExceptionInfo{"connector", "database unreachable", "", kStart + 800, "", true}};
  const HealthReport h = evaluate_job_health(job_, options_, kStart, {}, kStart + 2000);
  EXPECT_EQ(codes(h), std::vector<std::string>{"job-not-running"});
  EXPECT_EQ(h.reason, "the job is RESTARTING (restart 3) after a failure 1200 ms ago: database unreachable");
}

TEST_F(JobHealthTest, CanceledAndCreatedAreNotRunning) {
  impl_->st = JobStatus::kCanceled;
  EXPECT_EQ(evaluate_job_health(job_, options_, kStart, {}, kStart + 10).reason, "the job is CANCELED");
  impl_->st = JobStatus::kCreated;
  EXPECT_EQ(evaluate_job_health(job_, options_, kStart, {}, kStart + 10).reason, "the job is CREATED");
}

// A cluster job waiting for slots says what it waits for (it said only "the job is CREATED", found by a fresh-user
// trial; GET /jobs had it in status-message).
TEST_F(JobHealthTest, AJobThatIsNotRunningNamesWhatItWaitsFor) {
  impl_->st = JobStatus::kCreated;
  const std::string waiting = "waiting for TaskManagers: needs 4 slots, 2 registered (on 1 TaskManager(s))";
  EXPECT_EQ(evaluate_job_health(job_, options_, kStart, {}, kStart + 10, waiting).reason,
            "the job is CREATED; " + waiting);
  impl_->st = JobStatus::kRestarting;
  impl_->failures = {JobExceptionInfo{"runtime", "TaskManager tm-1 lost", "", kStart + 5, "", true}};
  EXPECT_EQ(evaluate_job_health(job_, options_, kStart, {}, kStart + 10, waiting).reason,
            "the job is RESTARTING (restart 0) after a failure 5 ms ago: TaskManager tm-1 lost; " + waiting);
}

TEST_F(JobHealthTest, RunningAgainWithinTheRestartGraceIsARecentFailure) {
  impl_->restart_count = 1;
  impl_->failures = {JobExceptionInfo{"runtime", "boom", "", kStart + 1000, "", true}};
  HealthReport h = evaluate_job_health(job_, options_, kStart, {}, kStart + 5000);
  EXPECT_EQ(codes(h), std::vector<std::string>{"recent-failure"});
  EXPECT_NE(h.reason.find("counts as healthy only after 60000 ms without a failure (health.restart-grace)"),
            std::string::npos);
  impl_->history = {checkpoint(1, kStart + 60'500, true)};
  h = evaluate_job_health(job_, options_, kStart, {}, kStart + 61'001);
  EXPECT_TRUE(h.healthy) << h.to_json();
}

TEST_F(JobHealthTest, CheckpointAgeCountsFromTheStartUntilTheFirstAndHonoursTheConfiguredBound) {
  // Default bound 3 x 1 s + 10 s.
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {}, kStart + 13'000).healthy);
  EXPECT_EQ(codes(evaluate_job_health(job_, options_, kStart, {}, kStart + 13'001)),
            std::vector<std::string>{"checkpoint-age"});
  options_.max_checkpoint_age_ms = 2000;
  EXPECT_EQ(options_.checkpoint_age_bound_ms(), 2000);
  EXPECT_EQ(codes(evaluate_job_health(job_, options_, kStart, {}, kStart + 2001)),
            std::vector<std::string>{"checkpoint-age"});
  // A job that does not checkpoint has no bound.
  options_.checkpoint_interval_ms = 0;
  EXPECT_EQ(options_.checkpoint_age_bound_ms(), 0);
  const HealthReport h = evaluate_job_health(job_, options_, kStart, {}, kStart + 3'600'000);
  EXPECT_TRUE(h.healthy);
  EXPECT_EQ(h.checkpoint_age_ms, -1);
}

TEST_F(JobHealthTest, ConsecutiveFailedCheckpointsCountBackToTheLastCompletedOneSavepointsAside) {
  impl_->history = {checkpoint(1, kStart + 100, false), checkpoint(2, kStart + 200, true),
                    checkpoint(3, kStart + 300, false), checkpoint(4, kStart + 400, false, "savepoint"),
                    checkpoint(5, kStart + 500, false)};
  EXPECT_EQ(failed_checkpoints_in_a_row(impl_->history), 2);
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {}, kStart + 600).healthy);  // bound 3 by default
  impl_->history.push_back(checkpoint(6, kStart + 600, false));
  HealthReport h = evaluate_job_health(job_, options_, kStart, {}, kStart + 700);
  EXPECT_EQ(codes(h), std::vector<std::string>{"failed-checkpoints"}) << h.to_json();
  EXPECT_EQ(h.failed_checkpoints_in_a_row, 3);
  EXPECT_EQ(h.reason,
            "the last 3 checkpoints failed (bound 3, health.max-failed-checkpoints); the latest: checkpoint 6 expired "
            "before completing");
  // A completed one ends the run; 0 turns the check off.
  impl_->history.push_back(checkpoint(7, kStart + 700, true));
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {}, kStart + 800).healthy);
  impl_->history.pop_back();
  options_.max_failed_checkpoints = 0;
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {}, kStart + 800).healthy);
}

TEST_F(JobHealthTest, SourceLagOverTheBoundNamesTheSource) {
  options_.max_source_lag_ms = 5000;
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {{"postgres", 5000}}, kStart + 10).healthy);
  const HealthReport h = evaluate_job_health(job_, options_, kStart, {{"postgres", 5001}}, kStart + 10);
  EXPECT_EQ(codes(h), std::vector<std::string>{"source-lag"});
  EXPECT_EQ(h.reason, "the postgres source lags 5001 ms behind (bound 5000 ms, health.max-source-lag)");
  // What it reads, when known (the JobManager's sources come with it from the TaskManagers' heartbeats).
  EXPECT_EQ(evaluate_job_health(job_, options_, kStart, {{"kafka", 61'234, "orders"}}, kStart + 10).reason,
            "the kafka source 'orders' lags 61234 ms behind (bound 5000 ms, health.max-source-lag)");
  // Unknown lag (-1) is never unhealthy; no bound: no check.
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {{"kafka", -1}}, kStart + 10).healthy);
  options_.max_source_lag_ms = 0;
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {{"postgres", 999'999}}, kStart + 10).healthy);
}

TEST_F(JobHealthTest, ADisconnectedSourceSubtaskIsNamedWithItsReasonAndNoSecret) {
  SourceHealth s;
  s.name = "kafka";
  s.description = "orders";
  s.lag_ms = 0;
  EXPECT_TRUE(evaluate_job_health(job_, options_, kStart, {s}, kStart + 10).healthy);
  s.disconnected.push_back({1, 3240, "no broker of '127.0.0.1:9092' answers: all brokers down (1/1 brokers are down)"});
  HealthReport h = evaluate_job_health(job_, options_, kStart, {s}, kStart + 10);
  EXPECT_FALSE(h.healthy);
  EXPECT_EQ(codes(h), std::vector<std::string>{"source-disconnected"});
  EXPECT_EQ(h.reason,
            "source 'orders' (kafka) disconnected for 3.2 s (subtask 1): no broker of '127.0.0.1:9092' answers: all "
            "brokers down (1/1 brokers are down)");
  // Without a description the connector names it; a password in a connector's reason never reaches /health.
  s.description.clear();
  s.disconnected[0].reason = "cannot connect: postgresql://cdc:hunter2@db/payments refused";
  h = evaluate_job_health(job_, options_, kStart, {s}, kStart + 10);
  EXPECT_NE(h.reason.find("source 'kafka' (kafka) disconnected for 3.2 s (subtask 1): cannot connect"),
            std::string::npos)
      << h.reason;
  EXPECT_EQ(h.reason.find("hunter2"), std::string::npos) << h.reason;
  // Cluster mode: the TaskManager that runs the reader is named too.
  s.description = "orders";
  s.disconnected[0] = {0, 4100, "no broker answered", "127.0.0.1:40913-3fa2c1"};
  h = evaluate_job_health(job_, options_, kStart, {s}, kStart + 10);
  EXPECT_EQ(h.reason,
            "source 'orders' (kafka) disconnected for 4.1 s (subtask 0 on TaskManager 127.0.0.1:40913-3fa2c1): no "
            "broker answered");
}

TEST_F(JobHealthTest, JsonNamesEveryReason) {
  impl_->st = JobStatus::kFailed;
  const std::string json = evaluate_job_health(job_, options_, kStart, {}, kStart + 20'000).to_json();
  EXPECT_NE(json.find(R"("healthy":false)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("reasons":[{"code":"job-not-running","message":"the job is FAILED"},)"
                      R"({"code":"checkpoint-age",)"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("failed_checkpoints_in_a_row":0)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("last_failure":null)"), std::string::npos) << json;
}

// A REST server without a health provider (the examples, a user's job through RestServer::execute) evaluates every
// registered job: 503 naming the unhealthy job and its reasons; a FINISHED job counts as healthy.
TEST(RestServerHealthTest, EveryRegisteredJobIsEvaluatedAndTheUnhealthyOneIsNamed) {
  auto server = RestServer::start(RestServerOptions{});
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  httplib::Client http("127.0.0.1", (*server)->port());
  auto running = std::make_shared<ScriptedJob>();
  running->id = "aaaa";
  (*server)->register_job("steady", JobClient(running));
  auto finished = std::make_shared<ScriptedJob>();
  finished->id = "bbbb";
  finished->st = JobStatus::kFinished;
  (*server)->register_job("bounded", JobClient(finished));
  auto res = http.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;

  auto failing = std::make_shared<ScriptedJob>();
  failing->id = "cccc";
  failing->history = {checkpoint(1, 100, false), checkpoint(2, 200, false), checkpoint(3, 300, false)};
  (*server)->register_job("flaky", JobClient(failing));
  res = http.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_NE(res->body.find(R"("reason":"job 'flaky' (cccc): the last 3 checkpoints failed (bound 3, )"
                           R"(health.max-failed-checkpoints); the latest: checkpoint 3 expired before completing")"),
            std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find(R"("code":"failed-checkpoints")"), std::string::npos) << res->body;

  running->st = JobStatus::kRestarting;
  failing->history.push_back(checkpoint(4, 400, true));
  res = http.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_NE(res->body.find(R"("reason":"job 'steady' (aaaa): the job is RESTARTING")"), std::string::npos) << res->body;
}

}  // namespace
}  // namespace sluice
