// RestServer::Impl::route_flink_views: the routes of Flink's REST views (/overview, /config, job vertices,
// back pressure, metrics) that Flink's web UI and tools read.
#include <fmt/format.h>

#include "rest_server_internals.h"

namespace sluice {

namespace {

constexpr const char* kSluiceVersion = "sluice-" SLUICE_VERSION;

}  // namespace

void RestServer::Impl::route_flink_views() {
  // Flink's GET /overview: the cluster in one object. In local mode the process is its one TaskManager and
  // has as many slots as its jobs use.
  server_->Get("/overview", [this](const httplib::Request&, httplib::Response& res) {
    int64_t running = 0;
    int64_t finished = 0;
    int64_t cancelled = 0;
    int64_t failed = 0;
    int64_t slots_used = 0;
    for (const auto& j : jobs_in_order()) {
      const JobStatus st = j->client.status();
      if (st == JobStatus::kFinished) {
        ++finished;
      } else if (st == JobStatus::kCanceled) {
        ++cancelled;
      } else if (st == JobStatus::kFailed) {
        ++failed;
      } else {
        ++running;
        std::map<std::string, int> group_max;
        for (const auto& v : web::vertices_of(snapshot(*j)))
          group_max[v.slot_sharing_group] = std::max(group_max[v.slot_sharing_group], v.parallelism);
        for (const auto& [g, p] : group_max)
          slots_used += p;
      }
    }
    std::function<std::vector<RestTaskManagerInfo>()> tms;
    {
      std::lock_guard lock(mu_);
      tms = task_managers_;
    }
    int64_t taskmanagers = 1;
    int64_t slots_total = slots_used;
    int64_t slots_free = 0;
    if (tms) {
      const auto list = tms();
      taskmanagers = static_cast<int64_t>(list.size());
      slots_total = 0;
      for (const auto& t : list) {
        slots_total += t.slots_total;
        slots_free += t.slots_free;
      }
    }
    reply(res, 200,
          Value::object({{"taskmanagers", taskmanagers},
                         {"slots-total", slots_total},
                         {"slots-available", slots_free},
                         {"jobs-running", running},
                         {"jobs-finished", finished},
                         {"jobs-cancelled", cancelled},
                         {"jobs-failed", failed},
                         {"flink-version", kSluiceVersion},
                         {"flink-commit", ""}}));
  });

  // Flink's GET /config: what the web UI needs to know of the server.
  server_->Get("/config", [](const httplib::Request&, httplib::Response& res) {
    const std::time_t t = std::time(nullptr);
    std::tm local{};
    ::localtime_r(&t, &local);
    reply(res, 200,
          Value::object(
              {{"refresh-interval", 3000},
               {"timezone-name", local.tm_zone != nullptr ? local.tm_zone : "UTC"},
               {"timezone-offset", static_cast<int64_t>(local.tm_gmtoff) * 1000},
               {"flink-version", kSluiceVersion},
               {"flink-revision", ""},
               {"features",
                Value::object(
                    {{"web-submit", false}, {"web-cancel", true}, {"web-rescale", false}, {"web-history", false}})}}));
  });

  // Flink's GET /jobmanager/config: the process's configuration, secret values hidden.
  server_->Get("/jobmanager/config", [this](const httplib::Request&, httplib::Response& res) {
    Value list = Value::array();
    std::lock_guard lock(mu_);
    for (const auto& [key, value] : config_)
      list.push_back(Value::object({{"key", key}, {"value", value}}));
    reply(res, 200, list);
  });
  // Flink's GET /jobs/:id/config (JobConfigInfo); "user-config" is the served configuration.
  server_->Get(R"(/jobs/([^/]+)/config)", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    int parallelism = 1;
    std::shared_ptr<const JobPlan> plan;
    Value user = Value::object();
    std::string restart = "default";
    {
      std::lock_guard lock(mu_);
      plan = job->plan;
      for (const auto& [key, value] : config_) {
        user.set(key, value);
        if (key == options::kRestartStrategy.key) restart = value;
      }
    }
    for (const auto& o : plan->operators)
      parallelism = std::max(parallelism, o.parallelism);
    reply(res, 200,
          Value::object({{"jid", job->client.job_id()},
                         {"name", job->name},
                         {"execution-config", Value::object({{"execution-mode", "PIPELINED"},
                                                             {"restart-strategy", restart},
                                                             {"job-parallelism", parallelism},
                                                             {"object-reuse-mode", false},
                                                             {"user-config", std::move(user)}})}}));
  });

