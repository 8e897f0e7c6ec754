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
  {
    std::lock_guard lock(mu_);
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

size_t CompletedCheckpointStore::size() const {
  std::lock_guard lock(mu_);
  return checkpoints_.size();
}

}  // namespace sluice
