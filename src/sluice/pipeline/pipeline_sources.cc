// The source of a pipeline as a stream of change events, per `source.type`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdlib>

#include "pipeline_internal.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/files.h"
#include "sluice/connectors/kafka/kafka_source.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"
#include "sluice/core/assign_or_return.h"

namespace sluice::pipeline::detail {

Result<std::string> expand_env(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      const size_t end = text.find('}', i + 2);
      if (end == std::string::npos) {
        return Error(ErrorCode::kConfiguration, fmt::format("'{}': unterminated ${{ at offset {}", text, i));
      }
      const std::string name = text.substr(i + 2, end - i - 2);
      const char* v = std::getenv(name.c_str());
      if (v == nullptr) {
        return Error(ErrorCode::kConfiguration,
                     fmt::format("'{}': the environment variable {} is not set", text, name));
      }
      out += v;
      i = end;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

namespace {

Error option_error(const PipelineSpec& spec, const ConnectorOptions& o, std::string_view key, std::string reason) {
  Mark m = o.mark;
  if (const OptionValue* v = o.find(key)) m = v->mark;
  return Error(ErrorCode::kConfiguration, fmt::format("{}:{}:{}: {}", spec.file, m.line, m.column, reason));
}

// A string option with ${VAR} expanded; errors name the option's location.
Result<std::string> string_option(const PipelineSpec& spec, const ConnectorOptions& o, std::string_view key,
                                  std::string fallback = {}) {
  Result<std::string> v = expand_env(o.get_string(key, std::move(fallback)));
  if (!v.ok()) return option_error(spec, o, key, fmt::format("option '{}': {}", key, v.error().message()));
  return v;
}

// Change events from JSON lines in the envelope of ChangeEvent::to_value (docs/cdc.md).
LineFormat<cdc::ChangeEvent> change_event_lines() {
  return LineFormat<cdc::ChangeEvent>{"change-event JSON lines", true,
                                      [](std::string_view line, cdc::ChangeEvent& out) -> Status {
                                        SLUICE_ASSIGN_OR_RETURN(Value v, Value::from_json(line));
                                        SLUICE_ASSIGN_OR_RETURN(cdc::ChangeEvent e, cdc::ChangeEvent::from_value(v));
                                        out = std::move(e);
                                        return ok_status();
                                      }};
}

// A synthetic charges workload: entity i % entities goes through created -> paid -> refunded (every fifth
// charge) or settled, then stays there with an update per further round.
cdc::ChangeEvent generate_charge(int64_t index, int64_t entities, uint64_t seed) {
  const int64_t entity = index % entities;
  const int64_t round = index / entities;
  SeededRandom rnd(seed ^ (static_cast<uint64_t>(entity) * 0x9E3779B97F4A7C15ULL));
  const int64_t amount = 100 + static_cast<int64_t>(rnd.next_below(100'000));
  const std::string id = fmt::format("ch_{:08d}", entity);
  const std::string customer = fmt::format("cus_{:05d}", rnd.next_below(5000));
  auto row = [&](int64_t r) {
    const char* status = r == 0 ? "created" : r == 1 ? "paid" : entity % 5 == 0 ? "refunded" : "settled";
    return Value::object({{"id", Value(id)},
                          {"customer_id", Value(customer)},
                          {"amount_cents", Value(amount)},
                          {"currency", Value("EUR")},
                          {"status", Value(status)},
                          {"revision", Value(r)}});
  };
  cdc::ChangeEvent e;
  e.op = round == 0 ? cdc::ChangeOp::kCreate : cdc::ChangeOp::kUpdate;
  e.key = Value::object({{"id", Value(id)}});
  if (round > 0) e.before = row(round - 1);
  e.after = row(round);
  // The generation time as source time (as a database's commit time), so source lag reads as for a real source.
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  e.source = cdc::SourceInfo{"datagen", "payments", "public.charges", fmt::format("{}", index), now_ms, false, -1, 0};
  return e;
}

}  // namespace

Result<DataStream<cdc::ChangeEvent>> add_source(StreamEnvironment& env, const PipelineSpec& spec,
                                                const std::string& dead_letter_dir, SourceProbe& probe) {
  const ConnectorOptions& o = spec.source;
  probe.type = o.type;
  const bool dead_letter = spec.pipeline.dead_letter.has_value();
  const std::string dl_file = dead_letter_dir + "/source-" + o.type + ".jsonl";
  if (dead_letter) probe.dead_letter_path = dl_file;
  if (o.type == "files") {
    SLUICE_ASSIGN_OR_RETURN(std::string path, string_option(spec, o, "path"));
    // Checked here too (the source checks again when the job starts), so `sluice validate` reports it.
    if (Result<std::vector<std::string>> files = sluice::detail::expand_file_paths({path}); !files.ok()) {
      return option_error(spec, o, "path", files.error().message());
    }
    auto src = std::make_shared<FileSource<cdc::ChangeEvent>>(std::vector<std::string>{path}, change_event_lines());
    if (dead_letter) src->on_bad_record(BadRecordPolicy::kDeadLetter, dl_file);
    auto stats = src->stats();
    probe.bad_records = [stats] { return stats->bad_records.load(); };
    probe.gauges = [stats] {
      return std::vector<std::pair<std::string, double>>{
          {"sluice_source_bad_records_total", static_cast<double>(stats->bad_records.load())}};
    };
    probe.connector_metrics = [stats] {
      return std::vector<SourceProbe::ConnectorMetric>{
          {"", "numRecordsInErrors", static_cast<double>(stats->bad_records.load())}};
    };
    return env.from_source(src, "files").uid("source");
  }
  if (o.type == "datagen") {
    const int64_t count = o.get_int("count", 100'000);
    const int64_t entities = std::max<int64_t>(1, o.get_int("entities", 1000));
    const auto seed = static_cast<uint64_t>(o.get_int("seed", 42));
    auto src = std::make_shared<DataGeneratorSource<cdc::ChangeEvent>>(
        [entities, seed](int64_t i) { return generate_charge(i, entities, seed); },
        count == 0 ? DataGeneratorSource<cdc::ChangeEvent>::kUnbounded : count,
        static_cast<double>(o.get_int("rate", 0)));
    // One reader: the events of an entity are spread over the index range, so more readers would reorder them.
    return env.from_source(src, "datagen").uid("source").set_parallelism(1);
  }
  if (o.type == "postgres") {
    SLUICE_ASSIGN_OR_RETURN(std::string conninfo, string_option(spec, o, "conninfo"));
    auto b = PostgresCdcSource::builder();
    b.conninfo(conninfo).tables(o.get_list("tables"));
    if (o.find("slot")) b.slot_name(o.get_string("slot"));
    b.owner(spec.pipeline.name);  // a slot streamed by another pipeline is never taken over (docs/cdc.md)
    if (o.find("publication")) b.publication_name(o.get_string("publication"));
    b.create_slot(o.get_bool("create-slot", true)).create_publication(o.get_bool("create-publication", true));
    b.start_mode(o.get_string("start", "initial") == "latest" ? PostgresStartMode::kLatest
                                                              : PostgresStartMode::kInitial);
    b.truncate_policy(o.get_string("truncate", "fail") == "skip" ? PostgresTruncatePolicy::kSkip
                                                                 : PostgresTruncatePolicy::kFail);
    if (o.find("heartbeat-interval")) {
      b.heartbeat_interval(std::chrono::milliseconds(o.get_int("heartbeat-interval", 0)));
    }
    if (o.find("liveness-timeout")) b.liveness_timeout(std::chrono::milliseconds(o.get_int("liveness-timeout", 0)));
    // A crash during the initial snapshot: reading it again repeats rows, which exactly-once delivery must refuse
    // (the default then) and at-least-once delivery allows.
    const std::string resume = o.get_string(
        "snapshot-resume", spec.pipeline.delivery == "exactly-once" ? std::string("fail") : std::string("repeat"));
    b.on_interrupted_snapshot(resume == "repeat" ? PostgresInterruptedSnapshot::kRepeat
                                                 : PostgresInterruptedSnapshot::kFail);
    if (o.find("snapshot-fetch-rows")) b.snapshot_fetch_rows(o.get_int("snapshot-fetch-rows", 10'000));
    // Smaller than the connector's default (16,384): a pipeline's memory budget is tens of MiB, and the queue
    // only needs to cover the replication connection's bursts.
    b.queue_capacity(static_cast<size_t>(std::max<int64_t>(1, o.get_int("queue-capacity", 2048))));
    if (dead_letter) b.on_bad_record(BadRecordPolicy::kDeadLetter, dl_file);
    Result<std::shared_ptr<PostgresCdcSource>> src = b.try_build();
    if (!src.ok()) return option_error(spec, o, "type", src.error().message());
    std::shared_ptr<PostgresCdcSource> s = *src;
    probe.description = "slot " + s->settings().slot_name;
    probe.connections = [s] { return s->connections(); };
    probe.bad_records = [s] { return s->metrics().bad_records; };
    probe.lag_ms = [s](int64_t) { return s->metrics().lag_ms; };
    probe.gauges = [s] {
      const PostgresCdcMetrics m = s->metrics();
      return std::vector<std::pair<std::string, double>>{
          {"sluice_source_events_total", static_cast<double>(m.events)},
          {"sluice_source_events_per_second", m.events_per_second},
          {"sluice_source_transactions_total", static_cast<double>(m.transactions)},
          {"sluice_source_bad_records_total", static_cast<double>(m.bad_records)},
          {"sluice_source_postgres_position_lsn", static_cast<double>(m.position)},
          {"sluice_source_postgres_confirmed_lsn", static_cast<double>(m.confirmed_lsn)},
          {"sluice_source_postgres_received_lsn", static_cast<double>(m.received_lsn)},
          {"sluice_source_postgres_slot_busy_ms", static_cast<double>(m.slot_busy_ms)}};
    };
    probe.connector_metrics = [s] {
      const PostgresCdcMetrics m = s->metrics();
      return std::vector<SourceProbe::ConnectorMetric>{
          {"", "numRecordsInErrors", static_cast<double>(m.bad_records)},
          {"", "currentEmitEventTimeLag", static_cast<double>(m.lag_ms)},
          {"PostgresCdcSource", "events", static_cast<double>(m.events)},
          {"PostgresCdcSource", "snapshotEvents", static_cast<double>(m.snapshot_events)},
          {"PostgresCdcSource", "transactions", static_cast<double>(m.transactions)},
          {"PostgresCdcSource", "replicationLagMs", static_cast<double>(m.lag_ms)},
          {"PostgresCdcSource", "unconfirmedBytes",
           static_cast<double>(m.received_lsn > m.confirmed_lsn ? m.received_lsn - m.confirmed_lsn : 0)},
          {"PostgresCdcSource", "confirmedFlushLsn", static_cast<double>(m.confirmed_lsn)},
          {"PostgresCdcSource", "receivedLsn", static_cast<double>(m.received_lsn)},
          {"PostgresCdcSource", "positionLsn", static_cast<double>(m.position)},
          {"PostgresCdcSource", "slotBusyMs", static_cast<double>(m.slot_busy_ms)}};
    };
    return env.from_source(s, "postgres").uid("source").set_parallelism(1);
  }
  if (o.type == "mongodb") {
    SLUICE_ASSIGN_OR_RETURN(std::string uri, string_option(spec, o, "uri"));
    auto b = MongoCdcSource::builder();
    b.uri(uri).database(o.get_string("database"));
    if (o.find("collections")) b.collections(o.get_list("collections"));
    if (o.find("collection-regex")) b.collection_pattern(o.get_string("collection-regex"));
    const std::string start = o.get_string("start", "initial");
    b.start_mode(start == "latest"      ? MongoStartMode::kLatest
                 : start == "timestamp" ? MongoStartMode::kTimestamp
                                        : MongoStartMode::kInitial);
    if (o.find("start-timestamp")) b.start_timestamp_ms(o.get_int("start-timestamp", 0));
    b.update_lookup(o.get_string("full-document", "update-lookup") == "update-lookup");
    b.pre_images(o.get_bool("pre-images", false));
    b.on_drop(o.get_string("on-drop", "fail") == "end" ? MongoOnDrop::kEndSplit : MongoOnDrop::kFail);
    b.on_history_lost(o.get_string("on-history-lost", "fail") == "resnapshot" ? MongoOnHistoryLost::kResnapshot
                                                                              : MongoOnHistoryLost::kFail);
    if (dead_letter) b.on_bad_record(BadRecordPolicy::kDeadLetter, dl_file);
    Result<std::shared_ptr<MongoCdcSource>> src = b.try_build();
    if (!src.ok()) return option_error(spec, o, "type", src.error().message());
    std::shared_ptr<MongoCdcSource> s = *src;
    probe.description = o.get_string("database");
    probe.connections = [s] { return s->connections(); };
    probe.bad_records = [s] { return s->metrics()->bad_records.load(); };
    probe.lag_ms = [s](int64_t now_ms) { return s->metrics()->lag_ms(now_ms); };
    probe.gauges = [s] {
      const auto& m = *s->metrics();
      return std::vector<std::pair<std::string, double>>{
          {"sluice_source_events_total", static_cast<double>(m.events.load())},
          {"sluice_source_snapshot_reads_total", static_cast<double>(m.snapshot_reads.load())},
          {"sluice_source_bad_records_total", static_cast<double>(m.bad_records.load())},
          {"sluice_source_mongodb_last_event_time_ms", static_cast<double>(m.last_event_time_ms.load())}};
    };
    probe.connector_metrics = [s] {
      const auto& m = *s->metrics();
      const int64_t now =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      return std::vector<SourceProbe::ConnectorMetric>{
          {"", "numRecordsInErrors", static_cast<double>(m.bad_records.load())},
          {"", "currentEmitEventTimeLag", static_cast<double>(m.lag_ms(now))},
          {"MongoCdcSource", "events", static_cast<double>(m.events.load())},
          {"MongoCdcSource", "snapshotReads", static_cast<double>(m.snapshot_reads.load())},
          {"MongoCdcSource", "lagMs", static_cast<double>(m.lag_ms(now))},
          {"MongoCdcSource", "lastEventTime", static_cast<double>(m.last_event_time_ms.load())}};
    };
    return env.from_source(s, "mongodb").uid("source");
  }
  if (o.type == "kafka") {
    SLUICE_ASSIGN_OR_RETURN(std::string servers, string_option(spec, o, "bootstrap-servers"));
    auto b = KafkaSource<cdc::ChangeEvent>::builder();
    b.bootstrap_servers(servers);
    if (o.find("topics")) b.topics(o.get_list("topics"));
    if (o.find("topic-pattern")) b.topic_pattern(o.get_string("topic-pattern"));
    b.group_id(o.get_string("group-id", "sluice-" + spec.pipeline.name));
    const std::string start = o.get_string("start", "committed");
    b.starting_offsets(start == "earliest" ? KafkaStartingOffsets::earliest()
                       : start == "latest" ? KafkaStartingOffsets::latest()
                                           : KafkaStartingOffsets::committed(KafkaOffsetReset::kEarliest));
    for (const auto& [k, v] : o.get_map("properties")) {
      Result<std::string> value = expand_env(v);
      if (!value.ok()) return option_error(spec, o, "properties", value.error().message());
      b.property(k, *value);
    }
    b.deserializer([](const KafkaMessageView& m, cdc::ChangeEvent& out) -> Status {
      if (!m.value) return Error(ErrorCode::kSerialization, "the value is null, expected a change event");
      SLUICE_ASSIGN_OR_RETURN(Value v, Value::from_json(*m.value));
      SLUICE_ASSIGN_OR_RETURN(cdc::ChangeEvent e, cdc::ChangeEvent::from_value(v));
      out = std::move(e);
      return ok_status();
    });
    if (dead_letter) b.on_bad_record(BadRecordPolicy::kDeadLetter, dl_file);
    Result<std::shared_ptr<KafkaSource<cdc::ChangeEvent>>> src = b.try_build();
    if (!src.ok()) return option_error(spec, o, "type", src.error().message());
    std::shared_ptr<KafkaSource<cdc::ChangeEvent>> s = *src;
    probe.description = s->settings().topic_pattern.empty() ? fmt::format("{}", fmt::join(s->settings().topics, ", "))
                                                            : s->settings().topic_pattern;
    probe.connections = [s] { return s->connections(); };
    probe.bad_records = [s] { return s->metrics().bad_records; };
    probe.lag_ms = [s](int64_t) { return s->metrics().lag_ms; };
    probe.gauges = [s] {
      const KafkaSourceMetrics m = s->metrics();
      return std::vector<std::pair<std::string, double>>{
          {"sluice_source_events_total", static_cast<double>(m.records_read)},
          {"sluice_source_events_per_second", m.records_per_second},
          {"sluice_source_bad_records_total", static_cast<double>(m.bad_records)},
          {"sluice_source_kafka_bytes_total", static_cast<double>(m.bytes_read)},
          {"sluice_source_kafka_records_lag_max", static_cast<double>(m.records_lag_max)},
          {"sluice_source_kafka_pending_records", static_cast<double>(m.pending_records)},
          {"sluice_source_kafka_assigned_partitions", static_cast<double>(m.partitions.size())}};
    };
    probe.connector_metrics = [s] {
      const KafkaSourceMetrics m = s->metrics();
      return std::vector<SourceProbe::ConnectorMetric>{
          {"", "numRecordsInErrors", static_cast<double>(m.bad_records)},
          {"", "pendingRecords", static_cast<double>(m.pending_records)},
          {"", "currentEmitEventTimeLag", static_cast<double>(m.lag_ms)},
          {"KafkaSourceReader.KafkaConsumer", "records-lag-max", static_cast<double>(m.records_lag_max)},
          {"KafkaSourceReader.KafkaConsumer", "records-consumed-total", static_cast<double>(m.records_read)},
          {"KafkaSourceReader.KafkaConsumer", "bytes-consumed-total", static_cast<double>(m.bytes_read)},
          {"KafkaSourceReader.KafkaConsumer", "assigned-partitions", static_cast<double>(m.partitions.size())}};
    };
    DataStream<cdc::ChangeEvent> out = env.from_source(s, "kafka").uid("source");
    if (o.find("parallelism")) {
      // Flink SQL's scan.parallelism: fewer readers than the job's subtasks (in cluster mode, readers that fit
      // one TaskManager's slots).
      const int64_t p = o.get_int("parallelism", 1);
      if (p < 1 || p > 1024) {
        return option_error(spec, o, "parallelism", fmt::format("must be an integer from 1 to 1024, got {}", p));
      }
      out.set_parallelism(static_cast<int>(p));
    }
    return out;
  }
  return option_error(spec, o, "type", fmt::format("unknown source type '{}'", o.type));
}

}  // namespace sluice::pipeline::detail
