// Pipeline files: parsing, defaults, connector option tables, and the exact "file:line:col: reason" of each
// error class (docs/pipelines.md).
#include "sluice/pipeline/pipeline_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace sluice::pipeline {
namespace {

/// The error message of parsing `yaml` as "p.yaml" (fails the test when it parses).
std::string error_of(std::string_view yaml) {
  Result<PipelineSpec> spec = parse_pipeline(yaml, "p.yaml");
  if (spec.ok()) {
    ADD_FAILURE() << "parsed but should not:\n" << yaml;
    return "";
  }
  EXPECT_EQ(spec.error().code(), ErrorCode::kConfiguration);
  return spec.error().message();
}

PipelineSpec parse_ok(std::string_view yaml) {
  Result<PipelineSpec> spec = parse_pipeline(yaml, "p.yaml");
  if (!spec.ok()) {
    ADD_FAILURE() << spec.error().message();
    return PipelineSpec{};
  }
  return std::move(spec).value();
}

constexpr std::string_view kMinimal =
    "source: { type: datagen }\n"
    "sink:\n"
    "  out: { type: print }\n";

TEST(PipelineSpecTest, DesignExampleParses) {
  const PipelineSpec spec = parse_ok(R"yaml(pipeline:
  name: charges-to-events
  parallelism: 4
  checkpoint: { interval: 1s, storage: "file:///var/lib/sluice/checkpoints" }
  delivery: at-least-once
  dead-letter: { type: kafka, bootstrap-servers: "127.0.0.1:9092", topic: charges-dlq }
source:
  type: mongodb
  uri: mongodb://127.0.0.1:27017
  database: payments
  collections: [charges, refunds]
  start: initial
transform:
  - match: payments.charges
    filter: "after.status IN ('paid', 'refunded')"
    key: after.customer_id
    event:
      type: "'charge.' || after.status"
      payload: "after.id, after.amount AS amount_cents, after.customer_id"
route:
  - { match: "payments.*", sink: events }
  - { match: "payments.charges", sink: search }
sink:
  events: { type: kafka, bootstrap-servers: "127.0.0.1:9092", topic: domain-events }
  search: { type: opensearch, url: "http://127.0.0.1:9200", index: charges, id: key }
)yaml");
  EXPECT_EQ(spec.file, "p.yaml");
  EXPECT_EQ(spec.pipeline.name, "charges-to-events");
  EXPECT_EQ(spec.pipeline.parallelism, 4);
  EXPECT_EQ(spec.pipeline.checkpoint_interval_ms, 1000);
  EXPECT_EQ(spec.pipeline.checkpoint_storage, "file:///var/lib/sluice/checkpoints");
  EXPECT_EQ(spec.pipeline.delivery, "at-least-once");
  ASSERT_TRUE(spec.pipeline.dead_letter.has_value());
  EXPECT_EQ(spec.pipeline.dead_letter->name, "dead-letter");
  EXPECT_EQ(spec.pipeline.dead_letter->options.type, "kafka");
  EXPECT_EQ(spec.pipeline.dead_letter->options.get_string("topic"), "charges-dlq");

  EXPECT_EQ(spec.source.type, "mongodb");
  EXPECT_EQ(spec.source.get_string("uri"), "mongodb://127.0.0.1:27017");
  EXPECT_EQ(spec.source.get_list("collections"), (std::vector<std::string>{"charges", "refunds"}));
  EXPECT_EQ(spec.source.get_string("start"), "initial");
  EXPECT_EQ(spec.source.mark.line, 8);
  EXPECT_EQ(spec.source.mark.column, 3);

  ASSERT_EQ(spec.transforms.size(), 1u);
  const TransformSpec& t = spec.transforms[0];
  EXPECT_EQ(t.match, "payments.charges");
  ASSERT_TRUE(t.filter.has_value());
  EXPECT_EQ(t.filter->text(), "after.status IN ('paid', 'refunded')");
  ASSERT_TRUE(t.key.has_value());
  EXPECT_EQ(t.key->text(), "after.customer_id");
  ASSERT_TRUE(t.event.type.has_value());
  ASSERT_TRUE(t.event.payload.has_value());
  EXPECT_EQ(t.event.payload->names(), (std::vector<std::string>{"id", "amount_cents", "customer_id"}));
  EXPECT_FALSE(t.event.entity.has_value());
  EXPECT_FALSE(t.projection.has_value());
  EXPECT_EQ(t.mark.line, 14);

  ASSERT_EQ(spec.routes.size(), 2u);
  EXPECT_EQ(spec.routes[0].match, "payments.*");
  EXPECT_EQ(spec.routes[0].sink, "events");
  EXPECT_EQ(spec.routes[1].sink, "search");
  EXPECT_EQ(spec.routes[1].mark.line, 22);

  ASSERT_EQ(spec.sinks.size(), 2u);
  EXPECT_EQ(spec.sinks[0].name, "events");
  EXPECT_EQ(spec.sinks[0].options.get_string("topic"), "domain-events");
  const SinkSpec* search = spec.find_sink("search");
  ASSERT_NE(search, nullptr);
  EXPECT_EQ(search->options.type, "opensearch");
  ASSERT_TRUE(search->document_id.has_value());
  EXPECT_EQ(search->document_id->text(), "key");
  EXPECT_EQ(search->options.get_string("id"), "key");  // expressions keep their text in values too
  EXPECT_EQ(spec.find_sink("nope"), nullptr);
}

TEST(PipelineSpecTest, MinimalFileGetsDefaults) {
  const PipelineSpec spec = parse_ok(kMinimal);
  const PipelineSettings defaults;
  EXPECT_EQ(spec.pipeline.name, "sluice-pipeline");
  EXPECT_EQ(spec.pipeline.parallelism, 1);
  EXPECT_EQ(spec.pipeline.checkpoint_interval_ms, 1000);
  EXPECT_EQ(spec.pipeline.checkpoint_storage, defaults.checkpoint_storage);
  EXPECT_EQ(spec.pipeline.delivery, "at-least-once");
  EXPECT_EQ(spec.pipeline.restart.strategy, "exponential-delay");
  EXPECT_FALSE(spec.pipeline.restart.attempts.has_value());  // exponential-delay: no limit, as Flink
  EXPECT_FALSE(spec.pipeline.dead_letter.has_value());
  EXPECT_EQ(spec.pipeline.http_port, -1);
  EXPECT_TRUE(spec.pipeline.config.empty());
  EXPECT_EQ(spec.source.type, "datagen");
  EXPECT_EQ(spec.source.get_int("count", 100000), 100000);  // options are as written: no defaults filled in
  EXPECT_TRUE(spec.transforms.empty());
  EXPECT_TRUE(spec.routes.empty());
  ASSERT_EQ(spec.sinks.size(), 1u);
  EXPECT_EQ(spec.sinks[0].name, "out");
  EXPECT_FALSE(spec.sinks[0].kafka_key.has_value());
}

TEST(PipelineSpecTest, EntityVersionIsOffByDefaultAndABoolean) {
  EXPECT_FALSE(parse_ok(kMinimal).pipeline.entity_version);
  EXPECT_TRUE(
      parse_ok(std::string("pipeline: { entity-version: true }\n") + std::string(kMinimal)).pipeline.entity_version);
  EXPECT_EQ(error_of(std::string("pipeline:\n  entity-version: yes please\n") + std::string(kMinimal)),
            "p.yaml:2:19: 'entity-version' must be true or false, got 'yes please'");
}

TEST(PipelineSpecTest, PipelineSectionEveryKey) {
  const PipelineSpec spec = parse_ok(R"yaml(pipeline:
  name: p1
  parallelism: 1024
  checkpoint: { interval: 250ms, storage: "file:///tmp/cp" }
  delivery: exactly-once
  restart: { strategy: fixed-delay, attempts: 0, delay: 250ms, max-delay: 2d }
  dead-letter: { type: files, path: /tmp/dlq }
  http: { address: 0.0.0.0, port: 0 }
  health: { max-checkpoint-age: 5m, max-source-lag: 1h }
  config:
    taskmanager.memory.segment-size: 32768
    pipeline.object-reuse: true
source: { type: datagen, count: 0, rate: 500, entities: 10, seed: 7 }
sink: { out: { type: print, prefix: "> " } }
)yaml");
  const PipelineSettings& p = spec.pipeline;
  EXPECT_EQ(p.name, "p1");
  EXPECT_EQ(p.parallelism, 1024);
  EXPECT_EQ(p.checkpoint_interval_ms, 250);
  EXPECT_EQ(p.checkpoint_storage, "file:///tmp/cp");
  EXPECT_EQ(p.delivery, "exactly-once");
  EXPECT_EQ(p.restart.strategy, "fixed-delay");
  EXPECT_EQ(p.restart.attempts, 0);
  EXPECT_EQ(p.restart.delay_ms, 250);
  EXPECT_EQ(p.restart.max_delay_ms, 2 * 86'400'000LL);
  ASSERT_TRUE(p.dead_letter.has_value());
  EXPECT_EQ(p.dead_letter->options.type, "files");
  EXPECT_EQ(p.http_address, "0.0.0.0");
  EXPECT_EQ(p.http_port, 0);
  EXPECT_EQ(p.health_max_checkpoint_age_ms, 300'000);
  EXPECT_EQ(p.health_max_source_lag_ms, 3'600'000);
  ASSERT_EQ(p.config.size(), 2u);
  EXPECT_EQ(p.config[0], (std::pair<std::string, std::string>{"taskmanager.memory.segment-size", "32768"}));
  EXPECT_EQ(p.config[1], (std::pair<std::string, std::string>{"pipeline.object-reuse", "true"}));
  EXPECT_EQ(spec.source.get_int("count", -1), 0);
  EXPECT_EQ(spec.source.get_int("seed", -1), 7);
  EXPECT_EQ(spec.sinks[0].options.get_string("prefix"), "> ");
}

TEST(PipelineSpecTest, OptionKindsAreNormalised) {
  const PipelineSpec spec = parse_ok(R"yaml(source:
  type: postgres
  conninfo: "host=127.0.0.1 dbname=shop"
  tables: [public.orders, public.items]
  create-slot: false
  heartbeat-interval: 10s
  snapshot-fetch-rows: 5000
  truncate: skip
sink:
  bus:
    type: kafka
    bootstrap-servers: 127.0.0.1:9092
    topic: events
    key: "after.id"
    properties:
      linger.ms: 5
      compression.type: zstd
  db:
    type: postgres
    conninfo: ""
    table: public.orders_copy
    key-columns: [id]
    row: "after.id, after.total AS total"
    flush-interval: 2000
)yaml");
  const ConnectorOptions& src = spec.source;
  EXPECT_EQ(src.get_list("tables"), (std::vector<std::string>{"public.orders", "public.items"}));
  EXPECT_FALSE(src.get_bool("create-slot", true));
  EXPECT_TRUE(src.get_bool("create-publication", true));
  EXPECT_EQ(src.get_int("heartbeat-interval", 0), 10'000);
  EXPECT_EQ(src.get_int("snapshot-fetch-rows", 0), 5000);
  EXPECT_EQ(src.get_string("truncate"), "skip");
  EXPECT_EQ(src.get_string("slot", "sluice"), "sluice");
  ASSERT_NE(src.find("tables"), nullptr);
  EXPECT_EQ(src.find("tables")->mark.line, 4);
  EXPECT_EQ(src.find("tables")->mark.column, 11);
  EXPECT_EQ(src.find("slot"), nullptr);

  const SinkSpec* bus = spec.find_sink("bus");
  ASSERT_NE(bus, nullptr);
  ASSERT_TRUE(bus->kafka_key.has_value());
  EXPECT_TRUE(bus->kafka_key->is_field_path());
  EXPECT_EQ(bus->options.get_map("properties"),
            (std::vector<std::pair<std::string, std::string>>{{"linger.ms", "5"}, {"compression.type", "zstd"}}));
  const SinkSpec* db = spec.find_sink("db");
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->row.has_value());
  EXPECT_EQ(db->row->names(), (std::vector<std::string>{"id", "total"}));
  EXPECT_EQ(db->options.get_string("conninfo", "x"), "");
  EXPECT_EQ(db->options.get_int("flush-interval", 0), 2000);
}

TEST(PipelineSpecTest, ElasticsearchAndKafkaSources) {
  const PipelineSpec spec = parse_ok(R"yaml(source:
  type: kafka
  bootstrap-servers: 127.0.0.1:9092
  topic-pattern: "orders-.*"
  start: earliest
sink:
  es:
    type: elasticsearch
    url: http://127.0.0.1:9200
    index-expression: "'orders-' || op"
    versioning: none
)yaml");
  EXPECT_EQ(spec.source.get_string("topic-pattern"), "orders-.*");
  ASSERT_TRUE(spec.sinks[0].index_expression.has_value());
  EXPECT_EQ(spec.sinks[0].options.get_string("versioning"), "none");
}

// --- errors: one message "file:line:col: reason" ---

TEST(PipelineSpecErrorTest, UnknownSectionWithSuggestion) {
  EXPECT_EQ(error_of("source: { type: datagen }\nsinks:\n  out: { type: print }\n"),
            "p.yaml:2:1: unknown section 'sinks' in the pipeline file; did you mean 'sink'?");
}

TEST(PipelineSpecErrorTest, UnknownOptionWithSuggestion) {
  EXPECT_EQ(error_of("source: { type: datagen }\n"
                     "sink:\n"
                     "  bus:\n"
                     "    type: kafka\n"
                     "    bootstrap-servers: b:9092\n"
                     "    topc: t\n"),
            "p.yaml:6:5: unknown option 'topc' in sink 'bus' (kafka); did you mean 'topic'?");
}

TEST(PipelineSpecErrorTest, UnknownKeyWithoutCloseMatchListsKnownKeys) {
  EXPECT_EQ(error_of("pipeline:\n  restart: { strategy: none, backoff: 1s }\nsource: { type: datagen }\n"
                     "sink: { out: { type: print } }\n"),
            "p.yaml:2:30: unknown key 'backoff' in 'restart' (known: strategy, attempts, delay, max-delay)");
  EXPECT_EQ(error_of("pipeline:\n  paralelism: 2\n" + std::string(kMinimal)),
            "p.yaml:2:3: unknown key 'paralelism' in 'pipeline'; did you mean 'parallelism'?");
}

TEST(PipelineSpecErrorTest, WrongKind) {
  EXPECT_EQ(error_of("pipeline:\n  parallelism: [2]\n" + std::string(kMinimal)),
            "p.yaml:2:16: 'parallelism' must be an integer from 1 to 1024, got a list");
  EXPECT_EQ(error_of("pipeline:\n  parallelism: 0\n" + std::string(kMinimal)),
            "p.yaml:2:16: 'parallelism' must be an integer from 1 to 1024, got '0'");
  EXPECT_EQ(error_of("source: { type: datagen, count: lots }\nsink: { out: { type: print } }\n"),
            "p.yaml:1:33: 'count' must be an integer >= 0, got 'lots'");
  EXPECT_EQ(
      error_of("source:\n  type: postgres\n  conninfo: x\n  create-slot: maybe\nsink: { out: { type: print } }\n"),
      "p.yaml:4:16: 'create-slot' must be true or false, got 'maybe'");
  EXPECT_EQ(error_of("source:\n  type: postgres\n  conninfo: x\n  tables: orders\nsink: { out: { type: print } }\n"),
            "p.yaml:4:11: 'tables' must be a list, got 'orders'");
  EXPECT_EQ(error_of("source: datagen\nsink: { out: { type: print } }\n"),
            "p.yaml:1:9: 'source' must be a mapping, got 'datagen'");
  // An empty value points at its key.
  EXPECT_EQ(error_of("pipeline:\n  name:\n" + std::string(kMinimal)),
            "p.yaml:2:3: 'name' must be a string, got nothing");
}

TEST(PipelineSpecErrorTest, BadDuration) {
  EXPECT_EQ(error_of("pipeline:\n  checkpoint:\n    interval: 1sec\n" + std::string(kMinimal)),
            "p.yaml:3:15: 'interval' must be a duration: an integer with unit ms, s, m, h or d (250ms, 1s, 5m, 1h, "
            "2d) or an integer of milliseconds, got '1sec'");
  EXPECT_EQ(error_of("pipeline:\n  restart: { delay: -5 }\n" + std::string(kMinimal)),
            "p.yaml:2:21: 'delay' must be a duration: an integer with unit ms, s, m, h or d (250ms, 1s, 5m, 1h, "
            "2d) or an integer of milliseconds, got '-5'");
}

TEST(PipelineSpecErrorTest, BadEnum) {
  EXPECT_EQ(error_of("pipeline:\n  delivery: exactly_once\n" + std::string(kMinimal)),
            "p.yaml:2:13: 'delivery' must be one of at-least-once, exactly-once, got 'exactly_once'; did you mean "
            "'exactly-once'?");
  EXPECT_EQ(error_of("source:\n  type: mongodb\n  uri: m\n  database: d\n  collections: [a]\n  start: now\n"
                     "sink: { out: { type: print } }\n"),
            "p.yaml:6:10: 'start' must be one of initial, latest, timestamp, got 'now'");
}

TEST(PipelineSpecErrorTest, ExactlyOnceWithoutCheckpointsIsRefusedNamingTheKey) {
  // Exactly-once sinks commit on completed checkpoints: without them the run would silently be at-least-once.
  EXPECT_EQ(error_of("pipeline:\n  checkpoint: { interval: 0 }\n  delivery: exactly-once\n" + std::string(kMinimal)),
            "p.yaml:3:13: 'delivery: exactly-once' needs checkpoints, but 'pipeline.checkpoint.interval' is 0 "
            "(disabled) at line 2; set an interval (e.g. 1s) or use 'delivery: at-least-once'");
  // The order of the keys does not matter, and at-least-once without checkpoints stays valid.
  EXPECT_EQ(error_of("pipeline:\n  delivery: exactly-once\n  checkpoint:\n    interval: 0ms\n" + std::string(kMinimal)),
            "p.yaml:2:13: 'delivery: exactly-once' needs checkpoints, but 'pipeline.checkpoint.interval' is 0 "
            "(disabled) at line 4; set an interval (e.g. 1s) or use 'delivery: at-least-once'");
  EXPECT_EQ(parse_ok("pipeline:\n  checkpoint: { interval: 0 }\n  delivery: at-least-once\n" + std::string(kMinimal))
                .pipeline.checkpoint_interval_ms,
            0);
}

TEST(PipelineSpecErrorTest, UnknownConnectorType) {
  EXPECT_EQ(error_of("source: { type: postgress, conninfo: x }\nsink: { out: { type: print } }\n"),
            "p.yaml:1:17: unknown source type 'postgress' (types: files, datagen, postgres, mongodb, kafka); did "
            "you mean 'postgres'?");
  EXPECT_EQ(error_of("source: { type: datagen }\nsink:\n  x: { type: stdout }\n"),
            "p.yaml:3:14: unknown sink type 'stdout' (types: kafka, opensearch, elasticsearch, postgres, files, "
            "print)");
  EXPECT_EQ(error_of("pipeline:\n  dead-letter: { type: postgres, conninfo: c, table: t, key-columns: [id] }\n" +
                     std::string(kMinimal)),
            "p.yaml:2:24: the dead-letter sink must be of type files, kafka, print, got 'postgres'");
}

TEST(PipelineSpecErrorTest, MissingRequired) {
  EXPECT_EQ(error_of("sink: { out: { type: print } }\n"), "p.yaml:1:1: missing required section 'source'");
  EXPECT_EQ(error_of("pipeline: { name: x }\nsource: { type: datagen }\n"),
            "p.yaml:1:1: missing required section 'sink'");
  EXPECT_EQ(error_of(""), "p.yaml:1:1: missing required section 'source'");
  EXPECT_EQ(error_of("source: { type: datagen }\nsink: {}\n"), "p.yaml:2:7: 'sink' needs at least one sink");
  EXPECT_EQ(error_of("source:\n  uri: x\nsink: { out: { type: print } }\n"),
            "p.yaml:2:3: the source is missing required key 'type' (one of files, datagen, postgres, mongodb, "
            "kafka)");
  EXPECT_EQ(error_of("source: { type: datagen }\n"
                     "sink:\n"
                     "  db:\n"
                     "    type: postgres\n"
                     "    conninfo: x\n"
                     "    key-columns: [id]\n"),
            "p.yaml:4:5: sink 'db' (postgres) is missing required option 'table'");
  EXPECT_EQ(error_of("source: { type: datagen }\nsink: { out: { type: print } }\ntransform:\n  - filter: \"true\"\n"),
            "p.yaml:4:5: a transform is missing required key 'match'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "route:\n  - match: a.b\n"),
            "p.yaml:5:5: a route is missing required key 'sink'");
}

TEST(PipelineSpecErrorTest, ExactlyOneOf) {
  EXPECT_EQ(error_of("source:\n  type: mongodb\n  uri: m\n  database: d\nsink: { out: { type: print } }\n"),
            "p.yaml:2:3: the source (mongodb) needs one of 'collections' or 'collection-regex'");
  EXPECT_EQ(error_of("source:\n  type: kafka\n  bootstrap-servers: b\n  topics: [a]\n  topic-pattern: a.*\n"
                     "sink: { out: { type: print } }\n"),
            "p.yaml:5:18: the source (kafka) takes only one of 'topics' and 'topic-pattern'");
}

TEST(PipelineSpecErrorTest, UnknownSinkInRoute) {
  EXPECT_EQ(error_of("source: { type: datagen }\n"
                     "route:\n"
                     "  - { match: \"a.*\", sink: evnts }\n"
                     "sink:\n"
                     "  events: { type: print }\n"
                     "  audit: { type: files, path: /tmp/a }\n"),
            "p.yaml:3:27: unknown sink 'evnts' (sinks: events, audit); did you mean 'events'?");
  EXPECT_EQ(error_of(std::string(kMinimal) + "route:\n  - { match: x, sink: warehouse }\n"),
            "p.yaml:5:23: unknown sink 'warehouse' (sinks: out)");
}

TEST(PipelineSpecErrorTest, RouteTopicAndIndexNeedAMatchingSinkType) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "route:\n  - { match: x, sink: out, topic: t }\n"),
            "p.yaml:5:28: 'topic' applies to routes to kafka sinks; sink 'out' is print");
  EXPECT_EQ(error_of(std::string(kMinimal) + "route:\n  - match: x\n    sink: out\n    index: i\n"),
            "p.yaml:7:5: 'index' applies to routes to opensearch and elasticsearch sinks; sink 'out' is print");
}

