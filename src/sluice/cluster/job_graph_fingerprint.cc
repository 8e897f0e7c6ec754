#include "sluice/cluster/job_graph_fingerprint.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "sluice/graph/job_graph.h"

namespace sluice {

Result<JobGraphFingerprint> fingerprint_job_graph(const StreamGraph& graph) {
  StreamGraph copy = graph;  // build_job_graph fills derived uids and default partitioners
  Result<JobGraph> built = build_job_graph(copy);
  if (!built.ok()) return built.error();
  const JobGraph& jg = *built;
  // Version line first: a change of this text's format changes every fingerprint, on purpose.
  std::string text = "sluice-job-graph v1\n";
  for (const auto& node : copy.nodes()) {
    const auto i = static_cast<size_t>(node.id);
    text +=
        fmt::format("operator {} parallelism={} max-parallelism={} slot-sharing-group={} vertex={}\n", jg.node_uid[i],
                    jg.node_parallelism[i], jg.node_max_parallelism[i], node.slot_sharing_group, jg.vertex_of_node[i]);
  }
  for (const auto& e : copy.edges()) {
    text += fmt::format("edge {} -> {} partitioner={} input={} side-output={}\n",
                        jg.node_uid[static_cast<size_t>(e.source)], jg.node_uid[static_cast<size_t>(e.target)],
                        partitioner_name(e.partitioner), e.input_index, e.side_output_tag);
  }
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return JobGraphFingerprint{fmt::format("{:016x}{:016x}", h.high64, h.low64), std::move(text), jg.required_slots};
}

}  // namespace sluice
