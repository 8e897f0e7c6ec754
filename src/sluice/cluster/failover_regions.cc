// Failover regions as connected components of the job graph (union-find over the job edges).
#include "sluice/cluster/failover_regions.h"

#include <algorithm>
#include <cstddef>
#include <numeric>

namespace sluice {
namespace {

/// Returns the region index of each vertex id; regions numbered in order of their smallest vertex id.
std::vector<int> label_regions(const JobGraph& jg, int* region_count) {
  int max_id = -1;
  for (const JobVertex& v : jg.vertices)
    max_id = std::max(max_id, v.id);
  const auto n = static_cast<size_t>(max_id + 1);

  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&parent](int x) {
    while (parent[static_cast<size_t>(x)] != x) {
      int& p = parent[static_cast<size_t>(x)];
      p = parent[static_cast<size_t>(p)];  // path halving
      x = p;
    }
    return x;
  };
  for (const JobEdge& e : jg.edges) {
    int a = find(e.source_vertex);
    int b = find(e.target_vertex);
    if (a != b) parent[static_cast<size_t>(std::max(a, b))] = std::min(a, b);  // the root is the smallest id
  }

  std::vector<bool> present(n, false);
  for (const JobVertex& v : jg.vertices)
    present[static_cast<size_t>(v.id)] = true;
  std::vector<int> region_of_root(n, -1);
  std::vector<int> region(n, -1);
  int count = 0;
  for (size_t id = 0; id < n; ++id) {  // ascending ids: a region is numbered at its smallest vertex
    if (!present[id]) continue;
    int root = find(static_cast<int>(id));
    int& r = region_of_root[static_cast<size_t>(root)];
    if (r < 0) r = count++;
    region[id] = r;
  }
  *region_count = count;
  return region;
}

}  // namespace

std::vector<std::vector<int>> compute_failover_regions(const JobGraph& jg) {
  int count = 0;
  std::vector<int> region = label_regions(jg, &count);
  std::vector<std::vector<int>> regions(static_cast<size_t>(count));
  for (size_t id = 0; id < region.size(); ++id) {
    if (region[id] >= 0) regions[static_cast<size_t>(region[id])].push_back(static_cast<int>(id));
  }
  return regions;
}

std::vector<int> region_of_vertex(const JobGraph& jg) {
  int count = 0;
  return label_regions(jg, &count);
}

}  // namespace sluice
