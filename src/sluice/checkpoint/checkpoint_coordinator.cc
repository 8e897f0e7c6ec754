#include "sluice/checkpoint/checkpoint_coordinator.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace sluice {
namespace {

constexpr size_t kMaxStats = 100;
constexpr int kWriterThreads = 2;

std::string human_bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (1 << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
  if (b < (1ULL << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ULL << 30));
}

// Writes `bytes` into a new file `path` and fsyncs it (a retained final state file copied into a later
// checkpoint's directory: the same bytes, so the handle's offsets and checksum stay valid).
Status write_file_synced(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Error(ErrorCode::kCheckpoint, fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return Error(ErrorCode::kCheckpoint, fmt::format("cannot write {}: {}", path.string(), std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Error(ErrorCode::kCheckpoint, fmt::format("cannot fsync {}: {}", path.string(), std::strerror(err)));
  }
  ::close(fd);
  return ok_status();
}

}  // namespace

Result<CheckpointCoordinatorOptions> CheckpointCoordinatorOptions::from_config(const Configuration& config) {
  CheckpointCoordinatorOptions o;
  try {
    o.interval_ms = config.get(options::kCheckpointInterval);
    o.timeout_ms = config.get(options::kCheckpointTimeout);
    o.min_pause_ms = config.get(options::kCheckpointMinPause);
    o.max_concurrent = config.get(options::kMaxConcurrentCheckpoints);
    std::string mode = config.get(options::kCheckpointMode);
    std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::toupper(c); });
    o.mode = mode == "AT_LEAST_ONCE" ? CheckpointingMode::kAtLeastOnce : CheckpointingMode::kExactlyOnce;
    o.tolerable_failures = config.get(options::kTolerableFailedCheckpoints);
    o.savepoint_dir = config.get(options::kSavepointDir);
    o.num_retained = config.get(options::kCheckpointsRetained);
  } catch (const SluiceException& e) {
    return e.error();
  }
  auto bad = [](std::string_view key, auto value, std::string_view expected) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} = {}; {}", key, value, expected));
  };
  if (o.interval_ms < 0) return bad(options::kCheckpointInterval.key, o.interval_ms, "it must be >= 0");
  if (o.interval_ms > 0 && o.interval_ms < 10) {
    return bad(options::kCheckpointInterval.key, fmt::format("{} ms", o.interval_ms),
               "the minimum is 10 ms (as Flink)");
  }
  if (o.timeout_ms <= 0) return bad(options::kCheckpointTimeout.key, o.timeout_ms, "it must be > 0");
  if (o.min_pause_ms < 0) return bad(options::kCheckpointMinPause.key, o.min_pause_ms, "it must be >= 0");
  if (o.max_concurrent < 1) return bad(options::kMaxConcurrentCheckpoints.key, o.max_concurrent, "it must be >= 1");
  if (o.tolerable_failures < 0) {
    return bad(options::kTolerableFailedCheckpoints.key, o.tolerable_failures, "it must be >= 0");
  }
  if (o.num_retained < 1) return bad(options::kCheckpointsRetained.key, o.num_retained, "it must be >= 1");
  return o;
}

struct CheckpointCoordinator::Pending {
  int64_t id = 0;
  SnapshotType type = SnapshotType::kCheckpoint;
  CheckpointBarrier barrier;
  std::filesystem::path dir;
  int64_t start_ns = 0;
  std::set<CheckpointTaskKey> not_acknowledged;  // neither acknowledged nor written yet
  std::set<CheckpointTaskKey> not_written;       // acknowledged or retained, file not written yet
  std::map<std::string, std::vector<OperatorSubtaskStateHandle>> handles;  // per uid
  std::map<std::string, std::string> coordinator_state;
  std::vector<TaskCheckpointStats> task_stats;
  std::shared_ptr<std::promise<Result<std::string>>> promise;
  bool completing = false;
};

