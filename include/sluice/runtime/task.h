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
#include "sluice/core/clock.h"
#include "sluice/core/task_lease.h"
#include "sluice/core/thread_checker.h"
#include "sluice/operators/source_operator.h"
#include "sluice/runtime/barrier_handler.h"
#include "sluice/runtime/checkpoint_barrier.h"
#include "sluice/runtime/input_processor.h"
#include "sluice/runtime/mailbox.h"
#include "sluice/runtime/record_writer.h"
#include "sluice/runtime/task_state.h"
#include "sluice/runtime/wakeup.h"
#include "sluice/state/operator_state.h"

namespace sluice {

enum class TaskState { kCreated, kRunning, kFinished, kFailed, kCanceled };
const char* task_state_name(TaskState s);

class Task;

/// Told when a task reaches a terminal state, and of its checkpoint progress. Every call comes from the
/// task's own thread.
class TaskListener {
 public:
  virtual ~TaskListener() = default;
  virtual void on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) = 0;
  /// The synchronous part of a checkpoint is done: the listener writes the state (asynchronously) and
  /// acknowledges it to the coordinator.
  virtual void on_checkpoint_snapshot(Task& /*task*/, TaskStateSnapshot&& /*snapshot*/) {}
  /// The task has consumed all its input and finished its operators; with checkpointing it now waits for a
  /// checkpoint that covers its final state to complete before it closes (the coordinator triggers one).
  virtual void on_end_of_input(Task& /*task*/) {}
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
  /// Marks the job as taking periodic checkpoints (before open()).
  void set_checkpointing_enabled(bool enabled) { checkpointing_ = enabled; }
  bool is_checkpointing_enabled() const override { return checkpointing_; }
  /// Marks the subtask as restored from a checkpoint or savepoint (before open()).
  void set_restored(bool restored) { restored_ = restored; }
  bool is_restored() const override { return restored_ || attempt_ > 0; }
  /// The job's configuration (before open()); it must outlive the context.
  void set_job_configuration(const Configuration* config) { config_ = config; }
  const Configuration* job_configuration() const override { return config_; }
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
  bool checkpointing_ = false;
  bool restored_ = false;
  const Configuration* config_ = nullptr;
};

/// Flink's task I/O metrics (TaskIOMetricGroup) of one subtask: time spent waiting for input (idle) and for
/// output credit (backpressured), bytes through the network, and each chained operator's watermarks. Written
/// by the task thread only, with relaxed stores (no lock, no read-modify-write); any thread may read them and
/// sees values at most one publication old. Times are cumulative nanoseconds of the steady clock; bytes and
/// watermarks are published by the task whenever it flushes its outputs (at least every buffer timeout while
/// busy) and when it goes idle or ends, so a reader lags by at most that much.
struct TaskIoMetrics {
  std::atomic<int64_t> idle_ns{0};           ///< waiting for input or a timer (nothing to do)
  std::atomic<int64_t> backpressured_ns{0};  ///< blocked on an output channel without credit
  std::atomic<uint64_t> bytes_in{0};         ///< bytes of the network buffers read (numBytesIn)
  std::atomic<uint64_t> bytes_out{0};        ///< bytes of the network buffers sent (numBytesOut)
  std::atomic<int64_t> start_ns{0};          ///< steady clock when the thread started (0 before)
  std::atomic<int64_t> end_ns{0};            ///< steady clock when the thread ended (0 while it runs)
  /// Per operator of the chain (head first), one per add_operator(): the last watermark the operator received
  /// (currentInputWatermark) and the one it passed on (currentOutputWatermark); INT64_MIN before the first.
  std::deque<std::atomic<int64_t>> input_watermarks;
  std::deque<std::atomic<int64_t>> output_watermarks;
};

class Task final : public TaskServices, public CreditWaiter {
 public:
  struct Options {
    std::string vertex_name;
    int vertex_id = 0;  ///< the job vertex this task runs a subtask of
    int subtask_index = 0;
    int parallelism = 1;
    int attempt = 0;
    const Clock* clock = &SystemClock::instance();
    int64_t buffer_timeout_ms = 10;
    /// With periodic checkpoints, a task that consumed all its input waits for a checkpoint of its final
    /// state to complete before it closes (so two-phase-commit sinks commit their last data exactly once).
    bool checkpointing_enabled = false;
    /// State to restore before open(), by operator uid; null on a fresh start.
    std::shared_ptr<const TaskRestore> restore;
    /// Instead of `restore`: reads the state to restore, called once on the task's own thread before open()
    /// (Flink's INITIALIZING: a deployment with large state returns at once, the task reads its state). An error
    /// fails the task. Null on a fresh start or with `restore`.
    std::function<Result<std::shared_ptr<const TaskRestore>>()> restore_loader;
    /// The TaskManager's lease on its registration (cluster mode; it must outlive the task), or null. A task
    /// whose lease lapsed is stale: it stops (reporting kCanceled) within a millisecond of running again, and
    /// its sinks write nothing more (core/cancellation.h).
    const TaskLease* lease = nullptr;
  };

