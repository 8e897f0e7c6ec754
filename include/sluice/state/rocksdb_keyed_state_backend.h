// One header over 800 lines: RocksDBKeyedStateBackend<K> and its state classes are templates on the key type that
// every keyed operator instantiates, so their definitions must be visible to it; they share one RocksDBInstance.
// RocksDBKeyedStateBackend<K>: the keyed state of one operator subtask in a RocksDB database on local disk
// (Flink's RocksDBKeyedStateBackend), for state larger than memory.
//
// Layout (DESIGN.md §6): one RocksDBInstance per subtask under its own working directory, one column family
// per state, and RocksDB keys made of
//     [key group: 2 bytes big-endian][TypeSerializer<K> bytes of the key][TypeSerializer<N> bytes of the namespace]
// followed, for map state, by the TypeSerializer bytes of the user key. Keys compare bytewise, so one key
// group is one contiguous key range. Values are TypeSerializer bytes: the value (value state), the reduced
// value (reducing), the accumulator (aggregating), the user value (map), and for list state the elements
// one after the other (add() appends with a RocksDB merge, without reading the list). TypeSerializer
// encodings are self-delimiting, so key, namespace and user key can be told apart again.
//
// Snapshots are the canonical key-group blobs of docs/state-format.md, byte-compatible with
// HeapKeyedStateBackend: a checkpoint or savepoint written by one backend restores into the other, and key
// groups move between subtasks on rescaling exactly as with the heap backend. capture() takes a RocksDB
// snapshot (a sequence number: no data is copied); the checkpoint writer thread then scans each key group
// through it while the task keeps writing. With incremental checkpoints (state.backend.incremental) the
// capture also holds a hard-link RocksDB checkpoint (rocksdb_incremental.h): checkpoints store its files, of
// which only SST files new since this backend's earlier uploads are uploaded, while savepoints stay canonical.
// A database restored from an incremental checkpoint is opened from its files; its states' kinds and format
// flags are kept in the database (RocksDBInstance::state_meta) and checked when the states are registered.
// TTL (Flink's StateTtlConfig on RocksDB): values carry their i64 last-access timestamp as in the canonical
// format (list elements and map entries each their own); a read never returns an expired value (it deletes
// it), and a compaction filter per column family drops expired values nobody reads (for lists: expired
// elements). Incremental cleanup settings are not needed and ignored: compaction does that work. Not
// supported yet, refused with a kConfiguration error rather than run differently: TTL visibility
// ReturnExpiredIfNotCleanedUp. The Clock must outlive the backend and its captures (compactions read it).
// Threading: everything runs on the owning task thread, except the RocksDBKeyedStateSnapshot that capture()
// returns, which any thread may write and destroy. Errors: misuse throws SluiceException (kState), RocksDB
// failures kState too; restore returns a Status.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
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
#include "sluice/state/rocksdb_incremental.h"
#include "sluice/state/rocksdb_instance.h"
#include "sluice/state/state.h"

namespace sluice {

namespace detail {

/// Appends the 2-byte big-endian key-group prefix of every RocksDB key.
inline void append_key_group_prefix(std::string& out, int32_t kg) {
  out.push_back(static_cast<char>((kg >> 8) & 0xff));
  out.push_back(static_cast<char>(kg & 0xff));
}
inline std::string key_group_prefix(int32_t kg) {
  std::string s;
  append_key_group_prefix(s, kg);
  return s;
}

/// Serializes `v` into `buf` (cleared first) and returns its bytes.
template <class T>
std::string_view encode_into(DataOutput& buf, const T& v) {
  buf.clear();
  TypeSerializer<T>::serialize(v, buf);
  return buf.view();
}

/// Deserializes a whole value; throws kSerialization on trailing bytes (a corrupt database value).
template <class T>
void decode_from(std::string_view bytes, T& v) {
  DataInput in(bytes);
  TypeSerializer<T>::deserialize(v, in);
  if (!in.at_end()) in.fail("trailing bytes after a value read from RocksDB");
}

/// Hints the kernel to reclaim the whole pages of `bytes`, restored entries just written into RocksDB. A restore
/// reads a large state file's sections from its mapping once: without the hint their clean pages stay resident and
/// a restore of state larger than memory shows as RSS the size of the file (reclaimable, but counted). Only
/// sections of at least 1 MiB. MADV_PAGEOUT is a hint that never changes contents, so it is safe on any memory:
/// an S3 state file of up to 64 MiB or a test's copy is anonymous memory, which stays (or, with swap, is written
/// out once). Failures (an older kernel; Linux 6.1+ ignores it for files this process may not write) are ignored.
inline void reclaim_restored_pages(std::string_view bytes) {
  constexpr size_t kMinBytes = 1 << 20;
  if (bytes.size() < kMinBytes) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t begin = (start + page - 1) & ~(page - 1);
  const uintptr_t end = (start + bytes.size()) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
}

inline std::string_view bytes_between(const uint8_t* a, const uint8_t* b) {
  return {reinterpret_cast<const char*>(a), static_cast<size_t>(b - a)};
}

/// Reads the key of a canonical entry and checks that it belongs to key group `kg`.
template <class K>
void read_entry_key(DataInput& in, K& scratch, KeyGroup kg, int max_parallelism, std::string_view state_name) {
  const uint8_t* start = in.current();
  TypeSerializer<K>::deserialize(scratch, in);
  KeyGroup found = key_group_for_hash(key_hash({start, static_cast<size_t>(in.current() - start)}), max_parallelism);
  if (found != kg) {
    throw_entry_in_wrong_key_group("an entry of state '" + std::string(state_name) + "'", found, kg, max_parallelism);
  }
}

/// Converts one state's RocksDB layout to and from the canonical entries of docs/state-format.md.
/// Immutable and stateless: a capture shares it with the live state and uses it on the writer thread.
class RocksStateCodec {
 public:
  virtual ~RocksStateCodec() = default;
  /// Appends the canonical entries of key group `kg` as `snapshot` (or the live database) sees them and
  /// returns their count. Any thread with a snapshot.
  virtual uint64_t write_group(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf,
                               const RocksDBInstance::Snapshot* snapshot, KeyGroup kg, DataOutput& out) const = 0;
  /// Writes `count` canonical entries of key group `kg` read from `in` into the database; an entry replaces
  /// the one with the same key and namespace. Throws kState (wrong key group) or kSerialization.
  virtual void read_group(RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg, int max_parallelism,
                          uint64_t count, DataInput& in, std::string_view state_name) const = 0;
};

/// Value, reducing and aggregating state: one RocksDB entry per key and namespace; its value bytes are
/// the canonical value bytes (no TTL).
template <class K, class N, class V>
class RocksValueCodec final : public RocksStateCodec {
 public:
  /// `ttl`: values end with their i64 last-access timestamp (the canonical TTL layout).
  explicit RocksValueCodec(bool ttl) : ttl_(ttl) {}
  uint64_t write_group(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf,
                       const RocksDBInstance::Snapshot* snapshot, KeyGroup kg, DataOutput& out) const override {
    uint64_t n = 0;
    db.scan(cf, key_group_prefix(kg.value), snapshot, [&](std::string_view k, std::string_view v) {
      out.write_bytes(k.data() + 2, k.size() - 2);
      out.write_bytes(v.data(), v.size());
      ++n;
      return true;
    });
    return n;
  }
  void read_group(RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg, int max_parallelism,
                  uint64_t count, DataInput& in, std::string_view state_name) const override {
    K key{};
    N ns{};
    V value{};
    std::string db_key;
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* start = in.current();
      read_entry_key(in, key, kg, max_parallelism, state_name);
      TypeSerializer<N>::deserialize(ns, in);
      const uint8_t* key_end = in.current();
      TypeSerializer<V>::deserialize(value, in);
      if (ttl_) in.read_fixed<int64_t>();
      db_key.clear();
      append_key_group_prefix(db_key, kg.value);
      db_key.append(bytes_between(start, key_end));
      db.put(cf, db_key, bytes_between(key_end, in.current()));
    }
  }

