// The heap backend's state objects: one class per state kind, templated on the key type K, the namespace
// type N and the value types, all `final` (no virtual call when the concrete type is known).
//
// Storage (a StateTable per state): one absl::flat_hash_map per key group of the backend's range, from
// (key, namespace) to the value, so snapshots and rescaling move whole key groups. The table hash
// combines the key's stable XXH3 hash (already computed by set_current_key for its key group) with the
// namespace's hash and is stored in the entry: no key is hashed or serialized twice, not even on rehash.
// A state remembers the entry it found last, so value() followed by update() for the same key probes once.
//
// Namespaces: each state object has a current namespace, set with set_current_namespace() (Flink's
// InternalKvState.setCurrentNamespace); states of VoidNamespace have only the one. The current key belongs
// to the backend (HeapKeyedStateBackend::set_current_key) and is shared by all its states.
//
// Everything here runs on the task thread that owns the backend; nothing is thread-safe.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"
#include "sluice/state/state.h"

namespace sluice {

template <class K>
class HeapKeyedStateBackend;

namespace detail {

/// Version of the keyed-state and timer snapshot formats (docs/state-format.md).
inline constexpr uint64_t kStateFormatVersion = 1;
/// Section flag: entries carry a last-access timestamp (the state has TTL).
inline constexpr uint8_t kStateFlagTtl = 0x01;

[[noreturn]] void throw_state_error(std::string message);
[[noreturn]] void throw_no_current_key(std::string_view state_name);
[[noreturn]] void throw_key_outside_range(KeyGroup kg, const KeyGroupRange& range, int max_parallelism);
[[noreturn]] void throw_entry_in_wrong_key_group(std::string_view what, KeyGroup found, KeyGroup expected,
                                                 int max_parallelism);

/// Hash for in-memory tables of namespaces and map keys: absl::Hash when the type supports it, otherwise
/// XXH3 of its serialized bytes (so every serializable type works). Never stored anywhere.
template <class T>
struct StateHasher {
  size_t operator()(const T& value) const {
    if constexpr (std::is_same_v<T, VoidNamespace>) {
      return 0;
    } else if constexpr (std::is_invocable_v<absl::Hash<T>, const T&>) {
      return absl::Hash<T>{}(value);
    } else {
      thread_local DataOutput buf;
      buf.clear();
      TypeSerializer<T>::serialize(value, buf);
      return static_cast<size_t>(key_hash(buf.bytes()));
    }
  }
};

/// The table hash of (key, namespace) from the key's stable hash and the namespace's hash. Within one key
/// group all stable hashes share their residue modulo max parallelism (their low bits when it is a power of
/// two), so the bits are rotated or mixed before abseil uses the low 7 bits as a tag.
template <class N>
inline size_t entry_hash(uint64_t key_hash, size_t namespace_hash) noexcept {
  if constexpr (std::is_same_v<N, VoidNamespace>) {
    return static_cast<size_t>(std::rotr(key_hash, 32));
  } else {
    return absl::HashOf(key_hash, namespace_hash);
  }
}

/// True when an entry last accessed at `last_access` has expired at `now` (last_access + ttl <= now,
/// without overflow).
inline bool ttl_expired(TimestampMs last_access, int64_t ttl_ms, TimestampMs now) noexcept {
  if (last_access > std::numeric_limits<int64_t>::max() - ttl_ms) return false;
  return last_access + ttl_ms <= now;
}

/// The backend's current key, shared by all its states.
template <class K>
struct KeyContext {
  K key{};
  uint64_t key_hash = 0;  ///< key_hash() of the key's serialized bytes
  KeyGroup key_group{};   ///< key_hash % max parallelism
  int32_t group = -1;     ///< key_group - range start; -1 while no key is set
  uint64_t epoch = 1;     ///< changes whenever the key does (states cache their last lookup per epoch)
};

/// One absl::flat_hash_map per key group of the range, from (key, namespace) to the slot S. Each entry
/// stores its table hash, so lookups with a known key hash and rehashing never serialize a key again.
template <class K, class N, class S>
class StateTable {
 public:
  struct EntryKey {
    K key{};
    [[no_unique_address]] N ns{};
    size_t hash = 0;
  };
  struct Probe {
    const K* key;
    const N* ns;
    size_t hash;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(const EntryKey& k) const noexcept { return k.hash; }
    size_t operator()(const Probe& p) const noexcept { return p.hash; }
  };
  struct KeyEq {
    using is_transparent = void;
    bool operator()(const EntryKey& a, const EntryKey& b) const {
      return a.hash == b.hash && a.key == b.key && a.ns == b.ns;
    }
    bool operator()(const EntryKey& a, const Probe& p) const {
      return a.hash == p.hash && a.key == *p.key && a.ns == *p.ns;
    }
    bool operator()(const Probe& p, const EntryKey& a) const { return (*this)(a, p); }
  };
  using Map = absl::flat_hash_map<EntryKey, S, KeyHash, KeyEq>;
  using Entry = typename Map::value_type;

