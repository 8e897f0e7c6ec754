// HA options and etcd endpoint parsing (no etcd needed; the etcd behaviour is tested in integration/ha/).
#include "sluice/cluster/ha/ha_options.h"

#include <gtest/gtest.h>

#include "sluice/cluster/ha/etcd_client.h"

namespace sluice::ha {
namespace {

TEST(HaOptionsTest, NoneByDefault) {
  auto o = HaOptions::from_configuration(Configuration{});
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->enabled);
}

TEST(HaOptionsTest, EtcdWithEndpointsClusterIdAndTtl) {
  Configuration c;
  c.set_string("high-availability.type", "etcd");
  c.set_string("high-availability.etcd.endpoints", "http://10.0.0.1:2379, 10.0.0.2:2379/");
  c.set_string("high-availability.cluster-id", "payments");
  c.set_string("high-availability.etcd.lease-ttl", "4s");
  auto o = HaOptions::from_configuration(c);
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_TRUE(o->enabled);
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}));
  EXPECT_EQ(o->cluster_id, "payments");
  EXPECT_EQ(o->lease_ttl, std::chrono::seconds(4));
  EXPECT_EQ(HaKeys(o->cluster_id).leader(), "/sluice/payments/leader");
  EXPECT_EQ(HaKeys(o->cluster_id).job_checkpoint("j"), "/sluice/payments/jobs/j/checkpoint");
  EXPECT_TRUE(is_ha_option("high-availability.etcd.lease-ttl"));
  EXPECT_FALSE(is_ha_option("high-availability.storageDir"));
}

TEST(HaOptionsTest, BadValuesAreRefusedNamingTheKey) {
  auto refused = [](std::initializer_list<std::pair<const char*, const char*>> kv, const std::string& key) {
    Configuration c;
    for (auto [k, v] : kv)
      c.set_string(k, v);
    auto o = HaOptions::from_configuration(c);
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.error().code(), ErrorCode::kConfiguration);
    EXPECT_NE(o.error().message().find(key), std::string::npos) << o.error().message();
  };
  refused({{"high-availability.type", "zookeeper"}}, "high-availability.type");
  refused({{"high-availability.type", "etcd"}}, "high-availability.etcd.endpoints");
  refused({{"high-availability.type", "etcd"}, {"high-availability.etcd.endpoints", "https://a:2379"}},
          "high-availability.etcd.endpoints");
  refused({{"high-availability.type", "etcd"},
           {"high-availability.etcd.endpoints", "a:1"},
           {"high-availability.cluster-id", "a/b"}},
          "high-availability.cluster-id");
  refused({{"high-availability.type", "etcd"},
           {"high-availability.etcd.endpoints", "a:1"},
           {"high-availability.etcd.lease-ttl", "1500ms"}},
          "high-availability.etcd.lease-ttl");
  refused({{"high-availability.type", "etcd"},
           {"high-availability.etcd.endpoints", "a:1"},
           {"high-availability.etcd.lease-ttl", "soon"}},
          "high-availability.etcd.lease-ttl");
}

}  // namespace
}  // namespace sluice::ha
