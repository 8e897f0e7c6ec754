// Stream operators: the runtime form of a transformation (Flink's StreamOperator / OneInputStreamOperator),
// and the typed Output through which an operator emits records to the next operator of its chain or to the
// network.
//
// Threading: an operator and its outputs belong to one task thread (the mailbox thread); every method here
// runs on it. Counters in OperatorMetrics are written by that thread and may be read by any thread.
//
// Lifecycle: created -> setup() -> open() -> process_* ... -> end_input() -> finish() -> close().
// Records pass by rvalue reference: a receiver may move from the record (object reuse, DESIGN.md §12).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/api/functions.h"
#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/error.h"

namespace sluice {

/// A single-writer counter: increments are plain loads and stores (no lock prefix) because only the task
/// thread writes; other threads read a possibly slightly stale value.
class Counter {
 public:
  void inc(uint64_t n = 1) noexcept { v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

/// Per-operator, per-subtask counters.
struct OperatorMetrics {
  Counter records_in;
  Counter records_out;
};

/// The untyped half of an output: watermarks and other stream elements that carry no record.
class OutputBase {
 public:
  virtual ~OutputBase() = default;
  /// Forwards a watermark (ms since epoch) downstream.
  virtual void emit_watermark(TimestampMs watermark) = 0;
  /// Forwards a watermark status: idle outputs do not hold back downstream watermarks (Flink's
  /// WatermarkStatus).
  virtual void emit_watermark_status(bool idle) = 0;
};

/// Where an operator sends its records. `timestamp` is the record's event time or kNoTimestamp.
template <class T>
class Output : public OutputBase {
 public:
  virtual void collect(T&& record, TimestampMs timestamp) = 0;
};

/// Thrown by an operator when user code fails; carries the operator's name so the task can say which
/// operator failed. The task adds subtask index and attempt.
class OperatorException : public std::runtime_error {
 public:
  OperatorException(std::string operator_name, const std::string& message, ErrorCode code = ErrorCode::kRuntime)
      : std::runtime_error(message), operator_name_(std::move(operator_name)), code_(code) {}
  const std::string& operator_name() const { return operator_name_; }
  /// kRuntime for exceptions from user code; the original code for a SluiceException (e.g. kConnector).
  ErrorCode code() const { return code_; }

 private:
  std::string operator_name_;
  ErrorCode code_;
};

/// Runs `fn` and converts any exception other than OperatorException into an OperatorException naming
/// `operator_name`. Exceptions from downstream operators (already OperatorException) and task cancellation
/// pass through unchanged.
template <class F>
decltype(auto) call_user_function(const std::string& operator_name, F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const OperatorException&) {
    throw;
  } catch (const TaskCancelledException&) {
    throw;
  } catch (const SluiceException& e) {
    throw OperatorException(operator_name, e.error().message(), e.error().code());
  } catch (const std::exception& e) {
    throw OperatorException(operator_name, e.what());
  } catch (...) {
    throw OperatorException(operator_name, "unknown exception");
  }
}

/// Services a task offers its operators. Thread-safety: post_mail() and wakeup() may be called from any
/// thread; the rest only on the task thread.
class TaskServices {
 public:
  virtual ~TaskServices() = default;
  /// Runs `mail` on the task thread, between records (Flink's mailbox).
  virtual void post_mail(std::function<void()> mail) = 0;
  /// Wakes the task if it waits for input (a source reader has data again).
  virtual void wakeup() = 0;
  /// Wakes the task no later than `time_ms` on the task's clock.
  virtual void wakeup_at(TimestampMs time_ms) = 0;
  /// Runs `callback(time)` on the task thread once the task's clock reaches `time_ms` (Flink's
  /// ProcessingTimeService). Task thread only.
  virtual void register_processing_timer(TimestampMs time_ms, std::function<void(TimestampMs)> callback) = 0;
  /// The task's processing-time clock.
  virtual const Clock& processing_clock() const = 0;
  /// True once the task was asked to stop.
  virtual bool is_cancelled() const = 0;
  /// The flag behind is_cancelled(), for checks on a hot path (a relaxed load, no virtual call).
  virtual const std::atomic<bool>& cancelled_flag() const = 0;
};

/// Base of every operator. Holds the name, the runtime context and the outputs.
class StreamOperatorBase {
 public:
  virtual ~StreamOperatorBase() = default;

  /// The typed input `index` (an InputHandle<T>*) for the runtime to feed; nullptr for sources.
  virtual void* input_handle(int /*index*/) { return nullptr; }

