// The Kafka sink's librdkafka side: producers, the transactional producer pool, pre-commit, commit and the
// recovery of restored transactions (see kafka_sink.h for the design).
#include "sluice/connectors/kafka/kafka_sink.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "sluice/api/functions.h"
#include "sluice/api/operator.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/value.h"
#include "sluice/state/operator_state.h"

namespace sluice {

std::string_view delivery_guarantee_name(DeliveryGuarantee guarantee) noexcept {
  switch (guarantee) {
    case DeliveryGuarantee::kNone:
      return "none";
    case DeliveryGuarantee::kAtLeastOnce:
      return "at-least-once";
    case DeliveryGuarantee::kExactlyOnce:
      return "exactly-once";
  }
  return "unknown";
}

Result<DeliveryGuarantee> parse_delivery_guarantee(std::string_view text) {
  std::string t;
  for (char c : text)
    t.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (t == "none") return DeliveryGuarantee::kNone;
  if (t == "at-least-once") return DeliveryGuarantee::kAtLeastOnce;
  if (t == "exactly-once") return DeliveryGuarantee::kExactlyOnce;
  return Error(ErrorCode::kConfiguration,
               "unknown delivery guarantee '" + std::string(text) + "': use none, at-least-once or exactly-once");
}

int32_t kafka_murmur2(std::string_view bytes) noexcept {
  // org.apache.kafka.common.utils.Utils.murmur2, in unsigned arithmetic (Java's int wraps the same way).
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto length = static_cast<uint32_t>(bytes.size());
  constexpr uint32_t kSeed = 0x9747b28c;
  constexpr uint32_t kM = 0x5bd1e995;
  constexpr int kR = 24;
  uint32_t h = kSeed ^ length;
  const uint32_t length4 = length / 4;
  for (uint32_t i = 0; i < length4; ++i) {
    const uint32_t i4 = i * 4;
    uint32_t k = static_cast<uint32_t>(data[i4]) | (static_cast<uint32_t>(data[i4 + 1]) << 8) |
                 (static_cast<uint32_t>(data[i4 + 2]) << 16) | (static_cast<uint32_t>(data[i4 + 3]) << 24);
    k *= kM;
    k ^= k >> kR;
    k *= kM;
    h *= kM;
    h ^= k;
  }
  const uint32_t tail = length & ~3u;
  switch (length % 4) {
    case 3:
      h ^= static_cast<uint32_t>(data[tail + 2]) << 16;
      [[fallthrough]];
    case 2:
      h ^= static_cast<uint32_t>(data[tail + 1]) << 8;
      [[fallthrough]];
    case 1:
      h ^= static_cast<uint32_t>(data[tail]);
      h *= kM;
      break;
    default:
      break;
  }
  h ^= h >> 13;
  h *= kM;
  h ^= h >> 15;
  return static_cast<int32_t>(h);
}

int32_t kafka_default_partition(std::string_view key, int32_t num_partitions) noexcept {
  const uint32_t positive = static_cast<uint32_t>(kafka_murmur2(key)) & 0x7fffffffu;
  return static_cast<int32_t>(positive % static_cast<uint32_t>(num_partitions));
}

namespace detail {
namespace {

// ------------------------------------------------------------------------------------------------------------
// librdkafka helpers (the shared RAII handles are in kafka_common.h)

using kafka::KafkaClientPtr;
using kafka::KafkaErrorPtr;
using kafka::KafkaPartitionListPtr;

// Handles kafka_common.h has no deleter for.
struct LocalDeleter {
  void operator()(rd_kafka_topic_t* t) const noexcept { rd_kafka_topic_destroy(t); }
  void operator()(rd_kafka_ListConsumerGroupOffsets_t* r) const noexcept {
    rd_kafka_ListConsumerGroupOffsets_destroy(r);
  }
};

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1'000'000'000));
}

[[noreturn]] void fail(std::string message) {
  throw SluiceException(Error(ErrorCode::kConnector, std::move(message)));
}

// The longest single wait of a blocking librdkafka call: between slices the sink checks its liveness probe,
// authentication errors and the task's cancellation, so none of them waits for the operation timeout.
constexpr int kWaitSliceMs = 200;
// A committed() call is a FindCoordinator and an OffsetFetch round trip, each slice anew: give it a second.
constexpr int kMarkerSliceMs = 1000;
// The bound of the metadata and ListOffsets requests that describe a transaction still pending (for its error).
constexpr int kProbeMetadataTimeoutMs = 5000;
// How long a checkpoint waits for each committed transaction's probe record before it carries it on as pending.
constexpr int64_t kConfirmWaitMs = 200;
// How long committing a transaction waits for the confirmation of this subtask's earlier commits (in all), and
// how long the last commits of a subtask whose input ended wait for theirs.
constexpr int64_t kConfirmBeforeCommitMs = 5000;

// True when the fault point "kafka.lose-commit" fires (see Producer::commit_transaction).
bool commit_lost_by_fault_point() {
  try {
    SLUICE_FAULT_POINT("kafka.lose-commit");
    return false;
  } catch (const SluiceException&) {
    return true;
  }
}

// What confirm_commits waits for (see there).
enum class ConfirmWait {
  kCheckpoint,    ///< at a checkpoint: briefly; what is not confirmed yet goes into the checkpoint
  kBeforeCommit,  ///< before this subtask's next commit: everything, or the task fails
  kInputEnded,    ///< after the last commits of a subtask whose input ended: everything, or the task fails
};

// What librdkafka's error_cb reports that retrying cannot fix: credentials, permissions or TLS (the sink fails at once
// instead of retrying until a timeout while the job looks healthy).
bool is_permanent_client_error(int err) {
  switch (static_cast<rd_kafka_resp_err_t>(err)) {
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR__SSL:  // a TLS handshake failure: an untrusted or misnamed certificate
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTHORIZATION_FAILED:
      return true;
    default:
      return false;
  }
}

// A read_committed reader cannot get past a transaction that is still open: the partition's last stable offset
// (LSO) stays at its first record. One that no producer will ever end is a hanging transaction (KIP-664): seen with
// Kafka 4.4 when a broker restarted right after acknowledging a commit. librdkafka 2.0.2 has no Admin API to abort
// it (no DescribeProducers, no WriteTxnMarkers), so the sink names it and the remedy, and the job restarts until it
// is aborted. `what` says which transaction of ours waits behind it.
std::string hanging_transaction_text(const std::string& what, const std::string& transactional_id,
                                     const std::string& topic, int32_t partition, int64_t offset,
                                     int64_t last_stable_offset, int32_t leader, int64_t waited_ms,
                                     const std::string& bootstrap) {
  const std::string tp = topic + " [" + std::to_string(partition) + "]";
  const std::string start = last_stable_offset >= 0 ? std::to_string(last_stable_offset) : "<its start offset>";
  std::string text = what + " (transactional.id " + transactional_id + "): its first record, " + tp + " offset " +
                     std::to_string(offset) + ", is not readable by read_committed readers after " +
                     std::to_string(waited_ms) + " ms";
  text += last_stable_offset >= 0 ? ": the partition's last stable offset stays at " + start
                                  : ": the partition's last stable offset could not be read";
  text +=
      ". A transaction that started at that offset is still open on the broker and blocks every read_committed "
      "reader of the partition; if no producer will end it (a hanging transaction, seen with Kafka 4.4 after a broker "
      "restart right after a commit), abort it by hand: kafka-transactions.sh --bootstrap-server " +
      bootstrap + " find-hanging --broker-id " +
      (leader >= 0 ? std::to_string(leader) : std::string("<leader of ") + tp + ">") +
      " (lists it), then kafka-transactions.sh --bootstrap-server " + bootstrap + " abort --topic " + topic +
      " --partition " + std::to_string(partition) + " --start-offset " + start +
      " (docs/connectors.md). The sink cannot abort it itself (librdkafka has no API for it); the job restarts "
      "until it is aborted, then re-publishes what the abort removed";
  return text;
}

// The id of the broker leading `topic` [`partition`] (-1: unknown), from `rk`'s metadata.
int32_t partition_leader(rd_kafka_t* rk, const std::string& topic, int32_t partition) {
  std::unique_ptr<rd_kafka_topic_t, decltype(&rd_kafka_topic_destroy)> rkt(
      rd_kafka_topic_new(rk, topic.c_str(), nullptr), &rd_kafka_topic_destroy);
  if (!rkt) return -1;
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_metadata(rk, /*all_topics=*/0, rkt.get(), &md, kProbeMetadataTimeoutMs) != RD_KAFKA_RESP_ERR_NO_ERROR)
    return -1;
  kafka::KafkaMetadataPtr owned(md);
  for (int t = 0; t < md->topic_cnt; ++t) {
    if (topic != md->topics[t].topic) continue;
    for (int i = 0; i < md->topics[t].partition_cnt; ++i) {
      if (md->topics[t].partitions[i].id == partition) return md->topics[t].partitions[i].leader;
    }
  }
  return -1;
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool is_false(const std::string& v) {
  std::string t;
  for (char c : v)
    t.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return t == "false" || t == "0";
}

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

// ------------------------------------------------------------------------------------------------------------
// One librdkafka producer with its delivery-report bookkeeping. Used by one thread at a time (callbacks are
// served by rd_kafka_poll/flush on the calling thread).

class Producer {
 public:
  /// Creates a producer; `transactional_id` empty for a plain idempotent producer.
  /// `watchdog` (may be empty) throws when the sink must stop waiting (its liveness probe failed); `cancelled`
  /// (may be null) is the task's cancellation flag. Both are checked between the slices of every blocking wait.
  Producer(const KafkaSinkSettings& settings, std::string transactional_id, std::string who,
           std::function<void()> watchdog = nullptr, const std::atomic<bool>* cancelled = nullptr)
      : who_(std::move(who)),
        txid_(std::move(transactional_id)),
        bootstrap_(settings.bootstrap_servers),
        timeout_ms_(settings.operation_timeout_ms),
        watchdog_(std::move(watchdog)),
        cancelled_(cancelled),
        marker_props_(marker_consumer_properties(settings)) {
    kafka::KafkaConfPtr conf = kafka::make_kafka_conf(producer_properties(settings, txid_), who_).value_or_throw();
    rd_kafka_conf_set_dr_msg_cb(conf.get(), &Producer::on_delivery);
    rd_kafka_conf_set_error_cb(conf.get(), &Producer::on_error);
    rd_kafka_conf_set_opaque(conf.get(), this);
    rk_ = kafka::make_kafka_client(RD_KAFKA_PRODUCER, std::move(conf), who_).value_or_throw();
  }

  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  ~Producer() {
    topics_.clear();
    if (!rk_) return;
    if (in_transaction_) {
      // End the transaction before destroying: readers are unblocked at once, and librdkafka 2.0.2 can abort the
      // process (assertion `txn_req_cnt > 0` in rd_kafka_txn_handle_AddPartitionsToTxn) when a producer is
      // destroyed with a transaction request in flight. A pre-committed transaction aborted here is re-published
      // from its recovery copy by the restore, as one the broker aborted would be.
      KafkaErrorPtr err(rd_kafka_abort_transaction(rk_.get(), static_cast<int>(std::min<int64_t>(timeout_ms_, 5000))));
      if (err) spdlog::debug("{}: abort_transaction on close: {}", who_, kafka::kafka_error_text(err.get()));
      rd_kafka_purge(rk_.get(), RD_KAFKA_PURGE_F_QUEUE);
    } else if (txid_.empty()) {
      // Undelivered messages of a failed run are dropped.
      rd_kafka_purge(rk_.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    }
  }

  rd_kafka_t* rk() const noexcept { return rk_.get(); }
  const std::string& transactional_id() const noexcept { return txid_; }

  /// Produces one record; waits (serving delivery reports) while librdkafka's queue is full. Returns librdkafka's
  /// reason when it refuses the record for its content (MSG_SIZE_TOO_LARGE: key, value and headers above
  /// message.max.bytes; nothing was produced), nullopt when produced; throws on other errors.
  [[nodiscard]] std::optional<std::string> produce(
      std::string_view topic, int32_t partition, std::optional<std::string_view> key,
      std::optional<std::string_view> value,
      const std::vector<std::pair<std::string_view, std::optional<std::string_view>>>* view_headers,
      const std::vector<KafkaHeader>* headers, int64_t timestamp_ms) {
    rd_kafka_topic_t* rkt = topic_handle(topic);
    Clock::time_point deadline{};
    for (bool first = true;; first = false) {
      kafka::KafkaHeadersPtr hdrs;
      const size_t header_count = headers ? headers->size() : (view_headers ? view_headers->size() : 0);
      if (header_count > 0) {
        hdrs.reset(rd_kafka_headers_new(header_count));
        if (headers) {
          for (const KafkaHeader& h : *headers) {
            rd_kafka_header_add(hdrs.get(), h.key.data(), static_cast<ssize_t>(h.key.size()),
                                h.value ? h.value->data() : nullptr,
                                h.value ? static_cast<ssize_t>(h.value->size()) : 0);
          }
        } else {
          for (const auto& [name, v] : *view_headers) {
            rd_kafka_header_add(hdrs.get(), name.data(), static_cast<ssize_t>(name.size()), v ? v->data() : nullptr,
                                v ? static_cast<ssize_t>(v->size()) : 0);
          }
        }
      }
      rd_kafka_vu_t vu[7];
      size_t n = 0;
      vu[n].vtype = RD_KAFKA_VTYPE_RKT;
      vu[n++].u.rkt = rkt;
      vu[n].vtype = RD_KAFKA_VTYPE_PARTITION;
      vu[n++].u.i32 = partition;
      vu[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
      vu[n++].u.i = RD_KAFKA_MSG_F_COPY;
      vu[n].vtype = RD_KAFKA_VTYPE_VALUE;
      vu[n].u.mem.ptr = value ? const_cast<char*>(value->data()) : nullptr;
      vu[n++].u.mem.size = value ? value->size() : 0;
      if (key) {
        // A present empty key must not be a null pointer: librdkafka treats a null key as "no key".
        static char empty = '\0';
        vu[n].vtype = RD_KAFKA_VTYPE_KEY;
        vu[n].u.mem.ptr = key->empty() ? &empty : const_cast<char*>(key->data());
        vu[n++].u.mem.size = key->size();
      }
      if (timestamp_ms > 0) {
        vu[n].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
        vu[n++].u.i64 = timestamp_ms;
      }
      if (hdrs) {
        vu[n].vtype = RD_KAFKA_VTYPE_HEADERS;
        vu[n++].u.headers = hdrs.get();
      }
      KafkaErrorPtr err(rd_kafka_produceva(rk_.get(), vu, n));
      if (!err) {
        hdrs.release();  // owned by the message now
        if (++since_poll_ >= 256) poll();
        return std::nullopt;
      }
      if (rd_kafka_error_code(err.get()) == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        return kafka::kafka_error_text(err.get()) + " (the record is larger than the producer's message.max.bytes, " +
               max_message_bytes() + ")";
      }
      if (rd_kafka_error_code(err.get()) != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        fail(who_ + ": producing to topic '" + std::string(topic) + "' partition " + partition_text(partition) +
             " failed: " + kafka::kafka_error_text(err.get()));
      }
      // Backpressure: wait for deliveries to free the queue.
      if (first) deadline = deadline_after(timeout_ms_);
      if (Clock::now() >= deadline) {
        fail(who_ + ": librdkafka's queue stayed full for " + std::to_string(timeout_ms_) + " ms (topic '" +
             std::string(topic) + "'): is the broker reachable?");
      }
      rd_kafka_poll(rk_.get(), 10);
      check_interrupts();
    }
  }

  /// The producer's message.max.bytes, as text.
  std::string max_message_bytes() const {
    char buf[64];
    size_t size = sizeof buf;
    if (rd_kafka_conf_get(rd_kafka_conf(rk_.get()), "message.max.bytes", buf, &size) != RD_KAFKA_CONF_OK) return "?";
    return buf;
  }

  /// Serves delivery reports and throws on a failed delivery or a fatal error.
  void poll() {
    since_poll_ = 0;
    rd_kafka_poll(rk_.get(), 0);
    check_errors();
  }

  /// Waits until every produced record is acknowledged; throws on failures or after the timeout. Waits in slices
  /// of kWaitSliceMs: a failed liveness probe, an authentication error or the task's cancellation ends the wait.
  void flush() {
    const Clock::time_point deadline = deadline_after(timeout_ms_);
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    while (true) {
      err = rd_kafka_flush(rk_.get(), std::clamp(remaining_ms(deadline), 1, kWaitSliceMs));
      check_interrupts();
      if (err != RD_KAFKA_RESP_ERR__TIMED_OUT || Clock::now() >= deadline) break;
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      fail(who_ + ": flush did not complete within " + std::to_string(timeout_ms_) + " ms (" +
           std::to_string(rd_kafka_outq_len(rk_.get())) + " records and requests in flight): " + rd_kafka_err2str(err) +
           "; is the broker reachable?");
    }
  }

  void check_errors() {
    if (!fatal_.empty()) fail(who_ + ": fatal producer error" + txid_suffix() + ": " + fatal_);
    if (!permanent_.empty()) {
      throw SluiceException(mark_non_recoverable(
          Error(ErrorCode::kConnector,
                who_ + ": the broker refused the sink" + txid_suffix() + ": " + permanent_ +
                    "; check the security settings (security.protocol, sasl.*, ssl.*) and the ACLs of the sink's "
                    "principal"),
          "the broker refused the sink's credentials or permissions"));
    }
    if (failed_ > 0) {
      fail(who_ + ": " + first_failure_ +
           (failed_ > 1 ? " (" + std::to_string(failed_) + " deliveries failed in all)" : std::string()));
    }
  }

  /// check_errors(), after serving queued callbacks (error_cb), then the watchdog (liveness) and cancellation
  /// (throws TaskCancelledException, which unwinds the task).
  void check_interrupts() {
    check_errors();
    if (watchdog_) watchdog_();
    if (cancelled_ != nullptr && cancelled_->load(std::memory_order_acquire)) throw TaskCancelledException{};
  }

  // --- transactions (all block up to the operation timeout; throw with librdkafka's error) ---

  /// init_transactions in slices of kWaitSliceMs (librdkafka resumes a timed-out init_transactions when called
  /// again): an authentication or authorization error fails at once, a broker that does not answer within the
  /// liveness timeout fails through the watchdog, a cancelled task stops waiting; otherwise the operation timeout.
  void init_transactions() {
    const Clock::time_point deadline = deadline_after(timeout_ms_);
    while (true) {
      KafkaErrorPtr err(rd_kafka_init_transactions(rk_.get(), std::clamp(remaining_ms(deadline), 1, kWaitSliceMs)));
      if (!err) return;
      rd_kafka_poll(rk_.get(), 0);  // serves error_cb: an authentication failure explains a timeout
      check_interrupts();
      if (rd_kafka_error_code(err.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT && Clock::now() < deadline) continue;
      if (rd_kafka_error_is_retriable(err.get()) && Clock::now() < deadline) continue;
      fail(who_ + ": init_transactions" + txid_suffix() + " failed: " + kafka::kafka_error_text(err.get()) +
           (rd_kafka_error_code(err.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT
                ? " (no answer within the operation timeout of " + std::to_string(timeout_ms_) +
                      " ms; is the broker reachable, and does it allow transactions?)"
                : std::string()));
    }
  }

  /// Checks at open that `topic` exists (a metadata request for it, which lets the broker auto-create it when
  /// its auto.create.topics.enable and the producer's allow.auto.create.topics allow: the broker's answer
  /// decides, the sink does not guess). Fails naming the topic and the bootstrap servers when the broker says
  /// it does not exist; waits at most `bound_ms` for an answer (then only logs: the liveness probe covers a
  /// broker that does not answer).
  void check_topic(const std::string& topic, int64_t bound_ms) {
    rd_kafka_topic_t* rkt = topic_handle(topic);
    const Clock::time_point deadline = deadline_after(bound_ms);
    int unknown_answers = 0;
    while (true) {
      const rd_kafka_metadata_t* md = nullptr;
      const rd_kafka_resp_err_t err =
          rd_kafka_metadata(rk_.get(), 0, rkt, &md, std::clamp(remaining_ms(deadline), 1, 500));
      kafka::KafkaMetadataPtr owned(md);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md != nullptr) {
        rd_kafka_resp_err_t topic_err = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        for (int i = 0; i < md->topic_cnt; ++i) {
          if (topic == md->topics[i].topic) topic_err = md->topics[i].err;
        }
        if (topic_err == RD_KAFKA_RESP_ERR_NO_ERROR || topic_err == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE) {
          return;  // exists, or is being created (auto-creation) and has no leader yet
        }
        if (topic_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
          // A second answer, so a topic the first request just auto-created is seen as created.
          if (++unknown_answers >= 2) {
            fail(who_ + ": topic '" + topic + "' does not exist on " + bootstrap_ +
                 " (auto-creation off?): create it (kafka-topics.sh --create) or let the broker create topics "
                 "(auto.create.topics.enable=true)");
          }
        } else if (is_permanent_client_error(topic_err)) {
          throw SluiceException(mark_non_recoverable(
              Error(ErrorCode::kConnector,
                    who_ + ": topic '" + topic + "' on " + bootstrap_ + ": " + kafka::kafka_error_text(topic_err)),
              "the broker refused the sink's credentials or permissions"));
        }
      }
      rd_kafka_poll(rk_.get(), 0);
      check_interrupts();
      if (Clock::now() >= deadline) {
        spdlog::warn("{}: could not check that topic '{}' exists on {} within {} ms (last: {})", who_, topic,
                     bootstrap_, bound_ms, rd_kafka_err2str(err));
        return;
      }
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  void begin_transaction() {
    KafkaErrorPtr err(rd_kafka_begin_transaction(rk_.get()));
    if (err) fail(who_ + ": begin_transaction" + txid_suffix() + " failed: " + kafka::kafka_error_text(err.get()));
    in_transaction_ = true;
    probe_offset_ = -1;
  }

  /// The first record delivered in the current transaction (topic, partition, offset); offset -1: none yet.
  void fill_probe(KafkaCommittable& c) const {
    c.probe_topic = probe_topic_;
    c.probe_partition = probe_partition_;
    c.probe_offset = probe_offset_;
  }

  enum class Visibility { kCommitted, kAborted, kPending };

  /// What probe_visibility() found. For kPending also where the partition's last stable offset stood (the first
  /// offset of the oldest transaction still open there; -1: not learned) and the partition's leader (-1: unknown).
  struct Probe {
    Visibility visibility = Visibility::kPending;
    int64_t last_stable_offset = -1;
    int32_t leader = -1;
  };

  /// Whether a read_committed reader sees the record at (topic, partition, offset): the record there means its
  /// transaction committed; the reader's position past it without it means aborted; nothing yet (the last stable
  /// offset is not past it) means still pending. Asks for up to `wait_ms`, then answers kPending with the last
  /// stable offset and the leader, for the error that names them (hanging_transaction_text()).
  Probe probe_visibility(const std::string& topic, int32_t partition, int64_t offset, int64_t wait_ms) {
    if (!probe_consumer_) {
      kafka::KafkaProperties props = marker_props_;
      props["group.id"] = "sluice-probe";  // never joined, never committed
      props["isolation.level"] = "read_committed";
      props["enable.partition.eof"] = "true";
      kafka::KafkaConfPtr conf = kafka::make_kafka_conf(props, who_).value_or_throw();
      probe_consumer_ = kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf), who_).value_or_throw();
      // A new consumer connects first (bootstrap, metadata, the leader): a brief wait would end before its fetch.
      wait_ms = std::max<int64_t>(wait_ms, std::min<int64_t>(timeout_ms_, kProbeMetadataTimeoutMs));
    }
    rd_kafka_t* rk = probe_consumer_.get();
    KafkaPartitionListPtr parts(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(parts.get(), topic.c_str(), partition)->offset = offset;
    if (rd_kafka_resp_err_t err = rd_kafka_assign(rk, parts.get())) {
      fail(who_ + ": assigning " + topic + " [" + std::to_string(partition) +
           "] to read a transaction's record back: " + rd_kafka_err2str(err));
    }
    struct Unassign {
      rd_kafka_t* rk;
      ~Unassign() { rd_kafka_assign(rk, nullptr); }
    } unassign{rk};
    const Clock::time_point deadline = deadline_after(wait_ms);
    Probe probe;
    while (Clock::now() < deadline) {
      kafka::KafkaMessagePtr m(rd_kafka_consumer_poll(rk, std::clamp(remaining_ms(deadline), 1, kWaitSliceMs)));
      if (!m) {
        check_interrupts();
        continue;
      }
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        if (m->offset > offset) {  // at the last stable offset, past the record, without it
          probe.visibility = Visibility::kAborted;
          return probe;
        }
        continue;  // the last stable offset is not past the record yet
      }
      if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (is_permanent_client_error(m->err)) {
          fail(who_ + ": reading back " + topic + " [" + std::to_string(partition) +
               "] failed: " + rd_kafka_err2str(m->err));
        }
        continue;
      }
      probe.visibility = m->offset == offset ? Visibility::kCommitted : Visibility::kAborted;
      return probe;
    }
    // Still pending: a read_committed consumer's ListOffsets answers the last stable offset as the high mark.
    int64_t low = -1, high = -1;
    if (rd_kafka_query_watermark_offsets(rk, topic.c_str(), partition, &low, &high, kProbeMetadataTimeoutMs) ==
        RD_KAFKA_RESP_ERR_NO_ERROR) {
      probe.last_stable_offset = high;
    }
    probe.leader = partition_leader(rk, topic, partition);
    return probe;
  }

  /// Drops probe_visibility()'s reader: a settled producer lives on in the writer's pool, its reader need not.
  void drop_probe_consumer() { probe_consumer_.reset(); }

  /// The bootstrap servers, for the remedy a hanging transaction's error names.
  const std::string& bootstrap() const noexcept { return bootstrap_; }

  /// Adds the marker (group `<txid>-marker`, `topic` partition 0, offset, metadata = token) to the transaction.
  void send_marker(const std::string& topic, int64_t offset, const std::string& token) {
    const std::string group = txid_ + "-marker";
    retry("send_offsets_to_transaction", [&](int ms) {
      KafkaPartitionListPtr offsets(rd_kafka_topic_partition_list_new(1));
      rd_kafka_topic_partition_t* p = rd_kafka_topic_partition_list_add(offsets.get(), topic.c_str(), 0);
      p->offset = offset;
      p->metadata = std::malloc(token.size());
      std::memcpy(p->metadata, token.data(), token.size());
      p->metadata_size = token.size();
      kafka::KafkaGroupMetadataPtr meta(rd_kafka_consumer_group_metadata_new(group.c_str()));
      return rd_kafka_send_offsets_to_transaction(rk_.get(), offsets.get(), meta.get(), ms);
    });
  }

  /// Commits the open transaction (retrying retriable errors up to the timeout).
  void commit_transaction() {
    if (commit_lost_by_fault_point()) {
      // The fault point "kafka.lose-commit" (armed with kThrow) emulates a broker that acknowledges a commit and
      // then loses it (seen when a broker restarted right after the commit, docs/benchmarks.md): the transaction
      // is aborted and the call returns as if it had committed, so tests drive the confirmation deterministically.
      retry("abort_transaction", [&](int ms) { return rd_kafka_abort_transaction(rk_.get(), ms); });
      in_transaction_ = false;
      spdlog::warn("{}: fault point 'kafka.lose-commit' fired: transaction{} aborted, reported committed", who_,
                   txid_suffix());
      return;
    }
    retry("commit_transaction", [&](int ms) { return rd_kafka_commit_transaction(rk_.get(), ms); });
    in_transaction_ = false;
  }

  /// The marker's metadata in the marker group of this producer's transactional id (nullopt: no offset), for
  /// the transaction whose token is `token`. Call after init_transactions, which completes the id's previous
  /// transaction. Decided by resolve_marker() from certain evidence only: fails the task rather than guess.
  std::optional<std::string> read_marker(const std::string& topic, const std::string& token) {
    const std::string group = txid_ + "-marker";
    // The marker consumers are needed only for this decision: a settled producer lives on in the writer's pool,
    // and two idle clients (threads, connections) per restored transaction would live on with it.
    struct DropConsumers {
      std::map<std::string, kafka::KafkaClientPtr>& consumers;
      ~DropConsumers() { consumers.clear(); }
    } drop{marker_consumers_};
    return resolve_marker([&](bool require_stable) { return fetch_marker(group, topic, require_stable); }, token,
                          timeout_ms_, 100, who_ + txid_suffix(), group, [this] { check_interrupts(); });
  }

  /// One OffsetFetch of `group`'s committed offset for `topic` partition 0, through a consumer of that group
  /// (read_committed: the broker answers only when no transactional offset is pending). Throws on non-retriable
  /// errors. Not the admin API's ListConsumerGroupOffsets: librdkafka (2.0.2 here; still open in 2.4,
  /// confluentinc/librdkafka#5040) dereferences the null consumer group of a non-consumer client when that
  /// request is answered NOT_COORDINATOR, and Kafka 4's group coordinator answers NOT_COORDINATOR when a
  /// require-stable fetch times out (KAFKA-17267). A build that read markers at every checkpoint crashed so (SIGSEGV
  /// on librdkafka's main thread while a fetch was in flight) in 2 of 3 broker-restart test runs. A consumer's
  /// committed() handles NOT_COORDINATOR by looking the coordinator up again. The consumer never subscribes, so it
  /// never joins the group.
  MarkerReading fetch_marker(const std::string& group, const std::string& topic, bool require_stable) {
    const int request_ms = static_cast<int>(std::clamp<int64_t>(timeout_ms_, 1000, 30'000));
    rd_kafka_t* consumer = marker_consumer(group, require_stable);
    KafkaPartitionListPtr parts(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(parts.get(), topic.c_str(), 0);
    // In slices, so that a cancelled task or a failed liveness probe stops the wait; each slice asks again (the
    // consumer keeps the coordinator it found).
    const Clock::time_point deadline = deadline_after(request_ms);
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    while (true) {
      err = rd_kafka_committed(consumer, parts.get(), std::clamp(remaining_ms(deadline), 1, kMarkerSliceMs));
      if (err != RD_KAFKA_RESP_ERR__TIMED_OUT || Clock::now() >= deadline) break;
      check_interrupts();
    }
    MarkerReading r;
    r.kind = MarkerReading::Kind::kRetriableError;
    const std::string where = "marker group '" + group + "' (topic '" + topic + "' partition 0)";
    if (err == RD_KAFKA_RESP_ERR__TIMED_OUT) {
      r.error = "no answer within " + std::to_string(request_ms) + " ms" +
                (require_stable ? " (the broker may still hold pending transactional offsets for the group)" : "");
      return r;
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      r.error = std::string(rd_kafka_err2name(err)) + ": " + rd_kafka_err2str(err);
      if (is_permanent_client_error(err))
        fail(who_ + ": reading the committed offset of " + where + " failed: " + r.error);
      return r;  // transport errors, a coordinator moving or loading: worth another try
    }
    const rd_kafka_topic_partition_t& p = parts->elems[0];
    if (p.err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (p.offset < 0) {
        r.kind = MarkerReading::Kind::kNoOffset;
      } else {
        r.kind = MarkerReading::Kind::kOffset;
        r.metadata.assign(static_cast<const char*>(p.metadata), p.metadata == nullptr ? 0 : p.metadata_size);
      }
      return r;
    }
    r.error = std::string(rd_kafka_err2name(p.err)) + ": " + rd_kafka_err2str(p.err);
    if (p.err == RD_KAFKA_RESP_ERR_UNSTABLE_OFFSET_COMMIT) {
      r.kind = MarkerReading::Kind::kUnstable;  // pending transactional offsets
    } else if (is_permanent_client_error(p.err)) {
      fail(who_ + ": reading the committed offset of " + where + " failed: " + r.error);
    }
    return r;
  }

  /// The consumer fetch_marker() reads `group` with (created on first use; read_committed when `require_stable`).
  rd_kafka_t* marker_consumer(const std::string& group, bool require_stable) {
    kafka::KafkaClientPtr& c = marker_consumers_[group + (require_stable ? "|stable" : "|any")];
    if (!c) {
      kafka::KafkaProperties props = marker_props_;
      props["group.id"] = group;
      props["isolation.level"] = require_stable ? "read_committed" : "read_uncommitted";
      kafka::KafkaConfPtr conf = kafka::make_kafka_conf(props, who_).value_or_throw();
      c = kafka::make_kafka_client(RD_KAFKA_CONSUMER, std::move(conf), who_).value_or_throw();
    }
    return c.get();
  }

  /// Partition count of `topic` (broker metadata).
  int32_t fetch_partition_count(const std::string& topic) {
    std::vector<kafka::KafkaTopicInfo> topics =
        kafka::fetch_topic_metadata(rk_.get(), {topic}, std::chrono::milliseconds(timeout_ms_), bootstrap_)
            .value_or_throw();
    for (const kafka::KafkaTopicInfo& t : topics) {
      if (t.name != topic) continue;
      if (t.error != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fail(who_ + ": topic '" + topic + "': " + kafka::kafka_error_text(t.error));
      }
      if (t.partitions > 0) return t.partitions;
    }
    fail(who_ + ": topic '" + topic + "' has no partitions in the broker's metadata");
  }

 private:
  static std::string partition_text(int32_t partition) {
    return partition == RD_KAFKA_PARTITION_UA ? std::string("(any)") : std::to_string(partition);
  }

  std::string txid_suffix() const { return txid_.empty() ? std::string() : " (transactional.id " + txid_ + ")"; }

  // Calls `op(timeout_ms)` until it succeeds, retrying retriable errors until the operation timeout. Throws on a
  // non-retriable error (after aborting the transaction when librdkafka says it must be).
  template <class Op>
  void retry(const char* what, Op&& op) {
    const Clock::time_point deadline = deadline_after(timeout_ms_);
    while (true) {
      KafkaErrorPtr err(op(std::max(remaining_ms(deadline), 1)));
      if (!err) return;
      if (rd_kafka_error_is_retriable(err.get()) && Clock::now() < deadline) continue;
      std::string text = kafka::kafka_error_text(err.get());
      if (rd_kafka_error_txn_requires_abort(err.get())) {
        KafkaErrorPtr abort_err(rd_kafka_abort_transaction(rk_.get(), static_cast<int>(timeout_ms_)));
        if (abort_err) {
          text += " (abort_transaction: " + kafka::kafka_error_text(abort_err.get()) + ")";
        } else {
          in_transaction_ = false;
        }
      }
      check_errors();  // a failed delivery is the better explanation
      fail(who_ + ": " + what + txid_suffix() + " failed: " + text);
    }
  }

  rd_kafka_topic_t* topic_handle(std::string_view topic) {
    if (last_topic_ != nullptr && last_topic_name_ == topic) return last_topic_;
    std::string name(topic);
    auto it = topics_.find(name);
    if (it == topics_.end()) {
      rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_.get(), name.c_str(), nullptr);
      if (rkt == nullptr) {
        fail(who_ + ": cannot use topic '" + name + "': " + rd_kafka_err2str(rd_kafka_last_error()));
      }
      it = topics_.emplace(name, std::unique_ptr<rd_kafka_topic_t, LocalDeleter>(rkt)).first;
    }
    last_topic_name_ = it->first;
    last_topic_ = it->second.get();
    return last_topic_;
  }

  static void on_delivery(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque) {
    auto* self = static_cast<Producer*>(opaque);
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (self->probe_offset_ < 0 && m->offset >= 0) {
        self->probe_topic_ = rd_kafka_topic_name(m->rkt);
        self->probe_partition_ = m->partition;
        self->probe_offset_ = m->offset;
      }
      return;
    }
    if (self->failed_++ == 0) {
      self->first_failure_ = "delivery to topic '" + std::string(rd_kafka_topic_name(m->rkt)) + "' partition " +
                             partition_text(m->partition) + " failed: " + rd_kafka_err2str(m->err) + " (" +
                             rd_kafka_err2name(m->err) + ")";
      if (m->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        // The broker refused what the producer let through: only records the producer refuses can go to the
        // dead letters (a transaction with a refused record must abort as a whole).
        self->first_failure_ +=
            ": the topic's max.message.bytes is below the producer's message.max.bytes; set message.max.bytes no "
            "higher than the topic's, so the sink refuses too large records itself (and dead-letters them)";
      }
    }
  }

  static void on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* self = static_cast<Producer*>(opaque);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
      char buf[512];
      rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof buf);
      self->fatal_ = std::string(rd_kafka_err2name(orig)) + ": " + buf;
      return;
    }
    if (is_permanent_client_error(err)) {
      // Credentials or permissions: librdkafka would retry for ever while the job looks healthy.
      if (self->permanent_.empty()) {
        self->permanent_ = std::string(rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err))) + ": " + reason;
      }
      return;
    }
    // Other errors are informational: librdkafka retries (a broker restarting, a connection refused).
    spdlog::debug("{}: librdkafka: {}: {}", self->who_, rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)),
                  reason);
  }

  KafkaClientPtr rk_;
  std::string who_;
  std::string txid_;
  std::string bootstrap_;
  int64_t timeout_ms_;
  std::function<void()> watchdog_;
  const std::atomic<bool>* cancelled_;
  std::string permanent_;  // the first authentication/authorization error of error_cb
  int since_poll_ = 0;
  bool in_transaction_ = false;  // begun and neither committed nor aborted
  int64_t failed_ = 0;
  std::string first_failure_;
  std::string fatal_;
  std::unordered_map<std::string, std::unique_ptr<rd_kafka_topic_t, LocalDeleter>> topics_;
  kafka::KafkaProperties marker_props_;  // the marker consumers' connection and security settings
  std::map<std::string, kafka::KafkaClientPtr> marker_consumers_;  // by group and isolation (marker_consumer)
  kafka::KafkaClientPtr probe_consumer_;  // probe_visibility's read_committed reader (assign only)
  std::string probe_topic_;               // the first record delivered in the current transaction
  int32_t probe_partition_ = -1;
  int64_t probe_offset_ = -1;
  std::string last_topic_name_;
  rd_kafka_topic_t* last_topic_ = nullptr;
};