 private:
  bool ttl_;
};

/// List state: one RocksDB entry per key and namespace whose value is the elements back to back; the
/// canonical entry adds the element count.
template <class K, class N, class T>
class RocksListCodec final : public RocksStateCodec {
 public:
  /// `ttl`: every element is followed by its i64 timestamp.
  explicit RocksListCodec(bool ttl) : ttl_(ttl) {}
  uint64_t write_group(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf,
                       const RocksDBInstance::Snapshot* snapshot, KeyGroup kg, DataOutput& out) const override {
    uint64_t n = 0;
    T element{};
    db.scan(cf, key_group_prefix(kg.value), snapshot, [&](std::string_view k, std::string_view v) {
      uint64_t elements = 0;
      DataInput vin(v);
      while (!vin.at_end()) {
        TypeSerializer<T>::deserialize(element, vin);
        if (ttl_) vin.read_fixed<int64_t>();
        ++elements;
      }
      if (elements == 0) return true;  // never stored, but an empty list is no entry
      out.write_bytes(k.data() + 2, k.size() - 2);
      out.write_varint(elements);
      out.write_bytes(v.data(), v.size());
      ++n;
      return true;
    });
    return n;
  }
  void read_group(RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg, int max_parallelism,
                  uint64_t count, DataInput& in, std::string_view state_name) const override {
    K key{};
    N ns{};
    T element{};
    std::string db_key;
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* start = in.current();
      read_entry_key(in, key, kg, max_parallelism, state_name);
      TypeSerializer<N>::deserialize(ns, in);
      const uint8_t* key_end = in.current();
      uint64_t elements = in.read_varint();
      if (elements == 0) in.fail("a list entry of state '" + std::string(state_name) + "' without elements");
      const uint8_t* elements_start = in.current();
      for (uint64_t e = 0; e < elements; ++e) {
        TypeSerializer<T>::deserialize(element, in);
        if (ttl_) in.read_fixed<int64_t>();
      }
      db_key.clear();
      append_key_group_prefix(db_key, kg.value);
      db_key.append(bytes_between(start, key_end));
      db.put(cf, db_key, bytes_between(elements_start, in.current()));
    }
  }

 private:
  bool ttl_;
};

/// Map state: one RocksDB entry per key, namespace and user key; the canonical entry groups the user
/// entries of one key and namespace under a count.
template <class K, class N, class UK, class UV>
class RocksMapCodec final : public RocksStateCodec {
 public:
  /// `ttl`: every user value is followed by its i64 timestamp.
  explicit RocksMapCodec(bool ttl) : ttl_(ttl) {}
  uint64_t write_group(const RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf,
                       const RocksDBInstance::Snapshot* snapshot, KeyGroup kg, DataOutput& out) const override {
    uint64_t n = 0;
    K key{};
    N ns{};
    std::string current;  // key and namespace bytes of the entry being gathered
    DataOutput user_entries;
    uint64_t user_count = 0;
    auto flush = [&] {
      if (user_count == 0) return;
      out.write_bytes(current.data(), current.size());
      out.write_varint(user_count);
      out.write_bytes(user_entries.data(), user_entries.size());
      user_entries.clear();
      user_count = 0;
      ++n;
    };
    db.scan(cf, key_group_prefix(kg.value), snapshot, [&](std::string_view k, std::string_view v) {
      std::string_view rest = k.substr(2);
      DataInput kin(rest);
      TypeSerializer<K>::deserialize(key, kin);
      TypeSerializer<N>::deserialize(ns, kin);
      std::string_view prefix = rest.substr(0, kin.position());
      if (user_count == 0 || prefix != current) {
        flush();
        current.assign(prefix);
      }
      std::string_view user_key = rest.substr(kin.position());
      user_entries.write_bytes(user_key.data(), user_key.size());
      user_entries.write_bytes(v.data(), v.size());
      ++user_count;
      return true;
    });
    flush();
    return n;
  }
  void read_group(RocksDBInstance& db, RocksDBInstance::ColumnFamily* cf, KeyGroup kg, int max_parallelism,
                  uint64_t count, DataInput& in, std::string_view state_name) const override {
    K key{};
    N ns{};
    UK user_key{};
    UV user_value{};
    std::string db_key;
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* start = in.current();
      read_entry_key(in, key, kg, max_parallelism, state_name);
      TypeSerializer<N>::deserialize(ns, in);
      const uint8_t* key_end = in.current();
      uint64_t entries = in.read_varint();
      if (entries == 0) in.fail("a map entry of state '" + std::string(state_name) + "' without user entries");
      for (uint64_t e = 0; e < entries; ++e) {
        const uint8_t* uk_start = in.current();
        TypeSerializer<UK>::deserialize(user_key, in);
        const uint8_t* uk_end = in.current();
        TypeSerializer<UV>::deserialize(user_value, in);
        if (ttl_) in.read_fixed<int64_t>();
        db_key.clear();
        append_key_group_prefix(db_key, kg.value);
        db_key.append(bytes_between(start, key_end));
        db_key.append(bytes_between(uk_start, uk_end));
        db.put(cf, db_key, bytes_between(uk_end, in.current()));
      }
    }
  }

 private:
  bool ttl_;
};

/// The backend's current key: its key-group prefixed bytes are the start of every RocksDB key.
template <class K>
struct RocksKeyContext {
  K key{};
  std::string key_bytes;  ///< 2-byte key group + TypeSerializer<K> bytes
  KeyGroup key_group{};
  int32_t group = -1;  ///< key group - range start; -1 while no key is set
  uint64_t epoch = 1;  ///< changes whenever the key does
};

/// The i64 timestamp at the end of a TTL value (value, reducing, aggregating and map state).
inline TimestampMs trailing_timestamp(std::string_view value) {
  int64_t ts = 0;
  if (value.size() >= sizeof(ts)) std::memcpy(&ts, value.data() + value.size() - sizeof(ts), sizeof(ts));
  return ts;
}