// The final state of a task of another process (cluster mode), as its TaskManager wrote it: the handles and
// the files' bytes, mapped (valid after the checkpoint directory they were read from is deleted).
struct CheckpointCoordinator::RetainedFiles {
  std::vector<std::string> uids;
  std::vector<OperatorSubtaskStateHandle> handles;
  std::vector<std::shared_ptr<const StateFileBytes>> bytes;
  int64_t alignment_ns = 0;
  int64_t sync_pause_ns = 0;
};

struct CheckpointCoordinator::WriteJob {
  int64_t id = 0;
  std::filesystem::path dir;
  CheckpointTaskKey key;
  std::string task_name;
  std::shared_ptr<const TaskStateSnapshot> snapshot;  // or, in cluster mode:
  std::shared_ptr<const RetainedFiles> files;
};

CheckpointCoordinator::CheckpointCoordinator(CheckpointCoordinatorOptions options, FileCheckpointStorage& storage,
                                             std::vector<CheckpointVertexInfo> vertices, CheckpointJobHooks& hooks,
                                             const Clock& clock, int64_t first_checkpoint_id)
    : options_(std::move(options)),
      storage_(storage),
      vertices_(std::move(vertices)),
      hooks_(hooks),
      clock_(clock),
      store_(std::make_unique<CompletedCheckpointStore>(options_.num_retained, storage)),
      next_id_(first_checkpoint_id) {}

CheckpointCoordinator::~CheckpointCoordinator() {
  stop();
}

void CheckpointCoordinator::start() {
  {
    MutexLock lock(mu_);  // no other thread yet: taken for the analysis, which cannot know that
    last_trigger_ns_ = clock_.monotonic_ns();
    last_end_ns_ = 0;
  }
  thread_ = std::thread([this] { run(); });
  for (int i = 0; i < kWriterThreads; ++i)
    writers_.emplace_back([this] { run_writer(); });
}

void CheckpointCoordinator::stop() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // Threads first: a writer still writing into a checkpoint directory must be done before it is deleted.
  cv_.notify_all();
  writer_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& w : writers_) {
    if (w.joinable()) w.join();
  }
  {
    MutexLock lock(mu_);
    std::vector<int64_t> ids;
    for (auto& [id, p] : pending_)
      ids.push_back(id);
    for (int64_t id : ids)
      abort_locked(id, "the job ended", /*notify_tasks=*/false, /*count_failure=*/false, /*discard=*/true,
                   /*job_ended=*/true);
    for (auto& r : requests_)
      r.promise->set_value(Error(ErrorCode::kCheckpoint, "the job ended before the savepoint was triggered"));
    requests_.clear();
    write_queue_.clear();
  }
}

