#include "sluice/web/job_views.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <utility>

namespace sluice::web {
namespace {

constexpr std::string_view kJobPrefix = "flink_jobmanager_job_";
constexpr std::string_view kTaskPrefix = "flink_taskmanager_job_task_";
constexpr std::string_view kOperatorPrefix = "flink_taskmanager_job_task_operator_";

const std::string* label(const metrics::Labels& labels, std::string_view name) {
  for (const auto& [k, v] : labels) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

double ns_to_ms(int64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

/// Flink's IOMetricsInfo of one subtask or a sum of them.
struct Io {
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
  uint64_t read_records = 0;
  uint64_t write_records = 0;
  double backpressured_ms = 0;
  double idle_ms = 0;
  double busy_ms = 0;

  void add(const SubtaskMetrics& m) {
    read_bytes += m.bytes_in;
    write_bytes += m.bytes_out;
    if (!m.operators.empty()) {
      read_records += m.operators.front().records_in;
      write_records += task_records_out(m);
    }
    backpressured_ms += ns_to_ms(m.backpressured_ns);
    idle_ms += ns_to_ms(m.idle_ns);
    busy_ms += ns_to_ms(std::max<int64_t>(0, m.run_ns - m.idle_ns - m.backpressured_ns));
  }
  Value json(bool complete) const {
    return Value::object({{"read-bytes", read_bytes},
                          {"read-bytes-complete", complete},
                          {"write-bytes", write_bytes},
                          {"write-bytes-complete", complete},
                          {"read-records", read_records},
                          {"read-records-complete", complete},
                          {"write-records", write_records},
                          {"write-records-complete", complete},
                          {"accumulated-backpressured-time", static_cast<int64_t>(backpressured_ms)},
                          {"accumulated-idle-time", static_cast<int64_t>(idle_ms)},
                          {"accumulated-busy-time", busy_ms}});
  }
};

/// The subtasks' metrics of `vertex`, by subtask index (null where a subtask has not been deployed yet).
std::vector<const SubtaskMetrics*> subtasks_of(const JobSnapshot& job, const JobPlanVertex& vertex) {
  std::vector<const SubtaskMetrics*> out(static_cast<size_t>(std::max(1, vertex.parallelism)), nullptr);
  for (const auto& m : job.subtasks) {
    if (m.vertex_id != vertex.index || m.subtask_index < 0) continue;
    if (static_cast<size_t>(m.subtask_index) >= out.size()) out.resize(static_cast<size_t>(m.subtask_index) + 1);
    out[static_cast<size_t>(m.subtask_index)] = &m;
  }
  return out;
}

/// Flink's aggregate state of a vertex from its subtasks' states (ExecutionJobVertex::getAggregateJobVertexState).
std::string vertex_state(const std::vector<std::string>& states) {
  auto any = [&](const char* s) { return std::find(states.begin(), states.end(), s) != states.end(); };
  if (any("FAILED")) return "FAILED";
  if (any("CANCELING")) return "CANCELING";
  if (any("CANCELED")) return "CANCELED";
  if (any("RUNNING")) return "RUNNING";
  if (!states.empty() &&
      std::all_of(states.begin(), states.end(), [](const std::string& s) { return s == "FINISHED"; })) {
    return "FINISHED";
  }
  if (any("DEPLOYING")) return "DEPLOYING";
  return "CREATED";
}

const std::vector<const char*> kExecutionStates = {"CREATED",     "SCHEDULED",   "DEPLOYING", "RUNNING",
                                                   "FINISHED",    "CANCELING",   "CANCELED",  "FAILED",
                                                   "RECONCILING", "INITIALIZING"};

Value state_counts(const std::vector<std::string>& states) {
  Value v = Value::object();
  for (const char* s : kExecutionStates)
    v.set(s, static_cast<int64_t>(std::count(states.begin(), states.end(), s)));
  return v;
}

std::vector<std::string> states_of(const JobSnapshot& job, const JobPlanVertex& vertex,
                                   const std::vector<const SubtaskMetrics*>& subtasks) {
  std::vector<std::string> states;
  states.reserve(subtasks.size());
  for (size_t i = 0; i < subtasks.size(); ++i)
    states.push_back(subtask_state(job, vertex.index, static_cast<int>(i), subtasks[i]));
  return states;
}

/// The value of task metric `name` of subtask `subtask` of the task `task_name` in `samples`, or NaN.
double task_sample(const std::vector<metrics::MetricSample>& samples, const std::string& job_id,
                   const std::string& task_name, int subtask, std::string_view name) {
  const std::string idx = std::to_string(subtask);
  for (const auto& s : samples) {
    if (!starts_with(s.name, kTaskPrefix) || std::string_view(s.name).substr(kTaskPrefix.size()) != name) continue;
    const std::string* j = label(s.labels, "job_id");
    const std::string* t = label(s.labels, "task_name");
    const std::string* i = label(s.labels, "subtask_index");
    if (j && *j == job_id && t && *t == task_name && i && *i == idx && !label(s.labels, "operator_name")) {
      return s.value;
    }
  }
  return std::nan("");
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == std::floor(v) && std::abs(v) < 9.2e18) return std::to_string(static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    while (!item.empty() && item.front() == ' ')
      item.erase(item.begin());
    while (!item.empty() && item.back() == ' ')
      item.pop_back();
    if (!item.empty()) out.push_back(std::move(item));
    start = end + 1;
  }
  return out;
}

}  // namespace

const char* backpressure_level(double ratio) {
  if (ratio <= 0.10) return "ok";
  if (ratio <= 0.5) return "low";
  return "high";
}

std::vector<JobPlanVertex> vertices_of(const JobSnapshot& job) {
  if (job.plan != nullptr && !job.plan->vertices.empty()) return job.plan->vertices;
  std::map<int, JobPlanVertex> by_index;
  for (const auto& m : job.subtasks) {
    JobPlanVertex& v = by_index[m.vertex_id];
    if (!v.name.empty()) continue;
    v.index = m.vertex_id;
    v.name = m.task_name;
    v.parallelism = m.parallelism;
    for (const auto& op : m.operators) {
      v.operator_names.push_back(op.name);
      v.operator_uids.push_back(op.uid);
    }
    v.id = job_vertex_id(v.operator_uids);
  }
  std::vector<JobPlanVertex> out;
  for (auto& [i, v] : by_index)
    out.push_back(std::move(v));
  return out;
}

const JobPlanVertex* find_vertex(const std::vector<JobPlanVertex>& vertices, const std::string& id) {
  for (const auto& v : vertices) {
    if (v.id == id || std::to_string(v.index) == id) return &v;
  }
  return nullptr;
}

std::string subtask_state(const SubtaskMetrics* m, JobStatus job) {
  if (m != nullptr && m->running) return "RUNNING";
  switch (job) {
    case JobStatus::kFinished:
      return "FINISHED";
    case JobStatus::kCanceled:
    case JobStatus::kSuspended:  // its tasks were cancelled; a new JobManager leader deploys them again
      return "CANCELED";
    case JobStatus::kFailed:
      return "FAILED";
    case JobStatus::kCreated:
      return "CREATED";
    case JobStatus::kRestarting:
    case JobStatus::kFailing:
      return m != nullptr ? "CANCELED" : "CREATED";
    case JobStatus::kRunning:
      // Not running in a running job: a bounded subtask that ended, or one not deployed yet.
      return m != nullptr && m->run_ns > 0 ? "FINISHED" : "DEPLOYING";
  }
  return "CREATED";
}

std::string subtask_state(const JobSnapshot& job, int vertex, int subtask, const SubtaskMetrics* m) {
  // A cluster's JobManager knows the execution state of what it deployed; counters that do not say "running" may be
  // a heartbeat sent while the task's thread starts, or a failed attempt's before the new one reports.
  if ((m == nullptr || !m->running) && job.status == JobStatus::kRunning) {
    for (const auto& l : job.locations) {
      if (l.vertex == vertex && l.subtask == subtask && !l.execution_state.empty()) return l.execution_state;
    }
  }
  return subtask_state(m, job.status);
}

Value job_overview_json(const JobSnapshot& job, int64_t now_ms) {
  const std::vector<JobPlanVertex> vertices = vertices_of(job);
  std::vector<std::string> all;
  for (const auto& v : vertices) {
    auto states = states_of(job, v, subtasks_of(job, v));
    all.insert(all.end(), states.begin(), states.end());
  }
  Value tasks = Value::object();
  for (const char* s : kExecutionStates) {
    std::string key = s;
    for (char& c : key)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    tasks.set(key, static_cast<int64_t>(std::count(all.begin(), all.end(), s)));
  }
  tasks.set("total", static_cast<int64_t>(all.size()));
  const int64_t end = job.end_time_ms;
  return Value::object({{"jid", job.job_id},
                        {"name", job.name},
                        {"state", job_status_name(job.status)},
                        {"start-time", job.start_time_ms},
                        {"end-time", end},
                        {"duration", (end >= 0 ? end : now_ms) - job.start_time_ms},
                        {"last-modification", end >= 0 ? end : job.start_time_ms},
                        {"tasks", std::move(tasks)}});
}

Value job_details_json(const JobSnapshot& job, int64_t now_ms) {
  const std::vector<JobPlanVertex> vertices = vertices_of(job);
  const bool ended = job.end_time_ms >= 0;
  const int64_t duration = (ended ? job.end_time_ms : now_ms) - job.start_time_ms;
  std::map<int, std::string> id_of_index;
  for (const auto& v : vertices)
    id_of_index[v.index] = v.id;

  Value vertex_list = Value::array();
  Value nodes = Value::array();
  std::vector<std::string> all_states;
  int max_parallelism = -1;
  for (const auto& v : vertices) {
    const auto subtasks = subtasks_of(job, v);
    const auto states = states_of(job, v, subtasks);
    all_states.insert(all_states.end(), states.begin(), states.end());
    Io io;
    // Each operator of the chain summed over the subtasks (not in Flink, whose vertices show their chain's
    // names only).
    std::vector<std::pair<uint64_t, uint64_t>> op_records(v.operator_names.size());
    for (const SubtaskMetrics* m : subtasks) {
      if (m == nullptr) continue;
      io.add(*m);
      for (size_t i = 0; i < m->operators.size() && i < op_records.size(); ++i) {
        op_records[i].first += m->operators[i].records_in;
        op_records[i].second += m->operators[i].records_out;
      }
    }
    Value operators = Value::array();
    for (size_t i = 0; i < v.operator_names.size(); ++i) {
      operators.push_back(Value::object({{"name", v.operator_names[i]},
                                         {"uid", i < v.operator_uids.size() ? v.operator_uids[i] : std::string()},
                                         {"read-records", op_records[i].first},
                                         {"write-records", op_records[i].second}}));
    }
    max_parallelism = std::max(max_parallelism, v.max_parallelism);
    vertex_list.push_back(Value::object({{"id", v.id},
                                         {"slotSharingGroupId", v.slot_sharing_group},
                                         {"name", v.name},
                                         {"maxParallelism", v.max_parallelism},
                                         {"parallelism", v.parallelism},
                                         {"status", vertex_state(states)},
                                         {"start-time", job.start_time_ms},
                                         {"end-time", job.end_time_ms},
                                         {"duration", duration},
                                         {"tasks", state_counts(states)},
                                         {"metrics", io.json(ended)},
                                         {"operators", std::move(operators)}}));
    Value inputs = Value::array();
    for (size_t i = 0; i < v.inputs.size(); ++i) {
      inputs.push_back(Value::object({{"num", static_cast<int64_t>(i)},
                                      {"id", id_of_index[v.inputs[i].vertex]},
                                      {"ship_strategy", v.inputs[i].ship_strategy},
                                      {"exchange", "pipelined_bounded"}}));
    }
    Value uids = Value::array();  // not in Flink: the web UI joins operator metrics on them
    for (const auto& u : v.operator_uids)
      uids.push_back(Value(u));
    Value node = Value::object({{"id", v.id},
                                {"parallelism", v.parallelism},
                                {"operator", ""},
                                {"operator_strategy", ""},
                                {"description", v.name},
                                {"operator_uids", std::move(uids)},
                                {"optimizer_properties", Value::object()}});
    if (!v.inputs.empty()) node.set("inputs", std::move(inputs));  // Flink omits "inputs" of sources
    nodes.push_back(std::move(node));
  }

  Value timestamps = Value::object();
  for (const char* s : {"INITIALIZING", "CREATED", "RUNNING", "FAILING", "FAILED", "CANCELLING", "CANCELED", "FINISHED",
                        "RESTARTING", "SUSPENDED", "RECONCILING"}) {
    timestamps.set(s, 0);
  }
  timestamps.set("INITIALIZING", job.start_time_ms);
  timestamps.set("CREATED", job.start_time_ms);
  if (job.status != JobStatus::kCreated) timestamps.set("RUNNING", job.start_time_ms);
  if (ended) timestamps.set(job_status_name(job.status), job.end_time_ms);

  return Value::object(
      {{"jid", job.job_id},
       {"name", job.name},
       {"isStoppable", false},
       {"state", job_status_name(job.status)},
       {"job-type", "STREAMING"},
       {"start-time", job.start_time_ms},
       {"end-time", job.end_time_ms},
       {"duration", duration},
       {"maxParallelism", max_parallelism},
       {"now", now_ms},
       {"timestamps", std::move(timestamps)},
       {"vertices", std::move(vertex_list)},
       {"status-counts", state_counts(all_states)},
       {"plan",
        Value::object({{"jid", job.job_id}, {"name", job.name}, {"type", "STREAMING"}, {"nodes", std::move(nodes)}})}});
}

Value vertex_details_json(const JobSnapshot& job, const JobPlanVertex& vertex,
                          const std::vector<metrics::MetricSample>& samples, int64_t now_ms) {
  const bool ended = job.end_time_ms >= 0;
  const int64_t end = ended ? job.end_time_ms : -1;
  const auto subtasks = subtasks_of(job, vertex);
  Value list = Value::array();
  for (size_t i = 0; i < subtasks.size(); ++i) {
    const SubtaskMetrics* m = subtasks[i];
    Io io;
    if (m != nullptr) io.add(*m);
    Value metrics = io.json(ended);
    for (const char* name : {"backPressuredTimeMsPerSecond", "idleTimeMsPerSecond", "busyTimeMsPerSecond"}) {
      const double v = task_sample(samples, job.job_id, vertex.name, static_cast<int>(i), name);
      metrics.set(name, std::isnan(v) ? Value() : Value(v));
    }
    if (m != nullptr && !m->operators.empty()) {
      metrics.set("currentInputWatermark", m->operators.front().input_watermark);
      metrics.set("currentOutputWatermark", m->operators.back().output_watermark);
    }
    // In a cluster: the TaskManager and slot the subtask was deployed to; else this process.
    std::string tm = job.locations.empty() ? "local" : "";
    std::string host = job.locations.empty() ? job.hostname : "";
    Value slot;
    int attempt = m != nullptr ? m->attempt : 0;
    for (const auto& l : job.locations) {
      if (l.vertex != vertex.index || l.subtask != static_cast<int>(i)) continue;
      tm = l.task_manager_id;
      host = l.address;
      slot = Value(l.slot);
      if (m == nullptr) attempt = l.attempt;
    }
    list.push_back(Value::object({{"subtask", static_cast<int64_t>(i)},
                                  {"status", subtask_state(job, vertex.index, static_cast<int>(i), m)},
                                  {"attempt", attempt},
                                  {"endpoint", host},
                                  {"host", host},
                                  {"taskmanager-id", tm},
                                  {"slot", slot},
                                  {"start-time", job.start_time_ms},
                                  {"start_time", job.start_time_ms},
                                  {"end-time", end},
                                  {"duration", (ended ? end : now_ms) - job.start_time_ms},
                                  {"metrics", std::move(metrics)}}));
  }
  return Value::object({{"id", vertex.id},
                        {"name", vertex.name},
                        {"maxParallelism", vertex.max_parallelism},
                        {"parallelism", vertex.parallelism},
                        {"now", now_ms},
                        {"subtasks", std::move(list)}});
}

Value backpressure_json(const JobSnapshot& job, const JobPlanVertex& vertex,
                        const std::vector<metrics::MetricSample>& samples, int64_t now_ms) {
  const auto subtasks = subtasks_of(job, vertex);
  Value list = Value::array();
  double worst = 0;
  auto ratio = [](double ms_per_s) { return std::isnan(ms_per_s) ? 0.0 : std::clamp(ms_per_s / 1000.0, 0.0, 1.0); };
  for (size_t i = 0; i < subtasks.size(); ++i) {
    const int idx = static_cast<int>(i);
    const double bp = ratio(task_sample(samples, job.job_id, vertex.name, idx, "backPressuredTimeMsPerSecond"));
    const double idle = ratio(task_sample(samples, job.job_id, vertex.name, idx, "idleTimeMsPerSecond"));
    const double busy = ratio(task_sample(samples, job.job_id, vertex.name, idx, "busyTimeMsPerSecond"));
    worst = std::max(worst, bp);
    list.push_back(Value::object({{"subtask", static_cast<int64_t>(i)},
                                  {"attempt-number", subtasks[i] != nullptr ? subtasks[i]->attempt : 0},
                                  {"backpressure-level", backpressure_level(bp)},
                                  {"backpressureLevel", backpressure_level(bp)},
                                  {"ratio", bp},
                                  {"idleRatio", idle},
                                  {"busyRatio", busy}}));
  }
  return Value::object({{"status", "ok"},
                        {"backpressure-level", backpressure_level(worst)},
                        {"backpressureLevel", backpressure_level(worst)},
                        {"end-timestamp", now_ms},
                        {"subtasks", std::move(list)}});
}

std::vector<NamedMetric> job_metrics(const std::vector<metrics::MetricSample>& samples, const std::string& job_id) {
  std::vector<NamedMetric> out;
  for (const auto& s : samples) {
    if (s.type == metrics::MetricType::kHistogram || !starts_with(s.name, kJobPrefix)) continue;
    const std::string* j = label(s.labels, "job_id");
    if (j == nullptr || *j != job_id) continue;
    std::string id = s.name.substr(kJobPrefix.size());
    // Labels beyond the job's (a dead-letter stage, a sink) tell series of one metric apart: Flink would have
    // a group per value, named in the id.
    for (const auto& [k, v] : s.labels) {
      if (k != "job_id" && k != "job_name") id = v + "." + id;
    }
    out.push_back(NamedMetric{std::move(id), s.value});
  }
  return out;
}

std::vector<NamedMetric> vertex_metrics(const std::vector<metrics::MetricSample>& samples, const std::string& job_id,
                                        const JobPlanVertex& vertex) {
  std::vector<NamedMetric> out;
  for (const auto& s : samples) {
    if (s.type == metrics::MetricType::kHistogram) continue;
    const std::string* j = label(s.labels, "job_id");
    const std::string* t = label(s.labels, "task_name");
    const std::string* i = label(s.labels, "subtask_index");
    if (j == nullptr || *j != job_id || t == nullptr || *t != vertex.name || i == nullptr) continue;
    const std::string* op = label(s.labels, "operator_name");
    if (op != nullptr && starts_with(s.name, kOperatorPrefix)) {
      out.push_back(NamedMetric{*i + "." + *op + "." + s.name.substr(kOperatorPrefix.size()), s.value});
    } else if (op == nullptr && starts_with(s.name, kTaskPrefix)) {
      out.push_back(NamedMetric{*i + "." + s.name.substr(kTaskPrefix.size()), s.value});
    }
  }
  return out;
}

Value metrics_json(const std::vector<NamedMetric>& metrics, const std::optional<std::string>& get) {
  Value out = Value::array();
  if (!get) {
    std::set<std::string> seen;
    for (const auto& m : metrics) {
      if (seen.insert(m.id).second) out.push_back(Value::object({{"id", m.id}}));
    }
    return out;
  }
  for (const auto& id : split_list(*get)) {
    for (const auto& m : metrics) {
      if (m.id == id) {
        out.push_back(Value::object({{"id", m.id}, {"value", format_value(m.value)}}));
        break;
      }
    }
  }
  return out;
}

Value aggregated_metrics_json(const std::vector<NamedMetric>& vertex_metrics, const std::optional<std::string>& get,
                              const std::string& agg) {
  // "<subtask>.<rest>" -> rest: the values of every subtask.
  std::map<std::string, std::vector<double>> by_name;
  std::vector<std::string> order;
  for (const auto& m : vertex_metrics) {
    const size_t dot = m.id.find('.');
    if (dot == std::string::npos) continue;
    std::string name = m.id.substr(dot + 1);
    auto [it, fresh] = by_name.try_emplace(name);
    if (fresh) order.push_back(name);
    it->second.push_back(m.value);
  }
  Value out = Value::array();
  if (!get) {
    for (const auto& name : order)
      out.push_back(Value::object({{"id", name}}));
    return out;
  }
  std::vector<std::string> aggs = split_list(agg);
  if (aggs.empty()) aggs = {"min", "max", "avg", "sum", "skew"};
  for (const auto& name : split_list(*get)) {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second.empty()) continue;
    const auto& values = it->second;
    double min = std::numeric_limits<double>::infinity();
    double max = -min;
    double sum = 0;
    for (double v : values) {
      min = std::min(min, v);
      max = std::max(max, v);
      sum += v;
    }
    const double avg = sum / static_cast<double>(values.size());
    Value entry = Value::object({{"id", name}});
    for (const auto& a : aggs) {
      if (a == "min") entry.set("min", min);
      if (a == "max") entry.set("max", max);
      if (a == "avg") entry.set("avg", avg);
      if (a == "sum") entry.set("sum", sum);
      // Flink's skew: how far the largest value is above the average, in percent of the largest.
      if (a == "skew") entry.set("skew", max > 0 ? (max - avg) / max * 100.0 : 0.0);
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace sluice::web