  explicit StateTable(int32_t num_groups) : maps_(static_cast<size_t>(num_groups)) {}

  int32_t num_groups() const noexcept { return static_cast<int32_t>(maps_.size()); }
  size_t size() const noexcept { return size_; }
  /// Counts inserts and erases: an Entry* stays valid while it does not change.
  uint64_t mutations() const noexcept { return mutations_; }
  Map& map(int32_t g) noexcept { return maps_[g]; }
  const Map& map(int32_t g) const noexcept { return maps_[g]; }

  /// The entry (key, ns) of group g, or nullptr.
  Entry* find(int32_t g, const K& key, const N& ns, size_t hash) {
    Map& m = maps_[g];
    auto it = m.find(Probe{&key, &ns, hash});
    return it == m.end() ? nullptr : &*it;
  }

  /// The entry (key, ns) of group g, inserted with a value-initialized slot when absent; `.second` is true
  /// when it was inserted.
  std::pair<Entry*, bool> find_or_insert(int32_t g, const K& key, const N& ns, size_t hash) {
    if (Entry* e = find(g, key, ns, hash)) return {e, false};
    auto it = maps_[g].try_emplace(EntryKey{key, ns, hash}).first;
    ++size_;
    ++mutations_;
    return {&*it, true};
  }

  void erase(int32_t g, Entry* e) {
    ++mutations_;
    --size_;
    maps_[g].erase(e->first);
  }
  void erase(int32_t g, typename Map::iterator it) {
    ++mutations_;
    --size_;
    maps_[g].erase(it);
  }

 private:
  std::vector<Map> maps_;
  size_t size_ = 0;
  uint64_t mutations_ = 0;
};

/// The type-erased view of a state that the backend uses for snapshots, restore and iteration.
template <class K>
class HeapStateBase {
 public:
  HeapStateBase(std::string name, StateKind kind, const StateTtlConfig& ttl, const KeyContext<K>& ctx,
                const Clock& clock)
      : name_(std::move(name)), kind_(kind), ttl_(ttl), ctx_(ctx), clock_(clock) {}
  virtual ~HeapStateBase() = default;
  HeapStateBase(const HeapStateBase&) = delete;
  HeapStateBase& operator=(const HeapStateBase&) = delete;

  const std::string& name() const noexcept { return name_; }
  StateKind kind() const noexcept { return kind_; }
  const StateTtlConfig& ttl_config() const noexcept { return ttl_; }
  /// The section flags written into snapshots (kStateFlagTtl).
  uint8_t format_flags() const noexcept { return ttl_.enabled() ? kStateFlagTtl : 0; }

  /// Entries (key and namespace pairs) stored, expired or not.
  virtual size_t num_entries() const noexcept = 0;
  virtual size_t num_entries_in_group(int32_t group) const noexcept = 0;
  /// Appends the entries of one key group in the format of docs/state-format.md.
  virtual void write_group(int32_t group, DataOutput& out) const = 0;
  /// Reads `count` entries of key group `kg` (stored at index `group`), replacing entries with the same key
  /// and namespace. Throws SluiceException on corrupt input or an entry of another key group.
  virtual void read_group(int32_t group, KeyGroup kg, int max_parallelism, uint64_t count, DataInput& in) = 0;
  /// Calls fn(key) for every entry (once per key and namespace).
  virtual void for_each_key(const std::function<void(const K&)>& fn) const = 0;

 protected:
  std::string name_;
  StateKind kind_;
  StateTtlConfig ttl_;
  const KeyContext<K>& ctx_;
  const Clock& clock_;
};

/// Common code of the heap states: current namespace, lookups of the current key, TTL and the
/// incremental cleanup cursor, and the entry framing (key, namespace) of snapshots.
template <class K, class N, class S>
class HeapKvState : public HeapStateBase<K> {
 public:
  using KeyType = K;
  using Namespace = N;
  using Table = StateTable<K, N, S>;
  using Entry = typename Table::Entry;

  /// Sets the namespace that later calls read and write (Flink's setCurrentNamespace).
  void set_current_namespace(const N& ns) {
    if constexpr (!std::is_same_v<N, VoidNamespace>) {
      ns_ = ns;
      ns_hash_ = StateHasher<N>{}(ns);
      cached_ = nullptr;
    }
  }
  const N& current_namespace() const noexcept { return ns_; }

  size_t num_entries() const noexcept override { return table_.size(); }
  size_t num_entries_in_group(int32_t group) const noexcept override { return table_.map(group).size(); }

  void write_group(int32_t group, DataOutput& out) const override {
    for (const auto& [k, slot] : table_.map(group)) {
      TypeSerializer<K>::serialize(k.key, out);
      TypeSerializer<N>::serialize(k.ns, out);
      write_slot(slot, out);
    }
  }

