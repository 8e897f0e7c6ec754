// One file over 800 lines: LocalJob, the mini-cluster's job (job master, region scheduler, failover, checkpoint
// hooks), is one class whose members share one mutex, released and retaken by its *_locked functions; a split
// by function would only spread that protocol over files. Issue 19 leaves its split to the cluster-mode work.
#include "sluice/cluster/local_cluster.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "sluice/checkpoint/checkpoint_coordinator.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/state_assignment.h"
#include "sluice/cluster/failover_regions.h"
#include "sluice/cluster/restart_strategy.h"
#include "sluice/cluster/task_deployment.h"
#include "sluice/cluster/task_metrics.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/redact.h"
#include "sluice/core/s3_client.h"
#include "sluice/graph/job_graph.h"
#include "sluice/operators/source_operator.h"
#include "sluice/runtime/buffer_pool.h"
#include "sluice/runtime/channel.h"
#include "sluice/runtime/task.h"

namespace sluice {

const char* job_status_name(JobStatus s) {
  switch (s) {
    case JobStatus::kCreated:
      return "CREATED";
    case JobStatus::kRunning:
      return "RUNNING";
    case JobStatus::kRestarting:
      return "RESTARTING";
    case JobStatus::kFailing:
      return "FAILING";
    case JobStatus::kFinished:
      return "FINISHED";
    case JobStatus::kFailed:
      return "FAILED";
    case JobStatus::kCanceled:
      return "CANCELED";
    case JobStatus::kSuspended:
      return "SUSPENDED";
  }
  return "UNKNOWN";
}

namespace {

std::string new_job_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;  // only for a unique id, never for data
  uint64_t a = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}{:016x}", a, counter.fetch_add(1) + 1);
}

enum class RegionState { kRunning, kFailing, kRestarting, kFinished, kFailed, kCanceled };

bool region_terminal(RegionState s) {
  return s == RegionState::kFinished || s == RegionState::kFailed || s == RegionState::kCanceled;
}

// One deployment of a failover region: its tasks, their channels and the coordinators of its sources.
struct RegionAttempt {
  int number = 0;
  // Declaration order matters for teardown: tasks (and their input processors, which recycle held buffers
  // into channels) go first, then the channels, which give their buffers back to the pool.
  std::vector<std::unique_ptr<LocalChannel>> channels;
  std::map<int, std::shared_ptr<SourceCoordinatorBase>> coordinators;  // by stream node id
  std::vector<std::unique_ptr<Task>> tasks;
  std::vector<std::pair<int, StreamOperatorBase*>> operators;  // (stream node id, operator)
  size_t terminated = 0;
  std::set<Task*> exited;        // terminated as FINISHED
  std::set<Task*> end_of_input;  // waiting for a checkpoint of their final state
};

