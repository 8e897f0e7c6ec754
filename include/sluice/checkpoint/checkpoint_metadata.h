// CheckpointMetadata: the `_metadata` file of a completed checkpoint or savepoint (Flink's
// CheckpointMetadata with its OperatorState / OperatorSubtaskState handles, reduced to file-based storage).
//
// The metadata names, per operator uid and old subtask, the state file in the checkpoint directory, its size
// and XXH3-64 checksum, where in it the operator (list) state is, and where each key group's bytes are.
// A restore reads only the metadata to decide which bytes every new subtask gets
// (checkpoint/state_assignment.h). The binary format is in docs/state-format.md, "Checkpoint storage layout".
//
// Threading: plain values; (de)serialization functions are pure and usable from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/runtime/checkpoint_barrier.h"

namespace sluice {

/// The file name of a checkpoint's or savepoint's metadata inside its directory.
inline constexpr std::string_view kMetadataFileName = "_metadata";

/// Where the bytes of one key group are in a state file (what KeyedStateSnapshot::write_key_group wrote).
struct KeyGroupHandle {
  int32_t key_group = 0;
  uint64_t offset = 0;  ///< bytes from the start of the state file
  uint64_t length = 0;  ///< bytes; never 0 (empty key groups are not recorded)
  friend bool operator==(const KeyGroupHandle&, const KeyGroupHandle&) = default;
};

/// One file of a native (incremental rocksdb) keyed state: in the job's shared directory, or inside the state
/// file of the checkpoint.
struct NativeFileHandle {
  std::string local_name;   ///< the file's name in the database directory (000012.sst, MANIFEST-000005, ...)
  std::string shared_name;  ///< its object in `<job dir>/shared/`, or "" when its bytes are in the state file
  uint64_t offset = 0;      ///< bytes from the start of the state file (shared_name empty)
  uint64_t size = 0;        ///< bytes
  uint64_t checksum = 0;    ///< XXH3-64 of a shared file (0 in the state file, which has its own checksum)
  friend bool operator==(const NativeFileHandle&, const NativeFileHandle&) = default;
};

/// The database of one subtask's incremental rocksdb checkpoint (Flink's IncrementalRemoteKeyedStateHandle).
struct NativeKeyedStateHandle {
  int32_t key_group_start = 0;  ///< the key groups the database holds: [start, end]
  int32_t key_group_end = -1;
  std::vector<NativeFileHandle> files;  ///< every file of the database, by name
  friend bool operator==(const NativeKeyedStateHandle&, const NativeKeyedStateHandle&) = default;
};

/// The state of one operator in one (old) subtask: one file in the checkpoint directory.
struct OperatorSubtaskStateHandle {
  int subtask = 0;                         ///< the subtask index at the time of the checkpoint
  std::string file;                        ///< file name relative to the checkpoint directory
  uint64_t file_size = 0;                  ///< bytes
  uint64_t checksum = 0;                   ///< XXH3-64 (seed 0) of the whole file
  uint64_t operator_state_offset = 0;      ///< OperatorStateStore::snapshot() bytes: offset in the file
  uint64_t operator_state_length = 0;      ///< ... and length (0: no operator state)
  std::vector<KeyGroupHandle> key_groups;  ///< ascending key group; only non-empty key groups
  /// Incremental rocksdb checkpoints: the database's files (key_groups then hold timers and state beside it).
  std::optional<NativeKeyedStateHandle> native;
  /// The resource id of the TaskManager that wrote the file (cluster mode; Flink's TaskManagerLocation of a
  /// subtask's state), which a restore prefers for the subtask so that a TaskManager-local copy of the file can
  /// be read. "" when unknown: local mode, a file the JobManager wrote, metadata of format version 1 or 2.
  std::string location;
  friend bool operator==(const OperatorSubtaskStateHandle&, const OperatorSubtaskStateHandle&) = default;
};

/// The state of one operator (by uid) across all its subtasks at the time of the checkpoint.
struct OperatorStateEntry {
  std::string uid;
  int parallelism = 0;                               ///< number of subtasks when the checkpoint was taken
  int max_parallelism = 0;                           ///< number of key groups
  std::vector<OperatorSubtaskStateHandle> subtasks;  ///< ascending subtask; subtasks without state may be absent
  friend bool operator==(const OperatorStateEntry&, const OperatorStateEntry&) = default;
};

/// Everything a restore needs to know about one completed checkpoint or savepoint.
struct CheckpointMetadata {
  int64_t checkpoint_id = 0;
  TimestampMs trigger_timestamp = 0;  ///< ms since the Unix epoch
  SnapshotType type = SnapshotType::kCheckpoint;
  std::string job_id;
  std::vector<OperatorStateEntry> operators;
  std::map<std::string, std::string> coordinator_state;  ///< per source uid: the split enumerator's bytes
  uint64_t total_state_bytes = 0;                        ///< sum of the state files' sizes
  friend bool operator==(const CheckpointMetadata&, const CheckpointMetadata&) = default;
};

/// Current version of the metadata format (docs/state-format.md, "Checkpoint storage layout"). Version 2 adds
/// the native handles of incremental checkpoints, version 3 the location of each subtask's state; versions 1
/// and 2 are still read (location "").
inline constexpr uint32_t kCheckpointMetadataVersion = 3;

/// Whether `name` names an entry inside one directory: not empty, not "." or "..", no '/' and no NUL. Every name
/// that a handle, a TaskManager's message or a job id contributes to a checkpoint path is checked with it, so none
/// reaches outside its directory.
inline bool is_plain_file_name(std::string_view name) noexcept {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

/// The shared files (`<job dir>/shared/<name>`) a checkpoint references, with their sizes.
std::map<std::string, uint64_t> shared_files_of(const CheckpointMetadata& metadata);

/// Encodes `metadata` (magic "SLCM", version, fields, trailing XXH3-64 of everything before it).
std::string serialize_checkpoint_metadata(const CheckpointMetadata& metadata);

/// Decodes bytes written by serialize_checkpoint_metadata (any version from 1 to kCheckpointMetadataVersion).
/// `file` names the source in error messages (the path of the _metadata file). Errors (kState, naming `file`):
/// wrong magic, unknown version, truncated
/// bytes, checksum mismatch (expected vs actual), trailing bytes, or inconsistent handles (a subtask outside
/// [0, parallelism), a key group outside [0, max parallelism) or out of order, a range past the file size).
[[nodiscard]] Result<CheckpointMetadata> deserialize_checkpoint_metadata(std::string_view bytes, std::string_view file);

}  // namespace sluice
