#include "sluice/cluster/taskmanager/deployed_tasks.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/checkpoint/deferred_state_assignment.h"
#include "sluice/checkpoint/state_assignment.h"
#include "sluice/cluster/task_metrics.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/config.h"
#include "sluice/operators/source_operator.h"

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
  d->jg_ = &jg;
  d->pool_ = &pool;
  auto here = [&](int vertex, int subtask) {
    return spec.peer_of[static_cast<size_t>(vertex)][static_cast<size_t>(subtask)] == spec.self;
  };

  // The restored checkpoint: only `_metadata` is read here (the enumerators' state is in it). The subtasks' state
  // is assigned and read by each task as it initialises (Flink's INITIALIZING), on its own thread: hundreds of MiB
  // from S3 take seconds, longer than a deployment call may, and a failed read fails the task like any other
  // failure. This TaskManager assigns its own subtasks' state only.
  std::optional<CheckpointMetadata> restore;
  std::shared_ptr<DeferredStateAssignment> assignment;
  if (!spec.restore_dir.empty()) {
    auto meta = FileCheckpointStorage::load_metadata(spec.restore_dir);
    if (!meta.ok()) return meta.error().with_context("restoring the tasks of attempt " + std::to_string(spec.attempt));
    std::vector<VertexToRestore> vertices(jg.vertices.size());
    for (const auto& v : jg.vertices) {
      VertexToRestore& vr = vertices[static_cast<size_t>(v.id)];
      vr.parallelism = v.parallelism;
      for (int nid : v.chained_nodes) {
        vr.operator_uids.push_back(jg.node_uid[static_cast<size_t>(nid)]);
        vr.max_parallelism.push_back(jg.node_max_parallelism[static_cast<size_t>(nid)]);
      }
      vr.subtasks.resize(static_cast<size_t>(v.parallelism));
      for (int i = 0; i < v.parallelism; ++i)
        vr.subtasks[static_cast<size_t>(i)] = here(v.id, i);
    }
    assignment =
        std::make_shared<DeferredStateAssignment>(*meta, spec.restore_dir, std::move(vertices), spec.local_state);
    restore = std::move(*meta);
  }
  d->source_vertex_.assign(jg.vertices.size(), false);
  for (const auto& v : jg.vertices)
    d->source_vertex_[static_cast<size_t>(v.id)] = v.inputs.empty();

  // The split enumerators of the sources with a reader subtask here, every split assigned up front.
  std::vector<int> vertices;
  for (const auto& v : jg.vertices) {
    vertices.push_back(v.id);
    bool any_here = false;
    bool all_here = true;
    for (int i = 0; i < v.parallelism; ++i) {
      any_here = any_here || here(v.id, i);
      all_here = all_here && here(v.id, i);
    }
    if (!any_here) continue;
    for (int nid : v.chained_nodes) {
      const StreamNode& node = graph.node(nid);
      if (!node.factory->is_source()) continue;
      const std::string& uid = jg.node_uid[static_cast<size_t>(nid)];
      // Restored: the enumerator starts from the splits it had not assigned at the checkpoint, and every
      // TaskManager reads the same bytes, so the up-front assignment is the same in each.
      const std::string* state = nullptr;
      if (restore) {
        auto it = restore->coordinator_state.find(uid);
        if (it != restore->coordinator_state.end()) state = &it->second;
      }
      try {
        auto c = node.factory->create_coordinator(jg.node_parallelism[static_cast<size_t>(nid)], state);
        if (!c) continue;
        // Every reader here: the enumerator serves them as in local mode (splits on request or pushed, discovery
        // over time: Kafka and CDC sources work). Readers spread over TaskManagers: each process assigns the same
        // fixed split list up front.
        if (!all_here) SLUICE_RETURN_IF_ERROR(c->assign_splits_up_front(node.name));
        d->coordinators_[nid] = std::move(c);
        d->sources_[nid] = SourceInfo{uid, v.id, all_here};
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
      SLUICE_ASSIGN_OR_RETURN(auto buffers, pool.allocate(static_cast<size_t>(credits)));
      self->local_channels_.push_back(std::make_unique<LocalChannel>(pool, std::move(buffers)));
      return ChannelEnds{self->local_channels_.back().get(), self->local_channels_.back().get()};
    }
    const net::ChannelId id{e.id, producer, consumer, spec.attempt};
    if (pp == spec.self) {
      SLUICE_ASSIGN_OR_RETURN(auto s, connections.create_output_channel(spec.peers[static_cast<size_t>(cp)], id, pool,
                                                                        static_cast<size_t>(credits)));
      self->remote_senders_.push_back(std::move(s));
      return ChannelEnds{self->remote_senders_.back().get(), nullptr};
    }
    SLUICE_ASSIGN_OR_RETURN(auto r, connections.create_input_channel(spec.peers[static_cast<size_t>(pp)], id, pool,
                                                                     static_cast<size_t>(credits), nullptr));
    self->remote_inputs_.push_back(std::move(r));
    return ChannelEnds{nullptr, self->remote_inputs_.back().get()};
  };
  sd.coordinators = &d->coordinators_;
  sd.attempt = spec.attempt;
  sd.clock = &clock;
  sd.lease = spec.lease;
  sd.buffer_timeout_ms = config.get(options::kBufferTimeout);
  sd.checkpointing = spec.checkpointing;
  if (assignment) {
    sd.restore_loader = [assignment](int vertex, int subtask) { return assignment->subtask(vertex, subtask); };
  }
  sd.listener = d.get();
  try {
    SLUICE_ASSIGN_OR_RETURN(DeployedSubtasks built, build_subtasks(sd));
    d->tasks_ = std::move(built.tasks);
  } catch (const SluiceException& e) {
    return e.error();
  }
  for (auto& t : d->tasks_)
    t->start();
  return d;
}