// Frees the keyed state of torn-down region attempts on a thread of its own. Freeing a large keyed state
// takes long (1.4 s for 1 GiB of heap state: a million strings and hash-table entries), and a restarting
// region must not wait for it: the tasks were joined already, so nothing uses that state any more. The rest
// of an attempt is destroyed at once: the operators (a sink's client must be gone before the restarted
// region writes, or it could still deliver older records after newer ones), the tasks, and the channels
// with their network buffers, which the restarted region needs. The job drains the disposer before it
// reports its end.
class OperatorDisposer {
 public:
  OperatorDisposer() = default;
  OperatorDisposer(const OperatorDisposer&) = delete;
  OperatorDisposer& operator=(const OperatorDisposer&) = delete;
  ~OperatorDisposer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void dispose(std::shared_ptr<void> owner) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(owner));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    cv_.notify_all();
  }

  /// Waits until everything queued so far was destroyed.
  void drain() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  void run() {
    pthread_setname_np(pthread_self(), "sluice-dispose");
    // Below the task threads: a restored task decoding its state should get the CPU first (best effort;
    // an unprivileged process may always lower its own threads' priority).
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      std::shared_ptr<void> owner = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      owner.reset();
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<void>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

struct Region {
  std::vector<int> vertices;
  RegionState state = RegionState::kRunning;
  std::unique_ptr<RegionAttempt> attempt;
  int attempts = 0;
  std::optional<Error> failure;
  TimestampMs restart_at_ms = 0;  // when a restarting region redeploys (the job's Clock)
};

struct JobEvent {
  enum Kind { kTaskTerminated, kFailJob } kind = kTaskTerminated;
  Task* task = nullptr;
  TaskState state = TaskState::kFinished;
  std::optional<Error> error;
};

class LocalJob final : public JobClient::Impl, public TaskListener, public CheckpointJobHooks {
 public:
  LocalJob(std::shared_ptr<StreamGraph> graph, std::string name, const Clock& clock)
      : graph_(std::move(graph)), name_(std::move(name)), id_(new_job_id()), clock_(clock) {}

  ~LocalJob() override {
    cancel();
    if (master_.joinable()) master_.join();
    if (coordinator_) coordinator_->stop();
  }

  Status prepare(JobGraph jg);
  Status start();

  // --- JobClient::Impl ---
  const std::string& job_id() const override { return id_; }
  JobStatus status() const override {
    std::lock_guard lock(mu_);
    if (status_ != JobStatus::kRunning) return status_;
    if (failing_) return JobStatus::kFailing;
    for (const auto& r : regions_) {
      // From the failure on (its tasks being cancelled, the backoff, the redeployment) until it runs again.
      if (r.state == RegionState::kFailing || r.state == RegionState::kRestarting) return JobStatus::kRestarting;
    }
    return JobStatus::kRunning;
  }
  void cancel() override {
    {
      std::lock_guard lock(mu_);
      if (status_ != JobStatus::kRunning || cancel_requested_) return;
      cancel_requested_ = true;
    }
    cv_.notify_all();
  }
  JobResult wait() override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return terminal_; });
    return result_;
  }
  bool wait_for(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    return done_cv_.wait_for(lock, timeout, [&] { return terminal_; });
  }
  std::future<Result<std::string>> trigger_savepoint(std::string target_dir, bool terminate) override {
    {
      std::lock_guard lock(mu_);
      if (terminal_ || status_ != JobStatus::kRunning) {
        std::promise<Result<std::string>> p;
        p.set_value(Error(ErrorCode::kCheckpoint, fmt::format("job '{}' is {}: savepoints are taken of running jobs",
                                                              name_, job_status_name(status_))));
        return p.get_future();
      }
    }
    if (!coordinator_) {
      std::promise<Result<std::string>> p;
      p.set_value(Error(ErrorCode::kConfiguration,
                        fmt::format("savepoints need checkpoint storage: set {} (and {} or pass a directory)",
                                    options::kCheckpointDir.key, options::kSavepointDir.key)));
      return p.get_future();
    }
    return coordinator_->trigger_savepoint(std::move(target_dir), terminate);
  }
  std::vector<CheckpointStats> checkpoint_stats() const override {
    return coordinator_ ? coordinator_->stats() : std::vector<CheckpointStats>{};
  }
  int restarts() const override {
    std::lock_guard lock(mu_);
    return restarts_;
  }
  std::vector<JobExceptionInfo> exceptions() const override {
    std::lock_guard lock(mu_);
    return {exceptions_.begin(), exceptions_.end()};
  }
  std::vector<OperatorStats> operator_stats() const override {
    std::lock_guard lock(mu_);
    if (terminal_) return result_.operators;
    std::vector<OperatorStats> out = stats_;
    for (const auto& r : regions_) {
      if (!r.attempt) continue;
      for (const auto& [nid, op] : r.attempt->operators) {
        out[static_cast<size_t>(nid)].records_in += op->metrics().records_in.get();
        out[static_cast<size_t>(nid)].records_out += op->metrics().records_out.get();
      }
    }
    // An attempt being torn down is neither in its region nor in stats_ yet: keep what was reported.
    if (reported_stats_.size() == out.size()) {
      for (size_t i = 0; i < out.size(); ++i) {
        out[i].records_in = std::max(out[i].records_in, reported_stats_[i].records_in);
        out[i].records_out = std::max(out[i].records_out, reported_stats_[i].records_out);
      }
    }
    reported_stats_ = out;
    return out;
  }

  CheckpointCounts checkpoint_counts() const override {
    if (!coordinator_) return {};
    return CheckpointCounts{coordinator_->completed_count(), coordinator_->failed_count()};
  }
  std::vector<SubtaskMetrics> subtask_metrics() const override {
    std::lock_guard lock(mu_);
    std::map<std::pair<int, int>, SubtaskMetrics> out = subtask_totals_;
    for (const auto& r : regions_) {
      if (!r.attempt) continue;
      for (const auto& t : r.attempt->tasks) {
        add_task_metrics(subtask_entry(out, *t), *t, jg_);
      }
    }
    // An attempt being torn down is neither in its region nor in the totals yet: keep what was reported, so
    // counters never go down and its subtasks (absent from `out` when it was their first attempt) stay listed.
    for (const auto& [key, p] : reported_subtasks_) {
      auto [it, absent] = out.try_emplace(key, p);
      if (absent) it->second.running = false;
    }
    std::vector<SubtaskMetrics> v;
    v.reserve(out.size());
    for (auto& [key, m] : out) {
      auto prev = reported_subtasks_.find(key);
      if (prev != reported_subtasks_.end()) {
        const SubtaskMetrics& p = prev->second;
        m.bytes_in = std::max(m.bytes_in, p.bytes_in);
        m.bytes_out = std::max(m.bytes_out, p.bytes_out);
        m.run_ns = std::max(m.run_ns, p.run_ns);
        m.idle_ns = std::max(m.idle_ns, p.idle_ns);
        m.backpressured_ns = std::max(m.backpressured_ns, p.backpressured_ns);
        for (size_t i = 0; i < m.operators.size() && i < p.operators.size(); ++i) {
          m.operators[i].records_in = std::max(m.operators[i].records_in, p.operators[i].records_in);
          m.operators[i].records_out = std::max(m.operators[i].records_out, p.operators[i].records_out);
        }
      }
      reported_subtasks_[key] = m;
      v.push_back(m);
    }
    return v;
  }

  // --- TaskListener (task threads) ---
  void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) override {
    if (state == TaskState::kFinished && coordinator_) {
      // Atomically (under the coordinator's lock) the task stops being live and its retained final state
      // takes its place in every later checkpoint.
      coordinator_->on_task_finished(key_of(task), [&] { mark_exited(task); });
    } else if (state == TaskState::kFinished) {
      mark_exited(task);
    }
    {
      std::lock_guard lock(mu_);
      events_.push_back(JobEvent{JobEvent::kTaskTerminated, &task, state, error});
    }
    cv_.notify_all();
  }
  void on_checkpoint_snapshot(Task& task, TaskStateSnapshot&& snapshot) override {
    if (coordinator_) coordinator_->acknowledge(key_of(task), task.display_name(), std::move(snapshot));
  }
  void on_end_of_input(Task& task) override {
    {
      std::lock_guard lock(mu_);
      Region& r = regions_[static_cast<size_t>(region_of_vertex_[static_cast<size_t>(task.options().vertex_id)])];
      if (r.attempt) r.attempt->end_of_input.insert(&task);
    }
    if (coordinator_) coordinator_->on_end_of_input(key_of(task));
  }

  // --- CheckpointJobHooks (coordinator thread, coordinator lock held) ---
  bool ready_for_checkpoint() override {
    std::lock_guard lock(mu_);
    if (status_ != JobStatus::kRunning || cancel_requested_ || failing_) return false;
    bool any_running = false;
    for (const auto& r : regions_) {
      if (r.state != RegionState::kRunning && r.state != RegionState::kFinished) return false;
      any_running = any_running || r.state == RegionState::kRunning;
    }
    return any_running;
  }
  Triggered trigger(const CheckpointBarrier& barrier) override {
    std::lock_guard lock(mu_);
    Triggered t;
    for (auto& r : regions_) {
      if (r.state != RegionState::kRunning || !r.attempt) continue;
      RegionAttempt& a = *r.attempt;
      for (auto& task : a.tasks) {
        if (a.exited.count(task.get()) == 0) t.tasks.push_back(key_of(*task));
      }
      for (int vid : r.vertices) {
        const JobVertex& v = jg_.vertices[static_cast<size_t>(vid)];
        int head = v.chained_nodes[0];
        auto c = a.coordinators.find(head);
        if (c == a.coordinators.end()) continue;
        t.coordinator_state[jg_.node_uid[static_cast<size_t>(head)]] =
            c->second->checkpoint(barrier.checkpoint_id, [&] {
              for (auto& task : a.tasks) {
                if (task->options().vertex_id == vid && a.exited.count(task.get()) == 0)
                  task->trigger_checkpoint(barrier);
              }
            });
      }
      for (Task* task : a.end_of_input) {
        if (a.exited.count(task) == 0) task->trigger_checkpoint(barrier);
      }
    }
    return t;
  }
  void trigger_task(const CheckpointTaskKey& key, const CheckpointBarrier& barrier) override {
    std::lock_guard lock(mu_);
    if (Task* t = find_task_locked(key)) t->trigger_checkpoint(barrier);
  }
  void notify_complete(int64_t checkpoint_id) override {
    std::lock_guard lock(mu_);
    for_each_live_task_locked([&](Task& t) { t.notify_checkpoint_complete(checkpoint_id); });
  }
  void notify_aborted(int64_t checkpoint_id) override {
    std::lock_guard lock(mu_);
    for_each_live_task_locked([&](Task& t) { t.notify_checkpoint_aborted(checkpoint_id); });
  }
  void fail_job(const Error& error) override {
    {
      std::lock_guard lock(mu_);
      events_.push_back(JobEvent{JobEvent::kFailJob, nullptr, TaskState::kFailed, error});
    }
    cv_.notify_all();
  }

  const NetworkBufferPool* pool() const { return pool_.get(); }
  int task_count() const { return task_count_; }

 private:
  CheckpointTaskKey key_of(const Task& t) const { return {t.options().vertex_id, t.options().subtask_index}; }
  void mark_exited(Task& task) {
    std::lock_guard lock(mu_);
    Region& r = regions_[static_cast<size_t>(region_of_vertex_[static_cast<size_t>(task.options().vertex_id)])];
    if (r.attempt) r.attempt->exited.insert(&task);
  }
  Task* find_task_locked(const CheckpointTaskKey& key) {
    Region& r = regions_[static_cast<size_t>(region_of_vertex_[static_cast<size_t>(key.vertex)])];
    if (r.state != RegionState::kRunning || !r.attempt) return nullptr;
    for (auto& t : r.attempt->tasks) {
      if (key_of(*t) == key && r.attempt->exited.count(t.get()) == 0) return t.get();
    }
    return nullptr;
  }
  template <class F>
  void for_each_live_task_locked(F&& f) {
    for (auto& r : regions_) {
      if (!r.attempt) continue;
      for (auto& t : r.attempt->tasks) {
        if (r.attempt->exited.count(t.get()) == 0) f(*t);
      }
    }
  }

  Status deploy_region(size_t region_index, const RestorePoint* restore);
  Result<std::vector<std::vector<std::shared_ptr<const TaskRestore>>>> assign_state(const Region& region,
                                                                                    const RestorePoint& point);
  Result<RestorePoint> pick_restore_point();
  void run_master();
  void handle_event(JobEvent& e, std::unique_lock<std::mutex>& lock);
  /// Region `ri` has just started failing with r.failure (of task `task_name`, "" for none): records the
  /// failure and asks the restart strategy at once, as Flink's ExecutionFailureHandler does, so the status,
  /// the restart count and the time of the restart are known from the failure on.
  void region_failed_locked(size_t ri, const std::string& task_name);
  void record_exception_locked(const Error& error, const std::string& task_name, bool restarted, TimestampMs when);
  void teardown_locked(Region& r, std::unique_lock<std::mutex>& lock);
  /// The job fails for good with `error`: no more restarts; every region still deployed is cancelled.
  void fail_job_locked(Error error);
  void maybe_finalize_locked(std::unique_lock<std::mutex>& lock);
  void finalize_locked(std::unique_lock<std::mutex>& lock);

  std::shared_ptr<StreamGraph> graph_;
  std::string name_;
  std::string id_;
  const Clock& clock_;
  JobGraph jg_;
  std::vector<int> region_of_vertex_;
  std::vector<EdgeChannelPlan> edge_plans_;
  int credits_ = 0;
  bool checkpointing_ = false;
  std::unique_ptr<NetworkBufferPool> pool_;
  std::unique_ptr<FileCheckpointStorage> storage_;
  std::unique_ptr<CheckpointCoordinator> coordinator_;
  std::unique_ptr<RestartBackoffTimeStrategy> restart_strategy_;
  OperatorDisposer disposer_;
  bool restore_fallback_ = false;
  int task_count_ = 0;
  int64_t start_ns_ = 0;  // clock_.monotonic_ns() when the job started: JobResult::duration is on the job's Clock
  std::thread master_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the master thread
  std::condition_variable done_cv_;  // wakes wait()
  std::deque<JobEvent> events_;
  std::vector<Region> regions_;
  JobStatus status_ = JobStatus::kCreated;
  bool cancel_requested_ = false;
  bool cancel_sent_ = false;
  bool failing_ = false;  // the job is failing for good: no more restarts
  bool terminal_ = false;
  int restarts_ = 0;
  std::deque<JobExceptionInfo> exceptions_;  // newest first, at most JobClient::kMaxExceptionHistory
  std::optional<Error> job_error_;
  std::vector<OperatorStats> stats_;                   // per stream node, summed over finished attempts
  mutable std::vector<OperatorStats> reported_stats_;  // the last operator_stats(), so counters never go down
  // Per (vertex id, subtask): counters summed over torn-down attempts; and the last subtask_metrics().
  std::map<std::pair<int, int>, SubtaskMetrics> subtask_totals_;
  mutable std::map<std::pair<int, int>, SubtaskMetrics> reported_subtasks_;

  SubtaskMetrics& subtask_entry(std::map<std::pair<int, int>, SubtaskMetrics>& m, const Task& t) const {
    return m[{t.options().vertex_id, t.options().subtask_index}];
  }
  JobResult result_;
};

