// Incremental checkpoints of the rocksdb backend (issue 18) through the real storage and retention path: a
// KeyedStateStore on rocksdb with state.backend.incremental captures, FileCheckpointStorage writes chk-<n> (new SST
// files into shared/, the rest in the state file), CompletedCheckpointStore retains and releases checkpoints and
// reference-counts the shared files, and assign_subtask_states + KeyedStateStore::restore bring any retained
// checkpoint back, also at another parallelism. Checked after every checkpoint of a chain of 10 with 1 % of the keys
// changed each time (and compactions that replace files): every shared file a retained checkpoint references exists,
// and every file in shared/ is referenced by a retained checkpoint (deleted when unreferenced, never while
// referenced). An aborted checkpoint's uploads stay and are referenced by the next one; savepoints stay canonical;
// the heap refuses an incremental checkpoint with a reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/completed_checkpoint_store.h"
#include "sluice/checkpoint/state_assignment.h"
#include "sluice/core/clock.h"
#include "sluice/state/keyed_state_store.h"
#include "sluice/state/timer_service.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kMaxParallelism = 128;
constexpr int64_t kKeys = 20'000;
const std::string kUid = "counts";

using Contents = std::map<int64_t, std::string>;

class IncrementalCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("sluice-incremental-test-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    auto storage = FileCheckpointStorage::create("file://" + (root_ / "checkpoints").string(), "job-a");
    ASSERT_TRUE(storage.ok()) << storage.error().to_string();
    storage_ = std::make_unique<FileCheckpointStorage>(std::move(*storage));
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  StateBackendOptions options(bool rocksdb = true) const {
    StateBackendOptions o;
    o.type = rocksdb ? StateBackendOptions::Type::kRocksDB : StateBackendOptions::Type::kHashMap;
    o.local_dir = root_ / "local";
    o.incremental = true;
    return o;
  }

  std::unique_ptr<KeyedStateStore<int64_t>> make_store(int parallelism, int index, bool rocksdb = true) {
    return std::make_unique<KeyedStateStore<int64_t>>(
        KeyGroupRange::for_operator_index(kMaxParallelism, parallelism, index), kMaxParallelism, clock_,
        options(rocksdb), "counts", index, 0);
  }

  static ValueState<std::string>& value(KeyedStateStore<int64_t>& s) {
    return s.get_state(ValueStateDescriptor<std::string>{"value"});
  }
  static ListState<int64_t>& history(KeyedStateStore<int64_t>& s) {
    return s.get_state(ListStateDescriptor<int64_t>{"history"});
  }

  void put(KeyedStateStore<int64_t>& s, int64_t key, const std::string& v, int64_t round) {
    s.set_current_key(key);
    value(s).update(v);
    history(s).add(round);
    expected_[key] = v;
    rounds_[key].push_back(round);
  }

  // Writes checkpoint `id` of `store` (subtask 0 of parallelism 1) and returns its metadata (not yet finalized
  // when `finalize` is false: an aborted checkpoint).
  CheckpointMetadata write_checkpoint(KeyedStateStore<int64_t>& store, int64_t id, uint64_t& uploaded,
                                      bool finalize = true) {
    auto keyed = store.capture<VoidNamespace>(nullptr);
    return write_captured(*keyed, id, uploaded, finalize);
  }

  // A store of parallelism 1 with every key written once, and checkpoint 1 of it (the base of the next ones).
  std::unique_ptr<KeyedStateStore<int64_t>> filled_and_checkpointed(uint64_t& uploaded) {
    auto state = make_store(1, 0);
    for (int64_t k = 0; k < kKeys; ++k)
      put(*state, k, "a" + std::to_string(k), 0);
    write_checkpoint(*state, 1, uploaded);
    return state;
  }

  // write_checkpoint() of a capture taken before (the barrier), so the task can write between the two.
  CheckpointMetadata write_captured(const KeyedStateSnapshot& keyed, int64_t id, uint64_t& uploaded,
                                    bool finalize = true) {
    auto dir = storage_->init_checkpoint(id);
    EXPECT_TRUE(dir.ok());
    auto handle = storage_->write_subtask_state(*dir, kUid, 0, "", &keyed, &uploaded);
    EXPECT_TRUE(handle.ok()) << handle.error().to_string();
    CheckpointMetadata m;
    m.checkpoint_id = id;
    m.job_id = "job-a";
    OperatorStateEntry e;
    e.uid = kUid;
    e.parallelism = 1;
    e.max_parallelism = kMaxParallelism;
    e.subtasks.push_back(*handle);
    m.operators.push_back(e);
    if (finalize) {
      Status st = storage_->finalize_checkpoint(*dir, m);
      EXPECT_TRUE(st.ok()) << st.error().to_string();
    } else {
      storage_->discard(*dir);
    }
    return m;
  }

  // The subtasks of parallelism `parallelism` restored from checkpoint `dir`, with their states registered.
  std::vector<std::unique_ptr<KeyedStateStore<int64_t>>> restored_stores(const fs::path& dir, int parallelism) {
    std::vector<std::unique_ptr<KeyedStateStore<int64_t>>> out;
    auto metadata = FileCheckpointStorage::load_metadata(dir);
    EXPECT_TRUE(metadata.ok());
    if (!metadata.ok()) return out;
    auto restores = assign_subtask_states(*metadata, dir, VertexToRestore{{kUid}, parallelism, {kMaxParallelism}});
    EXPECT_TRUE(restores.ok()) << restores.error().to_string();
    if (!restores.ok()) return out;
    for (int i = 0; i < parallelism; ++i) {
      out.push_back(make_store(parallelism, i));
      Status st = out.back()->restore<VoidNamespace>(nullptr, *(*restores)[i]->operators.at(kUid).keyed);
      EXPECT_TRUE(st.ok()) << st.error().to_string();
      value(*out.back());
      history(*out.back());
    }
    return out;
  }

  // Writes checkpoint `id` of `subtasks` (subtask i of parallelism subtasks.size()), asserting each is native
  // (incremental), and returns its directory.
  fs::path write_native_checkpoint(const std::vector<std::unique_ptr<KeyedStateStore<int64_t>>>& subtasks, int64_t id) {
    auto dir = storage_->init_checkpoint(id);
    EXPECT_TRUE(dir.ok());
    CheckpointMetadata m;
    m.checkpoint_id = id;
    m.job_id = "job-a";
    OperatorStateEntry e{kUid, static_cast<int>(subtasks.size()), kMaxParallelism, {}};
    for (size_t i = 0; i < subtasks.size(); ++i) {
      auto keyed = subtasks[i]->capture<VoidNamespace>(nullptr);
      auto h = storage_->write_subtask_state(*dir, kUid, static_cast<int>(i), "", keyed.get());
      EXPECT_TRUE(h.ok()) << h.error().to_string();
      if (!h.ok()) return *dir;
      EXPECT_TRUE(h->native.has_value()) << "subtask " << i;
      e.subtasks.push_back(*h);
    }
    m.operators.push_back(e);
    Status st = storage_->finalize_checkpoint(*dir, m);
    EXPECT_TRUE(st.ok()) << st.error().to_string();
    return *dir;
  }

  std::set<std::string> files_in_shared() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(storage_->shared_dir()))
      names.insert(e.path().filename().string());
    return names;
  }

  // Restores checkpoint `dir` at `parallelism` and returns the union of every subtask's contents; each subtask
  // must hold only keys of its own key groups (checked by counting entries).
  Contents restore_all(const fs::path& dir, int parallelism, std::map<int64_t, std::vector<int64_t>>* lists = nullptr) {
    auto metadata = FileCheckpointStorage::load_metadata(dir);
    EXPECT_TRUE(metadata.ok());
    EXPECT_TRUE(verify_checkpoint_files(*metadata, dir).ok());
    VertexToRestore v{{kUid}, parallelism, {kMaxParallelism}};
    auto restores = assign_subtask_states(*metadata, dir, v);
    EXPECT_TRUE(restores.ok()) << restores.error().to_string();
    Contents all;
    size_t entries = 0;
    for (int i = 0; i < parallelism; ++i) {
      auto store = make_store(parallelism, i);
      const auto& op = (*restores)[static_cast<size_t>(i)]->operators.at(kUid);
      Status st = store->restore<VoidNamespace>(nullptr, *op.keyed);
      EXPECT_TRUE(st.ok()) << st.error().to_string();
      value(*store);
      history(*store);
      entries += store->num_entries("value");
      for (int64_t key = 0; key < kKeys; ++key) {
        const KeyGroup kg = key_group_for_hash(key_hash_of(key), kMaxParallelism);
        if (!store->key_group_range().contains(kg)) continue;
        store->set_current_key(key);
        if (value(*store).has_value()) all[key] = value(*store).value();
        if (lists != nullptr) (*lists)[key] = history(*store).get();
      }
    }
    EXPECT_EQ(entries, all.size()) << "a subtask kept entries outside its key groups";
    return all;
  }

  static uint64_t key_hash_of(int64_t key) {
    DataOutput out;
    TypeSerializer<int64_t>::serialize(key, out);
    return key_hash(out.bytes());
  }

  fs::path root_;
  ManualClock clock_{1'000'000};
  std::unique_ptr<FileCheckpointStorage> storage_;
  Contents expected_;
  std::map<int64_t, std::vector<int64_t>> rounds_;
};

