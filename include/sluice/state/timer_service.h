// InternalTimerService<K, N>: event-time and processing-time timers per (key, namespace, timestamp) of one
// operator subtask (Flink's InternalTimerServiceImpl).
//
// A timer is identified by its key, namespace and timestamp: registering it twice keeps one timer, and a
// timer fires exactly once (it is removed before its callback runs). Each time domain keeps one priority
// queue ordered by timestamp, ties in registration order, plus a dedup set per key group (Flink's
// KeyGroupPartitionedPriorityQueue), so timers are snapshotted and rescaled with their key groups like
// keyed state. Register and delete are O(log n); the next timestamp is O(1).
//
// Timers are registered for the backend's current key. Firing (advance_watermark, on_processing_time)
// makes each timer's key current in the backend before calling `on_timer(key, ns, ts)`; the callback may
// register and delete timers, and a timer it registers at or before the time being advanced to fires in
// the same call. An event-time timer at or before the current watermark fires at the next watermark
// advance; a processing-time timer in the past fires at the next on_processing_time call. If a callback
// throws, its timer is gone and the exception propagates (the task fails and restores from a checkpoint).
//
// Where timers live: in memory (the default; Flink's timer-service.factory HEAP), or, with the rocksdb state
// backend and state.backend.rocksdb.timer-service.factory: rocksdb, in the subtask's RocksDB database
// (use_rocksdb(): one RocksDBTimerQueue per time domain, rocksdb_timer_queue.h), so timers can outgrow memory.
// Both write the same snapshots, so checkpoints and savepoints move between them; RocksDB timers fire equal
// timestamps in (key group, key, namespace) order rather than registration order.
//
// The watermark is not snapshotted (as in Flink): it restarts at kInitialWatermark after a restore.
//
// Snapshots: snapshot() / snapshot_key_group() write synchronously; capture() serializes every key group
// into a TimerServiceSnapshot at once (timers are usually few, so the copy is the capture) that any thread
// can then write while the task goes on.
//
// Lifecycle: created after its backend (which must outlive it) → restore (optional) → running →
// snapshot or capture at checkpoints. Threading: the owning task thread only (except the snapshots
// capture() returns); callbacks must not re-enter advance_watermark or on_processing_time.
#pragma once

#include <absl/container/node_hash_set.h>
#include <absl/hash/hash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/heap_state.h"
#include "sluice/state/rocksdb_timer_queue.h"
#include "sluice/state/state.h"
#include "sluice/state/timer_service_snapshot.h"

namespace sluice {

namespace detail {
/// Magic bytes at the start of a whole-range timer snapshot.
inline constexpr char kTimersMagic[4] = {'S', 'L', 'T', 'M'};
}  // namespace detail

/// The timers of a heap InternalTimerService as they were at capture(), already serialized per key group.
///
/// Thread-safety: immutable; write_timers() may run on any thread, concurrently with the task thread
/// (which no longer shares anything with it). Destroyed on any thread.
class HeapTimerServiceSnapshot final : public TimerServiceSnapshot {
 public:
  /// Built by InternalTimerService::capture(): `bytes` holds the key groups of `range` back to back, group
  /// index i at [offsets[i], offsets[i + 1]).
  HeapTimerServiceSnapshot(KeyGroupRange range, std::string bytes, std::vector<size_t> offsets)
      : range_(range), bytes_(std::move(bytes)), offsets_(std::move(offsets)) {}

  /// The bytes InternalTimerService::snapshot_key_group(kg) wrote at capture time. Throws
  /// SluiceException (kState) when `kg` is outside key_group_range().
  std::string_view key_group_bytes(KeyGroup kg) const {
    if (!range_.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside the captured timer range " +
                                range_.to_string());
    }
    size_t g = static_cast<size_t>(kg.value - range_.start());
    return std::string_view(bytes_).substr(offsets_[g], offsets_[g + 1] - offsets_[g]);
  }