Status LocalJob::prepare(JobGraph jg) {
  jg_ = std::move(jg);
  const Configuration& config = graph_->config();
  const int configured_slots = config.get(options::kTaskSlots);
  if (configured_slots > 0 && configured_slots < jg_.required_slots) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("the job needs {} task slots (the largest parallelism of each slot sharing group, "
                             "summed) but {} = {}; raise it or lower the parallelism",
                             jg_.required_slots, options::kTaskSlots.key, configured_slots));
  }
  const int64_t segment_size = config.get(options::kBufferSize);
  credits_ = config.get(options::kBuffersPerChannel);
  if (segment_size < 1024 || segment_size > (64 << 20)) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} = {} bytes; it must be between 1 KiB and 64 MiB",
                                                        options::kBufferSize.key, segment_size));
  }
  if (credits_ < 1) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} must be at least 1", options::kBuffersPerChannel.key));
  }
  // Channels per job edge: producer i feeds consumers targets[i].
  size_t channel_count = 0;
  edge_plans_ = plan_channels(jg_, &channel_count);
  const int64_t network_max = config.get(options::kNetworkMemoryMax);
  const long double needed = static_cast<long double>(channel_count) * credits_ * segment_size;
  if (needed > static_cast<long double>(network_max)) {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("the job's data exchange needs {} channels x {} buffers x {} bytes = {:.0f} MiB of network "
                    "buffers, above {} = {} MiB; lower the parallelism, {} or {}, or raise {}",
                    channel_count, credits_, segment_size, static_cast<double>(needed) / (1 << 20),
                    options::kNetworkMemoryMax.key, network_max >> 20, options::kBuffersPerChannel.key,
                    options::kBufferSize.key, options::kNetworkMemoryMax.key));
  }
  pool_ = std::make_unique<NetworkBufferPool>(static_cast<uint32_t>(segment_size),
                                              channel_count * static_cast<size_t>(credits_));

  // Failover regions.
  std::vector<std::vector<int>> regions = compute_failover_regions(jg_);
  region_of_vertex_.assign(jg_.vertices.size(), 0);
  regions_.resize(regions.size());
  for (size_t r = 0; r < regions.size(); ++r) {
    regions_[r].vertices = regions[r];
    for (int v : regions[r])
      region_of_vertex_[static_cast<size_t>(v)] = static_cast<int>(r);
  }
  for (const auto& v : jg_.vertices)
    task_count_ += v.parallelism;

  // Restart strategy (seeded for jitter; the seed only spreads restarts of different jobs, and is logged).
  const uint64_t seed = std::random_device{}();
  SLUICE_ASSIGN_OR_RETURN(auto strategy, make_restart_strategy(config, seed));
  restart_strategy_ = std::move(strategy);
  spdlog::debug("job '{}': restart strategy {} (jitter seed {})", name_, restart_strategy_->describe(), seed);
  restore_fallback_ = config.get(options::kRestoreFallback);

  // Checkpointing: a coordinator when checkpoints, savepoints or a restore are configured.
  SLUICE_ASSIGN_OR_RETURN(auto ck, CheckpointCoordinatorOptions::from_config(config));
  checkpointing_ = ck.interval_ms > 0;
  std::string dir = config.get(options::kCheckpointDir);
  const std::string recovery = config.get(options::kStateRecoveryPath);
  if (checkpointing_ && dir.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} is set but {} is not: checkpoints need a directory (file:///path)",
                             options::kCheckpointInterval.key, options::kCheckpointDir.key));
  }
  if (dir.empty() && (!ck.savepoint_dir.empty() || !recovery.empty())) {
    dir = (std::filesystem::temp_directory_path() / "sluice-checkpoints").string();
  }
  if (!dir.empty()) {
    // The process's S3 client (s3.* options, AWS environment), for s3:// checkpoint, savepoint and restore paths.
    SLUICE_RETURN_IF_ERROR(S3Client::configure(config));
    SLUICE_ASSIGN_OR_RETURN(auto storage, FileCheckpointStorage::create(dir, id_));
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
    std::optional<RestorePoint> initial;
    if (!recovery.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto path, FileCheckpointStorage::resolve_restore_path(recovery));
      // With restore-fallback, older checkpoints of the same job directory are the next candidates.
      std::vector<std::filesystem::path> candidates{path};
      const int64_t wanted = FileCheckpointStorage::checkpoint_id_of(path);
      if (restore_fallback_ && wanted >= 0) {
        std::vector<std::pair<int64_t, std::filesystem::path>> older;
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(path.parent_path(), ec)) {
          int64_t id = FileCheckpointStorage::checkpoint_id_of(e.path());
          if (id >= 0 && id < wanted && std::filesystem::exists(e.path() / kMetadataFileName)) {
            older.emplace_back(id, e.path());
          }
        }
        std::sort(older.rbegin(), older.rend());
        for (auto& [id, p] : older)
          candidates.push_back(p);
      }
      SLUICE_ASSIGN_OR_RETURN(auto loaded, load_for_restore(candidates, restore_fallback_));
      std::set<std::string> uids(jg_.node_uid.begin(), jg_.node_uid.end());
      Status unclaimed = check_unclaimed_state(loaded.metadata, uids, config.get(options::kIgnoreUnclaimedState));
      if (!unclaimed.ok()) return unclaimed.error();
      first_id = loaded.metadata.checkpoint_id + 1;
      initial = RestorePoint{loaded.dir, loaded.metadata};
      spdlog::info("job '{}' starts from {} {} ({})", name_, snapshot_type_name(loaded.metadata.type),
                   loaded.metadata.checkpoint_id, loaded.dir.string());
    }
    coordinator_ = std::make_unique<CheckpointCoordinator>(ck, *storage_, std::move(vertices), *this, clock_, first_id);
    if (initial) coordinator_->set_initial_restore_point(std::move(*initial));
  }
  stats_.resize(graph_->nodes().size());
  for (const auto& node : graph_->nodes()) {
    OperatorStats& s = stats_[static_cast<size_t>(node.id)];
    s.name = node.name;
    s.uid = jg_.node_uid[static_cast<size_t>(node.id)];
    s.parallelism = jg_.node_parallelism[static_cast<size_t>(node.id)];
  }
  return ok_status();
}

