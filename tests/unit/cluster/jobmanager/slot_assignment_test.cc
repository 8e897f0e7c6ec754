// assign_slots (cluster/jobmanager/slot_assignment.h): Flink's slot sharing (shared slot i of a group holds
// subtask i of every vertex of the group), slot sharing groups adding up, filling TaskManagers in registration
// order or spreading evenly (cluster.evenly-spread-out-slots), the "needs N slots, M registered" refusal, and the
// state-locality preferences of a restore (preferred_locations_of from a checkpoint's handles' locations).
#include "sluice/cluster/jobmanager/slot_assignment.h"

#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <random>
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

/// Offers of TaskManagers with resource ids: {resource id, slots} in registration order.
std::vector<SlotOffer> tms(const std::vector<std::pair<std::string, int>>& slots) {
  std::vector<SlotOffer> out;
  for (size_t i = 0; i < slots.size(); ++i)
    out.push_back(SlotOffer{"r-" + std::to_string(i), slots[i].second, slots[i].first});
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

// The placement before state-locality preferences existed (a copy of the code of that commit), to check that no
// preference changes nothing.
std::vector<std::vector<SubtaskSlot>> placement_without_preferences(const JobGraph& jg,
                                                                    const std::vector<SlotOffer>& offers, bool even) {
  std::vector<std::string> groups;
  std::map<std::string, int> group_size;
  for (const auto& v : jg.vertices) {
    auto [it, fresh] = group_size.emplace(v.slot_sharing_group, 0);
    if (fresh) groups.push_back(v.slot_sharing_group);
    it->second = std::max(it->second, v.parallelism);
  }
  int needed = 0;
  std::map<std::string, int> first_slot;
  for (const auto& g : groups) {
    first_slot[g] = needed;
    needed += group_size[g];
  }
  std::vector<SubtaskSlot> physical;
  if (even) {
    for (int s = 0; static_cast<int>(physical.size()) < needed; ++s) {
      for (size_t t = 0; t < offers.size() && static_cast<int>(physical.size()) < needed; ++t) {
        if (s < offers[t].slots) physical.push_back({static_cast<int>(t), s});
      }
    }
  } else {
    for (size_t t = 0; t < offers.size() && static_cast<int>(physical.size()) < needed; ++t) {
      for (int s = 0; s < offers[t].slots && static_cast<int>(physical.size()) < needed; ++s)
        physical.push_back({static_cast<int>(t), s});
    }
  }
  std::vector<std::vector<SubtaskSlot>> out(jg.vertices.size());
  for (const auto& v : jg.vertices) {
    for (int i = 0; i < v.parallelism; ++i)
      out[static_cast<size_t>(v.id)].push_back(physical[static_cast<size_t>(first_slot[v.slot_sharing_group] + i)]);
  }
  return out;
}

bool same(const std::vector<std::vector<SubtaskSlot>>& a, const std::vector<std::vector<SubtaskSlot>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t v = 0; v < a.size(); ++v) {
    if (a[v].size() != b[v].size()) return false;
    for (size_t i = 0; i < a[v].size(); ++i) {
      if (a[v][i].task_manager != b[v][i].task_manager || a[v][i].slot != b[v][i].slot) return false;
    }
  }
  return true;
}

TEST(SlotAssignmentPreferenceTest, WithoutPreferencesThePlacementIsTheOneBeforePreferencesExisted) {
  const unsigned seed = std::random_device{}();
  std::cout << "seed " << seed << "\n";
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int compared = 0;
  for (int round = 0; round < 500; ++round) {
    std::vector<std::pair<int, std::string>> vertices;
    const int n = pick(1, 4);
    for (int v = 0; v < n; ++v)
      vertices.emplace_back(pick(1, 6), pick(0, 3) == 0 ? "other" : "default");
    const JobGraph jg = graph(vertices);
    std::vector<std::pair<std::string, int>> slots;
    const int t = pick(1, 4);
    for (int i = 0; i < t; ++i)
      slots.emplace_back("tm-" + std::to_string(i), pick(0, 5));
    const bool even = pick(0, 1) == 1;
    auto a = assign_slots(jg, tms(slots), even);
    if (!a.ok()) continue;  // too few slots: the refusal is checked above
    ++compared;
    EXPECT_TRUE(same(a->subtasks, placement_without_preferences(jg, tms(slots), even)))
        << "seed " << seed << " round " << round;
    // Preferences that are all empty, or for no registered TaskManager, are no preferences.
    PreferredLocations empty(jg.vertices.size());
    PreferredLocations unknown;
    for (const auto& v : jg.vertices)
      unknown.emplace_back(static_cast<size_t>(v.parallelism), "tm-gone");
    auto b = assign_slots(jg, tms(slots), even, empty);
    auto c = assign_slots(jg, tms(slots), even, unknown);
    ASSERT_TRUE(b.ok() && c.ok());
    EXPECT_TRUE(same(b->subtasks, a->subtasks)) << "seed " << seed << " round " << round;
    EXPECT_TRUE(same(c->subtasks, a->subtasks)) << "seed " << seed << " round " << round;
    EXPECT_EQ(a->slots_used, c->slots_used);
    EXPECT_EQ(a->preferred_subtasks, 0);
    EXPECT_EQ(b->preferred_subtasks, 0);
    EXPECT_EQ(c->placed_as_preferred, 0);
  }
  std::cout << compared << " placements compared\n";
  EXPECT_GE(compared, 100) << "seed " << seed;
}

