// `sluice taskmanager --http-port N`: the TaskManager's /health and /metrics (Kubernetes probes and Prometheus
// scrapes; deploy/helm/sluice). Served by a MetricsServer (web/metrics_server.h) on its own thread; the providers
// read TaskExecutor::status(), which is thread-safe.
#pragma once

#include <string>

#include "sluice/cluster/taskmanager/task_executor.h"
#include "sluice/web/metrics_server.h"

namespace sluice::cli {

/// /health of a TaskManager: healthy (200) while it is registered with a JobManager; otherwise 503 with the reason
/// (registering, how many attempts failed). The JSON has the registration, its counters and the running tasks.
HealthResponse taskmanager_health(const TaskExecutorStatus& status, const std::string& jobmanager);

/// /metrics of a TaskManager in Prometheus' text format: registered, slots, running tasks, registrations,
/// JobManager losses and failed registration attempts.
std::string taskmanager_metrics(const TaskExecutorStatus& status, int slots, const std::string& resource_id);

}  // namespace sluice::cli
