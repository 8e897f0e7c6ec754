// The heap backend's state objects: one class per state kind, templated on the key type K, the namespace
// type N and the value types, all `final` (no virtual call when the concrete type is known).
//
// Storage (a StateTable per state): one hash table per key group of the backend's range, holding entries
// (key, namespace, value). A table is an index map: a dense vector of entries plus an absl::flat_hash_set
// of positions into it, so
//  * a lookup is one hash probe; the hash combines the key's stable XXH3 hash (already computed by
//    set_current_key for its key group) with the namespace's hash, so no key is hashed twice;
//  * snapshots and rescaling move whole key groups;
//  * the TTL cleanup cursor is a plain (key group, position) pair that survives inserts and rehashes.
// Erasing moves the group's last entry into the hole.
//
// Namespaces: each state object has a current namespace, set with set_current_namespace() (Flink's
// InternalKvState.setCurrentNamespace); states of VoidNamespace have only the one. The current key belongs
// to the backend (HeapKeyedStateBackend::set_current_key) and is shared by all its states.
//
// Everything here runs on the task thread that owns the backend; nothing is thread-safe.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
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
  uint64_t key_hash = 0;   ///< key_hash() of the key's serialized bytes
  KeyGroup key_group{};    ///< key_hash % max parallelism
  int32_t group = -1;      ///< key_group - range start; -1 while no key is set
};

/// The per-key-group index map described at the top of this file. S is the stored value ("slot").
template <class K, class N, class S>
class StateTable {
 public:
  struct Entry {
    K key;
    N ns;
    size_t hash;
    S slot;
  };
  static constexpr uint32_t kNotFound = std::numeric_limits<uint32_t>::max();

  explicit StateTable(int32_t num_groups) : groups_(std::make_unique<Group[]>(num_groups)), num_groups_(num_groups) {}

  int32_t num_groups() const noexcept { return num_groups_; }
  size_t size() const noexcept { return size_; }
  std::vector<Entry>& entries(int32_t g) noexcept { return groups_[g].entries; }
  const std::vector<Entry>& entries(int32_t g) const noexcept { return groups_[g].entries; }

  /// Position of (key, ns) in group g, or kNotFound.
  uint32_t find(int32_t g, const K& key, const N& ns, size_t hash) const {
    const Group& grp = groups_[g];
    auto it = grp.index.find(Probe{&key, &ns, hash});
    return it == grp.index.end() ? kNotFound : *it;
  }

  /// Position of (key, ns) in group g, appending an entry with a value-initialized slot when absent;
  /// `.second` is true when it was appended. Appending may move the group's entries.
  std::pair<uint32_t, bool> find_or_insert(int32_t g, const K& key, const N& ns, size_t hash) {
    Group& grp = groups_[g];
    auto it = grp.index.find(Probe{&key, &ns, hash});
    if (it != grp.index.end()) return {*it, false};
    auto pos = static_cast<uint32_t>(grp.entries.size());
    grp.entries.push_back(Entry{key, ns, hash, S{}});
    grp.index.insert(pos);
    ++size_;
    return {pos, true};
  }

  /// Removes the entry at `pos` of group g; the group's last entry moves to `pos`.
  void erase_at(int32_t g, uint32_t pos) {
    Group& grp = groups_[g];
    auto last = static_cast<uint32_t>(grp.entries.size() - 1);
    grp.index.erase(pos);
    if (pos != last) {
      grp.index.erase(last);
      grp.entries[pos] = std::move(grp.entries[last]);
      grp.entries.pop_back();
      grp.index.insert(pos);
    } else {
      grp.entries.pop_back();
    }
    --size_;
  }

