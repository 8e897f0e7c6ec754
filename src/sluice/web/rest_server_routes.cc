// RestServer::Impl::route: the routes other than Flink's views: /, /metrics, /health, jobs, checkpoints,
// exceptions, savepoints, stop-with-savepoint and cancel.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rest_server_internals.h"
#include "sluice/core/redact.h"

namespace sluice {

namespace {

/// What `/` answers when the UI's files were not found: the REST API works, the page says how to get the UI.
constexpr const char* kNoUiPage = R"(<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice</title></head>
<body style="font-family: sans-serif; max-width: 46em; margin: 2em auto">
<h1>Sluice: the web UI is not installed</h1>
<p>This process serves the REST API (<a href="/jobs">/jobs</a>, <a href="/metrics">/metrics</a>,
<a href="/health">/health</a>), but the web UI's files were not found. They are built from <code>web-ui/</code>
by the CMake build when Node.js and npm are present (<code>npm ci &amp;&amp; npm run build</code>, into
<code>share/sluice/web-ui</code> of the build folder); this build had none, or the files were moved.</p>
<p>Point to a built UI with the environment variable <code>SLUICE_WEB_UI_DIR</code> (a folder with
<code>index.html</code>), or install Node.js (<code>scripts/setup</code>) and build again.
See docs/operations.md, "Web UI".</p>
</body></html>
)";

}  // namespace

