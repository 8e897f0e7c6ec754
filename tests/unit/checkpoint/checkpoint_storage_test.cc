#include "sluice/checkpoint/checkpoint_storage.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/checkpoint/completed_checkpoint_store.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "test_util/files.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A KeyedStateSnapshot that writes fixed bytes per key group ("" = the key group has no state).
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

class ThrowingKeyedSnapshot final : public KeyedStateSnapshot {
 public:
  KeyGroupRange key_group_range() const override { return {0, 3}; }
  int max_parallelism() const override { return 4; }
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    out.write_u8(1);
    if (kg.value == 2) throw SluiceException(Error(ErrorCode::kState, "state table 'counts' broke"));
  }
};

// Whether `name` is `prefix` followed by exactly `hex_digits` lower-case hex digits.
bool is_prefix_and_hex(std::string_view name, std::string_view prefix, size_t hex_digits) {
  if (!name.starts_with(prefix) || name.size() != prefix.size() + hex_digits) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

using sluice::testing::read_file;
using sluice::testing::write_file;

std::set<std::string> file_names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.insert(e.path().filename().string());
  return names;
}

CheckpointMetadata sample_metadata() {
  CheckpointMetadata m;
  m.checkpoint_id = 42;
  m.trigger_timestamp = 1'700'000'000'123;
  m.type = SnapshotType::kSavepoint;
  m.job_id = "0123456789abcdef";
  OperatorStateEntry src{"source-1", 2, 128, {}};
  src.subtasks.push_back({0, "source-1-0-aaaa", 30, 0x1234, 5, 25, {}});
  src.subtasks.push_back({1, "source-1-1-bbbb", 5, 0x5678, 5, 0, {}});
  OperatorStateEntry keyed{"counts", 3, 128, {}};
  keyed.subtasks.push_back({2, "counts-2-cccc", 1000, 0xdeadbeefcafef00dULL, 5, 0, {{86, 5, 100}, {90, 105, 895}}});
  m.operators = {src, keyed};
  m.coordinator_state = {{"source-1", std::string("\x00\x01enumerator", 12)}};
  m.total_state_bytes = 1035;
  return m;
}

class CheckpointStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("sluice-checkpoint-storage-test-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  FileCheckpointStorage make_storage(const std::string& job_id = "job-abcdef123") {
    auto storage = FileCheckpointStorage::create((root_ / "checkpoints").string(), job_id);
    EXPECT_TRUE(storage.ok()) << (storage.ok() ? "" : storage.error().to_string());
    return std::move(storage).value_or_throw();
  }

  // A finalized checkpoint `id` with one operator state file.
  fs::path completed_checkpoint(const FileCheckpointStorage& storage, int64_t id,
                                SnapshotType type = SnapshotType::kCheckpoint) {
    auto dir = storage.init_checkpoint(id);
    EXPECT_TRUE(dir.ok());
    auto handle = storage.write_subtask_state(*dir, "op", 0, "state-" + std::to_string(id), nullptr);
    EXPECT_TRUE(handle.ok());
    CheckpointMetadata m;
    m.checkpoint_id = id;
    m.type = type;
    m.job_id = storage.job_id();
    m.operators.push_back({"op", 1, 128, {*handle}});
    m.total_state_bytes = handle->file_size;
    EXPECT_TRUE(storage.finalize_checkpoint(*dir, m).ok());
    return *dir;
  }

  fs::path root_;
};

// --- metadata ---

TEST(CheckpointMetadataTest, RoundTrip) {
  CheckpointMetadata m = sample_metadata();
  std::string bytes = serialize_checkpoint_metadata(m);
  EXPECT_EQ(bytes.substr(0, 4), "SLCM");
  auto back = deserialize_checkpoint_metadata(bytes, "/x/_metadata");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, m);

  CheckpointMetadata empty;
  auto empty_back = deserialize_checkpoint_metadata(serialize_checkpoint_metadata(empty), "f");
  ASSERT_TRUE(empty_back.ok());
  EXPECT_EQ(*empty_back, empty);
}