TEST_F(IncrementalCheckpointTest, ChainOfTenRestoresEveryRetainedCheckpointAndDeletesOnlyUnreferencedFiles) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  CompletedCheckpointStore store(3, *storage_);
  auto state = make_store(1, 0);
  for (int64_t k = 0; k < kKeys; ++k)
    put(*state, k, "v0-" + std::to_string(k) + std::string(40, 'x'), 0);
  std::map<int64_t, Contents> at;  // checkpoint id -> the contents it captured
  uint64_t incremental_uploaded = 0;
  uint64_t incremental_total = 0;
  for (int64_t id = 1; id <= 10; ++id) {
    if (id > 1) {
      for (int i = 0; i < kKeys / 100; ++i) {  // 1 % of the keys change
        const int64_t k = static_cast<int64_t>(rng() % kKeys);
        put(*state, k, "v" + std::to_string(id) + "-" + std::to_string(k), id);
      }
    }
    if (id % 4 == 0) state->rocksdb()->instance().compact();  // replaces files: earlier uploads become unused
    uint64_t uploaded = 0;
    CheckpointMetadata m = write_checkpoint(*state, id, uploaded);
    uint64_t shared_total = 0;
    for (const auto& [name, size] : shared_files_of(m))
      shared_total += size;
    ASSERT_GT(shared_total, 0u);
    std::printf("checkpoint %lld: %llu of %llu shared bytes uploaded\n", static_cast<long long>(id),
                static_cast<unsigned long long>(uploaded), static_cast<unsigned long long>(shared_total));
    if (id == 1) {
      EXPECT_EQ(uploaded, shared_total);
    } else if (id % 4 == 0) {
      // The state's column families were compacted into new files (the small metadata family was not).
      EXPECT_GT(uploaded * 10, shared_total * 9) << "checkpoint " << id;
    } else {
      // RocksDB's own compactions may rewrite files now and then; over the chain most bytes are referenced.
      incremental_uploaded += uploaded;
      incremental_total += shared_total;
    }
    at[id] = expected_;
    store.add(CompletedCheckpoint{id, storage_->checkpoint_dir(id), m});
    // Referenced files exist; every file in shared/ is referenced by a retained checkpoint.
    std::map<std::string, int> refs;
    for (const auto& c : store.all())
      for (const auto& [name, size] : shared_files_of(c->metadata))
        ++refs[name];
    const std::set<std::string> present = files_in_shared();
    for (const auto& [name, n] : refs) {
      EXPECT_TRUE(present.contains(name)) << name << " is referenced by " << n << " checkpoint(s) but was deleted";
      EXPECT_EQ(store.shared_references(name), n) << name;
    }
    for (const std::string& name : present)
      EXPECT_TRUE(refs.contains(name)) << name << " is referenced by no retained checkpoint but was not deleted";
    EXPECT_EQ(store.size(), static_cast<size_t>(std::min<int64_t>(id, 3)));
  }
  std::printf("checkpoints without a forced compaction uploaded %llu of %llu referenced bytes\n",
              static_cast<unsigned long long>(incremental_uploaded),
              static_cast<unsigned long long>(incremental_total));
  EXPECT_LT(incremental_uploaded * 4, incremental_total) << "the checkpoints are not incremental";
  // Every retained checkpoint restores exactly what it captured; the newest also at parallelism 3 and 1.
  for (const auto& c : store.all()) {
    EXPECT_TRUE(restore_all(c->dir, 1) == at[c->id]) << "checkpoint " << c->id;
  }
  std::map<int64_t, std::vector<int64_t>> lists;
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(10), 3, &lists) == at[10]);
  EXPECT_TRUE(lists == rounds_) << "list state differs after rescaling to 3";
  // 3 -> 1: a checkpoint taken by the three rescaled subtasks restores into one.
  {
    auto subs = restored_stores(storage_->checkpoint_dir(10), 3);
    if (HasFailure()) return;
    const fs::path dir = write_native_checkpoint(subs, 11);
    if (HasFatalFailure()) return;
    lists.clear();
    EXPECT_TRUE(restore_all(dir, 1, &lists) == at[10]);
    EXPECT_TRUE(lists == rounds_);
  }
}

