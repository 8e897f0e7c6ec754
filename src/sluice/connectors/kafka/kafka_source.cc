#include "sluice/connectors/kafka/kafka_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <regex>
#include <thread>
#include <tuple>

#include "sluice/core/clock.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/utf8.h"
#include "sluice/core/value.h"

namespace sluice {

using kafka::KafkaClientPtr;
using kafka::KafkaPartitionListPtr;
using kafka::KafkaProperties;

namespace {

constexpr const char* kRole = "Kafka source";
// The group id the readers' consumers use when the user gave none: librdkafka needs one for
// rd_kafka_assign(); nothing is ever committed to or read from it.
constexpr const char* kNoGroupId = "sluice-kafka-source-no-group";
// Completed-checkpoint commits remembered at most (older ones are dropped: a newer commit supersedes them).
constexpr size_t kMaxPendingCommits = 64;
// The consumer's default queued.min.messages (see normalize_and_validate).
constexpr int kQueuedMinMessages = 1'000'000;
// How long close() waits for dead letters in flight to a dead-letter topic.
constexpr int kCloseFlushMs = 10'000;
// How long a checkpoint waits for dead letters in flight to a dead-letter topic.
constexpr int kSnapshotFlushMs = 60'000;
// Bounds a periodic discovery round (its metadata request runs off the coordinator's lock; resolving the offsets
// of new partitions runs under it).
constexpr std::chrono::milliseconds kDiscoveryTimeout{5'000};
// The shortest window of a reader's records-per-second rate; metrics() treats a window open for twice as long
// (the reader was not polled: nothing to read) as ending now.
constexpr int64_t kRateWindowMs = 1'000;

// Steady-clock milliseconds (the rate windows).
int64_t steady_ms() {
  return SystemClock::instance().monotonic_ns() / 1'000'000;
}

/// Logs a kind of event at most once per interval, with the number of suppressed repeats.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::seconds interval) : interval_(interval) {}
  /// True when the caller should log now; `suppressed` then holds the repeats skipped since the last one.
  bool allow(int64_t& suppressed) {
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++suppressed_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  std::chrono::seconds interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_once_ = false;
  int64_t suppressed_ = 0;
};

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

std::string reset_name(KafkaOffsetReset r) {
  switch (r) {
    case KafkaOffsetReset::kEarliest:
      return "earliest";
    case KafkaOffsetReset::kLatest:
      return "latest";
    case KafkaOffsetReset::kNone:
      return "none";
  }
  return "?";
}

KafkaTimestampType timestamp_type_of(rd_kafka_timestamp_type_t t) {
  switch (t) {
    case RD_KAFKA_TIMESTAMP_CREATE_TIME:
      return KafkaTimestampType::kCreateTime;
    case RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME:
      return KafkaTimestampType::kLogAppendTime;
    default:
      return KafkaTimestampType::kNone;
  }
}

/// The properties of a source's consumer: the user's, the defaults normalize_and_validate added, and the
/// ones the source owns.
KafkaProperties consumer_properties(const detail::KafkaSourceSettings& s, const std::string& client_id) {
  KafkaProperties p = s.properties;
  p["enable.auto.commit"] = "false";
  p["enable.auto.offset.store"] = "false";
  p["enable.partition.eof"] = "true";
  if (s.group_id().empty()) p["group.id"] = kNoGroupId;
  if (p.find("client.id") == p.end()) p["client.id"] = client_id;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Starting offsets, owner rule, settings

std::string KafkaStartingOffsets::describe() const {
  switch (kind_) {
    case Kind::kEarliest:
      return "earliest";
    case Kind::kLatest:
      return "latest";
    case Kind::kCommitted:
      return "committed (reset " + reset_name(reset_) + ")";
    case Kind::kTimestamp:
      return fmt::format("timestamp {}", timestamp_ms_);
    case Kind::kSpecific:
      return fmt::format("{} specific offsets (reset {})", offsets_.size(), reset_name(reset_));
  }
  return "?";
}

namespace kafka {

int32_t java_string_hash(std::string_view s) noexcept {
  uint32_t h = 0;
  for (const char c : s)
    h = 31 * h + static_cast<uint32_t>(static_cast<unsigned char>(c));
  return static_cast<int32_t>(h);
}

int split_owner(std::string_view topic, int32_t partition, int num_readers) noexcept {
  // Java: ((topic.hashCode() * 31) & 0x7FFFFFFF) % numReaders, then (start + partition) % numReaders.
  const uint32_t hash31 = static_cast<uint32_t>(java_string_hash(topic)) * 31u;
  const int64_t start = static_cast<int64_t>(hash31 & 0x7FFFFFFFu) % num_readers;
  return static_cast<int>((start + partition) % num_readers);
}

// ---------------------------------------------------------------------------------------------------------
// Deserializers

KafkaDeserializer<std::string> bytes_value() {
  return [](const KafkaMessageView& m, std::string& out) -> Status {
    if (m.value) {
      out.assign(*m.value);
    } else {
      out.clear();
    }
    return ok_status();
  };
}

KafkaDeserializer<std::string> string_value() {
  return [](const KafkaMessageView& m, std::string& out) -> Status {
    if (!m.value) {
      out.clear();
      return ok_status();
    }
    if (const size_t bad = first_invalid_utf8(*m.value); bad != std::string_view::npos) {
      return Error(ErrorCode::kSerialization,
                   fmt::format("the value is not valid UTF-8: invalid byte 0x{:02x} at byte {} of {}",
                               static_cast<unsigned char>((*m.value)[bad]), bad, m.value->size()));
    }
    out.assign(*m.value);
    return ok_status();
  };
}

}  // namespace kafka

std::vector<KafkaHeader> KafkaMessageView::headers() const {
  std::vector<KafkaHeader> out;
  if (raw == nullptr) {
    out.assign(fixed_headers.begin(), fixed_headers.end());
    return out;
  }
  rd_kafka_headers_t* hdrs = nullptr;  // owned by the message
  if (rd_kafka_message_headers(raw, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR || hdrs == nullptr) return out;
  const char* name = nullptr;
  const void* value = nullptr;
  size_t size = 0;
  for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
    KafkaHeader h;
    h.key = name;
    if (value != nullptr) h.value.emplace(static_cast<const char*>(value), size);
    out.push_back(std::move(h));
  }
  return out;
}

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
    Result<int64_t> ms = parse_int("partition.discovery.interval.ms", *v);
    if (!ms.ok()) return ms.error();
    s.discovery_interval_ms = *ms;
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
    Result<int64_t> ms = parse_int("startup.timeout.ms", *v);
    if (!ms.ok()) return ms.error();
    s.startup_timeout_ms = *ms;
  }
  if (auto v = take_property(p, "liveness.timeout.ms")) {
    Result<int64_t> ms = parse_int("liveness.timeout.ms", *v);
    if (!ms.ok()) return ms.error();
    s.liveness_timeout_ms = *ms;
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
  Result<kafka::KafkaConfPtr> conf = kafka::make_kafka_conf(consumer_properties(s, s.client_id_prefix), kRole);
  if (!conf.ok()) return conf.error();
  return ok_status();
}

// ---------------------------------------------------------------------------------------------------------
// Metrics

KafkaSourceMetrics KafkaSourceStats::metrics() const {
  return metrics(SystemClock::instance().now_ms(), steady_ms());
}

KafkaSourceMetrics KafkaSourceStats::metrics(int64_t now_ms, int64_t steady_now_ms) const {
  KafkaSourceMetrics m;
  m.records_read = records_read.load(std::memory_order_relaxed);
  m.bytes_read = bytes_read.load(std::memory_order_relaxed);
  m.bad_records = bad->bad_records.load(std::memory_order_relaxed);
  bool all_caught_up = true;
  int64_t oldest_lagging_ts = -1;  // the oldest last-record timestamp of the partitions that lag
  {
    std::lock_guard lock(mu);
    for (const std::shared_ptr<KafkaReaderStats>& r : readers) {
      const int64_t start = r->window_start_ms.load(std::memory_order_relaxed);
      const int64_t open_ms = steady_now_ms - start;
      if (start >= 0 && open_ms >= 2 * kRateWindowMs) {
        // Not polled for a while (nothing arrived): the open window's rate, which decays towards 0.
        m.records_per_second += static_cast<double>(r->window_records.load(std::memory_order_relaxed)) * 1000.0 /
                                static_cast<double>(open_ms);
      } else {
        m.records_per_second += r->records_per_second.load(std::memory_order_relaxed);
      }
      for (const auto& [tp, p] : r->partitions) {
        KafkaPartitionMetrics pm;
        pm.topic = p->topic;
        pm.partition = p->partition;
        pm.current_offset = p->current_offset.load(std::memory_order_relaxed);
        pm.committed_offset = p->committed_offset.load(std::memory_order_relaxed);
        int64_t low = RD_KAFKA_OFFSET_INVALID;
        int64_t high = RD_KAFKA_OFFSET_INVALID;
        // librdkafka's values from its last fetch response (a lookup under its locks, no request).
        if (r->consumer != nullptr &&
            rd_kafka_get_watermark_offsets(r->consumer, p->topic.c_str(), p->partition, &low, &high) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            high >= 0) {
          pm.high_watermark = high;
        }
        if (pm.high_watermark >= 0 && pm.current_offset >= 0) {
          pm.lag = std::max<int64_t>(0, pm.high_watermark - pm.current_offset);
        }
        if (pm.lag != 0) all_caught_up = false;
        if (pm.lag > 0) {
          // Only a partition known to lag says how old the data it has not read is; an unknown lag (no fetch
          // response yet) says nothing.
          const int64_t ts = p->last_timestamp_ms.load(std::memory_order_relaxed);
          if (ts >= 0 && (oldest_lagging_ts < 0 || ts < oldest_lagging_ts)) oldest_lagging_ts = ts;
        }
        if (pm.lag >= 0) {
          m.records_lag_max = std::max(m.records_lag_max, pm.lag);
          m.pending_records = std::max<int64_t>(m.pending_records, 0) + pm.lag;
        }
        m.partitions.push_back(std::move(pm));
      }
    }
  }
  std::sort(m.partitions.begin(), m.partitions.end(),
            [](const KafkaPartitionMetrics& a, const KafkaPartitionMetrics& b) {
              return std::tie(a.topic, a.partition) < std::tie(b.topic, b.partition);
            });
  // Unknown (-1) without assigned partitions (a restart in progress) or when no lagging partition has read a
  // record yet: the last timestamp ever read would make a quiet topic look hours behind.
  if (oldest_lagging_ts >= 0) {
    m.lag_ms = std::max<int64_t>(0, now_ms - oldest_lagging_ts);
  } else if (all_caught_up && !m.partitions.empty() && last_timestamp_ms.load(std::memory_order_relaxed) >= 0) {
    m.lag_ms = 0;
  }
  return m;
}

// ---------------------------------------------------------------------------------------------------------
// Discovery with librdkafka

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
  Result<KafkaClientPtr> client = kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf).value(), kRole);
  if (!client.ok()) return client.error();
  return std::unique_ptr<KafkaPartitionDiscoverer>(
      std::make_unique<RdKafkaDiscoverer>(settings, std::move(errors), std::move(client).value()));
}

