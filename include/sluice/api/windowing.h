// Windows, window assigners and triggers (Flink's windowing model, "Windows" in Flink's docs).
//
// An assigner maps a record to the windows it belongs to; a trigger decides when a window's contents are
// evaluated (FIRE) and/or dropped (PURGE). Event-time windows fire when the watermark passes their end;
// processing-time windows when the task's clock does. Windows are values with a TypeSerializer: they are the
// namespace of the window contents in keyed state and are checkpointed with it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/functions.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// The window [start, end) in ms since epoch. Its last timestamp is end - 1.
struct TimeWindow {
  TimestampMs start = 0;
  TimestampMs end = 0;
  TimestampMs max_timestamp() const { return end - 1; }
  bool intersects(const TimeWindow& o) const { return start <= o.end && end >= o.start; }
  TimeWindow cover(const TimeWindow& o) const { return {std::min(start, o.start), std::max(end, o.end)}; }
  friend bool operator==(const TimeWindow&, const TimeWindow&) = default;
  friend auto operator<=>(const TimeWindow&, const TimeWindow&) = default;
  /// abseil hashing: windows are namespaces of window state and timers, looked up per element (in memory
  /// only; nothing persisted depends on this hash).
  template <class H>
  friend H AbslHashValue(H h, const TimeWindow& w) {
    return H::combine(std::move(h), w.start, w.end);
  }
  /// The start of the window of `size` (shifted by `offset`) that contains `ts` (Flink's getWindowStartWithOffset).
  static TimestampMs window_start(TimestampMs ts, int64_t offset, int64_t size) {
    int64_t rem = (ts - offset) % size;
    if (rem < 0) rem += size;
    return ts - rem;
  }
};
SLUICE_FIELDS(TimeWindow, start, end);

/// The single window of GlobalWindows: everything, forever (fires only through a custom or count trigger).
struct GlobalWindow {
  TimestampMs max_timestamp() const { return kMaxWatermark; }
  friend bool operator==(const GlobalWindow&, const GlobalWindow&) = default;
  friend auto operator<=>(const GlobalWindow&, const GlobalWindow&) = default;
  template <class H>
  friend H AbslHashValue(H h, const GlobalWindow&) {
    return h;
  }
};
template <>
struct TypeSerializer<GlobalWindow> {
  static void serialize(const GlobalWindow&, DataOutput&) {}
  static void deserialize(GlobalWindow&, DataInput&) {}
  static constexpr size_t min_encoded_size() { return 0; }
};

/// What a trigger decides for a window.
enum class TriggerResult { kContinue, kFire, kPurge, kFireAndPurge };
inline bool fires(TriggerResult r) {
  return r == TriggerResult::kFire || r == TriggerResult::kFireAndPurge;
}
inline bool purges(TriggerResult r) {
  return r == TriggerResult::kPurge || r == TriggerResult::kFireAndPurge;
}

/// What a trigger may do: timers for the current key and window, the current watermark, and a per-window
/// counter in keyed state (enough for count triggers).
template <class W>
class TriggerContext {
 public:
  virtual ~TriggerContext() = default;
  virtual TimestampMs current_watermark() const = 0;
  virtual TimestampMs current_processing_time() const = 0;
  virtual void register_event_time_timer(TimestampMs time) = 0;
  virtual void register_processing_time_timer(TimestampMs time) = 0;
  virtual void delete_event_time_timer(TimestampMs time) = 0;
  virtual void delete_processing_time_timer(TimestampMs time) = 0;
  /// A counter kept per key and window in keyed state under `name` (checkpointed).
  virtual int64_t& counter(const std::string& name) = 0;
  virtual void clear_counter(const std::string& name) = 0;
};

