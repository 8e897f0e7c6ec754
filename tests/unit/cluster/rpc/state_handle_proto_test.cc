// The state handle crosses AcknowledgeCheckpoint whole: a handle with every field set comes back equal (but for
// `location`, which the JobManager sets itself), and names that would reach outside the checkpoint's or the shared
// directory are refused.
#include "sluice/cluster/rpc/state_handle_proto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::rpc {
namespace {

using ::testing::HasSubstr;

// Every field of OperatorSubtaskStateHandle set to a value other than its default; a field added to the handle
// belongs here too.
OperatorSubtaskStateHandle full_handle() {
  OperatorSubtaskStateHandle h;
  h.subtask = 3;
  h.file = "keyed-3-0123456789abcdef";
  h.file_size = 1'000'000;
  h.checksum = 0x96d942cd3d146702ULL;
  h.operator_state_offset = 900'000;
  h.operator_state_length = 1'234;
  h.key_groups = {{7, 16, 100}, {9, 116, 200'000}};
  NativeKeyedStateHandle n;
  n.key_group_start = 64;
  n.key_group_end = 95;
  n.files = {{"000012.sst", "0a1b2c-000012.sst", 0, 65'536, 0x1122334455667788ULL},
             {"MANIFEST-000005", "", 200'116, 512, 0},
             {"CURRENT", "", 200'628, 16, 0}};
  h.native = std::move(n);
  h.location = "127.0.0.1:35409-2b5010";
  return h;
}

TEST(StateHandleProtoTest, EveryFieldButTheLocationRoundTrips) {
  const OperatorSubtaskStateHandle h = full_handle();
  cluster::v1::StateHandle sh;
  to_proto(h, &sh);
  // Through the bytes, as on the wire.
  cluster::v1::StateHandle received;
  ASSERT_TRUE(received.ParseFromString(sh.SerializeAsString()));
  Result<OperatorSubtaskStateHandle> back = from_proto(received);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->location, "") << "the location is the JobManager's to set";
  OperatorSubtaskStateHandle expected = h;
  expected.location.clear();
  EXPECT_EQ(*back, expected);
  ASSERT_TRUE(back->native.has_value());
  EXPECT_EQ(back->native->files.size(), 3u);
}

TEST(StateHandleProtoTest, AHandleWithoutNativeStateStaysWithout) {
  OperatorSubtaskStateHandle h = full_handle();
  h.native.reset();
  h.location.clear();
  cluster::v1::StateHandle sh;
  to_proto(h, &sh);
  EXPECT_FALSE(sh.has_native());
  Result<OperatorSubtaskStateHandle> back = from_proto(sh);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, h);
}

TEST(StateHandleProtoTest, NamesOutsideTheirDirectoryAreRefused) {
  for (const char* file : {"", "../state", "a/b", ".in-progress", "..", "."}) {
    OperatorSubtaskStateHandle h = full_handle();
    h.file = file;
    cluster::v1::StateHandle sh;
    to_proto(h, &sh);
    Result<OperatorSubtaskStateHandle> back = from_proto(sh);
    ASSERT_FALSE(back.ok()) << "'" << file << "' was accepted";
    EXPECT_EQ(back.error().code(), ErrorCode::kConfiguration);
    EXPECT_THAT(back.error().message(), HasSubstr("is not a file name in the checkpoint's directory"));
  }
  for (const auto& [local, shared] : std::vector<std::pair<std::string, std::string>>{
           {"000012.sst", "../../etc/passwd"}, {"000012.sst", "x/y.sst"}, {"", "a.sst"}, {"..", ""}}) {
    OperatorSubtaskStateHandle h = full_handle();
    h.native->files[0].local_name = local;
    h.native->files[0].shared_name = shared;
    cluster::v1::StateHandle sh;
    to_proto(h, &sh);
    Result<OperatorSubtaskStateHandle> back = from_proto(sh);
    ASSERT_FALSE(back.ok()) << "'" << local << "' / '" << shared << "' was accepted";
    EXPECT_THAT(back.error().message(), HasSubstr("is not a plain file name"));
  }
}

}  // namespace
}  // namespace sluice::rpc
