// Joins: keyed connect with a KeyedCoProcessFunction, the interval join and the window join (Flink's
// KeyedCoProcessOperator, IntervalJoinOperator and JoinedStreams).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/api/connected_streams.h"
#include "sluice/api/windowed_stream.h"
#include "sluice/state/keyed_state_snapshot.h"

namespace sluice {

// ------------------------------------------------------------------------------------------------------
// Keyed connect
// ------------------------------------------------------------------------------------------------------

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
  HeapKeyedStateBackend<K>& keyed_state() { return *keyed_state_; }
  void set_keyed_state(HeapKeyedStateBackend<K>* backend) { keyed_state_ = backend; }

 private:
  HeapKeyedStateBackend<K>* keyed_state_ = nullptr;
};

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
    keyed_.timers().advance_watermark(
        wm, [this](const K&, const VoidNamespace&, TimestampMs t) { on_timer(t, TimeDomain::kEventTime); });
    StreamOperatorBase::process_watermark(wm);
    schedule();
  }

 protected:
  virtual void on_timer(TimestampMs t, TimeDomain domain) = 0;
  void set_key1(const In1& r) { keyed_.backend().set_current_key(std::invoke(sel1_, r)); }
  void set_key2(const In2& r) { keyed_.backend().set_current_key(std::invoke(sel2_, r)); }
  void schedule() {
    keyed_.schedule_processing_time(
        [this](const K&, const VoidNamespace&, TimestampMs t) { on_timer(t, TimeDomain::kProcessingTime); });
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
    fn_.set_keyed_state(&this->keyed_.backend());
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
    const K& current_key() const override { return op->keyed_.backend().current_key(); }
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

/// Two streams connected and keyed by compatible keys.
template <class K, class T1, class T2>
class KeyedConnectedStreams {
 public:
  using Sel1 = std::function<K(const T1&)>;
  using Sel2 = std::function<K(const T2&)>;
  KeyedConnectedStreams(ConnectedStreams<T1, T2> streams, Sel1 s1, Sel2 s2)
      : streams_(std::move(streams)), sel1_(std::move(s1)), sel2_(std::move(s2)) {}

  template <class P>
  DataStream<typename P::OutputType> process(P fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<KeyedCoProcessFunction<K, T1, T2, Out>, P>,
                  "process() takes a KeyedCoProcessFunction<K, T1, T2, Out>");
    auto s1 = sel1_;
    auto s2 = sel2_;
    return streams_.template add_two_input_node<Out>("Keyed Co-Process", true, [s1, s2, fn]() {
      return std::make_unique<KeyedCoProcessOperator<K, T1, T2, Out, Sel1, Sel2, P>>(s1, s2, fn);
    });
  }
  ConnectedStreams<T1, T2>& streams() { return streams_; }
  const Sel1& selector1() const { return sel1_; }
  const Sel2& selector2() const { return sel2_; }

 private:
  ConnectedStreams<T1, T2> streams_;
  Sel1 sel1_;
  Sel2 sel2_;
};

/// Keys both inputs: records with equal keys meet in the same subtask.
template <class T1, class T2, class S1, class S2>
auto key_by(const ConnectedStreams<T1, T2>& connected, S1 sel1, S2 sel2) {
  using K = std::decay_t<std::invoke_result_t<S1&, const T1&>>;
  static_assert(std::is_same_v<K, std::decay_t<std::invoke_result_t<S2&, const T2&>>>,
                "both key selectors must return the same key type");
  auto first = connected.first().key_by(sel1);
  auto second = connected.second().key_by(sel2);
  return KeyedConnectedStreams<K, T1, T2>(ConnectedStreams<T1, T2>(first, second), std::function<K(const T1&)>(sel1),
                                          std::function<K(const T2&)>(sel2));
}

