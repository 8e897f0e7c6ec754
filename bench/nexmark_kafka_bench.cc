// Nexmark query 1 from Kafka to Kafka on Sluice (see nexmark_kafka_bench.h for what is written and measured).
#include "nexmark_kafka_bench.h"

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <simdjson.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kafka_admin.h"
#include "nexmark/generator.h"
#include "nexmark/model.h"
#include "nexmark/queries.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/kafka/kafka_source.h"
#include "sluice/core/value.h"

namespace sluice::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nexmark::Bid;
using nexmark::Q1Result;

/// Appends the exact decimal `e3 / 1000` with three decimals (1120472 -> "1120.472", 908000 -> "908.000").
void append_e3(int64_t e3, std::string& out) {
  const uint64_t magnitude = e3 < 0 ? 0 - static_cast<uint64_t>(e3) : static_cast<uint64_t>(e3);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", e3 < 0 ? "-" : "", magnitude / 1000, magnitude % 1000);
}

/// Appends a bid as the input topic's JSON value.
void append_bid_json(const Bid& b, std::string& out) {
  fmt::format_to(std::back_inserter(out), R"({{"auction":{},"bidder":{},"price":{},"channel":)", b.auction, b.bidder,
                 b.price);
  append_json_string(b.channel, out);
  out += R"(,"url":)";
  append_json_string(b.url, out);
  fmt::format_to(std::back_inserter(out), R"(,"dateTime":{},"extra":)", b.date_time);
  append_json_string(b.extra, out);
  out += '}';
}

/// Appends a query 1 row as the output topic's JSON value (the price as the exact DECIMAL(23, 3)).
void append_q1_json(const Q1Result& r, std::string& out) {
  fmt::format_to(std::back_inserter(out), R"({{"auction":{},"bidder":{},"price":)", r.auction, r.bidder);
  append_e3(r.price_e3, out);
  fmt::format_to(std::back_inserter(out), R"(,"dateTime":{},"extra":)", r.date_time);
  append_json_string(r.extra, out);
  out += '}';
}

/// Reads a bid from its JSON value with simdjson's on-demand API straight into the struct (no intermediate
/// document tree, unlike kafka::json_value<Bid>(), which builds a Value first). Fields may come in any order;
/// unknown ones are skipped; a missing or mistyped one makes the message a bad record. simdjson reads up to
/// SIMDJSON_PADDING bytes past the end, which a message's buffer does not promise, so the value is copied into
/// a padded buffer first. Each copy of the functor (one per reader subtask) has its own parser and buffer.
class BidJsonDeserializer {
 public:
  BidJsonDeserializer() : state_(std::make_unique<State>()) {}
  BidJsonDeserializer(const BidJsonDeserializer&) : state_(std::make_unique<State>()) {}
  BidJsonDeserializer(BidJsonDeserializer&&) noexcept = default;
  BidJsonDeserializer& operator=(const BidJsonDeserializer&) = delete;
  BidJsonDeserializer& operator=(BidJsonDeserializer&&) noexcept = default;
  ~BidJsonDeserializer() = default;

