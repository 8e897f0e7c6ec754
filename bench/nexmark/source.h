// NexmarkSource: the Nexmark generator as a bounded, split-based Sluice source.
//
// The enumerator deals events 0..events-1 to the reader subtasks in blocks of kBlock consecutive numbers,
// round robin: with p readers, reader i generates blocks i, i + p, i + 2p, ... So all readers move through
// event time together, at most about p blocks apart, and a downstream operator's watermark (the minimum
// over its inputs) trails the newest events by that much. (Contiguous ranges per reader would put the
// readers up to half the input apart in event time, and every window and timer of the later half would
// wait for the earlier reader to finish.) A reader generates its blocks in order at full speed (no rate
// limit: `rate` only spaces event time), emits each event with its event timestamp and, after every block,
// the watermark timestamp(next event) - 1: generated timestamps never decrease within a split, and several
// events may share a millisecond, so this is the largest watermark no later event of the reader can
// violate. The end of input brings the final watermark (the runtime's). Events are the same whatever the
// parallelism: event n depends only on n.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nexmark/generator.h"
#include "sluice/api/source.h"

namespace sluice::nexmark {

/// The event numbers of one reader: blocks of NexmarkSource::kBlock consecutive numbers whose starts are
/// `stride` apart (a multiple of kBlock), from `next` (advancing as the reader emits) up to `end`
/// (exclusive).
struct NexmarkSplit {
  int64_t next = 0;
  int64_t end = 0;
  int64_t stride = 0;
};
SLUICE_FIELDS(NexmarkSplit, next, end, stride);

class NexmarkSource final : public Source<Event, NexmarkSplit> {
 public:
  /// Events per block: a reader generates one block per poll_next call, then emits a watermark.
  static constexpr int64_t kBlock = 1024;

  /// A source of `config.events` events. Fails (kConfiguration) when the config does not validate or
  /// has no events.
  static Result<std::shared_ptr<NexmarkSource>> create(NexmarkConfig config) {
    if (Status s = config.validate(); !s.ok()) return s.error();
    if (config.events == 0) {
      return Error(ErrorCode::kConfiguration, "nexmark source: events must be > 0 (the source is bounded)");
    }
    return std::shared_ptr<NexmarkSource>(new NexmarkSource(config));
  }

  const NexmarkGenerator& generator() const { return generator_; }

  Boundedness boundedness() const override { return Boundedness::kBounded; }

  std::unique_ptr<SplitEnumerator<NexmarkSplit>> create_enumerator(
      SplitEnumeratorContext<NexmarkSplit>& ctx) const override {
    return std::make_unique<Enumerator>(ctx, splits(ctx.current_parallelism()));
  }

