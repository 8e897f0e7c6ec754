#include "sluice/cluster/jobmanager/job_master.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <set>

#include "sluice/cluster/rpc/rpc_status.h"
#include "sluice/cluster/v1/taskmanager.grpc.pb.h"

namespace sluice {
namespace v1 = ::sluice::cluster::v1;

JobMaster::JobMaster(JobMasterOptions options, const JobGraph& jg, JobManagerServer& server, const Clock& clock)
    : options_(std::move(options)), jg_(jg), server_(server), clock_(clock) {
  start_ = std::chrono::steady_clock::now();
  server_.set_job_events(this);
}

JobMaster::~JobMaster() {
  server_.set_job_events(nullptr);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cancel_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void JobMaster::start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sluice-jobmaster");
    run();
  });
}

JobStatus JobMaster::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

std::string JobMaster::status_message() const {
  std::lock_guard lock(mu_);
  return status_message_;
}

std::vector<SubtaskLocation> JobMaster::placement() const {
  std::lock_guard lock(mu_);
  return placement_;
}

void JobMaster::cancel() {
  {
    std::lock_guard lock(mu_);
    if (terminal_) return;
    cancel_requested_ = true;
  }
  cv_.notify_all();
}

JobResult JobMaster::wait() {
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return terminal_; });
  return result_;
}

bool JobMaster::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return done_cv_.wait_for(lock, timeout, [&] { return terminal_; });
}

std::future<Result<std::string>> JobMaster::trigger_savepoint(std::string, bool) {
  std::promise<Result<std::string>> p;
  p.set_value(Error(ErrorCode::kCheckpoint,
                    fmt::format("job '{}' runs in cluster mode, which does not take checkpoints or savepoints in this "
                                "build (issue 21)",
                                options_.job_name)));
  return p.get_future();
}

std::vector<JobExceptionInfo> JobMaster::exceptions() const {
  std::lock_guard lock(mu_);
  return exceptions_;
}

void JobMaster::on_task_state(const TaskStateReport& report) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(report);
  }
  cv_.notify_all();
}

void JobMaster::on_task_manager_closed(const ClosedRegistration& closed) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(closed);
  }
  cv_.notify_all();
}

std::optional<std::pair<SlotAssignment, std::vector<TaskManagerRegistration>>> JobMaster::wait_for_slots(
    std::unique_lock<std::mutex>& lock) {
  const TimestampMs deadline = clock_.now_ms() + options_.slot_request_timeout_ms;
  std::string last_logged;
  for (;;) {
    if (cancel_requested_) {
      finish_locked(JobStatus::kCanceled, std::nullopt);
      return std::nullopt;
    }
    events_.clear();  // nothing is deployed yet: task and TaskManager events do not concern this job
    lock.unlock();
    std::vector<TaskManagerRegistration> tms = server_.task_managers();
    lock.lock();
    std::vector<SlotOffer> offers;
    for (const auto& t : tms)
      offers.push_back(SlotOffer{t.registration_id, t.slots_total});
    Result<SlotAssignment> a = assign_slots(jg_, offers, options_.evenly_spread);
    if (a.ok()) return std::make_pair(std::move(*a), std::move(tms));
    status_message_ = "waiting for TaskManagers: " + a.error().message();
    if (status_message_ != last_logged) {
      spdlog::warn("job '{}' {}", options_.job_name, status_message_);
      last_logged = status_message_;
    }
    const TimestampMs now = clock_.now_ms();
    if (now >= deadline) {
      finish_locked(
          JobStatus::kFailed,
          Error(ErrorCode::kConfiguration,
                fmt::format("job '{}' did not get the slots it needs within slot.request.timeout = {} ms: {}; "
                            "start more TaskManagers (or give them more --slots) or lower the parallelism",
                            options_.job_name, options_.slot_request_timeout_ms, a.error().message())));
      return std::nullopt;
    }
    // Registrations wake the thread through events; poll at least every 100 ms for the deadline.
    cv_.wait_for(lock, std::chrono::milliseconds(std::clamp<int64_t>(deadline - now, 1, 100)));
  }
}