// ------------------------------------------------------------------------------------------------------
// Interval join
// ------------------------------------------------------------------------------------------------------

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
    left_ = &this->keyed_.backend().get_state(MapStateDescriptor<TimestampMs, std::vector<L>>{"left-buffer"});
    right_ = &this->keyed_.backend().get_state(MapStateDescriptor<TimestampMs, std::vector<R>>{"right-buffer"});
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
    add(*left_, ts, l);
    // right.ts in [ts + lower, ts + upper]
    right_->for_each([&](const TimestampMs& rts, const std::vector<R>& rs) {
      if (rts < ts + lower_ || rts > ts + upper_) return;
      for (const R& r : rs)
        emit(l, ts, r, rts);
    });
    // Left elements can match right elements up to ts + upper; clean up after that.
    this->keyed_.timers().register_event_time_timer(VoidNamespace{}, cleanup_left(ts));
  }
  void process_element2(R&& r, TimestampMs ts) override {
    this->set_key2(r);
    if (late(ts)) return;
    add(*right_, ts, r);
    // left.ts in [ts - upper, ts - lower]
    left_->for_each([&](const TimestampMs& lts, const std::vector<L>& ls) {
      if (lts < ts - upper_ || lts > ts - lower_) return;
      for (const L& l : ls)
        emit(l, lts, r, ts);
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
    left_->for_each([&](const TimestampMs& ts, const std::vector<L>&) {
      if (cleanup_left(ts) <= t) drop.push_back(ts);
    });
    for (TimestampMs ts : drop)
      left_->remove(ts);
    drop.clear();
    right_->for_each([&](const TimestampMs& ts, const std::vector<R>&) {
      if (cleanup_right(ts) <= t) drop.push_back(ts);
    });
    for (TimestampMs ts : drop)
      right_->remove(ts);
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
  HeapMapState<K, VoidNamespace, TimestampMs, std::vector<L>>* left_ = nullptr;
  HeapMapState<K, VoidNamespace, TimestampMs, std::vector<R>>* right_ = nullptr;
  uint64_t late_dropped_ = 0;
};

/// `left.interval_join(right).between(lower, upper).process(fn)` on two keyed streams.
template <class K, class L, class R>
class IntervalJoin {
 public:
  IntervalJoin(KeyedStream<K, L> left, KeyedStream<K, R> right) : left_(std::move(left)), right_(std::move(right)) {}
  /// Joins right elements with timestamps in [left.ts + lower, left.ts + upper] (inclusive bounds).
  IntervalJoin& between(std::chrono::milliseconds lower, std::chrono::milliseconds upper) {
    if (lower > upper) {
      throw SluiceException(Error(ErrorCode::kGraph, "interval_join().between(): the lower bound exceeds the upper"));
    }
    lower_ = lower.count();
    upper_ = upper.count();
    return *this;
  }
  template <class P>
  DataStream<typename P::OutputType> process(P fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<ProcessJoinFunction<L, R, Out>, P>,
                  "process() takes a ProcessJoinFunction<L, R, Out>");
    auto s1 = left_.selector();
    auto s2 = right_.selector();
    auto lower = lower_, upper = upper_;
    ConnectedStreams<L, R> c(left_, right_);
    return c.template add_two_input_node<Out>("Interval Join", true, [s1, s2, lower, upper, fn]() {
      return std::make_unique<IntervalJoinOperator<K, L, R, Out, P>>(s1, s2, lower, upper, fn);
    });
  }

 private:
  KeyedStream<K, L> left_;
  KeyedStream<K, R> right_;
  int64_t lower_ = 0, upper_ = 0;
};

template <class K, class L, class R>
IntervalJoin<K, L, R> interval_join(const KeyedStream<K, L>& left, const KeyedStream<K, R>& right) {
  return IntervalJoin<K, L, R>(left, right);
}

// ------------------------------------------------------------------------------------------------------
// Window join
// ------------------------------------------------------------------------------------------------------

/// `join(a, b).where(ka).equal_to(kb).window(assigner).apply(fn)`: every pair of a and b elements with equal
/// keys in the same window (Flink's JoinedStreams: a co-group over a union of both inputs, tagged).
template <class L, class R>
class JoinedStreams {
 public:
  using Tagged = std::variant<L, R>;
  JoinedStreams(DataStream<L> left, DataStream<R> right) : left_(std::move(left)), right_(std::move(right)) {}

  template <class S1>
  auto where(S1 sel1) {
    return Where<S1>(*this, std::move(sel1));
  }

  template <class S1>
  class Where {
   public:
    Where(JoinedStreams j, S1 s) : j_(std::move(j)), s1_(std::move(s)) {}
    template <class S2>
    auto equal_to(S2 s2) {
      return EqualTo<S2>(*this, std::move(s2));
    }
    template <class S2>
    class EqualTo {
     public:
      EqualTo(Where w, S2 s) : w_(std::move(w)), s2_(std::move(s)) {}
      template <class Assigner>
      auto window(std::shared_ptr<Assigner> assigner) {
        return Windowed<S2, Assigner>(*this, std::move(assigner));
      }
      template <class S2b, class Assigner>
      class Windowed;
      Where w_;
      S2 s2_;
    };
    JoinedStreams j_;
    S1 s1_;
  };

  DataStream<L> left_;
  DataStream<R> right_;
};

template <class L, class R>
template <class S1>
template <class S2>
template <class S2b, class Assigner>
class JoinedStreams<L, R>::Where<S1>::EqualTo<S2>::Windowed {
 public:
  using W = typename Assigner::WindowType;
  using K = std::decay_t<std::invoke_result_t<S1&, const L&>>;
  Windowed(EqualTo e, std::shared_ptr<Assigner> a) : e_(std::move(e)), assigner_(std::move(a)) {}

  /// Calls `fn(const L&, const R&) -> Out` for every pair of the window (emitted at window.max_timestamp()).
  template <class F>
  auto apply(F fn) {
    using Out = std::decay_t<std::invoke_result_t<F&, const L&, const R&>>;
    using Tagged = std::variant<L, R>;
    auto s1 = e_.w_.s1_;
    auto s2 = e_.s2_;
    auto left = e_.w_.j_.left_.map([](const L& l) { return Tagged(std::in_place_index<0>, l); }).name("Join: tag left");
    auto right =
        e_.w_.j_.right_.map([](const R& r) { return Tagged(std::in_place_index<1>, r); }).name("Join: tag right");
    return left.union_with(right)
        .key_by([s1, s2](const Tagged& t) -> K { return t.index() == 0 ? s1(std::get<0>(t)) : s2(std::get<1>(t)); })
        .window(assigner_)
        .process(CrossProduct<Out, F>(fn));
  }

 private:
  template <class Out, class F>
  class CrossProduct final : public ProcessWindowFunction<std::variant<L, R>, Out, K, W> {
   public:
    explicit CrossProduct(F fn) : fn_(std::move(fn)) {}
    void process(const K&, typename ProcessWindowFunction<std::variant<L, R>, Out, K, W>::Context&,
                 const std::vector<std::variant<L, R>>& elements, Collector<Out>& out) override {
      std::vector<const L*> ls;
      std::vector<const R*> rs;
      for (const auto& e : elements) {
        if (e.index() == 0) {
          ls.push_back(&std::get<0>(e));
        } else {
          rs.push_back(&std::get<1>(e));
        }
      }
      for (const L* l : ls) {
        for (const R* r : rs)
          out.collect(fn_(*l, *r));
      }
    }

   private:
    F fn_;
  };
  EqualTo e_;
  std::shared_ptr<Assigner> assigner_;
};

template <class L, class R>
JoinedStreams<L, R> join(const DataStream<L>& left, const DataStream<R>& right) {
  return JoinedStreams<L, R>(left, right);
}

}  // namespace sluice
