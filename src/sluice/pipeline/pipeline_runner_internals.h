// Private to src/sluice/pipeline/: what the files of PipelineRunner share: its State and the helpers several
// of them use. Not installed; pipeline_runner.h describes the runner.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "pipeline_internal.h"
#include "sluice/api/stream_environment.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/dead_letter_counts.h"
#include "sluice/connectors/files.h"
#include "sluice/core/s3_client.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/metrics/prometheus_text.h"
#include "sluice/pipeline/pipeline_runner.h"

namespace sluice::pipeline {

namespace fs = std::filesystem;
using detail::ConnectorMetric;
using detail::PipelineCounters;
using detail::RoutedEvent;
using detail::SourceProbe;

namespace pipeline_runner_internal {

int64_t wall_ms();

// Written into a job's checkpoint directory when the job FINISHED (find_latest_checkpoint skips it).
constexpr const char* kFinishedMarker = "_finished";

// Written instead when the job FINISHED through `sluice stop` (stop-with-savepoint); holds the savepoint's path,
// which the next run resumes from: a stop is a pause, not the end of a CDC job's stream.
constexpr const char* kStoppedMarker = "_stopped";

std::string storage_path(const std::string& storage);

}  // namespace pipeline_runner_internal

using pipeline_runner_internal::kFinishedMarker;
using pipeline_runner_internal::kStoppedMarker;
using pipeline_runner_internal::storage_path;
using pipeline_runner_internal::wall_ms;

struct PipelineRunner::State {
  PipelineSpec spec;
  Configuration config;
  std::unique_ptr<StreamEnvironment> env;
  std::shared_ptr<PipelineCounters> counters = std::make_shared<PipelineCounters>();
  SourceProbe probe;
  std::string restored_from;
  std::string dead_letter_dir;
  // Per sink: its dead-letter file (records it refused: too large for Kafka, failed bulk items, rows Postgres
  // refuses) and how many records the process had appended to that file before this run.
  struct SinkDeadLetters {
    std::string sink;
    std::string path;
    int64_t before = 0;
    std::map<std::string, int64_t> before_by_reason;
    int64_t count() const { return dead_letters_appended(path) - before; }
  };
  std::vector<SinkDeadLetters> sink_dead_letters;
  std::map<std::string, int64_t> source_dead_letters_before;  // by reason, at the start of this run
  int dead_letter_hook = -1;  // registry's refresh hook adding a series per new dead-letter reason
  int64_t start_wall_ms = 0;
  mutable std::mutex mu;
  std::optional<JobClient> client;
  int lock_fd = -1;                 // flock(2)ed while the runner lives: one run per checkpoint storage
  bool superseded_removed = false;  // remove_superseded_checkpoints() ran (once per run)
  std::string kept_job_dir;         // the job directory of an explicit execution.state-recovery.path, kept
  // Flink-named metrics of the job (metrics/), appended to metrics_text(); the job's registration goes before
  // the registry.
  metrics::MetricRegistry registry;
  std::unique_ptr<metrics::JobMetrics> job_metrics;
  // The filters' (seen, kept) counts over time, for the window of health.filter-window; guarded by diag_mu.
  struct FilterSnapshot {
    int64_t at_ms;
    std::vector<std::pair<int64_t, int64_t>> counts;  // per transform: seen, kept
  };
  mutable std::mutex diag_mu;
  mutable std::vector<FilterSnapshot> filter_history;
  std::set<std::string> logged_warnings;  // keys logged and still present (log_transform_warnings' thread)

  /// The source's lag, for /health.
  std::vector<SourceHealth> source_health(int64_t now) const;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (dead_letter_hook >= 0) registry.remove_refresh_hook(dead_letter_hook);
    if (lock_fd >= 0) ::close(lock_fd);
  }
};

}  // namespace sluice::pipeline
