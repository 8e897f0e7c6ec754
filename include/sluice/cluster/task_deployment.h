// Building the tasks of a job's subtasks from the job graph: the part of deployment that local mode (LocalJob)
// and cluster mode (a TaskManager's DeployedJob) share. It creates one Task per subtask to deploy, their
// operators (matched to the stream graph by node, so no code travels), chained outputs, network outputs and
// input processors. Channels come from the caller: local mode makes a LocalChannel for every channel; a
// TaskManager makes a LocalChannel when both ends run in it, the TCP data plane's RemoteChannelSender /
// RemoteInputChannel when only one does, and nothing when neither does.
//
// Threading: called by the one thread that deploys (the job master, a TaskManager's RPC handler); the tasks are
// returned unstarted.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"
#include "sluice/runtime/channel.h"
#include "sluice/runtime/task.h"

namespace sluice {

class SourceCoordinatorBase;
struct TaskRestore;

/// The consumer subtasks each producer subtask of a job edge feeds: targets[producer] (all consumers for an
/// all-to-all edge, Flink's POINTWISE spread for forward/rescale).
struct EdgeChannelPlan {
  std::vector<std::vector<int>> targets;
};

/// The channel plan of every job edge (indexed by job edge id), and the number of channels in total.
std::vector<EdgeChannelPlan> plan_channels(const JobGraph& jg, size_t* channel_count = nullptr);

/// The ends of one channel in this process: `sender` when the producer subtask is deployed here, `receiver`
/// when the consumer is (both for a LocalChannel). The caller owns the objects behind them.
struct ChannelEnds {
  ChannelSender* sender = nullptr;
  ChannelReceiver* receiver = nullptr;
};

struct SubtaskDeployment {
  const StreamGraph* graph = nullptr;
  const JobGraph* jg = nullptr;
  const std::vector<EdgeChannelPlan>* plan = nullptr;
  /// The vertices whose subtasks may be deployed (a failover region, or every vertex).
  std::vector<int> vertices;
  /// Whether subtask (vertex, index) is deployed here; empty = every subtask of `vertices`.
  std::function<bool(int vertex, int subtask)> here;
  /// Makes the channel `producer` -> `consumer` of job edge `edge` (called for every channel with at least one
  /// end here, edge by edge, producer by producer, consumer by consumer: the order of the gates' channels).
  std::function<Result<ChannelEnds>(const JobEdge& edge, int producer, int consumer)> make_channel;
  /// Source coordinators by stream node id (a source node without one gets nullptr).
  const std::map<int, std::shared_ptr<SourceCoordinatorBase>>* coordinators = nullptr;
  /// Per vertex, per subtask: the state to restore; null = fresh start.
  const std::vector<std::vector<std::shared_ptr<const TaskRestore>>>* restores = nullptr;
  /// Instead of `restores`: reads the state of subtask (vertex, index) on that task's thread as it initialises
  /// (Task::Options::restore_loader); null = fresh start.
  std::function<Result<std::shared_ptr<const TaskRestore>>(int vertex, int subtask)> restore_loader;
  int attempt = 0;
  const Clock* clock = nullptr;
  const TaskLease* lease = nullptr;  ///< a TaskManager's lease on its registration (cluster mode), or null
  int64_t buffer_timeout_ms = 100;
  bool checkpointing = false;
  TaskListener* listener = nullptr;
};

/// The unstarted tasks of a deployment and their operators ((stream node id, operator), for counters).
struct DeployedSubtasks {
  std::vector<std::unique_ptr<Task>> tasks;
  std::vector<std::pair<int, StreamOperatorBase*>> operators;
};

/// Builds the tasks. Errors: what make_channel returns; SluiceException from operator factories propagates.
Result<DeployedSubtasks> build_subtasks(const SubtaskDeployment& d);

}  // namespace sluice