std::string describe(const RuntimeContext& ctx) {
  return "Kafka sink '" + ctx.operator_name() + "' (subtask " + std::to_string(ctx.subtask_index()) + ")";
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// --------------------------------------------------------------------------------------------------------------
// settings

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
  Result<kafka::KafkaConfPtr> conf = kafka::make_kafka_conf(settings.properties, "KafkaSink");
  if (!conf.ok()) return conf.error();
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

std::string transactional_id(std::string_view prefix, int subtask, int k) {
  return std::string(prefix) + "-" + std::to_string(subtask) + "-" + std::to_string(k);
}

std::vector<std::string> lingering_transactional_ids(std::string_view prefix, int subtask, int parallelism,
                                                     int old_parallelism, int pool_size, int old_pool_size,
                                                     const std::vector<std::string>& skip) {
  std::vector<std::string> ids;
  if (prefix.empty() || parallelism <= 0) return ids;
  const std::set<std::string> skipped(skip.begin(), skip.end());
  const int subtasks = std::max(old_parallelism, parallelism);
  const int pool = std::max(old_pool_size, pool_size);
  for (int j = subtask; j < subtasks; j += parallelism) {
    for (int k = 0; k < pool; ++k) {
      std::string id = transactional_id(prefix, j, k);
      if (!skipped.contains(id)) ids.push_back(std::move(id));
    }
  }
  return ids;
}

std::optional<std::string> resolve_marker(const std::function<MarkerReading(bool require_stable)>& fetch,
                                          std::string_view token, int64_t timeout_ms, int64_t retry_ms,
                                          std::string_view who, std::string_view group,
                                          const std::function<void()>& interrupt) {
  const auto start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(timeout_ms);
  std::string last;
  bool unstable = false;
  while (true) {
    MarkerReading r = fetch(true);
    if (r.kind == MarkerReading::Kind::kOffset) return std::move(r.metadata);
    if (r.kind == MarkerReading::Kind::kNoOffset) return std::nullopt;
    last = r.error;
    unstable = r.kind == MarkerReading::Kind::kUnstable;
    {
      // No stable reading: the broker holds pending transactional offsets for the group although init_transactions
      // completed the transaction (or it did not answer in time, which a consumer's read_committed fetch also does
      // while offsets are pending). The materialized offsets hold only what committed transactions wrote: our
      // token there is proof of the commit. Another token or none proves nothing (the commit may be pending).
      MarkerReading m = fetch(false);
      if (m.kind == MarkerReading::Kind::kOffset && m.metadata == token) {
        spdlog::info(
            "{}: no stable reading of marker group '{}' ({}), but its committed offset carries token {}: that "
            "transaction was committed",
            who, group, last, token);
        return std::string(token);
      }
    }
    if (Clock::now() >= deadline) break;
    if (interrupt) interrupt();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(retry_ms, 1)));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  if (unstable) {
    fail(std::string(who) + ": cannot tell whether the transaction with token " + std::string(token) +
         " was committed: for " + std::to_string(waited) + " ms the broker answered UNSTABLE_OFFSET_COMMIT (" + last +
         ") for marker group '" + std::string(group) +
         "' although init_transactions completed the transaction, and its committed offset does not carry the "
         "token. Re-publishing could publish the transaction twice and skipping it could lose it, so the task "
         "fails and the restore asks again after the restart. Kafka 4.4 was seen to do this after a broker "
         "restart; if it persists, look at the group with kafka-consumer-groups.sh --describe --group '" +
         std::string(group) + "' and at the broker's group coordinator log");
  }
  fail(std::string(who) + ": reading the committed offset of marker group '" + std::string(group) + "' failed for " +
       std::to_string(waited) + " ms: " + last);
}