// ---------------------------------------------------------------------------------------------------------
// Enumerator

KafkaSourceEnumerator::KafkaSourceEnumerator(SplitEnumeratorContext<KafkaPartitionSplit>& ctx,
                                             std::unique_ptr<KafkaPartitionDiscoverer> discoverer, Options options)
    : ctx_(ctx), discoverer_(std::move(discoverer)), options_(std::move(options)) {}

void KafkaSourceEnumerator::start() {
  if (!restored_) {
    Status st = discover_and_assign(/*initial=*/true, options_.startup_timeout);
    if (!st.ok()) throw SluiceException(st.error());
    spdlog::info("{} ({}): {} partitions, starting at {}{}", kRole, options_.description, pending_count(),
                 options_.starting.describe(), options_.bounded ? ", bounded by the latest offsets at start" : "");
  } else if (!options_.bounded) {
    // Readers resume their restored splits; partitions never seen before start from the earliest offset.
    Status st = discover_and_assign(/*initial=*/false, std::min(options_.startup_timeout, kDiscoveryTimeout));
    if (!st.ok()) {
      spdlog::warn("{} ({}): partition discovery after the restore failed, retrying periodically: {}", kRole,
                   options_.description, st.error().to_string());
    }
  }
  if (discovery_enabled()) {
    auto failures = std::make_shared<RateLimitedLog>(std::chrono::seconds(60));
    auto warn = [this, failures](const Error& e) {
      int64_t suppressed = 0;
      if (failures->allow(suppressed)) {
        spdlog::warn("{} ({}): partition discovery failed ({} more failures not logged): {}", kRole,
                     options_.description, suppressed, e.to_string());
      }
    };
    // The metadata request runs off the coordinator's lock; the result is applied under it.
    ctx_.call_async(
        [this, discoverer = discoverer_, warn]() -> std::function<void()> {
          Result<std::vector<KafkaTopicPartition>> found = discoverer->discover(kDiscoveryTimeout);
          return [this, found = std::move(found), warn] {
            if (!discoverer_) return;
            Status st = found.ok() ? assign_discovered(*found, /*initial=*/false, kDiscoveryTimeout) : found.error();
            if (!st.ok()) warn(st.error());
          };
        },
        options_.discovery_interval_ms);
  }
}

