#include "checkpoint_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "sluice/api/keyed_process_function.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/s3_client.h"

namespace sluice::bench {
namespace {

using sluice::bench::cpu_seconds;
using sluice::bench::median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Process-wide probes of the benchmark jobs (one job runs at a time).
std::atomic<int64_t> g_processed{0};
std::atomic<bool> g_fail_now{false};
std::atomic<int64_t> g_failed_at_ns{0};
std::atomic<int64_t> g_resumed_at_ns{0};
// A new job restored from a checkpoint (attempt 0): its subtasks count as restored; each one's first record counts.
std::atomic<bool> g_restoring_job{false};
std::atomic<int> g_restored_subtasks{0};
std::atomic<int64_t> g_last_restored_at_ns{0};
// recovery --verify-keys: records whose key had no value yet (a key written for the first time, or after a restore
// a key whose state is missing), and after the restore which keys the restored job has visited (a flag per key).
std::atomic<int64_t> g_new_keys{0};
std::unique_ptr<std::atomic<bool>[]> g_visited;
std::atomic<int64_t> g_visited_keys{0};

/// Keeps one value of `bytes` bytes per key and rewrites it on every record.
class FillState final : public KeyedProcessFunction<int64_t, int64_t, int64_t> {
 public:
  /// `count_new_keys` reads each key's state before it writes it and counts the keys that had none (g_new_keys).
  explicit FillState(int64_t bytes, bool random = false, bool count_new_keys = false)
      : bytes_(bytes), random_(random), count_new_keys_(count_new_keys) {}
  void open(RuntimeContext& ctx) override {
    value_ = &keyed_state().get_state(ValueStateDescriptor<std::string>{"value", {}});
    restored_ = ctx.attempt_number() > 0 || g_restoring_job.load();
    mark_visits_ = count_new_keys_ && restored_;
  }
  void process_element(const int64_t& v, Context&, Collector<int64_t>&) override {
    if (restored_) {
      const int64_t now = now_ns();
      int64_t expected = 0;
      g_resumed_at_ns.compare_exchange_strong(expected, now);
      int64_t last = g_last_restored_at_ns.load();
      while (last < now && !g_last_restored_at_ns.compare_exchange_weak(last, now)) {
      }
      g_restored_subtasks.fetch_add(1);
      restored_ = false;
    }
    if (count_new_keys_ && !value_->has_value()) g_new_keys.fetch_add(1, std::memory_order_relaxed);
    if (mark_visits_ && !g_visited[static_cast<size_t>(v)].exchange(true, std::memory_order_relaxed))
      g_visited_keys.fetch_add(1, std::memory_order_relaxed);
    std::string s(static_cast<size_t>(bytes_), static_cast<char>('a' + v % 26));
    if (random_) {
      // Incompressible: SplitMix64 of (record, update count), new bytes on every update of the key.
      uint64_t x = static_cast<uint64_t>(v) ^ (static_cast<uint64_t>(++updates_) << 40);
      for (size_t b = 0; b + 8 <= s.size(); b += 8) {
        x += 0x9E3779B97F4A7C15ULL;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        std::memcpy(s.data() + b, &z, 8);
      }
    }
    value_->update(std::move(s));
    g_processed.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  int64_t bytes_;
  bool random_ = false;
  bool count_new_keys_ = false;
  bool mark_visits_ = false;  // a restored job's subtask under --verify-keys
  int64_t updates_ = 0;
  bool restored_ = false;
  ValueState<std::string>* value_ = nullptr;
};

/// Counts records per key (the "keyed counting job").
class Count final : public KeyedProcessFunction<int64_t, int64_t, int64_t> {
 public:
  void open(RuntimeContext&) override { count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0}); }
  void process_element(const int64_t&, Context&, Collector<int64_t>& out) override {
    int64_t c = count_->value() + 1;
    count_->update(c);
    if ((c & 1023) == 0) out.collect(c);  // a trickle of output, so the sink is exercised
  }

