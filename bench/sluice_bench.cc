// sluice-bench: end-to-end benchmarks on the local mini-cluster.
//
//   sluice-bench nexmark --query q1 --events 10000000 --parallelism 2 [--rate 10000] [--format json]
//                        [--metrics-scrape-ms 1000]
//   sluice-bench metrics-scrape [--operators 100] [--parallelism 8] [--scrapes 50]
//   sluice-bench checkpoint state|churn|throughput|recovery [--state-mb 100] [--incremental] ...
//   sluice-bench checkpoint storage --state-mb 1024 --storages none,local,s3://bucket/prefix [--interval 3s]
//   sluice-bench nexmark-kafka-fill --bootstrap HOST:PORT --topic T --events N [--partitions 2]
//   sluice-bench nexmark-kafka-q1 --bootstrap HOST:PORT --input T --output T2 [--parallelism 2] ...
//
// Runs one Nexmark query over generated events into a discarding sink and prints one line: query, events,
// parallelism, wall seconds, events/s, events per CPU-second, peak RSS and output records. CPU time is the
// process's user + system time (getrusage RUSAGE_SELF) measured around execute(), so it includes every
// task thread; peak RSS is ru_maxrss. The generator's one-off tables are built before timing starts.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint_bench.h"
#include "nexmark/queries.h"
#include "nexmark/source.h"
#include "nexmark_kafka_bench.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/metric_registry.h"

namespace {

using sluice::DataStream;
using sluice::nexmark::Event;

/// Counts records and otherwise drops them; each writer adds its count to `total` when it closes.
template <class T>
class DiscardingSink final : public sluice::Sink<T> {
 public:
  explicit DiscardingSink(std::shared_ptr<std::atomic<int64_t>> total) : total_(std::move(total)) {}
  std::unique_ptr<sluice::SinkWriter<T>> create_writer(sluice::RuntimeContext&) const override {
    return std::make_unique<Writer>(total_);
  }

 private:
  class Writer final : public sluice::SinkWriter<T> {
   public:
    explicit Writer(std::shared_ptr<std::atomic<int64_t>> total) : total_(std::move(total)) {}
    void write(const T&, const sluice::SinkWriterContext&) override { ++count_; }
    void flush(bool) override {}
    void close() override {
      total_->fetch_add(count_);
      count_ = 0;
    }

