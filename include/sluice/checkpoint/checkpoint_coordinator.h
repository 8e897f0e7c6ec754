// CheckpointCoordinator: the JobManager's side of checkpoints (Flink's CheckpointCoordinator, DESIGN.md §6).
//
// It triggers checkpoint n periodically (interval, minimum pause, max concurrent) or on demand (savepoints),
// by asking the job to inject barrier n at every source subtask (and at tasks whose input has already ended).
// Tasks acknowledge with the captured state; writer threads write each subtask's state files into
// chk-<n>/ (the asynchronous part); when every live task has been written, the coordinator writes
// `_metadata` atomically, the checkpoint is **completed**, and every task is told
// notify_checkpoint_complete(n). A checkpoint that times out, fails to write, or is overtaken by a failover
// is aborted: its directory is deleted and tasks are told notify_checkpoint_aborted(n). More consecutive
// failed checkpoints than tolerated fail the job over (a restart under its restart strategy).
//
// Finished tasks: a task that consumed all its input snapshots its final state in the next checkpoint and
// then closes; later checkpoints write that retained final state again, so every completed checkpoint covers
// every operator (the model of Flink's FLIP-147 "checkpoints after tasks finished").
//
// Threading: public methods are thread-safe. One coordinator thread runs the timer loop and completes
// checkpoints; two writer threads write state files. Lock order: the coordinator's locks, then whatever the
// CheckpointJobHooks take; hooks must never call back into the coordinator synchronously. Which member each
// lock guards is annotated (SLUICE_GUARDED_BY) and checked by clang's -Wthread-safety (the thread-safety preset).
#pragma once

#include <compare>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/completed_checkpoint_store.h"
#include "sluice/core/clock.h"
#include "sluice/core/config.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/runtime/checkpoint_barrier.h"
#include "sluice/runtime/task_state.h"

namespace sluice {

/// One subtask of a job vertex.
struct CheckpointTaskKey {
  int vertex = 0;
  int subtask = 0;
  auto operator<=>(const CheckpointTaskKey&) const = default;
};

/// The checkpointing options of a job (execution.checkpointing.*).
struct CheckpointCoordinatorOptions {
  int64_t interval_ms = 0;  ///< 0: no periodic checkpoints (savepoints still work)
  int64_t timeout_ms = 10 * 60'000;
  int64_t min_pause_ms = 0;
  int max_concurrent = 1;
  CheckpointingMode mode = CheckpointingMode::kExactlyOnce;
  int tolerable_failures = 0;
  std::string savepoint_dir;  ///< default target of savepoints
  int num_retained = 1;

  /// Reads and checks the options. Errors: kConfiguration naming the key.
  static Result<CheckpointCoordinatorOptions> from_config(const Configuration& config);
};

/// The operators of one job vertex, as checkpoints record them.
struct CheckpointVertexInfo {
  int vertex = 0;
  std::string name;
  int parallelism = 1;
  std::vector<std::string> uids;     ///< chain order
  std::vector<int> max_parallelism;  ///< per uid
};

/// What the coordinator asks of the job. Called with the coordinator's lock held: implementations may take
/// their own locks and post mails to tasks, but must not call the coordinator.
class CheckpointJobHooks {
 public:
  virtual ~CheckpointJobHooks() = default;
  struct Triggered {
    std::map<std::string, std::string> coordinator_state;  ///< per source uid
    std::vector<CheckpointTaskKey> tasks;                  ///< live tasks that will acknowledge
    /// Set when the barrier could not be injected everywhere (a TaskManager did not take the trigger): the
    /// checkpoint is aborted at once with this reason (in the history, not counted as a failed checkpoint)
    /// instead of waiting for its timeout while no later checkpoint can start.
    std::optional<std::string> failure;
  };
  /// False while some region is being restarted (checkpoints wait, as Flink requires all tasks running).
  virtual bool ready_for_checkpoint() = 0;
  /// Injects `barrier` at every live source subtask (snapshotting each source's split enumerator first) and
  /// triggers every live task whose input has ended.
  virtual Triggered trigger(const CheckpointBarrier& barrier) = 0;
  /// trigger() with the directory the checkpoint or savepoint is written to (a savepoint's is outside the job's
  /// checkpoint directory). Cluster mode tells it to the TaskManagers; local mode has no use for it.
  virtual Triggered trigger_into(const CheckpointBarrier& barrier, const std::filesystem::path& /*dir*/) {
    return trigger(barrier);
  }
  /// Triggers one task whose input ended while checkpoint `barrier` was pending.
  virtual void trigger_task(const CheckpointTaskKey& task, const CheckpointBarrier& barrier) = 0;
  /// Called after `_metadata` of checkpoint `checkpoint_id` in `dir` is written and before the checkpoint counts
  /// as completed (nothing subsumed, no task notified yet): a JobManager with high availability moves its fenced
  /// latest-checkpoint pointer here. An error keeps the checkpoint from completing: it fails (counted) with that
  /// reason, tasks are told it aborted, and its directory is kept (the pointer may have moved to it anyway when the
  /// answer was lost). The default accepts every checkpoint.
  virtual Status before_complete(int64_t /*checkpoint_id*/, const std::filesystem::path& /*dir*/) {
    return ok_status();
  }
  virtual void notify_complete(int64_t checkpoint_id) = 0;
  virtual void notify_aborted(int64_t checkpoint_id) = 0;
  /// Too many checkpoints failed in a row: the job fails over with `error` (its running regions restart from
  /// the latest completed checkpoint under the restart strategy, as Flink's CheckpointFailureManager).
  virtual void fail_job(const Error& error) = 0;
};

/// A completed checkpoint or savepoint to restore from.
struct RestorePoint {
  std::filesystem::path dir;
  CheckpointMetadata metadata;
};

class CheckpointCoordinator {
 public:
  /// `first_checkpoint_id` continues the numbering of a restored checkpoint (its id + 1). The storage and
  /// hooks must outlive the coordinator.
  CheckpointCoordinator(CheckpointCoordinatorOptions options, FileCheckpointStorage& storage,
                        std::vector<CheckpointVertexInfo> vertices, CheckpointJobHooks& hooks, const Clock& clock,
                        int64_t first_checkpoint_id);
  ~CheckpointCoordinator();
  CheckpointCoordinator(const CheckpointCoordinator&) = delete;
  CheckpointCoordinator& operator=(const CheckpointCoordinator&) = delete;