Result<RestorePoint> LocalJob::pick_restore_point() {
  std::vector<RestorePoint> candidates = coordinator_->restore_candidates();
  // Without fallback the state assignment checks every file as it reads it; verifying first would read and
  // hash all state twice (which dominated recovery time with large state).
  if (!restore_fallback_ && !candidates.empty()) return candidates.front();
  std::string failures;
  for (const auto& c : candidates) {
    Status st = verify_checkpoint_files(c.metadata, c.dir);
    if (st.ok()) return c;
    if (!restore_fallback_) return st.error();
    spdlog::error("cannot restore {} {}: {}; trying the previous one ({} = true)", snapshot_type_name(c.metadata.type),
                  c.metadata.checkpoint_id, st.error().to_string(), options::kRestoreFallback.key);
    failures += "\n  " + st.error().to_string();
  }
  return Error(ErrorCode::kState, "no checkpoint could be restored:" + failures);
}

Result<std::vector<std::vector<std::shared_ptr<const TaskRestore>>>> LocalJob::assign_state(const Region& region,
                                                                                            const RestorePoint& point) {
  std::vector<std::vector<std::shared_ptr<const TaskRestore>>> out(jg_.vertices.size());
  for (int vid : region.vertices) {
    const JobVertex& v = jg_.vertices[static_cast<size_t>(vid)];
    VertexToRestore vr;
    vr.parallelism = v.parallelism;
    for (int nid : v.chained_nodes) {
      vr.operator_uids.push_back(jg_.node_uid[static_cast<size_t>(nid)]);
      vr.max_parallelism.push_back(jg_.node_max_parallelism[static_cast<size_t>(nid)]);
    }
    SLUICE_ASSIGN_OR_RETURN(auto assigned, assign_subtask_states(point.metadata, point.dir, vr));
    out[static_cast<size_t>(vid)] = std::move(assigned);
  }
  return out;
}

