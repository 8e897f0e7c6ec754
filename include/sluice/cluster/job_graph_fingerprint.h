// The job graph's fingerprint: what a JobManager and a TaskManager compare at registration to know they built
// the same job (DESIGN.md §2: every process builds the graph from the same code or pipeline file; operators
// are matched by uid, so no code goes over the wire).
//
// It covers the shape that task deployment relies on: every operator's uid, parallelism, max parallelism,
// slot sharing group and chain (which vertex it runs in), and every edge with its partitioner and side
// output. It does not cover the code of functions or connectors' settings (a changed filter expression or
// topic keeps the fingerprint): those are the same when every process starts from the same file or binary.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/error.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

struct JobGraphFingerprint {
  std::string hex;         ///< XXH3-128 of `canonical`, 32 lower-case hex digits
  std::string canonical;   ///< the text hashed: one line per operator and per edge (for a debug log)
  int required_slots = 0;  ///< slots the job needs (JobGraph::required_slots)
};

/// The job a process built, as a JobManager and a TaskManager compare it at registration.
struct JobGraphIdentity {
  std::string fingerprint;    ///< JobGraphFingerprint::hex
  std::string job_name;       ///< for messages only
  std::string build_version;  ///< the Sluice build, e.g. "0.1.0"
  /// digest_pipeline_text() of the pipeline file the process started from; "" (a job built by code): not compared.
  std::string pipeline_digest;
};

/// XXH3-128 of a pipeline file's text, 32 lower-case hex digits: what the fingerprint leaves out (connector
/// settings, expressions) differs between two processes exactly when their files do.
[[nodiscard]] std::string digest_pipeline_text(std::string_view text);

/// Builds the job graph of a copy of `graph` (the graph itself is left as it is) and fingerprints it, quietly:
/// neither build_job_graph's warnings nor its check of the engine options, which the build that runs the job
/// makes (so each is said once per process). Errors: those of build_job_graph's chaining (kGraph), kConfiguration
/// for a malformed option it reads.
[[nodiscard]] Result<JobGraphFingerprint> fingerprint_job_graph(const StreamGraph& graph);

}  // namespace sluice
