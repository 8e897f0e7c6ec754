// The type-erased view of keyed state that checkpoints move around (Flink's KeyedStateHandle and
// SnapshotResources, reduced to what a local checkpoint needs).
//
// A keyed operator captures its state on the task thread (KeyedStateSnapshot: cheap, consistent as of the
// capture) and the checkpoint writer thread later asks it for the bytes of each key group. On restore the
// runtime hands the operator the bytes of every key group of its new range (KeyedStateRestore), possibly
// written by several old subtasks: that is how keyed state moves when the parallelism changes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"

namespace sluice {

/// A file of an incremental snapshot that a checkpoint uploaded into the job's shared area
/// (`<checkpoint dir>/<job-id>/shared/`), where later checkpoints reference it instead of uploading it again.
struct SharedStateFile {
  std::string name;       ///< object name inside the shared directory
  uint64_t size = 0;      ///< bytes
  uint64_t checksum = 0;  ///< XXH3-64 (seed 0) of the whole file
};

/// The native files of an incremental keyed-state snapshot (the rocksdb backend's hard-link RocksDB
/// checkpoint; Flink's IncrementalRemoteKeyedStateHandle before the upload). The checkpoint writer uploads the
/// immutable files (SST) that no earlier checkpoint of the same backend uploaded into the shared area and
/// embeds the others (MANIFEST, CURRENT, OPTIONS) in the checkpoint's own state file.
/// Thread-safety: complete() and record_upload() are thread-safe, the rest is immutable once complete() returned;
/// used on writer threads.
class NativeKeyedStateSnapshot {
 public:
  virtual ~NativeKeyedStateSnapshot() = default;
  /// The key groups the database holds.
  virtual KeyGroupRange key_group_range() const = 0;
  /// The asynchronous part of the snapshot, on the writer thread before directory() and files(): waits for what
  /// the capture started (the rocksdb backend: the flush of the barrier's memtables) and collects the files.
  /// Returns false when the files cannot hold exactly the captured state (the writer then writes the capture
  /// canonically, write_key_group()). Idempotent. Errors: kState.
  [[nodiscard]] virtual Result<bool> complete() const = 0;
  /// The local directory holding the files; it lives as long as the snapshot.
  virtual const std::filesystem::path& directory() const = 0;
  /// The file names in directory(), sorted; after complete() returned true.
  virtual const std::vector<std::string>& files() const = 0;
  /// The copy of `file` in the shared area that an earlier checkpoint of the same backend uploaded, if any.
  virtual std::optional<SharedStateFile> uploaded_before(std::string_view file) const = 0;
  /// Records that `file` is now in the shared area as `shared` (after the upload, on a writer thread).
  virtual void record_upload(std::string_view file, const SharedStateFile& shared) const = 0;
  /// True for immutable files that go to the shared area (RocksDB's SST files).
  static bool is_shared_file(std::string_view name) { return name.size() > 4 && name.ends_with(".sst"); }
};

/// A consistent capture of one operator subtask's keyed state (state tables and timers).
/// Thread-safety: created on the task thread; write_key_group() may then run on another thread while the task
/// keeps processing (the capture must not change). Destroyed on any thread.
class KeyedStateSnapshot {
 public:
  virtual ~KeyedStateSnapshot() = default;
  /// The key groups this capture covers.
  virtual KeyGroupRange key_group_range() const = 0;
  /// Number of key groups of the operator (its max parallelism).
  virtual int max_parallelism() const = 0;
  /// Appends the bytes of key group `kg` (inside key_group_range()). The bytes are self-delimiting only
  /// together with their length, which the storage records. Throws SluiceException (kState) on misuse.
  virtual void write_key_group(KeyGroup kg, DataOutput& out) const = 0;
  /// The native files of an incremental snapshot, or nullptr (the backend writes key groups only). Checkpoints
  /// (not savepoints, which stay canonical) then store the files and write_key_group_beside_native().
  virtual const NativeKeyedStateSnapshot* native() const { return nullptr; }
  /// With native(): the bytes of key group `kg` that are not in the native files (timers, restored state not
  /// registered yet), in write_key_group()'s format.
  virtual void write_key_group_beside_native(KeyGroup kg, DataOutput& out) const { write_key_group(kg, out); }
};

/// The database of one old subtask's incremental checkpoint, to be restored (Flink's
/// IncrementalRemoteKeyedStateHandle on the restore side).
struct NativeKeyedStateRestore {
  /// The key groups the old subtask's database holds.
  KeyGroupRange key_groups;
  /// Writes the database's files into the existing, empty directory `dir`: shared files linked (local storage)
  /// or downloaded (S3), private files from the checkpoint's state file, sizes and checksums checked. Errors:
  /// kState naming the file. Any thread; each call writes the files again.
  std::function<Status(const std::filesystem::path& dir)> materialize;
};

/// The keyed state restored into one operator subtask: for each key group of its new range that had state,
/// the bytes one KeyedStateSnapshot::write_key_group() wrote. Immutable once built; shared read-only.
///
/// The bytes are views, not copies: into the state files as the checkpoint storage mapped them (a restore of
/// 1 GiB must not copy 1 GiB before decoding it), kept alive by `owners`.
struct KeyedStateRestore {
  int max_parallelism = 0;
  /// Key group -> its bytes; each view points into memory one of `owners` keeps alive.
  std::map<int32_t, std::string_view> key_groups;
  /// Keep-alive references to the memory the views point into (a mapped state file, or private copies).
  std::vector<std::shared_ptr<const void>> owners;
  /// Databases of an incremental checkpoint whose key groups intersect the subtask's range (only the rocksdb
  /// backend restores them; the key-group bytes above then hold timers and states beside them).
  std::vector<NativeKeyedStateRestore> native;

  /// Sets key group `kg` to a private copy of `bytes` (replacing an earlier entry); for tests and small states.
  void add_copy(int32_t kg, std::string_view bytes) {
    auto copy = std::make_shared<const std::string>(bytes);
    key_groups[kg] = std::string_view(*copy);
    owners.push_back(std::move(copy));
  }
};

}  // namespace sluice
