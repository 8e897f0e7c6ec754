// KeyedStateStore<K>: the keyed state of one operator subtask in the backend the job's configuration selects
// (state.backend.type: hashmap or rocksdb), behind one API for keyed operators and user functions (Flink's
// KeyedStateStore / the RuntimeContext's getState). get_state() returns the user-facing interfaces of state.h
// (ValueState<T>& ...), implemented by HeapValueState (hashmap) or RocksDBValueState (rocksdb).
//
// Timers live on the heap (state.backend.rocksdb.timer-service.factory: heap, the default here; Flink's default
// is rocksdb) or, with rocksdb and timer-service.factory: rocksdb, in the subtask's database (attach_timers()).
// Either way the store owns a HeapKeyedStateBackend, which with rocksdb holds no state and only carries the
// current key and its hash for the InternalTimerService. Operators that fire timers make the fired key current
// with set_current_key() so RocksDB states see it too.
//
// The engine's keyed operators (reduce, windows, joins, keyed connect) use the heap's typed states on hashmap
// and the RocksDB states on rocksdb. User functions written against the heap's typed states reach them with
// heap(), which throws kConfiguration when the job runs on rocksdb, so a job is never silently run on the heap
// when it asked for RocksDB.
//
// Threading: the task thread, as the backends. Errors: kConfiguration for bad options, kState as the backends.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_operator_snapshot.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/state.h"
#include "sluice/state/timer_service.h"

namespace sluice {

class Configuration;

/// The state backend options of a job (the state.backend.* keys of docs/configuration.md).
struct StateBackendOptions {
  enum class Type { kHashMap, kRocksDB };
  Type type = Type::kHashMap;
  /// state.backend.rocksdb.localdir; empty: std::filesystem::temp_directory_path().
  std::filesystem::path local_dir;
  /// The RocksDB memory budget (state.backend.rocksdb.memory.*): per slot with for_subtask(), else per database.
  RocksDBMemoryOptions memory;
  /// state.backend.incremental: rocksdb checkpoints upload only new SST files (rocksdb_incremental.h).
  bool incremental = false;
  /// state.backend.rocksdb.timer-service.factory = rocksdb: timers in the RocksDB database (rocksdb only).
  bool rocksdb_timers = false;

  /// Reads the options from `config` (nullptr: the defaults, hashmap). Throws SluiceException
  /// (kConfiguration) for values validate_engine_options() refuses, with the same reasons.
  static StateBackendOptions from_config(const Configuration* config);

  /// from_config(), with the RocksDB memory budget shared per slot as Flink's fixed-per-slot: the databases of
  /// subtask `subtask_index` of every keyed operator of the job whose configuration is `config` share one budget
  /// in this process (`memory.shared_scope`), since slot sharing puts subtask i of each operator into shared slot
  /// i (cluster/jobmanager/slot_assignment.h). A job with several slot-sharing groups shares one budget between
  /// its groups' slots i that run in one process: less memory than Flink would give them, never more. `config`
  /// null: the defaults, a budget per database. Throws as from_config().
  static StateBackendOptions for_subtask(const Configuration* config, int subtask_index);
};

/// A fresh, unique working directory for one RocksDB instance:
/// `<local_dir>/sluice-rocksdb-<pid>/<operator>-<subtask>-<attempt>-<n>` (the operator name reduced to
/// [A-Za-z0-9_.-]). The instance removes it when it closes (finish, cancel, failover). The first call of a
/// process also removes the `sluice-rocksdb-<pid>` directories of processes that no longer run (left behind
/// by a SIGKILL). Thread-safe. Throws kState when the directory cannot be created.
std::filesystem::path make_rocksdb_working_dir(const StateBackendOptions& options, std::string_view operator_name,
                                               int subtask_index, int attempt);

/// The keyed state of one subtask in the configured backend (see the file comment).
template <class K>
class KeyedStateStore {
 public:
  /// A store for the key groups `range` of `max_parallelism`; `clock` (TTL, timers) must outlive it. With
  /// rocksdb, the database lives in make_rocksdb_working_dir(options, operator_name, subtask, attempt).
  KeyedStateStore(KeyGroupRange range, int max_parallelism, const Clock& clock, const StateBackendOptions& options,
                  std::string_view operator_name, int subtask_index, int attempt)
      : operator_name_(operator_name),
        rocksdb_timers_(options.type == StateBackendOptions::Type::kRocksDB && options.rocksdb_timers) {
    heap_ = std::make_unique<HeapKeyedStateBackend<K>>(range, max_parallelism, clock);
    if (options.type == StateBackendOptions::Type::kRocksDB) {
      rocks_ = std::make_unique<RocksDBKeyedStateBackend<K>>(
          range, max_parallelism, clock, make_rocksdb_working_dir(options, operator_name, subtask_index, attempt),
          options.memory);
      if (options.incremental) rocks_->enable_incremental_checkpoints();
    }
  }
  KeyedStateStore(const KeyedStateStore&) = delete;
  KeyedStateStore& operator=(const KeyedStateStore&) = delete;
  ~KeyedStateStore() {
    rocks_.reset();  // closes the database and removes its working directory
  }

