// CoProcessOperator: runs a CoProcessFunction over the two inputs of connect() (Flink's CoProcessOperator).
// The operator's watermark is the minimum of both inputs'.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "sluice/api/co_process_functions.h"
#include "sluice/operators/operators.h"

namespace sluice {

/// Runs a CoProcessFunction (Flink's CoProcessOperator).
template <class In1, class In2, class Out, class P>
class CoProcessOperator final : public TwoInputOperator<In1, In2>, OutputOf<Out> {
 public:
  explicit CoProcessOperator(P fn) : fn_(std::move(fn)), context_(this) {}
  void open() override {
    fn_.open(*this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  void close() override { fn_.close(); }
  void process_element1(In1&& record, TimestampMs ts) override {
    prepare(ts);
    call_user_function(this->name(), [&] { fn_.process_element1(std::as_const(record), context_, collector_); });
  }
  void process_element2(In2&& record, TimestampMs ts) override {
    prepare(ts);
    call_user_function(this->name(), [&] { fn_.process_element2(std::as_const(record), context_, collector_); });
  }

 private:
  void prepare(TimestampMs ts) {
    collector_.set_timestamp(ts);
    context_.ts = ts;
  }
  struct Ctx final : ProcessFunction<In1, Out>::Context {
    explicit Ctx(CoProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->current_watermark(); }
    void* side_output(const std::string& tag_id) override { return op->side_output(tag_id); }
    CoProcessOperator* op;
    TimestampMs ts = kNoTimestamp;
  };
  P fn_;
  Ctx context_;
  detail::TimestampedCollector<Out> collector_;
};
}  // namespace sluice
