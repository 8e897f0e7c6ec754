// Key groups: the unit in which keyed state is partitioned, stored and moved (DESIGN.md §1).
//
// A key's key group is `xxh3_64(serialized key bytes, seed 0) % max_parallelism`, where the bytes are the
// key's TypeSerializer encoding (docs/serialization.md). XXH3-64 (Yann Collet's xxHash, v0.8 spec) is fixed
// and platform-independent, so a key maps to the same key group on every machine and in every version of
// Sluice: key groups live in checkpoints and must never change. std::hash is never used.
//
// Ranges and the owning subtask follow Flink's KeyGroupRangeAssignment exactly:
//   operator_index(kg) = kg * parallelism / max_parallelism
//   range(i) = [ceil(i * maxp / p), floor(((i + 1) * maxp - 1) / p)]
#pragma once

#include <cassert>
#include <cstdint>
#include <span>
#include <string>

namespace sluice {

/// Default number of key groups (the max parallelism) of a keyed operator.
inline constexpr int kDefaultMaxParallelism = 128;
/// Upper bound on max parallelism, as Flink (2^15).
inline constexpr int kUpperBoundMaxParallelism = 1 << 15;

/// Strong type for a key-group index in [0, max_parallelism).
struct KeyGroup {
  int32_t value = 0;
  friend bool operator==(KeyGroup, KeyGroup) = default;
  friend auto operator<=>(KeyGroup, KeyGroup) = default;
};

/// Returns the stable 64-bit hash of serialized key bytes (XXH3-64, seed 0).
uint64_t key_hash(std::span<const uint8_t> serialized_key) noexcept;

/// Returns the key group of a key given its stable hash.
inline KeyGroup key_group_for_hash(uint64_t hash, int max_parallelism) noexcept {
  return KeyGroup{static_cast<int32_t>(hash % static_cast<uint64_t>(max_parallelism))};
}

/// Returns the key group of serialized key bytes.
inline KeyGroup assign_to_key_group(std::span<const uint8_t> serialized_key, int max_parallelism) noexcept {
  return key_group_for_hash(key_hash(serialized_key), max_parallelism);
}

/// Returns the subtask index that owns `kg` at `parallelism` (Flink's computeOperatorIndexForKeyGroup).
inline int operator_index_for_key_group(int max_parallelism, int parallelism, KeyGroup kg) noexcept {
  assert(kg.value >= 0 && kg.value < max_parallelism);
  return static_cast<int>(static_cast<int64_t>(kg.value) * parallelism / max_parallelism);
}

/// An inclusive range [start, end] of key groups owned by one subtask. Empty when end < start.
class KeyGroupRange {
 public:
  KeyGroupRange() = default;
  KeyGroupRange(int32_t start, int32_t end) : start_(start), end_(end) {}

  /// The range owned by `operator_index` of `parallelism` subtasks (Flink's
  /// computeKeyGroupRangeForOperatorIndex).
  static KeyGroupRange for_operator_index(int max_parallelism, int parallelism, int operator_index) {
    assert(parallelism > 0 && parallelism <= max_parallelism);
    int32_t start =
        static_cast<int32_t>((static_cast<int64_t>(operator_index) * max_parallelism + parallelism - 1) / parallelism);
    int32_t end =
        static_cast<int32_t>(((static_cast<int64_t>(operator_index) + 1) * max_parallelism - 1) / parallelism);
    return {start, end};
  }

  int32_t start() const noexcept { return start_; }
  int32_t end() const noexcept { return end_; }
  int32_t size() const noexcept { return end_ >= start_ ? end_ - start_ + 1 : 0; }
  bool contains(KeyGroup kg) const noexcept { return kg.value >= start_ && kg.value <= end_; }
  std::string to_string() const { return "[" + std::to_string(start_) + ", " + std::to_string(end_) + "]"; }
  friend bool operator==(const KeyGroupRange&, const KeyGroupRange&) = default;

 private:
  int32_t start_ = 0;
  int32_t end_ = -1;
};

}  // namespace sluice
