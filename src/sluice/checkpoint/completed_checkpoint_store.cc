#include "sluice/checkpoint/completed_checkpoint_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace sluice {
namespace {

int checked_retained(int n) {
  if (n >= 1) return n;
  spdlog::warn("execution.checkpointing.num-retained is {}; keeping 1 completed checkpoint", n);
  return 1;
}

}  // namespace

CompletedCheckpointStore::CompletedCheckpointStore(int num_retained, FileCheckpointStorage& storage)
    : num_retained_(checked_retained(num_retained)), storage_(storage) {}

void CompletedCheckpointStore::add(CompletedCheckpoint checkpoint) {
  auto entry = std::make_shared<const CompletedCheckpoint>(std::move(checkpoint));
  std::vector<std::shared_ptr<const CompletedCheckpoint>> dropped;
  std::vector<std::string> unreferenced;
  {
    std::lock_guard lock(mu_);
    // Count the new checkpoint's shared files first, so files it shares with dropped ones survive.
    if (entry->metadata.type == SnapshotType::kCheckpoint) {
      for (const auto& [name, size] : shared_files_of(entry->metadata))
        ++shared_refs_[name];
    }
    auto it = std::lower_bound(checkpoints_.begin(), checkpoints_.end(), entry->id,
                               [](const auto& c, int64_t id) { return c->id < id; });
    if (it != checkpoints_.end() && (*it)->id == entry->id) {
      if ((*it)->dir != entry->dir) dropped.push_back(*it);
      *it = entry;
    } else {
      checkpoints_.insert(it, entry);
    }
    const size_t excess = checkpoints_.size() > static_cast<size_t>(num_retained_)
                              ? checkpoints_.size() - static_cast<size_t>(num_retained_)
                              : 0;
    dropped.insert(dropped.end(), checkpoints_.begin(), checkpoints_.begin() + static_cast<ptrdiff_t>(excess));
    checkpoints_.erase(checkpoints_.begin(), checkpoints_.begin() + static_cast<ptrdiff_t>(excess));
    for (const auto& old : dropped) {
      if (old->metadata.type != SnapshotType::kCheckpoint) continue;
      for (const auto& [name, size] : shared_files_of(old->metadata)) {
        auto it = shared_refs_.find(name);
        if (it == shared_refs_.end()) continue;
        if (--it->second <= 0) {
          unreferenced.push_back(name);
          shared_refs_.erase(it);
        }
      }
    }
  }
  for (const std::string& name : unreferenced) {
    spdlog::debug("shared file {} is no longer referenced by a retained checkpoint; deleting it", name);
    storage_.discard_shared_file(name);
  }
  for (const auto& old : dropped) {
    if (old->metadata.type == SnapshotType::kCheckpoint) {
      spdlog::debug("checkpoint {} is subsumed; deleting {}", old->id, old->dir.string());
      storage_.discard(old->dir);
    } else {
      spdlog::info("{} {} is subsumed; keeping it in {}", snapshot_type_name(old->metadata.type), old->id,
                   old->dir.string());
    }
  }
}

std::shared_ptr<const CompletedCheckpoint> CompletedCheckpointStore::latest() const {
  std::lock_guard lock(mu_);
  return checkpoints_.empty() ? nullptr : checkpoints_.back();
}

std::vector<std::shared_ptr<const CompletedCheckpoint>> CompletedCheckpointStore::all() const {
  std::lock_guard lock(mu_);
  return {checkpoints_.rbegin(), checkpoints_.rend()};
}

int CompletedCheckpointStore::shared_references(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = shared_refs_.find(name);
  return it == shared_refs_.end() ? 0 : it->second;
}

size_t CompletedCheckpointStore::shared_file_count() const {
  std::lock_guard lock(mu_);
  return shared_refs_.size();
}

size_t CompletedCheckpointStore::size() const {
  std::lock_guard lock(mu_);
  return checkpoints_.size();
}

}  // namespace sluice
