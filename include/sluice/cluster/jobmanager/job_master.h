// JobMaster: runs one job on the cluster's TaskManagers (Flink's JobMaster with its scheduler, as far as this
// build goes). It waits until the registered TaskManagers offer the slots the job needs (up to
// slot.request.timeout, saying "needs N slots, M registered"), places every subtask in a slot
// (slot_assignment.h: slot sharing as Flink), deploys each TaskManager's share with SubmitTasks, and follows the
// tasks' state updates: the job is FINISHED when every task finished, FAILED as soon as a task failed or a
// TaskManager holding tasks was lost or disconnected (the tasks left on the other TaskManagers are cancelled
// with CancelTasks), CANCELED on cancel().
//
// Checkpoints (init_checkpoints()): the JobMaster hosts the same CheckpointCoordinator as local mode, as its
// CheckpointJobHooks: a trigger goes to the TaskManagers holding source subtasks (TriggerCheckpoint, answered
// with the split enumerators' state), the TaskManagers write their tasks' state files into the shared checkpoint
// directory and acknowledge with the handles (JobEvents::on_checkpoint_ack; an acknowledgement of another attempt
// or registration is dropped), the coordinator writes `_metadata` as in local mode, and every TaskManager is told
// NotifyCheckpointComplete / NotifyCheckpointAborted. A job can start from a checkpoint or savepoint
// (execution.state-recovery.path): each TaskManager assigns its subtasks' state from its `_metadata`.
//
// Failover (init_restart_strategy()): a failed task, a lost or disconnected TaskManager with tasks, or too many
// failed checkpoints fail the running attempt; the JobMaster cancels its remaining tasks (CancelTasks), asks the
// restart strategy (Flink's restart-strategy.* keys), waits its backoff, waits for enough slots among the
// registered TaskManagers (a new one may register; up to slot.request.timeout) and deploys the whole job again
// as the next attempt, restored from the latest completed checkpoint. Full-job restart: region failover across
// processes is not built. A TaskManager that cannot be reached at deployment is left out of the placement for
// `unreachable_exclusion_ms` (a killed one is usually still registered until heartbeat.timeout).
//
// Savepoints (trigger_savepoint): the coordinator's savepoint path, as in local mode; a stop-with-savepoint's
// tasks end after its NotifyCheckpointComplete and the job is FINISHED. A job started from a savepoint at another
// parallelism gets its keyed state by key group and its operator state round robin (each TaskManager assigns
// its subtasks' share from the savepoint's `_metadata`).
//
// Counters (subtask_metrics(), operator_stats(): the REST API's vertex and subtask metrics, /metrics): each
// TaskManager's heartbeats carry the counters of its running tasks and each task's end its final ones
// (SubtaskMetricsStore); a subtask's attempts add up.
//
// Threading: one master thread (started by start()) does every RPC; JobEvents and JobClient calls are
// thread-safe and only queue work for it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/checkpoint/checkpoint_coordinator.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/cluster/jobmanager/jobmanager_server.h"
#include "sluice/cluster/jobmanager/slot_assignment.h"
#include "sluice/cluster/jobmanager/subtask_metrics_store.h"
#include "sluice/cluster/restart_strategy.h"
#include "sluice/core/clock.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

struct JobMasterOptions {
  std::string job_id;
  std::string job_name;
  int64_t slot_request_timeout_ms = 300000;  ///< slot.request.timeout
  bool evenly_spread = false;                ///< cluster.evenly-spread-out-slots
  int64_t rpc_timeout_ms = 30000;            ///< deadline of SubmitTasks / CancelTasks
  /// How long a TaskManager that could not be reached at deployment is left out of placements (its loss is
  /// declared after heartbeat.timeout; use that).
  int64_t unreachable_exclusion_ms = 10000;
  /// High availability (docs/high-availability.md); both unset without it. `publish_checkpoint` moves the fenced
  /// latest-checkpoint pointer to checkpoint `id` at `path` after its `_metadata` is written and before the
  /// TaskManagers are told it completed (sinks commit on that): an error (a former leader's fenced write, etcd out
  /// of reach) keeps the checkpoint from completing. `is_leader` (advisory) is asked before each checkpoint starts.
  std::function<Status(int64_t id, const std::string& path)> publish_checkpoint;
  std::function<bool()> is_leader;
  /// High availability, a job a new leader resumes: the id of the checkpoint the HA store's pointer names (0 when
  /// none completed). Every `chk-<n>` of the job's directory above it was left by a former leader and never
  /// completed (the pointer moves before a checkpoint completes; a `_metadata` there was written by a leader whose
  /// pointer move was fenced, or that died in between): init_checkpoints() discards them, after the new ids were
  /// placed above them. nullopt: not a resumed job.
  std::optional<int64_t> resumed_checkpoint_id;
  /// High availability: the number of the first deployment attempt (a resumed job continues above the attempts
  /// of its former leaders, so that no channel id or task report of theirs matches one of this leader's), and
  /// `record_attempt`, called with each attempt's number before it is deployed: an error (fenced, etcd out of
  /// reach) fails the deployment.
  int first_attempt = 0;
  std::function<Status(int attempt)> record_attempt;
};

