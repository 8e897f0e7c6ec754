// The JSON answers of the REST API's job endpoints in the shapes of Flink's REST API (JobDetailsInfo,
// JobVertexDetailsInfo, JobVertexBackPressureInfo, MetricCollectionResponseBody, ...), built from one job's
// JobClient, its JobPlan and the samples of the server's metric registry. Pure functions: the caller takes the
// snapshots (subtask_metrics(), MetricRegistry::collect()) and passes them in; called on HTTP threads.
// Private to web/ (rest_server.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/api/job.h"
#include "sluice/core/value.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/web/job_plan.h"

namespace sluice::web {

/// Flink's thresholds of backpressure levels (JobVertexBackPressureHandler): a ratio of time backpressured up
/// to 0.10 is "ok", up to 0.5 "low", above it "high".
const char* backpressure_level(double ratio);

/// Where a subtask runs in a cluster (RestServer::serve_subtask_locations).
struct SubtaskPlace {
  int vertex = 0;  ///< JobPlanVertex::index
  int subtask = 0;
  std::string task_manager_id;
  std::string address;  ///< its RPC address ("" when no longer registered)
  int slot = 0;
  int attempt = 0;
  std::string execution_state;  ///< RestSubtaskLocation::execution_state
};

/// What the views read of one registered job, taken once per request.
struct JobSnapshot {
  std::string name;
  std::string job_id;
  JobStatus status = JobStatus::kCreated;
  int64_t start_time_ms = 0;
  int64_t end_time_ms = -1;  ///< -1 while it runs
  int restarts = 0;
  std::shared_ptr<const JobPlan> plan;         ///< null or without vertices: learnt from `subtasks`
  std::vector<SubtaskMetrics> subtasks;        ///< JobClient::subtask_metrics()
  std::vector<OperatorStats> final_operators;  ///< JobResult::operators once ended
  std::string hostname;                        ///< where the subtasks run (this process's host)
  std::vector<SubtaskPlace> locations;         ///< a cluster's placement; empty in local mode
};

/// The job's vertices: the plan's, or (a job registered without its graph) those its subtasks report,
/// without edges.
std::vector<JobPlanVertex> vertices_of(const JobSnapshot& job);

/// The vertex with this id (Flink's 32-hex id, or its index "0", "1", ... in the plan) or null.
const JobPlanVertex* find_vertex(const std::vector<JobPlanVertex>& vertices, const std::string& id);

/// Flink's execution state of one subtask ("RUNNING", "FINISHED", ...) from whether it runs and the job's state.
std::string subtask_state(const SubtaskMetrics* m, JobStatus job);

/// The same for subtask `subtask` of vertex `vertex` (JobPlanVertex::index) of `job`: in a cluster, whose
/// JobManager has no metrics of the TaskManagers' tasks (`m` null), the state its placement reports while the job
/// runs.
std::string subtask_state(const JobSnapshot& job, int vertex, int subtask, const SubtaskMetrics* m);

/// An entry of GET /jobs/overview (Flink's JobDetails).
Value job_overview_json(const JobSnapshot& job, int64_t now_ms);

/// GET /jobs/:id without the Sluice additions (restarts, failures) the server adds: Flink's JobDetailsInfo
/// with "vertices" (each with IO metrics and its chain's operators) and "plan" (nodes with their inputs).
Value job_details_json(const JobSnapshot& job, int64_t now_ms);

/// GET /jobs/:id/vertices/:vid (Flink's JobVertexDetailsInfo): one entry per subtask with its state, host and
/// IO metrics, plus its busy/idle/backpressured ms per second from `samples`.
Value vertex_details_json(const JobSnapshot& job, const JobPlanVertex& vertex,
                          const std::vector<metrics::MetricSample>& samples, int64_t now_ms);

/// GET /jobs/:id/vertices/:vid/backpressure (Flink's JobVertexBackPressureInfo) from each subtask's
/// backPressuredTimeMsPerSecond, idleTimeMsPerSecond and busyTimeMsPerSecond in `samples`.
Value backpressure_json(const JobSnapshot& job, const JobPlanVertex& vertex,
                        const std::vector<metrics::MetricSample>& samples, int64_t now_ms);

/// One metric as Flink's metric endpoints name it, with its value.
struct NamedMetric {
  std::string id;
  double value = 0;
};

/// The job-scope metrics of job `job_id` (flink_jobmanager_job_*: numRestarts, lastCheckpointDuration ...),
/// by their short names.
std::vector<NamedMetric> job_metrics(const std::vector<metrics::MetricSample>& samples, const std::string& job_id);

/// The metrics of `vertex`'s subtasks: "<subtask>.<name>" for task metrics and "<subtask>.<operator>.<name>"
/// for operator metrics, as Flink's GET /jobs/:id/vertices/:vid/metrics.
std::vector<NamedMetric> vertex_metrics(const std::vector<metrics::MetricSample>& samples, const std::string& job_id,
                                        const JobPlanVertex& vertex);

/// Flink's answer of a metrics endpoint: without `get`, [{"id"}] for every metric; with it, [{"id", "value"}]
/// for the requested ids that exist (values as strings, as Flink).
Value metrics_json(const std::vector<NamedMetric>& metrics, const std::optional<std::string>& get);

/// Flink's GET /jobs/:id/vertices/:vid/subtasks/metrics: each requested metric (by the name without the
/// subtask prefix) aggregated over the subtasks, [{"id", "min", "max", "avg", "sum", "skew"}] filtered by `agg`
/// ("min,max,avg,sum,skew"; all when empty). Without `get`, the list of ids.
Value aggregated_metrics_json(const std::vector<NamedMetric>& vertex_metrics, const std::optional<std::string>& get,
                              const std::string& agg);

}  // namespace sluice::web
