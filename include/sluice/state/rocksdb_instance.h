// RocksDBInstance: one RocksDB database on local disk, the storage of one operator subtask's keyed state in
// the rocksdb state backend (Flink's RocksDBKeyedStateBackend keeps one instance per subtask, too). The typed
// states (rocksdb_keyed_state_backend.h) see column families as opaque handles and keys and values as bytes.
//
// The implementation, the only code that includes RocksDB's headers, is the loadable module
// libsluice_rocksdb.so (state/rocksdb/rocksdb_database.cc), loaded by the first open() or open_existing() of the
// process: a job that keeps its state on the heap never maps librocksdb (6 MiB of its pages were resident in every
// idle `sluice run` while it was linked in; docs/benchmarks.md). Where the module is looked for:
// state/rocksdb/rocksdb_module.h.
//
// Layout: one column family per state, and one per timer queue when timers live in RocksDB
// (state.backend.rocksdb.timer-service.factory: rocksdb; rocksdb_timer_queue.h); keys are compared bytewise,
// so the backend's 2-byte big-endian key group prefix keeps each key group contiguous (snapshots and rescaling
// scan one key group). The write-ahead log is off, as in Flink: state survives a crash through checkpoints, never
// through the local files, and the working directory is deleted when the instance is destroyed.
//
// Thread-safety: writes and column-family creation happen on the task thread only. Reads through a
// Snapshot (scan) and the asynchronous part of a checkpoint (finish_checkpoint) may run on any thread
// concurrently with the task's writes (RocksDB is thread-safe). An instance lives as long as the longest of its
// backend, its snapshots and its started checkpoints (shared_ptr).
// Errors: RocksDB failures throw SluiceException (kState) naming the directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice {

/// How much memory RocksDB may use (Flink's state.backend.rocksdb.memory.managed: the block cache and the
/// memtables share one budget), for one database or, with `shared_scope`, for all the databases of a slot. With
/// `managed_bytes` = 0 RocksDB's own defaults apply, which do not bound memory as the state grows.
struct RocksDBMemoryOptions {
  /// The budget in bytes for block cache plus memtables (write buffers); 0: unbounded (RocksDB defaults).
  uint64_t managed_bytes = 0;
  /// Share of the budget for memtables (Flink's state.backend.rocksdb.memory.write-buffer-ratio), in (0, 1).
  double write_buffer_ratio = 0.5;
  /// Share of the block cache reserved for index and filter blocks (Flink's
  /// state.backend.rocksdb.memory.high-prio-pool-ratio), in [0, 1).
  double high_priority_pool_ratio = 0.1;
  /// Databases of one process opened with the same non-empty scope and the same budget share that budget: one
  /// block cache and one write buffer manager for all of them, as Flink shares a slot's managed memory among the
  /// RocksDB backends in the slot. Empty: a budget of the database's own.
  std::string shared_scope;
};

/// One RocksDB database in a private working directory.
class RocksDBInstance : public std::enable_shared_from_this<RocksDBInstance> {
 public:
  /// A column family (one per state); owned by the instance, valid as long as it.
  struct ColumnFamily;
  /// A consistent point-in-time view for reads (RocksDB's snapshot); keeps the instance alive.
  class Snapshot;

  /// Opens a new, empty database in `dir` (loading the module on first use; throws SluiceException
  /// kConfiguration naming each place tried when it cannot be loaded): anything already at `dir` (a leftover of a
  /// crashed process) is removed first, and `dir` is removed again when the instance is destroyed. Throws
  /// SluiceException (kState) when the directory cannot be created or RocksDB cannot open it.
  ///
  /// Memory: with a budget, as Flink's RocksDBMemoryControllerUtils, the block cache gets
  /// (3 - write_buffer_ratio) / 3 of it and a write buffer manager, charging memtables to that same cache (both
  /// shared by the databases of one `memory.shared_scope`),
  /// flushes them when they exceed 2 * write_buffer_ratio / 3 of it; index and filter blocks live in the
  /// cache too. So blocks, indexes, filters and memtables together stay near the budget whatever the state
  /// size (iterators pinning blocks and RocksDB's own structures come on top). Throws kConfiguration for
  /// ratios outside their ranges.
  static std::shared_ptr<RocksDBInstance> open(const std::filesystem::path& dir,
                                               const RocksDBMemoryOptions& memory = {});
  /// Opens the database whose files are already in `dir` (restored from an incremental checkpoint: SST
  /// files, MANIFEST, CURRENT, OPTIONS) with all its column families; `dir` is removed when the instance is
  /// destroyed. Memory as open(). Throws SluiceException (kState) naming `dir` when RocksDB cannot open it.
  static std::shared_ptr<RocksDBInstance> open_existing(const std::filesystem::path& dir,
                                                        const RocksDBMemoryOptions& memory = {});
  virtual ~RocksDBInstance() = default;
  RocksDBInstance(const RocksDBInstance&) = delete;
  RocksDBInstance& operator=(const RocksDBInstance&) = delete;