Status LocalJob::deploy_region(size_t region_index, const RestorePoint* restore) {
  Region& region = regions_[region_index];
  const Configuration& config = graph_->config();
  std::vector<std::vector<std::shared_ptr<const TaskRestore>>> restores;
  if (restore != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(auto assigned, assign_state(region, *restore));
    restores = std::move(assigned);
  }
  auto attempt = std::make_unique<RegionAttempt>();
  attempt->number = region.attempts++;

  // Coordinators of the region's sources, restored with their enumerators' state.
  for (int vid : region.vertices) {
    for (int nid : jg_.vertices[static_cast<size_t>(vid)].chained_nodes) {
      const StreamNode& node = graph_->node(nid);
      if (!node.factory->is_source()) continue;
      const std::string* state = nullptr;
      if (restore != nullptr) {
        auto it = restore->metadata.coordinator_state.find(jg_.node_uid[static_cast<size_t>(nid)]);
        if (it != restore->metadata.coordinator_state.end()) state = &it->second;
      }
      try {
        attempt->coordinators[nid] =
            node.factory->create_coordinator(jg_.node_parallelism[static_cast<size_t>(nid)], state);
      } catch (const SluiceException& e) {
        return e.error().with_context(fmt::format("restoring the split enumerator of '{}'", node.name));
      }
    }
  }

  // Tasks, their channels (all LocalChannels: every subtask runs in this process), operators and inputs.
  SubtaskDeployment d;
  d.graph = graph_.get();
  d.jg = &jg_;
  d.plan = &edge_plans_;
  d.vertices = region.vertices;
  RegionAttempt* a = attempt.get();
  d.make_channel = [this, a](const JobEdge&, int, int) -> Result<ChannelEnds> {
    SLUICE_ASSIGN_OR_RETURN(auto buffers, pool_->allocate(static_cast<size_t>(credits_)));
    a->channels.push_back(std::make_unique<LocalChannel>(*pool_, std::move(buffers)));
    return ChannelEnds{a->channels.back().get(), a->channels.back().get()};
  };
  d.coordinators = &attempt->coordinators;
  d.restores = restore != nullptr ? &restores : nullptr;
  d.attempt = attempt->number;
  d.clock = &clock_;
  d.buffer_timeout_ms = config.get(options::kBufferTimeout);
  d.checkpointing = checkpointing_;
  d.listener = this;
  SLUICE_ASSIGN_OR_RETURN(DeployedSubtasks built, build_subtasks(d));
  attempt->tasks = std::move(built.tasks);
  attempt->operators = std::move(built.operators);
  region.attempt = std::move(attempt);
  region.state = RegionState::kRunning;
  for (auto& t : region.attempt->tasks)
    t->start();
  return ok_status();
}