Status KafkaSourceEnumerator::discover_and_assign(bool initial, std::chrono::milliseconds timeout) {
  if (!discoverer_) return ok_status();
  Result<std::vector<KafkaTopicPartition>> found = discoverer_->discover(timeout);
  if (!found.ok()) return found.error();
  return assign_discovered(*found, initial, timeout);
}

Status KafkaSourceEnumerator::assign_discovered(const std::vector<KafkaTopicPartition>& found, bool initial,
                                                std::chrono::milliseconds timeout) {
  if (!discoverer_) return ok_status();
  std::set<KafkaTopicPartition> known = assigned_;
  for (const auto& [owner, splits] : pending_) {
    for (const KafkaPartitionSplit& s : splits)
      known.insert(s.topic_partition());
  }
  std::vector<KafkaTopicPartition> fresh;
  for (const KafkaTopicPartition& tp : found) {
    if (known.count(tp) == 0) fresh.push_back(tp);
  }
  if (fresh.empty()) return ok_status();
  const KafkaStartingOffsets starting = initial ? options_.starting : KafkaStartingOffsets::earliest();
  Result<std::vector<KafkaPartitionSplit>> splits =
      discoverer_->make_splits(fresh, starting, options_.bounded, timeout);
  if (!splits.ok()) return splits.error();
  if (!initial) {
    std::vector<std::string> names;
    for (const KafkaTopicPartition& tp : fresh)
      names.push_back(tp.topic + "-" + std::to_string(tp.partition));
    spdlog::info("{} ({}): discovered {} new partition(s), reading them from the earliest offset: {}", kRole,
                 options_.description, fresh.size(), fmt::join(names, ", "));
  }
  for (KafkaPartitionSplit& s : *splits)
    add_pending(std::move(s));
  for (int r : registered_)
    assign_pending(r);
  return ok_status();
}

void KafkaSourceEnumerator::add_pending(KafkaPartitionSplit split) {
  split.assigned = false;
  const int owner = kafka::split_owner(split.topic, split.partition, std::max(1, ctx_.current_parallelism()));
  pending_[owner].push_back(std::move(split));
}

void KafkaSourceEnumerator::assign_pending(int subtask) {
  auto it = pending_.find(subtask);
  if (it == pending_.end()) return;
  std::vector<KafkaPartitionSplit> splits = std::move(it->second);
  pending_.erase(it);
  for (KafkaPartitionSplit& s : splits) {
    assigned_.insert(s.topic_partition());
    ctx_.assign_split(std::move(s), subtask);
  }
}

void KafkaSourceEnumerator::add_reader(int subtask) {
  registered_.insert(subtask);
  assign_pending(subtask);
  if (!discovery_enabled()) ctx_.signal_no_more_splits(subtask);
}

void KafkaSourceEnumerator::add_splits_back(std::vector<KafkaPartitionSplit> splits, int subtask) {
  registered_.erase(subtask);
  for (KafkaPartitionSplit& s : splits) {
    assigned_.erase(s.topic_partition());
    add_pending(std::move(s));
  }
  for (int r : registered_)
    assign_pending(r);
}

std::vector<KafkaPartitionSplit> KafkaSourceEnumerator::snapshot_state(int64_t /*checkpoint_id*/) {
  std::vector<KafkaPartitionSplit> out;
  for (const auto& [owner, splits] : pending_)
    out.insert(out.end(), splits.begin(), splits.end());
  for (const KafkaTopicPartition& tp : assigned_)
    out.push_back(KafkaPartitionSplit{tp.topic, tp.partition, 0, std::nullopt, true});
  return out;
}

void KafkaSourceEnumerator::restore_state(std::vector<KafkaPartitionSplit> splits) {
  restored_ = true;
  assigned_.clear();
  pending_.clear();
  for (KafkaPartitionSplit& s : splits) {
    if (s.assigned) {
      assigned_.insert(s.topic_partition());
    } else {
      add_pending(std::move(s));
    }
  }
}