TEST(CheckpointMetadataTest, Version3RecordsTheLocationOfEverySubtasksState) {
  CheckpointMetadata m = sample_metadata();
  m.operators[0].subtasks[0].location = "127.0.0.1:41231-0a1b2c";
  m.operators[1].subtasks[0].location = "10.0.0.7:6122-ffffff";  // source-1 subtask 1 stays unknown ("")
  const std::string bytes = serialize_checkpoint_metadata(m);
  EXPECT_EQ(bytes[4], 3) << "format version 3";
  EXPECT_EQ(kCheckpointMetadataVersion, 3u);
  auto back = deserialize_checkpoint_metadata(bytes, "/x/_metadata");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(back->operators[0].subtasks[0].location, "127.0.0.1:41231-0a1b2c");
  EXPECT_EQ(back->operators[0].subtasks[1].location, "");
  EXPECT_EQ(back->operators[1].subtasks[0].location, "10.0.0.7:6122-ffffff");
  EXPECT_NE(serialize_checkpoint_metadata(sample_metadata()), bytes) << "the location is part of the bytes";
}

TEST(CheckpointMetadataTest, Version2FilesAreStillReadWithoutLocations) {
  // sample_metadata() as the format-version-2 writer (commit c66fb41) serialized it.
  const std::string hex =
      "534c434d022a000000000000007b68e5cf8b0100000110303132333435363738396162636465660b040000000000000208736f757263"
      "652d3102800102000f736f757263652d312d302d616161611e000000000000003412000000000000050000000000000019000000000000"
      "000000010f736f757263652d312d312d6262626205000000000000007856000000000000050000000000000000000000000000000000"
      "06636f756e747303800101020d636f756e74732d322d63636363e8030000000000000df0fecaefbeadde0500000000000000000000000000"
      "00000256050000000000000064000000000000005a69000000000000007f03000000000000000108736f757263652d310c001e6e756d65"
      "7261746f72003806d0c3bf1884b3";
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  ASSERT_EQ(bytes[4], 2);
  auto back = deserialize_checkpoint_metadata(bytes, "/old/_metadata");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, sample_metadata());
  for (const auto& op : back->operators) {
    for (const auto& h : op.subtasks)
      EXPECT_EQ(h.location, "") << op.uid << " subtask " << h.subtask;
  }
  // Written again it is version 3, with the same content.
  auto again = deserialize_checkpoint_metadata(serialize_checkpoint_metadata(*back), "m");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *back);
}

