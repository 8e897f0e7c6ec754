// libsluice_rocksdb.so: the RocksDBInstance of the rocksdb state backend, one database per operator subtask, through
// RocksDB's C++ API. Loaded by the process on its first RocksDBInstance::open() (rocksdb_module_loader.cc).
#include <rocksdb/cache.h>
#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/listener.h>
#include <rocksdb/merge_operator.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/snapshot.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

#include "rocksdb_module.h"
#include "sluice/core/error.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {

namespace {

// Appends the operand to the existing value: list states add elements without reading the list (as Flink's
// RocksDBListState with its StringAppend merge operator, without a delimiter: elements are self-delimiting).
class ConcatMergeOperator final : public rocksdb::AssociativeMergeOperator {
 public:
  bool Merge(const rocksdb::Slice&, const rocksdb::Slice* existing, const rocksdb::Slice& value, std::string* new_value,
             rocksdb::Logger*) const override {
    new_value->clear();
    if (existing != nullptr) new_value->assign(existing->data(), existing->size());
    new_value->append(value.data(), value.size());
    return true;
  }
  const char* Name() const override { return "SluiceConcat"; }
};

// Runs a state's ValueFilter on every plain value a compaction sees (merge operands are kept: the next
// compaction after they are merged filters the result). The filter can be installed after the column family
// was opened (a database restored from its files learns its states' TTL when they are registered), so it is
// read under a mutex; compactions run on RocksDB's background threads.
class ValueCompactionFilter final : public rocksdb::CompactionFilter {
 public:
  void set(RocksDBInstance::ValueFilter filter) {
    std::lock_guard lock(mu_);
    filter_ = std::make_shared<const RocksDBInstance::ValueFilter>(std::move(filter));
  }
  Decision FilterV2(int, const rocksdb::Slice&, ValueType type, const rocksdb::Slice& value, std::string* new_value,
                    std::string*) const override {
    if (type != ValueType::kValue) return Decision::kKeep;
    std::shared_ptr<const RocksDBInstance::ValueFilter> filter;
    {
      std::lock_guard lock(mu_);
      filter = filter_;
    }
    if (filter == nullptr || !*filter) return Decision::kKeep;
    switch ((*filter)(std::string_view(value.data(), value.size()), *new_value)) {
      case RocksDBInstance::FilterDecision::kRemove:
        return Decision::kRemove;
      case RocksDBInstance::FilterDecision::kChange:
        return Decision::kChangeValue;
      case RocksDBInstance::FilterDecision::kKeep:
        break;
    }
    return Decision::kKeep;
  }
  const char* Name() const override { return "SluiceTtlCompactionFilter"; }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const RocksDBInstance::ValueFilter> filter_;
};

constexpr std::string_view kStatePrefix = "state/";
constexpr std::string_view kTimerPrefix = "timer/";
constexpr std::string_view kMetaFamily = "sluice/meta";
// Bytes a write batch may hold before it is written (write_full_batch()).
constexpr size_t kMaxBatchBytes = 4 << 20;
// Bytes of one SST file a rescaling restore writes for ingestion (copy_family_range()), about a compaction's output.
constexpr uint64_t kMaxIngestFileBytes = 64 << 20;

rocksdb::Slice slice(std::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

[[noreturn]] void throw_rocksdb(const std::filesystem::path& dir, std::string_view what, const rocksdb::Status& s) {
  ErrorCode code = ErrorCode::kState;
  throw SluiceException(
      Error(code, "RocksDB state backend in " + dir.string() + ": " + std::string(what) + " failed: " + s.ToString()));
}

// The smallest key greater than every key starting with `prefix`; empty when there is none (all 0xff).
std::string prefix_successor(std::string_view prefix) {
  std::string s(prefix);
  while (!s.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(s.back());
    if (last != 0xff) {
      ++last;
      return s;
    }
    s.pop_back();
  }
  return s;
}

// Links a RocksDB checkpoint into `target` without flushing and returns the file names there, sorted.
std::vector<std::string> link_files(rocksdb::DB* db, const std::filesystem::path& dir,
                                    const std::filesystem::path& target) {
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status s = rocksdb::Checkpoint::Create(db, &raw);
  if (!s.ok()) throw_rocksdb(dir, "starting a checkpoint", s);
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  // log_size_for_flush "max": no flush of its own (it would wait for the write stall, and take writes after the
  // barrier into the files); the memtables of the checkpoint were flushed before, and the WAL is off.
  s = checkpoint->CreateCheckpoint(target.string(), std::numeric_limits<uint64_t>::max());
  if (!s.ok()) throw_rocksdb(dir, "creating the checkpoint " + target.string(), s);
  std::vector<std::string> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec))
    files.push_back(it->path().filename().string());
  if (ec) {
    throw SluiceException(Error(ErrorCode::kState, "RocksDB state backend: cannot list the checkpoint " +
                                                       target.string() + ": " + ec.message()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// An incremental checkpoint between its barrier (begin_checkpoint()) and the moment its files are linked.
struct PendingCheckpoint {
  enum class Stage : uint8_t { kFlushing, kLinking, kLinked };
  // Every write up to here belongs to the checkpoint, none after.
  uint64_t sequence = 0;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // valid while the instance lives (no drops after restore)
  std::vector<std::string> names;                     // of handles
  std::filesystem::path target;
  // Set once the barrier's memtables are sealed (Flush() returned): before, they are not in the listener's queues
  // and an unrelated flush would find the checkpoint "flushed" without them.
  bool armed = false;
  Stage stage = Stage::kFlushing;
  std::optional<std::vector<std::string>> files;  // kLinked: the files, or nullopt when not the barrier's state
  std::string error;                              // kLinked: why linking failed
};

// Links the checkpoint of `p` and checks it is the barrier's state. The files are the version RocksDB holds when it
// links them; a file whose newest entry is after the barrier (a later flush, or a compaction that took one in)
// means that version is not the barrier's. Every file must be known, from just before or just after, with nothing
// newer than the barrier; else `target` is removed and nullopt returned.
std::optional<std::vector<std::string>> link_checked(rocksdb::DB* db, const std::filesystem::path& dir,
                                                     const PendingCheckpoint& p) {
  std::vector<rocksdb::LiveFileMetaData> before;
  db->GetLiveFilesMetaData(&before);
  std::vector<std::string> files = link_files(db, dir, p.target);
  std::vector<rocksdb::LiveFileMetaData> after;
  db->GetLiveFilesMetaData(&after);
  std::map<std::string, uint64_t, std::less<>> newest;
  for (const auto* list : {&before, &after})
    for (const rocksdb::LiveFileMetaData& f : *list)
      newest[f.relative_filename] = f.largest_seqno;
  for (const std::string& file : files) {
    if (!file.ends_with(".sst")) continue;
    auto it = newest.find(file);
    if (it == newest.end() || it->second > p.sequence) {
      std::error_code ec;
      std::filesystem::remove_all(p.target, ec);
      return std::nullopt;
    }
  }
  return files;
}

// Links each pending checkpoint the moment the flush of its barrier's memtables lands: on RocksDB's flush thread,
// in OnFlushCompleted, or at the latest in OnFlushBegin of the next flush, before it writes anything (a database
// runs one flush at a time: RocksDB's default for two background jobs, and atomic flush). Were it linked later, on
// the writer thread, a burst of writes after the barrier could fill and flush another memtable first, and no set of
// files would be the barrier's state (link_checked() still checks; the writer links itself once no immutable
// memtable is left). The flush thread pool is shared by the process's databases: a link (hard links, a MANIFEST
// copy; a few ms) delays the other subtasks' flushes by that much.
//
// Which memtables are unflushed is tracked from the callbacks alone, per column family: a sealed memtable is
// queued with its first sequence number, and a completed flush removes every queued memtable up to the newest
// sequence number it wrote (a column family's memtables hold ascending ranges and are flushed oldest first; a
// non-empty memtable always flushes into a file holding its newest entry). The barrier's writes are all flushed
// when no queued memtable starts at or before the barrier. No RocksDB call is made under mu_.
class CheckpointListener final : public rocksdb::EventListener {
 public:
  explicit CheckpointListener(std::filesystem::path dir) : dir_(std::move(dir)) {}

  void OnMemTableSealed(const rocksdb::MemTableInfo& info) override {
    std::lock_guard lock(mu_);
    unflushed_[info.cf_name].push_back(info.first_seqno);
  }
  void OnFlushCompleted(rocksdb::DB* db, const rocksdb::FlushJobInfo& info) override {
    {
      std::lock_guard lock(mu_);
      std::deque<uint64_t>& queue = unflushed_[info.cf_name];
      while (!queue.empty() && queue.front() <= info.largest_seqno)
        queue.pop_front();
    }
    link_ready(db, /*also=*/{});
  }
  void OnFlushBegin(rocksdb::DB* db, const rocksdb::FlushJobInfo&) override { link_ready(db, /*also=*/{}); }
  void OnBackgroundError(rocksdb::BackgroundErrorReason, rocksdb::Status*) override {
    {
      std::lock_guard lock(mu_);
      ++errors_;
    }
    cv_.notify_all();
  }

  void add(std::shared_ptr<PendingCheckpoint> p) {
    std::lock_guard lock(mu_);
    pending_.push_back(std::move(p));
  }
  void arm(PendingCheckpoint& p) {
    std::lock_guard lock(mu_);
    p.armed = true;
  }
  // Tests: the listener links nothing, so only the writer's later link (and its check) remains.
  void hold_links(bool hold) {
    std::lock_guard lock(mu_);
    hold_ = hold;
  }
  // Forgets `p`, after a link in progress on another thread has finished (it writes into p's target).
  void remove(const PendingCheckpoint* p) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return p->stage != PendingCheckpoint::Stage::kLinking; });
    std::erase_if(pending_, [&](const auto& q) { return q.get() == p; });
  }

  // Links on this thread every pending checkpoint whose barrier writes are flushed, and `also` (when not null and
  // still waiting): its caller saw no immutable memtable left.
  void link_ready(rocksdb::DB* db, const std::shared_ptr<PendingCheckpoint>& also) {
    std::unique_lock lock(mu_);
    for (;;) {
      std::shared_ptr<PendingCheckpoint> ready;
      for (const auto& p : pending_) {
        if (p->stage == PendingCheckpoint::Stage::kFlushing && p->armed &&
            (p == also || (!hold_ && barrier_flushed(*p)))) {
          ready = p;
          break;
        }
      }
      if (!ready) return;
      ready->stage = PendingCheckpoint::Stage::kLinking;
      lock.unlock();
      std::optional<std::vector<std::string>> files;
      std::string error;
      try {
        files = link_checked(db, dir_, *ready);
      } catch (const SluiceException& e) {
        error = e.error().message();
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      ready->files = std::move(files);
      ready->error = std::move(error);
      ready->stage = PendingCheckpoint::Stage::kLinked;
      cv_.notify_all();
    }
  }

  // Waits until `p` is linked, linking it on this thread once no memtable is left to flush; false at `deadline` or
  // when a background error came after `errors_before`.
  bool wait_linked(rocksdb::DB* db, const std::shared_ptr<PendingCheckpoint>& p, uint64_t errors_before,
                   std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      link_ready(db, nothing_immutable(db, *p) ? p : nullptr);
      std::unique_lock lock(mu_);
      if (p->stage == PendingCheckpoint::Stage::kLinked) return true;
      if (errors_ > errors_before || std::chrono::steady_clock::now() >= deadline) return false;
      cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    }
  }
  uint64_t background_errors() const {
    std::lock_guard lock(mu_);
    return errors_;
  }

 private:
  bool barrier_flushed(const PendingCheckpoint& p) const {
    for (const std::string& name : p.names) {
      auto it = unflushed_.find(name);
      if (it != unflushed_.end() && !it->second.empty() && it->second.front() <= p.sequence) return false;
    }
    return true;
  }
  // No immutable memtable in any column family of `p`: everything before now is in files. Not under mu_.
  static bool nothing_immutable(rocksdb::DB* db, const PendingCheckpoint& p) {
    for (rocksdb::ColumnFamilyHandle* handle : p.handles) {
      uint64_t immutable = 0;
      if (!db->GetIntProperty(handle, rocksdb::DB::Properties::kNumImmutableMemTable, &immutable) || immutable > 0)
        return false;
    }
    return true;
  }

  std::filesystem::path dir_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<PendingCheckpoint>> pending_;
  std::map<std::string, std::deque<uint64_t>, std::less<>> unflushed_;  // column family -> first sequence numbers
  uint64_t errors_ = 0;
  bool hold_ = false;
};

// One memory budget (Flink's RocksDBMemoryControllerUtils): a block cache of (3 - r) / 3 of it holding blocks,
// index and filter blocks, and a write buffer manager of 2r / 3 charging memtables to that cache. Held by every
// database that draws on it; the databases of one shared scope hold the same one.
struct MemoryBudget {
  std::shared_ptr<rocksdb::Cache> cache;
  std::shared_ptr<rocksdb::WriteBufferManager> write_buffers;
  size_t write_buffer_bytes = 0;
};

std::shared_ptr<MemoryBudget> make_budget(const RocksDBMemoryOptions& memory) {
  const double total = static_cast<double>(memory.managed_bytes);
  auto budget = std::make_shared<MemoryBudget>();
  budget->write_buffer_bytes = static_cast<size_t>(2.0 * total * memory.write_buffer_ratio / 3.0);
  budget->cache = rocksdb::NewLRUCache(static_cast<size_t>((3.0 - memory.write_buffer_ratio) * total / 3.0), -1, false,
                                       memory.high_priority_pool_ratio);
  budget->write_buffers = std::make_shared<rocksdb::WriteBufferManager>(budget->write_buffer_bytes, budget->cache);
  return budget;
}

// The budgets of the shared scopes (RocksDBMemoryOptions::shared_scope) of this process, by scope and budget
// figures: a budget lives while a database holds it, and the next database of its scope after the last one closed
// gets a new one.
class SharedBudgets {
 public:
  std::shared_ptr<MemoryBudget> acquire(const RocksDBMemoryOptions& memory) {
    const std::string key = memory.shared_scope + '\0' + std::to_string(memory.managed_bytes) + '/' +
                            std::to_string(memory.write_buffer_ratio) + '/' +
                            std::to_string(memory.high_priority_pool_ratio);
    std::lock_guard lock(mu_);
    for (auto it = budgets_.begin(); it != budgets_.end();) {  // drop the scopes whose databases all closed
      it = it->second.expired() ? budgets_.erase(it) : std::next(it);
    }
    if (auto existing = budgets_[key].lock()) return existing;
    auto budget = make_budget(memory);
    budgets_[key] = budget;
    return budget;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<MemoryBudget>> budgets_;
};

SharedBudgets& shared_budgets() {
  static SharedBudgets* budgets = new SharedBudgets();  // never destroyed: databases may close after exit starts
  return *budgets;
}

}  // namespace

// The RocksDBInstance of the module: a database opened by RocksDB's C++ API.
class RocksDBDatabase final : public RocksDBInstance {
 public:
  // RocksDBInstance::open() and open_existing() through the module's entry (rocksdb_module.h).
  static std::shared_ptr<RocksDBInstance> open(const std::filesystem::path& dir, const RocksDBMemoryOptions& memory,
                                               bool existing);
  ~RocksDBDatabase() override;

