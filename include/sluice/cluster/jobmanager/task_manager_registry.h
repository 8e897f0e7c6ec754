// TaskManagerRegistry: the JobManager's record of registered TaskManagers, their slots and heartbeats (the
// part of Flink's ResourceManager that tracks TaskExecutors, with its HeartbeatManager). A thread-free state
// machine: time comes in as `now_ms` arguments (from the JobManager's injected Clock), so tests drive it with
// a ManualClock and see a TaskManager declared lost exactly when heartbeat.timeout has passed.
//
// Protocol (docs/cluster.md, proto/sluice/cluster/v1/jobmanager.proto):
//  * register_task_manager() checks the TaskManager built the same job graph (fingerprint) with the same
//    Sluice build and creates a NEW registration with a fresh id, also for a resource id seen before (the old
//    registration of that resource id is closed first: the process restarted or re-registered after it
//    declared this JobManager lost).
//  * heartbeat() of a registration refreshes its last-heartbeat time and its free-slot count; a registration
//    id that is unknown (never issued, declared lost, replaced, disconnected) is refused: such a TaskManager
//    must register again and comes back as a new registration, so a stale identity never revives old slots.
//  * check_heartbeats(now) declares lost every registration whose last heartbeat is heartbeat.timeout or
//    more before `now` and removes it with its slots.
//
// Thread-safety: not thread-safe; the owner (JobManagerServer) serialises calls with its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/cluster/cluster_options.h"
#include "sluice/cluster/job_graph_fingerprint.h"
#include "sluice/core/clock.h"
#include "sluice/core/error.h"

namespace sluice {

/// What a TaskManager sends to register.
struct TaskManagerRegistrationRequest {
  std::string resource_id;   ///< stable for the TaskManager process ("host:port-<random>")
  std::string rpc_address;   ///< host:port of its TaskManagerService
  std::string data_address;  ///< host:port of its data plane; "" until the data plane is wired
  std::string hostname;
  int64_t pid = 0;
  int32_t slots = 0;  ///< taskmanager.numberOfTaskSlots; >= 1
  JobGraphIdentity job;
};

/// One live registration.
struct TaskManagerRegistration {
  std::string registration_id;  ///< new for every registration
  std::string resource_id;
  std::string rpc_address;
  std::string data_address;
  std::string hostname;
  int64_t pid = 0;
  int32_t slots_total = 0;
  int32_t slots_free = 0;  ///< as the TaskManager's latest slot report says
  TimestampMs registered_ms = 0;
  TimestampMs last_heartbeat_ms = 0;  ///< the registration counts as the first heartbeat
};

/// A registration that ended, and why.
struct ClosedRegistration {
  TaskManagerRegistration registration;
  std::string reason;  ///< "no heartbeat for 5000 ms (heartbeat.timeout 5000 ms)", "disconnected: ...", ...
  TimestampMs closed_ms = 0;
};

/// Slots over every live registration.
struct SlotSummary {
  int task_managers = 0;
  int slots_total = 0;
  int slots_free = 0;
};

/// How a heartbeat was received.
enum class HeartbeatVerdict {
  kAccepted,
  kUnknownRegistration,  ///< never issued, or closed (lost, replaced, disconnected): register again
  kInvalid,              ///< a malformed slot report (free slots outside 0..total)
};

class TaskManagerRegistry {
 public:
  /// `jobmanager_id` prefixes registration ids; `expected` is the JobManager's own job identity.
  TaskManagerRegistry(HeartbeatOptions heartbeat, JobGraphIdentity expected, std::string jobmanager_id);

  /// Creates a new registration (see the file comment). Errors: kGraph when the job graph fingerprint or the
  /// build version differs, naming both fingerprints, both versions and the job names; kConfiguration for a
  /// malformed request (empty resource id or address, slots < 1). `replaced` receives the closed earlier
  /// registration of the same resource id, if any.
  [[nodiscard]] Result<TaskManagerRegistration> register_task_manager(const TaskManagerRegistrationRequest& request,
                                                                      TimestampMs now_ms,
                                                                      std::optional<ClosedRegistration>* replaced);

  /// Records a heartbeat carrying the TaskManager's free slot count. `message` receives why a heartbeat was
  /// not accepted (for an unknown id: when and why it was closed, if this registry closed it).
  HeartbeatVerdict heartbeat(const std::string& registration_id, int32_t slots_free, TimestampMs now_ms,
                             std::string* message);

  /// Closes a registration at the TaskManager's request; false when it is unknown.
  bool disconnect(const std::string& registration_id, const std::string& reason, TimestampMs now_ms);

  /// Declares lost and removes every registration whose last heartbeat is at least heartbeat.timeout before
  /// `now_ms`; returns them (oldest heartbeat first).
  std::vector<ClosedRegistration> check_heartbeats(TimestampMs now_ms);

  /// The earliest time a registration can be declared lost (its last heartbeat + timeout), or the maximum
  /// TimestampMs when none is registered.
  TimestampMs next_timeout_ms() const;

  /// Live registrations, in registration order.
  std::vector<TaskManagerRegistration> task_managers() const;
  SlotSummary slots() const;
  /// The latest closed registrations, newest last (at most kClosedHistory).
  const std::deque<ClosedRegistration>& closed() const { return closed_; }

  const HeartbeatOptions& heartbeat_options() const { return heartbeat_; }
  const JobGraphIdentity& expected() const { return expected_; }

  static constexpr size_t kClosedHistory = 64;

 private:
  void close(std::map<std::string, TaskManagerRegistration>::iterator it, std::string reason, TimestampMs now_ms,
             ClosedRegistration* out);

  HeartbeatOptions heartbeat_;
  JobGraphIdentity expected_;
  std::string jobmanager_id_;
  uint64_t next_number_ = 1;
  std::map<std::string, TaskManagerRegistration> by_id_;  // by registration id
  std::vector<std::string> order_;                        // registration ids in registration order
  std::deque<ClosedRegistration> closed_;
};

}  // namespace sluice