void KafkaSourceEnumerator::close() {
  discoverer_.reset();
}

size_t KafkaSourceEnumerator::pending_count() const noexcept {
  size_t n = 0;
  for (const auto& [owner, splits] : pending_)
    n += splits.size();
  return n;
}

// ---------------------------------------------------------------------------------------------------------
// Reader

namespace {

/// What librdkafka's queue callback reaches: the reader's context while the reader is open.
struct WakeupHook {
  std::mutex mu;
  SourceReaderContext* ctx = nullptr;
};

// Called by librdkafka from its threads when the consumer queue becomes non-empty.
void on_queue_event(rd_kafka_t* /*rk*/, void* opaque) {
  auto* hook = static_cast<WakeupHook*>(opaque);
  std::lock_guard lock(hook->mu);
  if (hook->ctx != nullptr) hook->ctx->wakeup();
}

}  // namespace

struct KafkaReaderCore::Impl {
  KafkaSourceSettings settings;
  int subtask = 0;
  std::string name;  // "Kafka source subtask 2" for log lines
  bool commit = false;
  WakeupHook wakeup;  // outlives the clients (declared first, destroyed last)
  KafkaClientPtr consumer;
  kafka::KafkaQueuePtr queue;
  KafkaClientPtr dead_letter_producer;
  std::unique_ptr<kafka::KafkaLivenessProbe> liveness;  // stopped in close(), before the wakeup hook goes
  // Set by librdkafka callbacks, which run on the task thread while poll() consumes the queue.
  std::string fatal_error;
  std::string dead_letter_error;
  int64_t dead_letters_in_flight = 0;
  RateLimitedLog transient_log{std::chrono::seconds(10)};
  RateLimitedLog commit_failure_log{std::chrono::seconds(60)};
  // For metrics (set by the core; the callbacks run on the task thread).
  KafkaSourceStats* stats = nullptr;
  KafkaReaderStats* reader_stats = nullptr;
  // Last lookup of poll(): messages come in runs of one partition.
  const rd_kafka_topic_t* cached_rkt = nullptr;
  int32_t cached_partition = -1;
  Partition* cached = nullptr;
  bool closed = false;

  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    const auto code = static_cast<rd_kafka_resp_err_t>(err);
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
      char buf[512];
      const rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof buf);
      if (self->fatal_error.empty()) self->fatal_error = fmt::format("{}: {}", rd_kafka_err2name(orig), buf);
      return;
    }
    if (kafka::is_permanent_kafka_error(code)) {
      if (self->fatal_error.empty()) self->fatal_error = fmt::format("{}: {}", rd_kafka_err2name(code), reason);
      return;
    }
    int64_t suppressed = 0;
    if (self->transient_log.allow(suppressed)) {
      spdlog::warn("{}: Kafka client error, retrying ({} similar not logged): {}: {}", self->name, suppressed,
                   rd_kafka_err2name(code), reason);
    }
  }

  static void offset_commit_cb(rd_kafka_t* /*rk*/, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                               void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    std::string failed;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && offsets != nullptr) {
      for (int i = 0; i < offsets->cnt; ++i) {
        const rd_kafka_topic_partition_t& p = offsets->elems[i];
        if (p.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
          if (failed.empty()) {
            failed = fmt::format("topic '{}' partition {}: {}", p.topic, p.partition, kafka::kafka_error_text(p.err));
          }
        } else if (p.offset >= 0) {
          self->record_committed(p.topic, p.partition, p.offset);
        }
      }
    } else if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failed = kafka::kafka_error_text(err);
    }
    if (failed.empty()) {
      spdlog::debug("{}: committed offsets to group '{}'", self->name, self->settings.group_id());
      return;
    }
    int64_t suppressed = 0;
    if (self->commit_failure_log.allow(suppressed)) {
      spdlog::warn(
          "{}: committing offsets to group '{}' failed ({} more failures not logged); the job goes on, its "
          "positions are in its checkpoints: {}",
          self->name, self->settings.group_id(), suppressed, failed);
    }
  }

  static void dead_letter_delivery_cb(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    --self->dead_letters_in_flight;
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR && self->dead_letter_error.empty()) {
      self->dead_letter_error = kafka::kafka_error_text(m->err);
    }
  }

  // The broker acknowledged `offset` for a partition: shows it in metrics() while the partition is assigned.
  void record_committed(const char* topic, int32_t partition, int64_t offset) {
    if (stats == nullptr || reader_stats == nullptr) return;
    std::lock_guard lock(stats->mu);
    auto it = reader_stats->partitions.find(KafkaTopicPartition{topic, partition});
    if (it != reader_stats->partitions.end()) it->second->committed_offset.store(offset, std::memory_order_relaxed);
  }

  void throw_if_failed() const {
    if (liveness) {
      if (std::optional<std::string> f = liveness->failure()) throw SluiceException(Error(ErrorCode::kConnector, *f));
    }
    if (!fatal_error.empty()) {
      throw SluiceException(
          Error(ErrorCode::kConnector, fmt::format("{}: the Kafka consumer failed (bootstrap servers '{}'): {}", name,
                                                   settings.bootstrap_servers(), fatal_error)));
    }
    if (!dead_letter_error.empty()) {
      throw SluiceException(
          Error(ErrorCode::kConnector, fmt::format("{}: writing a bad record to the dead-letter topic '{}' failed: {}",
                                                   name, settings.dead_letter_topic, dead_letter_error)));
    }
  }

  // Waits for dead letters in flight to the dead-letter topic; throws when one failed or the wait timed out.
  void flush_dead_letters(int timeout_ms) {
    if (!dead_letter_producer) return;
    const rd_kafka_resp_err_t err = rd_kafka_flush(dead_letter_producer.get(), timeout_ms);
    throw_if_failed();
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw SluiceException(kafka::kafka_error(
          ErrorCode::kConnector,
          fmt::format("{}: bad records could not be written to the dead-letter topic '{}' within {} ms", name,
                      settings.dead_letter_topic, timeout_ms),
          err));
    }
  }
};