  ColumnFamily* column_family(std::string_view name, ValueFilter filter) override;
  void set_filter(std::string_view name, ValueFilter filter) override;
  ColumnFamily* timer_column_family(std::string_view name) override;
  ColumnFamily* find_timer_column_family(std::string_view name) const override;
  void drop_timer_column_family(std::string_view name) override;
  std::vector<std::string> timer_names() const override;
  std::vector<std::string> state_names() const override;
  std::string state_meta(std::string_view name) const override;
  void set_state_meta(std::string_view name, std::string_view bytes) override;
  std::shared_ptr<const CheckpointStart> begin_checkpoint(const std::filesystem::path& target) override;
  std::optional<std::vector<std::string>> finish_checkpoint(const CheckpointStart& start,
                                                            std::chrono::milliseconds timeout) override;
  void hold_checkpoint_links_for_testing(bool hold) override;
  std::vector<std::string> create_checkpoint(const std::filesystem::path& target) override;
  void copy_range_from(const RocksDBInstance& other, std::string_view begin, std::string_view end) override;
  void clip_to_range(std::string_view begin, std::string_view end) override;
  bool get(ColumnFamily* cf, std::string_view key, std::string& value) const override;
  void put(ColumnFamily* cf, std::string_view key, std::string_view value) override;
  void merge(ColumnFamily* cf, std::string_view key, std::string_view bytes) override;
  void remove(ColumnFamily* cf, std::string_view key) override;
  void begin_batch() override;
  void commit_batch() override;
  std::shared_ptr<const Snapshot> snapshot() override;
  void scan(ColumnFamily* cf, std::string_view prefix, const Snapshot* snapshot,
            const std::function<bool(std::string_view key, std::string_view value)>& fn) const override;
  void remove_prefix(ColumnFamily* cf, std::string_view prefix) override;
  uint64_t estimated_live_bytes() const override;
  uint64_t memory_usage() const override;
  void compact() override;
  size_t databases_sharing_budget() const override;

