// kafka-bench: throughput and latency of Kafka -> pass-through -> Kafka against a real broker (docs/benchmarks.md,
// "Kafka"; docs/connectors.md).
//
//   scripts/services/run-with kafka -- build/<dir>/bench/kafka-bench [--records N] [--bytes B] ...
//
// Measurements, each on fresh topics (--partitions, default 4) of the broker in KAFKA_BOOTSTRAP_SERVERS:
//  1. raw: librdkafka alone. One idempotent producer (acks=all, linger.ms=5) writes --records records of --bytes
//     bytes into the input topic; one read_committed consumer reads them back; and a raw pass-through, one
//     consumer (one message per rd_kafka_consumer_poll) and one idempotent producer in one loop on one thread:
//     what the job does, without the engine, as a reference.
//  2. pipeline: KafkaSource (bounded at the input's end offsets) -> pass-through map -> KafkaSink, key and value
//     kept, at-least-once and exactly-once at checkpoint intervals 1 s and 200 ms (--intervals); records/s from
//     job start (client set-up included) to FINISHED (the last transaction committed), and the ratios to (1): to
//     the raw produce rate and to the raw pass-through. Afterwards a
//     read_committed consumer checks that every record reached the output. With --source datagen the records
//     come from a generator instead of the input topic (the sink alone).
//  3. latency: exactly-once at the same intervals (and at-least-once at the shortest, for reference). A producer
//     in this process writes --rate records/s for --seconds into a fresh input topic, each value carrying the
//     time before its rd_kafka_producev (so linger.ms and the input's acks count); the job (unbounded source)
//     passes them through; a read_committed consumer in this process
//     reports p50/p99/max of produce -> visible to the consumer (records of the first 2 s, while the job's
//     clients connect, are left out).
//  4. eo-memory (only with --only eo-memory): the memory an exactly-once KafkaSink holds per record of its open
//     transaction (the recovery copy, docs/connectors.md "Memory"). One writer driven by hand writes --records
//     records (8-byte key, --bytes value) into one open transaction; the process's resident set (VmRSS, after
//     malloc_trim) is read before, after writing (librdkafka's queue still holds unacknowledged records) and after
//     a flush (every record acknowledged: only the recovery copy is left), and divided by the records; the copy's
//     encoded size per record comes from the pre-commit's committable.
// With --only latency --source raw no job runs: the consumer reads the input topic itself (the broker's and
// librdkafka's own latency, the reference for (3)).
// Options: --records N (1000000), --bytes B (100), --partitions P (4), --parallelism P (1), --rate R (20000),
// --seconds S (10), --intervals 1000,200 (ms), --only raw|pipeline|latency|eo-memory, --source kafka|datagen|raw,
// --guarantees at-least-once,exactly-once (pipeline runs), --source-property KEY=VALUE (repeatable; a librdkafka
// property of the Kafka source), --verbose (checkpoint log lines), --bootstrap HOST:PORT.
#include <librdkafka/rdkafka.h>
#include <malloc.h>
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
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "kafka_admin.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/kafka/kafka_source.h"
#include "sluice/core/clock.h"
#include "sluice/core/logging.h"
#include "sluice/state/operator_state.h"

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
  std::string source = "kafka";
  std::vector<std::string> guarantees = {"at-least-once", "exactly-once"};
  std::vector<std::string> source_properties;  // key=value, librdkafka consumer properties of the Kafka source
  bool verbose = false;
};

