#include "sluice/cluster/jobmanager/slot_assignment.h"

#include <fmt/format.h>

#include <map>

namespace sluice {

Result<SlotAssignment> assign_slots(const JobGraph& jg, const std::vector<SlotOffer>& offers, bool evenly_spread) {
  // Shared slots per slot sharing group, groups in the order of their first vertex.
  std::vector<std::string> groups;
  std::map<std::string, int> group_size;
  for (const auto& v : jg.vertices) {
    auto [it, fresh] = group_size.emplace(v.slot_sharing_group, 0);
    if (fresh) groups.push_back(v.slot_sharing_group);
    it->second = std::max(it->second, v.parallelism);
  }
  int needed = 0;
  std::map<std::string, int> group_first_slot;  // index of the group's shared slot 0 among all shared slots
  for (const auto& g : groups) {
    group_first_slot[g] = needed;
    needed += group_size[g];
  }
  int registered = 0;
  for (const auto& o : offers)
    registered += o.slots;
  if (registered < needed) {
    return Error(ErrorCode::kConfiguration, fmt::format("needs {} slots, {} registered (on {} TaskManager(s))", needed,
                                                        registered, offers.size()));
  }
  // Physical slots in placement order.
  std::vector<SubtaskSlot> physical;
  if (evenly_spread) {
    for (int s = 0; static_cast<int>(physical.size()) < needed; ++s) {
      for (size_t t = 0; t < offers.size() && static_cast<int>(physical.size()) < needed; ++t) {
        if (s < offers[t].slots) physical.push_back({static_cast<int>(t), s});
      }
    }
  } else {
    for (size_t t = 0; t < offers.size() && static_cast<int>(physical.size()) < needed; ++t) {
      for (int s = 0; s < offers[t].slots && static_cast<int>(physical.size()) < needed; ++s)
        physical.push_back({static_cast<int>(t), s});
    }
  }
  SlotAssignment out;
  out.slots_used.assign(offers.size(), 0);
  for (const auto& p : physical)
    ++out.slots_used[static_cast<size_t>(p.task_manager)];
  out.subtasks.resize(jg.vertices.size());
  for (const auto& v : jg.vertices) {
    const int first = group_first_slot[v.slot_sharing_group];
    for (int i = 0; i < v.parallelism; ++i)
      out.subtasks[static_cast<size_t>(v.id)].push_back(physical[static_cast<size_t>(first + i)]);
  }
  return out;
}

}  // namespace sluice