/// Decides when windows fire. One instance serves all keys and windows of a subtask: keep per-window state in
/// the context, not in members.
template <class T, class W>
class Trigger {
 public:
  virtual ~Trigger() = default;
  virtual TriggerResult on_element(const T& element, TimestampMs timestamp, const W& window,
                                   TriggerContext<W>& ctx) = 0;
  virtual TriggerResult on_event_time(TimestampMs time, const W& window, TriggerContext<W>& ctx) = 0;
  virtual TriggerResult on_processing_time(TimestampMs time, const W& window, TriggerContext<W>& ctx) = 0;
  /// Merging windows only: `window` replaced merged windows; re-register what the trigger needs.
  virtual void on_merge(const W& /*window*/, TriggerContext<W>& /*ctx*/) {}
  virtual bool can_merge() const { return false; }
  /// The window is gone: delete its timers and state.
  virtual void clear(const W& window, TriggerContext<W>& ctx) = 0;
};

/// Fires when the watermark passes the window's end; late elements within allowed lateness fire at once.
template <class T, class W>
class EventTimeTrigger final : public Trigger<T, W> {
 public:
  TriggerResult on_element(const T&, TimestampMs, const W& w, TriggerContext<W>& ctx) override {
    if (w.max_timestamp() <= ctx.current_watermark()) return TriggerResult::kFire;  // a late firing
    ctx.register_event_time_timer(w.max_timestamp());
    return TriggerResult::kContinue;
  }
  TriggerResult on_event_time(TimestampMs time, const W& w, TriggerContext<W>&) override {
    return time == w.max_timestamp() ? TriggerResult::kFire : TriggerResult::kContinue;
  }
  TriggerResult on_processing_time(TimestampMs, const W&, TriggerContext<W>&) override {
    return TriggerResult::kContinue;
  }
  bool can_merge() const override { return true; }
  void on_merge(const W& w, TriggerContext<W>& ctx) override {
    if (w.max_timestamp() > ctx.current_watermark()) ctx.register_event_time_timer(w.max_timestamp());
  }
  void clear(const W& w, TriggerContext<W>& ctx) override { ctx.delete_event_time_timer(w.max_timestamp()); }
};

/// Fires when the task's clock passes the window's end.
template <class T, class W>
class ProcessingTimeTrigger final : public Trigger<T, W> {
 public:
  TriggerResult on_element(const T&, TimestampMs, const W& w, TriggerContext<W>& ctx) override {
    ctx.register_processing_time_timer(w.max_timestamp());
    return TriggerResult::kContinue;
  }
  TriggerResult on_event_time(TimestampMs, const W&, TriggerContext<W>&) override { return TriggerResult::kContinue; }
  TriggerResult on_processing_time(TimestampMs, const W&, TriggerContext<W>&) override { return TriggerResult::kFire; }
  bool can_merge() const override { return true; }
  void on_merge(const W& w, TriggerContext<W>& ctx) override {
    if (w.max_timestamp() > ctx.current_processing_time()) ctx.register_processing_time_timer(w.max_timestamp());
  }
  void clear(const W& w, TriggerContext<W>& ctx) override { ctx.delete_processing_time_timer(w.max_timestamp()); }
};

/// Fires (and keeps the contents) every `count` elements of a window (Flink's CountTrigger).
template <class T, class W>
class CountTrigger final : public Trigger<T, W> {
 public:
  explicit CountTrigger(int64_t count) : count_(count) {}
  static std::shared_ptr<CountTrigger> of(int64_t count) { return std::make_shared<CountTrigger>(count); }
  TriggerResult on_element(const T&, TimestampMs, const W&, TriggerContext<W>& ctx) override {
    int64_t& c = ctx.counter("count");
    if (++c >= count_) {
      c = 0;
      return TriggerResult::kFire;
    }
    return TriggerResult::kContinue;
  }
  TriggerResult on_event_time(TimestampMs, const W&, TriggerContext<W>&) override { return TriggerResult::kContinue; }
  TriggerResult on_processing_time(TimestampMs, const W&, TriggerContext<W>&) override {
    return TriggerResult::kContinue;
  }
  void clear(const W&, TriggerContext<W>& ctx) override { ctx.clear_counter("count"); }

 private:
  int64_t count_;
};

