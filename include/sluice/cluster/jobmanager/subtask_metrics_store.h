// SubtaskMetricsStore: the JobManager's view of its job's task counters, from what the TaskManagers report (each
// heartbeat carries the counters of the tasks running there, each task's end its final ones): Flink's
// MetricStore behind the REST API's vertex and subtask metrics. Counters are cumulative within an attempt; a
// subtask's later attempt adds to what its earlier attempts counted (as local mode sums torn-down attempts), so
// counts never go down across restarts. A report of an attempt older than one already seen is dropped (a late
// heartbeat of a cancelled attempt).
//
// Thread-safety: every member is thread-safe (gRPC threads record, REST threads read).
#pragma once

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "sluice/api/job.h"

namespace sluice {

class SubtaskMetricsStore {
 public:
  /// Records a subtask's counters as reported; `final`: the task ended (its counters stop here).
  void record(const SubtaskMetrics& m, bool final);
  /// Every subtask seen, its counters summed over its attempts, watermarks of its latest attempt when that is
  /// `live_attempt` (else none yet); `running` only for a subtask of `live_attempt` whose task runs. In (vertex,
  /// subtask) order. `live_attempt` INT_MIN: the job ended (nothing runs, the last watermarks stay).
  std::vector<SubtaskMetrics> subtasks(int live_attempt) const;
  /// Per chained operator (vertex order, chain order): records in and out summed over subtasks and attempts.
  std::vector<OperatorStats> operators() const;

 private:
  struct Entry {
    SubtaskMetrics ended;  // sum over the attempts before `attempt`
    bool has_ended = false;
    SubtaskMetrics latest;  // the latest report of `attempt`
    int attempt = -1;
    bool final_seen = false;  // `attempt`'s task reported its end
  };
  static void add_counters(SubtaskMetrics& into, const SubtaskMetrics& m);

  mutable std::mutex mu_;
  std::map<std::pair<int, int>, Entry> entries_;  // by (vertex, subtask)
};

}  // namespace sluice
