// `sluice-bench nexmark-kafka-fill` and `sluice-bench nexmark-kafka-q1`: Nexmark query 1 from Kafka to Kafka,
// the Sluice half of a side-by-side run with Apache Flink (bench/compare/flink, io.sluice.compare.kafka).
//
//   fill  writes the bids among Nexmark events 0, 1, ... (NexmarkGenerator, default config) until --events bids,
//         as JSON values {"auction":..,"bidder":..,"price":..,"channel":"..","url":"..","dateTime":..,"extra":".."}
//         keyed by the auction id as decimal text, into --topic (created with --partitions when missing), with an
//         idempotent librdkafka producer and the Java client's partitioner (murmur2 of the key), so a key's
//         partition is the same for every engine. Preparation, not measured beyond a records/s line.
//   q1    a Sluice job on the local mini-cluster: bounded KafkaSource of --input (earliest to the end offsets seen
//         at start, read_committed) -> JSON to Bid (simdjson on-demand) -> Q1Result (price_e3 = 908 * price) ->
//         JSON -> KafkaSink at-least-once into --output keyed by auction, checkpoints every
//         --checkpoint-interval-ms. Prints wall seconds from job start to FINISHED, process CPU seconds
//         (getrusage, every thread), peak RSS (ru_maxrss) and the output topic's record count.
//
// The output value of one bid is {"auction":A,"bidder":B,"price":E,"dateTime":T,"extra":"X"} where E is the
// exact euro amount 908 * price / 1000 written with exactly three decimals (price 1234 -> 1120.472, price 1000 ->
// 908.000): the DECIMAL(23, 3) value of query 1. The Flink side writes the same text (BigDecimal with scale 3).
#pragma once

#include <cstdint>
#include <string>

namespace sluice::bench {

struct NexmarkKafkaOptions {
  std::string bootstrap;  ///< default: $KAFKA_BOOTSTRAP_SERVERS
  // fill
  std::string topic;
  int64_t events = 10'000'000;  ///< bids to write
  int partitions = 2;
  // q1
  std::string input;
  std::string output;  ///< created with the input's partition count when missing
  int parallelism = 2;
  int64_t checkpoint_interval_ms = 10'000;
  std::string format = "text";  ///< text or json
};

/// Writes the bids into `topic`; returns the process exit code.
int run_nexmark_kafka_fill(const NexmarkKafkaOptions& options);

/// Runs query 1 from `input` to `output` and prints its figures; returns the process exit code (1 when the job
/// fails or the output topic holds fewer records than were read).
int run_nexmark_kafka_q1(const NexmarkKafkaOptions& options);

}  // namespace sluice::bench
