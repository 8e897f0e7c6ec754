// Operators on a KeyedStream. Each record's key is recomputed from the record with the stream's key selector
// (as Flink does), so keys never travel separately. Per-key values live in a flat hash map owned by the
// subtask; the event-time/state issue moves them into the keyed state backend, partitioned by key group.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "sluice/api/keyed_process_function.h"
#include "sluice/api/operators.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// Hashes keys for in-memory maps: abseil's hash for scalars and strings, XXH3 over the serialized bytes for
/// everything else (so any serializable key type works). In-memory only: key groups use key_hash().
template <class K>
struct KeyHasher {
  size_t operator()(const K& key) const {
    if constexpr (std::is_arithmetic_v<K> || std::is_enum_v<K> || std::is_same_v<K, std::string>) {
      return absl::Hash<K>{}(key);
    } else {
      thread_local DataOutput buf;
      buf.clear();
      TypeSerializer<K>::serialize(key, buf);
      return static_cast<size_t>(key_hash(buf.bytes()));
    }
  }
};

template <class K, class V>
using KeyedMap = absl::flat_hash_map<K, V, KeyHasher<K>>;

/// Rolling reduce per key (Flink's StreamGroupedReduceOperator): emits the new aggregate for every record.
template <class K, class T, class Sel, class R>
class KeyedReduceOperator final : public OneInputOperator<T>, OutputOf<T> {
 public:
  KeyedReduceOperator(Sel selector, R reducer) : selector_(std::move(selector)), reducer_(std::move(reducer)) {}
  void open() override { detail::open_function(reducer_, *this->ctx_); }
  void close() override { detail::close_function(reducer_); }
  void process_element(T&& record, TimestampMs ts) override {
    K key = std::invoke(selector_, std::as_const(record));
    auto it = values_.find(key);
    if (it == values_.end()) {
      it = values_.emplace(std::move(key), std::move(record)).first;
    } else {
      T reduced = call_user_function(this->name(), [&]() -> T {
        if constexpr (detail::kIsRich<R>) {
          return reducer_.reduce(std::as_const(it->second), std::as_const(record));
        } else {
          return std::invoke(reducer_, std::as_const(it->second), std::as_const(record));
        }
      });
      it->second = std::move(reduced);
    }
    T out = it->second;
    this->metrics_.records_out.inc();
    this->typed(this->main_output_)->collect(std::move(out), ts);
  }
  /// Number of keys this subtask holds (for tests and metrics).
  size_t key_count() const { return values_.size(); }

 private:
  Sel selector_;
  R reducer_;
  KeyedMap<K, T> values_;
};

/// The keyed state backend and timer service of one keyed operator subtask, with the task-timer plumbing for
/// processing-time timers. Owned by keyed operators; task thread only.
template <class K, class N>
class KeyedContextHolder final : public TimerService {
 public:
  void open(RuntimeContext& ctx, TaskServices* services) {
    services_ = services;
    clock_ = &ctx.clock();
    backend_ = std::make_unique<HeapKeyedStateBackend<K>>(
        KeyGroupRange::for_operator_index(ctx.max_parallelism(), ctx.parallelism(), ctx.subtask_index()),
        ctx.max_parallelism(), ctx.clock());
    timers_ = std::make_unique<InternalTimerService<K, N>>(*backend_);
  }
  HeapKeyedStateBackend<K>& backend() { return *backend_; }
  InternalTimerService<K, N>& timers() { return *timers_; }

  // TimerService of keyed functions: timers in the default namespace of the current key.
  TimestampMs current_processing_time() const override { return clock_->now_ms(); }
  TimestampMs current_watermark() const override { return timers_->current_watermark(); }
  void register_event_time_timer(TimestampMs t) override { timers_->register_event_time_timer(N{}, t); }
  void register_processing_time_timer(TimestampMs t) override { timers_->register_processing_time_timer(N{}, t); }
  void delete_event_time_timer(TimestampMs t) override { timers_->delete_event_time_timer(N{}, t); }
  void delete_processing_time_timer(TimestampMs t) override { timers_->delete_processing_time_timer(N{}, t); }

  /// Keeps one task timer armed for the earliest processing-time timer; `fire(key, ns, ts)` runs due timers.
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
  std::unique_ptr<HeapKeyedStateBackend<K>> backend_;
  std::unique_ptr<InternalTimerService<K, N>> timers_;
  std::optional<TimestampMs> armed_;
};

/// Runs a KeyedProcessFunction (Flink's KeyedProcessOperator): keyed state, timers, current key.
template <class K, class In, class Out, class Sel, class P>
class KeyedProcessOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  KeyedProcessOperator(Sel selector, P fn) : selector_(std::move(selector)), fn_(std::move(fn)), context_(this) {}
  void open() override {
    keyed_.open(*this->ctx_, this->services_);
    fn_.set_keyed_state(&keyed_.backend());
    fn_.open(*this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  void close() override { fn_.close(); }
  void process_element(In&& record, TimestampMs ts) override {
    K key = std::invoke(selector_, std::as_const(record));
    keyed_.backend().set_current_key(key);
    context_.ts = ts;
    context_.domain = TimeDomain::kEventTime;
    collector_.set_timestamp(ts);
    call_user_function(this->name(), [&] { fn_.process_element(std::as_const(record), context_, collector_); });
    schedule();
  }
  void process_watermark(TimestampMs wm) override {
    keyed_.timers().advance_watermark(
        wm, [this](const K&, const VoidNamespace&, TimestampMs t) { fire(t, TimeDomain::kEventTime); });
    StreamOperatorBase::process_watermark(wm);
    schedule();
  }

 private:
  void fire(TimestampMs t, TimeDomain domain) {
    context_.ts = t;
    context_.domain = domain;
    collector_.set_timestamp(domain == TimeDomain::kEventTime ? t : kNoTimestamp);
    call_user_function(this->name(), [&] { fn_.on_timer(t, context_, collector_); });
  }
  void schedule() {
    keyed_.schedule_processing_time(
        [this](const K&, const VoidNamespace&, TimestampMs t) { fire(t, TimeDomain::kProcessingTime); });
  }

  struct Ctx final : KeyedProcessFunction<K, In, Out>::OnTimerContext {
    explicit Ctx(KeyedProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->keyed_.current_watermark(); }
    const K& current_key() const override { return op->keyed_.backend().current_key(); }
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