  /// Called once by the task before open(): gives the context and the outputs. `outputs` maps a side-output
  /// tag id ("" for the main output) to a borrowed Output<U>* (U is the tag's type) or is empty for sinks.
  void setup(RuntimeContext* ctx, TaskServices* services, std::unordered_map<std::string, OutputBase*> outputs) {
    ctx_ = ctx;
    name_ = &ctx->operator_name();  // cached: name() is read on every record by call_user_function
    services_ = services;
    outputs_ = std::move(outputs);
    auto it = outputs_.find("");
    main_output_ = it == outputs_.end() ? nullptr : it->second;
  }

  /// Opens user functions. Runs on the task thread before the first element.
  virtual void open() {}
  /// A watermark arrived; the default forwards it.
  virtual void process_watermark(TimestampMs watermark) {
    current_watermark_ = watermark;
    if (main_output_ != nullptr) main_output_->emit_watermark(watermark);
    for (auto& [tag, out] : outputs_) {
      if (!tag.empty()) out->emit_watermark(watermark);
    }
  }
  /// The input became idle (true) or active again (false); the default forwards it.
  virtual void process_watermark_status(bool idle) {
    if (main_output_ != nullptr) main_output_->emit_watermark_status(idle);
    for (auto& [tag, out] : outputs_) {
      if (!tag.empty()) out->emit_watermark_status(idle);
    }
  }
  /// All input has been consumed (bounded input ended); called after the final watermark.
  virtual void end_input() {}
  /// Emits anything buffered; called once after end_input() on a successful finish.
  virtual void finish() {}
  /// Releases resources; called on success and on failure or cancellation.
  virtual void close() {}

  // --- Checkpointing (task thread; DESIGN.md §6) ---

  /// The synchronous part of checkpoint `checkpoint_id` (Flink's snapshotState): bring the operator state
  /// (RuntimeContext::operator_state(): split positions, sink committables) up to date. Runs when the
  /// barrier has been aligned, before it is forwarded; must be quick. Throwing declines the checkpoint and
  /// fails the task.
  virtual void snapshot_state(int64_t /*checkpoint_id*/) {}
  /// Keyed operators: a consistent capture of the keyed state and timers (see KeyedStateSnapshot), taken
  /// right after snapshot_state(); nullptr for operators without keyed state.
  virtual std::unique_ptr<KeyedStateSnapshot> snapshot_keyed_state() { return nullptr; }
  /// Keyed operators: hands over the keyed state backend and timers of a subtask that has stopped (its task
  /// thread was joined), so that the runtime frees them on another thread: a large heap state takes over a
  /// second per GiB to free, and a restart must not wait for it. The operator is not used afterwards, except
  /// to be destroyed. nullptr for operators without keyed state.
  virtual std::shared_ptr<void> release_keyed_state() { return nullptr; }
  /// Checkpoint `checkpoint_id` completed (every task acknowledged and its metadata is durable): two-phase
  /// commit sinks commit, sources report positions. A later id implies the earlier ones.
  virtual void notify_checkpoint_complete(int64_t /*checkpoint_id*/) {}
  /// Checkpoint `checkpoint_id` was aborted (timeout, a declined snapshot, a failure).
  virtual void notify_checkpoint_aborted(int64_t /*checkpoint_id*/) {}
  /// Set by the runtime before open() when the subtask restores keyed state; keyed operators read it in open()
  /// after creating their backend. Operator state is restored into the RuntimeContext's store before open().
  void set_restored_keyed_state(std::shared_ptr<const KeyedStateRestore> state) { restored_keyed_ = std::move(state); }
  /// The keyed state to restore in open(), or nullptr on a fresh start.
  const KeyedStateRestore* restored_keyed_state() const { return restored_keyed_.get(); }

  const std::string& name() const { return *name_; }
  RuntimeContext& runtime_context() { return *ctx_; }
  OperatorMetrics& metrics() { return metrics_; }
  TimestampMs current_watermark() const { return current_watermark_; }
  /// The output for side-output `tag_id`, or nullptr when nothing reads it.
  OutputBase* side_output(const std::string& tag_id) {
    auto it = outputs_.find(tag_id);
    return it == outputs_.end() ? nullptr : it->second;
  }

