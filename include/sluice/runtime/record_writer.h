// RecordWriter: writes serialized stream elements into the channels of one result partition (one producer
// subtask's share of a job edge), packing many records per network buffer and blocking on missing credit.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "sluice/graph/exchange.h"
#include "sluice/runtime/channel.h"
#include "sluice/runtime/checkpoint_barrier.h"

namespace sluice {

/// Blocks a task until credit returns (implemented by Task: waits on its wakeup signal and throws
/// TaskCancelledException when the task is cancelled meanwhile).
class CreditWaiter {
 public:
  virtual ~CreditWaiter() = default;
  /// Forgets earlier wakeups; the writer checks for credit once more after this and before waiting.
  virtual void prepare_wait_for_credit() = 0;
  /// Waits until notified or a short deadline; throws when the task was cancelled.
  virtual void wait_for_credit() = 0;
};

/// Task-thread only.
class RecordWriter final : public RecordWriterBase {
 public:
  RecordWriter(std::vector<ChannelSender*> channels, CreditWaiter& waiter);

  int num_channels() const override { return static_cast<int>(channels_.size()); }
  void write_record(int channel, std::span<const uint8_t> bytes, TimestampMs timestamp) override;
  void broadcast_record(std::span<const uint8_t> bytes, TimestampMs timestamp) override;
  void broadcast_watermark(TimestampMs watermark) override;
  void broadcast_watermark_status(bool idle) override;

  /// Appends a checkpoint barrier to every channel and sends the buffers at once, so the barrier is not held
  /// back by the buffer timeout (Flink sends barriers as events that flush the partition).
  void broadcast_barrier(const CheckpointBarrier& barrier);
  /// Sends every partly filled buffer (on idle and on the buffer timeout).
  void flush_all();
  /// Appends end-of-partition to every channel and sends everything. Idempotent.
  void finish();
  /// True once finish() ran: nothing more may be written.
  bool finished() const { return finished_; }
  /// Buffers filled and sent so far.
  uint64_t buffers_sent() const { return buffers_sent_; }
  /// Bytes of the buffers sent so far (Flink's numBytesOut counts the same: serialized bytes handed to the
  /// network, headers of stream elements included). Task-thread only.
  uint64_t bytes_sent() const { return bytes_sent_; }
  /// The last watermark broadcast (INT64_MIN before the first). Task-thread only.
  TimestampMs last_watermark() const { return last_watermark_; }
  /// True when some channel holds a partly filled buffer.
  bool has_unflushed_data() const { return unflushed_ > 0; }

 private:
  NetworkBuffer* buffer_for(int channel, uint32_t min_space);
  void send_current(int channel);

  std::vector<ChannelSender*> channels_;
  std::vector<NetworkBuffer*> current_;
  CreditWaiter& waiter_;
  uint64_t buffers_sent_ = 0;
  uint64_t bytes_sent_ = 0;
  TimestampMs last_watermark_ = std::numeric_limits<int64_t>::min();
  int unflushed_ = 0;
  bool finished_ = false;
};

}  // namespace sluice
