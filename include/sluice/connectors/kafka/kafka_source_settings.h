// What a KafkaSource (kafka_source.h) is configured with: filled by KafkaSourceBuilder<T>, checked by
// normalize_and_validate (kafka_source_settings.cc). Public only because the templates hold it; not for users to
// build by hand. A value type, thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_starting_offsets.h"
#include "sluice/core/error.h"

namespace sluice {

namespace detail {

/// Everything a KafkaSource is configured with, validated by KafkaSourceBuilder::try_build().
struct KafkaSourceSettings {
  /// librdkafka properties (bootstrap.servers and group.id included; Sluice's own keys removed).
  kafka::KafkaProperties properties;
  std::vector<std::string> topics;
  std::string topic_pattern;
  KafkaStartingOffsets starting = KafkaStartingOffsets::earliest();
  bool bounded = false;
  int64_t discovery_interval_ms = 30'000;
  bool commit_offsets_on_checkpoint = true;
  std::string client_id_prefix = "sluice-kafka-source";
  int64_t startup_timeout_ms = 30'000;
  int64_t liveness_timeout_ms = 30'000;  ///< no broker answered for this long: the reader fails; 0 = off
  BadRecordPolicy bad_record_policy = BadRecordPolicy::kFail;
  std::string dead_letter_path;
  std::string dead_letter_topic;

  const std::string& bootstrap_servers() const;
  /// The user's group id ("" when none).
  const std::string& group_id() const;
  /// "topics [a, b]" or "topic pattern 'x.*'" (for messages).
  std::string describe_topics() const;
};

/// Applies Sluice's own keys, checks the settings and that librdkafka accepts the properties.
/// Errors: kConfiguration saying what is missing or wrong and how to fix it.
[[nodiscard]] Status normalize_and_validate(KafkaSourceSettings& settings);

}  // namespace detail

}  // namespace sluice
