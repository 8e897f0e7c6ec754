#include "sluice/web/job_health.h"

#include <fmt/format.h>

#include <algorithm>

#include "sluice/core/redact.h"
#include "sluice/core/value.h"

namespace sluice {

std::string HealthReport::to_json() const {
  Value list = Value::array();
  for (const auto& r : reasons)
    list.push_back(Value::object({{"code", Value(r.code)}, {"message", Value(r.message)}}));
  Value warned = Value::array();
  for (const auto& w : warnings)
    warned.push_back(Value(w));
  return Value::object({{"healthy", Value(healthy)},
                        {"status", Value(status)},
                        {"reason", Value(reason)},
                        {"reasons", std::move(list)},
                        {"checkpoint_age_ms", Value(checkpoint_age_ms)},
                        {"failed_checkpoints_in_a_row", Value(failed_checkpoints_in_a_row)},
                        {"source_lag_ms", Value(source_lag_ms)},
                        {"restarts", Value(restarts)},
                        {"last_failure", last_failure_ms >= 0 ? Value(last_failure) : Value()},
                        {"last_failure_ms", Value(last_failure_ms)},
                        {"warnings", std::move(warned)}})
      .to_json();
}

int failed_checkpoints_in_a_row(const std::vector<CheckpointStats>& history) {
  int n = 0;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (it->type != "checkpoint") continue;
    if (it->completed) break;
    if (!it->failure.empty()) ++n;
  }
  return n;
}

HealthReport evaluate_job_health(const JobClient& job, const JobHealthOptions& o, int64_t started_ms,
                                 const std::vector<SourceHealth>& sources, int64_t now,
                                 const std::string& waiting_for) {
  HealthReport h;
  const JobStatus st = job.status();
  h.status = job_status_name(st);
  auto add = [&h](std::string code, std::string message) {
    h.reasons.push_back(HealthReason{std::move(code), std::move(message)});
  };
  h.restarts = job.restarts();
  if (const std::vector<JobExceptionInfo> failures = job.exceptions(); !failures.empty()) {
    // Redacted as the REST API's failure causes are: /health is read by anyone who can reach the port.
    h.last_failure = redact_secrets(failures[0].message);
    h.last_failure_ms = failures[0].timestamp_ms;
  }
  const std::vector<CheckpointStats> history = job.checkpoint_stats();
  if (o.checkpoint_interval_ms > 0) {
    int64_t last = started_ms;
    for (const auto& cp : history) {
      if (cp.completed) last = std::max(last, cp.trigger_time_ms + cp.duration_ms);
    }
    h.checkpoint_age_ms = now - last;
  }
  h.failed_checkpoints_in_a_row = failed_checkpoints_in_a_row(history);
  for (const auto& s : sources)
    h.source_lag_ms = std::max(h.source_lag_ms, s.lag_ms);

  if (st != JobStatus::kRunning) {
    std::string m = fmt::format("the job is {}", h.status);
    if ((st == JobStatus::kRestarting || st == JobStatus::kFailing || st == JobStatus::kFailed) &&
        h.last_failure_ms >= 0) {
      m += fmt::format(" (restart {}) after a failure {} ms ago: {}", h.restarts, now - h.last_failure_ms,
                       h.last_failure);
    }
    if (!waiting_for.empty()) m += "; " + waiting_for;
    add("job-not-running", std::move(m));
  } else if (o.restart_grace_ms > 0 && h.last_failure_ms >= 0 && now - h.last_failure_ms < o.restart_grace_ms) {
    // A job that failed recently is not healthy, even while an attempt runs: in a restart loop each attempt is
    // RUNNING for a while (re-reading, re-decoding) before it fails again, and /health must not flap green then.
    add("recent-failure",
        fmt::format("the job failed {} ms ago (restart {}) and runs again, but counts as healthy only after {} ms "
                    "without a failure (health.restart-grace); the failure: {}",
                    now - h.last_failure_ms, h.restarts, o.restart_grace_ms, h.last_failure));
  }
  // Checked in every state: a FAILED or RESTARTING job does not checkpoint either, and the age says for how long.
  if (const int64_t bound = o.checkpoint_age_bound_ms(); bound > 0 && h.checkpoint_age_ms > bound) {
    add("checkpoint-age", fmt::format("the last completed checkpoint is {} ms old (bound {} ms, "
                                      "health.max-checkpoint-age)",
                                      h.checkpoint_age_ms, bound));
  }
  if (o.max_failed_checkpoints > 0 && h.failed_checkpoints_in_a_row >= o.max_failed_checkpoints) {
    std::string last_cause;
    for (auto it = history.rbegin(); it != history.rend(); ++it) {
      if (it->type == "checkpoint" && !it->completed && !it->failure.empty()) {
        last_cause = redact_secrets(it->failure);
        break;
      }
    }
    add("failed-checkpoints", fmt::format("the last {} checkpoints failed (bound {}, health.max-failed-checkpoints); "
                                          "the latest: {}",
                                          h.failed_checkpoints_in_a_row, o.max_failed_checkpoints, last_cause));
  }
  for (const auto& s : sources) {
    if (o.max_source_lag_ms > 0 && s.lag_ms > o.max_source_lag_ms) {
      add("source-lag",
          fmt::format("the {} source{} lags {} ms behind (bound {} ms, health.max-source-lag)", s.name,
                      s.description.empty() ? "" : " '" + s.description + "'", s.lag_ms, o.max_source_lag_ms));
    }
  }
  for (const auto& s : sources) {
    for (const auto& d : s.disconnected) {
      add("source-disconnected",
          fmt::format("source '{}' ({}) disconnected for {:.1f} s (subtask {}{}): {}",
                      s.description.empty() ? s.name : s.description, s.name, static_cast<double>(d.for_ms) / 1000.0,
                      d.subtask, d.task_manager.empty() ? "" : " on TaskManager " + d.task_manager,
                      redact_secrets(d.reason)));
    }
  }
  h.healthy = h.reasons.empty();
  for (const auto& r : h.reasons) {
    if (!h.reason.empty()) h.reason += "; ";
    h.reason += r.message;
  }
  return h;
}

}  // namespace sluice
