// One file over 800 lines: JobMaster (job_master.h) is one class, deployment, failover and checkpoint hooks of
// one job on the cluster, whose members share one mutex that its run loop releases and retakes; a split by
// function would spread that lock's protocol over files.
#include "sluice/cluster/jobmanager/job_master.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <random>
#include <set>
#include <thread>

#include "sluice/checkpoint/state_assignment.h"
#include "sluice/cluster/rpc/rpc_status.h"
#include "sluice/cluster/v1/taskmanager.grpc.pb.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/config.h"
#include "sluice/core/s3_client.h"

namespace sluice {
namespace v1 = ::sluice::cluster::v1;

JobMaster::JobMaster(JobMasterOptions options, const JobGraph& jg, JobManagerServer& server, const Clock& clock)
    : options_(std::move(options)), jg_(jg), server_(server), clock_(clock) {
  start_ = std::chrono::steady_clock::now();
  attempt_ = options_.first_attempt;
  server_.set_job_events(this);
}

namespace {
// Checkpoint RPCs are made by the coordinator's thread with its lock held: a TaskManager that does not answer
// must not hold up acknowledgements for long (its loss is the heartbeat monitor's to find).
constexpr int64_t kCheckpointRpcTimeoutMs = 10'000;
}  // namespace

JobMaster::~JobMaster() {
  server_.set_job_events(nullptr);
  if (coordinator_) coordinator_->stop();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cancel_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status JobMaster::init_checkpoints(const Configuration& config) {
  SLUICE_ASSIGN_OR_RETURN(auto ck, CheckpointCoordinatorOptions::from_config(config));
  std::string dir;
  std::string recovery;
  bool ignore_unclaimed = false;
  try {
    dir = config.get(options::kCheckpointDir);
    recovery = config.get(options::kStateRecoveryPath);
    ignore_unclaimed = config.get(options::kIgnoreUnclaimedState);
  } catch (const SluiceException& e) {
    return e.error();
  }
  checkpointing_ = ck.interval_ms > 0;
  if (checkpointing_ && dir.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} is set but {} is not: checkpoints need a directory that every process of the cluster "
                             "reaches (file:///path on a shared filesystem)",
                             options::kCheckpointInterval.key, options::kCheckpointDir.key));
  }
  if (dir.empty() && (!ck.savepoint_dir.empty() || !recovery.empty())) {
    dir = (std::filesystem::temp_directory_path() / "sluice-checkpoints").string();
  }
  if (dir.empty()) return ok_status();
  SLUICE_ASSIGN_OR_RETURN(auto storage, FileCheckpointStorage::create(dir, options_.job_id));
  storage_ = std::make_unique<FileCheckpointStorage>(std::move(storage));
  std::vector<CheckpointVertexInfo> vertices;
  for (const auto& v : jg_.vertices) {
    CheckpointVertexInfo info;
    info.vertex = v.id;
    info.name = v.name;
    info.parallelism = v.parallelism;
    for (int nid : v.chained_nodes) {
      info.uids.push_back(jg_.node_uid[static_cast<size_t>(nid)]);
      info.max_parallelism.push_back(jg_.node_max_parallelism[static_cast<size_t>(nid)]);
    }
    vertices.push_back(std::move(info));
  }
  int64_t first_id = 1;
  // Ids continue after every chk-<n> already in this job's directory, on a filesystem or an object store: a new
  // leader of the same job (high availability keeps the job id) must not reuse an id a former leader may still
  // be writing, nor write its files into a directory that already holds a former leader's `_metadata`.
  std::vector<FileCheckpointStorage::CheckpointDir> existing;
  if (auto dirs = storage_->checkpoint_dirs(); dirs.ok()) {
    existing = std::move(*dirs);
    for (const auto& d : existing)
      first_id = std::max(first_id, d.id + 1);
  } else {
    spdlog::warn(
        "job '{}': cannot list the checkpoint directory {}: {}; checkpoint ids continue after the restored "
        "checkpoint only",
        options_.job_name, storage_->job_dir().string(), dirs.error().to_string());
  }
  if (options_.resumed_checkpoint_id) {
    for (const auto& d : existing) {
      if (d.id <= *options_.resumed_checkpoint_id) continue;
      spdlog::info(
          "job '{}': discarding {} left by a former leader ({}; the latest-checkpoint pointer in etcd names "
          "checkpoint {}, so it never completed); this leader's checkpoint ids start at {}",
          options_.job_name, d.path.string(),
          d.complete ? "its _metadata was written but the pointer never moved to it" : "incomplete",
          *options_.resumed_checkpoint_id, first_id);
      storage_->discard(d.path);
    }
  }
  if (!recovery.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auto path, FileCheckpointStorage::resolve_restore_path(recovery));
    std::vector<std::filesystem::path> candidates{path};
    // Existence and size only (a HEAD per file on S3): reading and hashing every file here would move the whole
    // state through the JobManager before any TaskManager starts reading it; each TaskManager checks the
    // checksums of the files it reads, and a corrupted file fails its tasks naming the file.
    SLUICE_ASSIGN_OR_RETURN(auto loaded, load_for_restore(candidates, false, CheckpointFileCheck::kSize));
    std::set<std::string> uids(jg_.node_uid.begin(), jg_.node_uid.end());
    SLUICE_RETURN_IF_ERROR(check_unclaimed_state(loaded.metadata, uids, ignore_unclaimed));
    first_id = std::max(first_id, loaded.metadata.checkpoint_id + 1);
    initial_restore_ = RestorePoint{loaded.dir, loaded.metadata};
    spdlog::info("job '{}' starts from {} {} ({})", options_.job_name, snapshot_type_name(loaded.metadata.type),
                 loaded.metadata.checkpoint_id, loaded.dir.string());
  }
  coordinator_ = std::make_unique<CheckpointCoordinator>(ck, *storage_, std::move(vertices), *this, clock_, first_id);
  if (initial_restore_) coordinator_->set_initial_restore_point(*initial_restore_);
  spdlog::info("job '{}': checkpoints {} in {}", options_.job_name,
               checkpointing_ ? fmt::format("every {} ms", ck.interval_ms) : std::string("off (savepoints only)"),
               storage_->job_dir().string());
  return ok_status();
}

