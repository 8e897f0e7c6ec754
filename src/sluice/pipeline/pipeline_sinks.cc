// The sinks of a pipeline, per `sink.<name>.type`, fed by the routed domain events.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "pipeline_internal.h"
#include "sluice/api/keyed_process_function.h"
#include "sluice/connectors/files.h"
#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/connectors/postgres/postgres_upsert_sink.h"
#include "sluice/connectors/print.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/config.h"
#include "sluice/state/keyed_state_store.h"

namespace sluice::pipeline::detail {
namespace {

Error sink_error(const PipelineSpec& spec, const SinkSpec& s, std::string_view key, std::string reason) {
  Mark m = s.options.mark;
  if (const OptionValue* v = s.options.find(key)) m = v->mark;
  return Error(ErrorCode::kConfiguration,
               fmt::format("{}:{}:{}: sink '{}': {}", spec.file, m.line, m.column, s.name, reason));
}

Result<std::string> sink_string(const PipelineSpec& spec, const SinkSpec& s, std::string_view key,
                                std::string fallback = {}) {
  Result<std::string> v = expand_env(s.options.get_string(key, std::move(fallback)));
  if (!v.ok()) return sink_error(spec, s, key, v.error().message());
  return v;
}

// Evaluates a sink expression over a domain event; a failure fails the task naming the event.
std::string eval_text(const Expression& e, const Value& event, std::string_view what) {
  Result<Value> v = e.evaluate(event);
  if (!v.ok()) {
    throw SluiceException(v.error().with_context(fmt::format("{} of event {}", what, event.to_json())));
  }
  if (v->is_string()) return std::string(v->as_string());
  if (v->is_null()) {
    throw SluiceException(
        Error(ErrorCode::kRuntime, fmt::format("{} '{}' is NULL for event {}", what, e.text(), event.to_json())));
  }
  return v->to_json();
}

// The per-route override (topic or index) of a sink for a collection, or `fallback`.
std::function<std::string(const std::string&)> route_override(const PipelineSpec& spec, const SinkSpec& s, bool topic,
                                                              std::string fallback) {
  std::vector<std::pair<std::string, std::string>> overrides;  // (match, value)
  for (const RouteSpec& r : spec.routes) {
    const std::string& v = topic ? r.topic : r.index;
    if (r.sink == s.name && !v.empty()) overrides.emplace_back(r.match, v);
  }
  return [overrides = std::move(overrides), fallback = std::move(fallback)](const std::string& collection) {
    for (const auto& [match, v] : overrides) {
      if (match_collection(match, collection)) return v;
    }
    return fallback;
  };
}

/// The route of one sink with pipeline.entity-version: numbers each entity's events 1, 2, 3, ... in the keyed
/// state of the route (checkpointed; it moves with its key group when the job is rescaled).
class EntityVersionRoute final : public KeyedProcessFunction<std::string, RoutedEvent, RoutedEvent> {
 public:
  explicit EntityVersionRoute(uint64_t bit) : bit_(bit) {}
  void open(RuntimeContext&) override {
    version_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"entity-version", 0});
  }
  void process_element(const RoutedEvent& r, Context&, Collector<RoutedEvent>& out) override {
    if ((r.sinks & bit_) == 0) return;
    const int64_t v = version_->value() + 1;
    version_->update(v);
    RoutedEvent copy = r;
    copy.event["entity_version"] = Value(v);
    out.collect(std::move(copy));
  }

 private:
  uint64_t bit_;
  ValueState<int64_t>* version_ = nullptr;
};

DataStream<RoutedEvent> routed_to(DataStream<RoutedEvent>& events, const PipelineSpec& spec, const SinkSpec& s,
                                  size_t index) {
  const uint64_t bit = uint64_t{1} << index;
  // entity-version's counts are keyed state: the runner keys the events whenever it is on (add_sink checks).
  DataStream<RoutedEvent> out =
      spec.pipeline.entity_version
          ? static_cast<KeyedStream<std::string, RoutedEvent>&>(events).process(EntityVersionRoute(bit))
          : events.filter([bit](const RoutedEvent& r) { return (r.sinks & bit) != 0; });
  out.name("Route: " + s.name).uid("route-" + s.name);
  return out;
}

// The source position of a routed event (for bad-record errors and dead letters), "" when it has none.
std::string event_position(const RoutedEvent& r) {
  const Value* src = r.event.find("source");
  const Value* pos = src != nullptr ? src->find("position") : nullptr;
  return pos != nullptr && pos->is_string() ? std::string(pos->as_string()) : std::string();
}

