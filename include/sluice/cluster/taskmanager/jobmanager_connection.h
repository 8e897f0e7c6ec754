// JobManagerConnection: a TaskManager's view of its JobManager (Flink's TaskExecutor registration with
// retries and its heartbeat monitor of the JobManager). A thread-free state machine: time comes in as
// `now_ms` arguments from the TaskManager's injected Clock, and the caller performs the RPCs it asks for, so
// tests drive it with a ManualClock.
//
//   kRegistering --registered--> kRegistered --JobManager lost / registration unknown--> kRegistering
//        |                            (no heartbeat reply for heartbeat.timeout: the JobManager is
//        |                             declared lost; a NOT_FOUND reply: this registration is stale)
//        +--refused (graph or build differs)--> kRefused (terminal: the process exits non-zero)
//
// Registration attempts back off after each failure: initial, 2x initial, ... up to the maximum, reset by a
// successful registration. Heartbeats are sent every heartbeat.interval; the JobManager is declared lost
// when heartbeat.timeout has passed since the last successful reply (or since the registration) and a
// heartbeat sent within the last interval before that failed: a TaskManager that was itself paused past the
// timeout (SIGSTOP) sends one heartbeat first, and a NOT_FOUND answer tells it that its registration is stale.
//
// Thread-safety: not thread-safe; one thread (the TaskExecutor's) owns it.
#pragma once

#include <cstdint>
#include <string>

#include "sluice/cluster/cluster_options.h"
#include "sluice/core/clock.h"

namespace sluice {

class JobManagerConnection {
 public:
  enum class State { kRegistering, kRegistered, kRefused };

  /// What the owner should do next.
  struct Action {
    enum class Kind { kRegister, kHeartbeat, kWait, kStop } kind = Kind::kWait;
    TimestampMs wait_until_ms = 0;  ///< kWait: call next_action() again at this time (or on an event)
    int64_t deadline_ms = 0;        ///< kRegister / kHeartbeat: the RPC's deadline, ms from now (>= 1;
                                    ///< a heartbeat's is at most one interval)
  };

  JobManagerConnection(HeartbeatOptions heartbeat, RegistrationBackoff backoff);

  /// The next step at `now_ms`; first call check_jobmanager(now_ms).
  Action next_action(TimestampMs now_ms) const;

  /// Registered: `registration_id` from the JobManager `jobmanager_id`, which may impose its own heartbeat
  /// settings (values <= 0 keep ours).
  void on_registered(std::string registration_id, std::string jobmanager_id, HeartbeatOptions jobmanager_heartbeat,
                     TimestampMs now_ms);
  /// A registration attempt failed for a transient reason (JobManager unreachable, timed out): the next
  /// attempt waits the backoff. Returns that wait in ms.
  int64_t on_registration_failed(TimestampMs now_ms);
  /// The JobManager refused this TaskManager for good (its job graph or build differs): kRefused.
  void on_refused();
  /// A heartbeat reply came from the JobManager.
  void on_heartbeat_ok(TimestampMs now_ms);
  /// The heartbeat sent at `sent_ms` got no reply (unreachable, timed out): the next one goes one interval
  /// after it; the JobManager is declared lost only once heartbeat.timeout passes without a reply. The send
  /// time counts (not the failure's): a call that was in flight while this process was paused observed
  /// nothing.
  void on_heartbeat_failed(TimestampMs sent_ms);
  /// Something the JobManager should know at once changed (a source lost or regained its connection): when
  /// registered, the next heartbeat is due at `now_ms` instead of one interval after the last.
  void heartbeat_now(TimestampMs now_ms);
  /// The JobManager does not know this registration (it declared this TaskManager lost, or restarted):
  /// register again at once, as a new registration.
  void on_registration_unknown(TimestampMs now_ms);
  /// This TaskManager cancelled its tasks on its own (no heartbeat reply for heartbeat.timeout): register again at
  /// once, as a new registration, so that the JobManager, which may still count on those tasks (its answers were
  /// only late), closes the old registration and fails the job over instead of waiting on tasks that are gone.
  void on_tasks_fenced(TimestampMs now_ms);

  /// Declares the JobManager lost when registered, heartbeat.timeout or more has passed since the last reply
  /// and a heartbeat failed in the last interval before that; returns true when it did so now (the state is
  /// kRegistering again).
  bool check_jobmanager(TimestampMs now_ms);

  State state() const { return state_; }
  const std::string& registration_id() const { return registration_id_; }
  const std::string& jobmanager_id() const { return jobmanager_id_; }
  const HeartbeatOptions& heartbeat() const { return heartbeat_; }
  /// Failed attempts since the last successful registration.
  int failed_attempts() const { return failed_attempts_; }
  /// How often the JobManager was declared lost, and registrations so far.
  int jobmanager_losses() const { return losses_; }
  int registrations() const { return registrations_; }
  TimestampMs last_reply_ms() const { return last_reply_ms_; }

 private:
  void reregister(TimestampMs now_ms);

  const HeartbeatOptions own_heartbeat_;
  HeartbeatOptions heartbeat_;
  RegistrationBackoff backoff_;
  State state_ = State::kRegistering;
  std::string registration_id_;
  std::string jobmanager_id_;
  TimestampMs next_attempt_ms_ = 0;
  TimestampMs next_heartbeat_ms_ = 0;
  TimestampMs last_reply_ms_ = 0;
  TimestampMs last_failure_ms_ = 0;  ///< the latest failed heartbeat since the registration
  int failed_attempts_ = 0;
  int losses_ = 0;
  int registrations_ = 0;
};

}  // namespace sluice