 private:
  struct Impl;
  explicit RocksDBDatabase(std::filesystem::path dir);
  void copy_family_range(const RocksDBDatabase& other_db, ColumnFamily* from, ColumnFamily* to, std::string_view begin,
                         std::string_view end);
  std::unique_ptr<Impl> impl_;
};

struct RocksDBInstance::ColumnFamily {
  rocksdb::ColumnFamilyHandle* handle = nullptr;
  std::unique_ptr<ValueCompactionFilter> filter;  // outlives the handle (destroyed after it)
};

class RocksDBInstance::Snapshot {
 public:
  Snapshot(std::shared_ptr<RocksDBInstance> owner, rocksdb::DB* db)
      : owner_(std::move(owner)), db_(db), snapshot_(db->GetSnapshot()) {}
  ~Snapshot() { db_->ReleaseSnapshot(snapshot_); }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  const rocksdb::Snapshot* get() const noexcept { return snapshot_; }

 private:
  std::shared_ptr<RocksDBInstance> owner_;
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snapshot_;
};

struct RocksDBDatabase::Impl {
  rocksdb::DB* db = nullptr;
  rocksdb::ColumnFamilyOptions cf_options;
  rocksdb::WriteOptions write_options;
  // Creation is on the task thread only; the mutex orders it against nothing else today but keeps the
  // map consistent if a snapshot writer ever looks names up.
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<ColumnFamily>, std::less<>> families;
  std::map<std::string, std::unique_ptr<ColumnFamily>, std::less<>> timers;  // kTimerPrefix families
  std::unique_ptr<rocksdb::WriteBatch> batch;
  std::shared_ptr<MemoryBudget> budget;             // with a memory budget: its cache and write buffer manager
  std::shared_ptr<rocksdb::Cache> cache;            // budget->cache: blocks, indexes, filters and memtables
  std::unique_ptr<ColumnFamily> meta;               // kMetaFamily: per-state kind and flags
  std::shared_ptr<CheckpointListener> checkpoints;  // set by open()