void DeployedTasks::on_task_terminated(Task& task, TaskState state, const std::optional<Error>& error) {
  {
    std::lock_guard lock(mu_);
    exited_.insert(&task);
  }
  // The last task's end: every counter is final (the remote channels' are kept by the I/O thread, which still
  // runs, but a channel whose producer and consumer ended moves no more buffers).
  if (terminated_.fetch_add(1) + 1 == tasks_.size())
    spdlog::info("attempt {} ended: {}", attempt_, data_plane_summary());
  if (listener_.on_end) {
    SubtaskMetrics m;
    add_task_metrics(m, task, *jg_);
    m.running = false;
    listener_.on_end(
        TaskEnd{task.options().vertex_id, task.options().subtask_index, attempt_, state, error, std::move(m)});
  }
}

std::vector<SubtaskMetrics> DeployedTasks::task_metrics() const {
  std::vector<SubtaskMetrics> out(tasks_.size());
  for (size_t i = 0; i < tasks_.size(); ++i)
    add_task_metrics(out[i], *tasks_[i], *jg_);
  return out;
}

void DeployedTasks::on_checkpoint_snapshot(Task& task, TaskStateSnapshot&& snapshot) {
  if (listener_.on_snapshot) {
    listener_.on_snapshot(
        TaskEnd{task.options().vertex_id, task.options().subtask_index, attempt_, TaskState::kRunning, std::nullopt},
        task.display_name(), std::move(snapshot));
  }
}

void DeployedTasks::on_end_of_input(Task& task) {
  {
    std::lock_guard lock(mu_);
    end_of_input_.insert(&task);
  }
  if (listener_.on_end_of_input) {
    listener_.on_end_of_input(
        TaskEnd{task.options().vertex_id, task.options().subtask_index, attempt_, TaskState::kRunning, std::nullopt});
  }
}

