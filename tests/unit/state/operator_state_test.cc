#include "sluice/state/operator_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Offset {
  std::string split;
  int64_t position = 0;
  friend bool operator==(const Offset&, const Offset&) = default;
};
SLUICE_FIELDS(Offset, split, position);

std::string snapshot_of(const OperatorStateStore& store) {
  DataOutput out;
  store.snapshot(out);
  return std::string(out.view());
}

// Builds the snapshot of an old subtask with list state "offsets" and union state "names".
std::string old_subtask(const std::vector<int>& list, const std::vector<std::string>& names) {
  OperatorStateStore store;
  store.get_list_state<int>("offsets").update(list);
  store.get_union_list_state<std::string>("names").update(names);
  return snapshot_of(store);
}

// Redistributes `old` to subtask `index` of `parallelism` and restores it into a fresh store.
struct Restored {
  std::vector<int> list;
  std::vector<std::string> names;
};
Restored restore_subtask(const std::vector<std::string>& old, int parallelism, int index) {
  std::vector<std::string_view> views(old.begin(), old.end());
  DataOutput out;
  Status st = OperatorStateStore::redistribute(views, parallelism, index, out);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  OperatorStateStore store;
  DataInput in(out.bytes());
  EXPECT_TRUE(store.restore(in).ok());
  return {store.get_list_state<int>("offsets").get(), store.get_union_list_state<std::string>("names").get()};
}

TEST(OperatorStateTest, ListAndUnionStatesBehaveLikeLists) {
  OperatorStateStore store;
  ListState<Offset>& offsets = store.get_list_state<Offset>("offsets");
  EXPECT_THAT(offsets.get(), IsEmpty());
  offsets.add(Offset{"a", 1});
  offsets.add_all({Offset{"b", 2}, Offset{"c", 3}});
  EXPECT_EQ(offsets.get().size(), 3u);
  offsets.update({Offset{"z", 9}});
  EXPECT_THAT(offsets.get(), ElementsAre(Offset{"z", 9}));
  EXPECT_EQ(&store.get_list_state<Offset>("offsets"), &offsets);
  auto& u = store.get_union_list_state<int>("u");
  u.add(1);
  u.clear();
  EXPECT_THAT(u.get(), IsEmpty());
  EXPECT_THAT(store.state_names(), ElementsAre("offsets", "u"));
}

TEST(OperatorStateTest, ModeAndTypeMismatchesThrow) {
  OperatorStateStore store;
  store.get_list_state<int>("s");
  try {
    store.get_union_list_state<int>("s");
    FAIL() << "expected kState";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kState);
    EXPECT_THAT(e.error().message(), HasSubstr("'s' is a list state"));
  }
  EXPECT_THROW(store.get_list_state<std::string>("s"), SluiceException);
}

TEST(OperatorStateTest, SnapshotRoundTripDecodesOnFirstUse) {
  OperatorStateStore store;
  store.get_list_state<Offset>("offsets").update({Offset{"a", 1}, Offset{"b", 2}});
  store.get_union_list_state<std::string>("names").add("x");
  std::string bytes = snapshot_of(store);

  OperatorStateStore restored;
  DataInput in(bytes);
  ASSERT_TRUE(restored.restore(in).ok());
  EXPECT_THAT(restored.state_names(), ElementsAre("names", "offsets"));
  // "names" is not used before the next snapshot: it must be carried over unchanged.
  EXPECT_THAT(restored.get_list_state<Offset>("offsets").get(), ElementsAre(Offset{"a", 1}, Offset{"b", 2}));
  std::string again = snapshot_of(restored);
  OperatorStateStore last;
  DataInput in2(again);
  ASSERT_TRUE(last.restore(in2).ok());
  EXPECT_THAT(last.get_union_list_state<std::string>("names").get(), ElementsAre("x"));
  EXPECT_THROW(last.get_list_state<int>("offsets").get(), SluiceException);  // Offset, not int
}

TEST(OperatorStateTest, RestoredModeMismatchThrowsOnUse) {
  OperatorStateStore store;
  store.get_union_list_state<int>("s").add(1);
  std::string bytes = snapshot_of(store);
  OperatorStateStore restored;
  DataInput in(bytes);
  ASSERT_TRUE(restored.restore(in).ok());
  EXPECT_THROW(restored.get_list_state<int>("s"), SluiceException);
}

