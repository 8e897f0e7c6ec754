// RestServer::Impl's default GET /metrics and GET /health (without providers) and the metric sampler thread.
#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>

#include "rest_server_internals.h"
#include "sluice/metrics/prometheus_text.h"

namespace sluice {

std::string RestServer::Impl::default_metrics() {
  std::string out;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  struct Row {
    std::string job;
    JobStatus status;
    int restarts;
    std::vector<OperatorStats> operators;
    int64_t completed = 0;
    int64_t failed = 0;
    std::vector<SourceHealth> sources;  // served by serve_source_health (cluster mode)
  };
  std::vector<Row> rows;
  std::vector<std::pair<HealthReport, JobHealthOptions>> health;  // per row
  const int64_t now = now_ms();
  for (const auto& j : jobs_in_order()) {
    health.push_back(job_health(*j, now));
    Row r{metrics::escape_label_value(j->name), j->client.status(), j->client.restarts(), j->client.operator_stats()};
    {
      std::function<std::vector<SourceHealth>()> sources;
      {
        std::lock_guard lock(mu_);
        sources = j->sources;
      }
      if (sources) r.sources = sources();
    }
    if (job_status_terminal(r.status)) {
      JobResult result = j->client.wait();  // returns at once: the job has ended
      if (!result.operators.empty()) r.operators = result.operators;
    }
    for (const auto& cp : j->client.checkpoint_stats()) {
      if (cp.completed) {
        ++r.completed;
      } else if (!cp.failure.empty()) {
        ++r.failed;
      }
    }
    rows.push_back(std::move(r));
  }
  family("sluice_job_running", "gauge", "1 when the job is RUNNING, else 0.");
  for (const auto& r : rows) {
    out += fmt::format("sluice_job_running{{job=\"{}\",status=\"{}\"}} {}\n", r.job, job_status_name(r.status),
                       r.status == JobStatus::kRunning ? 1 : 0);
  }
  family("sluice_job_restarts_total", "counter", "Failover restarts of the job.");
  for (const auto& r : rows)
    out += fmt::format("sluice_job_restarts_total{{job=\"{}\"}} {}\n", r.job, r.restarts);
  family("sluice_operator_records_in_total", "counter", "Records an operator received, over its subtasks.");
  for (const auto& r : rows) {
    for (const auto& o : r.operators) {
      out += fmt::format("sluice_operator_records_in_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", r.job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_in);
    }
  }
  family("sluice_operator_records_out_total", "counter", "Records an operator emitted, over its subtasks.");
  for (const auto& r : rows) {
    for (const auto& o : r.operators) {
      out += fmt::format("sluice_operator_records_out_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", r.job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_out);
    }
  }
  family("sluice_checkpoints_completed", "gauge", "Completed checkpoints among the recent ones kept in history.");
  for (const auto& r : rows)
    out += fmt::format("sluice_checkpoints_completed{{job=\"{}\"}} {}\n", r.job, r.completed);
  family("sluice_checkpoints_failed", "gauge", "Failed checkpoints among the recent ones kept in history.");
  for (const auto& r : rows)
    out += fmt::format("sluice_checkpoints_failed{{job=\"{}\"}} {}\n", r.job, r.failed);
  // What `sluice run`'s /metrics has beside them, so that the alert rules (deploy/monitoring/sluice-alerts.yml)
  // fire on a JobManager as on a pipeline process: the checkpoint age and the consecutive failures against the
  // bounds of /health (a bound that is off is not exported), and /health's verdict.
  family("sluice_job_restarting", "gauge", "1 while the job is RESTARTING (a failure, its backoff, the restart).");
  for (const auto& r : rows)
    out += fmt::format("sluice_job_restarting{{job=\"{}\"}} {}\n", r.job, r.status == JobStatus::kRestarting ? 1 : 0);
  family("sluice_checkpoint_age_ms", "gauge",
         "Time since the last completed checkpoint (since the start before the first), ms.");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (health[i].second.checkpoint_interval_ms > 0)
      out += fmt::format("sluice_checkpoint_age_ms{{job=\"{}\"}} {}\n", rows[i].job, health[i].first.checkpoint_age_ms);
  }
  family("sluice_checkpoints_failed_consecutive", "gauge",
         "The latest checkpoints that failed, counted back to the last completed one (savepoints aside).");
  for (size_t i = 0; i < rows.size(); ++i) {
    out += fmt::format("sluice_checkpoints_failed_consecutive{{job=\"{}\"}} {}\n", rows[i].job,
                       health[i].first.failed_checkpoints_in_a_row);
  }
  family("sluice_health_checkpoint_age_bound_ms", "gauge",
         "health.max-checkpoint-age in force (default 3 x checkpoint interval + 10 s), ms.");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (const int64_t b = health[i].second.checkpoint_age_bound_ms(); b > 0)
      out += fmt::format("sluice_health_checkpoint_age_bound_ms{{job=\"{}\"}} {}\n", rows[i].job, b);
  }
  family("sluice_health_failed_checkpoints_bound", "gauge", "health.max-failed-checkpoints (consecutive).");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (const int b = health[i].second.max_failed_checkpoints; b > 0)
      out += fmt::format("sluice_health_failed_checkpoints_bound{{job=\"{}\"}} {}\n", rows[i].job, b);
  }
  // Each source's lag as its readers' TaskManagers report it (the largest), against the bound below
  // (SluiceSourceLagging). Only for jobs that serve their sources (cluster mode).
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.sources.empty(); })) {
    family("sluice_source_lag_ms", "gauge", "Behind the source's server (ms, -1 unknown), as its readers report it.");
    for (const auto& r : rows) {
      for (const SourceHealth& s : r.sources) {
        out += fmt::format("sluice_source_lag_ms{{job=\"{}\",source=\"{}\"}} {}\n", r.job,
                           metrics::escape_label_value(s.name), s.lag_ms);
      }
    }
  }
  family("sluice_health_source_lag_bound_ms", "gauge", "health.max-source-lag, ms.");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (const int64_t b = health[i].second.max_source_lag_ms; b > 0)
      out += fmt::format("sluice_health_source_lag_bound_ms{{job=\"{}\"}} {}\n", rows[i].job, b);
  }
  family("sluice_job_healthy", "gauge", "1 when /health answers 200 for the job, else 0.");
  for (size_t i = 0; i < rows.size(); ++i) {
    const bool healthy = health[i].first.healthy || health[i].first.status == job_status_name(JobStatus::kFinished);
    out += fmt::format("sluice_job_healthy{{job=\"{}\"}} {}\n", rows[i].job, healthy ? 1 : 0);
  }
  // The registry's Flink-named metrics of the same jobs (task, operator and job scopes).
  out += registry_.prometheus_text();
  return out;
}

