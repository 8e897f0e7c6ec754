// PipelineRunner: builds the job of a pipeline file (sources, transforms, sinks, dead letters, checkpoints),
// starts it with its lock on the checkpoint storage, waits for it and writes the run summary. Metrics, health
// and checkpoint discovery are in the other pipeline_runner_*.cc files (pipeline_runner_internals.h).
#include "sluice/pipeline/pipeline_runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "pipeline_internal.h"
#include "pipeline_runner_internals.h"
#include "sluice/api/stream_environment.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/dead_letter_counts.h"
#include "sluice/connectors/files.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/s3_client.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/metrics/prometheus_text.h"

namespace sluice::pipeline {

namespace pipeline_runner_internal {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string storage_path(const std::string& storage) {
  return storage.starts_with("file://") ? storage.substr(7) : storage;
}

}  // namespace pipeline_runner_internal

namespace {

// The local lock file standing for an s3:// storage: one run per storage on this machine (an object store has
// no lock; two machines sharing one storage must be kept apart by whoever deploys them).
fs::path s3_lock_path(const std::string& storage) {
  return fs::temp_directory_path() / fmt::format("sluice-s3-{:016x}.lock", std::hash<std::string>{}(storage));
}

// Dead letters per reason (bad_record.h's dead_letter_reason, a Postgres SQLSTATE, an OpenSearch error type):
// `deadLetters_numRecordsByReason{stage, [sink_name,] reason}`, a family of its own so that summing
// `deadLetters_numRecords` still counts each record once. The transform's two reasons are registered at once; a
// source's or sink's appear with their first record, added by a refresh hook before each collection.
template <class State>
void register_dead_letter_reasons(State& s, metrics::MetricGroup& job) {
  constexpr const char* kHelp = "Records sent to the dead-letter sink, per reason.";
  auto counters = s.counters;
  job.add_group("deadLetters", {{"stage", "transform"}, {"reason", std::string(dead_letter_reason::kExpression)}})
      .counter_function(
          "numRecordsByReason",
          [counters] {
            return static_cast<double>(counters->dead_letters.load() - counters->function_dead_letters.load());
          },
          kHelp);
  job.add_group("deadLetters", {{"stage", "transform"}, {"reason", std::string(dead_letter_reason::kFunction)}})
      .counter_function(
          "numRecordsByReason", [counters] { return static_cast<double>(counters->function_dead_letters.load()); },
          kHelp);
  struct File {
    metrics::Labels labels;  // stage (and sink_name)
    std::string path;
    std::map<std::string, int64_t> before;  // by reason, at the start of the run
    std::set<std::string> registered;       // the hook's only
  };
  auto files = std::make_shared<std::vector<File>>();
  if (!s.probe.dead_letter_path.empty()) {
    files->push_back(File{{{"stage", "source"}}, s.probe.dead_letter_path, s.source_dead_letters_before, {}});
  }
  for (const auto& d : s.sink_dead_letters)
    files->push_back(File{{{"stage", "sink"}, {"sink_name", d.sink}}, d.path, d.before_by_reason, {}});
  if (files->empty()) return;
  metrics::MetricGroup* group = &job;
  auto add_new_reasons = [files, group] {
    for (File& f : *files) {
      for (const auto& [reason, count] : dead_letters_appended_by_reason(f.path)) {
        auto b = f.before.find(reason);
        if (count - (b == f.before.end() ? 0 : b->second) <= 0 || !f.registered.insert(reason).second) continue;
        metrics::Labels labels = f.labels;
        labels.emplace_back("reason", reason);
        group->add_group("deadLetters", std::move(labels))
            .counter_function(
                "numRecordsByReason",
                [path = f.path, reason = reason, before = b == f.before.end() ? 0 : b->second] {
                  const auto now = dead_letters_appended_by_reason(path);
                  auto it = now.find(reason);
                  return static_cast<double>((it == now.end() ? 0 : it->second) - before);
                },
                kHelp);
      }
    }
  };
  add_new_reasons();
  // Hooks of one registry may run concurrently (two scrapes): the hook's state is guarded by its own mutex.
  auto mu = std::make_shared<std::mutex>();
  s.dead_letter_hook = s.registry.add_refresh_hook([mu, add_new_reasons] {
    std::lock_guard lock(*mu);
    add_new_reasons();
  });
}

// Registers the job's metrics (task, operator and job scope, metrics/job_metrics.h) and the pipeline's own:
// the source connector's metrics in the source operator's scope, dead letters per stage and sink in the job's.
// Registers `read`'s metrics in the scope of the operator of uid `uid`: its task is the one whose chain holds
// it. A connector counts over all its subtasks, so with parallelism above 1 the scope's subtask_index is "all".
void register_connector_metrics(metrics::JobMetrics& jm, const std::vector<SubtaskMetrics>& subtasks,
                                const std::string& uid, const std::string& fallback_name,
                                std::function<std::vector<ConnectorMetric>()> read) {
  std::string task_name = fallback_name, operator_name = fallback_name;
  int parallelism = 1;
  for (const SubtaskMetrics& m : subtasks) {
    for (const auto& o : m.operators) {
      if (o.uid == uid) {
        task_name = m.task_name;
        operator_name = o.name;
        parallelism = m.parallelism;
        break;
      }
    }
    if (task_name != fallback_name) break;
  }
  metrics::MetricGroup& op =
      jm.task_job_group()
          .add_group("task", {{"task_name", task_name}, {"subtask_index", parallelism == 1 ? "0" : "all"}})
          .add_group("operator", {{"operator_name", operator_name}, {"operator_id", uid}});
  const std::vector<ConnectorMetric> now = read();
  for (size_t i = 0; i < now.size(); ++i) {
    metrics::MetricGroup* g = &op;
    std::string_view path = now[i].group;
    while (!path.empty()) {
      const size_t dot = path.find('.');
      g = &g->add_group(std::string(path.substr(0, dot)));
      path = dot == std::string_view::npos ? std::string_view{} : path.substr(dot + 1);
    }
    g->gauge(now[i].name, [read, i] {
      const auto v = read();
      return i < v.size() ? v[i].value : 0.0;
    });
  }
}

// Registers the job's metrics (task, operator and job scope, metrics/job_metrics.h) and the pipeline's own:
// the source's and sinks' connector metrics in their operators' scopes, dead letters per stage and sink in the
// job's.
template <class State>  // PipelineRunner::State, private: deduced
void register_metrics(State& s, const JobClient& client) {
  s.job_metrics = std::make_unique<metrics::JobMetrics>(s.registry, client, s.spec.pipeline.name);
  const std::vector<SubtaskMetrics> subtasks = client.subtask_metrics();
  if (s.probe.connector_metrics) {
    register_connector_metrics(*s.job_metrics, subtasks, "source", s.probe.type, s.probe.connector_metrics);
  }
  for (const auto& sink : s.counters->sink_metrics)
    register_connector_metrics(*s.job_metrics, subtasks, sink.uid, sink.uid, sink.read);
  if (s.probe.connections) {
    // One series per source subtask (not "all"): which reader lost its server matters, as for Flink's per-subtask
    // metrics.
    for (const SubtaskMetrics& m : subtasks) {
      const auto op =
          std::find_if(m.operators.begin(), m.operators.end(), [](const auto& o) { return o.uid == "source"; });
      if (op == m.operators.end()) continue;
      auto connections = s.probe.connections;
      const int subtask = m.subtask_index;
      s.job_metrics->task_job_group()
          .add_group("task", {{"task_name", m.task_name}, {"subtask_index", std::to_string(subtask)}})
          .add_group("operator", {{"operator_name", op->name}, {"operator_id", op->uid}})
          .gauge(
              "sourceConnected",
              [connections, subtask] { return SourceConnectionBoard::gauge(connections(), subtask); },
              "1 while the source subtask is connected to its system, 0 while disconnected, -1 when its reader is "
              "not open.");
    }
  }
  metrics::MetricGroup& job = s.job_metrics->job_group();
  auto counters = s.counters;
  job.add_group("deadLetters", {{"stage", "transform"}})
      .counter_function(
          "numRecords", [counters] { return static_cast<double>(counters->dead_letters.load()); },
          "Records sent to the dead-letter sink.");
  if (s.probe.bad_records) {
    auto bad = s.probe.bad_records;
    job.add_group("deadLetters", {{"stage", "source"}})
        .counter_function(
            "numRecords", [bad] { return static_cast<double>(bad()); }, "Records sent to the dead-letter sink.");
  }
  for (const auto& d : s.sink_dead_letters) {
    job.add_group("deadLetters", {{"stage", "sink"}, {"sink_name", d.sink}})
        .counter_function(
            "numRecords", [d] { return static_cast<double>(d.count()); }, "Records sent to the dead-letter sink.");
  }
  register_dead_letter_reasons(s, job);
}

}  // namespace

PipelineRunner::PipelineRunner(std::unique_ptr<State> state) : s_(std::move(state)) {}
PipelineRunner::~PipelineRunner() {
  if (s_ && s_->client) {
    s_->client->cancel();
    s_->client->wait();
  }
}

Result<std::unique_ptr<PipelineRunner>> PipelineRunner::create(const PipelineSpec& spec,
                                                               const Configuration& engine_overrides) {
  auto s = std::make_unique<State>();
  s->spec = spec;
  const PipelineSettings& p = spec.pipeline;
  Configuration& c = s->config;
  c.set(options::kParallelism, p.parallelism);
  if (p.checkpoint_interval_ms > 0) {
    c.set(options::kCheckpointInterval, p.checkpoint_interval_ms);
    Result<std::string> storage = detail::expand_env(p.checkpoint_storage);
    if (!storage.ok()) return storage.error().with_context("pipeline.checkpoint.storage");
    // A plain path is made absolute here, so a relative one means the directory `sluice run` started in.
    c.set(options::kCheckpointDir,
          storage->find("://") == std::string::npos ? fs::absolute(*storage).lexically_normal().string() : *storage);
    c.set(options::kCheckpointMode, std::string(p.delivery == "exactly-once" ? "EXACTLY_ONCE" : "AT_LEAST_ONCE"));
  }
  c.set(options::kRestartStrategy, p.restart.strategy);
  if (p.restart.strategy == "fixed-delay") {
    c.set(options::kFixedDelayAttempts, p.restart.attempts.value_or(10));
    c.set(options::kFixedDelayDelay, p.restart.delay_ms);
  } else if (p.restart.strategy == "exponential-delay") {
    c.set(options::kExpDelayInitialBackoff, p.restart.delay_ms);
    c.set(options::kExpDelayMaxBackoff, p.restart.max_delay_ms);
    // Unset, it is Flink's default (no limit): a CDC job outlives a database outage of any length, loudly
    // unhealthy (RESTARTING on /health, /metrics and the REST API) while it waits.
    if (p.restart.attempts) c.set(options::kExpDelayAttempts, *p.restart.attempts);
  }
  for (const auto& [k, v] : p.config)
    c.set_string(k, v);
  for (const auto& [k, v] : engine_overrides.entries())
    c.set_string(k, v);
  if (c.contains(options::kCheckpointDir.key) && !c.contains(options::kSavepointDir.key)) {
    // `sluice savepoint JOB` and `sluice stop JOB` without a directory write under the checkpoint storage (as
    // the examples' --checkpoint-dir does); "savepoints" is no job id, so no run removes it as superseded.
    const std::string dir = c.get(options::kCheckpointDir);
    c.set(options::kSavepointDir, dir + (dir.ends_with('/') ? "" : "/") + "savepoints");
  }
  if (p.delivery == "exactly-once") {
    // Exactly-once sinks commit on completed checkpoints: without them they would silently run at-least-once
    // (or never commit). The file's own interval is checked by the parser; this catches `config:` and -D.
    int64_t interval = 0;
    try {
      interval = c.get(options::kCheckpointInterval);
    } catch (const SluiceException& e) {
      return e.error();
    }
    if (interval <= 0) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("pipeline '{}': 'pipeline.delivery: exactly-once' needs checkpoints, but {} is {} "
                               "(disabled); enable checkpointing or use 'delivery: at-least-once'",
                               p.name, options::kCheckpointInterval.key, interval));
    }
  }

  s->env = std::make_unique<StreamEnvironment>(c);
  std::string dead_letter_dir = "./.sluice/dead-letter";
  if (p.dead_letter && p.dead_letter->options.type == "files") {
    Result<std::string> dl = detail::expand_env(p.dead_letter->options.get_string("path"));
    if (!dl.ok()) return dl.error().with_context("pipeline.dead-letter.path");
    // The sources and sinks write their own dead letters through DeadLetterFile, a local file: an object-store URI
    // would become a local folder literally named "s3:...", so it is refused rather than silently misplaced.
    if (dl->find("://") != std::string::npos) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("pipeline '{}': the dead-letter sink's path '{}' must be a local directory (the "
                               "connectors write dead letters to local files); use a kafka dead-letter sink for a "
                               "shared location",
                               p.name, *dl));
    }
    dead_letter_dir = *dl;
  }
  s->dead_letter_dir = dead_letter_dir;

  SLUICE_ASSIGN_OR_RETURN(DataStream<cdc::ChangeEvent> changes,
                          detail::add_source(*s->env, spec, dead_letter_dir, s->probe));
  if (!s->probe.lag_ms) {
    // Sources without their own lag: now minus the source time of the latest change the transform saw.
    s->probe.lag_ms = [counters = s->counters](int64_t now_ms) -> int64_t {
      const int64_t ts = counters->last_source_ts_ms.load();
      return ts > 0 ? std::max<int64_t>(0, now_ms - ts) : -1;
    };
  }
  std::optional<DataStream<Value>> dead_letters;
  s->counters->init_filters(spec);
  SLUICE_ASSIGN_OR_RETURN(DataStream<RoutedEvent> transformed,
                          detail::add_transform(changes, spec, s->counters, &dead_letters));
  DataStream<RoutedEvent> events = std::move(transformed);
  events.name("Transform").uid("transform");
  // The events are keyed by entity so that each entity's events reach one sink subtask in order. Where one
  // transform subtask feeds one subtask of each sink, every event already goes there in order: the sinks are
  // chained to the transform instead, which saves serializing each event across an exchange and a hand-off
  // between two threads (about a fifth of a CDC change's instructions, docs/benchmarks.md). entity-version keeps
  // the key_by: its counts are keyed state. A savepoint restores either way (operators match by uid), also at
  // another parallelism, which brings the key_by back.
  StreamGraph& graph = *events.graph();
  const bool one_to_one = graph.parallelism_of(graph.node(events.node_id())) == 1 &&
                          s->config.get(options::kParallelism) == 1 && !spec.pipeline.entity_version;
  std::optional<KeyedStream<std::string, RoutedEvent>> keyed;
  if (!one_to_one) keyed.emplace(events.key_by([](const RoutedEvent& r) { return r.entity_key; }));
  DataStream<RoutedEvent>& sink_input = keyed ? *keyed : events;
  for (size_t i = 0; i < spec.sinks.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(detail::add_sink(sink_input, keyed.has_value(), spec, i, dead_letter_dir, s->counters));
    // The path the sink builders of pipeline_sinks.cc give a sink's dead-letter file.
    const std::string path = dead_letter_dir + "/sink-" + spec.sinks[i].name + ".jsonl";
    s->sink_dead_letters.push_back(
        {spec.sinks[i].name, path, dead_letters_appended(path), dead_letters_appended_by_reason(path)});
  }
  if (dead_letters) SLUICE_RETURN_IF_ERROR(detail::add_dead_letter_sink(*dead_letters, spec));
  if (!s->probe.dead_letter_path.empty()) {
    s->source_dead_letters_before = dead_letters_appended_by_reason(s->probe.dead_letter_path);
  }
  return std::unique_ptr<PipelineRunner>(new PipelineRunner(std::move(s)));
}