 protected:
  RuntimeContext* ctx_ = nullptr;
  const std::string* name_ = nullptr;
  TaskServices* services_ = nullptr;
  OutputBase* main_output_ = nullptr;
  std::unordered_map<std::string, OutputBase*> outputs_;
  OperatorMetrics metrics_;
  TimestampMs current_watermark_ = std::numeric_limits<int64_t>::min();
  std::shared_ptr<const KeyedStateRestore> restored_keyed_;
};

/// One typed input of an operator: where the runtime (or the previous operator of a chain) delivers records
/// and watermarks of type T. A one-input operator is its own input; a two-input operator has two.
template <class T>
class InputHandle {
 public:
  virtual ~InputHandle() = default;
  virtual void process_element(T&& record, TimestampMs timestamp) = 0;
  virtual void process_input_watermark(TimestampMs watermark) = 0;
  virtual void process_input_watermark_status(bool idle) = 0;
  virtual OperatorMetrics& input_metrics() = 0;
};

/// An operator with one typed input.
template <class In>
class OneInputOperator : public StreamOperatorBase, public InputHandle<In> {
 public:
  /// Processes one record; may move from `record`.
  void process_element(In&& record, TimestampMs timestamp) override = 0;
  void process_input_watermark(TimestampMs watermark) final { this->process_watermark(watermark); }
  void process_input_watermark_status(bool idle) final { this->process_watermark_status(idle); }
  OperatorMetrics& input_metrics() final { return this->metrics_; }
  void* input_handle(int index) override { return index == 0 ? static_cast<InputHandle<In>*>(this) : nullptr; }
};

/// An operator with two typed inputs (Flink's TwoInputStreamOperator), for connect() and joins. Its
/// watermark is the minimum of its two inputs' watermarks.
template <class In1, class In2>
class TwoInputOperator : public StreamOperatorBase {
 public:
  virtual void process_element1(In1&& record, TimestampMs timestamp) = 0;
  virtual void process_element2(In2&& record, TimestampMs timestamp) = 0;
  InputHandle<In1>* input1() { return &input1_; }
  InputHandle<In2>* input2() { return &input2_; }
  void* input_handle(int index) override {
    if (index == 0) return static_cast<InputHandle<In1>*>(&input1_);
    if (index == 1) return static_cast<InputHandle<In2>*>(&input2_);
    return nullptr;
  }

 private:
  template <class T, int kIndex>
  class Handle final : public InputHandle<T> {
   public:
    explicit Handle(TwoInputOperator* op) : op_(op) {}
    void process_element(T&& r, TimestampMs ts) override {
      if constexpr (kIndex == 0) {
        op_->process_element1(std::move(r), ts);
      } else {
        op_->process_element2(std::move(r), ts);
      }
    }
    void process_input_watermark(TimestampMs wm) override { op_->on_input_watermark(kIndex, wm); }
    void process_input_watermark_status(bool idle) override { op_->on_input_status(kIndex, idle); }
    OperatorMetrics& input_metrics() override { return op_->metrics(); }

   private:
    TwoInputOperator* op_;
  };
  void on_input_watermark(int index, TimestampMs wm) {
    input_watermarks_[index] = wm;
    advance_combined_watermark();
  }
  // An idle input does not hold back the combined watermark; the operator is idle when both inputs are.
  void on_input_status(int index, bool idle) {
    bool was_idle = input_idle_[0] && input_idle_[1];
    input_idle_[index] = idle;
    bool now_idle = input_idle_[0] && input_idle_[1];
    if (!now_idle) advance_combined_watermark();
    if (now_idle != was_idle) process_watermark_status(now_idle);
  }
  void advance_combined_watermark() {
    TimestampMs combined = std::numeric_limits<int64_t>::max();
    bool any = false;
    for (int i = 0; i < 2; ++i) {
      if (!input_idle_[i]) {
        combined = std::min(combined, input_watermarks_[i]);
        any = true;
      }
    }
    if (any && combined > current_watermark_) process_watermark(combined);
  }
  Handle<In1, 0> input1_{this};
  Handle<In2, 1> input2_{this};
  TimestampMs input_watermarks_[2] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min()};
  bool input_idle_[2] = {false, false};
};

/// An operator whose main output carries records of type Out.
template <class Out>
class OutputOf {
 protected:
  static Output<Out>* typed(OutputBase* base) { return static_cast<Output<Out>*>(base); }
};

template <class In, class Out>
template <class U>
void ProcessFunction<In, Out>::Context::output(const OutputTag<U>& tag, U value) {
  void* out = side_output(tag.id());
  if (out != nullptr) static_cast<Output<U>*>(static_cast<OutputBase*>(out))->collect(std::move(value), timestamp());
}

}  // namespace sluice
