#include "sluice/checkpoint/state_assignment.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/deferred_state_assignment.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/operator_state.h"
#include "test_util/files.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kMaxP = 128;

// A KeyedStateSnapshot that writes fixed bytes per key group (absent or "" = no state).
class FakeKeyedSnapshot final : public KeyedStateSnapshot {
 public:
  FakeKeyedSnapshot(KeyGroupRange range, int max_parallelism, std::map<int32_t, std::string> bytes)
      : range_(range), max_parallelism_(max_parallelism), bytes_(std::move(bytes)) {}
  KeyGroupRange key_group_range() const override { return range_; }
  int max_parallelism() const override { return max_parallelism_; }
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    if (!range_.contains(kg)) throw SluiceException(Error(ErrorCode::kState, "key group outside the range"));
    if (auto it = bytes_.find(kg.value); it != bytes_.end()) out.write_bytes(it->second.data(), it->second.size());
  }

 private:
  KeyGroupRange range_;
  int max_parallelism_;
  std::map<int32_t, std::string> bytes_;
};

// The bytes key group `kg` holds in every test: distinct per key group; every fifth key group is empty.
std::string kg_bytes(int32_t kg) {
  if (kg % 5 == 0) return "";
  return fmt::format("kg{}:", kg) + std::string(static_cast<size_t>(kg % 7 + 1), static_cast<char>('a' + kg % 26));
}

/// The key groups of a restore as owned strings (a restore holds views into the mapped state files).
std::map<int32_t, std::string> owned(const std::map<int32_t, std::string_view>& key_groups) {
  std::map<int32_t, std::string> out;
  for (const auto& [kg, bytes] : key_groups)
    out.emplace(kg, std::string(bytes));
  return out;
}

std::map<int32_t, std::string> expected_key_groups() {
  std::map<int32_t, std::string> all;
  for (int32_t kg = 0; kg < kMaxP; ++kg)
    if (!kg_bytes(kg).empty()) all[kg] = kg_bytes(kg);
  return all;
}

std::map<int32_t, std::string> key_groups_of(KeyGroupRange range) {
  std::map<int32_t, std::string> m;
  for (int32_t kg = range.start(); kg <= range.end(); ++kg)
    m[kg] = kg_bytes(kg);
  return m;
}

// What subtask `index` of `parallelism` restores of "counts": the key groups of its range that had bytes.
std::map<int32_t, std::string> restored_key_groups(int parallelism, int index) {
  std::map<int32_t, std::string> expected;
  for (const auto& [kg, bytes] : key_groups_of(KeyGroupRange::for_operator_index(kMaxP, parallelism, index)))
    if (!bytes.empty()) expected[kg] = bytes;
  return expected;
}

std::string operator_state(const std::vector<int>& offsets, const std::vector<std::string>& names) {
  OperatorStateStore store;
  store.get_list_state<int>("offsets").update(offsets);
  store.get_union_list_state<std::string>("names").update(names);
  DataOutput out;
  store.snapshot(out);
  return std::string(out.view());
}

struct RestoredOperatorState {
  std::vector<int> offsets;
  std::vector<std::string> names;
};

RestoredOperatorState decode(const std::string& bytes) {
  OperatorStateStore store;
  DataInput in(bytes);
  EXPECT_TRUE(store.restore(in).ok());
  return {store.get_list_state<int>("offsets").get(), store.get_union_list_state<std::string>("names").get()};
}

struct OldSubtask {
  std::string operator_state;
  std::map<int32_t, std::string> key_groups;
};

using sluice::testing::read_file;
using sluice::testing::write_file;

class StateAssignmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        fs::temp_directory_path() / ("sluice-state-assignment-test-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(root_);
    auto storage = FileCheckpointStorage::create((root_ / "checkpoints").string(), "job-0001");
    ASSERT_TRUE(storage.ok()) << storage.error().to_string();
    storage_.emplace(std::move(storage).value_or_throw());
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes one file per old subtask of operator `uid` (keyed: each subtask snapshots its key-group range).
  OperatorStateEntry write_operator(const fs::path& dir, const std::string& uid, int max_parallelism,
                                    const std::vector<OldSubtask>& subtasks, bool keyed) {
    const int p = static_cast<int>(subtasks.size());
    OperatorStateEntry entry{uid, p, max_parallelism, {}};
    for (int i = 0; i < p; ++i) {
      const OldSubtask& s = subtasks[static_cast<size_t>(i)];
      FakeKeyedSnapshot snapshot(KeyGroupRange::for_operator_index(max_parallelism, p, i), max_parallelism,
                                 s.key_groups);
      auto h = storage_->write_subtask_state(dir, uid, i, s.operator_state, keyed ? &snapshot : nullptr);
      EXPECT_TRUE(h.ok()) << h.error().to_string();
      entry.subtasks.push_back(*h);
    }
    return entry;
  }

  CheckpointMetadata finalize(const fs::path& dir, int64_t id, std::vector<OperatorStateEntry> operators) {
    CheckpointMetadata m;
    m.checkpoint_id = id;
    m.trigger_timestamp = 1000 * id;
    m.job_id = storage_->job_id();
    m.operators = std::move(operators);
    for (const auto& op : m.operators)
      for (const auto& h : op.subtasks)
        m.total_state_bytes += h.file_size;
    Status s = storage_->finalize_checkpoint(dir, m);
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return m;
  }

  // Checkpoint `id` of a two-operator chain at parallelism 2: "source" (operator state: list "offsets"
  // [0, 1, 2] and [3, 4], union "names" [a, b] and [c]) and "counts" (keyed state, kg_bytes()).
  CheckpointMetadata standard_checkpoint(int64_t id) {
    auto dir = storage_->init_checkpoint(id);
    EXPECT_TRUE(dir.ok());
    OperatorStateEntry source =
        write_operator(*dir, "source", kMaxP,
                       {{operator_state({0, 1, 2}, {"a", "b"}), {}}, {operator_state({3, 4}, {"c"}), {}}}, false);
    OperatorStateEntry counts = write_operator(*dir, "counts", kMaxP,
                                               {{"", key_groups_of(KeyGroupRange::for_operator_index(kMaxP, 2, 0))},
                                                {"", key_groups_of(KeyGroupRange::for_operator_index(kMaxP, 2, 1))}},
                                               true);
    return finalize(*dir, id, {source, counts});
  }

  // Flips a byte in the middle of the state file of old subtask `subtask` of "counts"; returns its path.
  fs::path corrupt_counts_file(const CheckpointMetadata& m, int subtask) {
    const fs::path path =
        storage_->checkpoint_dir(m.checkpoint_id) / m.operators[1].subtasks[static_cast<size_t>(subtask)].file;
    std::string bytes = read_file(path);
    bytes[bytes.size() / 2] ^= 0x01;
    write_file(path, bytes);
    return path;
  }

  VertexToRestore chain(int parallelism) const {
    return VertexToRestore{{"source", "counts", "added-later"}, parallelism, {kMaxP, kMaxP, kMaxP}};
  }

  fs::path root_;
  std::optional<FileCheckpointStorage> storage_;
};

