#include "sluice/runtime/task.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <cassert>
#include <chrono>

#include "sluice/core/cancellation.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/thread_checker.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Longest sleep without re-checking: bounds the effect of a clock that is not the system clock.
constexpr auto kMaxIdleWait = std::chrono::milliseconds(50);

}  // namespace

const char* task_state_name(TaskState s) {
  switch (s) {
    case TaskState::kCreated:
      return "CREATED";
    case TaskState::kRunning:
      return "RUNNING";
    case TaskState::kFinished:
      return "FINISHED";
    case TaskState::kFailed:
      return "FAILED";
    case TaskState::kCanceled:
      return "CANCELED";
  }
  return "UNKNOWN";
}

Task::Task(Options options, TaskListener& listener) : options_(std::move(options)), listener_(listener) {}

Task::~Task() {
  cancel();
  join();
}

StreamOperatorBase* Task::add_operator(std::unique_ptr<StreamOperatorBase> op, std::unique_ptr<TaskRuntimeContext> ctx,
                                       std::string uid) {
  ctx->set_checkpointing_enabled(options_.checkpointing_enabled);
  ctx->set_restored(options_.restore != nullptr || options_.restore_loader != nullptr);
  operators_.push_back(std::move(op));
  contexts_.push_back(std::move(ctx));
  uids_.push_back(std::move(uid));
  io_metrics_.input_watermarks.emplace_back(std::numeric_limits<int64_t>::min());
  io_metrics_.output_watermarks.emplace_back(std::numeric_limits<int64_t>::min());
  return operators_.back().get();
}

std::shared_ptr<void> Task::release_keyed_state() {
  assert(!thread_.joinable() && "release_keyed_state() needs a joined task");
  auto released = std::make_shared<std::vector<std::shared_ptr<void>>>();
  for (auto& op : operators_) {
    if (auto state = op->release_keyed_state()) released->push_back(std::move(state));
  }
  if (released->empty()) return nullptr;
  return released;
}

OutputBase* Task::own_output(std::unique_ptr<OutputBase> output) {
  outputs_.push_back(std::move(output));
  return outputs_.back().get();
}

RecordWriter* Task::add_record_writer(std::vector<ChannelSender*> channels) {
  for (auto* c : channels)
    c->set_sender_wakeup(&wakeup_);
  writers_.push_back(std::make_unique<RecordWriter>(std::move(channels), *this));
  return writers_.back().get();
}

void Task::add_input(std::vector<ChannelReceiver*> channels, std::unique_ptr<RecordInput> input) {
  for (auto* c : channels)
    c->set_receiver_wakeup(&wakeup_);
  record_inputs_.push_back(std::move(input));
  inputs_.push_back(std::make_unique<StreamInputProcessor>(std::move(channels), *record_inputs_.back()));
  inputs_.back()->set_barrier_handler(nullptr, input_channels_);
  input_channels_ += inputs_.back()->num_channels();
}

std::string Task::display_name() const {
  return fmt::format("{} ({}/{})", options_.vertex_name, options_.subtask_index + 1, options_.parallelism);
}

void Task::start() {
  if (!inputs_.empty()) {
    barrier_handler_ = std::make_unique<CheckpointBarrierHandler>(
        input_channels_,
        [this](const CheckpointBarrier& b, int64_t alignment_ns) { perform_checkpoint(b, alignment_ns); });
    size_t offset = 0;
    for (auto& in : inputs_) {
      in->set_barrier_handler(barrier_handler_.get(), offset);
      offset += in->num_channels();
    }
  }
  state_.store(TaskState::kRunning);
  thread_ = std::thread([this] { run(); });
}

void Task::cancel() {
  cancelled_.store(true, std::memory_order_release);
  wakeup_.notify();
}

void Task::join() {
  if (thread_.joinable()) thread_.join();
}

void Task::post_mail(std::function<void()> mail) {
  mailbox_.put(std::move(mail));
  wakeup_.notify();
}

void Task::wakeup_at(TimestampMs time_ms) {
  register_processing_timer(time_ms, [](TimestampMs) {});
}

