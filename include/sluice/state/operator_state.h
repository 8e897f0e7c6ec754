// OperatorStateStore: non-keyed state of one operator subtask (Flink's OperatorStateStore /
// DefaultOperatorStateBackend), used by sources (split offsets) and sinks (pending transactions).
//
// A state is a named list of elements. How the lists move when the parallelism changes is chosen per
// state when it is first requested:
//  * get_list_state (Flink's "even-split redistribution"): the lists of all old subtasks, concatenated in
//    subtask order, are cut into `new parallelism` consecutive runs of nearly equal length; subtask i gets
//    one run. The runs that get one extra element rotate from state to state, exactly as Flink's
//    RoundRobinOperatorStateRepartitioner does. When the parallelism is unchanged every subtask gets its
//    own list back.
//  * get_union_list_state (Flink's "union redistribution"): every new subtask gets every element of every
//    old subtask, in old-subtask order (each then picks what it needs).
//
// Snapshots are bytes (docs/state-format.md, "Operator state"); elements are length-prefixed, so
// redistribute() works on the bytes of the old subtasks without knowing the element types. A restored
// state is decoded when it is first requested, and written back unchanged by snapshots until then.
//
// Lifecycle: created per subtask → restore() with the subtask's redistributed bytes (optional) →
// get_*_state() in the operator's initialization → snapshot() at checkpoints.
// Threading: the owning task thread only; redistribute() is a pure function usable from any thread.
// Errors: a name requested with another mode or element type throws SluiceException (kState);
// restore() and redistribute() return a Status.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"
#include "sluice/state/state.h"

namespace sluice {

/// How an operator list state is redistributed on restore with a new parallelism.
enum class OperatorStateMode : uint8_t {
  kSplitDistribute = 0,  ///< get_list_state: even split
  kUnion = 1,            ///< get_union_list_state: every subtask gets everything
};

/// "list" or "union list".
std::string_view operator_state_mode_name(OperatorStateMode mode) noexcept;

namespace detail {

/// The type-erased view of an operator list state used for snapshots and restore.
class OperatorStateBase {
 public:
  explicit OperatorStateBase(OperatorStateMode mode) : mode_(mode) {}
  virtual ~OperatorStateBase() = default;
  OperatorStateMode mode() const noexcept { return mode_; }
  /// Writes the element count, then each element as a byte string.
  virtual void write_elements(DataOutput& out) const = 0;
  /// Appends `count` elements written by write_elements.
  virtual void read_elements(uint64_t count, DataInput& in) = 0;

 private:
  OperatorStateMode mode_;
};

[[noreturn]] void throw_operator_state_mismatch(std::string_view name, OperatorStateMode registered,
                                                OperatorStateMode requested, bool same_mode);

}  // namespace detail

/// An operator list state: a plain list owned by the subtask (no keys, no TTL).
template <class T>
class OperatorListState final : public ListState<T>, public detail::OperatorStateBase {
 public:
  explicit OperatorListState(OperatorStateMode mode) : detail::OperatorStateBase(mode) {}

  const std::vector<T>& get() override { return elements_; }
  void add(const T& value) override { elements_.push_back(value); }
  void add(T&& value) override { elements_.push_back(std::move(value)); }
  void add_all(const std::vector<T>& values) override {
    elements_.insert(elements_.end(), values.begin(), values.end());
  }
  void update(std::vector<T> values) override { elements_ = std::move(values); }
  void clear() override { elements_.clear(); }

  void write_elements(DataOutput& out) const override {
    out.write_varint(elements_.size());
    DataOutput element;
    for (const T& e : elements_) {
      element.clear();
      TypeSerializer<T>::serialize(e, element);
      out.write_string(element.view());
    }
  }
  void read_elements(uint64_t count, DataInput& in) override {
    for (uint64_t i = 0; i < count; ++i) {
      size_t n = in.read_length();
      DataInput element(in.read_view(n));
      T value{};
      TypeSerializer<T>::deserialize(value, element);
      if (!element.at_end()) element.fail("an operator state element has trailing bytes");
      elements_.push_back(std::move(value));
    }
  }

 private:
  std::vector<T> elements_;
};

class OperatorStateStore {
 public:
  OperatorStateStore() = default;
  OperatorStateStore(const OperatorStateStore&) = delete;
  OperatorStateStore& operator=(const OperatorStateStore&) = delete;

  /// The list state `name`, redistributed by even split. Owned by the store; the same name returns the
  /// same object. Throws SluiceException (kState) when `name` has another mode or element type, and
  /// kSerialization when restored bytes do not decode as T.
  template <class T>
  ListState<T>& get_list_state(const std::string& name) {
    return get<T>(name, OperatorStateMode::kSplitDistribute);
  }

  /// The union list state `name`: after a restore it holds the elements of every old subtask.
  template <class T>
  ListState<T>& get_union_list_state(const std::string& name) {
    return get<T>(name, OperatorStateMode::kUnion);
  }

  /// Names of registered and restored-but-unregistered states, sorted.
  std::vector<std::string> state_names() const;

  /// Appends a snapshot of every state (docs/state-format.md).
  void snapshot(DataOutput& out) const;

  /// Appends the elements of a snapshot (usually the output of redistribute()) to the states; may be
  /// called more than once. Errors: kState for a mode mismatch with a registered state, kSerialization for
  /// corrupt bytes.
  [[nodiscard]] Status restore(DataInput& in);

  /// Computes, from the snapshots of all `old_snapshots.size()` old subtasks (in subtask order; an empty
  /// snapshot means no state), the snapshot that new subtask `subtask_index` of `new_parallelism` restores,
  /// and appends it to `out`. Errors: kConfiguration for a bad parallelism or index, kState when old
  /// subtasks disagree on a state's mode, kSerialization for corrupt bytes.
  [[nodiscard]] static Status redistribute(std::span<const std::string_view> old_snapshots, int new_parallelism,
                                           int subtask_index, DataOutput& out);

 private:
  struct Pending {
    OperatorStateMode mode = OperatorStateMode::kSplitDistribute;
    uint64_t count = 0;
    std::string bytes;  // `count` length-prefixed elements
  };

  template <class T>
  ListState<T>& get(const std::string& name, OperatorStateMode mode) {
    if (auto it = states_.find(name); it != states_.end()) {
      auto* typed = it->second->mode() == mode ? dynamic_cast<OperatorListState<T>*>(it->second.get()) : nullptr;
      if (typed == nullptr) {
        detail::throw_operator_state_mismatch(name, it->second->mode(), mode, it->second->mode() == mode);
      }
      return *typed;
    }
    auto state = std::make_unique<OperatorListState<T>>(mode);
    if (auto p = pending_.find(name); p != pending_.end()) {
      if (p->second.mode != mode) detail::throw_operator_state_mismatch(name, p->second.mode, mode, false);
      DataInput in(p->second.bytes);
      state->read_elements(p->second.count, in);
      pending_.erase(p);
    }
    OperatorListState<T>& ref = *state;
    states_.emplace(name, std::move(state));
    return ref;
  }

  std::map<std::string, std::unique_ptr<detail::OperatorStateBase>, std::less<>> states_;
  std::map<std::string, Pending, std::less<>> pending_;
};

}  // namespace sluice
