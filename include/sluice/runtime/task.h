// Task: one parallel subtask of a job vertex (an operator chain), run by one thread in a mailbox loop
// (the model of Flink's StreamTask and MailboxProcessor).
//
// The thread alternates between mails (control actions posted by other threads), due timers, and one unit of
// input: a batch from the source reader, or one network buffer from the input gate. With nothing to do it
// sends partly filled output buffers and sleeps on its WakeupSignal. Operator code, state and timers run only
// on this thread.
//
// Lifecycle: created -> running (open, process) -> finishing (end_input, finish, end-of-partition) -> closed
// (close, always) -> FINISHED | FAILED | CANCELED, reported once to the TaskListener.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/api/source_operator.h"
#include "sluice/core/clock.h"
#include "sluice/runtime/input_processor.h"
#include "sluice/runtime/record_writer.h"
#include "sluice/runtime/wakeup.h"
#include "sluice/state/operator_state.h"

namespace sluice {

enum class TaskState { kCreated, kRunning, kFinished, kFailed, kCanceled };
const char* task_state_name(TaskState s);

class Task;

/// Told when a task reaches a terminal state (from the task's thread).
class TaskListener {
 public:
  virtual ~TaskListener() = default;
  virtual void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) = 0;
};

/// The RuntimeContext of one operator in one subtask.
class TaskRuntimeContext final : public RuntimeContext {
 public:
  TaskRuntimeContext(std::string operator_name, int subtask, int parallelism, int max_parallelism, int attempt,
                     const Clock& clock)
      : name_(std::move(operator_name)),
        subtask_(subtask),
        parallelism_(parallelism),
        max_parallelism_(max_parallelism),
        attempt_(attempt),
        clock_(clock) {}
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return subtask_; }
  int parallelism() const override { return parallelism_; }
  int max_parallelism() const override { return max_parallelism_; }
  int attempt_number() const override { return attempt_; }
  const Clock& clock() const override { return clock_; }
  OperatorStateStore& operator_state() override { return operator_state_; }

 private:
  OperatorStateStore operator_state_;
  std::string name_;
  int subtask_, parallelism_, max_parallelism_, attempt_;
  const Clock& clock_;
};

class Task final : public TaskServices, public CreditWaiter {
 public:
  struct Options {
    std::string vertex_name;
    int subtask_index = 0;
    int parallelism = 1;
    int attempt = 0;
    const Clock* clock = &SystemClock::instance();
    int64_t buffer_timeout_ms = 10;
  };

  Task(Options options, TaskListener& listener);
  ~Task() override;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  // --- wiring, before start() ---
  /// Appends the next operator of the chain (head first); the task owns it and its context.
  StreamOperatorBase* add_operator(std::unique_ptr<StreamOperatorBase> op, std::unique_ptr<TaskRuntimeContext> ctx);
  /// Keeps an output object alive for the task's lifetime.
  OutputBase* own_output(std::unique_ptr<OutputBase> output);
  /// Adds the writer of one outgoing job edge; returns it for wiring network outputs.
  RecordWriter* add_record_writer(std::vector<ChannelSender*> channels);
  /// Adds an input (non-source tasks): input 0, then input 1 for two-input operators.
  void add_input(std::vector<ChannelReceiver*> channels, std::unique_ptr<RecordInput> input);
  WakeupSignal& wakeup_signal() { return wakeup_; }
  const std::vector<std::unique_ptr<StreamOperatorBase>>& operators() const { return operators_; }

  // --- lifecycle, any thread ---
  void start();
  /// Asks the task to stop; returns at once. The task reports kCanceled unless it already terminated.
  void cancel();
  /// Waits for the thread to end.
  void join();
  TaskState state() const { return state_.load(); }
  const Options& options() const { return options_; }
  /// "Map -> Filter (2/4)" (1-based, as Flink prints subtasks).
  std::string display_name() const;

  // --- TaskServices ---
  void post_mail(std::function<void()> mail) override;
  void wakeup() override { wakeup_.notify(); }
  void wakeup_at(TimestampMs time_ms) override;
  void register_processing_timer(TimestampMs time_ms, std::function<void(TimestampMs)> callback) override;
  const Clock& processing_clock() const override { return *options_.clock; }
  bool is_cancelled() const override { return cancelled_.load(std::memory_order_acquire); }
  const std::atomic<bool>& cancelled_flag() const override { return cancelled_; }

  // --- CreditWaiter ---
  void prepare_wait_for_credit() override { wakeup_.clear(); }
  void wait_for_credit() override;

 private:
  void run();
  void invoke();
  void run_source_loop(SourceOperatorBase& source);
  void run_input_loop();
  void process_mails();
  void fire_due_timers();
  StreamInputProcessor::Status process_input();
  void maybe_flush();
  void flush_outputs();
  void idle_wait();
  void check_cancelled() const {
    if (is_cancelled()) throw TaskCancelledException{};
  }
  Error describe_failure(const std::string& operator_name, const std::string& message,
                         ErrorCode code = ErrorCode::kRuntime) const;

  Options options_;
  TaskListener& listener_;
  std::vector<std::unique_ptr<StreamOperatorBase>> operators_;
  std::vector<std::unique_ptr<TaskRuntimeContext>> contexts_;
  std::vector<std::unique_ptr<OutputBase>> outputs_;
  std::vector<std::unique_ptr<RecordWriter>> writers_;
  std::vector<std::unique_ptr<RecordInput>> record_inputs_;
  std::vector<std::unique_ptr<StreamInputProcessor>> inputs_;
  size_t next_input_ = 0;

  WakeupSignal wakeup_;
  std::atomic<bool> cancelled_{false};
  std::atomic<TaskState> state_{TaskState::kCreated};
  std::thread thread_;

  std::mutex mail_mu_;
  std::deque<std::function<void()>> mails_;
  std::atomic<bool> has_mail_{false};
  // Processing-time timers (task thread only), earliest first; ties fire in registration order.
  struct ProcessingTimer {
    TimestampMs time;
    uint64_t seq;
    std::function<void(TimestampMs)> callback;
    bool operator>(const ProcessingTimer& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  std::priority_queue<ProcessingTimer, std::vector<ProcessingTimer>, std::greater<>> timers_;
  uint64_t timer_seq_ = 0;
  int64_t last_flush_ns_ = 0;
};

}  // namespace sluice
