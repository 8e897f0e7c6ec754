// One header over 800 lines: class templates (one per state kind, on key, namespace and value types) that every
// keyed operator instantiates, so their definitions must be visible to it; they share StateTable and CowHandle.
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
// Copy-on-write snapshots (Flink's CopyOnWriteStateMap, at key-group granularity): each key group's map is
// held through a CowHandle. capture() copies the handles (O(key groups), no entry is copied); the first
// mutation of a key group whose map a live capture still holds clones that map first, so a capture never
// changes. Every mutation checks this with one branch (an acquire load of the map's reference count);
// reads do not clone. With TTL, a read that refreshes or drops an entry and the incremental cleanup are
// mutations and follow the same rule.
// Everything here runs on the task thread that owns the backend; nothing is thread-safe, except that a
// capture (CapturedState) may be read and destroyed on another thread while the task keeps going.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
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

/// An owning, reference-counted handle to a heap-allocated T, for copy-on-write sharing between a state
/// table and the captures that hold the same T (Flink's copy-on-write state map, with one T per key group).
/// Copies share the T; the last handle destroys it.
///
/// Thread-safety: handles to one T may be copied and destroyed on different threads (the count is atomic,
/// as std::shared_ptr's). The T must not be mutated while shared(): the owner checks shared() and, if true,
/// replaces its handle with a clone() before mutating. shared() is an acquire load that pairs with the
/// release decrement of a destroyed handle, so once it returns false every read another thread made
/// through a released handle happened before the owner's writes. (std::shared_ptr::use_count() is a relaxed
/// load and gives no such ordering, which is why this small class exists.)
template <class T>
class CowHandle {
 public:
  /// A null handle (holds no T).
  CowHandle() noexcept = default;
  /// A handle to a new T constructed from `args`.
  template <class... Args>
  static CowHandle make(Args&&... args) {
    CowHandle h;
    h.box_ = new Box{std::forward<Args>(args)...};
    return h;
  }
  CowHandle(const CowHandle& o) noexcept : box_(o.box_) {
    if (box_ != nullptr) box_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  CowHandle(CowHandle&& o) noexcept : box_(std::exchange(o.box_, nullptr)) {}
  CowHandle& operator=(CowHandle o) noexcept {
    std::swap(box_, o.box_);
    return *this;
  }
  ~CowHandle() { reset(); }

  /// Drops this handle (destroying the T if it was the last one).
  void reset() noexcept {
    Box* b = std::exchange(box_, nullptr);
    if (b != nullptr && b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
  }

  explicit operator bool() const noexcept { return box_ != nullptr; }
  const T& operator*() const noexcept { return box_->value; }
  const T* operator->() const noexcept { return &box_->value; }
  /// True when another handle holds the same T (it must then not be mutated). Not null.
  bool shared() const noexcept { return box_->refs.load(std::memory_order_acquire) != 1; }
  /// The T for writing; only when !shared() (checked in debug builds).
  T& mutable_value() noexcept {
    assert(!shared());
    return box_->value;
  }
  /// A handle to a new copy of the T (the source is only read, so it may be shared).
  CowHandle clone() const { return make(box_->value); }

 private:
  struct Box {
    template <class... Args>
    explicit Box(Args&&... args) : value(std::forward<Args>(args)...) {}
    std::atomic<size_t> refs{1};
    T value;
  };
  Box* box_ = nullptr;
};

/// A capture of one state: its name, kind and format flags and the maps of its key groups as they were at
/// capture time (HeapStateBase::capture()). Self-contained: it does not refer to the state or the backend,
/// so it may outlive both.
///
/// Thread-safety: immutable; any thread may call its const members, concurrently with the task thread
/// that keeps mutating the state (which clones the key groups it touches instead of changing these).
class CapturedState {
 public:
  CapturedState(std::string name, StateKind kind, uint8_t flags) : name_(std::move(name)), kind_(kind), flags_(flags) {}
  virtual ~CapturedState() = default;
  CapturedState(const CapturedState&) = delete;
  CapturedState& operator=(const CapturedState&) = delete;

  const std::string& name() const noexcept { return name_; }
  StateKind kind() const noexcept { return kind_; }
  uint8_t format_flags() const noexcept { return flags_; }
  /// Entries of key group index `group` (key group - range start) at capture time.
  virtual size_t num_entries_in_group(int32_t group) const noexcept = 0;
  /// Appends those entries exactly as HeapStateBase::write_group wrote them at capture time.
  virtual void write_group(int32_t group, DataOutput& out) const = 0;

 private:
  std::string name_;
  StateKind kind_;
  uint8_t flags_;
};

/// One absl::flat_hash_map per key group of the range, from (key, namespace) to the slot S. Each entry
/// stores its table hash, so lookups with a known key hash and rehashing never serialize a key again.
///
/// Copy-on-write: each group's map sits behind a CowHandle. share() hands out handles to all of them (a
/// capture); every mutating member first calls prepare_write(g), which clones group g's map if a capture
/// still holds it. Reads (map(), lookup()) never clone. A clone changes mutations(), so Entry pointers
/// and iterators taken before it are known to be stale.
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
  using MapHandle = CowHandle<Map>;

  explicit StateTable(int32_t num_groups) {
    maps_.reserve(static_cast<size_t>(num_groups));
    for (int32_t g = 0; g < num_groups; ++g)
      maps_.push_back(MapHandle::make());
  }

  int32_t num_groups() const noexcept { return static_cast<int32_t>(maps_.size()); }
  size_t size() const noexcept { return size_; }
  /// Counts inserts, erases and copy-on-write clones: an Entry* or iterator stays valid while it does not
  /// change.
  uint64_t mutations() const noexcept { return mutations_; }
  /// The map of group g, for reading (it may be shared with a capture).
  const Map& map(int32_t g) const noexcept { return *maps_[g]; }
  /// The map of group g, for writing (cloned first when a capture holds it).
  Map& mutable_map(int32_t g) {
    prepare_write(g);
    return maps_[g].mutable_value();
  }

  /// True when a live capture holds group g's map, so the next mutation of g clones it.
  bool is_shared(int32_t g) const noexcept { return maps_[g].shared(); }
  /// Makes group g's map private to this table (cloning it if a capture holds it); every mutation of g
  /// goes through here. One branch when no capture holds the group.
  void prepare_write(int32_t g) {
    if (maps_[g].shared()) [[unlikely]]
      clone_group(g);
  }

  /// The entry (key, ns) of group g for reading, or nullptr; it may live in a map shared with a capture.
  const Entry* lookup(int32_t g, const K& key, const N& ns, size_t hash) const {
    const Map& m = *maps_[g];
    auto it = m.find(Probe{&key, &ns, hash});
    return it == m.end() ? nullptr : &*it;
  }

  /// The entry (key, ns) of group g for writing, or nullptr (makes the group private first).
  Entry* find(int32_t g, const K& key, const N& ns, size_t hash) {
    Map& m = mutable_map(g);
    auto it = m.find(Probe{&key, &ns, hash});
    return it == m.end() ? nullptr : &*it;
  }

  /// The entry (key, ns) of group g, inserted with a value-initialized slot when absent; `.second` is true
  /// when it was inserted. Makes the group private first.
  std::pair<Entry*, bool> find_or_insert(int32_t g, const K& key, const N& ns, size_t hash) {
    if (Entry* e = find(g, key, ns, hash)) return {e, false};
    auto it = maps_[g].mutable_value().try_emplace(EntryKey{key, ns, hash}).first;
    ++size_;
    ++mutations_;
    return {&*it, true};
  }

  /// Erases the entry with the key and namespace of `e`, which may point into a map shared with a capture
  /// (the erase then happens in the clone).
  void erase(int32_t g, const Entry* e) {
    Map& m = mutable_map(g);
    ++mutations_;
    --size_;
    m.erase(e->first);
  }
  /// Erases `it`, an iterator of mutable_map(g) taken after the last clone of g.
  void erase(int32_t g, typename Map::const_iterator it) {
    assert(!maps_[g].shared());
    ++mutations_;
    --size_;
    maps_[g].mutable_value().erase(it);
  }

  /// Handles to the maps of all groups, for a capture. From now on, the first mutation of each group
  /// clones it, until the capture drops its handle. Also drops the map retired by the last clone.
  std::vector<MapHandle> share() {
    retired_.reset();
    return maps_;
  }

 private:
  // Replaces group g's shared map with a private copy. The old map is kept in retired_ until the next
  // clone or capture: a reference the caller read from it just before (a state's value() passed to its own
  // update(), say) must stay valid for the rest of this call even if the capture drops its handle on
  // another thread meanwhile.
  [[gnu::noinline]] void clone_group(int32_t g) {
    MapHandle copy = maps_[g].clone();
    retired_ = std::exchange(maps_[g], std::move(copy));
    ++mutations_;
  }

  std::vector<MapHandle> maps_;
  MapHandle retired_;
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
  /// Captures the entries of every key group as they are now: O(key groups), copies no entry. Later
  /// mutations of this state clone the key groups they touch first, so the capture never changes. Task
  /// thread only; the capture may then be read and destroyed on any thread.
  virtual std::unique_ptr<CapturedState> capture() = 0;

 protected:
  std::string name_;
  StateKind kind_;
  StateTtlConfig ttl_;
  const KeyContext<K>& ctx_;
  const Clock& clock_;
};

/// Writes a slot's snapshot bytes (each state kind's static write_slot); `ttl`: the state has TTL.
template <class S>
using SlotWriter = void (*)(const S& slot, bool ttl, DataOutput& out);

/// Appends the entries of one key group's map (key, namespace, slot), in the map's iteration order. The
/// live state and its captures both write through this, so their bytes are the same.
template <class K, class N, class S>
void write_entries(const typename StateTable<K, N, S>::Map& map, SlotWriter<S> write_slot, bool ttl, DataOutput& out) {
  for (const auto& [k, slot] : map) {
    TypeSerializer<K>::serialize(k.key, out);
    TypeSerializer<N>::serialize(k.ns, out);
    write_slot(slot, ttl, out);
  }
}

/// The capture of a HeapKvState: the handles of its key-group maps at capture time.
template <class K, class N, class S>
class CapturedKvState final : public CapturedState {
 public:
  using Map = typename StateTable<K, N, S>::Map;

