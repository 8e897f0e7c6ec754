// Job health: the verdict of `/health` for one job, with every reason it is unhealthy named (docs/operations.md,
// "Health and alerts"). One evaluation shared by `sluice run` (PipelineRunner::health) and the REST server's
// `GET /health` and `GET /jobs/:id/health`, so a pipeline and a job served by the REST API answer alike.
//
// Reasons (each a stable code for scripts and a message for people):
//   job-not-running      the job is CREATED, RESTARTING, FAILING, FAILED, CANCELED or FINISHED (RESTARTING,
//                        FAILING and FAILED name the restart count, the failure's age and its cause)
//   recent-failure       RUNNING again, but the latest failure is younger than restart_grace_ms
//   checkpoint-age       the last completed checkpoint (the start, before the first) is older than the bound
//   failed-checkpoints   max_failed_checkpoints checkpoints in a row failed (the latest ones, savepoints aside)
//   source-lag           a source lags more than max_source_lag_ms
//   source-disconnected  a reader subtask of a source lost its connection to its system (the Kafka cluster, the
//                        Postgres server, ...): named with how long and the connector's reason; no bound (each
//                        connector reports a loss after about 3 s, connectors/source_connection.h)
//
// Pure functions of their arguments and of the JobClient's thread-safe accessors: thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/api/job.h"

namespace sluice {

/// The bounds of /health. Pipelines set them from `health.*` (docs/pipelines.md); the REST server from its
/// Configuration (`health.*` and `execution.checkpointing.interval`, docs/configuration.md).
struct JobHealthOptions {
  int64_t checkpoint_interval_ms = 0;  ///< 0: the job does not checkpoint (no checkpoint-age check)
  int64_t max_checkpoint_age_ms = 0;   ///< 0 = 3 x checkpoint_interval_ms + 10 s
  int max_failed_checkpoints = 3;      ///< consecutive failed checkpoints that make it unhealthy; 0 = off
  int64_t max_source_lag_ms = 0;       ///< 0 = no bound
  int64_t restart_grace_ms = 60'000;   ///< unhealthy this long after a failure, also when RUNNING again; 0 = off

  /// The checkpoint-age bound in force (ms), or 0 when the job does not checkpoint.
  int64_t checkpoint_age_bound_ms() const {
    if (checkpoint_interval_ms <= 0) return 0;
    return max_checkpoint_age_ms > 0 ? max_checkpoint_age_ms : 3 * checkpoint_interval_ms + 10'000;
  }
};

/// What a job's source says of itself (pipelines: from the source connector).
struct SourceHealth {
  std::string name;     ///< "postgres", "kafka", ...
  int64_t lag_ms = -1;  ///< behind its server (ms), -1 unknown
  /// What it reads, for messages ("orders" for Kafka topics, "slot sluice" for Postgres); "" = name.
  std::string description;
  /// A reader subtask that lost its connection.
  struct Disconnected {
    int subtask = 0;
    int64_t for_ms = 0;  ///< how long (ms)
    std::string reason;  ///< the connector's ("no broker of '...' answers: all brokers down (...)")
    /// Cluster mode: the resource id of the TaskManager that runs the reader ("" in one process).
    std::string task_manager;
  };
  std::vector<Disconnected> disconnected;
};

/// One reason a job is unhealthy.
struct HealthReason {
  std::string
      code;  ///< job-not-running, recent-failure, checkpoint-age, failed-checkpoints, source-lag, source-disconnected
  std::string message;  ///< what and how much, with the bound and the option that sets it
};

/// The verdict of /health.
struct HealthReport {
  bool healthy = false;
  std::string status;                   ///< the job's status ("RUNNING", "FAILED", ...)
  std::string reason;                   ///< every reason's message joined by "; " ("" when healthy)
  std::vector<HealthReason> reasons;    ///< why unhealthy, the most fundamental first (empty when healthy)
  int64_t checkpoint_age_ms = -1;       ///< since the last completed checkpoint (or since the start), -1 unknown
  int failed_checkpoints_in_a_row = 0;  ///< the latest checkpoints that failed, counted back to a completed one
  int64_t source_lag_ms = -1;           ///< the largest over the sources, -1 unknown
  int restarts = 0;                     ///< failover restarts so far
  std::string last_failure;             ///< the latest failure's message ("" when none)
  int64_t last_failure_ms = -1;         ///< when it happened (ms since the epoch), -1 when none
  /// What looks wrong without making the job unhealthy (a pipeline's filter that reads a field no record had,
  /// or that dropped every record of health.filter-window).
  std::vector<std::string> warnings;

  /// {"healthy","status","reason","reasons":[{"code","message"}],"checkpoint_age_ms",
  /// "failed_checkpoints_in_a_row","source_lag_ms","restarts","last_failure","last_failure_ms","warnings"}
  std::string to_json() const;
};

/// Consecutive failed checkpoints at the end of `history` (oldest first, as JobClient::checkpoint_stats returns
/// it): failed checkpoints counted back from the newest to the latest completed one; savepoints and checkpoints in
/// progress are passed over.
int failed_checkpoints_in_a_row(const std::vector<CheckpointStats>& history);

/// Evaluates the health of `job` at `now_ms` (ms since the epoch). `started_ms` is when the job started (the
/// checkpoint age before the first completed checkpoint counts from it); `sources` may be empty (a job whose
/// sources report nothing: no source-lag check). `waiting_for`, when not empty, says what a job that is not RUNNING
/// waits for (a cluster job's "waiting for TaskManagers: needs 4 slots, 2 registered"): job-not-running names it.
HealthReport evaluate_job_health(const JobClient& job, const JobHealthOptions& options, int64_t started_ms,
                                 const std::vector<SourceHealth>& sources, int64_t now_ms,
                                 const std::string& waiting_for = "");

}  // namespace sluice
