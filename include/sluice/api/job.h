// What running a job returns: its status, per-operator counters and duration (JobResult), and a handle to a
// job running in the background (JobClient).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"

namespace sluice {

/// Flink's job states, reduced to those a local job goes through. RESTARTING: a failover region failed and
/// waits for its restart under the restart strategy (or is being redeployed); the job turns RUNNING again once
/// every region runs. FAILING: the restart strategy gave up (or the job cannot restart) and the job's tasks are
/// being cancelled; FAILED follows.
/// kSuspended (Flink's SUSPENDED): this JobManager stopped the job at its shutdown with high availability; it is
/// not globally terminal, a new leader resumes it from its latest checkpoint (docs/high-availability.md).
enum class JobStatus { kCreated, kRunning, kRestarting, kFailing, kFinished, kFailed, kCanceled, kSuspended };
/// Flink's name of the status ("RUNNING", "RESTARTING", ...).
const char* job_status_name(JobStatus s);
/// FINISHED, FAILED or CANCELED: the job ended and its status will not change (Flink's isGloballyTerminalState).
inline bool job_status_terminal(JobStatus s) {
  return s == JobStatus::kFinished || s == JobStatus::kFailed || s == JobStatus::kCanceled;
}

/// One failure of a job: an entry of Flink's exception history (GET /jobs/:id/exceptions).
struct JobExceptionInfo {
  std::string exception_name;    ///< the error's class (error_code_name: "runtime", "connector", ...)
  std::string message;           ///< the error's message
  std::string stacktrace;        ///< the message with its causes (Error::to_string)
  TimestampMs timestamp_ms = 0;  ///< when the job learned of it (the job's Clock, ms since the epoch)
  std::string task_name;         ///< "Map -> Sink (2/4)"; "" for a failure of no single task (a checkpoint)
  bool restarted = false;        ///< the restart strategy allowed a restart after it
};

/// Counters of one operator summed over its subtasks.
struct OperatorStats {
  std::string name;
  std::string uid;
  int parallelism = 1;
  uint64_t records_in = 0;
  uint64_t records_out = 0;
};

/// Metrics of one chained operator in one subtask (Flink's operator scope).
struct OperatorSubtaskMetrics {
  std::string name;
  std::string uid;
  uint64_t records_in = 0;      ///< numRecordsIn, summed over the subtask's attempts
  uint64_t records_out = 0;     ///< numRecordsOut, summed over the subtask's attempts
  bool network_output = false;  ///< its records leave the task over the network (not only to chained operators)
  TimestampMs input_watermark = std::numeric_limits<int64_t>::min();   ///< currentInputWatermark (live attempt)
  TimestampMs output_watermark = std::numeric_limits<int64_t>::min();  ///< currentOutputWatermark (live attempt)
};

/// Metrics of one subtask of a job vertex (Flink's task scope). Counters and times are summed over the
/// subtask's attempts (they never decrease between calls); watermarks are the live attempt's.
struct SubtaskMetrics {
  int vertex_id = 0;
  std::string task_name;  ///< the vertex's name: "Source: x -> Map"
  int subtask_index = 0;  ///< 0-based
  int parallelism = 1;
  int attempt = 0;       ///< the current (or last) attempt number
  bool running = false;  ///< a thread of this subtask runs now
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  int64_t run_ns = 0;                             ///< time its threads have run
  int64_t idle_ns = 0;                            ///< of which waiting for input
  int64_t backpressured_ns = 0;                   ///< of which blocked on output credit
  std::vector<OperatorSubtaskMetrics> operators;  ///< the chain, head first
};

/// The task's numRecordsOut (Flink's task scope, the REST API's write-records): what its chain sends to other
/// tasks, the records out of its operators whose output leaves the task. The chain's tail is not always that
/// operator: a dead-letter sink chained to a transform's side output comes last in the chain. A chain with no
/// such operator (one ending in a sink) reports its tail's.
inline uint64_t task_records_out(const SubtaskMetrics& m) {
  uint64_t out = 0;
  bool any = false;
  for (const auto& op : m.operators) {
    if (!op.network_output) continue;
    out += op.records_out;
    any = true;
  }
  if (any || m.operators.empty()) return out;
  return m.operators.back().records_out;
}

/// Checkpoints (and savepoints) since the job started: Flink's numberOfCompletedCheckpoints and
/// numberOfFailedCheckpoints, which, unlike checkpoint_stats(), are not bounded by the history's length.
struct CheckpointCounts {
  int64_t completed = 0;
  int64_t failed = 0;
};

/// Timings of one subtask in one checkpoint.
struct TaskCheckpointStats {
  std::string task;           ///< "Map -> Sink (2/4)"
  int64_t alignment_ns = 0;   ///< first to last barrier (exactly-once alignment)
  int64_t sync_pause_ns = 0;  ///< processing paused for the synchronous part of the snapshot
  uint64_t state_bytes = 0;   ///< bytes written for this subtask
};

/// One checkpoint or savepoint as the coordinator saw it (Flink's checkpoint statistics).
struct CheckpointStats {
  int64_t checkpoint_id = 0;
  std::string type;  ///< "checkpoint", "savepoint" or "stop-with-savepoint"
  TimestampMs trigger_time_ms = 0;
  int64_t duration_ms = 0;   ///< trigger to completion (or abort)
  uint64_t state_bytes = 0;  ///< all state files (incremental checkpoints: with the shared files they reference)
  /// Bytes this checkpoint wrote (Flink's checkpointed size): state files plus newly uploaded shared files.
  uint64_t checkpointed_bytes = 0;
  bool completed = false;
  std::string failure;  ///< why it was aborted (empty when completed)
  std::string path;     ///< its directory once completed
  std::vector<TaskCheckpointStats> tasks;
};

/// The outcome of a job.
struct JobResult {
  std::string job_id;
  std::string job_name;
  JobStatus status = JobStatus::kCreated;
  std::optional<Error> error;  ///< set when status is kFailed
  std::chrono::milliseconds duration{0};
  std::vector<OperatorStats> operators;  ///< in graph order; counts summed over every attempt
  int restarts = 0;                      ///< failover restarts (of any region)
  int64_t completed_checkpoints = 0;
  std::string latest_checkpoint_path;  ///< the last completed checkpoint or savepoint ("" when none)