 private:
  ValueState<int64_t>* count_ = nullptr;
};

class Discard final : public Sink<int64_t> {
 public:
  std::unique_ptr<SinkWriter<int64_t>> create_writer(RuntimeContext&) const override {
    struct W final : SinkWriter<int64_t> {
      void write(const int64_t&, const SinkWriterContext&) override {}
      void flush(bool) override {}
    };
    return std::make_unique<W>();
  }
};

fs::path checkpoint_root(const CheckpointBenchOptions& o, const std::string& name) {
  // An object store (--dir s3://bucket/prefix): each run writes under a job id of its own, nothing to clear.
  if (is_s3_uri(o.dir)) return fs::path(o.dir + "/" + name);
  fs::path base =
      o.dir.empty() ? fs::temp_directory_path() / fmt::format("sluice-bench-{}", ::getpid()) : fs::path(o.dir);
  fs::path dir = base / name;
  if (!is_s3_uri(dir.native())) fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Configuration base_config(const CheckpointBenchOptions& o, const fs::path& dir, const std::string& interval) {
  Configuration c;
  c.set(options::kParallelism, o.parallelism);
  c.set(options::kStateBackendType, o.backend);
  if (!o.rocksdb_memory.empty()) c.set_string(std::string(options::kRocksDBMemoryFixedPerSlot.key), o.rocksdb_memory);
  c.set(options::kStateBackendIncremental, o.incremental);
  if (interval != "none") {
    c.set_string(std::string(options::kCheckpointInterval.key), interval);
    c.set(options::kCheckpointDir, dir.string());
    // scripts/services/s3's endpoint (S3_ENDPOINT), path-style, as the tests use it.
    if (const char* endpoint = std::getenv("S3_ENDPOINT"); endpoint != nullptr && is_s3_uri(dir.native())) {
      c.set(options::kS3Endpoint, std::string(endpoint));
      c.set(options::kS3PathStyleAccess, true);
    }
  }
  return c;
}

int64_t keys_for(const CheckpointBenchOptions& o) {
  // ~64 bytes of per-entry overhead (hash table slot, key, string header) on top of the value.
  return std::max<int64_t>(1, o.state_mb * (1 << 20) / (o.value_bytes + 64));
}

/// Starts the fill job: an endless stream over `keys` keys at full speed.
JobClient start_fill_job(const CheckpointBenchOptions& o, Configuration config, int64_t keys) {
  StreamEnvironment env(std::move(config));
  auto source = std::make_shared<DataGeneratorSource<int64_t>>([keys](int64_t i) { return i % keys; },
                                                               DataGeneratorSource<int64_t>::kUnbounded);
  env.from_source(source, "keys")
      .uid("keys")
      .map([](const int64_t& v) {
        if (g_fail_now.load(std::memory_order_relaxed)) {
          bool expected = true;
          if (g_fail_now.compare_exchange_strong(expected, false)) {
            g_failed_at_ns.store(now_ns());
            throw std::runtime_error("injected failure (recovery benchmark)");
          }
        }
        return v;
      })
      .uid("fail")
      .key_by([](const int64_t& v) { return v; })
      .process(FillState(o.value_bytes, o.values == "random", o.verify_keys))
      .uid("state")
      .sink_to(std::make_shared<Discard>())
      .uid("discard");
  return env.execute_async("checkpoint benchmark");
}

bool wait_for(const std::function<bool()>& pred, std::chrono::seconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a benchmark driver, not a test
  }
  return true;
}

/// Resident set size of this process now, in MiB (/proc/self/statm).
double rss_mib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

int run_state(const CheckpointBenchOptions& o) {
  const int64_t keys = keys_for(o);
  fs::path dir = checkpoint_root(o, "state");
  g_processed = 0;
  JobClient client = start_fill_job(o, base_config(o, dir, "3s"), keys);
  // RSS as the state grows: after each quarter of the keys is written.
  for (int quarter = 1; quarter <= 4; ++quarter) {
    if (!wait_for([&] { return g_processed.load() >= keys * quarter / 4; }, std::chrono::minutes(10))) {
      fmt::print(stderr, "error: the state was not filled within 10 minutes\n");
      return 1;
    }
    fmt::print("checkpoint state: {} backend, {}/4 of the keys written: RSS {:.0f} MiB\n", o.backend, quarter,
               rss_mib());
  }
  const int64_t filled_ms = SystemClock::instance().now_ms();
  auto after_fill = [&] {
    std::vector<CheckpointStats> out;
    for (auto& s : client.checkpoint_stats()) {
      if (s.completed && s.trigger_time_ms > filled_ms) out.push_back(s);
    }
    return out;
  };
  if (!wait_for([&] { return after_fill().size() >= 3; }, std::chrono::minutes(10))) {
    fmt::print(stderr, "error: no 3 checkpoints completed within 10 minutes\n");
    return 1;
  }
  client.cancel();
  client.wait();
  std::vector<double> duration, size, pause, align;
  for (const auto& s : after_fill()) {
    duration.push_back(static_cast<double>(s.duration_ms));
    size.push_back(static_cast<double>(s.state_bytes) / (1 << 20));
    int64_t p = 0, a = 0;
    for (const auto& t : s.tasks) {
      p = std::max(p, t.sync_pause_ns);
      a = std::max(a, t.alignment_ns);
    }
    pause.push_back(static_cast<double>(p) / 1e6);
    align.push_back(static_cast<double>(a) / 1e6);
  }
  fmt::print(
      "checkpoint state: {} MiB target ({} keys x {} B), parallelism {}, {} checkpoints: median duration {:.0f} ms, "
      "size {:.1f} MiB, max synchronous pause {:.2f} ms, max alignment {:.2f} ms; {} backend, RSS now {:.0f} MiB\n",
      o.state_mb, keys, o.value_bytes, o.parallelism, duration.size(), median(duration), median(size), median(pause),
      median(align), o.backend, rss_mib());
  if (!is_s3_uri(dir.native())) fs::remove_all(dir);
  return 0;
}

/// Every key once at full speed, then `per_second` pseudo-random keys per second (over all subtasks), paced by the
/// reader itself: it returns kNothingAvailable and asks for a wake-up, so checkpoint barriers never wait behind the
/// pacing (a sleep in the source's chain would delay them and make checkpoint durations measure the pacing).
/// Subtask i fills keys [i*keys/p, (i+1)*keys/p); its split's `next` counts on past `end` through the churn, so
/// the position is checkpointed with the source.
class ChurnSource final : public Source<int64_t, DataGenSplit> {
 public:
  ChurnSource(int64_t keys, double per_second) : keys_(keys), per_second_(per_second) {}
  Boundedness boundedness() const override { return Boundedness::kContinuousUnbounded; }
  std::unique_ptr<SplitEnumerator<DataGenSplit>> create_enumerator(
      SplitEnumeratorContext<DataGenSplit>& ctx) const override {
    const int64_t p = ctx.current_parallelism();
    std::vector<DataGenSplit> splits;
    for (int64_t i = 0; i < p; ++i)
      splits.push_back(DataGenSplit{keys_ * i / p, keys_ * (i + 1) / p});
    return std::make_unique<StaticSplitEnumerator<DataGenSplit>>(ctx, std::move(splits));
  }
  std::unique_ptr<SourceReader<int64_t, DataGenSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx, keys_, per_second_ / ctx.parallelism());
  }

 private:
  class Reader final : public SourceReader<int64_t, DataGenSplit> {
   public:
    Reader(SourceReaderContext& ctx, int64_t keys, double rate) : ctx_(ctx), keys_(keys), rate_(rate) {}
    void start() override { ctx_.send_split_request(); }
    InputStatus poll_next(ReaderOutput<int64_t>& out) override {
      if (!split_) return InputStatus::kNothingAvailable;
      DataGenSplit& s = *split_;
      if (s.next < s.end) {  // the fill, at full speed
        const int64_t stop = std::min(s.end, s.next + 1024);
        for (; s.next < stop; ++s.next)
          out.collect(int64_t{s.next});
        return InputStatus::kMoreAvailable;
      }
      const TimestampMs now = ctx_.clock().now_ms();
      if (churn_start_ms_ < 0) churn_start_ms_ = now;
      const auto allowed = static_cast<int64_t>(static_cast<double>(now - churn_start_ms_) * rate_ / 1000.0) + 1;
      const int64_t budget = std::min<int64_t>(1024, allowed - churned_);
      if (budget <= 0) {
        ctx_.wakeup_at(churn_start_ms_ + static_cast<TimestampMs>(static_cast<double>(churned_) * 1000.0 / rate_) + 1);
        return InputStatus::kNothingAvailable;
      }
      for (int64_t n = 0; n < budget; ++n, ++s.next) {
        const uint64_t h = static_cast<uint64_t>(s.next) * 0x9E3779B97F4A7C15ULL;
        out.collect(static_cast<int64_t>((h ^ (h >> 29)) % static_cast<uint64_t>(keys_)));
      }
      churned_ += budget;
      return InputStatus::kMoreAvailable;
    }
    void add_splits(std::vector<DataGenSplit> splits) override {
      // One split per reader: the benchmark never rescales, and a restart gives each reader its own split back.
      if (splits.empty()) return;
      if (split_ || splits.size() > 1) throw std::logic_error("ChurnSource: a reader was given a second split");
      split_ = splits.front();
    }
    void notify_no_more_splits() override {}
    std::vector<DataGenSplit> snapshot_state(int64_t) override {
      if (!split_) return {};
      return {*split_};
    }

   private:
    SourceReaderContext& ctx_;
    int64_t keys_;
    double rate_;
    std::optional<DataGenSplit> split_;
    TimestampMs churn_start_ms_ = -1;
    int64_t churned_ = 0;
  };

  int64_t keys_;
  double per_second_;
};

