// Keyed state as a user function sees it (Flink's "Working with State" and "State TTL").
//
// A user function declares its state with a descriptor (name, types, optional TTL) and gets back a state
// object from the keyed state backend. Every call on a state object reads or writes the value of the
// backend's *current key* (the key of the record or timer being processed) and of the state object's
// *current namespace* (VoidNamespace for plain keyed state; the window for window contents).
//
// The state interfaces below are abstract so that a RuntimeContext, which does not know the key type or the
// backend, can hand them out; the heap backend's concrete classes (heap_state.h) are `final`, so code that
// holds the concrete type pays no virtual call.
//
// Threading: state objects belong to one task thread (DESIGN.md §6); nothing here is thread-safe.
// References and pointers returned by a state object (ValueState::value(), ListState::get(),
// MapState::find()) stay valid only until the next call on any state object of the same backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

// ---------------------------------------------------------------------------------------------------------
// TTL
// ---------------------------------------------------------------------------------------------------------

/// Time-to-live of keyed state entries (Flink's StateTtlConfig). TTL runs on processing time: the
/// backend's Clock. An entry expires when `last access + ttl_ms <= now`; what counts as an access is chosen
/// by `update_type`. Value, reducing and aggregating state expire as a whole; list state per element and
/// map state per map entry, as in Flink. Expired entries are removed when they are read and, with
/// `cleanup_incrementally`, by a rolling scan: every access to a state also checks up to
/// `incremental_cleanup_size` further entries of that state.
struct StateTtlConfig {
  /// What refreshes an entry's last-access timestamp.
  enum class UpdateType : uint8_t {
    kOnCreateAndWrite,  ///< creating and writing the entry (Flink's OnCreateAndWrite), the default
    kOnReadAndWrite,    ///< reads too (Flink's OnReadAndWrite)
  };
  /// Whether a read may return an expired entry that is still stored.
  enum class Visibility : uint8_t {
    kNeverReturnExpired,           ///< expired entries behave as absent (the default)
    kReturnExpiredIfNotCleanedUp,  ///< a read returns a still-stored expired entry once, then removes it
  };

  /// Time to live in milliseconds; 0 disables TTL.
  int64_t ttl_ms = 0;
  UpdateType update_type = UpdateType::kOnCreateAndWrite;
  Visibility visibility = Visibility::kNeverReturnExpired;
  /// Scan a few entries for expiry on every access of the state (Flink's cleanupIncrementally).
  bool cleanup_incrementally = true;
  /// Entries checked per access when cleanup_incrementally is set.
  int incremental_cleanup_size = 5;

  /// A TTL of `ttl_ms` milliseconds with the defaults above.
  static StateTtlConfig of(int64_t ttl_ms) {
    StateTtlConfig c;
    c.ttl_ms = ttl_ms;
    return c;
  }
  StateTtlConfig with_update_type(UpdateType type) const {
    StateTtlConfig c = *this;
    c.update_type = type;
    return c;
  }
  StateTtlConfig with_visibility(Visibility v) const {
    StateTtlConfig c = *this;
    c.visibility = v;
    return c;
  }
  /// Checks `entries_per_access` entries on every access (0 disables the scan).
  StateTtlConfig with_incremental_cleanup(int entries_per_access) const {
    StateTtlConfig c = *this;
    c.cleanup_incrementally = entries_per_access > 0;
    c.incremental_cleanup_size = entries_per_access;
    return c;
  }
  StateTtlConfig without_incremental_cleanup() const { return with_incremental_cleanup(0); }

  bool enabled() const noexcept { return ttl_ms > 0; }

  /// Returns a kConfiguration error naming `state_name` for a negative TTL or cleanup size.
  Status validate(std::string_view state_name) const;
};

// ---------------------------------------------------------------------------------------------------------
// Namespaces and kinds
// ---------------------------------------------------------------------------------------------------------

/// The namespace of plain keyed state (Flink's VoidNamespace): there is exactly one, encoded as zero bytes.
struct VoidNamespace {
  friend bool operator==(VoidNamespace, VoidNamespace) noexcept { return true; }
};