// --------------------------------------------------------------------------------------------------------------
// recovery copies

namespace {
constexpr uint8_t kHasKey = 1;
constexpr uint8_t kHasValue = 2;
constexpr uint8_t kSameTopic = 4;
}  // namespace

void RecoveryCopyWriter::append(const KafkaProducerRecord& record, int32_t partition, int64_t timestamp_ms) {
  uint8_t flags = 0;
  if (record.has_key()) flags |= kHasKey;
  if (record.has_value()) flags |= kHasValue;
  const bool same_topic = count_ > 0 && record.topic == last_topic_;
  if (same_topic) flags |= kSameTopic;
  out_.write_u8(flags);
  if (!same_topic) {
    out_.write_string(record.topic);
    last_topic_ = record.topic;
  }
  out_.write_signed_varint(partition);
  out_.write_signed_varint(timestamp_ms);
  if (record.has_key()) out_.write_string(record.key());
  if (record.has_value()) out_.write_string(record.value());
  out_.write_varint(record.headers.size());
  for (const KafkaHeader& h : record.headers) {
    out_.write_string(h.key);
    out_.write_u8(h.value ? 1 : 0);
    if (h.value) out_.write_string(*h.value);
  }
  ++count_;
}

std::string RecoveryCopyWriter::take() {
  std::string bytes(out_.view());
  out_.clear();
  last_topic_.clear();
  count_ = 0;
  return bytes;
}

