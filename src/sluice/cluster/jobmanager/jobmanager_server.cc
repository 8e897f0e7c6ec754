#include "sluice/cluster/jobmanager/jobmanager_server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "sluice/cluster/rpc/rpc_status.h"
#include "sluice/cluster/rpc/state_handle_proto.h"
#include "sluice/cluster/rpc/subtask_metrics_proto.h"
#include "sluice/cluster/v1/jobmanager.grpc.pb.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace v1 = ::sluice::cluster::v1;

namespace {

std::string describe(const TaskManagerRegistration& r) {
  return fmt::format("{} (registration {}, {}, pid {})", r.resource_id, r.registration_id, r.rpc_address, r.pid);
}

grpc::Status unimplemented(const char* call) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      fmt::format("{} is part of the control-plane contract but this build does not serve it yet: "
                                  "slots are offered at registration (docs/cluster.md)",
                                  call));
}

std::string describe(const std::string& resource_id, const SourceConnectionReport& r) {
  return fmt::format("source '{}' ({}) subtask {} on TaskManager {}", r.description.empty() ? r.source : r.description,
                     r.source, r.subtask, resource_id);
}

bool same_reader(const SourceConnectionReport& a, const SourceConnectionReport& b) {
  return a.source == b.source && a.description == b.description && a.subtask == b.subtask;
}

// One log line per reader that lost its connection, regained it, or stopped being reported while disconnected
// (its reader closed): the JobManager's log says what its /health says, once per change (heartbeats repeat).
void log_source_changes(const std::string& resource_id, const std::vector<SourceConnectionReport>& before,
                        const std::vector<SourceConnectionReport>& after) {
  for (const SourceConnectionReport& a : after) {
    auto b = std::find_if(before.begin(), before.end(), [&](const auto& x) { return same_reader(a, x); });
    const bool was_connected = b == before.end() || b->connected;
    if (!a.connected && was_connected) {
      spdlog::warn("{}: disconnected for {:.1f} s: {} (reported by its heartbeat; /health says source-disconnected)",
                   describe(resource_id, a), static_cast<double>(a.disconnected_ms) / 1000.0, a.reason);
    } else if (a.connected && !was_connected) {
      spdlog::info("{}: connected again (reported by its heartbeat)", describe(resource_id, a));
    }
  }
  for (const SourceConnectionReport& b : before) {
    if (b.connected) continue;
    if (std::none_of(after.begin(), after.end(), [&](const auto& x) { return same_reader(b, x); })) {
      spdlog::info("{}: no longer reported while disconnected (its reader closed)", describe(resource_id, b));
    }
  }
}

std::optional<TaskState> from_proto(v1::ExecutionState s) {
  switch (s) {
    case v1::EXECUTION_STATE_RUNNING:
      return TaskState::kRunning;
    case v1::EXECUTION_STATE_FINISHED:
      return TaskState::kFinished;
    case v1::EXECUTION_STATE_CANCELED:
      return TaskState::kCanceled;
    case v1::EXECUTION_STATE_FAILED:
      return TaskState::kFailed;
    default:
      return std::nullopt;
  }
}

}  // namespace

class JobManagerServer::Impl final : public v1::JobManagerService::Service {
 public:
  std::atomic<int64_t> leader_epoch_{0};  // set by JobManagerServer::set_leader_epoch; read by RegisterTaskManager

  Impl(JobManagerServerOptions options, const Clock& clock, std::string id)
      : options_(std::move(options)),
        clock_(clock),
        id_(std::move(id)),
        registry_(options_.heartbeat, options_.job, id_) {}

  ~Impl() override { stop(); }