   private:
    std::shared_ptr<std::atomic<int64_t>> total_;
    int64_t count_ = 0;
  };
  std::shared_ptr<std::atomic<int64_t>> total_;
};

template <class T>
void discard(DataStream<T> stream, const std::shared_ptr<std::atomic<int64_t>>& total) {
  stream.sink_to(std::make_shared<DiscardingSink<T>>(total), "Discard").uid("discard");
}

struct QueryEntry {
  std::string_view name;
  std::string_view description;
  void (*build)(DataStream<Event>, const std::shared_ptr<std::atomic<int64_t>>&);
};

template <class T>
using Query = DataStream<T> (*)(DataStream<Event>);

/// Builds `query` over the events into a discarding sink (a template argument, so each entry is a plain
/// function pointer).
template <class T, Query<T> query>
void build(DataStream<Event> events, const std::shared_ptr<std::atomic<int64_t>>& total) {
  discard(query(std::move(events)), total);
}

namespace nx = sluice::nexmark;

constexpr std::array<QueryEntry, 8> kQueries{{
    {"q0", "pass-through (identity map over every event)", &build<Event, &nx::query0>},
    {"q1", "currency conversion (every bid, price * 0.908)", &build<nx::Q1Result, &nx::query1>},
    {"q2", "selection (auction, price) of bids with auction % 123 == 0", &build<nx::Q2Result, &nx::query2>},
    {"q3", "local item suggestion (incremental join of OR/ID/CA sellers with category-10 auctions)",
     &build<nx::Q3Result, &nx::query3>},
    {"q4", "average closing price per category (winning bid per auction, running average)",
     &build<nx::Q4Result, &nx::query4>},
    {"q5", "hot items (auctions with the most bids per 10 s window sliding by 2 s)", &build<nx::Q5Result, &nx::query5>},
    {"q7", "highest bid (bids with the top price per tumbling 10 s window)", &build<nx::Q7Result, &nx::query7>},
    {"q8", "monitor new users (persons who created an auction in their tumbling 10 s window)",
     &build<nx::Q8Result, &nx::query8>},
}};

const QueryEntry* find_query(std::string_view name) {
  for (const auto& q : kQueries) {
    if (q.name == name) return &q;
  }
  return nullptr;
}

double cpu_seconds(const rusage& u) {
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

struct NexmarkOptions {
  std::string query;
  int64_t events = 10'000'000;
  int64_t checkpoint_interval_ms = 0;  ///< 0: no checkpoints
  int parallelism = 1;
  double rate = 10'000;
  uint64_t seed = 0;
  std::string format = "text";
  /// > 0: the job's metrics are registered (metrics/JobMetrics) and scraped (Prometheus text) every this many ms
  /// while it runs, as a Prometheus server would; 0: no registry.
  int64_t metrics_scrape_ms = 0;
  /// state.backend.type of the job's keyed state: hashmap (the heap) or rocksdb.
  std::string state_backend = "hashmap";
  /// state.backend.rocksdb.timer-service.factory with rocksdb: heap or rocksdb (Flink's default).
  std::string timer_service = "heap";
  /// state.backend.rocksdb.memory.fixed-per-slot with rocksdb; empty: the default (64mb).
  std::string rocksdb_memory;
};

int run_nexmark(const NexmarkOptions& opt) {
  const QueryEntry* query = find_query(opt.query);
  if (query == nullptr) {
    std::string available;
    for (const auto& q : kQueries)
      available += fmt::format("\n  {}  {}", q.name, q.description);
    fmt::print(stderr, "error: unknown query '{}'; available queries:{}\n", opt.query, available);
    return 2;
  }
  sluice::nexmark::NexmarkConfig config;
  config.events = opt.events;
  config.rate = opt.rate;
  config.seed = opt.seed;
  auto source = sluice::nexmark::NexmarkSource::create(config);
  if (!source.ok()) {
    fmt::print(stderr, "error: {}\n", source.error().to_string());
    return 2;
  }
  // Build the generator's channel table before timing.
  for (int64_t n = 0; n < config.total_proportion(); ++n)
    (void)(*source)->generator().event(n);

  sluice::Configuration conf;
  conf.set(sluice::options::kStateBackendType, opt.state_backend);
  conf.set_string(std::string(sluice::options::kRocksDBTimerServiceFactory.key), opt.timer_service);
  if (!opt.rocksdb_memory.empty()) {
    conf.set_string(std::string(sluice::options::kRocksDBMemoryFixedPerSlot.key), opt.rocksdb_memory);
  }
  std::filesystem::path checkpoint_dir;
  if (opt.checkpoint_interval_ms > 0) {
    // Checkpoints go to a fresh directory under the temp dir, removed at the end.
    checkpoint_dir = std::filesystem::temp_directory_path() / fmt::format("sluice-bench-nexmark-{}", ::getpid());
    conf.set_string(std::string(sluice::options::kCheckpointInterval.key),
                    fmt::format("{}ms", opt.checkpoint_interval_ms));
    conf.set(sluice::options::kCheckpointDir, "file://" + checkpoint_dir.string());
  }
  sluice::StreamEnvironment env(conf);
  env.set_parallelism(opt.parallelism);
  auto output_records = std::make_shared<std::atomic<int64_t>>(0);
  query->build(env.from_source(*source, "Nexmark").uid("nexmark-source"), output_records);

  rusage before{};
  rusage after{};
  getrusage(RUSAGE_SELF, &before);
  const auto start = std::chrono::steady_clock::now();
  sluice::JobResult result;
  int64_t scrapes = 0;
  if (opt.metrics_scrape_ms > 0) {
    sluice::JobClient client = env.execute_async(fmt::format("nexmark {}", query->name));
    sluice::metrics::MetricRegistry registry;
    auto job_metrics = std::make_unique<sluice::metrics::JobMetrics>(registry, client, std::string(query->name));
    while (!client.wait_for(std::chrono::milliseconds(opt.metrics_scrape_ms))) {
      const std::string text = registry.prometheus_text();
      if (!text.empty()) ++scrapes;
    }
    result = client.wait();
  } else {
    result = env.execute(fmt::format("nexmark {}", query->name));
  }
  const auto end = std::chrono::steady_clock::now();
  getrusage(RUSAGE_SELF, &after);
  if (!checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(checkpoint_dir, ec);
  }
  if (!result.ok()) {
    fmt::print(stderr, "error: job {}: {}\n", sluice::job_status_name(result.status),
               result.error ? result.error->to_string() : "no error recorded");
    return 1;
  }

  const double wall = std::chrono::duration<double>(end - start).count();
  const double cpu = cpu_seconds(after) - cpu_seconds(before);
  const double events = static_cast<double>(opt.events);
  const double peak_rss_mib = static_cast<double>(after.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
  if (opt.format == "json") {
    fmt::print(
        "{{\"benchmark\":\"nexmark\",\"query\":\"{}\",\"events\":{},\"parallelism\":{},\"rate\":{},"
        "\"wall_seconds\":{:.6f},\"cpu_seconds\":{:.6f},\"events_per_second\":{:.0f},"
        "\"events_per_cpu_second\":{:.0f},\"peak_rss_mib\":{:.1f},\"output_records\":{}}}\n",
        query->name, opt.events, opt.parallelism, opt.rate, wall, cpu, events / wall, events / cpu, peak_rss_mib,
        output_records->load());
  } else {
    fmt::print(
        "nexmark {}: events {}, parallelism {}, wall {:.3f} s, {:.0f} events/s, cpu {:.3f} s, {:.0f} events/cpu-s, "
        "peak RSS {:.1f} MiB, output records {}, metrics scrapes {}\n",
        query->name, opt.events, opt.parallelism, wall, events / wall, cpu, events / cpu, peak_rss_mib,
        output_records->load(), scrapes);
  }
  return 0;
}

struct MetricsScrapeOptions {
  int operators = 100;
  int parallelism = 8;
  int scrapes = 50;
};

/// A running job of `operators` chained operators (a rate-limited datagen source, maps, a discarding sink) at
/// `parallelism`: times MetricRegistry::prometheus_text() (what GET /metrics serves) and prints the median and
/// the largest of `scrapes` scrapes, the series count and the bytes.
int run_metrics_scrape(const MetricsScrapeOptions& opt) {
  sluice::StreamEnvironment env;
  env.set_parallelism(opt.parallelism);
  auto source = std::make_shared<sluice::DataGeneratorSource<int64_t>>(
      [](int64_t i) { return i; }, sluice::DataGeneratorSource<int64_t>::kUnbounded, 1000.0 * opt.parallelism);
  sluice::DataStream<int64_t> s = env.from_source(source, "numbers");
  for (int i = 0; i < opt.operators - 2; ++i)
    s = s.map([](int64_t v) { return v + 1; }).name(fmt::format("map-{}", i));
  discard(s, std::make_shared<std::atomic<int64_t>>(0));
  sluice::JobClient client = env.execute_async("metrics scrape");
  sluice::metrics::MetricRegistry registry;
  sluice::metrics::JobMetrics job_metrics(registry, client, "metrics scrape");
  // Wait until every subtask is registered (they appear on the first scrape after deployment).
  const size_t want_ops = static_cast<size_t>(opt.operators) * static_cast<size_t>(opt.parallelism);
  size_t series = 0, bytes = 0;
  for (int i = 0; i < 600; ++i) {
    const std::string t = registry.prometheus_text();
    size_t ops = 0;
    for (size_t p = t.find("\nflink_taskmanager_job_task_operator_numRecordsIn{"); p != std::string::npos;
         p = t.find("\nflink_taskmanager_job_task_operator_numRecordsIn{", p + 1))
      ++ops;
    if (ops >= want_ops) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<double> ms;
  for (int i = 0; i < opt.scrapes; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string t = registry.prometheus_text();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    bytes = t.size();
    series = static_cast<size_t>(std::count(t.begin(), t.end(), '\n')) -
             2 * static_cast<size_t>(std::count(t.begin(), t.end(), '#') / 2);
  }
  client.cancel();
  client.wait();
  std::sort(ms.begin(), ms.end());
  fmt::print(
      "metrics scrape: {} operators x {} subtasks: {} series, {} bytes, median {:.2f} ms, max {:.2f} ms ({} scrapes)\n",
      opt.operators, opt.parallelism, series, bytes, ms[ms.size() / 2], ms.back(), ms.size());
  return 0;
}

/// Prints the generator checksum (nexmark::checksum, XXH3-64 over the events' canonical serialization) of
/// events 0..events-1, the reference that bench/compare/flink's port of the generator must reproduce.
int run_nexmark_checksum(const NexmarkOptions& opt) {
  sluice::nexmark::NexmarkConfig config;
  config.events = opt.events;
  config.rate = opt.rate;
  config.seed = opt.seed;
  if (sluice::Status s = config.validate(); !s.ok()) {
    fmt::print(stderr, "error: {}\n", s.error().to_string());
    return 2;
  }
  fmt::print("nexmark checksum: events {}, rate {}, seed {}: {:016x}\n", opt.events, opt.rate, opt.seed,
             sluice::nexmark::checksum(config, opt.events));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice-bench: end-to-end benchmarks of Sluice on the local mini-cluster", "sluice-bench"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();

  NexmarkOptions opt;
  auto* nexmark = app.add_subcommand("nexmark", "Run a Nexmark query over generated events into a discarding sink");
  std::string query_help = "Query to run:";
  for (const auto& q : kQueries)
    query_help += fmt::format(" {}: {};", q.name, q.description);
  nexmark->add_option("-q,--query", opt.query, query_help)->required();
  nexmark->add_option("-n,--events", opt.events, "Number of events to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  nexmark->add_option("-p,--parallelism", opt.parallelism, "Parallelism of the job")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  nexmark->add_option("-r,--rate", opt.rate, "Events per second of event time (spaces timestamps; no throttling)")
      ->capture_default_str();
  nexmark->add_option("--seed", opt.seed, "Seed of the generator (runs are reproducible)")->capture_default_str();
  nexmark
      ->add_option("--checkpoint-interval-ms", opt.checkpoint_interval_ms,
                   "Checkpoint interval in ms (0: no checkpoints; checkpoints go under the temp dir)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  nexmark->add_option("--format", opt.format, "Output format")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  nexmark
      ->add_option("--state-backend", opt.state_backend,
                   "Keyed state backend (state.backend.type; rocksdb: one database per keyed subtask under the temp "
                   "dir, 64 MiB per slot)")
      ->capture_default_str()
      ->check(CLI::IsMember({"hashmap", "rocksdb"}));
  nexmark
      ->add_option("--timer-service", opt.timer_service,
                   "Where timers live with --state-backend rocksdb (state.backend.rocksdb.timer-service.factory; "
                   "Flink's default is rocksdb)")
      ->capture_default_str()
      ->check(CLI::IsMember({"heap", "rocksdb"}));
  nexmark->add_option(
      "--rocksdb-memory", opt.rocksdb_memory,
      "Memory budget of the RocksDB databases of each slot (state.backend.rocksdb.memory.fixed-per-slot, "
      "e.g. 128mb; default 64mb)");
  nexmark
      ->add_option("--metrics-scrape-ms", opt.metrics_scrape_ms,
                   "Register the job's metrics and scrape them every N ms while it runs (0: no registry)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));

  MetricsScrapeOptions scrape_opt;
  auto* metrics_scrape = app.add_subcommand(
      "metrics-scrape", "Time /metrics of a running job of N chained operators x P subtasks (Prometheus text)");
  metrics_scrape->add_option("--operators", scrape_opt.operators, "Operators per chain")->capture_default_str();
  metrics_scrape->add_option("-p,--parallelism", scrape_opt.parallelism, "Subtasks")->capture_default_str();
  metrics_scrape->add_option("--scrapes", scrape_opt.scrapes, "Scrapes to time")->capture_default_str();

  NexmarkOptions sum_opt;
  auto* nexmark_checksum = app.add_subcommand(
      "nexmark-checksum", "Print the checksum of the first N generated Nexmark events (compare with the Flink port)");
  nexmark_checksum->add_option("-n,--events", sum_opt.events, "Number of events")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  nexmark_checksum->add_option("-r,--rate", sum_opt.rate, "Events per second of event time")->capture_default_str();
  nexmark_checksum->add_option("--seed", sum_opt.seed, "Seed of the generator")->capture_default_str();

  sluice::bench::CheckpointBenchOptions ck;
  auto* checkpoint =
      app.add_subcommand("checkpoint", "What checkpoints cost: state size, churn, throughput, recovery, storage");
  checkpoint->add_option("scenario", ck.scenario, "state, churn, throughput, recovery or storage")
      ->required()
      ->check(CLI::IsMember({"state", "churn", "throughput", "recovery", "storage"}));
  checkpoint->add_option("--state-mb", ck.state_mb, "MiB of keyed state (state, recovery)")->capture_default_str();
  checkpoint->add_option("--value-bytes", ck.value_bytes, "Bytes of each key's value")->capture_default_str();
  checkpoint->add_option("--records", ck.records, "Records per run (throughput)")->capture_default_str();
  checkpoint->add_option("--intervals", ck.intervals, "Checkpoint intervals, the first is the baseline")
      ->capture_default_str();
  checkpoint->add_option("--rounds", ck.rounds, "Rounds (throughput, storage)")->capture_default_str();
  checkpoint->add_option("-p,--parallelism", ck.parallelism, "Parallelism")->capture_default_str();
  checkpoint->add_option("--restore-parallelism", ck.restore_parallelism,
                         "recovery: cancel the job and restore a new one from its last checkpoint at this "
                         "parallelism (rescaling)");
  checkpoint->add_flag("--verify-keys", ck.verify_keys,
                       "recovery: fill until every key is written; after the restore, count the keys without a value "
                       "(exit code 1 when any)");
  checkpoint->add_option("--dir", ck.dir, "Checkpoint directory (default: under the temp dir)");
  checkpoint->add_option("--backend", ck.backend, "State backend (state.backend.type)")
      ->capture_default_str()
      ->check(CLI::IsMember({"hashmap", "rocksdb"}));
  checkpoint->add_option(
      "--rocksdb-memory", ck.rocksdb_memory,
      "Memory budget of the RocksDB databases of each slot (state.backend.rocksdb.memory.fixed-per-slot)");
  checkpoint->add_flag("--incremental", ck.incremental, "Incremental checkpoints (state.backend.incremental: true)");
  checkpoint->add_option("--churn-percent", ck.churn_percent, "Keys changed per checkpoint interval, in % (churn)")
      ->capture_default_str();
  checkpoint
      ->add_option("--values", ck.values,
                   "Values: repeated (one letter, RocksDB compresses it ~13x) or random (incompressible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"repeated", "random"}));
  checkpoint
      ->add_option(
          "--storages", ck.storages,
          "Checkpoint storages compared (storage): none, local (under --dir or the temp dir), s3://bucket/prefix "
          "(S3_ENDPOINT for a local server)")
      ->capture_default_str();
  checkpoint->add_option("--interval", ck.interval, "Checkpoint interval (storage)")->capture_default_str();
  checkpoint->add_option("--window-s", ck.window_s, "Seconds of throughput measured after the fill (storage)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  checkpoint->add_option("--checkpoints", ck.checkpoints, "Completed checkpoints after the fill to wait for (storage)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));

  sluice::bench::NexmarkKafkaOptions kfill;
  auto* kafka_fill = app.add_subcommand("nexmark-kafka-fill", "Write Nexmark bids as JSON into a Kafka topic");
  kafka_fill->add_option("--bootstrap", kfill.bootstrap, "Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)");
  kafka_fill->add_option("--topic", kfill.topic, "Topic to write (created when missing)")->required();
  kafka_fill->add_option("-n,--events", kfill.events, "Number of bids to write")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  kafka_fill->add_option("--partitions", kfill.partitions, "Partitions of the topic")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000));
  kafka_fill->add_option("--format", kfill.format, "Output format")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));

  sluice::bench::NexmarkKafkaOptions kq1;
  auto* kafka_q1 =
      app.add_subcommand("nexmark-kafka-q1", "Nexmark query 1 from a Kafka topic of bids to a Kafka topic (JSON)");
  kafka_q1->add_option("--bootstrap", kq1.bootstrap, "Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)");
  kafka_q1->add_option("--input", kq1.input, "Topic of bids (nexmark-kafka-fill)")->required();
  kafka_q1->add_option("--output", kq1.output, "Output topic (created with the input's partitions when missing)")
      ->required();
  kafka_q1->add_option("-p,--parallelism", kq1.parallelism, "Parallelism of the job")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  kafka_q1->add_option("--checkpoint-interval-ms", kq1.checkpoint_interval_ms, "Checkpoint interval in ms")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  kafka_q1->add_option("--format", kq1.format, "Output format")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));

  try {
    if (nexmark->parsed()) return run_nexmark(opt);
    if (metrics_scrape->parsed()) return run_metrics_scrape(scrape_opt);
    if (nexmark_checksum->parsed()) return run_nexmark_checksum(sum_opt);
    if (checkpoint->parsed()) return sluice::bench::run_checkpoint_bench(ck);
    if (kafka_fill->parsed()) return sluice::bench::run_nexmark_kafka_fill(kfill);
    if (kafka_q1->parsed()) return sluice::bench::run_nexmark_kafka_q1(kq1);
  } catch (const sluice::SluiceException& e) {
    fmt::print(stderr, "error: {}\n", e.error().to_string());
    return 1;
  }
  return 0;
}