/// VoidNamespace is encoded as zero bytes.
template <>
struct TypeSerializer<VoidNamespace> {
  static void serialize(const VoidNamespace&, DataOutput&) {}
  static void deserialize(VoidNamespace&, DataInput&) {}
  static constexpr size_t min_encoded_size() { return 0; }
};

/// The kind of a keyed state; written into snapshots (docs/state-format.md), so the numbers are stable.
enum class StateKind : uint8_t {
  kValue = 1,
  kList = 2,
  kMap = 3,
  kReducing = 4,
  kAggregating = 5,
};

/// Returns "value", "list", "map", "reducing", "aggregating" (or "unknown").
std::string_view state_kind_name(StateKind kind) noexcept;

// ---------------------------------------------------------------------------------------------------------
// Aggregate functions
// ---------------------------------------------------------------------------------------------------------

/// Incremental aggregation with an accumulator (Flink's AggregateFunction), used by AggregatingState and
/// by window aggregation. `merge` combines two accumulators (merging windows); it may consume `a`.
template <class In, class Acc, class Out>
class AggregateFunction {
 public:
  using InputType = In;
  using AccumulatorType = Acc;
  using OutputType = Out;
  virtual ~AggregateFunction() = default;
  /// A new, empty accumulator.
  virtual Acc create_accumulator() = 0;
  /// Adds `value` to `accumulator` in place.
  virtual void add(const In& value, Acc& accumulator) = 0;
  /// The result for an accumulator (called on every AggregatingState::get()).
  virtual Out get_result(const Acc& accumulator) = 0;
  /// Merges two accumulators into one.
  virtual Acc merge(Acc a, const Acc& b) = 0;
};

/// An AggregateFunction made of four callables; see make_aggregate_function.
template <class In, class Acc, class Out, class Create, class Add, class Result, class Merge>
class LambdaAggregateFunction final : public AggregateFunction<In, Acc, Out> {
 public:
  LambdaAggregateFunction(Create create, Add add, Result result, Merge merge)
      : create_(std::move(create)), add_(std::move(add)), result_(std::move(result)), merge_(std::move(merge)) {}
  Acc create_accumulator() override { return create_(); }
  void add(const In& value, Acc& accumulator) override { add_(value, accumulator); }
  Out get_result(const Acc& accumulator) override { return result_(accumulator); }
  Acc merge(Acc a, const Acc& b) override { return merge_(std::move(a), b); }

 private:
  Create create_;
  Add add_;
  Result result_;
  Merge merge_;
};

/// Builds an AggregateFunction from `create() -> Acc`, `add(const In&, Acc&)`, `result(const Acc&) -> Out`
/// and `merge(Acc, const Acc&) -> Acc`:
///   auto avg = make_aggregate_function<double, std::pair<double, int64_t>, double>(...);
template <class In, class Acc, class Out, class Create, class Add, class Result, class Merge>
std::shared_ptr<AggregateFunction<In, Acc, Out>> make_aggregate_function(Create create, Add add, Result result,
                                                                         Merge merge) {
  return std::make_shared<LambdaAggregateFunction<In, Acc, Out, Create, Add, Result, Merge>>(
      std::move(create), std::move(add), std::move(result), std::move(merge));
}

// ---------------------------------------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------------------------------------
//
// A descriptor names a state and fixes its kind and types. Names are unique per operator: asking the
// backend twice for the same name returns the same state object (the first registration's default value,
// functions and TTL are kept); the same name with another kind or other types is an error. All value
// types need a TypeSerializer (snapshots); map keys also need operator== and a hash (absl::Hash when
// available, otherwise XXH3 of their serialized bytes).

/// A single value per key and namespace. `value()` returns `default_value` when the state holds nothing.
template <class T>
struct ValueStateDescriptor {
  using ValueType = T;
  std::string name;
  T default_value{};
  StateTtlConfig ttl{};
};

/// A list of elements per key and namespace.
template <class T>
struct ListStateDescriptor {
  using ElementType = T;
  std::string name;
  StateTtlConfig ttl{};
};