  const std::filesystem::path& directory() const noexcept { return dir_; }

  /// What a compaction filter decides for one stored value.
  enum class FilterDecision : uint8_t { kKeep, kRemove, kChange };
  /// Decides, during RocksDB's compactions (on its background threads, so it must be thread-safe), whether
  /// a value stays, goes, or is replaced by `new_value`: how state TTL drops expired entries that are never
  /// read again (Flink's TTL compaction filter).
  using ValueFilter = std::function<FilterDecision(std::string_view value, std::string& new_value)>;

  /// The column family `name`, created on first use with `filter` as its compaction filter (an existing one
  /// gets `filter` when it is not null: a restored database learns its states' TTL on registration). Every column
  /// family has a merge operator that concatenates values (list states append with merge()). Task thread only.
  virtual ColumnFamily* column_family(std::string_view name, ValueFilter filter = nullptr) = 0;

  /// Installs `filter` as the compaction filter of state `name`'s column family (one opened by
  /// open_existing() has none until its state is registered). Task thread.
  virtual void set_filter(std::string_view name, ValueFilter filter) = 0;

  /// The column family of timer queue `name` (rocksdb_timer_queue.h), created on first use; kept apart from
  /// the states' (state_names() does not list it), checkpointed, copied and clipped with them. Task thread.
  virtual ColumnFamily* timer_column_family(std::string_view name) = 0;
  /// The column family of timer queue `name`, or nullptr when the database has none (a restored database
  /// holds the timer queues of the job that wrote it).
  virtual ColumnFamily* find_timer_column_family(std::string_view name) const = 0;
  /// Drops timer queue `name` and its entries (no-op when absent): its timers moved to the heap. Only while no
  /// capture refers to the family (a restore, before the first checkpoint). Task thread.
  virtual void drop_timer_column_family(std::string_view name) = 0;
  /// Names of the timer queues' column families (without the internal "timer/" prefix), sorted.
  virtual std::vector<std::string> timer_names() const = 0;

  /// Names of the states' column families (without the internal "state/" prefix), sorted.
  virtual std::vector<std::string> state_names() const = 0;

  /// The per-state metadata kept in the database itself (the state's kind and format flags, so a database
  /// restored from its files can check a registration); empty when `name` has none.
  virtual std::string state_meta(std::string_view name) const = 0;
  virtual void set_state_meta(std::string_view name, std::string_view bytes) = 0;

  /// An incremental checkpoint between its synchronous part (begin_checkpoint()) and its asynchronous part
  /// (finish_checkpoint()): a snapshot pinning the sequence number of the barrier and the column families whose
  /// memtables were switched. Keeps the instance alive.
  struct CheckpointStart;

  /// The synchronous part of an incremental checkpoint into `target` (which must not exist; same file system as
  /// directory()), at the barrier: makes every non-empty memtable immutable and schedules its flush without
  /// waiting for it (a flush of a few MiB took 20-60 ms of the task's time), and pins a snapshot of the current
  /// sequence number. No I/O; later writes go into new memtables. When the flush lands, RocksDB's flush thread
  /// links the checkpoint (SST files as hard links, MANIFEST, CURRENT and OPTIONS copied) before it flushes
  /// anything later. Returns nullptr when RocksDB has stopped writes (it then refuses a flush it would not wait
  /// for): use create_checkpoint(). Task thread. Throws kState.
  virtual std::shared_ptr<const CheckpointStart> begin_checkpoint(const std::filesystem::path& target) = 0;

