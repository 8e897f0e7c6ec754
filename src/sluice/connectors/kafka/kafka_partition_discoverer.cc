// The librdkafka KafkaPartitionDiscoverer: topic metadata and ListOffsets / committed-offset lookups for the
// enumerator.
#include "sluice/connectors/kafka/kafka_partition_discoverer.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "kafka_source_internals.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {

using kafka::KafkaClientPtr;
using kafka::KafkaPartitionListPtr;
using kafka_source_internal::consumer_properties;
using kafka_source_internal::kRole;

namespace detail {

namespace {

class RdKafkaDiscoverer final : public KafkaPartitionDiscoverer {
 public:
  RdKafkaDiscoverer(const KafkaSourceSettings& s, std::unique_ptr<kafka::KafkaPermanentErrorCapture> errors,
                    KafkaClientPtr client)
      : settings_(s), errors_(std::move(errors)), client_(std::move(client)) {
    if (!s.topic_pattern.empty()) pattern_.emplace(s.topic_pattern, std::regex::ECMAScript);
  }

  Result<std::vector<KafkaTopicPartition>> discover(std::chrono::milliseconds timeout) override {
    const std::vector<std::string> wanted = pattern_ ? std::vector<std::string>{} : settings_.topics;
    Result<std::vector<kafka::KafkaTopicInfo>> md = kafka::fetch_topic_metadata(
        client_.get(), wanted, timeout, settings_.bootstrap_servers(), [this] { return errors_->get(); });
    if (!md.ok()) return md.error().with_context(kRole);
    std::vector<KafkaTopicPartition> out;
    for (const kafka::KafkaTopicInfo& t : *md) {
      if (pattern_) {
        if (t.name.starts_with("__") || !std::regex_match(t.name, *pattern_)) continue;
        if (t.partitions == 0) continue;  // being created or not visible; the next round sees it
      } else if (t.error == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
        return Error(ErrorCode::kConnector,
                     fmt::format("{}: topic '{}' does not exist in the Kafka cluster at '{}': create it (a source "
                                 "does not create topics) or fix its name",
                                 kRole, t.name, settings_.bootstrap_servers()));
      } else if (t.partitions == 0) {
        return kafka::kafka_error(ErrorCode::kConnector, fmt::format("{}: topic '{}' is not available", kRole, t.name),
                                  t.error);
      }
      if (t.error == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) {
        return mark_non_recoverable(
            kafka::kafka_error(ErrorCode::kConnector,
                               fmt::format("{}: not authorized to read topic '{}'", kRole, t.name), t.error),
            "the broker refused the source's permissions on the topic");
      }
      for (int32_t i = 0; i < t.partitions; ++i)
        out.push_back(KafkaTopicPartition{t.name, i});
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  Result<std::vector<KafkaPartitionSplit>> make_splits(const std::vector<KafkaTopicPartition>& partitions,
                                                       const KafkaStartingOffsets& starting, bool bounded,
                                                       std::chrono::milliseconds timeout) override {
    std::vector<KafkaPartitionSplit> splits;
    splits.reserve(partitions.size());
    for (const KafkaTopicPartition& tp : partitions)
      splits.push_back(KafkaPartitionSplit{tp.topic, tp.partition, 0, std::nullopt, false});
    std::vector<size_t> all(splits.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = i;
    std::vector<size_t> to_reset;
    switch (starting.kind()) {
      case KafkaStartingOffsets::Kind::kEarliest:
        SLUICE_RETURN_IF_ERROR(list_offsets(splits, all, kEarliestTs, timeout, false));
        break;
      case KafkaStartingOffsets::Kind::kLatest:
        SLUICE_RETURN_IF_ERROR(list_offsets(splits, all, kLatestTs, timeout, false));
        break;
      case KafkaStartingOffsets::Kind::kTimestamp: {
        SLUICE_RETURN_IF_ERROR(list_offsets(splits, all, starting.timestamp_ms(), timeout, false));
        std::vector<size_t> none;  // no record that recent: latest
        for (size_t i : all) {
          if (splits[i].starting_offset < 0) none.push_back(i);
        }
        SLUICE_RETURN_IF_ERROR(list_offsets(splits, none, kLatestTs, timeout, false));
        break;
      }
      case KafkaStartingOffsets::Kind::kCommitted:
        SLUICE_RETURN_IF_ERROR(committed_offsets(splits, timeout, to_reset));
        break;
      case KafkaStartingOffsets::Kind::kSpecific:
        for (size_t i : all) {
          auto it = starting.specific_offsets().find(splits[i].topic_partition());
          if (it == starting.specific_offsets().end() || it->second < 0) {
            to_reset.push_back(i);
          } else {
            splits[i].starting_offset = it->second;
          }
        }
        break;
    }
    if (!to_reset.empty()) {
      switch (starting.reset()) {
        case KafkaOffsetReset::kEarliest:
          SLUICE_RETURN_IF_ERROR(list_offsets(splits, to_reset, kEarliestTs, timeout, false));
          break;
        case KafkaOffsetReset::kLatest:
          SLUICE_RETURN_IF_ERROR(list_offsets(splits, to_reset, kLatestTs, timeout, false));
          break;
        case KafkaOffsetReset::kNone: {
          const KafkaPartitionSplit& s = splits[to_reset.front()];
          return Error(
              ErrorCode::kConnector,
              fmt::format("{}: no {} offset for topic '{}' partition {}{} and the reset strategy is "
                          "'none'; choose KafkaOffsetReset::kEarliest or kLatest",
                          kRole, starting.kind() == KafkaStartingOffsets::Kind::kCommitted ? "committed" : "explicit",
                          s.topic, s.partition,
                          settings_.group_id().empty() ? "" : " in group '" + settings_.group_id() + "'"));
        }
      }
    }
    if (bounded) SLUICE_RETURN_IF_ERROR(list_offsets(splits, all, kLatestTs, timeout, true));
    return splits;
  }

 private:
  // ListOffsets' special timestamps.
  static constexpr int64_t kLatestTs = -1;
  static constexpr int64_t kEarliestTs = -2;

  // Sets the starting (or, with `stopping`, the stopping) offset of splits[idx...] from a ListOffsets query
  // by `timestamp` (kLatestTs, kEarliestTs or ms). librdkafka sends the client's isolation level, so
  // "latest" is the last stable offset under read_committed.
  // Retries transient failures (a leader being elected, a coordinator loading) until `timeout` passed.
  Status list_offsets(std::vector<KafkaPartitionSplit>& splits, const std::vector<size_t>& idx, int64_t timestamp,
                      std::chrono::milliseconds timeout, bool stopping) {
    if (idx.empty()) return ok_status();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
      Status st = list_offsets_once(splits, idx, timestamp, remaining(deadline), stopping, err);
      if (st.ok() || !retry(err, deadline)) return st;
    }
  }

  Status list_offsets_once(std::vector<KafkaPartitionSplit>& splits, const std::vector<size_t>& idx, int64_t timestamp,
                           std::chrono::milliseconds timeout, bool stopping, rd_kafka_resp_err_t& failure) {
    KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(idx.size())));
    for (size_t i : idx)
      rd_kafka_topic_partition_list_add(list.get(), splits[i].topic.c_str(), splits[i].partition)->offset = timestamp;
    const rd_kafka_resp_err_t err =
        rd_kafka_offsets_for_times(client_.get(), list.get(), static_cast<int>(timeout.count()));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failure = err;
      return kafka::kafka_error(ErrorCode::kConnector,
                                fmt::format("{}: looking up offsets in the Kafka cluster at '{}' failed", kRole,
                                            settings_.bootstrap_servers()),
                                err);
    }
    for (size_t i : idx) {
      const rd_kafka_topic_partition_t* r =
          rd_kafka_topic_partition_list_find(list.get(), splits[i].topic.c_str(), splits[i].partition);
      if (r == nullptr || r->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        failure = r == nullptr ? RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION : r->err;
        return kafka::kafka_error(ErrorCode::kConnector,
                                  fmt::format("{}: looking up the offsets of topic '{}' partition {} failed", kRole,
                                              splits[i].topic, splits[i].partition),
                                  r == nullptr ? RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION : r->err);
      }
      if (stopping) {
        splits[i].stopping_offset = r->offset;
      } else {
        splits[i].starting_offset = r->offset;
      }
    }
    return ok_status();
  }

