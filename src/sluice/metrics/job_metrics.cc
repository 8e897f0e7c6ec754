#include "sluice/metrics/job_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sluice::metrics {

// One subtask's latest snapshot; its gauges hold a shared_ptr to it.
struct JobMetrics::Slot {
  mutable std::mutex mu;
  SubtaskMetrics m;
  template <class F>
  double read(F&& f) const {
    std::lock_guard lock(mu);
    return static_cast<double>(f(m));
  }
};

struct JobMetrics::JobSnapshot {
  mutable std::mutex mu;
  int restarts = 0;
  CheckpointCounts counts;
  int64_t last_duration_ms = -1;
  uint64_t last_size = 0;
  int64_t last_completed_id = -1;
  int64_t last_completed_ms = -1;
  int64_t last_seen_id = 0;  // the newest history entry already put into the histogram
  Histogram* durations = nullptr;
  template <class F>
  double read(F&& f) const {
    std::lock_guard lock(mu);
    return static_cast<double>(f(*this));
  }
};

namespace {

// Busy, idle and backpressured time react within seconds, as the web UI's colouring needs.
constexpr int kTimeMeterSpanS = 5;

const std::string kMinWatermarkHelp = " (ms since the epoch; -9223372036854775808 before the first watermark).";

}  // namespace

JobMetrics::JobMetrics(MetricRegistry& registry, JobClient client, std::string job_name)
    : registry_(registry), client_(std::move(client)), job_name_(std::move(job_name)) {
  Labels job_labels{{"job_id", client_.job_id()}, {"job_name", job_name_}};
  jm_root_ = &registry_.root().add_group("jobmanager");
  jm_job_ = &jm_root_->add_group("job", job_labels);
  tm_root_ = &registry_.root().add_group("taskmanager");
  tm_job_ = &tm_root_->add_group("job", job_labels);
  job_ = std::make_shared<JobSnapshot>();
  register_job_metrics();
  hook_ = registry_.add_refresh_hook([this] { refresh(); });
}

JobMetrics::~JobMetrics() {
  registry_.remove_refresh_hook(hook_);
  jm_root_->remove_group(*jm_job_);
  tm_root_->remove_group(*tm_job_);
}

void JobMetrics::register_job_metrics() {
  auto j = job_;
  MetricGroup& g = *jm_job_;
  g.counter_function(
      "numRestarts", [j] { return j->read([](const JobSnapshot& s) { return s.restarts; }); },
      "Failover restarts of the job since it was submitted.");
  g.counter_function(
      "numberOfCompletedCheckpoints", [j] { return j->read([](const JobSnapshot& s) { return s.counts.completed; }); },
      "Checkpoints and savepoints completed since the job started.");
  g.counter_function(
      "numberOfFailedCheckpoints", [j] { return j->read([](const JobSnapshot& s) { return s.counts.failed; }); },
      "Checkpoints and savepoints that failed or were aborted since the job started.");
  g.counter_function(
      "totalNumberOfCheckpoints",
      [j] { return j->read([](const JobSnapshot& s) { return s.counts.completed + s.counts.failed; }); },
      "Checkpoints and savepoints that ended (completed or failed) since the job started.");
  g.gauge(
      "lastCheckpointDuration", [j] { return j->read([](const JobSnapshot& s) { return s.last_duration_ms; }); },
      "Trigger to completion of the last completed checkpoint, ms (-1 none yet).");
  g.gauge(
      "lastCheckpointSize", [j] { return j->read([](const JobSnapshot& s) { return s.last_size; }); },
      "State bytes written by the last completed checkpoint.");
  g.gauge(
      "lastCompletedCheckpointId", [j] { return j->read([](const JobSnapshot& s) { return s.last_completed_id; }); },
      "Id of the last completed checkpoint (-1 none yet).");
  g.gauge(
      "lastCheckpointCompletedTimestamp",
      [j] { return j->read([](const JobSnapshot& s) { return s.last_completed_ms; }); },
      "When the last checkpoint completed, ms since the epoch (-1 none yet; not in Flink: age alerts use it).");
  j->durations = &g.histogram("checkpointDuration", Histogram::exponential_bounds(10, 2, 14),
                              "Durations of completed checkpoints, ms.");
}

MetricGroup& JobMetrics::operator_group(const std::string& task_name, int subtask_index,
                                        const std::string& operator_name) {
  return tm_job_->add_group("task", {{"task_name", task_name}, {"subtask_index", std::to_string(subtask_index)}})
      .add_group("operator", {{"operator_name", operator_name}});
}

