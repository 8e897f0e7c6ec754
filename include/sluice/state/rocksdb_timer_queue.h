// RocksDBTimerQueue: one time domain's timers of an operator subtask kept in RocksDB (Flink's
// state.backend.rocksdb.timer-service.factory: ROCKSDB; its RocksDBCachingPriorityQueueSet), so timers may
// outgrow memory with the state they clean up. InternalTimerService uses one per time domain when the job
// asks for it; this class knows bytes only (the typed service builds and parses the keys).
//
// Layout: a column family of the subtask's RocksDBInstance (its timer families, apart from the states'),
// with empty values and keys
//     [key group: 2 bytes big-endian][timestamp: 8 bytes big-endian, sign bit flipped][key bytes][namespace bytes]
// so keys compare as (key group, timestamp, key, namespace): one key group is one contiguous range, as in the
// state column families, and checkpoints, rescaling (copy and clip by key-group range) and restore treat the
// timers exactly as state. A timer is its key: adding it twice keeps one.
//
// Ordering and caching: each key group keeps in memory the up to kCachePerKeyGroup smallest keys it holds
// (an ordered cache; `complete` when it holds all of them), and the queue keeps the heads of the key groups in
// an ordered set, so next() is O(1) and add/remove touch RocksDB once plus O(log n) in memory; a key group's
// cache is refilled by one RocksDB seek when it runs empty. Equal timestamps fire in (key group, key,
// namespace) order (the heap queue fires them in registration order; Flink's RocksDB timers also by key group).
//
// Threading: the owning task thread; RocksDBTimerServiceSnapshot may be written on any thread.
// Errors: RocksDB failures throw SluiceException (kState), as RocksDBInstance.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/state/rocksdb_instance.h"
#include "sluice/state/timer_service_snapshot.h"

namespace sluice {

/// The timers of one time domain in one RocksDB column family (see the file comment).
class RocksDBTimerQueue {
 public:
  /// Key groups whose smallest keys a queue keeps in memory (Flink's RocksDB priority queue cache size).
  static constexpr size_t kCachePerKeyGroup = 128;
  /// Bytes before the key bytes: key group (2) and timestamp (8).
  static constexpr size_t kPrefixBytes = 10;

  /// A queue over the timer column family `family` of `db` for the key groups `range`. Reads what the family
  /// holds already (a restored database): one seek per key group. Throws kState on RocksDB failures.
  RocksDBTimerQueue(RocksDBInstance& db, std::string_view family, KeyGroupRange range);
  RocksDBTimerQueue(const RocksDBTimerQueue&) = delete;
  RocksDBTimerQueue& operator=(const RocksDBTimerQueue&) = delete;

  /// Appends the key-group and timestamp prefix of a timer key to `out`; the caller appends the key's and the
  /// namespace's TypeSerializer bytes.
  static void append_prefix(std::string& out, KeyGroup kg, TimestampMs ts);
  /// The timestamp of a timer key.
  static TimestampMs timestamp_of(std::string_view key);

  /// Adds the timer `key` (kept once); its key group must be in the range.
  void add(std::string_view key);
  /// Removes the timer `key` if present.
  void remove(std::string_view key);
  /// The earliest timestamp, or nullopt when empty.
  std::optional<TimestampMs> next() const;
  /// Removes the earliest timer (smallest key among the earliest timestamp) and returns its key. The queue
  /// must not be empty.
  std::string pop();
  /// The number of timers: a scan of the column family (for tests and metrics).
  size_t size() const;

  RocksDBInstance::ColumnFamily* column_family() const noexcept { return cf_; }

  /// Writes key group `kg` of `cf` in the canonical timer list format of docs/state-format.md (count, then
  /// key bytes, namespace bytes and i64 timestamp per timer), through `snapshot` when not null.
  static void write_canonical(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg,
                              const RocksDBInstance::Snapshot* snapshot, DataOutput& out);

 private:
  struct Group {
    std::set<std::string, std::less<>> cache;  // the smallest keys of the key group
    bool complete = true;                      // the cache holds every key of the key group
    std::optional<TimestampMs> head;           // the head's timestamp as entered in heads_
  };
  Group& group_of(std::string_view key);
  void refill(int32_t g);
  void update_head(int32_t g);

  RocksDBInstance& db_;
  RocksDBInstance::ColumnFamily* cf_;
  KeyGroupRange range_;
  std::vector<Group> groups_;
  std::set<std::pair<TimestampMs, int32_t>> heads_;  // (head timestamp, group index) of every non-empty group
};

/// The capture of RocksDB timers: a RocksDB snapshot of the database holding both time domains' families.
class RocksDBTimerServiceSnapshot final : public TimerServiceSnapshot {
 public:
  RocksDBTimerServiceSnapshot(KeyGroupRange range, std::shared_ptr<RocksDBInstance> db,
                              RocksDBInstance::ColumnFamily* event_time,
                              RocksDBInstance::ColumnFamily* processing_time);
  void write_timers(KeyGroup kg, DataOutput& out) const override;
  /// Nothing: an incremental checkpoint's files hold the timer column families.
  void write_timers_beside_native(KeyGroup, DataOutput&) const override {}

 private:
  KeyGroupRange range_;
  std::shared_ptr<RocksDBInstance> db_;
  std::shared_ptr<const RocksDBInstance::Snapshot> snapshot_;
  RocksDBInstance::ColumnFamily* event_time_;
  RocksDBInstance::ColumnFamily* processing_time_;
};

}  // namespace sluice
