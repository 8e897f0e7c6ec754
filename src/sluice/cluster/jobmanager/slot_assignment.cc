#include "sluice/cluster/jobmanager/slot_assignment.h"

#include <fmt/format.h>

#include <map>

namespace sluice {
namespace {

const std::string* preference_of(const PreferredLocations& preferred, int vertex, int subtask) {
  if (vertex < 0 || static_cast<size_t>(vertex) >= preferred.size()) return nullptr;
  const auto& of_vertex = preferred[static_cast<size_t>(vertex)];
  if (subtask < 0 || static_cast<size_t>(subtask) >= of_vertex.size()) return nullptr;
  const std::string& p = of_vertex[static_cast<size_t>(subtask)];
  return p.empty() ? nullptr : &p;
}

}  // namespace

PreferredLocations preferred_locations_of(const JobGraph& jg, const CheckpointMetadata& metadata) {
  std::map<std::string, const OperatorStateEntry*> by_uid;
  for (const OperatorStateEntry& op : metadata.operators)
    by_uid.emplace(op.uid, &op);
  PreferredLocations out(jg.vertices.size());
  for (const auto& v : jg.vertices) {
    auto& of_vertex = out[static_cast<size_t>(v.id)];
    of_vertex.assign(static_cast<size_t>(v.parallelism), "");
    for (int nid : v.chained_nodes) {
      auto it = by_uid.find(jg.node_uid[static_cast<size_t>(nid)]);
      if (it == by_uid.end() || it->second->parallelism != v.parallelism) continue;
      for (const OperatorSubtaskStateHandle& h : it->second->subtasks) {
        if (h.subtask < 0 || h.subtask >= v.parallelism || h.location.empty()) continue;
        std::string& p = of_vertex[static_cast<size_t>(h.subtask)];
        if (p.empty()) p = h.location;
      }
    }
  }
  return out;
}

Result<SlotAssignment> assign_slots(const JobGraph& jg, const std::vector<SlotOffer>& offers, bool evenly_spread,
                                    const PreferredLocations& preferred) {
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
  // Each shared slot's preferred offer (-1: none): its group's first vertex with a preference for subtask i, if
  // that TaskManager is registered (the first registration of a resource id).
  std::map<std::string, int> offer_of_resource;
  for (size_t t = 0; t < offers.size(); ++t) {
    if (!offers[t].resource_id.empty()) offer_of_resource.emplace(offers[t].resource_id, static_cast<int>(t));
  }
  std::vector<int> preferred_offer(static_cast<size_t>(needed), -1);
  std::vector<bool> decided(static_cast<size_t>(needed), false);
  for (const auto& v : jg.vertices) {
    const int first = group_first_slot[v.slot_sharing_group];
    for (int i = 0; i < v.parallelism; ++i) {
      const std::string* p = preference_of(preferred, v.id, i);
      const size_t k = static_cast<size_t>(first + i);
      if (p == nullptr || decided[k]) continue;
      decided[k] = true;
      auto it = offer_of_resource.find(*p);
      if (it != offer_of_resource.end()) preferred_offer[k] = it->second;
    }
  }

  // used[t][s]: slot s of offer t holds a shared slot.
  std::vector<std::vector<bool>> used(offers.size());
  for (size_t t = 0; t < offers.size(); ++t)
    used[t].assign(static_cast<size_t>(std::max(offers[t].slots, 0)), false);
  SlotAssignment out;
  out.slots_used.assign(offers.size(), 0);
  auto take = [&](int t) {
    auto& slots = used[static_cast<size_t>(t)];
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s]) continue;
      slots[s] = true;
      ++out.slots_used[static_cast<size_t>(t)];
      return SubtaskSlot{t, static_cast<int>(s)};
    }
    return SubtaskSlot{};  // unreachable: callers check for a free slot
  };
  auto has_free = [&](size_t t) { return out.slots_used[t] < static_cast<int>(used[t].size()); };

  std::vector<SubtaskSlot> physical(static_cast<size_t>(needed));
  std::vector<bool> placed(static_cast<size_t>(needed), false);
  // First the shared slots with a preference, in shared slot order, while their TaskManager has room.
  for (size_t k = 0; k < physical.size(); ++k) {
    const int t = preferred_offer[k];
    if (t < 0 || !has_free(static_cast<size_t>(t))) continue;
    physical[k] = take(t);
    placed[k] = true;
  }
  // Then the others over the remaining slots.
  for (size_t k = 0; k < physical.size(); ++k) {
    if (placed[k]) continue;
    int target = -1;
    for (size_t t = 0; t < offers.size(); ++t) {
      if (!has_free(t)) continue;
      // Registration order: the first TaskManager with room. Evenly spread: the fewest used, the first of those.
      if (target < 0 || (evenly_spread && out.slots_used[t] < out.slots_used[static_cast<size_t>(target)]))
        target = static_cast<int>(t);
      if (!evenly_spread) break;
    }
    physical[k] = take(target);  // target >= 0: there are at least `needed` slots
  }

  out.subtasks.resize(jg.vertices.size());
  for (const auto& v : jg.vertices) {
    const int first = group_first_slot[v.slot_sharing_group];
    for (int i = 0; i < v.parallelism; ++i) {
      const SubtaskSlot& s = physical[static_cast<size_t>(first + i)];
      out.subtasks[static_cast<size_t>(v.id)].push_back(s);
      if (const std::string* p = preference_of(preferred, v.id, i)) {
        ++out.preferred_subtasks;
        if (offers[static_cast<size_t>(s.task_manager)].resource_id == *p) ++out.placed_as_preferred;
      }
    }
  }
  return out;
}

}  // namespace sluice
