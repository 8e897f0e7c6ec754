#include "sluice/runtime/record_writer.h"

#include <cstring>

#include "sluice/runtime/stream_element.h"

namespace sluice {

RecordWriter::RecordWriter(std::vector<ChannelSender*> channels, CreditWaiter& waiter)
    : channels_(std::move(channels)), current_(channels_.size(), nullptr), waiter_(waiter) {}

NetworkBuffer* RecordWriter::buffer_for(int channel, uint32_t min_space) {
  NetworkBuffer*& cur = current_[static_cast<size_t>(channel)];
  if (cur != nullptr && cur->remaining() < min_space) send_current(channel);
  if (cur != nullptr) return cur;
  ChannelSender* ch = channels_[static_cast<size_t>(channel)];
  while (cur == nullptr) {
    cur = ch->try_acquire();
    if (cur != nullptr) break;
    // Backpressure: the receiver has not returned a buffer yet. Clear the wakeup, look once more, then wait,
    // so a credit returned in between is not missed.
    waiter_.prepare_wait_for_credit();
    cur = ch->try_acquire();
    if (cur != nullptr) break;
    waiter_.wait_for_credit();
  }
  ++unflushed_;
  return cur;
}

void RecordWriter::send_current(int channel) {
  NetworkBuffer*& cur = current_[static_cast<size_t>(channel)];
  if (cur == nullptr) return;
  bytes_sent_ += cur->size;
  channels_[static_cast<size_t>(channel)]->send(cur);
  cur = nullptr;
  --unflushed_;
  ++buffers_sent_;
}

void RecordWriter::write_record(int channel, std::span<const uint8_t> bytes, TimestampMs timestamp) {
  const bool with_ts = timestamp != kNoTimestamp;
  const uint32_t header = with_ts ? kMaxRecordHeaderSize : 5;
  NetworkBuffer* b = buffer_for(channel, header);
  uint8_t* p = b->data + b->size;
  *p = static_cast<uint8_t>(with_ts ? ElementTag::kRecordWithTimestamp : ElementTag::kRecord);
  uint32_t len = static_cast<uint32_t>(bytes.size());
  std::memcpy(p + 1, &len, 4);
  if (with_ts) std::memcpy(p + 5, &timestamp, 8);
  b->size += header;
  const uint8_t* src = bytes.data();
  size_t left = bytes.size();
  for (;;) {
    size_t n = std::min<size_t>(left, b->remaining());
    std::memcpy(b->data + b->size, src, n);
    b->size += static_cast<uint32_t>(n);
    src += n;
    left -= n;
    if (left == 0) break;
    b = buffer_for(channel, b->capacity);  // the payload spans into the next buffer
  }
  if (b->remaining() == 0) send_current(channel);
}

void RecordWriter::broadcast_record(std::span<const uint8_t> bytes, TimestampMs timestamp) {
  for (int c = 0; c < num_channels(); ++c)
    write_record(c, bytes, timestamp);
}

void RecordWriter::broadcast_watermark(TimestampMs watermark) {
  last_watermark_ = watermark;
  for (int c = 0; c < num_channels(); ++c) {
    NetworkBuffer* b = buffer_for(c, kWatermarkElementSize);
    b->data[b->size] = static_cast<uint8_t>(ElementTag::kWatermark);
    std::memcpy(b->data + b->size + 1, &watermark, 8);
    b->size += kWatermarkElementSize;
  }
}

void RecordWriter::broadcast_watermark_status(bool idle) {
  for (int c = 0; c < num_channels(); ++c) {
    NetworkBuffer* b = buffer_for(c, 2);
    b->data[b->size] = static_cast<uint8_t>(ElementTag::kWatermarkStatus);
    b->data[b->size + 1] = idle ? 1 : 0;
    b->size += 2;
  }
}

void RecordWriter::broadcast_barrier(const CheckpointBarrier& barrier) {
  for (int c = 0; c < num_channels(); ++c) {
    NetworkBuffer* b = buffer_for(c, kBarrierElementSize);
    uint8_t* p = b->data + b->size;
    p[0] = static_cast<uint8_t>(ElementTag::kBarrier);
    std::memcpy(p + 1, &barrier.checkpoint_id, 8);
    std::memcpy(p + 9, &barrier.timestamp, 8);
    p[17] = static_cast<uint8_t>(barrier.type);
    p[18] = static_cast<uint8_t>(barrier.mode);
    b->size += kBarrierElementSize;
    send_current(c);
  }
}

void RecordWriter::flush_all() {
  if (unflushed_ == 0) return;
  for (int c = 0; c < num_channels(); ++c) {
    NetworkBuffer* cur = current_[static_cast<size_t>(c)];
    if (cur != nullptr && cur->size > 0) send_current(c);
  }
}

void RecordWriter::finish() {
  if (finished_) return;
  finished_ = true;
  for (int c = 0; c < num_channels(); ++c) {
    NetworkBuffer* b = buffer_for(c, 1);
    b->data[b->size++] = static_cast<uint8_t>(ElementTag::kEndOfPartition);
    send_current(c);
  }
}

}  // namespace sluice
