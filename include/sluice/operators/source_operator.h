// The source operator and its coordinator: the runtime side of the split-based Source interface.
//
// SourceCoordinator runs the SplitEnumerator of one source for the whole job; its methods are serialized by a
// mutex (the local mini-cluster's stand-in for the JobManager's coordinator thread). Split assignments reach a
// reader as a mail on the reader's task thread, so readers never see concurrent calls.
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/operator.h"
#include "sluice/api/source.h"
#include "sluice/api/watermark_strategy.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"
#include "sluice/graph/stream_graph.h"
#include "sluice/state/operator_state.h"

namespace sluice {

/// Job-wide state of one source (type-erased).
class SourceCoordinatorBase {
 public:
  virtual ~SourceCoordinatorBase() = default;
  /// Checkpoint `checkpoint_id` at this source: under the coordinator's lock, snapshots the enumerator's
  /// unassigned splits and runs `inject_barriers` (which posts the trigger to every reader subtask), so no
  /// split assignment falls between the two: a split is either in the enumerator's state or delivered to
  /// its reader before the reader snapshots. Returns the enumerator state's bytes.
  virtual std::string checkpoint(int64_t checkpoint_id, const std::function<void()>& inject_barriers) = 0;
  /// Stops the enumerator.
  virtual void close() = 0;
  /// Cluster mode, where each TaskManager runs the enumerator of the sources it has reader subtasks of (the
  /// enumerator does not run on the JobManager yet): asks the enumerator for every split up front, for subtask
  /// 0, 1, ..., p-1, 0, ... in turn until each got "no more splits", then serves each reader's requests from
  /// what was assigned to it. Every TaskManager builds the same fixed split list and asks in the same order, so
  /// each split goes to the same subtask in every process and is read once. Before any reader registers.
  /// Fails (kConfiguration) when the enumerator does not answer a request at once with a split or "no more
  /// splits" (sources that discover splits over time: Kafka, CDC).
  virtual Status assign_splits_up_front(const std::string& source_name) = 0;
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
  /// `restored` (nullable) is the bytes checkpoint() returned in the checkpoint the job restores.
  /// Throws SluiceException (kState) when they do not decode.
  SourceCoordinator(const Source<T, SplitT>& source, int parallelism, const std::string* restored)
      : readers_(static_cast<size_t>(parallelism)) {
    std::lock_guard lock(mu_);
    enumerator_ = source.create_enumerator(*this);
    if (restored != nullptr) {
      std::vector<SplitT> unassigned;
      DataInput in(*restored);
      TypeSerializer<std::vector<SplitT>>::deserialize(unassigned, in);
      if (!in.at_end()) in.fail("trailing bytes after the split enumerator's state");
      enumerator_->restore_state(std::move(unassigned));
    }
    enumerator_->start();
  }

  std::string checkpoint(int64_t checkpoint_id, const std::function<void()>& inject_barriers) override {
    std::lock_guard lock(mu_);
    std::vector<SplitT> unassigned = enumerator_->snapshot_state(checkpoint_id);
    // Splits assigned up front but not handed to their reader yet are still the enumerator's.
    for (const UpFront& u : up_front_) {
      for (size_t i = u.next; i < u.splits.size(); ++i)
        unassigned.push_back(u.splits[i]);
    }
    DataOutput out;
    TypeSerializer<std::vector<SplitT>>::serialize(unassigned, out);
    inject_barriers();
    return std::string(out.view());
  }

  Status assign_splits_up_front(const std::string& source_name) override {
    std::lock_guard lock(mu_);
    const size_t p = readers_.size();
    up_front_.assign(p, UpFront{});
    capturing_ = true;
    size_t done = 0;
    for (size_t turn = 0; done < p; turn = (turn + 1) % p) {
      if (up_front_[turn].no_more) continue;
      answers_ = 0;
      enumerator_->handle_split_request(static_cast<int>(turn));
      if (answers_ != 1) {
        capturing_ = false;
        up_front_.clear();
        return Error(ErrorCode::kConfiguration,
                     fmt::format("source '{}': its split enumerator does not assign a fixed list of splits on request, "
                                 "which cluster mode needs in this build (the enumerator runs in each TaskManager, not "
                                 "yet on the JobManager: issue 21); run this pipeline with `sluice run`",
                                 source_name));
      }
      if (up_front_[turn].no_more) ++done;
    }
    capturing_ = false;
    served_up_front_ = true;
    return ok_status();
  }

