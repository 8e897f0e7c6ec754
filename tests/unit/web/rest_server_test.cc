// The REST API against real jobs on the local mini-cluster: listing, job details, checkpoint statistics,
// savepoints (polled until COMPLETED), stop-with-savepoint, cancel, and the error answers (404, 400, 409).
#include "sluice/web/rest_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/value.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using Sum = std::pair<int64_t, int64_t>;

/// A fresh directory under the system temp dir, removed with its contents when the test ends (also when an
/// assertion returns early).
struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("sluice-rest-test-" + name + "-" + std::to_string(::getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path path;
};

/// An endless, rate-limited job: numbers -> (n % 10, 1) -> key_by -> sum -> collect.
struct RunningJob {
  std::shared_ptr<testing::CollectedRecords<Sum>> out = std::make_shared<testing::CollectedRecords<Sum>>();
  std::optional<JobClient> client;
  std::vector<OperatorStats> operators;
  JobPlan plan;

  void start(Configuration config) {
    StreamEnvironment env(std::move(config));
    env.from_source(datagen::sequence(0, DataGeneratorSource<int64_t>::kUnbounded - 1, 2'000), "numbers")
        .uid("numbers")
        .map([](const int64_t& n) {
          return Sum{n % 10, 1};
        })
        .key_by([](const Sum& s) { return s.first; })
        .sum<1>()
        .uid("sums")
        .sink_to(std::make_shared<testing::CollectSink<Sum>>(out), "Collect")
        .uid("collect");
    operators = operators_of(env.stream_graph());
    plan = job_plan_of(env.stream_graph());
    client = env.execute_async("running sums");
  }
  ~RunningJob() {
    if (client) {
      client->cancel();
      client->wait();
    }
  }
};

Configuration checkpointing(const fs::path& dir) {
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set_string(std::string(options::kCheckpointInterval.key), "50ms");
  c.set(options::kCheckpointDir, dir.string());
  return c;
}

/// A started server, or a failed test.
std::unique_ptr<RestServer> start_server() {
  auto server = RestServer::start(RestServerOptions{});
  EXPECT_TRUE(server.ok()) << server.error().to_string();
  return server.ok() ? std::move(*server) : nullptr;
}

struct Answer {
  int status = 0;
  Value body;
};

/// Sends one request (GET, POST or PATCH); the body of the answer is parsed as JSON (every answer of the API is JSON).
Answer call(httplib::Client& http, const std::string& method, const std::string& path, const std::string& body = "") {
  httplib::Result r = method == "GET"    ? http.Get(path)
                      : method == "POST" ? http.Post(path, body, "application/json")
                                         : http.Patch(path, body, "application/json");
  if (!r) {
    ADD_FAILURE() << method << " " << path << ": " << httplib::to_string(r.error());
    return {};
  }
  auto v = Value::from_json(r->body);
  EXPECT_TRUE(v.ok()) << method << " " << path << " answered non-JSON: " << r->body;
  return {r->status, v.ok() ? std::move(*v) : Value()};
}

/// Sends `request` as it is over a new connection and returns everything the server answers until it closes
/// the connection (the request should say "Connection: close").
std::string raw_request(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval timeout{30, 0};  // a hung server fails the test instead of blocking it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0)
      answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}

std::string str(const Value& v, std::string_view path) {
  const Value* f = v.at_path(path);
  return f != nullptr && f->is_string() ? std::string(f->as_string()) : std::string();
}

/// Polls a savepoint operation until its status is COMPLETED; returns the final answer.
Value await_operation(httplib::Client& http, const std::string& job_id, const std::string& request_id) {
  Value last;
  EXPECT_TRUE(testing::wait_until([&] {
    last = call(http, "GET", "/jobs/" + job_id + "/savepoints/" + request_id).body;
    return str(last, "status.id") == "COMPLETED";
  })) << last.to_json();
  return last;
}

TEST(RestServerTest, ListsJobsTakesASavepointAndStopsWithOne) {
  const TempDir tmp("savepoint");
  const fs::path& root = tmp.path;
  RunningJob job;
  job.start(checkpointing(root / "checkpoints"));
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  server->register_job("running sums", *job.client, job.operators);
  const std::string id = job.client->job_id();
  httplib::Client http(server->address(), server->port());

  Answer jobs = call(http, "GET", "/jobs");
  ASSERT_EQ(jobs.status, 200);
  ASSERT_EQ(jobs.body.find("jobs")->size(), 1u);
  EXPECT_EQ(str(jobs.body, "jobs[0].id"), id);
  EXPECT_EQ(str(jobs.body, "jobs[0].name"), "running sums");
  EXPECT_EQ(str(jobs.body, "jobs[0].status"), "RUNNING");

  Answer details = call(http, "GET", "/jobs/" + id);
  ASSERT_EQ(details.status, 200);
  EXPECT_EQ(str(details.body, "state"), "RUNNING");
  EXPECT_EQ(details.body.at_path("restarts")->as_int64(), 0);
  // Job vertices (chains): the source and the keyed sum with its sink, registered without the graph's plan.
  ASSERT_TRUE(testing::wait_until([&] { return call(http, "GET", "/jobs/" + id).body.find("vertices")->size() == 2; }));
  details = call(http, "GET", "/jobs/" + id);
  EXPECT_EQ(str(details.body, "vertices[0].operators[0].uid"), "numbers");
  EXPECT_EQ(details.body.at_path("vertices[0].parallelism")->as_int64(), 2);

  // Periodic checkpoints show up in the statistics.
  ASSERT_TRUE(testing::wait_until([&] { return !job.client->checkpoint_stats().empty(); }));
  Answer checkpoints = call(http, "GET", "/jobs/" + id + "/checkpoints");
  ASSERT_EQ(checkpoints.status, 200);
  EXPECT_GE(checkpoints.body.at_path("counts.completed")->as_int64(), 1);
  EXPECT_EQ(str(checkpoints.body, "history[0].checkpoint_type"), "CHECKPOINT");
  EXPECT_TRUE(fs::exists(str(checkpoints.body, "latest.completed.external_path")));
  EXPECT_GT(checkpoints.body.at_path("latest.completed.tasks")->size(), 0u);

  // A savepoint while the job keeps running.
  Answer trigger =
      call(http, "POST", "/jobs/" + id + "/savepoints",
           Value::object({{"target-directory", (root / "savepoints").string()}, {"cancel-job", false}}).to_json());
  ASSERT_EQ(trigger.status, 202) << trigger.body.to_json();
  Value done = await_operation(http, id, str(trigger.body, "request-id"));
  const std::string savepoint = str(done, "operation.location");
  ASSERT_FALSE(savepoint.empty()) << done.to_json();
  EXPECT_TRUE(fs::exists(fs::path(savepoint) / "_metadata"));
  EXPECT_EQ(fs::path(savepoint).parent_path(), root / "savepoints");
  EXPECT_EQ(job.client->status(), JobStatus::kRunning);
  Answer after = call(http, "GET", "/jobs/" + id + "/checkpoints");
  EXPECT_EQ(str(after.body, "latest.savepoint.external_path"), savepoint);
  EXPECT_EQ(str(after.body, "latest.savepoint.checkpoint_type"), "SAVEPOINT");

  // Stop with a savepoint: the job ends FINISHED.
  Answer stop = call(http, "POST", "/jobs/" + id + "/stop",
                     Value::object({{"targetDirectory", (root / "final").string()}, {"drain", false}}).to_json());
  ASSERT_EQ(stop.status, 202) << stop.body.to_json();
  Value stopped = await_operation(http, id, str(stop.body, "request-id"));
  const std::string final_savepoint = str(stopped, "operation.location");
  ASSERT_FALSE(final_savepoint.empty()) << stopped.to_json();
  EXPECT_TRUE(fs::exists(fs::path(final_savepoint) / "_metadata"));
  JobResult r = job.client->wait();
  EXPECT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  EXPECT_TRUE(server->wait_for_fetched_operations(std::chrono::seconds(0)));

  Answer ended = call(http, "GET", "/jobs/" + id);
  EXPECT_EQ(str(ended.body, "state"), "FINISHED");
  EXPECT_GT(ended.body.at_path("vertices[0].metrics.write-records")->as_int64(), 0);
  // Actions on a job that has ended are refused.
  EXPECT_EQ(call(http, "POST", "/jobs/" + id + "/savepoints", "{}").status, 409);
  EXPECT_EQ(call(http, "POST", "/jobs/" + id + "/stop", "{}").status, 409);
  server->stop();
}

// A job in a restart loop is RESTARTING in the job list and details, with its restart count and latest
// failure, and GET /jobs/:id/exceptions lists its failures in Flink's shape, within 5 s of the failure.
TEST(RestServerTest, ARestartingJobShowsItsFailuresAndExceptionHistory) {
  Configuration c;
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 1000);
  c.set(options::kFixedDelayDelay, int64_t{60'000});  // stays RESTARTING for the test
  StreamEnvironment env(c);
  env.set_parallelism(1);
  env.from_source(datagen::sequence(0, 100), "numbers")
      .map([](const int64_t&) -> int64_t { throw std::runtime_error("broker unreachable"); })
      .name("Produce")
      .sink_to(std::make_shared<testing::CollectSink<int64_t>>(std::make_shared<testing::CollectedRecords<int64_t>>()));
  std::vector<OperatorStats> operators = operators_of(env.stream_graph());
  JobClient client = env.execute_async("failing");
  const auto started = std::chrono::steady_clock::now();
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  server->register_job("failing", client, operators);
  httplib::Client http(server->address(), server->port());
  const std::string id = client.job_id();

  Answer jobs;
  Answer details;
  Answer exceptions;
  ASSERT_TRUE(testing::wait_until(
      [&] {
        jobs = call(http, "GET", "/jobs");
        details = call(http, "GET", "/jobs/" + id);
        exceptions = call(http, "GET", "/jobs/" + id + "/exceptions");
        const Value* entries = exceptions.body.at_path("exceptionHistory.entries");
        return str(jobs.body, "jobs[0].status") == "RESTARTING" && str(details.body, "state") == "RESTARTING" &&
               entries != nullptr && entries->size() == 1;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::seconds(5) -
                                                            (std::chrono::steady_clock::now() - started))))
      << jobs.body.to_json() << "\n"
      << details.body.to_json() << "\n"
      << exceptions.body.to_json();
  EXPECT_EQ(jobs.body.at_path("jobs[0].restarts")->as_int64(), 1);
  EXPECT_NE(str(jobs.body, "jobs[0].last-failure.message").find("broker unreachable"), std::string::npos);
  EXPECT_EQ(details.body.at_path("restarts")->as_int64(), 1);
  EXPECT_NE(str(details.body, "last-failure.message").find("broker unreachable"), std::string::npos);
  EXPECT_GT(details.body.at_path("last-failure.timestamp")->as_int64(), 0);

  ASSERT_EQ(exceptions.status, 200);
  EXPECT_NE(str(exceptions.body, "root-exception").find("broker unreachable"), std::string::npos);
  EXPECT_EQ(exceptions.body.at_path("timestamp")->as_int64(),
            exceptions.body.at_path("exceptionHistory.entries[0].timestamp")->as_int64());
  EXPECT_EQ(str(exceptions.body, "exceptionHistory.entries[0].exceptionName"), "runtime");
  EXPECT_NE(str(exceptions.body, "exceptionHistory.entries[0].stacktrace").find("operator 'Produce'"),
            std::string::npos);
  EXPECT_NE(str(exceptions.body, "exceptionHistory.entries[0].taskName").find("Produce"), std::string::npos);
  EXPECT_TRUE(exceptions.body.at_path("exceptionHistory.entries[0].restarted")->as_bool());
  EXPECT_FALSE(str(exceptions.body, "exceptionHistory.entries[0].endpoint").empty());  // where the task ran
  EXPECT_TRUE(exceptions.body.at_path("exceptionHistory.entries[0].failureLabels")->is_object());
  EXPECT_FALSE(exceptions.body.at_path("exceptionHistory.truncated")->as_bool());

  Answer unknown = call(http, "GET", "/jobs/ffffffffffffffffffffffffffffffff/exceptions");
  EXPECT_EQ(unknown.status, 404);
  client.cancel();
  EXPECT_EQ(client.wait().status, JobStatus::kCanceled);
}

// The job graph the web UI draws: Flink's JobPlanInfo in GET /jobs/:id, one node per job vertex (a chain) with
// its input edges; an empty node list for a job registered without a plan.
TEST(RestServerTest, JobDetailsCarryThePlanOfJobVerticesAndEdges) {
  Configuration c;
  c.set(options::kParallelism, 2);
  RunningJob job;
  job.start(c);
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  server->register_job("running sums", *job.client, job.operators);
  const std::string id = job.client->job_id();
  httplib::Client http(server->address(), server->port());
  // Registered without its graph: the vertices its subtasks report, without edges.
  ASSERT_TRUE(
      testing::wait_until([&] { return call(http, "GET", "/jobs/" + id).body.at_path("plan.nodes")->size() == 2; }));
  EXPECT_EQ(call(http, "GET", "/jobs/" + id).body.at_path("plan.nodes[1].inputs"), nullptr);

  server->set_plan(id, job.plan);
  Answer details = call(http, "GET", "/jobs/" + id);
  ASSERT_EQ(details.status, 200);
  EXPECT_EQ(str(details.body, "plan.jid"), id);
  ASSERT_EQ(details.body.at_path("plan.nodes")->size(), 2u) << details.body.to_json();
  // numbers -> map chain (forward, same parallelism); key_by breaks the chain before sum -> Collect.
  // Ids are Flink's shape (32 hex digits), the same as the vertices' and those learnt from the subtasks.
  const std::string source_id = str(details.body, "plan.nodes[0].id");
  EXPECT_EQ(source_id.size(), 32u);
  EXPECT_EQ(str(details.body, "vertices[0].id"), source_id);
  EXPECT_EQ(str(details.body, "plan.nodes[0].description"), "Source: numbers -> Map");
  EXPECT_EQ(details.body.at_path("plan.nodes[0].inputs"), nullptr);  // a source has none, as in Flink
  EXPECT_EQ(str(details.body, "plan.nodes[0].operator_uids[0]"), "numbers");
  EXPECT_EQ(str(details.body, "plan.nodes[1].id").size(), 32u);
  EXPECT_EQ(details.body.at_path("plan.nodes[1].parallelism")->as_int64(), 2);
  ASSERT_EQ(details.body.at_path("plan.nodes[1].inputs")->size(), 1u);
  EXPECT_EQ(str(details.body, "plan.nodes[1].inputs[0].id"), source_id);
  EXPECT_EQ(str(details.body, "plan.nodes[1].inputs[0].ship_strategy"), "HASH");
  EXPECT_EQ(str(details.body, "plan.nodes[1].operator_uids[1]"), "collect");
  // The names are the tasks' names in /metrics (task_name), which the UI joins on.
  bool named = false;
  for (const auto& m : job.client->subtask_metrics())
    named = named || m.task_name == str(details.body, "plan.nodes[1].description");
  EXPECT_TRUE(named) << str(details.body, "plan.nodes[1].description");
}

// `/` serves the web UI's folder when there is one, else a page saying the UI is not installed; the API works
// either way.
TEST(RestServerTest, TheWebUiFolderIsServedAtTheRootElseAPageSaysWhy) {
  const TempDir tmp("ui");
  std::ofstream(tmp.path / "index.html") << "<html><body>the sluice ui</body></html>";
  std::ofstream(tmp.path / "app.js") << "console.log(1);";
  RestServerOptions with_ui;
  with_ui.ui_dir = tmp.path.string();
  auto server = RestServer::start(with_ui);
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  httplib::Client http((*server)->address(), (*server)->port());
  auto index = http.Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_NE(index->body.find("the sluice ui"), std::string::npos);
  auto js = http.Get("/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200);
  EXPECT_NE(js->get_header_value("Content-Type").find("javascript"), std::string::npos);
  EXPECT_EQ(call(http, "GET", "/jobs").status, 200);

  RestServerOptions without_ui;
  without_ui.ui_dir = (tmp.path / "missing").string();
  EXPECT_EQ(find_web_ui_dir(without_ui.ui_dir), "");
  auto bare = RestServer::start(without_ui);
  ASSERT_TRUE(bare.ok()) << bare.error().to_string();
  httplib::Client http2((*bare)->address(), (*bare)->port());
  auto root = http2.Get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 404);
  EXPECT_NE(root->body.find("the web UI is not installed"), std::string::npos) << root->body;
  EXPECT_NE(root->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_EQ(call(http2, "GET", "/jobs").status, 200);
}

TEST(RestServerTest, UnknownJobsRequestsAndPathsAre404) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  RunningJob job;
  job.start(Configuration{});
  server->register_job("running sums", *job.client);
  httplib::Client http(server->address(), server->port());

  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/jobs/0123456789abcdef"},
           {"GET", "/jobs/0123456789abcdef/checkpoints"},
           {"POST", "/jobs/0123456789abcdef/savepoints"},
           {"POST", "/jobs/0123456789abcdef/stop"},
           {"PATCH", "/jobs/0123456789abcdef?mode=cancel"},
           {"GET", "/jobs/" + job.client->job_id() + "/savepoints/no-such-request"},
           {"GET", "/no/such/endpoint"}}) {
    Answer a = call(http, method, path, "{}");
    EXPECT_EQ(a.status, 404) << method << " " << path;
    const Value* errors = a.body.find("errors");
    ASSERT_TRUE(errors != nullptr && errors->is_array() && errors->size() == 1) << a.body.to_json();
  }
  Answer unknown = call(http, "GET", "/jobs/0123456789abcdef");
  EXPECT_NE(str(unknown.body, "errors[0]").find("no job with id '0123456789abcdef'"), std::string::npos);
}

TEST(RestServerTest, BadRequestsAre400) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  const TempDir tmp("bad");
  const fs::path& root = tmp.path;
  RunningJob job;
  job.start(checkpointing(root / "checkpoints"));
  server->register_job("running sums", *job.client);
  httplib::Client http(server->address(), server->port());
  const std::string base = "/jobs/" + job.client->job_id();

  EXPECT_EQ(call(http, "POST", base + "/savepoints", "{not json").status, 400);
  EXPECT_EQ(call(http, "POST", base + "/savepoints", "[1, 2]").status, 400);
  EXPECT_EQ(call(http, "POST", base + "/savepoints", R"({"target-directory": 5})").status, 400);
  EXPECT_EQ(call(http, "POST", base + "/savepoints", R"({"cancel-job": "yes"})").status, 400);
  EXPECT_EQ(call(http, "PATCH", base + "?mode=stop").status, 400);
  Answer drain = call(http, "POST", base + "/stop", R"({"targetDirectory": "/tmp/x", "drain": true})");
  EXPECT_EQ(drain.status, 400);
  EXPECT_NE(str(drain.body, "errors[0]").find("not supported yet"), std::string::npos) << drain.body.to_json();
  EXPECT_EQ(job.client->status(), JobStatus::kRunning);  // none of it touched the job
}

TEST(RestServerTest, CancelEndsTheJobCanceled) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  RunningJob job;
  job.start(Configuration{});
  server->register_job("running sums", *job.client);
  httplib::Client http(server->address(), server->port());
  const std::string base = "/jobs/" + job.client->job_id();

  ASSERT_TRUE(testing::wait_until([&] { return job.out->size() > 0; }));
  // `curl -X POST/PATCH` without -d sends no Content-Length: answered at once, not after a read timeout.
  const auto start = std::chrono::steady_clock::now();
  std::string no_body = raw_request(
      server->port(), "POST " + base + "/stop HTTP/1.1\r\nHost: localhost\r\n" + "Connection: close\r\n\r\n");
  EXPECT_TRUE(no_body.starts_with("HTTP/1.1 202")) << no_body;  // (the operation fails: no checkpoint storage)
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  std::string cancel = raw_request(
      server->port(), "PATCH " + base + "?mode=cancel HTTP/1.1\r\nHost: localhost\r\n" + "Connection: close\r\n\r\n");
  EXPECT_TRUE(cancel.starts_with("HTTP/1.1 202")) << cancel;
  JobResult r = job.client->wait();
  EXPECT_EQ(r.status, JobStatus::kCanceled);
  EXPECT_EQ(str(call(http, "GET", base).body, "state"), "CANCELED");
  EXPECT_EQ(str(call(http, "GET", "/jobs").body, "jobs[0].status"), "CANCELED");
}