void CheckpointCoordinator::run() {
  pthread_setname_np(pthread_self(), "sluice-ckpt");
  MutexLock lock(mu_);
  while (!stopping_) {
    // Completions first: they free a concurrent slot.
    while (!ready_.empty() && !stopping_) {
      int64_t id = ready_.front();
      ready_.pop_front();
      lock.unlock();
      complete(id);
      lock.lock();
    }
    if (stopping_) break;
    const int64_t now = clock_.monotonic_ns();
    // Timeouts.
    std::vector<int64_t> expired;
    for (auto& [id, p] : pending_) {
      if (!p->completing && now - p->start_ns > options_.timeout_ms * 1'000'000) expired.push_back(id);
    }
    for (int64_t id : expired) {
      abort_locked(
          id,
          fmt::format("{} {} expired before completing (timeout {} ms, {})", snapshot_type_name(pending_.at(id)->type),
                      id, options_.timeout_ms, options::kCheckpointTimeout.key),
          true, true);
    }
    int64_t next_ns = now + 100'000'000;  // re-check at least every 100 ms
    // A free concurrent slot: fewer than max-concurrent checkpoints and savepoints pending, and none with a
    // minimum pause (which counts from the end of the previous one).
    const auto slot_free = [&]() SLUICE_REQUIRES(mu_) {
      return static_cast<int>(pending_.size()) < options_.max_concurrent &&
             (options_.min_pause_ms == 0 || pending_.empty());
    };
    const int64_t pause_end = last_end_ns_ > 0 ? last_end_ns_ + options_.min_pause_ms * 1'000'000 : 0;
    // Savepoints asked for, in order: each ignores the interval (as in Flink) but waits for a free slot and the
    // minimum pause like a periodic checkpoint. Triggered at once, back-to-back requests opened more snapshots
    // than max-concurrent allows, and each holds sink resources until it completes (an exactly-once Kafka
    // sink's transactional producer, from a bounded pool): the task failed.
    while (!requests_.empty() && slot_free()) {
      if (pause_end > now) {
        next_ns = std::min(next_ns, pause_end);
        break;
      }
      if (!hooks_.ready_for_checkpoint()) break;
      Request r = std::move(requests_.front());
      requests_.pop_front();
      trigger_locked(r.type, r.target_dir, r.promise);
    }
    // Periodic checkpoints wait behind queued savepoints, and count pending savepoints against the slots.
    if ((options_.interval_ms > 0 || urgent_) && requests_.empty()) {
      int64_t due = urgent_ ? now : last_trigger_ns_ + options_.interval_ms * 1'000'000;
      due = std::max(due, pause_end);
      if (due <= now && slot_free() && hooks_.ready_for_checkpoint()) {
        urgent_ = false;
        trigger_locked(SnapshotType::kCheckpoint, "", nullptr);
      } else if (due > now) {
        next_ns = std::min(next_ns, due);
      }
    }
    for (auto& [id, p] : pending_)
      next_ns = std::min(next_ns, p->start_ns + options_.timeout_ms * 1'000'000 + 1);
    // Intervals, pauses and timeouts are read on the job's Clock; the wait is at most 100 ms of real time, so a
    // ManualClock a test advances is noticed within that (the system clock's waits end when due).
    lock.wait_for(
        cv_, std::chrono::nanoseconds(std::clamp<int64_t>(next_ns - clock_.monotonic_ns(), 1'000'000, 100'000'000)));
  }
}

void CheckpointCoordinator::trigger_locked(SnapshotType type, const std::string& target_dir,
                                           std::shared_ptr<std::promise<Result<std::string>>> promise) {
  const int64_t id = next_id_++;
  last_trigger_ns_ = clock_.monotonic_ns();
  Result<std::filesystem::path> dir =
      type == SnapshotType::kCheckpoint
          ? storage_.init_checkpoint(id)
          : storage_.init_savepoint(target_dir.empty() ? options_.savepoint_dir : target_dir, id);
  if (!dir.ok()) {
    spdlog::warn("could not start {} {}: {}", snapshot_type_name(type), id, dir.error().to_string());
    CheckpointStats s;
    s.checkpoint_id = id;
    s.type = snapshot_type_name(type);
    s.trigger_time_ms = clock_.now_ms();
    s.failure = dir.error().to_string();
    record_stats_locked(std::move(s));
    if (promise) promise->set_value(dir.error());
    if (type == SnapshotType::kCheckpoint && ++consecutive_failures_ > options_.tolerable_failures) {
      hooks_.fail_job(Error(ErrorCode::kCheckpoint,
                            fmt::format("{} consecutive checkpoints failed, more than tolerated ({} = {}); last: {}",
                                        consecutive_failures_, options::kTolerableFailedCheckpoints.key,
                                        options_.tolerable_failures, dir.error().to_string())));
    }
    return;
  }
  auto p = std::make_unique<Pending>();
  p->id = id;
  p->type = type;
  p->dir = *dir;
  p->start_ns = clock_.monotonic_ns();
  p->promise = std::move(promise);
  p->barrier = CheckpointBarrier{id, clock_.now_ms(), type, options_.mode};
  Pending& ref = *p;
  pending_[id] = std::move(p);
  // Register what must be acknowledged before any task can acknowledge: acks wait for mu_.
  CheckpointJobHooks::Triggered t = hooks_.trigger_into(ref.barrier, ref.dir);
  for (const auto& key : t.tasks) {
    ref.not_acknowledged.insert(key);
    ref.not_written.insert(key);
  }
  ref.coordinator_state = last_coordinator_state_;
  for (auto& [uid, bytes] : t.coordinator_state) {
    ref.coordinator_state[uid] = bytes;
    last_coordinator_state_[uid] = std::move(bytes);
  }
  // Tasks that already closed contribute their retained final state.
  for (const auto& [key, name] : finished_tasks_) {
    auto it = final_snapshots_.find(key);
    if (it != final_snapshots_.end()) {
      ref.not_written.insert(key);
      enqueue_write_locked(ref, key, name, it->second);
      continue;
    }
    auto f = final_files_.find(key);
    if (f == final_files_.end()) continue;
    ref.not_written.insert(key);
    enqueue_write_locked(ref, key, name, nullptr, f->second);
  }
  if (t.failure) {
    // Not counted against execution.checkpointing.tolerable-failed-checkpoints (as Flink does not count a
    // checkpoint that could not start): a TaskManager that cannot be reached is the heartbeats' business.
    abort_locked(id, *t.failure, /*notify_tasks=*/true, /*count_failure=*/false);
    return;
  }
  if (t.tasks.empty() && ref.not_written.empty()) {
    // Every task has closed (a stop-with-savepoint, or the job ended meanwhile): nothing to checkpoint.
    abort_locked(id, "no task is running", false, false, /*discard=*/true, /*job_ended=*/true);
    return;
  }
  spdlog::debug("triggered {} {} at {} tasks", snapshot_type_name(type), id, t.tasks.size());
  if (ref.not_written.empty()) {
    ready_.push_back(id);
    cv_.notify_all();
  }
}