/// The compaction filter of a state whose values end with their timestamp: drops expired values.
inline RocksDBInstance::ValueFilter trailing_timestamp_filter(int64_t ttl_ms, const Clock& clock) {
  return [ttl_ms, &clock](std::string_view value, std::string&) {
    return ttl_expired(trailing_timestamp(value), ttl_ms, clock.now_ms()) ? RocksDBInstance::FilterDecision::kRemove
                                                                          : RocksDBInstance::FilterDecision::kKeep;
  };
}

/// The compaction filter of a list state with TTL: drops expired elements, and the list when none is left.
template <class T>
RocksDBInstance::ValueFilter list_element_filter(int64_t ttl_ms, const Clock& clock) {
  return [ttl_ms, &clock](std::string_view value, std::string& new_value) {
    const TimestampMs now = clock.now_ms();
    DataInput in(value);
    T element{};
    bool any_expired = false;
    new_value.clear();
    while (!in.at_end()) {
      const uint8_t* start = in.current();
      TypeSerializer<T>::deserialize(element, in);
      TimestampMs ts = in.read_fixed<int64_t>();
      if (ttl_expired(ts, ttl_ms, now)) {
        any_expired = true;
      } else {
        new_value.append(bytes_between(start, in.current()));
      }
    }
    if (!any_expired) return RocksDBInstance::FilterDecision::kKeep;
    return new_value.empty() ? RocksDBInstance::FilterDecision::kRemove : RocksDBInstance::FilterDecision::kChange;
  };
}

/// What every RocksDB state has, independent of its namespace and value types.
template <class K>
class RocksStateBase {
 public:
  /// `filter`: the compaction filter of the state's column family (TTL), or null.
  RocksStateBase(std::string name, StateKind kind, const StateTtlConfig& ttl, RocksDBInstance& db,
                 const RocksKeyContext<K>& ctx, const Clock& clock, std::shared_ptr<const RocksStateCodec> codec,
                 RocksDBInstance::ValueFilter filter)
      : name_(std::move(name)),
        kind_(kind),
        ttl_(ttl),
        db_(db),
        cf_(db.column_family(name_, std::move(filter))),
        ctx_(ctx),
        clock_(clock),
        codec_(std::move(codec)) {}
  virtual ~RocksStateBase() = default;
  const std::string& name() const noexcept { return name_; }
  StateKind kind() const noexcept { return kind_; }
  /// The canonical format flags: bit 0 when entries carry TTL timestamps.
  uint8_t format_flags() const noexcept { return ttl_.enabled() ? 1 : 0; }
  RocksDBInstance::ColumnFamily* column_family() const noexcept { return cf_; }
  const std::shared_ptr<const RocksStateCodec>& codec() const noexcept { return codec_; }

 protected:
  std::string name_;
  StateKind kind_;
  StateTtlConfig ttl_;
  RocksDBInstance& db_;
  RocksDBInstance::ColumnFamily* cf_;
  const RocksKeyContext<K>& ctx_;
  const Clock& clock_;
  std::shared_ptr<const RocksStateCodec> codec_;
};

/// A state with a namespace of type N: builds the RocksDB key of the current key and namespace once per
/// change of either, and implements TTL reads (never-return-expired; refresh on read when configured).
template <class K, class N>
class RocksKvState : public RocksStateBase<K> {
 public:
  using Namespace = N;
  RocksKvState(std::string name, StateKind kind, const StateTtlConfig& ttl, RocksDBInstance& db,
               const RocksKeyContext<K>& ctx, const Clock& clock, std::shared_ptr<const RocksStateCodec> codec,
               RocksDBInstance::ValueFilter filter)
      : RocksStateBase<K>(std::move(name), kind, ttl, db, ctx, clock, std::move(codec), std::move(filter)) {
    TypeSerializer<N>::serialize(ns_, ns_bytes_);
  }
  /// Sets the namespace the next accesses read and write (Flink's InternalKvState::setCurrentNamespace).
  void set_current_namespace(const N& ns) {
    if (ns == ns_) return;
    ns_ = ns;
    ns_bytes_.clear();
    TypeSerializer<N>::serialize(ns_, ns_bytes_);
    key_epoch_ = 0;
  }
  const N& current_namespace() const noexcept { return ns_; }

 protected:
  /// The RocksDB key of the current key and namespace; throws kState when no key is set.
  const std::string& current_db_key() {
    if (this->ctx_.group < 0) [[unlikely]]
      throw_no_current_key(this->name_);
    if (key_epoch_ != this->ctx_.epoch) {
      db_key_ = this->ctx_.key_bytes;
      db_key_.append(ns_bytes_.view());
      key_epoch_ = this->ctx_.epoch;
    }
    return db_key_;
  }
  /// The RocksDB key of the current key in namespace `ns`.
  std::string db_key_in(const N& ns) {
    if (this->ctx_.group < 0) [[unlikely]]
      throw_no_current_key(this->name_);
    std::string k = this->ctx_.key_bytes;
    scratch_.clear();
    TypeSerializer<N>::serialize(ns, scratch_);
    k.append(scratch_.view());
    return k;
  }

  bool ttl_on() const noexcept { return this->ttl_.enabled(); }
  TimestampMs now() const { return this->clock_.now_ms(); }
  bool expired(TimestampMs ts, TimestampMs at) const noexcept { return ttl_expired(ts, this->ttl_.ttl_ms, at); }
  bool refresh_on_read() const noexcept {
    return this->ttl_.update_type == StateTtlConfig::UpdateType::kOnReadAndWrite;
  }

  /// Encodes `v` followed, with TTL, by the current time.
  template <class V>
  std::string_view encode_value(const V& v) {
    out_.clear();
    TypeSerializer<V>::serialize(v, out_);
    if (ttl_on()) out_.write_fixed<int64_t>(now());
    return out_.view();
  }

  /// Reads the value at `key` into `v`: false when absent or expired (an expired value is deleted:
  /// never-return-expired); with OnReadAndWrite the read refreshes the timestamp.
  template <class V>
  bool read_live(const std::string& key, V& v) {
    if (!this->db_.get(this->cf_, key, value_buf_)) return false;
    std::string_view bytes = value_buf_;
    if (ttl_on()) {
      const TimestampMs t = now();
      if (bytes.size() < sizeof(int64_t) || expired(trailing_timestamp(bytes), t)) {
        this->db_.remove(this->cf_, key);
        return false;
      }
      bytes.remove_suffix(sizeof(int64_t));
      decode_from(bytes, v);
      if (refresh_on_read()) {
        std::memcpy(value_buf_.data() + value_buf_.size() - sizeof(t), &t, sizeof(t));
        this->db_.put(this->cf_, key, value_buf_);
      }
      return true;
    }
    decode_from(bytes, v);
    return true;
  }

  /// True when a live (unexpired) value is stored at `key`; deletes an expired one; never refreshes.
  bool has_live(const std::string& key) {
    if (!this->db_.get(this->cf_, key, value_buf_)) return false;
    if (ttl_on() && expired(trailing_timestamp(value_buf_), now())) {
      this->db_.remove(this->cf_, key);
      return false;
    }
    return true;
  }

  std::string value_buf_;  // the last value read
  DataOutput out_;         // serialization scratch

