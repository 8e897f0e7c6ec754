// PipelineSpec: a parsed and validated pipeline file, what `sluice run` and `sluice validate` read
// (DESIGN.md §11; the model is Flink CDC's pipeline definition files). docs/pipelines.md is the reference.
//
// A file has five sections: `pipeline` (name, parallelism, checkpoints, delivery, restart, dead letters,
// HTTP endpoint), `source` (one connector), `transform` (per collection/table pattern: filter, projection,
// entity key and domain-event mapping, as SQL expressions), `route` (patterns to sinks) and `sink` (named
// connectors). parse_pipeline() checks everything it can without connecting anywhere: unknown keys, wrong
// kinds, missing required options, expressions that do not compile, routes naming unknown sinks. Every error
// is one message "FILE:LINE:COLUMN: reason" (1-based, pointing at the offending key or value).
//
// Thread-safety: a PipelineSpec is an immutable value once parsed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/core/value.h"
#include "sluice/pipeline/expression.h"

namespace sluice::pipeline {

/// A position in the pipeline file, 1-based; line 0 means unknown.
struct Mark {
  int line = 0;
  int column = 0;
};

/// One option of a connector as written, normalised to its declared kind: strings stay strings, integers
/// become int64, durations ("500ms", "1s", "5m", "1h", or a bare integer of ms) become int64 ms, booleans
/// bool, lists arrays of strings, maps (`properties`) objects of strings.
struct OptionValue {
  std::string key;
  Value value;
  Mark mark;  ///< of the value
};

/// A connector's options (of a source or a sink), in file order, validated against the connector's table.
struct ConnectorOptions {
  std::string type;  ///< the `type` value ("kafka", "postgres", ...)
  std::vector<OptionValue> values;
  Mark mark;  ///< of the section (the mapping) itself

