// State larger than memory (issue 18): 5 GiB of keyed state written into one RocksDB keyed state backend with a
// 512 MiB managed-memory budget (state.backend.rocksdb.memory.fixed-per-slot); the process's RSS stays within
// the budget plus a documented overhead while the state grows to ten times the budget, and every value reads back.
//
// SLUICE_LARGE_STATE_MIB and SLUICE_LARGE_STATE_BUDGET_MIB change the sizes (defaults 5120 and 512; the same
// in CI). Values are random bytes, so compression cannot shrink the state below the budget. Keys are written in
// key order (key group, then key), so compactions move files rather than rewrite them: the test is about memory,
// and a random order would spend minutes on write amplification without touching more memory (RocksDB's
// compaction buffers are small next to the budget). The database lives under the test's temp dir and is removed.
//
// A second case restores a canonical state file (what a full checkpoint or a savepoint writes) four times the
// budget into a new backend the way a job does (key groups first, the state registered afterwards) and checks the
// process's anonymous memory stays within the budget plus the overhead: the file is mapped, not copied
// (SLUICE_LARGE_RESTORE_MIB, default 2048).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/core/clock.h"
#include "sluice/core/key_group.h"
#include "sluice/state/keyed_operator_snapshot.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/state.h"
#include "sluice/state/timer_service.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

uint64_t env_mib(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

/// A field of /proc/self/status in bytes ("VmRSS:", "RssAnon:", "RssFile:").
uint64_t status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + field.size(), nullptr, 10) * 1024;
  }
  return 0;
}

/// The process's resident set (VmRSS) in bytes.
uint64_t rss_bytes() {
  return status_bytes("VmRSS:");
}

/// Bytes under `dir` (the database's files).
uint64_t disk_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  }
  return n;
}

std::string key_of(int64_t i) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "k%015" PRId64, i);
  return buf;
}

/// Keys 0..keys-1 grouped by key group, each group's keys in increasing (= byte) order: the database's key order.
std::vector<std::vector<int64_t>> keys_in_database_order(RocksDBKeyedStateBackend<std::string>& backend, int64_t keys) {
  std::vector<std::vector<int64_t>> by_group(static_cast<size_t>(kDefaultMaxParallelism));
  for (int64_t i = 0; i < keys; ++i)
    by_group[static_cast<size_t>(backend.key_group_of(key_of(i)).value)].push_back(i);
  return by_group;
}