TEST(CheckpointMetadataTest, CorruptionIsDetectedAndNamesTheFile) {
  const std::string bytes = serialize_checkpoint_metadata(sample_metadata());
  for (size_t i : {size_t{6}, size_t{30}, bytes.size() / 2, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    auto r = deserialize_checkpoint_metadata(bad, "/ckpt/chk-42/_metadata");
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_EQ(r.error().code(), ErrorCode::kState);
    EXPECT_THAT(r.error().message(), HasSubstr("/ckpt/chk-42/_metadata"));
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 1;
  EXPECT_THAT(deserialize_checkpoint_metadata(flipped, "m").error().message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(deserialize_checkpoint_metadata(bytes.substr(0, bytes.size() - 3), "m").error().message(),
              HasSubstr("checksum mismatch"));
  EXPECT_THAT(deserialize_checkpoint_metadata("SLC", "m").error().message(), HasSubstr("magic"));
  EXPECT_THAT(deserialize_checkpoint_metadata("garbage-garbage-garbage", "m").error().message(), HasSubstr("magic"));
  std::string future = bytes;
  future[4] = 9;  // version
  EXPECT_THAT(deserialize_checkpoint_metadata(future, "m").error().message(), HasSubstr("format version 9"));
  EXPECT_THAT(deserialize_checkpoint_metadata(future, "m").error().message(), HasSubstr("reads versions 1 to 3"));
  future[4] = 0;
  EXPECT_THAT(deserialize_checkpoint_metadata(future, "m").error().message(), HasSubstr("format version 0"));
}

TEST(CheckpointMetadataTest, InconsistentHandlesAreRejected) {
  CheckpointMetadata m = sample_metadata();
  m.operators[1].subtasks[0].key_groups[1].length = 2000;  // past the end of the file
  auto r = deserialize_checkpoint_metadata(serialize_checkpoint_metadata(m), "meta");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr("key group 90"));

  m = sample_metadata();
  m.operators[1].subtasks[0].subtask = 3;  // parallelism is 3
  r = deserialize_checkpoint_metadata(serialize_checkpoint_metadata(m), "meta");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr("subtask index not in [0, 3)"));

  m = sample_metadata();
  m.operators[0].subtasks[0].file = "../escape";
  EXPECT_FALSE(deserialize_checkpoint_metadata(serialize_checkpoint_metadata(m), "meta").ok());
}

// --- locations ---

TEST(CheckpointLocationTest, ParsesFileUrisAndPlainPaths) {
  EXPECT_EQ(*FileCheckpointStorage::parse_location("file:///tmp/a/b"), fs::path("/tmp/a/b"));
  EXPECT_EQ(*FileCheckpointStorage::parse_location("file:/tmp/a"), fs::path("/tmp/a"));
  EXPECT_EQ(*FileCheckpointStorage::parse_location("file://localhost/tmp/a"), fs::path("/tmp/a"));
  EXPECT_EQ(*FileCheckpointStorage::parse_location("/tmp/a/./b/"), fs::path("/tmp/a/b"));
  EXPECT_EQ(*FileCheckpointStorage::parse_location("rel/dir"), (fs::current_path() / "rel/dir").lexically_normal());

  // s3:// is an object store location, kept as the URI's text (trailing '/' dropped); other schemes are refused.
  auto s3 = FileCheckpointStorage::parse_location("s3://bucket/checkpoints/");
  ASSERT_TRUE(s3.ok()) << s3.error().to_string();
  EXPECT_EQ(s3->native(), "s3://bucket/checkpoints");
  EXPECT_EQ(FileCheckpointStorage::parse_location("s3:///no-bucket").error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(FileCheckpointStorage::parse_location("s3://b/a b").error().message(), HasSubstr("character ' '"));
  auto gs = FileCheckpointStorage::parse_location("gs://bucket/checkpoints");
  ASSERT_FALSE(gs.ok());
  EXPECT_EQ(gs.error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(gs.error().message(), HasSubstr("'gs'"));
  EXPECT_EQ(FileCheckpointStorage::parse_location("").error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(FileCheckpointStorage::parse_location("file://host/tmp").error().message(), HasSubstr("host"));

  auto storage = FileCheckpointStorage::create("hdfs://nn:8020/x", "job");
  ASSERT_FALSE(storage.ok());
  EXPECT_EQ(storage.error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(storage.error().message(), HasSubstr("'hdfs'"));
  EXPECT_EQ(FileCheckpointStorage::create("/tmp/x", "a/b").error().code(), ErrorCode::kConfiguration);
}

TEST_F(CheckpointStorageTest, CreateMakesTheJobAndSharedDirectories) {
  auto storage = FileCheckpointStorage::create("file://" + (root_ / "checkpoints").string(), "job-1");
  ASSERT_TRUE(storage.ok()) << storage.error().to_string();
  EXPECT_EQ(storage->job_dir(), root_ / "checkpoints" / "job-1");
  EXPECT_TRUE(fs::is_directory(root_ / "checkpoints" / "job-1" / "shared"));
  EXPECT_EQ(storage->checkpoint_dir(7), root_ / "checkpoints" / "job-1" / "chk-7");
  auto dir = storage->init_checkpoint(7);
  ASSERT_TRUE(dir.ok());
  EXPECT_TRUE(fs::is_directory(*dir));
  EXPECT_EQ(storage->init_checkpoint(-1).error().code(), ErrorCode::kConfiguration);
}

TEST_F(CheckpointStorageTest, CheckpointIdOfParsesOnlyChkDirectories) {
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/chk-12"), 12);
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/chk-12/"), 12);
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/chk-"), -1);
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/chk--1"), -1);
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/chk-1x"), -1);
  EXPECT_EQ(FileCheckpointStorage::checkpoint_id_of("/a/shared"), -1);
}

// --- state files ---

TEST_F(CheckpointStorageTest, StateFileLayoutAndChecksum) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  // Key groups 4..9 of 16; 6 and 8 have no bytes.
  FakeKeyedSnapshot keyed({4, 9}, 16, {{4, "four"}, {5, "five!"}, {6, ""}, {7, std::string(3000, 'z')}, {9, "n"}});
  auto handle = storage.write_subtask_state(*dir, "window/agg #1", 3, "OPSTATE", &keyed);
  ASSERT_TRUE(handle.ok()) << handle.error().to_string();

  EXPECT_EQ(handle->subtask, 3);
  EXPECT_TRUE(is_prefix_and_hex(handle->file, "window_agg__1-3-", 8)) << handle->file;
  const std::string bytes = read_file(*dir / handle->file);
  EXPECT_EQ(bytes.size(), handle->file_size);
  EXPECT_EQ(XXH3_64bits(bytes.data(), bytes.size()), handle->checksum);
  EXPECT_EQ(bytes.substr(0, 4), "SLSF");
  EXPECT_EQ(bytes[4], '\x01');
  EXPECT_EQ(handle->operator_state_offset, 5u);
  EXPECT_EQ(bytes.substr(handle->operator_state_offset, handle->operator_state_length), "OPSTATE");
  std::map<int32_t, std::string> stored;
  for (const KeyGroupHandle& kg : handle->key_groups)
    stored[kg.key_group] = bytes.substr(kg.offset, kg.length);
  EXPECT_EQ(stored, (std::map<int32_t, std::string>{{4, "four"}, {5, "five!"}, {7, std::string(3000, 'z')}, {9, "n"}}));
  EXPECT_EQ(handle->key_groups.back().offset + handle->key_groups.back().length, handle->file_size);

  auto read = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ((*read)->view(), bytes);
  EXPECT_TRUE(FileCheckpointStorage::verify_state_file(*dir, *handle).ok());

  // Operator state only.
  auto plain = storage.write_subtask_state(*dir, "src", 0, "", nullptr);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->file_size, 5u);
  EXPECT_EQ(plain->operator_state_length, 0u);
  EXPECT_THAT(plain->key_groups, IsEmpty());
}

TEST_F(CheckpointStorageTest, StateFileChecksFailWithThePathAndReason) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  auto handle = storage.write_subtask_state(*dir, "op", 0, std::string(100, 'x'), nullptr);
  ASSERT_TRUE(handle.ok());
  const fs::path path = *dir / handle->file;
  std::string bytes = read_file(path);

  bytes[50] = 'y';
  write_file(path, bytes);
  Status s = FileCheckpointStorage::verify_state_file(*dir, *handle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kState);
  EXPECT_THAT(s.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(s.error().message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(s.error().message(), HasSubstr(fmt::format("{:016x}", handle->checksum)));
  EXPECT_THAT(s.error().message(), HasSubstr(fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()))));

  write_file(path, bytes.substr(0, 60));
  s = FileCheckpointStorage::verify_state_file(*dir, *handle);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message(), HasSubstr("truncated"));
  EXPECT_THAT(s.error().message(), HasSubstr("105 bytes"));

  fs::remove(path);
  auto r = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(r.error().message(), HasSubstr("missing"));
}

// A state file over the mapping's populate limit (64 MiB) is hashed in windows whose pages are dropped behind the
// hash: the bytes read back whole, and a flipped byte in the last window is found.
TEST_F(CheckpointStorageTest, ALargeStateFileIsReadInWindowsAndItsChecksumStillCovers) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  std::string state(80 << 20, '\0');
  for (size_t i = 0; i < state.size(); i += 4096)
    state[i] = static_cast<char>(i / 4096);
  auto handle = storage.write_subtask_state(*dir, "op", 0, state, nullptr);
  ASSERT_TRUE(handle.ok());
  const fs::path path = *dir / handle->file;
  {
    auto read = FileCheckpointStorage::read_state_file(*dir, *handle);
    ASSERT_TRUE(read.ok()) << read.error().to_string();
    EXPECT_TRUE((*read)->view().substr(handle->operator_state_offset, handle->operator_state_length) == state);
  }

  std::string bytes = read_file(path);
  bytes[bytes.size() - 10] ^= 0x01;
  write_file(path, bytes);
  auto corrupted = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(corrupted.ok());
  EXPECT_THAT(corrupted.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(corrupted.error().message(), HasSubstr("checksum mismatch"));
}

TEST_F(CheckpointStorageTest, SizeChecksReadNothingAndLeaveTheChecksumToTheReader) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  auto handle = storage.write_subtask_state(*dir, "op", 0, std::string(100, 'x'), nullptr);
  ASSERT_TRUE(handle.ok());
  const fs::path path = *dir / handle->file;
  std::string bytes = read_file(path);
  EXPECT_TRUE(FileCheckpointStorage::check_state_file_size(*dir, *handle).ok());

  // A flipped byte keeps the size: the size check passes, the reader's checksum names the file.
  bytes[50] = 'y';
  write_file(path, bytes);
  EXPECT_TRUE(FileCheckpointStorage::check_state_file_size(*dir, *handle).ok());
  auto read = FileCheckpointStorage::read_state_file(*dir, *handle);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(read.error().message(), HasSubstr("checksum mismatch"));

  write_file(path, bytes.substr(0, 60));
  Status s = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kState);
  EXPECT_THAT(s.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(s.error().message(), HasSubstr("is truncated: the metadata records 105 bytes, the stored file has 60"));

  write_file(path, bytes + "more");
  s = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message(), HasSubstr("has an unexpected size"));

  fs::remove(path);
  s = FileCheckpointStorage::check_state_file_size(*dir, *handle);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message(), HasSubstr(path.string()));
  EXPECT_THAT(s.error().message(), HasSubstr("is missing"));
}