  /// Called by each reader subtask when it opens.
  void register_reader(int subtask, SplitReceiver<SplitT>* receiver, TaskServices* services) {
    std::lock_guard lock(mu_);
    readers_.at(static_cast<size_t>(subtask)) = Reader{receiver, services};
    if (!served_up_front_) enumerator_->add_reader(subtask);
  }
  /// Called by a reader (any thread) to ask for a split.
  void request_split(int subtask) {
    std::lock_guard lock(mu_);
    if (served_up_front_) {
      UpFront& u = up_front_.at(static_cast<size_t>(subtask));
      if (u.next < u.splits.size()) {
        deliver_split(std::move(u.splits[u.next++]), subtask);
      } else {
        deliver_no_more_splits(subtask);
      }
      return;
    }
    enumerator_->handle_split_request(subtask);
  }
  void close() override {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (enumerator_) enumerator_->close();
    }
    periodic_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  ~SourceCoordinator() override { close(); }

 private:
  struct Reader {
    SplitReceiver<SplitT>* receiver = nullptr;
    TaskServices* services = nullptr;
  };
  /// A periodic enumerator task: `task` runs under mu_; or `work` runs without it and its handler under it.
  struct Periodic {
    std::function<void()> task;
    std::function<std::function<void()>()> work;
    int64_t period_ms;
    std::chrono::steady_clock::time_point due;
  };
  int current_parallelism() const override { return static_cast<int>(readers_.size()); }
  void assign_split(SplitT split, int subtask) override {
    if (capturing_) {
      ++answers_;
      up_front_.at(static_cast<size_t>(subtask)).splits.push_back(std::move(split));
      return;
    }
    deliver_split(std::move(split), subtask);
  }
  void signal_no_more_splits(int subtask) override {
    if (capturing_) {
      ++answers_;
      up_front_.at(static_cast<size_t>(subtask)).no_more = true;
      return;
    }
    deliver_no_more_splits(subtask);
  }
  void deliver_split(SplitT split, int subtask) {
    Reader r = readers_.at(static_cast<size_t>(subtask));
    auto shared = std::make_shared<SplitT>(std::move(split));
    r.services->post_mail([recv = r.receiver, shared] { recv->receive_splits({std::move(*shared)}); });
  }
  void deliver_no_more_splits(int subtask) {
    Reader r = readers_.at(static_cast<size_t>(subtask));
    r.services->post_mail([recv = r.receiver] { recv->receive_no_more_splits(); });
  }
  // Called under mu_ (from the enumerator).
  void schedule_periodic(std::function<void()> task, int64_t period_ms) override {
    add_periodic(Periodic{std::move(task), nullptr, std::max<int64_t>(period_ms, 1), {}});
  }
  // Called under mu_ (from the enumerator).
  void call_async(std::function<std::function<void()>()> work, int64_t period_ms) override {
    add_periodic(Periodic{nullptr, std::move(work), std::max<int64_t>(period_ms, 1), {}});
  }
  void add_periodic(Periodic p) {
    p.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(p.period_ms);
    periodic_.push_back(std::move(p));
    if (!worker_.joinable()) worker_ = std::thread([this] { run_periodic(); });
    periodic_cv_.notify_all();
  }
  void run_periodic() {
    std::unique_lock lock(mu_);
    while (!closed_) {
      auto next = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      // By index: a task or handler may schedule more (push_back), and the lock is released around async work.
      for (size_t i = 0; i < periodic_.size() && !closed_; ++i) {
        if (std::chrono::steady_clock::now() >= periodic_[i].due) {
          try {
            if (periodic_[i].task) {
              // A copy: the task may schedule another (push_back), which moves the vector's elements.
              std::function<void()> task = periodic_[i].task;
              task();
            } else {
              std::function<std::function<void()>()> work = periodic_[i].work;
              lock.unlock();
              std::function<void()> handler;
              try {
                handler = work();
              } catch (...) {
                lock.lock();
                throw;
              }
              lock.lock();
              if (handler && !closed_) handler();
            }
          } catch (const std::exception& e) {
            spdlog::warn("a periodic task of a split enumerator failed: {}", e.what());
          } catch (...) {
            spdlog::warn("a periodic task of a split enumerator failed with an exception that is not a std::exception");
          }
          periodic_[i].due = std::chrono::steady_clock::now() + std::chrono::milliseconds(periodic_[i].period_ms);
        }
        next = std::min(next, periodic_[i].due);
      }
      periodic_cv_.wait_until(lock, next);
    }
  }
  std::mutex mu_;
  std::condition_variable periodic_cv_;
  std::vector<Periodic> periodic_;
  std::thread worker_;
  bool closed_ = false;
  std::unique_ptr<SplitEnumerator<SplitT>> enumerator_;
  std::vector<Reader> readers_;
  // assign_splits_up_front(): the splits of each subtask, asked for before the readers run.
  struct UpFront {
    std::vector<SplitT> splits;
    size_t next = 0;
    bool no_more = false;
  };
  std::vector<UpFront> up_front_;
  bool capturing_ = false;  // the enumerator's answers go to up_front_
  int answers_ = 0;
  bool served_up_front_ = false;
};

/// Drives a SourceReader on the task thread and emits its records into the chain, applying the source's
/// WatermarkStrategy: timestamps are assigned per record, one watermark generator runs per split output (and
/// one for the reader's main output once it is used), and every `auto-watermark-interval` the operator emits
/// the minimum over the outputs that are not idle; when all are idle it marks its output idle.
template <class T, class SplitT>
class SourceOperator final : public SourceOperatorBase, SplitReceiver<SplitT>, SourceReaderContext, OutputOf<T> {
 public:
  SourceOperator(std::shared_ptr<const Source<T, SplitT>> source, SourceCoordinator<T, SplitT>* coordinator,
                 std::shared_ptr<const WatermarkStrategy<T>> strategy, int64_t watermark_interval_ms)
      : source_(std::move(source)),
        coordinator_(coordinator),
        strategy_(std::move(strategy)),
        interval_ms_(watermark_interval_ms),
        main_(this, "") {}