  Status start() {
    grpc::ServerBuilder builder;
    rpc::configure_server(builder);
    builder.AddListeningPort(fmt::format("{}:{}", options_.address, options_.port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      server_.reset();
      return Error(ErrorCode::kNetwork,
                   fmt::format("cannot serve the JobManager's RPC service on {}:{} (the port is in use or the address "
                               "is not local); pick another with --rpc-port / {} (0 = any free port)",
                               options_.address, options_.port, options::kJobManagerRpcPort.key));
    }
    if (options_.monitor_thread) {
      monitor_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "sluice-jm-hb");
        monitor();
      });
    }
    spdlog::info("JobManager RPC at {}:{} (jobmanager id {}, heartbeat.interval {} ms, heartbeat.timeout {} ms)",
                 options_.address, port_, id_, options_.heartbeat.interval_ms, options_.heartbeat.timeout_ms);
    return ok_status();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
    if (server_) {
      server_->Shutdown(rpc::deadline_in(1000));
      server_->Wait();
    }
  }

  // --- the service (gRPC threads) ---

  grpc::Status RegisterTaskManager(grpc::ServerContext*, const v1::RegisterTaskManagerRequest* req,
                                   v1::RegisterTaskManagerResponse* resp) override {
    TaskManagerRegistrationRequest r;
    r.resource_id = req->resource_id();
    r.rpc_address = req->rpc_address();
    r.data_address = req->data_address();
    r.hostname = req->hostname();
    r.pid = req->pid();
    r.slots = req->slots();
    r.job = JobGraphIdentity{req->job().fingerprint(), req->job().job_name(), req->job().build_version(),
                             req->job().pipeline_digest()};
    std::optional<ClosedRegistration> replaced;
    Result<TaskManagerRegistration> reg = [&] {
      std::lock_guard lock(mu_);
      return registry_.register_task_manager(r, clock_.now_ms(), &replaced);
    }();
    if (!reg.ok()) {
      spdlog::error("refused the registration of TaskManager {} ({}): {}", r.resource_id, r.rpc_address,
                    reg.error().message());
      return grpc::Status(reg.error().code() == ErrorCode::kGraph ? grpc::StatusCode::FAILED_PRECONDITION
                                                                  : grpc::StatusCode::INVALID_ARGUMENT,
                          reg.error().message());
    }
    if (replaced) {
      spdlog::info("TaskManager {}: its earlier registration {} is closed ({})", r.resource_id,
                   replaced->registration.registration_id, replaced->reason);
      notify_closed(*replaced);
    }
    resp->set_registration_id(reg->registration_id);
    resp->set_jobmanager_id(id_);
    resp->set_leader_epoch(leader_epoch_.load());
    resp->set_heartbeat_interval_ms(options_.heartbeat.interval_ms);
    resp->set_heartbeat_timeout_ms(options_.heartbeat.timeout_ms);
    resp->mutable_job()->set_fingerprint(options_.job.fingerprint);
    resp->mutable_job()->set_job_name(options_.job.job_name);
    resp->mutable_job()->set_build_version(options_.job.build_version);
    resp->mutable_job()->set_pipeline_digest(options_.job.pipeline_digest);
    const SlotSummary s = slots();
    spdlog::info("registered TaskManager {} with {} slots; {} TaskManager(s), {} slots ({} free)", describe(*reg),
                 reg->slots_total, s.task_managers, s.slots_total, s.slots_free);
    notify(s);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::TaskManagerHeartbeat* req,
                         v1::JobManagerHeartbeat* resp) override {
    if (!req->has_slot_report()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a heartbeat must carry the TaskManager's slot report");
    }
    std::vector<SourceConnectionReport> reported;
    reported.reserve(static_cast<size_t>(req->source_connections_size()));
    for (const v1::SourceConnectionStatus& c : req->source_connections()) {
      reported.push_back(SourceConnectionReport{c.source(), c.description(), c.subtask(), c.connected(),
                                                c.connected() ? 0 : std::max<int64_t>(0, c.disconnected_ms()),
                                                c.connected() ? std::string() : c.reason()});
    }
    std::vector<SourceLagReport> lags;
    lags.reserve(static_cast<size_t>(req->source_lags_size()));
    for (const v1::SourceLagStatus& l : req->source_lags())
      lags.push_back(SourceLagReport{l.source(), l.description(), std::max<int64_t>(-1, l.lag_ms())});
    std::string message;
    HeartbeatVerdict v;
    std::vector<SourceConnectionReport> before;
    {
      std::lock_guard lock(mu_);
      const TimestampMs now = clock_.now_ms();
      v = registry_.heartbeat(req->registration_id(), req->slot_report().slots_free(), now, &message);
      if (v == HeartbeatVerdict::kAccepted) {
        // Under the registry's lock: a registration closed after this heartbeat forgets what it stored.
        ReportedSources& r = sources_[req->registration_id()];
        before = std::move(r.connections);
        r.resource_id = req->resource_id();
        r.received_ms = now;
        r.connections = reported;
        r.lags = std::move(lags);
      }
    }
    switch (v) {
      case HeartbeatVerdict::kAccepted:
        log_source_changes(req->resource_id(), before, reported);
        if (req->subtask_metrics_size() > 0) {
          std::vector<SubtaskMetrics> metrics;
          metrics.reserve(static_cast<size_t>(req->subtask_metrics_size()));
          for (const v1::SubtaskMetricsStatus& m : req->subtask_metrics())
            metrics.push_back(rpc::from_proto(m));
          std::lock_guard lock(listener_mu_);
          if (events_ != nullptr) events_->on_subtask_metrics(std::move(metrics));
        }
        resp->set_jobmanager_id(id_);
        resp->set_timestamp_ms(clock_.now_ms());
        return grpc::Status::OK;
      case HeartbeatVerdict::kUnknownRegistration:
        spdlog::warn("refused a heartbeat of TaskManager {}: {}", req->resource_id(), message);
        return grpc::Status(grpc::StatusCode::NOT_FOUND, message);
      case HeartbeatVerdict::kInvalid:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "unreachable");
  }

  grpc::Status DisconnectTaskManager(grpc::ServerContext*, const v1::DisconnectTaskManagerRequest* req,
                                     v1::Acknowledgement*) override {
    bool known;
    std::optional<ClosedRegistration> closed;
    {
      std::lock_guard lock(mu_);
      known = registry_.disconnect(req->registration_id(), req->reason(), clock_.now_ms());
      if (known && !registry_.closed().empty()) closed = registry_.closed().back();
    }
    if (closed) notify_closed(*closed);
    if (!known) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          fmt::format("registration '{}' is not known to this JobManager", req->registration_id()));
    }
    const SlotSummary s = slots();
    spdlog::info("TaskManager registration {} disconnected ({}); {} TaskManager(s), {} slots ({} free)",
                 req->registration_id(), req->reason(), s.task_managers, s.slots_total, s.slots_free);
    notify(s);
    return grpc::Status::OK;
  }

  grpc::Status OfferSlots(grpc::ServerContext*, const v1::OfferSlotsRequest*, v1::OfferSlotsResponse*) override {
    return unimplemented("OfferSlots");
  }
  grpc::Status UpdateTaskExecutionState(grpc::ServerContext*, const v1::TaskExecutionStateUpdate* req,
                                        v1::Acknowledgement*) override {
    std::optional<TaskState> state = from_proto(req->state());
    if (!state || !req->has_subtask()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a task state update needs the subtask and a state (RUNNING, FINISHED, CANCELED or FAILED)");
    }
    bool known = false;
    {
      std::lock_guard lock(mu_);
      for (const auto& t : registry_.task_managers())
        known = known || t.registration_id == req->registration_id();
    }
    if (!known) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          fmt::format("registration '{}' is not known to this JobManager", req->registration_id()));
    }
    TaskStateReport r;
    r.registration_id = req->registration_id();
    r.vertex = req->subtask().vertex_id();
    r.subtask = req->subtask().subtask_index();
    r.attempt = req->subtask().attempt();
    r.state = *state;
    r.end_of_input = req->end_of_input();
    if (req->has_metrics()) r.metrics = rpc::from_proto(req->metrics());
    if (*state == TaskState::kFailed) {
      r.error = adopt_non_recoverable(
          Error(ErrorCode::kRuntime, req->error_message().empty() ? "the task failed" : req->error_message()),
          req->non_recoverable_reason());
    }
    std::lock_guard lock(listener_mu_);
    if (events_ != nullptr) events_->on_task_state(r);
    return grpc::Status::OK;
  }
  grpc::Status AcknowledgeCheckpoint(grpc::ServerContext*, const v1::AcknowledgeCheckpointRequest* req,
                                     v1::Acknowledgement*) override {
    if (!req->has_subtask())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "an acknowledgement needs the subtask");
    std::string resource_id;
    if (grpc::Status st = check_known(req->registration_id(), &resource_id); !st.ok()) return st;
    CheckpointAckReport r;
    r.registration_id = req->registration_id();
    r.vertex = req->subtask().vertex_id();
    r.subtask = req->subtask().subtask_index();
    r.attempt = req->subtask().attempt();
    r.checkpoint_id = req->checkpoint_id();
    r.task_name = req->task_name();
    r.alignment_ns = req->alignment_ns();
    r.sync_pause_ns = req->sync_duration_ns();
    r.finished_input = req->finished_input();
    for (const auto& sh : req->state()) {
      Result<OperatorSubtaskStateHandle> h = rpc::from_proto(sh);
      if (!h.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, h.error().message());
      h->location = resource_id;  // the TaskManager that wrote the file: a restore places the subtask there again
      r.uids.push_back(sh.operator_uid());
      r.handles.push_back(std::move(*h));
    }
    std::lock_guard lock(listener_mu_);
    if (events_ != nullptr) events_->on_checkpoint_ack(std::move(r));
    return grpc::Status::OK;
  }
  grpc::Status DeclineCheckpoint(grpc::ServerContext*, const v1::DeclineCheckpointRequest* req,
                                 v1::Acknowledgement*) override {
    if (!req->has_subtask()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a decline needs the subtask");
    if (grpc::Status st = check_known(req->registration_id()); !st.ok()) return st;
    CheckpointAckReport r;
    r.registration_id = req->registration_id();
    r.vertex = req->subtask().vertex_id();
    r.subtask = req->subtask().subtask_index();
    r.attempt = req->subtask().attempt();
    r.checkpoint_id = req->checkpoint_id();
    r.declined = true;
    r.reason = req->reason().empty() ? "no reason given" : req->reason();
    std::lock_guard lock(listener_mu_);
    if (events_ != nullptr) events_->on_checkpoint_ack(std::move(r));
    return grpc::Status::OK;
  }

  // OK when `registration_id` is an open registration, whose TaskManager's resource id goes to `*resource_id`.
  grpc::Status check_known(const std::string& registration_id, std::string* resource_id = nullptr) {
    std::lock_guard lock(mu_);
    for (const auto& t : registry_.task_managers()) {
      if (t.registration_id != registration_id) continue;
      if (resource_id != nullptr) *resource_id = t.resource_id;
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        fmt::format("registration '{}' is not known to this JobManager", registration_id));
  }

  // --- queries ---

  std::vector<TaskManagerRegistration> task_managers() const {
    std::lock_guard lock(mu_);
    return registry_.task_managers();
  }
  SlotSummary slots() const {
    std::lock_guard lock(mu_);
    return registry_.slots();
  }
  std::vector<ReportedSourceConnection> source_connections() const {
    std::vector<ReportedSourceConnection> out;
    std::lock_guard lock(mu_);
    const TimestampMs now = clock_.now_ms();
    for (const TaskManagerRegistration& t : registry_.task_managers()) {
      auto it = sources_.find(t.registration_id);
      if (it == sources_.end()) continue;
      for (const SourceConnectionReport& c : it->second.connections) {
        ReportedSourceConnection r{t.resource_id, t.registration_id, c};
        if (!c.connected) r.connection.disconnected_ms += std::max<int64_t>(0, now - it->second.received_ms);
        out.push_back(std::move(r));
      }
    }
    return out;
  }

  std::vector<ReportedSourceLag> source_lags() const {
    std::vector<ReportedSourceLag> out;
    std::lock_guard lock(mu_);
    for (const TaskManagerRegistration& t : registry_.task_managers()) {
      auto it = sources_.find(t.registration_id);
      if (it == sources_.end()) continue;
      for (const SourceLagReport& l : it->second.lags)
        out.push_back(ReportedSourceLag{t.resource_id, t.registration_id, l});
    }
    return out;
  }

  std::vector<ClosedRegistration> check_heartbeats() {
    std::vector<ClosedRegistration> lost;
    SlotSummary s;
    {
      std::lock_guard lock(mu_);
      lost = registry_.check_heartbeats(clock_.now_ms());
      s = registry_.slots();
    }
    for (const auto& c : lost) {
      spdlog::warn("TaskManager {} lost: {}; its {} slots are gone; {} TaskManager(s), {} slots ({} free) remain",
                   describe(c.registration), c.reason, c.registration.slots_total, s.task_managers, s.slots_total,
                   s.slots_free);
    }
    if (!lost.empty()) notify(s);
    for (const auto& c : lost)
      notify_closed(c);
    return lost;
  }

  void set_listener(Listener l) {
    std::lock_guard lock(listener_mu_);
    listener_ = std::move(l);
  }
  void set_job_events(JobEvents* e) {
    std::lock_guard lock(listener_mu_);
    events_ = e;
  }

  std::string target() const { return fmt::format("{}:{}", options_.address, port_); }
  int port() const { return port_; }
  const std::string& id() const { return id_; }

 private:
  void notify(const SlotSummary& s) {
    std::lock_guard lock(listener_mu_);
    if (listener_) listener_(s);
  }
  void notify_closed(const ClosedRegistration& c) {
    // Its sources' states go with it: a TaskManager that stops reporting leaves neither a stale "connected" nor a
    // stale "disconnected" (its readers are gone, or run again under a new registration that reports them).
    ReportedSources forgotten;
    {
      std::lock_guard lock(mu_);
      auto it = sources_.find(c.registration.registration_id);
      if (it != sources_.end()) {
        forgotten = std::move(it->second);
        sources_.erase(it);
      }
    }
    for (const SourceConnectionReport& r : forgotten.connections) {
      if (!r.connected) {
        spdlog::info("{}: forgotten while disconnected: its registration {} is closed ({})",
                     describe(c.registration.resource_id, r), c.registration.registration_id, c.reason);
      }
    }
    std::lock_guard lock(listener_mu_);
    if (events_ != nullptr) events_->on_task_manager_closed(c);
  }

  // Sleeps until the next registration could expire (at most one interval, so a clock that jumps is
  // noticed), then checks. Real time passes between checks; the verdict uses the Clock.
  void monitor() {
    std::unique_lock lock(mu_);
    while (!stopped_) {
      const TimestampMs now = clock_.now_ms();
      const TimestampMs next = registry_.next_timeout_ms();
      int64_t wait = options_.heartbeat.interval_ms;
      if (next != std::numeric_limits<TimestampMs>::max()) wait = std::clamp<int64_t>(next - now, 1, wait);
      cv_.wait_for(lock, std::chrono::milliseconds(wait));
      if (stopped_) break;
      lock.unlock();
      check_heartbeats();
      lock.lock();
    }
  }

  const JobManagerServerOptions options_;
  const Clock& clock_;
  const std::string id_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::thread monitor_;

  // What a registration's latest heartbeat said of its source readers.
  struct ReportedSources {
    std::string resource_id;
    TimestampMs received_ms = 0;
    std::vector<SourceConnectionReport> connections;
    std::vector<SourceLagReport> lags;
  };

  mutable std::mutex mu_;  // guards registry_, sources_ and stopped_
  std::condition_variable cv_;
  TaskManagerRegistry registry_;
  std::map<std::string, ReportedSources> sources_;  // by registration id; live registrations only
  bool stopped_ = false;

  std::mutex listener_mu_;  // guards listener_ and events_; calls them, never taken with mu_ held
  Listener listener_;
  JobEvents* events_ = nullptr;
};

