// Operators on a KeyedStream. Each record's key is recomputed from the record with the stream's key selector
// (as Flink does), so keys never travel separately. Per-key values live in a flat hash map owned by the
// subtask; the event-time/state issue moves them into the keyed state backend, partitioned by key group.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>

#include <string>
#include <type_traits>
#include <utility>

#include "sluice/api/operators.h"
#include "sluice/core/key_group.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// Hashes keys for in-memory maps: abseil's hash for scalars and strings, XXH3 over the serialized bytes for
/// everything else (so any serializable key type works). In-memory only: key groups use key_hash().
template <class K>
struct KeyHasher {
  size_t operator()(const K& key) const {
    if constexpr (std::is_arithmetic_v<K> || std::is_enum_v<K> || std::is_same_v<K, std::string>) {
      return absl::Hash<K>{}(key);
    } else {
      thread_local DataOutput buf;
      buf.clear();
      TypeSerializer<K>::serialize(key, buf);
      return static_cast<size_t>(key_hash(buf.bytes()));
    }
  }
};

template <class K, class V>
using KeyedMap = absl::flat_hash_map<K, V, KeyHasher<K>>;

/// Rolling reduce per key (Flink's StreamGroupedReduceOperator): emits the new aggregate for every record.
template <class K, class T, class Sel, class R>
class KeyedReduceOperator final : public OneInputOperator<T>, OutputOf<T> {
 public:
  KeyedReduceOperator(Sel selector, R reducer) : selector_(std::move(selector)), reducer_(std::move(reducer)) {}
  void open() override { detail::open_function(reducer_, *this->ctx_); }
  void close() override { detail::close_function(reducer_); }
  void process_element(T&& record, TimestampMs ts) override {
    K key = std::invoke(selector_, std::as_const(record));
    auto it = values_.find(key);
    if (it == values_.end()) {
      it = values_.emplace(std::move(key), std::move(record)).first;
    } else {
      T reduced = call_user_function(this->name(), [&]() -> T {
        if constexpr (detail::kIsRich<R>) {
          return reducer_.reduce(std::as_const(it->second), std::as_const(record));
        } else {
          return std::invoke(reducer_, std::as_const(it->second), std::as_const(record));
        }
      });
      it->second = std::move(reduced);
    }
    T out = it->second;
    this->metrics_.records_out.inc();
    this->typed(this->main_output_)->collect(std::move(out), ts);
  }
  /// Number of keys this subtask holds (for tests and metrics).
  size_t key_count() const { return values_.size(); }

 private:
  Sel selector_;
  R reducer_;
  KeyedMap<K, T> values_;
};

/// Runs a KeyedProcessFunction (Flink's KeyedProcessOperator).
template <class K, class In, class Out, class Sel, class P>
class KeyedProcessOperator final : public OneInputOperator<In>, OutputOf<Out> {
 public:
  KeyedProcessOperator(Sel selector, P fn) : selector_(std::move(selector)), fn_(std::move(fn)), context_(this) {}
  void open() override {
    fn_.open(*this->ctx_);
    collector_.reset(this->typed(this->main_output_), &this->metrics_.records_out, kNoTimestamp);
  }
  void close() override { fn_.close(); }
  void process_element(In&& record, TimestampMs ts) override {
    context_.key = std::invoke(selector_, std::as_const(record));
    context_.ts = ts;
    collector_.set_timestamp(ts);
    call_user_function(this->name(), [&] { fn_.process_element(std::as_const(record), context_, collector_); });
  }

 private:
  struct Ctx final : KeyedProcessFunction<K, In, Out>::Context {
    explicit Ctx(KeyedProcessOperator* o) : op(o) {}
    TimestampMs timestamp() const override { return ts; }
    TimestampMs current_watermark() const override { return op->current_watermark(); }
    const K& current_key() const override { return key; }
    void* side_output(const std::string& tag_id) override { return op->side_output(tag_id); }
    KeyedProcessOperator* op;
    K key{};
    TimestampMs ts = kNoTimestamp;
  };
  Sel selector_;
  P fn_;
  Ctx context_;
  detail::TimestampedCollector<Out> collector_;
};

}  // namespace sluice
