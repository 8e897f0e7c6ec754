// KafkaSourceEnumerator: discovery at start and periodically, the owner rule, checkpoint markers.
#include "sluice/connectors/kafka/kafka_source_enumerator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>

#include "kafka_source_internals.h"
#include "sluice/core/assign_or_return.h"

namespace sluice {

using kafka_source_internal::kRole;
using kafka_source_internal::RateLimitedLog;

namespace {

// Bounds a periodic discovery round (its metadata request runs off the coordinator's lock; resolving the offsets
// of new partitions runs under it).
constexpr std::chrono::milliseconds kDiscoveryTimeout{5'000};

}  // namespace

namespace detail {

KafkaSourceEnumerator::KafkaSourceEnumerator(SplitEnumeratorContext<KafkaPartitionSplit>& ctx,
                                             std::unique_ptr<KafkaPartitionDiscoverer> discoverer, Options options)
    : ctx_(ctx), discoverer_(std::move(discoverer)), options_(std::move(options)) {}

void KafkaSourceEnumerator::start() {
  if (!restored_) {
    Status st = discover_and_assign(/*initial=*/true, options_.startup_timeout);
    if (!st.ok()) throw SluiceException(st.error());
    spdlog::info("{} ({}): {} partitions, starting at {}{}", kRole, options_.description, pending_count(),
                 options_.starting.describe(), options_.bounded ? ", bounded by the latest offsets at start" : "");
  } else if (!options_.bounded) {
    // Readers resume their restored splits; partitions never seen before start from the earliest offset.
    Status st = discover_and_assign(/*initial=*/false, std::min(options_.startup_timeout, kDiscoveryTimeout));
    if (!st.ok()) {
      spdlog::warn("{} ({}): partition discovery after the restore failed, retrying periodically: {}", kRole,
                   options_.description, st.error().to_string());
    }
  }
  if (discovery_enabled()) {
    auto failures = std::make_shared<RateLimitedLog>(std::chrono::seconds(60));
    auto warn = [this, failures](const Error& e) {
      int64_t suppressed = 0;
      if (failures->allow(suppressed)) {
        spdlog::warn("{} ({}): partition discovery failed ({} more failures not logged): {}", kRole,
                     options_.description, suppressed, e.to_string());
      }
    };
    // The metadata request runs off the coordinator's lock; the result is applied under it.
    ctx_.call_async(
        [this, discoverer = discoverer_, warn]() -> std::function<void()> {
          Result<std::vector<KafkaTopicPartition>> found = discoverer->discover(kDiscoveryTimeout);
          return [this, found = std::move(found), warn] {
            if (!discoverer_) return;
            Status st = found.ok() ? assign_discovered(*found, /*initial=*/false, kDiscoveryTimeout) : found.error();
            if (!st.ok()) warn(st.error());
          };
        },
        options_.discovery_interval_ms);
  }
}

Status KafkaSourceEnumerator::discover_and_assign(bool initial, std::chrono::milliseconds timeout) {
  if (!discoverer_) return ok_status();
  SLUICE_ASSIGN_OR_RETURN(std::vector<KafkaTopicPartition> found, discoverer_->discover(timeout));
  return assign_discovered(found, initial, timeout);
}

Status KafkaSourceEnumerator::assign_discovered(const std::vector<KafkaTopicPartition>& found, bool initial,
                                                std::chrono::milliseconds timeout) {
  if (!discoverer_) return ok_status();
  std::set<KafkaTopicPartition> known = assigned_;
  for (const auto& [owner, splits] : pending_) {
    for (const KafkaPartitionSplit& s : splits)
      known.insert(s.topic_partition());
  }
  std::vector<KafkaTopicPartition> fresh;
  for (const KafkaTopicPartition& tp : found) {
    if (known.count(tp) == 0) fresh.push_back(tp);
  }
  if (fresh.empty()) return ok_status();
  const KafkaStartingOffsets starting = initial ? options_.starting : KafkaStartingOffsets::earliest();
  Result<std::vector<KafkaPartitionSplit>> splits =
      discoverer_->make_splits(fresh, starting, options_.bounded, timeout);
  if (!splits.ok()) return splits.error();
  if (!initial) {
    std::vector<std::string> names;
    for (const KafkaTopicPartition& tp : fresh)
      names.push_back(tp.topic + "-" + std::to_string(tp.partition));
    spdlog::info("{} ({}): discovered {} new partition(s), reading them from the earliest offset: {}", kRole,
                 options_.description, fresh.size(), fmt::join(names, ", "));
  }
  for (KafkaPartitionSplit& s : *splits)
    add_pending(std::move(s));
  for (int r : registered_)
    assign_pending(r);
  return ok_status();
}

void KafkaSourceEnumerator::add_pending(KafkaPartitionSplit split) {
  split.assigned = false;
  const int owner = kafka::split_owner(split.topic, split.partition, std::max(1, ctx_.current_parallelism()));
  pending_[owner].push_back(std::move(split));
}

void KafkaSourceEnumerator::assign_pending(int subtask) {
  auto it = pending_.find(subtask);
  if (it == pending_.end()) return;
  std::vector<KafkaPartitionSplit> splits = std::move(it->second);
  pending_.erase(it);
  for (KafkaPartitionSplit& s : splits) {
    assigned_.insert(s.topic_partition());
    ctx_.assign_split(std::move(s), subtask);
  }
}

void KafkaSourceEnumerator::add_reader(int subtask) {
  registered_.insert(subtask);
  assign_pending(subtask);
  if (!discovery_enabled()) ctx_.signal_no_more_splits(subtask);
}

void KafkaSourceEnumerator::add_splits_back(std::vector<KafkaPartitionSplit> splits, int subtask) {
  registered_.erase(subtask);
  for (KafkaPartitionSplit& s : splits) {
    assigned_.erase(s.topic_partition());
    add_pending(std::move(s));
  }
  for (int r : registered_)
    assign_pending(r);
}

std::vector<KafkaPartitionSplit> KafkaSourceEnumerator::snapshot_state(int64_t /*checkpoint_id*/) {
  std::vector<KafkaPartitionSplit> out;
  for (const auto& [owner, splits] : pending_)
    out.insert(out.end(), splits.begin(), splits.end());
  for (const KafkaTopicPartition& tp : assigned_)
    out.push_back(KafkaPartitionSplit{tp.topic, tp.partition, 0, std::nullopt, true});
  return out;
}

void KafkaSourceEnumerator::restore_state(std::vector<KafkaPartitionSplit> splits) {
  restored_ = true;
  assigned_.clear();
  pending_.clear();
  for (KafkaPartitionSplit& s : splits) {
    if (s.assigned) {
      assigned_.insert(s.topic_partition());
    } else {
      add_pending(std::move(s));
    }
  }
}

void KafkaSourceEnumerator::close() {
  discoverer_.reset();
}

size_t KafkaSourceEnumerator::pending_count() const noexcept {
  size_t n = 0;
  for (const auto& [owner, splits] : pending_)
    n += splits.size();
  return n;
}

}  // namespace detail

}  // namespace sluice