Status JobMaster::init_restart_strategy(const Configuration& config) {
  const uint64_t seed = std::random_device{}();  // spreads the jitter of different jobs' restarts only
  SLUICE_ASSIGN_OR_RETURN(auto strategy, make_restart_strategy(config, seed));
  restart_strategy_ = std::move(strategy);
  spdlog::info("job '{}': restart strategy {}", options_.job_name, restart_strategy_->describe());
  return ok_status();
}

int JobMaster::restarts() const {
  std::lock_guard lock(mu_);
  return restarts_;
}

void JobMaster::stop_coordinator(std::unique_lock<std::mutex>& lock) {
  if (!coordinator_) return;
  lock.unlock();
  coordinator_->stop();
  const int64_t completed = coordinator_->completed_count();
  std::string latest_path;
  if (auto latest = coordinator_->latest_restore_point()) latest_path = latest->dir.string();
  lock.lock();
  result_.completed_checkpoints = completed;
  result_.latest_checkpoint_path = latest_path;
}

void JobMaster::start() {
  if (coordinator_) coordinator_->start();
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
  std::vector<SubtaskLocation> out = placement_;
  for (auto& l : out) {
    l.attempt = attempt_;
    // SubmitTasks answered for every TaskManager: their tasks run (restoring their state first; the
    // TaskManagers report ends only, so Flink's INITIALIZING is not told apart).
    if (running_) l.execution_state = finished_.count(CheckpointTaskKey{l.vertex, l.subtask}) ? "FINISHED" : "RUNNING";
  }
  return out;
}

void JobMaster::cancel() {
  {
    std::lock_guard lock(mu_);
    if (terminal_) return;
    cancel_requested_ = true;
  }
  cv_.notify_all();
}

