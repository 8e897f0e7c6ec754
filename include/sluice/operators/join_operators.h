// Keyed two-input operators: KeyedCoProcessOperator (keyed connect with a KeyedCoProcessFunction) and
// IntervalJoinOperator (Flink's), over a shared base holding the keyed state backend, timers and current key.
// Both run on either backend (state.backend.type): KeyedCoProcessFunction gets the KeyedStateStore, the interval
// join's buffers are typed heap states or RocksDB states (detail::EitherState).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/co_process_functions.h"
#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/operators/keyed_operators.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_state_store.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"

namespace sluice {

/// The base of keyed two-input operators: a keyed state backend, a timer service and the current key.
template <class K, class In1, class In2, class Out, class Sel1, class Sel2>
class KeyedTwoInputOperatorBase : public TwoInputOperator<In1, In2>, protected OutputOf<Out> {
 public:
  KeyedTwoInputOperatorBase(Sel1 s1, Sel2 s2) : sel1_(std::move(s1)), sel2_(std::move(s2)) {}
  /// Creates (and, on a restore, restores) the keyed state and timers; derived operators open their function
  /// after this and call schedule() last, so restored processing-time timers are armed again.
  void open() override {
    keyed_.open(*this->ctx_, this->services_, this->restored_keyed_state());
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  std::unique_ptr<KeyedStateSnapshot> snapshot_keyed_state() override { return keyed_.snapshot(); }
  std::shared_ptr<void> release_keyed_state() override { return keyed_.release(); }
  void process_watermark(TimestampMs wm) override {
    keyed_.timers().advance_watermark(wm, [this](const K& key, const VoidNamespace&, TimestampMs t) {
      keyed_.follow_timer_key(key);
      on_timer(t, TimeDomain::kEventTime);
    });
    StreamOperatorBase::process_watermark(wm);
    schedule();
  }

 protected:
  virtual void on_timer(TimestampMs t, TimeDomain domain) = 0;
  void set_key1(const In1& r) { keyed_.store().set_current_key(std::invoke(sel1_, r)); }
  void set_key2(const In2& r) { keyed_.store().set_current_key(std::invoke(sel2_, r)); }
  void schedule() {
    keyed_.schedule_processing_time([this](const K& key, const VoidNamespace&, TimestampMs t) {
      keyed_.follow_timer_key(key);
      on_timer(t, TimeDomain::kProcessingTime);
    });
  }
  Sel1 sel1_;
  Sel2 sel2_;
  KeyedContextHolder<K, VoidNamespace> keyed_;
  detail::TimestampedCollector<Out> collector_;
};

template <class K, class In1, class In2, class Out, class Sel1, class Sel2, class P>
class KeyedCoProcessOperator final : public KeyedTwoInputOperatorBase<K, In1, In2, Out, Sel1, Sel2> {
  using Base = KeyedTwoInputOperatorBase<K, In1, In2, Out, Sel1, Sel2>;