 private:
  N ns_{};
  DataOutput ns_bytes_;
  DataOutput scratch_;
  std::string db_key_;
  uint64_t key_epoch_ = 0;  // ctx_.epoch when db_key_ was built; 0: stale
};

}  // namespace detail

/// ValueState in RocksDB: value() reads and decodes, update() encodes and writes.
template <class K, class N, class T>
class RocksDBValueState final : public detail::RocksKvState<K, N>, public ValueState<T> {
 public:
  RocksDBValueState(const ValueStateDescriptor<T>& d, RocksDBInstance& db, const detail::RocksKeyContext<K>& ctx,
                    const Clock& clock)
      : detail::RocksKvState<K, N>(d.name, StateKind::kValue, d.ttl, db, ctx, clock,
                                   std::make_shared<detail::RocksValueCodec<K, N, T>>(d.ttl.enabled()),
                                   d.ttl.enabled() ? detail::trailing_timestamp_filter(d.ttl.ttl_ms, clock) : nullptr),
        default_(d.default_value) {}
  const T& value() override { return this->read_live(this->current_db_key(), value_) ? value_ : default_; }
  bool has_value() override { return this->has_live(this->current_db_key()); }
  void update(const T& value) override {
    const std::string& k = this->current_db_key();
    this->db_.put(this->cf_, k, this->encode_value(value));
  }
  void update(T&& value) override { update(std::as_const(value)); }
  void clear() override { this->db_.remove(this->cf_, this->current_db_key()); }

 private:
  T default_;
  T value_{};
};

/// ListState in RocksDB: add() appends the encoded element with a merge (no read); get() decodes them all.
/// With TTL every element carries its timestamp and expires on its own, as in Flink.
template <class K, class N, class T>
class RocksDBListState final : public detail::RocksKvState<K, N>, public ListState<T> {
 public:
  RocksDBListState(const ListStateDescriptor<T>& d, RocksDBInstance& db, const detail::RocksKeyContext<K>& ctx,
                   const Clock& clock)
      : detail::RocksKvState<K, N>(d.name, StateKind::kList, d.ttl, db, ctx, clock,
                                   std::make_shared<detail::RocksListCodec<K, N, T>>(d.ttl.enabled()),
                                   d.ttl.enabled() ? detail::list_element_filter<T>(d.ttl.ttl_ms, clock) : nullptr) {}
  const std::vector<T>& get() override {
    list_.clear();
    const std::string& k = this->current_db_key();
    if (!this->db_.get(this->cf_, k, this->value_buf_)) return list_;
    if (!this->ttl_on()) {
      DataInput in(this->value_buf_);
      while (!in.at_end()) {
        list_.emplace_back();
        TypeSerializer<T>::deserialize(list_.back(), in);
      }
      return list_;
    }
    // Drop expired elements (and write the rest back); with OnReadAndWrite the rest gets the read's time.
    const TimestampMs now = this->now();
    const bool refresh = this->refresh_on_read();
    std::string kept;
    bool changed = false;
    DataInput in(this->value_buf_);
    while (!in.at_end()) {
      const uint8_t* start = in.current();
      T element{};
      TypeSerializer<T>::deserialize(element, in);
      const uint8_t* element_end = in.current();
      TimestampMs ts = in.read_fixed<int64_t>();
      if (this->expired(ts, now)) {
        changed = true;
        continue;
      }
      kept.append(detail::bytes_between(start, refresh ? element_end : in.current()));
      if (refresh) {
        kept.append(reinterpret_cast<const char*>(&now), sizeof(now));
        changed = true;
      }
      list_.push_back(std::move(element));
    }
    if (changed) {
      if (kept.empty()) {
        this->db_.remove(this->cf_, k);
      } else {
        this->db_.put(this->cf_, k, kept);
      }
    }
    return list_;
  }
  void add(const T& value) override {
    const std::string& k = this->current_db_key();
    this->db_.merge(this->cf_, k, this->encode_value(value));
  }
  void add(T&& value) override { add(std::as_const(value)); }
  void add_all(const std::vector<T>& values) override {
    if (values.empty()) return;
    const std::string& k = this->current_db_key();
    this->db_.merge(this->cf_, k, encode_all(values));
  }
  void update(std::vector<T> values) override {
    const std::string& k = this->current_db_key();
    if (values.empty()) {
      this->db_.remove(this->cf_, k);
      return;
    }
    this->db_.put(this->cf_, k, encode_all(values));
  }
  void clear() override { this->db_.remove(this->cf_, this->current_db_key()); }

  /// Appends the lists of namespaces `sources` to `target` for the current key and removes the sources
  /// (merging windows). Elements keep their timestamps.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    std::string merged;
    for (const N& ns : sources) {
      std::string k = this->db_key_in(ns);
      if (this->db_.get(this->cf_, k, this->value_buf_)) {
        merged.append(this->value_buf_);
        this->db_.remove(this->cf_, k);
      }
    }
    if (!merged.empty()) this->db_.merge(this->cf_, this->db_key_in(target), merged);
  }

 private:
  std::string_view encode_all(const std::vector<T>& values) {
    this->out_.clear();
    const TimestampMs now = this->ttl_on() ? this->now() : 0;
    for (const T& v : values) {
      TypeSerializer<T>::serialize(v, this->out_);
      if (this->ttl_on()) this->out_.template write_fixed<int64_t>(now);
    }
    return this->out_.view();
  }
  std::vector<T> list_;
};

/// MapState in RocksDB: one RocksDB entry per user key; iteration scans the key and namespace's prefix.
/// With TTL every user entry carries its timestamp and expires on its own, as in Flink.
template <class K, class N, class UK, class UV>
class RocksDBMapState final : public detail::RocksKvState<K, N>, public MapState<UK, UV> {
 public:
  RocksDBMapState(const MapStateDescriptor<UK, UV>& d, RocksDBInstance& db, const detail::RocksKeyContext<K>& ctx,
                  const Clock& clock)
      : detail::RocksKvState<K, N>(d.name, StateKind::kMap, d.ttl, db, ctx, clock,
                                   std::make_shared<detail::RocksMapCodec<K, N, UK, UV>>(d.ttl.enabled()),
                                   d.ttl.enabled() ? detail::trailing_timestamp_filter(d.ttl.ttl_ms, clock) : nullptr) {
  }
  std::optional<UV> get(const UK& key) override {
    const UV* v = find(key);
    return v == nullptr ? std::nullopt : std::optional<UV>(*v);
  }
  const UV* find(const UK& key) override { return this->read_live(user_db_key(key), value_) ? &value_ : nullptr; }
  bool contains(const UK& key) override { return find(key) != nullptr; }
  void put(const UK& key, UV value) override {
    const std::string& k = user_db_key(key);
    this->db_.put(this->cf_, k, this->encode_value(value));
  }
  void put_all(const std::vector<std::pair<UK, UV>>& entries) override {
    for (const auto& [k, v] : entries)
      put(k, v);
  }
  void remove(const UK& key) override { this->db_.remove(this->cf_, user_db_key(key)); }
  bool is_empty() override {
    bool empty = true;
    visit([&empty](UK&&, UV&&) { empty = false; }, /*decode=*/false);
    return empty;
  }
  std::vector<std::pair<UK, UV>> entries() override {
    std::vector<std::pair<UK, UV>> out;
    visit([&out](UK&& k, UV&& v) { out.emplace_back(std::move(k), std::move(v)); });
    return out;
  }
  std::vector<UK> keys() override {
    std::vector<UK> out;
    visit([&out](UK&& k, UV&&) { out.push_back(std::move(k)); });
    return out;
  }
  std::vector<UV> values() override {
    std::vector<UV> out;
    visit([&out](UK&&, UV&& v) { out.push_back(std::move(v)); });
    return out;
  }
  void for_each(const std::function<void(const UK&, const UV&)>& fn) override {
    // Entries are collected first: fn may read other states of the backend.
    for (auto& [k, v] : entries())
      fn(k, v);
  }
  void clear() override { this->db_.remove_prefix(this->cf_, this->current_db_key()); }

