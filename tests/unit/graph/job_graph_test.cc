// Chaining, partitioner defaults, uids and slot counting of build_job_graph.
#include "sluice/graph/job_graph.h"

#include <gtest/gtest.h>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

using testing::CollectedRecords;
using testing::CollectSink;

std::shared_ptr<CollectSink<int64_t>> sink() {
  return std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>());
}

TEST(JobGraphTest, ForwardOperatorsOfEqualParallelismChainIntoOneVertex) {
  StreamEnvironment env;
  env.set_parallelism(2);
  env.from_source(datagen::sequence(0, 9), "n")
      .map([](int64_t v) { return v; })
      .filter([](int64_t) { return true; })
      .sink_to(sink());
  auto graph = std::make_shared<StreamGraph>(env.stream_graph());
  auto jg = build_job_graph(*graph);
  ASSERT_TRUE(jg.ok()) << jg.error().to_string();
  ASSERT_EQ(jg->vertices.size(), 1u);
  EXPECT_EQ(jg->vertices[0].name, "Source: n -> Map -> Filter -> Sink");
  EXPECT_EQ(jg->required_slots, 2);
}

TEST(JobGraphTest, KeyByParallelismChangeAndDisabledChainingBreakChains) {
  StreamEnvironment env;
  env.set_parallelism(2);
  env.from_source(datagen::sequence(0, 9), "n")
      .map([](int64_t v) { return v; })
      .key_by([](int64_t v) { return v; })
      .map([](int64_t v) { return v; })  // hash edge: new vertex
      .map([](int64_t v) { return v; })
      .set_parallelism(3)  // parallelism change: rebalance, new vertex
      .map([](int64_t v) { return v; })
      .set_parallelism(3)
      .disable_chaining()  // a vertex of its own: chains with neither neighbour (as Flink)
      .sink_to(sink())
      .set_parallelism(3);
  auto graph = std::make_shared<StreamGraph>(env.stream_graph());
  auto jg = build_job_graph(*graph);
  ASSERT_TRUE(jg.ok()) << jg.error().to_string();
  ASSERT_EQ(jg->vertices.size(), 5u);
  EXPECT_EQ(jg->edges[0].partitioner, PartitionerKind::kKeyGroup);
  EXPECT_EQ(jg->edges[1].partitioner, PartitionerKind::kRebalance);
  EXPECT_EQ(jg->edges[2].partitioner, PartitionerKind::kForward);
  EXPECT_EQ(jg->edges[3].partitioner, PartitionerKind::kForward);
  EXPECT_EQ(jg->required_slots, 3);
}

TEST(JobGraphTest, SlotSharingGroupsAddUp) {
  StreamEnvironment env;
  env.set_parallelism(2);
  env.from_source(datagen::sequence(0, 9), "n")
      .map([](int64_t v) { return v; })
      .set_parallelism(3)
      .slot_sharing_group("heavy")
      .sink_to(sink())
      .set_parallelism(3)
      .slot_sharing_group("heavy");
  auto graph = std::make_shared<StreamGraph>(env.stream_graph());
  auto jg = build_job_graph(*graph);
  ASSERT_TRUE(jg.ok());
  EXPECT_EQ(jg->required_slots, 2 + 3);
}

TEST(JobGraphTest, UidsAreStableAndDuplicatesRejected) {
  auto build = [](bool duplicate) {
    StreamEnvironment env;
    env.from_source(datagen::sequence(0, 9), "n")
        .uid("src")
        .map([](int64_t v) { return v; })
        .uid(duplicate ? "src" : "m")
        .sink_to(sink());
    auto graph = std::make_shared<StreamGraph>(env.stream_graph());
    return build_job_graph(*graph);
  };
  auto a = build(false);
  auto b = build(false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->node_uid, b->node_uid);  // derived uids do not depend on run or address
  EXPECT_EQ(a->node_uid[0], "src");
  auto dup = build(true);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code(), ErrorCode::kGraph);
  EXPECT_NE(dup.error().message().find("reuses uid 'src'"), std::string::npos);
}

TEST(JobGraphTest, PointwiseTargetsSpreadEvenly) {
  EXPECT_EQ(pointwise_targets(2, 4, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(pointwise_targets(2, 4, 1), (std::vector<int>{2, 3}));
  EXPECT_EQ(pointwise_targets(4, 2, 3), (std::vector<int>{1}));
  EXPECT_EQ(pointwise_targets(3, 3, 2), (std::vector<int>{2}));
  // Every consumer is fed by someone.
  for (int up = 1; up <= 5; ++up) {
    for (int down = 1; down <= 5; ++down) {
      std::vector<int> fed(static_cast<size_t>(down), 0);
      for (int i = 0; i < up; ++i) {
        for (int j : pointwise_targets(up, down, i))
          fed[static_cast<size_t>(j)]++;
      }
      for (int f : fed)
        EXPECT_GE(f, 1) << up << "->" << down;
    }
  }
}

}  // namespace
}  // namespace sluice
