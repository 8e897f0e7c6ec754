// The sink interface (the model of Flink's Sink V2): a Sink creates one SinkWriter per parallel subtask.
// Writers run on the task thread. flush() is the hook that checkpoints call ("flush on snapshot" for
// at-least-once sinks); prepare_commit() produces what a two-phase-commit sink commits after the checkpoint
// completes (used by the checkpoint issue).
#pragma once

#include <memory>

#include "sluice/api/functions.h"

namespace sluice {

/// The context of one SinkWriter::write call.
class SinkWriterContext {
 public:
  virtual ~SinkWriterContext() = default;
  /// The record's event timestamp, or kNoTimestamp.
  virtual TimestampMs timestamp() const = 0;
  /// The subtask's current watermark.
  virtual TimestampMs current_watermark() const = 0;
};

/// Writes records of one subtask. Not thread-safe; runs on the task thread.
template <class T>
class SinkWriter {
 public:
  virtual ~SinkWriter() = default;
  /// Writes (or buffers) one record. May throw to fail the task.
  virtual void write(const T& record, const SinkWriterContext& ctx) = 0;
  /// Makes everything written so far durable/visible per the sink's guarantee. `end_of_input` is true on the
  /// final flush of a bounded job.
  virtual void flush(bool end_of_input) = 0;
  /// Releases resources; called on success, failure and cancellation.
  virtual void close() {}
};

/// A factory of writers. Thread-safe.
template <class T>
class Sink {
 public:
  using RecordType = T;
  virtual ~Sink() = default;
  /// Creates the writer of subtask `ctx.subtask_index()`.
  virtual std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const = 0;
};

}  // namespace sluice