TEST(PipelineSpecErrorTest, KafkaSinkTopicFromRoutes) {
  const std::string sinks =
      "source: { type: datagen }\n"
      "sink:\n"
      "  bus: { type: kafka, bootstrap-servers: b }\n";
  // Every route to the sink names a topic: fine.
  const PipelineSpec spec = parse_ok(sinks + "route:\n  - { match: a.x, sink: bus, topic: x }\n");
  EXPECT_EQ(spec.routes[0].topic, "x");
  EXPECT_EQ(error_of(sinks + "route:\n  - { match: a.x, sink: bus, topic: x }\n  - { match: a.y, sink: bus }\n"),
            "p.yaml:3:8: sink 'bus' (kafka) is missing required option 'topic'; the route at line 6 gives it no "
            "topic");
  EXPECT_EQ(error_of(sinks),
            "p.yaml:3:8: sink 'bus' (kafka) is missing required option 'topic'; without routes "
            "every event goes to it");
}

TEST(PipelineSpecErrorTest, SearchSinkIndexFromRoutes) {
  const std::string sinks =
      "source: { type: datagen }\n"
      "sink:\n"
      "  search: { type: opensearch, url: \"http://h:9200\" }\n";
  EXPECT_TRUE(parse_pipeline(sinks + "route:\n  - { match: '**', sink: search, index: all }\n", "p.yaml").ok());
  EXPECT_EQ(error_of(sinks + "route:\n  - { match: '**', sink: search }\n"),
            "p.yaml:3:11: sink 'search' (opensearch) is missing required option 'index' (or 'index-expression'); "
            "the route at line 5 gives it no index");
}

