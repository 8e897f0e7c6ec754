#include "sluice/cluster/task_deployment.h"

#include <fmt/format.h>

#include <string>
#include <unordered_map>

#include "sluice/core/assign_or_return.h"
#include "sluice/operators/source_operator.h"

namespace sluice {

std::vector<EdgeChannelPlan> plan_channels(const JobGraph& jg, size_t* channel_count) {
  std::vector<EdgeChannelPlan> plans(jg.edges.size());
  size_t count = 0;
  for (const auto& e : jg.edges) {
    const int ps = jg.vertices[static_cast<size_t>(e.source_vertex)].parallelism;
    const int pt = jg.vertices[static_cast<size_t>(e.target_vertex)].parallelism;
    auto& plan = plans[static_cast<size_t>(e.id)];
    plan.targets.resize(static_cast<size_t>(ps));
    for (int i = 0; i < ps; ++i) {
      if (is_pointwise(e.partitioner)) {
        plan.targets[static_cast<size_t>(i)] = pointwise_targets(ps, pt, i);
      } else {
        for (int j = 0; j < pt; ++j)
          plan.targets[static_cast<size_t>(i)].push_back(j);
      }
      count += plan.targets[static_cast<size_t>(i)].size();
    }
  }
  if (channel_count != nullptr) *channel_count = count;
  return plans;
}

Result<DeployedSubtasks> build_subtasks(const SubtaskDeployment& d) {
  const StreamGraph& graph = *d.graph;
  const JobGraph& jg = *d.jg;
  auto here = [&](int vertex, int subtask) { return !d.here || d.here(vertex, subtask); };
  DeployedSubtasks out;
  std::vector<bool> in_set(jg.vertices.size(), false);
  for (int vid : d.vertices)
    in_set[static_cast<size_t>(vid)] = true;

  // Tasks, vertex by vertex (null where the subtask runs elsewhere).
  std::vector<std::vector<Task*>> vertex_tasks(jg.vertices.size());
  for (int vid : d.vertices) {
    const JobVertex& v = jg.vertices[static_cast<size_t>(vid)];
    vertex_tasks[static_cast<size_t>(vid)].assign(static_cast<size_t>(v.parallelism), nullptr);
    for (int i = 0; i < v.parallelism; ++i) {
      if (!here(vid, i)) continue;
      Task::Options o;
      o.vertex_name = v.name;
      o.vertex_id = v.id;
      o.subtask_index = i;
      o.parallelism = v.parallelism;
      o.attempt = d.attempt;
      o.clock = d.clock;
      o.lease = d.lease;
      o.buffer_timeout_ms = d.buffer_timeout_ms;
      o.checkpointing_enabled = d.checkpointing;
      if (d.restores != nullptr) o.restore = (*d.restores)[static_cast<size_t>(vid)][static_cast<size_t>(i)];
      if (d.restore_loader) o.restore_loader = [load = d.restore_loader, vid, i] { return load(vid, i); };
      out.tasks.push_back(std::make_unique<Task>(o, *d.listener));
      vertex_tasks[static_cast<size_t>(vid)][static_cast<size_t>(i)] = out.tasks.back().get();
    }
  }

  // Channels and writers of the edges (every edge of a deployed vertex has both ends in the set: a failover
  // region is closed under edges, and cluster mode deploys every vertex).
  std::vector<std::vector<RecordWriter*>> writers(jg.edges.size());
  std::vector<std::vector<std::vector<std::vector<ChannelReceiver*>>>> receivers(jg.vertices.size());
  for (int vid : d.vertices) {
    receivers[static_cast<size_t>(vid)].assign(static_cast<size_t>(jg.vertices[static_cast<size_t>(vid)].parallelism),
                                               std::vector<std::vector<ChannelReceiver*>>(2));
  }
  for (const auto& e : jg.edges) {
    if (!in_set[static_cast<size_t>(e.source_vertex)]) continue;
    const auto& plan = (*d.plan)[static_cast<size_t>(e.id)];
    writers[static_cast<size_t>(e.id)].assign(plan.targets.size(), nullptr);
    const int input_index = graph.edge(e.stream_edge).input_index;
    for (size_t i = 0; i < plan.targets.size(); ++i) {
      const bool producer_here = here(e.source_vertex, static_cast<int>(i));
      std::vector<ChannelSender*> senders;
      for (int j : plan.targets[i]) {
        const bool consumer_here = here(e.target_vertex, j);
        if (!producer_here && !consumer_here) continue;
        SLUICE_ASSIGN_OR_RETURN(ChannelEnds ends, d.make_channel(e, static_cast<int>(i), j));
        if (producer_here) senders.push_back(ends.sender);
        if (consumer_here) {
          receivers[static_cast<size_t>(e.target_vertex)][static_cast<size_t>(j)][static_cast<size_t>(input_index)]
              .push_back(ends.receiver);
        }
      }
      if (producer_here) {
        writers[static_cast<size_t>(e.id)][i] =
            vertex_tasks[static_cast<size_t>(e.source_vertex)][i]->add_record_writer(std::move(senders));
      }
    }
  }

  // Operators, outputs and inputs per task.
  std::map<int, int> job_edge_of_stream_edge;
  for (const auto& e : jg.edges)
    job_edge_of_stream_edge[e.stream_edge] = e.id;
  for (int vid : d.vertices) {
    const JobVertex& v = jg.vertices[static_cast<size_t>(vid)];
    for (int i = 0; i < v.parallelism; ++i) {
      Task* task = vertex_tasks[static_cast<size_t>(v.id)][static_cast<size_t>(i)];
      if (task == nullptr) continue;
      std::map<int, StreamOperatorBase*> op_of_node;
      std::map<int, TaskRuntimeContext*> ctx_of_node;
      for (int nid : v.chained_nodes) {
        const StreamNode& node = graph.node(nid);
        SourceCoordinatorBase* coordinator = nullptr;
        if (d.coordinators != nullptr) {
          auto it = d.coordinators->find(nid);
          if (it != d.coordinators->end()) coordinator = it->second.get();
        }
        auto op = node.factory->create(coordinator);
        auto ctx = std::make_unique<TaskRuntimeContext>(
            node.name, i, v.parallelism, jg.node_max_parallelism[static_cast<size_t>(nid)], d.attempt, *d.clock);
        ctx->set_job_configuration(&graph.config());
        ctx_of_node[nid] = ctx.get();
        op_of_node[nid] = task->add_operator(std::move(op), std::move(ctx), jg.node_uid[static_cast<size_t>(nid)]);
        out.operators.emplace_back(nid, op_of_node[nid]);
      }
      // Outputs: tail first so chained targets exist; edges grouped by side-output tag.
      for (auto it = v.chained_nodes.rbegin(); it != v.chained_nodes.rend(); ++it) {
        const StreamNode& node = graph.node(*it);
        std::map<std::string, std::vector<std::pair<const StreamEdge*, OutputBase*>>> by_tag;
        for (int eid : node.out_edges) {
          const StreamEdge& se = graph.edge(eid);
          OutputBase* out = nullptr;
          if (jg.vertex_of_node[static_cast<size_t>(se.target)] == v.id) {
            out = task->own_output(se.ops->make_chaining_output(op_of_node.at(se.target)));
          } else {
            int je = job_edge_of_stream_edge.at(eid);
            RecordWriter* w = writers[static_cast<size_t>(je)][static_cast<size_t>(i)];
            out = task->own_output(se.ops->make_network_output(
                *w, se.partitioner, i, jg.node_max_parallelism[static_cast<size_t>(se.target)]));
          }
          by_tag[se.side_output_tag].push_back({&se, out});
        }
        std::unordered_map<std::string, OutputBase*> outputs;
        if (by_tag.find("") == by_tag.end() && node.output_ops != nullptr) {
          // Nothing reads the main output (only side outputs, or a dangling operator): drop its records.
          outputs[""] = task->own_output(node.output_ops->make_discarding_output());
        }
        for (auto& [tag, outs] : by_tag) {
          if (outs.size() == 1) {
            outputs[tag] = outs[0].second;
          } else {
            std::vector<OutputBase*> list;
            for (auto& p : outs)
              list.push_back(p.second);
            outputs[tag] = task->own_output(outs[0].first->ops->make_broadcasting_output(std::move(list)));
          }
        }
        op_of_node.at(*it)->setup(ctx_of_node.at(*it), task, std::move(outputs));
      }
      // One input processor per input index of the head (two for connect and joins).
      for (int input_index = 0; input_index < 2; ++input_index) {
        const JobEdge* first = nullptr;
        for (int je : v.inputs) {
          const JobEdge& e = jg.edges[static_cast<size_t>(je)];
          if (graph.edge(e.stream_edge).input_index == input_index) {
            first = &e;
            break;
          }
        }
        if (first == nullptr) continue;
        auto input =
            graph.edge(first->stream_edge).ops->make_record_input(op_of_node.at(v.chained_nodes[0]), input_index);
        task->add_input(receivers[static_cast<size_t>(v.id)][static_cast<size_t>(i)][static_cast<size_t>(input_index)],
                        std::move(input));
      }
    }
  }
  return out;
}

}  // namespace sluice
