// StreamInputProcessor: reads the buffers of a task's input channels (its input gate), parses the stream
// elements, reassembles records that span buffers, keeps the watermark valve (the task's watermark is the
// minimum over its channels that have not finished, DESIGN.md §1) and feeds the RecordInput.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/graph/exchange.h"
#include "sluice/runtime/barrier_handler.h"
#include "sluice/runtime/channel.h"

namespace sluice {

/// Task-thread only.
class StreamInputProcessor {
 public:
  enum class Status { kProcessed, kNothingAvailable, kEndOfInput };

  /// `barriers` (nullable) receives barriers and end-of-partition; this input's channels are numbered from
  /// `channel_offset` in it. A channel the handler blocks is not read; a buffer in which a barrier blocked its
  /// channel is kept and resumed after the barrier's position once the channel is unblocked.
  StreamInputProcessor(std::vector<ChannelReceiver*> channels, RecordInput& input,
                       CheckpointBarrierHandler* barriers = nullptr, size_t channel_offset = 0);
  ~StreamInputProcessor();
  /// Connects the task's barrier handler (before the first process_next()).
  void set_barrier_handler(CheckpointBarrierHandler* barriers, size_t channel_offset) {
    barriers_ = barriers;
    offset_ = channel_offset;
  }
  size_t num_channels() const { return channels_.size(); }
  StreamInputProcessor(const StreamInputProcessor&) = delete;
  StreamInputProcessor& operator=(const StreamInputProcessor&) = delete;

  /// Processes the elements of one available buffer (round robin over channels that are not blocked).
  Status process_next();
  /// Bytes of the buffers taken from the channels so far (Flink's numBytesIn). Task-thread only.
  uint64_t bytes_received() const { return bytes_received_; }
  /// The combined watermark of this input (INT64_MIN before the first). Task-thread only.
  TimestampMs combined_watermark() const { return combined_watermark_; }
  /// True once every channel delivered end-of-partition.
  bool finished() const { return finished_channels_ == channels_.size(); }

 private:
  struct ChannelState {
    bool finished = false;
    bool idle = false;
    // An active channel counts towards the combined watermark only once its watermark reached it (Flink's
    // StatusWatermarkValve "aligned" channels), so a channel waking from idleness cannot move it back.
    bool aligned = true;
    TimestampMs watermark = std::numeric_limits<int64_t>::min();
    // A record whose payload spans buffers: bytes gathered so far, bytes still missing, its timestamp.
    std::vector<uint8_t> partial;
    uint32_t missing = 0;
    TimestampMs partial_ts = 0;
    // A buffer whose processing stopped at a barrier that blocked the channel, and where to resume.
    NetworkBuffer* held = nullptr;
    uint32_t held_pos = 0;
  };
  /// Processes `buffer` from `pos`; returns false when it stopped at a blocking barrier (pos is then where
  /// to resume).
  bool process_buffer(size_t channel, const NetworkBuffer& buffer, uint32_t& pos);
  bool blocked(size_t channel) const { return barriers_ != nullptr && barriers_->is_blocked(offset_ + channel); }
  void on_watermark(size_t channel, TimestampMs wm);
  void on_end_of_partition(size_t channel);
  void update_combined_watermark();
  void on_watermark_status(size_t channel, bool idle);

  std::vector<ChannelReceiver*> channels_;
  std::vector<ChannelState> state_;
  RecordInput& input_;
  CheckpointBarrierHandler* barriers_;
  size_t offset_;
  size_t next_ = 0;
  size_t finished_channels_ = 0;
  TimestampMs combined_watermark_ = std::numeric_limits<int64_t>::min();
  bool input_idle_ = false;
  uint64_t bytes_received_ = 0;
};

}  // namespace sluice