TEST_F(StateAssignmentTest, RescalingTwoToThreeToOnePreservesAllState) {
  CheckpointMetadata m1 = standard_checkpoint(1);
  const fs::path chk1 = storage_->checkpoint_dir(1);

  // 2 -> 3
  auto three = assign_subtask_states(m1, chk1, chain(3));
  ASSERT_TRUE(three.ok()) << three.error().to_string();
  ASSERT_EQ(three->size(), 3u);
  std::map<int32_t, std::string> seen;
  std::vector<std::vector<int>> offsets;
  for (int i = 0; i < 3; ++i) {
    const TaskRestore& r = *(*three)[static_cast<size_t>(i)];
    EXPECT_EQ(r.checkpoint_id, 1);
    ASSERT_EQ(r.operators.count("source"), 1u);
    ASSERT_EQ(r.operators.count("counts"), 1u);
    EXPECT_EQ(r.operators.count("added-later"), 0u);  // not in the checkpoint: a fresh start

    const OperatorSubtaskRestore& source = r.operators.at("source");
    EXPECT_EQ(source.keyed, nullptr);
    RestoredOperatorState ops = decode(source.operator_state);
    offsets.push_back(ops.offsets);
    EXPECT_THAT(ops.names, ElementsAre("a", "b", "c"));  // union: everything, in old subtask order

    const OperatorSubtaskRestore& counts = r.operators.at("counts");
    EXPECT_EQ(counts.operator_state, "");
    ASSERT_NE(counts.keyed, nullptr);
    EXPECT_EQ(counts.keyed->max_parallelism, kMaxP);
    const KeyGroupRange range = KeyGroupRange::for_operator_index(kMaxP, 3, i);
    for (const auto& [kg, bytes] : counts.keyed->key_groups) {
      EXPECT_TRUE(range.contains(KeyGroup{kg})) << "subtask " << i << " got key group " << kg;
      EXPECT_TRUE(seen.emplace(kg, std::string(bytes)).second) << "key group " << kg << " restored twice";
    }
  }
  EXPECT_EQ(seen, expected_key_groups());
  // List state: [0..4] cut into runs of 2, 2, 1 in concatenation order.
  EXPECT_THAT(offsets, ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4)));

  // The three subtasks run and checkpoint again (each keeps a third of the union state, as sources do).
  auto dir2 = storage_->init_checkpoint(2);
  ASSERT_TRUE(dir2.ok());
  std::vector<OldSubtask> source_subtasks;
  std::vector<OldSubtask> counts_subtasks;
  const std::vector<std::string> all_names{"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    const TaskRestore& r = *(*three)[static_cast<size_t>(i)];
    std::vector<std::string> mine;
    for (size_t j = static_cast<size_t>(i); j < all_names.size(); j += 3)
      mine.push_back(all_names[j]);
    source_subtasks.push_back({operator_state(decode(r.operators.at("source").operator_state).offsets, mine), {}});
    counts_subtasks.push_back({"", owned(r.operators.at("counts").keyed->key_groups)});
  }
  CheckpointMetadata m2 = finalize(*dir2, 2,
                                   {write_operator(*dir2, "source", kMaxP, source_subtasks, false),
                                    write_operator(*dir2, "counts", kMaxP, counts_subtasks, true)});
  ASSERT_EQ(m2.operators[1].parallelism, 3);

  // 3 -> 1
  auto one = assign_subtask_states(m2, *dir2, chain(1));
  ASSERT_TRUE(one.ok()) << one.error().to_string();
  ASSERT_EQ(one->size(), 1u);
  const TaskRestore& r = *(*one)[0];
  EXPECT_EQ(r.checkpoint_id, 2);
  EXPECT_EQ(owned(r.operators.at("counts").keyed->key_groups), expected_key_groups());
  RestoredOperatorState ops = decode(r.operators.at("source").operator_state);
  EXPECT_THAT(ops.offsets, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(ops.names, ElementsAre("a", "b", "c"));
}

TEST_F(StateAssignmentTest, SameParallelismGivesEachSubtaskItsOwnState) {
  CheckpointMetadata m = standard_checkpoint(1);
  auto two = assign_subtask_states(m, storage_->checkpoint_dir(1), chain(2));
  ASSERT_TRUE(two.ok()) << two.error().to_string();
  EXPECT_THAT(decode((*two)[0]->operators.at("source").operator_state).offsets, ElementsAre(0, 1, 2));
  EXPECT_THAT(decode((*two)[1]->operators.at("source").operator_state).offsets, ElementsAre(3, 4));
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(owned((*two)[static_cast<size_t>(i)]->operators.at("counts").keyed->key_groups),
              restored_key_groups(2, i));
}

TEST_F(StateAssignmentTest, OperatorsWithoutStateGetEmptyEntries) {
  auto dir = storage_->init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  CheckpointMetadata m = finalize(*dir, 1, {write_operator(*dir, "map", kMaxP, {{"", {}}, {"", {}}}, false)});
  auto restored = assign_subtask_states(m, *dir, VertexToRestore{{"map"}, 3, {kMaxP}});
  ASSERT_TRUE(restored.ok()) << restored.error().to_string();
  for (const auto& r : *restored) {
    ASSERT_EQ(r->operators.count("map"), 1u);
    EXPECT_EQ(r->operators.at("map").operator_state, "");
    EXPECT_EQ(r->operators.at("map").keyed, nullptr);
  }
}

TEST_F(StateAssignmentTest, CorruptedStateFileIsNamedWithBothChecksums) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  const OperatorSubtaskStateHandle& h = m.operators[1].subtasks[1];
  const fs::path path = dir / h.file;
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(path, bytes);

  auto r = assign_subtask_states(m, dir, chain(3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kState);
  const std::string& msg = r.error().message();
  EXPECT_THAT(msg, HasSubstr(path.string()));
  EXPECT_THAT(msg, HasSubstr("checksum mismatch"));
  EXPECT_THAT(msg, HasSubstr(fmt::format("expected {:016x}", h.checksum)));
  EXPECT_THAT(msg, HasSubstr(fmt::format("actual {:016x}", XXH3_64bits(bytes.data(), bytes.size()))));
  EXPECT_THAT(msg, HasSubstr("operator 'counts' (old subtask 1)"));

  // The operator state of "source" is intact: restoring only it works.
  EXPECT_TRUE(assign_subtask_states(m, dir, VertexToRestore{{"source"}, 3, {kMaxP}}).ok());
}