// 2 -> 1 -> 2 -> 1: a new subtask opens the old database sharing most of its key groups in place (clipped) and
// ingests the other's entries as SST files. From fresh databases the ingested file lies below everything (sequence
// number 0); after 1 -> 2 the base keeps the clipped half under range deletions, so in 2 -> 1 the file overlaps them
// and RocksDB gives it a newer sequence number. Each restored database takes native checkpoints (the seqno check
// passes with ingested files) that restore every value and list element, at 3 too, with nothing left to ingest.
TEST_F(IncrementalCheckpointTest, ARescaledRestoreIngestsTheOtherDatabasesEntriesAndItsCheckpointsRestoreAgain) {
  std::vector<std::unique_ptr<KeyedStateStore<int64_t>>> subtasks;
  for (int i = 0; i < 2; ++i)
    subtasks.push_back(make_store(2, i));
  for (int64_t k = 0; k < kKeys; ++k) {
    for (auto& sub : subtasks) {
      if (sub->key_group_range().contains(key_group_for_hash(key_hash_of(k), kMaxParallelism)))
        put(*sub, k, "two-" + std::to_string(k), 0);
    }
  }
  fs::path dir = write_native_checkpoint(subtasks, 1);
  if (HasFatalFailure()) return;
  int64_t id = 1;
  for (int parallelism : {1, 2, 1}) {
    SCOPED_TRACE("restored at parallelism " + std::to_string(parallelism));
    subtasks = restored_stores(dir, parallelism);
    if (HasFatalFailure()) return;
    size_t entries = 0;
    for (auto& sub : subtasks) {
      entries += sub->num_entries("value");
      EXPECT_FALSE(fs::exists(sub->rocksdb()->instance().directory() / "restore-ingest"));
    }
    if (parallelism == 1) {
      EXPECT_EQ(entries, static_cast<size_t>(kKeys));
    }
    for (auto& sub : subtasks) {  // later writes land over restored and ingested entries
      for (int64_t k = id; k < kKeys; k += 7) {
        if (sub->key_group_range().contains(key_group_for_hash(key_hash_of(k), kMaxParallelism)))
          put(*sub, k, "p" + std::to_string(parallelism) + "-" + std::to_string(k), id);
      }
    }
    dir = write_native_checkpoint(subtasks, ++id);
    if (HasFatalFailure()) return;
    subtasks.clear();
    std::map<int64_t, std::vector<int64_t>> lists;
    EXPECT_TRUE(restore_all(dir, 3, &lists) == expected_);
    EXPECT_TRUE(lists == rounds_);
  }
  EXPECT_TRUE(restore_all(dir, 1) == expected_);
}