void JobMaster::suspend(std::string reason) {
  {
    std::lock_guard lock(mu_);
    if (terminal_) return;
    cancel_requested_ = true;
    suspend_reason_ = std::move(reason);
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

std::future<Result<std::string>> JobMaster::trigger_savepoint(std::string target_dir, bool terminate) {
  auto refuse = [](Error e) {
    std::promise<Result<std::string>> p;
    p.set_value(std::move(e));
    return p.get_future();
  };
  {
    std::lock_guard lock(mu_);
    if (terminal_ || !running_ || status_ != JobStatus::kRunning || cancel_requested_) {
      // Still RUNNING but no longer running_: attempt attempt_ failed and its tasks are being cancelled before
      // the job turns RESTARTING, which the state alone does not say.
      const std::string state = status_ == JobStatus::kRunning && !running_
                                    ? fmt::format("failing over (attempt {} failed)", attempt_)
                                    : std::string(job_status_name(status_));
      return refuse(Error(ErrorCode::kCheckpoint,
                          fmt::format("job '{}' is {}: savepoints are taken of running jobs (every task deployed); "
                                      "try again once it runs",
                                      options_.job_name, state)));
    }
  }
  if (!coordinator_) {
    return refuse(Error(ErrorCode::kConfiguration,
                        fmt::format("savepoints need checkpoint storage: set {} (a directory every process of the "
                                    "cluster reaches) and {} or pass a directory",
                                    options::kCheckpointDir.key, options::kSavepointDir.key)));
  }
  // The same path as local mode: the coordinator triggers it at the sources' TaskManagers (TriggerCheckpoint
  // with savepoint / stop_after), the TaskManagers write the state files into the savepoint's directory and the
  // coordinator writes its `_metadata`. A stop's tasks end once NotifyCheckpointComplete reached them.
  spdlog::info("job '{}': {} requested{}", options_.job_name, terminate ? "stop-with-savepoint" : "savepoint",
               target_dir.empty() ? std::string() : " into " + target_dir);
  return coordinator_->trigger_savepoint(std::move(target_dir), terminate);
}

void JobMaster::on_checkpoint_ack(CheckpointAckReport&& r) {
  {
    std::lock_guard lock(mu_);
    // Only the running attempt's tasks, from the registrations it was deployed to, take part in checkpoints.
    bool known = false;
    for (const auto& d : deployed_)
      known = known || d.tm.registration_id == r.registration_id;
    if (!coordinator_ || !running_ || r.attempt != attempt_ || !known) {
      spdlog::debug("job '{}': dropped a checkpoint {} acknowledgement of attempt {} (registration {})",
                    options_.job_name, r.checkpoint_id, r.attempt, r.registration_id);
      return;
    }
  }
  const CheckpointTaskKey key{r.vertex, r.subtask};
  if (r.declined) {
    coordinator_->decline(key, r.task_name, r.checkpoint_id, r.reason);
    return;
  }
  TaskCheckpointStats stats;
  stats.task = r.task_name;
  stats.alignment_ns = r.alignment_ns;
  stats.sync_pause_ns = r.sync_pause_ns;
  coordinator_->acknowledge_written(key, r.checkpoint_id, std::move(r.uids), std::move(r.handles), std::move(stats),
                                    r.finished_input);
}

JobMaster::Snapshot JobMaster::snapshot_locked() const {
  Snapshot s;
  s.attempt = attempt_;
  s.tms = deployed_;
  for (const auto& loc : placement_) {
    const CheckpointTaskKey k{loc.vertex, loc.subtask};
    int peer = -1;
    for (size_t i = 0; i < deployed_.size(); ++i) {
      if (deployed_[i].tm.resource_id == loc.task_manager) peer = static_cast<int>(i);
    }
    s.peer_of[k] = peer;
    if (finished_.count(k) != 0) continue;
    s.live.push_back(k);
    if (jg_.vertices[static_cast<size_t>(loc.vertex)].inputs.empty()) s.source_peers.insert(peer);
    if (end_of_input_.count(k) != 0) s.end_of_input_peers.insert(peer);
  }
  return s;
}

bool JobMaster::ready_for_checkpoint() {
  // A JobManager that may have lost its leadership (its lease not renewed for a TTL: paused, cut off) starts no
  // checkpoint; the pointer write of one already under way is fenced by etcd (publish_checkpoint).
  if (options_.is_leader && !options_.is_leader()) return false;
  std::lock_guard lock(mu_);
  return running_ && !terminal_ && !cancel_requested_;
}

CheckpointJobHooks::Triggered JobMaster::trigger(const CheckpointBarrier& barrier) {
  return trigger_into(barrier, {});
}

CheckpointJobHooks::Triggered JobMaster::trigger_into(const CheckpointBarrier& barrier,
                                                      const std::filesystem::path& dir) {
  Snapshot s;
  {
    std::lock_guard lock(mu_);
    if (!running_) return {};
    s = snapshot_locked();
  }
  Triggered t;
  t.tasks = s.live;
  std::set<int> peers = s.source_peers;
  peers.insert(s.end_of_input_peers.begin(), s.end_of_input_peers.end());
  // A savepoint's state files go to its own directory, which only the JobManager knows: it is told to every
  // TaskManager of the attempt, those without sources first, so that each knows it before a barrier of this
  // savepoint can reach its tasks (a trigger where no source and no ended task runs injects nothing).
  const bool savepoint = barrier.type != SnapshotType::kCheckpoint;
  std::vector<int> order;
  if (savepoint) {
    for (size_t peer = 0; peer < s.tms.size(); ++peer) {
      if (peers.count(static_cast<int>(peer)) == 0) order.push_back(static_cast<int>(peer));
    }
  }
  order.insert(order.end(), peers.begin(), peers.end());
  for (int peer : order) {
    if (peer < 0) continue;
    const Deployed& d = s.tms[static_cast<size_t>(peer)];
    v1::TriggerCheckpointRequest req;
    req.set_jobmanager_id(server_.jobmanager_id());
    req.set_leader_epoch(server_.leader_epoch());
    req.set_checkpoint_id(barrier.checkpoint_id);
    req.set_timestamp_ms(barrier.timestamp);
    req.set_savepoint(barrier.type != SnapshotType::kCheckpoint);
    req.set_stop_after(barrier.type == SnapshotType::kSavepointTerminate);
    req.set_attempt(s.attempt);
    req.set_at_least_once(barrier.mode == CheckpointingMode::kAtLeastOnce);
    if (savepoint) req.set_target_dir(dir.string());
    auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(d.tm.rpc_address));
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(kCheckpointRpcTimeoutMs));
    v1::TriggerCheckpointResponse resp;
    const grpc::Status st = stub->TriggerCheckpoint(&ctx, req, &resp);
    if (!st.ok()) {
      // Its tasks would never acknowledge: the checkpoint is aborted at once rather than left to expire after
      // execution.checkpointing.timeout (30 s of no checkpoint in the chaos suite).
      const std::string why = rpc::to_error(st, "TriggerCheckpoint", d.tm.rpc_address).message();
      spdlog::warn("job '{}': cannot trigger checkpoint {} on TaskManager {}: {}", options_.job_name,
                   barrier.checkpoint_id, d.tm.resource_id, why);
      if (!t.failure) {
        t.failure = fmt::format("triggering {} {} failed on TaskManager {}: {}", snapshot_type_name(barrier.type),
                                barrier.checkpoint_id, d.tm.resource_id, why);
      }
      continue;
    }
    for (const auto& [uid, bytes] : resp.coordinator_state())
      t.coordinator_state[uid] = bytes;
  }
  return t;
}