  Status operator()(const KafkaMessageView& m, Bid& out) const {
    namespace od = simdjson::ondemand;
    if (!m.value) return Error(ErrorCode::kSerialization, "the value is null, expected a bid as JSON");
    const std::string_view json = *m.value;
    std::string& buf = state_->buffer;
    if (buf.size() < json.size() + simdjson::SIMDJSON_PADDING) buf.resize(json.size() + simdjson::SIMDJSON_PADDING);
    std::memcpy(buf.data(), json.data(), json.size());
    auto fail = [](simdjson::error_code e, std::string_view where) {
      return Error(ErrorCode::kSerialization, fmt::format("bid JSON, {}: {}", where, simdjson::error_message(e)));
    };
    od::document doc;
    if (auto e = state_->parser.iterate(buf.data(), json.size(), buf.size()).get(doc)) return fail(e, "document");
    od::object object;
    if (auto e = doc.get_object().get(object)) return fail(e, "expected an object");
    unsigned seen = 0;
    for (auto member : object) {
      od::field field;
      if (auto e = std::move(member).get(field)) return fail(e, "member");
      std::string_view key;
      if (auto e = field.unescaped_key().get(key)) return fail(e, "key");
      od::value v = field.value();
      simdjson::error_code e = simdjson::SUCCESS;
      std::string_view text;
      if (key == "auction") {
        e = v.get_int64().get(out.auction);
        seen |= 1U;
      } else if (key == "bidder") {
        e = v.get_int64().get(out.bidder);
        seen |= 2U;
      } else if (key == "price") {
        e = v.get_int64().get(out.price);
        seen |= 4U;
      } else if (key == "channel") {
        if (!(e = v.get_string().get(text))) out.channel.assign(text);
        seen |= 8U;
      } else if (key == "url") {
        if (!(e = v.get_string().get(text))) out.url.assign(text);
        seen |= 16U;
      } else if (key == "dateTime") {
        e = v.get_int64().get(out.date_time);
        seen |= 32U;
      } else if (key == "extra") {
        if (!(e = v.get_string().get(text))) out.extra.assign(text);
        seen |= 64U;
      }
      if (e) return fail(e, fmt::format("field '{}'", key));
    }
    if (seen != 127U) return Error(ErrorCode::kSerialization, "bid JSON: a field is missing");
    return ok_status();
  }

 private:
  struct State {
    simdjson::ondemand::parser parser;
    std::string buffer;
  };
  std::unique_ptr<State> state_;
};

/// Bid -> query 1 row; moves the padding out of a bid the runtime hands over as an rvalue.
struct ToQ1 {
  Q1Result operator()(Bid&& b) const {
    return Q1Result{b.auction, b.bidder, b.price * nexmark::kDollarToEuroE3, b.date_time, std::move(b.extra)};
  }
  Q1Result operator()(const Bid& b) const {
    return Q1Result{b.auction, b.bidder, b.price * nexmark::kDollarToEuroE3, b.date_time, b.extra};
  }
};

std::string unique_suffix() {
  return fmt::format("{}-{}", ::getpid(), std::chrono::system_clock::now().time_since_epoch().count());
}

std::string bootstrap_of(const NexmarkKafkaOptions& o) {
  if (!o.bootstrap.empty()) return o.bootstrap;
  const char* env = std::getenv("KAFKA_BOOTSTRAP_SERVERS");
  return env != nullptr ? env : "";
}

int fail(const std::string& what) {
  fmt::print(stderr, "error: {}\n", what);
  return 1;
}

struct DeliveryStats {
  std::atomic<int64_t> failed{0};
  std::atomic<int> first_error{RD_KAFKA_RESP_ERR_NO_ERROR};
};

void on_delivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
  auto* stats = static_cast<DeliveryStats*>(opaque);
  int none = RD_KAFKA_RESP_ERR_NO_ERROR;
  stats->first_error.compare_exchange_strong(none, m->err);
  stats->failed.fetch_add(1);
}

}  // namespace

