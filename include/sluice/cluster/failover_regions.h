// Failover regions: the sets of vertices that fail and restart together (DESIGN.md §7).
//
// Every exchange in Sluice is pipelined (a producer and its consumers run at the same time), so a failure in
// one vertex reaches every vertex it exchanges data with, transitively: a region is a connected component of
// the job graph with edges taken as undirected. Independent pipelines of one job are separate regions and
// keep running when another fails. Source: Flink's RestartPipelinedRegionFailoverStrategy
// (jobmanager.execution.failover-strategy: region), whose pipelined regions with only pipelined edges are
// exactly these components.
//
// Regions are computed per vertex, not per subtask as Flink does. With all-to-all edges (hash, rebalance,
// broadcast) the two agree; vertices joined only by pointwise edges (forward, rescale) would split into
// several per-subtask regions in Flink but form one region here, so a failure restarts more subtasks than
// Flink would, never fewer.
//
// Thread-safety: pure functions of their argument.
#pragma once

#include <vector>

#include "sluice/graph/job_graph.h"

namespace sluice {

/// Returns the failover regions of `jg`: the connected components of its vertices (JobVertex::id), each sorted
/// ascending, the regions ordered by their smallest vertex id. Every vertex is in exactly one region; an empty
/// graph has none.
std::vector<std::vector<int>> compute_failover_regions(const JobGraph& jg);

/// Returns, indexed by vertex id, the index of its region in compute_failover_regions(jg) (-1 for an id that
/// no vertex has; JobGraph ids are dense, so none in practice).
std::vector<int> region_of_vertex(const JobGraph& jg);

}  // namespace sluice