KafkaReaderCore::KafkaReaderCore(const KafkaSourceSettings& settings, std::shared_ptr<DeadLetterFile> dead_letter,
                                 std::shared_ptr<KafkaSourceStats> stats)
    : dead_letter_(std::move(dead_letter)),
      stats_(std::move(stats)),
      reader_stats_(std::make_shared<KafkaReaderStats>()),
      impl_(std::make_unique<Impl>()) {
  impl_->settings = settings;
  impl_->stats = stats_.get();
  impl_->reader_stats = reader_stats_.get();
}

Result<std::unique_ptr<KafkaReaderCore>> KafkaReaderCore::create(const KafkaSourceSettings& settings,
                                                                 SourceReaderContext& ctx,
                                                                 std::shared_ptr<DeadLetterFile> dead_letter,
                                                                 std::shared_ptr<KafkaSourceStats> stats) {
  std::unique_ptr<KafkaReaderCore> core(new KafkaReaderCore(settings, std::move(dead_letter), std::move(stats)));
  Impl& impl = *core->impl_;
  impl.subtask = ctx.subtask_index();
  impl.name = fmt::format("{} subtask {} ({})", kRole, impl.subtask, settings.describe_topics());
  impl.commit = settings.commit_offsets_on_checkpoint && !settings.group_id().empty();

  Result<kafka::KafkaConfPtr> conf = kafka::make_kafka_conf(
      consumer_properties(settings, fmt::format("{}-{}", settings.client_id_prefix, impl.subtask)), kRole);
  if (!conf.ok()) return conf.error();
  rd_kafka_conf_set_opaque(conf->get(), &impl);
  rd_kafka_conf_set_error_cb(conf->get(), &Impl::error_cb);
  rd_kafka_conf_set_offset_commit_cb(conf->get(), &Impl::offset_commit_cb);
  Result<KafkaClientPtr> consumer = kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf).value(), kRole);
  if (!consumer.ok()) return consumer.error();
  impl.consumer = std::move(consumer).value();
  // Everything (errors, commit results) arrives on the consumer queue, which poll() serves.
  if (rd_kafka_resp_err_t err = rd_kafka_poll_set_consumer(impl.consumer.get())) {
    return kafka::kafka_error(ErrorCode::kConnector, fmt::format("{}: setting up the consumer", impl.name), err);
  }
  impl.queue.reset(rd_kafka_queue_get_consumer(impl.consumer.get()));
  if (!impl.queue) {
    return Error(ErrorCode::kInternal, fmt::format("{}: the consumer has no consumer queue", impl.name));
  }
  impl.wakeup.ctx = &ctx;
  rd_kafka_queue_cb_event_enable(impl.queue.get(), &on_queue_event, &impl.wakeup);
  {
    // A quiet topic calls poll() only when the consumer queue has something: the probe wakes the task itself.
    // Also with the liveness timeout off, the probe watches the connection for /health (connections()).
    Result<std::unique_ptr<kafka::KafkaLivenessProbe>> probe = kafka::KafkaLivenessProbe::start(
        RD_KAFKA_CONSUMER, settings.properties, std::chrono::milliseconds(settings.liveness_timeout_ms), impl.name,
        [hook = &impl.wakeup] {
          std::lock_guard lock(hook->mu);
          if (hook->ctx != nullptr) hook->ctx->wakeup();
        },
        kafka::KafkaLivenessProbe::ConnectionWatch{core->stats_->connections, impl.subtask});
    if (!probe.ok()) return probe.error();
    impl.liveness = std::move(probe).value();
  }
  {
    // From now on metrics() reads this reader (close() takes it out before destroying the consumer).
    std::lock_guard lock(core->stats_->mu);
    core->reader_stats_->consumer = impl.consumer.get();
    core->stats_->readers.push_back(core->reader_stats_);
  }

  if (settings.bad_record_policy == BadRecordPolicy::kDeadLetter && !settings.dead_letter_topic.empty()) {
    KafkaProperties props = settings.properties;
    for (const char* consumer_only : {"group.id", "isolation.level", "auto.offset.reset", "queued.min.messages"})
      props.erase(consumer_only);
    if (props.find("client.id") == props.end()) {
      props["client.id"] = fmt::format("{}-dead-letters-{}", settings.client_id_prefix, impl.subtask);
    }
    Result<kafka::KafkaConfPtr> pconf = kafka::make_kafka_conf(props, kRole);
    if (!pconf.ok()) return pconf.error();
    rd_kafka_conf_set_opaque(pconf->get(), &impl);
    rd_kafka_conf_set_dr_msg_cb(pconf->get(), &Impl::dead_letter_delivery_cb);
    Result<KafkaClientPtr> producer = kafka::make_kafka_client(RD_KAFKA_PRODUCER, std::move(pconf).value(), kRole);
    if (!producer.ok()) return producer.error();
    impl.dead_letter_producer = std::move(producer).value();
  }
  return core;
}

KafkaReaderCore::~KafkaReaderCore() {
  close();
}

