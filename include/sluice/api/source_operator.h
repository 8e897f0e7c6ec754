// The source operator and its coordinator: the runtime side of the split-based Source interface.
//
// SourceCoordinator runs the SplitEnumerator of one source for the whole job; its methods are serialized by a
// mutex (the local mini-cluster's stand-in for the JobManager's coordinator thread). Split assignments reach a
// reader as a mail on the reader's task thread, so readers never see concurrent calls.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/api/source.h"
#include "sluice/graph/stream_graph.h"

namespace sluice {

/// Job-wide state of one source (type-erased).
class SourceCoordinatorBase {
 public:
  virtual ~SourceCoordinatorBase() = default;
  /// Stops the enumerator.
  virtual void close() = 0;
};

/// The untyped view of a source operator the task drives.
class SourceOperatorBase : public StreamOperatorBase {
 public:
  /// Emits what the reader has (a batch) and reports the reader's status.
  virtual InputStatus emit_next() = 0;
};

/// Receives split assignments (implemented by the typed source operator).
template <class SplitT>
class SplitReceiver {
 public:
  virtual ~SplitReceiver() = default;
  virtual void receive_splits(std::vector<SplitT> splits) = 0;
  virtual void receive_no_more_splits() = 0;
};

/// Runs a source's SplitEnumerator and routes its assignments to reader subtasks.
template <class T, class SplitT>
class SourceCoordinator final : public SourceCoordinatorBase, SplitEnumeratorContext<SplitT> {
 public:
  SourceCoordinator(const Source<T, SplitT>& source, int parallelism) : readers_(static_cast<size_t>(parallelism)) {
    std::lock_guard lock(mu_);
    enumerator_ = source.create_enumerator(*this);
    enumerator_->start();
  }

  /// Called by each reader subtask when it opens.
  void register_reader(int subtask, SplitReceiver<SplitT>* receiver, TaskServices* services) {
    std::lock_guard lock(mu_);
    readers_.at(static_cast<size_t>(subtask)) = Reader{receiver, services};
    enumerator_->add_reader(subtask);
  }
  /// Called by a reader (any thread) to ask for a split.
  void request_split(int subtask) {
    std::lock_guard lock(mu_);
    enumerator_->handle_split_request(subtask);
  }
  void close() override {
    std::lock_guard lock(mu_);
    if (enumerator_) enumerator_->close();
  }

 private:
  struct Reader {
    SplitReceiver<SplitT>* receiver = nullptr;
    TaskServices* services = nullptr;
  };
  int current_parallelism() const override { return static_cast<int>(readers_.size()); }
  void assign_split(SplitT split, int subtask) override {
    Reader r = readers_.at(static_cast<size_t>(subtask));
    auto shared = std::make_shared<SplitT>(std::move(split));
    r.services->post_mail([recv = r.receiver, shared] { recv->receive_splits({std::move(*shared)}); });
  }
  void signal_no_more_splits(int subtask) override {
    Reader r = readers_.at(static_cast<size_t>(subtask));
    r.services->post_mail([recv = r.receiver] { recv->receive_no_more_splits(); });
  }

  std::mutex mu_;
  std::unique_ptr<SplitEnumerator<SplitT>> enumerator_;
  std::vector<Reader> readers_;
};

/// Drives a SourceReader on the task thread and emits its records into the chain.
template <class T, class SplitT>
class SourceOperator final : public SourceOperatorBase,
                             SplitReceiver<SplitT>,
                             SourceReaderContext,
                             ReaderOutput<T>,
                             OutputOf<T> {
 public:
  SourceOperator(std::shared_ptr<const Source<T, SplitT>> source, SourceCoordinator<T, SplitT>* coordinator)
      : source_(std::move(source)), coordinator_(coordinator) {}

  void open() override {
    out_ = this->typed(this->main_output_);
    reader_ = source_->create_reader(*this);
    coordinator_->register_reader(subtask_index(), this, services_);
    call_user_function(name(), [&] { reader_->start(); });
  }
  InputStatus emit_next() override {
    return call_user_function(name(), [&] { return reader_->poll_next(*this); });
  }
  void close() override {
    if (reader_) reader_->close();
  }

 private:
  // SplitReceiver
  void receive_splits(std::vector<SplitT> splits) override {
    call_user_function(name(), [&] { reader_->add_splits(std::move(splits)); });
    services_->wakeup();
  }
  void receive_no_more_splits() override {
    reader_->notify_no_more_splits();
    services_->wakeup();
  }
  // SourceReaderContext
  int subtask_index() const override { return ctx_->subtask_index(); }
  int parallelism() const override { return ctx_->parallelism(); }
  void send_split_request() override { coordinator_->request_split(ctx_->subtask_index()); }
  void wakeup() override { services_->wakeup(); }
  void wakeup_at(TimestampMs t) override { services_->wakeup_at(t); }
  const Clock& clock() const override { return ctx_->clock(); }
  // ReaderOutput
  using ReaderOutput<T>::collect;
  void collect(T&& record) override {
    metrics_.records_out.inc();
    out_->collect(std::move(record), kNoTimestamp);
  }
  void collect(T&& record, TimestampMs ts) override {
    metrics_.records_out.inc();
    out_->collect(std::move(record), ts);
  }
  void emit_watermark(TimestampMs wm) override {
    if (wm > current_watermark_) process_watermark(wm);
  }

  std::shared_ptr<const Source<T, SplitT>> source_;
  SourceCoordinator<T, SplitT>* coordinator_;
  std::unique_ptr<SourceReader<T, SplitT>> reader_;
  Output<T>* out_ = nullptr;
};

/// Creates SourceOperators and the source's coordinator.
template <class T, class SplitT>
class SourceOperatorFactory final : public OperatorFactory {
 public:
  explicit SourceOperatorFactory(std::shared_ptr<const Source<T, SplitT>> source) : source_(std::move(source)) {}
  bool is_source() const override { return true; }
  std::shared_ptr<SourceCoordinatorBase> create_coordinator(int parallelism) const override {
    return std::make_shared<SourceCoordinator<T, SplitT>>(*source_, parallelism);
  }
  std::unique_ptr<StreamOperatorBase> create(SourceCoordinatorBase* coordinator) const override {
    return std::make_unique<SourceOperator<T, SplitT>>(source_, static_cast<SourceCoordinator<T, SplitT>*>(coordinator));
  }
  const Source<T, SplitT>& source() const { return *source_; }

 private:
  std::shared_ptr<const Source<T, SplitT>> source_;
};

}  // namespace sluice
