// The pipeline runner's health: transform warnings (filters that drop everything, ...), the sources' lag
// and connections, and health() (/health of `sluice run`).
#include "pipeline_runner_internals.h"

namespace sluice::pipeline {

std::vector<PipelineRunner::TransformWarning> PipelineRunner::transform_warnings() const {
  constexpr int64_t kMinRecords = 100;  // "after some records": fewer say little about a filter
  const PipelineCounters& k = *s_->counters;
  const int64_t now = wall_ms();
  const bool ended = job_status_terminal(status());
  std::vector<std::pair<int64_t, int64_t>> counts;
  for (const auto& f : k.filters) {
    counts.emplace_back(f ? f->seen.load(std::memory_order_relaxed) : 0,
                        f ? f->kept.load(std::memory_order_relaxed) : 0);
  }
  // The window's start: the newest snapshot at least a window old (snapshots are taken at most once a second).
  std::vector<std::pair<int64_t, int64_t>> base;
  int64_t base_at = -1;
  {
    std::lock_guard lock(s_->diag_mu);
    auto& hist = s_->filter_history;
    if (hist.empty() || now - hist.back().at_ms >= 1000) hist.push_back({now, counts});
    const int64_t window = s_->spec.pipeline.health_filter_window_ms;
    size_t keep_from = 0;
    for (size_t i = 0; i < hist.size(); ++i) {
      if (now - hist[i].at_ms >= window) keep_from = i;
    }
    if (now - hist[keep_from].at_ms >= window) {
      base = hist[keep_from].counts;
      base_at = hist[keep_from].at_ms;
    }
    hist.erase(hist.begin(), hist.begin() + static_cast<std::ptrdiff_t>(keep_from));
  }
  std::vector<TransformWarning> out;
  for (size_t i = 0; i < k.filters.size(); ++i) {
    const detail::FilterStats* f = k.filters[i].get();
    if (f == nullptr) continue;
    const TransformSpec& t = s_->spec.transforms[i];
    const std::string which = fmt::format("transform #{} (match '{}', line {})", i + 1, t.match, t.mark.line);
    const int64_t seen = counts[i].first;
    const int64_t kept = counts[i].second;
    if (seen >= kMinRecords) {
      for (size_t p = 0; p < f->paths.size(); ++p) {
        if (f->present[p].load(std::memory_order_relaxed) > 0) continue;
        out.push_back({fmt::format("absent:{}:{}", i, f->paths[p]),
                       fmt::format("{}: the filter '{}' reads '{}', which is absent from all {} records it saw so far "
                                   "(a typo?); the records have {}",
                                   which, t.filter->text(), f->paths[p], seen, f->sample_fields())});
      }
    }
    if (ended && base_at < 0 && seen >= kMinRecords && kept == 0) {
      out.push_back({fmt::format("dropped:{}", i), fmt::format("{}: the filter '{}' dropped all {} records of the run",
                                                               which, t.filter->text(), seen)});
    } else if (base_at >= 0 && i < base.size() && seen - base[i].first >= kMinRecords && kept == base[i].second) {
      out.push_back({fmt::format("dropped:{}", i),
                     fmt::format("{}: the filter '{}' dropped all {} records of the last {} s (health.filter-window)",
                                 which, t.filter->text(), seen - base[i].first, (now - base_at) / 1000)});
    }
  }
  return out;
}

void PipelineRunner::log_transform_warnings() {
  std::set<std::string> now;
  for (const TransformWarning& w : transform_warnings()) {
    now.insert(w.key);
    if (!s_->logged_warnings.contains(w.key)) {
      spdlog::warn("pipeline '{}': {}", s_->spec.pipeline.name, w.text);
    }
  }
  s_->logged_warnings = std::move(now);
}

JobHealthOptions PipelineRunner::health_options() const {
  const PipelineSettings& p = s_->spec.pipeline;
  JobHealthOptions o;
  o.checkpoint_interval_ms = p.checkpoint_interval_ms;
  o.max_checkpoint_age_ms = p.health_max_checkpoint_age_ms;
  o.max_failed_checkpoints = p.health_max_failed_checkpoints;
  o.max_source_lag_ms = p.health_max_source_lag_ms;
  o.restart_grace_ms = p.health_restart_grace_ms;
  return o;
}

std::vector<SourceHealth> PipelineRunner::State::source_health(int64_t now) const {
  SourceHealth s;
  s.name = probe.type;
  s.description = probe.description;
  s.lag_ms = probe.lag_ms ? probe.lag_ms(now) : -1;
  if (probe.connections) {
    for (const SourceConnection& c : probe.connections()) {
      if (!c.connected) s.disconnected.push_back(SourceHealth::Disconnected{c.subtask, c.disconnected_ms, c.reason});
    }
  }
  return {s};
}

PipelineRunner::SourceConnections PipelineRunner::source_connections() const {
  SourceConnections out{s_->probe.type, s_->probe.description, {}};
  if (s_->probe.connections) out.readers = s_->probe.connections();
  return out;
}

int64_t PipelineRunner::source_lag_ms() const {
  return s_->probe.lag_ms ? s_->probe.lag_ms(wall_ms()) : -1;
}

HealthReport PipelineRunner::health() const {
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  const int64_t now = wall_ms();
  if (!c) {
    HealthReport h;
    h.status = job_status_name(JobStatus::kCreated);
    h.reasons.push_back(HealthReason{"job-not-running", "the job is CREATED"});
    h.reason = h.reasons.back().message;
    return h;
  }
  HealthReport h = evaluate_job_health(*c, health_options(), s_->start_wall_ms, s_->source_health(now), now);
  for (const TransformWarning& w : transform_warnings())
    h.warnings.push_back(w.text);
  return h;
}

}  // namespace sluice::pipeline