void JobMetrics::register_subtask(const std::shared_ptr<Slot>& slot, const SubtaskMetrics& m) {
  MetricGroup& task =
      tm_job_->add_group("task", {{"task_name", m.task_name}, {"subtask_index", std::to_string(m.subtask_index)}});
  auto rd = [slot](auto f) { return [slot, f] { return slot->read(f); }; };
  auto head_in = [](const SubtaskMetrics& s) { return s.operators.empty() ? 0 : s.operators.front().records_in; };
  auto tail_out = [](const SubtaskMetrics& s) { return task_records_out(s); };
  auto bytes_in = [](const SubtaskMetrics& s) { return s.bytes_in; };
  auto bytes_out = [](const SubtaskMetrics& s) { return s.bytes_out; };
  task.counter_function("numRecordsIn", rd(head_in), "Records the task received (its chain's head).");
  task.counter_function(
      "numRecordsOut", rd(tail_out),
      "Records the task emitted: out of its operators whose output leaves it (the chain's tail when none does).");
  task.meter("numRecordsInPerSecond", rd(head_in), "Records received per second (over 60 s).");
  task.meter("numRecordsOutPerSecond", rd(tail_out), "Records emitted per second (over 60 s).");
  task.counter_function("numBytesIn", rd(bytes_in), "Bytes of network buffers the task read.");
  task.counter_function("numBytesOut", rd(bytes_out), "Bytes of network buffers the task sent.");
  task.meter("numBytesInPerSecond", rd(bytes_in), "Network bytes read per second (over 60 s).");
  task.meter("numBytesOutPerSecond", rd(bytes_out), "Network bytes sent per second (over 60 s).");
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  // Meters over cumulative milliseconds give ms per second; the clamp absorbs sampling skew between the
  // task's counters and the scrape's clock.
  struct Clamped {
    std::shared_ptr<Meter> meter;
    double operator()() const { return std::clamp(meter->rate(), 0.0, 1000.0); }
  };
  auto time_meter = [&](const char* name, std::function<double()> count, const char* help) {
    auto meter = std::make_shared<Meter>(std::move(count), kTimeMeterSpanS);
    task.gauge(name, Clamped{meter}, help);
  };
  time_meter(
      "idleTimeMsPerSecond", [slot, ms] { return slot->read([&](const SubtaskMetrics& s) { return ms(s.idle_ns); }); },
      "Time per second the task waited for input, ms (over 5 s).");
  time_meter(
      "backPressuredTimeMsPerSecond",
      [slot, ms] { return slot->read([&](const SubtaskMetrics& s) { return ms(s.backpressured_ns); }); },
      "Time per second the task was blocked by backpressure (no credit on an output), ms (over 5 s).");
  time_meter(
      "busyTimeMsPerSecond",
      [slot, ms] {
        return slot->read([&](const SubtaskMetrics& s) {
          return ms(std::max<int64_t>(0, s.run_ns - s.idle_ns - s.backpressured_ns));
        });
      },
      "Time per second the task was neither idle nor backpressured, ms (over 5 s).");
  for (size_t i = 0; i < m.operators.size(); ++i) {
    Labels labels{{"operator_name", m.operators[i].name}};
    if (!m.operators[i].uid.empty()) labels.emplace_back("operator_id", m.operators[i].uid);
    MetricGroup& op = task.add_group("operator", std::move(labels));
    auto in = [i](const SubtaskMetrics& s) { return i < s.operators.size() ? s.operators[i].records_in : 0; };
    auto out = [i](const SubtaskMetrics& s) { return i < s.operators.size() ? s.operators[i].records_out : 0; };
    op.counter_function("numRecordsIn", rd(in), "Records the operator received.");
    op.counter_function("numRecordsOut", rd(out), "Records the operator emitted.");
    op.meter("numRecordsInPerSecond", rd(in), "Records received per second (over 60 s).");
    op.meter("numRecordsOutPerSecond", rd(out), "Records emitted per second (over 60 s).");
    op.gauge("currentInputWatermark", rd([i](const SubtaskMetrics& s) {
               return i < s.operators.size() ? s.operators[i].input_watermark : std::numeric_limits<int64_t>::min();
             }),
             "The last watermark the operator received" + kMinWatermarkHelp);
    op.gauge("currentOutputWatermark", rd([i](const SubtaskMetrics& s) {
               return i < s.operators.size() ? s.operators[i].output_watermark : std::numeric_limits<int64_t>::min();
             }),
             "The last watermark the operator passed on" + kMinWatermarkHelp);
  }
}

void JobMetrics::refresh() {
  std::vector<SubtaskMetrics> subtasks = client_.subtask_metrics();
  const int restarts = client_.restarts();
  const CheckpointCounts counts = client_.checkpoint_counts();
  const std::vector<CheckpointStats> history = client_.checkpoint_stats();
  std::lock_guard lock(mu_);
  {
    std::lock_guard jl(job_->mu);
    job_->restarts = restarts;
    job_->counts = counts;
    for (const auto& cp : history) {
      if (!cp.completed || cp.checkpoint_id <= job_->last_seen_id) continue;
      job_->last_seen_id = cp.checkpoint_id;
      job_->last_duration_ms = cp.duration_ms;
      job_->last_size = cp.state_bytes;
      job_->last_completed_id = cp.checkpoint_id;
      job_->last_completed_ms = cp.trigger_time_ms + cp.duration_ms;
      job_->durations->update(static_cast<double>(cp.duration_ms));
    }
  }
  for (auto& m : subtasks) {
    auto& slot = slots_[{m.vertex_id, m.subtask_index}];
    const bool fresh = slot == nullptr;
    if (fresh) slot = std::make_shared<Slot>();
    {
      std::lock_guard sl(slot->mu);
      slot->m = m;
    }
    if (fresh) register_subtask(slot, m);
  }
}

}  // namespace sluice::metrics
