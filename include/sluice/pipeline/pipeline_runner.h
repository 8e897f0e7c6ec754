// PipelineRunner: runs a parsed pipeline file as a job on the local mini-cluster (`sluice run`), and reports
// on it: Prometheus metrics and health (DESIGN.md §9; docs/pipelines.md "Operating a pipeline").
//
// The job: source (change events) -> Transform (filter, projection, key, domain event, routes; bad records
// to the dead-letter sink) -> key_by(entity) -> per sink: Route filter -> sink. Operator uids are fixed
// ("source", "transform", "route-<sink>", "sink-<sink>", "dead-letter"), so a pipeline restarted after a crash
// resumes from its checkpoints: start() looks for the latest completed checkpoint under the checkpoint storage
// (every run writes <storage>/<job-id>/chk-<n>) and restores it. A job that FINISHED (a bounded source read
// to its end) leaves a `_finished` marker in its job directory: the next run is a new job that starts over.
// Once a run's job has completed a checkpoint, remove_superseded_checkpoints() deletes earlier runs' job
// directories, so the storage does not grow by one job directory per run.
//
// Thread-safety: start() and wait() from one thread; metrics_text(), health() and status() from any thread
// (the HTTP endpoint calls them).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/connectors/source_connection.h"
#include "sluice/core/config.h"
#include "sluice/core/error.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/pipeline/pipeline_spec.h"
#include "sluice/web/job_health.h"

namespace sluice {
class StreamGraph;
}

namespace sluice::pipeline {

/// The verdict of /health (web/job_health.h, shared with the REST server).
using HealthReport = ::sluice::HealthReport;

class PipelineRunner {
 public:
  /// Builds the job of `spec` (connectors are configured, nothing is started). `engine_overrides` are
  /// Flink-style keys that win over the file (`-D` on the command line). Errors: kConfiguration naming the
  /// file location.
  [[nodiscard]] static Result<std::unique_ptr<PipelineRunner>> create(const PipelineSpec& spec,
                                                                      const Configuration& engine_overrides = {});
  ~PipelineRunner();

  /// Starts the job, resuming from the latest completed checkpoint in the checkpoint storage when there is
  /// one (logged). Errors: kConfiguration / kCheckpoint when the job cannot start.
  [[nodiscard]] Status start();
  /// Blocks until the job ends.
  JobResult wait();
  /// Cancels the job (returns at once; wait() then reports CANCELED).
  void cancel();
  /// The job's status (kCreated before start()).
  JobStatus status() const;
  /// The running job's handle, for the REST API (nullopt before start()).
  std::optional<JobClient> client() const;

  /// Prometheus text exposition format 0.0.4: per operator records in/out, checkpoints (count, failed,
  /// last duration and size, age of the last completed), restarts, job status, pipeline counters and the
  /// source's lag and position gauges.
  std::string metrics_text() const;
  /// The samples of the pipeline's metric registry (the job's Flink-named metrics and its connectors'), for the
  /// REST API's metric views (RestServer::serve_metric_samples). Thread-safe.
  std::vector<metrics::MetricSample> metric_samples() const;
  /// evaluate_job_health() with the pipeline's health.* bounds and its source's lag and connection: every reason
  /// named (job-not-running with the restart count and the latest failure's time and cause, recent-failure,
  /// checkpoint-age, failed-checkpoints, source-lag, source-disconnected). Healthy when none applies.
  HealthReport health() const;
  /// The health bounds in force (from the pipeline's health.* and checkpoint interval).
  JobHealthOptions health_options() const;

