// Operators on a KeyedStream. Each record's key is recomputed from the record with the stream's key selector
// (as Flink does), so keys never travel separately. Per-key values live in the subtask's KeyedStateStore, in
// the backend the job's configuration selects (state.backend.type: hashmap or rocksdb; partitioned by key
// group either way), and timers on the heap, so checkpoints capture them and a restore, at any parallelism
// and from either backend's checkpoint, gives each subtask the key groups of its new range (DESIGN.md §6).
// Every keyed operator runs on both backends: on the heap through the typed states (no virtual call on the
// hot path), on rocksdb through the RocksDB states (detail::EitherState picks one per state at open()).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "sluice/api/keyed_process_function.h"
#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/key_group.h"
#include "sluice/operators/operators.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_operator_snapshot.h"
#include "sluice/state/keyed_state_store.h"
#include "sluice/state/timer_service.h"

namespace sluice {

namespace detail {

/// The keyed state of this subtask (the key groups of its index at the operator's parallelism) in the
/// backend of the job's configuration (RuntimeContext::job_configuration(); none: hashmap). Throws
/// SluiceException: kConfiguration for bad state.backend.* values, kState when RocksDB cannot open.
template <class K>
std::unique_ptr<KeyedStateStore<K>> make_keyed_store(const RuntimeContext& ctx) {
  return std::make_unique<KeyedStateStore<K>>(
      KeyGroupRange::for_operator_index(ctx.max_parallelism(), ctx.parallelism(), ctx.subtask_index()),
      ctx.max_parallelism(), ctx.clock(),
      StateBackendOptions::for_subtask(ctx.job_configuration(), ctx.subtask_index()), ctx.operator_name(),
      ctx.subtask_index(), ctx.attempt_number());
}

/// Throws the error of a failed keyed-state restore as a SluiceException naming the operator and subtask
/// (the task then fails); does nothing for OK.
inline void throw_if_restore_failed(const Status& restored, const RuntimeContext& ctx) {
  if (restored.ok()) return;
  throw SluiceException(restored.error().with_context("operator '" + ctx.operator_name() + "' (subtask " +
                                                      std::to_string(ctx.subtask_index() + 1) + "/" +
                                                      std::to_string(ctx.parallelism()) + ")"));
}

/// One keyed state of an operator that runs on both backends: the heap's typed state (the hot path: no virtual
/// call) or the RocksDB state of the same descriptor; exactly one is set after bind(). visit() calls a generic
/// callable with the one that is set, so the operator's code is written once for both.
template <class HeapState, class RocksState>
class EitherState {
 public:
  /// Registers `descriptor` in namespace type N in the backend `store` holds (state.backend.type).
  template <class N, class K, class D>
  void bind(KeyedStateStore<K>& store, const D& descriptor) {
    if (RocksDBKeyedStateBackend<K>* rocks = store.rocksdb()) {
      rocks_ = &rocks->template get_partitioned_state<N>(descriptor);
      heap_ = nullptr;
    } else {
      heap_ = &store.heap().template get_partitioned_state<N>(descriptor);
      rocks_ = nullptr;
    }
  }
  template <class Fn>
  decltype(auto) visit(Fn&& fn) {
    if (heap_ != nullptr) [[likely]]
      return fn(*heap_);
    return fn(*rocks_);
  }

 private:
  HeapState* heap_ = nullptr;
  RocksState* rocks_ = nullptr;
};

}  // namespace detail

/// The keyed state backend and timer service of one keyed operator subtask, with the task-timer plumbing for
/// processing-time timers and the checkpoint capture and restore of both. Owned by keyed operators; task
/// thread only.
///
/// Lifecycle: open() (creates backend and timers, restores them when the subtask restores) -> running ->
/// snapshot() at checkpoints. After a restore the operator calls schedule_processing_time() once at the end
/// of its open(), so restored processing-time timers get a task timer again.
template <class K, class N>
class KeyedContextHolder final : public TimerService {
 public:
  /// Creates the backend and the timer service for this subtask's key-group range; when `restored` is not
  /// null, restores the keyed state and timers of that range from it (the runtime's
  /// StreamOperatorBase::restored_keyed_state()). Throws SluiceException (kState or kSerialization) naming the
  /// operator and subtask when the restore fails: the task then fails. The operator keeps its state in
  /// store() (either backend).
  void open(RuntimeContext& ctx, TaskServices* services, const KeyedStateRestore* restored) {
    services_ = services;
    clock_ = &ctx.clock();
    store_ = detail::make_keyed_store<K>(ctx);
    key_context_ = &store_->timer_key_context();
    timers_ = std::make_unique<InternalTimerService<K, N>>(store_->timer_key_context());
    store_->attach_timers(*timers_);
    if (restored != nullptr) detail::throw_if_restore_failed(store_->restore(timers_.get(), *restored), ctx);
  }
  /// A consistent capture of the keyed state and timers (StreamOperatorBase::snapshot_keyed_state); nullptr
  /// before open().
  std::unique_ptr<KeyedStateSnapshot> snapshot() const {
    if (store_ == nullptr) return nullptr;
    return store_->capture(timers_.get());
  }
  /// The current key (of the last set_current_key() or firing timer).
  const K& current_key() const { return key_context_->current_key(); }
  /// The keyed state in the configured backend.
  KeyedStateStore<K>& store() { return *store_; }
  /// Moves the state and the timers out (StreamOperatorBase::release_keyed_state); nullptr before open().
  std::shared_ptr<void> release() {
    if (store_ == nullptr) return nullptr;
    struct Released {
      std::unique_ptr<KeyedStateStore<K>> store;
      std::unique_ptr<InternalTimerService<K, N>> timers;  // declared last: destroyed before the backend it uses
    };
    key_context_ = nullptr;
    return std::make_shared<Released>(Released{std::move(store_), std::move(timers_)});
  }
  InternalTimerService<K, N>& timers() { return *timers_; }
  /// Makes the key of a firing timer current for the RocksDB states too (the timer service made it current in
  /// the heap key context only). Call before the timer's code reads state.
  void follow_timer_key(const K& key) {
    if (RocksDBKeyedStateBackend<K>* rocks = store_->rocksdb()) rocks->set_current_key(key);
  }