  server_->Get("/jobs/overview", [this](const httplib::Request&, httplib::Response& res) {
    Value list = Value::array();
    const int64_t now = now_ms();
    for (const auto& j : jobs_in_order())
      list.push_back(web::job_overview_json(snapshot(*j), now));
    reply(res, 200, Value::object({{"jobs", std::move(list)}}));
  });

  server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    const web::JobSnapshot snap = snapshot(*job);
    const auto vertices = web::vertices_of(snap);
    const JobPlanVertex* v = vertex_or_404(vertices, req, res);
    if (!v) return;
    reply(res, 200, web::vertex_details_json(snap, *v, samples_now(), now_ms()));
  });

  server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/backpressure)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 auto job = job_or_404(req, res);
                 if (!job) return;
                 const web::JobSnapshot snap = snapshot(*job);
                 const auto vertices = web::vertices_of(snap);
                 const JobPlanVertex* v = vertex_or_404(vertices, req, res);
                 if (!v) return;
                 reply(res, 200, web::backpressure_json(snap, *v, samples_now(), now_ms()));
               });

  server_->Get(
      R"(/jobs/([^/]+)/vertices/([^/]+)/metrics)", [this](const httplib::Request& req, httplib::Response& res) {
        auto job = job_or_404(req, res);
        if (!job) return;
        const web::JobSnapshot snap = snapshot(*job);
        const auto vertices = web::vertices_of(snap);
        const JobPlanVertex* v = vertex_or_404(vertices, req, res);
        if (!v) return;
        reply(res, 200, web::metrics_json(web::vertex_metrics(samples_now(), snap.job_id, *v), get_param(req)));
      });

  server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/subtasks/metrics)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 auto job = job_or_404(req, res);
                 if (!job) return;
                 const web::JobSnapshot snap = snapshot(*job);
                 const auto vertices = web::vertices_of(snap);
                 const JobPlanVertex* v = vertex_or_404(vertices, req, res);
                 if (!v) return;
                 reply(res, 200,
                       web::aggregated_metrics_json(web::vertex_metrics(samples_now(), snap.job_id, *v), get_param(req),
                                                    req.has_param("agg") ? req.get_param_value("agg") : ""));
               });

  // Flink's GET /jobs/:id/vertices/:vid/watermarks: each subtask's input watermark (of its chain's head).
  server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/watermarks)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 auto job = job_or_404(req, res);
                 if (!job) return;
                 const web::JobSnapshot snap = snapshot(*job);
                 const auto vertices = web::vertices_of(snap);
                 const JobPlanVertex* v = vertex_or_404(vertices, req, res);
                 if (!v) return;
                 Value list = Value::array();
                 for (const auto& m : snap.subtasks) {
                   if (m.vertex_id != v->index || m.operators.empty()) continue;
                   list.push_back(Value::object({{"id", fmt::format("{}.currentInputWatermark", m.subtask_index)},
                                                 {"value", std::to_string(m.operators.front().input_watermark)}}));
                 }
                 reply(res, 200, list);
               });

  server_->Get(R"(/jobs/([^/]+)/metrics)", [this](const httplib::Request& req, httplib::Response& res) {
    auto job = job_or_404(req, res);
    if (!job) return;
    reply(res, 200, web::metrics_json(web::job_metrics(samples_now(), job->client.job_id()), get_param(req)));
  });
}

}  // namespace sluice