/// The expected message of an expression that fails to compile, from the compiler's own offset and reason.
std::string expected_expression_error(std::string_view text, std::string_view option, int line, int column) {
  Expression out;
  ExpressionError error;
  EXPECT_FALSE(Expression::compile(text, &out, &error));
  return "p.yaml:" + std::to_string(line) + ":" + std::to_string(column + static_cast<int>(error.offset)) +
         ": invalid expression in '" + std::string(option) + "': " + error.message;
}

TEST(PipelineSpecErrorTest, BadExpressionPointsIntoTheScalar) {
  const std::string head = std::string(kMinimal) + "transform:\n  - match: a.b\n";
  // Plain scalar: column of the scalar + offset.
  EXPECT_EQ(error_of(head + "    filter: after.x = = 1\n"),
            expected_expression_error("after.x = = 1", "filter", 6, 13));
  // Double-quoted: one more for the opening quote.
  EXPECT_EQ(error_of(head + "    filter: \"after.x IN (1,\"\n"),
            expected_expression_error("after.x IN (1,", "filter", 6, 14));
  // Single-quoted with escaped quotes before the error: each '' is one character in two columns.
  EXPECT_EQ(error_of(head + "    key: 'COALESCE(after.a, ''b'') ) x'\n"),
            expected_expression_error("COALESCE(after.a, 'b') ) x", "key", 6, 11 + 2));
  // Nested event keys.
  EXPECT_EQ(error_of(head + "    event:\n      type: \"'x' ||\"\n"),
            expected_expression_error("'x' ||", "type", 7, 14));
}

