// A JobManager stand-in for etcd_ha_test: campaigns for leadership of a cluster id, and once elected writes the HA
// store's latest-checkpoint pointer every --write-interval-ms with the epoch it was elected with, without asking
// whether it still leads (as a process that was paused cannot know), so etcd's fencing is what stops a former
// leader. Prints one line per event on stdout (flushed):
//   ELECTED <create_revision> <lease_hex> <first_checkpoint_id>   APPLIED <id>   FENCED <id>
//   WRITE-ERROR <id> <error>   LOST <reason>
// After FENCED it waits until its election notices the loss, prints LOST, and campaigns again.
// Usage: etcd_ha_contender ENDPOINTS CLUSTER_ID ADDRESS TTL_S WRITE_INTERVAL_MS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_store.h"
#include "sluice/cluster/ha/leader_election.h"

using namespace sluice::ha;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ENDPOINTS CLUSTER_ID ADDRESS TTL_S WRITE_INTERVAL_MS\n", argv[0]);
    return 2;
  }
  auto endpoints = parse_etcd_endpoints(argv[1]);
  if (!endpoints.ok()) {
    std::fprintf(stderr, "%s\n", endpoints.error().to_string().c_str());
    return 2;
  }
  auto client = EtcdClient::create(
      EtcdClientOptions{*endpoints, std::chrono::milliseconds(1500), std::chrono::milliseconds(500)});
  if (!client.ok()) return 2;
  const HaKeys keys(argv[2]);
  EtcdHaStore store(**client, keys);
  LeaderElectionOptions options;
  options.leader_key = keys.leader();
  options.address = argv[3];
  options.lease_ttl = std::chrono::seconds(std::atoi(argv[4]));
  options.retry_interval = std::chrono::milliseconds(100);
  const auto write_interval = std::chrono::milliseconds(std::atoi(argv[5]));
  EtcdLeaderElection election(**client, options);
  const std::string job = "job-1";
  while (true) {
    auto epoch = election.campaign(std::chrono::hours(1));
    if (!epoch.ok()) {
      std::printf("CAMPAIGN-ERROR %s\n", epoch.error().to_string().c_str());
      std::fflush(stdout);
      continue;
    }
    if (!epoch->has_value()) return 1;
    // A new leader resumes after the latest completed checkpoint, as a JobManager restores from it.
    int64_t next = 1;
    auto latest = store.latest_checkpoint(job);
    if (latest.ok() && latest->has_value()) next = (*latest)->checkpoint_id + 1;
    std::printf("ELECTED %lld %llx %lld\n", static_cast<long long>((*epoch)->create_revision),
                static_cast<unsigned long long>((*epoch)->lease_id), static_cast<long long>(next));
    std::fflush(stdout);
    while (true) {
      CheckpointPointer p;
      p.checkpoint_id = next;
      p.external_path = "file:///tmp/ckpt/" + job + "/chk-" + std::to_string(next);
      p.completed_at_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      auto w = store.set_latest_checkpoint(**epoch, job, p);
      if (!w.ok()) {
        std::printf("WRITE-ERROR %lld %s\n", static_cast<long long>(next), w.error().to_string().c_str());
      } else if (*w == FencedWrite::kApplied) {
        std::printf("APPLIED %lld\n", static_cast<long long>(next));
        ++next;
      } else {
        std::printf("FENCED %lld\n", static_cast<long long>(next));
        std::fflush(stdout);
        while (!election.wait_lost(std::chrono::seconds(1))) {
        }
        std::printf("LOST %s\n", election.lost_reason().c_str());
        std::fflush(stdout);
        break;
      }
      std::fflush(stdout);
      std::this_thread::sleep_for(write_interval);  // the pace of a checkpoint interval
    }
  }
}