  void read_group(int32_t group, KeyGroup kg, int max_parallelism, uint64_t count, DataInput& in) override {
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* key_start = in.current();
      TypeSerializer<K>::deserialize(read_key_, in);
      uint64_t kh = key_hash({key_start, static_cast<size_t>(in.current() - key_start)});
      KeyGroup found = key_group_for_hash(kh, max_parallelism);
      if (found != kg) {
        throw_entry_in_wrong_key_group("an entry of state '" + this->name_ + "'", found, kg, max_parallelism);
      }
      TypeSerializer<N>::deserialize(read_ns_, in);
      size_t h = entry_hash<N>(kh, StateHasher<N>{}(read_ns_));
      read_slot(table_.find_or_insert(group, read_key_, read_ns_, h).first->second, in);
    }
  }

  void for_each_key(const std::function<void(const K&)>& fn) const override {
    for (int32_t g = 0; g < table_.num_groups(); ++g) {
      for (const auto& [k, slot] : table_.map(g))
        fn(k.key);
    }
  }

  /// Removes the entry (key, ns) of group index g if present; for HeapKeyedStateBackend::clear, which
  /// knows the key's stable hash and group without making it the current key.
  void erase_entry(int32_t g, const K& key, uint64_t key_hash, const N& ns) {
    if (Entry* e = table_.find(g, key, ns, entry_hash<N>(key_hash, StateHasher<N>{}(ns)))) table_.erase(g, e);
  }

  /// Appends the keys that have an entry in namespace `ns`.
  void collect_keys(const N& ns, std::vector<K>& out) const {
    for (int32_t g = 0; g < table_.num_groups(); ++g) {
      for (const auto& [k, slot] : table_.map(g)) {
        if (k.ns == ns) out.push_back(k.key);
      }
    }
  }

 protected:
  // A cleanup step may skip at most this many empty key groups, so an access costs O(1) even when a
  // large range holds few entries.
  static constexpr int32_t kMaxGroupsSkippedPerCleanup = 64;

  HeapKvState(std::string name, StateKind kind, const StateTtlConfig& ttl, const KeyContext<K>& ctx, const Clock& clock,
              int32_t num_groups)
      : HeapStateBase<K>(std::move(name), kind, ttl, ctx, clock),
        table_(num_groups),
        cleanup_(ttl.enabled() && ttl.cleanup_incrementally && ttl.incremental_cleanup_size > 0) {}

  virtual void write_slot(const S& slot, DataOutput& out) const = 0;
  virtual void read_slot(S& slot, DataInput& in) = 0;
  /// Drops what expired at `now` from `slot`; returns true when nothing is left (the entry must go).
  virtual bool purge_expired(S& slot, TimestampMs now) = 0;

  /// The current key's group index; throws kState when no key is set.
  int32_t group() const {
    int32_t g = this->ctx_.group;
    if (g < 0) [[unlikely]]
      throw_no_current_key(this->name_);
    return g;
  }
  size_t current_hash() const noexcept { return entry_hash<N>(this->ctx_.key_hash, ns_hash_); }
  size_t hash_in(const N& ns) const { return entry_hash<N>(this->ctx_.key_hash, StateHasher<N>{}(ns)); }

  // The entry of the current key and namespace, or nullptr. The entry found last is remembered until the
  // key, the namespace or the table changes, so value() followed by update() probes the table once.
  Entry* find_current(int32_t g) {
    if (cache_valid()) return cached_;
    Entry* e = table_.find(g, this->ctx_.key, ns_, current_hash());
    if (e != nullptr) remember(e);
    return e;
  }
  std::pair<Entry*, bool> insert_current(int32_t g) {
    if (cache_valid()) return {cached_, false};
    auto result = table_.find_or_insert(g, this->ctx_.key, ns_, current_hash());
    remember(result.first);
    return result;
  }
  Entry* find_in(int32_t g, const N& ns) { return table_.find(g, this->ctx_.key, ns, hash_in(ns)); }
  std::pair<Entry*, bool> insert_in(int32_t g, const N& ns) {
    return table_.find_or_insert(g, this->ctx_.key, ns, hash_in(ns));
  }
  void erase(int32_t g, Entry* e) { table_.erase(g, e); }

  bool ttl_on() const noexcept { return this->ttl_.enabled(); }
  bool expired(TimestampMs last_access, TimestampMs now) const noexcept {
    return ttl_expired(last_access, this->ttl_.ttl_ms, now);
  }
  bool refresh_on_read() const noexcept {
    return this->ttl_.update_type == StateTtlConfig::UpdateType::kOnReadAndWrite;
  }
  bool return_expired() const noexcept {
    return this->ttl_.visibility == StateTtlConfig::Visibility::kReturnExpiredIfNotCleanedUp;
  }