Status LocalJob::start() {
  // Lock order is coordinator before job: ask the coordinator before taking mu_.
  std::optional<RestorePoint> initial;
  if (coordinator_) initial = coordinator_->latest_restore_point();
  std::unique_lock lock(mu_);
  status_ = JobStatus::kRunning;
  start_ns_ = clock_.monotonic_ns();
  spdlog::info("job '{}' ({}) starting with {} tasks in {} failover region(s){}", name_, id_, task_count_,
               regions_.size(), checkpointing_ ? "" : ", checkpointing off");
  for (size_t r = 0; r < regions_.size(); ++r) {
    Status st = deploy_region(r, initial ? &*initial : nullptr);
    if (!st.ok()) {
      // Nothing may keep running: stop what was deployed, then report.
      for (size_t k = 0; k < r; ++k) {
        for (auto& t : regions_[k].attempt->tasks)
          t->cancel();
      }
      status_ = JobStatus::kFailed;
      lock.unlock();
      for (size_t k = 0; k < r; ++k) {
        for (auto& t : regions_[k].attempt->tasks)
          t->join();
      }
      lock.lock();
      terminal_ = true;
      return st;
    }
  }
  lock.unlock();
  if (coordinator_) coordinator_->start();
  master_ = std::thread([this] { run_master(); });
  return ok_status();
}

void LocalJob::run_master() {
  pthread_setname_np(pthread_self(), "sluice-jobmgr");
  std::unique_lock lock(mu_);
  for (;;) {
    if (cancel_requested_ && !cancel_sent_) {
      cancel_sent_ = true;
      for (auto& r : regions_) {
        if (r.state == RegionState::kRestarting) r.state = RegionState::kCanceled;
        if (r.attempt && !region_terminal(r.state)) {
          for (auto& t : r.attempt->tasks)
            t->cancel();
        }
      }
      maybe_finalize_locked(lock);
    }
    while (!events_.empty()) {
      JobEvent e = std::move(events_.front());
      events_.pop_front();
      handle_event(e, lock);
    }
    if (terminal_) break;
    // Restarts that are due, by the job's Clock. The wait is at most 100 ms of real time, so a ManualClock
    // advanced by a test is noticed within that.
    auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    for (size_t i = 0; i < regions_.size(); ++i) {
      Region& r = regions_[i];
      if (r.state != RegionState::kRestarting) continue;
      if (const int64_t wait_ms = r.restart_at_ms - clock_.now_ms(); wait_ms > 0) {
        next = std::min(next, std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms));
        continue;
      }
      Result<RestorePoint> point = Error(ErrorCode::kState, "no checkpoint");
      bool have_point = false;
      if (coordinator_) {
        lock.unlock();
        auto latest = coordinator_->latest_restore_point();
        if (latest) {
          point = pick_restore_point();
          have_point = true;
        }
        lock.lock();
      }
      Status st = have_point && !point.ok() ? Status(point.error()) : ok_status();
      if (st.ok()) {
        spdlog::info("job '{}': restarting region {} (attempt {}) from {}", name_, i, r.attempts,
                     have_point ? fmt::format("checkpoint {}", point->metadata.checkpoint_id) : "the beginning");
        st = deploy_region(i, have_point ? &*point : nullptr);
      }
      if (!st.ok() && st.error().code() == ErrorCode::kConnector) {
        // A source's enumerator could not reach its system while restoring (a broker still down when the backoff
        // ended): a failure like any other, for the restart strategy to judge, not the end of the job.
        const TimestampMs now = clock_.now_ms();
        const FailureHandling h = handle_failure(*restart_strategy_, st.error(), now);
        if (h.restart) {
          ++restarts_;
          r.restart_at_ms = now + h.backoff_ms;
          record_exception_locked(st.error(), "", true, now);
          spdlog::warn("job '{}' ({}) RESTARTING: region {} could not restart ({}); restart {} in {} ms ({})", name_,
                       id_, i, st.error().message(), restarts_, h.backoff_ms, restart_strategy_->describe());
          next = std::min(next, std::chrono::steady_clock::now() + std::chrono::milliseconds(h.backoff_ms));
          continue;
        }
        st = st.error().with_context(h.unrecoverable ? "restart suppressed" : h.reason);
      }
      if (!st.ok()) {
        spdlog::error("job '{}': region {} cannot restart: {}", name_, i, st.error().to_string());
        record_exception_locked(st.error(), "", false, clock_.now_ms());
        r.state = RegionState::kFailed;
        if (r.attempt) teardown_locked(r, lock);
        fail_job_locked(st.error());
        maybe_finalize_locked(lock);
      }
    }
    if (terminal_) break;
    if (!events_.empty() || (cancel_requested_ && !cancel_sent_)) continue;
    cv_.wait_until(lock, next);
  }
}

