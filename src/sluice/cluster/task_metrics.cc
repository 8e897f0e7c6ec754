#include "sluice/cluster/task_metrics.h"

#include <chrono>

namespace sluice {

void add_task_metrics(SubtaskMetrics& m, const Task& t, const JobGraph& jg) {
  const Task::Options& o = t.options();
  m.vertex_id = o.vertex_id;
  m.task_name = o.vertex_name;
  m.subtask_index = o.subtask_index;
  m.parallelism = o.parallelism;
  m.attempt = o.attempt;
  if (m.operators.size() != t.operators().size()) {
    m.operators.resize(t.operators().size());
    for (size_t i = 0; i < m.operators.size(); ++i) {
      m.operators[i].name = t.operators()[i]->name();
      m.operators[i].uid = i < t.operator_uids().size() ? t.operator_uids()[i] : std::string();
    }
    // The task's operators are its vertex's chained nodes in order: mark those feeding a job edge.
    if (o.vertex_id >= 0 && static_cast<size_t>(o.vertex_id) < jg.vertices.size()) {
      const JobVertex& v = jg.vertices[static_cast<size_t>(o.vertex_id)];
      for (int je : v.outputs) {
        const int node = jg.edges[static_cast<size_t>(je)].source_node;
        for (size_t i = 0; i < v.chained_nodes.size() && i < m.operators.size(); ++i) {
          if (v.chained_nodes[i] == node) m.operators[i].network_output = true;
        }
      }
    }
  }
  const TaskIoMetrics& io = t.io_metrics();
  const int64_t start = io.start_ns.load(std::memory_order_relaxed);
  int64_t end = io.end_ns.load(std::memory_order_relaxed);
  m.running = start != 0 && end == 0;
  if (start != 0) {
    if (end == 0) {
      end = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
    }
    m.run_ns += end - start;
  }
  m.bytes_in += io.bytes_in.load(std::memory_order_relaxed);
  m.bytes_out += io.bytes_out.load(std::memory_order_relaxed);
  m.idle_ns += io.idle_ns.load(std::memory_order_relaxed);
  m.backpressured_ns += io.backpressured_ns.load(std::memory_order_relaxed);
  const auto& ops = t.operators();
  for (size_t i = 0; i < ops.size() && i < m.operators.size(); ++i) {
    m.operators[i].records_in += ops[i]->metrics().records_in.get();
    m.operators[i].records_out += ops[i]->metrics().records_out.get();
    if (i < io.input_watermarks.size()) {
      m.operators[i].input_watermark = io.input_watermarks[i].load(std::memory_order_relaxed);
      m.operators[i].output_watermark = io.output_watermarks[i].load(std::memory_order_relaxed);
    }
  }
}

}  // namespace sluice
