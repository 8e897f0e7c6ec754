#include "sluice/checkpoint/state_assignment.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/task_local_state_store.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/config.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

bool has_keyed_state(const OperatorStateEntry& op) {
  for (const auto& h : op.subtasks)
    if (!h.key_groups.empty() || h.native) return true;
  return false;
}

bool has_operator_state(const OperatorStateEntry& op) {
  for (const auto& h : op.subtasks)
    if (h.operator_state_length > 0) return true;
  return false;
}

// The state files of one checkpoint, each mapped and verified at most once; read from the local copy when a
// TaskLocalStateStore has one that matches the handle.
class StateFileCache {
 public:
  StateFileCache(const fs::path& dir, int64_t checkpoint_id, const TaskLocalStateStore* local)
      : dir_(dir), checkpoint_id_(checkpoint_id), local_(local) {}
  const fs::path& dir() const noexcept { return dir_; }
  const StateReadStats& stats() const noexcept { return stats_; }

  Result<std::shared_ptr<const StateFileBytes>> get(const std::string& uid, const OperatorSubtaskStateHandle& handle) {
    auto it = files_.find(handle.file);
    if (it == files_.end()) {
      if (auto copy = read_local_copy(handle)) {
        ++stats_.local_files;
        stats_.local_bytes += handle.file_size;
        it = files_.emplace(handle.file, std::move(copy)).first;
        return it->second;
      }
      auto bytes = FileCheckpointStorage::read_state_file(dir_, handle);
      if (!bytes.ok()) {
        return bytes.error().with_context(fmt::format("restoring operator '{}' (old subtask {}) from checkpoint {}",
                                                      uid, handle.subtask, checkpoint_id_));
      }
      ++stats_.remote_files;
      stats_.remote_bytes += handle.file_size;
      it = files_.emplace(handle.file, std::move(*bytes)).first;
    }
    return it->second;
  }

 private:
  // The local copy when there is one and it is the primary's bytes (size and XXH3-64 of the handle); null otherwise.
  std::shared_ptr<const StateFileBytes> read_local_copy(const OperatorSubtaskStateHandle& handle) {
    if (local_ == nullptr) return nullptr;
    std::optional<fs::path> copy = local_->find(dir_, handle.file);
    if (!copy) return nullptr;
    auto bytes = FileCheckpointStorage::read_state_file(copy->parent_path(), handle);
    if (bytes.ok()) return std::move(*bytes);
    spdlog::warn("the local copy of a state file of checkpoint {} is not used, reading the file from {}: {}",
                 checkpoint_id_, dir_.string(), bytes.error().message());
    return nullptr;
  }

  const fs::path& dir_;
  int64_t checkpoint_id_;
  const TaskLocalStateStore* local_;
  StateReadStats stats_;
  std::map<std::string, std::shared_ptr<const StateFileBytes>> files_;
};

Error assignment_error(const CheckpointMetadata& m, const OperatorStateEntry& op, const std::string& what) {
  return Error(ErrorCode::kState, fmt::format("restoring operator '{}' from {} {}: {}", op.uid,
                                              snapshot_type_name(m.type), m.checkpoint_id, what));
}

