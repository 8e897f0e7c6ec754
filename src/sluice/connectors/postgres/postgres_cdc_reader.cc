// PostgresCdcReader: the task-thread side of a Postgres CDC reader. It takes what its Fetcher decoded, emits it,
// keeps the split's position and checkpoints it, and confirms the slot once a checkpoint completes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "postgres_cdc_fetcher.h"
#include "postgres_cdc_stats.h"

namespace sluice {

using postgres_cdc_internal::Fetcher;
using postgres_cdc_internal::Item;
using postgres_cdc_internal::kRole;
using postgres_cdc_internal::Lsn;

namespace {

// Items the task takes per poll_next.
constexpr size_t kPollBatch = 1024;

class PostgresCdcReader final : public SourceReader<cdc::ChangeEvent, PostgresCdcSplit> {
 public:
  PostgresCdcReader(const detail::PostgresCdcSettings& settings, SourceReaderContext& ctx,
                    std::shared_ptr<detail::PostgresCdcStats> stats, std::shared_ptr<DeadLetterFile> dead_letter)
      : s_(settings), ctx_(ctx), stats_(std::move(stats)), dead_letter_(std::move(dead_letter)) {}
  ~PostgresCdcReader() override { close(); }

  void start() override { ctx_.send_split_request(); }

  InputStatus poll_next(ReaderOutput<cdc::ChangeEvent>& output) override {
    if (!split_) return no_more_splits_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
    items_.clear();
    fetcher_->take(items_, kPollBatch);
    int64_t events = 0;
    for (Item& it : items_) {
      switch (it.kind) {
        case Item::Kind::kEvent: {
          const int64_t ts = it.event.source.ts_ms;
          if (it.lsn != 0) {
            // An event of a streamed transaction: the position now names it (commit LSN, index).
            if (it.lsn != txn_lsn_) {
              txn_lsn_ = it.lsn;
              txn_events_ = 0;
              stats_->last_commit_ts_ms.store(ts, std::memory_order_relaxed);
            }
            ++txn_events_;
          }
          if (it.event.op == cdc::ChangeOp::kRead) {
            stats_->snapshot_events.fetch_add(1, std::memory_order_relaxed);
            ++snapshot_events_;
          }
          output.collect(std::move(it.event), ts);
          ++events;
          break;
        }
        case Item::Kind::kCommit:
          position_ = std::max(position_, it.lsn);
          txn_lsn_ = 0;
          txn_events_ = 0;
          stats_->transactions.fetch_add(1, std::memory_order_relaxed);
          stats_->last_commit_ts_ms.store(it.ts_ms, std::memory_order_relaxed);
          break;
        case Item::Kind::kHeartbeat:
          position_ = std::max(position_, it.lsn);
          stats_->heartbeats.fetch_add(1, std::memory_order_relaxed);
          break;
        case Item::Kind::kSnapshotDone:
          snapshot_done_ = true;
          overlap_lsn_ = it.overlap;
          position_ = std::max(position_, it.lsn);
          stats_->snapshot_done.store(true);
          break;
        case Item::Kind::kError:
          throw SluiceException(*it.error);
      }
    }
    stats_->events.fetch_add(events, std::memory_order_relaxed);
    stats_->position.store(position_, std::memory_order_relaxed);
    update_rate(events);
    return items_.empty() ? InputStatus::kNothingAvailable : InputStatus::kMoreAvailable;
  }

  void add_splits(std::vector<PostgresCdcSplit> splits) override {
    for (auto& sp : splits) {
      if (split_) {
        spdlog::warn("{}: reader already reads slot {}; ignoring another split for slot {}", kRole, split_->slot,
                     sp.slot);
        continue;
      }
      split_ = sp;
      snapshot_done_ = sp.snapshot_done;
      overlap_lsn_ = sp.snapshot_done ? static_cast<Lsn>(sp.overlap_lsn) : 0;
      position_ = static_cast<Lsn>(sp.lsn);
      txn_lsn_ = static_cast<Lsn>(sp.txn_lsn);
      txn_events_ = sp.txn_events;
      // An unfinished snapshot is read from its start (or refused, per on_interrupted_snapshot): its rows are
      // counted from 0 again.
      snapshot_events_ = 0;
      stats_->snapshot_done.store(snapshot_done_);
      stats_->position.store(position_);
      fetcher_ = std::make_unique<Fetcher>(s_, sp, ctx_, stats_, dead_letter_);
      fetcher_->start();
    }
  }
  void notify_no_more_splits() override { no_more_splits_ = true; }

