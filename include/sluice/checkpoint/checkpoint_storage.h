// FileCheckpointStorage: checkpoints and savepoints on a local or mounted file system (Flink's
// FsCheckpointStorageAccess and FsCheckpointStorageLocation, DESIGN.md §6).
//
// Layout (docs/state-format.md, "Checkpoint storage layout"):
//
//   <base>/<job-id>/chk-<n>/_metadata          a completed checkpoint n: metadata ...
//   <base>/<job-id>/chk-<n>/<uid>-<subtask>-<hex>   ... and one state file per operator and subtask
//   <base>/<job-id>/shared/                    SST files of incremental rocksdb checkpoints, referenced by
//                                              any number of chk-<n>; deleted when no retained one does
//   <target>/savepoint-<job id[0:6]>-<12 hex>/ a savepoint: the same files; never deleted by the engine
//
// A checkpoint directory without `_metadata` is an incomplete checkpoint: `_metadata` is written last and
// atomically (temporary file, fsync, rename, fsync of the directory), so its presence means every state
// file it references is durable.
//
// Lifecycle: create() (makes the job and shared directories) → for each checkpoint: init_checkpoint(),
// write_subtask_state() per operator subtask, then finalize_checkpoint() or discard().
// Threading: every member function is safe to call from several threads at once; the object holds no
// mutable state after create(). Calls for the same checkpoint must be ordered by the caller (all
// write_subtask_state() calls return before finalize_checkpoint()).
// Errors: kConfiguration for a bad location, id or argument; kCheckpoint for I/O failures (with the path
// and the OS error) and for restore paths that do not hold a checkpoint; kState for an unreadable
// `_metadata` file.
//
// Object stores: every location may also be an `s3://bucket/prefix` URI (S3Client, s3_client.h; the process's
// client is set up from the job configuration by S3Client::configure). Paths are then the URI's text in a
// std::filesystem::path ("s3://bucket/prefix/<job-id>/chk-<n>"), a "directory" is a key prefix, and the same
// layout holds: state files are PUT (multipart above s3.multipart.threshold) before `_metadata`, whose PUT is
// atomic, so its presence again means every state file it references is stored; state files are checked against
// the size and XXH3-64 checksum in `_metadata` when read. discard() deletes the objects under the prefix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/core/error.h"

namespace sluice {

/// Current version of the state file format (docs/state-format.md, "Checkpoint storage layout").
inline constexpr uint32_t kStateFileVersion = 1;

/// The bytes of one state file, mapped read-only from a local file, or downloaded from an object store
/// (FileCheckpointStorage::read_state_file). Immutable and thread-safe; unmapped when destroyed.
class StateFileBytes {
 public:
  /// Takes over a mapping of `size` bytes at `data` (munmap'ed when destroyed).
  StateFileBytes(const void* data, size_t size) noexcept : data_(data), size_(size), mapped_(true) {}
  /// Holds downloaded bytes.
  explicit StateFileBytes(std::string owned) noexcept
      : owned_(std::move(owned)), data_(owned_.data()), size_(owned_.size()), mapped_(false) {}
  ~StateFileBytes();
  StateFileBytes(const StateFileBytes&) = delete;
  StateFileBytes& operator=(const StateFileBytes&) = delete;

  /// The whole file.
  std::string_view view() const noexcept { return {static_cast<const char*>(data_), size_}; }

 private:
  std::string owned_;
  const void* data_;
  size_t size_;
  bool mapped_;
};

/// Checkpoint and savepoint storage of one job in a directory tree. Thread-safe (see the file comment).
class FileCheckpointStorage {
 public:
  /// Creates the storage of job `job_id` under `base_location` ("file:///abs/path", or a plain path,
  /// made absolute against the working directory) and creates `<base>/<job-id>/shared/`.
  /// Errors: kConfiguration for another scheme ("s3://...": names the scheme), an empty location, or a
  /// job id that is empty or not a plain directory name; kCheckpoint when the directories cannot be created.
  [[nodiscard]] static Result<FileCheckpointStorage> create(std::string_view base_location, std::string job_id);

  /// Parses "file:///abs/path" or a plain path into an absolute local path. Errors: kConfiguration for an
  /// empty location, a scheme other than file, or a file URI with a host ("file://host/path").
  [[nodiscard]] static Result<std::filesystem::path> parse_location(std::string_view location);

  const std::string& job_id() const noexcept { return job_id_; }
  /// `<base>/<job-id>`.
  const std::filesystem::path& job_dir() const noexcept { return job_dir_; }
  /// `<base>/<job-id>/shared`.
  std::filesystem::path shared_dir() const { return job_dir_ / "shared"; }
  /// `<base>/<job-id>/chk-<id>` (whether or not it exists).
  std::filesystem::path checkpoint_dir(int64_t id) const;

