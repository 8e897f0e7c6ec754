#include "sluice/checkpoint/task_local_state_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/deferred_state_assignment.h"
#include "sluice/checkpoint/state_assignment.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "test_util/files.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxP = 128;

// Keyed state whose key group kg holds "kg<kg>:" and a run of letters.
class FakeKeyedSnapshot final : public KeyedStateSnapshot {
 public:
  explicit FakeKeyedSnapshot(KeyGroupRange range) : range_(range) {}
  KeyGroupRange key_group_range() const override { return range_; }
  int max_parallelism() const override { return kMaxP; }
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    const std::string bytes = bytes_of(kg.value);
    out.write_bytes(bytes.data(), bytes.size());
  }
  static std::string bytes_of(int32_t kg) {
    return fmt::format("kg{}:", kg) +
           std::string(static_cast<size_t>(kg % 7 + 1) * 100, static_cast<char>('a' + kg % 26));
  }

 private:
  KeyGroupRange range_;
};

using sluice::testing::read_file;
using sluice::testing::write_file;

class TaskLocalStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / ("sluice-local-state-test-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(root_);
    auto storage = FileCheckpointStorage::create((root_ / "primary").string(), "job-0001");
    ASSERT_TRUE(storage.ok()) << storage.error().to_string();
    storage_.emplace(std::move(storage).value_or_throw());
    local_.emplace(root_ / "local");
  }
  void TearDown() override { fs::remove_all(root_); }

  // Checkpoint `id` of keyed operator "counts" at parallelism 2, each subtask's file also copied locally.
  CheckpointMetadata checkpoint(int64_t id) {
    auto dir = storage_->init_checkpoint(id);
    EXPECT_TRUE(dir.ok());
    auto local_dir = local_->init_checkpoint(storage_->job_id(), id);
    EXPECT_TRUE(local_dir.ok()) << local_dir.error().to_string();
    OperatorStateEntry entry{"counts", 2, kMaxP, {}};
    for (int i = 0; i < 2; ++i) {
      FakeKeyedSnapshot snapshot(KeyGroupRange::for_operator_index(kMaxP, 2, i));
      auto h = storage_->write_subtask_state(*dir, "counts", i, "", &snapshot, nullptr, *local_dir);
      EXPECT_TRUE(h.ok()) << h.error().to_string();
      entry.subtasks.push_back(*h);
    }
    CheckpointMetadata m;
    m.checkpoint_id = id;
    m.job_id = storage_->job_id();
    m.operators = {entry};
    EXPECT_TRUE(storage_->finalize_checkpoint(*dir, m).ok());
    return m;
  }

  // Restores "counts" at parallelism 2 and checks every key group's bytes.
  StateReadStats restore_and_check(const CheckpointMetadata& m) {
    StateReadStats stats;
    auto r = assign_subtask_states(m, storage_->checkpoint_dir(m.checkpoint_id),
                                   VertexToRestore{{"counts"}, 2, {kMaxP}, {}}, &*local_, &stats);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok()) return stats;
    int key_groups = 0;
    for (const auto& restore : *r) {
      for (const auto& [kg, bytes] : restore->operators.at("counts").keyed->key_groups) {
        EXPECT_EQ(std::string(bytes), FakeKeyedSnapshot::bytes_of(kg)) << "key group " << kg;
        ++key_groups;
      }
    }
    EXPECT_EQ(key_groups, kMaxP);
    return stats;
  }

  fs::path local_copy(const CheckpointMetadata& m, int subtask) const {
    return local_->checkpoint_dir(m.job_id, m.checkpoint_id) /
           m.operators[0].subtasks[static_cast<size_t>(subtask)].file;
  }

  fs::path root_;
  std::optional<FileCheckpointStorage> storage_;
  std::optional<TaskLocalStateStore> local_;
};

TEST_F(TaskLocalStateStoreTest, TheLocalCopyHoldsThePrimarysBytesAndARestoreReadsIt) {
  const CheckpointMetadata m = checkpoint(3);
  for (int i = 0; i < 2; ++i) {
    const fs::path primary = storage_->checkpoint_dir(3) / m.operators[0].subtasks[static_cast<size_t>(i)].file;
    ASSERT_TRUE(fs::exists(local_copy(m, i)));
    EXPECT_EQ(read_file(local_copy(m, i)), read_file(primary));
  }
  // No temporary file is left beside the copies.
  int files = 0;
  for (const auto& e : fs::directory_iterator(local_->checkpoint_dir(m.job_id, 3))) {
    EXPECT_EQ(e.path().extension(), "") << e.path();
    ++files;
  }
  EXPECT_EQ(files, 2);

  // With the primary files gone, the restore can only have read the local copies.
  for (const auto& h : m.operators[0].subtasks)
    fs::remove(storage_->checkpoint_dir(3) / h.file);
  const StateReadStats stats = restore_and_check(m);
  EXPECT_EQ(stats.local_files, 2);
  EXPECT_EQ(stats.remote_files, 0);
  EXPECT_EQ(stats.local_bytes, m.operators[0].subtasks[0].file_size + m.operators[0].subtasks[1].file_size);
}

TEST_F(TaskLocalStateStoreTest, ACopyThatDiffersFromTheCheckpointIsNotUsed) {
  const CheckpointMetadata m = checkpoint(4);
  // A flipped byte (a copy cut by a crash, or a copy of other bytes under the same name): the checksum differs.
  std::string bytes = read_file(local_copy(m, 0));
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(local_copy(m, 0), bytes);
  // A truncated copy.
  std::string other = read_file(local_copy(m, 1));
  write_file(local_copy(m, 1), other.substr(0, other.size() - 3));
  const StateReadStats stats = restore_and_check(m);
  EXPECT_EQ(stats.local_files, 0);
  EXPECT_EQ(stats.remote_files, 2);
}