void Task::register_processing_timer(TimestampMs time_ms, std::function<void(TimestampMs)> callback) {
  // From another thread it would race with fire_due_timers on the heap: the timer could be lost or the heap broken.
  SLUICE_DCHECK_ON_THREAD(task_thread_, "Task::register_processing_timer (TaskServices, task thread only)");
  timers_.push(ProcessingTimer{time_ms, timer_seq_++, std::move(callback)});
}

void Task::wait_for_credit() {
  check_cancelled();
  const int64_t start = steady_ns();
  wakeup_.wait_until(std::chrono::steady_clock::now() + kMaxIdleWait);
  // Single writer: a relaxed load and store, no read-modify-write.
  io_metrics_.backpressured_ns.store(io_metrics_.backpressured_ns.load(std::memory_order_relaxed) + steady_ns() - start,
                                     std::memory_order_relaxed);
  // A backpressured task may not reach its flush or idle points for long: publish here too (only when blocked).
  publish_metrics();
  check_cancelled();
  check_lease(steady_ns());
}

void Task::stop_if_stale(int64_t now_ns) {
  last_lease_check_ns_ = now_ns;
  if (!options_.lease->lapsed()) return;
  // The JobManager may have declared this TaskManager lost and given the task's work to another attempt: the
  // connection thread cancels it too, but it may run only after this thread (a process woken from SIGSTOP).
  spdlog::warn(
      "task '{}' (attempt {}) stops as stale: its TaskManager's lease on the JobManager lapsed {} ms ago (no "
      "heartbeat answered within heartbeat.timeout; the JobManager may have declared the TaskManager lost)",
      display_name(), options_.attempt, options_.lease->clock().now_ms() - options_.lease->deadline_ms());
  cancelled_.store(true, std::memory_order_release);
  throw TaskCancelledException{};
}

void Task::publish_metrics() {
  uint64_t in = 0, out = 0;
  for (const auto& i : inputs_)
    in += i->bytes_received();
  for (const auto& w : writers_)
    out += w->bytes_sent();
  io_metrics_.bytes_in.store(in, std::memory_order_relaxed);
  io_metrics_.bytes_out.store(out, std::memory_order_relaxed);
  // An operator's output watermark is what the next operator of the chain received; the tail's is what the
  // task broadcast downstream (a sink, which sends nothing on, passes on what it received).
  const size_t n = operators_.size();
  for (size_t i = 0; i < n; ++i) {
    const TimestampMs received = operators_[i]->current_watermark();
    TimestampMs passed = received;
    if (i + 1 < n) {
      passed = operators_[i + 1]->current_watermark();
    } else if (!writers_.empty()) {
      passed = writers_.front()->last_watermark();
    }
    io_metrics_.input_watermarks[i].store(received, std::memory_order_relaxed);
    io_metrics_.output_watermarks[i].store(passed, std::memory_order_relaxed);
  }
}

Error Task::describe_failure(const std::string& operator_name, const std::string& message, ErrorCode code) const {
  return Error(code, fmt::format("operator '{}' failed in subtask {}/{} (attempt {}) of task '{}': {}", operator_name,
                                 options_.subtask_index + 1, options_.parallelism, options_.attempt,
                                 options_.vertex_name, message));
}