 public:
  KeyedCoProcessOperator(Sel1 s1, Sel2 s2, P fn) : Base(std::move(s1), std::move(s2)), fn_(std::move(fn)), ctx_(this) {}
  void open() override {
    Base::open();
    fn_.set_keyed_state(&this->keyed_.store());
    fn_.open(*this->StreamOperatorBase::ctx_);
    this->schedule();  // restored processing-time timers
  }
  void close() override { fn_.close(); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element1(In1&& r, TimestampMs ts) override {
    this->set_key1(r);
    prepare(ts, TimeDomain::kEventTime);
    call_user_function(this->name(), [&] { fn_.process_element1(std::as_const(r), ctx_, this->collector_); });
    this->schedule();
  }
  void process_element2(In2&& r, TimestampMs ts) override {
    this->set_key2(r);
    prepare(ts, TimeDomain::kEventTime);
    call_user_function(this->name(), [&] { fn_.process_element2(std::as_const(r), ctx_, this->collector_); });
    this->schedule();
  }

 private:
  void prepare(TimestampMs ts, TimeDomain d) {
    ctx_.ts = ts;
    ctx_.domain = d;
    this->collector_.set_timestamp(ts);
  }
  void on_timer(TimestampMs t, TimeDomain d) override {
    prepare(d == TimeDomain::kEventTime ? t : kNoTimestamp, d);
    ctx_.ts = t;
    call_user_function(this->name(), [&] { fn_.on_timer(t, ctx_, this->collector_); });
  }
  struct Ctx final : KeyedCoProcessFunction<K, In1, In2, Out>::OnTimerContext {
    explicit Ctx(KeyedCoProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->keyed_.current_watermark(); }
    const K& current_key() const override { return op->keyed_.current_key(); }
    TimerService& timer_service() override { return op->keyed_; }
    TimeDomain time_domain() const override { return domain; }
    void* side_output(const std::string& tag_id) override { return op->side_output(tag_id); }
    KeyedCoProcessOperator* op;
    TimestampMs ts = kNoTimestamp;
    TimeDomain domain = TimeDomain::kEventTime;
  };
  P fn_;
  Ctx ctx_;
};

/// Flink's IntervalJoinOperator: buffers both sides per key in MapState<timestamp, elements>, joins each new
/// element with the other side's buffered elements in its interval, and drops buffered elements once the
/// watermark passes the last time they can still join. Elements later than the watermark are dropped (and
/// counted), as in Flink.
template <class K, class L, class R, class Out, class P>
class IntervalJoinOperator final
    : public KeyedTwoInputOperatorBase<K, L, R, Out, std::function<K(const L&)>, std::function<K(const R&)>> {
  using Base = KeyedTwoInputOperatorBase<K, L, R, Out, std::function<K(const L&)>, std::function<K(const R&)>>;

 public:
  IntervalJoinOperator(std::function<K(const L&)> s1, std::function<K(const R&)> s2, int64_t lower, int64_t upper, P fn)
      : Base(std::move(s1), std::move(s2)), lower_(lower), upper_(upper), fn_(std::move(fn)) {}
  void open() override {
    Base::open();
    left_.template bind<VoidNamespace>(this->keyed_.store(),
                                       MapStateDescriptor<TimestampMs, std::vector<L>>{"left-buffer"});
    right_.template bind<VoidNamespace>(this->keyed_.store(),
                                        MapStateDescriptor<TimestampMs, std::vector<R>>{"right-buffer"});
    fn_.open(*this->StreamOperatorBase::ctx_);
  }
  void close() override { fn_.close(); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element1(L&& l, TimestampMs ts) override {
    this->set_key1(l);
    if (late(ts)) return;
    left_.visit([&](auto& st) { add(st, ts, l); });
    // right.ts in [ts + lower, ts + upper]
    right_.visit([&](auto& st) {
      st.for_each([&](const TimestampMs& rts, const std::vector<R>& rs) {
        if (rts < ts + lower_ || rts > ts + upper_) return;
        for (const R& r : rs)
          emit(l, ts, r, rts);
      });
    });
    // Left elements can match right elements up to ts + upper; clean up after that.
    this->keyed_.timers().register_event_time_timer(VoidNamespace{}, cleanup_left(ts));
  }
  void process_element2(R&& r, TimestampMs ts) override {
    this->set_key2(r);
    if (late(ts)) return;
    right_.visit([&](auto& st) { add(st, ts, r); });
    // left.ts in [ts - upper, ts - lower]
    left_.visit([&](auto& st) {
      st.for_each([&](const TimestampMs& lts, const std::vector<L>& ls) {
        if (lts < ts - upper_ || lts > ts - lower_) return;
        for (const L& l : ls)
          emit(l, lts, r, ts);
      });
    });
    this->keyed_.timers().register_event_time_timer(VoidNamespace{}, cleanup_right(ts));
  }
  /// Elements dropped because they arrived behind the watermark.
  uint64_t late_elements_dropped() const { return late_dropped_; }

 private:
  TimestampMs cleanup_left(TimestampMs ts) const { return upper_ <= 0 ? ts : ts + upper_; }
  TimestampMs cleanup_right(TimestampMs ts) const { return lower_ <= 0 ? ts - lower_ : ts; }
  bool late(TimestampMs ts) {
    if (ts == kNoTimestamp) {
      throw OperatorException(this->name(),
                              "interval join needs event timestamps: assign them with a WatermarkStrategy");
    }
    if (ts < this->keyed_.timers().current_watermark()) {
      ++late_dropped_;
      return true;
    }
    return false;
  }
  template <class State, class V>
  static void add(State& st, TimestampMs ts, const V& v) {
    std::vector<V> list;
    if (const std::vector<V>* existing = st.find(ts)) list = *existing;
    list.push_back(v);
    st.put(ts, std::move(list));
  }
  void emit(const L& l, TimestampMs lts, const R& r, TimestampMs rts) {
    ctx_.l = lts;
    ctx_.r = rts;
    this->collector_.set_timestamp(std::max(lts, rts));
    call_user_function(this->name(), [&] { fn_.process_element(l, r, ctx_, this->collector_); });
  }
  void on_timer(TimestampMs t, TimeDomain) override {
    // Drop buffered elements that can no longer join (their cleanup time passed).
    std::vector<TimestampMs> drop;
    left_.visit([&](auto& st) {
      st.for_each([&](const TimestampMs& ts, const std::vector<L>&) {
        if (cleanup_left(ts) <= t) drop.push_back(ts);
      });
      for (TimestampMs ts : drop)
        st.remove(ts);
    });
    drop.clear();
    right_.visit([&](auto& st) {
      st.for_each([&](const TimestampMs& ts, const std::vector<R>&) {
        if (cleanup_right(ts) <= t) drop.push_back(ts);
      });
      for (TimestampMs ts : drop)
        st.remove(ts);
    });
  }
  struct Ctx final : ProcessJoinFunction<L, R, Out>::Context {
    TimestampMs left_timestamp() const override { return l; }
    TimestampMs right_timestamp() const override { return r; }
    TimestampMs timestamp() const override { return std::max(l, r); }
    TimestampMs l = 0, r = 0;
  };
  int64_t lower_, upper_;
  P fn_;
  Ctx ctx_;
  detail::EitherState<HeapMapState<K, VoidNamespace, TimestampMs, std::vector<L>>,
                      RocksDBMapState<K, VoidNamespace, TimestampMs, std::vector<L>>>
      left_;
  detail::EitherState<HeapMapState<K, VoidNamespace, TimestampMs, std::vector<R>>,
                      RocksDBMapState<K, VoidNamespace, TimestampMs, std::vector<R>>>
      right_;
  uint64_t late_dropped_ = 0;
};
}  // namespace sluice