TEST_F(IncrementalCheckpointTest, AnAbortedCheckpointsUploadsStayAndTheNextCheckpointReferencesThem) {
  CompletedCheckpointStore store(1, *storage_);
  auto state = make_store(1, 0);
  for (int64_t k = 0; k < kKeys; ++k)
    put(*state, k, "a" + std::to_string(k), 0);
  uint64_t uploaded = 0;
  CheckpointMetadata aborted = write_checkpoint(*state, 1, uploaded, /*finalize=*/false);
  EXPECT_GT(uploaded, 0u);
  EXPECT_FALSE(fs::exists(storage_->checkpoint_dir(1)));
  const auto aborted_files = shared_files_of(aborted);
  for (const auto& [name, size] : aborted_files)
    EXPECT_TRUE(fs::exists(storage_->shared_dir() / name)) << name;
  put(*state, 7, "changed", 1);
  CheckpointMetadata next = write_checkpoint(*state, 2, uploaded);
  store.add(CompletedCheckpoint{2, storage_->checkpoint_dir(2), next});
  // Files still live in the database (RocksDB may have compacted some meanwhile) are referenced, not uploaded
  // again, and now counted by the store.
  std::map<std::string, std::string> aborted_by_local;
  for (const auto& f : aborted.operators[0].subtasks[0].native->files)
    if (!f.shared_name.empty()) aborted_by_local[f.local_name] = f.shared_name;
  int reused = 0;
  for (const auto& f : next.operators[0].subtasks[0].native->files) {
    auto it = aborted_by_local.find(f.local_name);
    if (it == aborted_by_local.end()) continue;
    EXPECT_EQ(f.shared_name, it->second) << f.local_name << " uploaded again instead of referenced";
    EXPECT_EQ(store.shared_references(f.shared_name), 1);
    ++reused;
  }
  EXPECT_GT(reused, 0);
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(2), 2) == expected_);
}