  // TimerService of keyed functions: timers in the default namespace of the current key.
  TimestampMs current_processing_time() const override { return clock_->now_ms(); }
  TimestampMs current_watermark() const override { return timers_->current_watermark(); }
  void register_event_time_timer(TimestampMs t) override { timers_->register_event_time_timer(N{}, t); }
  void register_processing_time_timer(TimestampMs t) override { timers_->register_processing_time_timer(N{}, t); }
  void delete_event_time_timer(TimestampMs t) override { timers_->delete_event_time_timer(N{}, t); }
  void delete_processing_time_timer(TimestampMs t) override { timers_->delete_processing_time_timer(N{}, t); }

  /// Keeps one task timer armed for the earliest processing-time timer; `fire(key, ns, ts)` runs due timers.
  /// Call after anything that may register one (a record, a watermark) and at the end of open() (restored
  /// timers).
  template <class Fire>
  void schedule_processing_time(Fire fire) {
    std::optional<TimestampMs> next = timers_->next_processing_time();
    if (!next || (armed_ && *armed_ <= *next)) return;
    armed_ = *next;
    services_->register_processing_timer(*next, [this, fire](TimestampMs) {
      armed_.reset();
      timers_->on_processing_time(clock_->now_ms(), fire);
      schedule_processing_time(fire);
    });
  }

 private:
  TaskServices* services_ = nullptr;
  const Clock* clock_ = nullptr;
  std::unique_ptr<KeyedStateStore<K>> store_;
  HeapKeyedStateBackend<K>* key_context_ = nullptr;  // store_->timer_key_context()
  std::unique_ptr<InternalTimerService<K, N>> timers_;
  std::optional<TimestampMs> armed_;
};

/// Rolling reduce per key (Flink's StreamGroupedReduceOperator): emits the new aggregate for every record.
/// The aggregate of each key is the ValueState "reduce-value" of a keyed state backend without timers
/// (checkpointed and rescaled with it); a record costs one set_current_key and one lookup of the key's entry.
/// Both backends: the heap path is the typed HeapValueState (no virtual call), the rocksdb path the same code
/// over RocksDBValueState.
template <class K, class T, class Sel, class R>
class KeyedReduceOperator final : public OneInputOperator<T>, OutputOf<T> {
 public:
  KeyedReduceOperator(Sel selector, R reducer) : selector_(std::move(selector)), reducer_(std::move(reducer)) {}
  void open() override {
    store_ = detail::make_keyed_store<K>(*this->ctx_);
    if (const KeyedStateRestore* restored = this->restored_keyed_state()) {
      detail::throw_if_restore_failed(
          store_->restore(static_cast<InternalTimerService<K, VoidNamespace>*>(nullptr), *restored), *this->ctx_);
    }
    if (RocksDBKeyedStateBackend<K>* rocks = store_->rocksdb()) {
      rocks_ = rocks;
      rocks_value_ = &rocks->get_state(ValueStateDescriptor<T>{"reduce-value"});
    } else {
      backend_ = &store_->heap();
      value_ = &backend_->get_state(ValueStateDescriptor<T>{"reduce-value"});
    }
    out_ = this->typed(this->main_output_);
    detail::open_function(reducer_, *this->ctx_);
  }
  void close() override { detail::close_function(reducer_); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(reducer_, this->name(), id); }
  std::unique_ptr<KeyedStateSnapshot> snapshot_keyed_state() override {
    return store_ == nullptr ? nullptr
                             : store_->capture(static_cast<const InternalTimerService<K, VoidNamespace>*>(nullptr));
  }
  std::shared_ptr<void> release_keyed_state() override {
    value_ = nullptr;
    rocks_value_ = nullptr;
    backend_ = nullptr;
    rocks_ = nullptr;
    return std::shared_ptr<void>(std::move(store_));
  }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(reducer_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(reducer_, this->name(), id);
  }
  void process_element(T&& record, TimestampMs ts) override {
    if (value_ != nullptr) [[likely]] {
      reduce_into(*backend_, *value_, std::move(record), ts);
    } else {
      reduce_into(*rocks_, *rocks_value_, std::move(record), ts);
    }
  }
  /// Number of keys this subtask holds (for tests and metrics); 0 before open().
  size_t key_count() const { return store_ == nullptr ? 0 : store_->num_entries("reduce-value"); }

