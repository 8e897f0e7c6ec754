// HeapKeyedStateBackend<K>: the keyed state of one operator subtask, kept in hash maps per key group
// (Flink's HeapKeyedStateBackend).
//
// Lifecycle: created for the subtask's key-group range → restore() / restore_key_group() (optional, before
// or after states are registered) → running (set_current_key + state access per record or timer) →
// snapshot() / snapshot_key_group() at checkpoints → destroyed with the task.
//
// The current key: set_current_key(k) serializes k with TypeSerializer<K> into a reused buffer, hashes
// the bytes (XXH3, core/key_group.h), takes the key group and checks that this subtask owns it. The key's
// hash is kept, so a state access afterwards is a single probe into the key group's table: no allocation
// and no second hash in steady state.
//
// Namespaces (decision): each state object carries its own current namespace, set with
// state.set_current_namespace(ns) as Flink's InternalKvState.setCurrentNamespace; get_state(d) is
// get_partitioned_state<VoidNamespace>(d). A window operator asks for get_partitioned_state<Window>(d) and
// sets the window on the state before each access; plain keyed functions never see a namespace.
//
// Snapshots (format in docs/state-format.md) come two ways:
//  * snapshot() / snapshot_key_group(): a synchronous, consistent, full copy into bytes on the task thread;
//  * capture(): a copy-on-write capture (heap_state.h) that takes references to every key group's map in
//    O(states x key groups) and copies no entry; the checkpoint writer thread then writes its key groups
//    (the same bytes snapshot_key_group() wrote at capture time) while the task keeps processing, and
//    each key group the task mutates meanwhile is cloned once, on first write.
// Restore accepts key groups from any old parallelism: that is how rescaling moves keyed state. States
// restored before their descriptor is registered are kept as bytes and decoded on registration (and
// written back unchanged by snapshots until then).
//
// Threading: everything runs on the owning task thread; nothing is thread-safe, except the snapshot that
// capture() returns (HeapKeyedStateSnapshot), which any thread may write and destroy.
// Errors: misuse (no current key, a key outside the range, a name registered with another kind or type)
// throws SluiceException with ErrorCode::kState; restore returns a Status.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"
#include "sluice/state/heap_state.h"
#include "sluice/state/state.h"

