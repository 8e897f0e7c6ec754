// Private to src/sluice/connectors/kafka/: Producer, one librdkafka producer of the Kafka sink with its
// delivery-report bookkeeping, transactions, the marker and probe-record reads, and the text of a hanging
// transaction. Implemented in kafka_producer.cc. Not installed.
#pragma once

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kafka_sink_internals.h"
#include "sluice/connectors/kafka/kafka_common.h"
#include "sluice/connectors/kafka/kafka_record.h"
#include "sluice/connectors/kafka/kafka_sink.h"

namespace sluice {
namespace kafka_sink_internal {

using detail::MarkerReading;
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

// A read_committed reader cannot get past a transaction that is still open: the partition's last stable offset
// (LSO) stays at its first record. One that no producer will ever end is a hanging transaction (KIP-664): seen with
// Kafka 4.4 when a broker restarted right after acknowledging a commit. librdkafka 2.0.2 has no Admin API to abort
// it (no DescribeProducers, no WriteTxnMarkers), so the sink names it and the remedy, and the job restarts until it
// is aborted. `what` says which transaction of ours waits behind it.
std::string hanging_transaction_text(const std::string& what, const std::string& transactional_id,
                                     const std::string& topic, int32_t partition, int64_t offset,
                                     int64_t last_stable_offset, int32_t leader, int64_t waited_ms,
                                     const std::string& bootstrap);

// One librdkafka producer with its delivery-report bookkeeping. Used by one thread at a time (callbacks are
// served by rd_kafka_poll/flush on the calling thread).
class Producer {
 public:
  /// Creates a producer; `transactional_id` empty for a plain idempotent producer.
  /// `watchdog` (may be empty) throws when the sink must stop waiting (its liveness probe failed); `cancelled`
  /// (may be null) is the task's cancellation flag. Both are checked between the slices of every blocking wait.
  Producer(const KafkaSinkSettings& settings, std::string transactional_id, std::string who,
           std::function<void()> watchdog = nullptr, const std::atomic<bool>* cancelled = nullptr);

  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  ~Producer();

  rd_kafka_t* rk() const noexcept { return rk_.get(); }
  const std::string& transactional_id() const noexcept { return txid_; }

  /// Produces one record; waits (serving delivery reports) while librdkafka's queue is full. Returns librdkafka's
  /// reason when it refuses the record for its content (MSG_SIZE_TOO_LARGE: key, value and headers above
  /// message.max.bytes; nothing was produced), nullopt when produced; throws on other errors.
  [[nodiscard]] std::optional<std::string> produce(
      std::string_view topic, int32_t partition, std::optional<std::string_view> key,
      std::optional<std::string_view> value,
      const std::vector<std::pair<std::string_view, std::optional<std::string_view>>>* view_headers,
      const std::vector<KafkaHeader>* headers, int64_t timestamp_ms);

  /// The producer's message.max.bytes, as text.
  std::string max_message_bytes() const;

  /// Serves delivery reports and throws on a failed delivery or a fatal error.
  void poll();

  /// Waits until every produced record is acknowledged; throws on failures or after the timeout. Waits in slices
  /// of kWaitSliceMs: a failed liveness probe, an authentication error or the task's cancellation ends the wait.
  void flush();

  void check_errors();

  /// check_errors(), after serving queued callbacks (error_cb), then the watchdog (liveness) and cancellation
  /// (throws TaskCancelledException, which unwinds the task).
  void check_interrupts();

  // --- transactions (all block up to the operation timeout; throw with librdkafka's error) ---

  /// init_transactions in slices of kWaitSliceMs (librdkafka resumes a timed-out init_transactions when called
  /// again): an authentication or authorization error fails at once, a broker that does not answer within the
  /// liveness timeout fails through the watchdog, a cancelled task stops waiting; otherwise the operation timeout.
  void init_transactions();

  /// Checks at open that `topic` exists (a metadata request for it, which lets the broker auto-create it when
  /// its auto.create.topics.enable and the producer's allow.auto.create.topics allow: the broker's answer
  /// decides, the sink does not guess). Fails naming the topic and the bootstrap servers when the broker says
  /// it does not exist; waits at most `bound_ms` for an answer (then only logs: the liveness probe covers a
  /// broker that does not answer).
  void check_topic(const std::string& topic, int64_t bound_ms);

  void begin_transaction();

  /// The first record delivered in the current transaction (topic, partition, offset); offset -1: none yet.
  void fill_probe(KafkaCommittable& c) const;

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
  Probe probe_visibility(const std::string& topic, int32_t partition, int64_t offset, int64_t wait_ms);

  /// Drops probe_visibility()'s reader: a settled producer lives on in the writer's pool, its reader need not.
  void drop_probe_consumer() { probe_consumer_.reset(); }

  /// The bootstrap servers, for the remedy a hanging transaction's error names.
  const std::string& bootstrap() const noexcept { return bootstrap_; }

  /// Adds the marker (group `<txid>-marker`, `topic` partition 0, offset, metadata = token) to the transaction.
  void send_marker(const std::string& topic, int64_t offset, const std::string& token);

  /// Commits the open transaction (retrying retriable errors up to the timeout).
  void commit_transaction();

  /// The marker's metadata in the marker group of this producer's transactional id (nullopt: no offset), for
  /// the transaction whose token is `token`. Call after init_transactions, which completes the id's previous
  /// transaction. Decided by resolve_marker() from certain evidence only: fails the task rather than guess.
  std::optional<std::string> read_marker(const std::string& topic, const std::string& token);

  /// One OffsetFetch of `group`'s committed offset for `topic` partition 0, through a consumer of that group
  /// (read_committed: the broker answers only when no transactional offset is pending). Throws on non-retriable
  /// errors. Not the admin API's ListConsumerGroupOffsets: librdkafka (2.0.2 here; still open in 2.4,
  /// confluentinc/librdkafka#5040) dereferences the null consumer group of a non-consumer client when that
  /// request is answered NOT_COORDINATOR, and Kafka 4's group coordinator answers NOT_COORDINATOR when a
  /// require-stable fetch times out (KAFKA-17267). A build that read markers at every checkpoint crashed so (SIGSEGV
  /// on librdkafka's main thread while a fetch was in flight) in 2 of 3 broker-restart test runs. A consumer's
  /// committed() handles NOT_COORDINATOR by looking the coordinator up again. The consumer never subscribes, so it
  /// never joins the group.
  MarkerReading fetch_marker(const std::string& group, const std::string& topic, bool require_stable);

  /// The consumer fetch_marker() reads `group` with (created on first use; read_committed when `require_stable`).
  rd_kafka_t* marker_consumer(const std::string& group, bool require_stable);

  /// Partition count of `topic` (broker metadata).
  int32_t fetch_partition_count(const std::string& topic);

 private:
  static std::string partition_text(int32_t partition);

  std::string txid_suffix() const { return txid_.empty() ? std::string() : " (transactional.id " + txid_ + ")"; }

  // Calls `op(timeout_ms)` until it succeeds, retrying retriable errors until the operation timeout. Throws on a
  // non-retriable error (after aborting the transaction when librdkafka says it must be).
  template <class Op>
  void retry(const char* what, Op&& op);

  rd_kafka_topic_t* topic_handle(std::string_view topic);

  static void on_delivery(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque);

  static void on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque);

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

}  // namespace kafka_sink_internal
}  // namespace sluice