  // Writes the open batch once it holds kMaxBatchBytes and starts the next. A batch goes into the memtable
  // whole, past its write-buffer budget, and is held twice meanwhile (batch and memtable): a restore of a key
  // group larger than memory would not fit. Batches are a speed-up, not a transaction (a failed restore fails
  // the task).
  void write_full_batch(const std::filesystem::path& dir) {
    if (batch->GetDataSize() < kMaxBatchBytes) return;
    rocksdb::Status s = db->Write(write_options, batch.get());
    if (!s.ok()) throw_rocksdb(dir, "a batched write", s);
    batch->Clear();
  }

  // The states' and the timers' column families.
  std::vector<ColumnFamily*> data_families() const {
    std::vector<ColumnFamily*> all;
    for (const auto& [name, cf] : families)
      all.push_back(cf.get());
    for (const auto& [name, cf] : timers)
      all.push_back(cf.get());
    return all;
  }
};

RocksDBDatabase::RocksDBDatabase(std::filesystem::path dir)
    : RocksDBInstance(std::move(dir)), impl_(std::make_unique<Impl>()) {}

std::shared_ptr<RocksDBInstance> RocksDBDatabase::open(const std::filesystem::path& dir,
                                                       const RocksDBMemoryOptions& memory, bool existing) {
  if (!(memory.write_buffer_ratio > 0 && memory.write_buffer_ratio < 1)) {
    throw SluiceException(
        Error(ErrorCode::kConfiguration, "state.backend.rocksdb.memory.write-buffer-ratio must be in (0, 1), got " +
                                             std::to_string(memory.write_buffer_ratio)));
  }
  if (!(memory.high_priority_pool_ratio >= 0 && memory.high_priority_pool_ratio < 1)) {
    throw SluiceException(
        Error(ErrorCode::kConfiguration, "state.backend.rocksdb.memory.high-prio-pool-ratio must be in [0, 1), got " +
                                             std::to_string(memory.high_priority_pool_ratio)));
  }
  std::error_code ec;
  if (!existing) std::filesystem::remove_all(dir, ec);
  if (ec) {
    throw SluiceException(Error(
        ErrorCode::kState,
        "RocksDB state backend: cannot remove the leftover working directory " + dir.string() + ": " + ec.message()));
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw SluiceException(Error(ErrorCode::kState, "RocksDB state backend: cannot create the working directory " +
                                                       dir.string() + ": " + ec.message()));
  }
  std::shared_ptr<RocksDBDatabase> instance(new RocksDBDatabase(dir));
  Impl& impl = *instance->impl_;
  rocksdb::Options options;
  options.create_if_missing = !existing;
  options.error_if_exists = !existing;
  options.keep_log_file_num = 1;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  // The files are thrown away on close: nothing to persist first.
  options.avoid_flush_during_shutdown = true;
  impl.checkpoints = std::make_shared<CheckpointListener>(dir);
  options.listeners.push_back(impl.checkpoints);
  // A flush job flushes only the memtables its request names (without atomic flush, RocksDB 7.8 flushes every
  // immutable memtable of the column family, so a barrier's flush that starts late also takes later writes in),
  // and the memtables of all column families switched at a barrier land as one flush.
  options.atomic_flush = true;
  if (memory.managed_bytes > 0) {
    // Flink's split (RocksDBMemoryControllerUtils): memtables are charged to the block cache, so one
    // cache bounds both; index and filter blocks are cached (high priority) instead of held per file. The
    // databases of one shared scope (a slot) share the cache and the write buffer manager, so the budget bounds
    // them together.
    impl.budget = memory.shared_scope.empty() ? make_budget(memory) : shared_budgets().acquire(memory);
    impl.cache = impl.budget->cache;
    options.write_buffer_manager = impl.budget->write_buffers;
    // A memtable is at most half the write buffer budget, so a flush is due before the budget is reached.
    options.write_buffer_size = std::max<size_t>(impl.budget->write_buffer_bytes / 2, 64 * 1024);
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = impl.cache;
    table.cache_index_and_filter_blocks = true;
    table.cache_index_and_filter_blocks_with_high_priority = true;
    table.pin_top_level_index_and_filter = true;
    options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  }
  impl.cf_options = rocksdb::ColumnFamilyOptions(options);
  impl.cf_options.merge_operator = std::make_shared<ConcatMergeOperator>();
  // Local state is recovered from checkpoints, never from the local files (Flink disables the WAL too).
  impl.write_options.disableWAL = true;
  if (!existing) {
    rocksdb::Status s = rocksdb::DB::Open(options, dir.string(), &impl.db);
    if (!s.ok()) throw_rocksdb(dir, "opening the database", s);
    return instance;
  }
  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(options, dir.string(), &names);
  if (!s.ok()) throw_rocksdb(dir, "listing the column families of the restored database", s);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  std::vector<std::unique_ptr<ColumnFamily>> families;
  for (const std::string& name : names) {
    auto cf = std::make_unique<ColumnFamily>();
    rocksdb::ColumnFamilyOptions cf_options = impl.cf_options;
    if (std::string_view(name).starts_with(kStatePrefix)) {
      cf->filter = std::make_unique<ValueCompactionFilter>();
      cf_options.compaction_filter = cf->filter.get();
    }
    descriptors.emplace_back(name, cf_options);
    families.push_back(std::move(cf));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  s = rocksdb::DB::Open(options, dir.string(), descriptors, &handles, &impl.db);
  if (!s.ok()) throw_rocksdb(dir, "opening the restored database", s);
  for (size_t i = 0; i < names.size(); ++i) {
    families[i]->handle = handles[i];
    std::string_view name = names[i];
    if (name.starts_with(kStatePrefix)) {
      impl.families.emplace(std::string(name.substr(kStatePrefix.size())), std::move(families[i]));
    } else if (name.starts_with(kTimerPrefix)) {
      impl.timers.emplace(std::string(name.substr(kTimerPrefix.size())), std::move(families[i]));
    } else if (name == kMetaFamily) {
      impl.meta = std::move(families[i]);
    } else {
      impl.db->DestroyColumnFamilyHandle(handles[i]);  // "default": unused
    }
  }
  return instance;
}

RocksDBDatabase::~RocksDBDatabase() {
  if (impl_->db != nullptr) {
    for (auto& [name, cf] : impl_->families)
      impl_->db->DestroyColumnFamilyHandle(cf->handle);
    for (auto& [name, cf] : impl_->timers)
      impl_->db->DestroyColumnFamilyHandle(cf->handle);
    if (impl_->meta) impl_->db->DestroyColumnFamilyHandle(impl_->meta->handle);
    impl_->db->Close();
    delete impl_->db;
  }
  std::error_code ec;
  std::filesystem::remove_all(directory(), ec);  // best effort: a leftover is removed by the next open()
}

RocksDBInstance::ColumnFamily* RocksDBDatabase::column_family(std::string_view name, ValueFilter filter) {
  std::lock_guard lock(impl_->mutex);
  if (auto it = impl_->families.find(name); it != impl_->families.end()) {
    // A column family of a restored database gets its state's filter when the state is registered.
    if (filter && it->second->filter) it->second->filter->set(std::move(filter));
    return it->second.get();
  }
  auto cf = std::make_unique<ColumnFamily>();
  rocksdb::ColumnFamilyOptions cf_options = impl_->cf_options;
  cf->filter = std::make_unique<ValueCompactionFilter>();
  if (filter) cf->filter->set(std::move(filter));
  cf_options.compaction_filter = cf->filter.get();
  rocksdb::Status s =
      impl_->db->CreateColumnFamily(cf_options, std::string(kStatePrefix) + std::string(name), &cf->handle);
  if (!s.ok()) throw_rocksdb(directory(), "creating the column family of state '" + std::string(name) + "'", s);
  ColumnFamily* raw = cf.get();
  impl_->families.emplace(std::string(name), std::move(cf));
  return raw;
}

void RocksDBDatabase::set_filter(std::string_view name, ValueFilter filter) {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->families.find(name);
  if (it != impl_->families.end() && it->second->filter) it->second->filter->set(std::move(filter));
}

RocksDBInstance::ColumnFamily* RocksDBDatabase::timer_column_family(std::string_view name) {
  std::lock_guard lock(impl_->mutex);
  if (auto it = impl_->timers.find(name); it != impl_->timers.end()) return it->second.get();
  auto cf = std::make_unique<ColumnFamily>();
  rocksdb::Status s =
      impl_->db->CreateColumnFamily(impl_->cf_options, std::string(kTimerPrefix) + std::string(name), &cf->handle);
  if (!s.ok()) throw_rocksdb(directory(), "creating the column family of timers '" + std::string(name) + "'", s);
  ColumnFamily* raw = cf.get();
  impl_->timers.emplace(std::string(name), std::move(cf));
  return raw;
}

RocksDBInstance::ColumnFamily* RocksDBDatabase::find_timer_column_family(std::string_view name) const {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->timers.find(name);
  return it == impl_->timers.end() ? nullptr : it->second.get();
}

void RocksDBDatabase::drop_timer_column_family(std::string_view name) {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->timers.find(name);
  if (it == impl_->timers.end()) return;
  rocksdb::Status s = impl_->db->DropColumnFamily(it->second->handle);
  if (!s.ok()) throw_rocksdb(directory(), "dropping the column family of timers '" + std::string(name) + "'", s);
  impl_->db->DestroyColumnFamilyHandle(it->second->handle);
  impl_->timers.erase(it);
}

std::vector<std::string> RocksDBDatabase::timer_names() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::string> names;
  for (const auto& [name, cf] : impl_->timers)
    names.push_back(name);
  return names;
}

std::vector<std::string> RocksDBDatabase::state_names() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::string> names;
  for (const auto& [name, cf] : impl_->families)
    names.push_back(name);
  return names;
}