  bool is_rocksdb() const noexcept { return rocks_ != nullptr; }
  const KeyGroupRange& key_group_range() const noexcept { return heap_->key_group_range(); }
  int max_parallelism() const noexcept { return heap_->max_parallelism(); }

  /// The heap backend holding the state, for code with a typed heap hot path. Throws SluiceException
  /// (kConfiguration) naming the operator when the job runs on rocksdb.
  HeapKeyedStateBackend<K>& heap() {
    if (rocks_ != nullptr) [[unlikely]]
      throw_heap_only();
    return *heap_;
  }
  /// The RocksDB backend, or nullptr on hashmap.
  RocksDBKeyedStateBackend<K>* rocksdb() noexcept { return rocks_.get(); }
  /// The heap backend that carries the current key for the timer service (with hashmap also the state).
  HeapKeyedStateBackend<K>& timer_key_context() noexcept { return *heap_; }
  /// Moves `timers` (built on timer_key_context(), none registered yet) into the database when the job keeps
  /// timers in RocksDB; no-op otherwise. Call before restore().
  template <class N>
  void attach_timers(InternalTimerService<K, N>& timers) {
    if (rocksdb_timers_) timers.use_rocksdb(rocks_->instance());
  }

  /// Makes `key` current for every state and for timers registered next. Throws kState when the key
  /// belongs to another subtask.
  void set_current_key(const K& key) {
    heap_->set_current_key(key);
    if (rocks_ != nullptr) rocks_->set_current_key(key);
  }
  /// The current key (valid after set_current_key()).
  const K& current_key() const noexcept { return heap_->current_key(); }

  // States (as the backends: same name -> same object; another kind or type -> kState).
  template <class T>
  ValueState<T>& get_state(const ValueStateDescriptor<T>& d) {
    if (rocks_ != nullptr) return rocks_->get_state(d);
    return heap_->get_state(d);
  }
  template <class T>
  ListState<T>& get_state(const ListStateDescriptor<T>& d) {
    if (rocks_ != nullptr) return rocks_->get_state(d);
    return heap_->get_state(d);
  }
  template <class UK, class UV>
  MapState<UK, UV>& get_state(const MapStateDescriptor<UK, UV>& d) {
    if (rocks_ != nullptr) return rocks_->get_state(d);
    return heap_->get_state(d);
  }
  template <class T>
  ReducingState<T>& get_state(const ReducingStateDescriptor<T>& d) {
    if (rocks_ != nullptr) return rocks_->get_state(d);
    return heap_->get_state(d);
  }
  template <class In, class Acc, class Out>
  AggregatingState<In, Out>& get_state(const AggregatingStateDescriptor<In, Acc, Out>& d) {
    if (rocks_ != nullptr) return rocks_->get_state(d);
    return heap_->get_state(d);
  }

  /// Entries of state `name` (one per key and namespace); for tests and metrics (RocksDB: a scan).
  size_t num_entries(std::string_view name) const {
    return rocks_ != nullptr ? rocks_->num_entries(name) : heap_->num_entries(name);
  }

