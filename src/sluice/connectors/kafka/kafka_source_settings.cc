// KafkaSourceSettings: Sluice's own keys, the checks of KafkaSourceBuilder::try_build(), and the properties of the
// source's consumers.
#include "sluice/connectors/kafka/kafka_source_settings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <optional>
#include <regex>
#include <string>
#include <string_view>

#include "kafka_source_internals.h"
#include "sluice/core/assign_or_return.h"

namespace sluice {

using kafka::KafkaProperties;
using kafka_source_internal::consumer_properties;
using kafka_source_internal::kRole;

namespace {

// The group id the readers' consumers use when the user gave none: librdkafka needs one for
// rd_kafka_assign(); nothing is ever committed to or read from it.
constexpr const char* kNoGroupId = "sluice-kafka-source-no-group";
// The consumer's default queued.min.messages (see normalize_and_validate).
constexpr int kQueuedMinMessages = 1'000'000;

std::optional<std::string> take_property(KafkaProperties& props, const char* key) {
  auto it = props.find(key);
  if (it == props.end()) return std::nullopt;
  std::string v = std::move(it->second);
  props.erase(it);
  return v;
}

Result<int64_t> parse_int(std::string_view key, const std::string& text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: property '{}' = '{}' is not an integer", kRole, key, text));
  }
  return v;
}

}  // namespace

namespace kafka_source_internal {

KafkaProperties consumer_properties(const detail::KafkaSourceSettings& s, const std::string& client_id) {
  KafkaProperties p = s.properties;
  p["enable.auto.commit"] = "false";
  p["enable.auto.offset.store"] = "false";
  p["enable.partition.eof"] = "true";
  if (s.group_id().empty()) p["group.id"] = kNoGroupId;
  if (p.find("client.id") == p.end()) p["client.id"] = client_id;
  return p;
}

}  // namespace kafka_source_internal

namespace detail {

const std::string& KafkaSourceSettings::bootstrap_servers() const {
  static const std::string empty;
  auto it = properties.find("bootstrap.servers");
  return it == properties.end() ? empty : it->second;
}

const std::string& KafkaSourceSettings::group_id() const {
  static const std::string empty;
  auto it = properties.find("group.id");
  return it == properties.end() ? empty : it->second;
}

std::string KafkaSourceSettings::describe_topics() const {
  if (!topic_pattern.empty()) return fmt::format("topic pattern '{}'", topic_pattern);
  return fmt::format("topics [{}]", fmt::join(topics, ", "));
}

Status normalize_and_validate(KafkaSourceSettings& s) {
  KafkaProperties& p = s.properties;
  if (auto v = take_property(p, "partition.discovery.interval.ms")) {
    SLUICE_ASSIGN_OR_RETURN(int64_t ms, parse_int("partition.discovery.interval.ms", *v));
    s.discovery_interval_ms = ms;
  }
  if (auto v = take_property(p, "commit.offsets.on.checkpoint")) {
    if (*v != "true" && *v != "false") {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{}: property 'commit.offsets.on.checkpoint' = '{}' must be true or false", kRole, *v));
    }
    s.commit_offsets_on_checkpoint = *v == "true";
  }
  if (auto v = take_property(p, "client.id.prefix")) s.client_id_prefix = *v;
  if (auto v = take_property(p, "startup.timeout.ms")) {
    SLUICE_ASSIGN_OR_RETURN(int64_t ms, parse_int("startup.timeout.ms", *v));
    s.startup_timeout_ms = ms;
  }
  if (auto v = take_property(p, "liveness.timeout.ms")) {
    SLUICE_ASSIGN_OR_RETURN(int64_t ms, parse_int("liveness.timeout.ms", *v));
    s.liveness_timeout_ms = ms;
  }
  if (s.liveness_timeout_ms < 0) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: the liveness timeout must not be negative, got {} ms", kRole, s.liveness_timeout_ms));
  }
  if (s.bootstrap_servers().empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: no bootstrap servers: call bootstrap_servers(\"host:port,...\")", kRole));
  }
  if (s.topics.empty() == s.topic_pattern.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: set either topics({{...}}) or topic_pattern(regex), exactly one of them", kRole));
  }
  for (const std::string& t : s.topics) {
    if (t.empty()) return Error(ErrorCode::kConfiguration, fmt::format("{}: an empty topic name", kRole));
  }
  if (!s.topic_pattern.empty()) {
    try {
      std::regex re(s.topic_pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{}: invalid topic pattern '{}': {}", kRole, s.topic_pattern, e.what()));
    }
  }
  if (s.starting.kind() == KafkaStartingOffsets::Kind::kCommitted && s.group_id().empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: starting offsets 'committed' need a consumer group: call group_id(\"...\")", kRole));
  }
  if (s.startup_timeout_ms <= 0) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: the startup timeout must be positive, got {} ms", kRole, s.startup_timeout_ms));
  }
  if (s.bad_record_policy == BadRecordPolicy::kDeadLetter && s.dead_letter_path.empty() &&
      s.dead_letter_topic.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: the dead-letter policy needs a dead-letter file or topic: pass "
                             "on_bad_record(BadRecordPolicy::kDeadLetter, path) or call dead_letter_topic(name)",
                             kRole));
  }
  if (s.bad_record_policy != BadRecordPolicy::kDeadLetter && !s.dead_letter_topic.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: a dead-letter topic is set but the bad-record policy is '{}': call "
                             "on_bad_record(BadRecordPolicy::kDeadLetter)",
                             kRole, bad_record_policy_name(s.bad_record_policy)));
  }
  if (p.find("isolation.level") == p.end()) p["isolation.level"] = "read_committed";
  if (p.find("auto.offset.reset") == p.end()) p["auto.offset.reset"] = "earliest";
  // librdkafka stops fetching a partition whose prefetch queue holds queued.min.messages (default 100,000) and
  // looks at it again only about a second later (librdkafka 2.0; later versions make that delay configurable,
  // fetch.queue.backoff.ms). A reader that drains 100,000 small records faster than that waits for the rest of
  // the second: a Kafka -> Kafka pass-through ran at 0.25-0.31 of its speed (docs/benchmarks.md, "Kafka").
  // queued.max.messages.kbytes still bounds the prefetched bytes.
  if (p.find("queued.min.messages") == p.end()) p["queued.min.messages"] = std::to_string(kQueuedMinMessages);
  // librdkafka must accept every property (unknown keys, bad values).
  SLUICE_ASSIGN_OR_RETURN(kafka::KafkaConfPtr conf,
                          kafka::make_kafka_conf(consumer_properties(s, s.client_id_prefix), kRole));
  return ok_status();
}

}  // namespace detail

}  // namespace sluice