void JobMaster::trigger_task(const CheckpointTaskKey& task, const CheckpointBarrier& barrier) {
  Snapshot s;
  {
    std::lock_guard lock(mu_);
    if (!running_) return;
    s = snapshot_locked();
  }
  auto it = s.peer_of.find(task);
  if (it == s.peer_of.end() || it->second < 0) return;
  const Deployed& d = s.tms[static_cast<size_t>(it->second)];
  v1::TriggerCheckpointRequest req;
  req.set_jobmanager_id(server_.jobmanager_id());
  req.set_leader_epoch(server_.leader_epoch());
  req.mutable_subtask()->set_vertex_id(task.vertex);
  req.mutable_subtask()->set_subtask_index(task.subtask);
  req.mutable_subtask()->set_attempt(s.attempt);
  req.set_checkpoint_id(barrier.checkpoint_id);
  req.set_timestamp_ms(barrier.timestamp);
  req.set_savepoint(barrier.type != SnapshotType::kCheckpoint);
  req.set_stop_after(barrier.type == SnapshotType::kSavepointTerminate);
  req.set_attempt(s.attempt);
  req.set_at_least_once(barrier.mode == CheckpointingMode::kAtLeastOnce);
  auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(d.tm.rpc_address));
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::deadline_in(kCheckpointRpcTimeoutMs));
  v1::TriggerCheckpointResponse resp;
  const grpc::Status st = stub->TriggerCheckpoint(&ctx, req, &resp);
  if (!st.ok()) {
    spdlog::warn("job '{}': cannot trigger checkpoint {} at subtask {}/{} on TaskManager {}: {}", options_.job_name,
                 barrier.checkpoint_id, task.vertex, task.subtask, d.tm.resource_id,
                 rpc::to_error(st, "TriggerCheckpoint", d.tm.rpc_address).message());
  }
}

void JobMaster::notify_all(int64_t checkpoint_id, bool complete) {
  Snapshot s;
  {
    std::lock_guard lock(mu_);
    if (!running_) return;
    s = snapshot_locked();
  }
  for (const auto& d : s.tms) {
    auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(d.tm.rpc_address));
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::deadline_in(kCheckpointRpcTimeoutMs));
    v1::Acknowledgement ack;
    grpc::Status st;
    if (complete) {
      v1::NotifyCheckpointCompleteRequest req;
      req.set_jobmanager_id(server_.jobmanager_id());
      req.set_leader_epoch(server_.leader_epoch());
      req.set_checkpoint_id(checkpoint_id);
      req.set_attempt(s.attempt);
      st = stub->NotifyCheckpointComplete(&ctx, req, &ack);
    } else {
      v1::NotifyCheckpointAbortedRequest req;
      req.set_jobmanager_id(server_.jobmanager_id());
      req.set_leader_epoch(server_.leader_epoch());
      req.set_checkpoint_id(checkpoint_id);
      req.set_attempt(s.attempt);
      st = stub->NotifyCheckpointAborted(&ctx, req, &ack);
    }
    if (!st.ok()) {
      // A sink that misses a completion commits its transactions with the next one (or on restore).
      const char* call = complete ? "NotifyCheckpointComplete" : "NotifyCheckpointAborted";
      spdlog::warn("job '{}': {} of checkpoint {} to TaskManager {} failed: {}", options_.job_name, call, checkpoint_id,
                   d.tm.resource_id, rpc::to_error(st, call, d.tm.rpc_address).message());
    }
  }
}

Status JobMaster::before_complete(int64_t checkpoint_id, const std::filesystem::path& dir) {
  if (!options_.publish_checkpoint) return ok_status();
  // Only checkpoints (chk-<n> of the job's directory) become the pointer a new leader resumes from; a savepoint is
  // the user's (Flink neither restores from one on failover).
  if (!storage_ || dir != storage_->checkpoint_dir(checkpoint_id)) return ok_status();
  return options_.publish_checkpoint(checkpoint_id, dir.string());
}

void JobMaster::notify_complete(int64_t checkpoint_id) {
  notify_all(checkpoint_id, true);
}

