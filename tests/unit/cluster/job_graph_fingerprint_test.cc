// The job graph fingerprint: equal for two builds of the same job, different when an operator's uid,
// parallelism, partitioner or chaining differs.
#include "sluice/cluster/job_graph_fingerprint.h"

#include <gtest/gtest.h>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "test_util/collect_sink.h"

namespace sluice {
namespace {

using testing::CollectedRecords;
using testing::CollectSink;

struct Variant {
  int parallelism = 2;
  int map_parallelism = -1;
  std::string uid = "doubler";
  bool rebalance = false;
  bool disable_chaining = false;
};

std::string fingerprint(const Variant& v, int* slots = nullptr) {
  StreamEnvironment env;
  env.set_parallelism(v.parallelism);
  auto src = env.from_source(datagen::sequence(0, 9), "n").uid("numbers");
  auto double_it = [](int64_t x) { return 2 * x; };
  auto mapped = v.rebalance ? src.rebalance().map(double_it).uid(v.uid)
                            : src.key_by([](int64_t x) { return x % 3; }).map(double_it).uid(v.uid);
  if (v.map_parallelism > 0) mapped.set_parallelism(v.map_parallelism);
  if (v.disable_chaining) mapped.disable_chaining();
  mapped.sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>())).uid("out");
  auto fp = fingerprint_job_graph(env.stream_graph());
  EXPECT_TRUE(fp.ok()) << fp.error().to_string();
  if (!fp.ok()) return "";
  if (slots != nullptr) *slots = fp->required_slots;
  EXPECT_EQ(fp->hex.size(), 32u);
  EXPECT_NE(fp->canonical.find("operator " + v.uid + " parallelism="), std::string::npos) << fp->canonical;
  return fp->hex;
}

TEST(JobGraphFingerprintTest, SameJobSameFingerprint) {
  int slots = 0;
  const std::string a = fingerprint({}, &slots);
  EXPECT_EQ(a, fingerprint({}));
  EXPECT_EQ(slots, 2);
}

TEST(JobGraphFingerprintTest, ShapeChangesChangeIt) {
  const std::string base = fingerprint({});
  EXPECT_NE(base, fingerprint({.parallelism = 3}));
  EXPECT_NE(base, fingerprint({.map_parallelism = 4}));
  EXPECT_NE(base, fingerprint({.uid = "tripler"}));
  EXPECT_NE(base, fingerprint({.rebalance = true}));
  EXPECT_NE(base, fingerprint({.disable_chaining = true}));
}

TEST(JobGraphFingerprintTest, LeavesTheGraphAsItIs) {
  StreamEnvironment env;
  env.from_source(datagen::sequence(0, 9), "n")
      .map([](int64_t x) { return x; })
      .sink_to(std::make_shared<CollectSink<int64_t>>(std::make_shared<CollectedRecords<int64_t>>()));
  ASSERT_TRUE(fingerprint_job_graph(env.stream_graph()).ok());
  for (const auto& n : env.stream_graph().nodes())
    EXPECT_TRUE(n.derived_uid.empty()) << "the fingerprint filled a derived uid of the user's graph";
}

}  // namespace
}  // namespace sluice
