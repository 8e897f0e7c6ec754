// EtcdLeaderElection: JobManager leader election on etcd (Flink's LeaderElectionService with etcd in place of
// ZooKeeper or a Kubernetes ConfigMap), and read_leader(), what a TaskManager or standby reads to find the leader.
//
// The recipe is etcd's own (its concurrency.Election): a contender grants a lease of `lease_ttl` and keeps it alive
// from a thread of its own (a renewal every TTL/3); it campaigns with a transaction "if the leader key does not
// exist, create it with my address, attached to my lease". The first to commit leads. The key's create revision and
// the lease id are the leader's **epoch** (LeaderEpoch): unique per term and increasing from one term to the next.
// A leader that stops renewing (killed, paused longer than the TTL, cut off) loses the lease; etcd then deletes the
// key and the next contender's transaction wins. No consensus is written here: etcd decides who committed first.
//
// Fencing: being elected is not proof of still leading when a write lands (a paused process cannot tell that its
// lease expired). Every write a leader makes goes through EtcdHaStore, whose transactions compare the leader key's
// create revision and lease with the writer's epoch, so etcd refuses the write of a former leader.
//
// Lifecycle: created -> campaign() (blocks until elected, cancelled or the deadline) -> leading -> lost (the lease
// expired or the key is no longer ours; on_lost runs once on the keep-alive thread) or resign(). campaign() may be
// called again after a loss (with a new lease). The destructor resigns and joins the keep-alive thread.
// Thread-safety: is_leader(), epoch(), wait_lost(), cancel() from any thread; campaign() and resign() from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/core/error.h"

namespace sluice::ha {

/// A leader's term: the create revision of the leader key (unique and increasing per term) and the lease it is
/// attached to. What fencing compares.
struct LeaderEpoch {
  int64_t create_revision = 0;
  int64_t lease_id = 0;
  friend bool operator==(const LeaderEpoch&, const LeaderEpoch&) = default;
};

/// The current leader as etcd records it: its published address and its epoch.
struct LeaderInfo {
  std::string address;
  LeaderEpoch epoch;
};

/// Reads the leader key: the leader, or nullopt when there is none at the moment (between terms).
Result<std::optional<LeaderInfo>> read_leader(EtcdClient& client, std::string_view leader_key);

struct LeaderElectionOptions {
  /// The key the leader holds, e.g. HaKeys::leader() = "/sluice/<cluster-id>/leader".
  std::string leader_key;
  /// What the leader publishes (a JobManager's gRPC address, host:port).
  std::string address;
  /// The lease's TTL: a dead or paused leader is replaced this long after its last renewal.
  std::chrono::seconds lease_ttl{10};
  /// How often a standby tries again while another contender leads.
  std::chrono::milliseconds retry_interval{200};
  /// Called once on the keep-alive thread when leadership is lost (not on resign()); must not block long.
  std::function<void(const std::string& reason)> on_lost;
};

class EtcdLeaderElection {
 public:
  /// `client` must outlive the election.
  EtcdLeaderElection(EtcdClient& client, LeaderElectionOptions options);
  ~EtcdLeaderElection();
  EtcdLeaderElection(const EtcdLeaderElection&) = delete;
  EtcdLeaderElection& operator=(const EtcdLeaderElection&) = delete;

  /// Campaigns until elected (returns the epoch), until `timeout` passes or cancel() is called (returns nullopt).
  /// etcd errors are retried until the deadline (a member restart, a lost quorum for a moment); the last one is
  /// returned if the deadline passes while etcd cannot be reached.
  Result<std::optional<LeaderEpoch>> campaign(std::chrono::milliseconds timeout);

  /// True while this contender leads as far as it can tell: elected, not lost, and the lease renewed less than a
  /// TTL ago (measured from when the renewal was sent). Advisory: writes are fenced by etcd, not by this.
  bool is_leader() const;
  /// The epoch of the current term, or nullopt when not leading.
  std::optional<LeaderEpoch> epoch() const;
  /// Waits until leadership is lost (true) or `timeout` passes (false).
  bool wait_lost(std::chrono::milliseconds timeout);
  /// Why leadership was lost ("" while leading or never elected).
  std::string lost_reason() const;

  /// Stops a campaign() in progress (from another thread).
  void cancel();
  /// Gives up leadership: deletes the leader key if it is still ours and revokes the lease (standbys win at once).
  Status resign();

 private:
  void keep_alive_loop(int64_t lease_id, std::chrono::steady_clock::time_point granted_at);
  void mark_lost(const std::string& reason);
  void stop_keep_alive();
  Status ensure_lease();

  EtcdClient& client_;
  LeaderElectionOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t lease_id_ = 0;                                // guarded by mu_: the lease of this contender (0: none)
  bool lease_lost_ = false;                             // guarded by mu_: the current lease is gone
  std::optional<LeaderEpoch> epoch_;                    // guarded by mu_: set while leading
  std::chrono::steady_clock::time_point renewed_sent_;  // guarded by mu_: when the last good renewal was sent
  std::string lost_reason_;                             // guarded by mu_
  bool stop_ = false;                                   // guarded by mu_: ends the keep-alive thread
  std::atomic<bool> cancelled_{false};
  std::thread keep_alive_;
};

}  // namespace sluice::ha