/// Where the JobMaster placed a subtask (for the REST API and logs).
struct SubtaskLocation {
  int vertex = 0;
  int subtask = 0;
  std::string task_manager;  ///< resource id
  int slot = 0;
  int attempt = 0;  ///< the deployment attempt that placed it
  /// Flink's execution state while the attempt runs (every task deployed): "RUNNING", or "FINISHED" once its
  /// TaskManager reported the end; "" otherwise (deploying, restarting, ended: the job's state says it).
  std::string execution_state;
};

class JobMaster final : public JobClient::Impl, public JobEvents, public CheckpointJobHooks {
 public:
  /// `jg` and `server` must outlive the JobMaster. Registers itself for the server's job events.
  JobMaster(JobMasterOptions options, const JobGraph& jg, JobManagerServer& server, const Clock& clock);
  ~JobMaster() override;
  JobMaster(const JobMaster&) = delete;
  JobMaster& operator=(const JobMaster&) = delete;

  /// Sets up checkpointing from the job's configuration (execution.checkpointing.*, state.checkpoints.dir,
  /// execution.state-recovery.path), before start(); a job without it takes no checkpoints. Errors:
  /// kConfiguration (an interval without a directory, a bad option), kState / kCheckpoint for a restore path
  /// that holds no restorable checkpoint or state the job does not claim.
  Status init_checkpoints(const Configuration& config);
  /// Sets the restart strategy from the job's configuration (restart-strategy.*, Flink's keys and defaults:
  /// exponential-delay with checkpointing, none without), before start(); without it a failure fails the job.
  /// Errors: kConfiguration naming the key.
  Status init_restart_strategy(const Configuration& config);
  /// Starts the master thread.
  void start();
  /// What the job waits for ("waiting for TaskManagers: needs 8 slots, 6 registered (on 3 TaskManager(s))"),
  /// or "" when it runs or ended.
  std::string status_message() const;
  std::vector<SubtaskLocation> placement() const;

  /// Suspends the job (Flink's suspend on a JobManager shutdown with high availability), unlike cancel(): no
  /// checkpoint starts or completes any more (the coordinator stops first; checkpoints already completed are kept),
  /// the tasks on the TaskManagers are cancelled with `reason`, and the job ends here as SUSPENDED, which is not
  /// globally terminal: a new leader resumes it from its latest checkpoint. A job that already finished stays
  /// FINISHED. Thread-safe; returns at once (wait() / wait_for() for the end).
  void suspend(std::string reason);

  // --- JobClient::Impl ---
  const std::string& job_id() const override { return options_.job_id; }
  JobStatus status() const override;
  void cancel() override;
  JobResult wait() override;
  bool wait_for(std::chrono::milliseconds timeout) override;
  std::future<Result<std::string>> trigger_savepoint(std::string target_dir, bool terminate) override;
  std::vector<CheckpointStats> checkpoint_stats() const override {
    return coordinator_ ? coordinator_->stats() : std::vector<CheckpointStats>{};
  }
  CheckpointCounts checkpoint_counts() const override {
    return coordinator_ ? CheckpointCounts{coordinator_->completed_count(), coordinator_->failed_count()}
                        : CheckpointCounts{};
  }
  int restarts() const override;
  std::vector<JobExceptionInfo> exceptions() const override;
  std::vector<SubtaskMetrics> subtask_metrics() const override;
  std::vector<OperatorStats> operator_stats() const override;

  // --- JobEvents (gRPC / monitor threads) ---
  void on_task_state(const TaskStateReport& report) override;
  void on_task_manager_closed(const ClosedRegistration& closed) override;
  void on_checkpoint_ack(CheckpointAckReport&& report) override;
  void on_subtask_metrics(std::vector<SubtaskMetrics>&& metrics) override;

  // --- CheckpointJobHooks (the coordinator's thread, its lock held) ---
  bool ready_for_checkpoint() override;
  Triggered trigger(const CheckpointBarrier& barrier) override;
  Triggered trigger_into(const CheckpointBarrier& barrier, const std::filesystem::path& dir) override;
  void trigger_task(const CheckpointTaskKey& task, const CheckpointBarrier& barrier) override;
  Status before_complete(int64_t checkpoint_id, const std::filesystem::path& dir) override;
  void notify_complete(int64_t checkpoint_id) override;
  void notify_aborted(int64_t checkpoint_id) override;
  void fail_job(const Error& error) override;

