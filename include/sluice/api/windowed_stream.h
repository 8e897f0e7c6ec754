// KeyedStream::window(): a keyed stream cut into windows, evaluated by reduce, aggregate or process (Flink's
// WindowedStream). See window_operator.h for the semantics and windowing.h for assigners and triggers.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "sluice/api/data_stream.h"
#include "sluice/operators/window_operator.h"

namespace sluice {

namespace detail {
template <class I, class A, class O>
std::tuple<I, A, O> aggregate_types(const AggregateFunction<I, A, O>*);
template <class F>
using AggregateTypes = decltype(aggregate_types(std::declval<F*>()));
}  // namespace detail

template <class K, class T, class W>
class WindowedStream {
 public:
  WindowedStream(KeyedStream<K, T> input, std::shared_ptr<const WindowAssigner<W>> assigner)
      : input_(std::move(input)), assigner_(std::move(assigner)) {}

  /// Replaces the assigner's default trigger.
  WindowedStream& trigger(std::shared_ptr<Trigger<T, W>> t) {
    trigger_ = std::move(t);
    return *this;
  }
  /// Keeps windows (and fires them again) for late elements up to `lateness` after their end.
  WindowedStream& allowed_lateness(std::chrono::milliseconds lateness) {
    lateness_ms_ = lateness.count();
    return *this;
  }
  /// Sends elements too late for every window to the side output `tag` (instead of dropping and counting).
  WindowedStream& side_output_late_data(const OutputTag<T>& tag) {
    late_tag_ = tag.id();
    return *this;
  }

  /// Incremental reduce per window; emits the reduced value when the window fires.
  template <class R>
  DataStream<T> reduce(R reducer) {
    auto agg = std::make_shared<ReduceAggregateFunction<T, R>>(reducer);
    return build<T>("Window(Reduce)", make_aggregating(agg), pass_through<T>(), {}, {});
  }
  /// Incremental reduce, then a ProcessWindowFunction<T, Out, K, W> over the single reduced value.
  template <class R, class P>
  DataStream<typename P::OutputType> reduce(R reducer, P window_fn) {
    auto agg = std::make_shared<ReduceAggregateFunction<T, R>>(reducer);
    return with_process_function<T>("Window(Reduce, Process)", make_aggregating(agg), std::move(window_fn));
  }

  /// Incremental aggregation with an AggregateFunction<T, Acc, Out> (accumulator per window).
  template <class A>
  auto aggregate(A agg_fn) {
    using Out = std::tuple_element_t<2, detail::AggregateTypes<A>>;
    auto agg = std::make_shared<A>(std::move(agg_fn));
    return build<Out>("Window(Aggregate)", make_aggregating(agg), pass_through<Out>(), {}, {});
  }
  /// Incremental aggregation, then a ProcessWindowFunction over the aggregate's result.
  template <class A, class P>
  DataStream<typename P::OutputType> aggregate(A agg_fn, P window_fn) {
    using Mid = std::tuple_element_t<2, detail::AggregateTypes<A>>;
    auto agg = std::make_shared<A>(std::move(agg_fn));
    return with_process_function<Mid>("Window(Aggregate, Process)", make_aggregating(agg), std::move(window_fn));
  }

  /// A ProcessWindowFunction<T, Out, K, W> over all elements of each window (kept in a list per window).
  template <class P>
  DataStream<typename P::OutputType> process(P window_fn) {
    return with_process_function<T>("Window(Process)", detail::ListContents<K, W, T>{}, std::move(window_fn));
  }

 private:
  template <class A>
  auto make_aggregating(std::shared_ptr<A> agg) {
    using Types = detail::AggregateTypes<A>;
    using Acc = std::tuple_element_t<1, Types>;
    using Out = std::tuple_element_t<2, Types>;
    return detail::AggregatingContents<K, W, T, Acc, Out>(
        std::static_pointer_cast<AggregateFunction<T, Acc, Out>>(std::move(agg)));
  }

  template <class Mid>
  static auto pass_through() {
    return [](const K&, typename ProcessWindowFunction<Mid, Mid, K, W>::Context&, const std::vector<Mid>& in,
              Collector<Mid>& out) {
      for (const Mid& m : in)
        out.collect(m);
    };
  }

  template <class Mid, class Contents, class P>
  DataStream<typename P::OutputType> with_process_function(std::string name, Contents contents, P window_fn) {
    using Out = typename P::OutputType;
    static_assert(std::is_base_of_v<ProcessWindowFunction<Mid, Out, K, W>, P>,
                  "the window function must be a ProcessWindowFunction<In, Out, K, W> with In the window's element "
                  "(or aggregate result) type");
    return build_with<Out>(std::move(name), std::move(contents), std::move(window_fn));
  }

  template <class Out, class Contents, class P>
  DataStream<Out> build_with(std::string name, Contents contents, P window_fn) {
    using Op = WindowOperator<K, T, Out, W, typename KeyedStream<K, T>::Selector, Contents>;
    auto settings = base_settings();
    auto sel = input_.selector();
    return input_.template add_transform<Out>(std::move(name), true, [sel, contents, window_fn, settings]() {
      auto fn = std::make_shared<P>(window_fn);  // one function object per subtask
      auto s = settings;
      s.open_fn = [fn](RuntimeContext& ctx) { fn->open(ctx); };
      s.close_fn = [fn] { fn->close(); };
      if constexpr (std::is_base_of_v<RichFunction, P>) s.rich_function = fn;  // checkpoint hooks
      typename Op::WindowFn call = [fn](const K& key, auto& ctx, const auto& elements, Collector<Out>& out) {
        fn->process(key, ctx, elements, out);
      };
      return std::make_unique<Op>(sel, contents, std::move(call), std::move(s));
    });
  }

  template <class Out, class Contents, class Fn>
  DataStream<Out> build(std::string name, Contents contents, Fn fn, std::function<void(RuntimeContext&)> open_fn,
                        std::function<void()> close_fn) {
    using Op = WindowOperator<K, T, Out, W, typename KeyedStream<K, T>::Selector, Contents>;
    auto settings = base_settings();
    settings.open_fn = std::move(open_fn);
    settings.close_fn = std::move(close_fn);
    auto sel = input_.selector();
    return input_.template add_transform<Out>(std::move(name), true, [sel, contents, fn, settings]() {
      return std::make_unique<Op>(sel, contents, typename Op::WindowFn(fn), settings);
    });
  }

  WindowSettings<T, W> base_settings() const {
    WindowSettings<T, W> s;
    s.assigner = assigner_;
    s.trigger = trigger_ ? trigger_ : assigner_->template default_trigger<T>();
    s.allowed_lateness_ms = lateness_ms_;
    s.late_tag = late_tag_;
    return s;
  }

  KeyedStream<K, T> input_;
  std::shared_ptr<const WindowAssigner<W>> assigner_;
  std::shared_ptr<Trigger<T, W>> trigger_;
  int64_t lateness_ms_ = 0;
  std::string late_tag_;
};

template <class K, class T>
template <class Assigner>
WindowedStream<K, T, typename Assigner::WindowType> KeyedStream<K, T>::window(std::shared_ptr<Assigner> assigner) {
  using W = typename Assigner::WindowType;
  return WindowedStream<K, T, W>(*this, std::static_pointer_cast<const WindowAssigner<W>>(std::move(assigner)));
}

}  // namespace sluice