  void open() override {
    out_ = this->typed(this->main_output_);
    cancelled_ = &services_->cancelled_flag();
    main_.init();
    reader_ = source_->create_reader(*this);
    // Splits and positions of the restored checkpoint (redistributed round robin when the parallelism
    // changed), as Flink's SourceOperator keeps them in the "SourceReaderState" list state.
    split_state_ = &ctx_->operator_state().template get_list_state<SplitT>("SourceReaderState");
    std::vector<SplitT> restored = split_state_->get();
    coordinator_->register_reader(subtask_index(), this, services_);
    call_user_function(name(), [&] {
      reader_->start();
      if (!restored.empty()) reader_->add_splits(std::move(restored));
    });
    if (strategy_ != nullptr && interval_ms_ > 0) schedule_periodic_emit();
  }
  /// Runs on the task thread between two emit_next() calls, so the positions match what was emitted.
  void snapshot_state(int64_t checkpoint_id) override { split_state_->update(reader_->snapshot_state(checkpoint_id)); }
  void notify_checkpoint_complete(int64_t checkpoint_id) override {
    call_user_function(name(), [&] { reader_->notify_checkpoint_complete(checkpoint_id); });
  }
  void notify_checkpoint_aborted(int64_t checkpoint_id) override {
    call_user_function(name(), [&] { reader_->notify_checkpoint_aborted(checkpoint_id); });
  }
  InputStatus emit_next() override {
    return call_user_function(name(), [&] { return reader_->poll_next(main_); });
  }
  void close() override {
    if (reader_) reader_->close();
  }

 private:
  /// One output (the main one, or one split's) with its generator and its watermark.
  class SplitOutput final : public ReaderOutput<T>, WatermarkOutput {
   public:
    SplitOutput(SourceOperator* op, std::string split_id) : op_(op), split_id_(std::move(split_id)) {}
    /// Creates the generator; needs the runtime context, so it runs at open() (or later for split outputs).
    void init() {
      if (op_->strategy_ != nullptr) generator_ = op_->strategy_->create_generator(op_->ctx_->clock());
    }
    using ReaderOutput<T>::collect;
    void collect(T&& record) override { collect(std::move(record), kNoTimestamp); }
    void collect(T&& record, TimestampMs ts) override {
      // Stop within one record of a cancel, even when the reader emits large batches into slow operators.
      if (op_->cancelled_->load(std::memory_order_relaxed)) [[unlikely]]
        throw TaskCancelledException{};
      participating_ = true;
      if (op_->strategy_ != nullptr) {
        ts = op_->strategy_->timestamp_of(record, ts);
        generator_->on_event(record, ts, *this);
      }
      op_->metrics_.records_out.inc();
      op_->out_->collect(std::move(record), ts);
    }
    void emit_watermark(TimestampMs wm) override {
      participating_ = true;
      idle_ = false;
      if (wm > watermark_) {
        watermark_ = wm;
        op_->update_watermark();
      }
    }
    void mark_idle() override {
      idle_ = true;
      op_->update_watermark();
    }
    void mark_active() override {
      idle_ = false;
      op_->update_watermark();
    }
    ReaderOutput<T>& output_for_split(const std::string& id) override { return op_->split_output(id); }
    void release_output_for_split(const std::string& id) override { op_->release_split_output(id); }
    void periodic_emit() {
      if (generator_) generator_->on_periodic_emit(*this);
    }
    bool participating() const { return participating_; }
    bool idle() const { return idle_; }
    TimestampMs watermark() const { return watermark_; }

