// The keyed state of one operator subtask for checkpoints: its heap state backend and (optionally) its timer
// service, captured together and written per key group (docs/state-format.md, "Keyed operator blob").
//
// capture_keyed_operator() runs on the task thread at the checkpoint barrier: the backend is captured
// copy-on-write (O(states x key groups), no entry copied) and the timers are serialized (they are few). The
// returned KeyedStateSnapshot is then written by the checkpoint writer thread, one key group at a time,
// while the task goes on processing. restore_keyed_operator() is the inverse, for the key groups of the
// subtask's (possibly new) range; key groups written by any old parallelism with the same max parallelism
// are accepted, which is how keyed state and timers move on rescaling.
//
// Bytes of one key group:
//   varint  length of the state part, then the state part (HeapKeyedStateBackend::snapshot_key_group)
//   varint  length of the timer part, then the timer part (InternalTimerService::snapshot_key_group);
//           length 0 when the operator had no timer service
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "sluice/api/keyed_state_snapshot.h"
#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"
#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/timer_service.h"

namespace sluice {

/// The capture of a keyed operator's state backend and timers (capture_keyed_operator()).
///
/// Thread-safety: immutable; write_key_group() may run on any thread (also several at once, for different
/// or equal key groups) while the task thread keeps mutating the backend and timers. Destroyed on any
/// thread; it does not refer to the backend or the timer service, so it may outlive them.
class KeyedOperatorSnapshot final : public KeyedStateSnapshot {
 public:
  /// `state` is the capture of either backend (heap or RocksDB; both write canonical key-group blobs);
  /// `timers` may be null (an operator without timers).
  KeyedOperatorSnapshot(std::unique_ptr<KeyedStateSnapshot> state, std::unique_ptr<TimerServiceSnapshot> timers)
      : state_(std::move(state)), timers_(std::move(timers)) {}

  KeyGroupRange key_group_range() const override { return state_->key_group_range(); }
  int max_parallelism() const override { return state_->max_parallelism(); }

  /// Appends [varint length][state bytes][varint length][timer bytes] of key group `kg` as they were at
  /// capture time. Throws SluiceException (kState) when `kg` is outside key_group_range().
  void write_key_group(KeyGroup kg, DataOutput& out) const override {
    // The state part goes through a scratch buffer because its varint length comes first.
    DataOutput state_bytes;
    state_->write_key_group(kg, state_bytes);
    write_parts(state_bytes, kg, /*beside_native=*/false, out);
  }

  /// The backend's native files (incremental rocksdb checkpoints), or nullptr.
  const NativeKeyedStateSnapshot* native() const override { return state_->native(); }
  /// As write_key_group(), with the state and timer parts reduced to what the native files do not hold.
  void write_key_group_beside_native(KeyGroup kg, DataOutput& out) const override {
    DataOutput state_bytes;
    state_->write_key_group_beside_native(kg, state_bytes);
    write_parts(state_bytes, kg, /*beside_native=*/true, out);
  }

  /// The captured backend state alone.
  const KeyedStateSnapshot& state() const noexcept { return *state_; }
  /// The captured timers, or null.
  const TimerServiceSnapshot* timers() const noexcept { return timers_.get(); }

 private:
  void write_parts(const DataOutput& state_bytes, KeyGroup kg, bool beside_native, DataOutput& out) const {
    out.write_varint(state_bytes.size());
    out.write_bytes(state_bytes.data(), state_bytes.size());
    DataOutput timer_bytes;
    if (timers_ != nullptr) {
      if (beside_native) {
        timers_->write_timers_beside_native(kg, timer_bytes);
      } else {
        timers_->write_timers(kg, timer_bytes);
      }
    }
    out.write_varint(timer_bytes.size());
    out.write_bytes(timer_bytes.data(), timer_bytes.size());
  }

