#include "sluice/cluster/ha/leader_election.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "sluice/core/assign_or_return.h"

namespace sluice::ha {

using Clock = std::chrono::steady_clock;

Result<std::optional<LeaderInfo>> read_leader(EtcdClient& client, std::string_view leader_key) {
  SLUICE_ASSIGN_OR_RETURN(auto kv, client.get(leader_key));
  if (!kv.has_value()) return std::optional<LeaderInfo>();
  LeaderInfo info;
  info.address = kv->value;
  info.epoch = LeaderEpoch{kv->create_revision, kv->lease};
  return std::optional<LeaderInfo>(std::move(info));
}

EtcdLeaderElection::EtcdLeaderElection(EtcdClient& client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {}

EtcdLeaderElection::~EtcdLeaderElection() {
  cancel();
  auto st = resign();
  if (!st.ok())
    spdlog::warn("leader election on {}: resign at shutdown failed: {}", options_.leader_key, st.error().to_string());
}

void EtcdLeaderElection::cancel() {
  cancelled_.store(true);
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

void EtcdLeaderElection::stop_keep_alive() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  std::lock_guard lock(mu_);
  stop_ = false;
}

Status EtcdLeaderElection::ensure_lease() {
  {
    std::lock_guard lock(mu_);
    if (lease_id_ != 0 && !lease_lost_) return ok_status();
  }
  stop_keep_alive();
  const auto sent = Clock::now();
  SLUICE_ASSIGN_OR_RETURN(auto lease, client_.grant_lease(options_.lease_ttl));
  {
    std::lock_guard lock(mu_);
    lease_id_ = lease.id;
    lease_lost_ = false;
    renewed_sent_ = sent;
  }
  keep_alive_ = std::thread([this, id = lease.id, sent] { keep_alive_loop(id, sent); });
  return ok_status();
}

Result<std::optional<LeaderEpoch>> EtcdLeaderElection::campaign(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::optional<Error> last_error;
  while (!cancelled_.load()) {
    auto st = ensure_lease();
    if (st.ok()) {
      int64_t lease;
      {
        std::lock_guard lock(mu_);
        lease = lease_id_;
      }
      const std::string& key = options_.leader_key;
      auto r = client_.txn({EtcdCompare{key, EtcdCompare::Target::kCreateRevision, EtcdCompare::Op::kEqual, 0, {}}},
                           {EtcdOp::put(key, options_.address, lease), EtcdOp::range(key)}, {EtcdOp::range(key)});
      if (r.ok()) {
        const std::vector<EtcdKeyValue>& found = r->succeeded ? r->ranges.at(1) : r->ranges.at(0);
        // Ours also when an earlier attempt of this campaign committed but its answer was lost (same lease).
        if (!found.empty() && found.front().lease == lease) {
          std::lock_guard lock(mu_);
          if (lease_lost_) continue;  // expired meanwhile: the key goes with it; campaign with a new lease
          epoch_ = LeaderEpoch{found.front().create_revision, lease};
          lost_reason_.clear();
          spdlog::info("leader election on {}: elected with epoch {} (lease {:x}), publishing '{}'", key,
                       epoch_->create_revision, lease, options_.address);
          return epoch_;
        }
        last_error.reset();
      } else {
        last_error = r.error();
      }
    } else {
      last_error = st.error();
    }
    if (Clock::now() >= deadline) break;
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, std::min(deadline, Clock::now() + options_.retry_interval), [&] { return cancelled_.load(); });
  }
  if (last_error && !cancelled_.load()) {
    return last_error->with_context(fmt::format("campaigning for {} on etcd", options_.leader_key));
  }
  return std::optional<LeaderEpoch>();
}

void EtcdLeaderElection::keep_alive_loop(int64_t lease_id, Clock::time_point granted_at) {
  const auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(options_.lease_ttl);
  const auto interval = std::max(std::chrono::milliseconds(100), ttl / 3);
  auto next = granted_at + interval;
  while (true) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_until(lock, next, [&] { return stop_; })) return;
    }
    const auto sent = Clock::now();
    auto remaining = client_.keep_alive_once(lease_id);
    if (remaining.ok() && *remaining > 0) {
      std::optional<LeaderEpoch> epoch;
      {
        std::lock_guard lock(mu_);
        renewed_sent_ = sent;
        epoch = epoch_;
      }
      next = sent + interval;
      if (epoch) {
        // The key can go while the lease lives (deleted by an operator): leading means holding the key too.
        auto leader = read_leader(client_, options_.leader_key);
        if (leader.ok() && (!leader->has_value() || (*leader)->epoch != *epoch)) {
          mark_lost(fmt::format("the leader key {} is no longer ours (epoch {})", options_.leader_key,
                                epoch->create_revision));
        }
      }
      continue;
    }
    Clock::time_point last_renewal;
    {
      std::lock_guard lock(mu_);
      last_renewal = renewed_sent_;
    }
    if (remaining.ok()) {  // TTL 0: etcd no longer knows the lease (expired while this process was paused or cut off)
      {
        std::lock_guard lock(mu_);
        lease_lost_ = true;
      }
      mark_lost(fmt::format("lease {:x} expired (last renewal {} ms ago, TTL {} s)", lease_id,
                            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_renewal).count(),
                            options_.lease_ttl.count()));
      return;
    }
    if (Clock::now() - last_renewal >= ttl) {
      {
        std::lock_guard lock(mu_);
        lease_lost_ = true;
      }
      mark_lost(fmt::format("lease {:x} could not be renewed within its TTL of {} s: {}", lease_id,
                            options_.lease_ttl.count(), remaining.error().to_string()));
      return;
    }
    next = Clock::now() + std::chrono::milliseconds(100);  // an endpoint failed: retry soon, within the TTL
  }
}

void EtcdLeaderElection::mark_lost(const std::string& reason) {
  bool was_leader = false;
  {
    std::lock_guard lock(mu_);
    was_leader = epoch_.has_value();
    epoch_.reset();
    if (was_leader) lost_reason_ = reason;
    cv_.notify_all();
  }
  if (!was_leader) return;
  spdlog::warn("leader election on {}: leadership lost: {}", options_.leader_key, reason);
  if (options_.on_lost) options_.on_lost(reason);
}

bool EtcdLeaderElection::is_leader() const {
  std::lock_guard lock(mu_);
  return epoch_.has_value() && !lease_lost_ && Clock::now() < renewed_sent_ + options_.lease_ttl;
}

std::optional<LeaderEpoch> EtcdLeaderElection::epoch() const {
  std::lock_guard lock(mu_);
  return epoch_;
}

bool EtcdLeaderElection::wait_lost(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return !epoch_.has_value() && !lost_reason_.empty(); });
}

std::string EtcdLeaderElection::lost_reason() const {
  std::lock_guard lock(mu_);
  return lost_reason_;
}

Status EtcdLeaderElection::resign() {
  stop_keep_alive();
  std::optional<LeaderEpoch> epoch;
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    epoch = epoch_;
    epoch_.reset();
    lease = lease_id_;
    lease_id_ = 0;
  }
  Status result;
  if (epoch) {
    auto r = client_.txn({EtcdCompare{options_.leader_key,
                                      EtcdCompare::Target::kCreateRevision,
                                      EtcdCompare::Op::kEqual,
                                      epoch->create_revision,
                                      {}}},
                         {EtcdOp::remove(options_.leader_key)}, {});
    if (!r.ok()) result = r.error();
  }
  if (lease != 0) {
    auto st = client_.revoke_lease(lease);
    if (!st.ok() && result.ok()) result = st;
  }
  return result;
}

}  // namespace sluice::ha
