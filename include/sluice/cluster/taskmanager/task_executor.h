// TaskExecutor: a TaskManager process (Flink's TaskExecutor, as far as cluster mode goes in this build):
// serves the gRPC TaskManagerService (proto/sluice/cluster/v1/taskmanager.proto), registers with the JobManager
// with retries and backoff, sends heartbeats with its slot report, declares the JobManager lost when
// heartbeat.timeout passes without a reply and registers again (a new registration), and stops for good when
// the JobManager refuses its job graph. With a job graph it runs the subtasks the JobManager deploys
// (SubmitTasks: DeployedTasks over its data plane, a net::ConnectionManager), reports each task's end
// (UpdateTaskExecutionState), and cancels them on CancelTasks or when it loses its JobManager.
//
// Checkpoints: TriggerCheckpoint / NotifyCheckpointComplete / NotifyCheckpointAborted reach the tasks of the
// attempt named in the call (another attempt's call has no effect); a checkpoint writer thread writes each task
// snapshot's state files into the job's checkpoint directory (from SubmitTasks) and acknowledges them with
// their handles (AcknowledgeCheckpoint), or declines with the error. FreeSlot answers UNIMPLEMENTED.
//
// High availability (find_leader set): the JobManager is whoever etcd names as leader; see TaskExecutorOptions.
//
// Lifecycle: start() serves and starts the connection thread; wait() blocks until it stops (refused, or
// stop()); stop() disconnects from the JobManager when registered (its slots go at once) and stops.
// Threading: thread-safe. One thread runs the JobManagerConnection state machine and makes the blocking RPCs
// with deadlines; time comes from the injected Clock (real waits in between).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/cluster/cluster_options.h"
#include "sluice/cluster/job_graph_fingerprint.h"
#include "sluice/cluster/source_connection_report.h"
#include "sluice/cluster/source_lag_report.h"
#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

/// The JobManager leader as high availability publishes it (etcd's leader key): its RPC address and epoch.
struct JobManagerLeader {
  std::string address;
  int64_t epoch = 0;
};

struct TaskExecutorOptions {
  std::string jobmanager;  ///< host:port of the JobManager's RPC service (unused with find_leader)
  /// High availability: reads the current leader (nullopt between terms); called every `leader_poll_ms` from the
  /// connection thread. A leader of a new epoch replaces the one registered with (its tasks are cancelled), and
  /// calls carrying an older epoch than the highest seen are refused (FAILED_PRECONDITION). Unset: `jobmanager`.
  std::function<Result<std::optional<JobManagerLeader>>()> find_leader;
  int64_t leader_poll_ms = 500;
  std::string address = "127.0.0.1";  ///< taskmanager.host: where this TaskManager's RPC service binds
  int port = 0;                       ///< taskmanager.rpc.port; 0 = a free port
  int32_t slots = 1;                  ///< taskmanager.numberOfTaskSlots
  JobGraphIdentity job;
  HeartbeatOptions heartbeat;
  RegistrationBackoff backoff;
  /// The job this TaskManager runs, built from the same pipeline file as the JobManager's (both must outlive
  /// the executor); null: it only registers and SubmitTasks is refused.
  const StreamGraph* graph = nullptr;
  const JobGraph* job_graph = nullptr;
  int data_port = 0;  ///< taskmanager.data.port: its data plane (binds `address`); 0 = a free port
  /// The connections of the source readers running here (source_connection_report.h), sent with every heartbeat
  /// for the JobManager's /health; called on the connection thread every `source_poll_ms`, and a heartbeat goes
  /// at once when a reader lost or regained its connection. Unset: none reported.
  std::function<std::vector<SourceConnectionReport>()> source_connections;
  int64_t source_poll_ms = 200;
  /// The lag of the sources whose readers run in this process (source_lag_report.h), sent with every heartbeat
  /// for the JobManager's /health (`source-lag`) and /metrics; called on the connection thread once per heartbeat.
  /// Unset: none reported (the JobManager then knows no lag).
  std::function<std::vector<SourceLagReport>()> source_lags;
  /// Test hook: called by SubmitTasks on its RPC thread while it holds the deployment (before the state
  /// restore), e.g. to stall a deployment as a slow restore from S3 does. Unset in production.
  std::function<void()> on_deploy;
};

/// What the TaskExecutor has seen (for tests and logs).
struct TaskExecutorStatus {
  bool registered = false;
  std::string registration_id;
  std::string jobmanager_id;
  int registrations = 0;      ///< successful registrations so far
  int jobmanager_losses = 0;  ///< times the JobManager was declared lost
  int failed_attempts = 0;    ///< failed registration attempts since the last success
  int deployed_attempt = -1;  ///< the attempt whose tasks it holds (-1: none)
  size_t running_tasks = 0;   ///< of that attempt
};

class TaskExecutor {
 public:
  /// Binds its RPC service and starts connecting. Errors: kNetwork when the port cannot be bound;
  /// kConfiguration for slots < 1 or an empty JobManager address.
  [[nodiscard]] static Result<std::unique_ptr<TaskExecutor>> start(TaskExecutorOptions options, const Clock& clock);
  ~TaskExecutor();
  TaskExecutor(const TaskExecutor&) = delete;
  TaskExecutor& operator=(const TaskExecutor&) = delete;

  /// "host:port-<random>": this process's identity towards the JobManager (Flink's ResourceID).
  const std::string& resource_id() const;
  /// host:port of its TaskManagerService.
  std::string rpc_address() const;
  /// host:port of its data plane ("" without a job graph).
  std::string data_address() const;

  /// Blocks until the executor stopped: returns the refusal when the JobManager refused this TaskManager
  /// (its job graph or build differs), or ok after stop().
  Status wait();
  /// Whether the executor has stopped (refused, or stop()); wait() then returns at once.
  bool done() const;
  /// Disconnects (when registered) and stops; idempotent.
  void stop();
  TaskExecutorStatus status() const;

  class Impl;

 private:
  explicit TaskExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
