// The functions of two-input operators (Flink's CoProcessFunction, KeyedCoProcessFunction and
// ProcessJoinFunction): what a user writes for connect(), keyed connect and the interval join. The operators
// that run them are in operators/co_process_operator.h and operators/join_operators.h.
#pragma once

#include <string>

#include "sluice/api/functions.h"
#include "sluice/api/keyed_process_function.h"

namespace sluice {

template <class K>
class KeyedStateStore;  // state/keyed_state_store.h, included by the operator that sets it

/// Processes the elements of two inputs; both calls run on the same task thread, never concurrently.
template <class In1, class In2, class Out>
class CoProcessFunction : public RichFunction {
 public:
  using OutputType = Out;
  /// Same context as ProcessFunction's: timestamp, watermark, side outputs.
  using Context = typename ProcessFunction<In1, Out>::Context;
  virtual void process_element1(const In1& value, Context& ctx, Collector<Out>& out) = 0;
  virtual void process_element2(const In2& value, Context& ctx, Collector<Out>& out) = 0;
};

/// Processes two keyed inputs with shared keyed state and timers (both inputs use the same key type).
template <class K, class In1, class In2, class Out>
class KeyedCoProcessFunction : public RichFunction {
 public:
  using KeyType = K;
  using OutputType = Out;
  using Context = typename KeyedProcessFunction<K, In1, Out>::Context;
  using OnTimerContext = typename KeyedProcessFunction<K, In1, Out>::OnTimerContext;
  virtual void process_element1(const In1& value, Context& ctx, Collector<Out>& out) = 0;
  virtual void process_element2(const In2& value, Context& ctx, Collector<Out>& out) = 0;
  virtual void on_timer(TimestampMs /*timestamp*/, OnTimerContext& /*ctx*/, Collector<Out>& /*out*/) {}
  /// The keyed state shared by both inputs, in the job's backend (state.backend.type), as
  /// KeyedProcessFunction::keyed_state(): get_state() in open() returns the ValueState<T>& ... interfaces;
  /// `keyed_state().heap()` gives the heap's typed states for a hot path and throws kConfiguration on rocksdb.
  KeyedStateStore<K>& keyed_state() { return *keyed_state_; }
  void set_keyed_state(KeyedStateStore<K>* store) { keyed_state_ = store; }

 private:
  KeyedStateStore<K>* keyed_state_ = nullptr;
};

/// Called for each pair (left, right) with right.ts in [left.ts + lower, left.ts + upper].
template <class L, class R, class Out>
class ProcessJoinFunction : public RichFunction {
 public:
  using OutputType = Out;
  class Context {
   public:
    virtual ~Context() = default;
    virtual TimestampMs left_timestamp() const = 0;
    virtual TimestampMs right_timestamp() const = 0;
    /// max(left, right): the timestamp of emitted records.
    virtual TimestampMs timestamp() const = 0;
  };
  virtual void process_element(const L& left, const R& right, Context& ctx, Collector<Out>& out) = 0;
};
}  // namespace sluice