void LocalJob::handle_event(JobEvent& e, std::unique_lock<std::mutex>& lock) {
  if (e.kind == JobEvent::kFailJob) {
    if (failing_ || terminal_) return;
    // As Flink's CheckpointFailureManager: too many failed checkpoints fail the job over (every running
    // region restarts from the latest checkpoint under the restart strategy), not for good.
    spdlog::error("job '{}' ({}) fails over: {}", name_, id_, e.error->to_string());
    bool any = false;
    for (size_t ri = 0; ri < regions_.size(); ++ri) {
      Region& r = regions_[ri];
      if (r.state != RegionState::kRunning || !r.attempt) continue;
      r.state = RegionState::kFailing;
      r.failure = e.error;
      for (auto& t : r.attempt->tasks)
        t->cancel();
      any = true;
      region_failed_locked(ri, "");
    }
    if (any && coordinator_) {
      lock.unlock();
      coordinator_->abort_pending("the job fails over: " + e.error->message());
      lock.lock();
    }
    return;
  }
  Task& task = *e.task;
  const size_t ri = static_cast<size_t>(region_of_vertex_[static_cast<size_t>(task.options().vertex_id)]);
  Region& r = regions_[ri];
  if (!r.attempt) return;
  RegionAttempt& a = *r.attempt;
  ++a.terminated;
  if (e.state == TaskState::kFailed && r.state == RegionState::kRunning) {
    r.state = RegionState::kFailing;
    r.failure = e.error.value_or(Error(ErrorCode::kRuntime, "task '" + task.display_name() + "' failed"));
    spdlog::error("job '{}' ({}): {}", name_, id_, r.failure->to_string());
    for (auto& t : a.tasks)
      t->cancel();
    region_failed_locked(ri, task.display_name());
    if (coordinator_) {
      lock.unlock();
      coordinator_->abort_pending("a task failed: " + r.failure->message());
      lock.lock();
    }
  }
  if (a.terminated < a.tasks.size()) return;
  // Every task of the region has terminated.
  if (r.state == RegionState::kRunning) {
    r.state = cancel_requested_ ? RegionState::kCanceled : RegionState::kFinished;
    if (r.state == RegionState::kFinished) {
      bool all_finished = true;
      for (auto& t : a.tasks)
        all_finished = all_finished && t->state() == TaskState::kFinished;
      if (!all_finished) r.state = RegionState::kCanceled;
    }
  } else if (r.state == RegionState::kFailing) {
    teardown_locked(r, lock);
    if (failing_) {
      r.state = RegionState::kFailed;
    } else if (cancel_requested_) {
      r.state = RegionState::kCanceled;
    } else {
      // region_failed_locked() allowed the restart (else failing_ would be set) and chose its time.
      r.state = RegionState::kRestarting;
      if (coordinator_) {
        std::vector<CheckpointTaskKey> keys;
        for (int vid : r.vertices) {
          for (int s = 0; s < jg_.vertices[static_cast<size_t>(vid)].parallelism; ++s)
            keys.push_back({vid, s});
        }
        lock.unlock();
        coordinator_->on_tasks_reset(keys);
        lock.lock();
      }
    }
  }
  maybe_finalize_locked(lock);
}

void LocalJob::region_failed_locked(size_t ri, const std::string& task_name) {
  Region& r = regions_[ri];
  const TimestampMs now = clock_.now_ms();
  if (failing_ || cancel_requested_) {
    record_exception_locked(*r.failure, task_name, false, now);
    return;
  }
  const FailureHandling h = handle_failure(*restart_strategy_, *r.failure, now);
  if (h.restart) {
    ++restarts_;
    r.restart_at_ms = now + h.backoff_ms;
    record_exception_locked(*r.failure, task_name, true, now);
    spdlog::warn("job '{}' ({}) RESTARTING: region {} failed ({}); restart {} in {} ms ({})", name_, id_, ri,
                 r.failure->message(), restarts_, h.backoff_ms, restart_strategy_->describe());
  } else {
    record_exception_locked(*r.failure, task_name, false, now);
    fail_job_locked(r.failure->with_context(h.unrecoverable ? "restart suppressed" : h.reason));
    spdlog::error("job '{}' ({}) FAILING: {}", name_, id_, h.reason);
  }
}

void LocalJob::record_exception_locked(const Error& error, const std::string& task_name, bool restarted,
                                       TimestampMs when) {
  // Redacted: the history is shown on /health and the REST API, and a connector's message may quote a
  // connection string.
  exceptions_.push_front(JobExceptionInfo{std::string(error_code_name(error.code())), redact_secrets(error.message()),
                                          redact_secrets(error.to_string()), when, task_name, restarted});
  while (exceptions_.size() > JobClient::kMaxExceptionHistory)
    exceptions_.pop_back();
}