TEST_F(StateAssignmentTest, MissingOrTruncatedStateFileIsNamed) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  const fs::path source0 = dir / m.operators[0].subtasks[0].file;
  const fs::path counts0 = dir / m.operators[1].subtasks[0].file;

  std::string bytes = read_file(counts0);
  write_file(counts0, bytes.substr(0, bytes.size() - 1));
  auto r = assign_subtask_states(m, dir, chain(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kState);
  EXPECT_THAT(r.error().message(), HasSubstr(counts0.string()));
  EXPECT_THAT(r.error().message(), HasSubstr("truncated"));

  fs::remove(source0);
  r = assign_subtask_states(m, dir, chain(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kState);
  EXPECT_THAT(r.error().message(), HasSubstr(source0.string()));
  EXPECT_THAT(r.error().message(), HasSubstr("missing"));
}

TEST_F(StateAssignmentTest, MaxParallelismMismatchNamesTheUidAndBothValues) {
  CheckpointMetadata m = standard_checkpoint(1);
  VertexToRestore vertex = chain(2);
  vertex.max_parallelism = {kMaxP, 256, kMaxP};
  auto r = assign_subtask_states(m, storage_->checkpoint_dir(1), vertex);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kState);
  EXPECT_THAT(r.error().message(), HasSubstr("'counts'"));
  EXPECT_THAT(r.error().message(), HasSubstr("max parallelism 128"));
  EXPECT_THAT(r.error().message(), HasSubstr("max parallelism 256"));
  EXPECT_THAT(r.error().message(), HasSubstr("restore with the old max parallelism"));

  // Operator state does not depend on key groups: another max parallelism for "source" is fine.
  vertex.max_parallelism = {64, kMaxP, kMaxP};
  EXPECT_TRUE(assign_subtask_states(m, storage_->checkpoint_dir(1), vertex).ok());
}

TEST_F(StateAssignmentTest, InvalidVerticesAreRejected) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  EXPECT_EQ(assign_subtask_states(m, dir, VertexToRestore{{"source"}, 0, {kMaxP}}).error().code(),
            ErrorCode::kConfiguration);
  EXPECT_EQ(assign_subtask_states(m, dir, VertexToRestore{{"source", "counts"}, 2, {kMaxP}}).error().code(),
            ErrorCode::kConfiguration);
  EXPECT_EQ(assign_subtask_states(m, dir, VertexToRestore{{"source", "source"}, 2, {kMaxP, kMaxP}}).error().code(),
            ErrorCode::kConfiguration);
  auto too_wide = assign_subtask_states(m, dir, VertexToRestore{{"counts"}, kMaxP + 1, {kMaxP}});
  ASSERT_FALSE(too_wide.ok());
  EXPECT_THAT(too_wide.error().message(), HasSubstr("exceeds its max parallelism"));
}

TEST_F(StateAssignmentTest, LoadForRestoreFallsBackToThePreviousCheckpoint) {
  standard_checkpoint(1);
  CheckpointMetadata m2 = standard_checkpoint(2);
  const fs::path chk1 = storage_->checkpoint_dir(1);
  const fs::path chk2 = storage_->checkpoint_dir(2);
  const fs::path broken = chk2 / m2.operators[0].subtasks[1].file;
  std::string bytes = read_file(broken);
  bytes[5] ^= 0x20;
  write_file(broken, bytes);
  const std::vector<fs::path> candidates{chk2, chk1};

  auto strict = load_for_restore(candidates, /*fallback=*/false);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.error().code(), ErrorCode::kState);
  EXPECT_THAT(strict.error().message(), HasSubstr(broken.string()));
  EXPECT_THAT(strict.error().message(), HasSubstr("checksum mismatch"));

  auto lenient = load_for_restore(candidates, /*fallback=*/true);
  ASSERT_TRUE(lenient.ok()) << lenient.error().to_string();
  EXPECT_EQ(lenient->dir, chk1);
  EXPECT_EQ(lenient->metadata.checkpoint_id, 1);

  // The newest works: no fallback needed.
  auto newest = load_for_restore(std::vector<fs::path>{chk1}, false);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->dir, chk1);

  // Nothing works: every failure is listed.
  fs::remove(chk1 / "_metadata");
  auto none = load_for_restore(candidates, /*fallback=*/true);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kState);
  EXPECT_THAT(none.error().message(), HasSubstr("none of the 2 checkpoints"));
  EXPECT_THAT(none.error().message(), HasSubstr(broken.string()));
  EXPECT_THAT(none.error().message(), HasSubstr((chk1 / "_metadata").string()));
  ASSERT_NE(none.error().cause(), nullptr);
  EXPECT_THAT(none.error().cause()->message(), HasSubstr(broken.string()));

  EXPECT_FALSE(load_for_restore({}, true).ok());
}