  /// Starts a read: without TTL returns 0 and does nothing else; with TTL reads the clock, runs a step of
  /// incremental cleanup and returns the time. Runs before the lookup, so the cleanup cannot move the
  /// entry whose value the read returns by reference.
  TimestampMs begin_access() {
    if (!ttl_on()) return 0;
    TimestampMs now = this->clock_.now_ms();
    if (cleanup_) incremental_cleanup(now);
    return now;
  }
  /// The time of a write (0 without TTL). A write ends with end_write, which runs the cleanup step after
  /// the value is stored, so a value passed by reference from this state is never moved before it is read.
  TimestampMs write_time() const { return ttl_on() ? this->clock_.now_ms() : 0; }
  void end_write(TimestampMs now) {
    if (cleanup_) incremental_cleanup(now);
  }

  Table table_;
  N ns_{};
  size_t ns_hash_ = 0;

 private:
  bool cache_valid() const noexcept {
    return cached_ != nullptr && cached_epoch_ == this->ctx_.epoch && cached_mutations_ == table_.mutations();
  }
  void remember(Entry* e) noexcept {
    cached_ = e;
    cached_epoch_ = this->ctx_.epoch;
    cached_mutations_ = table_.mutations();
  }

  // Checks up to incremental_cleanup_size entries from a rolling cursor over the key groups, removing the
  // expired ones. The cursor is an iterator, valid while the table has not changed since it was saved;
  // otherwise the saved key of the entry (copy-assigned, so no allocation in steady state) is looked up
  // again, and if that entry is gone the scan restarts at the beginning of its key group.
  void incremental_cleanup(TimestampMs now) {
    if (table_.size() == 0) return;
    int budget = this->ttl_.incremental_cleanup_size;
    const int32_t n = table_.num_groups();
    const int32_t max_skips = std::min(n, kMaxGroupsSkippedPerCleanup);
    int32_t skips = 0;
    auto* map = &table_.map(cursor_group_);
    auto it = map->end();
    if (has_cursor_) it = cursor_mutations_ == table_.mutations() ? cursor_it_ : map->find(cursor_key_);
    if (it == map->end()) it = map->begin();
    while (budget > 0) {
      if (it == map->end()) {
        cursor_group_ = cursor_group_ + 1 == n ? 0 : cursor_group_ + 1;
        map = &table_.map(cursor_group_);
        it = map->begin();
        if (++skips > max_skips) break;
        continue;
      }
      --budget;
      if (purge_expired(it->second, now)) {
        table_.erase(cursor_group_, it++);
      } else {
        ++it;
      }
    }
    if (it == map->end()) {
      cursor_group_ = cursor_group_ + 1 == n ? 0 : cursor_group_ + 1;
      has_cursor_ = false;
    } else {
      cursor_it_ = it;
      cursor_key_ = it->first;
      cursor_mutations_ = table_.mutations();
      has_cursor_ = true;
    }
  }

  K read_key_{};
  N read_ns_{};
  bool cleanup_;
  int32_t cursor_group_ = 0;
  bool has_cursor_ = false;
  typename Table::Map::iterator cursor_it_{};
  typename Table::EntryKey cursor_key_{};
  uint64_t cursor_mutations_ = 0;
  Entry* cached_ = nullptr;
  uint64_t cached_epoch_ = 0;
  uint64_t cached_mutations_ = 0;
};

/// A value with its last-access timestamp (0 and unused without TTL).
template <class T>
struct TtlSlot {
  T value{};
  TimestampMs ts = 0;
};

/// A list with one last-access timestamp per element (empty without TTL).
template <class T>
struct ListSlot {
  std::vector<T> values;
  std::vector<TimestampMs> ts;
};

template <class UV>
struct MapValue {
  UV value{};
  TimestampMs ts = 0;
};

/// A user map with one last-access timestamp per entry.
template <class UK, class UV>
struct MapSlot {
  absl::flat_hash_map<UK, MapValue<UV>, StateHasher<UK>> map;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Value state
// ---------------------------------------------------------------------------------------------------------

/// ValueState on the heap backend. Snapshot entry value: the value, then (TTL) the timestamp.
template <class K, class N, class T>
class HeapValueState final : public detail::HeapKvState<K, N, detail::TtlSlot<T>>, public ValueState<T> {
  using Base = detail::HeapKvState<K, N, detail::TtlSlot<T>>;
  using Slot = detail::TtlSlot<T>;
  using Entry = typename Base::Entry;

 public:
  using ValueType = T;

  HeapValueState(const ValueStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                 int32_t num_groups)
      : Base(d.name, StateKind::kValue, d.ttl, ctx, clock, num_groups), default_(d.default_value) {}