  /// The asynchronous part: waits until the checkpoint of `start` is linked (linking it on this thread when no
  /// flush was needed) and returns the file names in its target, or nullopt (and the target removed) when the
  /// database's files held writes after the barrier by then (a later memtable was flushed first), so no
  /// checkpoint of them is the state as of `start`. Any thread, while the task writes. Throws kState, also when a
  /// background error of RocksDB stops the flush or it has not finished after `timeout`.
  virtual std::optional<std::vector<std::string>> finish_checkpoint(const CheckpointStart& start,
                                                                    std::chrono::milliseconds timeout) = 0;

  /// Tests only: while `hold`, RocksDB's flush thread links no checkpoint, so finish_checkpoint() links late (once
  /// no immutable memtable is left) and its check decides.
  virtual void hold_checkpoint_links_for_testing(bool hold) = 0;

  /// Both parts of an incremental checkpoint on the calling thread: flushes every memtable and waits for it, then
  /// creates the checkpoint in `target` as finish_checkpoint() does. Returns the file names in `target`. Used after
  /// a finish_checkpoint() returned nullopt, so one checkpoint of a busy database surely completes natively. Task
  /// thread. Throws kState.
  virtual std::vector<std::string> create_checkpoint(const std::filesystem::path& target) = 0;

  /// Copies every entry of every state and timer column family of `other` whose key lies in [begin, end) (bytewise)
  /// into the column family of the same name here (created when missing), with its state metadata; the
  /// restore of a rescaled incremental checkpoint. The entries are written into SST files of about 64 MiB under
  /// `<dir>/restore-ingest` and ingested (moved into the database), not written through the memtables. Task
  /// thread. Throws kState.
  virtual void copy_range_from(const RocksDBInstance& other, std::string_view begin, std::string_view end) = 0;

  /// Deletes every key outside [begin, end) in every state and timer column family (RocksDB range deletions;
  /// compactions reclaim the space later): clips a restored database to the subtask's key groups. Task thread.
  virtual void clip_to_range(std::string_view begin, std::string_view end) = 0;

  /// Reads `key`; returns false when it is absent. `value` is overwritten when found.
  virtual bool get(ColumnFamily* cf, std::string_view key, std::string& value) const = 0;
  virtual void put(ColumnFamily* cf, std::string_view key, std::string_view value) = 0;
  /// Appends `bytes` to the value of `key` (creating it): the list states' add without a read.
  virtual void merge(ColumnFamily* cf, std::string_view key, std::string_view bytes) = 0;
  virtual void remove(ColumnFamily* cf, std::string_view key) = 0;

  /// From begin_batch() to commit_batch(), put/merge/remove go into write batches (a restore writes its
  /// entries this way): each batch is written when it holds 4 MiB, so memory stays bounded and a batch is
  /// not atomic. get() does not see writes of the open batch. Task thread only.
  virtual void begin_batch() = 0;
  virtual void commit_batch() = 0;

  /// A consistent view of the database as of now; reads through it see no later write.
  virtual std::shared_ptr<const Snapshot> snapshot() = 0;

  /// Calls fn(key, value) for every key of `cf` starting with `prefix`, in bytewise key order, until fn
  /// returns false. Reads `snapshot` when given, else the live database. Any thread with a snapshot; the
  /// task thread without one. fn must not write to the instance.
  virtual void scan(ColumnFamily* cf, std::string_view prefix, const Snapshot* snapshot,
                    const std::function<bool(std::string_view key, std::string_view value)>& fn) const = 0;

  /// Removes every key of `cf` starting with `prefix` (task thread).
  virtual void remove_prefix(ColumnFamily* cf, std::string_view prefix) = 0;

  /// Bytes RocksDB estimates the live data of all column families takes (for tests and metrics).
  virtual uint64_t estimated_live_bytes() const = 0;

  /// Memory RocksDB accounts for now: memtables, block cache usage (index and filter blocks included when
  /// a budget is set) and table readers; for tests and metrics.
  virtual uint64_t memory_usage() const = 0;

  /// Flushes the memtables and compacts every column family completely (for tests and tools).
  virtual void compact() = 0;

  /// How many open databases draw on this one's memory budget, itself included (1 without a shared scope or
  /// budget); for tests and logs.
  virtual size_t databases_sharing_budget() const = 0;

 protected:
  explicit RocksDBInstance(std::filesystem::path dir) : dir_(std::move(dir)) {}

 private:
  std::filesystem::path dir_;
};

}  // namespace sluice