/// Turns FIRE into FIRE_AND_PURGE (Flink's PurgingTrigger).
template <class T, class W>
class PurgingTrigger final : public Trigger<T, W> {
 public:
  explicit PurgingTrigger(std::shared_ptr<Trigger<T, W>> inner) : inner_(std::move(inner)) {}
  static std::shared_ptr<PurgingTrigger> of(std::shared_ptr<Trigger<T, W>> inner) {
    return std::make_shared<PurgingTrigger>(std::move(inner));
  }
  TriggerResult on_element(const T& e, TimestampMs ts, const W& w, TriggerContext<W>& ctx) override {
    return purge(inner_->on_element(e, ts, w, ctx));
  }
  TriggerResult on_event_time(TimestampMs t, const W& w, TriggerContext<W>& ctx) override {
    return purge(inner_->on_event_time(t, w, ctx));
  }
  TriggerResult on_processing_time(TimestampMs t, const W& w, TriggerContext<W>& ctx) override {
    return purge(inner_->on_processing_time(t, w, ctx));
  }
  bool can_merge() const override { return inner_->can_merge(); }
  void on_merge(const W& w, TriggerContext<W>& ctx) override { inner_->on_merge(w, ctx); }
  void clear(const W& w, TriggerContext<W>& ctx) override { inner_->clear(w, ctx); }

 private:
  static TriggerResult purge(TriggerResult r) { return fires(r) ? TriggerResult::kFireAndPurge : r; }
  std::shared_ptr<Trigger<T, W>> inner_;
};

/// Never fires (the default of GlobalWindows: give it a trigger).
template <class T, class W>
class NeverTrigger final : public Trigger<T, W> {
 public:
  TriggerResult on_element(const T&, TimestampMs, const W&, TriggerContext<W>&) override {
    return TriggerResult::kContinue;
  }
  TriggerResult on_event_time(TimestampMs, const W&, TriggerContext<W>&) override { return TriggerResult::kContinue; }
  TriggerResult on_processing_time(TimestampMs, const W&, TriggerContext<W>&) override {
    return TriggerResult::kContinue;
  }
  void clear(const W&, TriggerContext<W>&) override {}
};

/// Assigns records to windows. Stateless and shared by all subtasks.
template <class W>
class WindowAssigner {
 public:
  using WindowType = W;
  virtual ~WindowAssigner() = default;
  /// The windows of a record with event timestamp `timestamp` (or the current processing time `now` for
  /// processing-time assigners).
  virtual void assign_windows(TimestampMs timestamp, TimestampMs now, std::vector<W>& out) const = 0;
  virtual bool is_event_time() const = 0;
  /// Session windows merge overlapping windows of the same key.
  virtual bool is_merging() const { return false; }
  /// The default trigger for this assigner (event-time or processing-time end-of-window).
  template <class T>
  std::shared_ptr<Trigger<T, W>> default_trigger() const;
};

/// Fixed-size, non-overlapping windows.
class TumblingWindows final : public WindowAssigner<TimeWindow> {
 public:
  TumblingWindows(int64_t size_ms, int64_t offset_ms, bool event_time)
      : size_(size_ms), offset_(offset_ms), event_time_(event_time) {}
  void assign_windows(TimestampMs ts, TimestampMs now, std::vector<TimeWindow>& out) const override {
    TimestampMs t = event_time_ ? ts : now;
    TimestampMs start = TimeWindow::window_start(t, offset_, size_);
    out.push_back({start, start + size_});
  }
  bool is_event_time() const override { return event_time_; }

 private:
  int64_t size_, offset_;
  bool event_time_;
};

/// Fixed-size windows every `slide`: a record belongs to size / slide windows.
class SlidingWindows final : public WindowAssigner<TimeWindow> {
 public:
  SlidingWindows(int64_t size_ms, int64_t slide_ms, int64_t offset_ms, bool event_time)
      : size_(size_ms), slide_(slide_ms), offset_(offset_ms), event_time_(event_time) {}
  void assign_windows(TimestampMs ts, TimestampMs now, std::vector<TimeWindow>& out) const override {
    TimestampMs t = event_time_ ? ts : now;
    TimestampMs last_start = TimeWindow::window_start(t, offset_, slide_);
    for (TimestampMs start = last_start; start > t - size_; start -= slide_)
      out.push_back({start, start + size_});
  }
  bool is_event_time() const override { return event_time_; }