  const T& value() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return default_;
    Slot& slot = pos->second;
    if (this->ttl_on()) {
      if (this->expired(slot.ts, now)) {
        if (!this->return_expired()) {
          this->erase(g, pos);
          return default_;
        }
        scratch_ = std::move(slot.value);
        this->erase(g, pos);
        return scratch_;
      }
      if (this->refresh_on_read()) slot.ts = now;
    }
    return slot.value;
  }

  bool has_value() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return false;
    if (this->ttl_on() && !this->return_expired() && this->expired(pos->second.ts, now)) {
      this->erase(g, pos);
      return false;
    }
    return true;
  }

  void update(const T& value) override { write(value); }
  void update(T&& value) override { write(std::move(value)); }

  void clear() override {
    int32_t g = this->group();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) this->erase(g, pos);
  }

 private:
  template <class V>
  void write(V&& value) {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->insert_current(g).first->second;
    slot.value = std::forward<V>(value);
    slot.ts = now;
    this->end_write(now);
  }

  void write_slot(const Slot& slot, DataOutput& out) const override {
    TypeSerializer<T>::serialize(slot.value, out);
    if (this->ttl_on()) out.write_fixed<int64_t>(slot.ts);
  }
  void read_slot(Slot& slot, DataInput& in) override {
    TypeSerializer<T>::deserialize(slot.value, in);
    if (this->ttl_on()) slot.ts = in.read_fixed<int64_t>();
  }
  bool purge_expired(Slot& slot, TimestampMs now) override { return this->expired(slot.ts, now); }

  T default_;
  T scratch_{};
};

// ---------------------------------------------------------------------------------------------------------
// List state
// ---------------------------------------------------------------------------------------------------------

/// ListState on the heap backend; TTL is per element. With kReturnExpiredIfNotCleanedUp, get() returns
/// still-stored expired elements once (from a copy) and removes them. Snapshot entry value: varint count,
/// then each element followed (TTL) by its timestamp.
template <class K, class N, class T>
class HeapListState final : public detail::HeapKvState<K, N, detail::ListSlot<T>>, public ListState<T> {
  using Base = detail::HeapKvState<K, N, detail::ListSlot<T>>;
  using Slot = detail::ListSlot<T>;
  using Entry = typename Base::Entry;

 public:
  using ElementType = T;

  HeapListState(const ListStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                int32_t num_groups)
      : Base(d.name, StateKind::kList, d.ttl, ctx, clock, num_groups) {}

  const std::vector<T>& get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return empty_;
    Slot& slot = pos->second;
    if (!this->ttl_on()) return slot.values;
    bool any_expired =
        std::any_of(slot.ts.begin(), slot.ts.end(), [&](TimestampMs t) { return this->expired(t, now); });
    if (any_expired) {
      bool keep_copy = this->return_expired();
      if (keep_copy) scratch_ = slot.values;
      remove_expired(slot, now);
      if (slot.values.empty()) {
        this->erase(g, pos);
        return keep_copy ? scratch_ : empty_;
      }
      if (this->refresh_on_read()) std::fill(slot.ts.begin(), slot.ts.end(), now);
      return keep_copy ? scratch_ : slot.values;
    }
    if (this->refresh_on_read()) std::fill(slot.ts.begin(), slot.ts.end(), now);
    return slot.values;
  }

  void add(const T& value) override { append_one(value); }
  void add(T&& value) override { append_one(std::move(value)); }

  void add_all(const std::vector<T>& values) override {
    if (values.empty()) return;
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->insert_current(g).first->second;
    slot.values.insert(slot.values.end(), values.begin(), values.end());
    if (this->ttl_on()) slot.ts.resize(slot.values.size(), now);
    this->end_write(now);
  }

  void update(std::vector<T> values) override {
    if (values.empty()) {
      clear();
      return;
    }
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->insert_current(g).first->second;
    slot.values = std::move(values);
    if (this->ttl_on()) slot.ts.assign(slot.values.size(), now);
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) this->erase(g, pos);
  }

  /// Appends the lists of `sources` (in order, skipping expired elements) to the list of `target` and
  /// removes the sources, for the current key (Flink's mergeNamespaces, used by merging windows).
  /// `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    merged_.values.clear();
    merged_.ts.clear();
    for (const N& source : sources) {
      Entry* pos = this->find_in(g, source);
      if (pos == nullptr) continue;
      Slot& slot = pos->second;
      if (this->ttl_on()) remove_expired(slot, now);
      std::move(slot.values.begin(), slot.values.end(), std::back_inserter(merged_.values));
      merged_.ts.insert(merged_.ts.end(), slot.ts.begin(), slot.ts.end());
      this->erase(g, pos);
    }
    if (merged_.values.empty()) return;
    Slot& slot = this->insert_in(g, target).first->second;
    if (this->ttl_on()) remove_expired(slot, now);
    std::move(merged_.values.begin(), merged_.values.end(), std::back_inserter(slot.values));
    slot.ts.insert(slot.ts.end(), merged_.ts.begin(), merged_.ts.end());
  }

 private:
  template <class V>
  void append_one(V&& value) {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->insert_current(g).first->second;
    slot.values.push_back(std::forward<V>(value));
    if (this->ttl_on()) slot.ts.push_back(now);
    this->end_write(now);
  }

  void remove_expired(Slot& slot, TimestampMs now) {
    size_t out = 0;
    for (size_t i = 0; i < slot.values.size(); ++i) {
      if (this->expired(slot.ts[i], now)) continue;
      if (out != i) {
        slot.values[out] = std::move(slot.values[i]);
        slot.ts[out] = slot.ts[i];
      }
      ++out;
    }
    slot.values.erase(slot.values.begin() + static_cast<std::ptrdiff_t>(out), slot.values.end());
    slot.ts.resize(out);
  }

  void write_slot(const Slot& slot, DataOutput& out) const override {
    out.write_varint(slot.values.size());
    for (size_t i = 0; i < slot.values.size(); ++i) {
      TypeSerializer<T>::serialize(slot.values[i], out);
      if (this->ttl_on()) out.write_fixed<int64_t>(slot.ts[i]);
    }
  }
  void read_slot(Slot& slot, DataInput& in) override {
    size_t n = detail::read_count(in, std::max<size_t>(1, detail::min_encoded_size<T>()));
    slot.values.resize(n);
    slot.ts.clear();
    for (size_t i = 0; i < n; ++i) {
      TypeSerializer<T>::deserialize(slot.values[i], in);
      if (this->ttl_on()) slot.ts.push_back(in.read_fixed<int64_t>());
    }
  }
  bool purge_expired(Slot& slot, TimestampMs now) override {
    remove_expired(slot, now);
    return slot.values.empty();
  }

  const std::vector<T> empty_;
  std::vector<T> scratch_;
  Slot merged_;
};