  /// The source's reader subtasks open in this process and their connections to its system
  /// (connectors/source_connection.h), with the connector's type and what it reads. `readers` is empty for a
  /// source that reports none (files, datagen) and before its readers open. A cluster's TaskManager sends them to
  /// its JobManager with every heartbeat (its job runs from this runner's graph). Thread-safe.
  struct SourceConnections {
    std::string source;       ///< "kafka", "postgres", "mongodb", ...
    std::string description;  ///< what it reads ("orders", "slot sluice")
    std::vector<SourceConnection> readers;
  };
  SourceConnections source_connections() const;
  /// The source's lag now, as this process's readers measure it (the `source_lag_ms` of /health and
  /// `sluice_source_lag_ms`): ms behind its server, -1 unknown (no reader open here, nothing read yet). A cluster's
  /// TaskManager sends it with every heartbeat. Thread-safe.
  int64_t source_lag_ms() const;

  /// A warning about the transform's filters, with a key that names its kind and filter (stable while the
  /// count in the text changes).
  struct TransformWarning {
    std::string key;
    std::string text;
  };
  /// The filters' warnings now: a field the filter reads that is absent from every one of the (at least 100)
  /// records it saw so far; a filter that dropped every record (at least 100) over the last
  /// health.filter-window, or over the whole run once the job ended. Thread-safe.
  std::vector<TransformWarning> transform_warnings() const;
  /// Logs (warn) each warning of transform_warnings() when it appears; `sluice run` calls it while it waits
  /// for the job and once after it ended. From one thread.
  void log_transform_warnings();

  /// Once this job has completed a checkpoint of its own, deletes the job directories of earlier runs under the
  /// checkpoint storage (`<storage>/<job-id>/`, finished or not): the next run resumes from this job's
  /// checkpoints, so theirs are superseded. Keeps this job's retained checkpoints
  /// (execution.checkpointing.num-retained), savepoints, every entry whose name is not a job id, and the job
  /// directory of a checkpoint given with execution.state-recovery.path. Returns how many directories it deleted
  /// (a failure to delete one is logged, not fatal); returns 0 without looking before the first completed
  /// checkpoint and after it ran once. `sluice run` calls it while it waits for the job. From one thread.
  int remove_superseded_checkpoints();

  /// The job's stream graph as built from the file (cluster mode fingerprints it: every process builds the same
  /// graph). Valid until start(), which hands the graph to the job.
  const StreamGraph& stream_graph() const;

  /// The completed checkpoint the job resumed from ("" on a fresh start).
  const std::string& restored_from() const;
  /// The end-of-run summary: a line with changes in, events out, filtered, unrouted, dead letters, duration,
  /// checkpoints and restarts, then the domain events per type.
  std::string summary(const JobResult& result) const;

 private:
  struct State;
  explicit PipelineRunner(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

/// `sluice validate --sample N`: reads the first `records` change events of the pipeline's `files` source and
/// runs the transform over them (filter, projection, key, event, routes; functions are not run), saying what
/// each step did to each record and, per transform, what its filter kept, dropped and reads that no record
/// has. Errors: kConfiguration when the source is not `files`; kRuntime naming the file and line of a line that
/// is not a change event.
[[nodiscard]] Result<std::string> sample_transforms(const PipelineSpec& spec, int64_t records);

/// The latest completed checkpoint under `storage` (a path or file:// URI): the `chk-<n>` directory whose
/// `_metadata` file was written last, among job directories without a `_finished` marker; "" when none.
std::string find_latest_checkpoint(const std::string& storage);

/// Marks the FINISHED job `job_id` in `storage` (a path, file:// or s3:// URI) so that find_latest_checkpoint
/// skips it: `_finished` when it ended with its input, `_stopped` holding the savepoint's path when `sluice stop`
/// ended it (the next run resumes from that savepoint). `stats` are the job's checkpoints; `pipeline` names it in
/// the log. A marker that cannot be written is logged (the next run would resume the finished job's last
/// checkpoint), not an error. Called by `sluice run` and by a JobManager, once the job finished.
void mark_job_ended(const std::string& storage, const std::string& job_id, const std::vector<CheckpointStats>& stats,
                    const std::string& pipeline);

}  // namespace sluice::pipeline
