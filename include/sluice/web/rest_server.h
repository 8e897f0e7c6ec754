// RestServer: the JobManager's REST API (DESIGN.md §9) over HTTP/1.1 and JSON, in the shapes of Flink's REST
// API so that a Flink user's scripts and habits carry over (docs/operations.md lists every endpoint):
//
//   GET   /jobs                               {"jobs": [{"id", "name", "status", "start-time"}]}
//   GET   /overview, /config                  Flink's cluster overview and web UI configuration
//   GET   /jobs/overview                      Flink's JobDetails of every job (task counts by state)
//   GET   /jobs/:id                           Flink's JobDetailsInfo: vertices with IO metrics, plan (edges);
//                                             plus restarts and the latest failure
//   GET   /jobs/:id/vertices/:vid             per-subtask state, host, IO metrics, busy/idle/backpressure
//   GET   /jobs/:id/vertices/:vid/backpressure  level (ok/low/high) and ratio per subtask
//   GET   /jobs/:id/vertices/:vid/metrics[?get=a,b]  subtask metrics ("0.numRecordsIn", "0.Map.numRecordsOut")
//   GET   /jobs/:id/vertices/:vid/subtasks/metrics?get=..&agg=..  aggregated over subtasks
//   GET   /jobs/:id/vertices/:vid/watermarks  each subtask's input watermark
//   GET   /jobs/:id/metrics[?get=a,b]         job metrics (numRestarts, lastCheckpointDuration, ...)
//   GET   /jobs/:id/exceptions                Flink's exception history
//   GET   /jobs/:id/checkpoints               counts, latest and history of checkpoints and savepoints
//   POST  /jobs/:id/savepoints                {"target-directory", "cancel-job"} -> 202 {"request-id"}
//   GET   /jobs/:id/savepoints/:request-id    {"status": {"id": IN_PROGRESS|COMPLETED}, "operation": ...}
//   POST  /jobs/:id/stop                      {"targetDirectory", "drain"} -> 202 {"request-id"}
//   PATCH /jobs/:id?mode=cancel               202 {}
//   GET   /taskmanagers                       {"taskmanagers": [{"id", "path", "slotsNumber", "freeSlots",
//                                             "timeSinceLastHeartbeat", ...}]} (a cluster's JobManager only)
//   GET   /metrics                            Prometheus text 0.0.4 (serve_metrics, else every job's job-level
//                                             metrics)
//   GET   /jobmanager/config                  [{"key", "value"}] of serve_configuration (secrets as ******)
//   GET   /jobs/:id/config                    Flink's job config: {"jid", "name", "execution-config": {...}}
//   GET   /health                             200 healthy / 503 not, JSON saying why (serve_health, else from
//                                             the jobs' states)
//   GET   /  (and its files)                  the web UI (web-ui/, built by npm) from RestServerOptions::ui_dir;
//                                             without it, a page saying how to build it
//
// One port serves all of it: `sluice run`, the bundled examples and a user's job (RestServer::execute) alike.
//
// Security (rest_security.h): with tokens configured, a request without a valid bearer token is answered 401 and
// an action with the read-only token 403; GET /health and the UI's static files stay open.
//
// Errors are JSON `{"errors": ["..."]}`: 404 for an unknown job, request id or path, 400 for a malformed
// body or parameter, 409 for an action on a job that is no longer running.
//
// Lifecycle: start() binds the socket and starts serving on a background thread (created -> serving);
// register_job() adds jobs at any time; stop() (or the destructor) stops accepting requests, waits for the
// requests in flight and for the helper threads of cancel-job savepoints (serving -> closed).
// Threading: every member function is thread-safe. Handlers run on a small pool of HTTP threads; they only
// call the thread-safe JobClient, never block on a job, and hold the registry lock only to copy entries.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/core/config.h"
#include "sluice/core/error.h"
#include "sluice/graph/stream_graph.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/web/job_health.h"
#include "sluice/web/job_plan.h"
#include "sluice/web/metrics_server.h"
#include "sluice/web/rest_security.h"

namespace sluice {
namespace metrics {
class JobMetrics;
}  // namespace metrics
class StreamEnvironment;
}  // namespace sluice