  /// Starts the coordinator and writer threads.
  void start() SLUICE_EXCLUDES(mu_);
  /// Aborts pending checkpoints (without telling tasks) and stops the threads. Idempotent. A periodic
  /// checkpoint pending then is discarded, not counted as failed; a pending savepoint fails.
  void stop() SLUICE_EXCLUDES(mu_);

  /// A task finished the synchronous part of checkpoint `snapshot.checkpoint_id` (task thread).
  void acknowledge(const CheckpointTaskKey& task, std::string task_name, TaskStateSnapshot&& snapshot)
      SLUICE_EXCLUDES(mu_);
  /// Cluster mode: the TaskManager of `task` wrote its state of checkpoint `checkpoint_id` into the checkpoint's
  /// directory (`handles[i]` is the state of operator `uids[i]`) and acknowledged it over RPC. With
  /// `finished_input` it is the task's final state: the coordinator maps the files (the bytes outlive the
  /// checkpoint's directory) and writes them into the checkpoints taken after the task closed, as it does with
  /// a local task's retained snapshot. Any thread; an acknowledgement that is not expected (a duplicate, a
  /// checkpoint aborted meanwhile) is dropped.
  void acknowledge_written(const CheckpointTaskKey& task, int64_t checkpoint_id, std::vector<std::string> uids,
                           std::vector<OperatorSubtaskStateHandle> handles, TaskCheckpointStats stats,
                           bool finished_input) SLUICE_EXCLUDES(mu_);
  /// `task` could not take checkpoint `checkpoint_id` (Flink's declineCheckpoint): the checkpoint is aborted
  /// with the reason (in stats()) and counts as a failed checkpoint. Any thread.
  void decline(const CheckpointTaskKey& task, const std::string& task_name, int64_t checkpoint_id,
               const std::string& reason) SLUICE_EXCLUDES(mu_);
  /// A task consumed all its input and waits for a checkpoint of its final state.
  void on_end_of_input(const CheckpointTaskKey& task) SLUICE_EXCLUDES(mu_);
  /// A task closed after its final state was checkpointed; later checkpoints reuse that state, and pending
  /// ones that still wait for it take it. `mark_exited` runs under the coordinator's lock, so no trigger sees
  /// the task both live and finished (it should make the job stop listing the task as live).
  void on_task_finished(const CheckpointTaskKey& task, const std::function<void()>& mark_exited) SLUICE_EXCLUDES(mu_);
  /// The tasks of a region are being restarted: forget their retained final states.
  void on_tasks_reset(const std::vector<CheckpointTaskKey>& tasks) SLUICE_EXCLUDES(mu_);
  /// Aborts every pending checkpoint (a failover); tasks are told. Waits for a completion in progress, so
  /// afterwards latest_restore_point() is what a restart must restore.
  void abort_pending(const std::string& reason) SLUICE_EXCLUDES(completion_mu_, mu_);
  /// Triggers a savepoint into `target_dir` ("" = the configured savepoint dir). The future yields its
  /// directory or the error that aborted it.
  std::future<Result<std::string>> trigger_savepoint(std::string target_dir, bool terminate) SLUICE_EXCLUDES(mu_);

  /// The newest completed checkpoint or savepoint of this run, or the one it was started from.
  std::optional<RestorePoint> latest_restore_point() const SLUICE_EXCLUDES(mu_);
  /// Candidates for a restore, newest first (for execution.checkpointing.restore-fallback).
  std::vector<RestorePoint> restore_candidates() const SLUICE_EXCLUDES(mu_);
  /// Seeds the restore point with the checkpoint the job was started from.
  void set_initial_restore_point(RestorePoint point) SLUICE_EXCLUDES(mu_);
  std::vector<CheckpointStats> stats() const SLUICE_EXCLUDES(mu_);
  int64_t completed_count() const SLUICE_EXCLUDES(mu_);
  /// Checkpoints and savepoints that failed or were aborted since the coordinator started (Flink's
  /// numberOfFailedCheckpoints).
  int64_t failed_count() const SLUICE_EXCLUDES(mu_);
  const CheckpointCoordinatorOptions& options() const { return options_; }

