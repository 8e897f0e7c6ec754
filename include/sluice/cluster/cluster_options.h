// The options of cluster mode (Flink's keys): heartbeats, the JobManager's RPC address, registration backoff.
// docs/cluster.md and docs/configuration.md describe them; `sluice jobmanager` / `sluice taskmanager` read
// them from -D flags.
//
// Heartbeat defaults are chosen for fast detection of a lost process: a heartbeat every second and a peer
// declared lost after 5 s without one. Flink's defaults (10 s / 50 s) cover JVM garbage-collection pauses of
// tens of seconds; a Sluice process has no garbage collector, so its pauses are scheduling delays on a loaded
// machine (well below a second here), and every second of timeout is a second of a lost TaskManager's
// tasks not running (issue 21 targets recovery within the timeout + 2 s). 5 s leaves four missed heartbeats
// of margin against delays before a live TaskManager is declared lost.
#pragma once

#include <cstdint>
#include <string>

#include "sluice/core/config.h"
#include "sluice/core/error.h"

namespace sluice {
namespace options {
inline const ConfigOption<int64_t> kHeartbeatInterval{
    "heartbeat.interval", 1000, "Time between heartbeats of a TaskManager to its JobManager (ms or 1s, 500ms).",
    OptionUnit::kDuration};
inline const ConfigOption<int64_t> kHeartbeatTimeout{
    "heartbeat.timeout", 5000,
    "A TaskManager without a heartbeat for this long is declared lost by the JobManager; a JobManager whose "
    "heartbeat replies stop for this long is declared lost by the TaskManager, which registers again.",
    OptionUnit::kDuration};
inline const ConfigOption<std::string> kJobManagerRpcAddress{
    "jobmanager.rpc.address", "127.0.0.1", "Address the JobManager's RPC service binds to (sluice jobmanager)."};
inline const ConfigOption<int32_t> kJobManagerRpcPort{
    "jobmanager.rpc.port", 6123, "Port of the JobManager's RPC service; 0 picks a free port (printed at start)."};
inline const ConfigOption<std::string> kTaskManagerRpcAddress{
    "taskmanager.host", "127.0.0.1", "Address the TaskManager's RPC service binds to and registers with."};
inline const ConfigOption<int32_t> kTaskManagerRpcPort{"taskmanager.rpc.port", 0,
                                                       "Port of the TaskManager's RPC service; 0 picks a free port."};
inline const ConfigOption<int64_t> kRegistrationInitialBackoff{
    "cluster.registration.initial-timeout", 100,
    "Wait after a TaskManager's first failed registration attempt; doubles per failed attempt.", OptionUnit::kDuration};
inline const ConfigOption<int64_t> kRegistrationMaxBackoff{
    "cluster.registration.max-timeout", 5000, "Longest wait between a TaskManager's registration attempts.",
    OptionUnit::kDuration};
inline const ConfigOption<int32_t> kTaskManagerDataPort{
    "taskmanager.data.port", 0,
    "Port of the TaskManager's data plane (TCP between TaskManagers); 0 picks a free port (sent to the JobManager "
    "at registration)."};
inline const ConfigOption<int64_t> kSlotRequestTimeout{
    "slot.request.timeout", 300000,
    "How long the JobManager waits for enough TaskManager slots before the job fails, naming what it needs and "
    "what registered.",
    OptionUnit::kDuration};
inline const ConfigOption<bool> kEvenlySpreadOutSlots{
    "cluster.evenly-spread-out-slots", false,
    "Spread the job's slots over the TaskManagers in turn instead of filling one TaskManager's slots first."};
}  // namespace options

/// Heartbeat settings of one side of a connection.
struct HeartbeatOptions {
  int64_t interval_ms = 1000;  ///< heartbeat.interval; >= 1
  int64_t timeout_ms = 5000;   ///< heartbeat.timeout; > interval_ms
};

/// A TaskManager's registration retries: waits double from initial_ms to max_ms.
struct RegistrationBackoff {
  int64_t initial_ms = 100;  ///< >= 1
  int64_t max_ms = 5000;     ///< >= initial_ms
};

/// Reads heartbeat.interval and heartbeat.timeout. Errors (kConfiguration, naming the key): a value that does
/// not parse, an interval < 1 ms, or a timeout not above the interval.
[[nodiscard]] Result<HeartbeatOptions> heartbeat_options(const Configuration& config);

/// Reads cluster.registration.initial-timeout and max-timeout. Errors (kConfiguration): as above.
[[nodiscard]] Result<RegistrationBackoff> registration_backoff(const Configuration& config);

/// Whether `key` is one of the cluster options above (the CLI keeps them apart from the job's options).
bool is_cluster_option(std::string_view key);

}  // namespace sluice