 private:
  const std::string& user_db_key(const UK& key) {
    user_key_ = this->current_db_key();
    user_key_.append(detail::encode_into(this->out_, key));
    return user_key_;
  }
  // Calls fn(user key, user value) for every live entry of the current key and namespace; with TTL,
  // expired entries are deleted and, with OnReadAndWrite, the visited ones refreshed.
  template <class Fn>
  void visit(Fn&& fn, bool decode = true) {
    const std::string& prefix = this->current_db_key();
    const bool ttl = this->ttl_on();
    const TimestampMs now = ttl ? this->now() : 0;
    std::vector<std::string> expired_keys;
    std::vector<std::pair<std::string, std::string>> refreshed;
    this->db_.scan(this->cf_, prefix, nullptr, [&](std::string_view k, std::string_view v) {
      if (ttl) {
        if (this->expired(detail::trailing_timestamp(v), now)) {
          expired_keys.emplace_back(k);
          return true;
        }
        if (this->refresh_on_read()) {
          std::string fresh(v);
          std::memcpy(fresh.data() + fresh.size() - sizeof(now), &now, sizeof(now));
          refreshed.emplace_back(std::string(k), std::move(fresh));
        }
        v.remove_suffix(sizeof(int64_t));
      }
      UK uk{};
      UV uv{};
      if (decode) {
        detail::decode_from(k.substr(prefix.size()), uk);
        detail::decode_from(v, uv);
      }
      fn(std::move(uk), std::move(uv));
      return true;
    });
    for (const auto& k : expired_keys)
      this->db_.remove(this->cf_, k);
    for (const auto& [k, v] : refreshed)
      this->db_.put(this->cf_, k, v);
  }
  std::string user_key_;
  UV value_{};
};

/// ReducingState in RocksDB: add() reads, reduces and writes the reduced value.
template <class K, class N, class T>
class RocksDBReducingState final : public detail::RocksKvState<K, N>, public ReducingState<T> {
 public:
  RocksDBReducingState(const ReducingStateDescriptor<T>& d, RocksDBInstance& db, const detail::RocksKeyContext<K>& ctx,
                       const Clock& clock)
      : detail::RocksKvState<K, N>(d.name, StateKind::kReducing, d.ttl, db, ctx, clock,
                                   std::make_shared<detail::RocksValueCodec<K, N, T>>(d.ttl.enabled()),
                                   d.ttl.enabled() ? detail::trailing_timestamp_filter(d.ttl.ttl_ms, clock) : nullptr),
        reduce_(d.reduce) {}
  std::optional<T> get() override {
    T v{};
    if (!this->read_live(this->current_db_key(), v)) return std::nullopt;
    return v;
  }
  void add(const T& value) override {
    const std::string& k = this->current_db_key();
    T acc{};
    if (!this->read_live(k, acc)) {
      this->db_.put(this->cf_, k, this->encode_value(value));
      return;
    }
    this->db_.put(this->cf_, k, this->encode_value(reduce_(acc, value)));
  }
  void clear() override { this->db_.remove(this->cf_, this->current_db_key()); }

  /// Reduces the values of namespaces `sources` into `target` for the current key and removes the sources.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    std::optional<T> acc;
    auto take = [&](const std::string& k) {
      T v{};
      if (!this->read_live(k, v)) return;
      acc = acc ? reduce_(*acc, v) : std::move(v);
    };
    std::string target_key = this->db_key_in(target);
    take(target_key);
    for (const N& ns : sources) {
      std::string k = this->db_key_in(ns);
      if (k == target_key) continue;
      take(k);
      this->db_.remove(this->cf_, k);
    }
    if (acc) this->db_.put(this->cf_, target_key, this->encode_value(*acc));
  }

 private:
  std::function<T(const T&, const T&)> reduce_;
};

/// AggregatingState in RocksDB: the accumulator is stored; add() reads, adds and writes it.
template <class K, class N, class In, class Acc, class Out>
class RocksDBAggregatingState final : public detail::RocksKvState<K, N>, public AggregatingState<In, Out> {
 public:
  RocksDBAggregatingState(const AggregatingStateDescriptor<In, Acc, Out>& d, RocksDBInstance& db,
                          const detail::RocksKeyContext<K>& ctx, const Clock& clock)
      : detail::RocksKvState<K, N>(d.name, StateKind::kAggregating, d.ttl, db, ctx, clock,
                                   std::make_shared<detail::RocksValueCodec<K, N, Acc>>(d.ttl.enabled()),
                                   d.ttl.enabled() ? detail::trailing_timestamp_filter(d.ttl.ttl_ms, clock) : nullptr),
        aggregate_(d.aggregate) {}
  std::optional<Out> get() override {
    Acc acc{};
    if (!this->read_live(this->current_db_key(), acc)) return std::nullopt;
    return aggregate_->get_result(acc);
  }
  void add(const In& value) override {
    const std::string& k = this->current_db_key();
    Acc acc{};
    if (!this->read_live(k, acc)) acc = aggregate_->create_accumulator();
    aggregate_->add(value, acc);
    this->db_.put(this->cf_, k, this->encode_value(acc));
  }
  void clear() override { this->db_.remove(this->cf_, this->current_db_key()); }

  /// Merges the accumulators of namespaces `sources` into `target` for the current key; removes the sources.
  void merge_namespaces(const N& target, std::span<const N> sources) {
    std::optional<Acc> acc;
    auto take = [&](const std::string& k) {
      Acc v{};
      if (!this->read_live(k, v)) return;
      acc = acc ? aggregate_->merge(std::move(*acc), v) : std::move(v);
    };
    std::string target_key = this->db_key_in(target);
    take(target_key);
    for (const N& ns : sources) {
      std::string k = this->db_key_in(ns);
      if (k == target_key) continue;
      take(k);
      this->db_.remove(this->cf_, k);
    }
    if (acc) this->db_.put(this->cf_, target_key, this->encode_value(*acc));
  }

 private:
  std::shared_ptr<AggregateFunction<In, Acc, Out>> aggregate_;
};

