// Private parts of the pipeline runner shared by its files: the record that flows from the transform to the
// sinks, the counters the runner exposes, and the builders of sources, transform and sinks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/source_connection.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"
#include "sluice/pipeline/pipeline_spec.h"

namespace sluice::pipeline::detail {

/// A domain event on its way to the sinks.
struct RoutedEvent {
  Value event;             ///< the envelope (domain_event.h)
  std::string collection;  ///< "database.collection" of the change, for routes
  std::string entity_key;  ///< the entity as text: the key_by key
  int64_t version = -1;    ///< external version from the source position (OpenSearch), -1 when none
  uint64_t sinks = 0;      ///< bit i: goes to spec.sinks[i]
};
SLUICE_FIELDS(RoutedEvent, event, collection, entity_key, version, sinks);

/// What one transform's filter did, for the runner's warnings about a filter that drops everything or reads a
/// field no record has (a typo). Written by the transform's subtasks (relaxed atomics), read by the runner.
struct FilterStats {
  explicit FilterStats(std::vector<std::string> field_paths)
      : paths(std::move(field_paths)), present(std::make_unique<std::atomic<int64_t>[]>(paths.size())) {}
  std::atomic<int64_t> seen{0};                     ///< changes the filter evaluated
  std::atomic<int64_t> kept{0};                     ///< of those, kept (TRUE)
  const std::vector<std::string> paths;             ///< the field paths the filter reads
  std::unique_ptr<std::atomic<int64_t>[]> present;  ///< per path: > 0 once a record had it (checked until then)

  /// The field names of the first record the filter saw ("after: id, amount_cents, ..."), for the warning.
  void sample_once(const Value& input) {
    std::lock_guard lock(mu);
    if (!sample.empty()) return;
    for (const char* image : {"after", "before"}) {
      const Value* v = input.find(image);
      if (v == nullptr || !v->is_object()) continue;
      sample = std::string(image) + ":";
      for (const auto& [k, unused] : v->as_object())
        sample += " " + k;
      return;
    }
    sample = "(no row image)";
  }
  std::string sample_fields() const {
    std::lock_guard lock(mu);
    return sample;
  }

 private:
  mutable std::mutex mu;
  std::string sample;
};

/// Counters of one pipeline run, shared by the subtasks of its functions. Thread-safe (relaxed atomics).
/// One of a connector's own metrics under Flink's name, for the registry (metrics/): `group` is a '.'-separated
/// path below the connector operator's scope ("" = the operator scope itself, e.g.
/// "KafkaSourceReader.KafkaConsumer" as Flink's Kafka source).
struct ConnectorMetric {
  std::string group;
  std::string name;
  double value = 0;
};

struct PipelineCounters {
  /// Per transform (by index in spec.transforms): its filter's stats, null when it has no filter. Filled once
  /// before the job starts (init_filters), read-only in shape afterwards.
  std::vector<std::unique_ptr<FilterStats>> filters;
  void init_filters(const PipelineSpec& spec) {
    filters.clear();
    for (const TransformSpec& t : spec.transforms)
      filters.push_back(t.filter ? std::make_unique<FilterStats>(t.filter->field_paths()) : nullptr);
  }
  FilterStats* filter(size_t transform_index) const {
    return transform_index < filters.size() ? filters[transform_index].get() : nullptr;
  }

  std::atomic<int64_t> changes_in{0};             ///< change events that reached the transform
  std::atomic<int64_t> events_out{0};             ///< domain events emitted
  std::atomic<int64_t> filtered{0};               ///< dropped by a filter
  std::atomic<int64_t> unrouted{0};               ///< matched no route
  std::atomic<int64_t> dead_letters{0};           ///< sent to the dead-letter sink by the transform
  std::atomic<int64_t> function_dead_letters{0};  ///< of those, failures of a user function (the rest: expressions)
  std::atomic<int64_t> last_source_ts_ms{0};      ///< source timestamp of the latest change seen
  std::atomic<int64_t> tombstones{0};             ///< tombstones written by Kafka sinks after delete events
  /// Sinks' own metrics: the sink operator's uid and a function returning them (same order and length on every
  /// call). Filled while the job is built, before it starts; read-only afterwards.
  struct SinkMetrics {
    std::string uid;
    std::function<std::vector<ConnectorMetric>()> read;
  };
  std::vector<SinkMetrics> sink_metrics;