void CheckpointCoordinator::enqueue_write_locked(Pending& p, const CheckpointTaskKey& key, std::string task_name,
                                                 std::shared_ptr<const TaskStateSnapshot> snapshot,
                                                 std::shared_ptr<const RetainedFiles> files) {
  auto job = std::make_unique<WriteJob>();
  job->id = p.id;
  job->dir = p.dir;
  job->key = key;
  job->task_name = std::move(task_name);
  job->snapshot = std::move(snapshot);
  job->files = std::move(files);
  write_queue_.push_back(std::move(job));
  writer_cv_.notify_one();
}

void CheckpointCoordinator::acknowledge(const CheckpointTaskKey& task, std::string task_name,
                                        TaskStateSnapshot&& snapshot) {
  auto shared = std::make_shared<const TaskStateSnapshot>(std::move(snapshot));
  MutexLock lock(mu_);
  if (shared->finished_input) final_snapshots_[task] = shared;
  auto it = pending_.find(shared->checkpoint_id);
  if (it == pending_.end() || stopping_) return;  // aborted meanwhile
  Pending& p = *it->second;
  if (p.not_acknowledged.erase(task) == 0) return;  // not expected (a duplicate, or a task of another attempt)
  enqueue_write_locked(p, task, std::move(task_name), std::move(shared));
}

