// The Kafka sink's settings: their checks (validate_settings), the transaction timeout and its warning at start,
// max_commit_delay_from a job configuration, and the librdkafka properties of its producers and marker consumers.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iterator>

#include "kafka_sink_internals.h"
#include "sluice/api/operator.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/assign_or_return.h"

namespace sluice {
namespace kafka_sink_internal {

using detail::transaction_timeout_ms;

// The librdkafka properties of a sink producer: the sink's defaults, the user's properties, then the ones the
// sink manages.
kafka::KafkaProperties producer_properties(const KafkaSinkSettings& settings, const std::string& transactional_id) {
  kafka::KafkaProperties props{{"partitioner", "murmur2_random"}, {"enable.idempotence", "true"}, {"acks", "all"}};
  if (!settings.bootstrap_servers.empty()) props["bootstrap.servers"] = settings.bootstrap_servers;
  if (!transactional_id.empty()) props["transaction.timeout.ms"] = std::to_string(transaction_timeout_ms(settings));
  for (const auto& [k, v] : settings.properties)
    props[k] = v;
  if (!transactional_id.empty()) props["transactional.id"] = transactional_id;
  return props;
}

// The connection and security settings among the sink's client properties (a consumer of a marker group needs
// them; the producer's own settings would only draw librdkafka's "producer property ignored" warnings).
kafka::KafkaProperties marker_consumer_properties(const KafkaSinkSettings& settings) {
  static constexpr std::string_view kPrefixes[] = {"security.",
                                                   "ssl",
                                                   "sasl.",
                                                   "enable.ssl",
                                                   "enable.sasl",
                                                   "socket.",
                                                   "broker.",
                                                   "client.",
                                                   "metadata.",
                                                   "reconnect.",
                                                   "api.version",
                                                   "connections.max.idle",
                                                   "topic.metadata",
                                                   "retry.backoff",
                                                   "resolve.canonical",
                                                   "log."};
  kafka::KafkaProperties props{{"enable.auto.commit", "false"}, {"enable.auto.offset.store", "false"}};
  if (!settings.bootstrap_servers.empty()) props["bootstrap.servers"] = settings.bootstrap_servers;
  for (const auto& [k, v] : settings.properties) {
    const bool connection = std::any_of(std::begin(kPrefixes), std::end(kPrefixes),
                                        [&](std::string_view prefix) { return k.starts_with(prefix); });
    if (connection || k == "bootstrap.servers" || k == "debug") props[k] = v;
  }
  return props;
}

}  // namespace kafka_sink_internal

namespace detail {

using kafka_sink_internal::describe;

namespace {

bool is_false(const std::string& v) {
  std::string t;
  for (char c : v)
    t.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return t == "false" || t == "0";
}

}  // namespace

int64_t transaction_timeout_ms(const KafkaSinkSettings& settings) {
  auto it = settings.properties.find("transaction.timeout.ms");
  if (it != settings.properties.end()) {
    char* end = nullptr;
    long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && v > 0) return v;
  }
  return kDefaultTransactionTimeoutMs;
}

Status validate_settings(const KafkaSinkSettings& settings) {
  auto config_error = [](std::string m) { return Error(ErrorCode::kConfiguration, "KafkaSink: " + std::move(m)); };
  if (settings.bootstrap_servers.empty() && !settings.properties.contains("bootstrap.servers")) {
    return config_error("bootstrap_servers() is required");
  }
  if (settings.properties.contains("transactional.id")) {
    return config_error(
        "do not set transactional.id: the sink manages it (set transactional_id_prefix() for exactly-once)");
  }
  if (settings.operation_timeout_ms <= 0) return config_error("operation_timeout must be positive");
  if (settings.liveness_timeout_ms < 0) return config_error("liveness_timeout must not be negative");
  if (settings.max_transaction_bytes <= 0) return config_error("max_transaction_bytes must be positive");
  if (settings.on_bad_record == BadRecordPolicy::kDeadLetter && settings.dead_letter_path.empty()) {
    return config_error("on_bad_record(kDeadLetter) needs a dead-letter path");
  }
  if (settings.guarantee == DeliveryGuarantee::kExactlyOnce) {
    if (settings.transactional_id_prefix.empty()) {
      return config_error(
          "exactly-once needs transactional_id_prefix(): a name unique to this job and stable across its restarts");
    }
    if (settings.pool_size < 2) {
      return config_error("producer_pool_size must be at least 2 (one open and one pre-committed transaction), not " +
                          std::to_string(settings.pool_size));
    }
    auto idem = settings.properties.find("enable.idempotence");
    if (idem != settings.properties.end() && is_false(idem->second)) {
      return config_error("exactly-once needs enable.idempotence=true (transactions are idempotent)");
    }
  }
  SLUICE_ASSIGN_OR_RETURN(kafka::KafkaConfPtr conf, kafka::make_kafka_conf(settings.properties, "KafkaSink"));
  return ok_status();
}

std::optional<std::string> transaction_timeout_warning(const KafkaSinkSettings& settings) {
  if (settings.guarantee != DeliveryGuarantee::kExactlyOnce || !settings.max_commit_delay_ms) return std::nullopt;
  const int64_t timeout = transaction_timeout_ms(settings);
  const int64_t delay = *settings.max_commit_delay_ms;
  if (timeout >= 2 * delay) return std::nullopt;
  return "KafkaSink: transaction.timeout.ms (" + std::to_string(timeout) +
         " ms) is not well above the checkpoint interval plus the longest restart (" + std::to_string(delay) +
         " ms; want at least twice that): the broker may abort pre-committed transactions, which then costs a "
         "task restart and a re-publication from the checkpoint's copy. Raise transaction.timeout.ms (and the "
         "broker's transaction.max.timeout.ms) or lower the checkpoint interval / restart delays.";
}

int64_t max_commit_delay_from(const Configuration& job_config) {
  const int64_t interval = job_config.get(options::kCheckpointInterval);
  std::string strategy = job_config.get(options::kRestartStrategy);
  if (strategy.empty()) strategy = interval > 0 ? "exponential-delay" : "none";
  int64_t restart = 0;
  if (strategy == "fixed-delay") {
    restart = job_config.get(options::kFixedDelayDelay);
  } else if (strategy == "failure-rate") {
    restart = job_config.get(options::kFailureRateDelay);
  } else if (strategy == "exponential-delay") {
    const double jitter = job_config.get(options::kExpDelayJitter);
    restart = static_cast<int64_t>(static_cast<double>(job_config.get(options::kExpDelayMaxBackoff)) * (1.0 + jitter));
  }
  return interval + restart;
}

void log_start_warnings(const KafkaSinkSettings& settings, RuntimeContext& ctx) {
  if (ctx.subtask_index() != 0 || ctx.attempt_number() != 0) return;
  if (settings.guarantee != DeliveryGuarantee::kExactlyOnce) return;
  if (!ctx.is_checkpointing_enabled()) {
    spdlog::warn(
        "{}: exactly-once needs checkpointing (execution.checkpointing.interval); without it the sink "
        "runs at-least-once",
        describe(ctx));
    return;
  }
  if (std::optional<std::string> w = transaction_timeout_warning(settings)) {
    spdlog::warn("{}: {}", describe(ctx), *w);
  } else if (!settings.max_commit_delay_ms) {
    spdlog::info(
        "{}: transaction.timeout.ms is {} ms; give the sink max_commit_delay() or max_commit_delay_from(job "
        "configuration) to have it checked against the checkpoint interval plus the longest restart (pipelines "
        "do this from pipeline.checkpoint.interval and pipeline.restart)",
        describe(ctx), transaction_timeout_ms(settings));
  }
}

}  // namespace detail
}  // namespace sluice