/// The capture of a RocksDBKeyedStateBackend (RocksDBKeyedStateBackend::capture()): a RocksDB snapshot,
/// the registered states' column families and codecs, and the restored-but-unregistered states' bytes.
/// Holds the database open, so it may outlive the backend.
///
/// Thread-safety: immutable; write_key_group() may run on any thread, also while the task writes.
class RocksDBKeyedStateSnapshot final : public KeyedStateSnapshot {
 public:
  struct CapturedState {
    std::string name;
    StateKind kind;
    uint8_t flags;
    RocksDBInstance::ColumnFamily* cf;
    std::shared_ptr<const detail::RocksStateCodec> codec;
  };
  using CapturedPending = std::vector<std::pair<std::string, detail::PendingHandle>>;

  /// `native` (nullable): the RocksDB checkpoint of an incremental capture; `native_unregistered`: states of a
  /// database restored from an incremental checkpoint that are not registered (no codec: not canonical).
  RocksDBKeyedStateSnapshot(KeyGroupRange range, int max_parallelism, std::shared_ptr<RocksDBInstance> db,
                            std::vector<CapturedState> states, CapturedPending pending,
                            std::shared_ptr<const RocksDBNativeSnapshot> native = nullptr,
                            std::vector<std::string> native_unregistered = {})
      : range_(range),
        max_parallelism_(max_parallelism),
        db_(std::move(db)),
        snapshot_(db_->snapshot()),
        states_(std::move(states)),
        pending_(std::move(pending)),
        native_(std::move(native)),
        native_unregistered_(std::move(native_unregistered)) {}

  KeyGroupRange key_group_range() const override { return range_; }
  int max_parallelism() const override { return max_parallelism_; }

  /// Appends the canonical key-group blob of `kg` (docs/state-format.md) as of capture time: the same
  /// bytes a HeapKeyedStateBackend with equal contents writes, up to entry order. Throws kState when `kg`
  /// is outside the range, or when a state restored from an incremental checkpoint is not registered (its
  /// canonical form needs its types).
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    if (!native_unregistered_.empty()) {
      std::string names;
      for (const auto& n : native_unregistered_)
        names += (names.empty() ? "'" : ", '") + n + "'";
      detail::throw_state_error(
          "state(s) " + names +
          " were restored from an incremental checkpoint and are not registered by the operator: a savepoint or a "
          "full checkpoint needs their types to write them canonically; register them (get_state) before the "
          "snapshot, or keep taking incremental checkpoints");
    }
    write_blob(kg, out, /*registered=*/true);
  }

  const NativeKeyedStateSnapshot* native() const override { return native_.get(); }
  /// The blob of `kg` with only the restored states that are not registered yet (the others are in the
  /// native files).
  void write_key_group_beside_native(KeyGroup kg, DataOutput& out) const override {
    write_blob(kg, out, /*registered=*/false);
  }

 private:
  void write_blob(KeyGroup kg, DataOutput& out, bool registered) const {
    if (!range_.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside the captured range " +
                                range_.to_string() + " (max parallelism " + std::to_string(max_parallelism_) + ")");
    }
    const int32_t g = kg.value - range_.start();
    std::vector<std::pair<uint64_t, DataOutput>> entries(states_.size());
    uint64_t sections = 0;
    for (size_t i = 0; i < states_.size() && registered; ++i) {
      entries[i].first = states_[i].codec->write_group(*db_, states_[i].cf, snapshot_.get(), kg, entries[i].second);
      sections += entries[i].first > 0 ? 1 : 0;
    }
    for (const auto& [name, p] : pending_)
      sections += p->groups[g].count > 0 ? 1 : 0;
    out.write_varint(detail::kStateFormatVersion);
    out.write_varint(static_cast<uint64_t>(kg.value));
    out.write_varint(sections);
    for (size_t i = 0; i < states_.size(); ++i) {
      if (entries[i].first == 0) continue;
      size_t length_at =
          detail::begin_state_section(out, states_[i].name, states_[i].kind, states_[i].flags, entries[i].first);
      out.write_bytes(entries[i].second.data(), entries[i].second.size());
      detail::end_length_prefixed(out, length_at);
    }
    for (const auto& [name, p] : pending_) {
      const auto& pg = p->groups[g];
      if (pg.count == 0) continue;
      size_t length_at = detail::begin_state_section(out, name, p->kind, p->flags, pg.count);
      const std::string_view bytes = pg.bytes();
      out.write_bytes(bytes.data(), bytes.size());
      detail::end_length_prefixed(out, length_at);
    }
  }

  KeyGroupRange range_;
  int max_parallelism_;
  std::shared_ptr<RocksDBInstance> db_;
  std::shared_ptr<const RocksDBInstance::Snapshot> snapshot_;
  std::vector<CapturedState> states_;  // in name order
  CapturedPending pending_;            // in name order
  std::shared_ptr<const RocksDBNativeSnapshot> native_;
  std::vector<std::string> native_unregistered_;
};

/// The RocksDB keyed state backend for key type K (requires TypeSerializer<K> and operator==). Its API
/// mirrors HeapKeyedStateBackend's: current key, get_state / get_partitioned_state, key-group snapshot and
/// restore; the state objects are the RocksDB* classes above.
template <class K>
class RocksDBKeyedStateBackend {
 public:
  /// A backend for the key groups `range` of `max_parallelism`, with its database in `working_dir` (created;
  /// anything there before is removed, and the directory is removed with the backend). `clock` must
  /// outlive the backend. Throws SluiceException: kConfiguration for a bad range, kState when the database
  /// cannot be created.
  /// `memory` bounds the database's block cache and memtables (RocksDBMemoryOptions).
  RocksDBKeyedStateBackend(KeyGroupRange range, int max_parallelism, const Clock& clock,
                           const std::filesystem::path& working_dir, const RocksDBMemoryOptions& memory = {})
      : range_(range), max_parallelism_(max_parallelism), clock_(clock), memory_(memory) {
    detail::check_backend_range(range, max_parallelism);
    db_ = RocksDBInstance::open(working_dir, memory);
  }
  RocksDBKeyedStateBackend(const RocksDBKeyedStateBackend&) = delete;
  RocksDBKeyedStateBackend& operator=(const RocksDBKeyedStateBackend&) = delete;
  ~RocksDBKeyedStateBackend() {
    states_.clear();  // the states refer to the database; a capture may keep it open longer
  }

  const KeyGroupRange& key_group_range() const noexcept { return range_; }
  int max_parallelism() const noexcept { return max_parallelism_; }
  const Clock& clock() const noexcept { return clock_; }
  /// The database's working directory.
  const std::filesystem::path& directory() const noexcept { return db_->directory(); }
  RocksDBInstance& instance() noexcept { return *db_; }