  /// Creates the directory `chk-<id>` of checkpoint `id` (>= 0) and returns it. A leftover directory of
  /// the same id without `_metadata` (an earlier attempt that failed) is removed first.
  /// Errors: kConfiguration for a negative id; kCheckpoint when a completed checkpoint `id` already exists
  /// or the directory cannot be created.
  [[nodiscard]] Result<std::filesystem::path> init_checkpoint(int64_t id) const;

  /// Writes the state of operator `uid`, subtask `subtask`, into a new file in `dir` (a directory from
  /// init_checkpoint() or init_savepoint()) and fsyncs it. The file is: header (magic "SLSF", version),
  /// `operator_state` (OperatorStateStore::snapshot() bytes, may be empty), then the bytes of every key group
  /// of `keyed->key_group_range()` in ascending order, leaving out key groups that wrote no bytes. `keyed`
  /// may be null (no keyed state); it is only read. The handle holds the file name (sanitized uid, subtask,
  /// random suffix), size and XXH3-64 checksum of the whole file.
  /// Thread-safety: concurrent calls (for different subtasks or operators) are safe; this is what the
  /// asynchronous part of a checkpoint runs on writer threads.
  /// Errors: kCheckpoint naming the file for I/O failures; the error of write_key_group() (a thrown
  /// SluiceException or other exception, with the uid and subtask as context). No file is left on error.
  ///
  /// Incremental checkpoints: when `keyed->native()` is set and `dir` is a `chk-<n>` directory (never for a
  /// savepoint, which stays canonical), the key groups hold only write_key_group_beside_native(), the native
  /// SST files that the backend did not upload before are uploaded into `<job dir>/shared/` as
  /// `<uid>-<subtask>-<16 hex>-<file>` and the others referenced, and the remaining native files (MANIFEST,
  /// CURRENT, OPTIONS) are appended to the state file; `handle.native` lists them all. `uploaded_bytes`
  /// (nullable) receives the bytes uploaded into shared/ by this call.
  ///
  /// Local copy (task-local recovery, task_local_state_store.h): when `local_copy_dir` is not empty and `dir` is a
  /// `chk-<n>` directory, the same bytes are also written to `local_copy_dir/<file name>` (renamed into place once
  /// the primary is stored). A failure of the copy is logged and leaves no copy; it never fails the call.
  [[nodiscard]] Result<OperatorSubtaskStateHandle> write_subtask_state(
      const std::filesystem::path& dir, const std::string& uid, int subtask, const std::string& operator_state,
      const KeyedStateSnapshot* keyed, uint64_t* uploaded_bytes = nullptr,
      const std::filesystem::path& local_copy_dir = {}) const;

  /// Deletes `<job dir>/shared/<name>` (a shared file no retained checkpoint references any more; see
  /// CompletedCheckpointStore). On s3:// in the background. Never throws; failures are logged.
  void discard_shared_file(const std::string& name) const noexcept;

  /// The shared directory of the job a checkpoint directory `chk-<n>` belongs to (its sibling `shared`).
  static std::filesystem::path shared_dir_of(const std::filesystem::path& checkpoint_dir);

  /// Checks the shared file `file` of checkpoint `checkpoint_dir` against its handle: local storage its size and
  /// XXH3-64, S3 that the object exists (materialize_native() checks the downloaded bytes). Errors: kState
  /// naming the path.
  [[nodiscard]] static Status verify_shared_file(const std::filesystem::path& checkpoint_dir,
                                                 const NativeFileHandle& file);

  /// Writes the files of the native database `native` of checkpoint `checkpoint_dir` into the existing
  /// directory `target`: shared files checked (size, XXH3-64) and hard-linked (copied when linking fails) from
  /// local storage or downloaded from S3, the others from `state_file`, the subtask's mapped
  /// state file. Errors: kState naming the file.
  [[nodiscard]] static Status materialize_native(const std::filesystem::path& checkpoint_dir,
                                                 const NativeKeyedStateHandle& native, const StateFileBytes& state_file,
                                                 const std::filesystem::path& target);

  /// Completes the checkpoint or savepoint in `dir`: writes `_metadata` atomically (temporary file in `dir`,
  /// fsync, rename to `_metadata`, fsync of `dir` and of its parent). After it returns OK the checkpoint is
  /// durable and restorable. Errors: kCheckpoint naming the file when `dir` already has a `_metadata` or an
  /// I/O call fails (the temporary file is then removed).
  [[nodiscard]] Status finalize_checkpoint(const std::filesystem::path& dir, const CheckpointMetadata& metadata) const;

  /// Removes a failed or subsumed checkpoint directory and everything in it. Refuses (logs an error, removes
  /// nothing) unless `dir` is a `chk-<n>` directory of this job, or a `savepoint-*` directory without
  /// `_metadata` (a savepoint that failed): completed savepoints are never deleted by the engine.
  /// On s3:// the objects are deleted in the background (in order; finished before the storage is destroyed).
  /// Never throws; failures are logged.
  void discard(const std::filesystem::path& dir) const noexcept;