TEST(SlotAssignmentPreferenceTest, SubtasksGoBackToThePreferredTaskManagerWhenItHasRoom) {
  // source p=1 and a keyed vertex p=2 on two TaskManagers of 1 slot, registered in the other order than when the
  // state was written: shared slot 0 (source + keyed 0) was on tm-a, shared slot 1 on tm-b.
  const JobGraph jg = graph({{1, "default"}, {2, "default"}});
  const PreferredLocations preferred = {{"tm-a"}, {"tm-a", "tm-b"}};
  auto plain = assign_slots(jg, tms({{"tm-b", 1}, {"tm-a", 1}}), false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(at(*plain, 1, 0), std::make_pair(0, 0)) << "without preferences the first registered gets slot 0";
  for (bool even : {false, true}) {
    auto a = assign_slots(jg, tms({{"tm-b", 1}, {"tm-a", 1}}), even, preferred);
    ASSERT_TRUE(a.ok()) << a.error().message();
    EXPECT_EQ(at(*a, 0, 0), std::make_pair(1, 0));
    EXPECT_EQ(at(*a, 1, 0), std::make_pair(1, 0));
    EXPECT_EQ(at(*a, 1, 1), std::make_pair(0, 0));
    EXPECT_EQ(a->slots_used, (std::vector<int>{1, 1}));
    EXPECT_EQ(a->preferred_subtasks, 3);
    EXPECT_EQ(a->placed_as_preferred, 3);
  }
  // Subtasks of one shared slot that disagree: the group's first vertex with a preference decides.
  auto split = assign_slots(jg, tms({{"tm-b", 2}, {"tm-a", 2}}), false, {{"tm-a"}, {"tm-b", ""}});
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(at(*split, 0, 0).first, 1);
  EXPECT_EQ(at(*split, 1, 0).first, 1);
  EXPECT_EQ(split->preferred_subtasks, 2);
  EXPECT_EQ(split->placed_as_preferred, 1);
  // A vertex without a preference for its subtask takes the slot's preference from another vertex.
  auto later = assign_slots(jg, tms({{"tm-b", 2}, {"tm-a", 2}}), false, {{""}, {"tm-a", "tm-a"}});
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(at(*later, 0, 0), std::make_pair(1, 0));
  EXPECT_EQ(at(*later, 1, 1), std::make_pair(1, 1));
  EXPECT_EQ(later->slots_used, (std::vector<int>{0, 2}));
}

TEST(SlotAssignmentPreferenceTest, APreferenceForAnUnregisteredTaskManagerIsIgnored) {
  const JobGraph jg = graph({{1, "default"}, {3, "default"}});
  // Shared slot 1 wants a TaskManager that is gone: it is placed as without preferences, after the others.
  auto a = assign_slots(jg, tms({{"tm-0", 2}, {"tm-1", 2}}), false, {{"tm-1"}, {"tm-1", "tm-gone", "tm-0"}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(at(*a, 1, 0), std::make_pair(1, 0));
  EXPECT_EQ(at(*a, 1, 2), std::make_pair(0, 0));
  EXPECT_EQ(at(*a, 1, 1), std::make_pair(0, 1)) << "the first free slot in registration order";
  EXPECT_EQ(a->preferred_subtasks, 4);
  EXPECT_EQ(a->placed_as_preferred, 3);
}

TEST(SlotAssignmentPreferenceTest, ShortOfRoomOnThePreferredTaskManagerTheRestArePlacedNormally) {
  const JobGraph jg = graph({{4, "default"}});
  // All four subtasks wrote their state on tm-2, which now has 2 slots: shared slots 0 and 1 go there, 2 and 3
  // fill the remaining slots in registration order.
  auto a = assign_slots(jg, tms({{"tm-0", 2}, {"tm-1", 2}, {"tm-2", 2}}), false, {{"tm-2", "tm-2", "tm-2", "tm-2"}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(at(*a, 0, 0), std::make_pair(2, 0));
  EXPECT_EQ(at(*a, 0, 1), std::make_pair(2, 1));
  EXPECT_EQ(at(*a, 0, 2), std::make_pair(0, 0));
  EXPECT_EQ(at(*a, 0, 3), std::make_pair(0, 1));
  EXPECT_EQ(a->slots_used, (std::vector<int>{2, 0, 2}));
  EXPECT_EQ(a->preferred_subtasks, 4);
  EXPECT_EQ(a->placed_as_preferred, 2);
  // Preferences never make a job that fits refused, nor put two shared slots in one slot.
  auto b = assign_slots(graph({{5, "default"}}), tms({{"tm-0", 1}, {"tm-1", 4}}), true,
                        {{"tm-0", "tm-0", "tm-0", "tm-0", "tm-0"}});
  ASSERT_TRUE(b.ok());
  std::set<std::pair<int, int>> slots;
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(slots.insert(at(*b, 0, i)).second);
  EXPECT_EQ(b->slots_used, (std::vector<int>{1, 4}));
}

TEST(SlotAssignmentPreferenceTest, EvenlySpreadPlacesTheRestOnTheLeastUsedTaskManagers) {
  const JobGraph jg = graph({{1, "default"}, {5, "default"}});
  // Shared slots 0 and 1 go back to tm-2; 2, 3 and 4 spread over the least used: tm-0, tm-1, then tm-0 (tm-2
  // already has 2).
  auto a = assign_slots(jg, tms({{"tm-0", 2}, {"tm-1", 2}, {"tm-2", 2}}), true, {{"tm-2"}, {"", "tm-2"}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(at(*a, 1, 0), std::make_pair(2, 0));
  EXPECT_EQ(at(*a, 1, 1), std::make_pair(2, 1));
  EXPECT_EQ(at(*a, 1, 2), std::make_pair(0, 0));
  EXPECT_EQ(at(*a, 1, 3), std::make_pair(1, 0));
  EXPECT_EQ(at(*a, 1, 4), std::make_pair(0, 1));
  EXPECT_EQ(a->slots_used, (std::vector<int>{2, 1, 2}));
  EXPECT_EQ(a->placed_as_preferred, 2);
  // Registration order instead: the rest fill tm-0 first.
  auto b = assign_slots(jg, tms({{"tm-0", 2}, {"tm-1", 2}, {"tm-2", 2}}), false, {{"tm-2"}, {"", "tm-2"}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->slots_used, (std::vector<int>{2, 1, 2}));
  EXPECT_EQ(at(*b, 1, 3), std::make_pair(0, 1));
  EXPECT_EQ(at(*b, 1, 4), std::make_pair(1, 0));
}

TEST(SlotAssignmentPreferenceTest, PreferencesComeFromTheLocationsOfTheCheckpointsHandles) {
  // Vertex 0: source (node 0); vertex 1: map -> sink chained (nodes 1, 2), parallelism 2.
  JobGraph jg = graph({{1, "default"}, {2, "default"}});
  jg.vertices[0].chained_nodes = {0};
  jg.vertices[1].chained_nodes = {1, 2};
  jg.node_uid = {"src", "map", "sink"};
  CheckpointMetadata m;
  OperatorStateEntry src{"src", 1, 128, {}};
  src.subtasks.push_back({0, "src-0", 10, 0, 0, 10, {}});
  src.subtasks.back().location = "tm-a";
  OperatorStateEntry map{"map", 2, 128, {}};  // subtask 0 without a location (written by the JobManager)
  map.subtasks.push_back({0, "map-0", 10, 0, 0, 10, {}});
  OperatorStateEntry sink{"sink", 2, 128, {}};
  sink.subtasks.push_back({0, "sink-0", 10, 0, 0, 10, {}});
  sink.subtasks.back().location = "tm-a";
  sink.subtasks.push_back({1, "sink-1", 10, 0, 0, 10, {}});
  sink.subtasks.back().location = "tm-b";
  m.operators = {src, map, sink};
  EXPECT_EQ(preferred_locations_of(jg, m), (PreferredLocations{{"tm-a"}, {"tm-a", "tm-b"}}));
  // The chain's first uid with a location wins.
  m.operators[1].subtasks[0].location = "tm-c";
  EXPECT_EQ(preferred_locations_of(jg, m), (PreferredLocations{{"tm-a"}, {"tm-c", "tm-b"}}));
  // After a rescale (the job's parallelism differs from the checkpoint's) there is no preference.
  jg.vertices[1].parallelism = 3;
  EXPECT_EQ(preferred_locations_of(jg, m), (PreferredLocations{{"tm-a"}, {"", "", ""}}));
  // Older metadata (no locations) and a job without state: none.
  EXPECT_EQ(preferred_locations_of(jg, CheckpointMetadata{}), (PreferredLocations{{""}, {"", "", ""}}));
}

}  // namespace
}  // namespace sluice