TEST(RocksDBLargeStateTest, StateTenTimesTheBudgetKeepsRssWithinTheBudgetPlusOverhead) {
  const uint64_t state_bytes = env_mib("SLUICE_LARGE_STATE_MIB", 5120) << 20;
  const uint64_t budget = env_mib("SLUICE_LARGE_STATE_BUDGET_MIB", 512) << 20;
  // What RocksDB holds outside the budget (table readers' metadata not charged to the cache, compaction and
  // flush buffers, the allocator's free lists) and the test's own memory (value buffer, key list): measured
  // 2026-12-04 (docs/checkpoints.md, "State backends", memory bounded); a quarter of the budget leaves room for the
  // machine's noise.
  const uint64_t overhead = budget / 4;
  constexpr size_t kValueBytes = 4096;
  const int64_t keys = static_cast<int64_t>(state_bytes / kValueBytes);
  const uint64_t seed = std::random_device{}();
  std::printf("seed %" PRIu64 ", %" PRId64 " keys x %zu B = %" PRIu64 " MiB of state, budget %" PRIu64 " MiB\n", seed,
              keys, kValueBytes, state_bytes >> 20, budget >> 20);

  const fs::path dir = fs::path(::testing::TempDir()) / ("sluice-large-state-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ManualClock clock;
  RocksDBMemoryOptions memory;
  memory.managed_bytes = budget;
  const KeyGroupRange range(0, kDefaultMaxParallelism - 1);
  const uint64_t rss_before = rss_bytes();
  uint64_t peak_rss = rss_before;
  uint64_t peak_accounted = 0;
  {
    RocksDBKeyedStateBackend<std::string> backend(range, kDefaultMaxParallelism, clock, dir, memory);
    auto& value = backend.get_state(ValueStateDescriptor<std::string>{"payload"});
    const std::vector<std::vector<int64_t>> by_group = keys_in_database_order(backend, keys);
    std::mt19937_64 rng(seed);
    std::string payload(kValueBytes, '\0');
    auto fill = [&](int64_t i) {
      // Random bytes (incompressible); the key's number in front so a read can check it is the key's value.
      for (size_t b = 0; b < kValueBytes; b += 8) {
        const uint64_t r = rng();
        std::memcpy(payload.data() + b, &r, 8);
      }
      std::memcpy(payload.data(), &i, sizeof(i));
    };
    int64_t written = 0;
    for (const std::vector<int64_t>& group : by_group) {
      for (int64_t i : group) {
        backend.set_current_key(key_of(i));
        fill(i);
        value.update(payload);
        if (++written % 4096 == 0) {
          peak_rss = std::max(peak_rss, rss_bytes());
          peak_accounted = std::max(peak_accounted, backend.instance().memory_usage());
        }
      }
    }
    // Every value is there: random reads of 1.5 budgets' worth of values, so the block cache (inside the budget)
    // fills and must evict.
    std::mt19937_64 pick(seed ^ 0x9e3779b97f4a7c15ULL);
    const int64_t reads = static_cast<int64_t>(budget / kValueBytes * 3 / 2);
    for (int64_t n = 0; n < reads; ++n) {
      const int64_t i = static_cast<int64_t>(pick() % static_cast<uint64_t>(keys));
      backend.set_current_key(key_of(i));
      ASSERT_TRUE(value.has_value()) << "key " << i << " (seed " << seed << ")";
      int64_t stored = -1;
      std::memcpy(&stored, value.value().data(), sizeof(stored));
      ASSERT_EQ(stored, i) << "seed " << seed;
      ASSERT_EQ(value.value().size(), kValueBytes);
      if (n % 1024 == 0) {
        peak_rss = std::max(peak_rss, rss_bytes());
        peak_accounted = std::max(peak_accounted, backend.instance().memory_usage());
      }
    }
    const uint64_t on_disk = disk_bytes(dir);
    std::printf("written %" PRId64 " keys, read %" PRId64 "; database %" PRIu64 " MiB on disk; RSS before %" PRIu64
                " MiB, peak %" PRIu64 " MiB (+%" PRIu64 " MiB); peak memory accounted by RocksDB %" PRIu64
                " MiB of the %" PRIu64 " MiB budget\n",
                written, reads, on_disk >> 20, rss_before >> 20, peak_rss >> 20, (peak_rss - rss_before) >> 20,
                peak_accounted >> 20, budget >> 20);
    EXPECT_GE(on_disk, state_bytes * 9 / 10) << "the state did not reach disk at its size";
  }
  EXPECT_LE(peak_rss - rss_before, budget + overhead)
      << "RSS grew past the budget + overhead while the state grew to " << (state_bytes >> 20) << " MiB";
  fs::remove_all(dir);
}

/// Polls RssAnon and RssFile every 5 ms on its own thread and keeps their peaks (a restore is one call). stop()
/// wakes the thread at once (it waits on a condition between samples).
class MemorySampler {
 public:
  MemorySampler() : thread_([this] { run(); }) {}
  ~MemorySampler() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  uint64_t peak_anon() const { return peak_anon_; }
  uint64_t peak_file() const { return peak_file_; }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    do {
      peak_anon_ = std::max<uint64_t>(peak_anon_, status_bytes("RssAnon:"));
      peak_file_ = std::max<uint64_t>(peak_file_, status_bytes("RssFile:"));
    } while (!wake_.wait_for(lock, std::chrono::milliseconds(5), [this] { return stop_; }));
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<uint64_t> peak_anon_{0};
  std::atomic<uint64_t> peak_file_{0};
  std::thread thread_;
};

TEST(RocksDBLargeStateTest, ACanonicalStateFileFourTimesTheBudgetRestoresWithinTheBudget) {
  const uint64_t state_bytes = env_mib("SLUICE_LARGE_RESTORE_MIB", 2048) << 20;
  const uint64_t budget = env_mib("SLUICE_LARGE_STATE_BUDGET_MIB", 512) << 20;
  const uint64_t overhead = budget / 4;  // as in the test above
  constexpr size_t kValueBytes = 4096;
  const int64_t keys = static_cast<int64_t>(state_bytes / kValueBytes);
  const uint64_t seed = std::random_device{}();
  std::printf("seed %" PRIu64 ", %" PRId64 " keys x %zu B = %" PRIu64 " MiB of state, budget %" PRIu64 " MiB\n", seed,
              keys, kValueBytes, state_bytes >> 20, budget >> 20);
  // Before anything of the test: the allocator keeps what the source backend frees and hands it to the target.
  const uint64_t anon_before = status_bytes("RssAnon:");
  const fs::path root = fs::path(::testing::TempDir()) / ("sluice-large-restore-" + std::to_string(::getpid()));
  fs::remove_all(root);
  ManualClock clock;
  RocksDBMemoryOptions memory;
  memory.managed_bytes = budget;
  const KeyGroupRange range(0, kDefaultMaxParallelism - 1);
  // The value of key i: its number, then bytes from a generator seeded by it (incompressible, checkable).
  auto value_of = [seed](int64_t i, std::string& out) {
    out.resize(kValueBytes);
    std::mt19937_64 rng(seed ^ static_cast<uint64_t>(i));
    for (size_t b = 0; b < kValueBytes; b += 8) {
      const uint64_t r = rng();
      std::memcpy(out.data() + b, &r, 8);
    }
    std::memcpy(out.data(), &i, sizeof(i));
  };

  // A full (canonical) snapshot of the state, written as a checkpoint writes it.
  auto storage = FileCheckpointStorage::create((root / "checkpoints").string(), "large-restore");
  ASSERT_TRUE(storage.ok()) << storage.error().to_string();
  auto chk = storage->init_checkpoint(1);
  ASSERT_TRUE(chk.ok()) << chk.error().to_string();
  std::optional<OperatorSubtaskStateHandle> handle;
  {
    RocksDBKeyedStateBackend<std::string> source(range, kDefaultMaxParallelism, clock, root / "source", memory);
    auto& value = source.get_state(ValueStateDescriptor<std::string>{"payload"});
    const std::vector<std::vector<int64_t>> by_group = keys_in_database_order(source, keys);
    std::string payload;
    for (const std::vector<int64_t>& group : by_group) {
      for (int64_t i : group) {
        source.set_current_key(key_of(i));
        value_of(i, payload);
        value.update(payload);
      }
    }
    // As the operator writes it: the backend's capture beside an empty timer part.
    auto capture = std::make_unique<KeyedOperatorSnapshot>(source.capture(), nullptr);
    auto written = storage->write_subtask_state(*chk, "large", 0, "", capture.get());
    ASSERT_TRUE(written.ok()) << written.error().to_string();
    handle = *written;
  }
  fs::remove_all(root / "source");
  ASSERT_GE(handle->file_size, state_bytes);

  // Restored as a job restores: the key groups before the state is registered (the open() of the operator).
  const uint64_t anon_restore = status_bytes("RssAnon:");
  MemorySampler sampler;
  RocksDBKeyedStateBackend<std::string> target(range, kDefaultMaxParallelism, clock, root / "target", memory);
  {
    auto bytes = FileCheckpointStorage::read_state_file(*chk, *handle);
    ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
    KeyedStateRestore restore;
    restore.max_parallelism = kDefaultMaxParallelism;
    for (const KeyGroupHandle& kg : handle->key_groups)
      restore.key_groups[kg.key_group] = (*bytes)->view().substr(kg.offset, kg.length);
    restore.owners.push_back(*bytes);
    Status restored = restore_keyed_operator(target, static_cast<InternalTimerService<std::string>*>(nullptr), restore);
    ASSERT_TRUE(restored.ok()) << restored.error().to_string();
  }
  auto& value = target.get_state(ValueStateDescriptor<std::string>{"payload"});
  sampler.stop();
  std::printf("restored %" PRIu64 " MiB from a %" PRIu64 " MiB state file: RssAnon at the start %" PRIu64
              " MiB, before the restore %" PRIu64 " MiB, peak during it %" PRIu64 " MiB (+%" PRIu64
              " MiB over the start); peak RssFile %" PRIu64 " MiB (the mapped file's pages: clean, reclaimable)\n",
              state_bytes >> 20, handle->file_size >> 20, anon_before >> 20, anon_restore >> 20,
              sampler.peak_anon() >> 20, (sampler.peak_anon() - std::min(sampler.peak_anon(), anon_before)) >> 20,
              sampler.peak_file() >> 20);
  EXPECT_LE(sampler.peak_anon() - std::min(sampler.peak_anon(), anon_before), budget + overhead)
      << "a canonical restore held more anonymous memory than the budget + overhead (seed " << seed << ")";

  // Every key holds its value.
  std::string expected;
  int64_t wrong = 0;
  for (int64_t i = 0; i < keys; ++i) {
    target.set_current_key(key_of(i));
    value_of(i, expected);
    if (!value.has_value() || value.value() != expected) {
      if (++wrong <= 5) ADD_FAILURE() << "key " << i << " lost or changed by the restore (seed " << seed << ")";
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << keys << " keys";
  fs::remove_all(root);
}

}  // namespace
}  // namespace sluice