std::string RocksDBDatabase::state_meta(std::string_view name) const {
  std::string value;
  if (!impl_->meta) return value;
  rocksdb::Status s = impl_->db->Get(rocksdb::ReadOptions(), impl_->meta->handle, slice(name), &value);
  if (s.IsNotFound()) return {};
  if (!s.ok()) throw_rocksdb(directory(), "reading the metadata of state '" + std::string(name) + "'", s);
  return value;
}

void RocksDBDatabase::set_state_meta(std::string_view name, std::string_view bytes) {
  if (!impl_->meta) {
    auto cf = std::make_unique<ColumnFamily>();
    rocksdb::Status s = impl_->db->CreateColumnFamily(impl_->cf_options, std::string(kMetaFamily), &cf->handle);
    if (!s.ok()) throw_rocksdb(directory(), "creating the state metadata column family", s);
    impl_->meta = std::move(cf);
  }
  rocksdb::Status s = impl_->db->Put(impl_->write_options, impl_->meta->handle, slice(name), slice(bytes));
  if (!s.ok()) throw_rocksdb(directory(), "writing the metadata of state '" + std::string(name) + "'", s);
}

struct RocksDBInstance::CheckpointStart {
  // Pins the barrier's sequence number (and keeps the instance alive): compactions do not zero the sequence
  // numbers of later writes, which would then look as old as the barrier's.
  std::shared_ptr<const Snapshot> snapshot;
  std::shared_ptr<CheckpointListener> listener;
  std::shared_ptr<PendingCheckpoint> pending;
  uint64_t background_errors = 0;