  /// Domain events per type, merged from the transform's subtasks now and then (add_types) and at close.
  void add_types(std::map<std::string, int64_t>& counts) {
    std::lock_guard lock(mu);
    for (auto& [t, n] : counts)
      types[t] += n;
    counts.clear();
  }
  std::map<std::string, int64_t> type_counts() const {
    std::lock_guard lock(mu);
    return types;
  }

 private:
  mutable std::mutex mu;
  std::map<std::string, int64_t> types;
};

/// Source lag and position readers of the running source, for /metrics and /health.
struct SourceProbe {
  std::string type;
  /// What the source reads, for /health's messages ("orders" for a Kafka topic, "slot x" for Postgres).
  std::string description;
  /// Its reader subtasks' connections to their system (empty: the source reports none, e.g. files).
  std::function<std::vector<SourceConnection>()> connections;
  /// Lag in ms (now minus the source timestamp of the latest change not yet caught up), or -1 unknown. Set by
  /// the runner from the transform's latest source time for sources that do not report their own.
  std::function<int64_t(int64_t now_ms)> lag_ms;
  /// Extra gauges "name" -> value (events, positions), for /metrics.
  std::function<std::vector<std::pair<std::string, double>>()> gauges;
  /// Records the source diverted to its dead-letter file (empty: the source has none).
  std::function<int64_t()> bad_records;
  /// That file's path (DeadLetterFile::open's string; empty without pipeline.dead-letter), for the counts per reason.
  std::string dead_letter_path;
  /// The connector's own metrics under Flink's names; the list's order and length never change.
  using ConnectorMetric = detail::ConnectorMetric;
  std::function<std::vector<ConnectorMetric>()> connector_metrics;
};

/// Expands ${NAME} from the environment in `text`; an unset variable is a kConfiguration error naming it.
Result<std::string> expand_env(const std::string& text);

/// The source as a stream of change events. Fills `probe`. Errors: kConfiguration with the option's location.
Result<DataStream<cdc::ChangeEvent>> add_source(StreamEnvironment& env, const PipelineSpec& spec,
                                                const std::string& dead_letter_dir, SourceProbe& probe);

/// The transform: change events -> routed domain events; bad records to `dead_letters` (a side output) when
/// the pipeline has a dead-letter sink, else the job fails naming the record. Prepares the modules of the
/// transforms' functions (npm ci, esbuild): kConfiguration naming the module when that fails.
Result<DataStream<RoutedEvent>> add_transform(DataStream<cdc::ChangeEvent>& changes, const PipelineSpec& spec,
                                              std::shared_ptr<PipelineCounters> counters,
                                              std::optional<DataStream<Value>>* dead_letters);

/// Adds sink `index` of spec.sinks, fed by the events whose mask has bit `index`: `events` keyed by entity, or,
/// where one subtask feeds one (see PipelineRunner::create), the transform's output itself, chained to the sink.
/// `entity-version` needs the keyed stream. Errors: kConfiguration.
Status add_sink(DataStream<RoutedEvent>& events, bool keyed, const PipelineSpec& spec, size_t index,
                const std::string& dead_letter_dir, std::shared_ptr<PipelineCounters> counters);

/// Adds the dead-letter sink for the transform's bad records.
Status add_dead_letter_sink(DataStream<Value>& bad, const PipelineSpec& spec);

/// `sluice validate --sample`: runs the transform over `changes` as the job's would (filter, projection, key,
/// event, routes; functions are not run), one line per change saying what each step did, then per transform
/// how many records it matched and kept, with the warnings the running job would give about its filter.
std::string sample_transform(const PipelineSpec& spec, const std::vector<cdc::ChangeEvent>& changes);

}  // namespace sluice::pipeline::detail