Result<std::unique_ptr<JobManagerServer>> JobManagerServer::start(JobManagerServerOptions options, const Clock& clock) {
  std::random_device rd;  // an identity for this run of the process, not data
  const std::string id = fmt::format("{:08x}", rd());
  auto impl = std::make_unique<Impl>(std::move(options), clock, id);
  SLUICE_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<JobManagerServer>(new JobManagerServer(std::move(impl)));
}

JobManagerServer::JobManagerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobManagerServer::~JobManagerServer() {
  stop();
}
std::string JobManagerServer::target() const {
  return impl_->target();
}
int JobManagerServer::port() const {
  return impl_->port();
}
const std::string& JobManagerServer::jobmanager_id() const {
  return impl_->id();
}
std::vector<TaskManagerRegistration> JobManagerServer::task_managers() const {
  return impl_->task_managers();
}
SlotSummary JobManagerServer::slots() const {
  return impl_->slots();
}
std::vector<ReportedSourceConnection> JobManagerServer::source_connections() const {
  return impl_->source_connections();
}

std::vector<ReportedSourceLag> JobManagerServer::source_lags() const {
  return impl_->source_lags();
}
std::vector<ClosedRegistration> JobManagerServer::check_heartbeats() {
  return impl_->check_heartbeats();
}
void JobManagerServer::set_listener(Listener listener) {
  impl_->set_listener(std::move(listener));
}
void JobManagerServer::set_leader_epoch(int64_t epoch) {
  impl_->leader_epoch_.store(epoch);
}
int64_t JobManagerServer::leader_epoch() const {
  return impl_->leader_epoch_.load();
}
void JobManagerServer::set_job_events(JobEvents* events) {
  impl_->set_job_events(events);
}
void JobManagerServer::stop() {
  impl_->stop();
}

}  // namespace sluice