// Writes every key once at full speed, then changes churn_percent of the keys per 3 s interval (random keys, paced
// by the source without blocking): the checkpoints after the fill show what a mostly unchanged large state costs.
int run_churn(const CheckpointBenchOptions& o) {
  const int64_t keys = keys_for(o);
  const int64_t interval_ms = 3'000;
  const double per_second = std::max(1.0, static_cast<double>(keys) * o.churn_percent / 100 / (interval_ms / 1000.0));
  fs::path dir = checkpoint_root(o, "churn");
  g_processed = 0;
  StreamEnvironment env(base_config(o, dir, "3s"));
  env.from_source(std::make_shared<ChurnSource>(keys, per_second), "keys")
      .uid("keys")
      .key_by([](const int64_t& v) { return v; })
      .process(FillState(o.value_bytes, o.values == "random"))
      .uid("state")
      .sink_to(std::make_shared<Discard>())
      .uid("discard");
  JobClient client = env.execute_async("checkpoint churn benchmark");
  if (!wait_for([&] { return g_processed.load() >= keys; }, std::chrono::minutes(10))) {
    fmt::print(stderr, "error: the state was not filled within 10 minutes\n");
    return 1;
  }
  const int64_t filled_ms = SystemClock::instance().now_ms();
  auto after_fill = [&] {
    std::vector<CheckpointStats> out;
    for (auto& s : client.checkpoint_stats()) {
      if (s.completed && s.trigger_time_ms > filled_ms + interval_ms) out.push_back(s);  // the 2nd on: churn only
    }
    return out;
  };
  if (!wait_for([&] { return after_fill().size() >= 5; }, std::chrono::minutes(10))) {
    fmt::print(stderr, "error: no 5 checkpoints completed within 10 minutes\n");
    return 1;
  }
  const double rss = rss_mib();
  const double cpu = cpu_seconds();
  client.cancel();
  client.wait();
  std::vector<double> duration, written, size, pause;
  for (const auto& s : after_fill()) {
    duration.push_back(static_cast<double>(s.duration_ms));
    written.push_back(static_cast<double>(s.checkpointed_bytes) / (1 << 20));
    size.push_back(static_cast<double>(s.state_bytes) / (1 << 20));
    int64_t p = 0;
    for (const auto& t : s.tasks)
      p = std::max(p, t.sync_pause_ns);
    pause.push_back(static_cast<double>(p) / 1e6);
  }
  fmt::print(
      "checkpoint churn: {} MiB target ({} keys x {} B, {} values), {}% of the keys changed per 3 s, {} backend{}, {} "
      "checkpoints: median duration {:.0f} ms, written {:.2f} MiB of {:.1f} MiB state, max synchronous pause "
      "{:.2f} ms (median); RSS {:.0f} MiB, CPU {:.1f} s\n",
      o.state_mb, keys, o.value_bytes, o.values, o.churn_percent, o.backend, o.incremental ? " (incremental)" : "",
      duration.size(), median(duration), median(written), median(size), median(pause), rss, cpu);
  if (!is_s3_uri(dir.native())) fs::remove_all(dir);
  return 0;
}

