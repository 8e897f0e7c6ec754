// mongodb-cdc-bench: events/s of the MongoDB CDC source (docs/benchmarks.md, "MongoDB CDC source").
//
//   scripts/services/run-with mongodb -- build/<dir>/bench/mongodb-cdc-bench [--docs N] [--runs R]
//
// Against the server in MONGODB_URI (the emulator of scripts/services/mongodb, or a real replica set), each run on
// a fresh collection:
//  1. snapshot: N documents ({_id: int64, v: int64, s: 64-byte string, nested: {a: [1, 2, 3]}}) inserted in bulk,
//     then a job (parallelism 1) with start mode `initial` into a discarding sink; events/s = N / (time from job
//     start until the N-th snapshot read reached the sink).
//  2. streaming: N inserts written first (before the job), then a job with start mode `timestamp` (from before
//     the writes) reads them from the change stream; events/s = N / (job start until the N-th event).
// Prints each run and the median of --runs runs (default 3), plus this process's CPU seconds per million events
// (the source side only: the server runs in its own process).
// Options: --docs N (100000), --runs R (3), --batch B (1024: the source's batch_size), --uri URI.
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/logging.h"

namespace {

using sluice::bench::cpu_seconds;
using sluice::bench::median;

using Clock = std::chrono::steady_clock;

struct Options {
  std::string uri;
  int64_t docs = 100'000;
  int runs = 3;
  int batch = 1024;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mongodb-cdc-bench: %s\n", what.c_str());
  std::exit(2);
}

/// Counts what reaches the sink; wakes a waiter at `target`.
struct Counter {
  std::mutex mu;
  std::condition_variable cv;
  int64_t n = 0;
  int64_t target = 0;
  Clock::time_point done{};
  void add() {
    std::lock_guard lock(mu);
    if (++n == target) {
      done = Clock::now();
      cv.notify_all();
    }
  }
  bool wait(std::chrono::seconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return n >= target; });
  }
};

class CountingSink final : public sluice::Sink<sluice::cdc::ChangeEvent> {
 public:
  explicit CountingSink(std::shared_ptr<Counter> c) : c_(std::move(c)) {}
  std::unique_ptr<sluice::SinkWriter<sluice::cdc::ChangeEvent>> create_writer(sluice::RuntimeContext&) const override {
    return std::make_unique<Writer>(c_);
  }

 private:
  class Writer final : public sluice::SinkWriter<sluice::cdc::ChangeEvent> {
   public:
    explicit Writer(std::shared_ptr<Counter> c) : c_(std::move(c)) {}
    void write(const sluice::cdc::ChangeEvent&, const sluice::SinkWriterContext&) override { c_->add(); }
    void flush(bool) override {}

   private:
    std::shared_ptr<Counter> c_;
  };
  std::shared_ptr<Counter> c_;
};

void fill(mongoc_client_t* client, const std::string& db, const std::string& coll, int64_t n) {
  mongoc_collection_t* c = mongoc_client_get_collection(client, db.c_str(), coll.c_str());
  const std::string s(64, 'x');
  constexpr int64_t kBulk = 10'000;
  for (int64_t from = 0; from < n; from += kBulk) {
    mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(c, nullptr);
    for (int64_t i = from; i < std::min(n, from + kBulk); ++i) {
      bson_t* d = BCON_NEW("_id", BCON_INT64(i), "v", BCON_INT64(i * 7), "s", BCON_UTF8(s.c_str()), "nested", "{", "a",
                           "[", BCON_INT32(1), BCON_INT32(2), BCON_INT32(3), "]", "}");
      mongoc_bulk_operation_insert(bulk, d);
      bson_destroy(d);
    }
    bson_error_t e;
    if (mongoc_bulk_operation_execute(bulk, nullptr, &e) == 0) die(std::string("bulk insert failed: ") + e.message);
    mongoc_bulk_operation_destroy(bulk);
  }
  mongoc_collection_destroy(c);
}

struct Run {
  double events_per_s = 0;
  double cpu_s_per_million = 0;
};

