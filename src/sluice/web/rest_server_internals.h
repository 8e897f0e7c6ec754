// Private to src/sluice/web/: what the files of the REST server (rest_server*.cc) share: RestServer::Impl
// (the httplib server, the registered jobs and their savepoint operations, the metric sampler), its JobEntry
// and Operation, and (namespace rest_server_internal) the JSON of checkpoints, exceptions and errors and the
// reply helpers. Not installed; web/README.md describes the server and its threads.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/core/value.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/web/job_health.h"
#include "sluice/web/job_views.h"
#include "sluice/web/rest_server.h"

namespace sluice {
namespace rest_server_internal {

// Defined in rest_server_json.cc.

int64_t now_ms();

Value checkpoint_json(const CheckpointStats& s);

/// One entry of Flink's exception history (JobExceptionsInfoWithHistory.ExceptionInfo), plus the message alone;
/// redacted as failure causes are.
Value exception_json(const JobExceptionInfo& e, const std::string& hostname);

/// The latest failure and the restart count, for the job list and details ("last-failure" is null when none).
void add_failure_summary(Value& v, const JobClient& client);

// Redacted once more here: a failure cause is shown to every client of the API, and a connector's message may
// quote a connection string.
Value error_json(const Error& e);

void reply(httplib::Response& res, int status, const Value& body);

void reply_error(httplib::Response& res, int status, const std::string& message);

// Defined in rest_server.cc.

std::string this_hostname();

/// One savepoint or stop-with-savepoint triggered through the API.
struct Operation {
  std::shared_future<Result<std::string>> result;
  bool fetched = false;  ///< a client has read its final status
};

struct JobEntry {
  std::string name;
  JobClient client;
  std::shared_ptr<const JobPlan> plan;  // replaced whole by set_plan (under Impl::mu_)
  int64_t start_time_ms = 0;
  std::map<std::string, Operation> operations;   // by request id
  std::function<std::string()> status_message;   // what the job waits for; empty when nothing
  std::unique_ptr<metrics::JobMetrics> metrics;  // in the server's registry; null when the registry is external
  std::function<std::vector<RestSubtaskLocation>()> locations;  // guarded by Impl::mu_; cluster mode only
  std::function<std::vector<SourceHealth>()> sources;           // guarded by Impl::mu_; cluster mode only
  JobHealthOptions health;                                      // guarded by Impl::mu_
};

}  // namespace rest_server_internal

using rest_server_internal::add_failure_summary;
using rest_server_internal::checkpoint_json;
using rest_server_internal::error_json;
using rest_server_internal::exception_json;
using rest_server_internal::JobEntry;
using rest_server_internal::now_ms;
using rest_server_internal::Operation;
using rest_server_internal::reply;
using rest_server_internal::reply_error;
using rest_server_internal::this_hostname;

// Member functions are defined in rest_server.cc (life cycle, settings, TLS and tokens),
// rest_server_requests.cc (request helpers), rest_server_metrics.cc (default /metrics and /health, the
// sampler), rest_server_json.cc (job snapshots and checkpoint JSON), rest_server_flink_views.cc (Flink's
// views) and rest_server_routes.cc (the other routes).
class RestServer::Impl {
 public:
  static constexpr size_t kMaxBody = 1 << 20;