int run_throughput(const CheckpointBenchOptions& o) {
  std::vector<std::string> intervals;
  for (size_t start = 0; start <= o.intervals.size();) {
    size_t end = o.intervals.find(',', start);
    if (end == std::string::npos) end = o.intervals.size();
    if (end > start) intervals.push_back(o.intervals.substr(start, end - start));
    start = end + 1;
  }
  std::vector<std::vector<double>> rate(intervals.size()), cpu(intervals.size()), checkpoints(intervals.size());
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < intervals.size(); ++i) {
      fs::path dir = checkpoint_root(o, "throughput");
      StreamEnvironment env(base_config(o, dir, intervals[i]));
      env.from_source(datagen::sequence(0, o.records - 1), "numbers")
          .uid("numbers")
          .key_by([](const int64_t& v) { return v % 10'000; })
          .process(Count{})
          .uid("count")
          .sink_to(std::make_shared<Discard>())
          .uid("discard");
      const double cpu0 = cpu_seconds();
      const auto t0 = Clock::now();
      JobResult r = env.execute("keyed counting, checkpoints " + intervals[i]);
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      const double used = cpu_seconds() - cpu0;
      if (!r.ok()) {
        fmt::print(stderr, "error: {}\n", r.error ? r.error->to_string() : "job failed");
        return 1;
      }
      rate[i].push_back(static_cast<double>(o.records) / wall);
      cpu[i].push_back(static_cast<double>(o.records) / used);
      checkpoints[i].push_back(static_cast<double>(r.completed_checkpoints));
      if (!is_s3_uri(dir.native())) fs::remove_all(dir);
    }
  }
  const double base = median(rate[0]);
  for (size_t i = 0; i < intervals.size(); ++i) {
    fmt::print(
        "checkpoint throughput ({}): interval {:>5}: {:.0f} records/s (median of {}), {:.0f} records/cpu-s, {:.0f} "
        "checkpoints per run, {:.3f} of '{}'\n",
        o.backend, intervals[i], median(rate[i]), rate[i].size(), median(cpu[i]), median(checkpoints[i]),
        median(rate[i]) / base, intervals[0]);
  }
  return 0;
}

