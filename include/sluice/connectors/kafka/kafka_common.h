// What the Kafka source and sink share (DESIGN.md §8: Kafka on librdkafka): RAII handles for librdkafka
// objects, client configuration from a string map, client creation, error text, and a metadata lookup that
// waits a bounded time for an unreachable cluster.
//
// Client properties are librdkafka's (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md),
// which for the common ones are the Java client's names: `bootstrap.servers`, `security.protocol`,
// `sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`, ... They are passed through as
// given; the connectors set only the few they own (documented on each connector). Values of secret
// properties (passwords, keys, secrets) never appear in error messages or logs.
//
// librdkafka's own log lines go to spdlog's default logger (levels mapped from syslog: 0-3 error,
// 4 warning, 5-6 info, 7 debug), prefixed with the client's name.
//
// Thread-safety: the functions are thread-safe. librdkafka handles (rd_kafka_t) are thread-safe; the RAII
// wrappers are not (own each from one thread, as any unique_ptr).
#pragma once

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sluice/connectors/source_connection.h"
#include "sluice/core/error.h"

namespace sluice::kafka {

/// Destroys librdkafka objects; the deleter of the handle aliases below.
struct KafkaDeleter {
  void operator()(rd_kafka_t* rk) const noexcept {
    if (rk != nullptr) rd_kafka_destroy(rk);
  }
  void operator()(rd_kafka_conf_t* c) const noexcept {
    if (c != nullptr) rd_kafka_conf_destroy(c);
  }
  void operator()(rd_kafka_topic_conf_t* c) const noexcept {
    if (c != nullptr) rd_kafka_topic_conf_destroy(c);
  }
  void operator()(rd_kafka_message_t* m) const noexcept {
    if (m != nullptr) rd_kafka_message_destroy(m);
  }
  void operator()(rd_kafka_topic_partition_list_t* l) const noexcept {
    if (l != nullptr) rd_kafka_topic_partition_list_destroy(l);
  }
  void operator()(rd_kafka_error_t* e) const noexcept {
    if (e != nullptr) rd_kafka_error_destroy(e);
  }
  void operator()(rd_kafka_queue_t* q) const noexcept {
    if (q != nullptr) rd_kafka_queue_destroy(q);
  }
  void operator()(rd_kafka_event_t* e) const noexcept {
    if (e != nullptr) rd_kafka_event_destroy(e);
  }
  void operator()(rd_kafka_headers_t* h) const noexcept {
    if (h != nullptr) rd_kafka_headers_destroy(h);
  }
  void operator()(rd_kafka_AdminOptions_t* o) const noexcept {
    if (o != nullptr) rd_kafka_AdminOptions_destroy(o);
  }
  void operator()(rd_kafka_NewTopic_t* t) const noexcept {
    if (t != nullptr) rd_kafka_NewTopic_destroy(t);
  }
  void operator()(rd_kafka_NewPartitions_t* p) const noexcept {
    if (p != nullptr) rd_kafka_NewPartitions_destroy(p);
  }
  void operator()(rd_kafka_consumer_group_metadata_t* m) const noexcept {
    if (m != nullptr) rd_kafka_consumer_group_metadata_destroy(m);
  }
  void operator()(const rd_kafka_metadata_t* m) const noexcept {
    if (m != nullptr) rd_kafka_metadata_destroy(m);
  }
};

using KafkaClientPtr = std::unique_ptr<rd_kafka_t, KafkaDeleter>;
using KafkaConfPtr = std::unique_ptr<rd_kafka_conf_t, KafkaDeleter>;
using KafkaMessagePtr = std::unique_ptr<rd_kafka_message_t, KafkaDeleter>;
using KafkaPartitionListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, KafkaDeleter>;
using KafkaErrorPtr = std::unique_ptr<rd_kafka_error_t, KafkaDeleter>;
using KafkaQueuePtr = std::unique_ptr<rd_kafka_queue_t, KafkaDeleter>;
using KafkaEventPtr = std::unique_ptr<rd_kafka_event_t, KafkaDeleter>;
using KafkaHeadersPtr = std::unique_ptr<rd_kafka_headers_t, KafkaDeleter>;
using KafkaAdminOptionsPtr = std::unique_ptr<rd_kafka_AdminOptions_t, KafkaDeleter>;
using KafkaNewTopicPtr = std::unique_ptr<rd_kafka_NewTopic_t, KafkaDeleter>;
using KafkaNewPartitionsPtr = std::unique_ptr<rd_kafka_NewPartitions_t, KafkaDeleter>;
using KafkaGroupMetadataPtr = std::unique_ptr<rd_kafka_consumer_group_metadata_t, KafkaDeleter>;
using KafkaMetadataPtr = std::unique_ptr<const rd_kafka_metadata_t, KafkaDeleter>;

/// Client properties: librdkafka configuration keys to values, e.g. {"security.protocol", "SASL_SSL"}.
using KafkaProperties = std::map<std::string, std::string>;

/// True for properties whose values are secrets (keys containing "password", "secret", "sasl.jaas",
/// "sasl.oauthbearer.config" or ending in ".pem" / "ssl.key"): never print their values.
bool is_secret_property(std::string_view key) noexcept;

/// `value`, or "<redacted>" when `key` is secret (for messages and logs).
std::string printable_property_value(std::string_view key, std::string_view value);

/// "NAME: description" of a librdkafka error code, e.g.
/// "UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or partition".
std::string kafka_error_text(rd_kafka_resp_err_t err);

/// "NAME: message" of a librdkafka error object ("" for nullptr). Does not take ownership.
std::string kafka_error_text(const rd_kafka_error_t* error);

/// An Error with `code` whose message is "<context>: <kafka_error_text(err)>".
Error kafka_error(ErrorCode code, std::string_view context, rd_kafka_resp_err_t err);

/// True when librdkafka reports `err` as permanent for a client: authentication, authorization, TLS,
/// fatal (idempotence/transactions, rd_kafka_fatal_error), invalid configuration. Retrying with the same
/// configuration will not help, so connectors fail their task on these and only log the others
/// (transport failures, leader changes, timeouts), which librdkafka retries itself.
bool is_permanent_kafka_error(rd_kafka_resp_err_t err) noexcept;

/// Builds a librdkafka configuration from `properties` (applied in key order) and installs the spdlog
/// log callback. `role` names the client in errors ("Kafka source", "Kafka sink").
/// Errors: kConfiguration naming the property, its (redacted when secret) value and librdkafka's reason
/// when a key is unknown or a value invalid.
[[nodiscard]] Result<KafkaConfPtr> make_kafka_conf(const KafkaProperties& properties, std::string_view role);

/// Creates a client of `type` (RD_KAFKA_CONSUMER or RD_KAFKA_PRODUCER) from `conf`, which it takes over
/// also on failure. Creating a client does not contact the cluster. Errors: kConfiguration with librdkafka's
/// reason (invalid combinations of properties, e.g. a SASL mechanism without its library).
[[nodiscard]] Result<KafkaClientPtr> make_kafka_client(rd_kafka_type_t type, KafkaConfPtr conf, std::string_view role);

/// One topic in the cluster's metadata.
struct KafkaTopicInfo {
  std::string name;
  int32_t partitions = 0;
  /// The broker's error for this topic (RD_KAFKA_RESP_ERR_NO_ERROR when fine); UNKNOWN_TOPIC_OR_PART when
  /// it does not exist.
  rd_kafka_resp_err_t error = RD_KAFKA_RESP_ERR_NO_ERROR;
};

/// Reads the metadata of every topic (when `topics` is empty) or of the named topics from `rk`, retrying
/// transient failures (transport errors, timeouts) until `timeout` has passed. A named topic that does not
/// exist comes back with error UNKNOWN_TOPIC_OR_PART (the request does not create topics). Blocks the
/// calling thread for at most about `timeout`.
/// Errors: kConnector "cannot reach the Kafka cluster at '<bootstrap>' within <n> ms: <last librdkafka
/// error>; check bootstrap.servers, the security settings and that the brokers run" when no answer came;
/// permanent errors (authentication, authorization) at once.
/// `permanent_error` (optional) is asked after each failed attempt, once rk's callbacks were served
/// (rd_kafka_poll): a non-empty answer (the client's error callback saw an authentication or TLS failure, which
/// rd_kafka_metadata itself reports only as brokers down) fails at once with kConnector "the Kafka cluster at
/// '<bootstrap>' refused the client: <answer>; check the security settings (security.protocol, sasl.*, ssl.*)".
[[nodiscard]] Result<std::vector<KafkaTopicInfo>> fetch_topic_metadata(
    rd_kafka_t* rk, const std::vector<std::string>& topics, std::chrono::milliseconds timeout,
    std::string_view bootstrap_servers, const std::function<std::string()>& permanent_error = {});

/// What a client's error callback saw that no retry cures (authentication, TLS, librdkafka fatal errors), for
/// clients that have no error callback of their own: install() it on the client's configuration (it becomes the
/// opaque); it must outlive the client. Thread-safe.
class KafkaPermanentErrorCapture {
 public:
  void install(rd_kafka_conf_t* conf);
  /// "" while none; else "<error name>: <librdkafka's reason>" of the first one.
  std::string get() const;

