#include "sluice/checkpoint/deferred_state_assignment.h"

#include <fmt/format.h>

#include <utility>

namespace sluice {

DeferredStateAssignment::DeferredStateAssignment(CheckpointMetadata metadata, std::filesystem::path dir,
                                                 std::vector<VertexToRestore> vertices)
    : metadata_(std::move(metadata)),
      dir_(std::move(dir)),
      to_restore_(std::move(vertices)),
      vertices_(to_restore_.size()) {}

Result<std::shared_ptr<const TaskRestore>> DeferredStateAssignment::subtask(int vertex, int subtask) {
  if (vertex < 0 || static_cast<size_t>(vertex) >= vertices_.size()) {
    return Error(ErrorCode::kInternal, fmt::format("restoring from checkpoint {}: vertex {} is not in [0, {})",
                                                   metadata_.checkpoint_id, vertex, vertices_.size()));
  }
  const VertexToRestore& to_restore = to_restore_[static_cast<size_t>(vertex)];
  Vertex& v = vertices_[static_cast<size_t>(vertex)];
  std::lock_guard lock(v.mu);
  if (!v.assigned) {
    v.assigned = true;
    auto assigned = assign_subtask_states(metadata_, dir_, to_restore);
    if (assigned.ok()) {
      v.restores = std::move(*assigned);
      v.taken.assign(v.restores.size(), false);
    } else {
      v.error = assigned.error();
    }
  }
  if (v.error) return *v.error;
  const bool marked = subtask >= 0 && static_cast<size_t>(subtask) < v.restores.size() &&
                      (to_restore.subtasks.empty() || to_restore.subtasks[static_cast<size_t>(subtask)]);
  if (!marked || v.taken[static_cast<size_t>(subtask)]) {
    return Error(ErrorCode::kInternal,
                 fmt::format("restoring from checkpoint {}: the state of subtask {} of vertex {} was {}",
                             metadata_.checkpoint_id, subtask, vertex, marked ? "taken already" : "not assigned here"));
  }
  v.taken[static_cast<size_t>(subtask)] = true;
  return std::exchange(v.restores[static_cast<size_t>(subtask)], nullptr);
}

}  // namespace sluice