Status JobMaster::deploy(const SlotAssignment& a, const std::vector<TaskManagerRegistration>& tms) {
  // Peers: the TaskManagers that hold at least one slot of the job, in registration order.
  std::vector<int> peer_of_offer(tms.size(), -1);
  v1::SubmitTasksRequest base;
  base.set_jobmanager_id(server_.jobmanager_id());
  base.set_attempt(attempt_);
  std::vector<Deployed> deployed;
  for (size_t t = 0; t < tms.size(); ++t) {
    if (a.slots_used[t] == 0) continue;
    if (tms[t].data_address.empty()) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("TaskManager {} registered without a data-plane address: it runs no tasks (a "
                               "TaskManager of another build?)",
                               tms[t].resource_id));
    }
    peer_of_offer[t] = static_cast<int>(deployed.size());
    deployed.push_back(Deployed{tms[t], 0});
    auto* p = base.add_peers();
    p->set_resource_id(tms[t].resource_id);
    p->set_data_address(tms[t].data_address);
  }
  std::vector<SubtaskLocation> placement;
  for (const auto& v : jg_.vertices) {
    for (int i = 0; i < v.parallelism; ++i) {
      const SubtaskSlot& s = a.subtasks[static_cast<size_t>(v.id)][static_cast<size_t>(i)];
      const int peer = peer_of_offer[static_cast<size_t>(s.task_manager)];
      auto* pl = base.add_placement();
      pl->set_vertex_id(v.id);
      pl->set_subtask_index(i);
      pl->set_peer(peer);
      pl->set_slot_index(s.slot);
      ++deployed[static_cast<size_t>(peer)].tasks;
      placement.push_back(SubtaskLocation{v.id, i, tms[static_cast<size_t>(s.task_manager)].resource_id, s.slot});
    }
  }
  {
    std::lock_guard lock(mu_);
    deployed_ = deployed;
    placement_ = placement;
  }
  for (size_t peer = 0; peer < deployed.size(); ++peer) {
    v1::SubmitTasksRequest req = base;
    req.set_registration_id(deployed[peer].tm.registration_id);
    req.set_self(static_cast<int>(peer));
    auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(deployed[peer].tm.rpc_address));
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(options_.rpc_timeout_ms));
    v1::Acknowledgement ack;
    const grpc::Status st = stub->SubmitTasks(&ctx, req, &ack);
    if (!st.ok()) {
      return rpc::to_error(st, "SubmitTasks", deployed[peer].tm.rpc_address)
          .with_context(fmt::format("deploying {} task(s) of job '{}' to TaskManager {}", deployed[peer].tasks,
                                    options_.job_name, deployed[peer].tm.resource_id));
    }
    spdlog::info("job '{}': deployed {} task(s) to TaskManager {}", options_.job_name, deployed[peer].tasks,
                 deployed[peer].tm.resource_id);
  }
  return ok_status();
}

void JobMaster::cancel_deployed(const std::string& reason, const std::string& except_registration) {
  std::vector<Deployed> deployed;
  {
    std::lock_guard lock(mu_);
    deployed = deployed_;
  }
  for (const auto& d : deployed) {
    if (d.tm.registration_id == except_registration) continue;
    auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(d.tm.rpc_address));
    v1::CancelTasksRequest req;
    req.set_jobmanager_id(server_.jobmanager_id());
    req.set_attempt(attempt_);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(options_.rpc_timeout_ms));
    v1::Acknowledgement ack;
    const grpc::Status st = stub->CancelTasks(&ctx, req, &ack);
    if (!st.ok()) {
      // A TaskManager that cannot be reached cancels its tasks itself once it loses this JobManager.
      spdlog::warn("job '{}': cannot cancel the tasks on TaskManager {}: {}", options_.job_name, d.tm.resource_id,
                   rpc::to_error(st, "CancelTasks", d.tm.rpc_address).message());
    }
  }
}