Run run_job(const Options& o, std::shared_ptr<sluice::MongoCdcSource> source, int64_t expect) {
  sluice::Configuration c;
  c.set(sluice::options::kParallelism, 1);
  c.set(sluice::options::kRestartStrategy, std::string("none"));
  sluice::StreamEnvironment env(c);
  auto counter = std::make_shared<Counter>();
  counter->target = expect;
  env.from_source(source, "mongo").uid("mongo").sink_to(std::make_shared<CountingSink>(counter)).uid("sink");
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  sluice::JobClient job = env.execute_async("mongodb-cdc-bench");
  const bool ok = counter->wait(std::chrono::seconds(600));
  const double cpu1 = cpu_seconds();
  job.cancel();
  job.wait();
  if (!ok) die("timed out: " + std::to_string(counter->n) + " of " + std::to_string(expect) + " events");
  (void)o;
  const double s = std::chrono::duration<double>(counter->done - t0).count();
  return Run{static_cast<double>(expect) / s, (cpu1 - cpu0) / static_cast<double>(expect) * 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const char* u = std::getenv("MONGODB_URI")) o.uri = u;
  CLI::App app{"Events/s of the MongoDB CDC source, snapshot and streaming", "mongodb-cdc-bench"};
  app.add_option("--docs", o.docs, "Documents per run")->capture_default_str();
  app.add_option("--runs", o.runs, "Runs")->capture_default_str();
  app.add_option("--batch", o.batch, "Change-stream batch size")->capture_default_str();
  app.add_option("--uri", o.uri, "MongoDB URI (default: $MONGODB_URI)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.uri.empty()) die("no MONGODB_URI: run through scripts/services/run-with mongodb -- ...");
  if (o.docs <= 0 || o.runs <= 0) die("--docs and --runs must be positive");
  sluice::init_logging();
  spdlog::set_level(spdlog::level::warn);
  mongoc_init();
  mongoc_client_t* client = mongoc_client_new(o.uri.c_str());
  const std::string db = "sluice_bench_" + std::to_string(::getpid());
  std::printf("mongodb-cdc-bench: %lld documents per run, %d runs, batch %d, %s\n", static_cast<long long>(o.docs),
              o.runs, o.batch, o.uri.c_str());
  std::vector<double> snap_rate, snap_cpu, stream_rate, stream_cpu;
  for (int r = 0; r < o.runs; ++r) {
    const std::string coll = "snap_" + std::to_string(r);
    fill(client, db, coll, o.docs);
    auto src = sluice::MongoCdcSource::builder()
                   .uri(o.uri)
                   .database(db)
                   .collections({coll})
                   .start_mode(sluice::MongoStartMode::kInitial)
                   .batch_size(o.batch)
                   .build();
    Run s = run_job(o, src, o.docs);
    std::printf("  run %d snapshot:  %9.0f events/s, %.2f CPU s per million events\n", r + 1, s.events_per_s,
                s.cpu_s_per_million);
    snap_rate.push_back(s.events_per_s);
    snap_cpu.push_back(s.cpu_s_per_million);

    const std::string scoll = "stream_" + std::to_string(r);
    auto driver = sluice::mongodb::make_libmongoc_driver(o.uri).value_or_throw();
    sluice::MongoClusterTime start = 0;
    sluice::mongodb::DriverError e;
    if (!driver->cluster_time(db, start, e)) die("cluster time: " + e.message);
    fill(client, db, scoll, o.docs);
    auto ssrc = sluice::MongoCdcSource::builder()
                    .uri(o.uri)
                    .database(db)
                    .collections({scoll})
                    .start_mode(sluice::MongoStartMode::kTimestamp)
                    .start_timestamp_ms(static_cast<int64_t>(static_cast<uint64_t>(start) >> 32) * 1000)
                    .batch_size(o.batch)
                    .build();
    Run t = run_job(o, ssrc, o.docs);
    std::printf("  run %d streaming: %9.0f events/s, %.2f CPU s per million events\n", r + 1, t.events_per_s,
                t.cpu_s_per_million);
    stream_rate.push_back(t.events_per_s);
    stream_cpu.push_back(t.cpu_s_per_million);
  }
  std::printf("median snapshot:  %.0f events/s, %.2f CPU s per million events (source process)\n", median(snap_rate),
              median(snap_cpu));
  std::printf("median streaming: %.0f events/s, %.2f CPU s per million events (source process)\n", median(stream_rate),
              median(stream_cpu));
  mongoc_database_t* d = mongoc_client_get_database(client, db.c_str());
  bson_error_t err;
  mongoc_database_drop(d, &err);
  mongoc_database_destroy(d);
  mongoc_client_destroy(client);
  return 0;
}