/// A Kafka record passed through: key and value bytes.
struct PassRecord {
  std::string key;
  std::string value;
};
SLUICE_FIELDS(PassRecord, key, value);

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
  app.add_option("--only", o.only, "raw, pipeline, latency or eo-memory (default: the first three)");
  app.add_option("--source", o.source, "Where the pipeline's records come from: kafka (the input topic) or datagen")
      ->check(CLI::IsMember({"kafka", "datagen", "raw"}))
      ->capture_default_str();
  app.add_option("--guarantees", o.guarantees, "Delivery guarantees of the pipeline runs, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"at-least-once", "exactly-once"}))
      ->capture_default_str();
  app.add_option("--source-property", o.source_properties,
                 "A librdkafka consumer property of the pipeline's Kafka source, key=value (repeatable)");
  app.add_flag("--verbose", o.verbose, "Log at info level (checkpoints with their sizes and sync pauses)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.bootstrap.empty()) die("no broker: set KAFKA_BOOTSTRAP_SERVERS (scripts/services/run-with kafka -- ...)");
  if (o.bytes < 24) die("--bytes must be at least 24");
  if (o.source == "raw" && o.only != "latency") die("--source raw only applies to --only latency");
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

/// A read_committed consumer assigned every partition of `topic` from the beginning.
rd_kafka_t* raw_consumer(const Options& o, const std::string& topic) {
  rd_kafka_t* c = client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", o.bootstrap},
                                             {"group.id", unique("bench")},
                                             {"isolation.level", "read_committed"},
                                             {"enable.auto.commit", "false"},
                                             {"fetch.max.bytes", "52428800"},
                                             // As the Kafka source sets it (kafka_source_settings.cc): else a reader
                                             // slower than the fetcher waits about a second per 100,000 records.
                                             {"queued.min.messages", "1000000"}});
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(o.partitions);
  for (int p = 0; p < o.partitions; ++p)
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(c, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  return c;
}

/// Reads `count` records of `topic` with a read_committed consumer; returns records/s.
double consume(const Options& o, const std::string& topic, int64_t count) {
  rd_kafka_t* c = raw_consumer(o, topic);
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
  std::string topic;  // the input topic, holding the produced records
  double produce_rate = 0;
  double produce_cpu_us = 0;  // CPU µs per record
  double consume_rate = 0;
  double pass_rate = 0;  // consume -> produce loop, records/s
  double pass_cpu_us = 0;
};

rd_kafka_t* raw_producer(const Options& o) {
  return client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", o.bootstrap},
                                    {"enable.idempotence", "true"},
                                    {"acks", "all"},
                                    {"linger.ms", "5"},
                                    {"partitioner", "murmur2_random"}});
}

/// rd_kafka_producev, polling while the local queue is full.
void produce_one(rd_kafka_t* p, rd_kafka_topic_t* rkt, std::string_view key, std::string_view value) {
  while (true) {
    rd_kafka_resp_err_t err = rd_kafka_producev(p, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_KEY(key.data(), key.size()),
                                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
    if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) die(rd_kafka_err2str(err));
    rd_kafka_poll(p, 10);
  }
}