// The synchronous part only switches the memtables; their flush and the hard links come on the writer thread while
// the task writes on. The checkpoint holds the state as of the capture, not the writes after it.
TEST_F(IncrementalCheckpointTest, WritesAfterTheCaptureStayOutOfTheCheckpointWhoseFlushRunsBesideThem) {
  uint64_t uploaded = 0;
  auto state = filled_and_checkpointed(uploaded);
  for (int64_t k = 0; k < kKeys; k += 3)
    put(*state, k, "b" + std::to_string(k), 1);
  const Contents at_barrier = expected_;
  auto keyed = state->capture<VoidNamespace>(nullptr);
  for (int64_t k = 0; k < kKeys; k += 2)
    put(*state, k, "c" + std::to_string(k), 2);
  state->set_current_key(1);
  value(*state).clear();
  expected_.erase(1);
  CheckpointMetadata m = write_captured(*keyed, 2, uploaded);
  ASSERT_TRUE(m.operators[0].subtasks[0].native.has_value()) << "the checkpoint was not written natively";
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(2), 1) == at_barrier);
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(2), 3) == at_barrier);
  // The writes after the barrier are in the next checkpoint.
  write_checkpoint(*state, 3, uploaded);
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(3), 2) == expected_);
}

// A burst of writes right after the barrier fills and seals several memtables while the barrier's own flush runs
// (a budget of 3 MiB: 512 KiB memtables). Their flushes queue behind it, and the barrier's files are linked when
// its flush lands, before any of them: the checkpoint is native and holds the barrier's state.
TEST_F(IncrementalCheckpointTest, ABurstOfWritesAfterTheCaptureThatFillsMemtablesLeavesANativeCheckpointOfTheBarrier) {
  StateBackendOptions small = options();
  small.memory.managed_bytes = 3 << 20;
  auto state = std::make_unique<KeyedStateStore<int64_t>>(KeyGroupRange::for_operator_index(kMaxParallelism, 1, 0),
                                                          kMaxParallelism, clock_, small, "counts", 0, 0);
  const std::string pad(1'000, 'p');
  for (int64_t k = 0; k < kKeys; ++k)
    put(*state, k, "a" + std::to_string(k), 0);
  uint64_t uploaded = 0;
  write_checkpoint(*state, 1, uploaded);
  int native = 0;
  for (int round = 2; round <= 4; ++round) {
    for (int64_t k = round; k < kKeys; k += 7)
      put(*state, k, "b" + std::to_string(k * round), round);
    const Contents at_barrier = expected_;
    auto keyed = state->capture<VoidNamespace>(nullptr);
    for (int64_t k = 0; k < kKeys; ++k)  // ~20 MiB: about 40 memtables
      put(*state, k, pad + std::to_string(k * round), round);
    CheckpointMetadata m = write_captured(*keyed, round, uploaded);
    native += m.operators[0].subtasks[0].native.has_value() ? 1 : 0;
    EXPECT_TRUE(restore_all(storage_->checkpoint_dir(round), 2) == at_barrier) << "checkpoint " << round;
  }
  EXPECT_EQ(native, 3) << "a burst after the barrier made a checkpoint fall back to its canonical form";
}

// A capture with nothing to flush (the previous checkpoint flushed everything) is linked when the next flush
// begins, before it writes the later writes into a file: still native.
TEST_F(IncrementalCheckpointTest, ACaptureWithNothingToFlushIsLinkedBeforeTheNextFlushWrites) {
  uint64_t uploaded = 0;
  auto state = filled_and_checkpointed(uploaded);
  const Contents at_barrier = expected_;
  auto keyed = state->capture<VoidNamespace>(nullptr);
  for (int64_t k = 0; k < kKeys; k += 2)
    put(*state, k, "c" + std::to_string(k), 2);
  state->rocksdb()->instance().compact();
  CheckpointMetadata m = write_captured(*keyed, 2, uploaded);
  EXPECT_TRUE(m.operators[0].subtasks[0].native.has_value());
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(2), 2) == at_barrier);
}

