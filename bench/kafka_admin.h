// Kafka admin helpers shared by the benchmarks that need a broker (kafka-bench, postgres-cdc-bench and
// sluice-bench's nexmark-kafka-*): librdkafka clients from key/value settings, topic creation through the Admin
// API, partition and record counts. Benchmark tooling, not the connector: errors come back as Status/Result.
#pragma once

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/error.h"

namespace sluice::bench {

inline constexpr int kAdminTimeoutMs = 30'000;

/// A librdkafka handle, destroyed with its scope.
struct KafkaHandle {
  rd_kafka_t* rk = nullptr;
  KafkaHandle() = default;
  explicit KafkaHandle(rd_kafka_t* h) : rk(h) {}
  KafkaHandle(const KafkaHandle&) = delete;
  KafkaHandle& operator=(const KafkaHandle&) = delete;
  ~KafkaHandle() {
    if (rk != nullptr) rd_kafka_destroy(rk);
  }
};

/// A client of `type` with `conf` (key, value pairs); nullptr with `error` set when librdkafka refuses them.
/// `setup` may add callbacks to the configuration before the client is made.
template <class Setup = void (*)(rd_kafka_conf_t*)>
std::unique_ptr<KafkaHandle> make_client(
    rd_kafka_type_t type, const std::vector<std::pair<std::string, std::string>>& conf, std::string& error,
    Setup setup = [](rd_kafka_conf_t*) {}) {
  rd_kafka_conf_t* c = rd_kafka_conf_new();
  char err[512];
  for (const auto& [k, v] : conf) {
    if (rd_kafka_conf_set(c, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      error = fmt::format("{}={}: {}", k, v, err);
      rd_kafka_conf_destroy(c);
      return nullptr;
    }
  }
  setup(c);
  rd_kafka_t* rk = rd_kafka_new(type, c, err, sizeof err);  // takes `c` on success only
  if (rk == nullptr) {
    rd_kafka_conf_destroy(c);
    error = fmt::format("rd_kafka_new: {}", err);
    return nullptr;
  }
  return std::make_unique<KafkaHandle>(rk);
}

/// Creates `topic` with `partitions` partitions (replication 1: the benchmark broker is a single node). A topic
/// that exists already is fine when its partition count is `partitions`. Producers and consumers made
/// afterwards wait for the partitions' leaders themselves (librdkafka retries metadata), so this does not.
inline Status ensure_topic(rd_kafka_t* rk, const std::string& topic, int partitions) {
  char err[512];
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(topic.c_str(), partitions, 1, err, sizeof err);
  if (nt == nullptr) return Error(ErrorCode::kConfiguration, fmt::format("topic {}: {}", topic, err));
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_AdminOptions_t* opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_operation_timeout(opts, kAdminTimeoutMs, err, sizeof err);
  rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, kAdminTimeoutMs + 5'000);
  Status result = ok_status();
  if (ev == nullptr) {
    result = Error(ErrorCode::kConnector, fmt::format("CreateTopics {}: no answer from the broker", topic));
  } else if (rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    result = Error(ErrorCode::kConnector, fmt::format("CreateTopics {}: {}", topic, rd_kafka_event_error_string(ev)));
  } else {
    size_t n = 0;
    const rd_kafka_topic_result_t** res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    const rd_kafka_resp_err_t e = n == 1 ? rd_kafka_topic_result_error(res[0]) : RD_KAFKA_RESP_ERR__FAIL;
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
      result = Error(ErrorCode::kConnector, fmt::format("CreateTopics {}: {}", topic, rd_kafka_err2str(e)));
  }
  if (ev != nullptr) rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(opts);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
  return result;
}

/// The partition count of `topic`; 0 when it does not exist.
inline Result<int> partition_count(rd_kafka_t* rk, const std::string& topic) {
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, kAdminTimeoutMs);
  rd_kafka_topic_destroy(rkt);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
    return Error(ErrorCode::kConnector, fmt::format("metadata of {}: {}", topic, rd_kafka_err2str(e)));
  int count = 0;
  if (md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR) count = md->topics[0].partition_cnt;
  rd_kafka_metadata_destroy(md);
  return count;
}

/// The number of records in `topic`: the sum over its partitions of end offset - start offset. Exact for the
/// topics here (non-transactional producers, no compaction, nothing deleted).
inline Result<int64_t> record_count(rd_kafka_t* rk, const std::string& topic, int partitions) {
  int64_t total = 0;
  for (int p = 0; p < partitions; ++p) {
    int64_t low = 0;
    int64_t high = 0;
    const rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(rk, topic.c_str(), p, &low, &high, kAdminTimeoutMs);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
      return Error(ErrorCode::kConnector, fmt::format("offsets of {}-{}: {}", topic, p, rd_kafka_err2str(e)));
    total += high - low;
  }
  return total;
}

/// Creates `topic` (see ensure_topic) with a short-lived admin client of `bootstrap`.
inline Status ensure_topic(const std::string& bootstrap, const std::string& topic, int partitions) {
  std::string error;
  auto admin = make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}}, error);
  if (!admin) return Error(ErrorCode::kConfiguration, error);
  return ensure_topic(admin->rk, topic, partitions);
}

}  // namespace sluice::bench