namespace sluice {

/// Where and how a RestServer listens.
struct RestServerOptions {
  std::string address = "127.0.0.1";  ///< an IP address or host name to bind to (rest.address)
  int port = 0;                       ///< 0 = an ephemeral port chosen by the kernel (see RestServer::port())
  int threads = 4;                    ///< HTTP worker threads (each serves one connection at a time)
  /// The web UI's built files (index.html and assets/), served at `/`. "" = $SLUICE_WEB_UI_DIR when set, else
  /// the first `share/sluice/web-ui` holding an index.html in the executable's folder or one of its three
  /// parents (the build tree and an installed prefix). Not found: `/` answers 404 with a page saying why.
  std::string ui_dir;
  /// Bearer tokens (rest.auth.*; rest_security.h): when set, every request but GET /health and the UI's static
  /// files needs one, and actions the admin token.
  RestAuthOptions auth;
  /// HTTPS (security.ssl.rest.*): the certificate and key are loaded at start(), which also ignores SIGPIPE for
  /// the process unless it has a handler (OpenSSL's writes to a client that left would otherwise raise it).
  RestTlsOptions tls;
};

/// Sets `options.auth` and `options.tls` from `config`'s rest.auth.* and security.ssl.rest.* (load_rest_auth,
/// load_rest_tls). Errors: theirs (kConfiguration, naming the key).
[[nodiscard]] Status apply_rest_security(const Configuration& config, RestServerOptions& options);

/// One registered TaskManager as GET /taskmanagers shows it.
struct RestTaskManagerInfo {
  std::string id;               ///< the TaskManager's resource id
  std::string registration_id;  ///< its current registration (new after every re-registration)
  std::string address;          ///< host:port of its RPC service
  std::string data_address;     ///< host:port of its data plane ("" until wired)
  std::string hostname;
  int64_t pid = 0;
  int slots_total = 0;
  int slots_free = 0;
  int64_t registered_ms = 0;      ///< ms since the epoch
  int64_t last_heartbeat_ms = 0;  ///< ms since the epoch
};

/// Where one subtask of a job vertex runs in a cluster, for GET /jobs/:id/vertices/:vid.
struct RestSubtaskLocation {
  int vertex_id = 0;  ///< JobVertex::id (the plan's node id)
  int subtask = 0;
  std::string task_manager_id;  ///< the TaskManager's resource id
  std::string address;          ///< host:port of its RPC service ("" when it is no longer registered)
  int slot = 0;                 ///< slot index in that TaskManager
  int attempt = 0;              ///< the deployment attempt that placed it
  std::string execution_state;  ///< "RUNNING", "FINISHED" while the job runs; "" when the job's state says it
};

/// The REST API of the jobs of one process. Thread-safe (see the file comment).
class RestServer {
 public:
  /// Binds `options.address:options.port` and starts serving. Errors: kConfiguration for a port outside
  /// 0..65535 or thread count < 1, or TLS files that OpenSSL cannot load (naming the file and OpenSSL's reason);
  /// kNetwork when the address cannot be bound (in use, not local), with the
  /// address and how to pick another port.
  [[nodiscard]] static Result<std::unique_ptr<RestServer>> start(RestServerOptions options);
  /// As start(RestServerOptions), from `rest.address`, `rest.port`, rest.auth.* and security.ssl.rest.*. Errors: also
  /// kConfiguration when rest.port is -1 (the API is disabled: check the option first) or does not parse.
  [[nodiscard]] static Result<std::unique_ptr<RestServer>> start(const Configuration& config);

  RestServer(const RestServer&) = delete;
  RestServer& operator=(const RestServer&) = delete;
  /// Calls stop().
  ~RestServer();

  /// The bound address and port (the real one when started with port 0).
  const std::string& address() const noexcept;
  int port() const noexcept;
  /// "http://<address>:<port>", or "https://..." with TLS.
  std::string url() const;

  /// Serves `client` under its job id and `name`. `plan` describes the job's operators and vertices
  /// (job_plan_of() of its graph, taken before execution; operators_of() alone gives the vertices without their
  /// edges, learnt from the running job). Registering the same job id again replaces the entry. The server
  /// keeps the client (and so the job's resources) until it is destroyed. The job's metrics (metrics/
  /// JobMetrics) are registered in the server's own registry, unless serve_metric_samples() was called.
  void register_job(std::string name, JobClient client, JobPlan plan = {});
  /// As register_job(), with a line that says what the job waits for ("needs 8 slots, 6 registered"),
  /// served as "status-message" in GET /jobs and GET /jobs/:id. `status_message` is called on HTTP threads.
  void register_job(std::string name, JobClient client, JobPlan plan, std::function<std::string()> status_message);

  /// The metric views (vertex details, backpressure, /jobs/:id/metrics ...) read their samples from `samples`
  /// (e.g. a pipeline's registry, which has its connectors' metrics too) instead of a registry of the server's
  /// own. Call it before register_job(). `samples` is called on a server thread about once per second (for the
  /// rates' windows) and on an HTTP thread for each metric view, possibly at once: it must be thread-safe.
  void serve_metric_samples(std::function<std::vector<metrics::MetricSample>()> samples);