// When a memtable of writes after the barrier is flushed before the checkpoint's files are linked (the listener
// held back here; a forced flush and compaction come first), no set of the database's files is the captured state:
// that checkpoint is written canonically from the capture's snapshot, and the next capture flushes synchronously.
TEST_F(IncrementalCheckpointTest, AFlushOfLaterWritesBeforeTheLinkMakesThatCheckpointCanonical) {
  uint64_t uploaded = 0;
  auto state = filled_and_checkpointed(uploaded);
  for (int64_t k = 0; k < kKeys; k += 5)
    put(*state, k, "b" + std::to_string(k), 1);
  write_checkpoint(*state, 2, uploaded);
  std::map<int64_t, std::vector<int64_t>> lists_at_barrier = rounds_;
  const Contents at_barrier = expected_;
  state->rocksdb()->instance().hold_checkpoint_links_for_testing(true);
  auto keyed = state->capture<VoidNamespace>(nullptr);
  for (int64_t k = 0; k < kKeys; k += 2)
    put(*state, k, "c" + std::to_string(k), 2);
  state->rocksdb()->instance().compact();  // flushes the writes after the barrier into the files
  CheckpointMetadata m = write_captured(*keyed, 3, uploaded);
  state->rocksdb()->instance().hold_checkpoint_links_for_testing(false);
  const OperatorSubtaskStateHandle& canonical = m.operators[0].subtasks[0];
  EXPECT_FALSE(canonical.native.has_value());
  EXPECT_FALSE(canonical.key_groups.empty());
  std::map<int64_t, std::vector<int64_t>> lists;
  EXPECT_TRUE(restore_all(storage_->checkpoint_dir(3), 2, &lists) == at_barrier);
  EXPECT_TRUE(lists == lists_at_barrier);
  // A savepoint's capture (never completed) leaves the request for a synchronous capture in place.
  state->capture<VoidNamespace>(nullptr).reset();
  // The next capture flushes on the task thread and is native again; the one after it is asynchronous again.
  for (int rounds = 4; rounds <= 5; ++rounds) {
    for (int64_t k = 1; k < kKeys; k += 7)
      put(*state, k, "d" + std::to_string(k * rounds), rounds);
    CheckpointMetadata next = write_checkpoint(*state, rounds, uploaded);
    EXPECT_TRUE(next.operators[0].subtasks[0].native.has_value());
    lists.clear();
    EXPECT_TRUE(restore_all(storage_->checkpoint_dir(rounds), 1, &lists) == expected_);
    EXPECT_TRUE(lists == rounds_);
  }
}

