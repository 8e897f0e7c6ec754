#include "sluice/cluster/ha/ha_options.h"

#include <fmt/format.h>

#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/core/assign_or_return.h"

namespace sluice::ha {

bool is_ha_option(std::string_view key) {
  return key == options::kHaType.key || key == options::kEtcdEndpoints.key || key == options::kClusterId.key ||
         key == options::kLeaseTtl.key;
}

Result<HaOptions> HaOptions::from_configuration(const Configuration& config) {
  HaOptions out;
  std::string type;
  std::string cluster_id;
  int64_t ttl_ms = 0;
  try {
    type = config.get(options::kHaType);
    cluster_id = config.get(options::kClusterId);
    ttl_ms = config.get(options::kLeaseTtl);
  } catch (const SluiceException& e) {
    return e.error();
  }
  if (type == "none" || type == "NONE") return out;
  if (type != "etcd") {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: '{}' is not supported (none or etcd; Kubernetes and ZooKeeper HA are not built)",
                             options::kHaType.key, type));
  }
  out.enabled = true;
  SLUICE_ASSIGN_OR_RETURN(auto endpoints, parse_etcd_endpoints(config.get(options::kEtcdEndpoints)));
  out.endpoints = std::move(endpoints);
  if (cluster_id.empty() || cluster_id.find('/') != std::string::npos) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: '{}' must be a non-empty name without '/'", options::kClusterId.key, cluster_id));
  }
  out.cluster_id = std::move(cluster_id);
  if (ttl_ms < 1000 || ttl_ms % 1000 != 0) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: {} ms is not a whole number of seconds of at least 1s (etcd leases count seconds)",
                             options::kLeaseTtl.key, ttl_ms));
  }
  out.lease_ttl = std::chrono::seconds(ttl_ms / 1000);
  return out;
}

}  // namespace sluice::ha