// ---------------------------------------------------------------------------------------------------------
// Map state
// ---------------------------------------------------------------------------------------------------------

/// MapState on the heap backend; TTL is per map entry. An entry whose map becomes empty is removed.
/// Snapshot entry value: varint count, then each user key, user value and (TTL) timestamp, in hash order.
template <class K, class N, class UK, class UV>
class HeapMapState final : public detail::HeapKvState<K, N, detail::MapSlot<UK, UV>>, public MapState<UK, UV> {
  using Base = detail::HeapKvState<K, N, detail::MapSlot<UK, UV>>;
  using Slot = detail::MapSlot<UK, UV>;
  using Entry = typename Base::Entry;

 public:
  using UserKeyType = UK;
  using UserValueType = UV;

  HeapMapState(const MapStateDescriptor<UK, UV>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
               int32_t num_groups)
      : Base(d.name, StateKind::kMap, d.ttl, ctx, clock, num_groups) {}

  std::optional<UV> get(const UK& key) override {
    const UV* v = find(key);
    return v == nullptr ? std::nullopt : std::optional<UV>(*v);
  }

  const UV* find(const UK& key) override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return nullptr;
    auto& map = pos->second.map;
    auto it = map.find(key);
    if (it == map.end()) return nullptr;
    if (this->ttl_on()) {
      if (this->expired(it->second.ts, now)) {
        bool keep_copy = this->return_expired();
        if (keep_copy) scratch_ = std::move(it->second.value);
        map.erase(it);
        if (map.empty()) this->erase(g, pos);
        return keep_copy ? &scratch_ : nullptr;
      }
      if (this->refresh_on_read()) it->second.ts = now;
    }
    return &it->second.value;
  }

  bool contains(const UK& key) override { return find(key) != nullptr; }

  void put(const UK& key, UV value) override {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    auto& entry = this->insert_current(g).first->second.map[key];
    entry.value = std::move(value);
    entry.ts = now;
    this->end_write(now);
  }

  void put_all(const std::vector<std::pair<UK, UV>>& entries) override {
    if (entries.empty()) return;
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    auto& map = this->insert_current(g).first->second.map;
    for (const auto& [k, v] : entries) {
      auto& entry = map[k];
      entry.value = v;
      entry.ts = now;
    }
    this->end_write(now);
  }

  void remove(const UK& key) override {
    int32_t g = this->group();
    this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return;
    auto& map = pos->second.map;
    map.erase(key);
    if (map.empty()) this->erase(g, pos);
  }

  bool is_empty() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return true;
    Slot& slot = pos->second;
    if (this->ttl_on() && !this->return_expired() && purge_expired(slot, now)) {
      this->erase(g, pos);
      return true;
    }
    return slot.map.empty();
  }

  std::vector<std::pair<UK, UV>> entries() override {
    std::vector<std::pair<UK, UV>> out;
    visit([&](const UK& k, const UV& v) { out.emplace_back(k, v); });
    return out;
  }
  std::vector<UK> keys() override {
    std::vector<UK> out;
    visit([&](const UK& k, const UV&) { out.push_back(k); });
    return out;
  }
  std::vector<UV> values() override {
    std::vector<UV> out;
    visit([&](const UK&, const UV& v) { out.push_back(v); });
    return out;
  }
  void for_each(const std::function<void(const UK&, const UV&)>& fn) override { visit(fn); }

  void clear() override {
    int32_t g = this->group();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) this->erase(g, pos);
  }

 private:
  // Visits the entries of the current key and namespace, applying TTL: expired entries are skipped (or,
  // with kReturnExpiredIfNotCleanedUp, visited once) and removed; reads refresh with kOnReadAndWrite.
  template <class Fn>
  void visit(Fn&& fn) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return;
    auto& map = pos->second.map;
    if (!this->ttl_on()) {
      for (const auto& [k, v] : map)
        fn(k, v.value);
      return;
    }
    for (auto it = map.begin(); it != map.end();) {
      if (this->expired(it->second.ts, now)) {
        if (this->return_expired()) fn(it->first, it->second.value);
        map.erase(it++);
        continue;
      }
      if (this->refresh_on_read()) it->second.ts = now;
      fn(it->first, it->second.value);
      ++it;
    }
    if (map.empty()) this->erase(g, pos);
  }

  void write_slot(const Slot& slot, DataOutput& out) const override {
    out.write_varint(slot.map.size());
    for (const auto& [k, v] : slot.map) {
      TypeSerializer<UK>::serialize(k, out);
      TypeSerializer<UV>::serialize(v.value, out);
      if (this->ttl_on()) out.write_fixed<int64_t>(v.ts);
    }
  }
  void read_slot(Slot& slot, DataInput& in) override {
    size_t n =
        detail::read_count(in, std::max<size_t>(1, detail::min_encoded_size<UK>() + detail::min_encoded_size<UV>()));
    slot.map.clear();
    slot.map.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      UK k{};
      TypeSerializer<UK>::deserialize(k, in);
      auto [it, inserted] = slot.map.try_emplace(std::move(k));
      if (!inserted) in.fail("duplicate user key in an entry of map state '" + this->name() + "'");
      TypeSerializer<UV>::deserialize(it->second.value, in);
      if (this->ttl_on()) it->second.ts = in.read_fixed<int64_t>();
    }
  }
  bool purge_expired(Slot& slot, TimestampMs now) override {
    absl::erase_if(slot.map, [&](const auto& kv) { return this->expired(kv.second.ts, now); });
    return slot.map.empty();
  }

  UV scratch_{};
};