Status PipelineRunner::start() {
  const PipelineSettings& p = s_->spec.pipeline;
  if (p.checkpoint_interval_ms > 0) {
    // One run per checkpoint storage: a second run would resume from the first one's checkpoints while it
    // still writes them, and both would commit the same sink files and transactions.
    const std::string storage = s_->config.get(options::kCheckpointDir);
    const fs::path root = storage_path(storage);
    std::string lock_path = (root / ".lock").string();
    if (is_s3_uri(storage)) {
      SLUICE_RETURN_IF_ERROR(S3Client::configure(s_->config));
      lock_path = s3_lock_path(storage).string();
    } else {
      std::error_code ec;
      fs::create_directories(root, ec);
    }
    s_->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s_->lock_fd < 0) {
      return Error(ErrorCode::kCheckpoint, fmt::format("cannot open the lock file '{}' of the checkpoint storage: {}",
                                                       lock_path, std::strerror(errno)));
    }
    if (::flock(s_->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("pipeline '{}': another `sluice run` uses the checkpoint storage {} (it holds {}); "
                               "stop it first, or give this run its own pipeline.checkpoint.storage",
                               p.name, root.string(), lock_path));
    }
  }
  if (s_->config.contains(options::kStateRecoveryPath.key)) {
    // A checkpoint the user chose (-D execution.state-recovery.path) is theirs: its job directory is never
    // removed as superseded.
    fs::path chosen = fs::path(storage_path(s_->config.get(options::kStateRecoveryPath))).lexically_normal();
    if (chosen.filename().empty()) chosen = chosen.parent_path();
    s_->kept_job_dir = chosen.parent_path().filename().string();
  }
  if (p.checkpoint_interval_ms > 0 && !s_->config.contains(options::kStateRecoveryPath.key)) {
    const std::string latest = find_latest_checkpoint(s_->config.get(options::kCheckpointDir));
    std::error_code ec;
    bool latest_exists = !latest.empty() && fs::exists(fs::path(latest) / kMetadataFileName, ec);
    if (!latest.empty() && is_s3_uri(latest)) {
      auto meta = FileCheckpointStorage::load_metadata(latest);
      latest_exists = meta.ok();
    }
    if (!latest.empty() && !latest_exists) {
      // Only a stopped job's savepoint can be gone (a checkpoint is found by its _metadata): starting over
      // instead would re-read a CDC source's snapshot and repeat every row.
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("pipeline '{}' was stopped with a savepoint at {} (sluice stop), which is gone: "
                               "resume from another savepoint or checkpoint with -s PATH, or delete the job "
                               "directory holding its {} marker under {} to start over",
                               p.name, latest, kStoppedMarker, storage_path(s_->config.get(options::kCheckpointDir))));
    }
    if (!latest.empty()) {
      s_->restored_from = latest;
      s_->env->config().set(options::kStateRecoveryPath, latest);
      spdlog::info("pipeline '{}': resuming from checkpoint {}", p.name, latest);
    }
  }
  s_->start_wall_ms = wall_ms();
  try {
    JobClient client = s_->env->execute_async(p.name);
    register_metrics(*s_, client);
    std::lock_guard lock(s_->mu);
    s_->client.emplace(std::move(client));
  } catch (const SluiceException& e) {
    return e.error();
  }
  return ok_status();
}