  /// Appends key_group_bytes(kg).
  void write_timers(KeyGroup kg, DataOutput& out) const override {
    std::string_view b = key_group_bytes(kg);
    out.write_bytes(b.data(), b.size());
  }

 private:
  KeyGroupRange range_;
  std::string bytes_;
  std::vector<size_t> offsets_;
};

template <class K, class N = VoidNamespace>
class InternalTimerService {
 public:
  /// The watermark before the first one arrives (Flink's Long.MIN_VALUE).
  static constexpr TimestampMs kInitialWatermark = std::numeric_limits<int64_t>::min();

  /// A timer service for the keys of `backend`, which must outlive it.
  explicit InternalTimerService(HeapKeyedStateBackend<K>& backend)
      : backend_(backend),
        event_time_(backend.key_group_range().size()),
        processing_time_(backend.key_group_range().size()) {}
  InternalTimerService(const InternalTimerService&) = delete;
  InternalTimerService& operator=(const InternalTimerService&) = delete;

  /// Registers an event-time timer for the current key (no-op if it exists). Throws kState without a key.
  void register_event_time_timer(const N& ns, TimestampMs ts) { add(event_time_, rocks_event_.get(), ns, ts); }
  /// Deletes the event-time timer of the current key, `ns` and `ts` if it exists.
  void delete_event_time_timer(const N& ns, TimestampMs ts) { remove(event_time_, rocks_event_.get(), ns, ts); }
  /// Registers a processing-time timer for the current key (no-op if it exists).
  void register_processing_time_timer(const N& ns, TimestampMs ts) {
    add(processing_time_, rocks_processing_.get(), ns, ts);
  }
  /// Deletes the processing-time timer of the current key, `ns` and `ts` if it exists.
  void delete_processing_time_timer(const N& ns, TimestampMs ts) {
    remove(processing_time_, rocks_processing_.get(), ns, ts);
  }

  /// Keeps the timers in `db` from now on: the column families kEventTimeFamily and kProcessingTimeFamily
  /// (created when missing; what they hold already, in a database restored from an incremental checkpoint, is
  /// read). Call before any timer is registered, and again with the new database when a restore replaced it;
  /// `db` must outlive the service's use of it. Task thread; throws kState on RocksDB failures.
  void use_rocksdb(RocksDBInstance& db) {
    if (num_in_heap() != 0) {
      detail::throw_state_error("timers are moved into RocksDB only before any is registered or restored");
    }
    // Both queues first: when one throws, the service keeps the database it had.
    auto event_time = std::make_unique<RocksDBTimerQueue>(db, kEventTimeFamily, backend_.key_group_range());
    auto processing_time = std::make_unique<RocksDBTimerQueue>(db, kProcessingTimeFamily, backend_.key_group_range());
    rocks_event_ = std::move(event_time);
    rocks_processing_ = std::move(processing_time);
    rocks_db_ = &db;
  }

  /// Moves into this (heap) service the timers `db` holds in RocksDB timer column families, and drops those
  /// families: a database restored from an incremental checkpoint taken with RocksDB timers, by a job that keeps
  /// timers on the heap. Task thread. Throws kState for a timer of another key group, kSerialization for corrupt
  /// keys.
  void adopt_rocksdb_timers(RocksDBInstance& db) {
    adopt(db, kEventTimeFamily, event_time_);
    adopt(db, kProcessingTimeFamily, processing_time_);
  }

  /// The RocksDB column families of the two time domains (Flink names them _timer_state/event_... and
  /// _timer_state/processing_...).
  static constexpr std::string_view kEventTimeFamily = "event";
  static constexpr std::string_view kProcessingTimeFamily = "processing";

  /// The last watermark passed to advance_watermark (kInitialWatermark before the first).
  TimestampMs current_watermark() const noexcept { return watermark_; }
  /// The processing time of the backend's clock.
  TimestampMs current_processing_time() const { return backend_.clock().now_ms(); }

