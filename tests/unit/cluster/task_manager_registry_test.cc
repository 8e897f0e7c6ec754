// TaskManagerRegistry, the JobManager's thread-free record of TaskManagers, slots and heartbeats, driven by a
// ManualClock: a TaskManager is declared lost exactly when heartbeat.timeout has passed since its last
// heartbeat, a stale registration is refused, and a job graph that differs is refused naming both sides.
#include "sluice/cluster/jobmanager/task_manager_registry.h"

#include <gtest/gtest.h>

#include "sluice/core/clock.h"

namespace sluice {
namespace {

constexpr HeartbeatOptions kHeartbeat{1000, 5000};
const JobGraphIdentity kJob{"00112233445566778899aabbccddeeff", "orders", "0.1.0"};

TaskManagerRegistrationRequest request(std::string resource_id, int slots, JobGraphIdentity job = kJob) {
  TaskManagerRegistrationRequest r;
  r.resource_id = std::move(resource_id);
  r.rpc_address = "127.0.0.1:7000";
  r.slots = slots;
  r.job = std::move(job);
  return r;
}

TEST(TaskManagerRegistryTest, CountsSlotsOfEveryRegistration) {
  ManualClock clock(1'000'000);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  auto a = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  auto b = reg.register_task_manager(request("tm-b", 4), clock.now_ms(), nullptr);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->registration_id, b->registration_id);
  EXPECT_EQ(a->registration_id.rfind("jm1-", 0), 0u);
  SlotSummary s = reg.slots();
  EXPECT_EQ(s.task_managers, 2);
  EXPECT_EQ(s.slots_total, 6);
  EXPECT_EQ(s.slots_free, 6);
  std::string message;
  EXPECT_EQ(reg.heartbeat(b->registration_id, 1, clock.now_ms(), &message), HeartbeatVerdict::kAccepted);
  EXPECT_EQ(reg.slots().slots_free, 3);
  EXPECT_EQ(reg.heartbeat(b->registration_id, 5, clock.now_ms(), &message), HeartbeatVerdict::kInvalid);
  EXPECT_NE(message.find("5 free slots of 4"), std::string::npos) << message;
  ASSERT_EQ(reg.task_managers().size(), 2u);
  EXPECT_EQ(reg.task_managers()[0].resource_id, "tm-a");
}

TEST(TaskManagerRegistryTest, DeclaresLostExactlyAtHeartbeatTimeout) {
  ManualClock clock(1'000'000);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  auto a = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reg.next_timeout_ms(), 1'000'000 + 5000);
  clock.advance(3000);
  ASSERT_EQ(reg.heartbeat(a->registration_id, 2, clock.now_ms(), nullptr), HeartbeatVerdict::kAccepted);
  EXPECT_EQ(reg.next_timeout_ms(), 1'003'000 + 5000);
  clock.advance(4999);
  EXPECT_TRUE(reg.check_heartbeats(clock.now_ms()).empty()) << "lost 1 ms before heartbeat.timeout";
  EXPECT_EQ(reg.slots().task_managers, 1);
  clock.advance(1);
  std::vector<ClosedRegistration> lost = reg.check_heartbeats(clock.now_ms());
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].registration.resource_id, "tm-a");
  EXPECT_EQ(lost[0].closed_ms, 1'008'000);
  EXPECT_NE(lost[0].reason.find("no heartbeat for 5000 ms"), std::string::npos) << lost[0].reason;
  SlotSummary s = reg.slots();
  EXPECT_EQ(s.task_managers, 0);
  EXPECT_EQ(s.slots_total, 0);
  EXPECT_EQ(reg.next_timeout_ms(), std::numeric_limits<TimestampMs>::max());
  EXPECT_TRUE(reg.check_heartbeats(clock.now_ms() + 100'000).empty());
}

TEST(TaskManagerRegistryTest, StaleRegistrationIsRefusedAndComesBackAsANewOne) {
  ManualClock clock(0);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  auto first = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  ASSERT_TRUE(first.ok());
  clock.advance(5000);
  ASSERT_EQ(reg.check_heartbeats(clock.now_ms()).size(), 1u);
  // The TaskManager wakes up (SIGCONT) and sends a heartbeat with its old registration.
  std::string message;
  EXPECT_EQ(reg.heartbeat(first->registration_id, 2, clock.now_ms(), &message), HeartbeatVerdict::kUnknownRegistration);
  EXPECT_NE(message.find(first->registration_id), std::string::npos) << message;
  EXPECT_NE(message.find("no heartbeat for 5000 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("register again"), std::string::npos) << message;
  EXPECT_EQ(reg.slots().task_managers, 0) << "a stale heartbeat revived slots";
  auto second = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->registration_id, first->registration_id);
  EXPECT_EQ(reg.heartbeat(first->registration_id, 2, clock.now_ms(), nullptr), HeartbeatVerdict::kUnknownRegistration);
  EXPECT_EQ(reg.heartbeat(second->registration_id, 2, clock.now_ms(), nullptr), HeartbeatVerdict::kAccepted);
  EXPECT_EQ(reg.heartbeat("never-issued", 2, clock.now_ms(), &message), HeartbeatVerdict::kUnknownRegistration);
  EXPECT_NE(message.find("not known"), std::string::npos) << message;
}

TEST(TaskManagerRegistryTest, ReRegistrationOfALiveResourceIdClosesTheOldOne) {
  ManualClock clock(0);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  auto first = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  ASSERT_TRUE(first.ok());
  std::optional<ClosedRegistration> replaced;
  auto second = reg.register_task_manager(request("tm-a", 3), clock.now_ms(), &replaced);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ(replaced->registration.registration_id, first->registration_id);
  EXPECT_EQ(reg.slots().task_managers, 1);
  EXPECT_EQ(reg.slots().slots_total, 3);
  EXPECT_EQ(reg.heartbeat(first->registration_id, 2, clock.now_ms(), nullptr), HeartbeatVerdict::kUnknownRegistration);
}

TEST(TaskManagerRegistryTest, RefusesADifferentJobGraphNamingBothFingerprintsAndVersions) {
  ManualClock clock(0);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  JobGraphIdentity other{"ffeeddccbbaa99887766554433221100", "orders-v2", "0.1.0"};
  auto r = reg.register_task_manager(request("tm-a", 2, other), clock.now_ms(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kGraph);
  const std::string& m = r.error().message();
  EXPECT_NE(m.find(kJob.fingerprint), std::string::npos) << m;
  EXPECT_NE(m.find(other.fingerprint), std::string::npos) << m;
  EXPECT_NE(m.find("'orders'"), std::string::npos) << m;
  EXPECT_NE(m.find("'orders-v2'"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice 0.1.0"), std::string::npos) << m;
  EXPECT_EQ(reg.slots().task_managers, 0);

  JobGraphIdentity other_build = kJob;
  other_build.build_version = "0.2.0";
  r = reg.register_task_manager(request("tm-b", 2, other_build), clock.now_ms(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("sluice 0.2.0"), std::string::npos) << r.error().message();

  r = reg.register_task_manager(request("tm-c", 0), clock.now_ms(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kConfiguration);
  EXPECT_EQ(reg.slots().task_managers, 0);
}

// The same graph from another pipeline file is refused naming both digests; a side without a digest (a job built by
// code) is not compared.
TEST(TaskManagerRegistryTest, RefusesAnotherPipelineFileOfTheSameGraph) {
  ManualClock clock(0);
  JobGraphIdentity job = kJob;
  job.pipeline_digest = digest_pipeline_text("sink: { out: { type: kafka, topic: orders } }\n");
  TaskManagerRegistry reg(kHeartbeat, job, "jm1");
  JobGraphIdentity other = job;
  other.pipeline_digest = digest_pipeline_text("sink: { out: { type: kafka, topic: orders-2 } }\n");
  ASSERT_EQ(other.pipeline_digest.size(), 32u);
  ASSERT_NE(other.pipeline_digest, job.pipeline_digest);
  auto r = reg.register_task_manager(request("tm-a", 2, other), clock.now_ms(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kGraph);
  EXPECT_NE(r.error().message().find("pipeline digest " + job.pipeline_digest), std::string::npos);
  EXPECT_NE(r.error().message().find("pipeline digest " + other.pipeline_digest), std::string::npos);
  EXPECT_TRUE(reg.register_task_manager(request("tm-b", 2, job), clock.now_ms(), nullptr).ok());
  EXPECT_TRUE(reg.register_task_manager(request("tm-c", 2, kJob), clock.now_ms(), nullptr).ok()) << "no digest";
  EXPECT_EQ(reg.slots().task_managers, 2);
}

TEST(TaskManagerRegistryTest, DisconnectFreesSlotsAtOnce) {
  ManualClock clock(0);
  TaskManagerRegistry reg(kHeartbeat, kJob, "jm1");
  auto a = reg.register_task_manager(request("tm-a", 2), clock.now_ms(), nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(reg.disconnect(a->registration_id, "shutdown", clock.now_ms()));
  EXPECT_FALSE(reg.disconnect(a->registration_id, "shutdown", clock.now_ms()));
  EXPECT_EQ(reg.slots().slots_total, 0);
  ASSERT_FALSE(reg.closed().empty());
  EXPECT_EQ(reg.closed().back().reason, "disconnected: shutdown");
}

}  // namespace
}  // namespace sluice
