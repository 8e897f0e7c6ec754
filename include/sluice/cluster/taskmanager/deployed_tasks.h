// DeployedTasks: the tasks of one deployment attempt of the job that run in this TaskManager (the part of
// Flink's TaskExecutor that holds Tasks in its TaskSlotTable). Built from the TaskManager's own copy of the job
// graph and the JobManager's placement of every subtask: a channel whose two ends run here is a LocalChannel,
// a channel with one end here goes over the TCP data plane (net::ConnectionManager, one connection per pair
// of TaskManagers) to the peer holding the other end, a channel with no end here is not created.
//
// Sources: each TaskManager runs the split enumerator of the sources it has reader subtasks of, with every split
// assigned up front (SourceCoordinatorBase::assign_splits_up_front), so every process assigns each split to
// the same subtask; sources that discover splits over time are refused.
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
#include <optional>
#include <string>
#include <vector>

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
};

struct DeploymentSpec {
  int attempt = 0;
  std::vector<net::TaskManagerLocation> peers;  ///< every TaskManager of the deployment
  int self = 0;                                 ///< this TaskManager's index in peers
  std::vector<std::vector<int>> peer_of;        ///< [vertex][subtask]: index into peers
};

class DeployedTasks final : private TaskListener {
 public:
  using Listener = std::function<void(const TaskEnd&)>;

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
  int attempt() const { return attempt_; }
  size_t task_count() const { return tasks_.size(); }
  /// Tasks that have not terminated yet.
  size_t running() const { return tasks_.size() - terminated_.load(); }

 private:
  DeployedTasks(int attempt, Listener listener) : attempt_(attempt), listener_(std::move(listener)) {}
  void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) override;

  const int attempt_;
  Listener listener_;
  std::atomic<size_t> terminated_{0};
  // Declaration order is teardown order reversed: tasks go first (their input processors recycle held
  // buffers into the channels), then the coordinators, then the channels.
  std::vector<std::unique_ptr<LocalChannel>> local_channels_;
  std::vector<std::unique_ptr<net::RemoteChannelSender>> remote_senders_;
  std::vector<std::unique_ptr<net::RemoteInputChannel>> remote_inputs_;
  std::map<int, std::shared_ptr<SourceCoordinatorBase>> coordinators_;
  std::vector<std::unique_ptr<Task>> tasks_;
};

}  // namespace sluice