  std::unique_ptr<SourceReader<Event, NexmarkSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx, generator_);
  }

  /// The splits for `parallelism` readers: split i holds blocks i, i + p, i + 2p, ... of the events.
  std::vector<NexmarkSplit> splits(int parallelism) const {
    const int64_t count = generator_.config().events;
    const int64_t p = parallelism;
    std::vector<NexmarkSplit> out;
    for (int64_t i = 0; i < p; ++i)
      out.push_back(NexmarkSplit{std::min(i * kBlock, count), count, p * kBlock});
    return out;
  }

  /// The event numbers of `split` (stride > 0), in the order a reader emits them.
  static std::vector<int64_t> event_numbers(const NexmarkSplit& split) {
    assert(split.stride > 0);
    std::vector<int64_t> out;
    for (NexmarkSplit s = split; s.next < s.end; s.next = next_block(s)) {
      for (int64_t n = s.next; n < block_end(s); ++n)
        out.push_back(n);
    }
    return out;
  }

 private:
  explicit NexmarkSource(NexmarkConfig config) : generator_(config) {}

  /// The end of the block that holds split.next (within the split's end).
  static int64_t block_end(const NexmarkSplit& split) {
    return std::min(split.end, (split.next / kBlock + 1) * kBlock);
  }
  /// The first event of the split's block after the one holding split.next.
  static int64_t next_block(const NexmarkSplit& split) { return split.next / kBlock * kBlock + split.stride; }

  /// Gives split i to reader subtask i, whenever it asks (a first-come enumerator could hand a fast reader a
  /// second split that starts earlier in event time than the watermark it already emitted, making every
  /// record of that split late), and splits given back after a failure to the subtask that had them.
  class Enumerator final : public SplitEnumerator<NexmarkSplit> {
   public:
    Enumerator(SplitEnumeratorContext<NexmarkSplit>& ctx, std::vector<NexmarkSplit> splits) : ctx_(ctx) {
      for (size_t i = 0; i < splits.size(); ++i)
        pending_[static_cast<int>(i)].push_back(splits[i]);
    }
    void handle_split_request(int subtask) override {
      auto it = pending_.find(subtask);
      if (it == pending_.end() || it->second.empty()) {
        ctx_.signal_no_more_splits(subtask);
        return;
      }
      NexmarkSplit s = it->second.front();
      it->second.pop_front();
      ctx_.assign_split(s, subtask);
    }
    void add_splits_back(std::vector<NexmarkSplit> splits, int subtask) override {
      for (const NexmarkSplit& s : splits)
        pending_[subtask].push_back(s);
    }
    std::vector<NexmarkSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
      std::vector<NexmarkSplit> out;
      for (const auto& [subtask, splits] : pending_)
        out.insert(out.end(), splits.begin(), splits.end());
      return out;
    }
    // Unassigned splits go round robin over the (possibly new) readers.
    void restore_state(std::vector<NexmarkSplit> unassigned) override {
      pending_.clear();
      const int p = std::max(1, ctx_.current_parallelism());
      for (size_t i = 0; i < unassigned.size(); ++i)
        pending_[static_cast<int>(i) % p].push_back(unassigned[i]);
    }

   private:
    SplitEnumeratorContext<NexmarkSplit>& ctx_;
    std::map<int, std::deque<NexmarkSplit>> pending_;
  };

  class Reader final : public SourceReader<Event, NexmarkSplit> {
   public:
    Reader(SourceReaderContext& ctx, NexmarkGenerator gen) : ctx_(ctx), gen_(std::move(gen)) {}
    void start() override { ctx_.send_split_request(); }

    InputStatus poll_next(ReaderOutput<Event>& out) override {
      if (splits_.empty()) return no_more_splits_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
      NexmarkSplit& s = splits_.front();
      const int64_t stop = block_end(s);
      for (int64_t n = s.next; n < stop; ++n) {
        // One Event reused for every record: strings a downstream operator did not move keep their memory.
        gen_.event_into(n, scratch_);
        out.collect(std::move(scratch_), gen_.timestamp(n));
      }
      s.next = next_block(s);
      if (s.next >= s.end) {
        splits_.pop_front();
        if (splits_.empty() && !no_more_splits_) ctx_.send_split_request();
      }
      emit_watermark(out);
      return InputStatus::kMoreAvailable;
    }

    void add_splits(std::vector<NexmarkSplit> splits) override {
      for (auto& s : splits) {
        if (s.stride <= 0 || s.stride % kBlock != 0) {
          throw SluiceException(Error(ErrorCode::kInternal,
                                      "nexmark source: a split's stride must be a positive "
                                      "multiple of the block size, got " +
                                          std::to_string(s.stride)));
        }
        if (s.next < s.end) splits_.push_back(s);
      }
      // An empty split (fewer events than readers times kBlock) is dropped: ask for the next one, or the
      // enumerator's "no more splits", or this reader would wait forever.
      if (splits_.empty() && !no_more_splits_) ctx_.send_split_request();
    }
    void notify_no_more_splits() override { no_more_splits_ = true; }
    std::vector<NexmarkSplit> snapshot_state(int64_t) override { return {splits_.begin(), splits_.end()}; }

   private:
    /// The earliest timestamp still to come from any owned split, minus one. Nothing when no split is
    /// left: a later split (given back after a failure) may start earlier.
    void emit_watermark(ReaderOutput<Event>& out) const {
      if (splits_.empty()) return;
      TimestampMs next = gen_.timestamp(splits_.front().next);
      for (const auto& s : splits_)
        next = std::min(next, gen_.timestamp(s.next));
      out.emit_watermark(next - 1);
    }

    SourceReaderContext& ctx_;
    const NexmarkGenerator gen_;
    std::deque<NexmarkSplit> splits_;
    bool no_more_splits_ = false;
    Event scratch_;
  };

  NexmarkGenerator generator_;
};

}  // namespace sluice::nexmark