  CheckpointStart() = default;
  CheckpointStart(const CheckpointStart&) = delete;
  CheckpointStart& operator=(const CheckpointStart&) = delete;
  ~CheckpointStart() {
    if (listener && pending) listener->remove(pending.get());
  }
};

namespace {

std::vector<rocksdb::ColumnFamilyHandle*> checkpoint_handles(rocksdb::DB* db, const auto& families, const auto& timers,
                                                             const auto& meta) {
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  for (const auto& [name, cf] : families)
    handles.push_back(cf->handle);
  for (const auto& [name, cf] : timers)
    handles.push_back(cf->handle);
  if (meta) handles.push_back(meta->handle);
  if (db->DefaultColumnFamily() != nullptr) handles.push_back(db->DefaultColumnFamily());
  return handles;
}

}  // namespace

std::shared_ptr<const RocksDBInstance::CheckpointStart> RocksDBDatabase::begin_checkpoint(
    const std::filesystem::path& target) {
  auto start = std::make_shared<CheckpointStart>();
  start->snapshot = snapshot();
  start->listener = impl_->checkpoints;
  start->background_errors = start->listener->background_errors();
  auto pending = std::make_shared<PendingCheckpoint>();
  pending->sequence = start->snapshot->get()->GetSequenceNumber();
  pending->target = target;
  {
    std::lock_guard lock(impl_->mutex);
    pending->handles = checkpoint_handles(impl_->db, impl_->families, impl_->timers, impl_->meta);
  }
  for (rocksdb::ColumnFamilyHandle* handle : pending->handles)
    pending->names.push_back(handle->GetName());
  start->pending = pending;
  start->listener->add(pending);  // before the switch, so no seal after the barrier goes unseen
  rocksdb::FlushOptions flush;
  // Switch the memtables and schedule their flush; the listener links the checkpoint when it lands. The
  // write-ahead log is off, so the switch writes no log file: it costs a new memtable per column family.
  flush.wait = false;
  flush.allow_write_stall = true;  // the barrier does not wait for compaction either
  rocksdb::Status s = impl_->db->Flush(flush, pending->handles);
  if (s.ok()) {
    start->listener->arm(*pending);
    return start;
  }
  start.reset();  // waits for a link the listener may have started meanwhile, then removes what it linked
  std::error_code ec;
  std::filesystem::remove_all(target, ec);
  if (s.IsTryAgain()) return nullptr;  // writes are stopped: RocksDB refuses a flush it would not wait for
  throw_rocksdb(directory(), "switching the memtables of a checkpoint", s);
}

std::optional<std::vector<std::string>> RocksDBDatabase::finish_checkpoint(const CheckpointStart& start,
                                                                           std::chrono::milliseconds timeout) {
  const PendingCheckpoint& p = *start.pending;
  if (!start.listener->wait_linked(impl_->db, start.pending, start.background_errors,
                                   std::chrono::steady_clock::now() + timeout)) {
    throw SluiceException(
        Error(ErrorCode::kState, "RocksDB state backend in " + directory().string() + ": the flush of a checkpoint " +
                                     (start.listener->background_errors() > start.background_errors
                                          ? std::string("was stopped by a background error of RocksDB")
                                          : "has not finished after " + std::to_string(timeout.count()) + " ms")));
  }
  if (!p.error.empty()) {
    throw SluiceException(
        Error(ErrorCode::kState, "RocksDB state backend in " + directory().string() + ": " + p.error));
  }
  return p.files;
}

void RocksDBDatabase::hold_checkpoint_links_for_testing(bool hold) {
  impl_->checkpoints->hold_links(hold);
}

