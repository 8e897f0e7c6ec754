// The pipeline runner's metrics: the registry's dead-letter, connector and job metrics and metrics_text
// (GET /metrics of `sluice run`).
#include "pipeline_runner_internals.h"

namespace sluice::pipeline {

std::vector<metrics::MetricSample> PipelineRunner::metric_samples() const {
  return s_->registry.collect();
}

std::string PipelineRunner::metrics_text() const {
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  const std::string job = metrics::escape_label_value(s_->spec.pipeline.name);
  std::string out;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const JobStatus st = c ? c->status() : JobStatus::kCreated;
  family("sluice_job_running", "gauge", "1 when the job is RUNNING, else 0.");
  out += fmt::format("sluice_job_running{{job=\"{}\",status=\"{}\"}} {}\n", job, job_status_name(st),
                     st == JobStatus::kRunning ? 1 : 0);
  if (c) {
    const std::vector<OperatorStats> ops = c->operator_stats();
    family("sluice_operator_records_in_total", "counter", "Records an operator received, over its subtasks.");
    for (const auto& o : ops) {
      out += fmt::format("sluice_operator_records_in_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_in);
    }
    family("sluice_operator_records_out_total", "counter", "Records an operator emitted, over its subtasks.");
    for (const auto& o : ops) {
      out += fmt::format("sluice_operator_records_out_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_out);
    }
    family("sluice_sink_dead_letters_total", "counter",
           "Records a sink refused and wrote to its dead-letter file (too large for Kafka, failed bulk items, rows "
           "Postgres refuses).");
    for (const auto& d : s_->sink_dead_letters) {
      out += fmt::format("sluice_sink_dead_letters_total{{job=\"{}\",sink=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(d.sink), d.count());
    }
    family("sluice_job_restarts_total", "counter", "Failover restarts of the job.");
    out += fmt::format("sluice_job_restarts_total{{job=\"{}\"}} {}\n", job, c->restarts());
    family("sluice_job_restarting", "gauge", "1 while the job is RESTARTING (a failure, its backoff, the restart).");
    out += fmt::format("sluice_job_restarting{{job=\"{}\"}} {}\n", job, st == JobStatus::kRestarting ? 1 : 0);
    const std::vector<JobExceptionInfo> failures = c->exceptions();
    family("sluice_job_last_failure_timestamp_ms", "gauge", "When the job's latest failure happened (-1 none).");
    out += fmt::format("sluice_job_last_failure_timestamp_ms{{job=\"{}\"}} {}\n", job,
                       failures.empty() ? -1 : failures[0].timestamp_ms);
    const std::vector<CheckpointStats> cps = c->checkpoint_stats();
    int64_t completed = 0, failed = 0, last_duration = -1, last_completed_ms = -1;
    uint64_t last_size = 0;
    for (const auto& cp : cps) {
      if (cp.completed) {
        ++completed;
        last_duration = cp.duration_ms;
        last_size = cp.state_bytes;
        last_completed_ms = cp.trigger_time_ms + cp.duration_ms;
      } else if (!cp.failure.empty()) {
        ++failed;
      }
    }
    family("sluice_checkpoints_completed", "gauge", "Completed checkpoints among the recent ones kept in history.");
    out += fmt::format("sluice_checkpoints_completed{{job=\"{}\"}} {}\n", job, completed);
    family("sluice_checkpoints_failed", "gauge", "Failed checkpoints among the recent ones kept in history.");
    out += fmt::format("sluice_checkpoints_failed{{job=\"{}\"}} {}\n", job, failed);
    family("sluice_checkpoint_last_duration_ms", "gauge", "Duration of the last completed checkpoint (ms).");
    out += fmt::format("sluice_checkpoint_last_duration_ms{{job=\"{}\"}} {}\n", job, last_duration);
    family("sluice_checkpoint_last_size_bytes", "gauge", "State size of the last completed checkpoint (bytes).");
    out += fmt::format("sluice_checkpoint_last_size_bytes{{job=\"{}\"}} {}\n", job, last_size);
    family("sluice_checkpoint_age_ms", "gauge",
           "Time since the last completed checkpoint (since the start before the first), ms.");
    out += fmt::format("sluice_checkpoint_age_ms{{job=\"{}\"}} {}\n", job,
                       wall_ms() - (last_completed_ms >= 0 ? last_completed_ms : s_->start_wall_ms));
    family("sluice_checkpoints_failed_consecutive", "gauge",
           "The latest checkpoints that failed, counted back to the last completed one (savepoints aside).");
    out +=
        fmt::format("sluice_checkpoints_failed_consecutive{{job=\"{}\"}} {}\n", job, failed_checkpoints_in_a_row(cps));
  }
  // The bounds of /health, so that alert rules (deploy/monitoring/sluice-alerts.yml) fire on the same conditions
  // as /health without repeating each job's settings. A bound that is off is not exported.
  const JobHealthOptions bounds = health_options();
  if (const int64_t b = bounds.checkpoint_age_bound_ms(); b > 0) {
    family("sluice_health_checkpoint_age_bound_ms", "gauge",
           "health.max-checkpoint-age in force (default 3 x checkpoint interval + 10 s), ms.");
    out += fmt::format("sluice_health_checkpoint_age_bound_ms{{job=\"{}\"}} {}\n", job, b);
  }
  if (bounds.max_failed_checkpoints > 0) {
    family("sluice_health_failed_checkpoints_bound", "gauge", "health.max-failed-checkpoints (consecutive).");
    out += fmt::format("sluice_health_failed_checkpoints_bound{{job=\"{}\"}} {}\n", job, bounds.max_failed_checkpoints);
  }
  if (bounds.max_source_lag_ms > 0) {
    family("sluice_health_source_lag_bound_ms", "gauge", "health.max-source-lag, ms.");
    out += fmt::format("sluice_health_source_lag_bound_ms{{job=\"{}\"}} {}\n", job, bounds.max_source_lag_ms);
  }
  {
    const HealthReport h = health();
    family("sluice_job_healthy", "gauge", "1 when /health answers 200, else 0.");
    out += fmt::format("sluice_job_healthy{{job=\"{}\"}} {}\n", job, h.healthy ? 1 : 0);
  }
  const PipelineCounters& k = *s_->counters;
  auto counter = [&](std::string_view name, std::string_view help, int64_t v) {
    family(name, "counter", help);
    out += fmt::format("{}{{job=\"{}\"}} {}\n", name, job, v);
  };
  counter("sluice_pipeline_changes_total", "Change events that reached the transform.", k.changes_in.load());
  counter("sluice_pipeline_events_total", "Domain events emitted by the transform.", k.events_out.load());
  counter("sluice_pipeline_filtered_total", "Change events dropped by a filter.", k.filtered.load());
  counter("sluice_pipeline_unrouted_events_total", "Events that matched no route.", k.unrouted.load());
  counter("sluice_pipeline_dead_letters_total", "Records the transform sent to the dead-letter sink.",
          k.dead_letters.load());
  counter("sluice_pipeline_kafka_tombstones_total",
          "Tombstones (null values) Kafka sinks wrote after delete events (tombstones-on-delete).",
          k.tombstones.load());
  family("sluice_source_lag_ms", "gauge", "Now minus the source timestamp of the latest change (-1 unknown).");
  out += fmt::format("sluice_source_lag_ms{{job=\"{}\",source=\"{}\"}} {}\n", job,
                     metrics::escape_label_value(s_->probe.type), s_->probe.lag_ms(wall_ms()));
  if (s_->probe.gauges) {
    for (const auto& [name, v] : s_->probe.gauges()) {
      family(name, "gauge", "Reported by the source connector.");
      out +=
          fmt::format("{}{{job=\"{}\",source=\"{}\"}} {}\n", name, job, metrics::escape_label_value(s_->probe.type), v);
    }
  }
  out += s_->registry.prometheus_text();
  return out;
}

}  // namespace sluice::pipeline