// Fills the state of operator `op` into every new subtask of `restores`.
Status assign_operator(const CheckpointMetadata& m, const OperatorStateEntry& op, int job_max_parallelism,
                       const std::vector<bool>& wanted, StateFileCache& files, std::vector<TaskRestore>& restores) {
  const int p = static_cast<int>(restores.size());
  const bool keyed = has_keyed_state(op);

  // Old subtasks by index, checking the metadata names each at most once.
  std::vector<const OperatorSubtaskStateHandle*> old(static_cast<size_t>(op.parallelism), nullptr);
  for (const auto& h : op.subtasks) {
    if (h.subtask < 0 || h.subtask >= op.parallelism)
      return assignment_error(m, op, fmt::format("subtask {} is not in [0, {})", h.subtask, op.parallelism));
    if (old[static_cast<size_t>(h.subtask)] != nullptr)
      return assignment_error(m, op, fmt::format("the metadata lists subtask {} twice", h.subtask));
    old[static_cast<size_t>(h.subtask)] = &h;
  }

  // Keyed state: where each key group is.
  struct Located {
    const OperatorSubtaskStateHandle* handle = nullptr;
    const KeyGroupHandle* key_group = nullptr;
  };
  std::vector<Located> where;
  if (keyed) {
    if (op.max_parallelism != job_max_parallelism) {
      return assignment_error(
          m, op,
          fmt::format("the state was written with max parallelism {} but the job has max parallelism {}; keyed "
                      "state cannot move to another number of key groups: restore with the old max parallelism "
                      "(set_max_parallelism({}) on the operator, or pipeline.max-parallelism: {})",
                      op.max_parallelism, job_max_parallelism, op.max_parallelism, op.max_parallelism));
    }
    if (p > op.max_parallelism) {
      return Error(
          ErrorCode::kConfiguration,
          fmt::format("operator '{}': parallelism {} exceeds its max parallelism {}", op.uid, p, op.max_parallelism));
    }
    where.resize(static_cast<size_t>(op.max_parallelism));
    for (const auto* h : old) {
      if (h == nullptr) continue;
      for (const KeyGroupHandle& kg : h->key_groups) {
        if (kg.key_group < 0 || kg.key_group >= op.max_parallelism)
          return assignment_error(m, op,
                                  fmt::format("key group {} is not in [0, {})", kg.key_group, op.max_parallelism));
        Located& slot = where[static_cast<size_t>(kg.key_group)];
        if (slot.handle != nullptr) {
          return assignment_error(
              m, op,
              fmt::format("key group {} is stored by both subtask {} ({}) and subtask {} ({})", kg.key_group,
                          slot.handle->subtask, slot.handle->file, h->subtask, h->file));
        }
        slot = {h, &kg};
      }
    }
  }

  // Operator state: the old subtasks' snapshots in old subtask order ("" for none).
  std::vector<std::string_view> old_operator_state(static_cast<size_t>(op.parallelism));
  std::vector<std::shared_ptr<const StateFileBytes>> operator_state_owners;  // keep the views valid
  const bool has_op_state = has_operator_state(op);
  if (has_op_state) {
    for (size_t i = 0; i < old.size(); ++i) {
      const auto* h = old[i];
      if (h == nullptr || h->operator_state_length == 0) continue;
      SLUICE_ASSIGN_OR_RETURN(auto bytes, files.get(op.uid, *h));
      old_operator_state[i] = bytes->view().substr(h->operator_state_offset, h->operator_state_length);
      operator_state_owners.push_back(bytes);
    }
  }

  for (int s = 0; s < p; ++s) {
    if (!wanted.empty() && !wanted[static_cast<size_t>(s)]) continue;
    OperatorSubtaskRestore restore;
    if (has_op_state) {
      DataOutput out;
      Status st = OperatorStateStore::redistribute(old_operator_state, p, s, out);
      if (!st.ok()) {
        return st.error().with_context(
            fmt::format("restoring operator '{}' from {} {}", op.uid, snapshot_type_name(m.type), m.checkpoint_id));
      }
      restore.operator_state.assign(out.view());
    }
    if (keyed) {
      auto state = std::make_shared<KeyedStateRestore>();
      state->max_parallelism = op.max_parallelism;
      const KeyGroupRange range = KeyGroupRange::for_operator_index(op.max_parallelism, p, s);
      for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
        const Located& at = where[static_cast<size_t>(kg)];
        if (at.handle == nullptr) continue;
        SLUICE_ASSIGN_OR_RETURN(auto bytes, files.get(op.uid, *at.handle));
        state->key_groups.emplace(kg, bytes->view().substr(at.key_group->offset, at.key_group->length));
        if (state->owners.empty() || state->owners.back() != bytes) state->owners.push_back(bytes);
      }
      // Incremental rocksdb checkpoints: the old databases holding key groups of the new range.
      for (const auto* h : old) {
        if (h == nullptr || !h->native) continue;
        if (h->native->key_group_end < range.start() || h->native->key_group_start > range.end()) continue;
        SLUICE_ASSIGN_OR_RETURN(auto bytes, files.get(op.uid, *h));
        NativeKeyedStateRestore native;
        native.key_groups = KeyGroupRange(h->native->key_group_start, h->native->key_group_end);
        native.materialize = [dir = files.dir(), handle = *h->native, file = bytes](const fs::path& target) {
          return FileCheckpointStorage::materialize_native(dir, handle, *file, target);
        };
        state->native.push_back(std::move(native));
      }
      restore.keyed = std::move(state);
    }
    restores[static_cast<size_t>(s)].operators.emplace(op.uid, std::move(restore));
  }
  return ok_status();
}

}  // namespace