bool RecoveryCopyReader::next(RecoveryRecord& out) {
  if (in_.at_end()) return false;
  const uint8_t flags = in_.read_u8();
  if ((flags & ~(kHasKey | kHasValue | kSameTopic)) != 0) in_.fail("unknown recovery record flags");
  if ((flags & kSameTopic) != 0) {
    if (last_topic_.empty()) in_.fail("a recovery record repeats the topic of no previous record");
  } else {
    last_topic_ = in_.read_view(in_.read_length());
  }
  out.topic = last_topic_;
  out.partition = static_cast<int32_t>(in_.read_signed_varint());
  out.timestamp_ms = in_.read_signed_varint();
  out.key.reset();
  out.value.reset();
  if ((flags & kHasKey) != 0) out.key = in_.read_view(in_.read_length());
  if ((flags & kHasValue) != 0) out.value = in_.read_view(in_.read_length());
  out.headers.clear();
  const uint64_t headers = in_.read_varint();
  for (uint64_t i = 0; i < headers; ++i) {
    std::string_view name = in_.read_view(in_.read_length());
    std::optional<std::string_view> value;
    if (in_.read_u8() != 0) value = in_.read_view(in_.read_length());
    out.headers.emplace_back(name, value);
  }
  return true;
}

// --------------------------------------------------------------------------------------------------------------
// the producer pool of one subtask