TEST_F(CheckpointStorageTest, ConcurrentWritersGetDistinctFiles) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(3);
  ASSERT_TRUE(dir.ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::vector<OperatorSubtaskStateHandle>> handles(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // The same uid and subtask from every thread: names must still be unique.
        FakeKeyedSnapshot keyed({0, 7}, 8, {{t, std::string(100 + i, static_cast<char>('a' + t))}});
        auto h = storage.write_subtask_state(*dir, "same", 0, std::to_string(t * 1000 + i), &keyed);
        if (!h.ok()) {
          ++failures;
          continue;
        }
        handles[static_cast<size_t>(t)].push_back(*h);
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(failures.load(), 0);
  std::set<std::string> names;
  for (const auto& per_thread : handles) {
    for (const auto& h : per_thread) {
      names.insert(h.file);
      EXPECT_TRUE(FileCheckpointStorage::verify_state_file(*dir, h).ok()) << h.file;
    }
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(file_names(*dir).size(), names.size());
}

TEST_F(CheckpointStorageTest, AFailingSnapshotLeavesNoFile) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(1);
  ASSERT_TRUE(dir.ok());
  ThrowingKeyedSnapshot keyed;
  auto h = storage.write_subtask_state(*dir, "counts", 1, "", &keyed);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code(), ErrorCode::kState);
  EXPECT_THAT(h.error().message(), HasSubstr("operator 'counts' subtask 1"));
  EXPECT_THAT(h.error().message(), HasSubstr("state table 'counts' broke"));
  EXPECT_THAT(file_names(*dir), IsEmpty());

  auto missing = storage.write_subtask_state(root_ / "no-such-dir", "op", 0, "x", nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kCheckpoint);
  EXPECT_THAT(missing.error().message(), HasSubstr((root_ / "no-such-dir").string()));
}