/// A map per key and namespace.
template <class UK, class UV>
struct MapStateDescriptor {
  using UserKeyType = UK;
  using UserValueType = UV;
  std::string name;
  StateTtlConfig ttl{};
};

/// A value per key and namespace that every add() folds into with `reduce(accumulated, added)`.
template <class T>
struct ReducingStateDescriptor {
  using ValueType = T;
  std::string name;
  std::function<T(const T&, const T&)> reduce;
  StateTtlConfig ttl{};
};

/// An accumulator per key and namespace, maintained by an AggregateFunction.
template <class In, class Acc, class Out>
struct AggregatingStateDescriptor {
  using InputType = In;
  using AccumulatorType = Acc;
  using OutputType = Out;
  std::string name;
  std::shared_ptr<AggregateFunction<In, Acc, Out>> aggregate;
  StateTtlConfig ttl{};
};

// ---------------------------------------------------------------------------------------------------------
// State interfaces
// ---------------------------------------------------------------------------------------------------------
//
// Every call throws SluiceException (ErrorCode::kState) when the backend has no current key.

/// Base of all state objects.
class State {
 public:
  virtual ~State() = default;
  /// Removes the value of the current key and namespace.
  virtual void clear() = 0;
};

/// One value per key and namespace (Flink's ValueState).
template <class T>
class ValueState : public State {
 public:
  /// The value, or the descriptor's default value when there is none (or it expired). The reference is
  /// valid until the next call on a state of the same backend.
  virtual const T& value() = 0;
  /// True when a value is stored (an expired value counts only with kReturnExpiredIfNotCleanedUp). Not a
  /// read for TTL purposes: it does not refresh the entry.
  virtual bool has_value() = 0;
  virtual void update(const T& value) = 0;
  virtual void update(T&& value) = 0;
};

/// A list per key and namespace (Flink's ListState; also the operator list state).
template <class T>
class ListState : public State {
 public:
  /// The elements (empty when there are none). The reference is valid until the next call on a state of
  /// the same backend.
  virtual const std::vector<T>& get() = 0;
  virtual void add(const T& value) = 0;
  virtual void add(T&& value) = 0;
  /// Appends every element of `values` (an empty vector changes nothing).
  virtual void add_all(const std::vector<T>& values) = 0;
  /// Replaces the list; an empty vector clears the state.
  virtual void update(std::vector<T> values) = 0;
};

/// A map per key and namespace (Flink's MapState). Functions that visit entries must not modify the state
/// while they run.
template <class UK, class UV>
class MapState : public State {
 public:
  /// A copy of the value for `key`, or nullopt.
  virtual std::optional<UV> get(const UK& key) = 0;
  /// The value for `key` in place, or nullptr; valid until the next call on a state of the same backend.
  virtual const UV* find(const UK& key) = 0;
  virtual bool contains(const UK& key) = 0;
  virtual void put(const UK& key, UV value) = 0;
  virtual void put_all(const std::vector<std::pair<UK, UV>>& entries) = 0;
  virtual void remove(const UK& key) = 0;
  virtual bool is_empty() = 0;
  /// Copies of the entries, keys or values, in unspecified order.
  virtual std::vector<std::pair<UK, UV>> entries() = 0;
  virtual std::vector<UK> keys() = 0;
  virtual std::vector<UV> values() = 0;
  /// Calls `fn(key, value)` for every entry, in unspecified order.
  virtual void for_each(const std::function<void(const UK&, const UV&)>& fn) = 0;
};

/// A value that add() reduces into (Flink's ReducingState).
template <class T>
class ReducingState : public State {
 public:
  /// The reduced value, or nullopt when nothing was added.
  virtual std::optional<T> get() = 0;
  virtual void add(const T& value) = 0;
};

/// An accumulator that add() aggregates into (Flink's AggregatingState).
template <class In, class Out>
class AggregatingState : public State {
 public:
  /// The aggregate function's result for the accumulator, or nullopt when nothing was added.
  virtual std::optional<Out> get() = 0;
  virtual void add(const In& value) = 0;
};

}  // namespace sluice