namespace sluice {

template <class K, class N>
class InternalTimerService;

namespace detail {

/// Magic bytes at the start of a whole-range keyed-state snapshot.
inline constexpr char kKeyedStateMagic[4] = {'S', 'L', 'K', 'S'};

/// Entries of one state restored before its descriptor was registered: raw entry bytes per key group.
/// Held through a CowHandle, so a capture takes a reference and a later restore into it clones it first.
struct PendingKeyedState {
  struct Group {
    uint64_t count = 0;
    std::string owned;          ///< a copy, when the bytes came without an owner or in several pieces
    std::string_view borrowed;  ///< else a view into memory `owners` keeps alive (a mapped state file)
    std::string_view bytes() const noexcept { return owned.empty() ? borrowed : std::string_view(owned); }
    /// Adds the entry bytes of one more section; borrows them when `can_borrow` and nothing is held yet.
    void append(std::string_view more, bool can_borrow) {
      if (can_borrow && owned.empty() && borrowed.empty()) {
        borrowed = more;
        return;
      }
      if (owned.empty()) {
        owned.assign(borrowed);
        borrowed = {};
      }
      owned.append(more);
    }
  };
  StateKind kind = StateKind::kValue;
  uint8_t flags = 0;
  std::vector<Group> groups;  // indexed by key group - range start
  /// Keep-alive references to the memory borrowed views point into.
  std::vector<std::shared_ptr<const void>> owners;
};
using PendingHandle = CowHandle<PendingKeyedState>;

/// Returns kState errors for a restored state that does not match its registration, or OK.
Status check_restored_state(std::string_view name, StateKind restored_kind, uint8_t restored_flags,
                            StateKind registered_kind, uint8_t registered_flags);
/// Throws kConfiguration for a bad range or max parallelism.
void check_backend_range(const KeyGroupRange& range, int max_parallelism);
/// Throws kConfiguration for an empty name, a bad TTL or a missing function.
void check_descriptor(std::string_view name, const StateTtlConfig& ttl, bool has_function);
/// Throws kState: `name` is registered as another kind or with other types.
[[noreturn]] void throw_state_type_mismatch(std::string_view name, StateKind registered, StateKind requested,
                                            bool same_kind);
/// Writes a section (docs/state-format.md) header and returns the offset of its 8-byte length field.
size_t begin_state_section(DataOutput& out, std::string_view name, StateKind kind, uint8_t flags, uint64_t count);
/// Back-patches the 8-byte length field written at `length_offset` with the bytes written after it.
void end_length_prefixed(DataOutput& out, size_t length_offset);
/// Reads a state kind byte; throws kSerialization for an unknown kind.
StateKind read_state_kind(DataInput& in);

/// Writes one key-group blob (docs/state-format.md) for group index `g`: the sections of `states` (pairs of
/// name and a pointer to a HeapStateBase or CapturedState, in name order), then of `pending` (pairs of name
/// and PendingHandle, in name order). The live backend and its captures both write through this.
template <class States, class Pending>
void write_key_group_blob(KeyGroup kg, int32_t g, const States& states, const Pending& pending, DataOutput& out) {
  out.write_varint(kStateFormatVersion);
  out.write_varint(static_cast<uint64_t>(kg.value));
  uint64_t sections = 0;
  for (const auto& [name, s] : states)
    sections += s->num_entries_in_group(g) > 0 ? 1 : 0;
  for (const auto& [name, p] : pending)
    sections += p->groups[g].count > 0 ? 1 : 0;
  out.write_varint(sections);
  for (const auto& [name, s] : states) {
    size_t n = s->num_entries_in_group(g);
    if (n == 0) continue;
    size_t length_at = begin_state_section(out, name, s->kind(), s->format_flags(), n);
    s->write_group(g, out);
    end_length_prefixed(out, length_at);
  }
  for (const auto& [name, p] : pending) {
    const auto& pg = p->groups[g];
    if (pg.count == 0) continue;
    size_t length_at = begin_state_section(out, name, p->kind, p->flags, pg.count);
    const std::string_view bytes = pg.bytes();
    out.write_bytes(bytes.data(), bytes.size());
    end_length_prefixed(out, length_at);
  }
}

/// Writes a whole-range snapshot (docs/state-format.md): header, state metadata, then every key group
/// through write_group(KeyGroup, DataOutput&).
template <class States, class Pending, class WriteGroup>
void write_whole_range(const KeyGroupRange& range, int max_parallelism, const States& states, const Pending& pending,
                       WriteGroup&& write_group, DataOutput& out) {
  out.write_bytes(kKeyedStateMagic, sizeof(kKeyedStateMagic));
  out.write_varint(kStateFormatVersion);
  out.write_varint(static_cast<uint64_t>(max_parallelism));
  out.write_varint(static_cast<uint64_t>(range.start()));
  out.write_varint(static_cast<uint64_t>(range.end()));
  out.write_varint(states.size() + pending.size());
  auto write_metadata = [&out](const std::string& name, StateKind kind, uint8_t flags) {
    out.write_string(name);
    out.write_u8(static_cast<uint8_t>(kind));
    out.write_u8(flags);
  };
  for (const auto& [name, s] : states)
    write_metadata(name, s->kind(), s->format_flags());
  for (const auto& [name, p] : pending)
    write_metadata(name, p->kind, p->flags);
  out.write_varint(static_cast<uint64_t>(range.size()));
  for (int32_t kg = range.start(); kg <= range.end(); ++kg) {
    out.write_varint(static_cast<uint64_t>(kg));
    size_t length_at = out.size();
    out.write_fixed<uint64_t>(0);
    write_group(KeyGroup{kg}, out);
    end_length_prefixed(out, length_at);
  }
}

}  // namespace detail

/// The copy-on-write capture of a HeapKeyedStateBackend (HeapKeyedStateBackend::capture()): state metadata,
/// references to every key group's map of every registered state, and the restored-but-unregistered
/// states, all as they were at capture time. It does not refer to the backend, so it may outlive it.
///
/// Thread-safety: immutable after capture(); write_key_group() and write_all() may run on any thread, also
/// concurrently with each other and with the task thread mutating the backend. Destroyed on any thread;
/// holding it costs memory: every key group the task mutates meanwhile exists twice until it is destroyed.
class HeapKeyedStateSnapshot final : public KeyedStateSnapshot {
 public:
  using CapturedStates = std::vector<std::pair<std::string, std::unique_ptr<detail::CapturedState>>>;
  using CapturedPending = std::vector<std::pair<std::string, detail::PendingHandle>>;

