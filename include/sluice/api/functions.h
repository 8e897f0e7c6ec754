// User function interfaces of the DataStream API: rich functions with a lifecycle, collectors, side-output
// tags and the process functions. Names follow Flink's DataStream API.
//
// Functions are values: a job copies the function object once per parallel subtask, so a function may keep
// per-subtask members without locks. All methods run on the subtask's task thread.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "sluice/core/clock.h"

namespace sluice {

class Configuration;
class OperatorStateStore;

/// "No timestamp" marker for records that carry none.
inline constexpr TimestampMs kNoTimestamp = std::numeric_limits<int64_t>::min();
/// The final watermark, emitted when a bounded input ends: all event-time timers and windows fire.
inline constexpr TimestampMs kMaxWatermark = std::numeric_limits<int64_t>::max();

/// What a function learns about the subtask it runs in (Flink's RuntimeContext).
class RuntimeContext {
 public:
  virtual ~RuntimeContext() = default;
  /// Name of the task's operator ("Map", or what `name()` set).
  virtual const std::string& operator_name() const = 0;
  /// Index of this parallel subtask, in [0, parallelism).
  virtual int subtask_index() const = 0;
  /// Parallelism of the operator.
  virtual int parallelism() const = 0;
  /// Max parallelism (number of key groups) of the operator.
  virtual int max_parallelism() const = 0;
  /// How many times this subtask has been restarted (0 on the first run).
  virtual int attempt_number() const = 0;
  /// The processing-time clock of the job (injectable in tests).
  virtual const Clock& clock() const = 0;
  /// The operator state of this subtask (list and union list state, for non-keyed functions such as sources
  /// and sinks; include sluice/state/operator_state.h). Task thread only.
  virtual OperatorStateStore& operator_state() = 0;
  /// True when the job takes periodic checkpoints (execution.checkpointing.interval > 0): two-phase-commit
  /// sinks then commit on notify_checkpoint_complete instead of at the end of input.
  virtual bool is_checkpointing_enabled() const { return false; }
  /// True when this subtask started from a checkpoint or savepoint (Flink's isRestored()): a sink must then
  /// keep what earlier runs wrote.
  virtual bool is_restored() const { return false; }
  /// The job's configuration (engine options such as state.backend.*; include sluice/core/config.h), or
  /// nullptr when the subtask runs without one (operator tests): keyed operators then use the defaults.
  virtual const Configuration* job_configuration() const { return nullptr; }
};

/// Base of functions with a lifecycle: open() before the first record, close() after the last.
///
/// Checkpoint hooks (Flink's CheckpointedFunction and CheckpointListener): snapshot_state(id) runs in the
/// synchronous part of a checkpoint, so a function keeping data outside managed state copies it into
/// RuntimeContext::operator_state() there; notify_checkpoint_complete(id) / notify_checkpoint_aborted(id)
/// follow the checkpoint's outcome. All run on the task thread.
class RichFunction {
 public:
  virtual ~RichFunction() = default;
  virtual void open(RuntimeContext& /*ctx*/) {}
  virtual void close() {}
  virtual void snapshot_state(int64_t /*checkpoint_id*/) {}
  virtual void notify_checkpoint_complete(int64_t /*checkpoint_id*/) {}
  virtual void notify_checkpoint_aborted(int64_t /*checkpoint_id*/) {}
};

/// Receives the records a function emits. Not thread-safe: use only inside the call that passed it.
template <class T>
class Collector {
 public:
  virtual ~Collector() = default;
  /// Emits a record (moved: the collector may take ownership).
  virtual void collect(T&& record) = 0;
  void collect(const T& record) {
    T copy = record;
    collect(std::move(copy));
  }
};

/// Names a side output of type T (Flink's OutputTag). Two tags are the same output when their ids match.
template <class T>
class OutputTag {
 public:
  explicit OutputTag(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

 private:
  std::string id_;
};

/// Map one record to one record.
template <class In, class Out>
class MapFunction : public RichFunction {
 public:
  virtual Out map(const In& value) = 0;
};

/// Keep records for which filter() returns true.
template <class T>
class FilterFunction : public RichFunction {
 public:
  virtual bool filter(const T& value) = 0;
};

/// Map one record to zero or more records.
template <class In, class Out>
class FlatMapFunction : public RichFunction {
 public:
  virtual void flat_map(const In& value, Collector<Out>& out) = 0;
};

/// Combine two values of the same key into one (must be associative).
template <class T>
class ReduceFunction : public RichFunction {
 public:
  virtual T reduce(const T& accumulated, const T& value) = 0;
};

/// Side outputs, available to process functions.
class SideOutputs {
 public:
  virtual ~SideOutputs() = default;
  /// Returns the type-erased output registered for `tag_id`, or nullptr when no stream reads that tag.
  virtual void* side_output(const std::string& tag_id) = 0;
};

/// A low-level function with access to the record's timestamp and side outputs (Flink's ProcessFunction).
template <class In, class Out>
class ProcessFunction : public RichFunction {
 public:
  using InputType = In;
  using OutputType = Out;
  /// The context of one process_element() call.
  class Context {
   public:
    virtual ~Context() = default;
    /// The record's event timestamp (ms since epoch), or kNoTimestamp.
    virtual TimestampMs timestamp() const = 0;
    /// The current watermark of this subtask.
    virtual TimestampMs current_watermark() const = 0;
    /// Emits `value` to the side output named by `tag` (dropped when no stream reads the tag, as in Flink).
    template <class U>
    void output(const OutputTag<U>& tag, U value);

   protected:
    virtual void* side_output(const std::string& tag_id) = 0;
  };
  virtual void process_element(const In& value, Context& ctx, Collector<Out>& out) = 0;
};

}  // namespace sluice
