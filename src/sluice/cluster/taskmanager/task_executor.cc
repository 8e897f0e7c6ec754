// One file over 800 lines: TaskExecutor::Impl is one gRPC service (the TaskManager's RPCs, slots, checkpoint
// acks, reports to the JobManager) whose handlers share its mutexes and tables; a split would expose its
// internals in a header without separating them. The deployed tasks are in deployed_tasks.cc.
#include "sluice/cluster/taskmanager/task_executor.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/task_local_state_store.h"
#include "sluice/cluster/rpc/rpc_status.h"
#include "sluice/cluster/rpc/state_handle_proto.h"
#include "sluice/cluster/rpc/subtask_metrics_proto.h"
#include "sluice/cluster/taskmanager/deployed_tasks.h"
#include "sluice/cluster/taskmanager/jobmanager_connection.h"
#include "sluice/cluster/v1/jobmanager.grpc.pb.h"
#include "sluice/cluster/v1/taskmanager.grpc.pb.h"
#include "sluice/core/config.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace v1 = ::sluice::cluster::v1;

namespace {

grpc::Status unimplemented(const char* call) {
  return grpc::Status(
      grpc::StatusCode::UNIMPLEMENTED,
      fmt::format("{}: not served in this build (slots are freed with CancelTasks; docs/cluster.md)", call));
}

v1::ExecutionState to_proto(TaskState s) {
  switch (s) {
    case TaskState::kFinished:
      return v1::EXECUTION_STATE_FINISHED;
    case TaskState::kFailed:
      return v1::EXECUTION_STATE_FAILED;
    case TaskState::kCanceled:
      return v1::EXECUTION_STATE_CANCELED;
    case TaskState::kRunning:
      return v1::EXECUTION_STATE_RUNNING;
    case TaskState::kCreated:
      return v1::EXECUTION_STATE_DEPLOYING;
  }
  return v1::EXECUTION_STATE_UNSPECIFIED;
}

Result<net::Endpoint> parse_endpoint(const std::string& address) {
  const auto colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0) {
    return Error(ErrorCode::kConfiguration, fmt::format("data address '{}' is not HOST:PORT", address));
  }
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    port = 0;
  }
  if (port < 1 || port > 65535) {
    return Error(ErrorCode::kConfiguration, fmt::format("data address '{}' has no valid port", address));
  }
  return net::Endpoint{address.substr(0, colon), static_cast<uint16_t>(port)};
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
    if (options_.graph != nullptr) {
      // The data plane names this TaskManager by its resource id, as the JobManager's placement does.
      net::ConnectionManager::Options co;
      co.id = resource_id_;
      co.bind = net::Endpoint{options_.address, static_cast<uint16_t>(options_.data_port)};
      co.clock = &clock_;
      auto cm = net::ConnectionManager::start(co);
      if (!cm.ok()) {
        server_->Shutdown();
        server_.reset();
        return cm.error();
      }
      connections_ = std::move(*cm);
      set_up_local_state(options_.graph->config());
    }
    if (options_.find_leader) {
      spdlog::info("TaskManager {} with {} slots, RPC at {}; finding the JobManager leader through etcd", resource_id_,
                   options_.slots, rpc_address());
    } else {
      set_jobmanager(options_.jobmanager);
      spdlog::info("TaskManager {} with {} slots, RPC at {}; registering at JobManager {}", resource_id_,
                   options_.slots, rpc_address(), options_.jobmanager);
    }
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sluice-tm-conn");
      run();
    });
    ckpt_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sluice-tm-ckpt");
      run_checkpoint_writer();
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
    {
      std::lock_guard lock(ckpt_mu_);
      ckpt_stopping_ = true;
    }
    ckpt_cv_.notify_all();
    if (ckpt_thread_.joinable()) ckpt_thread_.join();
    if (server_) {
      server_->Shutdown(rpc::deadline_in(1000));
      server_->Wait();
    }
    {
      std::lock_guard lock(deploy_mu_);
      publish_deployment(nullptr, 0);
      deployed_.reset();
    }
    // The data plane before the buffer pools: its I/O thread may still write a finished sender's buffers.
    connections_.reset();
    pools_.clear();
    if (local_state_ && local_state_owned_) {
      std::error_code ec;
      std::filesystem::remove_all(local_state_->root(), ec);
    }
  }

  // taskmanager.state.local.root-dirs is a comma-separated list in Flink, which spreads a TaskManager's copies over
  // them. Here one directory holds them: the first of the list that exists or can be created (else the first,
  // whose failure is then logged), and the others are named in the log rather than read as part of one path.
  std::string choose_local_root(const std::string& value) const {
    std::vector<std::string> dirs;
    for (size_t start = 0; start <= value.size();) {
      size_t comma = value.find(',', start);
      if (comma == std::string::npos) comma = value.size();
      std::string d = value.substr(start, comma - start);
      d.erase(0, d.find_first_not_of(" \t"));
      d.erase(d.find_last_not_of(" \t") + 1);
      if (!d.empty()) dirs.push_back(std::move(d));
      start = comma + 1;
    }
    if (dirs.size() <= 1) return dirs.empty() ? std::string() : dirs.front();
    std::string chosen = dirs.front();
    for (const std::string& d : dirs) {
      std::error_code ec;
      std::filesystem::create_directories(d, ec);
      if (!ec && std::filesystem::is_directory(d, ec)) {
        chosen = d;
        break;
      }
    }
    spdlog::info(
        "TaskManager {}: taskmanager.state.local.root-dirs lists {} directories; this TaskManager keeps its "
        "local copies in one of them, {}",
        resource_id_, dirs.size(), chosen);
    return chosen;
  }

  // Task-local recovery (Flink's execution.checkpointing.local-backup.enabled / execution.state-recovery.from-local):
  // this TaskManager keeps a copy of the state files it writes for checkpoints, and with from-local its restores
  // read them. Restores need copies, so from-local enables them too.
  void set_up_local_state(const Configuration& config) {
    local_recovery_ = config.get(options::kStateRecoveryFromLocal);
    if (!local_recovery_ && !config.get(options::kLocalBackupEnabled)) return;
    std::filesystem::path root = choose_local_root(config.get(options::kLocalStateRootDir));
    if (root.empty()) {
      // Per process (the resource id is new with every start): removed when this TaskManager stops.
      std::string name = "sluice-localState-" + resource_id_;
      std::replace_if(
          name.begin(), name.end(), [](char c) { return c == ':' || c == '/'; }, '_');
      std::error_code ec;
      std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
      root = (ec ? std::filesystem::path("/tmp") : tmp) / name;
      local_state_owned_ = true;
    }
    local_state_ = std::make_shared<const TaskLocalStateStore>(root);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec || !std::filesystem::is_directory(root, ec)) {
      // Not fatal: the checkpoint storage is the primary copy; say it now rather than at the first checkpoint.
      spdlog::warn(
          "TaskManager {}: the local state root {} (taskmanager.state.local.root-dirs) is not a usable "
          "directory: {}; checkpoints will have no local copies and restores read the checkpoint storage",
          resource_id_, root.string(), ec ? ec.message() : "not a directory");
    }
    spdlog::info("TaskManager {}: local copies of checkpoint state in {} ({} restores)", resource_id_, root.string(),
                 local_recovery_ ? "read by" : "not read by");
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
    TaskExecutorStatus out;
    {
      std::lock_guard lock(mu_);
      out = status_;
    }
    std::lock_guard lock(slot_mu_);
    out.deployed_attempt = published_tasks_ != nullptr ? published_tasks_->attempt() : -1;
    out.running_tasks = published_tasks_ != nullptr ? published_tasks_->running() : 0;
    return out;
  }

  const std::string& resource_id() const { return resource_id_; }
  std::string rpc_address() const { return fmt::format("{}:{}", options_.address, port_); }
  std::string data_address() const { return connections_ ? connections_->endpoint().to_string() : ""; }

  // --- TaskManagerService: the JobManager's calls ---
  grpc::Status SubmitTasks(grpc::ServerContext*, const v1::SubmitTasksRequest* req, v1::Acknowledgement*) override {
    if (grpc::Status st = check_epoch(req->leader_epoch(), "SubmitTasks"); !st.ok()) return st;
    {
      std::lock_guard lock(mu_);
      if (!status_.registered || req->jobmanager_id() != status_.jobmanager_id ||
          req->registration_id() != status_.registration_id) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            fmt::format("TaskManager {} is registered as '{}' with JobManager '{}', not as '{}' with "
                                        "'{}': the deployment is stale",
                                        resource_id_, status_.registration_id, status_.jobmanager_id,
                                        req->registration_id(), req->jobmanager_id()));
      }
    }
    if (options_.graph == nullptr || !connections_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          fmt::format("TaskManager {} was started without a job graph and runs no tasks", resource_id_));
    }
    const JobGraph& jg = *options_.job_graph;
    DeploymentSpec spec;
    spec.attempt = req->attempt();
    spec.self = req->self();
    spec.checkpointing = req->checkpointing();
    spec.restore_dir = req->restore_dir();
    spec.lease = &lease_;
    if (local_recovery_) spec.local_state = local_state_;
    for (const auto& p : req->peers()) {
      auto ep = parse_endpoint(p.data_address());
      if (!ep.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, ep.error().message());
      spec.peers.push_back(net::TaskManagerLocation{p.resource_id(), *ep});
    }
    if (spec.self < 0 || spec.self >= static_cast<int>(spec.peers.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "SubmitTasks: 'self' is not an index into 'peers'");
    }
    spec.peer_of.resize(jg.vertices.size());
    for (const auto& v : jg.vertices)
      spec.peer_of[static_cast<size_t>(v.id)].assign(static_cast<size_t>(v.parallelism), -1);
    std::set<int> my_slots;
    for (const auto& pl : req->placement()) {
      if (pl.vertex_id() < 0 || static_cast<size_t>(pl.vertex_id()) >= jg.vertices.size() || pl.subtask_index() < 0 ||
          pl.subtask_index() >= jg.vertices[static_cast<size_t>(pl.vertex_id())].parallelism || pl.peer() < 0 ||
          pl.peer() >= static_cast<int>(spec.peers.size())) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            fmt::format("SubmitTasks: placement of vertex {} subtask {} on TaskManager {} does not "
                                        "match this TaskManager's job graph",
                                        pl.vertex_id(), pl.subtask_index(), pl.peer()));
      }
      spec.peer_of[static_cast<size_t>(pl.vertex_id())][static_cast<size_t>(pl.subtask_index())] = pl.peer();
      if (pl.peer() == spec.self) {
        if (pl.slot_index() < 0 || pl.slot_index() >= options_.slots) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              fmt::format("SubmitTasks: slot {} does not exist in TaskManager {} ({} slots)",
                                          pl.slot_index(), resource_id_, options_.slots));
        }
        my_slots.insert(pl.slot_index());
      }
    }
    for (const auto& v : jg.vertices) {
      for (int p : spec.peer_of[static_cast<size_t>(v.id)]) {
        if (p < 0) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              fmt::format("SubmitTasks: the placement leaves a subtask of vertex '{}' out", v.name));
        }
      }
    }
    std::lock_guard lock(deploy_mu_);
    apply_pending_release();
    if (options_.on_deploy) options_.on_deploy();
    if (deployed_ && deployed_->running() > 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("TaskManager {} still runs {} task(s) of attempt {}", resource_id_,
                                      deployed_->running(), deployed_->attempt()));
    }
    publish_deployment(nullptr, 0);
    deployed_.reset();
    const Configuration& config = options_.graph->config();
    const int credits = config.get(options::kBuffersPerChannel);
    const int64_t segment = config.get(options::kBufferSize);
    const size_t buffers = DeployedTasks::buffers_needed(jg, spec, credits);
    const long double bytes = static_cast<long double>(buffers) * static_cast<long double>(segment);
    if (bytes > static_cast<long double>(config.get(options::kNetworkMemoryMax))) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("the subtasks placed on TaskManager {} need {} network buffers of {} bytes, "
                                      "above {} = {} MiB",
                                      resource_id_, buffers, segment, options::kNetworkMemoryMax.key,
                                      config.get(options::kNetworkMemoryMax) >> 20));
    }
    pools_.push_back(std::make_unique<NetworkBufferPool>(static_cast<uint32_t>(segment), std::max<size_t>(buffers, 1)));
    if (!req->checkpoint_job_dir().empty()) {
      // The job's checkpoint directory, shared by every process: this TaskManager writes its tasks' state files
      // into its chk-<n>/ directories, the JobManager writes `_metadata`.
      const std::filesystem::path job_dir(req->checkpoint_job_dir());
      auto storage = FileCheckpointStorage::create(job_dir.parent_path().string(), job_dir.filename().string());
      if (!storage.ok()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            storage.error().with_context("TaskManager " + resource_id_).to_string());
      }
      std::lock_guard l(ckpt_mu_);
      storage_ = std::make_shared<const FileCheckpointStorage>(std::move(*storage));
    }
    DeployedTasks::Listener listener;
    listener.on_end = [this](const TaskEnd& end) {
      {
        std::lock_guard l(mu_);
        reports_.push_back(Report{end, false});
      }
      cv_.notify_all();
    };
    listener.on_end_of_input = [this](const TaskEnd& end) {
      {
        std::lock_guard l(mu_);
        reports_.push_back(Report{end, true});
      }
      cv_.notify_all();
    };
    listener.on_snapshot = [this](const TaskEnd& task, std::string name, TaskStateSnapshot&& snapshot) {
      {
        std::lock_guard l(ckpt_mu_);
        snapshots_.push_back(SnapshotToWrite{task, std::move(name), std::move(snapshot)});
      }
      ckpt_cv_.notify_all();
    };
    auto d =
        DeployedTasks::deploy(*options_.graph, jg, spec, *connections_, *pools_.back(), clock_, std::move(listener));
    if (!d.ok()) {
      spdlog::error("cannot deploy attempt {} on TaskManager {}: {}", spec.attempt, resource_id_,
                    d.error().to_string());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, d.error().to_string());
    }
    deployed_ = std::move(*d);
    slots_used_ = static_cast<int>(my_slots.size());
    publish_deployment(deployed_.get(), slots_used_);
    if (apply_pending_release()) {
      // The registration this deployment came with ended while it deployed (the JobManager was lost, or fenced
      // this TaskManager's tasks): its tasks are stale and already cancelled.
      return grpc::Status(grpc::StatusCode::ABORTED,
                          fmt::format("TaskManager {}: attempt {} was cancelled as it deployed: its JobManager "
                                      "registration ended meanwhile",
                                      resource_id_, spec.attempt));
    }
    spdlog::info("TaskManager {}: attempt {} deployed, {} task(s) in {} slot(s)", resource_id_, spec.attempt,
                 deployed_->task_count(), slots_used_);
    return grpc::Status::OK;
  }
  grpc::Status CancelTasks(grpc::ServerContext*, const v1::CancelTasksRequest* req, v1::Acknowledgement*) override {
    if (grpc::Status st = check_epoch(req->leader_epoch(), "CancelTasks"); !st.ok()) return st;
    {
      std::lock_guard lock(mu_);
      if (req->jobmanager_id() != status_.jobmanager_id) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            fmt::format("TaskManager {} is registered with JobManager '{}', not '{}'", resource_id_,
                                        status_.jobmanager_id, req->jobmanager_id()));
      }
    }
    release_tasks(req->attempt(), req->reason());
    return grpc::Status::OK;
  }
  grpc::Status TriggerCheckpoint(grpc::ServerContext*, const v1::TriggerCheckpointRequest* req,
                                 v1::TriggerCheckpointResponse* resp) override {
    if (grpc::Status st = check_epoch(req->leader_epoch(), "TriggerCheckpoint"); !st.ok()) return st;
    if (grpc::Status st = check_jobmanager(req->jobmanager_id()); !st.ok()) return st;
    CheckpointBarrier barrier;
    barrier.checkpoint_id = req->checkpoint_id();
    barrier.timestamp = req->timestamp_ms();
    barrier.type = req->stop_after()  ? SnapshotType::kSavepointTerminate
                   : req->savepoint() ? SnapshotType::kSavepoint
                                      : SnapshotType::kCheckpoint;
    barrier.mode = req->at_least_once() ? CheckpointingMode::kAtLeastOnce : CheckpointingMode::kExactlyOnce;
    if (!req->target_dir().empty()) {
      // A savepoint: where this TaskManager's tasks write their state for it (before any barrier can arrive).
      std::lock_guard l(ckpt_mu_);
      target_dirs_[req->checkpoint_id()] = req->target_dir();
      // Older ones are done (completed or aborted: the coordinator numbers checkpoints and savepoints in order
      // and keeps at most a few pending).
      while (target_dirs_.size() > 16)
        target_dirs_.erase(target_dirs_.begin());
    }
    std::lock_guard lock(deploy_mu_);
    // Another attempt's trigger (a JobManager decision overtaken by a restart) reaches no task.
    if (!deployed_ || deployed_->attempt() != req->attempt()) return grpc::Status::OK;
    if (req->has_subtask()) {
      deployed_->trigger_task(req->subtask().vertex_id(), req->subtask().subtask_index(), barrier);
      return grpc::Status::OK;
    }
    for (auto& [uid, bytes] : deployed_->trigger_checkpoint(barrier))
      (*resp->mutable_coordinator_state())[uid] = std::move(bytes);
    return grpc::Status::OK;
  }
  grpc::Status NotifyCheckpointComplete(grpc::ServerContext*, const v1::NotifyCheckpointCompleteRequest* req,
                                        v1::Acknowledgement*) override {
    if (grpc::Status st = check_epoch(req->leader_epoch(), "NotifyCheckpointComplete"); !st.ok()) return st;
    if (grpc::Status st = check_jobmanager(req->jobmanager_id()); !st.ok()) return st;
    {
      std::lock_guard lock(deploy_mu_);
      if (deployed_ && deployed_->attempt() == req->attempt())
        deployed_->notify_checkpoint_complete(req->checkpoint_id());
    }
    // Removing older copies (hundreds of MiB) outside deploy_mu_: deployments and triggers do not wait for it.
    if (auto job = local_state_job()) local_state_->confirm_checkpoint(*job, req->checkpoint_id());
    return grpc::Status::OK;
  }
  grpc::Status NotifyCheckpointAborted(grpc::ServerContext*, const v1::NotifyCheckpointAbortedRequest* req,
                                       v1::Acknowledgement*) override {
    if (grpc::Status st = check_epoch(req->leader_epoch(), "NotifyCheckpointAborted"); !st.ok()) return st;
    if (grpc::Status st = check_jobmanager(req->jobmanager_id()); !st.ok()) return st;
    {
      std::lock_guard lock(deploy_mu_);
      if (deployed_ && deployed_->attempt() == req->attempt())
        deployed_->notify_checkpoint_aborted(req->checkpoint_id());
    }
    if (auto job = local_state_job()) local_state_->abort_checkpoint(*job, req->checkpoint_id());
    return grpc::Status::OK;
  }
  grpc::Status FreeSlot(grpc::ServerContext*, const v1::FreeSlotRequest*, v1::Acknowledgement*) override {
    return unimplemented("FreeSlot");
  }

 private:
  struct Report {
    TaskEnd end;
    bool end_of_input = false;  // not an end: the task waits for a checkpoint of its final state
  };
  struct SnapshotToWrite {
    TaskEnd task;
    std::string name;
    TaskStateSnapshot snapshot;
  };

  std::shared_ptr<v1::JobManagerService::Stub> stub() const {
    std::lock_guard lock(stub_mu_);
    return stub_;
  }
  std::string jobmanager_address() const {
    std::lock_guard lock(stub_mu_);
    return jobmanager_address_;
  }
  void set_jobmanager(const std::string& address) {
    auto stub =
        std::shared_ptr<v1::JobManagerService::Stub>(v1::JobManagerService::NewStub(rpc::make_channel(address)));
    std::lock_guard lock(stub_mu_);
    stub_ = std::move(stub);
    jobmanager_address_ = address;
  }

  // A call of a JobManager whose leader epoch is older than one this TaskManager has seen comes from a former
  // leader (paused past its lease, cut off): it must have no effect.
  grpc::Status check_epoch(int64_t epoch, const char* call) const {
    const int64_t highest = highest_epoch_.load();
    if (epoch >= highest) return grpc::Status::OK;
    spdlog::warn("TaskManager {}: refused {} of a former JobManager leader (epoch {}; the current leader's is {})",
                 resource_id_, call, epoch, highest);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        fmt::format("TaskManager {} refuses {} from a former JobManager leader: its leader epoch {} is "
                                    "older than {}, the current leader's",
                                    resource_id_, call, epoch, highest));
  }

  // The job whose local state copies this TaskManager keeps, when it keeps any.
  std::optional<std::string> local_state_job() {
    if (!local_state_) return std::nullopt;
    std::lock_guard l(ckpt_mu_);
    if (!storage_) return std::nullopt;
    return storage_->job_id();
  }

  grpc::Status check_jobmanager(const std::string& jobmanager_id) {
    std::lock_guard lock(mu_);
    if (jobmanager_id == status_.jobmanager_id) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        fmt::format("TaskManager {} is registered with JobManager '{}', not '{}'", resource_id_,
                                    status_.jobmanager_id, jobmanager_id));
  }

  // The checkpoint writer thread (the asynchronous part of the tasks' checkpoints here): writes each snapshot's
  // state files into the checkpoint's directory, then acknowledges it to the JobManager with their handles, or
  // declines it with the error.
  void run_checkpoint_writer() {
    for (;;) {
      SnapshotToWrite job;
      std::shared_ptr<const FileCheckpointStorage> storage;
      std::string target_dir;  // a savepoint's directory; "" for a checkpoint (chk-<n>/ of the job's directory)
      {
        std::unique_lock lock(ckpt_mu_);
        ckpt_cv_.wait(lock, [&] { return ckpt_stopping_ || !snapshots_.empty(); });
        if (ckpt_stopping_) return;
        job = std::move(snapshots_.front());
        snapshots_.pop_front();
        storage = storage_;
        auto t = target_dirs_.find(job.snapshot.checkpoint_id);
        if (t != target_dirs_.end()) target_dir = t->second;
      }
      std::string registration;
      {
        std::lock_guard lock(mu_);
        registration = status_.registration_id;
      }
      const int64_t id = job.snapshot.checkpoint_id;
      v1::SubtaskId subtask;
      subtask.set_vertex_id(job.task.vertex);
      subtask.set_subtask_index(job.task.subtask);
      subtask.set_attempt(job.task.attempt);
      std::optional<Error> error;
      v1::AcknowledgeCheckpointRequest ack;
      if (storage == nullptr) {
        error = Error(ErrorCode::kCheckpoint, "the TaskManager got no checkpoint directory with its tasks");
      } else {
        const std::filesystem::path dir =
            target_dir.empty() ? storage->checkpoint_dir(id) : std::filesystem::path(target_dir);
        std::filesystem::path local_dir;  // checkpoints only: savepoints are not kept locally
        if (local_state_ && target_dir.empty()) {
          auto d = local_state_->init_checkpoint(storage->job_id(), id);
          if (d.ok()) {
            local_dir = std::move(*d);
            if (local_copy_failing_.exchange(false)) {
              spdlog::info("TaskManager {}: checkpoint {} of {} has local copies again in {}", resource_id_, id,
                           job.name, local_state_->root().string());
            }
          } else if (!local_copy_failing_.exchange(true)) {
            // Once per outage, not per subtask and checkpoint: every snapshot would repeat it every interval.
            spdlog::warn(
                "TaskManager {}: checkpoint {} of {} gets no local copy: {}; checkpoints go on without local "
                "copies (restores read the checkpoint storage), not logged again until a copy is written",
                resource_id_, id, job.name, d.error().message());
          }
        }
        for (const auto& op : job.snapshot.operators) {
          if (op.operator_state.empty() && op.keyed == nullptr) continue;
          Result<OperatorSubtaskStateHandle> h = storage->write_subtask_state(
              dir, op.operator_uid, job.task.subtask, op.operator_state, op.keyed.get(), nullptr, local_dir);
          if (!h.ok()) {
            error = h.error().with_context(
                fmt::format("TaskManager {} writing the state of '{}' for checkpoint {}", resource_id_, job.name, id));
            break;
          }
          v1::StateHandle* sh = ack.add_state();
          sh->set_operator_uid(op.operator_uid);
          rpc::to_proto(*h, sh);
        }
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(rpc::deadline_in(std::max<int64_t>(5000, connection_heartbeat_timeout_ms_.load())));
      v1::Acknowledgement reply;
      grpc::Status st;
      const char* call = "AcknowledgeCheckpoint";
      if (error) {
        spdlog::warn("declining checkpoint {} of {}: {}", id, job.name, error->to_string());
        v1::DeclineCheckpointRequest req;
        req.set_registration_id(registration);
        *req.mutable_subtask() = subtask;
        req.set_checkpoint_id(id);
        req.set_reason(error->to_string());
        call = "DeclineCheckpoint";
        st = stub()->DeclineCheckpoint(&ctx, req, &reply);
      } else {
        ack.set_registration_id(registration);
        *ack.mutable_subtask() = subtask;
        ack.set_checkpoint_id(id);
        ack.set_alignment_ns(job.snapshot.alignment_ns);
        ack.set_sync_duration_ns(job.snapshot.sync_pause_ns);
        ack.set_finished_input(job.snapshot.finished_input);
        ack.set_task_name(job.name);
        st = stub()->AcknowledgeCheckpoint(&ctx, ack, &reply);
      }
      if (!st.ok()) {
        // The checkpoint then expires on the JobManager (execution.checkpointing.timeout).
        spdlog::warn("cannot send {} of checkpoint {} for {}: {}", call, id, job.name,
                     rpc::to_error(st, call, jobmanager_address()).message());
      }
    }
  }

  // The connection thread: asks the state machine what to do, does it, reports the outcome.
  void run() {
    std::string last_error;
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) break;
      }
      const TimestampMs now = clock_.now_ms();
      retry_pending_release();
      fence_stale_tasks(now);
      if (connection_.check_jobmanager(now)) {
        spdlog::warn(
            "JobManager {} lost: no heartbeat reply for {} ms (heartbeat.timeout {} ms; last error: {}); this "
            "TaskManager registers again",
            jobmanager_address(), now - connection_.last_reply_ms(), connection_.heartbeat().timeout_ms,
            last_error.empty() ? "none" : last_error);
        publish();
        release_tasks_soon("the JobManager was lost");
      }
      if (options_.find_leader && !follow_leader(now)) {
        // No leader known yet (an election under way, etcd out of reach): look again shortly.
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, options_.leader_poll_ms)),
                     [&] { return stopping_; });
        continue;
      }
      send_reports();
      watch_sources(now);
      const JobManagerConnection::Action a = connection_.next_action(now);
      switch (a.kind) {
        case JobManagerConnection::Action::Kind::kStop:
          finish();
          return;
        case JobManagerConnection::Action::Kind::kWait: {
          std::unique_lock lock(mu_);
          TimestampMs until = options_.find_leader ? std::min(a.wait_until_ms, next_leader_check_ms_) : a.wait_until_ms;
          if (options_.source_connections && connection_.state() == JobManagerConnection::State::kRegistered) {
            until = std::min(until, now + std::max<int64_t>(1, options_.source_poll_ms));
          }
          cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, until - now)),
                       [&] { return stopping_ || !reports_.empty(); });
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
      const grpc::Status st = stub()->DisconnectTaskManager(&ctx, req, &ack);
      if (!st.ok()) spdlog::warn("{}", rpc::to_error(st, "DisconnectTaskManager", jobmanager_address()).message());
    }
    finish();
  }

  // With high availability: reads the leader from etcd every leader_poll_ms. A leader of another epoch than the
  // one registered with replaces it: the tasks of the former leader are cancelled (it deployed them; the new one
  // restores the job from its latest checkpoint), and this TaskManager registers with the new leader. Returns
  // false while no JobManager is known at all.
  bool follow_leader(TimestampMs now) {
    if (connection_.state() == JobManagerConnection::State::kRefused) return true;
    const bool have_jobmanager = stub() != nullptr;
    if (now < next_leader_check_ms_ && have_jobmanager) return true;
    next_leader_check_ms_ = now + options_.leader_poll_ms;
    Result<std::optional<JobManagerLeader>> leader = options_.find_leader();
    if (!leader.ok()) {
      if (!leader_error_logged_) {
        spdlog::warn("TaskManager {}: cannot read the JobManager leader from etcd: {}", resource_id_,
                     leader.error().to_string());
      }
      leader_error_logged_ = true;
      return have_jobmanager;
    }
    leader_error_logged_ = false;
    if (!leader->has_value()) return have_jobmanager;  // between terms: the next leader appears soon
    const JobManagerLeader& l = **leader;
    int64_t highest = highest_epoch_.load();
    while (l.epoch > highest && !highest_epoch_.compare_exchange_weak(highest, l.epoch)) {
    }
    const bool registered = connection_.state() == JobManagerConnection::State::kRegistered;
    if (registered && l.epoch != registered_epoch_) {
      spdlog::warn(
          "TaskManager {}: a new JobManager leader (epoch {}) at {}; it was epoch {} at {}: registering with "
          "the new leader",
          resource_id_, l.epoch, l.address, registered_epoch_, jobmanager_address());
      connection_.on_registration_unknown(now);
      publish();
      release_tasks_soon("a new JobManager leader was elected");
    }
    if (l.address != jobmanager_address()) {
      if (!registered)
        spdlog::info("TaskManager {}: the JobManager leader (epoch {}) is at {}", resource_id_, l.epoch, l.address);
      set_jobmanager(l.address);
    }
    return true;
  }

  void register_once(int64_t deadline_ms, std::string& last_error) {
    v1::RegisterTaskManagerRequest req;
    req.set_resource_id(resource_id_);
    req.set_rpc_address(rpc_address());
    req.set_data_address(data_address());
    req.set_slots(options_.slots);
    req.mutable_job()->set_fingerprint(options_.job.fingerprint);
    req.mutable_job()->set_job_name(options_.job.job_name);
    req.mutable_job()->set_build_version(options_.job.build_version);
    req.mutable_job()->set_pipeline_digest(options_.job.pipeline_digest);
    req.set_pid(::getpid());
    req.set_hostname(hostname());
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(deadline_ms));
    v1::RegisterTaskManagerResponse resp;
    const TimestampMs sent = clock_.now_ms();
    const grpc::Status st = stub()->RegisterTaskManager(&ctx, req, &resp);
    const TimestampMs now = clock_.now_ms();
    if (st.ok()) {
      lease_from_ms_ = sent;
      lease_.extend_until(sent + resp.heartbeat_timeout_ms());
      registered_epoch_ = resp.leader_epoch();
      int64_t highest = highest_epoch_.load();
      while (resp.leader_epoch() > highest && !highest_epoch_.compare_exchange_weak(highest, resp.leader_epoch())) {
      }
      connection_.on_registered(resp.registration_id(), resp.jobmanager_id(),
                                HeartbeatOptions{resp.heartbeat_interval_ms(), resp.heartbeat_timeout_ms()}, now);
      connection_heartbeat_timeout_ms_.store(resp.heartbeat_timeout_ms());
      sent_source_states_.clear();  // a new registration is told its sources' states with the next pass
      last_error.clear();
      spdlog::info("registered at JobManager {} (jobmanager id {}) as registration {} with {} slots",
                   jobmanager_address(), resp.jobmanager_id(), resp.registration_id(), options_.slots);
      publish();
      return;
    }
    const Error e = rpc::to_error(st, "RegisterTaskManager", jobmanager_address());
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
    // gRPC's words for a peer that answers HTTP/1.x: the REST port (or another web server), not the RPC service.
    const bool http1 = e.message().find("http1.x server") != std::string::npos;
    spdlog::warn("registration attempt {} at JobManager {} failed: {}{}; next attempt in {} ms",
                 connection_.failed_attempts(), jobmanager_address(), e.message(),
                 http1 ? " (that address answers HTTP/1.x: is it the JobManager's REST port? --jobmanager takes its "
                         "RPC port, --rpc-port / jobmanager.rpc.port, default 6123)"
                       : "",
                 wait);
    publish();
  }

  // What a change of makes the next heartbeat go at once: which reader subtasks run, and whether each is connected
  // (not for how long, nor the reason's text).
  static std::vector<std::tuple<std::string, std::string, int, bool>> connection_states(
      const std::vector<SourceConnectionReport>& reports) {
    std::vector<std::tuple<std::string, std::string, int, bool>> out;
    out.reserve(reports.size());
    for (const auto& r : reports)
      out.emplace_back(r.source, r.description, r.subtask, r.connected);
    std::sort(out.begin(), out.end());
    return out;
  }

  // A source reader that lost or regained its connection is told to the JobManager with the next pass of this
  // thread, not up to one heartbeat.interval later: its /health must turn within 5 s of the loss, and the
  // connectors take about 3 s to report one (connectors/source_connection.h).
  void watch_sources(TimestampMs now) {
    if (!options_.source_connections || connection_.state() != JobManagerConnection::State::kRegistered) return;
    if (connection_states(options_.source_connections()) != sent_source_states_) connection_.heartbeat_now(now);
  }

  void heartbeat_once(int64_t deadline_ms, std::string& last_error) {
    v1::TaskManagerHeartbeat req;
    req.set_registration_id(connection_.registration_id());
    req.set_resource_id(resource_id_);
    req.mutable_slot_report()->set_slots_total(options_.slots);
    req.mutable_slot_report()->set_slots_free(options_.slots - slots_in_use());
    if (options_.source_connections) {
      const std::vector<SourceConnectionReport> sources = options_.source_connections();
      for (const SourceConnectionReport& r : sources) {
        v1::SourceConnectionStatus* c = req.add_source_connections();
        c->set_source(r.source);
        c->set_description(r.description);
        c->set_subtask(r.subtask);
        c->set_connected(r.connected);
        c->set_disconnected_ms(r.disconnected_ms);
        c->set_reason(r.reason);
      }
      // Also when the call fails: the next heartbeat (one interval on) carries the state then, and a JobManager out
      // of reach is not called in a loop.
      sent_source_states_ = connection_states(sources);
    }
    if (options_.source_lags) {
      for (const SourceLagReport& r : options_.source_lags()) {
        v1::SourceLagStatus* l = req.add_source_lags();
        l->set_source(r.source);
        l->set_description(r.description);
        l->set_lag_ms(r.lag_ms);
      }
    }
    {
      // The published deployment lives while slot_mu_ is held (it is cleared before it is destroyed).
      std::lock_guard lock(slot_mu_);
      if (published_tasks_ != nullptr) {
        for (const SubtaskMetrics& m : published_tasks_->task_metrics())
          rpc::to_proto(m, req.add_subtask_metrics());
      }
    }
    const TimestampMs sent = clock_.now_ms();
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(deadline_ms));
    v1::JobManagerHeartbeat resp;
    const grpc::Status st = stub()->Heartbeat(&ctx, req, &resp);
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
        lease_from_ms_ = std::max(lease_from_ms_, sent);
        lease_.extend_until(lease_from_ms_ + connection_.heartbeat().timeout_ms);
      }
      last_error.clear();
      return;
    }
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      spdlog::warn(
          "the JobManager {} refused this TaskManager's registration {} as stale: {}; registering again as "
          "a new registration",
          jobmanager_address(), connection_.registration_id(), st.error_message());
      connection_.on_registration_unknown(now);
      publish();
      release_tasks_soon("the JobManager no longer knows this TaskManager's registration");
      return;
    }
    last_error = rpc::to_error(st, "Heartbeat", jobmanager_address()).message();
    spdlog::debug("{}", last_error);
    connection_.on_heartbeat_failed(sent);
  }

  // The fence of a TaskManager that was paused (SIGSTOP, a frozen VM) or cut off: the JobManager declares it lost
  // heartbeat.timeout after the last heartbeat it received, which came no earlier than the send of the last
  // heartbeat answered here. Once that much time has passed since that send, the JobManager may have declared
  // this TaskManager lost and moved or failed its tasks, so they are cancelled now, before the next heartbeat
  // asks whether the registration still stands (check_jobmanager waits for that answer): a woken TaskManager's
  // stale tasks stop within one pass of this thread instead of one heartbeat round trip or timeout later.
  void fence_stale_tasks(TimestampMs now) {
    if (connection_.state() != JobManagerConnection::State::kRegistered) return;
    const int64_t silent = now - lease_from_ms_;
    if (silent < connection_.heartbeat().timeout_ms) return;
    {
      std::lock_guard lock(slot_mu_);
      if (published_tasks_ == nullptr) return;
    }
    release_tasks_soon(
        fmt::format("no heartbeat reply for {} ms (heartbeat.timeout {} ms): the JobManager is gone or has "
                    "declared this TaskManager lost by now, so its tasks are stale",
                    silent, connection_.heartbeat().timeout_ms));
    // The JobManager may not have declared it lost (its answers were only late, on a loaded machine): it would then
    // wait on tasks that are gone, the job RUNNING with every checkpoint expiring (seen in the chaos suite: 4 minutes
    // until something else failed the job over). A new registration closes the old one on the JobManager, which
    // fails the job over at once; if it did declare this TaskManager lost, registering again is what comes next
    // anyway.
    spdlog::warn("TaskManager {}: registers again so that the JobManager restarts the job without its cancelled tasks",
                 resource_id_);
    connection_.on_tasks_fenced(now);
    publish();
  }

  // Reads only the published deployment: a heartbeat never waits for a deployment (a state restore can take
  // longer than heartbeat.timeout, and the JobManager would declare this TaskManager lost meanwhile).
  int slots_in_use() {
    std::lock_guard lock(slot_mu_);
    return published_tasks_ != nullptr && published_tasks_->running() > 0 ? published_slots_ : 0;
  }

  // Under deploy_mu_, whenever deployed_ changes: what slots_in_use() and status() read. `tasks` is cleared here
  // before the DeployedTasks it names is destroyed.
  void publish_deployment(const DeployedTasks* tasks, int slots) {
    std::lock_guard lock(slot_mu_);
    published_tasks_ = tasks;
    published_slots_ = slots;
  }

  // The connection thread's release of whatever runs: at once when no deployment (or other call) holds
  // deploy_mu_, else handed to that holder (a SubmitTasks applies it when its deployment ends) and retried on the
  // next pass of the connection thread, so that the thread goes on with its heartbeats and registration.
  void release_tasks_soon(const std::string& reason) {
    {
      std::lock_guard lock(slot_mu_);
      if (!pending_release_) pending_release_ = reason;
    }
    std::unique_lock lock(deploy_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      spdlog::info("TaskManager {}: a deployment is under way; its tasks are cancelled when it ends ({})", resource_id_,
                   reason);
      return;
    }
    apply_pending_release();
  }

  // Under deploy_mu_: performs a release that release_tasks_soon left pending; returns whether there was one.
  bool apply_pending_release() {
    std::optional<std::string> reason;
    {
      std::lock_guard lock(slot_mu_);
      reason.swap(pending_release_);
    }
    if (!reason) return false;
    release_locked(-1, *reason);
    return true;
  }

  // Retries a pending release on the connection thread without waiting for deploy_mu_.
  void retry_pending_release() {
    {
      std::lock_guard lock(slot_mu_);
      if (!pending_release_) return;
    }
    std::unique_lock lock(deploy_mu_, std::try_to_lock);
    if (lock.owns_lock()) apply_pending_release();
  }

  // Cancels and releases the tasks of `attempt` (-1: whatever runs); their slots are free when it returns.
  void release_tasks(int attempt, const std::string& reason) {
    std::lock_guard lock(deploy_mu_);
    release_locked(attempt, reason);
  }

  // release_tasks under deploy_mu_.
  void release_locked(int attempt, const std::string& reason) {
    std::unique_ptr<DeployedTasks> gone;
    {
      if (!deployed_ || (attempt >= 0 && deployed_->attempt() != attempt)) return;
      if (const size_t running = deployed_->running(); running > 0) {
        // Counted here, not as deployed: tasks that already ended (finished, or failed on a lost connection)
        // have nothing left to cancel.
        spdlog::warn(
            "TaskManager {}: cancelling the {} running task(s) of attempt {} ({} deployed here, {} already "
            "ended): {}",
            resource_id_, running, deployed_->attempt(), deployed_->task_count(), deployed_->task_count() - running,
            reason);
      }
      publish_deployment(nullptr, 0);
      gone = std::move(deployed_);
      const int attempt_gone = gone->attempt();
      gone.reset();  // cancels and joins (under deploy_mu_: a SubmitTasks waits until the slots are free)
      spdlog::info("TaskManager {}: the tasks of attempt {} are cancelled and released", resource_id_, attempt_gone);
    }
    if (attempt < 0) {
      // Nobody wants the ends of tasks deployed by a JobManager that is gone.
      std::lock_guard lock(mu_);
      reports_.clear();
    }
  }

  // Sends the queued task ends to the JobManager (connection thread).
  void send_reports() {
    std::deque<Report> batch;
    std::string registration;
    {
      std::lock_guard lock(mu_);
      batch.swap(reports_);
      registration = status_.registration_id;
    }
    for (const Report& report : batch) {
      const TaskEnd& e = report.end;
      v1::TaskExecutionStateUpdate req;
      req.set_end_of_input(report.end_of_input);
      req.set_registration_id(registration);
      req.mutable_subtask()->set_vertex_id(e.vertex);
      req.mutable_subtask()->set_subtask_index(e.subtask);
      req.mutable_subtask()->set_attempt(e.attempt);
      req.mutable_subtask()->set_vertex_uid(
          options_.job_graph != nullptr
              ? options_.job_graph->node_uid[static_cast<size_t>(
                    options_.job_graph->vertices[static_cast<size_t>(e.vertex)].chained_nodes[0])]
              : "");
      req.set_state(to_proto(e.state));
      if (e.metrics && !report.end_of_input) rpc::to_proto(*e.metrics, req.mutable_metrics());
      if (e.error) {
        req.set_error_code(std::string(error_code_name(e.error->code())));
        req.set_error_message(e.error->to_string());
        req.set_non_recoverable_reason(non_recoverable_reason(*e.error));
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(rpc::deadline_in(std::max<int64_t>(1000, connection_.heartbeat().interval_ms)));
      v1::Acknowledgement ack;
      const grpc::Status st = stub()->UpdateTaskExecutionState(&ctx, req, &ack);
      if (!st.ok()) {
        spdlog::warn("cannot report the end of subtask {}/{} (attempt {}) to the JobManager: {}", e.vertex, e.subtask,
                     e.attempt, rpc::to_error(st, "UpdateTaskExecutionState", jobmanager_address()).message());
      }
    }
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
  // lease_from_ms_ + heartbeat.timeout, which the tasks read themselves: woken from SIGSTOP they may run before
  // this thread's fence_stale_tasks does. Declared before deployed_, so that it outlives the tasks.
  TaskLease lease_{clock_};
  int port_ = 0;
  std::string resource_id_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex stub_mu_;
  std::shared_ptr<v1::JobManagerService::Stub> stub_;  // guarded by stub_mu_: the current JobManager's
  std::string jobmanager_address_;                     // guarded by stub_mu_
  int64_t registered_epoch_ = 0;                       // the connection thread's: the leader epoch registered with
  TimestampMs next_leader_check_ms_ = 0;               // the connection thread's
  bool leader_error_logged_ = false;                   // the connection thread's
  std::atomic<int64_t> highest_epoch_{0};              // the highest leader epoch seen: older calls are refused
  std::thread thread_;
  JobManagerConnection connection_;  // only the connection thread touches it

  std::unique_ptr<net::ConnectionManager> connections_;
  std::vector<std::unique_ptr<NetworkBufferPool>> pools_;  // every attempt's; outlive connections_
  mutable std::mutex deploy_mu_;                           // guards deployed_, slots_used_
  std::unique_ptr<DeployedTasks> deployed_;
  int slots_used_ = 0;
  // What the connection thread reads of the deployment (it never takes deploy_mu_, which a deployment holds for
  // its whole state restore): set with deployed_, cleared before the DeployedTasks is destroyed. Guards also
  // pending_release_ (a release the connection thread asked for while deploy_mu_ was held).
  mutable std::mutex slot_mu_;
  const DeployedTasks* published_tasks_ = nullptr;
  int published_slots_ = 0;
  std::optional<std::string> pending_release_;
  // The source connection states the last heartbeat carried (connection thread only; see watch_sources).
  std::vector<std::tuple<std::string, std::string, int, bool>> sent_source_states_;
  // Send time of the last registration or heartbeat the JobManager answered (connection thread only).
  TimestampMs lease_from_ms_ = 0;

  std::atomic<int64_t> connection_heartbeat_timeout_ms_{0};
  std::mutex ckpt_mu_;  // guards storage_, snapshots_, ckpt_stopping_
  std::condition_variable ckpt_cv_;
  std::shared_ptr<const FileCheckpointStorage> storage_;
  // Local state copies (set in start(), then read-only): null when neither local backup nor local recovery is on.
  std::shared_ptr<const TaskLocalStateStore> local_state_;
  std::atomic<bool> local_copy_failing_{false};  // the last local copy directory could not be created
  bool local_state_owned_ = false;               // the default root, this process's own: removed in stop()
  bool local_recovery_ = false;                  // execution.state-recovery.from-local: restores read the copies
  std::map<int64_t, std::string> target_dirs_;   // savepoint id -> its directory (guarded by ckpt_mu_)
  std::deque<SnapshotToWrite> snapshots_;
  bool ckpt_stopping_ = false;
  std::thread ckpt_thread_;

  mutable std::mutex mu_;  // guards stopping_, done_, refusal_, status_, reports_
  std::condition_variable cv_;
  std::deque<Report> reports_;
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
  if (options.jobmanager.empty() && !options.find_leader) {
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
std::string TaskExecutor::data_address() const {
  return impl_->data_address();
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
