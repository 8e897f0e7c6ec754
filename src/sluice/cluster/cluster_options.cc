#include "sluice/cluster/cluster_options.h"

#include <fmt/format.h>

#include <array>

namespace sluice {

Result<HeartbeatOptions> heartbeat_options(const Configuration& config) {
  HeartbeatOptions h;
  try {
    h.interval_ms = config.get(options::kHeartbeatInterval);
    h.timeout_ms = config.get(options::kHeartbeatTimeout);
  } catch (const SluiceException& e) {
    return e.error();
  }
  if (h.interval_ms < 1) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} = {} ms; it must be at least 1 ms", options::kHeartbeatInterval.key, h.interval_ms));
  }
  if (h.timeout_ms <= h.interval_ms) {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("{} = {} ms must be above {} = {} ms (a peer is declared lost after missing several "
                    "heartbeats)",
                    options::kHeartbeatTimeout.key, h.timeout_ms, options::kHeartbeatInterval.key, h.interval_ms));
  }
  return h;
}

Result<RegistrationBackoff> registration_backoff(const Configuration& config) {
  RegistrationBackoff b;
  try {
    b.initial_ms = config.get(options::kRegistrationInitialBackoff);
    b.max_ms = config.get(options::kRegistrationMaxBackoff);
  } catch (const SluiceException& e) {
    return e.error();
  }
  if (b.initial_ms < 1) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} = {} ms; it must be at least 1 ms",
                                                        options::kRegistrationInitialBackoff.key, b.initial_ms));
  }
  if (b.max_ms < b.initial_ms) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} = {} ms is below {} = {} ms", options::kRegistrationMaxBackoff.key, b.max_ms,
                             options::kRegistrationInitialBackoff.key, b.initial_ms));
  }
  return b;
}

bool is_cluster_option(std::string_view key) {
  static const std::array<std::string_view, 11> keys = {
      options::kHeartbeatInterval.key,          options::kHeartbeatTimeout.key,
      options::kJobManagerRpcAddress.key,       options::kJobManagerRpcPort.key,
      options::kTaskManagerRpcAddress.key,      options::kTaskManagerRpcPort.key,
      options::kRegistrationInitialBackoff.key, options::kRegistrationMaxBackoff.key,
      options::kTaskManagerDataPort.key,        options::kSlotRequestTimeout.key,
      options::kEvenlySpreadOutSlots.key};
  for (auto k : keys) {
    if (k == key) return true;
  }
  return false;
}

}  // namespace sluice