 private:
  int64_t size_, slide_, offset_;
  bool event_time_;
};

/// Windows that close after a gap of inactivity per key; overlapping sessions merge.
class SessionWindows final : public WindowAssigner<TimeWindow> {
 public:
  SessionWindows(int64_t gap_ms, bool event_time) : gap_(gap_ms), event_time_(event_time) {}
  void assign_windows(TimestampMs ts, TimestampMs now, std::vector<TimeWindow>& out) const override {
    TimestampMs t = event_time_ ? ts : now;
    out.push_back({t, t + gap_});
  }
  bool is_event_time() const override { return event_time_; }
  bool is_merging() const override { return true; }

 private:
  int64_t gap_;
  bool event_time_;
};

/// One window for all records (give it a trigger, e.g. CountTrigger).
class GlobalWindows final : public WindowAssigner<GlobalWindow> {
 public:
  static std::shared_ptr<GlobalWindows> create() { return std::make_shared<GlobalWindows>(); }
  void assign_windows(TimestampMs, TimestampMs, std::vector<GlobalWindow>& out) const override { out.push_back({}); }
  bool is_event_time() const override { return false; }
};

template <class W>
template <class T>
std::shared_ptr<Trigger<T, W>> WindowAssigner<W>::default_trigger() const {
  if constexpr (std::is_same_v<W, GlobalWindow>) {
    return std::make_shared<NeverTrigger<T, W>>();
  } else {
    if (is_event_time()) return std::make_shared<EventTimeTrigger<T, W>>();
    return std::make_shared<ProcessingTimeTrigger<T, W>>();
  }
}

namespace detail {
inline int64_t ms(std::chrono::milliseconds d) {
  return d.count();
}
}  // namespace detail

/// Factories named as in Flink.
struct TumblingEventTimeWindows {
  static std::shared_ptr<TumblingWindows> of(std::chrono::milliseconds size,
                                             std::chrono::milliseconds offset = std::chrono::milliseconds(0)) {
    return std::make_shared<TumblingWindows>(detail::ms(size), detail::ms(offset), true);
  }
};
struct TumblingProcessingTimeWindows {
  static std::shared_ptr<TumblingWindows> of(std::chrono::milliseconds size,
                                             std::chrono::milliseconds offset = std::chrono::milliseconds(0)) {
    return std::make_shared<TumblingWindows>(detail::ms(size), detail::ms(offset), false);
  }
};
struct SlidingEventTimeWindows {
  static std::shared_ptr<SlidingWindows> of(std::chrono::milliseconds size, std::chrono::milliseconds slide,
                                            std::chrono::milliseconds offset = std::chrono::milliseconds(0)) {
    return std::make_shared<SlidingWindows>(detail::ms(size), detail::ms(slide), detail::ms(offset), true);
  }
};
struct SlidingProcessingTimeWindows {
  static std::shared_ptr<SlidingWindows> of(std::chrono::milliseconds size, std::chrono::milliseconds slide,
                                            std::chrono::milliseconds offset = std::chrono::milliseconds(0)) {
    return std::make_shared<SlidingWindows>(detail::ms(size), detail::ms(slide), detail::ms(offset), false);
  }
};
struct EventTimeSessionWindows {
  static std::shared_ptr<SessionWindows> with_gap(std::chrono::milliseconds gap) {
    return std::make_shared<SessionWindows>(detail::ms(gap), true);
  }
};
struct ProcessingTimeSessionWindows {
  static std::shared_ptr<SessionWindows> with_gap(std::chrono::milliseconds gap) {
    return std::make_shared<SessionWindows>(detail::ms(gap), false);
  }
};

}  // namespace sluice
