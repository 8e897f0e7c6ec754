#include "sluice/state/rocksdb_timer_queue.h"

#include <string>

#include "sluice/core/error.h"
#include "sluice/state/heap_state.h"

namespace sluice {

namespace {

constexpr uint64_t kSignBit = uint64_t{1} << 63;

std::string key_group_prefix(int32_t kg) {
  return std::string{static_cast<char>((kg >> 8) & 0xff), static_cast<char>(kg & 0xff)};
}

int32_t key_group_of_key(std::string_view key) {
  return (static_cast<int32_t>(static_cast<uint8_t>(key[0])) << 8) | static_cast<uint8_t>(key[1]);
}

}  // namespace

void RocksDBTimerQueue::append_prefix(std::string& out, KeyGroup kg, TimestampMs ts) {
  out.push_back(static_cast<char>((kg.value >> 8) & 0xff));
  out.push_back(static_cast<char>(kg.value & 0xff));
  // Big-endian with the sign bit flipped: bytewise order is numeric order, negative timestamps included.
  const uint64_t u = static_cast<uint64_t>(ts) ^ kSignBit;
  for (int shift = 56; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((u >> shift) & 0xff));
}

TimestampMs RocksDBTimerQueue::timestamp_of(std::string_view key) {
  uint64_t u = 0;
  for (size_t i = 2; i < kPrefixBytes; ++i)
    u = (u << 8) | static_cast<uint8_t>(key[i]);
  return static_cast<TimestampMs>(u ^ kSignBit);
}

RocksDBTimerQueue::RocksDBTimerQueue(RocksDBInstance& db, std::string_view family, KeyGroupRange range)
    : db_(db), cf_(db.timer_column_family(family)), range_(range), groups_(static_cast<size_t>(range.size())) {
  for (int32_t g = 0; g < range_.size(); ++g) {
    groups_[g].complete = false;
    refill(g);
    update_head(g);  // a restored database's timers are due without any further add
  }
}

RocksDBTimerQueue::Group& RocksDBTimerQueue::group_of(std::string_view key) {
  if (key.size() < kPrefixBytes) [[unlikely]]
    detail::throw_state_error("a RocksDB timer key of " + std::to_string(key.size()) +
                              " bytes is shorter than its prefix");
  const KeyGroup kg{key_group_of_key(key)};
  if (!range_.contains(kg)) [[unlikely]] {
    detail::throw_state_error("a RocksDB timer of key group " + std::to_string(kg.value) +
                              " is outside the timer queue's range " + range_.to_string());
  }
  return groups_[static_cast<size_t>(kg.value - range_.start())];
}

void RocksDBTimerQueue::add(std::string_view key) {
  Group& group = group_of(key);
  const auto g = static_cast<int32_t>(&group - groups_.data());
  if (group.cache.find(key) != group.cache.end()) return;  // cached timers are in RocksDB: nothing to write
  db_.put(cf_, key, {});
  // The cache holds the smallest keys of the group: a key below its largest belongs in it (the largest then
  // leaves when the cache is full); a key above it stays in RocksDB alone, unless the cache holds everything.
  if (group.complete || (!group.cache.empty() && key < *group.cache.rbegin())) {
    group.cache.emplace(key);
    if (group.cache.size() > kCachePerKeyGroup) {
      group.cache.erase(std::prev(group.cache.end()));
      group.complete = false;
    }
  }
  update_head(g);
}

void RocksDBTimerQueue::remove(std::string_view key) {
  Group& group = group_of(key);
  const auto g = static_cast<int32_t>(&group - groups_.data());
  auto it = group.cache.find(key);
  if (it == group.cache.end()) {
    if (group.complete) return;  // known absent: no tombstone
    db_.remove(cf_, key);
    return;  // not among the smallest: the head is unchanged
  }
  db_.remove(cf_, key);
  group.cache.erase(it);
  if (group.cache.empty() && !group.complete) refill(g);
  update_head(g);
}

std::optional<TimestampMs> RocksDBTimerQueue::next() const {
  if (heads_.empty()) return std::nullopt;
  return heads_.begin()->first;
}

std::string RocksDBTimerQueue::pop() {
  const int32_t g = heads_.begin()->second;
  Group& group = groups_[static_cast<size_t>(g)];
  auto node = group.cache.extract(group.cache.begin());
  db_.remove(cf_, node.value());
  if (group.cache.empty() && !group.complete) refill(g);
  update_head(g);
  return std::move(node.value());
}

size_t RocksDBTimerQueue::size() const {
  size_t n = 0;
  db_.scan(cf_, {}, nullptr, [&n](std::string_view, std::string_view) {
    ++n;
    return true;
  });
  return n;
}

void RocksDBTimerQueue::refill(int32_t g) {
  Group& group = groups_[static_cast<size_t>(g)];
  group.cache.clear();
  size_t seen = 0;
  db_.scan(cf_, key_group_prefix(range_.start() + g), nullptr, [&](std::string_view key, std::string_view) {
    if (++seen > kCachePerKeyGroup) return false;  // one more than the cache: the group holds more
    group.cache.emplace(key);
    return true;
  });
  group.complete = seen <= kCachePerKeyGroup;
}

void RocksDBTimerQueue::update_head(int32_t g) {
  Group& group = groups_[static_cast<size_t>(g)];
  std::optional<TimestampMs> head;
  if (!group.cache.empty()) head = timestamp_of(*group.cache.begin());
  if (head == group.head) return;
  if (group.head) heads_.erase({*group.head, g});
  if (head) heads_.emplace(*head, g);
  group.head = head;
}

void RocksDBTimerQueue::write_canonical(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg,
                                        const RocksDBInstance::Snapshot* snapshot, DataOutput& out) {
  // Count first (a varint), so the entries go through a scratch buffer.
  DataOutput entries;
  uint64_t count = 0;
  if (cf != nullptr) {
    db.scan(cf, key_group_prefix(kg.value), snapshot, [&](std::string_view key, std::string_view) {
      // The key's and namespace's serializer bytes follow the prefix back to back, as the canonical entry has them.
      entries.write_bytes(key.data() + kPrefixBytes, key.size() - kPrefixBytes);
      entries.write_fixed<int64_t>(timestamp_of(key));
      ++count;
      return true;
    });
  }
  out.write_varint(count);
  out.write_bytes(entries.data(), entries.size());
}

RocksDBTimerServiceSnapshot::RocksDBTimerServiceSnapshot(KeyGroupRange range, std::shared_ptr<RocksDBInstance> db,
                                                         RocksDBInstance::ColumnFamily* event_time,
                                                         RocksDBInstance::ColumnFamily* processing_time)
    : range_(range),
      db_(std::move(db)),
      snapshot_(db_->snapshot()),
      event_time_(event_time),
      processing_time_(processing_time) {}

void RocksDBTimerServiceSnapshot::write_timers(KeyGroup kg, DataOutput& out) const {
  if (!range_.contains(kg)) {
    detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside the captured timer range " +
                              range_.to_string());
  }
  out.write_varint(detail::kStateFormatVersion);
  out.write_varint(static_cast<uint64_t>(kg.value));
  RocksDBTimerQueue::write_canonical(*db_, event_time_, kg, snapshot_.get(), out);
  RocksDBTimerQueue::write_canonical(*db_, processing_time_, kg, snapshot_.get(), out);
}

}  // namespace sluice