TEST(OperatorStateTest, EvenSplitWhenScalingUp) {
  // 7 elements from 2 old subtasks to 3: runs of 3, 2, 2 in concatenation order.
  std::vector<std::string> old{old_subtask({1, 2, 3, 4, 5}, {"a"}), old_subtask({6, 7}, {"b", "c"})};
  Restored r0 = restore_subtask(old, 3, 0);
  Restored r1 = restore_subtask(old, 3, 1);
  Restored r2 = restore_subtask(old, 3, 2);
  EXPECT_THAT(r0.list, ElementsAre(1, 2, 3));
  EXPECT_THAT(r1.list, ElementsAre(4, 5));
  EXPECT_THAT(r2.list, ElementsAre(6, 7));
  for (const Restored* r : {&r0, &r1, &r2})
    EXPECT_THAT(r->names, ElementsAre("a", "b", "c"));
}

TEST(OperatorStateTest, EvenSplitWhenScalingDown) {
  std::vector<std::string> old{old_subtask({1, 2}, {}), old_subtask({3}, {"n"}), old_subtask({4, 5, 6}, {})};
  Restored r0 = restore_subtask(old, 2, 0);
  Restored r1 = restore_subtask(old, 2, 1);
  EXPECT_THAT(r0.list, ElementsAre(1, 2, 3));
  EXPECT_THAT(r1.list, ElementsAre(4, 5, 6));
  EXPECT_THAT(r0.names, ElementsAre("n"));
  EXPECT_THAT(r1.names, ElementsAre("n"));
}

TEST(OperatorStateTest, SameParallelismKeepsEachSubtasksList) {
  std::vector<std::string> old{old_subtask({1, 2, 3}, {"a"}), old_subtask({4}, {"b"})};
  EXPECT_THAT(restore_subtask(old, 2, 0).list, ElementsAre(1, 2, 3));
  EXPECT_THAT(restore_subtask(old, 2, 1).list, ElementsAre(4));
  EXPECT_THAT(restore_subtask(old, 2, 1).names, ElementsAre("a", "b"));
}

TEST(OperatorStateTest, ExtraElementsRotateAcrossStatesAsInFlink) {
  // Two list states of 4 elements each, redistributed to 3 subtasks: the first state gives its extra
  // element to subtask 0, the second starts where the first left off (subtask 1).
  OperatorStateStore old;
  old.get_list_state<int>("a").update({1, 2, 3, 4});
  old.get_list_state<int>("b").update({5, 6, 7, 8});
  std::string bytes = snapshot_of(old);
  std::vector<std::string_view> views{bytes, std::string_view()};  // the second old subtask had no state
  std::vector<std::vector<int>> a(3), b(3);
  for (int i = 0; i < 3; ++i) {
    DataOutput out;
    ASSERT_TRUE(OperatorStateStore::redistribute(views, 3, i, out).ok());
    OperatorStateStore store;
    DataInput in(out.bytes());
    ASSERT_TRUE(store.restore(in).ok());
    a[i] = store.get_list_state<int>("a").get();
    b[i] = store.get_list_state<int>("b").get();
  }
  EXPECT_THAT(a, ElementsAre(ElementsAre(1, 2), ElementsAre(3), ElementsAre(4)));
  EXPECT_THAT(b, ElementsAre(ElementsAre(8), ElementsAre(5, 6), ElementsAre(7)));
}

TEST(OperatorStateTest, RedistributionErrors) {
  std::string list_snapshot;
  {
    OperatorStateStore s;
    s.get_list_state<int>("s").add(1);
    list_snapshot = snapshot_of(s);
  }
  std::string union_snapshot;
  {
    OperatorStateStore s;
    s.get_union_list_state<int>("s").add(1);
    union_snapshot = snapshot_of(s);
  }
  DataOutput out;
  std::vector<std::string_view> conflicting{list_snapshot, union_snapshot};
  Status conflict = OperatorStateStore::redistribute(conflicting, 2, 0, out);
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.error().code(), ErrorCode::kState);

  std::vector<std::string_view> one{list_snapshot};
  EXPECT_EQ(OperatorStateStore::redistribute(one, 2, 2, out).error().code(), ErrorCode::kConfiguration);

  std::string cut = list_snapshot.substr(0, list_snapshot.size() - 1);
  std::vector<std::string_view> corrupt{cut};
  EXPECT_EQ(OperatorStateStore::redistribute(corrupt, 1, 0, out).error().code(), ErrorCode::kSerialization);
}

}  // namespace
}  // namespace sluice