 private:
  struct Pending;
  struct WriteJob;
  struct RetainedFiles;
  struct Request {
    SnapshotType type;
    std::string target_dir;
    std::shared_ptr<std::promise<Result<std::string>>> promise;
  };

  void run() SLUICE_EXCLUDES(mu_);
  void run_writer() SLUICE_EXCLUDES(mu_);
  void trigger_locked(SnapshotType type, const std::string& target_dir,
                      std::shared_ptr<std::promise<Result<std::string>>> promise) SLUICE_REQUIRES(mu_);
  void enqueue_write_locked(Pending& p, const CheckpointTaskKey& key, std::string task_name,
                            std::shared_ptr<const TaskStateSnapshot> snapshot,
                            std::shared_ptr<const RetainedFiles> files = nullptr) SLUICE_REQUIRES(mu_);
  void on_written(int64_t id, const CheckpointTaskKey& key, Result<std::vector<OperatorSubtaskStateHandle>> handles,
                  std::vector<std::string> uids, TaskCheckpointStats stats) SLUICE_EXCLUDES(mu_);
  void complete(int64_t id) SLUICE_EXCLUDES(completion_mu_, mu_);
  /// `discard`: delete the checkpoint's directory (false: keep it, something may point to it). With `job_ended`,
  /// a periodic checkpoint is discarded rather than failed: the job finished (or was cancelled) while it was
  /// pending, which says nothing about checkpointing, so it is neither in stats() nor in failed_count() (Flink's
  /// CheckpointFailureManager ignores such aborts too). A savepoint someone asked for is still recorded as failed.
  void abort_locked(int64_t id, const std::string& reason, bool notify_tasks, bool count_failure, bool discard = true,
                    bool job_ended = false) SLUICE_REQUIRES(mu_);
  void record_stats_locked(CheckpointStats stats) SLUICE_REQUIRES(mu_);

  CheckpointCoordinatorOptions options_;
  FileCheckpointStorage& storage_;
  std::vector<CheckpointVertexInfo> vertices_;
  CheckpointJobHooks& hooks_;
  const Clock& clock_;
  std::unique_ptr<CompletedCheckpointStore> store_ SLUICE_PT_GUARDED_BY(mu_);

  Mutex completion_mu_ SLUICE_ACQUIRED_BEFORE(mu_);  // held while a checkpoint completes
  mutable Mutex mu_ SLUICE_ACQUIRED_BEFORE(stats_mu_);
  // The statistics' own lock: their readers (the REST API, /health, /metrics) never wait for mu_, which is held
  // while a trigger's or an abort's RPCs to the TaskManagers run (up to their deadline, seconds when a TaskManager
  // is paused), and a probe must answer at once.
  mutable Mutex stats_mu_;
  std::condition_variable cv_;
  std::condition_variable writer_cv_;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::vector<std::thread> writers_;

  int64_t next_id_ SLUICE_GUARDED_BY(mu_);
  std::map<int64_t, std::unique_ptr<Pending>> pending_ SLUICE_GUARDED_BY(mu_);
  std::deque<int64_t> ready_ SLUICE_GUARDED_BY(mu_);     // fully written, waiting for completion
  std::deque<Request> requests_ SLUICE_GUARDED_BY(mu_);  // savepoints asked for
  std::deque<std::unique_ptr<WriteJob>> write_queue_ SLUICE_GUARDED_BY(mu_);
  int64_t last_trigger_ns_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t last_end_ns_ SLUICE_GUARDED_BY(mu_) = 0;
  bool urgent_ SLUICE_GUARDED_BY(mu_) = false;
  int consecutive_failures_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t completed_ SLUICE_GUARDED_BY(stats_mu_) = 0;
  int64_t failed_ SLUICE_GUARDED_BY(stats_mu_) = 0;
  std::optional<RestorePoint> latest_ SLUICE_GUARDED_BY(mu_);
  std::map<std::string, std::string> last_coordinator_state_ SLUICE_GUARDED_BY(mu_);
  std::map<CheckpointTaskKey, std::shared_ptr<const TaskStateSnapshot>> final_snapshots_ SLUICE_GUARDED_BY(mu_);
  std::map<CheckpointTaskKey, std::shared_ptr<const RetainedFiles>> final_files_
      SLUICE_GUARDED_BY(mu_);  // cluster mode
  std::map<CheckpointTaskKey, std::string> finished_tasks_
      SLUICE_GUARDED_BY(mu_);  // key -> task name, final state retained
  std::deque<CheckpointStats> stats_ SLUICE_GUARDED_BY(stats_mu_);
};

}  // namespace sluice
