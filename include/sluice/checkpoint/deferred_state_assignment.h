// Deferred state assignment: a restore's state assignment done by the tasks as they initialise, not by the call
// that deploys them (Flink's INITIALIZING task state: a task is deployed at once and restores its state on its own
// thread, so a deployment with gigabytes of state returns in milliseconds and a failed restore fails the task).
//
// Threading: subtask() may be called from any thread, concurrently. The first call for a vertex computes the state
// of every subtask of that vertex it was given (assign_subtask_states, reading each file once); concurrent calls for
// the same vertex wait for it, calls for other vertices run in parallel. Each vertex's assignment logs (INFO) where its
// files came from: local copies or the checkpoint storage.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/checkpoint/state_assignment.h"
#include "sluice/checkpoint/task_local_state_store.h"
#include "sluice/core/error.h"
#include "sluice/runtime/task_state.h"

namespace sluice {

class DeferredStateAssignment {
 public:
  /// `vertices` indexed by job vertex id: what to restore of each (VertexToRestore::subtasks marks the subtasks
  /// that will ask; a vertex with no subtask to restore may have parallelism 0).
  /// `local` (nullable): the TaskManager's local copies of state files, read instead of `dir`'s when they match
  /// (task-local recovery, execution.state-recovery.from-local).
  DeferredStateAssignment(CheckpointMetadata metadata, std::filesystem::path dir, std::vector<VertexToRestore> vertices,
                          std::shared_ptr<const TaskLocalStateStore> local = nullptr);
  DeferredStateAssignment(const DeferredStateAssignment&) = delete;
  DeferredStateAssignment& operator=(const DeferredStateAssignment&) = delete;

  /// The state of subtask `subtask` of vertex `vertex`, handed out once: this object keeps no reference to it
  /// afterwards, so the state's memory goes with the task that restored it.
  /// Errors: those of assign_subtask_states (the same error for every subtask of a vertex whose assignment
  /// failed, naming the file); kInternal for a vertex or subtask out of range, not marked, or asked twice.
  [[nodiscard]] Result<std::shared_ptr<const TaskRestore>> subtask(int vertex, int subtask);

  int64_t checkpoint_id() const noexcept { return metadata_.checkpoint_id; }

 private:
  struct Vertex {
    std::mutex mu;
    bool assigned = false;
    std::optional<Error> error;
    std::vector<std::shared_ptr<const TaskRestore>> restores;  // emptied as subtasks take theirs
    std::vector<bool> taken;
  };

  const CheckpointMetadata metadata_;
  const std::filesystem::path dir_;
  const std::vector<VertexToRestore> to_restore_;
  const std::shared_ptr<const TaskLocalStateStore> local_;
  std::vector<Vertex> vertices_;
};

}  // namespace sluice