  std::unique_ptr<KeyedStateSnapshot> state_;
  std::unique_ptr<TimerServiceSnapshot> timers_;
};

/// Captures `backend` and `timers` (nullable; it must belong to `backend`) for an asynchronous checkpoint.
/// Task thread only; the pause is the backend's capture() plus serializing the timers.
template <class K, class N>
std::unique_ptr<KeyedStateSnapshot> capture_keyed_operator(const HeapKeyedStateBackend<K>& backend,
                                                           const InternalTimerService<K, N>* timers) {
  return std::make_unique<KeyedOperatorSnapshot>(backend.capture(), timers != nullptr ? timers->capture() : nullptr);
}

/// capture_keyed_operator() for an operator without timers.
template <class K>
std::unique_ptr<KeyedStateSnapshot> capture_keyed_operator(const HeapKeyedStateBackend<K>& backend) {
  return std::make_unique<KeyedOperatorSnapshot>(backend.capture(), nullptr);
}

namespace detail {

/// Reads a varint length and that many bytes of a keyed operator blob; throws kSerialization.
inline std::string_view read_operator_part(DataInput& in, const char* what) {
  uint64_t length = in.read_varint();
  if (length > in.remaining()) in.fail(std::string("the length of the ") + what + " exceeds the remaining bytes");
  return in.read_view(static_cast<size_t>(length));
}

/// Throws kState unless `bytes` (a timer key-group blob) holds no timer: for an operator restored without
/// a timer service.
inline void check_no_timers(std::string_view bytes, KeyGroup kg) {
  if (bytes.empty()) return;
  DataInput in(bytes);
  in.read_varint();  // format version
  in.read_varint();  // key group
  uint64_t event_time = in.read_varint();
  uint64_t processing_time = event_time == 0 ? in.read_varint() : 0;
  if (event_time != 0 || processing_time != 0 || !in.at_end()) {
    throw_state_error("key group " + std::to_string(kg.value) +
                      " holds timers but the operator is restored without a timer service: register the timer "
                      "service before restoring, or restore into the operator that wrote the checkpoint");
  }
}

}  // namespace detail

/// Restores every key group of `restore` (written by KeyedOperatorSnapshot::write_key_group of any subtask
/// with the same max parallelism) into `backend` and `timers` (nullable). Entries and timers are added to
/// what is there (equal keys and namespaces replace state entries; equal timers collapse). Errors: kState
/// when the max parallelism differs, a key group is outside the backend's range, timers come for an
/// operator without a timer service, or a state does not match its registration; kSerialization for
/// corrupt bytes. Every error names the key group. On error part of the state may be restored: the task
/// should fail. Task thread only. `Backend` is HeapKeyedStateBackend<K> or RocksDBKeyedStateBackend<K> (the
/// timers then live on a heap backend of the same range).
template <class Backend, class K, class N>
[[nodiscard]] Status restore_keyed_operator(Backend& backend, InternalTimerService<K, N>* timers,
                                            const KeyedStateRestore& restore) {
  if (restore.max_parallelism != backend.max_parallelism()) {
    return Error(ErrorCode::kState, "restoring keyed operator state: it was written with max parallelism " +
                                        std::to_string(restore.max_parallelism) +
                                        " but this operator has max parallelism " +
                                        std::to_string(backend.max_parallelism()) +
                                        "; keyed state can only be rescaled within the same max parallelism: restore "
                                        "with the old max parallelism");
  }
  for (const auto& [kg_value, bytes] : restore.key_groups) {
    KeyGroup kg{kg_value};
    if (!backend.key_group_range().contains(kg)) {
      return Error(ErrorCode::kState, "restoring keyed operator state: key group " + std::to_string(kg_value) +
                                          " is outside this subtask's key-group range " +
                                          backend.key_group_range().to_string() + " (max parallelism " +
                                          std::to_string(backend.max_parallelism()) +
                                          "): the state assignment handed it to the wrong subtask");
    }
    std::string_view state_bytes;
    std::string_view timer_bytes;
    try {
      DataInput in(bytes);
      state_bytes = detail::read_operator_part(in, "keyed state part");
      timer_bytes = detail::read_operator_part(in, "timer part");
      if (!in.at_end()) in.fail("trailing bytes after the timer part");
      if (timers == nullptr) detail::check_no_timers(timer_bytes, kg);
    } catch (const SluiceException& e) {
      return e.error().with_context("restoring keyed operator state of key group " + std::to_string(kg_value));
    }
    DataInput state_in(state_bytes);
    // Its errors name the key group. The restore's owners keep the bytes alive, so states registered
    // later decode them in place instead of from a copy.
    SLUICE_RETURN_IF_ERROR(backend.restore_key_group(kg, state_in, &restore.owners));
    if (timers != nullptr && !timer_bytes.empty()) {
      DataInput timer_in(timer_bytes);
      SLUICE_RETURN_IF_ERROR(timers->restore_key_group(kg, timer_in));
    }
  }
  return ok_status();
}

/// restore_keyed_operator() for an operator without timers (key groups holding timers are an error).
template <class K>
[[nodiscard]] Status restore_keyed_operator(HeapKeyedStateBackend<K>& backend, const KeyedStateRestore& restore) {
  return restore_keyed_operator(backend, static_cast<InternalTimerService<K, VoidNamespace>*>(nullptr), restore);
}

}  // namespace sluice