std::vector<std::string> RocksDBDatabase::create_checkpoint(const std::filesystem::path& target) {
  const std::vector<rocksdb::ColumnFamilyHandle*> handles =
      checkpoint_handles(impl_->db, impl_->families, impl_->timers, impl_->meta);
  rocksdb::FlushOptions flush;
  flush.wait = true;
  // RocksDB's default flush first waits until it would not stall writes, which with level 0 full means behind
  // compaction (1.1 s of synchronous pause measured with 10 GiB of churning state). The barrier should not wait
  // for compaction: the flush goes ahead, and writes after it stall as they would have anyway.
  flush.allow_write_stall = true;
  rocksdb::Status s = impl_->db->Flush(flush, handles);
  if (!s.ok()) throw_rocksdb(directory(), "the flush of a checkpoint", s);
  return link_files(impl_->db, directory(), target);
}

void RocksDBDatabase::copy_range_from(const RocksDBInstance& other, std::string_view begin, std::string_view end) {
  // Every instance of the process comes from this module (RocksDBInstance::open).
  const auto& other_db = static_cast<const RocksDBDatabase&>(other);
  for (const std::string& name : other.state_names()) {
    const std::string meta = other.state_meta(name);
    if (!meta.empty() && state_meta(name).empty()) set_state_meta(name, meta);
    copy_family_range(other_db, other_db.impl_->families.at(name).get(), column_family(name, nullptr), begin, end);
  }
  for (const std::string& name : other.timer_names())
    copy_family_range(other_db, other_db.impl_->timers.at(name).get(), timer_column_family(name), begin, end);
}

void RocksDBDatabase::copy_family_range(const RocksDBDatabase& other_db, ColumnFamily* from, ColumnFamily* to,
                                        std::string_view begin, std::string_view end) {
  // The entries go into SST files (SstFileWriter, in key order as the scan yields them) that the database ingests:
  // writes through the memtables flushed and compacted every byte again and stalled behind level 0 (copying half
  // of 1 GiB took seconds), while an ingested file is linked into the tree as it is. A file that overlaps anything
  // here (entries or range deletions, e.g. a clipped base's stale key groups) gets a sequence number newer than
  // all of it; one that overlaps nothing keeps sequence number 0 in the lowest level it fits. Either way nothing
  // here hides its entries: [begin, end) is outside the clip's range deletions.
  rocksdb::Slice lower = slice(begin);
  rocksdb::Slice upper = slice(end);
  rocksdb::ReadOptions ro;
  ro.iterate_lower_bound = &lower;
  ro.iterate_upper_bound = &upper;
  ro.fill_cache = false;  // read once
  std::unique_ptr<rocksdb::Iterator> it(other_db.impl_->db->NewIterator(ro, from->handle));
  const std::filesystem::path staging = directory() / "restore-ingest";
  std::error_code ec;
  std::filesystem::create_directories(staging, ec);
  if (ec) {
    throw SluiceException(
        Error(ErrorCode::kState, "RocksDB state backend: cannot create " + staging.string() + ": " + ec.message()));
  }
  const rocksdb::Options options(impl_->db->GetDBOptions(), impl_->db->GetOptions(to->handle));
  std::vector<std::string> files;
  std::unique_ptr<rocksdb::SstFileWriter> writer;
  auto finish = [&] {
    rocksdb::Status s = writer->Finish();
    if (!s.ok()) throw_rocksdb(directory(), "writing a restore file", s);
    writer.reset();
  };
  for (it->Seek(lower); it->Valid(); it->Next()) {
    if (writer == nullptr) {
      writer = std::make_unique<rocksdb::SstFileWriter>(rocksdb::EnvOptions(), options, to->handle);
      files.push_back((staging / (std::to_string(files.size()) + ".sst")).string());
      rocksdb::Status s = writer->Open(files.back());
      if (!s.ok()) throw_rocksdb(directory(), "creating a restore file", s);
    }
    rocksdb::Status s = writer->Put(it->key(), it->value());
    if (!s.ok()) throw_rocksdb(directory(), "writing a restore file", s);
    if (writer->FileSize() >= kMaxIngestFileBytes) finish();
  }
  if (!it->status().ok()) throw_rocksdb(other_db.directory(), "a restore scan", it->status());
  if (writer != nullptr) finish();
  if (!files.empty()) {
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;
    rocksdb::Status s = impl_->db->IngestExternalFile(to->handle, files, ingest);
    if (!s.ok()) throw_rocksdb(directory(), "ingesting restored entries", s);
  }
  // Ingestion moved the files; the directory stays empty. After a failure ~RocksDBDatabase removes the directory with
  // it.
  std::filesystem::remove_all(staging, ec);
}

void RocksDBDatabase::clip_to_range(std::string_view begin, std::string_view end) {
  const std::string lowest(1, '\0');
  const std::string highest(8, '\xff');
  auto clip = [&](ColumnFamily* cf) {
    rocksdb::Status s;
    if (std::string_view(lowest) < begin) {
      s = impl_->db->DeleteRange(impl_->write_options, cf->handle, slice(""), slice(begin));
      if (!s.ok()) throw_rocksdb(directory(), "clipping a restored database", s);
    }
    if (!end.empty()) {
      s = impl_->db->DeleteRange(impl_->write_options, cf->handle, slice(end), slice(highest));
      if (!s.ok()) throw_rocksdb(directory(), "clipping a restored database", s);
    }
  };
  for (const auto& [name, cf] : impl_->families)
    clip(cf.get());
  for (const auto& [name, cf] : impl_->timers)
    clip(cf.get());
}

bool RocksDBDatabase::get(ColumnFamily* cf, std::string_view key, std::string& value) const {
  rocksdb::Status s = impl_->db->Get(rocksdb::ReadOptions(), cf->handle, slice(key), &value);
  if (s.IsNotFound()) return false;
  if (!s.ok()) throw_rocksdb(directory(), "a read", s);
  return true;
}

void RocksDBDatabase::put(ColumnFamily* cf, std::string_view key, std::string_view value) {
  rocksdb::Status s = impl_->batch ? impl_->batch->Put(cf->handle, slice(key), slice(value))
                                   : impl_->db->Put(impl_->write_options, cf->handle, slice(key), slice(value));
  if (!s.ok()) throw_rocksdb(directory(), "a write", s);
  if (impl_->batch) impl_->write_full_batch(directory());
}