  /// Makes `key` current; throws kState when the key belongs to another subtask's key groups.
  void set_current_key(const K& key) {
    if (ctx_.group >= 0 && ctx_.key == key) return;
    key_buf_.clear();
    TypeSerializer<K>::serialize(key, key_buf_);
    KeyGroup kg = key_group_for_hash(key_hash(key_buf_.bytes()), max_parallelism_);
    if (!range_.contains(kg)) [[unlikely]]
      detail::throw_key_outside_range(kg, range_, max_parallelism_);
    ctx_.key = key;
    ctx_.key_bytes.clear();
    detail::append_key_group_prefix(ctx_.key_bytes, kg.value);
    ctx_.key_bytes.append(key_buf_.view());
    ctx_.key_group = kg;
    ctx_.group = kg.value - range_.start();
    ++ctx_.epoch;
  }
  bool has_current_key() const noexcept { return ctx_.group >= 0; }
  const K& current_key() const noexcept { return ctx_.key; }
  KeyGroup current_key_group() const noexcept { return ctx_.key_group; }
  KeyGroup key_group_of(const K& key) {
    key_buf_.clear();
    TypeSerializer<K>::serialize(key, key_buf_);
    return key_group_for_hash(key_hash(key_buf_.bytes()), max_parallelism_);
  }

  // States: as HeapKeyedStateBackend (same name -> same object; another kind or type -> kState). A
  // descriptor with TTL visibility ReturnExpiredIfNotCleanedUp throws kConfiguration (not supported yet).