class KafkaProducerPool {
 public:
  enum class SlotState { kIdle, kOpen, kPrecommitted };
  struct Slot {
    std::unique_ptr<Producer> producer;
    SlotState state = SlotState::kIdle;
    std::string token;
  };

  KafkaProducerPool(const KafkaSinkSettings& settings, RuntimeContext& ctx)
      : settings(settings),
        who(describe(ctx)),
        subtask(ctx.subtask_index()),
        parallelism(std::max(ctx.parallelism(), 1)),
        transactional(settings.guarantee == DeliveryGuarantee::kExactlyOnce && ctx.is_checkpointing_enabled()) {
    if (transactional) slots.resize(static_cast<size_t>(settings.pool_size));
    cancelled = current_task_cancel_flag();
    std::random_device rd;
    token_base = hex64((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(wall_ms()));
  }

  std::string own_id(int k) const { return transactional_id(settings.transactional_id_prefix, subtask, k); }

  /// The pool index of `id` when it is one of this subtask's current ids, else -1.
  int index_of(const std::string& id) const {
    for (size_t k = 0; k < slots.size(); ++k) {
      if (own_id(static_cast<int>(k)) == id) return static_cast<int>(k);
    }
    return -1;
  }

  std::unique_ptr<Producer> make_producer(const std::string& txid) const {
    return std::make_unique<Producer>(settings, txid, who, watchdog, cancelled);
  }

  std::string next_token() { return token_base + "-" + std::to_string(++token_counter); }

  /// Confirms the transactions committed and not yet confirmed from their probe records, and returns those still
  /// pending, as committables marked `committed`, for the checkpoint being taken. Called at each checkpoint,
  /// before the pre-commit: a commit the broker acknowledged can still be lost when the broker shuts down right
  /// after it (the chaos suite lost checkpoint 12's three transactions, committed 85 ms before a broker restart).
  /// So a committed transaction stays in every checkpoint until its record is seen; one the broker aborted fails
  /// this checkpoint, and the restore of the last completed one, which holds it, re-publishes it.
  /// The check waits briefly (kConfirmWaitMs per transaction): the record is readable only once the partition's
  /// last stable offset is past it, which other subtasks' transactions, open until their own checkpoint
  /// notification, can hold back for a while; blocking the task for them could wait on a subtask that waits for
  /// this one. Pending for longer than the operation timeout fails the task naming the transaction that holds
  /// the partition and the remedy (hanging_transaction_text).
  /// With kBeforeCommit (called before this subtask commits its next transaction) nothing may stay pending:
  /// it waits up to kConfirmBeforeCommitMs in all, then fails the task. A later transaction of this subtask can
  /// hold the same keys (keyed input goes to one subtask), and committing it while an earlier one might still
  /// turn out aborted would put the earlier one's re-publication after it: per-key order broken (seen in a chaos
  /// run before this wait: revisions 13-18 of a key after 19-22). The restore after the failure settles both in
  /// checkpoint order. kInputEnded (after the commits of the checkpoint that follows the end of the input) waits
  /// the same way: no checkpoint comes after it to carry a pending transaction, so a commit the broker lost would
  /// otherwise go unnoticed as the task finishes; failing the task instead makes the restore of that checkpoint
  /// re-publish it.
  std::vector<KafkaCommittable> confirm_commits(ConfirmWait wait = ConfirmWait::kCheckpoint) {
    const bool before_commit = wait != ConfirmWait::kCheckpoint;
    std::vector<KafkaCommittable> pending;
    if (committed_unconfirmed.empty()) return pending;
    if (!marker_reader) marker_reader = make_producer("");
    const Clock::time_point deadline =
        deadline_after(before_commit ? std::min<int64_t>(settings.operation_timeout_ms, kConfirmBeforeCommitMs) : 0);
    for (auto it = committed_unconfirmed.begin(); it != committed_unconfirmed.end();) {
      const KafkaCommittable& c = it->committable;
      if (c.probe_offset < 0) {  // no record: nothing to lose
        it = committed_unconfirmed.erase(it);
        continue;
      }
      // The data decides, not the marker group: after a broker restart a marker group's offsets were seen to stay
      // pending for minutes both for a commit the broker lost and for one it made (docs/benchmarks.md).
      const Producer::Probe probe =
          marker_reader->probe_visibility(c.probe_topic, c.probe_partition, c.probe_offset,
                                          before_commit ? std::max(remaining_ms(deadline), 1) : kConfirmWaitMs);
      if (probe.visibility == Producer::Visibility::kCommitted) {
        it = committed_unconfirmed.erase(it);
        continue;
      }
      std::string message;
      if (probe.visibility == Producer::Visibility::kAborted) {
        message = who + ": transaction " + c.transactional_id + " (token " + c.token + ", " +
                  std::to_string(c.record_count) + " records) was acknowledged as committed but its records are not " +
                  "visible: the broker lost the commit (seen when it restarted right after; its record " +
                  c.probe_topic + " [" + std::to_string(c.probe_partition) + "] offset " +
                  std::to_string(c.probe_offset) +
                  " was skipped as aborted). The checkpoint fails; the restore of the last completed checkpoint, "
                  "which holds the transaction, re-publishes it";
      } else {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - it->since).count();
        if (waited < settings.operation_timeout_ms && !before_commit) {
          pending.push_back(c);
          pending.back().committed = true;
          ++it;
          continue;
        }
        if (waited < settings.operation_timeout_ms) {
          message = who + ": transaction " + c.transactional_id + " (token " + c.token + ", " +
                    std::to_string(c.record_count) + " records), committed " + std::to_string(waited) +
                    " ms ago, is not confirmed yet: its record " + c.probe_topic + " [" +
                    std::to_string(c.probe_partition) + "] offset " + std::to_string(c.probe_offset) +
                    " is not readable by read_committed readers (the partition's last stable offset is " +
                    std::to_string(probe.last_stable_offset) +
                    (wait == ConfirmWait::kInputEnded
                         ? "). The input ended and no later checkpoint would carry it: the task fails and the restore "
                           "of the last checkpoint settles it"
                         : "). This subtask's next transaction is not committed before it (per-key order); the task "
                           "fails and the restore settles both in order");
        } else {
          message =
              who + ": " +
              hanging_transaction_text("transaction " + c.transactional_id + " (token " + c.token + ", " +
                                           std::to_string(c.record_count) +
                                           " records) was acknowledged as committed but is not visible",
                                       c.transactional_id, c.probe_topic, c.probe_partition, c.probe_offset,
                                       probe.last_stable_offset, probe.leader, waited, marker_reader->bootstrap());
        }
      }
      committed_unconfirmed.clear();
      spdlog::error("{}", message);
      fail(message);
    }
    return pending;
  }

