// Change events a CDC integration test's job delivers, for the test thread to wait on and inspect:
// ReceivedEvents (thread-safe) and receiving_sink(), a sink whose writers append to it; CallbackSink for a sink
// that calls a function per record.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "sluice/api/sink.h"
#include "sluice/connectors/cdc/change_event.h"

namespace sluice::testing {

/// A sink whose writers call `f` for every record (from the task threads: `f` must be thread-safe).
template <class T>
class CallbackSink final : public Sink<T> {
 public:
  explicit CallbackSink(std::function<void(const T&)> f) : f_(std::move(f)) {}
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext&) const override { return std::make_unique<Writer>(f_); }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    explicit Writer(std::function<void(const T&)> f) : f_(std::move(f)) {}
    void write(const T& r, const SinkWriterContext&) override { f_(r); }
    void flush(bool) override {}

   private:
    std::function<void(const T&)> f_;
  };
  std::function<void(const T&)> f_;
};

/// The events a sink received, in arrival order. Thread-safe: the sink's writers add, the test waits and reads.
class ReceivedEvents {
 public:
  /// `deadline`: how long the waits below wait when not told.
  explicit ReceivedEvents(std::chrono::milliseconds deadline = std::chrono::seconds(60)) : deadline_(deadline) {}

  void add(const cdc::ChangeEvent& e) {
    std::lock_guard lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  /// Waits until `pred(events)` holds (checked at every new event and at least every 100 ms, so a predicate may
  /// also look at something outside); true when it held before the deadline.
  bool wait_until(const std::function<bool(const std::vector<cdc::ChangeEvent>&)>& pred) {
    return wait_until(pred, deadline_);
  }
  bool wait_until(const std::function<bool(const std::vector<cdc::ChangeEvent>&)>& pred,
                  std::chrono::milliseconds deadline) {
    std::unique_lock lock(mu_);
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!pred(events_)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= end) return false;
      cv_.wait_until(lock, std::min(end, now + std::chrono::milliseconds(100)));
    }
    return true;
  }
  /// Waits until `n` events arrived.
  bool wait_for(size_t n) { return wait_for(n, deadline_); }
  bool wait_for(size_t n, std::chrono::milliseconds deadline) {
    return wait_until([n](const std::vector<cdc::ChangeEvent>& e) { return e.size() >= n; }, deadline);
  }
  std::vector<cdc::ChangeEvent> all() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return events_.size();
  }

 private:
  const std::chrono::milliseconds deadline_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<cdc::ChangeEvent> events_;
};

/// A sink that appends every event to `out`.
inline std::shared_ptr<Sink<cdc::ChangeEvent>> receiving_sink(std::shared_ptr<ReceivedEvents> out) {
  return std::make_shared<CallbackSink<cdc::ChangeEvent>>([out](const cdc::ChangeEvent& e) { out->add(e); });
}

}  // namespace sluice::testing
