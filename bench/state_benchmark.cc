// Heap keyed state checkpoint benchmarks (issue: copy-on-write capture): how long processing pauses for a
// checkpoint of ~100 MB of heap state with capture() (copy-on-write) against a synchronous snapshot, how
// long the asynchronous write of the capture takes, and what the first writes after a capture cost
// (each key group is cloned on its first write). Run:
//   build/release/bench/state_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and the 1 GB variant (not run by default; needs ~3 GB of memory while a capture lives):
//   build/release/bench/state_benchmark --state_mb=1000 --benchmark_repetitions=3 ...
//
// State: one ValueState<std::string> (64-byte values) keyed by int64_t, max parallelism 128, one subtask
// owning all key groups; ~160 bytes of heap per key (entry, hash-table overhead, string allocation), so
// --state_mb=100 is 625k keys. Time is the wall-clock time around exactly the measured calls (manual
// timing) per iteration; the counter cpu_ms is the thread CPU time of the same calls (steadier on a shared
// machine); items/s where given counts state updates.
#include <benchmark/benchmark.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/state.h"

namespace sluice {
namespace {

constexpr int kMaxParallelism = 128;
constexpr size_t kValueBytes = 64;
constexpr size_t kHeapBytesPerKey = 160;  // measured: RSS growth / keys for this state
constexpr uint64_t kSeed = 42;            // fixed: runs are comparable

int64_t g_state_mb = 100;

using Clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Times the measured calls of one iteration: wall clock for SetIterationTime, thread CPU time summed into
/// the cpu_ms counter.
class IterationTimer {
 public:
  explicit IterationTimer(double& cpu_total) : cpu_total_(cpu_total), wall_(Clock::now()), cpu_(thread_cpu_seconds()) {}
  void stop(benchmark::State& st) {
    cpu_total_ += thread_cpu_seconds() - cpu_;
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - wall_).count());
  }

 private:
  double& cpu_total_;
  Clock::time_point wall_;
  double cpu_;
};

/// Resident set size of this process in MB (Linux).
double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0;
  uint64_t resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return static_cast<double>(resident_pages) * 4096.0 / 1e6;
}

/// A backend with `keys` keys in one value state, built once per size and shared by the benchmarks.
struct Fixture {
  explicit Fixture(int64_t keys)
      : backend(KeyGroupRange(0, kMaxParallelism - 1), kMaxParallelism, clock),
        state(backend.get_state(ValueStateDescriptor<std::string>{"value"})),
        keys(keys),
        value(kValueBytes, 'x') {
    double before = rss_mb();
    for (int64_t k = 0; k < keys; ++k) {
      backend.set_current_key(k);
      state.update(value);
    }
    heap_mb = rss_mb() - before;
  }

  ManualClock clock{0};
  HeapKeyedStateBackend<int64_t> backend;
  HeapValueState<int64_t, VoidNamespace, std::string>& state;
  int64_t keys;
  std::string value;
  double heap_mb = 0;  // RSS growth while filling
};

Fixture& fixture() {
  static Fixture f(g_state_mb * 1'000'000 / static_cast<int64_t>(kHeapBytesPerKey));
  return f;
}

void set_counters(benchmark::State& st, const Fixture& f, double cpu_seconds) {
  st.counters["keys"] = static_cast<double>(f.keys);
  st.counters["heap_mb"] = f.heap_mb;
  st.counters["cpu_ms"] = benchmark::Counter(cpu_seconds * 1e3, benchmark::Counter::kAvgIterations);
}

// (a) The pause of a checkpoint with copy-on-write: capture() alone.
void BM_CapturePause(benchmark::State& st) {
  Fixture& f = fixture();
  double cpu = 0;
  for (auto _ : st) {
    IterationTimer t(cpu);
    auto snap = f.backend.capture();
    t.stop(st);
    benchmark::DoNotOptimize(snap.get());
  }
  set_counters(st, f, cpu);
}

// (b) The pause before: a synchronous snapshot of every key group into a buffer (reused, so no growth).
void BM_SyncSnapshot(benchmark::State& st) {
  Fixture& f = fixture();
  DataOutput out;
  double cpu = 0;
  for (auto _ : st) {
    out.clear();
    IterationTimer t(cpu);
    for (int32_t kg = 0; kg < kMaxParallelism; ++kg)
      f.backend.snapshot_key_group(KeyGroup{kg}, out);
    t.stop(st);
  }
  st.SetBytesProcessed(static_cast<int64_t>(out.size()) * st.iterations());
  set_counters(st, f, cpu);
}

// (c) The asynchronous part: writing a capture's key groups to a buffer (reused), no mutation meanwhile.
void BM_AsyncWrite(benchmark::State& st) {
  Fixture& f = fixture();
  DataOutput out;
  double cpu = 0;
  for (auto _ : st) {
    auto snap = f.backend.capture();
    out.clear();
    IterationTimer t(cpu);
    for (int32_t kg = 0; kg < kMaxParallelism; ++kg)
      snap->write_key_group(KeyGroup{kg}, out);
    t.stop(st);
  }
  st.SetBytesProcessed(static_cast<int64_t>(out.size()) * st.iterations());
  set_counters(st, f, cpu);
}