  bool ok() const { return status == JobStatus::kFinished; }
  /// The stats of the first operator with this name, or nullptr.
  const OperatorStats* find(const std::string& operator_name) const {
    for (const auto& o : operators) {
      if (o.name == operator_name) return &o;
    }
    return nullptr;
  }
};

/// A handle to a submitted job. Thread-safe.
class JobClient {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual const std::string& job_id() const = 0;
    virtual JobStatus status() const = 0;
    virtual void cancel() = 0;
    virtual JobResult wait() = 0;
    virtual bool wait_for(std::chrono::milliseconds timeout) = 0;
    virtual std::future<Result<std::string>> trigger_savepoint(std::string target_dir, bool terminate) = 0;
    virtual std::vector<CheckpointStats> checkpoint_stats() const = 0;
    virtual int restarts() const = 0;
    virtual std::vector<OperatorStats> operator_stats() const { return {}; }
    virtual std::vector<JobExceptionInfo> exceptions() const { return {}; }
    virtual std::vector<SubtaskMetrics> subtask_metrics() const { return {}; }
    virtual CheckpointCounts checkpoint_counts() const { return {}; }
  };
  explicit JobClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  const std::string& job_id() const { return impl_->job_id(); }
  JobStatus status() const { return impl_->status(); }
  /// Asks every task to stop; returns at once. wait() then reports kCanceled.
  void cancel() { impl_->cancel(); }
  /// Blocks until the job ends and every task thread has exited; returns the result (idempotent).
  JobResult wait() { return impl_->wait(); }
  /// Waits up to `timeout` for the job to end; true when it has.
  bool wait_for(std::chrono::milliseconds timeout) { return impl_->wait_for(timeout); }
  /// Takes a savepoint into `target_dir` (file:///path or a path; "" = execution.checkpointing.savepoint-dir)
  /// while the job keeps running. The future yields the savepoint's directory, or the error that aborted it.
  std::future<Result<std::string>> trigger_savepoint(std::string target_dir = {}) {
    return impl_->trigger_savepoint(std::move(target_dir), false);
  }
  /// Stop-with-savepoint (Flink's `stop`): sources stop right after the savepoint's barrier, the savepoint
  /// completes, sinks commit, and the job ends FINISHED without draining (no final watermark). The future
  /// yields the savepoint's directory; if the savepoint fails the job fails over to its latest checkpoint.
  std::future<Result<std::string>> stop_with_savepoint(std::string target_dir = {}) {
    return impl_->trigger_savepoint(std::move(target_dir), true);
  }
  /// Statistics of recent checkpoints and savepoints, oldest first.
  std::vector<CheckpointStats> checkpoint_stats() const { return impl_->checkpoint_stats(); }
  /// Failover restarts so far.
  int restarts() const { return impl_->restarts(); }
  /// Per-operator counters while the job runs, in graph order, summed over subtasks and attempts. Never
  /// decrease between calls (fit for Prometheus counters); the final JobResult::operators may be larger.
  std::vector<OperatorStats> operator_stats() const { return impl_->operator_stats(); }
  /// The job's recent failures, newest first: at most kMaxExceptionHistory (Flink's web.exception-history-size
  /// default), each also logged at error level when it happened.
  std::vector<JobExceptionInfo> exceptions() const { return impl_->exceptions(); }
  static constexpr size_t kMaxExceptionHistory = 16;
  /// Per-subtask metrics (task and operator scope, Flink's names in metrics/), vertex by vertex, subtask by
  /// subtask. Cheap: reads the tasks' single-writer counters under the job's lock, no task is stopped.
  std::vector<SubtaskMetrics> subtask_metrics() const { return impl_->subtask_metrics(); }
  /// Checkpoints completed and failed since the job started.
  CheckpointCounts checkpoint_counts() const { return impl_->checkpoint_counts(); }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace sluice