void CheckpointCoordinator::run_writer() {
  pthread_setname_np(pthread_self(), "sluice-ckpt-io");
  for (;;) {
    std::unique_ptr<WriteJob> job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && write_queue_.empty())
        lock.wait(writer_cv_);
      if (stopping_) return;
      job = std::move(write_queue_.front());
      write_queue_.pop_front();
    }
    std::vector<OperatorSubtaskStateHandle> handles;
    std::vector<std::string> uids;
    TaskCheckpointStats stats;
    stats.task = job->task_name;
    std::optional<Error> error;
    if (job->files) {
      // A finished task of another process: its final state files again, byte for byte, in this checkpoint.
      stats.alignment_ns = job->files->alignment_ns;
      stats.sync_pause_ns = job->files->sync_pause_ns;
      for (size_t i = 0; i < job->files->handles.size() && !error; ++i) {
        const OperatorSubtaskStateHandle& h = job->files->handles[i];
        Status st = write_file_synced(job->dir / h.file, job->files->bytes[i]->view());
        if (!st.ok()) {
          error = st.error().with_context(
              fmt::format("writing the final state of '{}' into checkpoint {}", job->task_name, job->id));
          break;
        }
        stats.state_bytes += h.file_size;
        handles.push_back(h);
        handles.back().location.clear();  // this copy is the JobManager's: no TaskManager holds it locally
        uids.push_back(job->files->uids[i]);
      }
      if (error) {
        on_written(job->id, job->key, *error, {}, stats);
      } else {
        on_written(job->id, job->key, std::move(handles), std::move(uids), stats);
      }
      continue;
    }
    stats.alignment_ns = job->snapshot->alignment_ns;
    stats.sync_pause_ns = job->snapshot->sync_pause_ns;
    for (const auto& op : job->snapshot->operators) {
      if (op.operator_state.empty() && op.keyed == nullptr) continue;
      uint64_t uploaded = 0;
      Result<OperatorSubtaskStateHandle> h = storage_.write_subtask_state(job->dir, op.operator_uid, job->key.subtask,
                                                                          op.operator_state, op.keyed.get(), &uploaded);
      if (!h.ok()) {
        error =
            h.error().with_context(fmt::format("writing the state of '{}' for checkpoint {}", job->task_name, job->id));
        break;
      }
      stats.state_bytes += h->file_size + uploaded;  // what this checkpoint wrote (incremental: new files only)
      handles.push_back(std::move(*h));
      uids.push_back(op.operator_uid);
    }
    if (error) {
      on_written(job->id, job->key, *error, {}, stats);
    } else {
      on_written(job->id, job->key, std::move(handles), std::move(uids), stats);
    }
  }
}