void JobMaster::notify_aborted(int64_t checkpoint_id) {
  notify_all(checkpoint_id, false);
}

void JobMaster::fail_job(const Error& error) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(CheckpointFailure{error});
  }
  cv_.notify_all();
}

std::vector<JobExceptionInfo> JobMaster::exceptions() const {
  std::lock_guard lock(mu_);
  // JobClient's contract: newest first, at most kMaxExceptionHistory (exceptions_ is in the order they happened).
  std::vector<JobExceptionInfo> out(exceptions_.rbegin(), exceptions_.rend());
  if (out.size() > JobClient::kMaxExceptionHistory) out.resize(JobClient::kMaxExceptionHistory);
  return out;
}

void JobMaster::on_task_state(const TaskStateReport& report) {
  {
    std::lock_guard lock(mu_);
    // Before the event is queued: when the master thread sees the job's last task end, its counts are in.
    if (report.metrics && counts_attempt_locked(report.metrics->attempt)) {
      metrics_.record(*report.metrics, report.state != TaskState::kRunning);
    }
    events_.push_back(report);
  }
  cv_.notify_all();
}

bool JobMaster::counts_attempt_locked(int attempt) const {
  // An attempt of this JobManager (a former leader's, or a TaskManager's stale deployment of a JobManager that ran
  // before this one, would freeze or skew the counts).
  return attempt >= options_.first_attempt && attempt <= attempt_;
}

void JobMaster::on_subtask_metrics(std::vector<SubtaskMetrics>&& metrics) {
  std::lock_guard lock(mu_);
  for (const SubtaskMetrics& m : metrics) {
    if (counts_attempt_locked(m.attempt)) metrics_.record(m, false);
  }
}

std::vector<OperatorStats> JobMaster::operator_stats() const {
  {
    std::lock_guard lock(mu_);
    if (terminal_) return result_.operators;  // as local mode: the counts the job ended with
  }
  return metrics_.operators();
}

std::vector<SubtaskMetrics> JobMaster::subtask_metrics() const {
  int live_attempt;
  {
    std::lock_guard lock(mu_);
    live_attempt = terminal_ ? std::numeric_limits<int>::min() : attempt_;
  }
  return metrics_.subtasks(live_attempt);
}

void JobMaster::on_task_manager_closed(const ClosedRegistration& closed) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(closed);
  }
  cv_.notify_all();
}