   private:
    SourceOperator* op_;
    std::string split_id_;
    std::unique_ptr<WatermarkGenerator<T>> generator_;
    TimestampMs watermark_ = std::numeric_limits<int64_t>::min();
    bool participating_ = false;
    bool idle_ = false;
  };

  ReaderOutput<T>& split_output(const std::string& id) {
    auto it = splits_.find(id);
    if (it == splits_.end()) {
      it = splits_.emplace(id, std::make_unique<SplitOutput>(this, id)).first;
      it->second->init();
      it->second->emit_watermark(std::numeric_limits<int64_t>::min() + 1);  // participates from now on
    }
    return *it->second;
  }
  void release_split_output(const std::string& id) {
    splits_.erase(id);
    update_watermark();
  }

  void schedule_periodic_emit() {
    services_->register_processing_timer(ctx_->clock().now_ms() + interval_ms_, [this](TimestampMs) {
      main_.periodic_emit();
      for (auto& [id, out] : splits_)
        out->periodic_emit();
      schedule_periodic_emit();
    });
  }

  // The combined watermark: minimum over participating outputs that are not idle.
  void update_watermark() {
    TimestampMs combined = std::numeric_limits<int64_t>::max();
    bool any_active = false;
    bool any_participating = false;
    auto consider = [&](const SplitOutput& o) {
      if (!o.participating()) return;
      any_participating = true;
      if (o.idle()) return;
      any_active = true;
      combined = std::min(combined, o.watermark());
    };
    consider(main_);
    for (auto& [id, out] : splits_)
      consider(*out);
    if (!any_participating) return;
    const bool idle = !any_active;
    if (idle != output_idle_) {
      output_idle_ = idle;
      if (!idle && combined > current_watermark_) process_watermark(combined);
      process_watermark_status(idle);
      return;
    }
    if (!idle && combined > current_watermark_) process_watermark(combined);
  }

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

  std::shared_ptr<const Source<T, SplitT>> source_;
  SourceCoordinator<T, SplitT>* coordinator_;
  std::unique_ptr<SourceReader<T, SplitT>> reader_;
  std::shared_ptr<const WatermarkStrategy<T>> strategy_;
  int64_t interval_ms_;
  Output<T>* out_ = nullptr;
  const std::atomic<bool>* cancelled_ = nullptr;
  ListState<SplitT>* split_state_ = nullptr;
  SplitOutput main_;
  std::map<std::string, std::unique_ptr<SplitOutput>> splits_;
  bool output_idle_ = false;
};

/// Creates SourceOperators and the source's coordinator.
template <class T, class SplitT>
class SourceOperatorFactory final : public OperatorFactory {
 public:
  SourceOperatorFactory(std::shared_ptr<const Source<T, SplitT>> source,
                        std::shared_ptr<const WatermarkStrategy<T>> strategy, int64_t watermark_interval_ms)
      : source_(std::move(source)), strategy_(std::move(strategy)), interval_ms_(watermark_interval_ms) {}
  bool is_source() const override { return true; }
  std::shared_ptr<SourceCoordinatorBase> create_coordinator(int parallelism,
                                                            const std::string* restored) const override {
    return std::make_shared<SourceCoordinator<T, SplitT>>(*source_, parallelism, restored);
  }
  std::unique_ptr<StreamOperatorBase> create(SourceCoordinatorBase* coordinator) const override {
    return std::make_unique<SourceOperator<T, SplitT>>(source_, static_cast<SourceCoordinator<T, SplitT>*>(coordinator),
                                                       strategy_, interval_ms_);
  }
  const Source<T, SplitT>& source() const { return *source_; }

 private:
  std::shared_ptr<const Source<T, SplitT>> source_;
  std::shared_ptr<const WatermarkStrategy<T>> strategy_;
  int64_t interval_ms_;
};

}  // namespace sluice
