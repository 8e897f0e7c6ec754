// The local mini-cluster (DESIGN.md §2 "local mode"): JobManager and TaskManager parts in one process.
//
// Chains the stream graph, checks slots, sizes the network buffer pool, wires in-memory channels and runs one
// thread per task. The JobManager part runs the CheckpointCoordinator (when checkpointing or savepoints are
// configured) and failover (DESIGN.md §7): a failed task fails its failover region — the connected part of
// the job graph — whose tasks are cancelled and, under the job's restart strategy, redeployed from the latest
// completed checkpoint; other regions keep running. When the strategy allows no more restarts the job fails
// with the task's error.
#pragma once

#include <memory>
#include <string>

#include "sluice/api/job.h"
#include "sluice/core/clock.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

class NetworkBufferPool;

/// Introspection for tests and metrics (the job's buffer pool).
struct LocalJobProbe {
  const NetworkBufferPool* buffer_pool = nullptr;
  int task_count = 0;
};

/// Submits `graph` to a new local mini-cluster and returns at once. Errors in the graph (kGraph),
/// configuration (kConfiguration) or the state to start from (kState, kCheckpoint: a savepoint that cannot be
/// read or does not match the job) are returned before anything runs.
Result<JobClient> submit_local_job(std::shared_ptr<StreamGraph> graph, std::string job_name, const Clock& clock,
                                   LocalJobProbe* probe = nullptr);

}  // namespace sluice
