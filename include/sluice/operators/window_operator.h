// WindowOperator: keyed windows with triggers, allowed lateness, late-data side output and merging (session)
// windows — Flink's WindowOperator and MergingWindowSet, on either keyed state backend (state.backend.type:
// hashmap through the heap's typed states, rocksdb through the RocksDB states; detail::EitherState).
//
// Window contents live in keyed state with the window as namespace (so they are checkpointed with the rest of
// the keyed state): an accumulator per window for reduce()/aggregate(), the list of elements for process().
// Each window gets a cleanup timer at max_timestamp + allowed lateness (event time) that drops its state.
// Results carry the timestamp window.max_timestamp(). All on the task thread.
//
// Checkpoints: backend and timers live in a KeyedContextHolder, which captures them (snapshot_keyed_state) and
// restores them in open(); pending windows, trigger state and merging-window sets travel with their key
// groups. Processing-time timers restored are armed again at the end of open().
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/api/windowing.h"
#include "sluice/operators/keyed_operators.h"
#include "sluice/operators/operators.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/keyed_state_store.h"
#include "sluice/state/rocksdb_keyed_state_backend.h"
#include "sluice/state/timer_service.h"

namespace sluice {

/// A function over all contents (or the aggregated result) of one window of one key (Flink's
/// ProcessWindowFunction).
template <class In, class Out, class K, class W>
class ProcessWindowFunction : public RichFunction {
 public:
  using InputType = In;
  using OutputType = Out;
  class Context {
   public:
    virtual ~Context() = default;
    virtual const W& window() const = 0;
    virtual TimestampMs current_watermark() const = 0;
    virtual TimestampMs current_processing_time() const = 0;
    /// Emits to a side output.
    template <class U>
    void output(const OutputTag<U>& tag, U value) {
      void* out = side_output(tag.id());
      if (out != nullptr) {
        static_cast<Output<U>*>(static_cast<OutputBase*>(out))->collect(std::move(value), window().max_timestamp());
      }
    }

   protected:
    virtual void* side_output(const std::string& tag_id) = 0;
  };
  virtual void process(const K& key, Context& ctx, const std::vector<In>& elements, Collector<Out>& out) = 0;
};

/// Adapts a reduce function to an AggregateFunction with an optional accumulator.
template <class T, class R>
class ReduceAggregateFunction final : public AggregateFunction<T, std::optional<T>, T> {
 public:
  explicit ReduceAggregateFunction(R reduce) : reduce_(std::move(reduce)) {}
  std::optional<T> create_accumulator() override { return std::nullopt; }
  void add(const T& value, std::optional<T>& acc) override {
    if (acc) {
      acc = std::invoke(reduce_, std::as_const(*acc), value);
    } else {
      acc = value;
    }
  }
  T get_result(const std::optional<T>& acc) override { return *acc; }
  std::optional<T> merge(std::optional<T> a, const std::optional<T>& b) override {
    if (!a) return b;
    if (!b) return a;
    return std::invoke(reduce_, std::as_const(*a), *b);
  }

 private:
  R reduce_;
};

namespace detail {

/// Window contents as an accumulator (reduce/aggregate): the window function sees one element, the result.
template <class K, class W, class In, class Acc, class Mid>
class AggregatingContents {
 public:
  using MidType = Mid;
  explicit AggregatingContents(std::shared_ptr<AggregateFunction<In, Acc, Mid>> fn) : fn_(std::move(fn)) {}
  void init(KeyedStateStore<K>& store) {
    state_.template bind<W>(store, AggregatingStateDescriptor<In, Acc, Mid>{"window-contents", fn_});
  }
  void add(const W& ns, const In& v) {
    state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      st.add(v);
    });
  }
  bool get(const W& ns, std::vector<Mid>& out) {
    std::optional<Mid> r = state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      return st.get();
    });
    out.clear();
    if (!r) return false;
    out.push_back(std::move(*r));
    return true;
  }
  void clear(const W& ns) {
    state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      st.clear();
    });
  }
  void merge(const W& target, const std::vector<W>& sources) {
    state_.visit([&](auto& st) { st.merge_namespaces(target, sources); });
  }

 private:
  std::shared_ptr<AggregateFunction<In, Acc, Mid>> fn_;
  EitherState<HeapAggregatingState<K, W, In, Acc, Mid>, RocksDBAggregatingState<K, W, In, Acc, Mid>> state_;
};

