#include "sluice/cluster/job_graph_fingerprint.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

Result<JobGraphFingerprint> fingerprint_job_graph(const StreamGraph& graph) {
  StreamGraph copy = graph;  // build_job_graph fills derived uids and default partitioners
  // Quietly: the process builds the same graph again to run it, and that build warns (unknown options, uids).
  Result<JobGraph> built = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(copy, /*log_warnings=*/false);
    } catch (const SluiceException& e) {  // a malformed option it reads (unchecked in a quiet build)
      return e.error();
    }
  }();
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

std::string digest_pipeline_text(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace sluice