void JobMaster::finish_locked(JobStatus status, std::optional<Error> error) {
  status_ = status;
  status_message_.clear();
  result_.job_id = options_.job_id;
  result_.job_name = options_.job_name;
  result_.status = status;
  result_.error = std::move(error);
  result_.duration = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_);
  if (status == JobStatus::kFailed) {
    spdlog::error("job '{}' ({}) FAILED: {}", options_.job_name, options_.job_id, result_.error->to_string());
  } else {
    spdlog::info("job '{}' ({}) {} after {} ms", options_.job_name, options_.job_id, job_status_name(status),
                 result_.duration.count());
  }
  terminal_ = true;
  done_cv_.notify_all();
}

void JobMaster::run() {
  std::unique_lock lock(mu_);
  auto slots = wait_for_slots(lock);
  if (!slots) return;
  status_message_.clear();
  lock.unlock();
  Status st = deploy(slots->first, slots->second);
  lock.lock();
  if (!st.ok()) {
    lock.unlock();
    cancel_deployed("the deployment failed", "");
    lock.lock();
    exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(st.error().code())), st.error().message(),
                                           st.error().to_string(), clock_.now_ms(), "", false});
    finish_locked(JobStatus::kFailed, st.error());
    return;
  }
  status_ = JobStatus::kRunning;
  size_t total = 0;
  std::set<std::string> registrations;
  for (const auto& d : deployed_) {
    total += static_cast<size_t>(d.tasks);
    registrations.insert(d.tm.registration_id);
  }
  spdlog::info("job '{}' ({}) RUNNING: {} task(s) on {} TaskManager(s)", options_.job_name, options_.job_id, total,
               deployed_.size());
  std::set<std::pair<int, int>> finished;
  for (;;) {
    std::optional<Error> failure;
    std::string lost_registration;
    bool cancel = false;
    cv_.wait(lock, [&] { return !events_.empty() || cancel_requested_; });
    while (!events_.empty() && !failure) {
      Event e = std::move(events_.front());
      events_.pop_front();
      if (auto* r = std::get_if<TaskStateReport>(&e)) {
        if (r->attempt != attempt_ || registrations.count(r->registration_id) == 0) continue;
        const JobVertex& v = jg_.vertices.at(static_cast<size_t>(r->vertex));
        const std::string task = fmt::format("{} ({}/{})", v.name, r->subtask + 1, v.parallelism);
        if (r->state == TaskState::kFinished) {
          finished.insert({r->vertex, r->subtask});
        } else if (r->state == TaskState::kFailed || (r->state == TaskState::kCanceled && !cancel_requested_)) {
          failure =
              r->error.value_or(Error(ErrorCode::kRuntime, fmt::format("task '{}' was cancelled", task)))
                  .with_context(fmt::format("task '{}' on TaskManager registration {}", task, r->registration_id));
          exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(failure->code())), failure->message(),
                                                 failure->to_string(), clock_.now_ms(), task, false});
        }
      } else {
        const auto& c = std::get<ClosedRegistration>(e);
        if (registrations.count(c.registration.registration_id) == 0) continue;
        lost_registration = c.registration.registration_id;
        failure = Error(ErrorCode::kNetwork,
                        fmt::format("TaskManager {} (registration {}, {}) holding tasks of the job is gone: {}; this "
                                    "build does not restart tasks on other slots yet",
                                    c.registration.resource_id, c.registration.registration_id,
                                    c.registration.rpc_address, c.reason));
        exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(failure->code())), failure->message(),
                                               failure->to_string(), clock_.now_ms(), "", false});
      }
    }
    if (!failure && finished.size() == total) {
      finish_locked(JobStatus::kFinished, std::nullopt);
      return;
    }
    cancel = cancel_requested_;
    if (!failure && !cancel) continue;
    lock.unlock();
    cancel_deployed(failure ? "the job fails: " + failure->message() : "the job is cancelled", lost_registration);
    lock.lock();
    if (failure) {
      finish_locked(JobStatus::kFailed, failure);
    } else {
      finish_locked(JobStatus::kCanceled, std::nullopt);
    }
    return;
  }
}

}  // namespace sluice
