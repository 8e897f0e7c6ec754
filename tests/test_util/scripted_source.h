// ScriptedSource: a bounded single-split source that emits a fixed script of records (with timestamps) and
// watermarks in order, so window tests control event time exactly.
#pragma once

#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "sluice/api/source.h"

namespace sluice::testing {

struct ScriptSplit {
  int64_t next = 0;
};

}  // namespace sluice::testing

namespace sluice {
template <>
struct TypeSerializer<testing::ScriptSplit> {
  static void serialize(const testing::ScriptSplit& s, DataOutput& out) { out.write_signed_varint(s.next); }
  static void deserialize(testing::ScriptSplit& s, DataInput& in) { s.next = in.read_signed_varint(); }
};
}  // namespace sluice

namespace sluice::testing {

/// One step of a script: a record with its timestamp, or a watermark.
template <class T>
struct Step {
  std::optional<T> record;
  TimestampMs time = 0;
  static Step rec(T r, TimestampMs ts) { return Step{std::move(r), ts}; }
  static Step wm(TimestampMs w) { return Step{std::nullopt, w}; }
};

template <class T>
class ScriptedSource final : public Source<T, ScriptSplit> {
 public:
  explicit ScriptedSource(std::vector<Step<T>> script)
      : script_(std::make_shared<std::vector<Step<T>>>(std::move(script))) {}
  Boundedness boundedness() const override { return Boundedness::kBounded; }
  std::unique_ptr<SplitEnumerator<ScriptSplit>> create_enumerator(
      SplitEnumeratorContext<ScriptSplit>& ctx) const override {
    return std::make_unique<StaticSplitEnumerator<ScriptSplit>>(ctx, std::vector<ScriptSplit>{ScriptSplit{}});
  }
  std::unique_ptr<SourceReader<T, ScriptSplit>> create_reader(SourceReaderContext& ctx) const override {
    return std::make_unique<Reader>(ctx, script_);
  }

 private:
  class Reader final : public SourceReader<T, ScriptSplit> {
   public:
    Reader(SourceReaderContext& ctx, std::shared_ptr<std::vector<Step<T>>> script)
        : ctx_(ctx), script_(std::move(script)) {}
    void start() override { ctx_.send_split_request(); }
    InputStatus poll_next(ReaderOutput<T>& out) override {
      if (!split_) return done_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
      if (split_->next >= static_cast<int64_t>(script_->size())) {
        split_.reset();
        ctx_.send_split_request();
        return InputStatus::kMoreAvailable;
      }
      const Step<T>& s = (*script_)[static_cast<size_t>(split_->next++)];
      if (s.record) {
        out.collect(T(*s.record), s.time);
      } else {
        out.emit_watermark(s.time);
      }
      return InputStatus::kMoreAvailable;
    }
    void add_splits(std::vector<ScriptSplit> splits) override { split_ = splits.front(); }
    void notify_no_more_splits() override { done_ = true; }

   private:
    SourceReaderContext& ctx_;
    std::shared_ptr<std::vector<Step<T>>> script_;
    std::optional<ScriptSplit> split_;
    bool done_ = false;
  };
  std::shared_ptr<std::vector<Step<T>>> script_;
};

}  // namespace sluice::testing
