// The job graph: stream nodes chained into vertices (DESIGN.md §1 "operator, chain"). Two adjacent nodes are
// chained when the edge between them is forward, both have the same parallelism and slot sharing group, the
// target has exactly one input edge, and neither disabled chaining (Flink's StreamingJobGraphGenerator rule).
#pragma once

#include <string>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

/// One vertex: a chain of stream nodes run by one task per parallel subtask.
struct JobVertex {
  int id = 0;
  std::string name;                ///< "Map -> Filter" for a chain
  std::vector<int> chained_nodes;  ///< stream node ids, head first
  int parallelism = 1;
  int max_parallelism = 128;
  std::string slot_sharing_group;
  std::vector<int> inputs;   ///< job edge ids
  std::vector<int> outputs;  ///< job edge ids
};

/// A non-chained stream edge between two vertices.
struct JobEdge {
  int id = 0;
  int stream_edge = 0;  ///< the StreamEdge it carries
  int source_vertex = 0;
  int target_vertex = 0;
  int source_node = 0;  ///< the node inside the source vertex that produces into it
  PartitionerKind partitioner = PartitionerKind::kForward;
};

struct JobGraph {
  std::vector<JobVertex> vertices;  ///< in topological order
  std::vector<JobEdge> edges;
  /// The vertex that contains each stream node (indexed by node id).
  std::vector<int> vertex_of_node;
  /// Effective parallelism and max parallelism per node, and its stable uid.
  std::vector<int> node_parallelism;
  std::vector<int> node_max_parallelism;
  std::vector<std::string> node_uid;
  /// Slots the job needs: the sum over slot sharing groups of the largest parallelism in each.
  int required_slots = 0;
};

/// Validates the stream graph and chains it. Fails (kGraph) on a forward edge between different parallelisms,
/// duplicate uids, a parallelism above max parallelism, or a cycle. Logs a warning for stateful operators
/// without a uid; their derived uid is a hash of their position in the graph (unless `log_warnings` is false:
/// a second build of the same graph for display, such as the REST API's plan, says nothing new).
Result<JobGraph> build_job_graph(StreamGraph& graph, bool log_warnings = true);

/// For pointwise edges: the consumer subtasks that producer `i` feeds, given both parallelisms
/// (Flink's POINTWISE distribution: an even spread of producers over consumers or the reverse).
std::vector<int> pointwise_targets(int producer_parallelism, int consumer_parallelism, int i);

}  // namespace sluice