JobResult PipelineRunner::wait() {
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  if (!c) return JobResult{};
  JobResult r = c->wait();
  if (r.status == JobStatus::kFinished && s_->spec.pipeline.checkpoint_interval_ms > 0) {
    // A job that ended with its input is done: the next run is a new job and must not resume from its final
    // checkpoint. A job ended by `sluice stop` is paused: the next run resumes from the stop's savepoint.
    mark_job_ended(s_->config.get(options::kCheckpointDir), r.job_id, c->checkpoint_stats(), s_->spec.pipeline.name);
  }
  return r;
}

void PipelineRunner::cancel() {
  std::lock_guard lock(s_->mu);
  if (s_->client) s_->client->cancel();
}

JobStatus PipelineRunner::status() const {
  std::lock_guard lock(s_->mu);
  return s_->client ? s_->client->status() : JobStatus::kCreated;
}

std::optional<JobClient> PipelineRunner::client() const {
  std::lock_guard lock(s_->mu);
  return s_->client;
}

const StreamGraph& PipelineRunner::stream_graph() const {
  return s_->env->stream_graph();
}

const std::string& PipelineRunner::restored_from() const {
  return s_->restored_from;
}

std::string PipelineRunner::summary(const JobResult& result) const {
  const PipelineCounters& k = *s_->counters;
  std::string out = fmt::format(
      "pipeline '{}' {} after {:.1f} s: {} changes in, {} domain events from the transform ({} filtered, {} "
      "unrouted, {} to the dead-letter sink), {} checkpoints, {} restarts",
      s_->spec.pipeline.name, job_status_name(result.status), static_cast<double>(result.duration.count()) / 1000.0,
      k.changes_in.load(), k.events_out.load(), k.filtered.load(), k.unrouted.load(), k.dead_letters.load(),
      result.completed_checkpoints, result.restarts);
  if (const int64_t bad = s_->probe.bad_records ? s_->probe.bad_records() : 0; bad > 0) {
    out += fmt::format("; {} bad source {} went to {}/source-{}.jsonl", bad, bad == 1 ? "record" : "records",
                       s_->dead_letter_dir, s_->probe.type);
  }
  std::map<std::string, int64_t> sink_dead;
  for (const auto& d : s_->sink_dead_letters) {
    if (const int64_t n = d.count(); n > 0) {
      sink_dead[d.sink] = n;
      out += fmt::format("; {} {} refused by sink '{}' went to {}", n, n == 1 ? "record" : "records", d.sink, d.path);
    }
  }
  if (result.restarts > 0) out += " (counts include the records replayed after restarts)";
  if (result.error) out += fmt::format("; error: {}", result.error->to_string());
  // What the sinks delivered: only a FINISHED job flushed and committed everything its sinks received. Otherwise
  // what they received is not counted as delivered: what the last completed checkpoint covers was delivered
  // (flushed or committed with it), the rest is delivered by the next run, which resumes from that checkpoint.
  // A sink's records include those it refused and dead-lettered: those are not delivered to it.
  std::string sinks;
  for (const OperatorStats& o : result.operators) {
    if (!o.uid.starts_with("sink-") && o.uid != "dead-letter") continue;
    const std::string name = o.uid == "dead-letter" ? std::string("dead-letter") : o.uid.substr(5);
    const auto dead = o.uid == "dead-letter" ? sink_dead.end() : sink_dead.find(name);
    if (dead == sink_dead.end()) {
      sinks += fmt::format("{}'{}' {}", sinks.empty() ? "" : ", ", name, o.records_in);
    } else if (result.status == JobStatus::kFinished) {
      sinks += fmt::format("{}'{}' {} (and {} to its dead-letter file)", sinks.empty() ? "" : ", ", name,
                           std::max<int64_t>(0, o.records_in - dead->second), dead->second);
    } else {
      sinks += fmt::format("{}'{}' {} ({} of them to its dead-letter file)", sinks.empty() ? "" : ", ", name,
                           o.records_in, dead->second);
    }
  }
  if (const int64_t t = k.tombstones.load(); t > 0) {
    sinks += fmt::format(" (Kafka sinks: {} of them deletes followed by a tombstone)", t);
  }
  if (!sinks.empty()) {
    if (result.status == JobStatus::kFinished) {
      out += fmt::format("\ndelivered by the sinks: {}", sinks);
    } else {
      out += fmt::format(
          "\nreceived by the sinks (not all delivered: the job is {}; delivered is what the last completed "
          "checkpoint covers, the next run resumes from it): {}",
          job_status_name(result.status), sinks);
    }
  }
  const auto types = k.type_counts();
  if (!types.empty()) {
    out += "\nevents by type:";
    for (const auto& [t, n] : types)
      out += fmt::format("\n  {:>10}  {}", n, t);
  }
  return out;
}