  /// Replaces the plan of the registered job `job_id` (register_job's `plan`). Unknown job ids are ignored (the
  /// job was never registered).
  void set_plan(const std::string& job_id, JobPlan plan);

  /// Serves where each subtask of `job_id` runs (a cluster's JobManager: JobMaster::placement()) in GET
  /// /jobs/:id/vertices/:vid's "subtasks" (taskmanager-id, host, slot). `provider` is called on HTTP threads
  /// (thread-safe); it returns nothing before deployment. Unknown job ids are ignored.
  void serve_subtask_locations(const std::string& job_id, std::function<std::vector<RestSubtaskLocation>()> provider);

  /// Serves what the sources of `job_id` say of themselves (a cluster's JobManager: the source connections its
  /// TaskManagers report with their heartbeats) to GET /health, which then names a disconnected source reader
  /// (`source-disconnected`) as `sluice run`'s does. `provider` is called on HTTP threads (thread-safe). Unknown job
  /// ids are ignored.
  void serve_source_health(const std::string& job_id, std::function<std::vector<SourceHealth>()> provider);

  /// The health bounds of job `job_id` for GET /health (a cluster's JobManager: its pipeline's `health.*` and
  /// checkpoint interval, as `sluice run` applies them). Without, a job gets JobHealthOptions{}: no checkpoint-age
  /// bound (its interval is unknown here) and the default failed-checkpoint and restart-grace bounds. Unknown job ids
  /// are ignored. Thread-safe.
  void serve_health_options(const std::string& job_id, const JobHealthOptions& options);

  /// The Flink-named metrics of the registered job `job_id` in the server's own registry, for a caller to add
  /// metrics of its own (a cluster's JobManager: its sources' `sourceConnected`); null for an unknown job id or when
  /// serve_metric_samples() replaced the registry. Valid while the server lives.
  metrics::JobMetrics* job_metrics(const std::string& job_id);

  /// Builds `env`'s job, starts it (execute_async) and registers it under `name` with its operators: a user's
  /// C++ job served as `sluice run` serves a pipeline. Errors: as StreamEnvironment::execute_async (thrown).
  JobClient execute(StreamEnvironment& env, std::string name);

  /// Serves GET /metrics from `provider` (Prometheus text 0.0.4; called on HTTP threads, so thread-safe).
  /// Without a provider, /metrics serves the job-level metrics of every registered job (status, restarts,
  /// per-operator records in and out, checkpoint counts) followed by the registry's Flink-named metrics
  /// (flink_taskmanager_job_task_operator_numRecordsIn ..., docs/operations.md).
  void serve_metrics(std::function<std::string()> provider);
  /// Serves GET /health from `provider` (called on HTTP threads, so thread-safe): 200 when healthy, else 503,
  /// with its JSON. Without a provider, /health is healthy while every registered job is RUNNING or FINISHED
  /// (and at least one is registered), and names the jobs that are not.
  void serve_health(std::function<HealthResponse()> provider);

  /// Serves `config` at GET /jobmanager/config (Flink's [{"key", "value"}]) and as the "user-config" of GET
  /// /jobs/:id/config, with the value of every key naming a secret (is_secret_key, rest.auth.*) shown as "******"
  /// as Flink does. Without it both list nothing.
  void serve_configuration(const Configuration& config);

  /// Serves GET /taskmanagers from `provider` (called on HTTP threads, so thread-safe). Without a provider
  /// (local mode) GET /taskmanagers answers 404 saying the process is not a cluster's JobManager.
  void serve_task_managers(std::function<std::vector<RestTaskManagerInfo>()> provider);

  /// Waits until a client has fetched the result of every savepoint or stop operation that has completed,
  /// or `timeout` passes; true when nothing is left unfetched. A process that serves a job calls it after
  /// the job ended, so that `sluice stop` reads the savepoint's path before the server goes away.
  bool wait_for_fetched_operations(std::chrono::milliseconds timeout);

  /// Stops serving: closes the listening socket, waits for requests in flight and for the threads that
  /// cancel jobs after a cancel-job savepoint (they end when the savepoint does, or when its job ends).
  /// Idempotent.
  void stop();

 private:
  class Impl;
  explicit RestServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The operators of `graph` (name, uid, parallelism; no counters) in graph order, resolving the default
/// parallelism from the graph's configuration. Call it before execute_async(), which consumes the graph.
std::vector<OperatorStats> operators_of(const StreamGraph& graph);

/// The web UI folder RestServer serves for `configured` (RestServerOptions::ui_dir): it when not empty, else
/// $SLUICE_WEB_UI_DIR, else share/sluice/web-ui beside or above the executable; "" when none has index.html.
std::string find_web_ui_dir(const std::string& configured);

}  // namespace sluice
