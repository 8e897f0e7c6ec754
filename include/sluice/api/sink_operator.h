// The sink operator (runs a SinkWriter) and the generic operator factory used by the DataStream API.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "sluice/api/operator.h"
#include "sluice/api/sink.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

/// Writes every record with the subtask's SinkWriter; flushes it at the end of a bounded input.
template <class T>
class SinkOperator final : public OneInputOperator<T>, SinkWriterContext {
 public:
  explicit SinkOperator(std::shared_ptr<const Sink<T>> sink) : sink_(std::move(sink)) {}
  void open() override {
    writer_ = call_user_function(this->name(), [&] { return sink_->create_writer(*this->ctx_); });
  }
  void process_element(T&& record, TimestampMs ts) override {
    ts_ = ts;
    call_user_function(this->name(), [&] { writer_->write(record, *this); });
  }
  void finish() override {
    call_user_function(this->name(), [&] { writer_->flush(true); });
  }
  void close() override {
    if (writer_) writer_->close();
  }

 private:
  TimestampMs timestamp() const override { return ts_; }
  TimestampMs current_watermark() const override { return this->current_watermark_; }
  std::shared_ptr<const Sink<T>> sink_;
  std::unique_ptr<SinkWriter<T>> writer_;
  TimestampMs ts_ = kNoTimestamp;
};

/// An OperatorFactory from a callable that builds a fresh operator (copying the user function into it).
class LambdaOperatorFactory final : public OperatorFactory {
 public:
  LambdaOperatorFactory(std::function<std::unique_ptr<StreamOperatorBase>()> make, bool stateful)
      : make_(std::move(make)), stateful_(stateful) {}
  std::unique_ptr<StreamOperatorBase> create(SourceCoordinatorBase* /*coordinator*/) const override { return make_(); }
  bool is_stateful() const override { return stateful_; }

 private:
  std::function<std::unique_ptr<StreamOperatorBase>()> make_;
  bool stateful_;
};

}  // namespace sluice