void KafkaReaderCore::add_splits(std::vector<KafkaPartitionSplit> splits) {
  KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(splits.size())));
  for (KafkaPartitionSplit& s : splits) {
    KafkaTopicPartition tp = s.topic_partition();
    if (s.assigned || partitions_.count(tp) != 0) {
      spdlog::warn("{}: ignoring a split for topic '{}' partition {}: {}", impl_->name, s.topic, s.partition,
                   s.assigned ? "it is an enumerator marker" : "this reader already reads it");
      continue;
    }
    if (s.stopping_offset && s.starting_offset >= *s.stopping_offset) {
      finished_offsets_[tp] = s.starting_offset;  // nothing to read in bounded mode
      continue;
    }
    auto p = std::make_unique<Partition>();
    p->topic = s.topic;
    p->partition = s.partition;
    p->split_id = s.split_id();
    p->next_offset = s.starting_offset;
    p->stopping_offset = s.stopping_offset;
    p->stats = std::make_shared<KafkaPartitionStats>(s.topic, s.partition);
    p->stats->current_offset.store(s.starting_offset, std::memory_order_relaxed);
    {
      std::lock_guard lock(stats_->mu);
      reader_stats_->partitions[tp] = p->stats;
    }
    rd_kafka_topic_partition_list_add(list.get(), s.topic.c_str(), s.partition)->offset = s.starting_offset;
    new_partitions_.push_back(p.get());
    finished_offsets_.erase(tp);
    partitions_.emplace(std::move(tp), std::move(p));
  }
  if (list->cnt == 0) return;
  kafka::KafkaErrorPtr error(rd_kafka_incremental_assign(impl_->consumer.get(), list.get()));
  if (error) {
    throw SluiceException(
        Error(ErrorCode::kConnector, fmt::format("{}: assigning {} partition(s) failed: {}", impl_->name, list->cnt,
                                                 kafka::kafka_error_text(error.get()))));
  }
  impl_->cached = nullptr;
  impl_->cached_rkt = nullptr;
}

std::vector<KafkaReaderCore::Partition*> KafkaReaderCore::take_new_partitions() {
  return std::exchange(new_partitions_, {});
}

KafkaReaderCore::Partition* KafkaReaderCore::find_partition(const rd_kafka_message_t& m) {
  if (m.rkt == nullptr) return nullptr;
  if (impl_->cached != nullptr && impl_->cached_rkt == m.rkt && impl_->cached_partition == m.partition) {
    return impl_->cached;
  }
  auto it = partitions_.find(KafkaTopicPartition{rd_kafka_topic_name(m.rkt), m.partition});
  if (it == partitions_.end()) return nullptr;
  impl_->cached_rkt = m.rkt;
  impl_->cached_partition = m.partition;
  impl_->cached = it->second.get();
  return impl_->cached;
}

void KafkaReaderCore::finish_partition(Partition& p, Handler& handler) {
  KafkaTopicPartition tp{p.topic, p.partition};
  finished_offsets_[tp] = p.next_offset;
  handler.on_finished(p);
  KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), p.topic.c_str(), p.partition);
  kafka::KafkaErrorPtr error(rd_kafka_incremental_unassign(impl_->consumer.get(), list.get()));
  if (error) {
    spdlog::warn("{}: unassigning finished partition {} failed: {}", impl_->name, p.split_id,
                 kafka::kafka_error_text(error.get()));
  }
  std::erase(new_partitions_, &p);
  impl_->cached = nullptr;
  impl_->cached_rkt = nullptr;
  unregister_partition(tp);
  partitions_.erase(tp);
}

void KafkaReaderCore::set_next_offset(Partition& p, int64_t offset) {
  p.next_offset = offset;
  p.stats->current_offset.store(offset, std::memory_order_relaxed);
}

void KafkaReaderCore::unregister_partition(const KafkaTopicPartition& tp) {
  std::lock_guard lock(stats_->mu);
  reader_stats_->partitions.erase(tp);
}

void KafkaReaderCore::handle_event(const rd_kafka_message_t& m, Handler& handler) {
  if (m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    // The end of the partition (the last stable offset under read_committed): every message before it has
    // been delivered, so the position moves past trailing transaction markers and aborted records.
    Partition* p = find_partition(m);
    if (p == nullptr) return;
    set_next_offset(*p, std::max(p->next_offset, m.offset));
    if (p->stopping_offset && p->next_offset >= *p->stopping_offset) finish_partition(*p, handler);
    return;
  }
  const std::string where =
      m.rkt != nullptr ? fmt::format(" (topic '{}' partition {})", rd_kafka_topic_name(m.rkt), m.partition) : "";
  if (kafka::is_permanent_kafka_error(m.err)) {
    throw SluiceException(
        Error(ErrorCode::kConnector,
              fmt::format("{}: the Kafka consumer failed{} (bootstrap servers '{}'): {}: {}", impl_->name, where,
                          impl_->settings.bootstrap_servers(), rd_kafka_err2name(m.err), rd_kafka_message_errstr(&m))));
  }
  int64_t suppressed = 0;
  if (impl_->transient_log.allow(suppressed)) {
    spdlog::warn("{}: Kafka consumer error{}, retrying ({} similar not logged): {}: {}", impl_->name, where, suppressed,
                 rd_kafka_err2name(m.err), rd_kafka_message_errstr(&m));
  }
}

