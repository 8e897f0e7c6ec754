// assign_slots (cluster/jobmanager/slot_assignment.h): Flink's slot sharing (shared slot i of a group holds
// subtask i of every vertex of the group), slot sharing groups adding up, filling TaskManagers in registration
// order or spreading evenly (cluster.evenly-spread-out-slots), and the "needs N slots, M registered" refusal.
#include "sluice/cluster/jobmanager/slot_assignment.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

namespace sluice {
namespace {

/// A job graph of vertices given as (parallelism, slot sharing group); edges do not matter for placement.
JobGraph graph(const std::vector<std::pair<int, std::string>>& vertices) {
  JobGraph jg;
  for (const auto& [parallelism, group] : vertices) {
    JobVertex v;
    v.id = static_cast<int>(jg.vertices.size());
    v.name = "v" + std::to_string(v.id);
    v.parallelism = parallelism;
    v.slot_sharing_group = group;
    jg.vertices.push_back(v);
  }
  return jg;
}

std::vector<SlotOffer> offers(const std::vector<int>& slots) {
  std::vector<SlotOffer> out;
  for (size_t i = 0; i < slots.size(); ++i)
    out.push_back(SlotOffer{"r-" + std::to_string(i), slots[i]});
  return out;
}

/// (TaskManager, slot) of a subtask.
std::pair<int, int> at(const SlotAssignment& a, int vertex, int subtask) {
  const SubtaskSlot& s = a.subtasks.at(static_cast<size_t>(vertex)).at(static_cast<size_t>(subtask));
  return {s.task_manager, s.slot};
}

TEST(SlotAssignmentTest, SubtaskIOfEveryVertexOfAGroupSharesSharedSlotI) {
  // source p=1 -> map p=4 -> sink p=4, one group: 4 slots, slot 0 holds the source and subtask 0 of the others.
  const JobGraph jg = graph({{1, "default"}, {4, "default"}, {4, "default"}});
  auto a = assign_slots(jg, offers({2, 2}), /*evenly_spread=*/false);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(at(*a, 0, 0), std::make_pair(0, 0));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(at(*a, 1, i), at(*a, 2, i)) << "subtask " << i << " of map and sink share a slot";
  }
  // Filling in registration order: shared slots 0, 1 on TaskManager 0, 2, 3 on TaskManager 1.
  EXPECT_EQ(at(*a, 1, 0), std::make_pair(0, 0));
  EXPECT_EQ(at(*a, 1, 1), std::make_pair(0, 1));
  EXPECT_EQ(at(*a, 1, 2), std::make_pair(1, 0));
  EXPECT_EQ(at(*a, 1, 3), std::make_pair(1, 1));
  EXPECT_EQ(a->slots_used, (std::vector<int>{2, 2}));
  // Never two subtasks of one vertex in one slot.
  for (int v = 0; v < 3; ++v) {
    std::set<std::pair<int, int>> seen;
    for (int i = 0; i < jg.vertices[static_cast<size_t>(v)].parallelism; ++i)
      EXPECT_TRUE(seen.insert(at(*a, v, i)).second) << "vertex " << v << " subtask " << i;
  }
}

TEST(SlotAssignmentTest, FillingUsesTheFirstTaskManagersSlotsBeforeTheNext) {
  const JobGraph jg = graph({{3, "default"}});
  auto a = assign_slots(jg, offers({4, 4, 4}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots_used, (std::vector<int>{3, 0, 0}));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(at(*a, 0, i), std::make_pair(0, i));
}

TEST(SlotAssignmentTest, EvenlySpreadOutSlotsGoToTheTaskManagersInTurn) {
  const JobGraph jg = graph({{1, "default"}, {6, "default"}});
  auto a = assign_slots(jg, offers({3, 3, 3}), /*evenly_spread=*/true);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots_used, (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(at(*a, 1, 0), std::make_pair(0, 0));
  EXPECT_EQ(at(*a, 1, 1), std::make_pair(1, 0));
  EXPECT_EQ(at(*a, 1, 2), std::make_pair(2, 0));
  EXPECT_EQ(at(*a, 1, 3), std::make_pair(0, 1));
  EXPECT_EQ(at(*a, 0, 0), at(*a, 1, 0)) << "the source shares shared slot 0";
  // TaskManagers of different sizes: a small one drops out of the turn once full.
  auto b = assign_slots(graph({{5, "default"}}), offers({1, 4}), true);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->slots_used, (std::vector<int>{1, 4}));
  std::set<std::pair<int, int>> slots;
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(slots.insert(at(*b, 0, i)).second);
}

TEST(SlotAssignmentTest, SlotSharingGroupsNeedTheSumOfTheirLargestParallelisms) {
  // Group "a" (p 2, 3) needs 3 slots, group "b" (p 2) needs 2: 5, never shared across groups.
  const JobGraph jg = graph({{2, "a"}, {3, "a"}, {2, "b"}});
  auto a = assign_slots(jg, offers({5}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots_used, (std::vector<int>{5}));
  std::set<std::pair<int, int>> group_a;
  for (int i = 0; i < 3; ++i)
    group_a.insert(at(*a, 1, i));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(at(*a, 0, i), at(*a, 1, i));
    EXPECT_EQ(group_a.count(at(*a, 2, i)), 0u) << "group b's subtask " << i << " in a slot of group a";
  }
  auto refused = assign_slots(jg, offers({2, 2}), false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message(), "needs 5 slots, 4 registered (on 2 TaskManager(s))");
}

TEST(SlotAssignmentTest, TooFewSlotsAreRefusedNamingWhatTheJobNeeds) {
  const JobGraph jg = graph({{1, "default"}, {8, "default"}});
  auto a = assign_slots(jg, offers({2, 2, 2}), false);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::kConfiguration);
  EXPECT_EQ(a.error().message(), "needs 8 slots, 6 registered (on 3 TaskManager(s))");
  auto none = assign_slots(jg, {}, true);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message(), "needs 8 slots, 0 registered (on 0 TaskManager(s))");
  // Exactly enough is enough.
  EXPECT_TRUE(assign_slots(jg, offers({2, 2, 4}), false).ok());
}

TEST(SlotAssignmentTest, ThePlacementIsDeterministic) {
  const JobGraph jg = graph({{2, "default"}, {4, "default"}, {3, "x"}});
  for (bool even : {false, true}) {
    auto a = assign_slots(jg, offers({3, 2, 4}), even);
    auto b = assign_slots(jg, offers({3, 2, 4}), even);
    ASSERT_TRUE(a.ok() && b.ok());
    for (int v = 0; v < 3; ++v) {
      for (int i = 0; i < jg.vertices[static_cast<size_t>(v)].parallelism; ++i)
        EXPECT_EQ(at(*a, v, i), at(*b, v, i));
    }
  }
}

}  // namespace
}  // namespace sluice
