// TaskLocalStateStore: a TaskManager's local copies of the checkpoint state files its tasks write (Flink's
// task-local recovery: execution.checkpointing.local-backup.enabled, execution.state-recovery.from-local,
// taskmanager.state.local.root-dirs).
//
// The checkpoint storage (S3, a shared file system) stays the primary copy, the one a checkpoint's `_metadata`
// names and the one that survives the loss of the machine. Beside it each state file this TaskManager writes for a
// checkpoint is also written to the local disk, and a restore onto the same TaskManager (the scheduler places a
// subtask where its state was written, cluster/jobmanager/slot_assignment.h) reads that copy instead of downloading
// it: a JobManager failover or a task restart with a gigabyte of state then reads from the page cache or local disk.
// A local copy is only used when its size and XXH3-64 checksum equal the primary's handle in `_metadata`; any
// mismatch (a partly written copy after a crash, a copy of another checkpoint) falls back to the primary.
//
// Layout: `<root>/<job-id>/chk-<n>/<state file name>`, the names of the primary's `<base>/<job-id>/chk-<n>/`, so
// a restore finds the copy of a primary file by its checkpoint directory's last two components. Only checkpoints
// get copies (never savepoints: they are the user's, read rarely and maybe elsewhere). Incremental rocksdb shared
// files are not copied (their restore still downloads them).
//
// Retention: a confirmed checkpoint n (notifyCheckpointComplete) with copies here removes the job's copies of every
// older checkpoint; an aborted one removes its own. So a job keeps at most its latest confirmed checkpoint's copies and
// those of the checkpoints in progress.
//
// Threading: every member is safe to call from several threads; the object holds no mutable state. File errors
// are reported (write side) or logged (removal), never thrown.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "sluice/core/error.h"

namespace sluice {

class TaskLocalStateStore {
 public:
  /// A store under `root` (created on demand).
  explicit TaskLocalStateStore(std::filesystem::path root) : root_(std::move(root)) {}

  const std::filesystem::path& root() const noexcept { return root_; }

  /// `<root>/<job-id>/chk-<checkpoint_id>` (whether or not it exists).
  std::filesystem::path checkpoint_dir(const std::string& job_id, int64_t checkpoint_id) const;

  /// Creates the directory of checkpoint `checkpoint_id`'s local copies and returns it. Errors: kCheckpoint naming
  /// the directory and the OS error (the caller then writes no copy; the checkpoint itself goes on).
  [[nodiscard]] Result<std::filesystem::path> init_checkpoint(const std::string& job_id, int64_t checkpoint_id) const;

  /// The local copy of state file `file` of the primary checkpoint directory `primary_checkpoint_dir` (a
  /// `.../<job-id>/chk-<n>` path or s3:// URI text), when one exists; nullopt otherwise (also for a savepoint
  /// directory). Not checked here: the reader checks it against the handle.
  std::optional<std::filesystem::path> find(const std::filesystem::path& primary_checkpoint_dir,
                                            const std::string& file) const;

  /// Checkpoint `checkpoint_id` of job `job_id` completed: removes the copies of the job's older checkpoints. Does
  /// nothing when it has no copies here (a savepoint: the older copies stay, a failover restores a checkpoint).
  void confirm_checkpoint(const std::string& job_id, int64_t checkpoint_id) const noexcept;

  /// Checkpoint `checkpoint_id` of job `job_id` was aborted: removes its copies.
  void abort_checkpoint(const std::string& job_id, int64_t checkpoint_id) const noexcept;

 private:
  std::filesystem::path root_;
};

}  // namespace sluice
