// State assignment: the restore side of checkpoints (Flink's StateAssignmentOperation and
// CheckpointCoordinator#restoreLatestCheckpointedState, reduced to file-based storage).
//
// Given the metadata of a completed checkpoint or savepoint, computes the state of every subtask of a job
// vertex at its (possibly new) parallelism:
//  * keyed state moves by key group: new subtask i of p gets the bytes of every key group of
//    KeyGroupRange::for_operator_index(max parallelism, p, i), from whichever old subtask's file holds it;
//  * operator (list) state is redistributed by OperatorStateStore::redistribute over the old subtasks'
//    snapshots in old subtask order (even split for list state, everything for union list state).
// Before the job restores, load_for_restore() picks the checkpoint (optionally falling back to older ones)
// and check_unclaimed_state() refuses state that the job would silently drop.
//
// Threading: free functions without shared state; usable from any thread, concurrently.
// Errors: kState for state that cannot be restored (missing, truncated or corrupted files, a changed max
// parallelism, unclaimed state), naming the file or uid and how to fix it; kConfiguration for an invalid
// VertexToRestore.
#pragma once

#include <filesystem>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/core/error.h"
#include "sluice/runtime/task_state.h"

namespace sluice {

class TaskLocalStateStore;

/// Where the state files a restore read came from.
struct StateReadStats {
  int local_files = 0;  ///< read from the TaskManager's local copies (task-local recovery)
  uint64_t local_bytes = 0;
  int remote_files = 0;  ///< read from the checkpoint storage
  uint64_t remote_bytes = 0;
};

/// The restoring side of one job vertex (one chain of operators) at its new parallelism.
struct VertexToRestore {
  std::vector<std::string> operator_uids;  ///< chain order
  int parallelism = 0;                     ///< the new number of subtasks (>= 1)
  std::vector<int> max_parallelism;        ///< per uid, same order as operator_uids
  /// The new subtasks whose state to compute (index = subtask); empty = all. A TaskManager computes only its
  /// own subtasks', so it reads only the files holding their key groups.
  std::vector<bool> subtasks;
};

/// Computes the state of each of the `vertex.parallelism` new subtasks (index = subtask) from checkpoint
/// `metadata` stored in `dir`. Each TaskRestore has checkpoint_id = metadata.checkpoint_id and an entry for
/// every uid of the vertex that the metadata has: operator_state holds the redistributed
/// OperatorStateStore bytes ("" when no old subtask had operator state), keyed the key groups of the new
/// subtask's range that had bytes (null when the operator had no keyed state). Uids absent from the
/// metadata get no entry (a fresh start for that operator). A subtask left out of `vertex.subtasks` gets null.
/// Every file read is checked (size, XXH3-64 checksum) once per call; files without needed state are not
/// read. Memory: the files of the vertex's operators are held while the call runs.
/// Errors: kState when an operator with keyed state had another max parallelism (names the uid and both
/// values), when a state file is missing, truncated or corrupted (names the full path and expected vs actual
/// size or checksum), or when the metadata is inconsistent (a key group or subtask stored twice);
/// kConfiguration for an invalid `vertex` (sizes differ, parallelism < 1 or above the max parallelism,
/// a uid twice, `subtasks` neither empty nor of size parallelism).
///
/// Local recovery: with `local`, a state file with a local copy there (TaskLocalStateStore::find) whose size and
/// checksum equal the handle's is read from it; a copy that differs is logged and the file read from `dir`.
/// `stats` (nullable) receives how many files and bytes came from each.
[[nodiscard]] Result<std::vector<std::shared_ptr<const TaskRestore>>> assign_subtask_states(
    const CheckpointMetadata& metadata, const std::filesystem::path& dir, const VertexToRestore& vertex,
    const TaskLocalStateStore* local = nullptr, StateReadStats* stats = nullptr);

/// Checks that the job claims all state in `metadata`: every operator uid with state (operator state, key
/// groups or coordinator state) must be in `job_uids`. Otherwise returns kState listing the unclaimed uids
/// and naming the option execution.state-recovery.ignore-unclaimed-state; with `ignore_unclaimed` it logs
/// a warning instead and returns OK (that state is dropped).
[[nodiscard]] Status check_unclaimed_state(const CheckpointMetadata& metadata, const std::set<std::string>& job_uids,
                                           bool ignore_unclaimed);

/// How much of a checkpoint's files verify_checkpoint_files() checks.
enum class CheckpointFileCheck {
  /// Each file exists with the size its handle records (a stat or one HEAD request each; nothing is read).
  /// What a JobManager checks before it deploys a restore: the TaskManagers check the checksums as they read
  /// the state (assign_subtask_states, FileCheckpointStorage::materialize_native), and a corrupted file fails
  /// their tasks, naming the file.
  kSize,
  /// Also the XXH3-64 checksum and header of each file (every byte read once): what a restore that may fall
  /// back to an older checkpoint checks before it picks one.
  kChecksum,
};

/// Checks every state file that `metadata` references in `dir`: exists and size, and with kChecksum the
/// XXH3-64 checksum and header (streaming each file once). Errors: the first failure, kState naming the full
/// path and the reason (see FileCheckpointStorage::read_state_file) with the checkpoint, operator and subtask.
[[nodiscard]] Status verify_checkpoint_files(const CheckpointMetadata& metadata, const std::filesystem::path& dir,
                                             CheckpointFileCheck check = CheckpointFileCheck::kChecksum);

/// A checkpoint or savepoint whose metadata was read and whose files were verified.
struct LoadedCheckpoint {
  std::filesystem::path dir;
  CheckpointMetadata metadata;
};

/// Loads the first usable checkpoint of `candidates` (checkpoint or savepoint directories, newest first):
/// reads its metadata and verifies every file it references (verify_checkpoint_files with `check`). Without
/// `fallback` only the first candidate is tried and its error returned. With `fallback`, a candidate that
/// fails is logged (warning) and the next older one tried. Errors: kState when there is no candidate, or when
/// none works (lists each candidate with its failure; the first failure is the cause).
[[nodiscard]] Result<LoadedCheckpoint> load_for_restore(std::span<const std::filesystem::path> candidates,
                                                        bool fallback,
                                                        CheckpointFileCheck check = CheckpointFileCheck::kChecksum);

}  // namespace sluice