  /// The option, or nullptr when absent.
  const OptionValue* find(std::string_view key) const noexcept;
  /// Typed accessors returning `fallback` when absent (the parser already checked the kinds).
  std::string get_string(std::string_view key, std::string fallback = {}) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::vector<std::string> get_list(std::string_view key) const;
  /// A map option as key/value string pairs in file order (empty when absent).
  std::vector<std::pair<std::string, std::string>> get_map(std::string_view key) const;
};

/// A named sink (a key under `sink:`), or the dead-letter sink.
struct SinkSpec {
  std::string name;
  ConnectorOptions options;  ///< options.type: kafka | opensearch | elasticsearch | postgres | files | print
  /// Expressions some sinks take, compiled (over the domain event; see docs/pipelines.md):
  std::optional<Expression> document_id;       ///< opensearch/elasticsearch `id` (default: `id`, the event id's entity)
  std::optional<Expression> index_expression;  ///< opensearch/elasticsearch `index-expression`
  std::optional<Expression> kafka_key;         ///< kafka `key` (default: `entity`)
  std::optional<Projection> row;               ///< postgres `row` (default: the event's payload)
};

/// The domain-event mapping of a transform (`event:`). Expressions are evaluated over the change event.
struct EventSpec {
  std::optional<Expression> type;         ///< default: "<collection>.<created|updated|deleted|read>"
  std::optional<Expression> entity;       ///< default: the transform's `key`, else the change event's key
  std::optional<Projection> payload;      ///< default: the row image (after; before for deletes)
  std::optional<Expression> occurred_at;  ///< default: the source timestamp
};

/// A transform's `function:`: an exported function of a TypeScript or JavaScript module, run on out-of-process
/// workers (one per subtask) after the filter and projection (docs/functions.md).
struct FunctionSpec {
  std::string runtime = "node";    ///< node (python is refused until it exists)
  std::string module;              ///< as written; relative paths are relative to the pipeline file's folder
  std::string export_name;         ///< the exported function
  int64_t batch_size = 256;        ///< records per batch sent to the worker
  int64_t batch_max_delay_ms = 2;  ///< a batch is sent at the latest this long after its first record
  int64_t max_in_flight = 2;       ///< batches sent and not yet answered, per subtask (backpressure beyond)
  int64_t timeout_ms = 30'000;     ///< a batch not answered within this fails the task (a hung worker)
  int64_t memory_mb = 512;  ///< node: the heap limit (--max-old-space-size); python: the address space (RLIMIT_AS)
  Mark mark;                ///< of the `function` key
  Mark module_mark;         ///< of the `module` value
};

/// One `transform:` item. Applies to the change events whose "database.collection" matches `match`.
struct TransformSpec {
  std::string match;                 ///< a glob: `*` any run of characters except '.', `**` any run, `?` one character
  std::optional<Expression> filter;  ///< keep the event only when TRUE
  std::optional<Projection> projection;  ///< replaces the row image (after, and before when known)
  std::optional<Expression> key;         ///< the entity id
  /// Called with the change event after filter and projection; its result is `result` in key and event
  /// expressions and the default payload.
  std::optional<FunctionSpec> function;
  EventSpec event;
  Mark mark;
};

/// One `route:` item: events of collections matching `match` go to sink `sink`.
struct RouteSpec {
  std::string match;
  std::string sink;
  std::string topic;  ///< kafka sinks: overrides the sink's topic ("" = the sink's)
  std::string index;  ///< opensearch sinks: overrides the sink's index ("" = the sink's)
  Mark mark;
};

/// How the job restarts after a failure (Flink's restart strategies).
struct RestartSpec {
  std::string strategy = "exponential-delay";  ///< none | fixed-delay | exponential-delay
  /// fixed-delay: restarts before the job fails (unset: 10); exponential-delay: restarts in a row (without
  /// running reset-backoff-threshold, 1 h) before the job fails (unset: no limit, as Flink's default).
  std::optional<int> attempts;
  int64_t delay_ms = 1000;        ///< fixed-delay: delay; exponential-delay: initial backoff
  int64_t max_delay_ms = 60'000;  ///< exponential-delay: max backoff
};

/// The `pipeline:` section.
struct PipelineSettings {
  std::string name = "sluice-pipeline";
  int parallelism = 1;
  int64_t checkpoint_interval_ms = 1000;  ///< 0 disables checkpointing
  std::string checkpoint_storage =
      "./.sluice/checkpoints";             ///< a path (relative: to the working directory) or file:///abs
  std::string delivery = "at-least-once";  ///< at-least-once | exactly-once
  /// Each domain event carries `entity_version`: 1, 2, 3, ... per entity and sink, kept in keyed state (it
  /// survives restarts and moves with its key group when the job is rescaled).
  bool entity_version = false;
  RestartSpec restart;
  std::optional<SinkSpec> dead_letter;  ///< where bad records go; absent = the job fails on a bad record
  std::string http_address = "127.0.0.1";
  int http_port = -1;                        ///< /metrics and /health; -1 disabled, 0 ephemeral
  int64_t health_max_checkpoint_age_ms = 0;  ///< 0 = 3 x checkpoint interval + 10 s
  int64_t health_max_source_lag_ms = 0;      ///< 0 = no bound
  int health_max_failed_checkpoints = 3;     ///< consecutive failed checkpoints that make /health fail; 0 = off
  /// /health stays unhealthy for this long after a failure, also once the job is RUNNING again (0 = off).
  int64_t health_restart_grace_ms = 60'000;
  /// A filter that dropped every record of this window (at least 100 of them) is reported as a warning in the
  /// log and in /health's "warnings" (health.filter-window).
  int64_t health_filter_window_ms = 60'000;
  /// Engine options passed through as written (`config:` map of Flink-style keys, e.g.
  /// `taskmanager.memory.segment-size: 32768`).
  std::vector<std::pair<std::string, std::string>> config;
};

/// A whole pipeline file.
struct PipelineSpec {
  std::string file;  ///< the name used in messages
  PipelineSettings pipeline;
  ConnectorOptions source;  ///< type: files | datagen | postgres | mongodb | kafka
  std::vector<TransformSpec> transforms;
  std::vector<RouteSpec> routes;  ///< empty: every event goes to every sink
  std::vector<SinkSpec> sinks;    ///< in file order

  const SinkSpec* find_sink(std::string_view name) const noexcept;
};

/// Parses and validates pipeline YAML. `file_name` is used in messages. Errors are kConfiguration with one
/// message "FILE:LINE:COLUMN: reason".
[[nodiscard]] Result<PipelineSpec> parse_pipeline(std::string_view yaml_text, std::string file_name);
/// Reads and parses a file; kConfiguration naming the path when it cannot be read.
[[nodiscard]] Result<PipelineSpec> load_pipeline(const std::filesystem::path& path);

/// True when `name` ("database.collection") matches the glob `pattern` (see TransformSpec::match).
bool match_collection(std::string_view pattern, std::string_view name) noexcept;

}  // namespace sluice::pipeline