void Task::run() {
  // Task threads are recognisable in top, gdb and the tests (the kernel keeps at most 15 characters).
  pthread_setname_np(pthread_self(), "sluice-task");
  task_thread_.bind();
  // Blocking connector calls (a Kafka flush) check it between bounded waits (core/cancellation.h).
  set_current_task_cancel_flag(&cancelled_);
  set_current_task_lease(options_.lease);
  io_metrics_.start_ns.store(steady_ns(), std::memory_order_relaxed);
  TaskState final_state = TaskState::kFinished;
  std::optional<Error> error;
  try {
    invoke();
  } catch (const TaskCancelledException&) {
    final_state = TaskState::kCanceled;
  } catch (const OperatorException& e) {
    final_state = TaskState::kFailed;
    error = describe_failure(e.operator_name(), e.what(), e.code());
  } catch (const SluiceException& e) {
    final_state = TaskState::kFailed;
    error = e.error().with_context(fmt::format("task '{}' failed", display_name()));
  } catch (const std::exception& e) {
    final_state = TaskState::kFailed;
    error = Error(ErrorCode::kRuntime, fmt::format("task '{}' failed: {}", display_name(), e.what()));
  }
  // Close every operator, tail first, whatever happened; a failure while closing is logged, not hidden.
  for (auto it = operators_.rbegin(); it != operators_.rend(); ++it) {
    try {
      (*it)->close();
    } catch (const TaskCancelledException&) {
      // A sink that found the task cancelled or stale while closing (core/cancellation.h) wrote nothing more.
      if (final_state == TaskState::kFinished) final_state = TaskState::kCanceled;
    } catch (const std::exception& e) {
      spdlog::warn("closing operator '{}' of task '{}' failed: {}", (*it)->name(), display_name(), e.what());
      if (final_state == TaskState::kFinished) {
        final_state = TaskState::kFailed;
        error = describe_failure((*it)->name(), std::string("close failed: ") + e.what());
      }
    }
  }
  if (final_state == TaskState::kFailed && is_cancelled() && !error) final_state = TaskState::kCanceled;
  publish_metrics();
  io_metrics_.end_ns.store(steady_ns(), std::memory_order_relaxed);
  state_.store(final_state);
  listener_.on_task_terminated(*this, final_state, error);
}

void Task::trigger_checkpoint(const CheckpointBarrier& barrier) {
  post_mail([this, barrier] { perform_checkpoint(barrier, 0); });
}

void Task::notify_checkpoint_complete(int64_t checkpoint_id) {
  post_mail([this, checkpoint_id] {
    for (auto it = operators_.rbegin(); it != operators_.rend(); ++it) {
      StreamOperatorBase* op = it->get();
      call_user_function(op->name(), [&] { op->notify_checkpoint_complete(checkpoint_id); });
    }
    if (exit_after_checkpoint_ >= 0 && checkpoint_id >= exit_after_checkpoint_) exit_allowed_ = true;
  });
}

void Task::notify_checkpoint_aborted(int64_t checkpoint_id) {
  post_mail([this, checkpoint_id] {
    if (barrier_handler_) barrier_handler_->abort(checkpoint_id);
    for (auto it = operators_.rbegin(); it != operators_.rend(); ++it) {
      StreamOperatorBase* op = it->get();
      call_user_function(op->name(), [&] { op->notify_checkpoint_aborted(checkpoint_id); });
    }
    if (stop_without_drain_ && checkpoint_id == exit_after_checkpoint_) {
      // The sources already stopped for this stop-with-savepoint: fail over to the last checkpoint.
      throw SluiceException(Error(ErrorCode::kRuntime, fmt::format("stop-with-savepoint {} was aborted; the job "
                                                                   "restarts from its latest checkpoint",
                                                                   checkpoint_id)));
    }
  });
}

void Task::perform_checkpoint(const CheckpointBarrier& barrier, int64_t alignment_ns) {
  if (barrier.checkpoint_id <= last_snapshot_id_) return;  // taken already (a trigger raced the barrier)
  last_snapshot_id_ = barrier.checkpoint_id;
  const int64_t start = steady_ns();
  SLUICE_FAULT_POINT("checkpoint.snapshot:" + options_.vertex_name);
  TaskStateSnapshot snapshot;
  snapshot.checkpoint_id = barrier.checkpoint_id;
  snapshot.alignment_ns = alignment_ns;
  snapshot.finished_input = input_finished_;
  snapshot.operators.reserve(operators_.size());
  for (size_t i = 0; i < operators_.size(); ++i) {
    StreamOperatorBase* op = operators_[i].get();
    OperatorSubtaskSnapshot os;
    os.operator_uid = uids_[i];
    call_user_function(op->name(), [&] {
      op->snapshot_state(barrier.checkpoint_id);
      os.keyed = op->snapshot_keyed_state();
    });
    OperatorStateStore& store = contexts_[i]->operator_state();
    if (!store.state_names().empty()) {
      DataOutput out;
      store.snapshot(out);
      os.operator_state.assign(reinterpret_cast<const char*>(out.data()), out.size());
    }
    snapshot.operators.push_back(std::move(os));
  }
  // Forward the barrier: everything emitted from now on belongs to the next checkpoint.
  for (auto& w : writers_) {
    if (!w->finished()) w->broadcast_barrier(barrier);
  }
  snapshot.sync_pause_ns = steady_ns() - start;
  if (barrier.type == SnapshotType::kSavepointTerminate && !input_finished_) {
    stop_without_drain_ = true;
    exit_after_checkpoint_ = barrier.checkpoint_id;
  } else if (input_finished_ && exit_after_checkpoint_ < 0) {
    exit_after_checkpoint_ = barrier.checkpoint_id;
  }
  listener_.on_checkpoint_snapshot(*this, std::move(snapshot));
}

