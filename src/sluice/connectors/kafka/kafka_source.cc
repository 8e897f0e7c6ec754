// The non-template glue of KafkaSource<T> (kafka_source.h): what the template reaches of the enumerator and the
// shared counters, which are private to this folder. The parts are in kafka_source_settings.cc,
// kafka_partition_discoverer.cc, kafka_source_enumerator.cc, kafka_reader_core.cc and kafka_source_stats.cc.
#include "sluice/connectors/kafka/kafka_source.h"

#include "kafka_partition_discoverer.h"
#include "kafka_source_enumerator.h"
#include "kafka_source_stats.h"

namespace sluice {

namespace detail {

std::shared_ptr<KafkaSourceStats> make_kafka_source_stats(const KafkaSourceSettings& settings) {
  auto stats = std::make_shared<KafkaSourceStats>();
  stats->connections = std::make_shared<SourceConnectionBoard>("Kafka source (" + settings.describe_topics() + ")");
  return stats;
}

const std::shared_ptr<BadRecordStats>& kafka_bad_record_stats(const KafkaSourceStats& stats) noexcept {
  return stats.bad;
}

KafkaSourceMetrics kafka_source_metrics(const KafkaSourceStats& stats) {
  return stats.metrics();
}

std::vector<SourceConnection> kafka_source_connections(const KafkaSourceStats& stats) {
  return stats.connections->snapshot(SourceConnectionBoard::steady_now_ms());
}

std::unique_ptr<SplitEnumerator<KafkaPartitionSplit>> make_kafka_source_enumerator(
    SplitEnumeratorContext<KafkaPartitionSplit>& ctx, const KafkaSourceSettings& settings) {
  KafkaSourceEnumerator::Options o;
  o.bounded = settings.bounded;
  o.discovery_interval_ms = settings.discovery_interval_ms;
  o.startup_timeout = std::chrono::milliseconds(settings.startup_timeout_ms);
  o.starting = settings.starting;
  o.description = settings.describe_topics();
  return std::make_unique<KafkaSourceEnumerator>(ctx, make_kafka_discoverer(settings).value_or_throw(), std::move(o));
}

}  // namespace detail

}  // namespace sluice
