// Test sinks: CollectSink keeps every record per subtask in arrival order; GatedSink blocks until the test
// opens its gate, to hold back a pipeline deterministically.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "sluice/api/sink.h"

namespace sluice::testing {

/// Records received, per subtask, in arrival order. Thread-safe.
template <class T>
class CollectedRecords {
 public:
  void add(int subtask, const T& r) {
    std::lock_guard lock(mu_);
    if (per_subtask_.size() <= static_cast<size_t>(subtask)) per_subtask_.resize(static_cast<size_t>(subtask) + 1);
    per_subtask_[static_cast<size_t>(subtask)].push_back(r);
  }
  std::vector<std::vector<T>> per_subtask() const {
    std::lock_guard lock(mu_);
    return per_subtask_;
  }
  std::vector<T> all() const {
    std::lock_guard lock(mu_);
    std::vector<T> out;
    for (const auto& v : per_subtask_)
      out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto& v : per_subtask_)
      n += v.size();
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<T>> per_subtask_;
};

template <class T>
class CollectSink final : public Sink<T> {
 public:
  explicit CollectSink(std::shared_ptr<CollectedRecords<T>> out) : out_(std::move(out)) {}
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    return std::make_unique<Writer>(out_, ctx.subtask_index());
  }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    Writer(std::shared_ptr<CollectedRecords<T>> out, int subtask) : out_(std::move(out)), subtask_(subtask) {}
    void write(const T& r, const SinkWriterContext&) override { out_->add(subtask_, r); }
    void flush(bool) override {}

   private:
    std::shared_ptr<CollectedRecords<T>> out_;
    int subtask_;
  };
  std::shared_ptr<CollectedRecords<T>> out_;
};

/// A gate the test opens to let a sink proceed: write() blocks while the gate has no permits.
class Gate {
 public:
  void open_fully() {
    std::lock_guard lock(mu_);
    unlimited_ = true;
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return unlimited_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool unlimited_ = false;
};

template <class T>
class GatedSink final : public Sink<T> {
 public:
  GatedSink(std::shared_ptr<Gate> gate, std::shared_ptr<CollectedRecords<T>> out)
      : gate_(std::move(gate)), out_(std::move(out)) {}
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    return std::make_unique<Writer>(gate_, out_, ctx.subtask_index());
  }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    Writer(std::shared_ptr<Gate> g, std::shared_ptr<CollectedRecords<T>> out, int subtask)
        : gate_(std::move(g)), out_(std::move(out)), subtask_(subtask) {}
    void write(const T& r, const SinkWriterContext&) override {
      gate_->pass();
      out_->add(subtask_, r);
    }
    void flush(bool) override {}

   private:
    std::shared_ptr<Gate> gate_;
    std::shared_ptr<CollectedRecords<T>> out_;
    int subtask_;
  };
  std::shared_ptr<Gate> gate_;
  std::shared_ptr<CollectedRecords<T>> out_;
};

/// Waits until `pred` holds or `timeout` passes; returns pred(). Polls, so tests never sleep blindly.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::yield();
  }
  return true;
}

}  // namespace sluice::testing
