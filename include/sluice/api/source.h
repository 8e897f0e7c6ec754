// The split-based source interface (the model of Flink's FLIP-27 "Refactor Source Interface").
//
// A Source is a factory. Its SplitEnumerator runs once per job in the coordinator (JobManager side): it
// discovers splits (a Kafka partition, a file, a change stream) and assigns them to readers. A SourceReader
// runs in each parallel source subtask on the task thread: it receives splits and emits records. SplitT is a
// value type with a TypeSerializer (splits and their positions go into checkpoints).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/api/functions.h"

namespace sluice {

/// Whether a source ends (bounded: a file, a fixed range) or runs forever (a topic, a change stream).
enum class Boundedness { kBounded, kContinuousUnbounded };

/// What SourceReader::poll_next reports.
enum class InputStatus {
  kMoreAvailable,     ///< call poll_next again soon
  kNothingAvailable,  ///< no data now; the reader calls SourceReaderContext::wakeup() when there is
  kEndOfInput,        ///< the reader has finished all its splits and will get no more
};

/// Where a reader emits records. Runs on the task thread.
template <class T>
class ReaderOutput {
 public:
  virtual ~ReaderOutput() = default;
  /// Emits a record without an event timestamp.
  virtual void collect(T&& record) = 0;
  /// Emits a record with an event timestamp (ms since epoch).
  virtual void collect(T&& record, TimestampMs timestamp) = 0;
  /// Emits a watermark (ms since epoch): no record with timestamp <= watermark follows from this reader.
  virtual void emit_watermark(TimestampMs watermark) = 0;
  void collect(const T& record) {
    T copy = record;
    collect(std::move(copy));
  }
  /// An output for the records of one split, with its own watermark generator, so the source's watermark is
  /// the minimum over its splits (Flink's per-split watermarks). Valid until release_output_for_split().
  virtual ReaderOutput<T>& output_for_split(const std::string& /*split_id*/) { return *this; }
  /// The split has finished: it no longer holds back the watermark.
  virtual void release_output_for_split(const std::string& /*split_id*/) {}
};

/// What a reader may ask of its subtask. Thread-safety: wakeup() may be called from any thread (a fetcher
/// thread); the rest only on the task thread.
class SourceReaderContext {
 public:
  virtual ~SourceReaderContext() = default;
  virtual int subtask_index() const = 0;
  virtual int parallelism() const = 0;
  /// Asks the enumerator for a split; the answer arrives as add_splits() or notify_no_more_splits().
  virtual void send_split_request() = 0;
  /// Tells the task that poll_next may have data again (after it returned kNothingAvailable).
  virtual void wakeup() = 0;
  /// Asks the task to call poll_next again no later than `time_ms` on clock() (for rate limits and polling).
  virtual void wakeup_at(TimestampMs time_ms) = 0;
  /// The processing-time clock.
  virtual const Clock& clock() const = 0;
};

/// Reads the records of the splits assigned to one subtask. All methods run on the task thread.
template <class T, class SplitT>
class SourceReader {
 public:
  virtual ~SourceReader() = default;
  /// Called once before the first poll_next.
  virtual void start() {}
  /// Emits available records (a batch is fine) and reports whether more are available.
  virtual InputStatus poll_next(ReaderOutput<T>& output) = 0;
  /// Hands the reader new splits.
  virtual void add_splits(std::vector<SplitT> splits) = 0;
  /// No further splits will be assigned to this reader.
  virtual void notify_no_more_splits() = 0;
  /// The splits this reader owns with their current positions, for a checkpoint.
  virtual std::vector<SplitT> snapshot_state(int64_t /*checkpoint_id*/) { return {}; }
  /// Checkpoint `checkpoint_id` completed: positions up to its snapshot are durable (a Kafka reader commits
  /// offsets to its consumer group here, a CDC reader confirms its slot or resume token).
  virtual void notify_checkpoint_complete(int64_t /*checkpoint_id*/) {}
  /// Checkpoint `checkpoint_id` was aborted.
  virtual void notify_checkpoint_aborted(int64_t /*checkpoint_id*/) {}
  /// Releases resources; called on success, failure and cancellation.
  virtual void close() {}
};

/// What an enumerator may ask of the coordinator. Methods are called under the coordinator's lock.
template <class SplitT>
class SplitEnumeratorContext {
 public:
  virtual ~SplitEnumeratorContext() = default;
  virtual int current_parallelism() const = 0;
  /// Assigns a split to a reader subtask (delivered to its mailbox).
  virtual void assign_split(SplitT split, int subtask) = 0;
  /// Tells a reader it will get no more splits.
  virtual void signal_no_more_splits(int subtask) = 0;
  /// Runs `task` every `period_ms` on the coordinator's worker thread, under the coordinator's lock (so it may
  /// assign splits), until the coordinator closes: periodic split discovery such as new Kafka partitions
  /// (Flink's SplitEnumeratorContext.callAsync with a period). An exception from `task` is logged and the
  /// task keeps its schedule.
  virtual void schedule_periodic(std::function<void()> task, int64_t period_ms) = 0;
  /// Runs `work` every `period_ms` on the coordinator's worker thread *without* the coordinator's lock, so it
  /// may block on the network (a metadata request) without holding up checkpoints or split requests, then runs
  /// the handler it returns (if any) under the lock, where it may read the enumerator's state and assign splits.
  /// The handler does not run once the coordinator has closed. This is Flink's
  /// `SplitEnumeratorContext.callAsync(callable, handler, initialDelay, period)`. `work` must not touch the
  /// enumerator's state: it runs concurrently with the enumerator's other methods. Exceptions from either are
  /// logged and the schedule goes on. The default runs both under the lock (for contexts without a worker).
  virtual void call_async(std::function<std::function<void()>()> work, int64_t period_ms) {
    schedule_periodic(
        [work = std::move(work)] {
          if (std::function<void()> handler = work()) handler();
        },
        period_ms);
  }
};

/// Discovers and assigns splits. Its methods run serialized (under the coordinator's lock), never
/// concurrently with each other.
template <class SplitT>
class SplitEnumerator {
 public:
  virtual ~SplitEnumerator() = default;
  virtual void start() {}
  /// A reader asked for a split.
  virtual void handle_split_request(int subtask) = 0;
  /// Splits given back after a reader failed (restored on failover).
  virtual void add_splits_back(std::vector<SplitT> splits, int subtask) = 0;
  /// A reader registered.
  virtual void add_reader(int /*subtask*/) {}
  /// The splits the enumerator still holds (not assigned to any reader), for checkpoint `checkpoint_id`.
  /// Splits already assigned are checkpointed by their readers. Called under the coordinator's lock, so no
  /// assignment runs concurrently.
  virtual std::vector<SplitT> snapshot_state(int64_t checkpoint_id) = 0;
  /// Restores what snapshot_state() returned, before start(): the enumerator must hand out exactly these
  /// splits from now on (readers hold the rest in their own restored state).
  virtual void restore_state(std::vector<SplitT> unassigned) = 0;
  virtual void close() {}
};

/// A source of records of type T made of splits of type SplitT. Thread-safe factory: create_* may be called
/// from several threads.
template <class T, class SplitT>
class Source {
 public:
  using RecordType = T;
  using SplitType = SplitT;
  virtual ~Source() = default;
  virtual Boundedness boundedness() const = 0;
  virtual std::unique_ptr<SplitEnumerator<SplitT>> create_enumerator(SplitEnumeratorContext<SplitT>& ctx) const = 0;
  virtual std::unique_ptr<SourceReader<T, SplitT>> create_reader(SourceReaderContext& ctx) const = 0;
};

/// An enumerator over a fixed list of splits: each request gets the next split, then "no more splits".
/// Suits files and generated ranges.
template <class SplitT>
class StaticSplitEnumerator final : public SplitEnumerator<SplitT> {
 public:
  StaticSplitEnumerator(SplitEnumeratorContext<SplitT>& ctx, std::vector<SplitT> splits)
      : ctx_(ctx), pending_(std::move(splits)) {}
  void handle_split_request(int subtask) override {
    if (pending_.empty()) {
      ctx_.signal_no_more_splits(subtask);
      return;
    }
    SplitT s = std::move(pending_.front());
    pending_.erase(pending_.begin());
    ctx_.assign_split(std::move(s), subtask);
  }
  void add_splits_back(std::vector<SplitT> splits, int /*subtask*/) override {
    for (auto& s : splits)
      pending_.push_back(std::move(s));
  }
  std::vector<SplitT> snapshot_state(int64_t /*checkpoint_id*/) override { return pending_; }
  void restore_state(std::vector<SplitT> unassigned) override { pending_ = std::move(unassigned); }

 private:
  SplitEnumeratorContext<SplitT>& ctx_;
  std::vector<SplitT> pending_;
};

}  // namespace sluice