 private:
  struct Deployed {
    TaskManagerRegistration tm;
    int tasks = 0;
  };
  struct CheckpointFailure {
    Error error;
  };
  using Event = std::variant<TaskStateReport, ClosedRegistration, CheckpointFailure>;
  /// The TaskManagers of the running attempt and what they hold, copied for RPCs outside mu_.
  struct Snapshot {
    int attempt = 0;
    std::vector<Deployed> tms;
    std::vector<CheckpointTaskKey> live;  // tasks not finished
    std::set<int> source_peers;           // peers with a live source subtask
    std::map<CheckpointTaskKey, int> peer_of;
    std::set<int> end_of_input_peers;
  };
  Snapshot snapshot_locked() const;
  void notify_all(int64_t checkpoint_id, bool complete);

  void run();
  /// Waits for the slots; returns the assignment and the TaskManagers it is on, or nullopt (the job ended).
  /// With `restore` (nullable), subtasks prefer the TaskManagers that wrote their state (its handles' locations).
  std::optional<std::pair<SlotAssignment, std::vector<TaskManagerRegistration>>> wait_for_slots(
      std::unique_lock<std::mutex>& lock, const RestorePoint* restore);
  /// The first checkpointed source that `a` places on more than one TaskManager (deploy() refuses it), with the
  /// number of TaskManagers; nullopt when there is none.
  std::optional<std::pair<const JobVertex*, size_t>> split_source(const SlotAssignment& a) const;
  /// Deploys attempt attempt_; `restore` (nullable) is the checkpoint its tasks restore. On a TaskManager that
  /// cannot be reached, sets `*unreachable` to its registration id.
  Status deploy(const SlotAssignment& a, const std::vector<TaskManagerRegistration>& tms, const RestorePoint* restore,
                std::string* unreachable);
  enum class Outcome { kFinished, kCanceled, kFailed };
  /// Follows the running attempt's events until it ends; for kFailed sets `failure` and `lost_registration`.
  Outcome follow(std::unique_lock<std::mutex>& lock, std::optional<Error>& failure, std::string& lost_registration);
  /// Starts the next deployment attempt (mu_ held by `lock`, released while the coordinator resets): a new
  /// attempt number, so that the reports of every task of the previous deployment (whole or aborted halfway) are
  /// stale, and `restore` set to the latest completed checkpoint.
  void begin_next_attempt(std::unique_lock<std::mutex>& lock, std::optional<RestorePoint>& restore);
  /// Stops the coordinator (without mu_: its thread may wait for mu_ in a hook) and keeps its counts for the result.
  void stop_coordinator(std::unique_lock<std::mutex>& lock);
  void cancel_deployed(const std::string& reason, const std::string& except_registration);
  void finish_locked(JobStatus status, std::optional<Error> error);
  /// Whether counters of deployment attempt `attempt` are this JobManager's to count (mu_ held).
  bool counts_attempt_locked(int attempt) const;

  const JobMasterOptions options_;
  const JobGraph& jg_;
  JobManagerServer& server_;
  const Clock& clock_;
  int attempt_ = 0;  // the deployment attempt (guarded by mu_; written by the master thread only)
  int restarts_ = 0;
  std::unique_ptr<RestartBackoffTimeStrategy> restart_strategy_;
  std::map<std::string, TimestampMs> unreachable_until_;  // registration -> left out of placements until
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the master thread
  std::condition_variable done_cv_;  // wakes wait()
  std::deque<Event> events_;
  JobStatus status_ = JobStatus::kCreated;
  std::string status_message_;
  bool cancel_requested_ = false;              // cancel() or suspend()
  std::optional<std::string> suspend_reason_;  // suspend(): the job ends SUSPENDED, not CANCELED or FAILED
  bool stopping_ = false;
  bool terminal_ = false;
  std::vector<Deployed> deployed_;  // by peer index
  std::vector<SubtaskLocation> placement_;
  bool running_ = false;                                // every task deployed, none failed
  std::set<CheckpointTaskKey> finished_;                // tasks that reported FINISHED
  std::set<CheckpointTaskKey> end_of_input_;            // tasks waiting for a checkpoint of their final state
  bool checkpointing_ = false;                          // periodic checkpoints
  std::unique_ptr<FileCheckpointStorage> storage_;      // null: no checkpoints
  std::unique_ptr<CheckpointCoordinator> coordinator_;  // stopped before the rest goes
  std::optional<RestorePoint> initial_restore_;
  std::vector<JobExceptionInfo> exceptions_;
  JobResult result_;
  SubtaskMetricsStore metrics_;  // thread-safe on its own
};

}  // namespace sluice
