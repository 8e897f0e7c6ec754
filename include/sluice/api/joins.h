// Joins: keyed connect with a KeyedCoProcessFunction, the interval join and the window join (Flink's
// KeyedConnectedStreams, IntervalJoin and JoinedStreams). The operators they create are in
// operators/join_operators.h; the functions users write in api/co_process_functions.h.
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
#include "sluice/operators/join_operators.h"

namespace sluice {

// ------------------------------------------------------------------------------------------------------
// Keyed connect
// ------------------------------------------------------------------------------------------------------

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