  Task(Options options, TaskListener& listener);
  ~Task() override;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  // --- wiring, before start() ---
  /// Appends the next operator of the chain (head first); the task owns it and its context. `uid` names its
  /// state in checkpoints.
  StreamOperatorBase* add_operator(std::unique_ptr<StreamOperatorBase> op, std::unique_ptr<TaskRuntimeContext> ctx,
                                   std::string uid = {});
  /// Keeps an output object alive for the task's lifetime.
  OutputBase* own_output(std::unique_ptr<OutputBase> output);
  /// Adds the writer of one outgoing job edge; returns it for wiring network outputs.
  RecordWriter* add_record_writer(std::vector<ChannelSender*> channels);
  /// Adds an input (non-source tasks): input 0, then input 1 for two-input operators.
  void add_input(std::vector<ChannelReceiver*> channels, std::unique_ptr<RecordInput> input);
  WakeupSignal& wakeup_signal() { return wakeup_; }
  const std::vector<std::unique_ptr<StreamOperatorBase>>& operators() const { return operators_; }
  /// The operators' uids, in the order of operators().
  const std::vector<std::string>& operator_uids() const { return uids_; }
  /// Takes the keyed state of every operator of a task whose thread was joined
  /// (StreamOperatorBase::release_keyed_state), so that the caller may free it on another thread: freeing a
  /// large heap state takes over a second per GiB, and a restart must not wait for it. Everything with
  /// effects outside the process (sinks, clients) stays with the operators, which are destroyed with the
  /// task. Returns an owner of the states (nullptr when there is none), for destruction only.
  std::shared_ptr<void> release_keyed_state();

  // --- lifecycle, any thread ---
  void start();
  /// Asks the task to stop; returns at once. The task reports kCanceled unless it already terminated.
  void cancel();
  /// Waits for the thread to end.
  void join();
  TaskState state() const { return state_.load(); }
  const Options& options() const { return options_; }
  /// I/O and time metrics, readable from any thread (see TaskIoMetrics).
  const TaskIoMetrics& io_metrics() const { return io_metrics_; }
  /// "Map -> Filter (2/4)" (1-based, as Flink prints subtasks).
  std::string display_name() const;

  // --- checkpoints, any thread (each runs as a mail on the task thread) ---
  /// Takes checkpoint `barrier` at a task that does not receive barriers from its inputs: a source task, or
  /// a task whose input has ended. Snapshots, forwards the barrier (unless the outputs ended) and reports
  /// the snapshot to the listener. Ignored when this id was taken already.
  void trigger_checkpoint(const CheckpointBarrier& barrier);
  /// Checkpoint `checkpoint_id` completed: every operator is told, tail first.
  void notify_checkpoint_complete(int64_t checkpoint_id);
  /// Checkpoint `checkpoint_id` was aborted: an alignment in progress is dropped; operators are told.
  void notify_checkpoint_aborted(int64_t checkpoint_id);

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
  void restore_state();
  void perform_checkpoint(const CheckpointBarrier& barrier, int64_t alignment_ns);
  void wait_for_final_checkpoint();
  void run_source_loop(SourceOperatorBase& source);
  void run_input_loop();
  void process_mails();
  void fire_due_timers();
  StreamInputProcessor::Status process_input();
  void maybe_flush();
  void flush_outputs();
  void idle_wait();
  /// Copies the task-thread counters (bytes, watermarks) into io_metrics_.
  void publish_metrics();
  void check_cancelled() const {
    if (is_cancelled()) throw TaskCancelledException{};
  }
  /// At most once per millisecond of the steady clock (`now_ns`): a task whose lease lapsed cancels itself.
  void check_lease(int64_t now_ns) {
    if (options_.lease != nullptr && now_ns - last_lease_check_ns_ >= 1'000'000) stop_if_stale(now_ns);
  }
  void stop_if_stale(int64_t now_ns);
  Error describe_failure(const std::string& operator_name, const std::string& message,
                         ErrorCode code = ErrorCode::kRuntime) const;

  Options options_;
  std::shared_ptr<const TaskRestore> restore_;  // task thread: options_.restore or what restore_loader read
  int64_t state_read_ns_ = 0;                   // task thread: how long restore_loader took
  TaskListener& listener_;
  std::vector<std::unique_ptr<StreamOperatorBase>> operators_;
  std::vector<std::unique_ptr<TaskRuntimeContext>> contexts_;
  std::vector<std::string> uids_;
  std::vector<std::unique_ptr<OutputBase>> outputs_;
  std::vector<std::unique_ptr<RecordWriter>> writers_;
  std::vector<std::unique_ptr<RecordInput>> record_inputs_;
  std::vector<std::unique_ptr<StreamInputProcessor>> inputs_;
  size_t next_input_ = 0;

  TaskIoMetrics io_metrics_;
  WakeupSignal wakeup_;
  std::atomic<bool> cancelled_{false};
  std::atomic<TaskState> state_{TaskState::kCreated};
  std::thread thread_;
  // Bound to thread_ when it starts: the "task thread only" members check it (debug builds).
  ThreadChecker task_thread_;

  Mailbox mailbox_;
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
  int64_t last_lease_check_ns_ = 0;

  // Checkpointing (task thread only).
  std::unique_ptr<CheckpointBarrierHandler> barrier_handler_;
  size_t input_channels_ = 0;
  int64_t last_snapshot_id_ = 0;
  bool input_finished_ = false;         // end of input reached, operators finished, end-of-partition sent
  bool stop_without_drain_ = false;     // a stop-with-savepoint was taken: end without final watermark/finish
  int64_t exit_after_checkpoint_ = -1;  // the checkpoint whose completion lets a finished task close
  bool exit_allowed_ = false;
};

}  // namespace sluice