void LocalJob::fail_job_locked(Error error) {
  job_error_ = std::move(error);
  failing_ = true;
  for (auto& r : regions_) {
    if (r.state == RegionState::kRestarting) r.state = RegionState::kFailed;
    if (r.attempt && !region_terminal(r.state)) {
      r.state = RegionState::kFailing;
      for (auto& t : r.attempt->tasks)
        t->cancel();
    }
  }
}

void LocalJob::teardown_locked(Region& r, std::unique_lock<std::mutex>& lock) {
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<RegionAttempt> a = std::move(r.attempt);
  // Task threads may still be returning from on_task_terminated; join without the lock.
  lock.unlock();
  for (auto& t : a->tasks)
    t->join();
  for (auto& [nid, c] : a->coordinators)
    c->close();
  const auto joined = std::chrono::steady_clock::now();
  lock.lock();
  for (auto& [nid, op] : a->operators) {
    stats_[static_cast<size_t>(nid)].records_in += op->metrics().records_in.get();
    stats_[static_cast<size_t>(nid)].records_out += op->metrics().records_out.get();
  }
  for (auto& t : a->tasks) {
    SubtaskMetrics& m = subtask_entry(subtask_totals_, *t);
    add_task_metrics(m, *t, jg_);
    m.running = false;
    for (auto& o : m.operators) {  // watermarks are the live attempt's; a restarted one starts from none
      o.input_watermark = o.output_watermark = std::numeric_limits<int64_t>::min();
    }
  }
  for (auto& t : a->tasks) {
    if (auto state = t->release_keyed_state()) disposer_.dispose(std::move(state));
  }
  lock.unlock();
  a.reset();  // tasks, then channels (their buffers go back to the pool)
  lock.lock();
  spdlog::debug(
      "job '{}': a region was torn down in {} ms (tasks joined after {} ms)", name_,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count(),
      std::chrono::duration_cast<std::chrono::milliseconds>(joined - started).count());
}

void LocalJob::maybe_finalize_locked(std::unique_lock<std::mutex>& lock) {
  if (terminal_) return;
  for (const auto& r : regions_) {
    if (!region_terminal(r.state)) return;
  }
  finalize_locked(lock);
}

void LocalJob::finalize_locked(std::unique_lock<std::mutex>& lock) {
  // Join and fold the counters of every attempt still deployed.
  for (auto& r : regions_) {
    if (r.attempt) teardown_locked(r, lock);
  }
  bool failed = job_error_.has_value();
  std::optional<Error> region_error;
  for (const auto& r : regions_) {
    if (r.state == RegionState::kFailed) {
      failed = true;
      if (!region_error && r.failure) region_error = r.failure;
    }
  }
  if (failed) {
    status_ = JobStatus::kFailed;
  } else if (cancel_requested_) {
    status_ = JobStatus::kCanceled;
  } else {
    bool all_finished = true;
    for (const auto& r : regions_)
      all_finished = all_finished && r.state == RegionState::kFinished;
    status_ = all_finished ? JobStatus::kFinished : JobStatus::kCanceled;
  }
  result_.job_id = id_;
  result_.job_name = name_;
  result_.status = status_;
  result_.error = job_error_ ? job_error_ : region_error;
  if (status_ == JobStatus::kFailed && !result_.error) {
    result_.error = Error(ErrorCode::kRuntime, "the job failed");
  }
  result_.duration = std::chrono::milliseconds((clock_.monotonic_ns() - start_ns_) / 1'000'000);
  result_.operators = stats_;
  result_.restarts = restarts_;
  if (coordinator_) {
    // Lock order is coordinator before job.
    lock.unlock();
    const int64_t completed = coordinator_->completed_count();
    std::optional<RestorePoint> latest = coordinator_->latest_restore_point();
    lock.lock();
    result_.completed_checkpoints = completed;
    if (latest) result_.latest_checkpoint_path = latest->dir.string();
  }
  if (status_ == JobStatus::kFailed) {
    spdlog::error("job '{}' ({}) FAILED: {}", name_, id_, result_.error->to_string());
  } else {
    spdlog::info("job '{}' ({}) {} after {} ms", name_, id_, job_status_name(status_), result_.duration.count());
  }
  if (coordinator_) {
    // Pending checkpoints and savepoint requests end with the job (their futures get an error).
    lock.unlock();
    coordinator_->stop();
    lock.lock();
  }
  lock.unlock();
  disposer_.drain();
  lock.lock();
  terminal_ = true;
  done_cv_.notify_all();
}

}  // namespace

Result<JobClient> submit_local_job(std::shared_ptr<StreamGraph> graph, std::string job_name, const Clock& clock,
                                   LocalJobProbe* probe) {
  Result<JobGraph> jg = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(*graph);
    } catch (const SluiceException& e) {
      return e.error();
    }
  }();
  if (!jg.ok()) return jg.error();
  auto job = std::make_shared<LocalJob>(graph, std::move(job_name), clock);
  try {
    Status st = job->prepare(std::move(*jg));
    if (!st.ok()) return st.error();
    st = job->start();
    if (!st.ok()) return st.error();
  } catch (const SluiceException& e) {
    return e.error();
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::kConfiguration,
                 "out of memory while deploying the job (network buffers, operators); lower the parallelism or "
                 "the network memory options");
  }
  if (probe != nullptr) {
    probe->buffer_pool = job->pool();
    probe->task_count = job->task_count();
  }
  return JobClient(job);
}

}  // namespace sluice
