// CompletedCheckpointStore: the completed checkpoints (and savepoints) a job can restore from, newest
// first, with retention (Flink's StandaloneCompletedCheckpointStore and execution.checkpointing.num-retained).
//
// The store lives as long as the job object, so a restarted job (same object, after a failure) finds its
// checkpoints in memory. Adding a checkpoint beyond the retained count drops the oldest entries; dropped
// periodic checkpoints have their directories deleted, dropped savepoints are only forgotten (the engine
// never deletes a savepoint).
//
// Shared files (incremental rocksdb checkpoints, `<job dir>/shared/`) are reference-counted over the retained
// checkpoints (Flink's SharedStateRegistry): add() counts the files a new checkpoint references before it drops
// older checkpoints, and a dropped checkpoint's files whose count reaches 0 are deleted. So a shared file is
// deleted only when no retained checkpoint references it, and never one that no completed checkpoint registered
// (an upload of a checkpoint that was aborted stays, as its backend may reference it next time).
//
// Threading: every member function is thread-safe (one mutex); directories are deleted outside the lock.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/checkpoint/checkpoint_storage.h"

namespace sluice {

/// One completed checkpoint or savepoint: its id, directory and metadata. Immutable once in the store.
struct CompletedCheckpoint {
  int64_t id = 0;
  std::filesystem::path dir;
  CheckpointMetadata metadata;
};

/// The newest `num_retained` completed checkpoints of one job. Thread-safe.
class CompletedCheckpointStore {
 public:
  /// Keeps at most `num_retained` checkpoints (values below 1 are raised to 1, with a warning); deletes
  /// subsumed checkpoint directories through `storage`, which must outlive the store.
  CompletedCheckpointStore(int num_retained, FileCheckpointStorage& storage);

  CompletedCheckpointStore(const CompletedCheckpointStore&) = delete;
  CompletedCheckpointStore& operator=(const CompletedCheckpointStore&) = delete;

  /// Adds a completed checkpoint (kept in id order; an entry with the same id is replaced). Then drops the
  /// oldest entries beyond the retained count, deleting the directories of those that are periodic
  /// checkpoints (metadata.type == kCheckpoint) and keeping savepoints on disk. Never throws for I/O:
  /// a directory that cannot be deleted is logged.
  void add(CompletedCheckpoint checkpoint);

  /// The checkpoint with the highest id, or nullptr when there is none.
  std::shared_ptr<const CompletedCheckpoint> latest() const;

  /// Every retained checkpoint, newest (highest id) first.
  std::vector<std::shared_ptr<const CompletedCheckpoint>> all() const;

  /// Number of retained checkpoints.
  size_t size() const;

  /// The retention limit (>= 1).
  int num_retained() const noexcept { return num_retained_; }

  /// How many retained checkpoints reference the shared file `name` (0: none, or deleted).
  int shared_references(const std::string& name) const;
  /// Number of shared files the retained checkpoints reference.
  size_t shared_file_count() const;

 private:
  const int num_retained_;
  FileCheckpointStorage& storage_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const CompletedCheckpoint>> checkpoints_;  // ascending id; guarded by mu_
  std::map<std::string, int> shared_refs_;                               // shared file -> references; mu_
};

}  // namespace sluice