TEST(RestServerTest, SavepointFailureAndCancelWithSavepoint) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  httplib::Client http(server->address(), server->port());

  // No checkpoint storage: the operation completes with the engine's reason.
  RunningJob plain;
  plain.start(Configuration{});
  server->register_job("no storage", *plain.client);
  Answer trigger =
      call(http, "POST", "/jobs/" + plain.client->job_id() + "/savepoints", R"({"target-directory": "/tmp/unused"})");
  ASSERT_EQ(trigger.status, 202);
  Value failed = await_operation(http, plain.client->job_id(), str(trigger.body, "request-id"));
  EXPECT_EQ(str(failed, "operation.failure-cause.class"), "configuration") << failed.to_json();
  EXPECT_NE(str(failed, "operation.failure-cause.message").find("checkpoint storage"), std::string::npos);
  EXPECT_EQ(failed.find("operation")->find("location"), nullptr);

  // cancel-job: the job is cancelled once the savepoint has completed.
  const TempDir tmp("cancel-job");
  const fs::path& root = tmp.path;
  RunningJob job;
  job.start(checkpointing(root / "checkpoints"));
  server->register_job("cancel with savepoint", *job.client);
  Answer cws = call(http, "POST", "/jobs/" + job.client->job_id() + "/savepoints",
                    Value::object({{"target-directory", (root / "sp").string()}, {"cancel-job", true}}).to_json());
  ASSERT_EQ(cws.status, 202);
  Value done = await_operation(http, job.client->job_id(), str(cws.body, "request-id"));
  EXPECT_TRUE(fs::exists(fs::path(str(done, "operation.location")) / "_metadata")) << done.to_json();
  EXPECT_EQ(job.client->wait().status, JobStatus::kCanceled);
  Answer jobs = call(http, "GET", "/jobs");
  EXPECT_EQ(jobs.body.find("jobs")->size(), 2u);
  server->stop();
}