// (d) `range(0)` value-state updates of random keys, right after a capture that stays alive meanwhile
// (range(1) == 1: every key group's first write clones it) or with no capture (range(1) == 0).
void BM_UpdatesAfterCapture(benchmark::State& st) {
  Fixture& f = fixture();
  const int64_t updates = st.range(0);
  const bool with_capture = st.range(1) != 0;
  std::mt19937_64 rng(kSeed);
  std::vector<int64_t> keys(static_cast<size_t>(updates));
  for (auto& k : keys)
    k = static_cast<int64_t>(rng() % static_cast<uint64_t>(f.keys));
  double cpu = 0;
  for (auto _ : st) {
    std::unique_ptr<KeyedStateSnapshot> snap;
    if (with_capture) snap = f.backend.capture();
    IterationTimer t(cpu);
    for (int64_t k : keys) {
      f.backend.set_current_key(k);
      f.state.update(f.value);
    }
    t.stop(st);
    snap.reset();  // frees the old copies of the cloned key groups, outside the timing
  }
  st.SetItemsProcessed(updates * st.iterations());
  set_counters(st, f, cpu);
}

// (d') The worst single update after a capture: the first write into a key group, which clones that key
// group's map (1/128 of the state here). Times one update per key group, each the group's first.
void BM_FirstTouchOfAKeyGroup(benchmark::State& st) {
  Fixture& f = fixture();
  std::vector<int64_t> key_of_group(kMaxParallelism, -1);  // one key of every key group
  for (int64_t k = 0, found = 0; k < f.keys && found < kMaxParallelism; ++k) {
    auto& slot = key_of_group[static_cast<size_t>(f.backend.key_group_of(k).value)];
    if (slot < 0) {
      slot = k;
      ++found;
    }
  }
  double cpu = 0;
  int32_t kg = 0;
  std::unique_ptr<KeyedStateSnapshot> snap = f.backend.capture();
  for (auto _ : st) {
    if (kg == kMaxParallelism) {
      st.PauseTiming();
      snap = f.backend.capture();  // every key group shared again
      kg = 0;
      st.ResumeTiming();
    }
    f.backend.set_current_key(key_of_group[static_cast<size_t>(kg++)]);
    IterationTimer t(cpu);
    f.state.update(f.value);
    t.stop(st);
  }
  set_counters(st, f, cpu);
}

// Steady state (no capture ever alive): value-state reads and updates of random keys, the per-record cost
// that copy-on-write must not raise.
void BM_SteadyState(benchmark::State& st) {
  Fixture& f = fixture();
  const bool write = st.range(0) != 0;
  constexpr int64_t kOps = 1'000'000;
  std::mt19937_64 rng(kSeed);
  std::vector<int64_t> keys(kOps);
  for (auto& k : keys)
    k = static_cast<int64_t>(rng() % static_cast<uint64_t>(f.keys));
  double cpu = 0;
  for (auto _ : st) {
    IterationTimer t(cpu);
    for (int64_t k : keys) {
      f.backend.set_current_key(k);
      if (write) {
        f.state.update(f.value);
      } else {
        benchmark::DoNotOptimize(f.state.value().size());
      }
    }
    t.stop(st);
  }
  st.SetItemsProcessed(kOps * st.iterations());
  set_counters(st, f, cpu);
}

void register_benchmarks() {
  auto ms = [](benchmark::internal::Benchmark* b) { return b->UseManualTime()->Unit(benchmark::kMillisecond); };
  benchmark::RegisterBenchmark("BM_CapturePause", BM_CapturePause)->UseManualTime()->Unit(benchmark::kMicrosecond);
  ms(benchmark::RegisterBenchmark("BM_SyncSnapshot", BM_SyncSnapshot));
  ms(benchmark::RegisterBenchmark("BM_AsyncWrite", BM_AsyncWrite));
  ms(benchmark::RegisterBenchmark("BM_UpdatesAfterCapture", BM_UpdatesAfterCapture))
      ->ArgNames({"updates", "capture"})
      ->ArgsProduct({{1'000, 100'000, 1'000'000}, {0, 1}});
  benchmark::RegisterBenchmark("BM_FirstTouchOfAKeyGroup", BM_FirstTouchOfAKeyGroup)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(kMaxParallelism);
  ms(benchmark::RegisterBenchmark("BM_SteadyState", BM_SteadyState))->ArgNames({"write"})->Arg(0)->Arg(1);
}

}  // namespace
}  // namespace sluice

// Accepts --state_mb=N (default 100) besides Google Benchmark's flags.
int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--state_mb=", 11) == 0) {
      sluice::g_state_mb = std::strtoll(argv[i] + 11, nullptr, 10);
      if (sluice::g_state_mb <= 0) {
        std::fprintf(stderr, "--state_mb must be a positive number of megabytes\n");
        return 2;
      }
      continue;
    }
    argv[kept++] = argv[i];
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  sluice::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