Result<std::vector<std::shared_ptr<const TaskRestore>>> assign_subtask_states(const CheckpointMetadata& metadata,
                                                                              const fs::path& dir,
                                                                              const VertexToRestore& vertex,
                                                                              const TaskLocalStateStore* local,
                                                                              StateReadStats* stats) {
  if (vertex.parallelism < 1) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("restoring a vertex with parallelism {}: it must be at least 1", vertex.parallelism));
  }
  if (vertex.max_parallelism.size() != vertex.operator_uids.size()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("restoring a vertex: {} operator uids but {} max parallelism values",
                             vertex.operator_uids.size(), vertex.max_parallelism.size()));
  }
  if (!vertex.subtasks.empty() && vertex.subtasks.size() != static_cast<size_t>(vertex.parallelism)) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("restoring a vertex with parallelism {}: {} subtasks are marked to restore",
                             vertex.parallelism, vertex.subtasks.size()));
  }
  std::map<std::string_view, const OperatorStateEntry*> by_uid;
  for (const OperatorStateEntry& op : metadata.operators) {
    if (!by_uid.emplace(op.uid, &op).second) {
      return Error(ErrorCode::kState,
                   fmt::format("{} {} in {}: the metadata lists operator '{}' twice", snapshot_type_name(metadata.type),
                               metadata.checkpoint_id, dir.string(), op.uid));
    }
  }

  std::vector<TaskRestore> restores(static_cast<size_t>(vertex.parallelism));
  for (TaskRestore& r : restores)
    r.checkpoint_id = metadata.checkpoint_id;
  StateFileCache files(dir, metadata.checkpoint_id, local);
  std::set<std::string_view> seen;
  for (size_t i = 0; i < vertex.operator_uids.size(); ++i) {
    const std::string& uid = vertex.operator_uids[i];
    if (!seen.insert(uid).second)
      return Error(ErrorCode::kConfiguration, fmt::format("restoring a vertex: operator uid '{}' appears twice", uid));
    auto it = by_uid.find(uid);
    if (it == by_uid.end()) continue;
    SLUICE_RETURN_IF_ERROR(
        assign_operator(metadata, *it->second, vertex.max_parallelism[i], vertex.subtasks, files, restores));
  }
  if (stats != nullptr) *stats = files.stats();

  std::vector<std::shared_ptr<const TaskRestore>> result;
  result.reserve(restores.size());
  for (size_t s = 0; s < restores.size(); ++s) {
    const bool wanted = vertex.subtasks.empty() || vertex.subtasks[s];
    result.push_back(wanted ? std::make_shared<const TaskRestore>(std::move(restores[s])) : nullptr);
  }
  return result;
}