std::map<std::string, std::string> DeployedTasks::trigger_checkpoint(const CheckpointBarrier& barrier) {
  std::map<std::string, std::string> states;
  std::set<int> by_coordinator;
  for (auto& [nid, c] : coordinators_) {
    const SourceInfo& info = sources_.at(nid);
    by_coordinator.insert(info.vertex);
    std::string bytes = c->checkpoint(barrier.checkpoint_id, [&] {
      std::lock_guard lock(mu_);
      for (auto& t : tasks_) {
        if (t->options().vertex_id == info.vertex && exited_.count(t.get()) == 0) t->trigger_checkpoint(barrier);
      }
    });
    // An enumerator whose readers span TaskManagers has only this process's view: the JobManager refuses to
    // checkpoint such a job (job_master.cc), so only complete states are returned.
    if (info.all_here) states[info.uid] = std::move(bytes);
  }
  std::lock_guard lock(mu_);
  for (auto& t : tasks_) {
    if (exited_.count(t.get()) != 0) continue;
    const int v = t->options().vertex_id;
    const bool source_without_coordinator = source_vertex_[static_cast<size_t>(v)] && by_coordinator.count(v) == 0;
    if (source_without_coordinator || end_of_input_.count(t.get()) != 0) t->trigger_checkpoint(barrier);
  }
  return states;
}

bool DeployedTasks::trigger_task(int vertex, int subtask, const CheckpointBarrier& barrier) {
  std::lock_guard lock(mu_);
  for (auto& t : tasks_) {
    if (t->options().vertex_id == vertex && t->options().subtask_index == subtask && exited_.count(t.get()) == 0) {
      t->trigger_checkpoint(barrier);
      return true;
    }
  }
  return false;
}

void DeployedTasks::notify_checkpoint_complete(int64_t checkpoint_id) {
  std::lock_guard lock(mu_);
  for (auto& t : tasks_) {
    if (exited_.count(t.get()) == 0) t->notify_checkpoint_complete(checkpoint_id);
  }
}

void DeployedTasks::notify_checkpoint_aborted(int64_t checkpoint_id) {
  std::lock_guard lock(mu_);
  for (auto& t : tasks_) {
    if (exited_.count(t.get()) == 0) t->notify_checkpoint_aborted(checkpoint_id);
  }
}

std::string DeployedTasks::data_plane_summary() const {
  std::string out =
      fmt::format("network buffers: pool of {} x {} bytes, {} allocated, peak in flight {}", pool_->max_buffers(),
                  pool_->segment_size(), pool_->allocated(), pool_->peak_in_flight());
  net::RemoteChannelSender::Stats out_total;
  for (const auto& s : remote_senders_) {
    const auto st = s->stats();
    out_total.credit_received += st.credit_received;
    out_total.buffers_sent += st.buffers_sent;
    out_total.buffers += st.buffers;
  }
  out += fmt::format("; remote output channels {}: {} own buffers, credit received {}, buffers sent {}",
                     remote_senders_.size(), out_total.buffers, out_total.credit_received, out_total.buffers_sent);
  int64_t announced = 0;
  int64_t received = 0;
  int64_t peak_held = 0;
  int64_t exclusive = 0;
  for (const auto& r : remote_inputs_) {
    const auto st = r->stats();
    announced += st.credit_announced;
    received += st.buffers_received;
    peak_held = std::max(peak_held, st.peak_held);
    exclusive += st.exclusive;
  }
  out += fmt::format(
      "; remote input channels {}: {} exclusive buffers, credit announced {}, buffers received {}, peak held by one "
      "channel {}",
      remote_inputs_.size(), exclusive, announced, received, peak_held);
  for (const auto& t : tasks_) {
    const TaskIoMetrics& m = t->io_metrics();
    const int64_t start = m.start_ns.load(std::memory_order_relaxed);
    const int64_t end = m.end_ns.load(std::memory_order_relaxed);
    out += fmt::format("; task '{}' ({}/{}) backpressured {} ms of {} ms", t->options().vertex_name,
                       t->options().subtask_index + 1, t->options().parallelism,
                       m.backpressured_ns.load(std::memory_order_relaxed) / 1'000'000,
                       end > start && start > 0 ? (end - start) / 1'000'000 : 0);
  }
  return out;
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