int run_nexmark_kafka_fill(const NexmarkKafkaOptions& o) {
  const std::string bootstrap = bootstrap_of(o);
  if (bootstrap.empty()) return fail("no broker: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS");
  DeliveryStats stats;
  std::string error;
  // Large batches and a long linger: this is bulk loading, and the broker is local.
  auto producer = make_client(RD_KAFKA_PRODUCER,
                              {{"bootstrap.servers", bootstrap},
                               {"enable.idempotence", "true"},
                               {"acks", "all"},
                               {"linger.ms", "50"},
                               {"batch.size", "1000000"},
                               {"queue.buffering.max.messages", "1000000"},
                               {"queue.buffering.max.kbytes", "1048576"},
                               {"partitioner", "murmur2_random"}},
                              error, [&stats](rd_kafka_conf_t* c) {
                                rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
                                rd_kafka_conf_set_opaque(c, &stats);
                              });
  if (producer == nullptr) return fail(error);
  rd_kafka_t* rk = producer->rk;
  if (Status s = ensure_topic(rk, o.topic, o.partitions); !s.ok()) return fail(s.error().to_string());
  Result<int> partitions = partition_count(rk, o.topic);
  if (!partitions.ok()) return fail(partitions.error().to_string());
  if (*partitions != o.partitions)
    return fail(fmt::format("topic {} exists with {} partitions, not {}", o.topic, *partitions, o.partitions));

  nexmark::NexmarkConfig config;
  // Enough events to hold --events bids (46 of every 50 events are bids); only validate() reads it.
  config.events = o.events / config.bid_proportion * config.total_proportion() + config.total_proportion();
  if (Status s = config.validate(); !s.ok()) return fail(s.error().to_string());
  const nexmark::NexmarkGenerator generator(config);
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, o.topic.c_str(), nullptr);

  const auto start = Clock::now();
  nexmark::Event event;
  std::string key;
  std::string value;
  int64_t bytes = 0;
  int64_t written = 0;
  for (int64_t n = 0; written < o.events; ++n) {
    if (generator.type_of(n) != nexmark::EventType::kBid) continue;
    generator.event_into(n, event);
    const Bid& bid = event.bid();
    key.clear();
    fmt::format_to(std::back_inserter(key), "{}", bid.auction);
    value.clear();
    append_bid_json(bid, value);
    while (true) {
      const rd_kafka_resp_err_t e = rd_kafka_producev(rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_KEY(key.data(), key.size()),
                                                      RD_KAFKA_V_VALUE(value.data(), value.size()),
                                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
      if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) return fail(fmt::format("produce: {}", rd_kafka_err2str(e)));
      rd_kafka_poll(rk, 100);  // serves delivery reports, which frees queue space
    }
    bytes += static_cast<int64_t>(key.size() + value.size());
    ++written;
    if ((written & 4095) == 0) rd_kafka_poll(rk, 0);
  }
  const rd_kafka_resp_err_t flushed = rd_kafka_flush(rk, 600'000);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  rd_kafka_topic_destroy(rkt);
  if (flushed != RD_KAFKA_RESP_ERR_NO_ERROR) return fail(fmt::format("flush: {}", rd_kafka_err2str(flushed)));
  if (stats.failed.load() > 0) {
    return fail(fmt::format("{} records were not delivered: {}", stats.failed.load(),
                            rd_kafka_err2str(static_cast<rd_kafka_resp_err_t>(stats.first_error.load()))));
  }
  Result<int64_t> in_topic = record_count(rk, o.topic, o.partitions);
  if (!in_topic.ok()) return fail(in_topic.error().to_string());
  const std::string line = fmt::format(
      "{{\"benchmark\":\"nexmark-kafka-fill\",\"topic\":\"{}\",\"partitions\":{},\"records\":{},\"bytes\":{},"
      "\"seconds\":{:.3f},\"records_per_second\":{:.0f},\"topic_records\":{}}}",
      o.topic, o.partitions, written, bytes, seconds, static_cast<double>(written) / seconds, *in_topic);
  if (o.format == "json") {
    fmt::print("{}\n", line);
  } else {
    fmt::print(
        "nexmark-kafka-fill: {} bids, {} bytes (keys + values) into {} ({} partitions) in {:.1f} s, {:.0f}/s; "
        "the topic holds {} records\n",
        written, bytes, o.topic, o.partitions, seconds, static_cast<double>(written) / seconds, *in_topic);
  }
  return 0;
}