Status check_unclaimed_state(const CheckpointMetadata& metadata, const std::set<std::string>& job_uids,
                             bool ignore_unclaimed) {
  std::set<std::string> unclaimed;
  for (const OperatorStateEntry& op : metadata.operators) {
    if ((has_keyed_state(op) || has_operator_state(op)) && !job_uids.contains(op.uid)) unclaimed.insert(op.uid);
  }
  for (const auto& [uid, bytes] : metadata.coordinator_state) {
    if (!bytes.empty() && !job_uids.contains(uid)) unclaimed.insert(uid);
  }
  if (unclaimed.empty()) return ok_status();
  std::string list;
  for (const std::string& uid : unclaimed)
    list += (list.empty() ? "'" : ", '") + uid + "'";
  const std::string_view option = options::kIgnoreUnclaimedState.key;
  if (ignore_unclaimed) {
    spdlog::warn("{} {} holds state of operator uid(s) {} that the job does not have; dropping it ({}: true)",
                 snapshot_type_name(metadata.type), metadata.checkpoint_id, list, option);
    return ok_status();
  }
  return Error(ErrorCode::kState,
               fmt::format("{} {} holds state of operator uid(s) {} that the job does not have. If an operator was "
                           "removed on purpose, set {}: true to start without that state; if its uid changed, give "
                           "it the old uid again",
                           snapshot_type_name(metadata.type), metadata.checkpoint_id, list, option));
}

Status verify_checkpoint_files(const CheckpointMetadata& metadata, const fs::path& dir, CheckpointFileCheck check) {
  const bool checksums = check == CheckpointFileCheck::kChecksum;
  std::set<std::string_view> verified;
  for (const OperatorStateEntry& op : metadata.operators) {
    for (const OperatorSubtaskStateHandle& h : op.subtasks) {
      if (!verified.insert(h.file).second) continue;
      Status s = checksums ? FileCheckpointStorage::verify_state_file(dir, h)
                           : FileCheckpointStorage::check_state_file_size(dir, h);
      if (s.ok() && h.native) {
        for (const NativeFileHandle& f : h.native->files) {
          if (f.shared_name.empty() || !verified.insert(f.shared_name).second) continue;
          s = checksums ? FileCheckpointStorage::verify_shared_file(dir, f)
                        : FileCheckpointStorage::check_shared_file_size(dir, f);
          if (!s.ok()) break;
        }
      }
      if (!s.ok()) {
        return s.error().with_context(fmt::format("{} {}, operator '{}' subtask {}", snapshot_type_name(metadata.type),
                                                  metadata.checkpoint_id, op.uid, h.subtask));
      }
    }
  }
  return ok_status();
}

Result<LoadedCheckpoint> load_for_restore(std::span<const fs::path> candidates, bool fallback,
                                          CheckpointFileCheck check) {
  if (candidates.empty())
    return Error(ErrorCode::kState, "there is no completed checkpoint or savepoint to restore from");
  std::vector<std::string> failures;
  std::shared_ptr<const Error> first_failure;
  for (const fs::path& dir : candidates) {
    auto metadata = FileCheckpointStorage::load_metadata(dir);
    Status status = metadata.ok() ? verify_checkpoint_files(*metadata, dir, check) : Status(metadata.error());
    if (status.ok()) {
      if (!failures.empty())
        spdlog::warn("restoring from the older checkpoint {} instead ({} newer checkpoint(s) failed)", dir.string(),
                     failures.size());
      return LoadedCheckpoint{dir, std::move(*metadata)};
    }
    if (!fallback) return status.error();
    const bool more = &dir != &candidates.back();
    spdlog::warn("cannot restore from {}: {}{}", dir.string(), status.error().to_string(),
                 more ? "; trying the previous checkpoint (execution.checkpointing.restore-fallback)" : "");
    if (first_failure == nullptr) first_failure = std::make_shared<const Error>(status.error());
    failures.push_back(fmt::format("{}: {}", dir.string(), status.error().message()));
  }
  std::string list;
  for (const std::string& f : failures)
    list += "\n  " + f;
  return Error(ErrorCode::kState,
               fmt::format("none of the {} checkpoints could be restored:{}", candidates.size(), list),
               std::move(first_failure));
}

}  // namespace sluice
