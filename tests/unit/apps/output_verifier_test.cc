// The checks of `sluice verify` (apps/sluice/output_verifier.h) on hand-made outputs: clean, duplicated, gapped,
// reordered, unreadable. The command itself runs on real outputs in integration/cli_verify_test.cc.
#include "output_verifier.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice::cli {
namespace {

std::string rec(const std::string& id, const std::string& key, int64_t seq) {
  return "{\"event_id\":\"" + id + "\",\"payload\":{\"account\":\"" + key + "\",\"seq\":" + std::to_string(seq) + "}}";
}

VerifyFields fields() {
  return VerifyFields{"event_id", "payload.account", "payload.seq", std::nullopt, std::nullopt};
}

TEST(OutputVerifierTest, ACleanOutputHasNoViolation) {
  OutputVerifier v(fields());
  for (int s = 1; s <= 5; ++s) {
    v.add(rec("a" + std::to_string(s), "a", s), "t/0@" + std::to_string(s));
    v.add(rec("b" + std::to_string(s), "b", s), "t/1@" + std::to_string(s));
  }
  const VerifyReport r = v.report();
  EXPECT_EQ(r.records, 10);
  EXPECT_EQ(r.keys, 2);
  EXPECT_EQ(r.distinct_ids, 10);
  EXPECT_EQ(r.duplicated + r.missing + r.out_of_order + r.unreadable, 0);
  EXPECT_FALSE(r.violated(false));
}

TEST(OutputVerifierTest, DuplicatesGapsAndReorderingAreCountedAndNamed) {
  OutputVerifier v(fields());
  v.add(rec("a1", "a", 1), "f:1");
  v.add(rec("a2", "a", 2), "f:2");
  v.add(rec("a2", "a", 2), "f:3");  // duplicate (a replay)
  v.add(rec("a5", "a", 5), "f:4");  // 3 and 4 missing
  v.add(rec("b2", "b", 2), "f:5");
  v.add(rec("b1", "b", 1), "f:6");  // out of order
  const VerifyReport r = v.report();
  EXPECT_EQ(r.records, 6);
  EXPECT_EQ(r.duplicated, 1);
  EXPECT_EQ(r.missing, 2);
  EXPECT_EQ(r.keys_with_gaps, 1);
  EXPECT_EQ(r.out_of_order, 1) << "a replayed duplicate is not also counted out of order";
  EXPECT_TRUE(r.violated(false));
  EXPECT_TRUE(r.violated(true)) << "gaps violate at-least-once too";
  std::string all;
  for (const auto& e : r.examples)
    all += e + "\n";
  EXPECT_NE(all.find("duplicate at f:3"), std::string::npos) << all;
  EXPECT_NE(all.find("out of order at f:6: key b seq 1 after seq 2"), std::string::npos) << all;
  EXPECT_NE(all.find("key a: 2 of seq 1..5 missing, first: 3, 4"), std::string::npos) << all;
}

TEST(OutputVerifierTest, DuplicatesAloneAreAllowedForAtLeastOnce) {
  OutputVerifier v(fields());
  v.add(rec("a1", "a", 1), "x");
  v.add(rec("a1", "a", 1), "y");
  const VerifyReport r = v.report();
  EXPECT_EQ(r.duplicated, 1);
  EXPECT_TRUE(r.violated(false));
  EXPECT_FALSE(r.violated(true));
}

TEST(OutputVerifierTest, SeqStartAndEndFindLossAtTheEdges) {
  VerifyFields f = fields();
  f.seq_start = 1;
  f.seq_end = 4;
  OutputVerifier v(f);
  v.add(rec("a2", "a", 2), "x");
  v.add(rec("a3", "a", 3), "y");
  const VerifyReport r = v.report();
  EXPECT_EQ(r.missing, 2) << "seq 1 and 4 of key a";
}

TEST(OutputVerifierTest, WithoutAnIdFieldKeyAndSeqIdentifyAnEvent) {
  OutputVerifier v(VerifyFields{"", "k", "s", std::nullopt, std::nullopt});
  v.add(R"({"k":7,"s":"1"})", "x");
  v.add(R"({"k":7,"s":"1"})", "y");
  v.add(R"({"k":7,"s":2})", "z");
  const VerifyReport r = v.report();
  EXPECT_EQ(r.duplicated, 1);
  EXPECT_EQ(r.missing, 0);
  EXPECT_EQ(r.keys, 1);
}

TEST(OutputVerifierTest, UnreadableRecordsAreViolationsNamingWhere) {
  OutputVerifier v(fields());
  v.add("not json", "part-0-0:3");
  v.add(R"({"event_id":"x","payload":{"account":"a"}})", "part-0-0:4");
  v.add(R"({"event_id":"y","payload":{"account":"a","seq":"abc"}})", "part-0-0:5");
  const VerifyReport r = v.report();
  EXPECT_EQ(r.unreadable, 3);
  EXPECT_TRUE(r.violated(true));
  ASSERT_EQ(r.examples.size(), 3U);
  EXPECT_NE(r.examples[0].find("part-0-0:3"), std::string::npos);
  EXPECT_NE(r.examples[1].find("no sequence field 'payload.seq'"), std::string::npos) << r.examples[1];
}

}  // namespace
}  // namespace sluice::cli
