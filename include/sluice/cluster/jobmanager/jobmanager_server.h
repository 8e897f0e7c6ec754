// JobManagerServer: the JobManager's control plane — the gRPC JobManagerService that TaskManagers register
// with and send heartbeats to (proto/sluice/cluster/v1/jobmanager.proto), over a TaskManagerRegistry, and a
// heartbeat monitor that declares a TaskManager lost once heartbeat.timeout has passed without a heartbeat.
//
// Task deployment itself is the JobMaster's (job_master.h): the server passes the TaskManagers' task state
// updates (UpdateTaskExecutionState) and every closed registration (lost, replaced, disconnected) to the
// JobEvents set on it, and so are the tasks' checkpoint acknowledgements and declines. Heartbeats also carry the
// connections of the source readers each TaskManager runs (source_connections(), for /health). Not yet: OfferSlots
// answers UNIMPLEMENTED with a message saying so.
//
// Lifecycle: start() binds and serves (gRPC's threads) and starts the monitor thread; stop() (or the
// destructor) stops both and waits for calls in flight. Threading: every member function is thread-safe; the
// registry is guarded by one mutex, held only for registry calls (never during I/O). Time comes from the
// injected Clock; check_heartbeats() lets a test with a ManualClock run the monitor's check itself.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/cluster/cluster_options.h"
#include "sluice/cluster/jobmanager/task_manager_registry.h"
#include "sluice/cluster/source_connection_report.h"
#include "sluice/cluster/source_lag_report.h"
#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/runtime/task.h"

namespace sluice {

/// A task's state change as a TaskManager reported it.
struct TaskStateReport {
  std::string registration_id;
  int vertex = 0;
  int subtask = 0;
  int attempt = 0;
  TaskState state = TaskState::kRunning;
  std::optional<Error> error;             ///< for kFailed: the task's error (its code's name and text)
  bool end_of_input = false;              ///< kRunning: the task consumed its input and waits for a final checkpoint
  std::optional<SubtaskMetrics> metrics;  ///< with a final state: the task's counters at its end
};

/// A task's acknowledgement (its state files written, with their handles) or decline of a checkpoint.
struct CheckpointAckReport {
  std::string registration_id;
  int vertex = 0;
  int subtask = 0;
  int attempt = 0;
  int64_t checkpoint_id = 0;
  std::string task_name;
  bool declined = false;
  std::string reason;                               ///< declined: why
  std::vector<std::string> uids;                    ///< per handle: the operator's uid
  std::vector<OperatorSubtaskStateHandle> handles;  ///< file names relative to the checkpoint's directory
  int64_t alignment_ns = 0;
  int64_t sync_pause_ns = 0;
  bool finished_input = false;
};

/// What the job master hears from the control plane (called on gRPC or monitor threads, without the server's
/// lock held).
class JobEvents {
 public:
  virtual ~JobEvents() = default;
  virtual void on_task_state(const TaskStateReport& report) = 0;
  /// A registration ended: the TaskManager was lost (no heartbeat), replaced (it registered again) or
  /// disconnected.
  virtual void on_task_manager_closed(const ClosedRegistration& closed) = 0;
  /// A task acknowledged or declined a checkpoint (AcknowledgeCheckpoint / DeclineCheckpoint).
  virtual void on_checkpoint_ack(CheckpointAckReport&& /*report*/) {}
  /// An accepted heartbeat's counters of the tasks running on that TaskManager.
  virtual void on_subtask_metrics(std::vector<SubtaskMetrics>&& /*metrics*/) {}
};

/// A source reader subtask's connection as the latest heartbeat of the TaskManager running it reported it.
struct ReportedSourceConnection {
  std::string task_manager;     ///< the TaskManager's resource id
  std::string registration_id;  ///< its registration
  /// As reported; a disconnection's `disconnected_ms` is grown by the time since that heartbeat arrived.
  SourceConnectionReport connection;
};

/// A source's lag as the latest heartbeat of a TaskManager running its readers reported it.
struct ReportedSourceLag {
  std::string task_manager;     ///< the TaskManager's resource id
  std::string registration_id;  ///< its registration
  SourceLagReport lag;          ///< as reported (measured when that heartbeat was sent)
};

struct JobManagerServerOptions {
  std::string address = "127.0.0.1";  ///< jobmanager.rpc.address
  int port = 0;                       ///< jobmanager.rpc.port; 0 = a free port (see port())
  HeartbeatOptions heartbeat;
  JobGraphIdentity job;
  /// Runs the heartbeat monitor thread (a test driving a ManualClock turns it off and calls
  /// check_heartbeats()).
  bool monitor_thread = true;
};

class JobManagerServer {
 public:
  /// Called (without the server's lock held, on a gRPC or the monitor thread) after every change of the
  /// registered TaskManagers: registered, lost, replaced, disconnected.
  using Listener = std::function<void(const SlotSummary&)>;

  /// Binds address:port and starts serving. Errors: kNetwork when the port cannot be bound (naming it).
  [[nodiscard]] static Result<std::unique_ptr<JobManagerServer>> start(JobManagerServerOptions options,
                                                                       const Clock& clock);
  ~JobManagerServer();
  JobManagerServer(const JobManagerServer&) = delete;
  JobManagerServer& operator=(const JobManagerServer&) = delete;

  /// "host:port" TaskManagers connect to (the real port when started with 0).
  std::string target() const;
  int port() const;
  /// This run's identity (random per process start; registration ids start with it).
  const std::string& jobmanager_id() const;

  std::vector<TaskManagerRegistration> task_managers() const;
  SlotSummary slots() const;
  /// The source connections the live registrations reported with their latest heartbeat (each heartbeat
  /// replaces its TaskManager's; a closed registration's are forgotten with it), by TaskManager in registration
  /// order. The server logs each reader's loss (warn) and recovery (info) as they arrive.
  std::vector<ReportedSourceConnection> source_connections() const;
  /// The source lags the live registrations reported with their latest heartbeat, kept and forgotten as the
  /// connections are (a closed registration's lag goes with it), by TaskManager in registration order.
  std::vector<ReportedSourceLag> source_lags() const;
  /// Declares lost every TaskManager whose heartbeat is overdue at the clock's now; returns them.
  std::vector<ClosedRegistration> check_heartbeats();
  void set_listener(Listener listener);
  /// With high availability: this JobManager's leader epoch (its etcd leader key's create revision), told to every
  /// TaskManager that registers; TaskManagers refuse calls carrying an older epoch than they have seen. 0: no HA.
  void set_leader_epoch(int64_t epoch);
  int64_t leader_epoch() const;
  /// Sets (or clears, with nullptr) the job events receiver; it must stay alive until cleared.
  void set_job_events(JobEvents* events);

  /// Stops serving; idempotent.
  void stop();

  class Impl;

 private:
  explicit JobManagerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