void CheckpointCoordinator::on_written(int64_t id, const CheckpointTaskKey& key,
                                       Result<std::vector<OperatorSubtaskStateHandle>> handles,
                                       std::vector<std::string> uids, TaskCheckpointStats stats) {
  MutexLock lock(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  if (!handles.ok()) {
    abort_locked(id, handles.error().to_string(), true, true);
    return;
  }
  for (size_t i = 0; i < uids.size(); ++i)
    p.handles[uids[i]].push_back(std::move((*handles)[i]));
  p.task_stats.push_back(std::move(stats));
  p.not_written.erase(key);
  if (p.not_written.empty() && p.not_acknowledged.empty()) {
    ready_.push_back(id);
    cv_.notify_all();
  }
}

void CheckpointCoordinator::complete(int64_t id) {
  MutexLock completion(completion_mu_);
  CheckpointMetadata meta;
  std::filesystem::path dir;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    Pending& p = *it->second;
    p.completing = true;
    dir = p.dir;
    meta.checkpoint_id = id;
    meta.trigger_timestamp = p.barrier.timestamp;
    meta.type = p.type;
    meta.job_id = storage_.job_id();
    meta.coordinator_state = p.coordinator_state;
    for (const auto& v : vertices_) {
      for (size_t i = 0; i < v.uids.size(); ++i) {
        auto h = p.handles.find(v.uids[i]);
        if (h == p.handles.end() || h->second.empty()) continue;
        OperatorStateEntry e;
        e.uid = v.uids[i];
        e.parallelism = v.parallelism;
        e.max_parallelism = v.max_parallelism[i];
        e.subtasks = h->second;
        std::sort(e.subtasks.begin(), e.subtasks.end(),
                  [](const auto& a, const auto& b) { return a.subtask < b.subtask; });
        for (const auto& s : e.subtasks) {
          meta.total_state_bytes += s.file_size;
          if (s.native) {
            for (const auto& f : s.native->files)
              if (!f.shared_name.empty()) meta.total_state_bytes += f.size;  // the full state, shared files too
          }
        }
        meta.operators.push_back(std::move(e));
      }
    }
  }
  Status st = storage_.finalize_checkpoint(dir, meta);
  MutexLock lock(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  if (!st.ok()) {
    it->second->completing = false;
    abort_locked(id, st.error().to_string(), true, true);
    return;
  }
  if (Status published = hooks_.before_complete(id, dir); !published.ok()) {
    it->second->completing = false;
    abort_locked(id, published.error().to_string(), true, true, /*discard=*/false);
    return;
  }
  std::unique_ptr<Pending> p = std::move(it->second);
  pending_.erase(it);
  const int64_t duration_ms = (clock_.monotonic_ns() - p->start_ns) / 1'000'000;
  last_end_ns_ = clock_.monotonic_ns();
  if (p->type == SnapshotType::kCheckpoint) consecutive_failures_ = 0;
  store_->add(CompletedCheckpoint{id, dir, meta});
  latest_ = RestorePoint{dir, meta};
  CheckpointStats s;
  s.checkpoint_id = id;
  s.type = snapshot_type_name(p->type);
  s.trigger_time_ms = p->barrier.timestamp;
  s.duration_ms = duration_ms;
  s.state_bytes = meta.total_state_bytes;
  s.completed = true;
  s.path = dir.string();
  int64_t max_sync = 0;
  int64_t max_align = 0;
  for (const auto& t : p->task_stats) {
    max_sync = std::max(max_sync, t.sync_pause_ns);
    max_align = std::max(max_align, t.alignment_ns);
    s.checkpointed_bytes += t.state_bytes;
  }
  s.tasks = std::move(p->task_stats);
  spdlog::info("completed {} {} ({}) in {} ms: {} ({} written), max alignment {:.1f} ms, max sync pause {:.2f} ms",
               snapshot_type_name(p->type), id, dir.string(), duration_ms, human_bytes(meta.total_state_bytes),
               human_bytes(s.checkpointed_bytes), static_cast<double>(max_align) / 1e6,
               static_cast<double>(max_sync) / 1e6);
  record_stats_locked(std::move(s));
  // Older pending checkpoints are subsumed (Flink aborts them).
  std::vector<int64_t> older;
  for (auto& [pid, pp] : pending_) {
    if (pid < id) older.push_back(pid);
  }
  for (int64_t o : older)
    abort_locked(o, fmt::format("subsumed by checkpoint {}", id), true, false);
  hooks_.notify_complete(id);
  if (p->promise) p->promise->set_value(dir.string());
}

void CheckpointCoordinator::abort_locked(int64_t id, const std::string& reason, bool notify_tasks, bool count_failure,
                                         bool discard, bool job_ended) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  std::unique_ptr<Pending> p = std::move(it->second);
  pending_.erase(it);
  last_end_ns_ = clock_.monotonic_ns();
  // Writes still queued for it are dropped; a write in flight finds no pending entry when it reports.
  std::erase_if(write_queue_, [&](const std::unique_ptr<WriteJob>& j) { return j->id == id; });
  if (discard) storage_.discard(p->dir);
  // Expected aborts (the job ended, a newer checkpoint completed) are not worth a warning.
  spdlog::log(count_failure || p->promise ? spdlog::level::warn
              : notify_tasks              ? spdlog::level::info
                                          : spdlog::level::debug,
              "{} {} aborted: {}", snapshot_type_name(p->type), id, reason);
  if (job_ended && p->type == SnapshotType::kCheckpoint && !p->promise) {
    // Discarded, not failed: nothing went wrong with checkpointing (a bounded job simply finished first).
    if (notify_tasks) hooks_.notify_aborted(id);
    return;
  }
  CheckpointStats s;
  s.checkpoint_id = id;
  s.type = snapshot_type_name(p->type);
  s.trigger_time_ms = p->barrier.timestamp;
  s.duration_ms = (clock_.monotonic_ns() - p->start_ns) / 1'000'000;
  s.failure = reason;
  s.tasks = std::move(p->task_stats);
  record_stats_locked(std::move(s));
  if (notify_tasks) hooks_.notify_aborted(id);
  if (p->promise) p->promise->set_value(Error(ErrorCode::kCheckpoint, reason));
  if (count_failure && p->type == SnapshotType::kCheckpoint && ++consecutive_failures_ > options_.tolerable_failures) {
    hooks_.fail_job(Error(
        ErrorCode::kCheckpoint,
        fmt::format("{} consecutive checkpoints failed, more than tolerated ({} = {}); last: {}", consecutive_failures_,
                    options::kTolerableFailedCheckpoints.key, options_.tolerable_failures, reason)));
  }
}