int run_nexmark_kafka_q1(const NexmarkKafkaOptions& o) {
  const std::string bootstrap = bootstrap_of(o);
  if (bootstrap.empty()) return fail("no broker: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS");
  std::string error;
  // Admin work before the clock starts: the input's size, and the output topic with the input's partitions.
  auto admin = make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}}, error);
  if (admin == nullptr) return fail(error);
  Result<int> partitions = partition_count(admin->rk, o.input);
  if (!partitions.ok()) return fail(partitions.error().to_string());
  if (*partitions == 0) return fail(fmt::format("input topic {} does not exist", o.input));
  Result<int64_t> records = record_count(admin->rk, o.input, *partitions);
  if (!records.ok()) return fail(records.error().to_string());
  if (Status s = ensure_topic(admin->rk, o.output, *partitions); !s.ok()) return fail(s.error().to_string());

  const auto dir = std::filesystem::temp_directory_path() / ("sluice-nexmark-kafka-q1-" + unique_suffix());
  Configuration config;
  config.set(options::kParallelism, o.parallelism);
  config.set(options::kCheckpointInterval, o.checkpoint_interval_ms);  // ms
  config.set(options::kCheckpointDir, "file://" + dir.string());
  StreamEnvironment env(config);

  auto source = KafkaSource<Bid>::builder()
                    .bootstrap_servers(bootstrap)
                    .topics({o.input})
                    .group_id("sluice-nexmark-q1-" + unique_suffix())
                    .starting_offsets(KafkaStartingOffsets::earliest())
                    .bounded()
                    .deserializer(BidJsonDeserializer())
                    .build();
  auto sink = KafkaSink<Q1Result>::builder()
                  .bootstrap_servers(bootstrap)
                  .topic(o.output)
                  .delivery_guarantee(DeliveryGuarantee::kAtLeastOnce)
                  .record_serializer([](const Q1Result& r, KafkaProducerRecord& out) {
                    fmt::format_to(std::back_inserter(out.mutable_key()), "{}", r.auction);
                    append_q1_json(r, out.mutable_value());
                  })
                  .build();
  env.from_source(source, "Kafka bids")
      .uid("kafka-source")
      .map(ToQ1{})
      .name("Q1 currency conversion")
      .uid("q1")
      .sink_to(sink, "Kafka Q1")
      .uid("kafka-sink");

  const double cpu0 = cpu_seconds();
  const auto start = Clock::now();
  JobResult result = env.execute("nexmark-kafka-q1");
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu0;
  const double rss = peak_rss_mib();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!result.ok()) {
    return fail(fmt::format("job {}: {}", job_status_name(result.status),
                            result.error ? result.error->to_string() : "no error recorded"));
  }
  Result<int64_t> output_records = record_count(admin->rk, o.output, *partitions);
  if (!output_records.ok()) return fail(output_records.error().to_string());

  const auto n = static_cast<double>(*records);
  if (o.format == "json") {
    fmt::print(
        "{{\"benchmark\":\"nexmark-kafka-q1\",\"engine\":\"sluice\",\"records\":{},\"parallelism\":{},"
        "\"checkpoint_interval_ms\":{},\"wall_seconds\":{:.3f},\"cpu_seconds\":{:.3f},\"records_per_second\":{:.0f},"
        "\"cpu_seconds_per_million\":{:.3f},\"peak_rss_mib\":{:.1f},\"output_records\":{},\"checkpoints\":{}}}\n",
        *records, o.parallelism, o.checkpoint_interval_ms, wall, cpu, n / wall, cpu * 1e6 / n, rss, *output_records,
        result.completed_checkpoints);
  } else {
    fmt::print(
        "nexmark-kafka-q1 (sluice): {} records, parallelism {}, checkpoints every {} ms ({} completed): wall {:.3f} s, "
        "{:.0f} records/s, cpu {:.3f} s ({:.3f} s per million), peak RSS {:.1f} MiB, output topic {} records\n",
        *records, o.parallelism, o.checkpoint_interval_ms, result.completed_checkpoints, wall, n / wall, cpu,
        cpu * 1e6 / n, rss, *output_records);
  }
  if (*output_records < *records) {
    return fail(fmt::format("the output topic {} holds {} records, fewer than the {} read", o.output, *output_records,
                            *records));
  }
  return 0;
}

}  // namespace sluice::bench
