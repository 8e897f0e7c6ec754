// SourceConnectionReport: one source reader subtask's connection to its external system (the Kafka cluster, the
// Postgres server, the MongoDB server) as a TaskManager reports it to its JobManager with every heartbeat
// (proto/sluice/cluster/v1/jobmanager.proto, `TaskManagerHeartbeat.source_connections`), so that the
// JobManager's /health says `source-disconnected` as `sluice run`'s does (docs/operations.md, "Health and
// alerts"). The connectors' own view is connectors/source_connection.h; cluster code does not include connectors,
// so the process that builds the job (apps/sluice) converts one into the other.
//
// A plain value: thread-compatible.
#pragma once

#include <cstdint>
#include <string>

namespace sluice {

struct SourceConnectionReport {
  std::string source;       ///< the connector: "kafka", "postgres", "mongodb"
  std::string description;  ///< what it reads, for messages ("orders", "slot sluice"); "" = source
  int subtask = 0;          ///< the reader's subtask index
  bool connected = true;
  int64_t disconnected_ms = 0;  ///< while disconnected: for how long (ms) when reported; 0 when connected
  std::string reason;           ///< while disconnected: the connector's reason (secrets redacted); "" when connected

  bool operator==(const SourceConnectionReport&) const = default;
};

}  // namespace sluice