/// recovery --verify-keys: clears the per-key visit flags before a restored job starts.
void reset_visits(int64_t keys) {
  g_visited = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(keys));
  g_visited_keys = 0;
  g_new_keys = 0;
}

/// recovery --verify-keys, after a restore: waits until the restored job has processed a record of every key, then
/// prints how many keys had no value when it did: state the restore lost.
int verify_restored_keys(int64_t keys) {
  if (!wait_for([&] { return g_visited_keys.load() >= keys; }, std::chrono::minutes(30))) {
    fmt::print(stderr, "error: the restored job visited {} of {} keys within 30 minutes\n", g_visited_keys.load(),
               keys);
    return 1;
  }
  const int64_t missing = g_new_keys.load();
  fmt::print("checkpoint recovery: restored keys checked: {} of {} keys had no value after the restore\n", missing,
             keys);
  return missing == 0 ? 0 : 1;
}

// recovery --restore-parallelism: cancels the fill job and starts a new one from its last checkpoint at the new
// parallelism; measures from the start to the first record of the last restored subtask.
int restore_rescaled(const CheckpointBenchOptions& o, JobClient& client, const fs::path& dir, uint64_t state_bytes) {
  client.cancel();
  JobResult r = client.wait();
  if (r.latest_checkpoint_path.empty()) {
    fmt::print(stderr, "error: the cancelled job left no checkpoint\n");
    return 1;
  }
  CheckpointBenchOptions rescaled = o;
  rescaled.parallelism = o.restore_parallelism;
  Configuration c = base_config(rescaled, dir / "restored", "none");
  c.set(options::kStateRecoveryPath, r.latest_checkpoint_path);
  g_restoring_job = true;
  g_restored_subtasks = 0;
  g_last_restored_at_ns = 0;
  if (o.verify_keys) reset_visits(keys_for(o));
  const int64_t started = now_ns();
  JobClient restored = start_fill_job(rescaled, c, keys_for(o));
  if (!wait_for([&] { return g_restored_subtasks.load() >= o.restore_parallelism; }, std::chrono::minutes(10))) {
    fmt::print(stderr, "error: the restored job's subtasks did not all process a record within 10 minutes\n");
    return 1;
  }
  const double ms = static_cast<double>(g_last_restored_at_ns.load() - started) / 1e6;
  const int verified = o.verify_keys ? verify_restored_keys(keys_for(o)) : 0;
  restored.cancel();
  restored.wait();
  fmt::print(
      "checkpoint recovery: {} MiB target ({} keys x {} B, checkpoint {:.1f} MiB), parallelism {} -> {}, {} "
      "backend{}: {:.0f} ms from the restored job's start to a record processed by every restored subtask\n",
      o.state_mb, keys_for(o), o.value_bytes, static_cast<double>(state_bytes) / (1 << 20), o.parallelism,
      o.restore_parallelism, o.backend, o.incremental ? " (incremental)" : "", ms);
  if (!is_s3_uri(dir.native())) fs::remove_all(dir);
  return verified;
}

