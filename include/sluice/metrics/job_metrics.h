// JobMetrics: a running job's metrics registered in a MetricRegistry under Flink's scopes and names, fed from
// the counters the runtime keeps anyway (operators' records in/out, tasks' TaskIoMetrics, the checkpoint
// coordinator), never from a second count.
//
//   flink_jobmanager_job_<name>{job_id,job_name}                                   numRestarts, checkpoints, ...
//   flink_taskmanager_job_task_<name>{job_id,job_name,task_name,subtask_index}     bytes, busy/idle/backpressure
//   flink_taskmanager_job_task_operator_<name>{...,operator_name,operator_id}      records, watermarks
//
// Scraping takes one snapshot of the job (JobClient::subtask_metrics: relaxed reads of single-writer counters,
// no task is paused) in a refresh hook; every gauge reads that snapshot. Subtasks appear on the first scrape
// after they were deployed.
//
// Thread-safety: all members are thread-safe. Lifecycle: the destructor removes the job's groups and hook;
// the JobClient may outlive it or not (it is kept by value).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "sluice/api/job.h"
#include "sluice/metrics/metric_registry.h"

namespace sluice::metrics {

class JobMetrics {
 public:
  /// Registers the job `client` named `job_name` in `registry` (which must outlive this).
  JobMetrics(MetricRegistry& registry, JobClient client, std::string job_name);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  /// The job's JobManager scope (flink_jobmanager_job_*): job-wide metrics a caller adds (a pipeline's
  /// connector gauges).
  MetricGroup& job_group() { return *jm_job_; }
  /// The TaskManager job scope (flink_taskmanager_job_*).
  MetricGroup& task_job_group() { return *tm_job_; }
  /// The operator scope of the operator named `operator_name` in subtask `subtask_index` of the task named
  /// `task_name` (flink_taskmanager_job_task_operator_*), for a connector's own metrics.
  MetricGroup& operator_group(const std::string& task_name, int subtask_index, const std::string& operator_name);
  /// Takes a snapshot now (what every scrape does first).
  void refresh();

 private:
  struct Slot;  // one subtask's latest snapshot, read by its gauges
  void register_subtask(const std::shared_ptr<Slot>& slot, const SubtaskMetrics& m);
  void register_job_metrics();

  MetricRegistry& registry_;
  JobClient client_;
  std::string job_name_;
  MetricGroup* jm_root_;
  MetricGroup* jm_job_;
  MetricGroup* tm_root_;
  MetricGroup* tm_job_;
  int hook_ = -1;

  std::mutex mu_;  // slots_ and the job-wide snapshot; never held while taking the registry's lock
  std::map<std::pair<int, int>, std::shared_ptr<Slot>> slots_;
  struct JobSnapshot;
  std::shared_ptr<JobSnapshot> job_;
};

}  // namespace sluice::metrics