size_t KafkaReaderCore::poll(Handler& handler, size_t max_messages) {
  Impl& impl = *impl_;
  impl.throw_if_failed();
  if (impl.dead_letter_producer) rd_kafka_poll(impl.dead_letter_producer.get(), 0);
  if (batch_.size() < max_messages) batch_.resize(max_messages);
  const ssize_t got = rd_kafka_consume_batch_queue(impl.queue.get(), 0, batch_.data(), max_messages);
  if (got < 0) {
    throw SluiceException(kafka::kafka_error(ErrorCode::kConnector, fmt::format("{}: consuming failed", impl.name),
                                             rd_kafka_last_error()));
  }
  const auto n = static_cast<size_t>(got);
  size_t i = 0;
  int64_t records = 0;
  int64_t bytes = 0;
  int64_t last_timestamp_ms = -1;
  // Messages not handled yet when a handler throws are destroyed too.
  struct DestroyRest {
    std::vector<rd_kafka_message_t*>& batch;
    size_t& i;
    size_t n;
    ~DestroyRest() {
      for (; i < n; ++i)
        rd_kafka_message_destroy(batch[i]);
    }
  } destroy_rest{batch_, i, n};
  for (; i < n; ++i) {
    rd_kafka_message_t& m = *batch_[i];
    if (m.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      handle_event(m, handler);
    } else if (Partition* p = find_partition(m); p != nullptr && m.offset >= p->next_offset) {
      // (Messages of partitions no longer assigned, or before the position, are left over from an earlier
      // assignment: skipped.)
      if (p->stopping_offset && m.offset >= *p->stopping_offset) {
        finish_partition(*p, handler);
      } else {
        KafkaMessageView view;
        view.topic = p->topic;
        view.partition = m.partition;
        view.offset = m.offset;
        rd_kafka_timestamp_type_t ts_type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        view.timestamp_ms = rd_kafka_message_timestamp(&m, &ts_type);
        view.timestamp_type = timestamp_type_of(ts_type);
        if (m.key != nullptr) view.key.emplace(static_cast<const char*>(m.key), m.key_len);
        if (m.payload != nullptr) view.value.emplace(static_cast<const char*>(m.payload), m.len);
        view.raw = &m;
        handler.on_message(*p, view);
        ++records;
        bytes += static_cast<int64_t>(m.key_len + m.len);
        if (view.timestamp_ms >= 0) {
          last_timestamp_ms = view.timestamp_ms;
          p->stats->last_timestamp_ms.store(view.timestamp_ms, std::memory_order_relaxed);
        }
        set_next_offset(*p, m.offset + 1);
        if (p->stopping_offset && p->next_offset >= *p->stopping_offset) finish_partition(*p, handler);
      }
    }
    rd_kafka_message_destroy(batch_[i]);
  }
  publish_batch(records, bytes, last_timestamp_ms);
  impl.throw_if_failed();
  return n;
}

