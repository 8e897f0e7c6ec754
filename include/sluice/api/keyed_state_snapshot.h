// The type-erased view of keyed state that checkpoints move around (Flink's KeyedStateHandle and
// SnapshotResources, reduced to what a local checkpoint needs).
//
// A keyed operator captures its state on the task thread (KeyedStateSnapshot: cheap, consistent as of the
// capture) and the checkpoint writer thread later asks it for the bytes of each key group. On restore the
// runtime hands the operator the bytes of every key group of its new range (KeyedStateRestore), possibly
// written by several old subtasks: that is how keyed state moves when the parallelism changes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"
#include "sluice/core/key_group.h"

namespace sluice {

/// A consistent capture of one operator subtask's keyed state (state tables and timers).
/// Thread-safety: created on the task thread; write_key_group() may then run on another thread while the task
/// keeps processing (the capture must not change). Destroyed on any thread.
class KeyedStateSnapshot {
 public:
  virtual ~KeyedStateSnapshot() = default;
  /// The key groups this capture covers.
  virtual KeyGroupRange key_group_range() const = 0;
  /// Number of key groups of the operator (its max parallelism).
  virtual int max_parallelism() const = 0;
  /// Appends the bytes of key group `kg` (inside key_group_range()). The bytes are self-delimiting only
  /// together with their length, which the storage records. Throws SluiceException (kState) on misuse.
  virtual void write_key_group(KeyGroup kg, DataOutput& out) const = 0;
};

/// The keyed state restored into one operator subtask: for each key group of its new range that had state,
/// the bytes one KeyedStateSnapshot::write_key_group() wrote. Immutable once built; shared read-only.
///
/// The bytes are views, not copies: into the state files as the checkpoint storage mapped them (a restore of
/// 1 GiB must not copy 1 GiB before decoding it), kept alive by `owners`.
struct KeyedStateRestore {
  int max_parallelism = 0;
  /// Key group -> its bytes; each view points into memory one of `owners` keeps alive.
  std::map<int32_t, std::string_view> key_groups;
  /// Keep-alive references to the memory the views point into (a mapped state file, or private copies).
  std::vector<std::shared_ptr<const void>> owners;

  /// Sets key group `kg` to a private copy of `bytes` (replacing an earlier entry); for tests and small states.
  void add_copy(int32_t kg, std::string_view bytes) {
    auto copy = std::make_shared<const std::string>(bytes);
    key_groups[kg] = std::string_view(*copy);
    owners.push_back(std::move(copy));
  }
};

}  // namespace sluice
