// The REST server's JSON of checkpoints (Flink's CheckpointingStatistics), exception history, errors and job
// details, and the reply helpers.
#include <fmt/format.h>

#include <algorithm>

#include "rest_server_internals.h"
#include "sluice/core/redact.h"

namespace sluice {

namespace {

/// Flink's names of checkpoint types.
const char* flink_checkpoint_type(const std::string& type) {
  if (type == "savepoint") return "SAVEPOINT";
  if (type == "stop-with-savepoint") return "SYNC_SAVEPOINT";
  return "CHECKPOINT";
}

}  // namespace

namespace rest_server_internal {

using Clock = std::chrono::system_clock;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

Value checkpoint_json(const CheckpointStats& s) {
  Value tasks = Value::array();
  for (const auto& t : s.tasks) {
    tasks.push_back(Value::object({{"task", t.task},
                                   {"alignment_duration_ns", t.alignment_ns},
                                   {"sync_duration_ns", t.sync_pause_ns},
                                   {"state_size", t.state_bytes}}));
  }
  const bool savepoint = s.type != "checkpoint";
  int64_t alignment_ns = 0;
  for (const auto& t : s.tasks)
    alignment_ns = std::max(alignment_ns, t.alignment_ns);
  const int64_t end = s.trigger_time_ms + s.duration_ms;
  return Value::object({{"className", s.completed ? ".CompletedCheckpointStatistics" : ".FailedCheckpointStatistics"},
                        {"id", s.checkpoint_id},
                        {"status", s.completed ? "COMPLETED" : "FAILED"},
                        {"is_savepoint", savepoint},
                        {"savepointFormat", savepoint ? Value("CANONICAL") : Value()},
                        {"checkpoint_type", flink_checkpoint_type(s.type)},
                        {"trigger_timestamp", s.trigger_time_ms},
                        {"latest_ack_timestamp", end},
                        {"end_to_end_duration", s.duration_ms},
                        {"state_size", s.state_bytes},
                        {"checkpointed_size", s.completed ? s.checkpointed_bytes : s.state_bytes},
                        {"alignment_buffered", 0},
                        {"processed_data", 0},
                        {"persisted_data", 0},
                        {"alignment_duration_max_ns", alignment_ns},
                        {"num_subtasks", static_cast<int64_t>(s.tasks.size())},
                        {"num_acknowledged_subtasks", static_cast<int64_t>(s.tasks.size())},
                        {"discarded", false},
                        {"external_path", s.completed ? Value(s.path) : Value()},
                        {"failure_timestamp", s.completed ? Value() : Value(end)},
                        {"failure_message", s.completed ? Value() : Value(s.failure)},
                        {"tasks", std::move(tasks)}});
}

/// One entry of Flink's exception history (JobExceptionsInfoWithHistory.ExceptionInfo), plus the message alone;
/// redacted as failure causes are.
Value exception_json(const JobExceptionInfo& e, const std::string& hostname) {
  const bool task = !e.task_name.empty();
  return Value::object({{"exceptionName", e.exception_name},
                        {"message", redact_secrets(e.message)},
                        {"stacktrace", redact_secrets(e.stacktrace)},
                        {"timestamp", e.timestamp_ms},
                        {"taskName", task ? Value(e.task_name) : Value()},
                        {"endpoint", task ? Value(hostname) : Value()},
                        {"location", task ? Value(hostname) : Value()},
                        {"taskManagerId", task ? Value("local") : Value()},
                        {"failureLabels", Value::object()},
                        {"restarted", e.restarted},
                        {"concurrentExceptions", Value::array()}});
}

/// The latest failure and the restart count, for the job list and details ("last-failure" is null when none).
void add_failure_summary(Value& v, const JobClient& client) {
  const std::vector<JobExceptionInfo> ex = client.exceptions();
  v.set("last-failure",
        ex.empty() ? Value()
                   : Value::object({{"exceptionName", ex[0].exception_name},
                                    {"message", redact_secrets(ex[0].message)},
                                    {"timestamp", ex[0].timestamp_ms},
                                    {"taskName", ex[0].task_name.empty() ? Value() : Value(ex[0].task_name)}}));
}

// Redacted once more here: a failure cause is shown to every client of the API, and a connector's message may
// quote a connection string.
Value error_json(const Error& e) {
  return Value::object({{"class", error_code_name(e.code())},
                        {"message", redact_secrets(e.message())},
                        {"stack-trace", redact_secrets(e.to_string())}});
}

void reply(httplib::Response& res, int status, const Value& body) {
  res.status = status;
  res.set_content(body.to_json(), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, Value::object({{"errors", Value::array({Value(message)})}}));
}

}  // namespace rest_server_internal

web::JobSnapshot RestServer::Impl::snapshot(JobEntry& job) {
  web::JobSnapshot s;
  s.name = job.name;
  s.job_id = job.client.job_id();
  s.status = job.client.status();
  s.start_time_ms = job.start_time_ms;
  s.restarts = job.client.restarts();
  std::function<std::vector<RestSubtaskLocation>()> locations;
  {
    std::lock_guard lock(mu_);
    s.plan = job.plan;
    locations = job.locations;
  }
  if (locations) {
    for (const auto& l : locations())
      s.locations.push_back(web::SubtaskPlace{l.vertex_id, l.subtask, l.task_manager_id, l.address, l.slot, l.attempt,
                                              l.execution_state});
  }
  s.subtasks = job.client.subtask_metrics();
  s.hostname = hostname_;
  if (job_status_terminal(s.status)) {
    JobResult r = job.client.wait();  // returns at once: the job has ended
    s.end_time_ms = job.start_time_ms + r.duration.count();
    s.restarts = r.restarts;
    s.final_operators = r.operators;
  }
  return s;
}

Value RestServer::Impl::job_details(JobEntry& job) {
  const web::JobSnapshot snap = snapshot(job);
  Value v = web::job_details_json(snap, now_ms());
  v.set("restarts", snap.restarts);
  if (job_status_terminal(snap.status)) {
    JobResult r = job.client.wait();  // returns at once: the job has ended
    if (r.error) v.set("failure-cause", error_json(*r.error));
  }
  add_failure_summary(v, job.client);
  if (job.status_message) v.set("status-message", job.status_message());
  return v;
}

Value RestServer::Impl::checkpoints_json(const std::vector<CheckpointStats>& stats) {
  int64_t completed = 0;
  int64_t failed = 0;
  const CheckpointStats* latest_completed = nullptr;
  const CheckpointStats* latest_savepoint = nullptr;
  const CheckpointStats* latest_failed = nullptr;
  Value history = Value::array();
  for (auto it = stats.rbegin(); it != stats.rend(); ++it) {  // newest first, as Flink
    const CheckpointStats& s = *it;
    if (s.completed) {
      ++completed;
      if (!latest_completed) latest_completed = &s;
      if (!latest_savepoint && s.type != "checkpoint") latest_savepoint = &s;
    } else {
      ++failed;
      if (!latest_failed) latest_failed = &s;
    }
    history.push_back(checkpoint_json(s));
  }
  auto or_null = [](const CheckpointStats* s) { return s ? checkpoint_json(*s) : Value(); };
  // Flink's summary: min/max/avg (and percentiles) of the completed checkpoints in the history.
  auto summary = [&](auto field) {
    std::vector<double> values;
    for (const auto& s : stats) {
      if (s.completed) values.push_back(static_cast<double>(field(s)));
    }
    if (values.empty()) {
      return Value::object(
          {{"min", 0}, {"max", 0}, {"avg", 0}, {"p50", 0}, {"p90", 0}, {"p95", 0}, {"p99", 0}, {"p999", 0}});
    }
    std::sort(values.begin(), values.end());
    double sum = 0;
    for (double v : values)
      sum += v;
    auto pct = [&](double p) {
      const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * static_cast<double>(values.size())));
      return static_cast<int64_t>(values[i]);
    };
    return Value::object({{"min", static_cast<int64_t>(values.front())},
                          {"max", static_cast<int64_t>(values.back())},
                          {"avg", static_cast<int64_t>(sum / static_cast<double>(values.size()))},
                          {"p50", pct(0.5)},
                          {"p90", pct(0.9)},
                          {"p95", pct(0.95)},
                          {"p99", pct(0.99)},
                          {"p999", pct(0.999)}});
  };
  auto size = [](const CheckpointStats& s) { return s.state_bytes; };
  auto duration = [](const CheckpointStats& s) { return s.duration_ms; };
  return Value::object({{"counts", Value::object({{"restored", 0},
                                                  {"total", completed + failed},
                                                  {"in_progress", 0},
                                                  {"completed", completed},
                                                  {"failed", failed}})},
                        {"summary", Value::object({{"checkpointed_size", summary(size)},
                                                   {"state_size", summary(size)},
                                                   {"end_to_end_duration", summary(duration)}})},
                        {"latest", Value::object({{"completed", or_null(latest_completed)},
                                                  {"savepoint", or_null(latest_savepoint)},
                                                  {"failed", or_null(latest_failed)},
                                                  {"restored", Value()}})},
                        {"history", std::move(history)}});
}

}  // namespace sluice
