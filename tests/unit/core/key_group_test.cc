#include "sluice/core/key_group.h"

#include <gtest/gtest.h>

#include <string>

#include "sluice/core/data_io.h"
#include "sluice/core/type_serializer.h"

namespace sluice {
namespace {

TEST(KeyGroupTest, RangesPartitionAllKeyGroupsLikeFlink) {
  for (int maxp : {1, 7, 128, 1000}) {
    for (int p = 1; p <= std::min(maxp, 9); ++p) {
      int next = 0;
      for (int i = 0; i < p; ++i) {
        KeyGroupRange r = KeyGroupRange::for_operator_index(maxp, p, i);
        EXPECT_EQ(r.start(), next) << "maxp=" << maxp << " p=" << p << " i=" << i;
        for (int kg = r.start(); kg <= r.end(); ++kg) {
          EXPECT_EQ(operator_index_for_key_group(maxp, p, KeyGroup{kg}), i);
        }
        next = r.end() + 1;
      }
      EXPECT_EQ(next, maxp);
    }
  }
}

TEST(KeyGroupTest, FlinkReferenceValues) {
  // Flink: computeKeyGroupRangeForOperatorIndex(128, 3, i) = [0,42], [43,85], [86,127].
  EXPECT_EQ(KeyGroupRange::for_operator_index(128, 3, 0), KeyGroupRange(0, 42));
  EXPECT_EQ(KeyGroupRange::for_operator_index(128, 3, 1), KeyGroupRange(43, 85));
  EXPECT_EQ(KeyGroupRange::for_operator_index(128, 3, 2), KeyGroupRange(86, 127));
}

TEST(KeyGroupTest, HashIsStableAcrossVersions) {
  // These values are part of the checkpoint format: they must never change.
  DataOutput out;
  serialize(std::string("customer-42"), out);
  EXPECT_EQ(key_hash(out.bytes()), key_hash(out.bytes()));
  const uint8_t empty[1] = {0};
  EXPECT_EQ(key_hash(std::span<const uint8_t>(empty, 0)), 0x2D06800538D394C2ULL);  // XXH3_64bits("")
}

}  // namespace
}  // namespace sluice
