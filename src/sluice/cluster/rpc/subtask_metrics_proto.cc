#include "sluice/cluster/rpc/subtask_metrics_proto.h"

namespace sluice::rpc {

void to_proto(const SubtaskMetrics& m, cluster::v1::SubtaskMetricsStatus* out) {
  out->set_vertex_id(m.vertex_id);
  out->set_subtask_index(m.subtask_index);
  out->set_attempt(m.attempt);
  out->set_task_name(m.task_name);
  out->set_parallelism(m.parallelism);
  out->set_running(m.running);
  out->set_bytes_in(m.bytes_in);
  out->set_bytes_out(m.bytes_out);
  out->set_run_ns(m.run_ns);
  out->set_idle_ns(m.idle_ns);
  out->set_backpressured_ns(m.backpressured_ns);
  for (const OperatorSubtaskMetrics& op : m.operators) {
    cluster::v1::OperatorMetricsStatus* o = out->add_operators();
    o->set_name(op.name);
    o->set_uid(op.uid);
    o->set_records_in(op.records_in);
    o->set_records_out(op.records_out);
    o->set_network_output(op.network_output);
    o->set_input_watermark(op.input_watermark);
    o->set_output_watermark(op.output_watermark);
  }
}

SubtaskMetrics from_proto(const cluster::v1::SubtaskMetricsStatus& s) {
  SubtaskMetrics m;
  m.vertex_id = s.vertex_id();
  m.subtask_index = s.subtask_index();
  m.attempt = s.attempt();
  m.task_name = s.task_name();
  m.parallelism = s.parallelism();
  m.running = s.running();
  m.bytes_in = s.bytes_in();
  m.bytes_out = s.bytes_out();
  m.run_ns = s.run_ns();
  m.idle_ns = s.idle_ns();
  m.backpressured_ns = s.backpressured_ns();
  m.operators.reserve(static_cast<size_t>(s.operators_size()));
  for (const cluster::v1::OperatorMetricsStatus& o : s.operators()) {
    OperatorSubtaskMetrics op;
    op.name = o.name();
    op.uid = o.uid();
    op.records_in = o.records_in();
    op.records_out = o.records_out();
    op.network_output = o.network_output();
    op.input_watermark = o.input_watermark();
    op.output_watermark = o.output_watermark();
    m.operators.push_back(std::move(op));
  }
  return m;
}

}  // namespace sluice::rpc
