// postgres-cdc-bench: events/s of the Postgres CDC source against a real Postgres (docs/benchmarks.md,
// "Postgres CDC source").
//
//   scripts/services/run-with postgres -- build/<dir>/bench/postgres-cdc-bench [--rows N] [--runs R]
//
// Per run, on a fresh table bench_cdc(id bigint primary key, customer text, status text, amount numeric(12,2),
// updated_at timestamptz) of --rows rows and a fresh slot:
//  1. snapshot: a job PostgresCdcSource (start mode initial) -> discarding sink; events/s from the job's start to
//     the last snapshot event;
//  2. streaming: with the job running, an insert/update workload — --rows rows inserted by INSERT ... SELECT
//     generate_series in transactions of --txn-rows rows, then every row updated once the same way — and
//     events/s from the first commit to the last event (so the server's decoding is included: pgoutput sends a
//     transaction after its commit).
//  3. backlog: --rows updates written while no job runs, into a slot made beforehand; a second job (start mode
//     latest) reads them: events/s from its start to the last event (server decoding + source, no writer).
// Each phase also reports the process's CPU seconds per million events (user+system, getrusage: the source,
// the engine and libpq; the walsender is the server's) and the process's peak RSS. The medians of --runs runs
// are printed last. Options: --rows N (200000), --runs R (3), --txn-rows T (10000), --url URL (POSTGRES_URL),
// --sink discard|kafka (discard).
//
// With --sink kafka (run through scripts/services/run-with postgres kafka) every job writes its events as JSON
// envelopes into a fresh topic through KafkaSink at-least-once (keyed by the entity id, linger.ms 5): a phase
// ends when the last event was written *and* a savepoint has completed, which waits for every delivery report,
// so the figures are events acknowledged by the broker.
#include <libpq-fe.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "kafka_admin.h"
#include "sluice/api/sink.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"
#include "sluice/core/logging.h"

namespace {

using sluice::bench::cpu_seconds;
using sluice::bench::median;
using sluice::bench::peak_rss_mib;

using Clock = std::chrono::steady_clock;
using sluice::cdc::ChangeEvent;

struct Options {
  std::string url;
  int64_t rows = 200'000;
  int runs = 3;
  int64_t txn_rows = 10'000;
  std::string sink = "discard";
  std::string bootstrap;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "postgres-cdc-bench: %s\n", what.c_str());
  std::exit(2);
}

void exec(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  const auto st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) die(sql + ": " + PQresultErrorMessage(r));
  PQclear(r);
}

/// CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat; -1 when unreadable.
double process_cpu_seconds(int pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command may contain spaces: fields follow the last ')'
  if (p == nullptr) return -1;
  unsigned long utime = 0, stime = 0;
  // Fields 3.. after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime.
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

/// Counts events; discards them.
class CountingSink final : public sluice::Sink<ChangeEvent> {
 public:
  explicit CountingSink(std::shared_ptr<std::atomic<int64_t>> n) : n_(std::move(n)) {}
  std::unique_ptr<sluice::SinkWriter<ChangeEvent>> create_writer(sluice::RuntimeContext&) const override {
    return std::make_unique<Writer>(n_);
  }

 private:
  class Writer final : public sluice::SinkWriter<ChangeEvent> {
   public:
    explicit Writer(std::shared_ptr<std::atomic<int64_t>> n) : n_(std::move(n)) {}
    void write(const ChangeEvent&, const sluice::SinkWriterContext&) override {
      n_->fetch_add(1, std::memory_order_relaxed);
    }
    void flush(bool) override {}

   private:
    std::shared_ptr<std::atomic<int64_t>> n_;
  };
  std::shared_ptr<std::atomic<int64_t>> n_;
};

/// The phase's sink: a counting discard, or KafkaSink at-least-once into a fresh topic counting what it writes.
void attach_sink(const Options& o, sluice::DataStream<ChangeEvent> events, std::shared_ptr<std::atomic<int64_t>> n,
                 const std::string& topic) {
  if (o.sink == "discard") {
    events.sink_to(std::make_shared<CountingSink>(std::move(n))).uid("discard");
    return;
  }
  if (sluice::Status st = sluice::bench::ensure_topic(o.bootstrap, topic, 1); !st.ok()) die(st.error().to_string());
  auto sink = sluice::KafkaSink<ChangeEvent>::builder()
                  .bootstrap_servers(o.bootstrap)
                  .topic(topic)
                  .delivery_guarantee(sluice::DeliveryGuarantee::kAtLeastOnce)
                  .record_serializer([n](const ChangeEvent& e, sluice::KafkaProducerRecord& out) {
                    out.set_key(e.entity_id().to_json());
                    out.set_value(e.to_value().to_json());
                    n->fetch_add(1, std::memory_order_relaxed);
                  })
                  .property("linger.ms", "5")
                  .build();
  events.sink_to(sink).uid("kafka");
}

/// With the Kafka sink, a completed savepoint means every event written so far was acknowledged.
void wait_acknowledged(const Options& o, sluice::JobClient& job, const std::filesystem::path& dir) {
  if (o.sink != "kafka") return;
  sluice::Result<std::string> sp = job.trigger_savepoint((dir / "savepoints").string()).get();
  if (!sp.ok()) die("savepoint: " + sp.error().to_string());
}

void wait_for(const std::atomic<int64_t>& n, int64_t target) {
  const auto deadline = Clock::now() + std::chrono::minutes(10);
  while (n.load() < target) {
    if (Clock::now() > deadline) die("timed out waiting for events");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a benchmark's completion poll
  }
}

struct Figures {
  double snapshot_eps = 0, snapshot_cpu_per_m = 0, stream_eps = 0, stream_cpu_per_m = 0, backlog_eps = 0,
         backlog_cpu_per_m = 0, walsender_cpu_per_m = -1;
};

Figures run_once(const Options& o, int run) {
  PGconn* c = PQconnectdb(o.url.c_str());
  if (PQstatus(c) != CONNECTION_OK) die(std::string("connect: ") + PQerrorMessage(c));
  const std::string slot = "bench_cdc_" + std::to_string(::getpid()) + "_" + std::to_string(run);
  exec(c, "SET client_min_messages = warning");
  exec(c, "DROP TABLE IF EXISTS bench_cdc");
  exec(c,
       "CREATE TABLE bench_cdc (id bigint PRIMARY KEY, customer text, status text, amount numeric(12,2), "
       "updated_at timestamptz)");
  exec(c,
       "INSERT INTO bench_cdc SELECT g, 'cus_' || (g % 1000), 'paid', (g % 100000) / 100.0, now() FROM "
       "generate_series(1, " +
           std::to_string(o.rows) + ") g");
  exec(c, "VACUUM ANALYZE bench_cdc");

  const auto dir = std::filesystem::temp_directory_path() / slot;
  sluice::Configuration conf;
  conf.set(sluice::options::kParallelism, 1);
  conf.set_string(std::string(sluice::options::kCheckpointInterval.key), "1s");
  conf.set(sluice::options::kCheckpointDir, "file://" + dir.string());
  sluice::StreamEnvironment env(conf);
  auto n = std::make_shared<std::atomic<int64_t>>(0);
  auto src = sluice::PostgresCdcSource::builder()
                 .conninfo(o.url)
                 .tables({"public.bench_cdc"})
                 .slot_name(slot)
                 .publication_name("bench_cdc")
                 .build();
  attach_sink(o, env.from_source(src, "pg").uid("pg"), n, slot);
  Figures f;
  double cpu0 = cpu_seconds();
  auto t0 = Clock::now();
  sluice::JobClient job = env.execute_async("postgres-cdc-bench");
  wait_for(*n, o.rows);
  wait_acknowledged(o, job, dir);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  f.snapshot_eps = static_cast<double>(o.rows) / secs;
  f.snapshot_cpu_per_m = (cpu_seconds() - cpu0) / (static_cast<double>(o.rows) / 1e6);
  while (!src->metrics().snapshot_done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // Streaming: inserts of new ids, then an update of each of them.
  const int64_t base = o.rows;
  const int64_t target = o.rows + 2 * o.rows;
  cpu0 = cpu_seconds();
  t0 = Clock::now();
  for (int64_t from = 1; from <= o.rows; from += o.txn_rows) {
    const int64_t to = std::min(o.rows, from + o.txn_rows - 1);
    exec(c, "INSERT INTO bench_cdc SELECT " + std::to_string(base) +
                " + g, 'cus_' || (g % 1000), 'new', "
                "(g % 100000) / 100.0, now() FROM generate_series(" +
                std::to_string(from) + ", " + std::to_string(to) + ") g");
  }
  for (int64_t from = 1; from <= o.rows; from += o.txn_rows) {
    const int64_t to = std::min(o.rows, from + o.txn_rows - 1);
    exec(c, "UPDATE bench_cdc SET status = 'refunded', updated_at = now() WHERE id BETWEEN " +
                std::to_string(base + from) + " AND " + std::to_string(base + to));
  }
  wait_for(*n, target);
  wait_acknowledged(o, job, dir);
  secs = std::chrono::duration<double>(Clock::now() - t0).count();
  f.stream_eps = static_cast<double>(2 * o.rows) / secs;
  f.stream_cpu_per_m = (cpu_seconds() - cpu0) / (static_cast<double>(2 * o.rows) / 1e6);
  job.cancel();
  job.wait();

  // Backlog: the changes are already in the WAL when the job starts (a slot made beforehand), so the rate is the
  // server's decoding plus the source, without the writer.
  const std::string slot2 = slot + "_backlog";
  exec(c, "SELECT pg_create_logical_replication_slot('" + slot2 + "', 'pgoutput')");
  for (int64_t from = 1; from <= o.rows; from += o.txn_rows) {
    const int64_t to = std::min(o.rows, from + o.txn_rows - 1);
    exec(c, "UPDATE bench_cdc SET status = 'disputed', updated_at = now() WHERE id BETWEEN " +
                std::to_string(base + from) + " AND " + std::to_string(base + to));
  }
  {
    sluice::StreamEnvironment env2(conf);
    auto n2 = std::make_shared<std::atomic<int64_t>>(0);
    auto src2 = sluice::PostgresCdcSource::builder()
                    .conninfo(o.url)
                    .tables({"public.bench_cdc"})
                    .slot_name(slot2)
                    .publication_name("bench_cdc")
                    .start_mode(sluice::PostgresStartMode::kLatest)
                    .build();
    attach_sink(o, env2.from_source(src2, "pg").uid("pg"), n2, slot2);
    cpu0 = cpu_seconds();
    t0 = Clock::now();
    sluice::JobClient job2 = env2.execute_async("postgres-cdc-bench backlog");
    wait_for(*n2, o.rows);
    wait_acknowledged(o, job2, dir);
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
    f.backlog_eps = static_cast<double>(o.rows) / secs;
    f.backlog_cpu_per_m = (cpu_seconds() - cpu0) / (static_cast<double>(o.rows) / 1e6);
    // The walsender's CPU (same machine): the server's decoding cost of the same events.
    PGresult* r = PQexec(c, ("SELECT active_pid FROM pg_replication_slots WHERE slot_name = '" + slot2 + "'").c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
      f.walsender_cpu_per_m = process_cpu_seconds(std::atoi(PQgetvalue(r, 0, 0))) / (static_cast<double>(o.rows) / 1e6);
    }
    PQclear(r);
    job2.cancel();
    job2.wait();
  }
  // Drop the slots once the jobs' connections released them.
  for (int i = 0; i < 500; ++i) {
    PGresult* r =
        PQexec(c, ("SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = '" + slot + "'").c_str());
    const bool active = PQresultStatus(r) == PGRES_TUPLES_OK && std::string(PQgetvalue(r, 0, 0)) != "0";
    PQclear(r);
    if (!active) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  exec(c, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('" + slot + "', '" +
              slot2 + "') AND NOT active");
  exec(c, "DROP PUBLICATION IF EXISTS bench_cdc");
  exec(c, "DROP TABLE bench_cdc");
  PQfinish(c);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf(
      "run %d: snapshot %.0f events/s (%.2f CPU-s per M), streaming %.0f events/s (%.2f CPU-s per M), "
      "backlog %.0f events/s (%.2f CPU-s per M; walsender %.2f CPU-s per M), peak RSS %.1f MiB\n",
      run, f.snapshot_eps, f.snapshot_cpu_per_m, f.stream_eps, f.stream_cpu_per_m, f.backlog_eps, f.backlog_cpu_per_m,
      f.walsender_cpu_per_m, peak_rss_mib());
  std::fflush(stdout);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const char* u = std::getenv("POSTGRES_URL")) o.url = u;
  CLI::App app{"Events/s of the Postgres CDC source: snapshot, streaming and backlog", "postgres-cdc-bench"};
  app.add_option("--rows", o.rows, "Rows per run")->capture_default_str();
  app.add_option("--runs", o.runs, "Runs")->capture_default_str();
  app.add_option("--txn-rows", o.txn_rows, "Rows per writer transaction")->capture_default_str();
  app.add_option("--url", o.url, "Postgres URL (default: $POSTGRES_URL)");
  app.add_option("--sink", o.sink, "discard, or kafka (at-least-once, needs KAFKA_BOOTSTRAP_SERVERS)")
      ->capture_default_str()
      ->check(CLI::IsMember({"discard", "kafka"}));
  app.add_option("--bootstrap", o.bootstrap, "Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.url.empty()) die("no POSTGRES_URL: run through scripts/services/run-with postgres -- ...");
  if (o.bootstrap.empty()) {
    if (const char* b = std::getenv("KAFKA_BOOTSTRAP_SERVERS")) o.bootstrap = b;
  }
  if (o.sink == "kafka" && o.bootstrap.empty())
    die("--sink kafka: run through scripts/services/run-with postgres kafka");
  sluice::init_logging();
  spdlog::set_level(spdlog::level::warn);
  std::printf("postgres-cdc-bench: %lld rows, %d runs, %lld rows per transaction, sink %s\n",
              static_cast<long long>(o.rows), o.runs, static_cast<long long>(o.txn_rows), o.sink.c_str());
  std::vector<double> s, sc, t, tc, b, bc;
  for (int r = 1; r <= o.runs; ++r) {
    Figures f = run_once(o, r);
    s.push_back(f.snapshot_eps);
    sc.push_back(f.snapshot_cpu_per_m);
    t.push_back(f.stream_eps);
    tc.push_back(f.stream_cpu_per_m);
    b.push_back(f.backlog_eps);
    bc.push_back(f.backlog_cpu_per_m);
  }
  std::printf(
      "median: snapshot %.0f events/s (%.2f CPU-s per M events), streaming %.0f events/s (%.2f CPU-s "
      "per M events), backlog %.0f events/s (%.2f CPU-s per M events), peak RSS %.1f MiB\n",
      median(s), median(sc), median(t), median(tc), median(b), median(bc), peak_rss_mib());
  return 0;
}
