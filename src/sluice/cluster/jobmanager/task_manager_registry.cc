#include "sluice/cluster/jobmanager/task_manager_registry.h"

#include <fmt/format.h>

#include <algorithm>

namespace sluice {

TaskManagerRegistry::TaskManagerRegistry(HeartbeatOptions heartbeat, JobGraphIdentity expected,
                                         std::string jobmanager_id)
    : heartbeat_(heartbeat), expected_(std::move(expected)), jobmanager_id_(std::move(jobmanager_id)) {}

Result<TaskManagerRegistration> TaskManagerRegistry::register_task_manager(
    const TaskManagerRegistrationRequest& r, TimestampMs now_ms, std::optional<ClosedRegistration>* replaced) {
  if (r.resource_id.empty() || r.rpc_address.empty()) {
    return Error(ErrorCode::kConfiguration, "a TaskManager registration needs a resource id and an RPC address");
  }
  if (r.slots < 1) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("TaskManager {} offers {} slots; taskmanager.numberOfTaskSlots must be at least 1",
                             r.resource_id, r.slots));
  }
  if (r.job.fingerprint != expected_.fingerprint || r.job.build_version != expected_.build_version) {
    return Error(ErrorCode::kGraph,
                 fmt::format("TaskManager {} is refused: its job graph differs from the JobManager's. JobManager: "
                             "job '{}', graph fingerprint {}, sluice {}; TaskManager: job '{}', graph fingerprint "
                             "{}, sluice {}. Start every process with the same pipeline file, -D options and Sluice "
                             "build",
                             r.resource_id, expected_.job_name, expected_.fingerprint, expected_.build_version,
                             r.job.job_name, r.job.fingerprint, r.job.build_version));
  }
  if (!r.job.pipeline_digest.empty() && !expected_.pipeline_digest.empty() &&
      r.job.pipeline_digest != expected_.pipeline_digest) {
    // The same graph from another file: its tasks would read or write elsewhere (another topic, table, path or
    // filter), splitting the job's output without a word.
    return Error(ErrorCode::kGraph,
                 fmt::format("TaskManager {} is refused: its pipeline file differs from the JobManager's, though the "
                             "job graph is the same (the files' text differs: connector settings, expressions and "
                             "options are not in the graph fingerprint, so any difference is refused). JobManager: "
                             "job '{}', pipeline digest {}; TaskManager: job '{}', pipeline digest {}. Start every "
                             "process with the same pipeline file",
                             r.resource_id, expected_.job_name, expected_.pipeline_digest, r.job.job_name,
                             r.job.pipeline_digest));
  }
  for (auto it = by_id_.begin(); it != by_id_.end(); ++it) {
    if (it->second.resource_id == r.resource_id) {
      ClosedRegistration c;
      close(it, "replaced by a new registration of the same TaskManager", now_ms, &c);
      if (replaced != nullptr) *replaced = std::move(c);
      break;
    }
  }
  TaskManagerRegistration reg;
  reg.registration_id = fmt::format("{}-{}", jobmanager_id_, next_number_++);
  reg.resource_id = r.resource_id;
  reg.rpc_address = r.rpc_address;
  reg.data_address = r.data_address;
  reg.hostname = r.hostname;
  reg.pid = r.pid;
  reg.slots_total = r.slots;
  reg.slots_free = r.slots;
  reg.registered_ms = now_ms;
  reg.last_heartbeat_ms = now_ms;
  order_.push_back(reg.registration_id);
  by_id_.emplace(reg.registration_id, reg);
  return reg;
}

HeartbeatVerdict TaskManagerRegistry::heartbeat(const std::string& registration_id, int32_t slots_free,
                                                TimestampMs now_ms, std::string* message) {
  auto it = by_id_.find(registration_id);
  if (it == by_id_.end()) {
    if (message != nullptr) {
      *message = fmt::format("registration '{}' is not known to this JobManager", registration_id);
      for (auto c = closed_.rbegin(); c != closed_.rend(); ++c) {
        if (c->registration.registration_id == registration_id) {
          *message = fmt::format("registration '{}' of TaskManager {} was closed at {} ms: {}", registration_id,
                                 c->registration.resource_id, c->closed_ms, c->reason);
          break;
        }
      }
      *message += "; register again";
    }
    return HeartbeatVerdict::kUnknownRegistration;
  }
  TaskManagerRegistration& reg = it->second;
  if (slots_free < 0 || slots_free > reg.slots_total) {
    if (message != nullptr) {
      *message = fmt::format("slot report of registration '{}' says {} free slots of {}", registration_id, slots_free,
                             reg.slots_total);
    }
    return HeartbeatVerdict::kInvalid;
  }
  reg.slots_free = slots_free;
  reg.last_heartbeat_ms = std::max(reg.last_heartbeat_ms, now_ms);
  return HeartbeatVerdict::kAccepted;
}

bool TaskManagerRegistry::disconnect(const std::string& registration_id, const std::string& reason,
                                     TimestampMs now_ms) {
  auto it = by_id_.find(registration_id);
  if (it == by_id_.end()) return false;
  close(it, "disconnected: " + reason, now_ms, nullptr);
  return true;
}

std::vector<ClosedRegistration> TaskManagerRegistry::check_heartbeats(TimestampMs now_ms) {
  std::vector<std::string> expired;
  for (const auto& [id, reg] : by_id_) {
    if (now_ms - reg.last_heartbeat_ms >= heartbeat_.timeout_ms) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end(), [&](const std::string& a, const std::string& b) {
    return by_id_.at(a).last_heartbeat_ms < by_id_.at(b).last_heartbeat_ms;
  });
  std::vector<ClosedRegistration> lost;
  for (const auto& id : expired) {
    auto it = by_id_.find(id);
    ClosedRegistration c;
    close(it,
          fmt::format("no heartbeat for {} ms (heartbeat.timeout {} ms)", now_ms - it->second.last_heartbeat_ms,
                      heartbeat_.timeout_ms),
          now_ms, &c);
    lost.push_back(std::move(c));
  }
  return lost;
}

TimestampMs TaskManagerRegistry::next_timeout_ms() const {
  TimestampMs next = std::numeric_limits<TimestampMs>::max();
  for (const auto& [id, reg] : by_id_)
    next = std::min(next, reg.last_heartbeat_ms + heartbeat_.timeout_ms);
  return next;
}

std::vector<TaskManagerRegistration> TaskManagerRegistry::task_managers() const {
  std::vector<TaskManagerRegistration> out;
  for (const auto& id : order_) {
    auto it = by_id_.find(id);
    if (it != by_id_.end()) out.push_back(it->second);
  }
  return out;
}

SlotSummary TaskManagerRegistry::slots() const {
  SlotSummary s;
  for (const auto& [id, reg] : by_id_) {
    ++s.task_managers;
    s.slots_total += reg.slots_total;
    s.slots_free += reg.slots_free;
  }
  return s;
}

void TaskManagerRegistry::close(std::map<std::string, TaskManagerRegistration>::iterator it, std::string reason,
                                TimestampMs now_ms, ClosedRegistration* out) {
  ClosedRegistration c{std::move(it->second), std::move(reason), now_ms};
  order_.erase(std::remove(order_.begin(), order_.end(), c.registration.registration_id), order_.end());
  by_id_.erase(it);
  closed_.push_back(c);
  if (closed_.size() > kClosedHistory) closed_.pop_front();
  if (out != nullptr) *out = std::move(c);
}

}  // namespace sluice