/// Window contents as the list of elements (process).
template <class K, class W, class In>
class ListContents {
 public:
  using MidType = In;
  void init(KeyedStateStore<K>& store) { state_.template bind<W>(store, ListStateDescriptor<In>{"window-contents"}); }
  void add(const W& ns, const In& v) {
    state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      st.add(v);
    });
  }
  bool get(const W& ns, std::vector<In>& out) {
    state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      out = st.get();
    });
    return !out.empty();
  }
  void clear(const W& ns) {
    state_.visit([&](auto& st) {
      st.set_current_namespace(ns);
      st.clear();
    });
  }
  void merge(const W& target, const std::vector<W>& sources) {
    state_.visit([&](auto& st) { st.merge_namespaces(target, sources); });
  }

 private:
  EitherState<HeapListState<K, W, In>, RocksDBListState<K, W, In>> state_;
};

}  // namespace detail

/// How a window operator assigns, triggers and treats late data, and its function's lifecycle hooks.
template <class In, class W>
struct WindowSettings {
  std::shared_ptr<const WindowAssigner<W>> assigner;
  std::shared_ptr<Trigger<In, W>> trigger;
  int64_t allowed_lateness_ms = 0;
  std::string late_tag;  ///< "" = late elements are dropped and counted
  std::function<void(RuntimeContext&)> open_fn;
  std::function<void()> close_fn;
  /// The window function when it is a RichFunction (a ProcessWindowFunction), shared with the WindowFn
  /// that calls it: receives snapshot_state() and notify_checkpoint_complete/aborted(), and open()/close()
  /// when open_fn/close_fn are not set. Null for plain callables.
  std::shared_ptr<RichFunction> rich_function;
};