  /// Notes a committed transaction (or a restored one, settled) for confirm_commits; `c.committed` ones that are
  /// noted already are not noted twice.
  void note_committed(const KafkaCommittable& c) {
    for (const Unconfirmed& u : committed_unconfirmed) {
      if (u.committable.token == c.token) return;
    }
    committed_unconfirmed.push_back(Unconfirmed{c, Clock::now()});
  }

  /// Destroys the producers, in parallel (each may abort an open transaction, which takes a round trip or, with
  /// the broker away, up to 5 s).
  void close() {
    std::vector<std::thread> threads;
    for (Slot& slot : slots) {
      if (slot.producer) threads.emplace_back([p = std::move(slot.producer)]() mutable { p.reset(); });
    }
    slots.clear();
    plain.reset();
    marker_reader.reset();
    for (std::thread& t : threads)
      t.join();
  }

  const KafkaSinkSettings settings;
  const std::string who;
  const int subtask;
  const int parallelism;
  const bool transactional;
  std::vector<Slot> slots;          // transactional producers (exactly-once)
  std::unique_ptr<Producer> plain;  // the producer of none / at-least-once
  // Committed and not yet confirmed (confirm_commits), with the time of the commit; task thread only.
  struct Unconfirmed {
    KafkaCommittable committable;
    Clock::time_point since;
  };
  std::vector<Unconfirmed> committed_unconfirmed;
  std::unique_ptr<Producer> marker_reader;  // non-transactional: reads marker groups
  bool input_ended = false;                 // the writer was flushed at the end of the input (task thread)
  // Restored transactions that were not committed (abort_lingering), with the evidence, in checkpoint order: the
  // writer re-publishes them in its first transaction (republish_restored). Task thread.
  std::vector<std::pair<KafkaCommittable, std::string>> to_republish;
  std::string token_base;
  int64_t token_counter = 0;
  // Checked between the slices of the producers' blocking waits: the writer's liveness probe (set by the writer;
  // holds the probe) and the cancellation flag of the task that made the pool.
  std::function<void()> watchdog;
  const std::atomic<bool>* cancelled = nullptr;
};

