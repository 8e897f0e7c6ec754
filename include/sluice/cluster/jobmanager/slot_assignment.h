// Slot assignment: which TaskManager slot runs each subtask of a job (the part of Flink's scheduler and
// SlotPool that places subtasks). Thread-free and deterministic: the same graph, TaskManagers and preferences
// give the same placement.
//
// Slot sharing as Flink: the subtasks of a slot sharing group share slots; shared slot i of a group holds
// subtask i of each vertex of the group that has one, so a group needs as many slots as its largest
// parallelism, and a job the sum over its groups (JobGraph::required_slots). Shared slots are placed on the
// TaskManagers in registration order, filling one TaskManager's slots before the next; with
// cluster.evenly-spread-out-slots they go to the TaskManagers in turn (TaskManager 0, 1, ..., 0, ...).
//
// State locality (Flink's preference for a subtask's previous location on a restore): a shared slot whose
// subtasks prefer a TaskManager (the one that wrote their checkpointed state) goes there first, while that
// TaskManager has free slots; the other shared slots then fill the remaining slots in the order above.
#pragma once

#include <string>
#include <vector>

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"

namespace sluice {

/// The slots one TaskManager offers.
struct SlotOffer {
  std::string registration_id;
  int slots = 0;
  std::string resource_id;  ///< the TaskManager's resource id: what a preference (a state handle's location) names
};

/// Preferred TaskManager per subtask, by resource id: [vertex id][subtask index], "" for none. Missing vertices
/// or subtasks (an empty vector: no preferences at all) have none.
using PreferredLocations = std::vector<std::vector<std::string>>;

/// The preferences of a restore from `metadata`: subtask i of a vertex prefers the location of the state handle
/// of old subtask i of the first of the vertex's operator uids (chain order) that has one with a location, and
/// only when that operator's parallelism in the checkpoint equals the vertex's (after a rescale a subtask's state
/// comes from several old subtasks: no preference).
PreferredLocations preferred_locations_of(const JobGraph& jg, const CheckpointMetadata& metadata);

/// Where one subtask runs.
struct SubtaskSlot {
  int task_manager = -1;  ///< index into the offers
  int slot = -1;          ///< slot index in that TaskManager
};

struct SlotAssignment {
  std::vector<std::vector<SubtaskSlot>> subtasks;  ///< [vertex id][subtask index]
  std::vector<int> slots_used;                     ///< per offer: how many of its slots are used
  int preferred_subtasks = 0;                      ///< subtasks with a preference for a TaskManager
  int placed_as_preferred = 0;                     ///< ... of them placed on that TaskManager
};

/// Places every subtask. `preferred` (optional) names, per subtask, the TaskManager it should run on; the
/// preference of shared slot i of a group is that of subtask i of the group's first vertex (in graph order)
/// with one. A shared slot with a preference for an offered TaskManager (by resource id; an unknown one is
/// ignored) goes there while it has free slots; every other shared slot, in order, takes the first free slot
/// in registration order (or, evenly spread, on the TaskManager with the fewest slots used, the earliest of
/// equals). Without preferences the placement is the one described at the top of this file.
/// Errors (kConfiguration): fewer slots than the job needs, with the message
/// "needs N slots, M registered (on K TaskManager(s))".
[[nodiscard]] Result<SlotAssignment> assign_slots(const JobGraph& jg, const std::vector<SlotOffer>& offers,
                                                  bool evenly_spread, const PreferredLocations& preferred = {});

}  // namespace sluice
