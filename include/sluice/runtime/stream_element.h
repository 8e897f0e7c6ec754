// The byte layout of stream elements inside network buffers (format version 1).
//
// Every element starts with a one-byte tag. A record's header (tag, u32 little-endian payload length, and the
// i64 timestamp when tagged kRecordWithTimestamp) always sits whole in one buffer; its payload may continue
// in the following buffers of the same channel (records larger than a buffer "span"). Elements on a channel
// are FIFO (DESIGN.md §4).
#pragma once

#include <cstdint>

namespace sluice {

enum class ElementTag : uint8_t {
  kRecord = 1,               ///< u32 length, payload
  kRecordWithTimestamp = 2,  ///< u32 length, i64 timestamp (ms), payload
  kWatermark = 3,            ///< i64 watermark (ms)
  kEndOfPartition = 4,       ///< the producer subtask has finished; nothing follows
  kWatermarkStatus = 5,      ///< u8: 1 = idle, 0 = active
  kBarrier = 6,              ///< i64 checkpoint id, i64 timestamp (ms), u8 SnapshotType, u8 CheckpointingMode
};

/// Largest header: tag + length + timestamp.
inline constexpr uint32_t kMaxRecordHeaderSize = 1 + 4 + 8;
inline constexpr uint32_t kWatermarkElementSize = 1 + 8;
inline constexpr uint32_t kBarrierElementSize = 1 + 8 + 8 + 1 + 1;

}  // namespace sluice