TEST(PipelineSpecErrorTest, BadExpressionInBlockScalarPointsAtItsStart) {
  const std::string text = "after.a > 1 AND\nafter.b = = 2\n";
  Expression out;
  ExpressionError error;
  ASSERT_FALSE(Expression::compile(text, &out, &error));
  EXPECT_EQ(
      error_of(std::string(kMinimal) + "transform:\n  - match: a.b\n    filter: |\n      after.a > 1 AND\n"
                                       "      after.b = = 2\n"),
      "p.yaml:6:13: invalid expression in 'filter': at offset " + std::to_string(error.offset) + ": " + error.message);
}

TEST(PipelineSpecErrorTest, BadProjectionInSinkOption) {
  Projection out;
  ExpressionError error;
  ASSERT_FALSE(Projection::compile("after.a + 1", &out, &error));  // a computed item needs AS
  EXPECT_EQ(error_of("source: { type: datagen }\nsink:\n  db: { type: postgres, conninfo: c, table: t, "
                     "key-columns: [id], row: \"after.a + 1\" }\n"),
            "p.yaml:3:" + std::to_string(73 + static_cast<int>(error.offset)) +
                ": invalid projection in 'row': " + error.message);
}

TEST(PipelineSpecErrorTest, YamlSyntaxError) {
  EXPECT_EQ(error_of("source: { type: datagen\nsink: x\n"), "p.yaml:2:5: invalid YAML: end of map flow not found");
  EXPECT_EQ(error_of("source: a: b\n"), "p.yaml:1:10: invalid YAML: illegal map value");
}

