// What a task contributes to a checkpoint and what it gets back on restore, per operator of its chain
// (Flink's TaskStateSnapshot / OperatorSubtaskState and TaskStateManager's restore side).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/api/keyed_state_snapshot.h"

namespace sluice {

/// The synchronous result of one operator's snapshot in one subtask.
struct OperatorSubtaskSnapshot {
  std::string operator_uid;
  std::string operator_state;                       ///< OperatorStateStore::snapshot() bytes ("" when none)
  std::shared_ptr<const KeyedStateSnapshot> keyed;  ///< null for operators without keyed state
};

/// Everything one subtask captured for checkpoint `checkpoint_id`, plus its timings.
struct TaskStateSnapshot {
  int64_t checkpoint_id = 0;
  std::vector<OperatorSubtaskSnapshot> operators;  ///< chain order
  int64_t alignment_ns = 0;                        ///< from the first barrier to the last one (0 for sources)
  int64_t sync_pause_ns = 0;                       ///< processing paused for the synchronous part
  /// True when the subtask had consumed all its input before it snapshotted (its state is final).
  bool finished_input = false;
};

/// The state one operator of a restored subtask gets.
struct OperatorSubtaskRestore {
  std::string operator_state;                      ///< redistributed OperatorStateStore bytes ("" when none)
  std::shared_ptr<const KeyedStateRestore> keyed;  ///< null when the operator had no keyed state
};

/// The state a restored subtask gets, by operator uid. Immutable, shared read-only.
struct TaskRestore {
  int64_t checkpoint_id = 0;
  std::map<std::string, OperatorSubtaskRestore> operators;
};

}  // namespace sluice