void Task::restore_state() {
  const int64_t start = steady_ns();
  restore_ = options_.restore;
  if (!restore_ && options_.restore_loader) {
    Result<std::shared_ptr<const TaskRestore>> loaded = options_.restore_loader();
    if (!loaded.ok()) throw SluiceException(loaded.error().with_context("restoring the state of " + display_name()));
    restore_ = std::move(*loaded);
    state_read_ns_ = steady_ns() - start;
  }
  if (!restore_) return;
  SLUICE_FAULT_POINT("checkpoint.restore:" + options_.vertex_name);
  for (size_t i = 0; i < operators_.size(); ++i) {
    auto it = restore_->operators.find(uids_[i]);
    if (it == restore_->operators.end()) continue;
    StreamOperatorBase* op = operators_[i].get();
    if (!it->second.operator_state.empty()) {
      DataInput in(it->second.operator_state);
      Status st = contexts_[i]->operator_state().restore(in);
      if (!st.ok()) {
        throw OperatorException(op->name(),
                                fmt::format("restoring operator state (uid '{}') from checkpoint {}: {}", uids_[i],
                                            restore_->checkpoint_id, st.error().to_string()),
                                ErrorCode::kState);
      }
    }
    op->set_restored_keyed_state(it->second.keyed);
  }
}

void Task::wait_for_final_checkpoint() {
  listener_.on_end_of_input(*this);
  // Only mails run now (checkpoint triggers and notifications); timers stay silent after finish(), as in Flink.
  while (!exit_allowed_) {
    wakeup_.clear();
    check_cancelled();
    process_mails();
    if (exit_allowed_) break;
    flush_outputs();
    publish_metrics();
    const int64_t start = steady_ns();
    wakeup_.wait_until(std::chrono::steady_clock::now() + kMaxIdleWait);
    io_metrics_.idle_ns.store(io_metrics_.idle_ns.load(std::memory_order_relaxed) + steady_ns() - start,
                              std::memory_order_relaxed);
  }
}

void Task::invoke() {
  const int64_t restore_start_ns = steady_ns();
  restore_state();
  // Open tail first, so downstream operators are ready when the head emits.
  for (auto it = operators_.rbegin(); it != operators_.rend(); ++it) {
    StreamOperatorBase* op = it->get();
    call_user_function(op->name(), [&] { op->open(); });
  }
  last_flush_ns_ = steady_ns();
  if (restore_) {
    // Flink's INITIALIZING phase, split: reading the files (storage) vs decoding them into the state backend.
    const int64_t total_ns = last_flush_ns_ - restore_start_ns;
    spdlog::info(
        "task '{}': restored from checkpoint {} in {} ms (state files read in {} ms, state restored and "
        "operators opened in {} ms)",
        display_name(), restore_->checkpoint_id, total_ns / 1'000'000, state_read_ns_ / 1'000'000,
        (total_ns - state_read_ns_) / 1'000'000);
  }
  auto* source = dynamic_cast<SourceOperatorBase*>(operators_.front().get());
  if (source != nullptr) {
    run_source_loop(*source);
    // A bounded source has ended: the final watermark fires all event-time timers and windows downstream
    // (not after a stop-with-savepoint, which ends the job without draining, as Flink's default).
    if (!stop_without_drain_) source->process_watermark(kMaxWatermark);
  } else {
    run_input_loop();
  }
  if (!stop_without_drain_) {
    // Finish the chain head first: what an operator emits in finish() reaches the next one before it finishes.
    for (auto& op : operators_) {
      StreamOperatorBase* o = op.get();
      call_user_function(o->name(), [&] {
        o->end_input();
        o->finish();
      });
    }
  }
  for (auto& w : writers_)
    w->finish();
  input_finished_ = true;
  if (options_.checkpointing_enabled || stop_without_drain_) wait_for_final_checkpoint();
}