int run_recovery(const CheckpointBenchOptions& o) {
  const int64_t keys = keys_for(o);
  fs::path dir = checkpoint_root(o, "recovery");
  Configuration c = base_config(o, dir, "2s");
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 1);
  c.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
  g_processed = 0;
  g_resumed_at_ns = 0;
  g_new_keys = 0;
  JobClient client = start_fill_job(o, c, keys);
  // Filled: `keys` records in all, or with --verify-keys every key written (at -p > 1 the source subtasks'
  // sequences overlap, so `keys` records do not write every key).
  if (!wait_for([&] { return (o.verify_keys ? g_new_keys.load() : g_processed.load()) >= keys; },
                std::chrono::minutes(10))) {
    fmt::print(stderr, "error: the state was not filled within 10 minutes\n");
    return 1;
  }
  const int64_t filled_ms = SystemClock::instance().now_ms();
  if (!wait_for(
          [&] {
            for (auto& s : client.checkpoint_stats()) {
              if (s.completed && s.trigger_time_ms > filled_ms) return true;
            }
            return false;
          },
          std::chrono::minutes(10))) {
    return 1;
  }
  uint64_t state_bytes = 0;
  for (auto& s : client.checkpoint_stats()) {
    if (s.completed) state_bytes = s.state_bytes;
  }
  if (o.restore_parallelism > 0) return restore_rescaled(o, client, dir, state_bytes);
  if (o.verify_keys) reset_visits(keys);
  g_fail_now = true;
  if (!wait_for([&] { return g_resumed_at_ns.load() != 0; }, std::chrono::minutes(10))) {
    fmt::print(stderr, "error: processing did not resume within 10 minutes\n");
    return 1;
  }
  const double ms = static_cast<double>(g_resumed_at_ns.load() - g_failed_at_ns.load()) / 1e6;
  const int verified = o.verify_keys ? verify_restored_keys(keys) : 0;
  client.cancel();
  client.wait();
  fmt::print(
      "checkpoint recovery: {} MiB target ({} keys x {} B, checkpoint {:.1f} MiB), parallelism {}, {} backend{}: "
      "{:.0f} ms from the failure to the first record processed by the restored operator\n",
      o.state_mb, keys, o.value_bytes, static_cast<double>(state_bytes) / (1 << 20), o.parallelism, o.backend,
      o.incremental ? " (incremental)" : "", ms);
  if (!is_s3_uri(dir.native())) fs::remove_all(dir);
  return verified;
}