TEST_F(TaskLocalStateStoreTest, WithoutACopyTheRestoreReadsThePrimary) {
  const CheckpointMetadata m = checkpoint(5);
  fs::remove(local_copy(m, 1));
  const StateReadStats stats = restore_and_check(m);
  EXPECT_EQ(stats.local_files, 1);
  EXPECT_EQ(stats.remote_files, 1);
}

TEST_F(TaskLocalStateStoreTest, FindsCopiesOfCheckpointsOnlyByTheirJobAndCheckpointDirectory) {
  const CheckpointMetadata m = checkpoint(6);
  const std::string& file = m.operators[0].subtasks[0].file;
  EXPECT_TRUE(local_->find(storage_->checkpoint_dir(6), file).has_value());
  EXPECT_TRUE(local_->find(fs::path("s3://bucket/prefix/job-0001/chk-6"), file).has_value());
  EXPECT_TRUE(local_->find(fs::path("s3://bucket/prefix/job-0001/chk-6/"), file).has_value());
  EXPECT_FALSE(local_->find(fs::path("s3://bucket/prefix/job-0002/chk-6"), file).has_value());
  EXPECT_FALSE(local_->find(storage_->checkpoint_dir(7), file).has_value());
  EXPECT_FALSE(local_->find(root_ / "savepoints" / "savepoint-job-00-0123456789ab", file).has_value());
  EXPECT_FALSE(local_->find(storage_->checkpoint_dir(6), "../chk-6/" + file).has_value());
}

TEST_F(TaskLocalStateStoreTest, ASavepointGetsNoCopy) {
  auto dir = storage_->init_savepoint((root_ / "savepoints").string(), 8);
  ASSERT_TRUE(dir.ok()) << dir.error().to_string();
  const fs::path local_dir = root_ / "local-for-savepoint";
  fs::create_directories(local_dir);
  FakeKeyedSnapshot snapshot(KeyGroupRange::for_operator_index(kMaxP, 1, 0));
  auto h = storage_->write_subtask_state(*dir, "counts", 0, "", &snapshot, nullptr, local_dir);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_TRUE(fs::is_empty(local_dir));
}

TEST_F(TaskLocalStateStoreTest, AFailedCopyLeavesTheCheckpointWhole) {
  auto dir = storage_->init_checkpoint(9);
  ASSERT_TRUE(dir.ok());
  // The copy's directory is a regular file: creating the copy fails.
  const fs::path not_a_dir = root_ / "local-is-a-file";
  write_file(not_a_dir, "x");
  FakeKeyedSnapshot snapshot(KeyGroupRange::for_operator_index(kMaxP, 1, 0));
  auto h = storage_->write_subtask_state(*dir, "counts", 0, "", &snapshot, nullptr, not_a_dir);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_TRUE(FileCheckpointStorage::verify_state_file(*dir, *h).ok());
  EXPECT_EQ(read_file(not_a_dir), "x");
}

TEST_F(TaskLocalStateStoreTest, AConfirmedCheckpointRemovesOlderCopiesAndAnAbortedOneItsOwn) {
  checkpoint(10);
  checkpoint(11);
  checkpoint(12);
  checkpoint(13);
  const std::string job = storage_->job_id();
  // A savepoint (no copies here) completing must keep the latest checkpoint's copies, which a failover restores.
  local_->confirm_checkpoint(job, 20);
  EXPECT_TRUE(fs::exists(local_->checkpoint_dir(job, 10)));
  local_->confirm_checkpoint(job, 12);
  EXPECT_FALSE(fs::exists(local_->checkpoint_dir(job, 10)));
  EXPECT_FALSE(fs::exists(local_->checkpoint_dir(job, 11)));
  EXPECT_TRUE(fs::exists(local_->checkpoint_dir(job, 12)));
  EXPECT_TRUE(fs::exists(local_->checkpoint_dir(job, 13)));  // in progress when 12 was confirmed
  local_->abort_checkpoint(job, 13);
  EXPECT_FALSE(fs::exists(local_->checkpoint_dir(job, 13)));
  EXPECT_TRUE(fs::exists(local_->checkpoint_dir(job, 12)));
  // Another job's copies are its own.
  local_->confirm_checkpoint("job-0002", 100);
  EXPECT_TRUE(fs::exists(local_->checkpoint_dir(job, 12)));
}

TEST_F(TaskLocalStateStoreTest, ADeferredAssignmentReadsTheLocalCopies) {
  const CheckpointMetadata m = checkpoint(14);
  for (const auto& h : m.operators[0].subtasks)
    fs::remove(storage_->checkpoint_dir(14) / h.file);
  auto local = std::make_shared<const TaskLocalStateStore>(root_ / "local");
  DeferredStateAssignment deferred(m, storage_->checkpoint_dir(14), {VertexToRestore{{"counts"}, 2, {kMaxP}, {}}},
                                   local);
  for (int i = 0; i < 2; ++i) {
    auto r = deferred.subtask(0, i);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_FALSE((*r)->operators.at("counts").keyed->key_groups.empty());
  }
  // Without the local store the primary files are needed: the same restore fails naming the missing file.
  DeferredStateAssignment remote_only(m, storage_->checkpoint_dir(14), {VertexToRestore{{"counts"}, 2, {kMaxP}, {}}});
  auto r = remote_only.subtask(0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("is missing"), std::string::npos) << r.error().to_string();
}

}  // namespace
}  // namespace sluice
