// SubtaskMetricsStore (cluster/jobmanager/subtask_metrics_store.h): the JobManager's counts of its TaskManagers'
// tasks. Within an attempt the larger of each counter is kept (a heartbeat handled after the task's end changes
// nothing); a later attempt adds to the earlier ones (counts never go down over a restart); a late report of an
// older attempt is dropped; only the live attempt's running tasks are `running`; operators sum over subtasks. And
// the counters cross the wire unchanged (rpc/subtask_metrics_proto.h).
#include "sluice/cluster/jobmanager/subtask_metrics_store.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "sluice/cluster/rpc/subtask_metrics_proto.h"

namespace sluice {
namespace {

SubtaskMetrics report(int vertex, int subtask, int attempt, uint64_t in, uint64_t out, bool running) {
  SubtaskMetrics m;
  m.vertex_id = vertex;
  m.subtask_index = subtask;
  m.attempt = attempt;
  m.task_name = "Map -> Sink: out";
  m.parallelism = 2;
  m.running = running;
  m.bytes_in = in * 10;
  m.bytes_out = out * 10;
  m.run_ns = 1'000'000;
  m.operators = {OperatorSubtaskMetrics{"Map", "map", in, out, false, 5, 6},
                 OperatorSubtaskMetrics{"Sink: out", "sink", out, 0, false, 6, 7}};
  return m;
}

TEST(SubtaskMetricsStoreTest, AttemptsAddUpAndCountersNeverGoDown) {
  SubtaskMetricsStore store;
  store.record(report(1, 0, 0, 100, 90, true), false);
  store.record(report(1, 1, 0, 50, 50, true), false);
  store.record(report(1, 0, 0, 200, 190, true), false);
  std::vector<SubtaskMetrics> s = store.subtasks(0);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].operators[0].records_in, 200u);
  EXPECT_TRUE(s[0].running);
  // The end of subtask 0, then a heartbeat sent before it, handled after it: the end's counts stay, not running.
  store.record(report(1, 0, 0, 250, 240, false), true);
  store.record(report(1, 0, 0, 220, 210, true), false);
  s = store.subtasks(0);
  EXPECT_EQ(s[0].operators[0].records_in, 250u);
  EXPECT_EQ(s[0].operators[0].records_out, 240u);
  EXPECT_FALSE(s[0].running);
  // A restart: attempt 1 adds to attempt 0's counts; watermarks are the latest attempt's.
  SubtaskMetrics again = report(1, 0, 1, 30, 20, true);
  again.operators[0].input_watermark = 77;
  store.record(again, false);
  store.record(report(1, 0, 0, 999, 999, true), false);  // a late heartbeat of attempt 0: dropped
  s = store.subtasks(1);
  EXPECT_EQ(s[0].attempt, 1);
  EXPECT_EQ(s[0].operators[0].records_in, 280u);
  EXPECT_EQ(s[0].operators[1].records_in, 260u);
  EXPECT_EQ(s[0].bytes_in, 2800u);
  EXPECT_EQ(s[0].run_ns, 2'000'000);
  EXPECT_EQ(s[0].operators[0].input_watermark, 77);
  EXPECT_TRUE(s[0].running);
  EXPECT_FALSE(s[1].running) << "subtask 1 reported only attempt 0, which is not live";
  EXPECT_FALSE(store.subtasks(2)[0].running) << "attempt 1 is not live any more";
  // Operators: summed over subtasks and attempts, in vertex and chain order.
  const std::vector<OperatorStats> ops = store.operators();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].name, "Map");
  EXPECT_EQ(ops[0].uid, "map");
  EXPECT_EQ(ops[0].records_in, 280u + 50u);
  EXPECT_EQ(ops[0].records_out, 260u + 50u);
  EXPECT_EQ(ops[1].name, "Sink: out");
  EXPECT_EQ(ops[0].parallelism, 2);
}

TEST(SubtaskMetricsProtoTest, EveryFieldCrossesTheWire) {
  SubtaskMetrics m = report(3, 1, 4, 123, 45, true);
  m.idle_ns = 7;
  m.backpressured_ns = 8;
  m.operators[1].network_output = true;
  cluster::v1::SubtaskMetricsStatus p;
  rpc::to_proto(m, &p);
  // What one task adds to a heartbeat (the chain "Map -> Sink: out", counters in the hundreds).
  std::printf("wire size of one task with 2 chained operators: %zu bytes\n", p.ByteSizeLong());
  const SubtaskMetrics back = rpc::from_proto(p);
  EXPECT_EQ(back.vertex_id, 3);
  EXPECT_EQ(back.subtask_index, 1);
  EXPECT_EQ(back.attempt, 4);
  EXPECT_EQ(back.task_name, m.task_name);
  EXPECT_EQ(back.parallelism, 2);
  EXPECT_TRUE(back.running);
  EXPECT_EQ(back.bytes_in, m.bytes_in);
  EXPECT_EQ(back.bytes_out, m.bytes_out);
  EXPECT_EQ(back.run_ns, m.run_ns);
  EXPECT_EQ(back.idle_ns, 7);
  EXPECT_EQ(back.backpressured_ns, 8);
  ASSERT_EQ(back.operators.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.operators[i].name, m.operators[i].name);
    EXPECT_EQ(back.operators[i].uid, m.operators[i].uid);
    EXPECT_EQ(back.operators[i].records_in, m.operators[i].records_in);
    EXPECT_EQ(back.operators[i].records_out, m.operators[i].records_out);
    EXPECT_EQ(back.operators[i].network_output, m.operators[i].network_output);
    EXPECT_EQ(back.operators[i].input_watermark, m.operators[i].input_watermark);
    EXPECT_EQ(back.operators[i].output_watermark, m.operators[i].output_watermark);
  }
}

}  // namespace
}  // namespace sluice
