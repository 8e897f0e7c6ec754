// kafka-bench: throughput and latency of the Kafka sink against a real broker (docs/connectors.md, "Kafka sink").
//
//   scripts/services/run-with kafka -- build/<dir>/bench/kafka-bench [--records N] [--bytes B] ...
//
// Three measurements, each on a fresh topic (--partitions, default 4) of the broker in KAFKA_BOOTSTRAP_SERVERS:
//  1. raw: librdkafka alone, one idempotent producer (acks=all, linger.ms=5) producing --records records of
//     --bytes bytes, then one consumer reading them back: the ceiling of (2).
//  2. pipeline: datagen -> pass-through map -> KafkaSink with --records records of --bytes bytes, at-least-once and
//     exactly-once at checkpoint intervals 1 s and 200 ms (--intervals); records/s from job start to FINISHED (the
//     last transaction committed), and the ratio to (1)'s produce rate.
//  3. latency: exactly-once at the same intervals (and at-least-once at the shortest, for reference), a datagen
//     rate-limited to --rate records/s for --seconds; each value carries its emit time; a read_committed consumer
//     in this process reports p50/p99/max of emit -> visible to the consumer (records emitted in the first 2 s,
//     while the producers connect, are left out).
// Options: --records N (1000000), --bytes B (100), --partitions P (4), --parallelism P (1), --rate R (20000),
// --seconds S (10), --intervals 1000,200 (ms), --only raw|pipeline|latency, --bootstrap HOST:PORT.
#include <librdkafka/rdkafka.h>
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
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "kafka_admin.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/logging.h"