  /// Built by HeapKeyedStateBackend::capture(); `states` and `pending` in name order.
  HeapKeyedStateSnapshot(KeyGroupRange range, int max_parallelism, CapturedStates states, CapturedPending pending)
      : range_(range), max_parallelism_(max_parallelism), states_(std::move(states)), pending_(std::move(pending)) {}

  KeyGroupRange key_group_range() const override { return range_; }
  int max_parallelism() const override { return max_parallelism_; }

  /// Appends exactly the bytes HeapKeyedStateBackend::snapshot_key_group(kg) wrote at capture time. Throws
  /// SluiceException (kState) when `kg` is outside key_group_range().
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    if (!range_.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside the captured range " +
                                range_.to_string() + " (max parallelism " + std::to_string(max_parallelism_) + ")");
    }
    detail::write_key_group_blob(kg, kg.value - range_.start(), states_, pending_, out);
  }

  /// Appends exactly the bytes HeapKeyedStateBackend::snapshot() wrote at capture time.
  void write_all(DataOutput& out) const {
    detail::write_whole_range(
        range_, max_parallelism_, states_, pending_,
        [this](KeyGroup kg, DataOutput& o) {
          detail::write_key_group_blob(kg, kg.value - range_.start(), states_, pending_, o);
        },
        out);
  }

  /// Names of the captured states (registered, then restored but unregistered, each in name order).
  std::vector<std::string> state_names() const {
    std::vector<std::string> names;
    for (const auto& [name, s] : states_)
      names.push_back(name);
    for (const auto& [name, p] : pending_)
      names.push_back(name);
    return names;
  }

 private:
  KeyGroupRange range_;
  int max_parallelism_;
  CapturedStates states_;
  CapturedPending pending_;
};

/// The heap keyed state backend for key type K (requires TypeSerializer<K> and operator==).
template <class K>
class HeapKeyedStateBackend {
 public:
  /// A backend for the key groups `range` of `max_parallelism`; `clock` drives TTL and must outlive the
  /// backend. Throws SluiceException (kConfiguration) for an empty range or one outside
  /// [0, max_parallelism).
  HeapKeyedStateBackend(KeyGroupRange range, int max_parallelism, const Clock& clock)
      : range_(range), max_parallelism_(max_parallelism), clock_(clock) {
    detail::check_backend_range(range, max_parallelism);
  }
  HeapKeyedStateBackend(const HeapKeyedStateBackend&) = delete;
  HeapKeyedStateBackend& operator=(const HeapKeyedStateBackend&) = delete;

  const KeyGroupRange& key_group_range() const noexcept { return range_; }
  int max_parallelism() const noexcept { return max_parallelism_; }
  const Clock& clock() const noexcept { return clock_; }

  // -------------------------------------------------------------------------------------------------------
  // Current key
  // -------------------------------------------------------------------------------------------------------

  /// Makes `key` the key that every state of this backend reads and writes. Throws SluiceException
  /// (kState) naming the key group and the range when the key belongs to another subtask: records reached
  /// the wrong subtask, a partitioning bug.
  void set_current_key(const K& key) {
    if (ctx_.group >= 0 && ctx_.key == key) return;
    set_current_key_with_hash(key, hash_key(key));
  }
  /// True once set_current_key has succeeded.
  bool has_current_key() const noexcept { return ctx_.group >= 0; }
  /// The current key; only valid when has_current_key().
  const K& current_key() const noexcept { return ctx_.key; }
  /// The key group of the current key; only valid when has_current_key().
  KeyGroup current_key_group() const noexcept { return ctx_.key_group; }
  /// The key group `key` belongs to (whether or not this backend owns it).
  KeyGroup key_group_of(const K& key) { return key_group_for_hash(hash_key(key), max_parallelism_); }

