#include "sluice/cluster/taskmanager/deployed_tasks.h"

#include <fmt/format.h>

#include "sluice/api/source_operator.h"
#include "sluice/core/config.h"

namespace sluice {

namespace {

Status check_spec(const JobGraph& jg, const DeploymentSpec& spec) {
  if (spec.self < 0 || static_cast<size_t>(spec.self) >= spec.peers.size()) {
    return Error(ErrorCode::kGraph,
                 fmt::format("the placement names TaskManager {} of {} as this one", spec.self, spec.peers.size()));
  }
  if (spec.peer_of.size() != jg.vertices.size()) {
    return Error(ErrorCode::kGraph, fmt::format("the placement has {} vertices, this TaskManager's job graph {}",
                                                spec.peer_of.size(), jg.vertices.size()));
  }
  for (const auto& v : jg.vertices) {
    const auto& subtasks = spec.peer_of[static_cast<size_t>(v.id)];
    if (static_cast<int>(subtasks.size()) != v.parallelism) {
      return Error(ErrorCode::kGraph,
                   fmt::format("the placement has {} subtasks of vertex '{}', this TaskManager's job graph {}",
                               subtasks.size(), v.name, v.parallelism));
    }
    for (int p : subtasks) {
      if (p < 0 || static_cast<size_t>(p) >= spec.peers.size()) {
        return Error(ErrorCode::kGraph, fmt::format("the placement puts a subtask of vertex '{}' on TaskManager {} "
                                                    "of {}",
                                                    v.name, p, spec.peers.size()));
      }
    }
  }
  return ok_status();
}

}  // namespace

size_t DeployedTasks::buffers_needed(const JobGraph& jg, const DeploymentSpec& spec, int credits) {
  size_t ends = 0;
  const std::vector<EdgeChannelPlan> plan = plan_channels(jg);
  for (const auto& e : jg.edges) {
    const auto& targets = plan[static_cast<size_t>(e.id)].targets;
    for (size_t i = 0; i < targets.size(); ++i) {
      const bool producer_here = spec.peer_of[static_cast<size_t>(e.source_vertex)][i] == spec.self;
      for (int j : targets[i]) {
        const bool consumer_here =
            spec.peer_of[static_cast<size_t>(e.target_vertex)][static_cast<size_t>(j)] == spec.self;
        // A LocalChannel has one set of buffers; a channel with one end here has that end's buffers.
        if (producer_here || consumer_here) ++ends;
      }
    }
  }
  return ends * static_cast<size_t>(credits);
}

Result<std::unique_ptr<DeployedTasks>> DeployedTasks::deploy(const StreamGraph& graph, const JobGraph& jg,
                                                             const DeploymentSpec& spec,
                                                             net::ConnectionManager& connections,
                                                             NetworkBufferPool& pool, const Clock& clock,
                                                             Listener listener) {
  SLUICE_RETURN_IF_ERROR(check_spec(jg, spec));
  const Configuration& config = graph.config();
  const int credits = config.get(options::kBuffersPerChannel);
  std::unique_ptr<DeployedTasks> d(new DeployedTasks(spec.attempt, std::move(listener)));
  auto here = [&](int vertex, int subtask) {
    return spec.peer_of[static_cast<size_t>(vertex)][static_cast<size_t>(subtask)] == spec.self;
  };

  // The split enumerators of the sources with a reader subtask here, every split assigned up front.
  std::vector<int> vertices;
  for (const auto& v : jg.vertices) {
    vertices.push_back(v.id);
    bool any_here = false;
    for (int i = 0; i < v.parallelism; ++i)
      any_here = any_here || here(v.id, i);
    if (!any_here) continue;
    for (int nid : v.chained_nodes) {
      const StreamNode& node = graph.node(nid);
      if (!node.factory->is_source()) continue;
      try {
        auto c = node.factory->create_coordinator(jg.node_parallelism[static_cast<size_t>(nid)], nullptr);
        if (!c) continue;
        SLUICE_RETURN_IF_ERROR(c->assign_splits_up_front(node.name));
        d->coordinators_[nid] = std::move(c);
      } catch (const SluiceException& e) {
        return e.error().with_context(fmt::format("starting the split enumerator of '{}'", node.name));
      }
    }
  }

  const std::vector<EdgeChannelPlan> plan = plan_channels(jg);
  SubtaskDeployment sd;
  sd.graph = &graph;
  sd.jg = &jg;
  sd.plan = &plan;
  sd.vertices = std::move(vertices);
  sd.here = here;
  DeployedTasks* self = d.get();
  sd.make_channel = [&](const JobEdge& e, int producer, int consumer) -> Result<ChannelEnds> {
    const int pp = spec.peer_of[static_cast<size_t>(e.source_vertex)][static_cast<size_t>(producer)];
    const int cp = spec.peer_of[static_cast<size_t>(e.target_vertex)][static_cast<size_t>(consumer)];
    if (pp == spec.self && cp == spec.self) {
      auto buffers = pool.allocate(static_cast<size_t>(credits));
      if (!buffers.ok()) return buffers.error();
      self->local_channels_.push_back(std::make_unique<LocalChannel>(pool, std::move(*buffers)));
      return ChannelEnds{self->local_channels_.back().get(), self->local_channels_.back().get()};
    }
    const net::ChannelId id{e.id, producer, consumer, spec.attempt};
    if (pp == spec.self) {
      auto s = connections.create_output_channel(spec.peers[static_cast<size_t>(cp)], id, pool,
                                                 static_cast<size_t>(credits));
      if (!s.ok()) return s.error();
      self->remote_senders_.push_back(std::move(*s));
      return ChannelEnds{self->remote_senders_.back().get(), nullptr};
    }
    auto r = connections.create_input_channel(spec.peers[static_cast<size_t>(pp)], id, pool,
                                              static_cast<size_t>(credits), nullptr);
    if (!r.ok()) return r.error();
    self->remote_inputs_.push_back(std::move(*r));
    return ChannelEnds{nullptr, self->remote_inputs_.back().get()};
  };
  sd.coordinators = &d->coordinators_;
  sd.attempt = spec.attempt;
  sd.clock = &clock;
  sd.buffer_timeout_ms = config.get(options::kBufferTimeout);
  sd.checkpointing = false;  // checkpoints in cluster mode are refused before deployment (not built yet)
  sd.listener = d.get();
  try {
    Result<DeployedSubtasks> built = build_subtasks(sd);
    if (!built.ok()) return built.error();
    d->tasks_ = std::move(built->tasks);
  } catch (const SluiceException& e) {
    return e.error();
  }
  for (auto& t : d->tasks_)
    t->start();
  return d;
}

void DeployedTasks::on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) {
  terminated_.fetch_add(1);
  if (listener_) listener_(TaskEnd{task.options().vertex_id, task.options().subtask_index, attempt_, state, error});
}

void DeployedTasks::cancel() {
  for (auto& t : tasks_)
    t->cancel();
}

DeployedTasks::~DeployedTasks() {
  cancel();
  for (auto& t : tasks_)
    t->join();
  // The data plane's I/O thread notifies a remote channel's wakeup at any time: clear them before the tasks
  // that own the signals go.
  for (auto& s : remote_senders_)
    s->set_sender_wakeup(nullptr);
  for (auto& r : remote_inputs_)
    r->set_receiver_wakeup(nullptr);
  tasks_.clear();
  for (auto& [nid, c] : coordinators_)
    c->close();
}

}  // namespace sluice