namespace {

using sluice::bench::cpu_seconds;

using Clock = std::chrono::steady_clock;
using sluice::DeliveryGuarantee;

struct Options {
  std::string bootstrap;
  int64_t records = 1'000'000;
  int bytes = 100;
  int partitions = 4;
  int parallelism = 1;
  double rate = 20'000;
  int seconds = 10;
  std::vector<int64_t> intervals = {1000, 200};
  std::string only;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "kafka-bench: %s\n", what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* b = std::getenv("KAFKA_BOOTSTRAP_SERVERS")) o.bootstrap = b;
  CLI::App app{
      "Kafka ceiling, pipeline throughput and exactly-once latency (see the comment at the top of "
      "bench/kafka_bench.cc)",
      "kafka-bench"};
  app.add_option("--bootstrap", o.bootstrap, "Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)");
  app.add_option("--records", o.records, "Records per run")->capture_default_str();
  app.add_option("--bytes", o.bytes, "Bytes per record value")->capture_default_str();
  app.add_option("--partitions", o.partitions, "Partitions of the topics")->capture_default_str();
  app.add_option("--parallelism", o.parallelism, "Job parallelism")->capture_default_str();
  app.add_option("--rate", o.rate, "Records/s of the latency run")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds of the latency run")->capture_default_str();
  app.add_option("--intervals", o.intervals, "Checkpoint intervals in ms, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--only", o.only, "raw, pipeline or latency (default: all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.bootstrap.empty()) die("no broker: set KAFKA_BOOTSTRAP_SERVERS (scripts/services/run-with kafka -- ...)");
  if (o.bytes < 24) die("--bytes must be at least 24");
  return o;
}

rd_kafka_t* client(rd_kafka_type_t type, const std::map<std::string, std::string>& conf) {
  rd_kafka_conf_t* c = rd_kafka_conf_new();
  char err[512];
  for (const auto& [k, v] : conf) {
    if (rd_kafka_conf_set(c, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) die(k + ": " + err);
  }
  rd_kafka_t* rk = rd_kafka_new(type, c, err, sizeof err);
  if (rk == nullptr) die(std::string("rd_kafka_new: ") + err);
  return rk;
}

void create_topic(const Options& o, const std::string& topic) {
  if (sluice::Status st = sluice::bench::ensure_topic(o.bootstrap, topic, o.partitions); !st.ok())
    die(st.error().to_string());
  rd_kafka_t* admin = client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", o.bootstrap}});
  // Wait until every partition has a leader.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(admin, topic.c_str(), nullptr);
    bool ready = false;
    if (rd_kafka_metadata(admin, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      ready = md->topic_cnt == 1 && md->topics[0].partition_cnt == o.partitions;
      for (int p = 0; ready && p < md->topics[0].partition_cnt; ++p)
        ready = md->topics[0].partitions[p].leader >= 0;
      rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
    if (ready) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  rd_kafka_destroy(admin);
}

std::string unique(const std::string& prefix) {
  static int n = 0;
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" +
         std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 1'000'000);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A value of `bytes` bytes: the index, padded.
std::string make_value(int64_t i, int bytes) {
  std::string v(static_cast<size_t>(bytes), 'x');
  const std::string n = std::to_string(i);
  std::memcpy(v.data(), n.data(), n.size());
  return v;
}

/// Reads `count` records of `topic` with a read_committed consumer; returns records/s.
double consume(const Options& o, const std::string& topic, int64_t count) {
  rd_kafka_t* c = client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", o.bootstrap},
                                             {"group.id", unique("bench")},
                                             {"isolation.level", "read_committed"},
                                             {"enable.auto.commit", "false"},
                                             {"fetch.max.bytes", "52428800"}});
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(o.partitions);
  for (int p = 0; p < o.partitions; ++p)
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(c, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  int64_t got = 0;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::minutes(5);
  while (got < count && Clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(c, 100);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) ++got;
    rd_kafka_message_destroy(m);
  }
  const double s = seconds_since(start);
  rd_kafka_consumer_close(c);
  rd_kafka_destroy(c);
  if (got < count) die("consumed only " + std::to_string(got) + " of " + std::to_string(count));
  return static_cast<double>(count) / s;
}

struct Raw {
  double produce_rate = 0;
  double produce_cpu_us = 0;  // CPU µs per record
  double consume_rate = 0;
};

Raw bench_raw(const Options& o) {
  const std::string topic = unique("bench-raw");
  create_topic(o, topic);
  rd_kafka_t* p = client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", o.bootstrap},
                                             {"enable.idempotence", "true"},
                                             {"acks", "all"},
                                             {"linger.ms", "5"},
                                             {"partitioner", "murmur2_random"}});
  // Connect and learn the topic's metadata before the clock starts (the sink's producers do so at start too).
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(p, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_metadata(p, 0, rkt, &md, 10'000) == RD_KAFKA_RESP_ERR_NO_ERROR) rd_kafka_metadata_destroy(md);
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  for (int64_t i = 0; i < o.records; ++i) {
    const std::string value = make_value(i, o.bytes);  // as the pipeline's datagen makes it
    while (true) {
      rd_kafka_resp_err_t err = rd_kafka_producev(p, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_KEY(value.data(), 3),
                                                  RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) break;
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) die(rd_kafka_err2str(err));
      rd_kafka_poll(p, 10);
    }
    if ((i & 1023) == 0) rd_kafka_poll(p, 0);
  }
  if (rd_kafka_flush(p, 120'000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush");
  Raw r;
  r.produce_rate = static_cast<double>(o.records) / seconds_since(start);
  r.produce_cpu_us = (cpu_seconds() - cpu0) * 1e6 / static_cast<double>(o.records);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(p);
  r.consume_rate = consume(o, topic, o.records);
  return r;
}

sluice::Configuration job_config(const Options& o, int64_t interval_ms, const std::filesystem::path& dir) {
  sluice::Configuration c;
  c.set(sluice::options::kParallelism, o.parallelism);
  c.set_string("execution.checkpointing.interval", std::to_string(interval_ms) + "ms");
  c.set(sluice::options::kCheckpointDir, "file://" + dir.string());
  c.set(sluice::options::kCheckpointMode, std::string("EXACTLY_ONCE"));
  return c;
}

std::shared_ptr<sluice::KafkaSink<std::string>> make_sink(const Options& o, const std::string& topic,
                                                          DeliveryGuarantee g, const sluice::Configuration& job) {
  auto b = sluice::KafkaSink<std::string>::builder()
               .bootstrap_servers(o.bootstrap)
               .topic(topic)
               .delivery_guarantee(g)
               .record_serializer([](const std::string& v, sluice::KafkaProducerRecord& out) {
                 out.set_key(std::string_view(v).substr(0, 3));
                 out.set_value(v);
               })
               .property("linger.ms", "5");
  if (g == DeliveryGuarantee::kExactlyOnce) b.transactional_id_prefix(unique("bench-tx")).max_commit_delay_from(job);
  return b.build();
}

struct PipelineResult {
  double rate = 0;
  double cpu_us = 0;  // CPU µs per record, job start to end
  int64_t checkpoints = 0;
};

PipelineResult bench_pipeline(const Options& o, DeliveryGuarantee g, int64_t interval_ms) {
  const std::string topic = unique("bench-pipe");
  create_topic(o, topic);
  const auto dir = std::filesystem::temp_directory_path() / unique("kafka-bench-ckpt");
  sluice::Configuration config = job_config(o, interval_ms, dir);
  sluice::StreamEnvironment env(config);
  const int bytes = o.bytes;
  env.from_source(std::make_shared<sluice::DataGeneratorSource<std::string>>(
                      [bytes](int64_t i) { return make_value(i, bytes); }, o.records),
                  "datagen")
      .uid("datagen")
      .map([](const std::string& s) { return s; })
      .uid("pass-through")
      .sink_to(make_sink(o, topic, g, config), "Kafka")
      .uid("kafka-sink");
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  sluice::JobResult r = env.execute("kafka-bench pipeline");
  const double s = seconds_since(start);
  const double cpu = cpu_seconds() - cpu0;
  std::filesystem::remove_all(dir);
  if (!r.ok()) die("job failed: " + (r.error ? r.error->to_string() : std::string("?")));
  return PipelineResult{static_cast<double>(o.records) / s, cpu * 1e6 / static_cast<double>(o.records),
                        r.completed_checkpoints};
}

struct Latency {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  int64_t records = 0;
};

Latency bench_latency(const Options& o, DeliveryGuarantee g, int64_t interval_ms) {
  const std::string topic = unique("bench-lat");
  create_topic(o, topic);
  const auto dir = std::filesystem::temp_directory_path() / unique("kafka-bench-ckpt");
  sluice::Configuration config = job_config(o, interval_ms, dir);
  sluice::StreamEnvironment env(config);
  const int64_t count = static_cast<int64_t>(o.rate * o.seconds);
  const int bytes = o.bytes;
  // Each value starts with its emit time (steady clock, µs): this process also consumes, so one clock.
  env.from_source(
         std::make_shared<sluice::DataGeneratorSource<std::string>>(
             [bytes](int64_t) {
               const auto us =
                   std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
               return make_value(us, bytes);
             },
             count, o.rate),
         "datagen")
      .uid("datagen")
      .map([](const std::string& s) { return s; })
      .uid("pass-through")
      .sink_to(make_sink(o, topic, g, config), "Kafka")
      .uid("kafka-sink");

  std::atomic<bool> stop{false};
  std::vector<std::pair<int64_t, double>> all;  // (emit time µs, latency ms)
  all.reserve(static_cast<size_t>(count));
  int64_t first_sent = -1;
  std::thread reader([&] {
    rd_kafka_t* c = client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", o.bootstrap},
                                               {"group.id", unique("bench")},
                                               {"isolation.level", "read_committed"},
                                               {"enable.auto.commit", "false"},
                                               {"fetch.wait.max.ms", "10"}});
    rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(o.partitions);
    for (int p = 0; p < o.partitions; ++p)
      rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(c, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    while (!stop.load() || static_cast<int64_t>(all.size()) < count) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(c, 50);
      if (m == nullptr) {
        if (stop.load()) break;
        continue;
      }
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const int64_t now =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
        const int64_t sent = std::strtoll(static_cast<const char*>(m->payload), nullptr, 10);
        if (first_sent < 0 || sent < first_sent) first_sent = sent;
        all.emplace_back(sent, static_cast<double>(now - sent) / 1000.0);
      }
      rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
  });
  sluice::JobResult r = env.execute("kafka-bench latency");
  stop.store(true);
  reader.join();
  std::filesystem::remove_all(dir);
  if (!r.ok()) die("job failed: " + (r.error ? r.error->to_string() : std::string("?")));
  // The first 2 s are warm-up (the producers connect and initialize while the source already emits).
  std::vector<double> latencies;
  for (const auto& [sent, ms] : all) {
    if (sent >= first_sent + 2'000'000) latencies.push_back(ms);
  }
  Latency l;
  l.records = static_cast<int64_t>(latencies.size());
  if (latencies.empty()) return l;
  std::sort(latencies.begin(), latencies.end());
  auto at = [&](double q) {
    return latencies[std::min(latencies.size() - 1, static_cast<size_t>(q * latencies.size()))];
  };
  l.p50_ms = at(0.50);
  l.p99_ms = at(0.99);
  l.max_ms = latencies.back();
  return l;
}

const char* name(DeliveryGuarantee g) {
  return g == DeliveryGuarantee::kExactlyOnce ? "exactly-once" : "at-least-once";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  sluice::init_logging();
  spdlog::set_level(spdlog::level::warn);
  std::printf("kafka-bench: broker %s, %lld records of %d bytes, %d partitions, parallelism %d\n", o.bootstrap.c_str(),
              static_cast<long long>(o.records), o.bytes, o.partitions, o.parallelism);
  Raw raw;
  if (o.only.empty() || o.only == "raw" || o.only == "pipeline") {
    raw = bench_raw(o);
    std::printf(
        "raw librdkafka   produce %10.0f records/s (%6.1f MB/s, %.2f CPU us/record)   consume %10.0f records/s "
        "(%6.1f MB/s)\n",
        raw.produce_rate, raw.produce_rate * o.bytes / 1e6, raw.produce_cpu_us, raw.consume_rate,
        raw.consume_rate * o.bytes / 1e6);
    std::fflush(stdout);
  }
  if (o.only.empty() || o.only == "pipeline") {
    for (DeliveryGuarantee g : {DeliveryGuarantee::kAtLeastOnce, DeliveryGuarantee::kExactlyOnce}) {
      for (int64_t interval : o.intervals) {
        PipelineResult p = bench_pipeline(o, g, interval);
        std::printf(
            "pipeline %-13s checkpoint %5lld ms: %10.0f records/s  (%.2f of raw produce; %.2f CPU us/record, "
            "%.2f of raw; %lld checkpoints)\n",
            name(g), static_cast<long long>(interval), p.rate, p.rate / raw.produce_rate, p.cpu_us,
            p.cpu_us / raw.produce_cpu_us, static_cast<long long>(p.checkpoints));
        std::fflush(stdout);
      }
    }
  }
  if (o.only.empty() || o.only == "latency") {
    std::vector<std::pair<DeliveryGuarantee, int64_t>> runs;
    for (int64_t interval : o.intervals)
      runs.emplace_back(DeliveryGuarantee::kExactlyOnce, interval);
    runs.emplace_back(DeliveryGuarantee::kAtLeastOnce, *std::min_element(o.intervals.begin(), o.intervals.end()));
    for (const auto& [g, interval] : runs) {
      Latency l = bench_latency(o, g, interval);
      std::printf(
          "latency  %-13s checkpoint %5lld ms at %.0f records/s: p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms "
          "(%lld records after warm-up)\n",
          name(g), static_cast<long long>(interval), o.rate, l.p50_ms, l.p99_ms, l.max_ms,
          static_cast<long long>(l.records));
      std::fflush(stdout);
    }
  }
  return 0;
}