TEST(RestServerTest, ConfigurationAndBindErrors) {
  Configuration disabled;
  auto off = RestServer::start(disabled);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(off.error().message().find("rest.port"), std::string::npos);

  Configuration any;
  any.set(options::kRestPort, 0);
  auto first = RestServer::start(any);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_EQ((*first)->url(), "http://127.0.0.1:" + std::to_string((*first)->port()));

  RestServerOptions busy;
  busy.port = (*first)->port();
  auto second = RestServer::start(busy);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kNetwork);
  EXPECT_NE(second.error().message().find(std::to_string(busy.port)), std::string::npos);
  EXPECT_FALSE(RestServer::start(RestServerOptions{"127.0.0.1", 70000, 4}).ok());
  EXPECT_TRUE(validate_engine_options(any).ok());
  Configuration bad;
  bad.set(options::kRestPort, -5);
  EXPECT_FALSE(validate_engine_options(bad).ok());
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

TEST(RestServerTest, TaskManagersAndAJobsStatusMessageOfAClustersJobManager) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  httplib::Client http(server->address(), server->port());
  Answer local = call(http, "GET", "/taskmanagers");
  EXPECT_EQ(local.status, 404);
  EXPECT_NE(str(local.body, "errors[0]").find("local mini-cluster"), std::string::npos) << local.body.to_json();

  const int64_t beat = 1'700'000'000'000;
  server->serve_task_managers([&] {
    return std::vector<RestTaskManagerInfo>{
        {"127.0.0.1:4000-abc", "jm-1", "127.0.0.1:4000", "", "host", 42, 4, 3, beat - 10, beat}};
  });
  Answer a = call(http, "GET", "/taskmanagers");
  ASSERT_EQ(a.status, 200);
  const Value* list = a.body.find("taskmanagers");
  ASSERT_TRUE(list != nullptr && list->is_array() && list->size() == 1) << a.body.to_json();
  const Value& t = list->as_array()[0];
  EXPECT_EQ(str(t, "id"), "127.0.0.1:4000-abc");
  EXPECT_EQ(str(t, "registration-id"), "jm-1");
  EXPECT_EQ(str(t, "path"), "127.0.0.1:4000");
  EXPECT_EQ(t.find("slotsNumber")->as_int64(), 4);
  EXPECT_EQ(t.find("freeSlots")->as_int64(), 3);
  EXPECT_EQ(t.find("pid")->as_int64(), 42);
  EXPECT_EQ(t.find("timeSinceLastHeartbeat")->as_int64(), beat);
  EXPECT_GT(t.find("ms-since-last-heartbeat")->as_int64(), 0);

  RunningJob job;
  job.start(Configuration{});
  server->register_job("running sums", *job.client, {}, [] { return std::string("needs 8 slots, 6 registered"); });
  Answer details = call(http, "GET", "/jobs/" + job.client->job_id());
  EXPECT_EQ(str(details.body, "status-message"), "needs 8 slots, 6 registered") << details.body.to_json();
  Answer jobs = call(http, "GET", "/jobs");
  EXPECT_EQ(str(jobs.body, "jobs[0].status-message"), "needs 8 slots, 6 registered") << jobs.body.to_json();
}

}  // namespace
}  // namespace sluice