TEST(PipelineSpecErrorTest, DuplicateKey) {
  EXPECT_EQ(error_of("source: { type: datagen }\nsink: { out: { type: print } }\nsource: { type: files }\n"),
            "p.yaml:3:1: duplicate key 'source' (first at line 1)");
  EXPECT_EQ(error_of("source: { type: datagen, count: 1, count: 2 }\nsink: { out: { type: print } }\n"),
            "p.yaml:1:36: duplicate key 'count' (first at line 1)");
  EXPECT_EQ(error_of("source: { type: datagen }\nsink:\n  a: { type: print }\n  a: { type: print }\n"),
            "p.yaml:4:3: duplicate key 'a' (first at line 3)");
}

TEST(PipelineSpecTest, LoadPipeline) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_pipeline_spec_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "p.yaml";
  {
    std::ofstream out(file);
    out << "pipeline: { name: from-file }\n" << kMinimal;
  }
  Result<PipelineSpec> spec = load_pipeline(file);
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  EXPECT_EQ(spec->pipeline.name, "from-file");
  EXPECT_EQ(spec->file, file.string());

  {
    std::ofstream out(file);
    out << "pipeline: { name: from-file, parallelism: x }\n" << kMinimal;
  }
  Result<PipelineSpec> bad = load_pipeline(file);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), file.string() + ":1:43: 'parallelism' must be an integer from 1 to 1024, got 'x'");

  Result<PipelineSpec> missing = load_pipeline(dir / "absent.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kConfiguration);
  EXPECT_NE(missing.error().message().find("absent.yaml"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(MatchCollectionTest, Globs) {
  EXPECT_TRUE(match_collection("payments.charges", "payments.charges"));
  EXPECT_FALSE(match_collection("payments.charges", "payments.charges2"));
  EXPECT_FALSE(match_collection("payments.charge", "payments.charges"));
  EXPECT_TRUE(match_collection("payments.*", "payments.charges"));
  EXPECT_TRUE(match_collection("payments.*", "payments."));
  EXPECT_FALSE(match_collection("payments.*", "payments.charges.v2"));
  EXPECT_TRUE(match_collection("*.charges", "payments.charges"));
  EXPECT_FALSE(match_collection("*.charges", "a.b.charges"));
  EXPECT_TRUE(match_collection("**", "a.b.c"));
  EXPECT_TRUE(match_collection("**", ""));
  EXPECT_TRUE(match_collection("a.**", "a.b.c"));
  EXPECT_TRUE(match_collection("**.c", "a.b.c"));
  EXPECT_FALSE(match_collection("**.c", "a.b.cd"));
  EXPECT_TRUE(match_collection("a.**.z", "a.b.c.z"));
  EXPECT_TRUE(match_collection("pay*.ch*s", "payments.charges"));
  EXPECT_FALSE(match_collection("pay*", "payments.charges"));
  EXPECT_TRUE(match_collection("payments.charge?", "payments.charges"));
  EXPECT_FALSE(match_collection("payments.charge?", "payments.charge"));
  EXPECT_TRUE(match_collection("public.order_?", "public.order_1"));
  EXPECT_TRUE(match_collection("", ""));
  EXPECT_FALSE(match_collection("", "a"));
  EXPECT_FALSE(match_collection("a", ""));
  EXPECT_TRUE(match_collection("*", ""));
  EXPECT_TRUE(match_collection("*a*b*c*", "xaybzc"));
  EXPECT_FALSE(match_collection("*a*b*c*", "xaybz.c"));
}

}  // namespace
}  // namespace sluice::pipeline