  explicit Impl(RestServerOptions options) : options_(std::move(options)) {
    std::random_device rd;  // only for unguessable request ids, never for data
    id_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  ~Impl() { stop(); }

  Status start();

  void stop();

  std::string url() const;

  void serve_configuration(const Configuration& config);

  void register_job(std::string name, JobClient client, JobPlan plan, std::function<std::string()> status_message);

  void serve_metric_samples(std::function<std::vector<metrics::MetricSample>()> samples);

  bool wait_for_fetched_operations(std::chrono::milliseconds timeout);

  void serve_task_managers(std::function<std::vector<RestTaskManagerInfo>()> provider);
  void serve_metrics(std::function<std::string()> provider);
  void serve_health(std::function<HealthResponse()> provider);

  const RestServerOptions& options() const { return options_; }
  int port() const { return port_; }

  void set_plan(const std::string& job_id, JobPlan plan);
  void serve_subtask_locations(const std::string& job_id, std::function<std::vector<RestSubtaskLocation>()> provider);
  metrics::JobMetrics* job_metrics(const std::string& job_id);
  void serve_health_options(const std::string& job_id, const JobHealthOptions& options);
  void serve_source_health(const std::string& job_id, std::function<std::vector<SourceHealth>()> provider);

 private:
  Error bind_error() const;

  /// What needs no token: GET /health (probes) and the web UI's static files (the page asks for the token).
  bool is_open(const httplib::Request& req) const;

  /// An httplib::SSLServer on the PEM certificate chain and key of options_.tls, TLS 1.2 or newer. Errors:
  /// kConfiguration naming the file and OpenSSL's reason.
  Status make_tls_server();

  std::shared_ptr<JobEntry> find_job(const std::string& id);

  /// Looks up the job of `req.matches[1]`; answers 404 and returns null when there is none.
  std::shared_ptr<JobEntry> job_or_404(const httplib::Request& req, httplib::Response& res);

  /// Parses a JSON object body; an empty body is an empty object. Answers 400 and returns null on error.
  std::optional<Value> body_or_400(const std::string& body, httplib::Response& res);

  /// Reads an optional string field; answers 400 when it has another type.
  static bool string_field(const Value& body, std::string_view key, std::string& out, httplib::Response& res);
  static bool bool_field(const Value& body, std::string_view key, bool& out, httplib::Response& res);

  std::string new_request_id();
  static uint64_t splitmix(uint64_t x);

  /// Answers 409 and returns false when the job no longer runs.
  static bool running_or_409(JobEntry& job, const char* action, httplib::Response& res);

  void add_operation(JobEntry& job, const std::string& rid, std::shared_future<Result<std::string>> f);

  /// The body of POST /jobs/:id/savepoints or /jobs/:id/stop: the job, the target directory (empty: the
  /// default) and the request's flag (cancel-job, drain).
  struct SavepointRequest {
    std::shared_ptr<JobEntry> job;
    std::string target;
    bool flag = false;
  };
  /// Looks up the job of `req` and reads the string field `target_key` and the bool field `flag_key` of the JSON
  /// body `text`; answers 404 or 400 and returns nullopt when that fails.
  std::optional<SavepointRequest> savepoint_request(const httplib::Request& req, const std::string& text,
                                                    httplib::Response& res, std::string_view target_key,
                                                    std::string_view flag_key);
  /// Registers `f` as a new operation of `job` (GET .../savepoints/:request-id), logs it as `what` ("savepoint",
  /// "stop-with-savepoint") into `target`, and answers 202 with the request id.
  void accept_savepoint_operation(JobEntry& job, std::shared_future<Result<std::string>> f, std::string_view what,
                                  const std::string& target, httplib::Response& res);

  using BodyHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  /// Reads the request body first, and only when the request announces one (Content-Length or chunked):
  /// httplib's own reading waits for the connection to close when a client sends a POST or PATCH without a
  /// body and without Content-Length (`curl -X PATCH ...`), and answers 400 after its read timeout.
  static httplib::Server::HandlerWithContentReader with_body(BodyHandler handler);

  std::vector<std::shared_ptr<JobEntry>> jobs_in_order();

  /// GET /metrics without a provider: the job-level metrics of every registered job, with the names
  /// `sluice run` uses for the same values.
  std::string default_metrics();

  /// GET /health without a provider: healthy while every registered job is RUNNING or FINISHED.
  HealthResponse default_health();

  /// One job's verdict by evaluate_job_health with its bounds (serve_health_options) and sources, and the bounds.
  std::pair<HealthReport, JobHealthOptions> job_health(const JobEntry& job, int64_t now);

  /// Every metric sample of the jobs now.
  std::vector<metrics::MetricSample> collect_samples();

  /// Collects every second, so that the meters' windows (busy, idle and backpressured ms per second over 5 s,
  /// records per second) hold a sample a second however rarely a client asks; drops what it collects.
  void sample_metrics();

  /// The samples of this moment, for one request (a job that has just ended answers its final counts).
  std::vector<metrics::MetricSample> samples_now();

  web::JobSnapshot snapshot(JobEntry& job);

  /// The vertex of `req.matches[2]` in `vertices`; answers 404 and returns null when there is none.
  static const JobPlanVertex* vertex_or_404(const std::vector<JobPlanVertex>& vertices, const httplib::Request& req,
                                            httplib::Response& res);

  static std::optional<std::string> get_param(const httplib::Request& req);

  void route_flink_views();

  void route();

  /// The result of a ready future; a broken promise (the job went away) becomes an error.
  static Result<std::string> await(const std::shared_future<Result<std::string>>& f);

  /// Flink's JobDetailsInfo (web/job_views.h) with Sluice's additions: restarts, the latest failure, the cause
  /// of a failed job and what a cluster's job waits for.
  Value job_details(JobEntry& job);

  static Value checkpoints_json(const std::vector<CheckpointStats>& stats);

  RestServerOptions options_;
  std::string ui_dir_;  // the mounted web UI folder, "" when none
  // Before jobs_: each entry's JobMetrics removes its groups from it when destroyed.
  metrics::MetricRegistry registry_;
  std::unique_ptr<httplib::Server> server_;  // an httplib::SSLServer with TLS; made by start()
  int port_ = 0;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::atomic<bool> stopping_{false};

  uint64_t id_seed_ = 0;
  std::atomic<uint64_t> request_counter_{0};

  std::mutex mu_;  // guards jobs_, order_, every JobEntry::operations and cancellers_
  std::condition_variable fetched_cv_;
  std::map<std::string, std::shared_ptr<JobEntry>> jobs_;
  std::vector<std::string> order_;  // job ids in registration order
  std::vector<std::thread> cancellers_;
  std::function<std::vector<RestTaskManagerInfo>()> task_managers_;  // guarded by mu_
  std::function<std::string()> metrics_;                             // guarded by mu_
  std::function<HealthResponse()> health_;                           // guarded by mu_
  std::vector<std::pair<std::string, std::string>> config_;          // served (redacted) config; guarded by mu_
  // Where the metric views read samples: the server's own registry (a JobMetrics per job), or a provider's
  // (a pipeline's registry, which also has its connectors' metrics). Guarded by mu_.
  std::shared_ptr<std::function<std::vector<metrics::MetricSample>()>> external_samples_;
  std::condition_variable sampler_cv_;
  std::thread sampler_;
  std::string hostname_ = this_hostname();
};

}  // namespace sluice