  /// Sets the watermark to `watermark` and fires, in timestamp order, every event-time timer with
  /// timestamp <= watermark, calling on_timer(const K& key, const N& ns, TimestampMs ts) with the key
  /// made current in the backend.
  template <class Fn>
  void advance_watermark(TimestampMs watermark, Fn&& on_timer) {
    watermark_ = watermark;
    fire_until(event_time_, rocks_event_.get(), watermark, on_timer);
  }

  /// Fires, in timestamp order, every processing-time timer with timestamp <= now (the task calls this when
  /// the time from next_processing_time() has come).
  template <class Fn>
  void on_processing_time(TimestampMs now, Fn&& on_timer) {
    fire_until(processing_time_, rocks_processing_.get(), now, on_timer);
  }

  /// The earliest processing-time timer, for scheduling the task's wake-up.
  std::optional<TimestampMs> next_processing_time() const {
    return rocks_processing_ ? rocks_processing_->next() : processing_time_.next();
  }
  /// The earliest event-time timer.
  std::optional<TimestampMs> next_event_time() const {
    return rocks_event_ ? rocks_event_->next() : event_time_.next();
  }

  /// The number of timers of each domain (with RocksDB timers a scan: for tests and metrics).
  size_t num_event_time_timers() const { return rocks_event_ ? rocks_event_->size() : event_time_.size(); }
  size_t num_processing_time_timers() const {
    return rocks_processing_ ? rocks_processing_->size() : processing_time_.size();
  }

  /// Appends the timers of key group `kg` (docs/state-format.md). Throws kState outside the range.
  void snapshot_key_group(KeyGroup kg, DataOutput& out) const {
    int32_t g = group_index(kg);
    out.write_varint(detail::kStateFormatVersion);
    out.write_varint(static_cast<uint64_t>(kg.value));
    if (rocks_db_ != nullptr) {
      RocksDBTimerQueue::write_canonical(*rocks_db_, rocks_event_->column_family(), kg, nullptr, out);
      RocksDBTimerQueue::write_canonical(*rocks_db_, rocks_processing_->column_family(), kg, nullptr, out);
      return;
    }
    event_time_.write_group(g, out);
    processing_time_.write_group(g, out);
  }