// ---------------------------------------------------------------------------------------------------------
// Reducing state
// ---------------------------------------------------------------------------------------------------------

/// ReducingState on the heap backend; TTL applies to the reduced value. An expired value is dropped, not
/// reduced with. Snapshot entry value: the value, then (TTL) the timestamp.
template <class K, class N, class T>
class HeapReducingState final : public detail::HeapKvState<K, N, detail::TtlSlot<T>>, public ReducingState<T> {
  using Base = detail::HeapKvState<K, N, detail::TtlSlot<T>>;
  using Slot = detail::TtlSlot<T>;
  using Entry = typename Base::Entry;

 public:
  using ValueType = T;

  HeapReducingState(const ReducingStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                    int32_t num_groups)
      : Base(d.name, StateKind::kReducing, d.ttl, ctx, clock, num_groups), reduce_(d.reduce) {}

  std::optional<T> get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return std::nullopt;
    Slot& slot = pos->second;
    if (this->ttl_on()) {
      if (this->expired(slot.ts, now)) {
        std::optional<T> result;
        if (this->return_expired()) result = std::move(slot.value);
        this->erase(g, pos);
        return result;
      }
      if (this->refresh_on_read()) slot.ts = now;
    }
    return slot.value;
  }

  void add(const T& value) override {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) {
      Slot& slot = pos->second;
      if (this->ttl_on() && this->expired(slot.ts, now)) {
        slot.value = value;
      } else {
        slot.value = reduce_(std::as_const(slot.value), value);
      }
      slot.ts = now;
    } else {
      Slot& slot = this->insert_current(g).first->second;
      slot.value = value;
      slot.ts = now;
    }
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) this->erase(g, pos);
  }

  /// Reduces the values of `sources` (skipping expired ones) into `target` and removes the sources, for the
  /// current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    std::optional<T> merged;
    for (const N& source : sources) {
      Entry* pos = this->find_in(g, source);
      if (pos == nullptr) continue;
      Slot& slot = pos->second;
      if (!this->ttl_on() || !this->expired(slot.ts, now)) {
        if (merged) {
          merged = reduce_(std::as_const(*merged), std::as_const(slot.value));
        } else {
          merged = std::move(slot.value);
        }
      }
      this->erase(g, pos);
    }
    if (!merged) return;
    auto [pos, inserted] = this->insert_in(g, target);
    Slot& slot = pos->second;
    if (!inserted && !(this->ttl_on() && this->expired(slot.ts, now))) {
      slot.value = reduce_(std::as_const(slot.value), std::as_const(*merged));
    } else {
      slot.value = std::move(*merged);
    }
    slot.ts = now;
  }

 private:
  void write_slot(const Slot& slot, DataOutput& out) const override {
    TypeSerializer<T>::serialize(slot.value, out);
    if (this->ttl_on()) out.write_fixed<int64_t>(slot.ts);
  }
  void read_slot(Slot& slot, DataInput& in) override {
    TypeSerializer<T>::deserialize(slot.value, in);
    if (this->ttl_on()) slot.ts = in.read_fixed<int64_t>();
  }
  bool purge_expired(Slot& slot, TimestampMs now) override { return this->expired(slot.ts, now); }

  std::function<T(const T&, const T&)> reduce_;
};