void Task::run_source_loop(SourceOperatorBase& source) {
  for (;;) {
    wakeup_.clear();
    check_cancelled();
    process_mails();
    fire_due_timers();
    if (stop_without_drain_) return;  // a stop-with-savepoint was taken: emit nothing after its barrier
    InputStatus st = source.emit_next();
    if (st == InputStatus::kEndOfInput) return;
    if (st == InputStatus::kNothingAvailable) {
      idle_wait();
    } else {
      maybe_flush();
    }
  }
}

void Task::run_input_loop() {
  for (;;) {
    wakeup_.clear();
    check_cancelled();
    process_mails();
    fire_due_timers();
    auto st = process_input();
    if (st == StreamInputProcessor::Status::kEndOfInput) return;
    if (st == StreamInputProcessor::Status::kNothingAvailable) {
      idle_wait();
    } else {
      maybe_flush();
    }
  }
}

void Task::process_mails() {
  SLUICE_DCHECK_ON_THREAD(task_thread_, "Task::process_mails");
  if (!mailbox_.has_mail()) return;
  for (auto& m : mailbox_.take_all())
    m();
}

StreamInputProcessor::Status Task::process_input() {
  // Round robin over the inputs that have not ended; the task's input ends when all have.
  const size_t n = inputs_.size();
  bool all_finished = true;
  for (size_t k = 0; k < n; ++k) {
    StreamInputProcessor& in = *inputs_[next_input_];
    next_input_ = next_input_ + 1 == n ? 0 : next_input_ + 1;
    if (in.finished()) continue;
    all_finished = false;
    if (in.process_next() == StreamInputProcessor::Status::kProcessed) return StreamInputProcessor::Status::kProcessed;
  }
  for (const auto& in : inputs_)
    all_finished = all_finished && in->finished();
  return all_finished ? StreamInputProcessor::Status::kEndOfInput : StreamInputProcessor::Status::kNothingAvailable;
}

void Task::fire_due_timers() {
  SLUICE_DCHECK_ON_THREAD(task_thread_, "Task::fire_due_timers");
  if (timers_.empty()) return;
  const TimestampMs now = options_.clock->now_ms();
  while (!timers_.empty() && timers_.top().time <= now) {
    ProcessingTimer t = timers_.top();
    timers_.pop();
    t.callback(t.time);  // may register new timers
  }
}

void Task::maybe_flush() {
  int64_t now = steady_ns();
  check_lease(now);
  if (now - last_flush_ns_ >= options_.buffer_timeout_ms * 1'000'000) {
    flush_outputs();
    publish_metrics();
    last_flush_ns_ = now;
  }
}

void Task::flush_outputs() {
  for (auto& w : writers_)
    w->flush_all();
}

void Task::idle_wait() {
  // Nothing to do: send what is buffered (low latency when idle), then sleep until woken or a wakeup is due.
  flush_outputs();
  publish_metrics();
  const int64_t start = steady_ns();
  last_flush_ns_ = start;
  auto deadline = std::chrono::steady_clock::now() + kMaxIdleWait;
  if (!timers_.empty()) {
    TimestampMs delta = timers_.top().time - options_.clock->now_ms();
    if (delta <= 0) return;
    deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(delta));
  }
  wakeup_.wait_until(deadline);
  const int64_t end = steady_ns();
  io_metrics_.idle_ns.store(io_metrics_.idle_ns.load(std::memory_order_relaxed) + end - start,
                            std::memory_order_relaxed);
  check_lease(end);
}

}  // namespace sluice