std::optional<std::pair<SlotAssignment, std::vector<TaskManagerRegistration>>> JobMaster::wait_for_slots(
    std::unique_lock<std::mutex>& lock, const RestorePoint* restore) {
  // Flink's state locality: each subtask prefers the TaskManager that wrote its state, whose local copy of the
  // state files it can then read instead of the checkpoint storage.
  const PreferredLocations preferred = restore ? preferred_locations_of(jg_, restore->metadata) : PreferredLocations{};
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
    // TaskManagers that could not be reached at the last deployment are left out for a while.
    const TimestampMs now_ms = clock_.now_ms();
    std::erase_if(unreachable_until_, [&](const auto& u) { return u.second <= now_ms; });
    std::erase_if(tms,
                  [&](const TaskManagerRegistration& t) { return unreachable_until_.count(t.registration_id) != 0; });
    std::vector<SlotOffer> offers;
    for (const auto& t : tms)
      offers.push_back(SlotOffer{t.registration_id, t.slots_total, t.resource_id});
    Result<SlotAssignment> a = assign_slots(jg_, offers, options_.evenly_spread, preferred);
    if (a.ok() && a->preferred_subtasks > 0 && split_source(*a)) {
      // The preferences would put a checkpointed source on several TaskManagers, which deploy() refuses: the
      // placement without them (the old TaskManager of the source is gone, or has fewer slots).
      spdlog::info(
          "job '{}': placing the subtasks without their state-locality preferences, which would split a "
          "checkpointed source across TaskManagers",
          options_.job_name);
      a = assign_slots(jg_, offers, options_.evenly_spread);
    }
    if (a.ok()) {
      if (a->preferred_subtasks > 0) {
        spdlog::info("job '{}': placed {} of {} subtasks on the TaskManager that wrote their state ({} {})",
                     options_.job_name, a->placed_as_preferred, a->preferred_subtasks,
                     snapshot_type_name(restore->metadata.type), restore->metadata.checkpoint_id);
      }
      return std::make_pair(std::move(*a), std::move(tms));
    }
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

std::optional<std::pair<const JobVertex*, size_t>> JobMaster::split_source(const SlotAssignment& a) const {
  if (!coordinator_) return std::nullopt;
  for (const auto& v : jg_.vertices) {
    // A source's split enumerator runs in each TaskManager with readers of it (with every split assigned up
    // front); its state in a checkpoint is complete only when one TaskManager holds all the readers.
    if (!v.inputs.empty()) continue;
    std::set<int> tms_of_source;
    for (int i = 0; i < v.parallelism; ++i)
      tms_of_source.insert(a.subtasks[static_cast<size_t>(v.id)][static_cast<size_t>(i)].task_manager);
    if (tms_of_source.size() > 1) return std::make_pair(&v, tms_of_source.size());
  }
  return std::nullopt;
}

Status JobMaster::deploy(const SlotAssignment& a, const std::vector<TaskManagerRegistration>& tms,
                         const RestorePoint* restore, std::string* unreachable) {
  if (options_.record_attempt) {
    if (Status st = options_.record_attempt(attempt_); !st.ok()) {
      return st.error().with_context(fmt::format("recording deployment attempt {} in the HA store", attempt_));
    }
  }
  // Peers: the TaskManagers that hold at least one slot of the job, in registration order.
  std::vector<int> peer_of_offer(tms.size(), -1);
  v1::SubmitTasksRequest base;
  base.set_jobmanager_id(server_.jobmanager_id());
  base.set_leader_epoch(server_.leader_epoch());
  base.set_attempt(attempt_);
  base.set_job_id(options_.job_id);
  if (storage_) base.set_checkpoint_job_dir(storage_->job_dir().string());
  base.set_checkpointing(checkpointing_);
  if (restore != nullptr) base.set_restore_dir(restore->dir.string());
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
  if (auto split = split_source(a)) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("source '{}' (parallelism {}) is placed on {} TaskManagers, but a checkpointed source "
                             "must run in one TaskManager in this build (its split enumerator runs there, not yet "
                             "on the JobManager): lower the source's parallelism to at most the slots of one "
                             "TaskManager",
                             split->first->name, split->first->parallelism, split->second));
  }
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
  // Every TaskManager at once, one thread per call: a SubmitTasks returns once that TaskManager created its tasks
  // and channels (the tasks read their state afterwards, as they initialise), and one TaskManager slow to answer
  // must not hold up the others.
  std::vector<grpc::Status> results(deployed.size());
  {
    std::vector<std::jthread> calls;
    calls.reserve(deployed.size());
    for (size_t peer = 0; peer < deployed.size(); ++peer) {
      calls.emplace_back([&, peer] {
        v1::SubmitTasksRequest req = base;
        req.set_registration_id(deployed[peer].tm.registration_id);
        req.set_self(static_cast<int>(peer));
        auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(deployed[peer].tm.rpc_address));
        grpc::ClientContext ctx;
        ctx.set_deadline(rpc::deadline_in(options_.rpc_timeout_ms));
        v1::Acknowledgement ack;
        results[peer] = stub->SubmitTasks(&ctx, req, &ack);
        if (results[peer].ok()) {
          spdlog::info("job '{}': deployed {} task(s) to TaskManager {} (attempt {})", options_.job_name,
                       deployed[peer].tasks, deployed[peer].tm.resource_id, attempt_);
        }
      });
    }
  }  // joins every call
  // The failure of a TaskManager that cannot be reached first, else the first in peer order; the caller cancels
  // what the others deployed. A killed TaskManager not yet declared lost also fails the others' deployments
  // (they cannot open its data-plane connection): that is its failure, not theirs, and not the job's.
  const auto unreachable_call = [](const grpc::Status& st) {
    return st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  };
  std::optional<size_t> failed;
  for (size_t peer = 0; peer < deployed.size(); ++peer) {
    if (results[peer].ok()) continue;
    if (!failed || (unreachable_call(results[peer]) && !unreachable_call(results[*failed]))) failed = peer;
  }
  if (failed) {
    const size_t peer = *failed;
    const grpc::Status& st = results[peer];
    if (unreachable_call(st)) *unreachable = deployed[peer].tm.registration_id;
    return rpc::to_error(st, "SubmitTasks", deployed[peer].tm.rpc_address)
        .with_context(fmt::format("deploying {} task(s) of job '{}' to TaskManager {}", deployed[peer].tasks,
                                  options_.job_name, deployed[peer].tm.resource_id));
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
    // The count is what this attempt deployed there; the TaskManager says how many of them still ran.
    spdlog::info("job '{}': asking TaskManager {} to cancel the {} task(s) of attempt {} deployed to it: {}",
                 options_.job_name, d.tm.resource_id, d.tasks, attempt_, reason);
    auto stub = v1::TaskManagerService::NewStub(rpc::make_channel(d.tm.rpc_address));
    v1::CancelTasksRequest req;
    req.set_jobmanager_id(server_.jobmanager_id());
    req.set_leader_epoch(server_.leader_epoch());
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
  // A suspended job is not over (a new leader resumes it) unless it finished first; a failure racing with the
  // suspension is for the next leader's restart strategy to handle.
  if (suspend_reason_ && status != JobStatus::kFinished) status = JobStatus::kSuspended;
  running_ = false;
  status_ = status;
  status_message_.clear();
  result_.job_id = options_.job_id;
  result_.job_name = options_.job_name;
  result_.status = status;
  result_.error = std::move(error);
  result_.duration = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_);
  result_.operators = metrics_.operators();

  if (status == JobStatus::kFailed) {
    spdlog::error("job '{}' ({}) FAILED: {}", options_.job_name, options_.job_id, result_.error->to_string());
  } else if (status == JobStatus::kSuspended) {
    spdlog::info(
        "job '{}' ({}) SUSPENDED after {} ms ({}): not globally terminal, its checkpoints are kept for the "
        "next JobManager leader",
        options_.job_name, options_.job_id, result_.duration.count(), *suspend_reason_);
  } else {
    spdlog::info("job '{}' ({}) {} after {} ms", options_.job_name, options_.job_id, job_status_name(status),
                 result_.duration.count());
  }
  terminal_ = true;
  done_cv_.notify_all();
}

