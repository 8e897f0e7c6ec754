// Helpers the runtime's unit tests share: a RecordInput that keeps what it receives, and a CreditWaiter on a
// WakeupSignal (what Task does, without a task).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "sluice/graph/exchange.h"
#include "sluice/runtime/record_writer.h"
#include "sluice/runtime/wakeup.h"

namespace sluice::testing {

/// Keeps every record (its bytes as a string), watermark and idleness change, in arrival order.
class CollectingInput final : public RecordInput {
 public:
  struct Record {
    std::string bytes;
    TimestampMs timestamp;
  };
  void process_record(DataInput& in, TimestampMs timestamp) override {
    records.push_back({std::string(in.read_view(in.remaining())), timestamp});
  }
  void process_watermark(TimestampMs watermark) override { watermarks.push_back(watermark); }
  void process_watermark_status(bool idle) override { idleness.push_back(idle); }

  std::vector<std::string> payloads() const {
    std::vector<std::string> out;
    for (const auto& r : records)
      out.push_back(r.bytes);
    return out;
  }

  std::vector<Record> records;
  std::vector<TimestampMs> watermarks;
  std::vector<bool> idleness;
};

/// Waits for credit on a WakeupSignal set as the channels' sender wakeup, in slices of `slice`.
class SignalCreditWaiter final : public CreditWaiter {
 public:
  explicit SignalCreditWaiter(WakeupSignal& signal, std::chrono::milliseconds slice = std::chrono::milliseconds(50))
      : signal_(signal), slice_(slice) {}
  void prepare_wait_for_credit() override { signal_.clear(); }
  void wait_for_credit() override {
    waits.fetch_add(1, std::memory_order_relaxed);
    signal_.wait_until(std::chrono::steady_clock::now() + slice_);
  }
  /// How often the writer had to wait for credit (read from any thread).
  std::atomic<int> waits{0};

 private:
  WakeupSignal& signal_;
  std::chrono::milliseconds slice_;
};

inline std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace sluice::testing