/// A topic handle of `p`, after the topic's metadata arrived (the sink's producers learn it at start too).
rd_kafka_topic_t* topic_handle(rd_kafka_t* p, const std::string& topic) {
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(p, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_metadata(p, 0, rkt, &md, 10'000) == RD_KAFKA_RESP_ERR_NO_ERROR) rd_kafka_metadata_destroy(md);
  return rkt;
}

/// The raw pass-through: reads the `count` records of `from` and produces each (key and value) into a fresh
/// topic, in one thread, until every delivery is acknowledged. Sets r.pass_rate and r.pass_cpu_us.
void bench_raw_pass(const Options& o, const std::string& from, int64_t count, Raw& r) {
  const std::string to = unique("bench-raw-pass");
  create_topic(o, to);
  rd_kafka_t* p = raw_producer(o);
  rd_kafka_topic_t* rkt = topic_handle(p, to);
  rd_kafka_t* c = raw_consumer(o, from);
  int64_t got = 0;
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  const auto deadline = start + std::chrono::minutes(5);
  while (got < count && Clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(c, 100);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      produce_one(p, rkt, std::string_view(static_cast<const char*>(m->key), m->key_len),
                  std::string_view(static_cast<const char*>(m->payload), m->len));
      if ((++got & 1023) == 0) rd_kafka_poll(p, 0);
    }
    rd_kafka_message_destroy(m);
  }
  if (rd_kafka_flush(p, 120'000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush");
  r.pass_rate = static_cast<double>(got) / seconds_since(start);
  r.pass_cpu_us = (cpu_seconds() - cpu0) * 1e6 / static_cast<double>(std::max<int64_t>(got, 1));
  rd_kafka_consumer_close(c);
  rd_kafka_destroy(c);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(p);
  if (got < count) die("raw pass-through read only " + std::to_string(got) + " of " + std::to_string(count));
}

Raw bench_raw(const Options& o) {
  Raw r;
  r.topic = unique("bench-input");
  create_topic(o, r.topic);
  rd_kafka_t* p = raw_producer(o);
  rd_kafka_topic_t* rkt = topic_handle(p, r.topic);
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  for (int64_t i = 0; i < o.records; ++i) {
    const std::string value = make_value(i, o.bytes);  // as the pipeline's datagen makes it
    produce_one(p, rkt, std::string_view(value).substr(0, 3), value);
    if ((i & 1023) == 0) rd_kafka_poll(p, 0);
  }
  if (rd_kafka_flush(p, 120'000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush");
  r.produce_rate = static_cast<double>(o.records) / seconds_since(start);
  r.produce_cpu_us = (cpu_seconds() - cpu0) * 1e6 / static_cast<double>(o.records);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(p);
  r.consume_rate = consume(o, r.topic, o.records);
  bench_raw_pass(o, r.topic, o.records, r);
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

/// The sink of both pipelines: PassRecord keeps the input's key; a generated string is keyed by its first 3 bytes.
template <class T>
std::shared_ptr<sluice::KafkaSink<T>> make_sink(const Options& o, const std::string& topic, DeliveryGuarantee g,
                                                const sluice::Configuration& job) {
  auto b = sluice::KafkaSink<T>::builder()
               .bootstrap_servers(o.bootstrap)
               .topic(topic)
               .delivery_guarantee(g)
               .record_serializer([](const T& v, sluice::KafkaProducerRecord& out) {
                 if constexpr (std::is_same_v<T, PassRecord>) {
                   out.set_key(v.key);
                   out.set_value(v.value);
                 } else {
                   out.set_key(std::string_view(v).substr(0, 3));
                   out.set_value(v);
                 }
               })
               .property("linger.ms", "5");
  if (g == DeliveryGuarantee::kExactlyOnce) b.transactional_id_prefix(unique("bench-tx")).max_commit_delay_from(job);
  return b.build();
}

/// Reads `topic` from its start: bounded at the end offsets seen at start, or unbounded.
std::shared_ptr<sluice::KafkaSource<PassRecord>> make_source(const Options& o, const std::string& topic, bool bounded) {
  auto b = sluice::KafkaSource<PassRecord>::builder()
               .bootstrap_servers(o.bootstrap)
               .topics({topic})
               .group_id(unique("bench-pass"))
               .starting_offsets(sluice::KafkaStartingOffsets::earliest())
               .deserializer([](const sluice::KafkaMessageView& m, PassRecord& out) {
                 if (m.key) out.key.assign(*m.key);
                 if (m.value) out.value.assign(*m.value);
                 return sluice::ok_status();
               });
  if (bounded) b.bounded();
  for (const std::string& kv : o.source_properties) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) die("--source-property needs key=value, got '" + kv + "'");
    b.property(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return b.build();
}

/// The job's middle and end: `records` -> pass-through map -> KafkaSink into `topic`.
template <class T>
void pass_to_kafka(sluice::DataStream<T> records, const Options& o, const std::string& topic, DeliveryGuarantee g,
                   const sluice::Configuration& config) {
  records.map([](const T& r) { return r; })
      .uid("pass-through")
      .sink_to(make_sink<T>(o, topic, g, config), "Kafka")
      .uid("kafka-sink");
}

struct PipelineResult {
  double rate = 0;
  double cpu_us = 0;  // CPU µs per record, job start to end
  int64_t checkpoints = 0;
};

/// Kafka (`input`, or a generator when empty) -> pass-through -> Kafka, `o.records` records.
PipelineResult bench_pipeline(const Options& o, const std::string& input, DeliveryGuarantee g, int64_t interval_ms) {
  const std::string topic = unique("bench-pipe");
  create_topic(o, topic);
  const auto dir = std::filesystem::temp_directory_path() / unique("kafka-bench-ckpt");
  sluice::Configuration config = job_config(o, interval_ms, dir);
  sluice::StreamEnvironment env(config);
  if (input.empty()) {
    const int bytes = o.bytes;
    auto generated = env.from_source(std::make_shared<sluice::DataGeneratorSource<std::string>>(
                                         [bytes](int64_t i) { return make_value(i, bytes); }, o.records),
                                     "datagen");
    pass_to_kafka(generated.uid("datagen"), o, topic, g, config);
  } else {
    pass_to_kafka(env.from_source(make_source(o, input, /*bounded=*/true), "Kafka input").uid("kafka-source"), o, topic,
                  g, config);
  }
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  sluice::JobResult r = env.execute("kafka-bench pipeline");
  const double s = seconds_since(start);
  const double cpu = cpu_seconds() - cpu0;
  std::filesystem::remove_all(dir);
  if (!r.ok()) die("job failed: " + (r.error ? r.error->to_string() : std::string("?")));
  // Every record is visible to a read_committed consumer of the output (after the clock stopped); consume()
  // fails the benchmark when fewer than o.records arrive.
  consume(o, topic, o.records);
  return PipelineResult{static_cast<double>(o.records) / s, cpu * 1e6 / static_cast<double>(o.records),
                        r.completed_checkpoints};
}

struct Latency {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  int64_t records = 0;
};

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
}

/// Latency from produce (or, with --source datagen, from emit) to visible to a read_committed consumer.
Latency bench_latency(const Options& o, DeliveryGuarantee g, int64_t interval_ms) {
  // raw: no job; the consumer reads the input topic itself (librdkafka and the broker alone, the reference).
  const bool raw = o.source == "raw";
  const bool from_kafka = o.source == "kafka" || raw;
  const std::string input = unique("bench-lat-in");
  if (from_kafka) create_topic(o, input);
  const std::string topic = raw ? input : unique("bench-lat");
  if (!raw) create_topic(o, topic);
  const auto dir = std::filesystem::temp_directory_path() / unique("kafka-bench-ckpt");
  sluice::Configuration config = job_config(o, interval_ms, dir);
  sluice::StreamEnvironment env(config);
  const int64_t count = static_cast<int64_t>(o.rate * o.seconds);
  const int bytes = o.bytes;
  // Each value starts with its produce (emit) time, steady clock µs: this process also consumes, so one clock.
  if (from_kafka && !raw) {
    pass_to_kafka(env.from_source(make_source(o, input, /*bounded=*/false), "Kafka input").uid("kafka-source"), o,
                  topic, g, config);
  } else if (!raw) {
    auto generated = env.from_source(std::make_shared<sluice::DataGeneratorSource<std::string>>(
                                         [bytes](int64_t) { return make_value(now_us(), bytes); }, count, o.rate),
                                     "datagen");
    pass_to_kafka(generated.uid("datagen"), o, topic, g, config);
  }

  std::atomic<bool> stop{false};
  std::atomic<int64_t> received{0};
  std::vector<std::pair<int64_t, double>> all;  // (produce time µs, latency ms)
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
        const int64_t now = now_us();
        const int64_t sent = std::strtoll(static_cast<const char*>(m->payload), nullptr, 10);
        if (first_sent < 0 || sent < first_sent) first_sent = sent;
        all.emplace_back(sent, static_cast<double>(now - sent) / 1000.0);
        received.fetch_add(1);
      }
      rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
  });
  sluice::JobResult r;
  if (from_kafka) {
    std::optional<sluice::JobClient> job;
    if (!raw) job.emplace(env.execute_async("kafka-bench latency"));
    // The producer paces itself to --rate; its records carry their produce time.
    rd_kafka_t* p = raw_producer(o);
    rd_kafka_topic_t* rkt = topic_handle(p, input);
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<int64_t>(1e6 * i / o.rate)));
      const std::string value = make_value(now_us(), bytes);
      produce_one(p, rkt, std::to_string(i % 1000), value);
      rd_kafka_poll(p, 0);
    }
    if (rd_kafka_flush(p, 120'000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush");
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(p);
    // Every record visible to the consumer, or a bound: then the job stops.
    const auto deadline = Clock::now() + std::chrono::seconds(30) + std::chrono::milliseconds(3 * interval_ms);
    while (received.load() < count && Clock::now() < deadline &&
           !(job && job->wait_for(std::chrono::milliseconds(50)))) {
      if (!job) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (job) {
      job->cancel();
      r = job->wait();
    }
    // An unbounded job ends by this cancel: that is its normal end here; a failure before it stays one.
    if (!job || r.status == sluice::JobStatus::kCanceled) r.status = sluice::JobStatus::kFinished;
  } else {
    r = env.execute("kafka-bench latency");
  }
  stop.store(true);
  reader.join();
  std::filesystem::remove_all(dir);
  if (!r.ok()) die("job failed: " + (r.error ? r.error->to_string() : std::string("?")));
  if (received.load() < count) {
    die("the consumer saw " + std::to_string(received.load()) + " of " + std::to_string(count) + " records");
  }
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

// ---- eo-memory

/// The resident set of this process (VmRSS of /proc/self/status), in bytes.
int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return -1;
}

int64_t settled_rss() {
  ::malloc_trim(0);
  return rss_bytes();
}

/// A RuntimeContext for a writer driven by hand (subtask 0 of 1, checkpointing on).
class HandContext final : public sluice::RuntimeContext {
 public:
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  int max_parallelism() const override { return 128; }
  int attempt_number() const override { return 0; }
  const sluice::Clock& clock() const override { return sluice::SystemClock::instance(); }
  sluice::OperatorStateStore& operator_state() override { return store_; }
  bool is_checkpointing_enabled() const override { return true; }

 private:
  std::string name_ = "eo-memory";
  sluice::OperatorStateStore store_;
};

class NoWriteContext final : public sluice::SinkWriterContext {
 public:
  sluice::TimestampMs timestamp() const override { return sluice::kNoTimestamp; }
  sluice::TimestampMs current_watermark() const override { return sluice::kNoTimestamp; }
};

void bench_eo_memory(const Options& o) {
  const std::string topic = unique("bench-eo-memory");
  create_topic(o, topic);
  auto sink = sluice::KafkaSink<PassRecord>::builder()
                  .bootstrap_servers(o.bootstrap)
                  .topic(topic)
                  .record_serializer([](const PassRecord& r, sluice::KafkaProducerRecord& out) {
                    out.set_key(r.key);
                    out.set_value(r.value);
                  })
                  .delivery_guarantee(DeliveryGuarantee::kExactlyOnce)
                  .transactional_id_prefix(unique("bench-eo-memory-tx"))
                  .max_transaction_bytes(int64_t{1} << 40)
                  .property("linger.ms", "5")
                  .build();
  HandContext ctx;
  NoWriteContext wctx;
  auto committer = sink->create_committer(ctx);
  committer->abort_lingering(ctx, {});
  auto writer = sink->create_precommitting_writer(ctx);
  PassRecord r;
  r.value.assign(static_cast<size_t>(o.bytes), 'v');
  auto write = [&](int64_t from, int64_t to) {
    char key[16];
    for (int64_t i = from; i < to; ++i) {
      std::snprintf(key, sizeof key, "k%07lld", static_cast<long long>(i % 10'000'000));
      r.key = key;
      writer->write(r, wctx);
    }
  };
  // Warm-up: producers connected, one transaction committed, buffers of a first epoch allocated and freed.
  write(0, 10'000);
  writer->flush(false);
  std::vector<sluice::KafkaCommittable> warm = writer->prepare_commit();
  committer->commit(warm);
  const int64_t before = settled_rss();
  write(0, o.records);
  const int64_t written = settled_rss();
  writer->flush(false);
  const int64_t acknowledged = settled_rss();
  std::vector<sluice::KafkaCommittable> c = writer->prepare_commit();
  const double n = static_cast<double>(o.records);
  const double copy = c.empty() ? 0 : static_cast<double>(c[0].records.size()) / n;
  committer->commit(c);
  writer->close();
  std::printf(
      "eo-memory %lld records of %d-byte values and 8-byte keys in one open transaction: resident +%.1f bytes/record "
      "after writing (librdkafka's queue included), +%.1f bytes/record once acknowledged (the recovery copy; %.1f "
      "encoded bytes/record, %.1f over key + value)\n",
      static_cast<long long>(o.records), o.bytes, static_cast<double>(written - before) / n,
      static_cast<double>(acknowledged - before) / n, copy, copy - 8 - o.bytes);
}

const char* name(DeliveryGuarantee g) {
  return g == DeliveryGuarantee::kExactlyOnce ? "exactly-once" : "at-least-once";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  sluice::init_logging();
  spdlog::set_level(o.verbose ? spdlog::level::info : spdlog::level::warn);
  std::printf("kafka-bench: broker %s, %lld records of %d bytes, %d partitions, parallelism %d, source %s\n",
              o.bootstrap.c_str(), static_cast<long long>(o.records), o.bytes, o.partitions, o.parallelism,
              o.source.c_str());
  if (o.only == "eo-memory") {
    bench_eo_memory(o);
    return 0;
  }
  Raw raw;
  if (o.only.empty() || o.only == "raw" || o.only == "pipeline") {
    raw = bench_raw(o);
    std::printf(
        "raw librdkafka   produce %10.0f records/s (%6.1f MB/s, %.2f CPU us/record)   consume %10.0f records/s "
        "(%6.1f MB/s)   pass-through %10.0f records/s (%.2f CPU us/record)\n",
        raw.produce_rate, raw.produce_rate * o.bytes / 1e6, raw.produce_cpu_us, raw.consume_rate,
        raw.consume_rate * o.bytes / 1e6, raw.pass_rate, raw.pass_cpu_us);
    std::fflush(stdout);
  }
  if (o.only.empty() || o.only == "pipeline") {
    const std::string input = o.source == "kafka" ? raw.topic : std::string();
    for (const std::string& guarantee : o.guarantees) {
      const DeliveryGuarantee g =
          guarantee == "exactly-once" ? DeliveryGuarantee::kExactlyOnce : DeliveryGuarantee::kAtLeastOnce;
      for (int64_t interval : o.intervals) {
        PipelineResult p = bench_pipeline(o, input, g, interval);
        std::printf(
            "pipeline %-13s checkpoint %5lld ms: %10.0f records/s  (%.2f of raw produce, %.2f of raw pass-through; "
            "%.2f CPU us/record; %lld checkpoints)\n",
            name(g), static_cast<long long>(interval), p.rate, p.rate / raw.produce_rate, p.rate / raw.pass_rate,
            p.cpu_us, static_cast<long long>(p.checkpoints));
        std::fflush(stdout);
      }
    }
  }
  if (o.only.empty() || o.only == "latency") {
    std::vector<std::pair<DeliveryGuarantee, int64_t>> runs;
    for (int64_t interval : o.intervals)
      runs.emplace_back(DeliveryGuarantee::kExactlyOnce, interval);
    runs.emplace_back(DeliveryGuarantee::kAtLeastOnce, *std::min_element(o.intervals.begin(), o.intervals.end()));
    if (o.source == "raw") runs.resize(1);  // no job: one run
    for (const auto& [g, interval] : runs) {
      Latency l = bench_latency(o, g, interval);
      std::printf(
          "latency  %-13s checkpoint %5lld ms at %.0f records/s: p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms "
          "(%lld records after warm-up)\n",
          o.source == "raw" ? "raw (no job)" : name(g), static_cast<long long>(interval), o.rate, l.p50_ms, l.p99_ms,
          l.max_ms, static_cast<long long>(l.records));
      std::fflush(stdout);
    }
  }
  return 0;
}