 private:
  template <class Backend, class State>
  void reduce_into(Backend& backend, State& value, T&& record, TimestampMs ts) {
    backend.set_current_key(std::invoke(selector_, std::as_const(record)));
    // has_value() finds the key's entry; value() and update() reuse that lookup (the state caches it).
    if (!value.has_value()) {
      value.update(std::as_const(record));
      this->metrics_.records_out.inc();
      out_->collect(std::move(record), ts);
      return;
    }
    T reduced = call_user_function(this->name(), [&]() -> T {
      if constexpr (detail::kIsRich<R>) {
        return reducer_.reduce(value.value(), std::as_const(record));
      } else {
        return std::invoke(reducer_, value.value(), std::as_const(record));
      }
    });
    value.update(std::as_const(reduced));
    this->metrics_.records_out.inc();
    out_->collect(std::move(reduced), ts);
  }

  Sel selector_;
  R reducer_;
  std::unique_ptr<KeyedStateStore<K>> store_;
  HeapKeyedStateBackend<K>* backend_ = nullptr;           // hashmap: the state's backend (in store_)
  HeapValueState<K, VoidNamespace, T>* value_ = nullptr;  // hashmap
  RocksDBKeyedStateBackend<K>* rocks_ = nullptr;          // rocksdb (in store_)
  RocksDBValueState<K, VoidNamespace, T>* rocks_value_ = nullptr;
  Output<T>* out_ = nullptr;
};

/// Runs a KeyedProcessFunction (Flink's KeyedProcessOperator): keyed state, timers, current key.
template <class K, class In, class Out, class Sel, class P>
class KeyedProcessOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  KeyedProcessOperator(Sel selector, P fn) : selector_(std::move(selector)), fn_(std::move(fn)), context_(this) {}
  void open() override {
    keyed_.open(*this->ctx_, this->services_, this->restored_keyed_state());
    fn_.set_keyed_state(&keyed_.store());
    fn_.open(*this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
    schedule();  // restored processing-time timers
  }
  void close() override { fn_.close(); }
  void snapshot_state(int64_t id) override { detail::snapshot_function(fn_, this->name(), id); }
  std::unique_ptr<KeyedStateSnapshot> snapshot_keyed_state() override { return keyed_.snapshot(); }
  std::shared_ptr<void> release_keyed_state() override { return keyed_.release(); }
  void notify_checkpoint_complete(int64_t id) override {
    detail::notify_function_checkpoint_complete(fn_, this->name(), id);
  }
  void notify_checkpoint_aborted(int64_t id) override {
    detail::notify_function_checkpoint_aborted(fn_, this->name(), id);
  }
  void process_element(In&& record, TimestampMs ts) override {
    K key = std::invoke(selector_, std::as_const(record));
    keyed_.store().set_current_key(key);
    context_.ts = ts;
    context_.domain = TimeDomain::kEventTime;
    collector_.set_timestamp(ts);
    call_user_function(this->name(), [&] { fn_.process_element(std::as_const(record), context_, collector_); });
    schedule();
  }
  void process_watermark(TimestampMs wm) override {
    keyed_.timers().advance_watermark(
        wm, [this](const K& key, const VoidNamespace&, TimestampMs t) { fire(key, t, TimeDomain::kEventTime); });
    StreamOperatorBase::process_watermark(wm);
    schedule();
  }

 private:
  void fire(const K& key, TimestampMs t, TimeDomain domain) {
    keyed_.follow_timer_key(key);
    context_.ts = t;
    context_.domain = domain;
    collector_.set_timestamp(domain == TimeDomain::kEventTime ? t : kNoTimestamp);
    call_user_function(this->name(), [&] { fn_.on_timer(t, context_, collector_); });
  }
  void schedule() {
    keyed_.schedule_processing_time(
        [this](const K& key, const VoidNamespace&, TimestampMs t) { fire(key, t, TimeDomain::kProcessingTime); });
  }

  struct Ctx final : KeyedProcessFunction<K, In, Out>::OnTimerContext {
    explicit Ctx(KeyedProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->keyed_.current_watermark(); }
    const K& current_key() const override { return op->keyed_.current_key(); }
    TimerService& timer_service() override { return op->keyed_; }
    TimeDomain time_domain() const override { return domain; }
    void* side_output(const std::string& tag_id) override { return op->side_output(tag_id); }
    KeyedProcessOperator* op;
    TimestampMs ts = kNoTimestamp;
    TimeDomain domain = TimeDomain::kEventTime;
  };
  Sel selector_;
  P fn_;
  KeyedContextHolder<K, VoidNamespace> keyed_;
  Ctx context_;
  detail::TimestampedCollector<Out> collector_;
};

}  // namespace sluice
