// The connector option tables of pipeline files; docs/pipelines.md mirrors them.
#include "sluice/pipeline/connector_option_tables.h"

#include <array>

namespace sluice::pipeline::detail {
namespace {

using K = OptionKind;

constexpr std::array<std::string_view, 1> kFilesFormats{"json-changes"};
constexpr std::array<std::string_view, 2> kPostgresStarts{"initial", "latest"};
constexpr std::array<std::string_view, 2> kPostgresTruncate{"fail", "skip"};
constexpr std::array<std::string_view, 2> kPostgresSnapshotResume{"fail", "repeat"};
constexpr std::array<std::string_view, 3> kMongoStarts{"initial", "latest", "timestamp"};
constexpr std::array<std::string_view, 2> kMongoFullDocument{"update-lookup", "default"};
constexpr std::array<std::string_view, 2> kMongoOnDrop{"fail", "end"};
constexpr std::array<std::string_view, 2> kMongoOnHistoryLost{"fail", "resnapshot"};
constexpr std::array<std::string_view, 3> kKafkaStarts{"earliest", "latest", "committed"};
constexpr std::array<std::string_view, 2> kVersioning{"external", "none"};
constexpr std::array<std::string_view, 2> kDecimalHandling{"string", "number"};

// --- sources ---
constexpr std::array kSourceFiles{
    OptionDef{
        "path", K::kString, true, {}, "", "a file, or a directory of `*.jsonl` / `*.json` files read in name order"},
    OptionDef{"format", K::kString, false, kFilesFormats, "json-changes",
              "json-changes: one change-event envelope (op, key, before, after, source) per line"},
};
constexpr std::array kSourceDatagen{
    OptionDef{"count", K::kInt, false, {}, "100000", "records to generate; 0 = unbounded"},
    OptionDef{"rate", K::kInt, false, {}, "0", "records per second; 0 = unlimited"},
    OptionDef{"entities", K::kInt, false, {}, "1000", "distinct entity keys"},
    OptionDef{"seed", K::kInt, false, {}, "42", "random seed (runs with the same seed are identical)"},
};
constexpr std::array kSourcePostgres{
    OptionDef{"conninfo", K::kString, true, {}, "", "libpq connection string"},
    OptionDef{"tables", K::kList, false, {}, "all tables of the publication", "tables to capture (schema.table)"},
    OptionDef{"slot", K::kString, false, {}, "sluice", "replication slot; each job needs its own"},
    OptionDef{"publication", K::kString, false, {}, "sluice", "publication"},
    OptionDef{"create-slot", K::kBool, false, {}, "true", "create the slot when absent"},
    OptionDef{"create-publication", K::kBool, false, {}, "true", "create the publication when absent"},
    OptionDef{"start", K::kString, false, kPostgresStarts, "initial", "initial: snapshot then stream; latest: stream"},
    OptionDef{"truncate", K::kString, false, kPostgresTruncate, "fail", "what a TRUNCATE does"},
    OptionDef{"heartbeat-interval",
              K::kDuration,
              false,
              {},
              "0 (none)",
              "emit a heartbeat message this often (keeps the slot moving when idle)"},
    OptionDef{"snapshot-resume", K::kString, false, kPostgresSnapshotResume,
              "fail with exactly-once delivery, else repeat",
              "restoring a checkpoint taken during the initial snapshot: fail, or read the snapshot again"},
    OptionDef{"liveness-timeout",
              K::kDuration,
              false,
              {},
              "wal_sender_timeout + 10s",
              "fail the source when the replication connection is silent this long"},
    OptionDef{"snapshot-fetch-rows", K::kInt, false, {}, "4096", "rows per snapshot fetch"},
    OptionDef{"queue-capacity",
              K::kInt,
              false,
              {},
              "2048",
              "changes buffered between the replication connection and the pipeline (memory: about 1 KiB each)"},
};
constexpr std::array kSourceMongodb{
    OptionDef{"uri", K::kString, true, {}, "", "MongoDB connection URI"},
    OptionDef{"database", K::kString, true, {}, "", "database to capture"},
    OptionDef{"collections", K::kList, false, {}, "", "collections (exactly one of collections / collection-regex)"},
    OptionDef{"collection-regex", K::kString, false, {}, "", "regular expression over collection names"},
    OptionDef{"start", K::kString, false, kMongoStarts, "initial",
              "initial: snapshot then stream; latest: stream; timestamp: stream from start-timestamp"},
    OptionDef{"start-timestamp", K::kInt, false, {}, "0", "start: timestamp: epoch milliseconds"},
    OptionDef{"full-document", K::kString, false, kMongoFullDocument, "update-lookup", "full document on updates"},
    OptionDef{"pre-images", K::kBool, false, {}, "false", "read before images (collections need them enabled)"},
    OptionDef{"on-drop", K::kString, false, kMongoOnDrop, "fail", "what a dropped collection does"},
    OptionDef{"on-history-lost", K::kString, false, kMongoOnHistoryLost, "fail",
              "when the resume point left the oplog: fail, or snapshot again"},
};
constexpr std::array kSourceKafka{
    OptionDef{"bootstrap-servers", K::kString, true, {}, "", "host:port[,host:port...]"},
    OptionDef{"topics", K::kList, false, {}, "", "topics (exactly one of topics / topic-pattern)"},
    OptionDef{"topic-pattern", K::kString, false, {}, "", "regular expression over topic names"},
    OptionDef{"group-id",
              K::kString,
              false,
              {},
              "sluice-{pipeline.name}",
              "consumer group (offsets are committed on checkpoints)"},
    OptionDef{"start", K::kString, false, kKafkaStarts, "committed", "where to start without a checkpoint"},
    OptionDef{"properties", K::kMap, false, {}, "", "librdkafka properties passed through"},
    OptionDef{"parallelism",
              K::kInt,
              false,
              {},
              "pipeline.parallelism",
              "readers of the source (1..1024), when they should be fewer than the job's subtasks"},
};

// --- sinks ---
constexpr std::array kSinkKafka{
    OptionDef{"bootstrap-servers", K::kString, true, {}, "", "host:port[,host:port...]"},
    OptionDef{"topic", K::kString, false, {}, "", "topic; required unless every route to this sink sets `topic`"},
    OptionDef{"key", K::kExpression, false, {}, "entity", "record key, over the domain event"},
    OptionDef{
        "transactional-id-prefix", K::kString, false, {}, "sluice-{pipeline.name}-{sink}", "exactly-once delivery"},
    OptionDef{"max-transaction-bytes",
              K::kInt,
              false,
              {},
              "536870912",
              "exactly-once: bound of a subtask's open transaction (its in-memory copy); past it the task fails"},
    OptionDef{"liveness-timeout",
              K::kDuration,
              false,
              {},
              "30s",
              "fail when no broker answered for this long, also while no record flows; 0 = off"},
    OptionDef{"tombstones-on-delete",
              K::kBool,
              false,
              {},
              "true",
              "after each delete event (op d), a record with the same key and a null value (Debezium's "
              "tombstones.on.delete): compaction then removes the key"},
    OptionDef{"properties", K::kMap, false, {}, "", "librdkafka properties passed through"},
};
constexpr std::array kSinkOpenSearch{
    OptionDef{"url", K::kString, true, {}, "", "http(s)://host:port"},
    OptionDef{"index",
              K::kString,
              false,
              {},
              "",
              "index; required unless index-expression is set or every route to this sink sets `index`"},
    OptionDef{"index-expression", K::kExpression, false, {}, "", "index per event, over the domain event"},
    OptionDef{
        "id", K::kExpression, false, {}, "entity", "document id, over the domain event (one document per entity)"},
    OptionDef{"bulk-actions", K::kInt, false, {}, "1000", "send a bulk request at this many actions"},
    OptionDef{"bulk-bytes", K::kInt, false, {}, "5242880", "... or at this many body bytes"},
    OptionDef{"flush-interval", K::kDuration, false, {}, "1s", "... or when its first action is this old"},
    OptionDef{"max-retries", K::kInt, false, {}, "8", "resends per request; 0 = no retry"},
    OptionDef{"versioning", K::kString, false, kVersioning, "external",
              "external: the event's version orders writes; none: last write wins"},
    OptionDef{"username", K::kString, false, {}, "", "basic authentication"},
    OptionDef{"password", K::kString, false, {}, "", "basic authentication"},
    OptionDef{"ca-file",
              K::kString,
              false,
              {},
              "",
              "PEM file of the CA(s) that signed the cluster's HTTPS certificate; default: the system's trusted CAs"},
    OptionDef{"decimal-handling", K::kString, false, kDecimalHandling, "string",
              "string: decimals as exact JSON strings; number: JSON numbers, which dynamic mapping indexes rounded"},
};
constexpr std::array kSinkPostgres{
    OptionDef{"conninfo", K::kString, true, {}, "", "libpq connection string"},
    OptionDef{"table", K::kString, true, {}, "", "target table (schema.table)"},
    OptionDef{"key-columns", K::kList, true, {}, "", "primary-key columns (upsert / delete by them)"},
    OptionDef{"row", K::kProjection, false, {}, "the event's payload", "the row's columns, over the domain event"},
    OptionDef{"batch-size", K::kInt, false, {}, "1000", "rows per statement batch"},
    OptionDef{"flush-interval", K::kDuration, false, {}, "1s", "flush a partial batch this old"},
};
constexpr std::array kSinkFiles{
    OptionDef{"path", K::kString, true, {}, "", "output directory or s3://bucket/prefix (JSON lines part files)"},
    OptionDef{"rolling-policy",
              K::kMap,
              false,
              {},
              "{ part-size: 128mb, rollover-interval: 1min, inactivity-interval: 1min }",
              "when a part file is finished (with checkpointing): at this size, age, or time without a record"},
    OptionDef{"throttle",
              K::kDuration,
              false,
              {},
              "0",
              "wait this long after each record, per subtask: a deliberately slow sink (demos, backpressure tests)"},
};
constexpr std::array kSinkPrint{
    OptionDef{"prefix", K::kString, false, {}, "", "text printed before each record"},
    OptionDef{"throttle",
              K::kDuration,
              false,
              {},
              "0",
              "wait this long after each record, per subtask: a deliberately slow sink (demos, backpressure tests)"},
};

constexpr std::array kSources{
    ConnectorTable{"files", kSourceFiles},       ConnectorTable{"datagen", kSourceDatagen},
    ConnectorTable{"postgres", kSourcePostgres}, ConnectorTable{"mongodb", kSourceMongodb},
    ConnectorTable{"kafka", kSourceKafka},
};
constexpr std::array kSinks{
    ConnectorTable{"kafka", kSinkKafka},
    ConnectorTable{"opensearch", kSinkOpenSearch},
    ConnectorTable{"elasticsearch", kSinkOpenSearch},
    ConnectorTable{"postgres", kSinkPostgres},
    ConnectorTable{"files", kSinkFiles},
    ConnectorTable{"print", kSinkPrint},
};
constexpr std::array<std::string_view, 3> kDeadLetterTypes{"files", "kafka", "print"};

}  // namespace

std::string_view option_kind_name(OptionKind kind) noexcept {
  switch (kind) {
    case OptionKind::kString:
      return "string";
    case OptionKind::kInt:
      return "integer";
    case OptionKind::kBool:
      return "boolean";
    case OptionKind::kDuration:
      return "duration";
    case OptionKind::kList:
      return "list";
    case OptionKind::kMap:
      return "map";
    case OptionKind::kExpression:
      return "expression";
    case OptionKind::kProjection:
      return "projection";
  }
  return "?";
}

const OptionDef* ConnectorTable::find(std::string_view key) const noexcept {
  for (const OptionDef& def : options) {
    if (def.key == key) return &def;
  }
  return nullptr;
}

std::span<const ConnectorTable> source_tables() noexcept {
  return kSources;
}
std::span<const ConnectorTable> sink_tables() noexcept {
  return kSinks;
}
std::span<const std::string_view> dead_letter_types() noexcept {
  return kDeadLetterTypes;
}

const ConnectorTable* find_table(std::span<const ConnectorTable> tables, std::string_view type) noexcept {
  for (const ConnectorTable& table : tables) {
    if (table.type == type) return &table;
  }
  return nullptr;
}

}  // namespace sluice::pipeline::detail