  // The group's committed offsets; partitions without one go to `to_reset`.
  Status committed_offsets(std::vector<KafkaPartitionSplit>& splits, std::chrono::milliseconds timeout,
                           std::vector<size_t>& to_reset) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
      to_reset.clear();
      Status st = committed_offsets_once(splits, remaining(deadline), to_reset, err);
      if (st.ok() || !retry(err, deadline)) return st;
    }
  }

  Status committed_offsets_once(std::vector<KafkaPartitionSplit>& splits, std::chrono::milliseconds timeout,
                                std::vector<size_t>& to_reset, rd_kafka_resp_err_t& failure) {
    KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(splits.size())));
    for (const KafkaPartitionSplit& s : splits)
      rd_kafka_topic_partition_list_add(list.get(), s.topic.c_str(), s.partition);
    const rd_kafka_resp_err_t err = rd_kafka_committed(client_.get(), list.get(), static_cast<int>(timeout.count()));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failure = err;
      return kafka::kafka_error(
          ErrorCode::kConnector,
          fmt::format("{}: reading the committed offsets of group '{}' failed", kRole, settings_.group_id()), err);
    }
    for (size_t i = 0; i < splits.size(); ++i) {
      const rd_kafka_topic_partition_t* r =
          rd_kafka_topic_partition_list_find(list.get(), splits[i].topic.c_str(), splits[i].partition);
      if (r != nullptr && r->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        failure = r->err;
        return kafka::kafka_error(ErrorCode::kConnector,
                                  fmt::format("{}: reading the committed offset of topic '{}' partition {} failed",
                                              kRole, splits[i].topic, splits[i].partition),
                                  r->err);
      }
      if (r == nullptr || r->offset < 0) {
        to_reset.push_back(i);
      } else {
        splits[i].starting_offset = r->offset;
      }
    }
    return ok_status();
  }

  static std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(100),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  }
  // After a failed attempt with `err`: waits a little and returns true when a retry makes sense.
  static bool retry(rd_kafka_resp_err_t err, std::chrono::steady_clock::time_point deadline) {
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR || kafka::is_permanent_kafka_error(err)) return false;
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return true;
  }

  KafkaSourceSettings settings_;
  std::unique_ptr<kafka::KafkaPermanentErrorCapture> errors_;  // the client's opaque: outlives it
  KafkaClientPtr client_;
  std::optional<std::regex> pattern_;
};

}  // namespace

Result<std::unique_ptr<KafkaPartitionDiscoverer>> make_kafka_discoverer(const KafkaSourceSettings& settings) {
  Result<kafka::KafkaConfPtr> conf =
      kafka::make_kafka_conf(consumer_properties(settings, settings.client_id_prefix + "-enumerator"), kRole);
  if (!conf.ok()) return conf.error();
  // A wrong password or certificate shows only as "brokers down" to rd_kafka_metadata: the error callback names it,
  // so that the job fails at once instead of after startup.timeout.ms.
  auto errors = std::make_unique<kafka::KafkaPermanentErrorCapture>();
  errors->install(conf->get());
  SLUICE_ASSIGN_OR_RETURN(KafkaClientPtr client,
                          kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf).value(), kRole));
  return std::unique_ptr<KafkaPartitionDiscoverer>(
      std::make_unique<RdKafkaDiscoverer>(settings, std::move(errors), std::move(client)));
}

}  // namespace detail

}  // namespace sluice