void CheckpointCoordinator::acknowledge_written(const CheckpointTaskKey& task, int64_t checkpoint_id,
                                                std::vector<std::string> uids,
                                                std::vector<OperatorSubtaskStateHandle> handles,
                                                TaskCheckpointStats stats, bool finished_input) {
  if (uids.size() != handles.size()) {
    decline(task, stats.task, checkpoint_id,
            fmt::format("its acknowledgement has {} operator uids for {} state handles", uids.size(), handles.size()));
    return;
  }
  if (finished_input) {
    // Map the final state's files now, while the checkpoint's directory exists: a later checkpoint writes
    // them again after this one is subsumed (outside the lock: it reads and hashes every file).
    std::filesystem::path dir;
    {
      MutexLock lock(mu_);
      auto it = pending_.find(checkpoint_id);
      if (it != pending_.end() && it->second->not_acknowledged.count(task) != 0) dir = it->second->dir;
    }
    if (!dir.empty()) {
      auto retained = std::make_shared<RetainedFiles>();
      retained->uids = uids;
      retained->handles = handles;
      retained->alignment_ns = stats.alignment_ns;
      retained->sync_pause_ns = stats.sync_pause_ns;
      for (const auto& h : handles) {
        auto bytes = FileCheckpointStorage::read_state_file(dir, h);
        if (!bytes.ok()) {
          decline(task, stats.task, checkpoint_id,
                  bytes.error().with_context("reading back the final state it wrote").to_string());
          return;
        }
        retained->bytes.push_back(std::move(*bytes));
      }
      MutexLock lock(mu_);
      final_files_[task] = std::move(retained);
    }
  }
  MutexLock lock(mu_);
  auto it = pending_.find(checkpoint_id);
  if (it == pending_.end() || stopping_) return;  // aborted meanwhile
  Pending& p = *it->second;
  if (p.not_acknowledged.erase(task) == 0) return;  // not expected (a duplicate, or a task of another attempt)
  for (size_t i = 0; i < uids.size(); ++i) {
    stats.state_bytes += handles[i].file_size;
    p.handles[uids[i]].push_back(std::move(handles[i]));
  }
  p.task_stats.push_back(std::move(stats));
  p.not_written.erase(task);
  if (p.not_written.empty() && p.not_acknowledged.empty()) {
    ready_.push_back(checkpoint_id);
    cv_.notify_all();
  }
}

void CheckpointCoordinator::decline(const CheckpointTaskKey& task, const std::string& task_name, int64_t checkpoint_id,
                                    const std::string& reason) {
  MutexLock lock(mu_);
  auto it = pending_.find(checkpoint_id);
  if (it == pending_.end() || stopping_ || it->second->completing) return;
  if (it->second->not_acknowledged.count(task) == 0) return;  // a task of another attempt, or a duplicate
  abort_locked(checkpoint_id,
               fmt::format("task '{}' declined {} {}: {}", task_name.empty() ? "?" : task_name,
                           snapshot_type_name(it->second->type), checkpoint_id, reason),
               true, true);
}

void CheckpointCoordinator::on_end_of_input(const CheckpointTaskKey& task) {
  MutexLock lock(mu_);
  for (auto& [id, p] : pending_) {
    if (p->not_acknowledged.count(task) != 0) hooks_.trigger_task(task, p->barrier);
  }
  // The task waits for a checkpoint of its final state before it closes: take one soon.
  urgent_ = true;
  cv_.notify_all();
}