void JobMaster::run() {
  std::unique_lock lock(mu_);
  std::optional<RestorePoint> restore = initial_restore_;
  for (;;) {
    auto slots = wait_for_slots(lock, restore ? &*restore : nullptr);
    if (!slots) {
      stop_coordinator(lock);  // the job ended while it waited (cancel, slot.request.timeout)
      return;
    }
    status_message_.clear();
    lock.unlock();
    std::string unreachable;
    Status st = deploy(slots->first, slots->second, restore ? &*restore : nullptr, &unreachable);
    lock.lock();
    std::optional<Error> failure;
    std::string lost_registration;
    Outcome outcome = Outcome::kFailed;
    if (!st.ok()) {
      lock.unlock();
      cancel_deployed("the deployment failed", unreachable);
      lock.lock();
      if (!unreachable.empty() && restart_strategy_) {
        // A TaskManager that was killed stays registered until heartbeat.timeout: place the job without it
        // (not a failure of the job; slot.request.timeout bounds the wait for enough slots).
        spdlog::warn("job '{}': {}; placing the job without that TaskManager", options_.job_name,
                     st.error().to_string());
        unreachable_until_[unreachable] = clock_.now_ms() + options_.unreachable_exclusion_ms;
        // A new attempt: the other TaskManagers' tasks of this one report CANCELED as they go, which must not
        // count as a failure of the next deployment.
        begin_next_attempt(lock, restore);
        continue;
      }
      failure = st.error();
      exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(st.error().code())), st.error().message(),
                                             st.error().to_string(), clock_.now_ms(), "", false});
    } else {
      outcome = follow(lock, failure, lost_registration);
    }
    running_ = false;
    if (outcome != Outcome::kFailed) {
      stop_coordinator(lock);
      if (outcome == Outcome::kCanceled) {
        const std::string reason =
            suspend_reason_ ? "the job is suspended: " + *suspend_reason_ : std::string("the job is cancelled");
        lock.unlock();
        cancel_deployed(reason, "");
        lock.lock();
      }
      finish_locked(outcome == Outcome::kFinished ? JobStatus::kFinished : JobStatus::kCanceled, std::nullopt);
      return;
    }
    // The attempt failed: nothing of it may keep running or complete a checkpoint.
    lock.unlock();
    if (coordinator_) coordinator_->abort_pending("the job fails over: " + failure->message());
    if (st.ok()) cancel_deployed("the job fails over: " + failure->message(), lost_registration);
    lock.lock();
    // A failure marked non-recoverable (here, or by a TaskManager: TaskExecutionStateUpdate's
    // non_recoverable_reason) fails the job without asking the strategy, as Flink's ExecutionFailureHandler.
    FailureHandling handling;
    if (restart_strategy_ && !cancel_requested_)
      handling = handle_failure(*restart_strategy_, *failure, clock_.now_ms());
    if (!handling.restart) {
      stop_coordinator(lock);
      if (handling.unrecoverable) {
        failure = failure->with_context("restart suppressed");
      } else if (restart_strategy_ && !cancel_requested_) {
        failure = failure->with_context(
            fmt::format("the restart strategy {} allows no more restarts", restart_strategy_->describe()));
      }
      finish_locked(JobStatus::kFailed, failure);
      return;
    }
    const int64_t backoff = handling.backoff_ms;
    if (!exceptions_.empty()) exceptions_.back().restarted = true;  // the failure this restart follows
    if (exceptions_.size() > JobClient::kMaxExceptionHistory) {     // a crash loop keeps the newest only
      exceptions_.erase(exceptions_.begin(),
                        exceptions_.end() - static_cast<std::ptrdiff_t>(JobClient::kMaxExceptionHistory));
    }
    status_ = JobStatus::kRestarting;
    ++restarts_;
    spdlog::warn("job '{}' RESTARTING (restart {}, {}) in {} ms after: {}", options_.job_name, restarts_,
                 restart_strategy_->describe(), backoff, failure->to_string());
    const TimestampMs until = clock_.now_ms() + backoff;
    while (!cancel_requested_ && clock_.now_ms() < until) {
      cv_.wait_for(lock, std::chrono::milliseconds(std::clamp<int64_t>(until - clock_.now_ms(), 1, 100)));
    }
    // The next attempt: a fresh deployment of every task, restored from the latest completed checkpoint.
    begin_next_attempt(lock, restore);
    spdlog::info("job '{}': attempt {} starts from {}", options_.job_name, attempt_,
                 restore ? fmt::format("{} {} ({})", snapshot_type_name(restore->metadata.type),
                                       restore->metadata.checkpoint_id, restore->dir.string())
                         : std::string("the beginning (no completed checkpoint)"));
  }
}