Result<std::string> sample_transforms(const PipelineSpec& spec, int64_t records) {
  if (spec.source.type != "files") {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("--sample reads a `files` source; this pipeline's source is `{}` (point a copy of the file "
                    "at a few change events saved as JSON lines)",
                    spec.source.type));
  }
  SLUICE_ASSIGN_OR_RETURN(std::string path, detail::expand_env(spec.source.get_string("path")));
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> files, sluice::detail::expand_file_paths({path}));
  std::vector<cdc::ChangeEvent> changes;
  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) return Error(ErrorCode::kRuntime, fmt::format("cannot read '{}': {}", file, std::strerror(errno)));
    std::string line;
    int64_t line_no = 0;
    while (static_cast<int64_t>(changes.size()) < records && std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Result<Value> v = Value::from_json(line);
      Result<cdc::ChangeEvent> e = v.ok() ? cdc::ChangeEvent::from_value(*v) : Result<cdc::ChangeEvent>(v.error());
      if (!e.ok()) {
        return Error(ErrorCode::kRuntime,
                     fmt::format("{}:{}: not a change event: {}", file, line_no, e.error().message()));
      }
      changes.push_back(std::move(*e));
    }
    if (static_cast<int64_t>(changes.size()) >= records) break;
  }
  return detail::sample_transform(spec, changes);
}

}  // namespace sluice::pipeline