// The fill job of `state` once per storage and round, storages alternating: what checkpointing the state to each
// storage costs the job (records/s and records per CPU-s against no checkpoints) and how long the checkpoints take.
// CPU is this process's (task threads and the writer threads that upload); an S3 server's own CPU is not in it.
int run_storage(const CheckpointBenchOptions& o) {
  std::vector<std::string> storages;
  for (size_t start = 0; start <= o.storages.size();) {
    size_t end = o.storages.find(',', start);
    if (end == std::string::npos) end = o.storages.size();
    if (end > start) storages.push_back(o.storages.substr(start, end - start));
    start = end + 1;
  }
  const int64_t keys = keys_for(o);
  struct Figures {
    std::vector<double> rate, per_cpu, duration, size, pause, completed, rss;
  };
  std::vector<Figures> figures(storages.size());
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < storages.size(); ++i) {
      const std::string& storage = storages[i];
      const bool none = storage == "none";
      fs::path dir;
      if (is_s3_uri(storage)) {
        dir = fs::path(fmt::format("{}/storage-{}-{}", storage, ::getpid(), round));
      } else if (storage == "local") {
        CheckpointBenchOptions local = o;
        if (is_s3_uri(local.dir)) local.dir.clear();
        dir = checkpoint_root(local, "storage");
      } else if (!none) {
        fmt::print(stderr, "error: unknown storage '{}' (none, local or s3://bucket/prefix)\n", storage);
        return 2;
      }
      g_processed = 0;
      JobClient client = start_fill_job(o, base_config(o, dir, none ? "none" : o.interval), keys);
      if (!wait_for([&] { return g_processed.load() >= keys; }, std::chrono::minutes(10))) {
        fmt::print(stderr, "error: the state was not filled within 10 minutes ({})\n", storage);
        return 1;
      }
      const int64_t filled_ms = SystemClock::instance().now_ms();
      const int64_t n0 = g_processed.load();
      const double cpu0 = cpu_seconds();
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(o.window_s));  // the measured window, not a synchronisation
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      const double rate = static_cast<double>(g_processed.load() - n0) / wall;
      const double per_cpu = static_cast<double>(g_processed.load() - n0) / (cpu_seconds() - cpu0);
      const double rss = rss_mib();
      auto after_fill = [&] {
        std::vector<CheckpointStats> out;
        for (auto& s : client.checkpoint_stats()) {
          if (s.completed && s.trigger_time_ms > filled_ms) out.push_back(s);
        }
        return out;
      };
      const int64_t in_window = none ? 0 : static_cast<int64_t>(after_fill().size());
      if (!none &&
          !wait_for([&] { return static_cast<int>(after_fill().size()) >= o.checkpoints; }, std::chrono::minutes(20))) {
        fmt::print(stderr, "error: no {} checkpoints completed within 20 minutes ({})\n", o.checkpoints, storage);
        return 1;
      }
      client.cancel();
      client.wait();
      std::vector<double> duration, size, pause;
      if (!none) {
        for (const auto& s : after_fill()) {
          duration.push_back(static_cast<double>(s.duration_ms));
          size.push_back(static_cast<double>(s.state_bytes) / (1 << 20));
          int64_t p = 0;
          for (const auto& t : s.tasks)
            p = std::max(p, t.sync_pause_ns);
          pause.push_back(static_cast<double>(p) / 1e6);
        }
      }
      fmt::print(
          "checkpoint storage: round {}, {:>8}: {} MiB target ({} keys x {} B), interval {}: {:.0f} records/s and "
          "{:.0f} records/CPU-s over {:.1f} s after the fill, {} checkpoint(s) completed in that window; "
          "checkpoints after the fill: {} (durations {} ms), median size {:.1f} MiB, median max synchronous pause "
          "{:.2f} ms; RSS {:.0f} MiB\n",
          round + 1, storage, o.state_mb, keys, o.value_bytes, none ? "none" : o.interval, rate, per_cpu, wall,
          in_window, duration.size(), fmt::join(duration, "/"), median(size), median(pause), rss);
      std::fflush(stdout);
      Figures& f = figures[i];
      f.rate.push_back(rate);
      f.per_cpu.push_back(per_cpu);
      f.completed.push_back(static_cast<double>(in_window));
      f.rss.push_back(rss);
      if (!none) {
        f.duration.push_back(median(duration));
        f.size.push_back(median(size));
        f.pause.push_back(median(pause));
      }
      if (!dir.empty() && !is_s3_uri(dir.native())) fs::remove_all(dir);
    }
  }
  const double base = median(figures[0].rate);
  for (size_t i = 0; i < storages.size(); ++i) {
    const Figures& f = figures[i];
    auto range = [](const std::vector<double>& v) {
      if (v.empty()) return std::string("-");
      return fmt::format("{:.0f}-{:.0f}", *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    };
    fmt::print(
        "checkpoint storage: {:>8} (median of {}): {:.0f} records/s ({}), {:.3f} of '{}', {:.0f} records/CPU-s, "
        "{:.0f} checkpoint(s) per window, checkpoint duration {:.0f} ms ({}), size {:.1f} MiB, max synchronous pause "
        "{:.2f} ms, RSS {:.0f} MiB\n",
        storages[i], f.rate.size(), median(f.rate), range(f.rate), median(f.rate) / base, storages[0],
        median(f.per_cpu), median(f.completed), median(f.duration), range(f.duration), median(f.size), median(f.pause),
        median(f.rss));
  }
  return 0;
}

}  // namespace

int run_checkpoint_bench(const CheckpointBenchOptions& options) {
  if (options.scenario == "state") return run_state(options);
  if (options.scenario == "churn") return run_churn(options);
  if (options.scenario == "throughput") return run_throughput(options);
  if (options.scenario == "recovery") return run_recovery(options);
  if (options.scenario == "storage") return run_storage(options);
  fmt::print(stderr, "error: unknown scenario '{}' (state, churn, throughput, recovery, storage)\n", options.scenario);
  return 2;
}

}  // namespace sluice::bench
