// JobMaster: runs one job on the cluster's TaskManagers (Flink's JobMaster with its scheduler, as far as this
// build goes). It waits until the registered TaskManagers offer the slots the job needs (up to
// slot.request.timeout, saying "needs N slots, M registered"), places every subtask in a slot
// (slot_assignment.h: slot sharing as Flink), deploys each TaskManager's share with SubmitTasks, and follows the
// tasks' state updates: the job is FINISHED when every task finished, FAILED as soon as a task failed or a
// TaskManager holding tasks was lost or disconnected (the tasks left on the other TaskManagers are cancelled
// with CancelTasks), CANCELED on cancel().
//
// Not yet (issue 21): restarts (a failure fails the job: there is no region failover across processes in this
// build), checkpoints and savepoints (refused before deployment), per-operator counters from the TaskManagers.
//
// Threading: one master thread (started by start()) does every RPC; JobEvents and JobClient calls are
// thread-safe and only queue work for it.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/cluster/jobmanager/jobmanager_server.h"
#include "sluice/cluster/jobmanager/slot_assignment.h"
#include "sluice/core/clock.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

struct JobMasterOptions {
  std::string job_id;
  std::string job_name;
  int64_t slot_request_timeout_ms = 300000;  ///< slot.request.timeout
  bool evenly_spread = false;                ///< cluster.evenly-spread-out-slots
  int64_t rpc_timeout_ms = 30000;            ///< deadline of SubmitTasks / CancelTasks
};

/// Where the JobMaster placed a subtask (for the REST API and logs).
struct SubtaskLocation {
  int vertex = 0;
  int subtask = 0;
  std::string task_manager;  ///< resource id
  int slot = 0;
};

class JobMaster final : public JobClient::Impl, public JobEvents {
 public:
  /// `jg` and `server` must outlive the JobMaster. Registers itself for the server's job events.
  JobMaster(JobMasterOptions options, const JobGraph& jg, JobManagerServer& server, const Clock& clock);
  ~JobMaster() override;
  JobMaster(const JobMaster&) = delete;
  JobMaster& operator=(const JobMaster&) = delete;

  /// Starts the master thread.
  void start();
  /// What the job waits for ("waiting for TaskManagers: needs 8 slots, 6 registered (on 3 TaskManager(s))"),
  /// or "" when it runs or ended.
  std::string status_message() const;
  std::vector<SubtaskLocation> placement() const;

  // --- JobClient::Impl ---
  const std::string& job_id() const override { return options_.job_id; }
  JobStatus status() const override;
  void cancel() override;
  JobResult wait() override;
  bool wait_for(std::chrono::milliseconds timeout) override;
  std::future<Result<std::string>> trigger_savepoint(std::string target_dir, bool terminate) override;
  std::vector<CheckpointStats> checkpoint_stats() const override { return {}; }
  int restarts() const override { return 0; }
  std::vector<JobExceptionInfo> exceptions() const override;

  // --- JobEvents (gRPC / monitor threads) ---
  void on_task_state(const TaskStateReport& report) override;
  void on_task_manager_closed(const ClosedRegistration& closed) override;

 private:
  struct Deployed {
    TaskManagerRegistration tm;
    int tasks = 0;
  };
  using Event = std::variant<TaskStateReport, ClosedRegistration>;

  void run();
  /// Waits for the slots; returns the assignment and the TaskManagers it is on, or nullopt (the job ended).
  std::optional<std::pair<SlotAssignment, std::vector<TaskManagerRegistration>>> wait_for_slots(
      std::unique_lock<std::mutex>& lock);
  Status deploy(const SlotAssignment& a, const std::vector<TaskManagerRegistration>& tms);
  void cancel_deployed(const std::string& reason, const std::string& except_registration);
  void finish_locked(JobStatus status, std::optional<Error> error);

  const JobMasterOptions options_;
  const JobGraph& jg_;
  JobManagerServer& server_;
  const Clock& clock_;
  const int attempt_ = 0;  // one deployment per job in this build (no restarts yet)
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the master thread
  std::condition_variable done_cv_;  // wakes wait()
  std::deque<Event> events_;
  JobStatus status_ = JobStatus::kCreated;
  std::string status_message_;
  bool cancel_requested_ = false;
  bool stopping_ = false;
  bool terminal_ = false;
  std::vector<Deployed> deployed_;  // by peer index
  std::vector<SubtaskLocation> placement_;
  std::vector<JobExceptionInfo> exceptions_;
  JobResult result_;
};

}  // namespace sluice