void CheckpointCoordinator::on_task_finished(const CheckpointTaskKey& task, const std::function<void()>& mark_exited) {
  MutexLock lock(mu_);
  mark_exited();
  auto it = final_snapshots_.find(task);
  auto files = final_files_.find(task);
  std::string name;
  for (const auto& v : vertices_) {
    if (v.vertex == task.vertex) name = fmt::format("{} ({}/{})", v.name, task.subtask + 1, v.parallelism);
  }
  if (it != final_snapshots_.end() || files != final_files_.end()) finished_tasks_[task] = name;
  // Pending checkpoints that still expect this task: its final state stands in for the acknowledgement
  // (without one, a job without periodic checkpoints, it contributes nothing).
  std::vector<int64_t> ready;
  for (auto& [id, p] : pending_) {
    if (p->not_acknowledged.erase(task) == 0) continue;
    if (it != final_snapshots_.end()) {
      enqueue_write_locked(*p, task, name, it->second);
    } else if (files != final_files_.end()) {
      enqueue_write_locked(*p, task, name, nullptr, files->second);
    } else {
      p->not_written.erase(task);
      if (p->not_written.empty() && p->not_acknowledged.empty()) ready.push_back(id);
    }
  }
  for (int64_t id : ready)
    ready_.push_back(id);
  if (!ready.empty()) cv_.notify_all();
}

void CheckpointCoordinator::on_tasks_reset(const std::vector<CheckpointTaskKey>& tasks) {
  MutexLock lock(mu_);
  for (const auto& t : tasks) {
    final_snapshots_.erase(t);
    final_files_.erase(t);
    finished_tasks_.erase(t);
  }
}

void CheckpointCoordinator::abort_pending(const std::string& reason) {
  MutexLock completion(completion_mu_);
  MutexLock lock(mu_);
  std::vector<int64_t> ids;
  for (auto& [id, p] : pending_)
    ids.push_back(id);
  for (int64_t id : ids)
    abort_locked(id, reason, true, false);
  ready_.clear();
}

std::future<Result<std::string>> CheckpointCoordinator::trigger_savepoint(std::string target_dir, bool terminate) {
  auto promise = std::make_shared<std::promise<Result<std::string>>>();
  auto future = promise->get_future();
  {
    MutexLock lock(mu_);
    if (stopping_) {
      promise->set_value(Error(ErrorCode::kCheckpoint, "the job is not running"));
      return future;
    }
    if (target_dir.empty() && options_.savepoint_dir.empty()) {
      promise->set_value(Error(ErrorCode::kConfiguration,
                               fmt::format("no savepoint directory: pass one or set {}", options::kSavepointDir.key)));
      return future;
    }
    requests_.push_back(Request{terminate ? SnapshotType::kSavepointTerminate : SnapshotType::kSavepoint,
                                std::move(target_dir), promise});
  }
  cv_.notify_all();
  return future;
}

std::optional<RestorePoint> CheckpointCoordinator::latest_restore_point() const {
  MutexLock lock(mu_);
  return latest_;
}

std::vector<RestorePoint> CheckpointCoordinator::restore_candidates() const {
  MutexLock lock(mu_);
  std::vector<RestorePoint> out;
  for (const auto& c : store_->all())
    out.push_back(RestorePoint{c->dir, c->metadata});
  if (latest_ && (out.empty() || out.front().metadata.checkpoint_id != latest_->metadata.checkpoint_id)) {
    out.insert(out.begin(), *latest_);
  }
  return out;
}

void CheckpointCoordinator::set_initial_restore_point(RestorePoint point) {
  MutexLock lock(mu_);
  last_coordinator_state_ = point.metadata.coordinator_state;
  latest_ = std::move(point);
}

std::vector<CheckpointStats> CheckpointCoordinator::stats() const {
  MutexLock lock(stats_mu_);
  return {stats_.begin(), stats_.end()};
}

int64_t CheckpointCoordinator::completed_count() const {
  MutexLock lock(stats_mu_);
  return completed_;
}

int64_t CheckpointCoordinator::failed_count() const {
  MutexLock lock(stats_mu_);
  return failed_;
}

void CheckpointCoordinator::record_stats_locked(CheckpointStats stats) {
  // The count and the history move together: a reader that sees N completed finds the N-th in stats().
  MutexLock lock(stats_mu_);
  if (stats.completed) {
    ++completed_;
  } else {
    ++failed_;
  }
  stats_.push_back(std::move(stats));
  while (stats_.size() > kMaxStats)
    stats_.pop_front();
}

}  // namespace sluice
