// The built-in one-input operators behind DataStream's transformations (map, filter, flat_map, process) and
// KeyedStream's (reduce, process). Each holds its user function by value, so a chained call is a direct,
// inlinable call (DESIGN.md §12) and every subtask owns its own copy. An operator forwards open/close and the
// checkpoint hooks (snapshot_state, notify_checkpoint_complete/aborted) to its function when that is a
// RichFunction.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "sluice/api/operator.h"

namespace sluice {
namespace detail {

template <class F>
inline constexpr bool kIsRich = std::is_base_of_v<RichFunction, F>;

template <class F>
void open_function(F& f, RuntimeContext& ctx) {
  if constexpr (kIsRich<F>) f.open(ctx);
}
template <class F>
void close_function(F& f) {
  if constexpr (kIsRich<F>) f.close();
}

// The checkpoint hooks of a RichFunction (no-ops for lambdas and plain callables). User code may throw: the
// exception is converted into an OperatorException naming the operator, which fails the task (and, for
// snapshot_state, declines the checkpoint).
template <class F>
void snapshot_function(F& f, const std::string& operator_name, int64_t checkpoint_id) {
  if constexpr (kIsRich<F>) call_user_function(operator_name, [&] { f.snapshot_state(checkpoint_id); });
}
template <class F>
void notify_function_checkpoint_complete(F& f, const std::string& operator_name, int64_t checkpoint_id) {
  if constexpr (kIsRich<F>) call_user_function(operator_name, [&] { f.notify_checkpoint_complete(checkpoint_id); });
}
template <class F>
void notify_function_checkpoint_aborted(F& f, const std::string& operator_name, int64_t checkpoint_id) {
  if constexpr (kIsRich<F>) call_user_function(operator_name, [&] { f.notify_checkpoint_aborted(checkpoint_id); });
}

/// The result type of a map function F applied to In (a lambda, a function pointer or a MapFunction).
template <class F, class In, class = void>
struct MapResult {
  using type = std::decay_t<std::invoke_result_t<F&, const In&>>;
};
template <class F, class In>
struct MapResult<F, In, std::enable_if_t<kIsRich<F>>> {
  using type = std::decay_t<decltype(std::declval<F&>().map(std::declval<const In&>()))>;
};

template <class F, class In>
decltype(auto) call_map(F& f, In& v) {
  if constexpr (kIsRich<F>) {
    return f.map(std::as_const(v));
  } else if constexpr (std::is_invocable_v<F&, In&&>) {
    return std::invoke(f, std::move(v));
  } else {
    return std::invoke(f, v);
  }
}

template <class F, class T>
bool call_filter(F& f, const T& v) {
  if constexpr (kIsRich<F>) {
    return f.filter(v);
  } else {
    return static_cast<bool>(std::invoke(f, v));
  }
}

/// A Collector that forwards to an Output with a fixed timestamp and counts what it emits.
template <class T>
class TimestampedCollector final : public Collector<T> {
 public:
  using Collector<T>::collect;
  void reset(Output<T>* out, Counter* counter, TimestampMs ts) {
    out_ = out;
    counter_ = counter;
    ts_ = ts;
  }
  void set_timestamp(TimestampMs ts) { ts_ = ts; }
  void collect(T&& record) override {
    counter_->inc();
    out_->collect(std::move(record), ts_);
  }

 private:
  Output<T>* out_ = nullptr;
  Counter* counter_ = nullptr;
  TimestampMs ts_ = kNoTimestamp;
};

}  // namespace detail

/// Applies F to every record (Flink's StreamMap).
template <class In, class Out, class F>
class MapOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  explicit MapOperator(F fn) : fn_(std::move(fn)) {}
  void open() override { detail::open_function(fn_, *this->ctx_); }
  void close() override { detail::close_function(fn_); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element(In&& record, TimestampMs ts) override {
    Out result = call_user_function(this->name(), [&]() -> Out { return detail::call_map(fn_, record); });
    this->metrics_.records_out.inc();
    this->typed(this->main_output_)->collect(std::move(result), ts);
  }

 private:
  F fn_;
};

/// Keeps records for which F returns true (Flink's StreamFilter).
template <class T, class F>
class FilterOperator final : public OneInputOperator<T>, OutputOf<T> {
 public:
  explicit FilterOperator(F fn) : fn_(std::move(fn)) {}
  void open() override { detail::open_function(fn_, *this->ctx_); }
  void close() override { detail::close_function(fn_); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element(T&& record, TimestampMs ts) override {
    bool keep = call_user_function(this->name(), [&] { return detail::call_filter(fn_, record); });
    if (keep) {
      this->metrics_.records_out.inc();
      this->typed(this->main_output_)->collect(std::move(record), ts);
    }
  }

 private:
  F fn_;
};

/// Calls F with each record and a collector (Flink's StreamFlatMap).
template <class In, class Out, class F>
class FlatMapOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  explicit FlatMapOperator(F fn) : fn_(std::move(fn)) {}
  void open() override {
    detail::open_function(fn_, *this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  void close() override { detail::close_function(fn_); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element(In&& record, TimestampMs ts) override {
    collector_.set_timestamp(ts);
    call_user_function(this->name(), [&] {
      if constexpr (detail::kIsRich<F>) {
        fn_.flat_map(std::as_const(record), collector_);
      } else {
        std::invoke(fn_, std::as_const(record), static_cast<Collector<Out>&>(collector_));
      }
    });
  }

 private:
  F fn_;
  detail::TimestampedCollector<Out> collector_;
};

/// Runs a ProcessFunction (Flink's ProcessOperator). P derives from ProcessFunction<In, Out>.
template <class In, class Out, class P>
class ProcessOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  explicit ProcessOperator(P fn) : fn_(std::move(fn)), context_(this) {}
  void open() override {
    fn_.open(*this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  void close() override { fn_.close(); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element(In&& record, TimestampMs ts) override {
    collector_.set_timestamp(ts);
    context_.ts = ts;
    call_user_function(this->name(), [&] { fn_.process_element(std::as_const(record), context_, collector_); });
  }

 private:
  struct Ctx final : ProcessFunction<In, Out>::Context {
    explicit Ctx(ProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->current_watermark(); }
    void* side_output(const std::string& tag_id) override { return op->side_output(tag_id); }
    ProcessOperator* op;
    TimestampMs ts = kNoTimestamp;
  };
  P fn_;
  Ctx context_;
  detail::TimestampedCollector<Out> collector_;
};

}  // namespace sluice
