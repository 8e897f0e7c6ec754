#include "sluice/graph/stream_graph.h"

namespace sluice {

const char* partitioner_name(PartitionerKind kind) {
  switch (kind) {
    case PartitionerKind::kForward:
      return "forward";
    case PartitionerKind::kRebalance:
      return "rebalance";
    case PartitionerKind::kRescale:
      return "rescale";
    case PartitionerKind::kBroadcast:
      return "broadcast";
    case PartitionerKind::kKeyGroup:
      return "hash";
  }
  return "unknown";
}

StreamNode& StreamGraph::add_node(std::string name, std::shared_ptr<OperatorFactory> factory) {
  StreamNode n;
  n.id = static_cast<int>(nodes_.size());
  n.name = std::move(name);
  n.factory = std::move(factory);
  nodes_.push_back(std::move(n));
  return nodes_.back();
}

StreamEdge& StreamGraph::add_edge(int source, int target, PartitionerKind kind, bool explicit_partitioner,
                                  std::string side_output_tag, std::shared_ptr<EdgeOps> ops, int input_index) {
  StreamEdge e;
  e.id = static_cast<int>(edges_.size());
  e.source = source;
  e.target = target;
  e.partitioner = kind;
  e.partitioner_explicit = explicit_partitioner;
  e.side_output_tag = std::move(side_output_tag);
  e.ops = std::move(ops);
  e.input_index = input_index;
  edges_.push_back(std::move(e));
  node(source).out_edges.push_back(edges_.back().id);
  node(target).in_edges.push_back(edges_.back().id);
  return edges_.back();
}

int StreamGraph::parallelism_of(const StreamNode& n) const {
  return n.parallelism > 0 ? n.parallelism : config_.get(options::kParallelism);
}

int StreamGraph::max_parallelism_of(const StreamNode& n) const {
  return n.max_parallelism > 0 ? n.max_parallelism : config_.get(options::kMaxParallelism);
}

}  // namespace sluice
