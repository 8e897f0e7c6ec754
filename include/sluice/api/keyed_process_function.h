// KeyedProcessFunction: the lowest-level keyed function (Flink's KeyedProcessFunction): per-key state from
// the keyed state backend, event-time and processing-time timers per key, the current key, side outputs.
#pragma once

#include "sluice/api/functions.h"

namespace sluice {

template <class K>
class KeyedStateStore;  // state/keyed_state_store.h, included by the keyed operators that set it

/// Registers and deletes timers for the current key (Flink's TimerService). Timers are deduplicated per key
/// and timestamp and fire once, on the task thread, in timestamp order.
class TimerService {
 public:
  virtual ~TimerService() = default;
  virtual TimestampMs current_processing_time() const = 0;
  virtual TimestampMs current_watermark() const = 0;
  virtual void register_event_time_timer(TimestampMs time) = 0;
  virtual void register_processing_time_timer(TimestampMs time) = 0;
  virtual void delete_event_time_timer(TimestampMs time) = 0;
  virtual void delete_processing_time_timer(TimestampMs time) = 0;
};

/// Which clock fired a timer.
enum class TimeDomain { kEventTime, kProcessingTime };

template <class K, class In, class Out>
class KeyedProcessFunction : public RichFunction {
 public:
  using KeyType = K;
  using InputType = In;
  using OutputType = Out;

  class Context : public ProcessFunction<In, Out>::Context {
   public:
    /// The key of the record (or timer) being processed.
    virtual const K& current_key() const = 0;
    virtual TimerService& timer_service() = 0;
  };
  class OnTimerContext : public Context {
   public:
    virtual TimeDomain time_domain() const = 0;
  };

  virtual void process_element(const In& value, Context& ctx, Collector<Out>& out) = 0;
  /// A timer registered for the current key fired at `timestamp`.
  virtual void on_timer(TimestampMs /*timestamp*/, OnTimerContext& /*ctx*/, Collector<Out>& /*out*/) {}

  /// The subtask's keyed state (set before open()) in the backend the job's configuration selects
  /// (state.backend.type): register states in open(), e.g.
  /// `count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0});` (a ValueState<int64_t>*).
  /// Each state reads and writes the value of the current key. `keyed_state().heap()` gives the heap
  /// backend's typed (final, inlinable) states for a hot path; it throws kConfiguration on rocksdb.
  KeyedStateStore<K>& keyed_state() { return *keyed_state_; }
  /// Used by the operator.
  void set_keyed_state(KeyedStateStore<K>* store) { keyed_state_ = store; }

 private:
  KeyedStateStore<K>* keyed_state_ = nullptr;
};

}  // namespace sluice