  // -------------------------------------------------------------------------------------------------------
  // States
  // -------------------------------------------------------------------------------------------------------
  //
  // The returned state is owned by the backend and lives as long as it. Asking again with the same name
  // returns the same object; the same name with another kind, value type or namespace type throws
  // SluiceException (kState). A descriptor with an empty name, a negative TTL or a missing function
  // throws kConfiguration. If the state was restored before, its entries are decoded now; a kind or TTL
  // mismatch with the snapshot throws kState.

  template <class T>
  HeapValueState<K, VoidNamespace, T>& get_state(const ValueStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class T>
  HeapListState<K, VoidNamespace, T>& get_state(const ListStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class UK, class UV>
  HeapMapState<K, VoidNamespace, UK, UV>& get_state(const MapStateDescriptor<UK, UV>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class T>
  HeapReducingState<K, VoidNamespace, T>& get_state(const ReducingStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class In, class Acc, class Out>
  HeapAggregatingState<K, VoidNamespace, In, Acc, Out>& get_state(const AggregatingStateDescriptor<In, Acc, Out>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }

  /// States with namespace type N; call state.set_current_namespace(ns) before accessing them.
  template <class N, class T>
  HeapValueState<K, N, T>& get_partitioned_state(const ValueStateDescriptor<T>& d) {
    detail::check_descriptor(d.name, d.ttl, true);
    return register_state<HeapValueState<K, N, T>>(d, StateKind::kValue);
  }
  template <class N, class T>
  HeapListState<K, N, T>& get_partitioned_state(const ListStateDescriptor<T>& d) {
    detail::check_descriptor(d.name, d.ttl, true);
    return register_state<HeapListState<K, N, T>>(d, StateKind::kList);
  }
  template <class N, class UK, class UV>
  HeapMapState<K, N, UK, UV>& get_partitioned_state(const MapStateDescriptor<UK, UV>& d) {
    detail::check_descriptor(d.name, d.ttl, true);
    return register_state<HeapMapState<K, N, UK, UV>>(d, StateKind::kMap);
  }
  template <class N, class T>
  HeapReducingState<K, N, T>& get_partitioned_state(const ReducingStateDescriptor<T>& d) {
    detail::check_descriptor(d.name, d.ttl, static_cast<bool>(d.reduce));
    return register_state<HeapReducingState<K, N, T>>(d, StateKind::kReducing);
  }
  template <class N, class In, class Acc, class Out>
  HeapAggregatingState<K, N, In, Acc, Out>& get_partitioned_state(const AggregatingStateDescriptor<In, Acc, Out>& d) {
    detail::check_descriptor(d.name, d.ttl, d.aggregate != nullptr);
    return register_state<HeapAggregatingState<K, N, In, Acc, Out>>(d, StateKind::kAggregating);
  }

  /// Names of the registered states and of restored states not registered yet, sorted.
  std::vector<std::string> state_names() const {
    std::vector<std::string> names;
    for (const auto& [name, s] : states_)
      names.push_back(name);
    for (const auto& [name, p] : pending_)
      names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Entries stored over all states (one per key and namespace; expired entries not cleaned up count).
  size_t num_entries() const {
    size_t n = 0;
    for (const auto& [name, s] : states_)
      n += s->num_entries();
    for (const auto& [name, p] : pending_) {
      for (const auto& g : p->groups)
        n += g.count;
    }
    return n;
  }

  /// Entries of state `name` (0 when unknown).
  size_t num_entries(std::string_view name) const {
    if (auto it = states_.find(name); it != states_.end()) return it->second->num_entries();
    size_t n = 0;
    if (auto it = pending_.find(name); it != pending_.end()) {
      for (const auto& g : it->second->groups)
        n += g.count;
    }
    return n;
  }

  /// Calls fn(key) for every entry of the registered state `name` (once per key and namespace), in
  /// unspecified order. fn must not modify that state. Throws kState when no such state is registered.
  void for_each_key(std::string_view name, const std::function<void(const K&)>& fn) const {
    auto it = states_.find(name);
    if (it == states_.end()) {
      detail::throw_state_error("for_each_key: no state named '" + std::string(name) + "' is registered");
    }
    it->second->for_each_key(fn);
  }

  /// Calls fn(key, state) for every key that has an entry in namespace `ns` of the descriptor's state,
  /// with that key made current and `ns` set on the state (Flink's applyToAllKeys). fn may read, update
  /// or clear the state; the keys are collected first. Leaves the last visited key current.
  template <class N, class D, class Fn>
  void apply_to_all_keys(const N& ns, const D& descriptor, Fn&& fn) {
    auto& state = get_partitioned_state<N>(descriptor);
    std::vector<K> keys;
    state.collect_keys(ns, keys);
    for (const K& key : keys) {
      set_current_key(key);
      state.set_current_namespace(ns);
      fn(key, state);
    }
  }

  /// Removes the entry of `key` in namespace `ns` of `state` without changing the current key (a window
  /// operator clearing a window of another key). Throws kState when this backend does not own `key`.
  template <class S>
  void clear(S& state, const K& key, const typename S::Namespace& ns) {
    uint64_t h = hash_key(key);
    KeyGroup kg = key_group_for_hash(h, max_parallelism_);
    if (!range_.contains(kg)) detail::throw_key_outside_range(kg, range_, max_parallelism_);
    state.erase_entry(kg.value - range_.start(), key, h, ns);
  }

  /// Merges namespaces `sources` into `target` of a list, reducing or aggregating state for the current
  /// key (merging windows); the sources are removed.
  template <class S>
  void merge_namespaces(S& state, const typename S::Namespace& target, std::span<const typename S::Namespace> sources) {
    state.merge_namespaces(target, sources);
  }

  // -------------------------------------------------------------------------------------------------------
  // Snapshot and restore (docs/state-format.md)
  // -------------------------------------------------------------------------------------------------------

  /// Appends the entries of key group `kg` of every state. Throws kState when `kg` is outside the range.
  void snapshot_key_group(KeyGroup kg, DataOutput& out) const {
    detail::write_key_group_blob(kg, group_index(kg), states_, pending_, out);
  }

  /// Captures the state of every key group as it is now, for writing later, possibly on another thread
  /// (the asynchronous part of a checkpoint): its write_key_group(kg) writes what snapshot_key_group(kg)
  /// writes now, and its write_all() what snapshot() writes now. Costs O(states x key groups) reference
  /// counts and copies no entry; each key group that is then mutated while the capture lives is cloned on
  /// its first mutation (once per capture generation), which is the cost moved out of the pause. The
  /// capture holds the restored-but-unregistered states and the state metadata too. Task thread only;
  /// several captures may be alive at once.
  std::unique_ptr<HeapKeyedStateSnapshot> capture() const {
    HeapKeyedStateSnapshot::CapturedStates states;
    states.reserve(states_.size());
    for (const auto& [name, s] : states_)
      states.emplace_back(name, s->capture());
    HeapKeyedStateSnapshot::CapturedPending pending(pending_.begin(), pending_.end());
    return std::make_unique<HeapKeyedStateSnapshot>(range_, max_parallelism_, std::move(states), std::move(pending));
  }

  /// Restores one key group written by snapshot_key_group of any backend with the same max parallelism
  /// (any old parallelism). Entries replace those with the same key and namespace. Errors: kState when
  /// `kg` is outside this range, a state's kind or TTL differs from its registration, or an entry belongs
  /// to another key group; kSerialization for corrupt bytes. On error the backend may hold part of the
  /// key group; the task should fail.
  ///
  /// `owners`, when given, keep the memory `in` reads from alive and immutable (a restore's mapped state
  /// files): the entries of states not registered yet are then kept as views into it instead of copies.
  [[nodiscard]] Status restore_key_group(KeyGroup kg, DataInput& in,
                                         const std::vector<std::shared_ptr<const void>>* owners = nullptr) {
    try {
      restore_group(kg, in, owners);
      return ok_status();
    } catch (const SluiceException& e) {
      return e.error().with_context("restoring keyed state of key group " + std::to_string(kg.value));
    }
  }

  /// Appends a snapshot of the whole range: header, state metadata, then every key group.
  void snapshot(DataOutput& out) const {
    detail::write_whole_range(
        range_, max_parallelism_, states_, pending_, [this](KeyGroup kg, DataOutput& o) { snapshot_key_group(kg, o); },
        out);
  }

  /// Restores a whole-range snapshot of any backend with the same max parallelism, keeping only the key
  /// groups in this backend's range (the others are skipped without decoding). Checks every state's kind
  /// and TTL against registered descriptors first. Errors as restore_key_group; also kState when the max
  /// parallelism differs and kSerialization for a bad magic or an unknown version.
  [[nodiscard]] Status restore(DataInput& in) {
    try {
      char magic[4];
      in.read_bytes(magic, sizeof(magic));
      if (std::memcmp(magic, detail::kKeyedStateMagic, sizeof(magic)) != 0) {
        in.fail("not a keyed state snapshot (bad magic bytes)");
      }
      check_version(in.read_varint(), in);
      uint64_t maxp = in.read_varint();
      if (maxp != static_cast<uint64_t>(max_parallelism_)) {
        return Error(ErrorCode::kState, "restoring keyed state: the snapshot was taken with max parallelism " +
                                            std::to_string(maxp) + " but this operator has max parallelism " +
                                            std::to_string(max_parallelism_) +
                                            "; keyed state can only be rescaled within the same max parallelism "
                                            "(as in Flink): restore with the old max parallelism");
      }
      in.read_varint();  // range start of the writer (informational)
      in.read_varint();  // range end of the writer
      uint64_t num_states = in.read_varint();
      for (uint64_t i = 0; i < num_states; ++i) {
        std::string name;
        in.read_string(name);
        StateKind kind = detail::read_state_kind(in);
        uint8_t flags = in.read_u8();
        SLUICE_RETURN_IF_ERROR(check_against_registered(name, kind, flags));
      }
      uint64_t num_groups = in.read_varint();
      for (uint64_t i = 0; i < num_groups; ++i) {
        uint64_t kg = in.read_varint();
        if (kg >= static_cast<uint64_t>(max_parallelism_)) {
          in.fail("key group " + std::to_string(kg) + " out of range for max parallelism " +
                  std::to_string(max_parallelism_));
        }
        uint64_t length = in.read_fixed<uint64_t>();
        if (length > in.remaining()) in.fail("key group length exceeds the remaining bytes");
        std::string_view bytes = in.read_view(static_cast<size_t>(length));
        KeyGroup group{static_cast<int32_t>(kg)};
        if (!range_.contains(group)) continue;
        DataInput group_in(bytes);
        restore_group(group, group_in);
      }
      if (!in.at_end()) in.fail("trailing bytes after the last key group");
      return ok_status();
    } catch (const SluiceException& e) {
      return e.error().with_context("restoring keyed state");
    }
  }

 private:
  template <class, class>
  friend class InternalTimerService;

  uint64_t hash_key(const K& key) {
    key_buf_.clear();
    TypeSerializer<K>::serialize(key, key_buf_);
    return key_hash(key_buf_.bytes());
  }

  // Sets the current key when its stable hash is already known (timers, which store it).
  void set_current_key_with_hash(const K& key, uint64_t h) {
    KeyGroup kg = key_group_for_hash(h, max_parallelism_);
    if (!range_.contains(kg)) [[unlikely]]
      detail::throw_key_outside_range(kg, range_, max_parallelism_);
    ctx_.key = key;
    ctx_.key_hash = h;
    ctx_.key_group = kg;
    ctx_.group = kg.value - range_.start();
    ++ctx_.epoch;
  }

  const detail::KeyContext<K>& key_context() const noexcept { return ctx_; }

  int32_t group_index(KeyGroup kg) const {
    if (!range_.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside this backend's range " +
                                range_.to_string() + " (max parallelism " + std::to_string(max_parallelism_) + ")");
    }
    return kg.value - range_.start();
  }

  template <class S, class D>
  S& register_state(const D& d, StateKind kind) {
    if (auto it = states_.find(d.name); it != states_.end()) {
      detail::HeapStateBase<K>& existing = *it->second;
      auto* typed = existing.kind() == kind ? dynamic_cast<S*>(&existing) : nullptr;
      if (typed == nullptr) detail::throw_state_type_mismatch(d.name, existing.kind(), kind, existing.kind() == kind);
      return *typed;
    }
    auto state = std::make_unique<S>(d, ctx_, clock_, range_.size());
    S& ref = *state;
    if (auto p = pending_.find(d.name); p != pending_.end()) {
      const detail::PendingKeyedState& pending = *p->second;
      Status st = detail::check_restored_state(d.name, pending.kind, pending.flags, kind, ref.format_flags());
      st.value_or_throw();
      for (int32_t g = 0; g < range_.size(); ++g) {
        const auto& pg = pending.groups[g];
        if (pg.count == 0) continue;
        DataInput in(pg.bytes());
        ref.read_group(g, KeyGroup{range_.start() + g}, max_parallelism_, pg.count, in);
        if (!in.at_end()) in.fail("trailing bytes after the entries of state '" + d.name + "'");
      }
      pending_.erase(p);
    }
    states_.emplace(d.name, std::move(state));
    return ref;
  }

  static void check_version(uint64_t version, DataInput& in) {
    if (version != detail::kStateFormatVersion) {
      in.fail("unsupported keyed state format version " + std::to_string(version) + " (this build reads version " +
              std::to_string(detail::kStateFormatVersion) + ")");
    }
  }

  Status check_against_registered(const std::string& name, StateKind kind, uint8_t flags) const {
    if (auto it = states_.find(name); it != states_.end()) {
      return detail::check_restored_state(name, kind, flags, it->second->kind(), it->second->format_flags());
    }
    if (auto it = pending_.find(name); it != pending_.end()) {
      return detail::check_restored_state(name, kind, flags, it->second->kind, it->second->flags);
    }
    return ok_status();
  }

  // Parses one key-group blob; throws SluiceException on any error.
  void restore_group(KeyGroup kg, DataInput& in, const std::vector<std::shared_ptr<const void>>* owners = nullptr) {
    int32_t g = group_index(kg);
    check_version(in.read_varint(), in);
    uint64_t written_kg = in.read_varint();
    if (written_kg != static_cast<uint64_t>(kg.value)) {
      detail::throw_state_error("the bytes given for key group " + std::to_string(kg.value) + " hold key group " +
                                std::to_string(written_kg));
    }
    uint64_t sections = in.read_varint();
    for (uint64_t i = 0; i < sections; ++i) {
      std::string name;
      in.read_string(name);
      StateKind kind = detail::read_state_kind(in);
      uint8_t flags = in.read_u8();
      uint64_t count = in.read_varint();
      uint64_t length = in.read_fixed<uint64_t>();
      if (length > in.remaining()) in.fail("section length exceeds the remaining bytes");
      std::string_view bytes = in.read_view(static_cast<size_t>(length));
      check_against_registered(name, kind, flags).value_or_throw();
      if (auto it = states_.find(name); it != states_.end()) {
        DataInput section(bytes);
        it->second->read_group(g, kg, max_parallelism_, count, section);
        if (!section.at_end()) section.fail("trailing bytes after the entries of state '" + name + "'");
        continue;
      }
      auto [pit, inserted] = pending_.try_emplace(name);
      if (inserted) {
        pit->second = detail::PendingHandle::make();
      } else if (pit->second.shared()) {
        pit->second = pit->second.clone();  // a capture holds it: copy on write
      }
      detail::PendingKeyedState& pending = pit->second.mutable_value();
      if (pending.groups.empty()) {
        pending.kind = kind;
        pending.flags = flags;
        pending.groups.resize(static_cast<size_t>(range_.size()));
      }
      pending.groups[g].count += count;
      pending.groups[g].append(bytes, owners != nullptr);
      if (owners != nullptr) {
        for (const auto& o : *owners) {
          if (std::find(pending.owners.begin(), pending.owners.end(), o) == pending.owners.end())
            pending.owners.push_back(o);
        }
      }
    }
    if (!in.at_end()) in.fail("trailing bytes after the last state of key group " + std::to_string(kg.value));
  }

  KeyGroupRange range_;
  int max_parallelism_;
  const Clock& clock_;
  detail::KeyContext<K> ctx_;
  DataOutput key_buf_;
  std::map<std::string, std::unique_ptr<detail::HeapStateBase<K>>, std::less<>> states_;
  std::map<std::string, detail::PendingHandle, std::less<>> pending_;
};

}  // namespace sluice