 private:
  struct Probe {
    const K* key;
    const N* ns;
    size_t hash;
  };
  // The index stores positions; hashing and comparing a position looks at its entry.
  struct IndexHash {
    using is_transparent = void;
    const std::vector<Entry>* entries = nullptr;
    size_t operator()(uint32_t pos) const { return (*entries)[pos].hash; }
    size_t operator()(const Probe& p) const { return p.hash; }
  };
  struct IndexEq {
    using is_transparent = void;
    const std::vector<Entry>* entries = nullptr;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t pos, const Probe& p) const {
      const Entry& e = (*entries)[pos];
      return e.hash == p.hash && e.key == *p.key && e.ns == *p.ns;
    }
    bool operator()(const Probe& p, uint32_t pos) const { return (*this)(pos, p); }
  };
  // Not movable: the index's functors point at the entries of the same group.
  struct Group {
    Group() = default;
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    std::vector<Entry> entries;
    absl::flat_hash_set<uint32_t, IndexHash, IndexEq> index{0, IndexHash{&entries}, IndexEq{&entries}};
  };

  std::unique_ptr<Group[]> groups_;
  int32_t num_groups_;
  size_t size_ = 0;
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

  /// Sets the namespace that later calls read and write (Flink's setCurrentNamespace).
  void set_current_namespace(const N& ns) {
    if constexpr (!std::is_same_v<N, VoidNamespace>) {
      ns_ = ns;
      ns_hash_ = StateHasher<N>{}(ns);
    }
  }
  const N& current_namespace() const noexcept { return ns_; }

  size_t num_entries() const noexcept override { return table_.size(); }
  size_t num_entries_in_group(int32_t group) const noexcept override { return table_.entries(group).size(); }

  void write_group(int32_t group, DataOutput& out) const override {
    for (const auto& e : table_.entries(group)) {
      TypeSerializer<K>::serialize(e.key, out);
      TypeSerializer<N>::serialize(e.ns, out);
      write_slot(e.slot, out);
    }
  }

  void read_group(int32_t group, KeyGroup kg, int max_parallelism, uint64_t count, DataInput& in) override {
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* key_start = in.current();
      TypeSerializer<K>::deserialize(read_key_, in);
      uint64_t kh = key_hash({key_start, static_cast<size_t>(in.current() - key_start)});
      KeyGroup found = key_group_for_hash(kh, max_parallelism);
      if (found != kg) throw_entry_in_wrong_key_group("an entry of state '" + this->name_ + "'", found, kg, max_parallelism);
      TypeSerializer<N>::deserialize(read_ns_, in);
      uint32_t pos = table_.find_or_insert(group, read_key_, read_ns_, entry_hash<N>(kh, StateHasher<N>{}(read_ns_))).first;
      read_slot(table_.entries(group)[pos].slot, in);
    }
  }

  void for_each_key(const std::function<void(const K&)>& fn) const override {
    for (int32_t g = 0; g < table_.num_groups(); ++g) {
      for (const auto& e : table_.entries(g)) fn(e.key);
    }
  }

  /// Removes the entry (key, ns) of group index g if present; for HeapKeyedStateBackend::clear, which
  /// knows the key's stable hash and group without making it the current key.
  void erase_entry(int32_t g, const K& key, uint64_t key_hash, const N& ns) {
    uint32_t pos = table_.find(g, key, ns, entry_hash<N>(key_hash, StateHasher<N>{}(ns)));
    if (pos != kNotFound) table_.erase_at(g, pos);
  }

  /// Appends the keys that have an entry in namespace `ns`.
  void collect_keys(const N& ns, std::vector<K>& out) const {
    for (int32_t g = 0; g < table_.num_groups(); ++g) {
      for (const auto& e : table_.entries(g)) {
        if (e.ns == ns) out.push_back(e.key);
      }
    }
  }

 protected:
  static constexpr uint32_t kNotFound = Table::kNotFound;
  // A cleanup step may skip at most this many empty key groups, so an access costs O(1) even when a
  // large range holds few entries.
  static constexpr int32_t kMaxGroupsSkippedPerCleanup = 64;

  HeapKvState(std::string name, StateKind kind, const StateTtlConfig& ttl, const KeyContext<K>& ctx,
              const Clock& clock, int32_t num_groups)
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

  uint32_t find_current(int32_t g) const { return table_.find(g, this->ctx_.key, ns_, current_hash()); }
  std::pair<uint32_t, bool> insert_current(int32_t g) {
    return table_.find_or_insert(g, this->ctx_.key, ns_, current_hash());
  }
  uint32_t find_in(int32_t g, const N& ns) const { return table_.find(g, this->ctx_.key, ns, hash_in(ns)); }
  std::pair<uint32_t, bool> insert_in(int32_t g, const N& ns) {
    return table_.find_or_insert(g, this->ctx_.key, ns, hash_in(ns));
  }
  S& slot_at(int32_t g, uint32_t pos) noexcept { return table_.entries(g)[pos].slot; }
  void erase(int32_t g, uint32_t pos) { table_.erase_at(g, pos); }

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
  // Checks up to incremental_cleanup_size entries from the rolling cursor, removing expired ones.
  void incremental_cleanup(TimestampMs now) {
    if (table_.size() == 0) return;
    int budget = this->ttl_.incremental_cleanup_size;
    const int32_t n = table_.num_groups();
    const int32_t max_skips = std::min(n, kMaxGroupsSkippedPerCleanup);
    int32_t skips = 0;
    while (budget > 0) {
      auto& entries = table_.entries(cursor_group_);
      if (cursor_pos_ >= entries.size()) {
        cursor_group_ = cursor_group_ + 1 == n ? 0 : cursor_group_ + 1;
        cursor_pos_ = 0;
        if (++skips > max_skips) return;
        continue;
      }
      --budget;
      if (purge_expired(entries[cursor_pos_].slot, now)) {
        table_.erase_at(cursor_group_, cursor_pos_);  // the last entry moved here: check it next
      } else {
        ++cursor_pos_;
      }
    }
  }

  K read_key_{};
  N read_ns_{};
  bool cleanup_;
  int32_t cursor_group_ = 0;
  uint32_t cursor_pos_ = 0;
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

 public:
  using ValueType = T;

  HeapValueState(const ValueStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                 int32_t num_groups)
      : Base(d.name, StateKind::kValue, d.ttl, ctx, clock, num_groups), default_(d.default_value) {}

  const T& value() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return default_;
    Slot& slot = this->slot_at(g, pos);
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
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return false;
    if (this->ttl_on() && !this->return_expired() && this->expired(this->slot_at(g, pos).ts, now)) {
      this->erase(g, pos);
      return false;
    }
    return true;
  }

  void update(const T& value) override { write(value); }
  void update(T&& value) override { write(std::move(value)); }

  void clear() override {
    int32_t g = this->group();
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) this->erase(g, pos);
  }

 private:
  template <class V>
  void write(V&& value) {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->slot_at(g, this->insert_current(g).first);
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

 public:
  using ElementType = T;

  HeapListState(const ListStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                int32_t num_groups)
      : Base(d.name, StateKind::kList, d.ttl, ctx, clock, num_groups) {}

  const std::vector<T>& get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return empty_;
    Slot& slot = this->slot_at(g, pos);
    if (!this->ttl_on()) return slot.values;
    bool any_expired = std::any_of(slot.ts.begin(), slot.ts.end(), [&](TimestampMs t) { return this->expired(t, now); });
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
    Slot& slot = this->slot_at(g, this->insert_current(g).first);
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
    Slot& slot = this->slot_at(g, this->insert_current(g).first);
    slot.values = std::move(values);
    if (this->ttl_on()) slot.ts.assign(slot.values.size(), now);
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) this->erase(g, pos);
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
      uint32_t pos = this->find_in(g, source);
      if (pos == Base::kNotFound) continue;
      Slot& slot = this->slot_at(g, pos);
      if (this->ttl_on()) remove_expired(slot, now);
      std::move(slot.values.begin(), slot.values.end(), std::back_inserter(merged_.values));
      merged_.ts.insert(merged_.ts.end(), slot.ts.begin(), slot.ts.end());
      this->erase(g, pos);
    }
    if (merged_.values.empty()) return;
    Slot& slot = this->slot_at(g, this->insert_in(g, target).first);
    if (this->ttl_on()) remove_expired(slot, now);
    std::move(merged_.values.begin(), merged_.values.end(), std::back_inserter(slot.values));
    slot.ts.insert(slot.ts.end(), merged_.ts.begin(), merged_.ts.end());
  }

 private:
  template <class V>
  void append_one(V&& value) {
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    Slot& slot = this->slot_at(g, this->insert_current(g).first);
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
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return nullptr;
    auto& map = this->slot_at(g, pos).map;
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
    auto& entry = this->slot_at(g, this->insert_current(g).first).map[key];
    entry.value = std::move(value);
    entry.ts = now;
    this->end_write(now);
  }

  void put_all(const std::vector<std::pair<UK, UV>>& entries) override {
    if (entries.empty()) return;
    int32_t g = this->group();
    TimestampMs now = this->write_time();
    auto& map = this->slot_at(g, this->insert_current(g).first).map;
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
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return;
    auto& map = this->slot_at(g, pos).map;
    map.erase(key);
    if (map.empty()) this->erase(g, pos);
  }

  bool is_empty() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return true;
    Slot& slot = this->slot_at(g, pos);
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
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) this->erase(g, pos);
  }

 private:
  // Visits the entries of the current key and namespace, applying TTL: expired entries are skipped (or,
  // with kReturnExpiredIfNotCleanedUp, visited once) and removed; reads refresh with kOnReadAndWrite.
  template <class Fn>
  void visit(Fn&& fn) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return;
    auto& map = this->slot_at(g, pos).map;
    if (!this->ttl_on()) {
      for (const auto& [k, v] : map) fn(k, v.value);
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
    size_t n = detail::read_count(
        in, std::max<size_t>(1, detail::min_encoded_size<UK>() + detail::min_encoded_size<UV>()));
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

 public:
  using ValueType = T;

  HeapReducingState(const ReducingStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                    int32_t num_groups)
      : Base(d.name, StateKind::kReducing, d.ttl, ctx, clock, num_groups), reduce_(d.reduce) {}

  std::optional<T> get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return std::nullopt;
    Slot& slot = this->slot_at(g, pos);
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
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) {
      Slot& slot = this->slot_at(g, pos);
      if (this->ttl_on() && this->expired(slot.ts, now)) {
        slot.value = value;
      } else {
        slot.value = reduce_(std::as_const(slot.value), value);
      }
      slot.ts = now;
    } else {
      Slot& slot = this->slot_at(g, this->insert_current(g).first);
      slot.value = value;
      slot.ts = now;
    }
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) this->erase(g, pos);
  }

  /// Reduces the values of `sources` (skipping expired ones) into `target` and removes the sources, for the
  /// current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    std::optional<T> merged;
    for (const N& source : sources) {
      uint32_t pos = this->find_in(g, source);
      if (pos == Base::kNotFound) continue;
      Slot& slot = this->slot_at(g, pos);
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
    Slot& slot = this->slot_at(g, pos);
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
    uint32_t pos = this->find_current(g);
    if (pos == Base::kNotFound) return std::nullopt;
    Slot& slot = this->slot_at(g, pos);
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
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) {
      Slot& slot = this->slot_at(g, pos);
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
      Slot& slot = this->slot_at(g, this->insert_current(g).first);
      slot.value = std::move(acc);
      slot.ts = now;
    }
    this->end_write(now);
  }

  void clear() override {
    int32_t g = this->group();
    uint32_t pos = this->find_current(g);
    if (pos != Base::kNotFound) this->erase(g, pos);
  }

  /// Merges the accumulators of `sources` (skipping expired ones) into `target` and removes the sources, for
  /// the current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    std::optional<Acc> merged;
    for (const N& source : sources) {
      uint32_t pos = this->find_in(g, source);
      if (pos == Base::kNotFound) continue;
      Slot& slot = this->slot_at(g, pos);
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
    Slot& slot = this->slot_at(g, pos);
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
