#include "sluice/runtime/input_processor.h"

#include <cstring>
#include <string>

#include "sluice/runtime/stream_element.h"

namespace sluice {
namespace {

[[noreturn]] void corrupt(size_t channel, const std::string& what) {
  throw SluiceException(
      Error(ErrorCode::kNetwork, "corrupt network buffer on input channel " + std::to_string(channel) + ": " + what));
}

}  // namespace

StreamInputProcessor::StreamInputProcessor(std::vector<ChannelReceiver*> channels, RecordInput& input,
                                           CheckpointBarrierHandler* barriers, size_t channel_offset)
    : channels_(std::move(channels)),
      state_(channels_.size()),
      input_(input),
      barriers_(barriers),
      offset_(channel_offset) {}

StreamInputProcessor::~StreamInputProcessor() {
  for (size_t c = 0; c < channels_.size(); ++c) {
    if (state_[c].held != nullptr) channels_[c]->recycle(state_[c].held);
  }
}

StreamInputProcessor::Status StreamInputProcessor::process_next() {
  if (finished()) return Status::kEndOfInput;
  const size_t n = channels_.size();
  for (size_t i = 0; i < n; ++i) {
    size_t c = next_;
    next_ = next_ + 1 == n ? 0 : next_ + 1;
    ChannelState& st = state_[c];
    if (st.finished || blocked(c)) continue;
    NetworkBuffer* b = st.held;
    uint32_t pos = st.held_pos;
    st.held = nullptr;
    if (b == nullptr) {
      b = channels_[c]->poll();
      if (b == nullptr) continue;
      pos = 0;
      bytes_received_ += b->size;
    }
    // Recycle even when a user function throws mid-buffer, so the sender is never left without credit; keep
    // the buffer instead when a barrier blocked the channel in the middle of it.
    struct Recycle {
      ChannelReceiver* ch;
      NetworkBuffer* b;
      ~Recycle() {
        if (b != nullptr) ch->recycle(b);
      }
    } recycle{channels_[c], b};
    if (!process_buffer(c, *b, pos)) {
      st.held = b;
      st.held_pos = pos;
      recycle.b = nullptr;
    }
    return finished() ? Status::kEndOfInput : Status::kProcessed;
  }
  return Status::kNothingAvailable;
}

bool StreamInputProcessor::process_buffer(size_t c, const NetworkBuffer& buffer, uint32_t& pos) {
  ChannelState& st = state_[c];
  const uint8_t* p = buffer.data + pos;
  const uint8_t* end = buffer.data + buffer.size;
  if (st.missing > 0) {
    uint32_t n = static_cast<uint32_t>(std::min<size_t>(st.missing, static_cast<size_t>(end - p)));
    st.partial.insert(st.partial.end(), p, p + n);
    p += n;
    st.missing -= n;
    if (st.missing > 0) return true;
    DataInput in(st.partial.data(), st.partial.size());
    input_.process_record(in, st.partial_ts);
  }
  while (p < end) {
    auto tag = static_cast<ElementTag>(*p);
    switch (tag) {
      case ElementTag::kRecord:
      case ElementTag::kRecordWithTimestamp: {
        const bool with_ts = tag == ElementTag::kRecordWithTimestamp;
        const size_t header = with_ts ? kMaxRecordHeaderSize : 5;
        if (static_cast<size_t>(end - p) < header) corrupt(c, "truncated record header");
        uint32_t len;
        std::memcpy(&len, p + 1, 4);
        TimestampMs ts = kNoTimestamp;
        if (with_ts) std::memcpy(&ts, p + 5, 8);
        p += header;
        size_t avail = static_cast<size_t>(end - p);
        if (len <= avail) {
          DataInput in(p, len);
          input_.process_record(in, ts);
          if (!in.at_end()) corrupt(c, "a record's serializer read fewer bytes than were written");
          p += len;
        } else {
          st.partial.assign(p, end);
          st.missing = len - static_cast<uint32_t>(avail);
          st.partial_ts = ts;
          return true;
        }
        break;
      }
      case ElementTag::kBarrier: {
        if (end - p < static_cast<ptrdiff_t>(kBarrierElementSize)) corrupt(c, "truncated checkpoint barrier");
        CheckpointBarrier barrier;
        std::memcpy(&barrier.checkpoint_id, p + 1, 8);
        std::memcpy(&barrier.timestamp, p + 9, 8);
        barrier.type = static_cast<SnapshotType>(p[17]);
        barrier.mode = static_cast<CheckpointingMode>(p[18]);
        p += kBarrierElementSize;
        if (barriers_ != nullptr) {
          barriers_->on_barrier(offset_ + c, barrier);
          if (blocked(c)) {
            pos = static_cast<uint32_t>(p - buffer.data);
            return p == end;  // nothing left: the buffer can go back at once
          }
        }
        break;
      }
      case ElementTag::kWatermark: {
        if (end - p < static_cast<ptrdiff_t>(kWatermarkElementSize)) corrupt(c, "truncated watermark");
        TimestampMs wm;
        std::memcpy(&wm, p + 1, 8);
        p += kWatermarkElementSize;
        on_watermark(c, wm);
        break;
      }
      case ElementTag::kWatermarkStatus: {
        if (end - p < 2) corrupt(c, "truncated watermark status");
        bool idle = p[1] != 0;
        p += 2;
        on_watermark_status(c, idle);
        break;
      }
      case ElementTag::kEndOfPartition:
        on_end_of_partition(c);
        return true;
      default:
        corrupt(c, "unknown element tag " + std::to_string(static_cast<int>(tag)));
    }
  }
  return true;
}

void StreamInputProcessor::on_watermark(size_t c, TimestampMs wm) {
  ChannelState& st = state_[c];
  if (wm <= st.watermark) return;
  st.watermark = wm;
  if (st.idle) on_watermark_status(c, false);  // a watermark implies the channel is active
  if (!st.aligned && st.watermark >= combined_watermark_) st.aligned = true;
  update_combined_watermark();
}

void StreamInputProcessor::on_watermark_status(size_t c, bool idle) {
  ChannelState& st = state_[c];
  if (st.idle == idle) return;
  st.idle = idle;
  if (!idle) st.aligned = st.watermark >= combined_watermark_;
  bool all_idle = true;
  for (const auto& s : state_)
    all_idle = all_idle && (s.finished || s.idle);
  if (all_idle != input_idle_) {
    input_idle_ = all_idle;
    input_.process_watermark_status(all_idle);
  }
  if (!all_idle) update_combined_watermark();
}

void StreamInputProcessor::update_combined_watermark() {
  TimestampMs m = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (const auto& s : state_) {
    if (!s.finished && !s.idle && s.aligned) {
      m = std::min(m, s.watermark);
      any = true;
    }
  }
  if (!any && !finished()) return;  // every open channel idle: hold the watermark
  if (m > combined_watermark_) {
    combined_watermark_ = m;
    input_.process_watermark(m);
  }
}

void StreamInputProcessor::on_end_of_partition(size_t c) {
  state_[c].finished = true;
  ++finished_channels_;
  // A finished channel no longer holds the watermark back.
  if (!finished()) update_combined_watermark();
  if (barriers_ != nullptr) barriers_->on_channel_finished(offset_ + c);
}

}  // namespace sluice