TEST_F(IncrementalCheckpointTest, SavepointsStayCanonicalAndTheHeapRefusesIncrementalCheckpoints) {
  auto state = make_store(1, 0);
  for (int64_t k = 0; k < 1'000; ++k)
    put(*state, k, "s" + std::to_string(k), 0);
  auto sp_dir = storage_->init_savepoint((root_ / "savepoints").string(), 1);
  ASSERT_TRUE(sp_dir.ok());
  auto keyed = state->capture<VoidNamespace>(nullptr);
  uint64_t uploaded = 0;
  auto sp = storage_->write_subtask_state(*sp_dir, kUid, 0, "", keyed.get(), &uploaded);
  ASSERT_TRUE(sp.ok());
  EXPECT_FALSE(sp->native.has_value());
  EXPECT_EQ(uploaded, 0u);
  EXPECT_EQ(sp->key_groups.size(), 128u);
  // The canonical savepoint restores into the heap.
  CheckpointMetadata m;
  m.checkpoint_id = 1;
  m.type = SnapshotType::kSavepoint;
  m.operators.push_back(OperatorStateEntry{kUid, 1, kMaxParallelism, {*sp}});
  ASSERT_TRUE(storage_->finalize_checkpoint(*sp_dir, m).ok());
  auto restores = assign_subtask_states(m, *sp_dir, VertexToRestore{{kUid}, 1, {kMaxParallelism}});
  ASSERT_TRUE(restores.ok());
  auto heap = make_store(1, 0, /*rocksdb=*/false);
  ASSERT_TRUE(heap->restore<VoidNamespace>(nullptr, *(*restores)[0]->operators.at(kUid).keyed).ok());
  heap->set_current_key(42);
  EXPECT_EQ(value(*heap).value(), "s42");
  // An incremental checkpoint: RocksDB's own files, which the heap cannot read.
  CheckpointMetadata chk = write_checkpoint(*state, 2, uploaded);
  auto chk_restores =
      assign_subtask_states(chk, storage_->checkpoint_dir(2), VertexToRestore{{kUid}, 1, {kMaxParallelism}});
  ASSERT_TRUE(chk_restores.ok());
  auto heap2 = make_store(1, 0, /*rocksdb=*/false);
  Status refused = heap2->restore<VoidNamespace>(nullptr, *(*chk_restores)[0]->operators.at(kUid).keyed);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message(), HasSubstr("through a savepoint"));
}

TEST_F(IncrementalCheckpointTest, ARestoredDatabaseChecksTheStatesTypesAndRefusesCanonicalSnapshotsOfUnregisteredOnes) {
  CompletedCheckpointStore store(1, *storage_);
  auto state = make_store(1, 0);
  for (int64_t k = 0; k < 100; ++k)
    put(*state, k, "t" + std::to_string(k), 0);
  uint64_t uploaded = 0;
  CheckpointMetadata m = write_checkpoint(*state, 1, uploaded);
  auto restores = assign_subtask_states(m, storage_->checkpoint_dir(1), VertexToRestore{{kUid}, 1, {kMaxParallelism}});
  ASSERT_TRUE(restores.ok());
  auto restored = make_store(1, 0);
  ASSERT_TRUE(restored->restore<VoidNamespace>(nullptr, *(*restores)[0]->operators.at(kUid).keyed).ok());
  // "value" was a ValueState: registering it as a list fails with the state's name.
  try {
    restored->get_state(ListStateDescriptor<std::string>{"value"});
    ADD_FAILURE() << "a list registration of a restored value state was accepted";
  } catch (const SluiceException& e) {
    EXPECT_THAT(e.error().message(), HasSubstr("value"));
  }
  // Unregistered restored states cannot be written canonically (a savepoint), but incrementally they can.
  auto keyed = restored->capture<VoidNamespace>(nullptr);
  auto sp_dir = storage_->init_savepoint((root_ / "savepoints").string(), 2);
  ASSERT_TRUE(sp_dir.ok());
  auto sp = storage_->write_subtask_state(*sp_dir, kUid, 0, "", keyed.get());
  ASSERT_FALSE(sp.ok());
  EXPECT_THAT(sp.error().to_string(), HasSubstr("not registered"));
  auto dir = storage_->init_checkpoint(2);
  ASSERT_TRUE(dir.ok());
  auto chk = storage_->write_subtask_state(*dir, kUid, 0, "", keyed.get());
  EXPECT_TRUE(chk.ok()) << chk.error().to_string();
}

}  // namespace
}  // namespace sluice