void JobMaster::begin_next_attempt(std::unique_lock<std::mutex>& lock, std::optional<RestorePoint>& restore) {
  ++attempt_;
  finished_.clear();
  end_of_input_.clear();
  deployed_.clear();
  events_.clear();
  lock.unlock();
  if (coordinator_) {
    std::vector<CheckpointTaskKey> all;
    for (const auto& v : jg_.vertices) {
      for (int i = 0; i < v.parallelism; ++i)
        all.push_back(CheckpointTaskKey{v.id, i});
    }
    coordinator_->on_tasks_reset(all);
    restore = coordinator_->latest_restore_point();
  }
  lock.lock();
}

JobMaster::Outcome JobMaster::follow(std::unique_lock<std::mutex>& lock, std::optional<Error>& failure,
                                     std::string& lost_registration) {
  status_ = JobStatus::kRunning;
  running_ = true;
  size_t total = 0;
  std::set<std::string> registrations;
  for (const auto& d : deployed_) {
    total += static_cast<size_t>(d.tasks);
    registrations.insert(d.tm.registration_id);
  }
  spdlog::info("job '{}' ({}) RUNNING: {} task(s) on {} TaskManager(s) (attempt {})", options_.job_name,
               options_.job_id, total, deployed_.size(), attempt_);
  for (;;) {
    std::vector<CheckpointTaskKey> ended_input;
    std::vector<CheckpointTaskKey> finished_now;
    cv_.wait(lock, [&] { return !events_.empty() || cancel_requested_; });
    while (!events_.empty() && !failure) {
      Event e = std::move(events_.front());
      events_.pop_front();
      if (auto* r = std::get_if<TaskStateReport>(&e)) {
        // Reports of an older attempt (or from a registration this attempt was not deployed to) are stale.
        if (r->attempt != attempt_ || registrations.count(r->registration_id) == 0) continue;
        const JobVertex& v = jg_.vertices.at(static_cast<size_t>(r->vertex));
        const std::string task = fmt::format("{} ({}/{})", v.name, r->subtask + 1, v.parallelism);
        const CheckpointTaskKey key{r->vertex, r->subtask};
        if (r->state == TaskState::kRunning && r->end_of_input) {
          end_of_input_.insert(key);
          ended_input.push_back(key);
        } else if (r->state == TaskState::kFinished) {
          finished_now.push_back(key);
        } else if (r->state == TaskState::kFailed || (r->state == TaskState::kCanceled && !cancel_requested_)) {
          failure =
              r->error.value_or(Error(ErrorCode::kRuntime, fmt::format("task '{}' was cancelled", task)))
                  .with_context(fmt::format("task '{}' on TaskManager registration {}", task, r->registration_id));
          exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(failure->code())), failure->message(),
                                                 failure->to_string(), clock_.now_ms(), task, false});
        }
      } else if (auto* c = std::get_if<ClosedRegistration>(&e)) {
        if (registrations.count(c->registration.registration_id) == 0) continue;
        lost_registration = c->registration.registration_id;
        failure = Error(ErrorCode::kNetwork,
                        fmt::format("TaskManager {} (registration {}, {}) holding tasks of the job is gone: {}",
                                    c->registration.resource_id, c->registration.registration_id,
                                    c->registration.rpc_address, c->reason));
        exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(failure->code())), failure->message(),
                                               failure->to_string(), clock_.now_ms(), "", false});
      } else {
        failure = std::get<CheckpointFailure>(e).error;
        exceptions_.push_back(JobExceptionInfo{std::string(error_code_name(failure->code())), failure->message(),
                                               failure->to_string(), clock_.now_ms(), "", false});
      }
    }
    if (failure) return Outcome::kFailed;
    // The coordinator is called without mu_ (lock order: coordinator, then job).
    if (!ended_input.empty() || !finished_now.empty()) {
      lock.unlock();
      for (const auto& key : ended_input) {
        if (coordinator_) coordinator_->on_end_of_input(key);
      }
      for (const auto& key : finished_now) {
        auto mark = [&] {
          std::lock_guard l(mu_);
          finished_.insert(key);
        };
        if (coordinator_) {
          // Atomically (under the coordinator's lock) the task stops being live and its retained final state
          // takes its place in every later checkpoint.
          coordinator_->on_task_finished(key, mark);
        } else {
          mark();
        }
      }
      lock.lock();
    }
    if (finished_.size() == total) return Outcome::kFinished;
    if (cancel_requested_) return Outcome::kCanceled;
  }
}

}  // namespace sluice
