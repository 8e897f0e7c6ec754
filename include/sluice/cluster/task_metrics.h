// A task's counters as the REST API and /metrics show them (SubtaskMetrics, api/job.h): what local mode's job and
// a TaskManager (for its heartbeats and task ends) read from their running tasks, the same way.
//
// Thread-safety: any thread; a task's counters are atomics its thread writes.
#pragma once

#include "sluice/api/job.h"
#include "sluice/graph/job_graph.h"
#include "sluice/runtime/task.h"

namespace sluice {

/// Adds task `t`'s counters as they are now to `m`: its run time (until now while it runs), bytes in and out,
/// idle and backpressured time, each chained operator's records in and out; sets the operators' watermarks and
/// `running`. First, when `m` does not hold the task's chain yet, fills its identity: vertex, name, subtask,
/// parallelism, attempt, and the chain's operators (name, uid) with those feeding a job edge of `jg` marked
/// `network_output`.
void add_task_metrics(SubtaskMetrics& m, const Task& t, const JobGraph& jg);

}  // namespace sluice
