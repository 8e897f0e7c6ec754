// Heap vs RocksDB keyed state backend, side by side (issue 18): per-record state access and a full
// checkpoint (capture + writing every key group) and its restore, for the same state in both backends.
// Run:
//   build/release/bench/state_backend_benchmark --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// State: one ValueState<std::string> (64-byte values) keyed by int64_t over `keys` keys, max parallelism
// 128, one subtask owning all key groups; accesses pick keys uniformly with a fixed seed. The RocksDB
// backend runs with RocksDB's defaults (no memory budget) in a working directory under /tmp. items/s counts
// state accesses (or entries, for snapshot and restore).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

constexpr int kMaxParallelism = 128;
constexpr uint64_t kSeed = 42;

std::filesystem::path work_dir() {
  static int n = 0;
  return std::filesystem::temp_directory_path() /
         ("sluice-state-backend-bench-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
}

struct Heap {
  using Backend = HeapKeyedStateBackend<int64_t>;
  static std::unique_ptr<Backend> make(const Clock& clock) {
    return std::make_unique<Backend>(KeyGroupRange(0, kMaxParallelism - 1), kMaxParallelism, clock);
  }
};
struct RocksDB {
  using Backend = RocksDBKeyedStateBackend<int64_t>;
  static std::unique_ptr<Backend> make(const Clock& clock) {
    return std::make_unique<Backend>(KeyGroupRange(0, kMaxParallelism - 1), kMaxParallelism, clock, work_dir());
  }
};

template <class B>
void fill(typename B::Backend& b, int64_t keys) {
  auto& v = b.get_state(ValueStateDescriptor<std::string>{"v"});
  const std::string value(64, 'x');
  for (int64_t k = 0; k < keys; ++k) {
    b.set_current_key(k);
    v.update(value);
  }
}

// One update of a random key (read-modify-write: value() then update()).
template <class B>
void BM_ReadModifyWrite(benchmark::State& st) {
  ManualClock clock;
  auto b = B::make(clock);
  const int64_t keys = st.range(0);
  fill<B>(*b, keys);
  auto& v = b->get_state(ValueStateDescriptor<std::string>{"v"});
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int64_t> pick(0, keys - 1);
  std::string next;
  for (auto _ : st) {
    b->set_current_key(pick(rng));
    next = v.value();
    next[0] = static_cast<char>(next[0] + 1);
    v.update(next);
  }
  st.SetItemsProcessed(st.iterations());
}

// One list append of a random key (heap: a vector push; RocksDB: a merge, no read).
template <class B>
void BM_ListAdd(benchmark::State& st) {
  ManualClock clock;
  auto b = B::make(clock);
  const int64_t keys = st.range(0);
  auto& list = b->get_state(ListStateDescriptor<int64_t>{"l"});
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int64_t> pick(0, keys - 1);
  for (auto _ : st) {
    int64_t k = pick(rng);
    b->set_current_key(k);
    list.add(k);
  }
  st.SetItemsProcessed(st.iterations());
}

// A full checkpoint: capture (the task's pause) plus writing every key group (the asynchronous part).
template <class B>
void BM_FullSnapshot(benchmark::State& st) {
  ManualClock clock;
  auto b = B::make(clock);
  const int64_t keys = st.range(0);
  fill<B>(*b, keys);
  size_t bytes = 0;
  for (auto _ : st) {
    auto capture = b->capture();
    DataOutput out;
    for (int32_t kg = 0; kg < kMaxParallelism; ++kg)
      capture->write_key_group(KeyGroup{kg}, out);
    bytes = out.size();
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * keys);
  st.counters["snapshot_MB"] = static_cast<double>(bytes) / 1e6;
}

// Restoring that checkpoint into a new backend with the state registered (decoded into the backend).
template <class B>
void BM_Restore(benchmark::State& st) {
  ManualClock clock;
  const int64_t keys = st.range(0);
  std::map<int32_t, std::string> groups;
  {
    auto b = B::make(clock);
    fill<B>(*b, keys);
    for (int32_t kg = 0; kg < kMaxParallelism; ++kg) {
      DataOutput out;
      b->snapshot_key_group(KeyGroup{kg}, out);
      groups[kg] = std::string(out.view());
    }
  }
  for (auto _ : st) {
    st.PauseTiming();
    auto target = B::make(clock);
    target->get_state(ValueStateDescriptor<std::string>{"v"});
    st.ResumeTiming();
    for (const auto& [kg, bytes] : groups) {
      DataInput in(bytes);
      if (!target->restore_key_group(KeyGroup{kg}, in).ok()) st.SkipWithError("restore failed");
    }
    st.PauseTiming();
    target.reset();
    st.ResumeTiming();
  }
  st.SetItemsProcessed(st.iterations() * keys);
}

constexpr int64_t kKeys = 200'000;
BENCHMARK_TEMPLATE(BM_ReadModifyWrite, Heap)->Arg(kKeys);
BENCHMARK_TEMPLATE(BM_ReadModifyWrite, RocksDB)->Arg(kKeys);
BENCHMARK_TEMPLATE(BM_ListAdd, Heap)->Arg(kKeys);
BENCHMARK_TEMPLATE(BM_ListAdd, RocksDB)->Arg(kKeys);
BENCHMARK_TEMPLATE(BM_FullSnapshot, Heap)->Arg(kKeys)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_FullSnapshot, RocksDB)->Arg(kKeys)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Restore, Heap)->Arg(kKeys)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Restore, RocksDB)->Arg(kKeys)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