// The Kafka sink options shared by sinks and the dead-letter sink: liveness-timeout.
template <class T>
void kafka_common_options(typename KafkaSink<T>::Builder& b, const SinkSpec& s) {
  if (s.options.find("liveness-timeout")) {
    b.liveness_timeout(std::chrono::milliseconds(s.options.get_int("liveness-timeout", 30'000)));
  }
}

// True when a routed event is a delete (op d): the key of a deleted row or document, the old key of a key change.
bool is_delete_event(const Value& event) {
  const Value* op = event.find("op");
  return op != nullptr && op->is_string() && op->as_string() == "d";
}

Status add_kafka_sink(DataStream<RoutedEvent>& in, const PipelineSpec& spec, const SinkSpec& s,
                      const std::string& dead_letter_dir, std::shared_ptr<PipelineCounters> counters) {
  SLUICE_ASSIGN_OR_RETURN(std::string servers, sink_string(spec, s, "bootstrap-servers"));
  auto b = KafkaSink<RoutedEvent>::builder();
  b.bootstrap_servers(servers);
  auto topic = route_override(spec, s, true, s.options.get_string("topic"));
  b.topic_selector([topic](const RoutedEvent& r) { return topic(r.collection); });
  // The sink's own topic (routes may choose others per record): the writer checks at open that it exists, and
  // exactly-once writes its transaction markers there.
  if (!s.options.get_string("topic").empty()) b.topic(s.options.get_string("topic"));
  std::optional<Expression> key = s.kafka_key;
  // The event's JSON is written straight into the record's value buffer, which keeps its capacity from one
  // record to the next: a string per event was an allocation, a copy and a free per record.
  b.record_serializer([key](const RoutedEvent& r, KafkaProducerRecord& out) {
    if (key) {
      out.set_key(eval_text(*key, r.event, "the Kafka key"));
    } else {
      out.set_key(r.entity_key);
    }
    r.event.write_json(out.mutable_value());
  });
  for (const auto& [k, v] : s.options.get_map("properties")) {
    Result<std::string> value = expand_env(v);
    if (!value.ok()) return sink_error(spec, s, "properties", value.error().message());
    b.property(k, *value);
  }
  const bool exactly_once = spec.pipeline.delivery == "exactly-once";
  b.delivery_guarantee(exactly_once ? DeliveryGuarantee::kExactlyOnce : DeliveryGuarantee::kAtLeastOnce);
  kafka_common_options<RoutedEvent>(b, s);
  if (s.options.find("max-transaction-bytes")) {
    b.max_transaction_bytes(s.options.get_int("max-transaction-bytes", sluice::detail::kDefaultMaxTransactionBytes));
  }
  b.position(event_position);
  if (s.options.get_bool("tombstones-on-delete", true)) {
    // Debezium's default: compacted topics drop a deleted key (the old key of a key change too) instead of keeping
    // its delete event for ever.
    b.tombstone_after([counters = std::move(counters)](const RoutedEvent& r) {
      if (!is_delete_event(r.event)) return false;
      counters->tombstones.fetch_add(1, std::memory_order_relaxed);
      return true;
    });
  }
  if (spec.pipeline.dead_letter) {
    // A record the producer refuses (larger than message.max.bytes) goes to the sink's dead-letter file.
    b.on_bad_record(BadRecordPolicy::kDeadLetter, dead_letter_dir + "/sink-" + s.name + ".jsonl");
  }
  if (exactly_once) {
    b.transactional_id_prefix(
        s.options.get_string("transactional-id-prefix", fmt::format("sluice-{}-{}", spec.pipeline.name, s.name)));
    // Each pending checkpoint holds a pre-committed transaction until its completion is notified: the pool needs
    // max-concurrent of them, one completed but not yet notified, and the open one.
    int64_t max_concurrent = options::kMaxConcurrentCheckpoints.default_value;
    for (const auto& [k, v] : spec.pipeline.config) {
      if (k == options::kMaxConcurrentCheckpoints.key) max_concurrent = std::strtoll(v.c_str(), nullptr, 10);
    }
    if (max_concurrent + 2 > 5) b.producer_pool_size(static_cast<int32_t>(max_concurrent + 2));
    // The sink checks transaction.timeout.ms against the checkpoint interval plus the longest restart delay (and
    // warns naming the pipeline keys when it is too short).
    Configuration job;
    job.set(options::kCheckpointInterval, spec.pipeline.checkpoint_interval_ms);
    job.set(options::kRestartStrategy, spec.pipeline.restart.strategy);
    job.set(options::kFixedDelayDelay, spec.pipeline.restart.delay_ms);
    job.set(options::kExpDelayMaxBackoff, spec.pipeline.restart.max_delay_ms);
    b.max_commit_delay_from(job);
  }
  Result<std::shared_ptr<KafkaSink<RoutedEvent>>> sink = b.try_build();
  if (!sink.ok()) return sink_error(spec, s, "type", sink.error().message());
  in.sink_to(*sink, "Sink: " + s.name).uid("sink-" + s.name);
  return ok_status();
}

Status add_opensearch_sink(DataStream<RoutedEvent>& in, const PipelineSpec& spec, const SinkSpec& s,
                           const std::string& dead_letter_dir, PipelineCounters& counters) {
  SLUICE_ASSIGN_OR_RETURN(std::string url, sink_string(spec, s, "url"));
  auto b = OpenSearchSink<RoutedEvent>::builder();
  b.url(url);
  if (s.options.find("username")) {
    SLUICE_ASSIGN_OR_RETURN(std::string password, sink_string(spec, s, "password"));
    b.basic_auth(s.options.get_string("username"), password);
  }
  if (s.options.find("ca-file")) {
    SLUICE_ASSIGN_OR_RETURN(std::string ca, sink_string(spec, s, "ca-file"));
    b.ca_file(ca);
  }
  if (s.index_expression) {
    Expression e = *s.index_expression;
    b.index_selector([e](const RoutedEvent& r) { return eval_text(e, r.event, "the index expression"); });
  } else {
    auto index = route_override(spec, s, false, s.options.get_string("index"));
    b.index_selector([index](const RoutedEvent& r) { return index(r.collection); });
  }
  std::optional<Expression> id = s.document_id;
  b.id([id](const RoutedEvent& r) { return id ? eval_text(*id, r.event, "the document id") : r.entity_key; });
  b.action([](const RoutedEvent& r) {
    const Value* op = r.event.find("op");
    return op != nullptr && op->is_string() && op->as_string() == "d" ? opensearch::BulkOp::kDelete
                                                                      : opensearch::BulkOp::kIndex;
  });
  const opensearch::DecimalHandling decimals = s.options.get_string("decimal-handling", "string") == "number"
                                                   ? opensearch::DecimalHandling::kNumber
                                                   : opensearch::DecimalHandling::kString;
  b.decimal_handling(decimals);
  b.document_json([decimals](const RoutedEvent& r, std::string& out) {
    const Value* payload = r.event.find("payload");
    if (payload != nullptr && payload->is_object()) {
      opensearch::write_document(*payload, decimals, out);
    } else {
      opensearch::write_document(Value::object({{"value", payload != nullptr ? *payload : Value()}}), decimals, out);
    }
  });
  if (s.options.get_string("versioning", "external") == "external") {
    b.version([](const RoutedEvent& r) { return r.version >= 0 ? std::optional<int64_t>(r.version) : std::nullopt; },
              opensearch::VersionType::kExternalGte);
  }
  b.position(event_position);
  b.batch(s.options.get_int("bulk-actions", 1000), s.options.get_int("bulk-bytes", 5 << 20));
  if (s.options.find("flush-interval")) {
    b.flush_interval(std::chrono::milliseconds(s.options.get_int("flush-interval", 1000)));
  }
  if (s.options.find("max-retries")) {
    opensearch::BackoffPolicy backoff;
    backoff.max_retries = static_cast<int>(s.options.get_int("max-retries", 8));
    b.backoff(backoff);
  }
  if (spec.pipeline.dead_letter) {
    b.on_failed_item(BadRecordPolicy::kDeadLetter, dead_letter_dir + "/sink-" + s.name + ".jsonl");
  }
  Result<std::shared_ptr<OpenSearchSink<RoutedEvent>>> sink = b.try_build();
  if (!sink.ok()) return sink_error(spec, s, "type", sink.error().message());
  std::shared_ptr<const Sink<RoutedEvent>> base = *sink;
  in.sink_to(base, "Sink: " + s.name).uid("sink-" + s.name);
  // Flink's sink writer metrics (numRecordsSend, numBytesSend, numRecordsSendErrors) and the bulk client's own.
  counters.sink_metrics.push_back(
      {"sink-" + s.name, [st = (*sink)->stats()] {
         return std::vector<ConnectorMetric>{
             {"", "numRecordsSend", static_cast<double>(st->acknowledged.load())},
             {"", "numBytesSend", static_cast<double>(st->bytes_sent.load())},
             {"", "numRecordsSendErrors", static_cast<double>(st->dead_letters.load())},
             {"OpenSearchSink", "bulkRequests", static_cast<double>(st->requests.load())},
             {"OpenSearchSink", "bulkRetries", static_cast<double>(st->retries.load())},
             {"OpenSearchSink", "bulkFailedItems", static_cast<double>(st->dead_letters.load())},
             {"OpenSearchSink", "retriedItems", static_cast<double>(st->retried_items.load())},
             {"OpenSearchSink", "versionConflicts", static_cast<double>(st->version_conflicts.load())}};
       }});
  return ok_status();
}

Status add_postgres_sink(DataStream<RoutedEvent>& in, const PipelineSpec& spec, const SinkSpec& s,
                         const std::string& dead_letter_dir) {
  SLUICE_ASSIGN_OR_RETURN(std::string conninfo, sink_string(spec, s, "conninfo"));
  auto b = PostgresUpsertSink::builder();
  b.conninfo(conninfo).table(s.options.get_string("table")).key_columns(s.options.get_list("key-columns"));
  if (s.options.find("batch-size")) b.batch_size(static_cast<size_t>(s.options.get_int("batch-size", 1000)));
  if (s.options.find("flush-interval")) {
    b.flush_interval(std::chrono::milliseconds(s.options.get_int("flush-interval", 1000)));
  }
  b.is_delete(is_delete_event);
  std::optional<Projection> row = s.row;
  b.row([row](const Value& event) -> Value {
    if (row) {
      Result<Value> v = row->evaluate(event);
      if (!v.ok()) throw SluiceException(v.error().with_context(fmt::format("row of event {}", event.to_json())));
      return std::move(*v);
    }
    const Value* payload = event.find("payload");
    return payload != nullptr ? *payload : Value();
  });
  if (spec.pipeline.dead_letter) {
    b.on_bad_record(BadRecordPolicy::kDeadLetter, dead_letter_dir + "/sink-" + s.name + ".jsonl");
  }
  Result<std::shared_ptr<PostgresUpsertSink>> sink = b.try_build();
  if (!sink.ok()) return sink_error(spec, s, "type", sink.error().message());
  DataStream<Value> events = in.map([](const RoutedEvent& r) { return r.event; });
  events.name("Event: " + s.name).uid("event-" + s.name);
  std::shared_ptr<const Sink<Value>> base = *sink;
  events.sink_to(base, "Sink: " + s.name).uid("sink-" + s.name);
  return ok_status();
}

// The files sink's `rolling-policy: { part-size, rollover-interval, inactivity-interval }` (Flink's names); absent
// keys keep those of `policy`.
Result<RollingPolicy> rolling_policy(const PipelineSpec& spec, const SinkSpec& s, RollingPolicy policy) {
  for (const auto& [k, v] : s.options.get_map("rolling-policy")) {
    const bool size = k == "part-size";
    if (!size && k != "rollover-interval" && k != "inactivity-interval") {
      return sink_error(spec, s, "rolling-policy",
                        fmt::format("rolling-policy: unknown key '{}'; the keys are part-size, rollover-interval, "
                                    "inactivity-interval",
                                    k));
    }
    Result<int64_t> n = size ? parse_memory_size(v) : parse_duration_ms(v);
    if (!n.ok() || *n < 1) {
      return sink_error(spec, s, "rolling-policy",
                        fmt::format("rolling-policy.{} '{}' is not {} greater than 0", k, v,
                                    size ? "a size (e.g. 128mb, 1gb)" : "a duration (e.g. 30s, 15min)"));
    }
    (size                       ? policy.part_size_bytes
     : k == "rollover-interval" ? policy.rollover_interval_ms
                                : policy.inactivity_interval_ms) = *n;
  }
  return policy;
}

// Sinks of plain values (the events themselves): files and print.
Status add_value_sink(DataStream<Value>& events, const PipelineSpec& spec, const SinkSpec& s, const std::string& uid) {
  if (uid == "dead-letter" && s.options.find("throttle")) {
    return sink_error(spec, s, "throttle", "throttle applies to the pipeline's sinks, not to the dead-letter sink");
  }
  if (s.options.type == "files") {
    SLUICE_ASSIGN_OR_RETURN(std::string path, sink_string(spec, s, "path"));
    // Dead letters are rare and wanted soon: that file is finished at the first checkpoint without a new one.
    const RollingPolicy defaults = uid == "dead-letter" ? RollingPolicy{.inactivity_interval_ms = 1} : RollingPolicy{};
    SLUICE_ASSIGN_OR_RETURN(RollingPolicy policy, rolling_policy(spec, s, defaults));
    auto sink = FileSink<Value>::json_lines(path);
    sink->rolling_policy(policy);
    events.sink_to(sink, "Sink: " + s.name).uid(uid);
    return ok_status();
  }
  if (s.options.type == "print") {
    std::shared_ptr<const Sink<Value>> sink = std::make_shared<PrintSink<Value>>(s.options.get_string("prefix"));
    events.sink_to(sink, "Sink: " + s.name).uid(uid);
    return ok_status();
  }
  if (s.options.type == "kafka") {
    if (s.options.find("tombstones-on-delete")) {
      return sink_error(spec, s, "tombstones-on-delete",
                        "tombstones-on-delete applies to the pipeline's sinks; the dead-letter sink writes no "
                        "deletes (remove the key)");
    }
    SLUICE_ASSIGN_OR_RETURN(std::string servers, sink_string(spec, s, "bootstrap-servers"));
    auto b = KafkaSink<Value>::builder();
    b.bootstrap_servers(servers).topic(s.options.get_string("topic"));
    b.value_serializer([](const Value& v) { return v.to_json(); });
    b.delivery_guarantee(DeliveryGuarantee::kAtLeastOnce);
    kafka_common_options<Value>(b, s);
    // `${VAR}` in the properties (a SASL password) is expanded as in the main Kafka sink's.
    for (const auto& [k, v] : s.options.get_map("properties")) {
      Result<std::string> value = expand_env(v);
      if (!value.ok()) return sink_error(spec, s, "properties", value.error().message());
      b.property(k, *value);
    }
    Result<std::shared_ptr<KafkaSink<Value>>> sink = b.try_build();
    if (!sink.ok()) return sink_error(spec, s, "type", sink.error().message());
    std::shared_ptr<const Sink<Value>> base = *sink;
    events.sink_to(base, "Sink: " + s.name).uid(uid);
    return ok_status();
  }
  return sink_error(spec, s, "type", fmt::format("type '{}' cannot be used here", s.options.type));
}

}  // namespace

Status add_sink(DataStream<RoutedEvent>& events, bool keyed, const PipelineSpec& spec, size_t index,
                const std::string& dead_letter_dir, std::shared_ptr<PipelineCounters> counters) {
  const SinkSpec& s = spec.sinks[index];
  if (spec.pipeline.entity_version && !keyed) {
    return sink_error(spec, s, "entity-version", "needs the events keyed by entity (internal error)");
  }
  DataStream<RoutedEvent> in = routed_to(events, spec, s, index);
  const std::string& type = s.options.type;
  if (type == "kafka") return add_kafka_sink(in, spec, s, dead_letter_dir, std::move(counters));
  if (type == "opensearch" || type == "elasticsearch")
    return add_opensearch_sink(in, spec, s, dead_letter_dir, *counters);
  if (type == "postgres") return add_postgres_sink(in, spec, s, dead_letter_dir);
  if (type == "files" || type == "print") {
    // `throttle`: a sink made slow on purpose. The wait is in the sink's task, so the sink's input fills up and
    // backpressure reaches the upstream vertex as it would behind a slow external system.
    const auto throttle = std::chrono::milliseconds(s.options.get_int("throttle", 0));
    DataStream<Value> values = in.map([throttle](const RoutedEvent& r) {
      if (throttle.count() > 0) std::this_thread::sleep_for(throttle);
      return r.event;
    });
    values.name("Event: " + s.name).uid("event-" + s.name);
    return add_value_sink(values, spec, s, "sink-" + s.name);
  }
  return sink_error(spec, s, "type", fmt::format("unknown sink type '{}'", type));
}

Status add_dead_letter_sink(DataStream<Value>& bad, const PipelineSpec& spec) {
  return add_value_sink(bad, spec, *spec.pipeline.dead_letter, "dead-letter");
}

}  // namespace sluice::pipeline::detail