// --- finalize, load, list ---

TEST_F(CheckpointStorageTest, FinalizeWritesMetadataAtomically) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(5);
  ASSERT_TRUE(dir.ok());
  FakeKeyedSnapshot keyed({0, 3}, 4, {{1, "one"}, {2, "two"}});
  auto h = storage.write_subtask_state(*dir, "op", 0, "ops", &keyed);
  ASSERT_TRUE(h.ok());
  CheckpointMetadata m;
  m.checkpoint_id = 5;
  m.trigger_timestamp = 1234;
  m.job_id = storage.job_id();
  m.operators.push_back({"op", 1, 4, {*h}});
  m.total_state_bytes = h->file_size;
  ASSERT_TRUE(storage.finalize_checkpoint(*dir, m).ok());

  EXPECT_EQ(file_names(*dir), (std::set<std::string>{"_metadata", h->file}));  // no temporary file left
  auto loaded = FileCheckpointStorage::load_metadata(*dir);
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  EXPECT_EQ(*loaded, m);

  Status again = storage.finalize_checkpoint(*dir, m);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kCheckpoint);
  EXPECT_THAT(again.error().message(), HasSubstr("already exists"));
  EXPECT_EQ(file_names(*dir).size(), 2u);

  // A completed checkpoint id cannot be initialized again.
  auto reinit = storage.init_checkpoint(5);
  ASSERT_FALSE(reinit.ok());
  EXPECT_THAT(reinit.error().message(), HasSubstr("already holds a completed checkpoint"));

  // A finalize that fails (the directory is gone) leaves nothing behind and says where.
  Status gone = storage.finalize_checkpoint(root_ / "gone", m);
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(gone.error().message(), HasSubstr((root_ / "gone").string()));
}

