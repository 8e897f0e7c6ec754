#include "sluice/graph/job_graph.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <map>
#include <set>

#include "sluice/core/key_group.h"

namespace sluice {
namespace {

Error graph_error(std::string msg) {
  return Error(ErrorCode::kGraph, std::move(msg));
}

std::string describe(const StreamNode& n) {
  return fmt::format("operator '{}' (node {})", n.name, n.id);
}

}  // namespace

std::vector<int> pointwise_targets(int up, int down, int i) {
  std::vector<int> out;
  if (up == down) {
    out.push_back(i);
  } else if (up > down) {
    out.push_back(static_cast<int>(static_cast<int64_t>(i) * down / up));
  } else {
    for (int j = 0; j < down; ++j) {
      if (static_cast<int>(static_cast<int64_t>(j) * up / down) == i) out.push_back(j);
    }
  }
  return out;
}

Result<JobGraph> build_job_graph(StreamGraph& graph, bool log_warnings) {
  // Validation warns of unknown keys; the build that runs the job does it (and fails on a bad value).
  if (log_warnings) SLUICE_RETURN_IF_ERROR(validate_engine_options(graph.config()));
  JobGraph jg;
  const auto& nodes = graph.nodes();
  const size_t n = nodes.size();
  if (n == 0) return graph_error("the job has no operators: add a source with from_source()");
  jg.vertex_of_node.assign(n, -1);
  jg.node_parallelism.resize(n);
  jg.node_max_parallelism.resize(n);
  jg.node_uid.resize(n);
  const bool chaining_enabled = graph.config().get(options::kChaining);

  // Effective parallelism and partitioners.
  for (const auto& node : nodes) {
    int p = graph.parallelism_of(node);
    int maxp = graph.max_parallelism_of(node);
    if (p < 1) return graph_error(describe(node) + fmt::format(" has parallelism {}; it must be at least 1", p));
    if (maxp < 1 || maxp > kUpperBoundMaxParallelism) {
      return graph_error(describe(node) + fmt::format(" has max parallelism {}; it must be in [1, {}]", maxp,
                                                      kUpperBoundMaxParallelism));
    }
    if (p > maxp) {
      return graph_error(describe(node) + fmt::format(" has parallelism {} above its max parallelism {}; raise "
                                                      "set_max_parallelism() or lower the parallelism",
                                                      p, maxp));
    }
    jg.node_parallelism[static_cast<size_t>(node.id)] = p;
    jg.node_max_parallelism[static_cast<size_t>(node.id)] = maxp;
    if (!node.factory->is_source() && node.in_edges.empty()) {
      return graph_error(describe(node) + " has no input");
    }
    if (log_warnings && !node.is_sink && node.out_edges.empty()) {
      spdlog::warn("{} has no downstream operator or sink: its records are discarded (add sink_to())", describe(node));
    }
  }
  for (auto& e : const_cast<std::vector<StreamEdge>&>(graph.edges())) {
    if (e.source >= e.target) return graph_error("the stream graph has a cycle (edge " + std::to_string(e.id) + ")");
    int ps = jg.node_parallelism[static_cast<size_t>(e.source)];
    int pt = jg.node_parallelism[static_cast<size_t>(e.target)];
    if (e.partitioner == PartitionerKind::kForward) {
      if (!e.partitioner_explicit && ps != pt) {
        e.partitioner = PartitionerKind::kRebalance;  // Flink's default when parallelisms differ
      } else if (ps != pt) {
        return graph_error(
            fmt::format("forward() between {} (parallelism {}) and {} (parallelism {}) needs equal parallelism; use "
                        "rebalance() or rescale()",
                        describe(graph.node(e.source)), ps, describe(graph.node(e.target)), pt));
      }
    }
  }

  // Stable uids: the user's, or a hash of the node's position and its inputs' uids.
  std::set<std::string> seen;
  for (const auto& node : nodes) {
    std::string uid;
    if (node.uid) {
      uid = *node.uid;
    } else {
      std::string key = fmt::format("pos:{};", node.id);
      for (int eid : node.in_edges)
        key += jg.node_uid[static_cast<size_t>(graph.edge(eid).source)] + ";";
      uid = fmt::format("{:016x}", XXH3_64bits(key.data(), key.size()));
      if (log_warnings && (node.factory->is_stateful() || node.factory->is_source())) {
        spdlog::warn(
            "{} has no uid(); using '{}' derived from its position in the graph. Set uid() so its "
            "state can be restored after the job changes.",
            describe(node), uid);
      }
    }
    if (!seen.insert(uid).second) {
      return graph_error(describe(node) + " reuses uid '" + uid + "'; uids must be unique within a job");
    }
    jg.node_uid[static_cast<size_t>(node.id)] = uid;
    graph.node(node.id).derived_uid = uid;
  }

  // Chaining: a node joins its input's vertex when the single input edge is chainable.
  auto chainable = [&](const StreamEdge& e) {
    const StreamNode& s = graph.node(e.source);
    const StreamNode& t = graph.node(e.target);
    return chaining_enabled && e.partitioner == PartitionerKind::kForward && t.in_edges.size() == 1 &&
           !s.chaining_disabled && !t.chaining_disabled && s.slot_sharing_group == t.slot_sharing_group &&
           jg.node_parallelism[static_cast<size_t>(e.source)] == jg.node_parallelism[static_cast<size_t>(e.target)] &&
           !t.factory->is_source();
  };
  for (const auto& node : nodes) {
    int v = -1;
    if (node.in_edges.size() == 1) {
      const StreamEdge& e = graph.edge(node.in_edges[0]);
      if (chainable(e)) v = jg.vertex_of_node[static_cast<size_t>(e.source)];
    }
    if (v < 0) {
      JobVertex jv;
      jv.id = static_cast<int>(jg.vertices.size());
      jv.parallelism = jg.node_parallelism[static_cast<size_t>(node.id)];
      jv.max_parallelism = jg.node_max_parallelism[static_cast<size_t>(node.id)];
      jv.slot_sharing_group = node.slot_sharing_group;
      jg.vertices.push_back(jv);
      v = jv.id;
    }
    JobVertex& jv = jg.vertices[static_cast<size_t>(v)];
    jv.chained_nodes.push_back(node.id);
    jv.name += (jv.name.empty() ? "" : " -> ") + node.name;
    jg.vertex_of_node[static_cast<size_t>(node.id)] = v;
  }
  for (const auto& e : graph.edges()) {
    int sv = jg.vertex_of_node[static_cast<size_t>(e.source)];
    int tv = jg.vertex_of_node[static_cast<size_t>(e.target)];
    if (sv == tv) continue;
    JobEdge je;
    je.id = static_cast<int>(jg.edges.size());
    je.stream_edge = e.id;
    je.source_vertex = sv;
    je.target_vertex = tv;
    je.source_node = e.source;
    je.partitioner = e.partitioner;
    jg.vertices[static_cast<size_t>(sv)].outputs.push_back(je.id);
    jg.vertices[static_cast<size_t>(tv)].inputs.push_back(je.id);
    jg.edges.push_back(je);
  }
  std::map<std::string, int> group_max;
  for (const auto& v : jg.vertices)
    group_max[v.slot_sharing_group] = std::max(group_max[v.slot_sharing_group], v.parallelism);
  for (const auto& [g, p] : group_max)
    jg.required_slots += p;
  return jg;
}

}  // namespace sluice
