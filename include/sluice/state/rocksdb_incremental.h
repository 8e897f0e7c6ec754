// Incremental checkpoints of the rocksdb state backend (Flink's RocksIncrementalSnapshotStrategy and
// RocksDBIncrementalRestoreOperation): the native side of a RocksDBKeyedStateBackend's capture and restore.
//
// Snapshot: the synchronous part switches the memtables and pins a RocksDB snapshot (no I/O); on the checkpoint
// writer thread the asynchronous part waits for the memtables' flush and creates a RocksDB checkpoint (hard links
// of the SST files, copies of MANIFEST, CURRENT and OPTIONS) in a sibling of the working directory, then uploads
// the SST files that no earlier checkpoint of this backend uploaded into the job's shared area and references the
// others (RocksDBUploadLedger remembers what went where). Flink flushes on the task thread (its synchronous part);
// here the flush of a few MiB of memtable (20-60 ms measured) runs beside the task. When a later memtable was
// flushed too before the checkpoint was linked, its files hold writes after the barrier: that checkpoint is
// written canonically from the snapshot instead, and the backend's next capture flushes synchronously. Restore: the old
// subtasks' files are materialized locally; the database sharing the most key groups with the new range is opened
// in place and clipped with range deletions, the others are opened beside it and their entries of the range written
// into SST files that the new database ingests (rescaling).
//
// Threading: RocksDBNativeSnapshot is created on the task thread and completed and read on a writer thread;
// restore_native_database() runs on the task thread. Errors: kState naming the directory or file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/key_group.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {

/// Which local SST files of one backend were uploaded into the shared area, and as what. The base of the next
/// incremental checkpoint: a file listed here is referenced, not uploaded again. Shared files are deleted only
/// when no retained checkpoint references them and never when no completed checkpoint registered them
/// (CompletedCheckpointStore), so a file uploaded for a checkpoint that was later aborted stays usable. SST
/// file numbers are never reused within one database, so a local name identifies its contents. Thread-safe.
class RocksDBUploadLedger {
 public:
  std::optional<SharedStateFile> find(std::string_view file) const;
  void record(std::string_view file, const SharedStateFile& shared);
  /// Forgets files no longer in `live` (compacted away): they never come back.
  void retain_only(const std::vector<std::string>& live);
  size_t size() const;
  /// Asks the backend's captures to flush synchronously (a capture's asynchronous checkpoint was overtaken by later
  /// writes) until one of them completes (a savepoint's capture never does).
  void request_synchronous_capture() { synchronous_capture_.store(true); }
  bool synchronous_capture_requested() const { return synchronous_capture_.load(); }
  void synchronous_capture_completed() { synchronous_capture_.store(false); }

 private:
  std::atomic<bool> synchronous_capture_{false};
  mutable std::mutex mu_;
  std::map<std::string, SharedStateFile, std::less<>> files_;
};

/// The RocksDB checkpoint of one capture, in a directory removed when the snapshot is destroyed.
class RocksDBNativeSnapshot final : public NativeKeyedStateSnapshot {
 public:
  /// How long complete() waits for the flush of the barrier's memtables (Flink's default checkpoint timeout).
  static constexpr std::chrono::milliseconds kFlushTimeout{10 * 60 * 1000};

  /// The synchronous part of the capture of `db` for the key groups `range`, whose checkpoint goes into `dir`
  /// (must not exist): RocksDBInstance::begin_checkpoint(), or create_checkpoint() when `synchronous` (the capture
  /// has no canonical form to fall back on) or the ledger asks for a synchronous capture. Task thread. Throws
  /// kState.
  RocksDBNativeSnapshot(std::shared_ptr<RocksDBInstance> db, std::filesystem::path dir, KeyGroupRange range,
                        std::shared_ptr<RocksDBUploadLedger> ledger, bool synchronous = false);
  ~RocksDBNativeSnapshot() override;
  RocksDBNativeSnapshot(const RocksDBNativeSnapshot&) = delete;
  RocksDBNativeSnapshot& operator=(const RocksDBNativeSnapshot&) = delete;

  KeyGroupRange key_group_range() const override { return range_; }
  /// Waits for the flush and links the checkpoint (RocksDBInstance::finish_checkpoint()); false when the files
  /// would hold later writes (then the next capture of the backend flushes synchronously). Writer thread.
  Result<bool> complete() const override;
  const std::filesystem::path& directory() const override { return dir_; }
  const std::vector<std::string>& files() const override { return files_; }
  std::optional<SharedStateFile> uploaded_before(std::string_view file) const override { return ledger_->find(file); }
  void record_upload(std::string_view file, const SharedStateFile& shared) const override {
    ledger_->record(file, shared);
  }

 private:
  std::shared_ptr<RocksDBInstance> db_;
  std::filesystem::path dir_;
  KeyGroupRange range_;
  std::shared_ptr<RocksDBUploadLedger> ledger_;
  mutable std::mutex mu_;                                                  // complete()
  mutable std::shared_ptr<const RocksDBInstance::CheckpointStart> start_;  // until complete()
  mutable std::optional<Result<bool>> completed_;
  bool synchronous_ = false;  // flushed on the task thread
  mutable std::vector<std::string> files_;
};

/// The smallest RocksDB key of key group `kg` and the first key after key group `last`: [begin, end) covers
/// the key groups [first, last] (2-byte big-endian prefixes).
std::string rocksdb_key_group_begin(int32_t kg);

/// Builds the database of a subtask owning `range` in `working_dir` (which must not exist) from `sources` (the
/// old subtasks' databases of an incremental checkpoint): the source sharing the most key groups with `range` is
/// materialized into `working_dir`, opened and clipped; every other source intersecting `range` is
/// materialized beside it, opened, and its entries of `range` copied in (copy_range_from()). Without an
/// intersecting source the database starts empty. Task thread. Errors: the sources' materialize() errors, kState for
/// RocksDB failures.
[[nodiscard]] Result<std::shared_ptr<RocksDBInstance>> restore_native_database(
    const std::filesystem::path& working_dir, KeyGroupRange range, const std::vector<NativeKeyedStateRestore>& sources,
    const RocksDBMemoryOptions& memory);

}  // namespace sluice