  /// Captures the state and `timers` (nullable; built on timer_key_context()) for a checkpoint: the heap's
  /// copy-on-write capture or a RocksDB snapshot; both write the canonical key-group blobs, so a checkpoint of
  /// one backend restores into the other. With state.backend.incremental the RocksDB capture also holds the
  /// native files that checkpoints (not savepoints) store instead.
  template <class N>
  std::unique_ptr<KeyedStateSnapshot> capture(const InternalTimerService<K, N>* timers) const {
    std::unique_ptr<TimerServiceSnapshot> timer_capture = timers != nullptr ? timers->capture() : nullptr;
    if (rocks_ != nullptr) return std::make_unique<KeyedOperatorSnapshot>(rocks_->capture(), std::move(timer_capture));
    return std::make_unique<KeyedOperatorSnapshot>(heap_->capture(), std::move(timer_capture));
  }
  /// Restores the key groups of `restore` (either backend's checkpoint or savepoint, or an incremental rocksdb
  /// checkpoint's databases, which only rocksdb reads: the heap refuses them with kState) and `timers`
  /// (nullable).
  template <class N>
  [[nodiscard]] Status restore(InternalTimerService<K, N>* timers, const KeyedStateRestore& restore) {
    if (!restore.native.empty()) {
      if (rocks_ == nullptr) {
        return Error(ErrorCode::kState,
                     "operator '" + operator_name_ +
                         "': the checkpoint holds incremental rocksdb state (RocksDB's own files), which "
                         "state.backend.type = hashmap cannot read; restore it with state.backend.type = rocksdb, "
                         "or switch backends through a savepoint (savepoints are canonical)");
      }
      Status restored = rocks_->restore_native(restore.native);
      if (!restored.ok()) {
        // The backend replaced the database it had with a new empty one: RocksDB timers follow it, so the service
        // never keeps a pointer into the closed one.
        if (timers != nullptr && rocksdb_timers_) timers->use_rocksdb(rocks_->instance());
        return restored;
      }
      // The restored database holds the timers when the checkpoint was taken with RocksDB timers.
      SLUICE_RETURN_IF_ERROR(place_restored_timers(timers));
    }
    if (rocks_ != nullptr) return restore_keyed_operator(*rocks_, timers, restore);
    return restore_keyed_operator(*heap_, timers, restore);
  }

 private:
  // After a native restore replaced the database: RocksDB timers move to the new database; heap timers take
  // whatever timers the database holds (a checkpoint taken with RocksDB timers); an operator without timers
  // refuses a database that holds some.
  template <class N>
  Status place_restored_timers(InternalTimerService<K, N>* timers) {
    try {
      RocksDBInstance& db = rocks_->instance();
      if (timers == nullptr) {
        for (const std::string& name : db.timer_names()) {
          bool any = false;
          db.scan(db.find_timer_column_family(name), {}, nullptr, [&any](std::string_view, std::string_view) {
            any = true;
            return false;
          });
          if (any) {
            return Error(ErrorCode::kState, "operator '" + operator_name_ +
                                                "': the checkpoint holds timers but the operator is restored without "
                                                "a timer service: restore into the operator that wrote it");
          }
        }
        return ok_status();
      }
      if (rocksdb_timers_) {
        timers->use_rocksdb(db);
      } else {
        timers->adopt_rocksdb_timers(db);
      }
      return ok_status();
    } catch (const SluiceException& e) {
      return e.error().with_context("operator '" + operator_name_ + "': restoring timers from RocksDB");
    }
  }

  [[noreturn]] void throw_heap_only() const {
    throw SluiceException(
        Error(ErrorCode::kConfiguration,
              "operator '" + operator_name_ +
                  "' uses the heap backend's typed states (keyed_state().heap()), which state.backend.type = rocksdb "
                  "does not have: use keyed_state().get_state() (the ValueState/ListState/MapState/... interfaces, on "
                  "either backend), or run this job with state.backend.type = hashmap"));
  }

  std::string operator_name_;
  bool rocksdb_timers_;
  std::unique_ptr<HeapKeyedStateBackend<K>> heap_;
  std::unique_ptr<RocksDBKeyedStateBackend<K>> rocks_;
};

}  // namespace sluice
