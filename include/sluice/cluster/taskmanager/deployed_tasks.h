// DeployedTasks: the tasks of one deployment attempt of the job that run in this TaskManager (the part of
// Flink's TaskExecutor that holds Tasks in its TaskSlotTable). Built from the TaskManager's own copy of the job
// graph and the JobManager's placement of every subtask: a channel whose two ends run here is a LocalChannel,
// a channel with one end here goes over the TCP data plane (net::ConnectionManager, one connection per pair
// of TaskManagers) to the peer holding the other end, a channel with no end here is not created.
//
// Sources: each TaskManager runs the split enumerator of the sources it has reader subtasks of. When it holds
// every reader of a source, the enumerator serves them as in local mode (so sources that discover splits over
// time, Kafka and CDC, work); when the readers are spread over TaskManagers, every split is assigned up front
// (SourceCoordinatorBase::assign_splits_up_front), so every process assigns each split to the same subtask, and
// sources that discover splits over time are refused.
//
// Checkpoints (with spec.checkpointing or a restore): tasks restore the state the TaskManager assigns them from
// the restored checkpoint's `_metadata` (checkpoint/state_assignment.h, as local mode does), and each task's
// synchronous snapshot, its end of input and its end go to the Callbacks. trigger_checkpoint() snapshots each
// local source's split enumerator and injects the barrier at its reader subtasks here.
//
// Lifecycle: deploy() builds and starts the tasks; each task's end is reported to the listener (on the task's
// thread). cancel() asks every task to stop; the destructor cancels, joins the task threads, clears the remote
// channels' wakeups (the data plane's I/O thread may notify them at any time), then destroys the tasks and the
// channels. Threading: deploy/cancel/destructor from any one thread at a time; running() is thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/checkpoint/task_local_state_store.h"
#include "sluice/cluster/task_deployment.h"
#include "sluice/core/clock.h"
#include "sluice/net/connection_manager.h"
#include "sluice/runtime/buffer_pool.h"

namespace sluice {

/// One task's end, as reported to the JobManager.
struct TaskEnd {
  int vertex = 0;
  int subtask = 0;
  int attempt = 0;
  TaskState state = TaskState::kFinished;
  std::optional<Error> error;
  std::optional<SubtaskMetrics> metrics;  ///< on_end: the task's counters at its end
};

struct DeploymentSpec {
  int attempt = 0;
  bool checkpointing = false;  ///< periodic checkpoints: finished tasks wait for a final checkpoint
  std::string restore_dir;     ///< a completed checkpoint's directory to restore from; "" = fresh start
  std::vector<net::TaskManagerLocation> peers;  ///< every TaskManager of the deployment
  int self = 0;                                 ///< this TaskManager's index in peers
  std::vector<std::vector<int>> peer_of;        ///< [vertex][subtask]: index into peers
  const TaskLease* lease = nullptr;  ///< the TaskManager's lease, which the tasks check (Task::Options::lease)
  /// The TaskManager's local state copies a restore reads from (execution.state-recovery.from-local); null: none.
  std::shared_ptr<const TaskLocalStateStore> local_state;
};

class DeployedTasks final : private TaskListener {
 public:
  /// Every call comes from the task's own thread.
  struct Listener {
    std::function<void(const TaskEnd&)> on_end;
    /// The synchronous part of a checkpoint is done: write the state and acknowledge it.
    std::function<void(const TaskEnd& task, std::string task_name, TaskStateSnapshot&& snapshot)> on_snapshot;
    /// The task consumed all its input and waits for a checkpoint of its final state.
    std::function<void(const TaskEnd& task)> on_end_of_input;
  };

  /// Builds and starts this TaskManager's subtasks. `graph`, `jg`, `connections` and `pool` must outlive the
  /// result; `pool` also outlives every channel the data plane still writes from (keep it as long as
  /// `connections`). Errors: a placement that does not match the job graph (kGraph), a source whose enumerator
  /// cannot assign its splits up front (kConfiguration), exhausted buffers (kNetwork), an operator factory's
  /// error. Nothing runs when it fails.
  [[nodiscard]] static Result<std::unique_ptr<DeployedTasks>> deploy(const StreamGraph& graph, const JobGraph& jg,
                                                                     const DeploymentSpec& spec,
                                                                     net::ConnectionManager& connections,
                                                                     NetworkBufferPool& pool, const Clock& clock,
                                                                     Listener listener);
  /// Buffers of `segment_size` bytes that deploy() takes from the pool for `spec` (credits per channel end).
  static size_t buffers_needed(const JobGraph& jg, const DeploymentSpec& spec, int credits);

  ~DeployedTasks() override;
  DeployedTasks(const DeployedTasks&) = delete;
  DeployedTasks& operator=(const DeployedTasks&) = delete;

  void cancel();
  /// Checkpoint `barrier`: snapshots the split enumerator of every source with a reader subtask here and
  /// injects the barrier at those subtasks, then triggers every task here whose input ended. Returns each
  /// enumerator's state by source uid, for the sources whose every subtask runs here. Any thread.
  std::map<std::string, std::string> trigger_checkpoint(const CheckpointBarrier& barrier);
  /// Triggers one task (its input ended while checkpoint `barrier` was pending); false when it is not here.
  bool trigger_task(int vertex, int subtask, const CheckpointBarrier& barrier);
  void notify_checkpoint_complete(int64_t checkpoint_id);
  void notify_checkpoint_aborted(int64_t checkpoint_id);
  int attempt() const { return attempt_; }
  size_t task_count() const { return tasks_.size(); }
  /// Tasks that have not terminated yet.
  size_t running() const { return tasks_.size() - terminated_.load(); }
  /// Every task's counters as they are now (for the heartbeats). Any thread while this object lives.
  std::vector<SubtaskMetrics> task_metrics() const;

  /// The data plane's counters of this attempt, logged when its last task ends (the backpressure test reads
  /// them): the buffer pool's cap and peak in flight, the remote channels' credit and buffers, and how long each
  /// task was blocked without output credit. Thread-safe; final once every task ended.
  std::string data_plane_summary() const;

 private:
  DeployedTasks(int attempt, Listener listener) : attempt_(attempt), listener_(std::move(listener)) {}
  void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) override;
  void on_checkpoint_snapshot(Task& task, TaskStateSnapshot&& snapshot) override;
  void on_end_of_input(Task& task) override;

  const int attempt_;
  Listener listener_;
  const JobGraph* jg_ = nullptr;  // deploy()'s, which outlives this
  NetworkBufferPool* pool_ = nullptr;
  std::atomic<size_t> terminated_{0};
  // Declaration order is teardown order reversed: tasks go first (their input processors recycle held
  // buffers into the channels), then the coordinators, then the channels.
  std::vector<std::unique_ptr<LocalChannel>> local_channels_;
  std::vector<std::unique_ptr<net::RemoteChannelSender>> remote_senders_;
  std::vector<std::unique_ptr<net::RemoteInputChannel>> remote_inputs_;
  std::map<int, std::shared_ptr<SourceCoordinatorBase>> coordinators_;
  std::vector<std::unique_ptr<Task>> tasks_;
  // Per source coordinator (stream node id): its uid, the vertex of its readers, and whether all run here.
  struct SourceInfo {
    std::string uid;
    int vertex = 0;
    bool all_here = false;
  };
  std::map<int, SourceInfo> sources_;
  std::vector<bool> source_vertex_;  // by vertex id: has no inputs (triggered directly)
  std::mutex mu_;                    // guards end_of_input_ and exited_
  std::set<Task*> end_of_input_;
  std::set<Task*> exited_;
};

}  // namespace sluice
