// Checkpoint barriers and the options a checkpoint runs with (Flink's CheckpointBarrier and
// CheckpointOptions). A barrier flows with the records on every channel; everything before barrier n on a
// channel belongs to checkpoint n, everything after it to n+1 (DESIGN.md §6).
#pragma once

#include <cstdint>

#include "sluice/core/clock.h"

namespace sluice {

/// What a checkpoint is for.
enum class SnapshotType : uint8_t {
  kCheckpoint = 0,          ///< periodic; owned and deleted by the engine
  kSavepoint = 1,           ///< user-triggered; never deleted by the engine
  kSavepointTerminate = 2,  ///< stop-with-savepoint: sources stop once it is taken; the job then finishes
};

/// How barriers are handled by a task with several input channels.
enum class CheckpointingMode : uint8_t {
  kExactlyOnce = 0,  ///< aligned: a channel that delivered the barrier is blocked until all did
  kAtLeastOnce = 1,  ///< not aligned: snapshot when the last barrier arrives, never block
};

/// The element injected by sources and forwarded by every task. Encoded on a channel as
/// tag, i64 id, i64 timestamp (ms since epoch), u8 type, u8 mode (runtime/stream_element.h).
struct CheckpointBarrier {
  int64_t checkpoint_id = 0;
  TimestampMs timestamp = 0;  ///< when the coordinator triggered it
  SnapshotType type = SnapshotType::kCheckpoint;
  CheckpointingMode mode = CheckpointingMode::kExactlyOnce;
};

inline const char* snapshot_type_name(SnapshotType t) {
  switch (t) {
    case SnapshotType::kCheckpoint:
      return "checkpoint";
    case SnapshotType::kSavepoint:
      return "savepoint";
    case SnapshotType::kSavepointTerminate:
      return "stop-with-savepoint";
  }
  return "unknown";
}

}  // namespace sluice
