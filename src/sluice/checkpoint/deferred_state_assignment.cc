#include "sluice/checkpoint/deferred_state_assignment.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

namespace sluice {

DeferredStateAssignment::DeferredStateAssignment(CheckpointMetadata metadata, std::filesystem::path dir,
                                                 std::vector<VertexToRestore> vertices,
                                                 std::shared_ptr<const TaskLocalStateStore> local)
    : metadata_(std::move(metadata)),
      dir_(std::move(dir)),
      to_restore_(std::move(vertices)),
      local_(std::move(local)),
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
    StateReadStats stats;
    const auto start = std::chrono::steady_clock::now();
    auto assigned = assign_subtask_states(metadata_, dir_, to_restore, local_.get(), &stats);
    if (stats.local_files + stats.remote_files > 0) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      spdlog::info(
          "restoring vertex {} from checkpoint {}: {} state file(s) ({} bytes) read from local copies{}, {} ({} "
          "bytes) from {}, in {} ms",
          vertex, metadata_.checkpoint_id, stats.local_files, stats.local_bytes,
          local_ ? " in " + local_->root().string() : "", stats.remote_files, stats.remote_bytes, dir_.string(), ms);
    }
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
