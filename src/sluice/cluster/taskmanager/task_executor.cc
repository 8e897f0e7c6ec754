#include "sluice/cluster/taskmanager/task_executor.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "sluice/cluster/rpc/rpc_status.h"
#include "sluice/cluster/taskmanager/jobmanager_connection.h"
#include "sluice/cluster/v1/jobmanager.grpc.pb.h"
#include "sluice/cluster/v1/taskmanager.grpc.pb.h"

namespace sluice {
namespace v1 = ::sluice::cluster::v1;

namespace {

grpc::Status unimplemented(const char* call) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      fmt::format("{}: this TaskManager build does not run tasks yet (cluster task deployment is the "
                                  "next step of issue 21; see docs/cluster.md)",
                                  call));
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

class TaskExecutor::Impl final : public v1::TaskManagerService::Service {
 public:
  Impl(TaskExecutorOptions options, const Clock& clock)
      : options_(std::move(options)), clock_(clock), connection_(options_.heartbeat, options_.backoff) {}
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
                   fmt::format("cannot serve the TaskManager's RPC service on {}:{} (the port is in use or the address "
                               "is not local); pick another with {} (0 = any free port)",
                               options_.address, options_.port, options::kTaskManagerRpcPort.key));
    }
    std::random_device rd;  // an identity for this process, not data
    resource_id_ = fmt::format("{}:{}-{:06x}", options_.address, port_, rd() & 0xffffff);
    stub_ = v1::JobManagerService::NewStub(rpc::make_channel(options_.jobmanager));
    spdlog::info("TaskManager {} with {} slots, RPC at {}; registering at JobManager {}", resource_id_, options_.slots,
                 rpc_address(), options_.jobmanager);
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sluice-tm-conn");
      run();
    });
    return ok_status();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (server_) {
      server_->Shutdown(rpc::deadline_in(1000));
      server_->Wait();
    }
  }

  Status wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return refusal_ ? Status(*refusal_) : ok_status();
  }

  bool done() const {
    std::lock_guard lock(mu_);
    return done_;
  }

  TaskExecutorStatus status() const {
    std::lock_guard lock(mu_);
    return status_;
  }

  const std::string& resource_id() const { return resource_id_; }
  std::string rpc_address() const { return fmt::format("{}:{}", options_.address, port_); }

  // --- TaskManagerService: the JobManager's calls (none is served in this build) ---
  grpc::Status SubmitTask(grpc::ServerContext*, const v1::SubmitTaskRequest*, v1::Acknowledgement*) override {
    return unimplemented("SubmitTask");
  }
  grpc::Status CancelTask(grpc::ServerContext*, const v1::CancelTaskRequest*, v1::Acknowledgement*) override {
    return unimplemented("CancelTask");
  }
  grpc::Status TriggerCheckpoint(grpc::ServerContext*, const v1::TriggerCheckpointRequest*,
                                 v1::Acknowledgement*) override {
    return unimplemented("TriggerCheckpoint");
  }
  grpc::Status NotifyCheckpointComplete(grpc::ServerContext*, const v1::NotifyCheckpointCompleteRequest*,
                                        v1::Acknowledgement*) override {
    return unimplemented("NotifyCheckpointComplete");
  }
  grpc::Status NotifyCheckpointAborted(grpc::ServerContext*, const v1::NotifyCheckpointAbortedRequest*,
                                       v1::Acknowledgement*) override {
    return unimplemented("NotifyCheckpointAborted");
  }
  grpc::Status FreeSlot(grpc::ServerContext*, const v1::FreeSlotRequest*, v1::Acknowledgement*) override {
    return unimplemented("FreeSlot");
  }

 private:
  // The connection thread: asks the state machine what to do, does it, reports the outcome.
  void run() {
    std::string last_error;
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) break;
      }
      const TimestampMs now = clock_.now_ms();
      if (connection_.check_jobmanager(now)) {
        spdlog::warn(
            "JobManager {} lost: no heartbeat reply for {} ms (heartbeat.timeout {} ms; last error: {}); this "
            "TaskManager registers again",
            options_.jobmanager, now - connection_.last_reply_ms(), connection_.heartbeat().timeout_ms,
            last_error.empty() ? "none" : last_error);
        publish();
      }
      const JobManagerConnection::Action a = connection_.next_action(now);
      switch (a.kind) {
        case JobManagerConnection::Action::Kind::kStop:
          finish();
          return;
        case JobManagerConnection::Action::Kind::kWait: {
          std::unique_lock lock(mu_);
          cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, a.wait_until_ms - now)),
                       [&] { return stopping_; });
          break;
        }
        case JobManagerConnection::Action::Kind::kRegister:
          register_once(a.deadline_ms, last_error);
          break;
        case JobManagerConnection::Action::Kind::kHeartbeat:
          heartbeat_once(a.deadline_ms, last_error);
          break;
      }
    }
    // Stopping: leave the JobManager so that its slots go at once instead of after heartbeat.timeout.
    if (connection_.state() == JobManagerConnection::State::kRegistered) {
      grpc::ClientContext ctx;
      ctx.set_deadline(rpc::deadline_in(1000));
      v1::DisconnectTaskManagerRequest req;
      req.set_registration_id(connection_.registration_id());
      req.set_reason("the TaskManager shuts down");
      v1::Acknowledgement ack;
      const grpc::Status st = stub_->DisconnectTaskManager(&ctx, req, &ack);
      if (!st.ok()) spdlog::warn("{}", rpc::to_error(st, "DisconnectTaskManager", options_.jobmanager).message());
    }
    finish();
  }

  void register_once(int64_t deadline_ms, std::string& last_error) {
    v1::RegisterTaskManagerRequest req;
    req.set_resource_id(resource_id_);
    req.set_rpc_address(rpc_address());
    req.set_data_address("");  // the TCP data plane is not wired to cluster mode yet
    req.set_slots(options_.slots);
    req.mutable_job()->set_fingerprint(options_.job.fingerprint);
    req.mutable_job()->set_job_name(options_.job.job_name);
    req.mutable_job()->set_build_version(options_.job.build_version);
    req.set_pid(::getpid());
    req.set_hostname(hostname());
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(deadline_ms));
    v1::RegisterTaskManagerResponse resp;
    const grpc::Status st = stub_->RegisterTaskManager(&ctx, req, &resp);
    const TimestampMs now = clock_.now_ms();
    if (st.ok()) {
      connection_.on_registered(resp.registration_id(), resp.jobmanager_id(),
                                HeartbeatOptions{resp.heartbeat_interval_ms(), resp.heartbeat_timeout_ms()}, now);
      last_error.clear();
      spdlog::info("registered at JobManager {} (jobmanager id {}) as registration {} with {} slots",
                   options_.jobmanager, resp.jobmanager_id(), resp.registration_id(), options_.slots);
      publish();
      return;
    }
    const Error e = rpc::to_error(st, "RegisterTaskManager", options_.jobmanager);
    if (!rpc::is_transient(st)) {
      spdlog::error("the JobManager refused this TaskManager: {}", st.error_message());
      {
        std::lock_guard lock(mu_);
        refusal_ = Error(e.code(), st.error_message());
      }
      connection_.on_refused();
      return;
    }
    last_error = e.message();
    const int64_t wait = connection_.on_registration_failed(now);
    spdlog::warn("registration attempt {} at JobManager {} failed: {}; next attempt in {} ms",
                 connection_.failed_attempts(), options_.jobmanager, e.message(), wait);
    publish();
  }

  void heartbeat_once(int64_t deadline_ms, std::string& last_error) {
    v1::TaskManagerHeartbeat req;
    req.set_registration_id(connection_.registration_id());
    req.set_resource_id(resource_id_);
    req.mutable_slot_report()->set_slots_total(options_.slots);
    req.mutable_slot_report()->set_slots_free(options_.slots);  // no tasks run here yet: every slot is free
    const TimestampMs sent = clock_.now_ms();
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(deadline_ms));
    v1::JobManagerHeartbeat resp;
    const grpc::Status st = stub_->Heartbeat(&ctx, req, &resp);
    const TimestampMs now = clock_.now_ms();
    if (st.ok()) {
      if (resp.jobmanager_id() != connection_.jobmanager_id()) {
        // Cannot happen with a registration id the JobManager issued; guard against a confused peer anyway.
        spdlog::warn(
            "a heartbeat reply came from JobManager {} but this TaskManager registered with {}; "
            "registering again",
            resp.jobmanager_id(), connection_.jobmanager_id());
        connection_.on_registration_unknown(now);
      } else {
        connection_.on_heartbeat_ok(now);
      }
      last_error.clear();
      return;
    }
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      spdlog::warn(
          "the JobManager {} refused this TaskManager's registration {} as stale: {}; registering again as "
          "a new registration",
          options_.jobmanager, connection_.registration_id(), st.error_message());
      connection_.on_registration_unknown(now);
      publish();
      return;
    }
    last_error = rpc::to_error(st, "Heartbeat", options_.jobmanager).message();
    spdlog::debug("{}", last_error);
    connection_.on_heartbeat_failed(sent);
  }

  void publish() {
    std::lock_guard lock(mu_);
    status_.registered = connection_.state() == JobManagerConnection::State::kRegistered;
    status_.registration_id = connection_.registration_id();
    status_.jobmanager_id = connection_.jobmanager_id();
    status_.registrations = connection_.registrations();
    status_.jobmanager_losses = connection_.jobmanager_losses();
    status_.failed_attempts = connection_.failed_attempts();
  }

  void finish() {
    publish();
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  const TaskExecutorOptions options_;
  const Clock& clock_;
  int port_ = 0;
  std::string resource_id_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::JobManagerService::Stub> stub_;
  std::thread thread_;
  JobManagerConnection connection_;  // only the connection thread touches it

  mutable std::mutex mu_;  // guards stopping_, done_, refusal_, status_
  std::condition_variable cv_;
  bool stopping_ = false;
  bool done_ = false;
  std::optional<Error> refusal_;
  TaskExecutorStatus status_;
};

Result<std::unique_ptr<TaskExecutor>> TaskExecutor::start(TaskExecutorOptions options, const Clock& clock) {
  if (options.slots < 1) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("taskmanager.numberOfTaskSlots = {}; a TaskManager needs at least 1 slot", options.slots));
  }
  if (options.jobmanager.empty()) {
    return Error(ErrorCode::kConfiguration, "a TaskManager needs the JobManager's address (--jobmanager HOST:PORT)");
  }
  auto impl = std::make_unique<Impl>(std::move(options), clock);
  SLUICE_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<TaskExecutor>(new TaskExecutor(std::move(impl)));
}

TaskExecutor::TaskExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TaskExecutor::~TaskExecutor() {
  stop();
}
const std::string& TaskExecutor::resource_id() const {
  return impl_->resource_id();
}
std::string TaskExecutor::rpc_address() const {
  return impl_->rpc_address();
}
Status TaskExecutor::wait() {
  return impl_->wait();
}
bool TaskExecutor::done() const {
  return impl_->done();
}
void TaskExecutor::stop() {
  impl_->stop();
}
TaskExecutorStatus TaskExecutor::status() const {
  return impl_->status();
}

}  // namespace sluice