TEST_F(StateAssignmentTest, UnclaimedStateIsAnErrorUnlessIgnored) {
  CheckpointMetadata m = standard_checkpoint(1);
  m.operators.push_back({"stateless", 2, kMaxP, {}});
  m.coordinator_state["old-source"] = "enumerator";

  Status s = check_unclaimed_state(m, {"source"}, /*ignore_unclaimed=*/false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kState);
  EXPECT_THAT(s.error().message(), HasSubstr("'counts', 'old-source'"));
  EXPECT_THAT(s.error().message(), Not(HasSubstr("stateless")));
  EXPECT_THAT(s.error().message(), HasSubstr("execution.state-recovery.ignore-unclaimed-state"));

  EXPECT_TRUE(check_unclaimed_state(m, {"source"}, /*ignore_unclaimed=*/true).ok());
  EXPECT_TRUE(check_unclaimed_state(m, {"source", "counts", "old-source"}, false).ok());
}

TEST_F(StateAssignmentTest, VerifyCheckpointFilesChecksEveryFile) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  EXPECT_TRUE(verify_checkpoint_files(m, dir).ok());
  const fs::path last = dir / m.operators[1].subtasks[1].file;
  fs::remove(last);
  Status s = verify_checkpoint_files(m, dir);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message(), HasSubstr(last.string()));
  EXPECT_THAT(s.error().message(), HasSubstr("operator 'counts' subtask 1"));
}

// The JobManager's check before a deployment (kSize) reads no file: a corrupted file of the right size passes it,
// and the state assignment on the TaskManager, which reads the file anyway, fails naming the file and the reason.
TEST_F(StateAssignmentTest, SizeChecksLeaveCorruptionToTheStateAssignment) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  EXPECT_TRUE(verify_checkpoint_files(m, dir, CheckpointFileCheck::kSize).ok());
  const fs::path broken = dir / m.operators[1].subtasks[0].file;
  std::string bytes = read_file(broken);
  bytes[bytes.size() - 1] ^= 0x01;
  write_file(broken, bytes);

  EXPECT_TRUE(verify_checkpoint_files(m, dir, CheckpointFileCheck::kSize).ok());
  auto loaded = load_for_restore(std::vector<fs::path>{dir}, false, CheckpointFileCheck::kSize);
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  Status full = verify_checkpoint_files(m, dir, CheckpointFileCheck::kChecksum);
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(full.error().message(), HasSubstr("checksum mismatch"));

  auto assigned =
      assign_subtask_states(loaded->metadata, dir, VertexToRestore{{"source", "counts"}, 2, {kMaxP, kMaxP}});
  ASSERT_FALSE(assigned.ok());
  EXPECT_EQ(assigned.error().code(), ErrorCode::kState);
  EXPECT_THAT(assigned.error().to_string(), HasSubstr(broken.string()));
  EXPECT_THAT(assigned.error().to_string(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(assigned.error().to_string(), HasSubstr("restoring operator 'counts'"));

  // A truncated or missing file is what the size check finds, naming the file, checkpoint, operator and subtask.
  write_file(broken, bytes.substr(0, bytes.size() / 2));
  Status s = verify_checkpoint_files(m, dir, CheckpointFileCheck::kSize);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().to_string(), HasSubstr(broken.string()));
  EXPECT_THAT(s.error().to_string(), HasSubstr("is truncated"));
  EXPECT_THAT(s.error().to_string(), HasSubstr("operator 'counts' subtask 0"));
  fs::remove(broken);
  auto missing = load_for_restore(std::vector<fs::path>{dir}, false, CheckpointFileCheck::kSize);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().to_string(), HasSubstr(broken.string()));
  EXPECT_THAT(missing.error().to_string(), HasSubstr("is missing"));
}

