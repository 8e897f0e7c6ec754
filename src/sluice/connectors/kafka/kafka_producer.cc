// Producer: one librdkafka producer of the Kafka sink (see kafka_producer.h; kafka_sink.h for the design).
#include "kafka_producer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "sluice/core/cancellation.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace kafka_sink_internal {

using detail::resolve_marker;

namespace {

// The longest single wait of a blocking librdkafka call: between slices the sink checks its liveness probe,
// authentication errors and the task's cancellation, so none of them waits for the operation timeout.
constexpr int kWaitSliceMs = 200;
// A committed() call is a FindCoordinator and an OffsetFetch round trip, each slice anew: give it a second.
constexpr int kMarkerSliceMs = 1000;
// The bound of the metadata and ListOffsets requests that describe a transaction still pending (for its error).
constexpr int kProbeMetadataTimeoutMs = 5000;
// The shortest pass of a retry loop: an error that librdkafka returns at once (no broker connection yet, a
// coordinator loading) is asked again after this, not in a loop that burns a core until the deadline.
constexpr auto kRetryPace = std::chrono::milliseconds(100);

// Waits until kRetryPace after `pass_start`, or until `deadline` if that comes first. A pass that already took
// that long (a call that used its timeout slice) goes on at once.
void pace_retry(Clock::time_point pass_start, Clock::time_point deadline) {
  std::this_thread::sleep_until(std::min(pass_start + kRetryPace, deadline));
}

// True when the fault point "kafka.lose-commit" fires (see Producer::commit_transaction).
bool commit_lost_by_fault_point() {
  try {
    SLUICE_FAULT_POINT("kafka.lose-commit");
    return false;
  } catch (const SluiceException&) {
    return true;
  }
}

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

}  // namespace

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

Producer::Producer(const KafkaSinkSettings& settings, std::string transactional_id, std::string who,
                   std::function<void()> watchdog, const std::atomic<bool>* cancelled)
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

Producer::~Producer() {
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

std::optional<std::string> Producer::produce(
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
                              h.value ? h.value->data() : nullptr, h.value ? static_cast<ssize_t>(h.value->size()) : 0);
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

std::string Producer::max_message_bytes() const {
  char buf[64];
  size_t size = sizeof buf;
  if (rd_kafka_conf_get(rd_kafka_conf(rk_.get()), "message.max.bytes", buf, &size) != RD_KAFKA_CONF_OK) return "?";
  return buf;
}

void Producer::poll() {
  since_poll_ = 0;
  rd_kafka_poll(rk_.get(), 0);
  check_errors();
}

void Producer::flush() {
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

void Producer::check_errors() {
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

void Producer::check_interrupts() {
  check_errors();
  if (watchdog_) watchdog_();
  if (cancelled_ != nullptr && cancelled_->load(std::memory_order_acquire)) throw TaskCancelledException{};
}

void Producer::init_transactions() {
  const Clock::time_point deadline = deadline_after(timeout_ms_);
  while (true) {
    const Clock::time_point pass_start = Clock::now();
    KafkaErrorPtr err(rd_kafka_init_transactions(rk_.get(), std::clamp(remaining_ms(deadline), 1, kWaitSliceMs)));
    if (!err) return;
    rd_kafka_poll(rk_.get(), 0);  // serves error_cb: an authentication failure explains a timeout
    check_interrupts();
    if ((rd_kafka_error_code(err.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT || rd_kafka_error_is_retriable(err.get())) &&
        Clock::now() < deadline) {
      pace_retry(pass_start, deadline);
      continue;
    }
    fail(who_ + ": init_transactions" + txid_suffix() + " failed: " + kafka::kafka_error_text(err.get()) +
         (rd_kafka_error_code(err.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT
              ? " (no answer within the operation timeout of " + std::to_string(timeout_ms_) +
                    " ms; is the broker reachable, and does it allow transactions?)"
              : std::string()));
  }
}

void Producer::check_topic(const std::string& topic, int64_t bound_ms) {
  rd_kafka_topic_t* rkt = topic_handle(topic);
  const Clock::time_point deadline = deadline_after(bound_ms);
  int unknown_answers = 0;
  while (true) {
    const Clock::time_point pass_start = Clock::now();
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
      spdlog::warn("{}: could not check that topic '{}' exists on {} within {} ms (last: {})", who_, topic, bootstrap_,
                   bound_ms, rd_kafka_err2str(err));
      return;
    }
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      // An answer: give a topic that it just auto-created time to appear before the second request.
      std::this_thread::sleep_for(std::min<Clock::duration>(kRetryPace, deadline - Clock::now()));
    } else {
      pace_retry(pass_start, deadline);  // without a broker connection the request fails at once
    }
  }
}

void Producer::begin_transaction() {
  KafkaErrorPtr err(rd_kafka_begin_transaction(rk_.get()));
  if (err) fail(who_ + ": begin_transaction" + txid_suffix() + " failed: " + kafka::kafka_error_text(err.get()));
  in_transaction_ = true;
  probe_offset_ = -1;
}

void Producer::fill_probe(KafkaCommittable& c) const {
  c.probe_topic = probe_topic_;
  c.probe_partition = probe_partition_;
  c.probe_offset = probe_offset_;
}

Producer::Probe Producer::probe_visibility(const std::string& topic, int32_t partition, int64_t offset,
                                           int64_t wait_ms) {
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

void Producer::send_marker(const std::string& topic, int64_t offset, const std::string& token) {
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

void Producer::commit_transaction() {
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

std::optional<std::string> Producer::read_marker(const std::string& topic, const std::string& token) {
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

MarkerReading Producer::fetch_marker(const std::string& group, const std::string& topic, bool require_stable) {
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

rd_kafka_t* Producer::marker_consumer(const std::string& group, bool require_stable) {
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

int32_t Producer::fetch_partition_count(const std::string& topic) {
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

std::string Producer::partition_text(int32_t partition) {
  return partition == RD_KAFKA_PARTITION_UA ? std::string("(any)") : std::to_string(partition);
}

template <class Op>
void Producer::retry(const char* what, Op&& op) {
  const Clock::time_point deadline = deadline_after(timeout_ms_);
  while (true) {
    const Clock::time_point pass_start = Clock::now();
    KafkaErrorPtr err(op(std::max(remaining_ms(deadline), 1)));
    if (!err) return;
    if (rd_kafka_error_is_retriable(err.get()) && Clock::now() < deadline) {
      pace_retry(pass_start, deadline);
      continue;
    }
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

rd_kafka_topic_t* Producer::topic_handle(std::string_view topic) {
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

void Producer::on_delivery(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque) {
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

void Producer::on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
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
  spdlog::debug("{}: librdkafka: {}: {}", self->who_, rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)), reason);
}

}  // namespace kafka_sink_internal
}  // namespace sluice