TEST_F(CheckpointStorageTest, LoadMetadataErrorsNameTheFile) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(2);
  ASSERT_TRUE(dir.ok());
  auto missing = FileCheckpointStorage::load_metadata(*dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kState);
  EXPECT_THAT(missing.error().message(), HasSubstr((*dir / "_metadata").string()));
  EXPECT_THAT(missing.error().message(), HasSubstr("missing"));

  fs::path done = completed_checkpoint(storage, 3);
  std::string bytes = read_file(done / "_metadata");
  bytes[10] ^= 0x10;
  write_file(done / "_metadata", bytes);
  auto corrupt = FileCheckpointStorage::load_metadata(done);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.error().message(), HasSubstr((done / "_metadata").string()));
  EXPECT_THAT(corrupt.error().message(), HasSubstr("checksum mismatch"));
}

TEST_F(CheckpointStorageTest, InitCheckpointRemovesAnIncompleteLeftover) {
  FileCheckpointStorage storage = make_storage();
  auto dir = storage.init_checkpoint(4);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(storage.write_subtask_state(*dir, "op", 0, "partial", nullptr).ok());
  auto again = storage.init_checkpoint(4);
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(file_names(*again), IsEmpty());
}

TEST_F(CheckpointStorageTest, CompletedCheckpointsAreSortedById) {
  FileCheckpointStorage storage = make_storage();
  completed_checkpoint(storage, 10);
  completed_checkpoint(storage, 2);
  completed_checkpoint(storage, 1);
  ASSERT_TRUE(storage.init_checkpoint(11).ok());  // incomplete: no _metadata
  fs::create_directories(storage.job_dir() / "chk-x");
  auto list = storage.completed_checkpoints();
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(*list, ElementsAre(storage.checkpoint_dir(1), storage.checkpoint_dir(2), storage.checkpoint_dir(10)));
}

TEST_F(CheckpointStorageTest, CheckpointDirsListsCompleteAndIncompleteOnesById) {
  FileCheckpointStorage storage = make_storage();
  auto none = storage.checkpoint_dirs();  // the job directory may not exist yet
  ASSERT_TRUE(none.ok()) << none.error().to_string();
  completed_checkpoint(storage, 7);
  completed_checkpoint(storage, 2);
  ASSERT_TRUE(storage.init_checkpoint(9).ok());  // incomplete: no _metadata
  fs::create_directories(storage.job_dir() / "chk-x");
  fs::create_directories(storage.job_dir() / "shared");
  auto dirs = storage.checkpoint_dirs();
  ASSERT_TRUE(dirs.ok()) << dirs.error().to_string();
  std::vector<std::tuple<int64_t, fs::path, bool>> got;
  for (const auto& d : *dirs)
    got.emplace_back(d.id, d.path, d.complete);
  EXPECT_THAT(got, ElementsAre(std::make_tuple(int64_t{2}, storage.checkpoint_dir(2), true),
                               std::make_tuple(int64_t{7}, storage.checkpoint_dir(7), true),
                               std::make_tuple(int64_t{9}, storage.checkpoint_dir(9), false)));
}