/// The window operator. `Contents` is detail::AggregatingContents or detail::ListContents; `WinFn` is
/// `void(const K&, const W&, const std::vector<Mid>&, typename ProcessWindowFunction<Mid,Out,K,W>::Context&,
/// Collector<Out>&)`.
template <class K, class In, class Out, class W, class Sel, class Contents>
class WindowOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  using Mid = typename Contents::MidType;
  using WindowFn = std::function<void(const K&, typename ProcessWindowFunction<Mid, Out, K, W>::Context&,
                                      const std::vector<Mid>&, Collector<Out>&)>;
  using Settings = WindowSettings<In, W>;
  /// Only windows with start, intersects() and cover() (TimeWindow) can merge.
  static constexpr bool kCanMerge = requires(const W& w) {
    w.start;
    w.intersects(w);
    w.cover(w);
  };

  WindowOperator(Sel selector, Contents contents, WindowFn fn, Settings settings)
      : selector_(std::move(selector)),
        contents_(std::move(contents)),
        fn_(std::move(fn)),
        settings_(std::move(settings)),
        trigger_ctx_(this),
        window_ctx_(this) {}

  void open() override {
    keyed_.open(*this->ctx_, this->services_, this->restored_keyed_state());
    store_ = &keyed_.store();
    timers_ = &keyed_.timers();
    contents_.init(*store_);
    if constexpr (kCanMerge) {
      if (settings_.assigner->is_merging()) {
        merging_state_.template bind<VoidNamespace>(
            *store_, ValueStateDescriptor<std::vector<std::pair<W, W>>>{"merging-window-set"});
      }
    }
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
    if (settings_.open_fn) {
      settings_.open_fn(*this->ctx_);
    } else if (settings_.rich_function) {
      settings_.rich_function->open(*this->ctx_);
    }
    schedule_processing_time();  // restored processing-time timers (triggers, processing-time windows)
  }
  void close() override {
    if (settings_.close_fn) {
      settings_.close_fn();
    } else if (settings_.rich_function) {
      settings_.rich_function->close();
    }
  }
  void snapshot_state(int64_t id) override {
    if (settings_.rich_function) detail::snapshot_function(*settings_.rich_function, this->name(), id);
  }
  /// Window contents, trigger counters, the merging-window set and all timers (cleanup and trigger timers).
  std::unique_ptr<KeyedStateSnapshot> snapshot_keyed_state() override { return keyed_.snapshot(); }
  std::shared_ptr<void> release_keyed_state() override { return keyed_.release(); }
  void notify_checkpoint_complete(int64_t id) override {
    if (settings_.rich_function) {
      detail::notify_function_checkpoint_complete(*settings_.rich_function, this->name(), id);
    }
  }
  void notify_checkpoint_aborted(int64_t id) override {
    if (settings_.rich_function) detail::notify_function_checkpoint_aborted(*settings_.rich_function, this->name(), id);
  }

  void process_element(In&& record, TimestampMs ts) override {
    K key = std::invoke(selector_, std::as_const(record));
    store_->set_current_key(key);
    const TimestampMs now = this->ctx_->clock().now_ms();
    if (settings_.assigner->is_event_time() && ts == kNoTimestamp) {
      throw OperatorException(this->name(),
                              "a record without an event timestamp reached an event-time window: assign timestamps "
                              "with a WatermarkStrategy on the source or assign_timestamps_and_watermarks()");
    }
    windows_.clear();
    settings_.assigner->assign_windows(ts, now, windows_);
    bool skipped = true;
    if (is_merging()) {
      load_merging_set();
      for (const W& w : windows_) {
        W actual = add_to_merging_set(w);
        if (is_window_late(actual)) {
          retire_window(actual);
          continue;
        }
        skipped = false;
        const W state_window = state_window_of(actual);
        contents_.add(state_window, record);
        handle_trigger(trigger_on_element(record, ts, actual), actual, state_window);
        register_cleanup_timer(actual);
      }
      store_merging_set();
    } else {
      for (const W& w : windows_) {
        if (is_window_late(w)) continue;
        skipped = false;
        contents_.add(w, record);
        handle_trigger(trigger_on_element(record, ts, w), w, w);
        register_cleanup_timer(w);
      }
    }
    if (skipped && is_element_late(ts)) {
      OutputBase* late = settings_.late_tag.empty() ? nullptr : this->side_output(settings_.late_tag);
      if (late != nullptr) {
        static_cast<Output<In>*>(late)->collect(std::move(record), ts);
      } else {
        ++late_records_dropped_;
      }
    }
    schedule_processing_time();
  }

  void process_watermark(TimestampMs wm) override {
    timers_->advance_watermark(wm, [this](const K& key, const W& w, TimestampMs t) {
      keyed_.follow_timer_key(key);
      on_timer(w, t, true);
    });
    StreamOperatorBase::process_watermark(wm);
    schedule_processing_time();
  }

  /// Late elements dropped because no late side output was configured (a metric; never silent: counted).
  uint64_t late_records_dropped() const { return late_records_dropped_; }

 private:
  using CounterState = detail::EitherState<HeapValueState<K, W, int64_t>, RocksDBValueState<K, W, int64_t>>;

  class TriggerCtx final : public TriggerContext<W> {
   public:
    explicit TriggerCtx(WindowOperator* op) : op_(op) {}
    TimestampMs current_watermark() const override { return op_->timers_->current_watermark(); }
    TimestampMs current_processing_time() const override { return op_->ctx_->clock().now_ms(); }
    void register_event_time_timer(TimestampMs t) override { op_->timers_->register_event_time_timer(*window, t); }
    void register_processing_time_timer(TimestampMs t) override {
      op_->timers_->register_processing_time_timer(*window, t);
    }
    void delete_event_time_timer(TimestampMs t) override { op_->timers_->delete_event_time_timer(*window, t); }
    void delete_processing_time_timer(TimestampMs t) override {
      op_->timers_->delete_processing_time_timer(*window, t);
    }
    int64_t& counter(const std::string& name) override {
      CounterState& counter = op_->counter_state(name);
      scratch_ = counter.visit([&](auto& st) -> int64_t {
        st.set_current_namespace(*window);
        return st.has_value() ? st.value() : 0;
      });
      pending_ = &counter;
      return scratch_;
    }
    void clear_counter(const std::string& name) override {
      op_->counter_state(name).visit([&](auto& st) {
        st.set_current_namespace(*window);
        st.clear();
      });
    }
    /// Writes back a counter the trigger changed through counter().
    void commit() {
      if (pending_ != nullptr) {
        pending_->visit([&](auto& st) {
          st.set_current_namespace(*window);
          st.update(scratch_);
        });
        pending_ = nullptr;
      }
    }
    const W* window = nullptr;

   private:
    WindowOperator* op_;
    int64_t scratch_ = 0;
    CounterState* pending_ = nullptr;
  };

  class WindowCtx final : public ProcessWindowFunction<Mid, Out, K, W>::Context {
   public:
    explicit WindowCtx(WindowOperator* op) : op_(op) {}
    const W& window() const override { return *window_; }
    TimestampMs current_watermark() const override { return op_->timers_->current_watermark(); }
    TimestampMs current_processing_time() const override { return op_->ctx_->clock().now_ms(); }
    const W* window_ = nullptr;

   protected:
    void* side_output(const std::string& tag_id) override { return op_->side_output(tag_id); }

   private:
    WindowOperator* op_;
  };

  CounterState& counter_state(const std::string& name) {
    auto it = counters_.find(name);
    if (it == counters_.end()) {
      it = counters_.emplace(name, CounterState{}).first;
      it->second.template bind<W>(*store_, ValueStateDescriptor<int64_t>{"trigger-" + name, 0});
    }
    return it->second;
  }

  TriggerResult trigger_on_element(const In& record, TimestampMs ts, const W& w) {
    trigger_ctx_.window = &w;
    TriggerResult r =
        call_user_function(this->name(), [&] { return settings_.trigger->on_element(record, ts, w, trigger_ctx_); });
    trigger_ctx_.commit();
    return r;
  }

  void handle_trigger(TriggerResult r, const W& window, const W& state_window) {
    if (fires(r)) emit_window(window, state_window);
    if (purges(r)) contents_.clear(state_window);
  }

  void emit_window(const W& window, const W& state_window) {
    if (!contents_.get(state_window, mids_)) return;
    window_ctx_.window_ = &window;
    collector_.set_timestamp(window.max_timestamp());
    const K& key = store_->current_key();
    call_user_function(this->name(), [&] { fn_(key, window_ctx_, mids_, collector_); });
  }

  void on_timer(const W& window, TimestampMs t, bool event_time) {
    std::optional<W> state_window = window;
    if (is_merging()) {
      load_merging_set();
      state_window = find_state_window(window);
      if (!state_window) return;  // the window was merged away; its timers are stale
    }
    trigger_ctx_.window = &window;
    TriggerResult r = call_user_function(this->name(), [&] {
      return event_time ? settings_.trigger->on_event_time(t, window, trigger_ctx_)
                        : settings_.trigger->on_processing_time(t, window, trigger_ctx_);
    });
    trigger_ctx_.commit();
    handle_trigger(r, window, *state_window);
    const bool event_time_window = settings_.assigner->is_event_time();
    if (event_time == event_time_window && t == cleanup_time(window)) clear_all_state(window, *state_window);
    if (is_merging()) store_merging_set();
  }

  void clear_all_state(const W& window, const W& state_window) {
    contents_.clear(state_window);
    trigger_ctx_.window = &window;
    settings_.trigger->clear(window, trigger_ctx_);
    for (auto& [name, counter] : counters_) {
      counter.visit([&](auto& st) {
        st.set_current_namespace(window);
        st.clear();
      });
    }
    if (is_merging()) retire_window(window);
  }

  bool is_merging() const {
    if constexpr (kCanMerge) {
      return settings_.assigner->is_merging();
    } else {
      return false;
    }
  }

  TimestampMs cleanup_time(const W& w) const {
    if (!settings_.assigner->is_event_time()) return w.max_timestamp();
    TimestampMs t = w.max_timestamp();
    if (t > std::numeric_limits<int64_t>::max() - settings_.allowed_lateness_ms)
      return std::numeric_limits<int64_t>::max();
    return t + settings_.allowed_lateness_ms;
  }
  bool is_window_late(const W& w) const {
    return settings_.assigner->is_event_time() && cleanup_time(w) <= timers_->current_watermark();
  }
  bool is_element_late(TimestampMs ts) const {
    return settings_.assigner->is_event_time() && ts + settings_.allowed_lateness_ms <= timers_->current_watermark();
  }
  void register_cleanup_timer(const W& w) {
    TimestampMs t = cleanup_time(w);
    if (t == std::numeric_limits<int64_t>::max()) return;  // the global window is never cleaned up
    if (settings_.assigner->is_event_time()) {
      timers_->register_event_time_timer(w, t);
    } else {
      timers_->register_processing_time_timer(w, t);
    }
  }

  // Processing-time timers: keep one task timer armed for the earliest pending one.
  void schedule_processing_time() {
    keyed_.schedule_processing_time([this](const K& key, const W& w, TimestampMs t) {
      keyed_.follow_timer_key(key);
      on_timer(w, t, false);
    });
  }

  // ---- merging windows (Flink's MergingWindowSet): window -> window whose namespace holds its state ----
  void load_merging_set() {
    if constexpr (kCanMerge) {
      mapping_.clear();
      merging_state_.visit([&](auto& st) {
        if (!st.has_value()) return;
        for (const auto& [w, s] : st.value())
          mapping_[w] = s;
      });
    }
  }
  void store_merging_set() {
    if constexpr (kCanMerge) {
      if (mapping_.empty()) {
        merging_state_.visit([](auto& st) { st.clear(); });
        return;
      }
      std::vector<std::pair<W, W>> v(mapping_.begin(), mapping_.end());
      merging_state_.visit([&](auto& st) { st.update(std::move(v)); });
    }
  }
  std::optional<W> find_state_window(const W& w) const {
    auto it = mapping_.find(w);
    if (it == mapping_.end()) return std::nullopt;
    return it->second;
  }
  W state_window_of(const W& w) const { return mapping_.at(w); }
  void retire_window(const W& w) { mapping_.erase(w); }

  W add_to_merging_set(const W& new_window) {
    if constexpr (!kCanMerge) {
      return new_window;
    } else {
      return add_to_merging_set_impl(new_window);
    }
  }

  W add_to_merging_set_impl(const W& new_window) requires kCanMerge {
    std::vector<W> all;
    for (const auto& [w, s] : mapping_)
      all.push_back(w);
    all.push_back(new_window);
    std::sort(all.begin(), all.end(), [](const W& a, const W& b) { return a.start < b.start; });
    // Groups of intersecting windows (TimeWindow.mergeWindows).
    std::vector<std::pair<W, std::vector<W>>> groups;
    for (const W& w : all) {
      if (!groups.empty() && groups.back().first.intersects(w)) {
        groups.back().first = groups.back().first.cover(w);
        groups.back().second.push_back(w);
      } else {
        groups.push_back({w, {w}});
      }
    }
    W result = new_window;
    bool merged_new = false;
    bool any_merge = false;
    for (auto& [merge_result, merged] : groups) {
      if (merged.size() < 2) continue;
      any_merge = true;
      auto pos = std::find(merged.begin(), merged.end(), new_window);
      if (pos != merged.end()) {
        merged.erase(pos);
        merged_new = true;
        result = merge_result;
      }
      const W merged_state_window = mapping_.at(merged.front());
      std::vector<W> merged_state_windows;
      for (const W& m : merged) {
        auto it = mapping_.find(m);
        if (it != mapping_.end()) {
          merged_state_windows.push_back(it->second);
          mapping_.erase(it);
        }
      }
      mapping_[merge_result] = merged_state_window;
      merged_state_windows.erase(
          std::remove(merged_state_windows.begin(), merged_state_windows.end(), merged_state_window),
          merged_state_windows.end());
      if (!(merged.size() == 1 && merged.front() == merge_result)) {
        on_merge(merge_result, merged, merged_state_window, merged_state_windows);
      }
    }
    if (!any_merge || (result == new_window && !merged_new)) mapping_[result] = result;
    return result;
  }

  void on_merge(const W& merge_result, const std::vector<W>& merged_windows, const W& state_window,
                const std::vector<W>& merged_state_windows) {
    if (settings_.assigner->is_event_time() && cleanup_time(merge_result) <= timers_->current_watermark()) {
      throw OperatorException(this->name(), "merging produced a window that ends before the current watermark");
    }
    trigger_ctx_.window = &merge_result;
    settings_.trigger->on_merge(merge_result, trigger_ctx_);
    for (const W& m : merged_windows) {
      trigger_ctx_.window = &m;
      settings_.trigger->clear(m, trigger_ctx_);
      TimestampMs t = cleanup_time(m);
      if (settings_.assigner->is_event_time()) {
        timers_->delete_event_time_timer(m, t);
      } else {
        timers_->delete_processing_time_timer(m, t);
      }
    }
    contents_.merge(state_window, merged_state_windows);
  }

  Sel selector_;
  Contents contents_;
  WindowFn fn_;
  Settings settings_;
  KeyedContextHolder<K, W> keyed_;                // owns backend and timers; restores and captures them
  KeyedStateStore<K>* store_ = nullptr;           // keyed_.store(), cached
  InternalTimerService<K, W>* timers_ = nullptr;  // keyed_.timers(), cached
  detail::EitherState<HeapValueState<K, VoidNamespace, std::vector<std::pair<W, W>>>,
                      RocksDBValueState<K, VoidNamespace, std::vector<std::pair<W, W>>>>
      merging_state_;
  std::map<W, W> mapping_;
  std::map<std::string, CounterState> counters_;  // map nodes are stable: TriggerCtx keeps a pointer
  std::vector<W> windows_;
  std::vector<Mid> mids_;
  TriggerCtx trigger_ctx_;
  WindowCtx window_ctx_;
  detail::TimestampedCollector<Out> collector_;
  uint64_t late_records_dropped_ = 0;
};

}  // namespace sluice
