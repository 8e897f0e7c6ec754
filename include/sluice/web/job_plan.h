// JobPlan: what the REST API shows of a job's graph, taken before it runs: its operators (stream nodes) and
// its job vertices (chains of operators, one task per subtask) with the edges between them, as Flink's
// GET /jobs/:id "plan" and "vertices" show them. Vertex ids are Flink's shape (32 hex digits), derived from
// the uids of the chain's operators, so they stay the same across runs of the same job.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

/// One input of a job vertex: the producing vertex (its index in JobPlan::vertices) and how records are
/// spread ("FORWARD", "HASH", "REBALANCE", "RESCALE", "BROADCAST": Flink's ship strategies).
struct JobPlanInput {
  int vertex = 0;
  std::string ship_strategy;
};

/// One job vertex: a chain of operators.
struct JobPlanVertex {
  int index = 0;     ///< the runtime's vertex id (SubtaskMetrics::vertex_id), topological order
  std::string id;    ///< 32 hex digits, stable across runs of the same graph
  std::string name;  ///< "Source: orders -> Filter" (the task name)
  int parallelism = 1;
  int max_parallelism = 128;
  std::string slot_sharing_group;
  std::vector<std::string> operator_names;  ///< the chain, head first
  std::vector<std::string> operator_uids;
  std::vector<JobPlanInput> inputs;
};

/// A job's operators and vertices. Implicitly made from operators alone (then the vertices are learnt from
/// the running job's metrics, without edges).
struct JobPlan {
  JobPlan() = default;
  JobPlan(std::vector<OperatorStats> ops) : operators(std::move(ops)) {}  // NOLINT(google-explicit-constructor)
  std::vector<OperatorStats> operators;
  std::vector<JobPlanVertex> vertices;
};

/// The plan of `graph` (copied; `graph` is not changed): the same chaining and vertex numbering as the job
/// that execute_async() builds from it. Call it before execute_async(), which consumes the graph. A graph that
/// does not build (execute_async reports why) gives its operators and no vertices.
JobPlan job_plan_of(const StreamGraph& graph);

/// Flink's 32-hex-digit vertex id for a chain with these operator uids.
std::string job_vertex_id(const std::vector<std::string>& operator_uids);

}  // namespace sluice
