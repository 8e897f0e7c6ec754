// assign_timestamps_and_watermarks(): assigns event timestamps and generates watermarks after any operator
// (Flink's TimestampsAndWatermarksOperator). Upstream watermarks are dropped, except the final one of a bounded
// input, which always passes so that every window fires at the end.
#pragma once

#include <memory>

#include "sluice/api/operator.h"
#include "sluice/api/watermark_strategy.h"

namespace sluice {

template <class T>
class TimestampsAndWatermarksOperator final : public OneInputOperator<T>, OutputOf<T>, WatermarkOutput {
 public:
  TimestampsAndWatermarksOperator(std::shared_ptr<const WatermarkStrategy<T>> strategy, int64_t interval_ms)
      : strategy_(std::move(strategy)), interval_ms_(interval_ms) {}

  void open() override {
    out_ = this->typed(this->main_output_);
    generator_ = strategy_->create_generator(this->ctx_->clock());
    if (interval_ms_ > 0) schedule();
  }
  void process_element(T&& record, TimestampMs ts) override {
    ts = call_user_function(this->name(), [&] { return strategy_->timestamp_of(record, ts); });
    generator_->on_event(record, ts, *this);
    this->metrics_.records_out.inc();
    out_->collect(std::move(record), ts);
  }
  void process_watermark(TimestampMs wm) override {
    if (wm == kMaxWatermark) StreamOperatorBase::process_watermark(wm);
  }
  void process_watermark_status(bool) override {}  // this operator decides idleness itself

  // WatermarkOutput
  void emit_watermark(TimestampMs wm) override {
    if (idle_) mark_active();
    if (wm > this->current_watermark_) StreamOperatorBase::process_watermark(wm);
  }
  void mark_idle() override {
    if (!idle_) {
      idle_ = true;
      StreamOperatorBase::process_watermark_status(true);
    }
  }
  void mark_active() override {
    if (idle_) {
      idle_ = false;
      StreamOperatorBase::process_watermark_status(false);
    }
  }

 private:
  void schedule() {
    this->services_->register_processing_timer(this->ctx_->clock().now_ms() + interval_ms_, [this](TimestampMs) {
      generator_->on_periodic_emit(*this);
      schedule();
    });
  }
  std::shared_ptr<const WatermarkStrategy<T>> strategy_;
  int64_t interval_ms_;
  std::unique_ptr<WatermarkGenerator<T>> generator_;
  Output<T>* out_ = nullptr;
  bool idle_ = false;
};

}  // namespace sluice
