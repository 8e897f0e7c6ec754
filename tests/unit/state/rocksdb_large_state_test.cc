// State larger than memory (issue 18): 5 GiB of keyed state written into one RocksDB keyed state backend with a
// 512 MiB managed-memory budget (state.backend.rocksdb.memory.fixed-per-slot); the process's RSS stays within
// the budget plus a documented overhead while the state grows to ten times the budget, and every value reads back.
//
// SLUICE_LARGE_STATE_MIB and SLUICE_LARGE_STATE_BUDGET_MIB change the sizes (defaults 5120 and 512; the same
// in CI). Values are random bytes, so compression cannot shrink the state below the budget. Keys are written in
// key order (key group, then key), so compactions move files rather than rewrite them: the test is about memory,
// and a random order would spend minutes on write amplification without touching more memory (RocksDB's
// compaction buffers are small next to the budget). The database lives under the test's temp dir and is removed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/key_group.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

uint64_t env_mib(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

/// The process's resident set (VmRSS) in bytes.
uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
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
    // Keys grouped by key group, each group's keys in increasing (= byte) order: the database's key order.
    std::vector<std::vector<int64_t>> by_group(static_cast<size_t>(kDefaultMaxParallelism));
    for (int64_t i = 0; i < keys; ++i)
      by_group[static_cast<size_t>(backend.key_group_of(key_of(i)).value)].push_back(i);
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

}  // namespace
}  // namespace sluice
