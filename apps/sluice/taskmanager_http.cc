#include "taskmanager_http.h"

#include <fmt/format.h>

#include "sluice/core/value.h"

namespace sluice::cli {

HealthResponse taskmanager_health(const TaskExecutorStatus& s, const std::string& jobmanager) {
  std::string reason;
  if (!s.registered) {
    reason = fmt::format("not registered with a JobManager{}: {} registration attempt(s) failed since the last success",
                         jobmanager.empty() ? std::string() : fmt::format(" (registering at {})", jobmanager),
                         s.failed_attempts);
  }
  HealthResponse h;
  h.healthy = s.registered;
  h.json = Value::object({{"healthy", Value(s.registered)},
                          {"reason", Value(reason)},
                          {"jobmanager", Value(jobmanager)},
                          {"registration-id", Value(s.registration_id)},
                          {"jobmanager-id", Value(s.jobmanager_id)},
                          {"registrations", Value(s.registrations)},
                          {"jobmanager-losses", Value(s.jobmanager_losses)},
                          {"failed-attempts", Value(s.failed_attempts)},
                          {"deployed-attempt", Value(s.deployed_attempt)},
                          {"running-tasks", Value(s.running_tasks)}})
               .to_json();
  return h;
}

std::string taskmanager_metrics(const TaskExecutorStatus& s, int slots, const std::string& resource_id) {
  // The resource id is "host:port-<random>": no quote or backslash to escape in a label value.
  const std::string l = fmt::format("{{taskmanager_id=\"{}\"}}", resource_id);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, l, v);
  };
  metric("sluice_taskmanager_registered", "gauge", "1 while registered with a JobManager", s.registered ? 1 : 0);
  metric("sluice_taskmanager_slots", "gauge", "Task slots this TaskManager offers", slots);
  metric("sluice_taskmanager_running_tasks", "gauge", "Tasks of the deployed attempt that run",
         static_cast<int64_t>(s.running_tasks));
  metric("sluice_taskmanager_registrations_total", "counter", "Successful registrations", s.registrations);
  metric("sluice_taskmanager_jobmanager_losses_total", "counter", "Times the JobManager was declared lost",
         s.jobmanager_losses);
  metric("sluice_taskmanager_failed_registration_attempts", "gauge",
         "Failed registration attempts since the last success", s.failed_attempts);
  return out;
}

}  // namespace sluice::cli