std::shared_ptr<KafkaProducerPool> make_producer_pool(const KafkaSinkSettings& settings, RuntimeContext& ctx) {
  return std::make_shared<KafkaProducerPool>(settings, ctx);
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

// --------------------------------------------------------------------------------------------------------------
// writer

struct KafkaSinkWriterCore::Impl {
  Impl(const KafkaSinkSettings& s, RuntimeContext& ctx, std::shared_ptr<KafkaProducerPool> p,
       std::shared_ptr<DeadLetterFile> dlq)
      : settings(s), pool(std::move(p)), dead_letter(std::move(dlq)) {
    auto& state = ctx.operator_state().get_union_list_state<KafkaSinkWriterState>(kWriterStateName);
    state.update({KafkaSinkWriterState{ctx.subtask_index(), std::max(ctx.parallelism(), 1), settings.pool_size,
                                       settings.transactional_id_prefix}});
    if (settings.liveness_timeout_ms > 0) {
      liveness = kafka::KafkaLivenessProbe::start(RD_KAFKA_PRODUCER, producer_properties(settings, ""),
                                                  std::chrono::milliseconds(settings.liveness_timeout_ms), pool->who)
                     .value_or_throw();
      pool->watchdog = [probe = liveness] {
        if (std::optional<std::string> f = probe->failure()) fail(*f);
      };
    }
    if (!pool->transactional) pool->plain = pool->make_producer("");
    // A topic that does not exist fails at open, naming it (not after a delivery or transaction timeout).
    std::vector<std::string> topics;
    if (!settings.topic.empty()) topics.push_back(settings.topic);
    if (!settings.marker_topic.empty() && settings.marker_topic != settings.topic) {
      topics.push_back(settings.marker_topic);
    }
    if (!topics.empty()) {
      std::unique_ptr<Producer> checker = pool->transactional ? pool->make_producer("") : nullptr;
      Producer& p = checker ? *checker : *pool->plain;
      for (const std::string& t : topics)
        p.check_topic(t, std::min<int64_t>(settings.operation_timeout_ms, kTopicCheckMs));
    }
  }

  // The longest wait for the broker's answer about the sink's topic at open.
  static constexpr int64_t kTopicCheckMs = 10'000;

  // Fails the task when no broker answered for the liveness timeout (checked at records and checkpoints).
  void check_liveness() const {
    if (!liveness) return;
    if (std::optional<std::string> f = liveness->failure()) fail(*f);
  }

  // The restored transactions abort_lingering found not committed, produced again from their recovery copies, in
  // checkpoint order, into this writer's first transaction ahead of any new record (per-key order) and into its
  // recovery copy (a loss of this transaction re-publishes them again).
  void republish_restored() {
    if (pool->to_republish.empty()) return;
    Producer& p = open_transaction();
    KafkaProducerRecord rec;
    for (const auto& [c, evidence] : pool->to_republish) {
      RecoveryCopyReader reader(c.records);
      RecoveryRecord r;
      int64_t n = 0;
      while (reader.next(r)) {
        if (std::optional<std::string> rejected =
                p.produce(r.topic, r.partition, r.key, r.value, r.headers.empty() ? nullptr : &r.headers, nullptr,
                          r.timestamp_ms)) {
          fail(pool->who + ": re-publishing transaction " + c.transactional_id + ": record " + std::to_string(n) +
               " of its recovery copy (topic '" + std::string(r.topic) + "') was refused: " + *rejected +
               " (was message.max.bytes lowered since it was written?)");
        }
        rec.clear();
        rec.topic.assign(r.topic);
        if (r.key) {
          rec.set_key(*r.key);
        } else {
          rec.set_null_key();
        }
        if (r.value) {
          rec.set_value(*r.value);
        } else {
          rec.set_null_value();
        }
        for (const auto& [name, v] : r.headers)
          rec.headers.push_back(KafkaHeader{std::string(name), v ? std::optional<std::string>(*v) : std::nullopt});
        copy.append(rec, r.partition, r.timestamp_ms);
        // A sink with a topic selector and no default topic has no marker topic before its first record.
        if (marker_topic.empty()) marker_topic = rec.topic;
        ++n;
      }
      spdlog::info(
          "{}: transaction {} (token {}) was not committed before the restart ({}): its {} records are re-published "
          "in transaction {} (token {}), committed with the next checkpoint",
          pool->who, c.transactional_id, c.token, evidence, n, p.transactional_id(),
          pool->slots[static_cast<size_t>(current)].token);
    }
    pool->to_republish.clear();
    republished_bytes = copy.bytes();
  }

  // The producer of the open transaction (opens one on the lowest idle producer when there is none).
  Producer& open_transaction() {
    if (current >= 0) return *pool->slots[static_cast<size_t>(current)].producer;
    int k = -1;
    for (size_t i = 0; i < pool->slots.size(); ++i) {
      if (pool->slots[i].state == KafkaProducerPool::SlotState::kIdle) {
        k = static_cast<int>(i);
        break;
      }
    }
    if (k < 0) {
      fail(pool->who + ": all " + std::to_string(pool->slots.size()) +
           " transactional producers hold pre-committed transactions whose checkpoints have not completed yet; "
           "raise producer_pool_size() or make checkpoints complete (too many failing or slow checkpoints)");
    }
    KafkaProducerPool::Slot& slot = pool->slots[static_cast<size_t>(k)];
    if (!slot.producer) {
      slot.producer = pool->make_producer(pool->own_id(k));
      slot.producer->init_transactions();
    }
    slot.producer->begin_transaction();
    slot.state = KafkaProducerPool::SlotState::kOpen;
    slot.token = pool->next_token();
    current = k;
    marker_topic = settings.marker_topic.empty() ? settings.topic : settings.marker_topic;
    return *slot.producer;
  }

  Producer& metadata_producer() { return pool->transactional ? open_transaction() : *pool->plain; }

  // fdatasync()s the dead letters written so far: before a checkpoint records positions past them.
  void sync_dead_letters() {
    if (dead_letter && dead_letters_unsynced) {
      dead_letter->sync().value_or_throw();
      dead_letters_unsynced = false;
    }
  }

  KafkaSinkSettings settings;
  std::shared_ptr<KafkaProducerPool> pool;
  std::shared_ptr<DeadLetterFile> dead_letter;
  std::shared_ptr<kafka::KafkaLivenessProbe> liveness;
  bool dead_letters_unsynced = false;
  int64_t dead_letters = 0;
  int current = -1;  // slot of the open transaction
  std::string marker_topic;
  RecoveryCopyWriter copy;
  // Bytes of `copy` that republish_restored() put there: not counted against max_transaction_bytes, which bounds
  // what the open epoch adds (restored copies of several lost transactions may sum above it, and counting them would
  // fail every restart at its first record).
  size_t republished_bytes = 0;
  struct CachedCount {
    int32_t count;
    Clock::time_point fetched;
  };
  std::unordered_map<std::string, CachedCount> partition_counts;
};

KafkaSinkWriterCore::KafkaSinkWriterCore(const KafkaSinkSettings& settings, RuntimeContext& ctx,
                                         std::shared_ptr<KafkaProducerPool> pool,
                                         std::shared_ptr<DeadLetterFile> dead_letter)
    : impl_(std::make_unique<Impl>(settings, ctx, std::move(pool), std::move(dead_letter))) {
  if (impl_->settings.on_bad_record == BadRecordPolicy::kDeadLetter && !impl_->dead_letter) {
    fail(impl_->pool->who + ": on_bad_record(kDeadLetter) without a dead-letter file");
  }
  if (impl_->pool->transactional) impl_->republish_restored();
}

KafkaSinkWriterCore::~KafkaSinkWriterCore() = default;

bool KafkaSinkWriterCore::transactional() const noexcept {
  return impl_->pool->transactional;
}

std::optional<std::string> KafkaSinkWriterCore::write(const KafkaProducerRecord& record, int64_t event_timestamp) {
  Impl& s = *impl_;
  if (record.topic.empty()) fail(s.pool->who + ": a record has no topic (the serializer or topic selector gave none)");
  s.check_liveness();
  int64_t ts = 0;
  if (record.timestamp_ms) {
    ts = *record.timestamp_ms;
  } else if (event_timestamp != kNoTimestamp && event_timestamp > 0) {
    ts = event_timestamp;
  }
  std::optional<std::string_view> key;
  if (record.has_key()) key = record.key();
  std::optional<std::string_view> value;
  if (record.has_value()) value = record.value();
  const std::vector<KafkaHeader>* headers = record.headers.empty() ? nullptr : &record.headers;
  if (!s.pool->transactional) {
    return s.pool->plain->produce(record.topic, record.partition, key, value, nullptr, headers, ts);
  }
  // The recovery copy is freed only by the pre-commit at the next checkpoint barrier: bound it, failing (the task
  // restarts from the last checkpoint) rather than growing until the process dies. Blocking here instead would
  // hold back the very barrier that frees it.
  const size_t record_bytes = record.topic.size() + record.key().size() + record.value().size() + 16;
  if (static_cast<int64_t>(s.copy.bytes() - s.republished_bytes + record_bytes) > s.settings.max_transaction_bytes) {
    fail(s.pool->who + ": the open transaction holds " + std::to_string(s.copy.count()) + " records (" +
         std::to_string(s.copy.bytes()) +
         " bytes in its recovery copy) and the next record would exceed "
         "max_transaction_bytes (" +
         std::to_string(s.settings.max_transaction_bytes) +
         " bytes; pipelines: max-transaction-bytes): no checkpoint barrier reached the sink to pre-commit it. Are "
         "checkpoints stalled or their interval too long for this output rate? Raise the bound or shorten the "
         "checkpoint interval");
  }
  Producer& p = s.open_transaction();
  if (s.marker_topic.empty()) s.marker_topic = record.topic;
  std::optional<std::string> rejected = p.produce(record.topic, record.partition, key, value, nullptr, headers, ts);
  if (!rejected) s.copy.append(record, record.partition, ts);
  return rejected;
}

void KafkaSinkWriterCore::bad_record(const KafkaProducerRecord& record, const std::string& reason,
                                     const std::string& position) {
  Impl& s = *impl_;
  const size_t size = record.key().size() + record.value().size();
  std::string key_text(record.key().substr(0, 200));
  if (s.settings.on_bad_record == BadRecordPolicy::kFail || !s.dead_letter) {
    fail(s.pool->who + ": cannot write a record to topic '" + record.topic + "' (key " +
         (record.has_key() ? "'" + key_text + "'" : std::string("null")) + ", " + std::to_string(size) +
         " bytes of key and value" + (position.empty() ? std::string() : ", source position " + position) +
         "): " + reason +
         ". Set a dead-letter sink (pipelines: pipeline.dead-letter) to divert such records, or "
         "raise message.max.bytes (and the topic's max.message.bytes)");
  }
  Value entry = Value::object();
  entry.set("sink", Value::string("kafka"));
  entry.set("operator", Value::string(s.pool->who));
  entry.set("topic", Value::string(record.topic));
  if (record.partition != KafkaProducerRecord::kAnyPartition) entry.set("partition", Value(record.partition));
  entry.set("key", record.has_key() ? Value::string(record.key()) : Value());
  entry.set("position", Value::string(position));
  entry.set("reason", Value::string(dead_letter_reason::kTooLarge));  // the producer's only content refusal
  entry.set("error", Value::string(reason));
  entry.set("size", Value(static_cast<int64_t>(size)));
  entry.set("record", record.has_value() ? Value::string(record.value()) : Value());
  s.dead_letter->append(entry).value_or_throw();
  s.dead_letters_unsynced = true;
  if (s.dead_letters++ == 0) {
    spdlog::warn("{}: a record for topic '{}' ({} bytes{}) was refused and written to the dead-letter file {}: {}",
                 s.pool->who, record.topic, size, position.empty() ? std::string() : ", source position " + position,
                 s.dead_letter->path(), reason);
  }
}

int64_t KafkaSinkWriterCore::dead_letters() const noexcept {
  return impl_->dead_letters;
}

int32_t KafkaSinkWriterCore::partition_count(const std::string& topic) {
  Impl& s = *impl_;
  auto it = s.partition_counts.find(topic);
  if (it != s.partition_counts.end() && Clock::now() - it->second.fetched < std::chrono::minutes(1)) {
    return it->second.count;
  }
  const int32_t count = s.metadata_producer().fetch_partition_count(topic);
  s.partition_counts[topic] = Impl::CachedCount{count, Clock::now()};
  return count;
}

void KafkaSinkWriterCore::flush(bool end_of_input) {
  Impl& s = *impl_;
  s.sync_dead_letters();
  s.check_liveness();
  if (!s.pool->transactional) {
    if (s.settings.guarantee == DeliveryGuarantee::kNone && !end_of_input) {
      s.pool->plain->poll();
    } else {
      s.pool->plain->flush();
    }
    return;
  }
  if (s.current >= 0) s.pool->slots[static_cast<size_t>(s.current)].producer->flush();
  if (end_of_input) s.pool->input_ended = true;
}

std::vector<KafkaCommittable> KafkaSinkWriterCore::prepare_commit() {
  Impl& s = *impl_;
  s.sync_dead_letters();
  s.check_liveness();
  if (!s.pool->transactional) return {};
  // Committed transactions not confirmed yet go into this checkpoint again (first: a restore settles them first).
  std::vector<KafkaCommittable> out = s.pool->confirm_commits();
  if (s.current < 0) return out;
  KafkaProducerPool::Slot& slot = s.pool->slots[static_cast<size_t>(s.current)];
  // Every record of this epoch is acknowledged before the next epoch's producer writes to the same partitions:
  // otherwise a later epoch's record can take a lower offset, and read_committed readers see the key's records
  // out of order (commit_transaction would flush too, but after the next epoch started; measured: per-key order
  // violations in KafkaSinkIntegrationTest.ExactlyOnceUnderInjectedFailures).
  slot.producer->flush();
  KafkaCommittable c;
  c.transactional_id = slot.producer->transactional_id();
  c.subtask = s.pool->subtask;
  c.token = slot.token;
  c.marker_topic = s.marker_topic;
  c.precommit_time_ms = wall_ms();
  slot.producer->send_marker(c.marker_topic, c.precommit_time_ms, c.token);
  c.record_count = s.copy.count();
  c.records = s.copy.take();
  s.republished_bytes = 0;
  slot.producer->fill_probe(c);
  slot.state = KafkaProducerPool::SlotState::kPrecommitted;
  s.current = -1;
  out.push_back(std::move(c));
  return out;
}

void KafkaSinkWriterCore::close() {
  impl_->pool->watchdog = nullptr;
  impl_->liveness.reset();
  impl_->current = -1;
  impl_->pool->close();
}

// --------------------------------------------------------------------------------------------------------------
// committer

namespace {

// Makes sure committable `c` is visible exactly once (see the file comment of kafka_sink.h), with `producer`, of
// c's transactional id, on which init_transactions completed: either "already committed" (its probe record is
// visible; for a version-1 committable, the marker carries its token) or a re-publication of its recovery copy,
// after which `c`'s probe record is the re-published one. Leaves the producer without an open transaction.
// Whether restored transaction `c` was committed (true), or not (false: `evidence` says why). Call after
// init_transactions on its id, which completed the id's transactions. Fails the task when it cannot tell.
bool restored_transaction_committed(const KafkaProducerPool& pool, Producer& producer, const KafkaCommittable& c,
                                    std::string& evidence) {
  Producer* p = &producer;
  if (c.probe_offset >= 0) {
    // The data decides (see confirm_commits): init_transactions completed every transaction of the id the broker
    // knows, so the record is readable, or skipped as aborted.
    const auto start = Clock::now();
    const Producer::Probe probe =
        p->probe_visibility(c.probe_topic, c.probe_partition, c.probe_offset, pool.settings.operation_timeout_ms);
    p->drop_probe_consumer();
    const std::string record =
        c.probe_topic + " [" + std::to_string(c.probe_partition) + "] offset " + std::to_string(c.probe_offset);
    if (probe.visibility == Producer::Visibility::kCommitted) {
      spdlog::info("{}: transaction {} ({} records) was committed before the restart (its record {} is visible)",
                   pool.who, c.transactional_id, c.record_count, record);
      return true;
    }
    if (probe.visibility == Producer::Visibility::kPending) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      const std::string message =
          pool.who + ": " +
          hanging_transaction_text("cannot tell whether restored transaction " + c.transactional_id + " (token " +
                                       c.token + ", " + std::to_string(c.record_count) +
                                       " records) was committed, although init_transactions completed its id's "
                                       "transactions",
                                   c.transactional_id, c.probe_topic, c.probe_partition, c.probe_offset,
                                   probe.last_stable_offset, probe.leader, waited, p->bootstrap());
      spdlog::error("{}", message);
      fail(message);
    }
    evidence = "its record " + record + " is skipped as aborted";
  } else {
    // A committable of format version 1 (no probe record): its marker group decides, as it did then.
    std::optional<std::string> marker = p->read_marker(c.marker_topic, c.token);
    if (marker && *marker == c.token) {
      spdlog::info("{}: transaction {} ({} records) was committed before the restart", pool.who, c.transactional_id,
                   c.record_count);
      return true;
    }
    evidence = "its marker group holds " + (marker ? "token " + *marker : std::string("no offset"));
  }
  return false;
}

// Settles restored transaction `c` at once: committed, nothing to do; not committed, its recovery copy is produced
// again in a new transaction on `producer` with the marker, and committed. For a committer used without its writer
// only: abort_lingering leaves the re-publication to the writer's first transaction instead (see there).
void settle(const KafkaProducerPool& pool, Producer& producer, KafkaCommittable& c) {
  Producer* p = &producer;
  std::string evidence;
  if (restored_transaction_committed(pool, producer, c, evidence)) return;
  p->begin_transaction();
  RecoveryCopyReader reader(c.records);
  RecoveryRecord r;
  int64_t n = 0;
  while (reader.next(r)) {
    if (std::optional<std::string> rejected = p->produce(
            r.topic, r.partition, r.key, r.value, r.headers.empty() ? nullptr : &r.headers, nullptr, r.timestamp_ms)) {
      fail(pool.who + ": re-publishing transaction " + c.transactional_id + ": record " + std::to_string(n) +
           " of its recovery copy (topic '" + std::string(r.topic) + "') was refused: " + *rejected +
           " (was message.max.bytes lowered since it was written?)");
    }
    ++n;
  }
  p->flush();
  p->fill_probe(c);  // the copy's records as now placed: what the next checkpoint confirms
  p->send_marker(c.marker_topic, wall_ms(), c.token);
  p->commit_transaction();
  spdlog::info("{}: transaction {} (token {}) was not committed before the restart ({}): re-published its {} records",
               pool.who, c.transactional_id, c.token, evidence, n);
}

// Runs init_transactions for each id (aborting what is open), at most 8 at a time. Returns the producers.
std::vector<std::unique_ptr<Producer>> init_all(const KafkaProducerPool& pool, const std::vector<std::string>& ids) {
  std::vector<std::unique_ptr<Producer>> producers(ids.size());
  std::vector<std::exception_ptr> errors(ids.size());
  constexpr size_t kConcurrency = 8;
  for (size_t begin = 0; begin < ids.size(); begin += kConcurrency) {
    std::vector<std::thread> threads;
    const size_t end = std::min(ids.size(), begin + kConcurrency);
    for (size_t i = begin; i < end; ++i) {
      threads.emplace_back([&, i] {
        try {
          producers[i] = pool.make_producer(ids[i]);
          producers[i]->init_transactions();
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (std::thread& t : threads)
      t.join();
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return producers;
}

}  // namespace

KafkaSinkCommitter::KafkaSinkCommitter(KafkaSinkSettings settings, std::shared_ptr<KafkaProducerPool> pool)
    : settings_(std::move(settings)), pool_(std::move(pool)) {}

KafkaSinkCommitter::~KafkaSinkCommitter() = default;

void KafkaSinkCommitter::commit(std::vector<KafkaCommittable>& committables) {
  if (!restore_done_) return;  // restored committables: abort_lingering settles them (by owner, in order)
  // This subtask's earlier commits are confirmed first (per-key order, see confirm_commits).
  if (pool_->transactional &&
      std::any_of(committables.begin(), committables.end(), [](const KafkaCommittable& c) { return !c.committed; })) {
    pool_->confirm_commits(ConfirmWait::kBeforeCommit);
  }
  for (const KafkaCommittable& c : committables) {
    // Committed already, carried on until confirmed (confirm_commits), which may have happened by now (a later
    // checkpoint's pre-commit can come before this notification): nothing to commit. A restore settles these.
    if (c.committed) continue;
    const int k = pool_->index_of(c.transactional_id);
    KafkaProducerPool::Slot* slot = k >= 0 ? &pool_->slots[static_cast<size_t>(k)] : nullptr;
    if (slot != nullptr && slot->producer && slot->state == KafkaProducerPool::SlotState::kPrecommitted &&
        slot->token == c.token) {
      try {
        slot->producer->commit_transaction();
      } catch (const SluiceException& e) {
        slot->producer.reset();
        slot->state = KafkaProducerPool::SlotState::kIdle;
        throw SluiceException(
            Error(ErrorCode::kConnector, e.error().message() +
                                             "; the task restarts and the restore re-publishes this transaction's "
                                             "records from the checkpoint"));
      }
      slot->state = KafkaProducerPool::SlotState::kIdle;
      slot->token.clear();
      pool_->note_committed(c);
      continue;
    }
    // Not held by this subtask's writer (a committer used without its writer): settle it like a restored one.
    KafkaCommittable settled = c;
    std::unique_ptr<Producer> p = pool_->make_producer(c.transactional_id);
    p->init_transactions();
    settle(*pool_, *p, settled);
    pool_->note_committed(settled);
    if (k >= 0 && slot != nullptr && slot->state == KafkaProducerPool::SlotState::kIdle) slot->producer = std::move(p);
  }
  // After the end of the input no checkpoint follows to confirm these commits: confirmed now (see confirm_commits).
  if (pool_->transactional && pool_->input_ended) pool_->confirm_commits(ConfirmWait::kInputEnded);
}

void KafkaSinkCommitter::abort_lingering(RuntimeContext& ctx, const std::vector<KafkaCommittable>& restored) {
  const int subtask = ctx.subtask_index();
  const int parallelism = std::max(ctx.parallelism(), 1);
  const std::string& prefix = settings_.transactional_id_prefix;

  // Ids and pool sizes of the run that took the restored checkpoint (this run's when there is none).
  int old_parallelism = parallelism;
  int old_pool = settings_.pool_size;
  auto& writers = ctx.operator_state().get_union_list_state<KafkaSinkWriterState>(kWriterStateName);
  bool found = false;
  for (const KafkaSinkWriterState& w : writers.get()) {
    if (w.transactional_id_prefix != prefix) continue;
    old_parallelism = found ? std::max(old_parallelism, w.parallelism) : w.parallelism;
    old_pool = found ? std::max(old_pool, w.pool_size) : w.pool_size;
    found = true;
  }

  // 1. init_transactions on every id this subtask succeeds: the restored committables' ids and the rest of the
  // range, which aborts what a previous run left open. All before any record is read back: a record is readable
  // only once every transaction that started before it on its partition ended, and those of the other subtasks'
  // ids end when those subtasks run this step, which they do without waiting for anyone.
  std::vector<const KafkaCommittable*> mine;
  std::vector<std::string> ids;
  for (const KafkaCommittable& c : restored) {
    if (!owns_committable(c.subtask, subtask, parallelism)) continue;
    mine.push_back(&c);
    if (std::find(ids.begin(), ids.end(), c.transactional_id) == ids.end()) ids.push_back(c.transactional_id);
  }
  const std::vector<std::string> settled_ids = ids;
  for (std::string& id : lingering_transactional_ids(prefix, subtask, parallelism, old_parallelism, settings_.pool_size,
                                                     old_pool, settled_ids)) {
    ids.push_back(std::move(id));
  }
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Producer>> producers = init_all(*pool_, ids);

  // 2. The restored committables, in checkpoint order: committed, or to be re-published from their recovery copies.
  // Not re-published and committed here: a failure before the next checkpoint completes restores the same
  // checkpoint, whose committable still names the aborted original, and would publish the copy a second time. The
  // writer's first transaction carries the copies instead (republish_restored), committed with the next checkpoint:
  // lost with that transaction when the task fails before, published once when it completes.
  for (const KafkaCommittable* c : mine) {
    const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), c->transactional_id) - ids.begin());
    std::string evidence;
    if (!restored_transaction_committed(*pool_, *producers[i], *c, evidence)) {
      pool_->to_republish.emplace_back(*c, std::move(evidence));
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int k = pool_->index_of(ids[i]);
    if (k >= 0) pool_->slots[static_cast<size_t>(k)].producer = std::move(producers[i]);
  }
  spdlog::debug("{}: initialized {} transactional ids and settled {} restored transactions in {} ms", pool_->who,
                ids.size(), mine.size(),
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  // Producers kept for the writer's pool only make sense for a transactional writer.
  if (!pool_->transactional) pool_->slots.clear();
  restore_done_ = true;
}

}  // namespace detail

void TypeSerializer<KafkaCommittable>::serialize(const KafkaCommittable& v, DataOutput& out) {
  // Version 1's fields, as SLUICE_FIELDS encoded them, then the version and what it added.
  ::sluice::serialize(v.transactional_id, out);
  ::sluice::serialize(v.subtask, out);
  ::sluice::serialize(v.token, out);
  ::sluice::serialize(v.marker_topic, out);
  ::sluice::serialize(v.precommit_time_ms, out);
  ::sluice::serialize(v.record_count, out);
  ::sluice::serialize(v.records, out);
  out.write_varint(kKafkaCommittableFormatVersion);
  ::sluice::serialize(v.probe_topic, out);
  ::sluice::serialize(v.probe_partition, out);
  ::sluice::serialize(v.probe_offset, out);
  ::sluice::serialize(v.committed, out);
}

void TypeSerializer<KafkaCommittable>::deserialize(KafkaCommittable& target, DataInput& in) {
  ::sluice::deserialize(target.transactional_id, in);
  ::sluice::deserialize(target.subtask, in);
  ::sluice::deserialize(target.token, in);
  ::sluice::deserialize(target.marker_topic, in);
  ::sluice::deserialize(target.precommit_time_ms, in);
  ::sluice::deserialize(target.record_count, in);
  ::sluice::deserialize(target.records, in);
  target.probe_topic.clear();
  target.probe_partition = -1;
  target.probe_offset = -1;
  target.committed = false;
  if (in.at_end()) return;  // version 1: no probe record, settled by the marker group
  const uint64_t version = in.read_varint();
  if (version != kKafkaCommittableFormatVersion) {
    in.fail("Kafka sink committable of transactional id '" + target.transactional_id + "' has format version " +
            std::to_string(version) + ", which this Sluice does not read (it reads versions 1 and " +
            std::to_string(kKafkaCommittableFormatVersion) + ")");
  }
  ::sluice::deserialize(target.probe_topic, in);
  ::sluice::deserialize(target.probe_partition, in);
  ::sluice::deserialize(target.probe_offset, in);
  ::sluice::deserialize(target.committed, in);
}

}  // namespace sluice