 private:
  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);
  mutable std::mutex mu_;
  std::string error_;  // guarded by mu_
};

/// Where a source reader's liveness probe reports its connection (KafkaLivenessProbe).
struct KafkaConnectionWatch {
  std::shared_ptr<SourceConnectionBoard> board;  ///< null: no watch
  int subtask = 0;
};

/// Watches whether a Kafka cluster answers, also while a connector sends nothing (an idle sink, a source on a
/// quiet topic): a thread of its own sends a metadata request for no topic (a round trip to one broker) every
/// interval = clamp(timeout / 4, 100 ms, 5 s), each bounded by clamp(timeout / 2, 500 ms, 5 s), on a client of
/// its own (with the connector's properties, so security settings apply), and remembers when one was
/// last answered. failure() is a stopped or paused broker (no answer) and an unreachable one (connection
/// refused) alike; librdkafka's own retries never end, so a connector without this would wait silently.
///
/// With a ConnectionWatch (a source reader's), the probe also reports the reader's connection to the watch's
/// board (source_connection.h) after every round: disconnected once no broker answered for 3 s (kDisconnectedAfter;
/// the reason names the bootstrap servers and librdkafka's last error, "all brokers down" when its error callback
/// said so), connected again at the next answer. It then probes at least every second, each request bounded by
/// 2.5 s, so a stopped or paused cluster shows within about 3.5 s. A timeout of 0 never fails (the watch only).
///
/// Lifecycle: start() -> failure() ... -> destroyed (stops the thread; waits for at most one request bound).
/// Thread-safety: failure() may be called from any thread; `on_failure` runs on the probe's thread, once when
/// the failure starts (a source uses it to wake its task thread).
class KafkaLivenessProbe {
 public:
  using ConnectionWatch = KafkaConnectionWatch;
  /// No broker answered for this long: disconnected (with a ConnectionWatch).
  static constexpr std::chrono::milliseconds kDisconnectedAfter{3'000};

  /// Starts probing the cluster of `properties` (bootstrap.servers required) with a client of `type`, the
  /// connector's own (so its properties apply without warnings): a producer drops transactional.id and
  /// idempotence, a consumer its group (it never joins one). `who` names the connector in failure(). Errors:
  /// kConfiguration when the client cannot be created from the properties.
  [[nodiscard]] static Result<std::unique_ptr<KafkaLivenessProbe>> start(
      rd_kafka_type_t type, KafkaProperties properties, std::chrono::milliseconds timeout, std::string who,
      std::function<void()> on_failure = nullptr, ConnectionWatch watch = {});
  ~KafkaLivenessProbe();
  KafkaLivenessProbe(const KafkaLivenessProbe&) = delete;
  KafkaLivenessProbe& operator=(const KafkaLivenessProbe&) = delete;

  /// nullopt while a broker answered within the timeout (or since start); otherwise "<who>: no broker of
  /// '<bootstrap.servers>' answered for <n> ms (liveness timeout <t> ms; last: <librdkafka error>)".
  std::optional<std::string> failure() const;

 private:
  KafkaLivenessProbe(std::chrono::milliseconds timeout, std::string who, std::string bootstrap,
                     std::function<void()> on_failure, ConnectionWatch watch);
  void run();
  // librdkafka's error callback of the probe's client (served by rd_kafka_poll on the probe's thread).
  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);

  const ConnectionWatch watch_;
  std::string client_error_;  // the client's last error callback since the last answer; guarded by mu_
  KafkaClientPtr client_;
  const std::chrono::milliseconds timeout_;
  const std::string who_;
  const std::string bootstrap_;
  const std::function<void()> on_failure_;
  std::atomic<int64_t> last_answer_ns_;  // steady clock
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;       // guarded by mu_
  std::string last_error_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace sluice::kafka