// A TaskManager assigns only the subtasks it runs: it reads the files of their key groups, no others.
TEST_F(StateAssignmentTest, SubtasksLeftOutAreNotAssignedAndTheirFilesNotRead) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  const fs::path counts1 = corrupt_counts_file(m, 1);

  VertexToRestore first = chain(2);
  first.subtasks = {true, false};
  auto r = assign_subtask_states(m, dir, first);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 2u);
  ASSERT_NE((*r)[0], nullptr);
  EXPECT_EQ((*r)[1], nullptr);
  EXPECT_THAT(decode((*r)[0]->operators.at("source").operator_state).offsets, ElementsAre(0, 1, 2));
  EXPECT_EQ(owned((*r)[0]->operators.at("counts").keyed->key_groups), restored_key_groups(2, 0));

  VertexToRestore second = chain(2);
  second.subtasks = {false, true};
  auto broken = assign_subtask_states(m, dir, second);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.error().message(), HasSubstr(counts1.string()));
  EXPECT_THAT(broken.error().message(), HasSubstr("checksum mismatch"));

  VertexToRestore wrong = chain(2);
  wrong.subtasks = {true};
  auto refused = assign_subtask_states(m, dir, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kConfiguration);
}

// DeferredStateAssignment (the tasks' side of a TaskManager's restore): the fixture's checkpoints serve it too.
TEST_F(StateAssignmentTest, DeferredAssignmentHandsEachSubtaskItsStateOnceFromConcurrentTasks) {
  CheckpointMetadata m = standard_checkpoint(1);
  VertexToRestore rescaled = chain(3);
  rescaled.subtasks = {true, false, true};  // subtask 1 runs in another TaskManager
  std::vector<VertexToRestore> vertices{VertexToRestore{{"map"}, 3, {kMaxP}}, rescaled};
  DeferredStateAssignment assignment(m, storage_->checkpoint_dir(1), vertices);
  EXPECT_EQ(assignment.checkpoint_id(), 1);

  std::vector<Result<std::shared_ptr<const TaskRestore>>> got(2, Error(ErrorCode::kInternal, "not run"));
  {
    std::vector<std::jthread> tasks;
    tasks.emplace_back([&] { got[0] = assignment.subtask(1, 0); });
    tasks.emplace_back([&] { got[1] = assignment.subtask(1, 2); });
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[static_cast<size_t>(i)].ok()) << got[static_cast<size_t>(i)].error().to_string();
    ASSERT_NE(*got[static_cast<size_t>(i)], nullptr);
  }
  const int subtask_of[2] = {0, 2};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(owned((*got[static_cast<size_t>(i)])->operators.at("counts").keyed->key_groups),
              restored_key_groups(3, subtask_of[i]));
  }
  EXPECT_THAT(decode((*got[1])->operators.at("source").operator_state).offsets, ElementsAre(4));

  auto again = assignment.subtask(1, 0);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kInternal);
  EXPECT_THAT(again.error().message(), HasSubstr("taken already"));
  auto elsewhere = assignment.subtask(1, 1);
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_THAT(elsewhere.error().message(), HasSubstr("not assigned here"));
  EXPECT_FALSE(assignment.subtask(2, 0).ok());
  EXPECT_FALSE(assignment.subtask(-1, 0).ok());

  // A vertex whose operators the checkpoint does not know: empty state, a fresh start for them.
  auto fresh = assignment.subtask(0, 1);
  ASSERT_TRUE(fresh.ok()) << fresh.error().to_string();
  EXPECT_TRUE((*fresh)->operators.empty());
}

TEST_F(StateAssignmentTest, DeferredAssignmentFailsEverySubtaskOfAVertexWithACorruptedFileNamingIt) {
  CheckpointMetadata m = standard_checkpoint(1);
  const fs::path dir = storage_->checkpoint_dir(1);
  const fs::path counts0 = corrupt_counts_file(m, 0);

  DeferredStateAssignment assignment(m, dir, {chain(2)});
  for (int i = 0; i < 2; ++i) {
    auto r = assignment.subtask(0, i);
    ASSERT_FALSE(r.ok()) << "subtask " << i;
    EXPECT_EQ(r.error().code(), ErrorCode::kState);
    EXPECT_THAT(r.error().message(), HasSubstr(counts0.string()));
    EXPECT_THAT(r.error().message(), HasSubstr("checksum mismatch"));
  }
}

}  // namespace
}  // namespace sluice
