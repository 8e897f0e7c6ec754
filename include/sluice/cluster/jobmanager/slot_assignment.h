// Slot assignment: which TaskManager slot runs each subtask of a job (the part of Flink's scheduler and
// SlotPool that places subtasks). Thread-free and deterministic: the same graph and the same TaskManagers
// give the same placement.
//
// Slot sharing as Flink: the subtasks of a slot sharing group share slots; shared slot i of a group holds
// subtask i of each vertex of the group that has one, so a group needs as many slots as its largest
// parallelism, and a job the sum over its groups (JobGraph::required_slots). Shared slots are placed on the
// TaskManagers in registration order, filling one TaskManager's slots before the next; with
// cluster.evenly-spread-out-slots they go to the TaskManagers in turn (TaskManager 0, 1, ..., 0, ...).
#pragma once

#include <string>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

/// The slots one TaskManager offers.
struct SlotOffer {
  std::string registration_id;
  int slots = 0;
};

/// Where one subtask runs.
struct SubtaskSlot {
  int task_manager = -1;  ///< index into the offers
  int slot = -1;          ///< slot index in that TaskManager
};

struct SlotAssignment {
  std::vector<std::vector<SubtaskSlot>> subtasks;  ///< [vertex id][subtask index]
  std::vector<int> slots_used;                     ///< per offer: how many of its slots are used
};

/// Places every subtask. Errors (kConfiguration): fewer slots than the job needs, with the message
/// "needs N slots, M registered (on K TaskManager(s))".
[[nodiscard]] Result<SlotAssignment> assign_slots(const JobGraph& jg, const std::vector<SlotOffer>& offers,
                                                  bool evenly_spread);

}  // namespace sluice