  std::vector<PostgresCdcSplit> snapshot_state(int64_t checkpoint_id) override {
    if (!split_) return {};
    if (dead_letter_) dead_letter_->sync().value_or_throw();
    // The slot is confirmed up to the last complete transaction only: a partly emitted one must be streamed
    // again after a restore (its first txn_events_ events are then skipped).
    if (snapshot_done_) pending_[checkpoint_id] = position_;
    PostgresCdcSplit sp = *split_;
    sp.snapshot_done = snapshot_done_;
    sp.lsn = static_cast<int64_t>(position_);
    sp.txn_lsn = static_cast<int64_t>(txn_lsn_);
    sp.txn_events = txn_events_;
    sp.snapshot_events = snapshot_done_ ? 0 : snapshot_events_;
    // The overlap mark must survive restores: a restore inside the overlap streams its transactions again.
    sp.overlap_lsn = snapshot_done_ ? static_cast<int64_t>(overlap_lsn_) : 0;
    return {sp};
  }

  void notify_checkpoint_complete(int64_t checkpoint_id) override {
    auto it = pending_.find(checkpoint_id);
    if (it == pending_.end()) return;
    const Lsn lsn = it->second;
    pending_.erase(pending_.begin(), std::next(it));
    if (lsn != 0 && fetcher_) fetcher_->confirm(lsn);
  }

  void notify_checkpoint_aborted(int64_t checkpoint_id) override { pending_.erase(checkpoint_id); }

  void close() override {
    if (fetcher_) fetcher_->stop();
  }

 private:
  void update_rate(int64_t events) {
    rate_events_ += events;
    const auto now = std::chrono::steady_clock::now();
    if (rate_start_ == std::chrono::steady_clock::time_point{}) {
      rate_start_ = now;
      return;
    }
    const double secs = std::chrono::duration<double>(now - rate_start_).count();
    if (secs >= 1.0) {
      stats_->events_per_second.store(static_cast<double>(rate_events_) / secs, std::memory_order_relaxed);
      rate_events_ = 0;
      rate_start_ = now;
    }
  }

  const detail::PostgresCdcSettings s_;
  SourceReaderContext& ctx_;
  std::shared_ptr<detail::PostgresCdcStats> stats_;
  std::shared_ptr<DeadLetterFile> dead_letter_;
  std::optional<PostgresCdcSplit> split_;
  std::unique_ptr<Fetcher> fetcher_;
  std::vector<Item> items_;
  bool no_more_splits_ = false;
  bool snapshot_done_ = false;
  Lsn overlap_lsn_ = 0;  // the snapshot's overlap with the stream (PostgresCdcSplit::overlap_lsn)
  Lsn position_ = 0;
  Lsn txn_lsn_ = 0;                 // the commit LSN of the transaction being emitted (0 between transactions)
  int64_t txn_events_ = 0;          // its events emitted so far
  int64_t snapshot_events_ = 0;     // snapshot rows emitted by this reader (while the snapshot is not done)
  std::map<int64_t, Lsn> pending_;  // checkpoint id -> position
  int64_t rate_events_ = 0;
  std::chrono::steady_clock::time_point rate_start_{};
};

}  // namespace

namespace detail {

std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> make_postgres_cdc_reader(
    const PostgresCdcSettings& settings, SourceReaderContext& ctx, std::shared_ptr<PostgresCdcStats> stats,
    std::shared_ptr<DeadLetterFile> dead_letter) {
  return std::make_unique<PostgresCdcReader>(settings, ctx, std::move(stats), std::move(dead_letter));
}

}  // namespace detail

}  // namespace sluice