// --- restore paths ---

TEST_F(CheckpointStorageTest, ResolveRestorePathAcceptsThreeForms) {
  FileCheckpointStorage storage = make_storage();
  fs::path chk2 = completed_checkpoint(storage, 2);
  fs::path chk9 = completed_checkpoint(storage, 9);
  ASSERT_TRUE(storage.init_checkpoint(12).ok());  // newer but incomplete

  // (1) a checkpoint directory, also as a file URI and with a trailing slash
  EXPECT_EQ(*FileCheckpointStorage::resolve_restore_path(chk2.string()), chk2);
  EXPECT_EQ(*FileCheckpointStorage::resolve_restore_path("file://" + chk2.string() + "/"), chk2);
  // (2) its _metadata file
  EXPECT_EQ(*FileCheckpointStorage::resolve_restore_path((chk2 / "_metadata").string()), chk2);
  // (3) the job directory: the newest complete checkpoint
  auto latest = FileCheckpointStorage::resolve_restore_path(storage.job_dir().string());
  ASSERT_TRUE(latest.ok()) << latest.error().to_string();
  EXPECT_EQ(*latest, chk9);
}

TEST_F(CheckpointStorageTest, ResolveRestorePathErrorsNameThePath) {
  FileCheckpointStorage storage = make_storage();
  const fs::path nowhere = root_ / "nowhere";
  auto r = FileCheckpointStorage::resolve_restore_path(nowhere.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCheckpoint);
  EXPECT_THAT(r.error().message(), HasSubstr(nowhere.string()));
  EXPECT_THAT(r.error().message(), HasSubstr("does not exist"));

  ASSERT_TRUE(storage.init_checkpoint(1).ok());  // only an incomplete checkpoint
  r = FileCheckpointStorage::resolve_restore_path(storage.job_dir().string());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr(storage.job_dir().string()));
  EXPECT_THAT(r.error().message(), HasSubstr("no _metadata file and no chk-<n> subdirectory"));
  EXPECT_THAT(r.error().message(), HasSubstr("1 chk-<n> directories without one"));

  write_file(root_ / "notes.txt", "hello");
  r = FileCheckpointStorage::resolve_restore_path((root_ / "notes.txt").string());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr("is a file but not a _metadata file"));

  r = FileCheckpointStorage::resolve_restore_path("gs://bucket/sp");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kConfiguration);
}

// --- savepoints and retention ---

TEST_F(CheckpointStorageTest, SavepointDirectoriesFollowFlinkNaming) {
  FileCheckpointStorage storage = make_storage("a1b2c3d4e5f6");
  auto sp = storage.init_savepoint("file://" + (root_ / "savepoints").string(), 17);
  ASSERT_TRUE(sp.ok()) << sp.error().to_string();
  EXPECT_EQ(sp->parent_path(), root_ / "savepoints");
  EXPECT_TRUE(is_prefix_and_hex(sp->filename().string(), "savepoint-a1b2c3-", 12)) << sp->filename();
  EXPECT_TRUE(fs::is_directory(*sp));
  auto sp2 = storage.init_savepoint((root_ / "savepoints").string(), 18);
  ASSERT_TRUE(sp2.ok());
  EXPECT_NE(*sp, *sp2);

  EXPECT_EQ(storage.init_savepoint("", 1).error().code(), ErrorCode::kConfiguration);
  EXPECT_THAT(storage.init_savepoint("", 1).error().message(), HasSubstr("execution.checkpointing.savepoint-dir"));
  EXPECT_EQ(storage.init_savepoint("gs://b/x", 1).error().code(), ErrorCode::kConfiguration);
  // On S3 a savepoint "directory" is a key prefix: named the same way, nothing created (no request made).
  auto s3 = storage.init_savepoint("s3://b/x/", 19);
  ASSERT_TRUE(s3.ok()) << s3.error().to_string();
  EXPECT_TRUE(is_prefix_and_hex(s3->native(), "s3://b/x/savepoint-a1b2c3-", 12)) << s3->native();
}

