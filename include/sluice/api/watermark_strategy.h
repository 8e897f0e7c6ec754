// WatermarkStrategy: how records get event timestamps and how watermarks are generated (Flink's
// WatermarkStrategy / WatermarkGenerator, "Generating Watermarks" in Flink's docs).
//
// A strategy is applied per source split inside a source (`from_source(source, strategy, name)`), or after any
// operator (`assign_timestamps_and_watermarks`). Generators get every event (on_event) and are asked
// periodically (on_periodic_emit, every `pipeline.auto-watermark-interval`, 200 ms of processing time by default)
// to emit a watermark. Generators run on the task thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <utility>

#include "sluice/api/functions.h"

namespace sluice {

/// Where a generator emits watermarks and idleness.
class WatermarkOutput {
 public:
  virtual ~WatermarkOutput() = default;
  /// Emits a watermark (ms since epoch); lower or equal watermarks than the last one are ignored.
  virtual void emit_watermark(TimestampMs watermark) = 0;
  /// Declares this output idle: it no longer holds back the watermark downstream.
  virtual void mark_idle() = 0;
  /// Declares this output active again (also implied by emit_watermark).
  virtual void mark_active() = 0;
};

/// Generates watermarks from events and/or periodically.
template <class T>
class WatermarkGenerator {
 public:
  virtual ~WatermarkGenerator() = default;
  virtual void on_event(const T& event, TimestampMs timestamp, WatermarkOutput& output) = 0;
  virtual void on_periodic_emit(WatermarkOutput& output) = 0;
};

/// Watermark = highest timestamp seen - max out-of-orderness - 1 (Flink's BoundedOutOfOrdernessWatermarks).
template <class T>
class BoundedOutOfOrdernessWatermarks final : public WatermarkGenerator<T> {
 public:
  explicit BoundedOutOfOrdernessWatermarks(int64_t max_out_of_orderness_ms)
      : delay_(max_out_of_orderness_ms), max_ts_(std::numeric_limits<int64_t>::min() + max_out_of_orderness_ms + 1) {}
  void on_event(const T&, TimestampMs ts, WatermarkOutput&) override { max_ts_ = std::max(max_ts_, ts); }
  void on_periodic_emit(WatermarkOutput& out) override { out.emit_watermark(max_ts_ - delay_ - 1); }

 private:
  int64_t delay_;
  TimestampMs max_ts_;
};

/// Emits no watermarks (for streams without event time).
template <class T>
class NoWatermarksGenerator final : public WatermarkGenerator<T> {
 public:
  void on_event(const T&, TimestampMs, WatermarkOutput&) override {}
  void on_periodic_emit(WatermarkOutput&) override {}
};

// GCC 12 warns of infinite recursion in the forwarding calls below (it speculates that inner_ may be this
// object); inner_ is always another generator.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winfinite-recursion"
/// Marks the output idle when no event arrived for `idle_timeout_ms` of processing time (Flink's
/// WatermarksWithIdleness); the clock is the task's (injectable).
template <class T>
class WatermarksWithIdleness final : public WatermarkGenerator<T> {
 public:
  WatermarksWithIdleness(std::unique_ptr<WatermarkGenerator<T>> inner, int64_t idle_timeout_ms, const Clock& clock)
      : inner_(std::move(inner)), timeout_(idle_timeout_ms), clock_(clock), last_activity_(clock.now_ms()) {}
  void on_event(const T& e, TimestampMs ts, WatermarkOutput& out) override {
    last_activity_ = clock_.now_ms();
    if (idle_) {
      idle_ = false;
      out.mark_active();
    }
    inner_->on_event(e, ts, out);
  }
  void on_periodic_emit(WatermarkOutput& out) override {
    if (!idle_ && clock_.now_ms() - last_activity_ >= timeout_) {
      idle_ = true;
      out.mark_idle();
    }
    if (!idle_) inner_->on_periodic_emit(out);
  }

 private:
  std::unique_ptr<WatermarkGenerator<T>> inner_;
  int64_t timeout_;
  const Clock& clock_;
  TimestampMs last_activity_;
  bool idle_ = false;
};
#pragma GCC diagnostic pop

/// A recipe for timestamp assignment and watermark generation. Copyable; immutable once built.
template <class T>
class WatermarkStrategy {
 public:
  using GeneratorFactory = std::function<std::unique_ptr<WatermarkGenerator<T>>()>;
  /// (record, timestamp the source attached or kNoTimestamp) -> event timestamp in ms since epoch.
  using TimestampAssigner = std::function<TimestampMs(const T&, TimestampMs)>;

  /// Watermarks trail the highest timestamp by `max_out_of_orderness`.
  static WatermarkStrategy for_bounded_out_of_orderness(std::chrono::milliseconds max_out_of_orderness) {
    int64_t d = max_out_of_orderness.count();
    return WatermarkStrategy([d] { return std::make_unique<BoundedOutOfOrdernessWatermarks<T>>(d); });
  }
  /// Timestamps never decrease: the watermark is the highest timestamp seen minus one.
  static WatermarkStrategy for_monotonous_timestamps() {
    return for_bounded_out_of_orderness(std::chrono::milliseconds(0));
  }
  /// No watermarks at all.
  static WatermarkStrategy no_watermarks() {
    return WatermarkStrategy([] { return std::make_unique<NoWatermarksGenerator<T>>(); });
  }
  /// A custom generator.
  static WatermarkStrategy for_generator(GeneratorFactory factory) { return WatermarkStrategy(std::move(factory)); }

  /// Takes event timestamps from records: `assigner(const T&) -> ms` or `assigner(const T&, TimestampMs)`.
  template <class F>
  WatermarkStrategy with_timestamp_assigner(F assigner) const {
    WatermarkStrategy s = *this;
    if constexpr (std::is_invocable_v<F&, const T&, TimestampMs>) {
      s.assigner_ = std::move(assigner);
    } else {
      s.assigner_ = [a = std::move(assigner)](const T& r, TimestampMs) mutable { return a(r); };
    }
    return s;
  }
  /// Marks a split/input idle after `timeout` without events, so it does not hold back the watermark.
  WatermarkStrategy with_idleness(std::chrono::milliseconds timeout) const {
    WatermarkStrategy s = *this;
    s.idle_timeout_ms_ = timeout.count();
    return s;
  }

  /// A new generator (idleness applied) for one split or one subtask.
  std::unique_ptr<WatermarkGenerator<T>> create_generator(const Clock& clock) const {
    auto g = factory_();
    if (idle_timeout_ms_ > 0) return std::make_unique<WatermarksWithIdleness<T>>(std::move(g), idle_timeout_ms_, clock);
    return g;
  }
  /// The event timestamp of `record` given the timestamp it came with.
  TimestampMs timestamp_of(const T& record, TimestampMs attached) const {
    return assigner_ ? assigner_(record, attached) : attached;
  }
  bool has_timestamp_assigner() const { return static_cast<bool>(assigner_); }

 private:
  explicit WatermarkStrategy(GeneratorFactory f) : factory_(std::move(f)) {}
  GeneratorFactory factory_;
  TimestampAssigner assigner_;
  int64_t idle_timeout_ms_ = 0;
};

}  // namespace sluice