  /// Captures the timers for an asynchronous checkpoint: the returned snapshot's write_timers(kg)
  /// writes what snapshot_key_group(kg) writes now. On the heap timers are usually few (a handful per key and
  /// window), so this serializes every key group synchronously, here on the task thread (O(timers), part of the
  /// checkpoint pause), rather than sharing the queues copy-on-write as the state backend does. RocksDB timers
  /// are captured as a RocksDB snapshot (O(1)) and read when written. Task thread only.
  std::unique_ptr<TimerServiceSnapshot> capture() const {
    const KeyGroupRange& range = backend_.key_group_range();
    if (rocks_db_ != nullptr) {
      return std::make_unique<RocksDBTimerServiceSnapshot>(
          range, rocks_db_->shared_from_this(), rocks_event_->column_family(), rocks_processing_->column_family());
    }
    DataOutput out;
    std::vector<size_t> offsets;
    offsets.reserve(static_cast<size_t>(range.size()) + 1);
    for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
      offsets.push_back(out.size());
      snapshot_key_group(KeyGroup{kg}, out);
    }
    offsets.push_back(out.size());
    return std::make_unique<HeapTimerServiceSnapshot>(range, std::string(out.view()), std::move(offsets));
  }

  /// Restores the timers of one key group written by any subtask with the same max parallelism; existing
  /// timers are kept (duplicates collapse). Errors: kState outside the range or for a timer of another key
  /// group, kSerialization for corrupt bytes.
  [[nodiscard]] Status restore_key_group(KeyGroup kg, DataInput& in) {
    try {
      restore_group(kg, in);
      return ok_status();
    } catch (const SluiceException& e) {
      return e.error().with_context("restoring timers of key group " + std::to_string(kg.value));
    }
  }

  /// Appends the timers of the whole range: header, then every key group.
  void snapshot(DataOutput& out) const {
    const KeyGroupRange& range = backend_.key_group_range();
    out.write_bytes(detail::kTimersMagic, sizeof(detail::kTimersMagic));
    out.write_varint(detail::kStateFormatVersion);
    out.write_varint(static_cast<uint64_t>(backend_.max_parallelism()));
    out.write_varint(static_cast<uint64_t>(range.size()));
    for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
      out.write_varint(static_cast<uint64_t>(kg));
      size_t length_at = out.size();
      out.write_fixed<uint64_t>(0);
      snapshot_key_group(KeyGroup{kg}, out);
      detail::end_length_prefixed(out, length_at);
    }
  }

  /// Restores a whole-range timer snapshot, keeping the key groups of this backend's range.
  [[nodiscard]] Status restore(DataInput& in) {
    try {
      char magic[4];
      in.read_bytes(magic, sizeof(magic));
      if (std::memcmp(magic, detail::kTimersMagic, sizeof(magic)) != 0) in.fail("not a timer snapshot (bad magic)");
      check_version(in.read_varint(), in);
      uint64_t maxp = in.read_varint();
      if (maxp != static_cast<uint64_t>(backend_.max_parallelism())) {
        return Error(ErrorCode::kState, "restoring timers: the snapshot was taken with max parallelism " +
                                            std::to_string(maxp) + " but this operator has max parallelism " +
                                            std::to_string(backend_.max_parallelism()));
      }
      uint64_t num_groups = in.read_varint();
      for (uint64_t i = 0; i < num_groups; ++i) {
        uint64_t kg = in.read_varint();
        if (kg >= maxp) in.fail("key group " + std::to_string(kg) + " out of range");
        uint64_t length = in.read_fixed<uint64_t>();
        if (length > in.remaining()) in.fail("key group length exceeds the remaining bytes");
        std::string_view bytes = in.read_view(static_cast<size_t>(length));
        KeyGroup group{static_cast<int32_t>(kg)};
        if (!backend_.key_group_range().contains(group)) continue;
        DataInput group_in(bytes);
        restore_group(group, group_in);
      }
      if (!in.at_end()) in.fail("trailing bytes after the last key group");
      return ok_status();
    } catch (const SluiceException& e) {
      return e.error().with_context("restoring timers");
    }
  }

 private:
  // One time domain: a binary min-heap of (timestamp, sequence) over nodes kept in per-key-group
  // node_hash_sets (stable addresses; a node knows its heap position, so delete is O(log n)).
  class TimerQueue {
   public:
    struct Node {
      K key;
      N ns;
      TimestampMs ts;
      uint64_t key_hash;
      size_t hash;
      int32_t group;
      mutable uint64_t seq;
      mutable size_t heap_pos;
    };
    struct Probe {
      const K* key;
      const N* ns;
      TimestampMs ts;
      size_t hash;
    };
    struct Fired {
      K key;
      N ns;
      TimestampMs ts;
      uint64_t key_hash;
    };

    explicit TimerQueue(int32_t num_groups) : groups_(static_cast<size_t>(num_groups)) {}

    size_t size() const noexcept { return heap_.size(); }
    std::optional<TimestampMs> next() const {
      if (heap_.empty()) return std::nullopt;
      return heap_.front().ts;
    }

    bool add(int32_t g, const K& key, uint64_t key_hash, const N& ns, TimestampMs ts) {
      size_t h = node_hash(key_hash, ns, ts);
      Set& set = groups_[g];
      if (set.find(Probe{&key, &ns, ts, h}) != set.end()) return false;
      auto [it, inserted] = set.insert(Node{key, ns, ts, key_hash, h, g, next_seq_++, heap_.size()});
      heap_.push_back(HeapEntry{ts, it->seq, &*it});
      sift_up(heap_.size() - 1);
      return inserted;
    }

    bool remove(int32_t g, const K& key, uint64_t key_hash, const N& ns, TimestampMs ts) {
      Set& set = groups_[g];
      auto it = set.find(Probe{&key, &ns, ts, node_hash(key_hash, ns, ts)});
      if (it == set.end()) return false;
      remove_heap_at(it->heap_pos);
      set.erase(it);
      return true;
    }

    // Removes the earliest timer and returns it; the queue must not be empty.
    Fired pop() {
      const Node* top = heap_.front().node;
      Set& set = groups_[top->group];
      remove_heap_at(0);
      auto handle = set.extract(set.find(*top));
      Node& n = handle.value();
      return Fired{std::move(n.key), std::move(n.ns), n.ts, n.key_hash};
    }

    // Writes the timers of group g ordered by (timestamp, sequence): count, then key, namespace, ts.
    void write_group(int32_t g, DataOutput& out) const {
      std::vector<const Node*> nodes;
      nodes.reserve(groups_[g].size());
      for (const Node& n : groups_[g])
        nodes.push_back(&n);
      std::sort(nodes.begin(), nodes.end(),
                [](const Node* a, const Node* b) { return a->ts != b->ts ? a->ts < b->ts : a->seq < b->seq; });
      out.write_varint(nodes.size());
      for (const Node* n : nodes) {
        TypeSerializer<K>::serialize(n->key, out);
        TypeSerializer<N>::serialize(n->ns, out);
        out.write_fixed<int64_t>(n->ts);
      }
    }

    static size_t node_hash(uint64_t key_hash, const N& ns, TimestampMs ts) {
      return absl::HashOf(key_hash, detail::StateHasher<N>{}(ns), ts);
    }

   private:
    struct NodeHash {
      using is_transparent = void;
      size_t operator()(const Node& n) const { return n.hash; }
      size_t operator()(const Probe& p) const { return p.hash; }
    };
    struct NodeEq {
      using is_transparent = void;
      bool operator()(const Node& a, const Node& b) const {
        return a.hash == b.hash && a.ts == b.ts && a.key == b.key && a.ns == b.ns;
      }
      bool operator()(const Node& a, const Probe& p) const {
        return a.hash == p.hash && a.ts == p.ts && a.key == *p.key && a.ns == *p.ns;
      }
      bool operator()(const Probe& p, const Node& a) const { return (*this)(a, p); }
    };
    using Set = absl::node_hash_set<Node, NodeHash, NodeEq>;
    struct HeapEntry {
      TimestampMs ts;
      uint64_t seq;
      const Node* node;
    };

    static bool before(const HeapEntry& a, const HeapEntry& b) noexcept {
      return a.ts != b.ts ? a.ts < b.ts : a.seq < b.seq;
    }
    void place(size_t i, const HeapEntry& e) noexcept {
      heap_[i] = e;
      e.node->heap_pos = i;
    }
    void sift_up(size_t i) noexcept {
      HeapEntry e = heap_[i];
      while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(e, heap_[parent])) break;
        place(i, heap_[parent]);
        i = parent;
      }
      place(i, e);
    }
    void sift_down(size_t i) noexcept {
      HeapEntry e = heap_[i];
      const size_t n = heap_.size();
      while (true) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
        if (!before(heap_[child], e)) break;
        place(i, heap_[child]);
        i = child;
      }
      place(i, e);
    }
    void remove_heap_at(size_t i) noexcept {
      HeapEntry last = heap_.back();
      heap_.pop_back();
      if (i == heap_.size()) return;
      place(i, last);
      if (i > 0 && before(last, heap_[(i - 1) / 2])) {
        sift_up(i);
      } else {
        sift_down(i);
      }
    }

    std::vector<Set> groups_;
    std::vector<HeapEntry> heap_;
    uint64_t next_seq_ = 0;
  };

  void add(TimerQueue& queue, RocksDBTimerQueue* rocks, const N& ns, TimestampMs ts) {
    const auto& ctx = current();
    if (rocks != nullptr) [[unlikely]] {
      rocks->add(rocks_key(ctx, ns, ts));
      return;
    }
    queue.add(ctx.group, ctx.key, ctx.key_hash, ns, ts);
  }
  void remove(TimerQueue& queue, RocksDBTimerQueue* rocks, const N& ns, TimestampMs ts) {
    const auto& ctx = current();
    if (rocks != nullptr) [[unlikely]] {
      rocks->remove(rocks_key(ctx, ns, ts));
      return;
    }
    queue.remove(ctx.group, ctx.key, ctx.key_hash, ns, ts);
  }

  // The RocksDB key of the current key's timer (rocksdb_timer_queue.h), in a buffer reused per call.
  const std::string& rocks_key(const detail::KeyContext<K>& ctx, const N& ns, TimestampMs ts) {
    rocks_key_.clear();
    RocksDBTimerQueue::append_prefix(rocks_key_, ctx.key_group, ts);
    rocks_bytes_.clear();
    TypeSerializer<K>::serialize(ctx.key, rocks_bytes_);
    TypeSerializer<N>::serialize(ns, rocks_bytes_);
    rocks_key_.append(rocks_bytes_.view());
    return rocks_key_;
  }

  // Parses a RocksDB timer key into its key (and the hash of its bytes), namespace and timestamp; checks that the
  // key belongs to the key group of the prefix. Throws kSerialization or kState.
  TimestampMs parse_rocks_key(std::string_view rocks_key, K& key, uint64_t& hash, N& ns) const {
    DataInput in(rocks_key.substr(RocksDBTimerQueue::kPrefixBytes));
    const uint8_t* key_start = in.current();
    TypeSerializer<K>::deserialize(key, in);
    hash = key_hash({key_start, static_cast<size_t>(in.current() - key_start)});
    TypeSerializer<N>::deserialize(ns, in);
    if (!in.at_end()) in.fail("trailing bytes after a RocksDB timer's namespace");
    const KeyGroup prefix_kg{(static_cast<int32_t>(static_cast<uint8_t>(rocks_key[0])) << 8) |
                             static_cast<uint8_t>(rocks_key[1])};
    const KeyGroup found = key_group_for_hash(hash, backend_.max_parallelism());
    if (found != prefix_kg) {
      detail::throw_entry_in_wrong_key_group("a RocksDB timer", found, prefix_kg, backend_.max_parallelism());
    }
    return RocksDBTimerQueue::timestamp_of(rocks_key);
  }

  void adopt(RocksDBInstance& db, std::string_view family, TimerQueue& queue) {
    RocksDBInstance::ColumnFamily* cf = db.find_timer_column_family(family);
    if (cf == nullptr) return;
    const KeyGroupRange& range = backend_.key_group_range();
    db.scan(cf, {}, nullptr, [&](std::string_view k, std::string_view) {
      uint64_t hash = 0;
      const TimestampMs ts = parse_rocks_key(k, read_key_, hash, read_ns_);
      const KeyGroup kg = key_group_for_hash(hash, backend_.max_parallelism());
      if (!range.contains(kg)) return true;  // clipped away by the restore (range deletions hide it already)
      queue.add(kg.value - range.start(), read_key_, hash, read_ns_, ts);
      return true;
    });
    db.drop_timer_column_family(family);
  }

  size_t num_in_heap() const noexcept { return event_time_.size() + processing_time_.size(); }

  const detail::KeyContext<K>& current() const {
    const auto& ctx = backend_.key_context();
    if (ctx.group < 0) [[unlikely]]
      detail::throw_state_error("a timer was registered or deleted with no current key: timers belong to keys");
    return ctx;
  }

  template <class Fn>
  void fire_until(TimerQueue& queue, RocksDBTimerQueue* rocks, TimestampMs time, Fn& on_timer) {
    if (rocks != nullptr) [[unlikely]] {
      fire_rocks_until(*rocks, time, on_timer);
      return;
    }
    while (true) {
      std::optional<TimestampMs> next = queue.next();
      if (!next || *next > time) return;
      typename TimerQueue::Fired timer = queue.pop();
      backend_.set_current_key_with_hash(timer.key, timer.key_hash);
      on_timer(std::as_const(timer.key), std::as_const(timer.ns), timer.ts);
    }
  }

  template <class Fn>
  void fire_rocks_until(RocksDBTimerQueue& rocks, TimestampMs time, Fn& on_timer) {
    while (true) {
      std::optional<TimestampMs> next = rocks.next();
      if (!next || *next > time) return;
      const std::string fired = rocks.pop();
      K key{};
      N ns{};
      uint64_t hash = 0;
      const TimestampMs ts = parse_rocks_key(fired, key, hash, ns);
      backend_.set_current_key_with_hash(key, hash);
      on_timer(std::as_const(key), std::as_const(ns), ts);
    }
  }

  int32_t group_index(KeyGroup kg) const {
    const KeyGroupRange& range = backend_.key_group_range();
    if (!range.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside the timer service's range " +
                                range.to_string());
    }
    return kg.value - range.start();
  }

  static void check_version(uint64_t version, DataInput& in) {
    if (version != detail::kStateFormatVersion) {
      in.fail("unsupported timer format version " + std::to_string(version) + " (this build reads version " +
              std::to_string(detail::kStateFormatVersion) + ")");
    }
  }

  void restore_group(KeyGroup kg, DataInput& in) {
    int32_t g = group_index(kg);
    check_version(in.read_varint(), in);
    uint64_t written_kg = in.read_varint();
    if (written_kg != static_cast<uint64_t>(kg.value)) {
      detail::throw_state_error("the bytes given for key group " + std::to_string(kg.value) + " hold key group " +
                                std::to_string(written_kg));
    }
    if (rocks_db_ != nullptr) rocks_db_->begin_batch();  // a restore only adds: no read sees the batch
    try {
      read_timers(event_time_, rocks_event_.get(), g, kg, in, "an event-time timer");
      read_timers(processing_time_, rocks_processing_.get(), g, kg, in, "a processing-time timer");
    } catch (...) {
      if (rocks_db_ != nullptr) rocks_db_->commit_batch();
      throw;
    }
    if (rocks_db_ != nullptr) rocks_db_->commit_batch();
    if (!in.at_end()) in.fail("trailing bytes after the timers of key group " + std::to_string(kg.value));
  }

  void read_timers(TimerQueue& queue, RocksDBTimerQueue* rocks, int32_t g, KeyGroup kg, DataInput& in,
                   const char* what) {
    size_t count = detail::read_count(in, sizeof(int64_t));
    for (size_t i = 0; i < count; ++i) {
      const uint8_t* key_start = in.current();
      TypeSerializer<K>::deserialize(read_key_, in);
      uint64_t kh = key_hash({key_start, static_cast<size_t>(in.current() - key_start)});
      KeyGroup found = key_group_for_hash(kh, backend_.max_parallelism());
      if (found != kg) detail::throw_entry_in_wrong_key_group(what, found, kg, backend_.max_parallelism());
      TypeSerializer<N>::deserialize(read_ns_, in);
      const uint8_t* ns_end = in.current();
      TimestampMs ts = in.read_fixed<int64_t>();
      if (rocks != nullptr) {
        // The canonical entry's key and namespace bytes are the RocksDB key's suffix as they are.
        rocks_key_.clear();
        RocksDBTimerQueue::append_prefix(rocks_key_, kg, ts);
        rocks_key_.append(reinterpret_cast<const char*>(key_start), static_cast<size_t>(ns_end - key_start));
        rocks->add(rocks_key_);
        continue;
      }
      queue.add(g, read_key_, kh, read_ns_, ts);
    }
  }

  HeapKeyedStateBackend<K>& backend_;
  TimerQueue event_time_;
  TimerQueue processing_time_;
  TimestampMs watermark_ = kInitialWatermark;
  K read_key_{};
  N read_ns_{};
  // RocksDB timers (use_rocksdb()); null on the heap.
  RocksDBInstance* rocks_db_ = nullptr;
  std::unique_ptr<RocksDBTimerQueue> rocks_event_;
  std::unique_ptr<RocksDBTimerQueue> rocks_processing_;
  std::string rocks_key_;
  DataOutput rocks_bytes_;
};

}  // namespace sluice
