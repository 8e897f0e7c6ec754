// The untyped seam between typed operators and the runtime's data exchange.
//
// Type erasure happens here, once, at the task boundary (DESIGN.md §12): a typed NetworkOutput<T> serializes
// a record with TypeSerializer<T> and hands the bytes to a RecordWriterBase; on the receiving side the
// runtime hands each record's bytes to a typed RecordInput that deserializes into a reused T and calls the
// chain's head operator. The runtime itself never sees T.
#pragma once

#include <memory>
#include <span>

#include "sluice/api/operator.h"
#include "sluice/core/data_io.h"

namespace sluice {

/// Writes serialized stream elements into the channels of one result partition. Implemented by the runtime;
/// used on the producing task's thread only. Blocks (backpressure) while the target channel has no credit.
class RecordWriterBase {
 public:
  virtual ~RecordWriterBase() = default;
  /// Number of channels (consumer subtasks this producer subtask feeds).
  virtual int num_channels() const = 0;
  /// Appends one serialized record to `channel`.
  virtual void write_record(int channel, std::span<const uint8_t> bytes, TimestampMs timestamp) = 0;
  /// Appends one serialized record to every channel.
  virtual void broadcast_record(std::span<const uint8_t> bytes, TimestampMs timestamp) = 0;
  /// Appends a watermark to every channel.
  virtual void broadcast_watermark(TimestampMs watermark) = 0;
  /// Appends a watermark status (idle or active) to every channel.
  virtual void broadcast_watermark_status(bool idle) = 0;
};

/// Receives the records of one input (typed behind this interface). Runs on the consuming task's thread.
class RecordInput {
 public:
  virtual ~RecordInput() = default;
  /// Deserializes one record from `in` (exactly its bytes) and processes it.
  virtual void process_record(DataInput& in, TimestampMs timestamp) = 0;
  /// Processes the input's combined watermark.
  virtual void process_watermark(TimestampMs watermark) = 0;
  /// The input as a whole became idle (every channel idle or finished) or active again.
  virtual void process_watermark_status(bool idle) = 0;
};

}  // namespace sluice
