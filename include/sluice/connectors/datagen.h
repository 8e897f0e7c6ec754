// The datagen source: records generated from their index by a user function, bounded or unbounded, at full
// speed or rate-limited (Flink's DataGeneratorSource). Generation is deterministic: record i is always
// generator(i), whatever the parallelism, so runs are reproducible; for random data use seeded_random().
//
// Splits are contiguous index ranges, one per reader subtask at start. Each split is emitted through its own
// split output (Flink's split-aware watermarking: one watermark generator per split, the source's watermark the
// minimum over them), created for every split a reader holds before it reads any: after a rescale one reader
// holds several splits and reads them one after the other, and a split not read yet holds the watermark back,
// so its records are not late behind another split's later timestamps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// A range [next, end) of record indexes.
struct DataGenSplit {
  int64_t next = 0;
  int64_t end = 0;
};

template <>
struct TypeSerializer<DataGenSplit> {
  static void serialize(const DataGenSplit& s, DataOutput& out) {
    out.write_signed_varint(s.next);
    out.write_signed_varint(s.end);
  }
  static void deserialize(DataGenSplit& s, DataInput& in) {
    s.next = in.read_signed_varint();
    s.end = in.read_signed_varint();
  }
};

/// A fast deterministic 64-bit mixer (SplitMix64, Steele et al., "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): the random stream for record i is seeded by splitmix64(seed ^ i).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// A small seeded generator handed to random generators; reproducible per (seed, index).
class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() { return state_ = splitmix64(state_); }
  /// Uniform in [0, bound).
  uint64_t next_below(uint64_t bound) { return bound == 0 ? 0 : next_u64() % bound; }
  /// Uniform in [0, 1).
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

template <class T>
class DataGeneratorSource final : public Source<T, DataGenSplit> {
 public:
  using Generator = std::function<T(int64_t index)>;
  /// Unbounded count.
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

  /// Generates records 0..count-1 (kUnbounded for an endless stream), at most `records_per_second` in total
  /// across subtasks (0 = no limit).
  DataGeneratorSource(Generator generator, int64_t count, double records_per_second = 0)
      : generator_(std::move(generator)), count_(count), rate_(records_per_second) {}

  Boundedness boundedness() const override {
    return count_ == kUnbounded ? Boundedness::kContinuousUnbounded : Boundedness::kBounded;
  }

  std::unique_ptr<SplitEnumerator<DataGenSplit>> create_enumerator(
      SplitEnumeratorContext<DataGenSplit>& ctx) const override {
    const int p = ctx.current_parallelism();
    std::vector<DataGenSplit> splits;
    for (int i = 0; i < p; ++i) {
      splits.push_back(DataGenSplit{boundary(i, p), boundary(i + 1, p)});
    }
    return std::make_unique<StaticSplitEnumerator<DataGenSplit>>(ctx, std::move(splits));
  }

  /// Start of split i of p: count * i / p without overflow.
  int64_t boundary(int64_t i, int64_t p) const { return (count_ / p) * i + (count_ % p) * i / p; }

  std::unique_ptr<SourceReader<T, DataGenSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx, generator_, rate_ / ctx.parallelism());
  }

 private:
  class Reader final : public SourceReader<T, DataGenSplit> {
   public:
    Reader(SourceReaderContext& ctx, Generator gen, double rate) : ctx_(ctx), gen_(std::move(gen)), rate_(rate) {}
    void start() override {
      start_ms_ = ctx_.clock().now_ms();
      ctx_.send_split_request();
    }
    InputStatus poll_next(ReaderOutput<T>& out) override {
      if (splits_.empty()) {
        return no_more_splits_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
      }
      // Every split's output exists before any record is read (see the file comment).
      for (; outputs_.size() < splits_.size();)
        outputs_.push_back(&out.output_for_split(split_id(splits_[outputs_.size()])));
      DataGenSplit& s = splits_.front();
      ReaderOutput<T>& split_out = *outputs_.front();
      int64_t budget = kBatch;
      if (rate_ > 0) {
        const TimestampMs now = ctx_.clock().now_ms();
        const auto allowed = static_cast<int64_t>(static_cast<double>(now - start_ms_) * rate_ / 1000.0) + 1;
        budget = std::min<int64_t>(budget, allowed - emitted_);
        if (budget <= 0) {
          ctx_.wakeup_at(start_ms_ + static_cast<TimestampMs>(static_cast<double>(emitted_) * 1000.0 / rate_) + 1);
          return InputStatus::kNothingAvailable;
        }
      }
      const int64_t stop = std::min(s.end, s.next + budget);
      for (int64_t i = s.next; i < stop; ++i)
        split_out.collect(gen_(i));
      emitted_ += stop - s.next;
      s.next = stop;
      if (s.next >= s.end) {
        out.release_output_for_split(split_id(s));
        outputs_.pop_front();
        splits_.pop_front();
        if (splits_.empty() && !no_more_splits_) ctx_.send_split_request();
      }
      return InputStatus::kMoreAvailable;
    }
    void add_splits(std::vector<DataGenSplit> splits) override {
      for (auto& s : splits)
        splits_.push_back(s);
    }
    void notify_no_more_splits() override { no_more_splits_ = true; }
    std::vector<DataGenSplit> snapshot_state(int64_t) override { return {splits_.begin(), splits_.end()}; }

   private:
    static constexpr int64_t kBatch = 1024;
    /// A split's identity: its end, which no other split shares and which never changes.
    static std::string split_id(const DataGenSplit& s) { return "datagen-" + std::to_string(s.end); }
    SourceReaderContext& ctx_;
    Generator gen_;
    double rate_;
    std::deque<DataGenSplit> splits_;
    std::deque<ReaderOutput<T>*> outputs_;  // the outputs of splits_' first entries, in the same order
    bool no_more_splits_ = false;
    TimestampMs start_ms_ = 0;
    int64_t emitted_ = 0;
  };

  Generator generator_;
  int64_t count_;
  double rate_;
};

namespace datagen {

/// The numbers from..to (inclusive) as int64, in order per split.
inline std::shared_ptr<DataGeneratorSource<int64_t>> sequence(int64_t from, int64_t to, double records_per_second = 0) {
  return std::make_shared<DataGeneratorSource<int64_t>>([from](int64_t i) { return from + i; }, to - from + 1,
                                                        records_per_second);
}

/// `count` records made by `make(SeededRandom&, index)`; record i depends only on (seed, i).
template <class F>
auto seeded_random(uint64_t seed, int64_t count, F make, double records_per_second = 0) {
  using T = std::decay_t<std::invoke_result_t<F&, SeededRandom&, int64_t>>;
  return std::make_shared<DataGeneratorSource<T>>(
      [seed, make](int64_t i) mutable {
        SeededRandom rng(splitmix64(seed ^ static_cast<uint64_t>(i)));
        return make(rng, i);
      },
      count, records_per_second);
}

/// The given records, in order (for tests and examples).
template <class T>
std::shared_ptr<DataGeneratorSource<T>> from_collection(std::vector<T> items) {
  auto shared = std::make_shared<const std::vector<T>>(std::move(items));
  auto n = static_cast<int64_t>(shared->size());
  return std::make_shared<DataGeneratorSource<T>>([shared](int64_t i) { return (*shared)[static_cast<size_t>(i)]; }, n);
}

}  // namespace datagen
}  // namespace sluice