void KafkaReaderCore::publish_batch(int64_t records, int64_t bytes, int64_t last_timestamp_ms) {
  if (records > 0) {
    stats_->records_read.fetch_add(records, std::memory_order_relaxed);
    stats_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (last_timestamp_ms >= 0) stats_->last_timestamp_ms.store(last_timestamp_ms, std::memory_order_relaxed);
  // The rate over windows of at least a second (a window ends at the first poll after its second).
  KafkaReaderStats& r = *reader_stats_;
  const int64_t now = steady_ms();
  const int64_t start = r.window_start_ms.load(std::memory_order_relaxed);
  const int64_t in_window = r.window_records.load(std::memory_order_relaxed) + records;
  if (start < 0) {
    r.window_start_ms.store(now, std::memory_order_relaxed);
    r.window_records.store(records, std::memory_order_relaxed);
  } else if (now - start >= kRateWindowMs) {
    r.records_per_second.store(static_cast<double>(in_window) * 1000.0 / static_cast<double>(now - start),
                               std::memory_order_relaxed);
    r.window_records.store(0, std::memory_order_relaxed);
    r.window_start_ms.store(now, std::memory_order_relaxed);
  } else if (records > 0) {
    r.window_records.store(in_window, std::memory_order_relaxed);
  }
}

void KafkaReaderCore::bad_record(const KafkaMessageView& m, std::string_view reason) {
  Impl& impl = *impl_;
  if (impl_->settings.bad_record_policy == BadRecordPolicy::kFail) {
    std::string_view why = reason;
    while (why.ends_with('.'))
      why.remove_suffix(1);
    throw SluiceException(Error(
        ErrorCode::kConnector,
        fmt::format(
            "{}: bad record in topic '{}' partition {} at offset {}: {}. Fix the producer, or divert bad "
            "records with on_bad_record(BadRecordPolicy::kDeadLetter, path) or dead_letter_topic(name) (in a pipeline "
            "file: set pipeline.dead-letter)",
            kRole, m.topic, m.partition, m.offset, why)));
  }
  if (dead_letter_) {
    Value entry = Value::object({{"source", Value("kafka")},
                                 {"topic", Value(m.topic)},
                                 {"partition", Value(m.partition)},
                                 {"offset", Value(m.offset)},
                                 {"timestamp", Value(m.timestamp_ms)},
                                 {"error", Value(reason)},
                                 {"key", m.key ? Value(*m.key) : Value::null()},
                                 {"record", m.value ? Value(*m.value) : Value::null()}});
    // JSON strings hold UTF-8 text only: keep the exact bytes of a key or value that is not.
    if (m.key && !is_valid_utf8(*m.key)) entry.set("key_base64", Value::bytes(*m.key));
    if (m.value && !is_valid_utf8(*m.value)) entry.set("record_base64", Value::bytes(*m.value));
    dead_letter_->append(entry).value_or_throw();
    unsynced_dead_letters_ = true;
  }
  if (impl.dead_letter_producer) {
    kafka::KafkaHeadersPtr headers;
    if (m.raw != nullptr) {
      rd_kafka_headers_t* original = nullptr;
      if (rd_kafka_message_headers(m.raw, &original) == RD_KAFKA_RESP_ERR_NO_ERROR && original != nullptr) {
        headers.reset(rd_kafka_headers_copy(original));
      }
    }
    if (!headers) headers.reset(rd_kafka_headers_new(4));
    const std::string partition = std::to_string(m.partition);
    const std::string offset = std::to_string(m.offset);
    rd_kafka_header_add(headers.get(), "sluice.dlq.topic", -1, m.topic.data(), static_cast<ssize_t>(m.topic.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.partition", -1, partition.data(),
                        static_cast<ssize_t>(partition.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.offset", -1, offset.data(), static_cast<ssize_t>(offset.size()));
    rd_kafka_header_add(headers.get(), "sluice.dlq.error", -1, reason.data(), static_cast<ssize_t>(reason.size()));
    void* key = m.key ? const_cast<char*>(m.key->data()) : nullptr;
    const size_t key_len = m.key ? m.key->size() : 0;
    void* value = m.value ? const_cast<char*>(m.value->data()) : nullptr;
    const size_t value_len = m.value ? m.value->size() : 0;
    for (;;) {
      rd_kafka_headers_t* h = headers.get();
      const rd_kafka_resp_err_t err = rd_kafka_producev(
          impl.dead_letter_producer.get(), RD_KAFKA_V_TOPIC(impl_->settings.dead_letter_topic.c_str()),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE(value, value_len),
          RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        (void)headers.release();  // owned by the message now
        ++impl.dead_letters_in_flight;
        break;
      }
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        throw SluiceException(
            kafka::kafka_error(ErrorCode::kConnector,
                               fmt::format("{}: writing a bad record to the dead-letter topic '{}' failed", impl.name,
                                           impl_->settings.dead_letter_topic),
                               err));
      }
      rd_kafka_poll(impl.dead_letter_producer.get(), 100);  // the producer's queue is full: let it drain
    }
  }
  stats_->bad->bad_records.fetch_add(1, std::memory_order_relaxed);
  if (!logged_dead_letter_) {
    logged_dead_letter_ = true;
    spdlog::warn(
        "{}: the record at topic '{}' partition {} offset {} could not be read and went to the dead letters ({}); "
        "further bad records of this reader go there without a log line (count: BadRecordStats::bad_records): {}",
        impl.name, m.topic, m.partition, m.offset,
        dead_letter_ ? "file '" + dead_letter_->path() + "'" : "topic '" + impl_->settings.dead_letter_topic + "'",
        reason);
  }
}

std::vector<KafkaPartitionSplit> KafkaReaderCore::snapshot(int64_t checkpoint_id) {
  if (unsynced_dead_letters_) {
    dead_letter_->sync().value_or_throw();
    unsynced_dead_letters_ = false;
  }
  impl_->flush_dead_letters(kSnapshotFlushMs);
  std::vector<KafkaPartitionSplit> out;
  out.reserve(partitions_.size());
  for (const auto& [tp, p] : partitions_)
    out.push_back(KafkaPartitionSplit{p->topic, p->partition, p->next_offset, p->stopping_offset, false});
  if (impl_->commit) {
    std::map<KafkaTopicPartition, int64_t> offsets = finished_offsets_;
    for (const auto& [tp, p] : partitions_)
      offsets[tp] = p->next_offset;
    pending_commits_[checkpoint_id] = std::move(offsets);
    while (pending_commits_.size() > kMaxPendingCommits)
      pending_commits_.erase(pending_commits_.begin());
  }
  return out;
}

void KafkaReaderCore::notify_checkpoint_complete(int64_t checkpoint_id) {
  auto it = pending_commits_.find(checkpoint_id);
  if (it != pending_commits_.end() && !it->second.empty() && !impl_->closed) {
    KafkaPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(it->second.size())));
    for (const auto& [tp, offset] : it->second)
      rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition)->offset = offset;
    const rd_kafka_resp_err_t err = rd_kafka_commit(impl_->consumer.get(), list.get(), /*async=*/1);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      int64_t suppressed = 0;
      if (impl_->commit_failure_log.allow(suppressed)) {
        spdlog::warn("{}: committing the offsets of checkpoint {} failed ({} more failures not logged): {}",
                     impl_->name, checkpoint_id, suppressed, kafka::kafka_error_text(err));
      }
    }
  }
  // A completed checkpoint supersedes every earlier one.
  pending_commits_.erase(pending_commits_.begin(), pending_commits_.upper_bound(checkpoint_id));
}

void KafkaReaderCore::close() noexcept {
  Impl& impl = *impl_;
  if (impl.closed) return;
  impl.closed = true;
  impl.liveness.reset();
  {
    std::lock_guard lock(impl.wakeup.mu);
    impl.wakeup.ctx = nullptr;
  }
  if (impl.queue) rd_kafka_queue_cb_event_enable(impl.queue.get(), nullptr, nullptr);
  {
    // metrics() no longer reads this reader (nor its consumer, destroyed below).
    std::lock_guard lock(stats_->mu);
    std::erase(stats_->readers, reader_stats_);
    reader_stats_->consumer = nullptr;
    reader_stats_->partitions.clear();
  }
  if (impl.dead_letter_producer) {
    const rd_kafka_resp_err_t err = rd_kafka_flush(impl.dead_letter_producer.get(), kCloseFlushMs);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR || impl.dead_letters_in_flight > 0) {
      spdlog::warn("{}: {} bad record(s) may not have reached the dead-letter topic '{}' at close: {}", impl.name,
                   impl.dead_letters_in_flight, impl_->settings.dead_letter_topic, kafka::kafka_error_text(err));
    }
    impl.dead_letter_producer.reset();
  }
  if (unsynced_dead_letters_ && dead_letter_) {
    Status st = dead_letter_->sync();
    if (!st.ok()) spdlog::warn("{}: {}", impl.name, st.error().to_string());
    unsynced_dead_letters_ = false;
  }
  impl.queue.reset();
  if (impl.consumer) {
    // Waits for commits in flight (the last checkpoint's), then leaves; no group membership to give up.
    if (rd_kafka_resp_err_t err = rd_kafka_consumer_close(impl.consumer.get())) {
      spdlog::debug("{}: closing the consumer: {}", impl.name, kafka::kafka_error_text(err));
    }
    impl.consumer.reset();
  }
  partitions_.clear();
  new_partitions_.clear();
  impl.cached = nullptr;
}

}  // namespace detail

}  // namespace sluice