void RestServer::Impl::route() {
  // Reached only when no UI folder is mounted at / (a mounted folder's files are served before routes).
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.status = 404;
    res.set_content(kNoUiPage, "text/html; charset=utf-8");
  });
  route_flink_views();
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::function<std::string()> provider;
    {
      std::lock_guard lock(mu_);
      provider = metrics_;
    }
    res.set_content(provider ? provider() : default_metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::function<HealthResponse()> provider;
    {
      std::lock_guard lock(mu_);
      provider = health_;
    }
    HealthResponse h = provider ? provider() : default_health();
    res.status = h.healthy ? 200 : 503;
    res.set_content(h.json, "application/json");
  });
  server_->Get("/jobs", [this](const httplib::Request&, httplib::Response& res) {
    std::vector<std::shared_ptr<JobEntry>> jobs;
    {
      std::lock_guard lock(mu_);
      for (const auto& id : order_)
        jobs.push_back(jobs_.at(id));
    }
    Value list = Value::array();
    for (const auto& j : jobs) {
      Value entry = Value::object({{"id", j->client.job_id()},
                                   {"name", j->name},
                                   {"status", job_status_name(j->client.status())},
                                   {"start-time", j->start_time_ms},
                                   {"restarts", j->client.restarts()}});
      add_failure_summary(entry, j->client);
      if (j->status_message) entry.set("status-message", j->status_message());
      list.push_back(std::move(entry));
    }
    reply(res, 200, Value::object({{"jobs", std::move(list)}}));
  });

  // Flink's GET /taskmanagers, plus the registration id, pid and times in ms since the epoch.
  // "timeSinceLastHeartbeat" keeps Flink's name and meaning: the time OF the last heartbeat (ms since the
  // epoch), not a duration; "ms-since-last-heartbeat" is the duration.
  server_->Get("/taskmanagers", [this](const httplib::Request&, httplib::Response& res) {
    std::function<std::vector<RestTaskManagerInfo>()> provider;
    {
      std::lock_guard lock(mu_);
      provider = task_managers_;
    }
    if (!provider) {
      reply_error(res, 404,
                  "this process runs its job on the local mini-cluster and has no TaskManagers to list; "
                  "GET /taskmanagers is served by a cluster's JobManager (sluice jobmanager, docs/cluster.md)");
      return;
    }
    const int64_t now = now_ms();
    Value list = Value::array();
    for (const auto& t : provider()) {
      list.push_back(Value::object({{"id", t.id},
                                    {"registration-id", t.registration_id},
                                    {"path", t.address},
                                    {"data-address", t.data_address},
                                    {"hostname", t.hostname},
                                    {"pid", t.pid},
                                    {"slotsNumber", t.slots_total},
                                    {"freeSlots", t.slots_free},
                                    {"registered", t.registered_ms},
                                    {"timeSinceLastHeartbeat", t.last_heartbeat_ms},
                                    {"ms-since-last-heartbeat", now - t.last_heartbeat_ms}}));
    }
    reply(res, 200, Value::object({{"taskmanagers", std::move(list)}}));
  });

  server_->Get(R"(/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    reply(res, 200, job_details(*job));
  });

  server_->Patch(
      R"(/jobs/([^/]+))", with_body([this](const httplib::Request& req, const std::string&, httplib::Response& res) {
        auto job = job_or_404(req, res);
        if (!job) return;
        const std::string mode = req.has_param("mode") ? req.get_param_value("mode") : "cancel";
        if (mode != "cancel") {
          reply_error(res, 400,
                      fmt::format("mode '{}' is not supported: use mode=cancel, or POST /jobs/:id/stop to stop with "
                                  "a savepoint",
                                  mode));
          return;
        }
        job->client.cancel();  // a no-op for a job that already ended (Flink also answers 202)
        reply(res, 202, Value::object());
      }));

  // Flink's GET /jobs/:jobid/exceptions (JobExceptionsInfoWithHistory): the newest failure as the root
  // exception, and the recent failures newest first.
  server_->Get(R"(/jobs/([^/]+)/exceptions)", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    const std::vector<JobExceptionInfo> ex = job->client.exceptions();
    Value entries = Value::array();
    for (const auto& e : ex)
      entries.push_back(exception_json(e, hostname_));
    const bool truncated = ex.size() >= JobClient::kMaxExceptionHistory;
    reply(res, 200,
          Value::object(
              {{"root-exception", ex.empty() ? Value() : Value(ex[0].stacktrace)},
               {"timestamp", ex.empty() ? Value() : Value(ex[0].timestamp_ms)},
               {"all-exceptions", Value::array()},
               {"truncated", truncated},
               {"exceptionHistory", Value::object({{"entries", std::move(entries)}, {"truncated", truncated}})}}));
  });

  server_->Get(R"(/jobs/([^/]+)/checkpoints)", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    reply(res, 200, checkpoints_json(job->client.checkpoint_stats()));
  });

  server_->Post(R"(/jobs/([^/]+)/savepoints)",
                with_body([this](const httplib::Request& req, const std::string& text, httplib::Response& res) {
                  auto r = savepoint_request(req, text, res, "target-directory", "cancel-job");
                  if (!r || !running_or_409(*r->job, "take a savepoint of", res)) return;
                  std::shared_future<Result<std::string>> f = r->job->client.trigger_savepoint(r->target).share();
                  if (r->flag) {
                    // Flink's cancel-with-savepoint: the job is cancelled once the savepoint has completed.
                    JobClient client = r->job->client;
                    std::lock_guard lock(mu_);
                    cancellers_.emplace_back([this, f, client]() mutable {
                      // Waits in slices: a job that ended resolves its savepoint only when destroyed, which this
                      // thread's client would prevent.
                      while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
                        if (stopping_.load() || job_status_terminal(client.status())) return;
                      }
                      if (await(f).ok()) client.cancel();
                    });
                  }
                  accept_savepoint_operation(*r->job, f, "savepoint", r->target, res);
                }));

  server_->Get(R"(/jobs/([^/]+)/savepoints/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    const std::string rid = req.matches[2];
    std::shared_future<Result<std::string>> f;
    {
      std::lock_guard lock(mu_);
      auto it = job->operations.find(rid);
      if (it == job->operations.end()) {
        reply_error(res, 404, fmt::format("no savepoint request '{}' for job '{}'", rid, job->client.job_id()));
        return;
      }
      f = it->second.result;
    }
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      reply(res, 200, Value::object({{"status", Value::object({{"id", "IN_PROGRESS"}})}, {"operation", Value()}}));
      return;
    }
    Result<std::string> r = await(f);
    Value operation =
        r.ok() ? Value::object({{"location", *r}}) : Value::object({{"failure-cause", error_json(r.error())}});
    reply(res, 200,
          Value::object({{"status", Value::object({{"id", "COMPLETED"}})}, {"operation", std::move(operation)}}));
    {
      std::lock_guard lock(mu_);
      job->operations[rid].fetched = true;
    }
    fetched_cv_.notify_all();
  });

  server_->Post(R"(/jobs/([^/]+)/stop)",
                with_body([this](const httplib::Request& req, const std::string& text, httplib::Response& res) {
                  auto r = savepoint_request(req, text, res, "targetDirectory", "drain");
                  if (!r) return;
                  if (r->flag) {
                    reply_error(
                        res, 400,
                        "drain=true (stop with a final MAX_WATERMARK that fires every timer and window) is not "
                        "supported yet; stop without drain: the job stops right after the savepoint and resumes "
                        "from it with its timers and windows intact");
                    return;
                  }
                  if (!running_or_409(*r->job, "stop", res)) return;
                  accept_savepoint_operation(*r->job, r->job->client.stop_with_savepoint(r->target).share(),
                                             "stop-with-savepoint", r->target, res);
                }));
}

}  // namespace sluice