void RocksDBDatabase::merge(ColumnFamily* cf, std::string_view key, std::string_view bytes) {
  rocksdb::Status s = impl_->batch ? impl_->batch->Merge(cf->handle, slice(key), slice(bytes))
                                   : impl_->db->Merge(impl_->write_options, cf->handle, slice(key), slice(bytes));
  if (!s.ok()) throw_rocksdb(directory(), "a merge", s);
  if (impl_->batch) impl_->write_full_batch(directory());
}

void RocksDBDatabase::remove(ColumnFamily* cf, std::string_view key) {
  rocksdb::Status s = impl_->batch ? impl_->batch->Delete(cf->handle, slice(key))
                                   : impl_->db->Delete(impl_->write_options, cf->handle, slice(key));
  if (!s.ok()) throw_rocksdb(directory(), "a delete", s);
  if (impl_->batch) impl_->write_full_batch(directory());
}

void RocksDBDatabase::begin_batch() {
  if (!impl_->batch) impl_->batch = std::make_unique<rocksdb::WriteBatch>();
}

void RocksDBDatabase::commit_batch() {
  if (!impl_->batch) return;
  std::unique_ptr<rocksdb::WriteBatch> batch = std::move(impl_->batch);
  rocksdb::Status s = impl_->db->Write(impl_->write_options, batch.get());
  if (!s.ok()) throw_rocksdb(directory(), "a batched write", s);
}

std::shared_ptr<const RocksDBInstance::Snapshot> RocksDBDatabase::snapshot() {
  return std::make_shared<const Snapshot>(shared_from_this(), impl_->db);
}

void RocksDBDatabase::scan(ColumnFamily* cf, std::string_view prefix, const Snapshot* snapshot,
                           const std::function<bool(std::string_view, std::string_view)>& fn) const {
  rocksdb::ReadOptions ro;
  if (snapshot != nullptr) ro.snapshot = snapshot->get();
  const std::string upper = prefix_successor(prefix);
  rocksdb::Slice upper_slice(upper);
  if (!upper.empty()) ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(ro, cf->handle));
  for (it->Seek(slice(prefix)); it->Valid(); it->Next()) {
    rocksdb::Slice k = it->key();
    if (!k.starts_with(slice(prefix))) break;
    rocksdb::Slice v = it->value();
    if (!fn(std::string_view(k.data(), k.size()), std::string_view(v.data(), v.size()))) break;
  }
  if (!it->status().ok()) throw_rocksdb(directory(), "a scan", it->status());
}

void RocksDBDatabase::remove_prefix(ColumnFamily* cf, std::string_view prefix) {
  std::vector<std::string> keys;
  scan(cf, prefix, nullptr, [&keys](std::string_view k, std::string_view) {
    keys.emplace_back(k);
    return true;
  });
  if (keys.empty()) return;
  const bool own_batch = !impl_->batch;
  begin_batch();
  try {
    for (const auto& k : keys)
      remove(cf, k);
  } catch (...) {
    if (own_batch) impl_->batch.reset();  // no batch left open behind a failed write
    throw;
  }
  if (own_batch) commit_batch();
}

uint64_t RocksDBDatabase::estimated_live_bytes() const {
  uint64_t total = 0;
  for (ColumnFamily* cf : impl_->data_families()) {
    uint64_t v = 0;
    if (impl_->db->GetIntProperty(cf->handle, "rocksdb.estimate-live-data-size", &v)) total += v;
    if (impl_->db->GetIntProperty(cf->handle, "rocksdb.cur-size-all-mem-tables", &v)) total += v;
  }
  return total;
}

size_t RocksDBDatabase::databases_sharing_budget() const {
  // Each database holds its budget once (Impl::budget); nothing else keeps a reference.
  return impl_->budget ? static_cast<size_t>(impl_->budget.use_count()) : 1;
}

uint64_t RocksDBDatabase::memory_usage() const {
  uint64_t total = 0;
  for (ColumnFamily* cf : impl_->data_families()) {
    uint64_t v = 0;
    if (impl_->db->GetIntProperty(cf->handle, "rocksdb.cur-size-all-mem-tables", &v)) total += v;
    if (!impl_->cache && impl_->db->GetIntProperty(cf->handle, "rocksdb.block-cache-usage", &v)) total += v;
    if (impl_->db->GetIntProperty(cf->handle, "rocksdb.estimate-table-readers-mem", &v)) total += v;
  }
  // With a budget the cache is shared and already holds the memtables' reservations: count it once.
  if (impl_->cache) total = std::max<uint64_t>(total, impl_->cache->GetUsage());
  return total;
}

void RocksDBDatabase::compact() {
  rocksdb::FlushOptions flush;
  flush.wait = true;
  for (ColumnFamily* cf : impl_->data_families()) {
    rocksdb::Status s = impl_->db->Flush(flush, cf->handle);
    if (!s.ok()) throw_rocksdb(directory(), "a flush", s);
    s = impl_->db->CompactRange(rocksdb::CompactRangeOptions(), cf->handle, nullptr, nullptr);
    if (!s.ok()) throw_rocksdb(directory(), "a compaction", s);
  }
}

namespace {
const RocksDBModule kModule{kRocksDBModuleAbiVersion, kRocksDBModuleInterfaceToken, &RocksDBDatabase::open};
}  // namespace

}  // namespace sluice

// The module's one exported symbol (the others are hidden: the module is linked with -fvisibility=hidden and
// --exclude-libs,ALL so that its copies of sluice_core and RocksDB's callers never interpose on the process's).
extern "C" __attribute__((visibility("default"))) const sluice::RocksDBModule* sluice_rocksdb_module() {
  return &sluice::kModule;
}