std::pair<HealthReport, JobHealthOptions> RestServer::Impl::job_health(const JobEntry& j, int64_t now) {
  std::function<std::vector<SourceHealth>()> sources;
  JobHealthOptions bounds;
  {
    std::lock_guard lock(mu_);
    sources = j.sources;
    bounds = j.health;
  }
  // What a cluster job that is not RUNNING waits for (slots), as GET /jobs says it in status-message.
  const std::string waiting_for = j.status_message ? j.status_message() : std::string();
  return {evaluate_job_health(j.client, bounds, j.start_time_ms, sources ? sources() : std::vector<SourceHealth>{}, now,
                              waiting_for),
          bounds};
}

HealthResponse RestServer::Impl::default_health() {
  // Each job by evaluate_job_health (web/job_health.h) with its bounds (serve_health_options), else those every
  // job has: not RUNNING, a failure within the restart grace, consecutive failed checkpoints (without the job's
  // checkpoint interval, no checkpoint-age bound). A FINISHED job ended as it should and counts as healthy.
  Value jobs = Value::array();
  std::string reason;
  const auto entries = jobs_in_order();
  const int64_t now = now_ms();
  for (const auto& j : entries) {
    const HealthReport h = job_health(*j, now).first;
    const bool healthy = h.healthy || h.status == job_status_name(JobStatus::kFinished);
    Value reasons = Value::array();
    for (const auto& r : h.reasons)
      reasons.push_back(Value::object({{"code", r.code}, {"message", r.message}}));
    jobs.push_back(Value::object({{"id", j->client.job_id()},
                                  {"name", j->name},
                                  {"status", h.status},
                                  {"restarts", h.restarts},
                                  {"healthy", healthy},
                                  {"reasons", healthy ? Value::array() : std::move(reasons)}}));
    if (!healthy && reason.empty()) reason = fmt::format("job '{}' ({}): {}", j->name, j->client.job_id(), h.reason);
  }
  if (entries.empty()) reason = "no job is registered yet";
  const bool healthy = reason.empty();
  return HealthResponse{healthy,
                        Value::object({{"healthy", healthy}, {"reason", reason}, {"jobs", std::move(jobs)}}).to_json()};
}

std::vector<metrics::MetricSample> RestServer::Impl::collect_samples() {
  std::shared_ptr<std::function<std::vector<metrics::MetricSample>()>> external;
  {
    std::lock_guard lock(mu_);
    external = external_samples_;
  }
  return external ? (*external)() : registry_.collect();
}

void RestServer::Impl::sample_metrics() {
  pthread_setname_np(pthread_self(), "sluice-rest-mt");
  std::unique_lock lock(mu_);
  while (!stopping_.load()) {
    if (!jobs_.empty()) {
      lock.unlock();
      collect_samples();  // for the meters' windows only: a request collects its own (samples_now)
      lock.lock();
    }
    sampler_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_.load(); });
  }
}

// Not the sampler's latest: those are up to a second old, and a job that ended within that second would answer
// the counts of while it ran (numRecordsOut 0 next to /jobs/:id's final write-records) until the next tick.
std::vector<metrics::MetricSample> RestServer::Impl::samples_now() {
  return collect_samples();
}

}  // namespace sluice