  /// Creates the directory of a new savepoint, `<target>/savepoint-<first 6 chars of the job id>-<12 random
  /// hex digits>` (Flink's naming), creating `<target>` if needed. `target_dir_uri` is parsed as in
  /// parse_location(); `id` is the checkpoint id the savepoint gets (for the log). Errors: kConfiguration
  /// for an empty or unsupported target (set execution.checkpointing.savepoint-dir or pass a target);
  /// kCheckpoint when the directory cannot be created.
  [[nodiscard]] Result<std::filesystem::path> init_savepoint(std::string_view target_dir_uri, int64_t id) const;

  /// Resolves what a user passes as execution.state-recovery.path into a checkpoint or savepoint
  /// directory: (1) a directory with a `_metadata` file, (2) the path of a `_metadata` file, or (3) a job
  /// directory `<base>/<job-id>`: its `chk-<n>` with the highest n that has a `_metadata`.
  /// Errors: kConfiguration for a bad URI; kCheckpoint naming the path and what was looked for when it
  /// does not exist or holds none of the three.
  [[nodiscard]] static Result<std::filesystem::path> resolve_restore_path(std::string_view uri);

  /// Reads and decodes `<dir>/_metadata`. Errors: kState naming the file (missing, unreadable, corrupt;
  /// see deserialize_checkpoint_metadata).
  [[nodiscard]] static Result<CheckpointMetadata> load_metadata(const std::filesystem::path& dir);

  /// The completed checkpoints of this job (`chk-<n>` directories with a `_metadata`), by ascending id.
  /// Errors: kCheckpoint when the job directory cannot be listed.
  [[nodiscard]] Result<std::vector<std::filesystem::path>> completed_checkpoints() const;

  /// A `chk-<n>` directory (prefix on s3://) of this job; `complete` when it holds a `_metadata`.
  struct CheckpointDir {
    int64_t id = 0;
    std::filesystem::path path;
    bool complete = false;
  };
  /// Every `chk-<n>` of this job, complete or not, by ascending id (one listing request on s3://); a job
  /// directory that does not exist yet has none. Errors: kCheckpoint (kConnector on s3://) when it cannot be listed.
  [[nodiscard]] Result<std::vector<CheckpointDir>> checkpoint_dirs() const;

  /// Maps the state file `handle.file` of checkpoint directory `dir` read-only into memory (mmap; no copy
  /// of the bytes, so restoring a large state starts decoding at once) and checks it against the handle:
  /// size, XXH3-64 checksum, then header. The returned bytes stay valid while the StateFileBytes lives,
  /// also after the file is deleted (checkpoint files are never modified in place). The handle's offsets
  /// index into them. Errors: kState naming the full path and the reason: missing, unreadable, truncated
  /// (expected vs actual size), checksum mismatch (expected vs actual), not a state file.
  [[nodiscard]] static Result<std::shared_ptr<const StateFileBytes>> read_state_file(
      const std::filesystem::path& dir, const OperatorSubtaskStateHandle& handle);

  /// The checks of read_state_file() without keeping the bytes (the file is streamed through the hash).
  [[nodiscard]] static Status verify_state_file(const std::filesystem::path& dir,
                                                const OperatorSubtaskStateHandle& handle);

  /// Checks that the state file `handle.file` of `dir` exists and has the size the handle records, without
  /// reading it: a stat on a file system, one HEAD request on s3://. What a JobManager checks before it deploys
  /// a restore; the TaskManagers check the checksum and header as they read the file (read_state_file).
  /// Errors: kState naming the full path: missing, truncated or of another size (expected vs actual), or
  /// the stat / HEAD failed (with its error).
  [[nodiscard]] static Status check_state_file_size(const std::filesystem::path& dir,
                                                    const OperatorSubtaskStateHandle& handle);

  /// The same for the shared file `file` of checkpoint `checkpoint_dir` (materialize_native() checks the
  /// checksum of what it downloads; local shared files by verify_shared_file()). Errors: kState naming the path.
  [[nodiscard]] static Status check_shared_file_size(const std::filesystem::path& checkpoint_dir,
                                                     const NativeFileHandle& file);

  /// The checkpoint id n of a directory named `chk-<n>`, or -1 for any other name.
  static int64_t checkpoint_id_of(const std::filesystem::path& dir) noexcept;

 private:
  class ObjectDeleter;
  FileCheckpointStorage(std::filesystem::path job_dir, std::string job_id,
                        std::shared_ptr<ObjectDeleter> deleter = nullptr)
      : job_dir_(std::move(job_dir)), job_id_(std::move(job_id)), deleter_(std::move(deleter)) {}

  std::filesystem::path job_dir_;
  std::string job_id_;
  // s3:// only: deletes discarded prefixes on a thread of its own, as discard() runs under the checkpoint
  // coordinator's lock and must not wait on the store. Drained when the last copy of the storage is destroyed.
  std::shared_ptr<ObjectDeleter> deleter_;
};

}  // namespace sluice
