// Failover regions of job graphs built with the DataStream API: independent pipelines are separate regions,
// pipelines joined by a union or a two-input operator are one.
#include "sluice/cluster/failover_regions.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using testing::CollectedRecords;
using testing::CollectSink;
using Regions = std::vector<std::vector<int>>;

std::shared_ptr<CollectSink<int64_t>> sink() {
  return std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>());
}

JobGraph job_graph(StreamEnvironment& env) {
  StreamGraph graph = env.stream_graph();
  auto jg = build_job_graph(graph);
  EXPECT_TRUE(jg.ok()) << jg.error().to_string();
  return std::move(jg).value_or_throw();
}

/// Returns the ids of the vertices whose name contains `part`.
std::vector<int> vertices_named(const JobGraph& jg, const std::string& part) {
  std::vector<int> ids;
  for (const JobVertex& v : jg.vertices) {
    if (v.name.find(part) != std::string::npos) ids.push_back(v.id);
  }
  return ids;
}

TEST(FailoverRegionsTest, EmptyGraphHasNoRegions) {
  JobGraph jg;
  EXPECT_TRUE(compute_failover_regions(jg).empty());
  EXPECT_TRUE(region_of_vertex(jg).empty());
}

TEST(FailoverRegionsTest, OneChainedPipelineIsOneRegion) {
  StreamEnvironment env;
  env.from_source(datagen::sequence(0, 9), "n").map([](int64_t v) { return v; }).sink_to(sink());
  JobGraph jg = job_graph(env);
  ASSERT_EQ(jg.vertices.size(), 1u);
  EXPECT_EQ(compute_failover_regions(jg), (Regions{{0}}));
  EXPECT_EQ(region_of_vertex(jg), (std::vector<int>{0}));
}

TEST(FailoverRegionsTest, TwoIndependentPipelinesAreTwoRegions) {
  StreamEnvironment env;
  env.set_parallelism(2);
  env.from_source(datagen::sequence(0, 9), "a")
      .key_by([](int64_t v) { return v % 3; })
      .map([](int64_t v) { return v; })
      .sink_to(sink());
  env.from_source(datagen::sequence(0, 9), "b")
      .map([](int64_t v) { return v; })
      .set_parallelism(3)  // rebalance: a second vertex in this pipeline too
      .sink_to(sink())
      .set_parallelism(3);
  JobGraph jg = job_graph(env);
  ASSERT_EQ(jg.vertices.size(), 4u);

  const Regions regions = compute_failover_regions(jg);
  ASSERT_EQ(regions.size(), 2u);
  std::vector<int> a = vertices_named(jg, "Source: a");
  std::vector<int> b = vertices_named(jg, "Source: b");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  const std::vector<int> of = region_of_vertex(jg);
  ASSERT_EQ(of.size(), 4u);
  EXPECT_NE(of[static_cast<size_t>(a[0])], of[static_cast<size_t>(b[0])]);
  for (const JobEdge& e : jg.edges) {
    EXPECT_EQ(of[static_cast<size_t>(e.source_vertex)], of[static_cast<size_t>(e.target_vertex)]);
  }
  // Each region is sorted, the regions are ordered by their smallest id, and together they cover every vertex.
  std::vector<int> all;
  for (size_t r = 0; r < regions.size(); ++r) {
    EXPECT_TRUE(std::is_sorted(regions[r].begin(), regions[r].end()));
    EXPECT_EQ(regions[r].size(), 2u);
    if (r > 0) {
      EXPECT_LT(regions[r - 1].front(), regions[r].front());
    }
    for (int v : regions[r]) {
      EXPECT_EQ(of[static_cast<size_t>(v)], static_cast<int>(r));
      all.push_back(v);
    }
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int>{0, 1, 2, 3}));
}

TEST(FailoverRegionsTest, UnionJoinsPipelinesIntoOneRegion) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto a = env.from_source(datagen::sequence(0, 9), "a");
  auto b = env.from_source(datagen::sequence(10, 19), "b");
  a.union_with(b).map([](int64_t v) { return v; }).sink_to(sink());
  env.from_source(datagen::sequence(0, 9), "c").map([](int64_t v) { return v; }).disable_chaining().sink_to(sink());
  JobGraph jg = job_graph(env);

  const Regions regions = compute_failover_regions(jg);
  ASSERT_EQ(regions.size(), 2u);
  const std::vector<int> of = region_of_vertex(jg);
  const int ra = of[static_cast<size_t>(vertices_named(jg, "Source: a").at(0))];
  const int rb = of[static_cast<size_t>(vertices_named(jg, "Source: b").at(0))];
  const int rc = of[static_cast<size_t>(vertices_named(jg, "Source: c").at(0))];
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
  EXPECT_EQ(regions[static_cast<size_t>(rc)].size(), 3u);  // source, the unchained map, the sink
}

TEST(FailoverRegionsTest, WindowJoinIsOneRegion) {
  StreamEnvironment env;
  env.set_parallelism(2);
  auto key = [](int64_t v) { return v % 4; };
  join(env.from_source(datagen::sequence(0, 9), "left"), env.from_source(datagen::sequence(0, 9), "right"))
      .where(key)
      .equal_to(key)
      .window(TumblingEventTimeWindows::of(10ms))
      .apply([](int64_t l, int64_t r) { return l + r; })
      .sink_to(sink());
  JobGraph jg = job_graph(env);
  ASSERT_GE(jg.vertices.size(), 3u);
  Regions expected(1);
  for (const JobVertex& v : jg.vertices)
    expected[0].push_back(v.id);
  EXPECT_EQ(compute_failover_regions(jg), expected);
  EXPECT_EQ(region_of_vertex(jg), std::vector<int>(jg.vertices.size(), 0));
}

TEST(FailoverRegionsTest, RegionsFollowEdgesNotVertexOrder) {
  // A hand-built graph: 0-2 and 1-3 connected, 4 alone, 3-5 connected -> {0,2}, {1,3,5}, {4}.
  JobGraph jg;
  for (int i = 0; i < 6; ++i)
    jg.vertices.push_back(JobVertex{.id = i});
  auto edge = [&jg](int s, int t) {
    jg.edges.push_back(JobEdge{.id = static_cast<int>(jg.edges.size()), .source_vertex = s, .target_vertex = t});
  };
  edge(0, 2);
  edge(3, 1);  // against id order: undirected for regions
  edge(3, 5);
  EXPECT_EQ(compute_failover_regions(jg), (Regions{{0, 2}, {1, 3, 5}, {4}}));
  EXPECT_EQ(region_of_vertex(jg), (std::vector<int>{0, 1, 0, 1, 2, 1}));
}

}  // namespace
}  // namespace sluice
