// SourceLagReport: how far one source is behind its server (the Kafka topics' latest records, the Postgres
// server's WAL position, the MongoDB cluster time) as the source in a TaskManager's process measures it, sent to
// the JobManager with every heartbeat (proto/sluice/cluster/v1/jobmanager.proto, `TaskManagerHeartbeat.source_lags`)
// so that the JobManager's /health says `source-lag` as `sluice run`'s does (docs/operations.md, "Health and
// alerts"). Cluster code does not include the pipeline; the process that builds the job (apps/sluice) asks its
// PipelineRunner.
//
// A plain value: thread-compatible.
#pragma once

#include <cstdint>
#include <string>

namespace sluice {

struct SourceLagReport {
  std::string source;       ///< the connector: "kafka", "postgres", "mongodb"
  std::string description;  ///< what it reads ("orders", "slot sluice"); "" = source
  int64_t lag_ms = -1;      ///< behind its server (ms) when measured; -1 unknown (no reader here, nothing read yet)

  bool operator==(const SourceLagReport&) const = default;
};

}  // namespace sluice