  template <class T>
  RocksDBValueState<K, VoidNamespace, T>& get_state(const ValueStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class T>
  RocksDBListState<K, VoidNamespace, T>& get_state(const ListStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class UK, class UV>
  RocksDBMapState<K, VoidNamespace, UK, UV>& get_state(const MapStateDescriptor<UK, UV>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class T>
  RocksDBReducingState<K, VoidNamespace, T>& get_state(const ReducingStateDescriptor<T>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }
  template <class In, class Acc, class Out>
  RocksDBAggregatingState<K, VoidNamespace, In, Acc, Out>& get_state(
      const AggregatingStateDescriptor<In, Acc, Out>& d) {
    return get_partitioned_state<VoidNamespace>(d);
  }

  template <class N, class T>
  RocksDBValueState<K, N, T>& get_partitioned_state(const ValueStateDescriptor<T>& d) {
    check(d.name, d.ttl, true);
    return register_state<RocksDBValueState<K, N, T>>(d, StateKind::kValue);
  }
  template <class N, class T>
  RocksDBListState<K, N, T>& get_partitioned_state(const ListStateDescriptor<T>& d) {
    check(d.name, d.ttl, true);
    return register_state<RocksDBListState<K, N, T>>(d, StateKind::kList);
  }
  template <class N, class UK, class UV>
  RocksDBMapState<K, N, UK, UV>& get_partitioned_state(const MapStateDescriptor<UK, UV>& d) {
    check(d.name, d.ttl, true);
    return register_state<RocksDBMapState<K, N, UK, UV>>(d, StateKind::kMap);
  }
  template <class N, class T>
  RocksDBReducingState<K, N, T>& get_partitioned_state(const ReducingStateDescriptor<T>& d) {
    check(d.name, d.ttl, static_cast<bool>(d.reduce));
    return register_state<RocksDBReducingState<K, N, T>>(d, StateKind::kReducing);
  }
  template <class N, class In, class Acc, class Out>
  RocksDBAggregatingState<K, N, In, Acc, Out>& get_partitioned_state(
      const AggregatingStateDescriptor<In, Acc, Out>& d) {
    check(d.name, d.ttl, d.aggregate != nullptr);
    return register_state<RocksDBAggregatingState<K, N, In, Acc, Out>>(d, StateKind::kAggregating);
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

  /// Entries of state `name` (one per key and namespace), counted by scanning the database; for tests.
  size_t num_entries(std::string_view name) const {
    size_t n = 0;
    if (auto it = states_.find(name); it != states_.end()) {
      DataOutput scratch;
      for (int32_t kg = range_.start(); kg <= range_.end(); ++kg) {
        scratch.clear();
        n += it->second->codec()->write_group(*db_, it->second->column_family(), nullptr, KeyGroup{kg}, scratch);
      }
    }
    if (auto it = pending_.find(name); it != pending_.end()) {
      for (const auto& g : it->second->groups)
        n += g.count;
    }
    return n;
  }

  // -------------------------------------------------------------------------------------------------------
  // Snapshot and restore (docs/state-format.md): the same key-group blobs as HeapKeyedStateBackend
  // -------------------------------------------------------------------------------------------------------

  /// Makes capture() also take a RocksDB checkpoint for incremental checkpoints (state.backend.incremental).
  void enable_incremental_checkpoints() { incremental_ = true; }
  bool incremental_checkpoints() const noexcept { return incremental_; }
  /// Local SST files this backend has uploaded into the shared area (for tests and metrics).
  size_t uploaded_files() const { return ledger_->size(); }

  /// A consistent capture of every key group as of now (a RocksDB snapshot: no data copied); its
  /// write_key_group() may run on another thread while the task goes on. With incremental checkpoints it also
  /// starts a RocksDB checkpoint (the synchronous part: the memtables switched; the flush and the hard links
  /// follow on the writer thread, RocksDBNativeSnapshot::complete()). Task thread only.
  std::unique_ptr<RocksDBKeyedStateSnapshot> capture() const {
    std::vector<RocksDBKeyedStateSnapshot::CapturedState> states;
    states.reserve(states_.size());
    for (const auto& [name, s] : states_)
      states.push_back({name, s->kind(), s->format_flags(), s->column_family(), s->codec()});
    RocksDBKeyedStateSnapshot::CapturedPending pending(pending_.begin(), pending_.end());
    std::shared_ptr<const RocksDBNativeSnapshot> native;
    if (incremental_) {
      // States restored from an incremental checkpoint and not registered yet have no canonical form, so this
      // capture could not fall back on one: it flushes on the task thread.
      native = std::make_shared<const RocksDBNativeSnapshot>(
          db_, db_->directory().string() + ".chk-" + std::to_string(++captures_), range_, ledger_,
          /*synchronous=*/!native_unregistered_.empty());
    }
    return std::make_unique<RocksDBKeyedStateSnapshot>(
        range_, max_parallelism_, db_, std::move(states), std::move(pending), std::move(native),
        std::vector<std::string>(native_unregistered_.begin(), native_unregistered_.end()));
  }

  /// Replaces the (empty) database with the one restored from `sources`, the old subtasks' databases of an
  /// incremental checkpoint (restore_native_database()); before any state is registered or restored. Task
  /// thread. Errors: kState (states registered already, RocksDB or file failures naming the file).
  [[nodiscard]] Status restore_native(const std::vector<NativeKeyedStateRestore>& sources) {
    if (!states_.empty() || !pending_.empty()) {
      return Error(ErrorCode::kState,
                   "restoring an incremental rocksdb checkpoint into a backend that already has states: restore "
                   "before registering any state");
    }
    const std::filesystem::path dir = db_->directory();
    db_.reset();  // closes the empty database and removes its directory
    auto restored = restore_native_database(dir, range_, sources, memory_);
    if (!restored.ok()) {
      db_ = RocksDBInstance::open(dir, memory_);  // an empty database again, for a consistent object
      return restored.error();
    }
    db_ = std::move(*restored);
    ledger_ = std::make_shared<RocksDBUploadLedger>();
    for (std::string& name : db_->state_names()) {
      // A state registered after the checkpoint's barrier has its (empty) column family in the checkpoint but not
      // its metadata: nothing of it to restore.
      if (db_->state_meta(name).empty() && !has_entries(name)) continue;
      native_unregistered_.insert(std::move(name));
    }
    return ok_status();
  }

  /// Appends the key-group blob of `kg` (as snapshot_key_group of the heap backend). Throws kState when
  /// `kg` is outside the range.
  void snapshot_key_group(KeyGroup kg, DataOutput& out) const { capture()->write_key_group(kg, out); }

  /// Restores one key-group blob written by either backend with the same max parallelism (any old
  /// parallelism). Errors as HeapKeyedStateBackend::restore_key_group. States not registered yet keep their
  /// bytes until they are registered: views into the memory of `owners` when given (a restore's mapped state
  /// files, whose pages the kernel may drop and read again: a canonical restore larger than memory fits),
  /// else a copy.
  [[nodiscard]] Status restore_key_group(KeyGroup kg, DataInput& in,
                                         const std::vector<std::shared_ptr<const void>>* owners = nullptr) {
    try {
      restore_group(kg, in, owners);
      return ok_status();
    } catch (const SluiceException& e) {
      try {
        db_->commit_batch();  // closes the batch; the task fails on the error below anyway
      } catch (const SluiceException&) {
      }
      return e.error().with_context("restoring keyed state of key group " + std::to_string(kg.value));
    }
  }

 private:
  // Whether the column family of state `name` holds any entry (registered or not).
  bool has_entries(std::string_view name) {
    bool any = false;
    db_->scan(db_->column_family(name), "", nullptr, [&](std::string_view, std::string_view) {
      any = true;
      return false;
    });
    return any;
  }

  void check(std::string_view name, const StateTtlConfig& ttl, bool has_function) {
    detail::check_descriptor(name, ttl, has_function);
    if (ttl.enabled() && ttl.visibility == StateTtlConfig::Visibility::kReturnExpiredIfNotCleanedUp) {
      throw SluiceException(Error(ErrorCode::kConfiguration,
                                  "state '" + std::string(name) +
                                      "': TTL visibility ReturnExpiredIfNotCleanedUp is not supported by the rocksdb "
                                      "state backend yet; use NeverReturnExpired (the default) or the hashmap "
                                      "backend"));
    }
  }

  template <class S, class D>
  S& register_state(const D& d, StateKind kind) {
    if (auto it = states_.find(d.name); it != states_.end()) {
      detail::RocksStateBase<K>& existing = *it->second;
      auto* typed = existing.kind() == kind ? dynamic_cast<S*>(&existing) : nullptr;
      if (typed == nullptr) detail::throw_state_type_mismatch(d.name, existing.kind(), kind, existing.kind() == kind);
      return *typed;
    }
    auto state = std::make_unique<S>(d, *db_, ctx_, clock_);
    S& ref = *state;
    // The kind and flags live in the database too, so a database restored from its files checks them here.
    const std::string meta = db_->state_meta(d.name);
    if (meta.size() == 2) {
      detail::check_restored_state(d.name, static_cast<StateKind>(static_cast<uint8_t>(meta[0])),
                                   static_cast<uint8_t>(meta[1]), kind, ref.format_flags())
          .value_or_throw();
    } else {
      const char bytes[2] = {static_cast<char>(kind), static_cast<char>(ref.format_flags())};
      db_->set_state_meta(d.name, std::string_view(bytes, 2));
    }
    native_unregistered_.erase(d.name);
    if (auto p = pending_.find(d.name); p != pending_.end()) {
      const detail::PendingKeyedState& pending = *p->second;
      detail::check_restored_state(d.name, pending.kind, pending.flags, kind, ref.format_flags()).value_or_throw();
      db_->begin_batch();
      try {
        for (int32_t g = 0; g < range_.size(); ++g) {
          const auto& pg = pending.groups[g];
          if (pg.count == 0) continue;
          DataInput in(pg.bytes());
          ref.codec()->read_group(*db_, ref.column_family(), KeyGroup{range_.start() + g}, max_parallelism_, pg.count,
                                  in, d.name);
          if (!in.at_end()) in.fail("trailing bytes after the entries of state '" + d.name + "'");
          if (pg.owned.empty()) detail::reclaim_restored_pages(pg.bytes());  // borrowed from a mapped file
        }
      } catch (...) {
        db_->commit_batch();
        throw;
      }
      db_->commit_batch();
      pending_.erase(p);
    }
    states_.emplace(d.name, std::move(state));
    return ref;
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

  static void check_version(uint64_t version, DataInput& in) {
    if (version != detail::kStateFormatVersion) {
      in.fail("unsupported keyed state format version " + std::to_string(version) + " (this build reads version " +
              std::to_string(detail::kStateFormatVersion) + ")");
    }
  }

  // Parses one key-group blob into the database (registered states, write batches of up to 4 MiB) or into pending
  // bytes (states not registered yet); throws SluiceException on any error.
  void restore_group(KeyGroup kg, DataInput& in, const std::vector<std::shared_ptr<const void>>* owners) {
    if (!range_.contains(kg)) {
      detail::throw_state_error("key group " + std::to_string(kg.value) + " is outside this backend's range " +
                                range_.to_string() + " (max parallelism " + std::to_string(max_parallelism_) + ")");
    }
    const int32_t g = kg.value - range_.start();
    check_version(in.read_varint(), in);
    uint64_t written_kg = in.read_varint();
    if (written_kg != static_cast<uint64_t>(kg.value)) {
      detail::throw_state_error("the bytes given for key group " + std::to_string(kg.value) + " hold key group " +
                                std::to_string(written_kg));
    }
    uint64_t sections = in.read_varint();
    db_->begin_batch();
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
        it->second->codec()->read_group(*db_, it->second->column_family(), kg, max_parallelism_, count, section, name);
        if (!section.at_end()) section.fail("trailing bytes after the entries of state '" + name + "'");
        detail::reclaim_restored_pages(bytes);
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
    db_->commit_batch();
    if (!in.at_end()) in.fail("trailing bytes after the last state of key group " + std::to_string(kg.value));
  }

  KeyGroupRange range_;
  int max_parallelism_;
  const Clock& clock_;
  RocksDBMemoryOptions memory_;
  bool incremental_ = false;
  mutable uint64_t captures_ = 0;
  std::shared_ptr<RocksDBUploadLedger> ledger_ = std::make_shared<RocksDBUploadLedger>();
  std::set<std::string, std::less<>> native_unregistered_;  // restored column families not registered yet
  std::shared_ptr<RocksDBInstance> db_;
  detail::RocksKeyContext<K> ctx_;
  DataOutput key_buf_;
  std::map<std::string, std::unique_ptr<detail::RocksStateBase<K>>, std::less<>> states_;
  std::map<std::string, detail::PendingHandle, std::less<>> pending_;
};

}  // namespace sluice