  CapturedKvState(std::string name, StateKind kind, uint8_t flags, std::vector<CowHandle<Map>> maps,
                  SlotWriter<S> write_slot)
      : CapturedState(std::move(name), kind, flags), maps_(std::move(maps)), write_slot_(write_slot) {}

  size_t num_entries_in_group(int32_t group) const noexcept override { return maps_[group]->size(); }
  void write_group(int32_t group, DataOutput& out) const override {
    write_entries<K, N, S>(*maps_[group], write_slot_, (format_flags() & kStateFlagTtl) != 0, out);
  }

 private:
  std::vector<CowHandle<Map>> maps_;
  SlotWriter<S> write_slot_;
};

/// Common code of the heap states: current namespace, lookups of the current key, TTL and the
/// incremental cleanup cursor, the entry framing (key, namespace) of snapshots, and copy-on-write captures.
///
/// Reads look entries up with peek_current (never clones); writes with find_current / insert_current /
/// find_in / insert_in / erase, which make the key group private first; a read that must write after all
/// (TTL) upgrades its entry with writable().
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
    write_entries<K, N, S>(table_.map(group), write_slot_, ttl_on(), out);
  }

  std::unique_ptr<CapturedState> capture() override {
    return std::make_unique<CapturedKvState<K, N, S>>(this->name_, this->kind_, this->format_flags(), table_.share(),
                                                      write_slot_);
  }

  void read_group(int32_t group, KeyGroup kg, int max_parallelism, uint64_t count, DataInput& in) override {
    // One allocation of the group's table instead of log2(count) rehashes while a restore fills it; the
    // count comes from the bytes, so cap it by what they could hold (an entry is at least two bytes).
    typename Table::Map& m = table_.mutable_map(group);
    m.reserve(m.size() + static_cast<size_t>(std::min<uint64_t>(count, in.remaining() / 2)));
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
    if (const Entry* e = table_.lookup(g, key, ns, entry_hash<N>(key_hash, StateHasher<N>{}(ns)))) table_.erase(g, e);
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
              int32_t num_groups, SlotWriter<S> write_slot)
      : HeapStateBase<K>(std::move(name), kind, ttl, ctx, clock),
        table_(num_groups),
        write_slot_(write_slot),
        cleanup_(ttl.enabled() && ttl.cleanup_incrementally && ttl.incremental_cleanup_size > 0) {}

  virtual void read_slot(S& slot, DataInput& in) = 0;
  /// True when something in `slot` expired at `now` (so purge_expired would change it). Only reads.
  virtual bool has_expired(const S& slot, TimestampMs now) const = 0;
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

  // The entry of the current key and namespace for reading, or nullptr; it may live in a key group shared
  // with a capture. The entry found last is remembered until the key, the namespace or the table changes,
  // so value() followed by update() probes the table once.
  const Entry* peek_current(int32_t g) {
    if (cache_valid()) return cached_;
    const Entry* e = table_.lookup(g, this->ctx_.key, ns_, current_hash());
    if (e != nullptr) remember(const_cast<Entry*>(e));  // written through only once the group is private
    return e;
  }
  // The entry of the current key and namespace for writing, or nullptr (the key group is made private).
  Entry* find_current(int32_t g) {
    if (cache_valid() && !table_.is_shared(g)) return cached_;
    Entry* e = table_.find(g, this->ctx_.key, ns_, current_hash());
    if (e != nullptr) remember(e);
    return e;
  }
  std::pair<Entry*, bool> insert_current(int32_t g) {
    if (cache_valid() && !table_.is_shared(g)) return {cached_, false};
    auto result = table_.find_or_insert(g, this->ctx_.key, ns_, current_hash());
    remember(result.first);
    return result;
  }
  Entry* find_in(int32_t g, const N& ns) { return table_.find(g, this->ctx_.key, ns, hash_in(ns)); }
  std::pair<Entry*, bool> insert_in(int32_t g, const N& ns) {
    return table_.find_or_insert(g, this->ctx_.key, ns, hash_in(ns));
  }
  // `e` may come from peek_current (the erase then clones the group first).
  void erase(int32_t g, const Entry* e) { table_.erase(g, e); }
  // Removes the current key's entry in the current namespace (every state kind's clear()).
  void clear_current() {
    const int32_t g = group();
    if (const Entry* pos = peek_current(g); pos != nullptr) erase(g, pos);
  }
  // The writable entry for `e`, which peek_current returned for group g: `e` itself when the group is
  // private, otherwise the same entry in the group's new private copy.
  Entry* writable(int32_t g, const Entry* e) {
    if (!table_.is_shared(g)) [[likely]]
      return const_cast<Entry*>(e);
    Entry* w = table_.find(g, e->first.key, e->first.ns, e->first.hash);
    remember(w);
    return w;
  }

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
  // again, and if that entry is gone the scan restarts at the beginning of its key group. The scan only
  // reads until it finds something expired; a key group shared with a capture is cloned just then.
  void incremental_cleanup(TimestampMs now) {
    if (table_.size() == 0) return;
    int budget = this->ttl_.incremental_cleanup_size;
    const int32_t n = table_.num_groups();
    const int32_t max_skips = std::min(n, kMaxGroupsSkippedPerCleanup);
    int32_t skips = 0;
    const typename Table::Map* map = &table_.map(cursor_group_);
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
      if (!has_expired(it->second, now)) {
        ++it;
        continue;
      }
      if (table_.is_shared(cursor_group_)) [[unlikely]] {
        cursor_key_ = it->first;
        map = &table_.mutable_map(cursor_group_);
        it = map->find(cursor_key_);
      }
      // The group's map is private now and not a const object, so writing through the iterator is sound.
      if (purge_expired(const_cast<S&>(it->second), now)) {
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

  SlotWriter<S> write_slot_;
  K read_key_{};
  N read_ns_{};
  bool cleanup_;
  int32_t cursor_group_ = 0;
  bool has_cursor_ = false;
  typename Table::Map::const_iterator cursor_it_{};
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

/// What the states whose slot is one value with its last-access timestamp (value, reducing, aggregating) share:
/// the snapshot entry value (the value, then with TTL the timestamp) and expiry of the whole slot; and the
/// TTL-aware read and namespace merge of ReducingState and AggregatingState.
template <class K, class N, class V>
class HeapTtlSlotState : public HeapKvState<K, N, TtlSlot<V>> {
  using Base = HeapKvState<K, N, TtlSlot<V>>;

 protected:
  using Slot = TtlSlot<V>;
  using Entry = typename Base::Entry;

  HeapTtlSlotState(std::string name, StateKind kind, const StateTtlConfig& ttl, const KeyContext<K>& ctx,
                   const Clock& clock, int32_t num_groups)
      : Base(std::move(name), kind, ttl, ctx, clock, num_groups, &write_slot) {}

  /// `project(value)` of the current key's value, or nullopt when there is none. An expired value is removed;
  /// it is projected (as an rvalue) first only when the TTL config returns expired values.
  template <class R, class Project>
  std::optional<R> get_current(Project project) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* pos = this->peek_current(g);
    if (pos == nullptr) return std::nullopt;
    if (this->ttl_on()) {
      if (this->expired(pos->second.ts, now)) {
        Entry* w = this->writable(g, pos);
        std::optional<R> result;
        if (this->return_expired()) result = project(std::move(w->second.value));
        this->erase(g, w);
        return result;
      }
      if (this->refresh_on_read()) this->writable(g, pos)->second.ts = now;
    }
    return project(std::as_const(pos->second.value));
  }

  /// Combines the values of `sources` (skipping expired ones) into `target` with `combine(V&& a, const V& b)`
  /// and removes the sources, for the current key (Flink's mergeNamespaces). `sources` may contain `target`.
  template <class Combine>
  void merge_current(const N& target, std::span<const N> sources, Combine combine) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    std::optional<V> merged;
    for (const N& source : sources) {
      Entry* pos = this->find_in(g, source);
      if (pos == nullptr) continue;
      Slot& slot = pos->second;
      if (!this->ttl_on() || !this->expired(slot.ts, now)) {
        if (merged) {
          merged = combine(std::move(*merged), std::as_const(slot.value));
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
      slot.value = combine(std::move(slot.value), std::as_const(*merged));
    } else {
      slot.value = std::move(*merged);
    }
    slot.ts = now;
  }

 private:
  static void write_slot(const Slot& slot, bool ttl, DataOutput& out) {
    TypeSerializer<V>::serialize(slot.value, out);
    if (ttl) out.write_fixed<int64_t>(slot.ts);
  }
  void read_slot(Slot& slot, DataInput& in) final {
    TypeSerializer<V>::deserialize(slot.value, in);
    if (this->ttl_on()) slot.ts = in.read_fixed<int64_t>();
  }
  bool has_expired(const Slot& slot, TimestampMs now) const final { return this->expired(slot.ts, now); }
  bool purge_expired(Slot& slot, TimestampMs now) final { return this->expired(slot.ts, now); }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Value state
// ---------------------------------------------------------------------------------------------------------

/// ValueState on the heap backend. Snapshot entry value: the value, then (TTL) the timestamp.
template <class K, class N, class T>
class HeapValueState final : public detail::HeapTtlSlotState<K, N, T>, public ValueState<T> {
  using Base = detail::HeapTtlSlotState<K, N, T>;
  using typename Base::Entry;
  using typename Base::Slot;

 public:
  using ValueType = T;

  HeapValueState(const ValueStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                 int32_t num_groups)
      : Base(d.name, StateKind::kValue, d.ttl, ctx, clock, num_groups), default_(d.default_value) {}

  const T& value() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* pos = this->peek_current(g);
    if (pos == nullptr) return default_;
    if (this->ttl_on()) {
      if (this->expired(pos->second.ts, now)) {
        if (!this->return_expired()) {
          this->erase(g, pos);
          return default_;
        }
        Entry* w = this->writable(g, pos);
        scratch_ = std::move(w->second.value);
        this->erase(g, w);
        return scratch_;
      }
      if (this->refresh_on_read()) {
        Slot& slot = this->writable(g, pos)->second;
        slot.ts = now;
        return slot.value;
      }
    }
    return pos->second.value;
  }

  bool has_value() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* pos = this->peek_current(g);
    if (pos == nullptr) return false;
    if (this->ttl_on() && !this->return_expired() && this->expired(pos->second.ts, now)) {
      this->erase(g, pos);
      return false;
    }
    return true;
  }

  void update(const T& value) override { write(value); }
  void update(T&& value) override { write(std::move(value)); }

  void clear() override { this->clear_current(); }

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
      : Base(d.name, StateKind::kList, d.ttl, ctx, clock, num_groups, &write_slot) {}

  const std::vector<T>& get() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* peeked = this->peek_current(g);
    if (peeked == nullptr) return empty_;
    if (!this->ttl_on()) return peeked->second.values;
    bool any_expired = has_expired(peeked->second, now);
    if (!any_expired && !this->refresh_on_read()) return peeked->second.values;
    Entry* pos = this->writable(g, peeked);
    Slot& slot = pos->second;
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

  void clear() override { this->clear_current(); }

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

  static void write_slot(const Slot& slot, bool ttl, DataOutput& out) {
    out.write_varint(slot.values.size());
    for (size_t i = 0; i < slot.values.size(); ++i) {
      TypeSerializer<T>::serialize(slot.values[i], out);
      if (ttl) out.write_fixed<int64_t>(slot.ts[i]);
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
  bool has_expired(const Slot& slot, TimestampMs now) const override {
    return std::any_of(slot.ts.begin(), slot.ts.end(), [&](TimestampMs t) { return this->expired(t, now); });
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
      : Base(d.name, StateKind::kMap, d.ttl, ctx, clock, num_groups, &write_slot) {}

  std::optional<UV> get(const UK& key) override {
    const UV* v = find(key);
    return v == nullptr ? std::nullopt : std::optional<UV>(*v);
  }

  const UV* find(const UK& key) override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* peeked = this->peek_current(g);
    if (peeked == nullptr) return nullptr;
    auto found = peeked->second.map.find(key);
    if (found == peeked->second.map.end()) return nullptr;
    if (!this->ttl_on() || (!this->refresh_on_read() && !this->expired(found->second.ts, now))) {
      return &found->second.value;
    }
    Entry* pos = this->writable(g, peeked);
    auto& map = pos->second.map;
    if (this->expired(found->second.ts, now)) {
      bool keep_copy = this->return_expired();
      auto it = map.find(key);
      if (keep_copy) scratch_ = std::move(it->second.value);
      map.erase(it);
      if (map.empty()) this->erase(g, pos);
      return keep_copy ? &scratch_ : nullptr;
    }
    // Refresh on read. Unless the group was just cloned, `found` is in the private map, which is not const.
    auto& value = pos == peeked ? const_cast<detail::MapValue<UV>&>(found->second) : map.find(key)->second;
    value.ts = now;
    return &value.value;
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
    const Entry* peeked = this->peek_current(g);
    if (peeked == nullptr || !peeked->second.map.contains(key)) return;
    Entry* pos = this->writable(g, peeked);
    auto& map = pos->second.map;
    map.erase(key);
    if (map.empty()) this->erase(g, pos);
  }

  bool is_empty() override {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* peeked = this->peek_current(g);
    if (peeked == nullptr) return true;
    if (this->ttl_on() && !this->return_expired() && has_expired(peeked->second, now)) {
      Entry* pos = this->writable(g, peeked);
      if (purge_expired(pos->second, now)) {
        this->erase(g, pos);
        return true;
      }
      return pos->second.map.empty();
    }
    return peeked->second.map.empty();
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

  void clear() override { this->clear_current(); }

 private:
  // Visits the entries of the current key and namespace, applying TTL: expired entries are skipped (or,
  // with kReturnExpiredIfNotCleanedUp, visited once) and removed; reads refresh with kOnReadAndWrite.
  template <class Fn>
  void visit(Fn&& fn) {
    int32_t g = this->group();
    TimestampMs now = this->begin_access();
    const Entry* peeked = this->peek_current(g);
    if (peeked == nullptr) return;
    if (!this->ttl_on() || (!this->refresh_on_read() && !has_expired(peeked->second, now))) {
      for (const auto& [k, v] : peeked->second.map)
        fn(k, v.value);
      return;
    }
    Entry* pos = this->writable(g, peeked);
    auto& map = pos->second.map;
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

  static void write_slot(const Slot& slot, bool ttl, DataOutput& out) {
    out.write_varint(slot.map.size());
    for (const auto& [k, v] : slot.map) {
      TypeSerializer<UK>::serialize(k, out);
      TypeSerializer<UV>::serialize(v.value, out);
      if (ttl) out.write_fixed<int64_t>(v.ts);
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
  bool has_expired(const Slot& slot, TimestampMs now) const override {
    return std::any_of(slot.map.begin(), slot.map.end(),
                       [&](const auto& kv) { return this->expired(kv.second.ts, now); });
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
class HeapReducingState final : public detail::HeapTtlSlotState<K, N, T>, public ReducingState<T> {
  using Base = detail::HeapTtlSlotState<K, N, T>;
  using typename Base::Entry;
  using typename Base::Slot;

 public:
  using ValueType = T;

  HeapReducingState(const ReducingStateDescriptor<T>& d, const detail::KeyContext<K>& ctx, const Clock& clock,
                    int32_t num_groups)
      : Base(d.name, StateKind::kReducing, d.ttl, ctx, clock, num_groups), reduce_(d.reduce) {}

  std::optional<T> get() override {
    return this->template get_current<T>([](auto&& value) -> T { return std::forward<decltype(value)>(value); });
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

  void clear() override { this->clear_current(); }

  /// Reduces the values of `sources` (skipping expired ones) into `target` and removes the sources, for the
  /// current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    this->merge_current(target, sources, [this](T&& a, const T& b) { return reduce_(std::as_const(a), b); });
  }

 private:
  std::function<T(const T&, const T&)> reduce_;
};

// ---------------------------------------------------------------------------------------------------------
// Aggregating state
// ---------------------------------------------------------------------------------------------------------

/// AggregatingState on the heap backend; TTL applies to the accumulator. Snapshot entry value: the
/// accumulator, then (TTL) the timestamp.
template <class K, class N, class In, class Acc, class Out>
class HeapAggregatingState final : public detail::HeapTtlSlotState<K, N, Acc>, public AggregatingState<In, Out> {
  using Base = detail::HeapTtlSlotState<K, N, Acc>;
  using typename Base::Entry;
  using typename Base::Slot;

 public:
  using InputType = In;
  using AccumulatorType = Acc;
  using OutputType = Out;

  HeapAggregatingState(const AggregatingStateDescriptor<In, Acc, Out>& d, const detail::KeyContext<K>& ctx,
                       const Clock& clock, int32_t num_groups)
      : Base(d.name, StateKind::kAggregating, d.ttl, ctx, clock, num_groups), fn_(d.aggregate) {}

  std::optional<Out> get() override {
    return this->template get_current<Out>([this](const Acc& acc) { return fn_->get_result(acc); });
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

  void clear() override { this->clear_current(); }

  /// Merges the accumulators of `sources` (skipping expired ones) into `target` and removes the sources, for
  /// the current key (Flink's mergeNamespaces). `sources` may contain `target`.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    this->merge_current(target, sources, [this](Acc&& a, const Acc& b) { return fn_->merge(std::move(a), b); });
  }

 private:
  std::shared_ptr<AggregateFunction<In, Acc, Out>> fn_;
};

}  // namespace sluice
