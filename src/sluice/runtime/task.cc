#include "sluice/runtime/task.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <chrono>

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

StreamOperatorBase* Task::add_operator(std::unique_ptr<StreamOperatorBase> op,
                                       std::unique_ptr<TaskRuntimeContext> ctx) {
  operators_.push_back(std::move(op));
  contexts_.push_back(std::move(ctx));
  return operators_.back().get();
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
}

std::string Task::display_name() const {
  return fmt::format("{} ({}/{})", options_.vertex_name, options_.subtask_index + 1, options_.parallelism);
}

void Task::start() {
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
  {
    std::lock_guard lock(mail_mu_);
    mails_.push_back(std::move(mail));
    has_mail_.store(true, std::memory_order_release);
  }
  wakeup_.notify();
}

void Task::wakeup_at(TimestampMs time_ms) {
  register_processing_timer(time_ms, [](TimestampMs) {});
}

void Task::register_processing_timer(TimestampMs time_ms, std::function<void(TimestampMs)> callback) {
  timers_.push(ProcessingTimer{time_ms, timer_seq_++, std::move(callback)});
}

void Task::wait_for_credit() {
  check_cancelled();
  wakeup_.wait_until(std::chrono::steady_clock::now() + kMaxIdleWait);
  check_cancelled();
}

Error Task::describe_failure(const std::string& operator_name, const std::string& message, ErrorCode code) const {
  return Error(code, fmt::format("operator '{}' failed in subtask {}/{} (attempt {}) of task '{}': {}", operator_name,
                                 options_.subtask_index + 1, options_.parallelism, options_.attempt,
                                 options_.vertex_name, message));
}

void Task::run() {
  // Task threads are recognisable in top, gdb and the tests (the kernel keeps at most 15 characters).
  pthread_setname_np(pthread_self(), "sluice-task");
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
    } catch (const std::exception& e) {
      spdlog::warn("closing operator '{}' of task '{}' failed: {}", (*it)->name(), display_name(), e.what());
      if (final_state == TaskState::kFinished) {
        final_state = TaskState::kFailed;
        error = describe_failure((*it)->name(), std::string("close failed: ") + e.what());
      }
    }
  }
  if (final_state == TaskState::kFailed && is_cancelled() && !error) final_state = TaskState::kCanceled;
  state_.store(final_state);
  listener_.on_task_terminated(*this, final_state, error);
}

void Task::invoke() {
  // Open tail first, so downstream operators are ready when the head emits.
  for (auto it = operators_.rbegin(); it != operators_.rend(); ++it) {
    StreamOperatorBase* op = it->get();
    call_user_function(op->name(), [&] { op->open(); });
  }
  last_flush_ns_ = steady_ns();
  auto* source = dynamic_cast<SourceOperatorBase*>(operators_.front().get());
  if (source != nullptr) {
    run_source_loop(*source);
    // A bounded source has ended: the final watermark fires all event-time timers and windows downstream.
    source->process_watermark(kMaxWatermark);
  } else {
    run_input_loop();
  }
  // Finish the chain head first: what an operator emits in finish() reaches the next one before it finishes.
  for (auto& op : operators_) {
    StreamOperatorBase* o = op.get();
    call_user_function(o->name(), [&] {
      o->end_input();
      o->finish();
    });
  }
  for (auto& w : writers_)
    w->finish();
}

void Task::run_source_loop(SourceOperatorBase& source) {
  for (;;) {
    wakeup_.clear();
    check_cancelled();
    process_mails();
    fire_due_timers();
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
  if (!has_mail_.load(std::memory_order_acquire)) return;
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard lock(mail_mu_);
    batch.swap(mails_);
    has_mail_.store(false, std::memory_order_release);
  }
  for (auto& m : batch)
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
  if (now - last_flush_ns_ >= options_.buffer_timeout_ms * 1'000'000) {
    flush_outputs();
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
  last_flush_ns_ = steady_ns();
  auto deadline = std::chrono::steady_clock::now() + kMaxIdleWait;
  if (!timers_.empty()) {
    TimestampMs delta = timers_.top().time - options_.clock->now_ms();
    if (delta <= 0) return;
    deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(delta));
  }
  wakeup_.wait_until(deadline);
}

}  // namespace sluice