TEST_F(CheckpointStorageTest, DiscardRemovesOnlyCheckpointsAndFailedSavepoints) {
  FileCheckpointStorage storage = make_storage();
  fs::path chk = completed_checkpoint(storage, 1);
  storage.discard(chk);
  EXPECT_FALSE(fs::exists(chk));

  // A completed savepoint is never deleted.
  auto sp = storage.init_savepoint((root_ / "sp").string(), 2);
  ASSERT_TRUE(sp.ok());
  ASSERT_TRUE(
      storage.finalize_checkpoint(*sp, CheckpointMetadata{2, 0, SnapshotType::kSavepoint, "j", {}, {}, 0}).ok());
  storage.discard(*sp);
  EXPECT_TRUE(fs::exists(*sp / "_metadata"));

  // A savepoint that failed before its metadata was written may be cleaned up.
  auto failed = storage.init_savepoint((root_ / "sp").string(), 3);
  ASSERT_TRUE(failed.ok());
  storage.discard(*failed);
  EXPECT_FALSE(fs::exists(*failed));

  // Anything else is refused.
  fs::create_directories(root_ / "precious");
  storage.discard(root_ / "precious");
  EXPECT_TRUE(fs::exists(root_ / "precious"));
  storage.discard(root_ / "does-not-exist" / "chk-1");  // never throws
}

TEST_F(CheckpointStorageTest, RetentionDeletesOlderCheckpointsButNotSavepoints) {
  FileCheckpointStorage storage = make_storage();
  CompletedCheckpointStore store(2, storage);
  EXPECT_EQ(store.latest(), nullptr);
  auto add = [&](int64_t id, SnapshotType type = SnapshotType::kCheckpoint) {
    fs::path dir;
    if (type == SnapshotType::kCheckpoint) {
      dir = completed_checkpoint(storage, id);
    } else {
      auto sp = storage.init_savepoint((root_ / "savepoints").string(), id);
      EXPECT_TRUE(sp.ok());
      dir = *sp;
      EXPECT_TRUE(storage.finalize_checkpoint(dir, CheckpointMetadata{id, 0, type, storage.job_id(), {}, {}, 0}).ok());
    }
    auto metadata = FileCheckpointStorage::load_metadata(dir);
    EXPECT_TRUE(metadata.ok());
    store.add(CompletedCheckpoint{id, dir, *metadata});
    return dir;
  };
  fs::path c1 = add(1);
  fs::path c2 = add(2);
  fs::path s3 = add(3, SnapshotType::kSavepoint);
  EXPECT_FALSE(fs::exists(c1));  // subsumed by 2 and 3
  EXPECT_TRUE(fs::exists(c2));
  fs::path c4 = add(4);
  EXPECT_FALSE(fs::exists(c2));
  fs::path c5 = add(5);
  EXPECT_TRUE(fs::exists(s3 / "_metadata"));  // subsumed, but a savepoint stays on disk
  EXPECT_TRUE(fs::exists(c4));
  EXPECT_TRUE(fs::exists(c5));

  ASSERT_NE(store.latest(), nullptr);
  EXPECT_EQ(store.latest()->id, 5);
  auto all = store.all();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]->id, 5);
  EXPECT_EQ(all[1]->id, 4);
  EXPECT_EQ(store.size(), 2u);
  auto on_disk = storage.completed_checkpoints();
  ASSERT_TRUE(on_disk.ok());
  EXPECT_THAT(*on_disk, ElementsAre(c4, c5));

  CompletedCheckpointStore at_least_one(0, storage);
  EXPECT_EQ(at_least_one.num_retained(), 1);
}

}  // namespace
}  // namespace sluice
