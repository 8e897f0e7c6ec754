#include "sluice/web/job_plan.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cctype>

#include "sluice/graph/job_graph.h"
#include "sluice/web/rest_server.h"

namespace sluice {

std::string job_vertex_id(const std::vector<std::string>& operator_uids) {
  std::string key;
  for (const auto& uid : operator_uids)
    key += uid + ";";
  const XXH128_hash_t h = XXH3_128bits(key.data(), key.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

JobPlan job_plan_of(const StreamGraph& graph) {
  JobPlan plan(operators_of(graph));
  StreamGraph copy = graph;  // build_job_graph fills derived uids and default partitioners in its graph
  Result<JobGraph> jg = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(copy, /*log_warnings=*/false);
    } catch (const SluiceException& e) {  // a malformed option: execute_async reports it
      return e.error();
    }
  }();
  if (!jg.ok()) return plan;
  for (const JobVertex& v : jg->vertices) {
    JobPlanVertex pv;
    pv.index = v.id;
    pv.name = v.name;
    pv.parallelism = v.parallelism;
    pv.max_parallelism = v.max_parallelism;
    pv.slot_sharing_group = v.slot_sharing_group;
    for (int node : v.chained_nodes) {
      pv.operator_names.push_back(copy.node(node).name);
      pv.operator_uids.push_back(jg->node_uid[static_cast<size_t>(node)]);
    }
    pv.id = job_vertex_id(pv.operator_uids);
    for (int eid : v.inputs) {
      const JobEdge& e = jg->edges[static_cast<size_t>(eid)];
      std::string strategy = partitioner_name(e.partitioner);
      for (char& c : strategy)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      pv.inputs.push_back(JobPlanInput{e.source_vertex, std::move(strategy)});
    }
    plan.vertices.push_back(std::move(pv));
  }
  return plan;
}

}  // namespace sluice
