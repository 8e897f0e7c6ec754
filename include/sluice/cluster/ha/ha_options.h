// High-availability options (Flink's keys where Flink has them) and the etcd key layout of one Sluice cluster.
//
//   high-availability.type             none (default) | etcd
//   high-availability.etcd.endpoints   etcd client URLs, comma-separated (http://host:2379,...)
//   high-availability.cluster-id       separates clusters sharing one etcd (default "default")
//   high-availability.etcd.lease-ttl   the leader's lease TTL (default 10s; whole seconds, at least 1s)
//
// Keys, all under /sluice/<cluster-id>/: `leader` (the leader's address, attached to its lease),
// `jobs/<job-id>/graph`, `jobs/<job-id>/status`, `jobs/<job-id>/checkpoint` (EtcdHaStore). Thread-free values.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/config.h"
#include "sluice/core/error.h"

namespace sluice::ha {

namespace options {
inline const ConfigOption<std::string> kHaType{"high-availability.type", "none",
                                               "High availability of the JobManager: none or etcd."};
inline const ConfigOption<std::string> kEtcdEndpoints{
    "high-availability.etcd.endpoints", "",
    "etcd client URLs, comma-separated (http://host:2379,http://host2:2379); required with type etcd."};
inline const ConfigOption<std::string> kClusterId{
    "high-availability.cluster-id", "default",
    "Name of this Sluice cluster in etcd; clusters sharing an etcd need different ids."};
inline const ConfigOption<int64_t> kLeaseTtl{
    "high-availability.etcd.lease-ttl", 10'000,
    "TTL of the leader's etcd lease: a dead or paused leader is replaced this long after its last renewal "
    "(whole seconds, at least 1s).",
    OptionUnit::kDuration};
}  // namespace options

/// True for the keys above (so option checks do not call them typos).
bool is_ha_option(std::string_view key);

/// The HA options of one process, validated.
struct HaOptions {
  bool enabled = false;  ///< high-availability.type: etcd
  std::vector<std::string> endpoints;
  std::string cluster_id = "default";
  std::chrono::seconds lease_ttl{10};

  /// Reads and checks the options: kConfiguration naming the key for an unknown type, etcd without endpoints, a
  /// cluster id with '/' or empty, a TTL below 1 s or not whole seconds.
  [[nodiscard]] static Result<HaOptions> from_configuration(const Configuration& config);
};

/// The etcd keys of one cluster id.
class HaKeys {
 public:
  explicit HaKeys(std::string cluster_id) : root_("/sluice/" + std::move(cluster_id) + "/") {}
  const std::string& root() const { return root_; }
  std::string leader() const { return root_ + "leader"; }
  std::string jobs_prefix() const { return root_ + "jobs/"; }
  std::string job_graph(std::string_view job_id) const { return jobs_prefix() + std::string(job_id) + "/graph"; }
  std::string job_status(std::string_view job_id) const { return jobs_prefix() + std::string(job_id) + "/status"; }
  std::string job_checkpoint(std::string_view job_id) const {
    return jobs_prefix() + std::string(job_id) + "/checkpoint";
  }
  /// The number of the job's latest deployment attempt (every leader's attempts continue from it).
  std::string job_attempt(std::string_view job_id) const { return jobs_prefix() + std::string(job_id) + "/attempt"; }

 private:
  std::string root_;
};

}  // namespace sluice::ha