// ---------------------------------------------------------------------------------------------------------
// Aggregating state
// ---------------------------------------------------------------------------------------------------------

/// AggregatingState on the heap backend; TTL applies to the accumulator. Snapshot entry value: the
/// accumulator, then (TTL) the timestamp.
template <class K, class N, class In, class Acc, class Out>
class HeapAggregatingState final : public detail::HeapKvState<K, N, detail::TtlSlot<Acc>>,
                                   public AggregatingState<In, Out> {
  using Base = detail::HeapKvState<K, N, detail::TtlSlot<Acc>>;
  using Slot = detail::TtlSlot<Acc>;
  using Entry = typename Base::Entry;

 public:
  using InputType = In;
  using AccumulatorType = Acc;
  using OutputType = Out;

  HeapAggregatingState(const AggregatingStateDescriptor<In, Acc, Out>& d, const detail::KeyContext<K>& ctx,
                       const Clock& clock, int32_t num_groups)
      : Base(d.name, StateKind::kAggregating, d.ttl, ctx, clock, num_groups), fn_(d.aggregate) {}

  std::optional<Out> get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    Entry* pos = this->find_current(g);
    if (pos == nullptr) return std::nullopt;
    Slot& slot = pos->second;
    if (this->ttl_on()) {
      if (this->expired(slot.ts, now)) {
        std::optional<Out> result;
        if (this->return_expired()) result = fn_->get_result(std::as_const(slot.value));
        this->erase(g, pos);
        return result;
      }
      if (this->refresh_on_read()) slot.ts = now;
    }
    return fn_->get_result(std::as_const(slot.value));
  }

  void add(const In& value) override {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) {
      Slot& slot = pos->second;
      if (this->ttl_on() && this->expired(slot.ts, now)) {
        Acc acc = fn_->create_accumulator();
        fn_->add(value, acc);
        slot.value = std::move(acc);
      } else {
        fn_->add(value, slot.value);
      }
      slot.ts = now;
    } else {
      Acc acc = fn_->create_accumulator();  // before inserting: a throwing user function leaves no entry
      fn_->add(value, acc);
      Slot& slot = this->insert_current(g).first->second;
      slot.value = std::move(acc);
      slot.ts = now;
    }
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    Entry* pos = this->find_current(g);
    if (pos != nullptr) this->erase(g, pos);
  }

  /// Merges the accumulators of `sources` (skipping expired ones) into `target` and removes the sources, for
  /// the current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    std::optional<Acc> merged;
    for (const N& source : sources) {
      Entry* pos = this->find_in(g, source);
      if (pos == nullptr) continue;
      Slot& slot = pos->second;
      if (!this->ttl_on() || !this->expired(slot.ts, now)) {
        if (merged) {
          merged = fn_->merge(std::move(*merged), std::as_const(slot.value));
        } else {
          merged = std::move(slot.value);
        }
      }
      this->erase(g, pos);
    }
    if (!merged) return;
    auto [pos, inserted] = this->insert_in(g, target);
    Slot& slot = pos->second;
    if (!inserted && !(this->ttl_on() && this->expired(slot.ts, now))) {
      slot.value = fn_->merge(std::move(slot.value), std::as_const(*merged));
    } else {
      slot.value = std::move(*merged);
    }
    slot.ts = now;
  }

 private:
  void write_slot(const Slot& slot, DataOutput& out) const override {
    TypeSerializer<Acc>::serialize(slot.value, out);
    if (this->ttl_on()) out.write_fixed<int64_t>(slot.ts);
  }
  void read_slot(Slot& slot, DataInput& in) override {
    TypeSerializer<Acc>::deserialize(slot.value, in);
    if (this->ttl_on()) slot.ts = in.read_fixed<int64_t>();
  }
  bool purge_expired(Slot& slot, TimestampMs now) override { return this->expired(slot.ts, now); }

  std::shared_ptr<AggregateFunction<In, Acc, Out>> fn_;
};

}  // namespace sluice
