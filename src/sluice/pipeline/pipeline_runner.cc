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
#include "sluice/api/stream_environment.h"
#include "sluice/checkpoint/checkpoint_storage.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/dead_letter_counts.h"
#include "sluice/connectors/files.h"
#include "sluice/core/s3_client.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/metric_registry.h"
#include "sluice/metrics/prometheus_text.h"

namespace sluice::pipeline {

namespace fs = std::filesystem;
using detail::ConnectorMetric;
using detail::PipelineCounters;
using detail::RoutedEvent;
using detail::SourceProbe;

namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Written into a job's checkpoint directory when the job FINISHED (find_latest_checkpoint skips it).
constexpr const char* kFinishedMarker = "_finished";
// Written instead when the job FINISHED through `sluice stop` (stop-with-savepoint); holds the savepoint's path,
// which the next run resumes from: a stop is a pause, not the end of a CDC job's stream.
constexpr const char* kStoppedMarker = "_stopped";

std::string storage_path(const std::string& storage) {
  return storage.starts_with("file://") ? storage.substr(7) : storage;
}

// A job directory's name: the 32 lowercase hex digits of a job id (local_cluster.cc). Savepoints
// ("savepoint-..."), the lock file and whatever else a user keeps in the storage never match.
bool is_job_id(std::string_view name) {
  return name.size() == 32 && name.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// find_latest_checkpoint() on s3://bucket/prefix: the same choice from one listing of the prefix (the newest
// _metadata of a chk-<n>, or a stopped job's savepoint, by the objects' LastModified; finished jobs skipped).
std::string find_latest_s3_checkpoint(const std::string& storage) {
  auto client = S3Client::shared();
  auto uri = S3Uri::parse(storage);
  if (!client.ok() || !uri.ok()) return {};
  const std::string prefix = uri->key.empty() ? std::string() : uri->key + "/";
  auto listing = (*client)->list(uri->bucket, prefix);
  if (!listing.ok()) {
    spdlog::warn("cannot list the checkpoint storage {}: {}", storage, listing.error().to_string());
    return {};
  }
  struct Job {
    bool finished = false;
    std::string stopped_key, best, best_time;
    int64_t best_id = -1;
  };
  std::map<std::string, Job> jobs;
  for (const S3Object& o : listing->objects) {
    std::string_view rest = std::string_view(o.key).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || !is_job_id(rest.substr(0, slash))) continue;
    Job& job = jobs[std::string(rest.substr(0, slash))];
    std::string_view inside = rest.substr(slash + 1);
    if (inside == kFinishedMarker) job.finished = true;
    if (inside == kStoppedMarker) {
      job.stopped_key = o.key;
    }
    // Within a job the highest checkpoint id is the newest (ids only grow; LastModified has whole seconds on some
    // stores, and a subsumed checkpoint may not be deleted yet).
    const size_t chk_end = inside.find('/');
    const int64_t id = chk_end == std::string_view::npos
                           ? -1
                           : FileCheckpointStorage::checkpoint_id_of(fs::path(std::string(inside.substr(0, chk_end))));
    if (id >= 0 && inside.substr(chk_end + 1) == kMetadataFileName && id > job.best_id) {
      job.best = "s3://" + uri->bucket + "/" + o.key.substr(0, o.key.size() - kMetadataFileName.size() - 1);
      job.best_id = id;
    }
  }
  // Across jobs: the trigger time (ms) in each job's newest _metadata.
  for (auto& [name, job] : jobs) {
    if (job.best.empty() || job.finished) continue;
    auto meta = FileCheckpointStorage::load_metadata(job.best);
    job.best_time = meta.ok() ? fmt::format("{:020d}", meta->trigger_timestamp) : std::string();
    if (!meta.ok()) job.best.clear();
  }
  std::string best, best_time;
  for (auto& [id, job] : jobs) {
    if (job.finished) continue;
    if (!job.stopped_key.empty()) {
      auto savepoint = (*client)->get_object(uri->bucket, job.stopped_key);
      if (!savepoint.ok() || savepoint->empty()) continue;
      // The savepoint's trigger time; a savepoint that is gone sorts first and is reported by the caller.
      auto meta = FileCheckpointStorage::load_metadata(*savepoint);
      const std::string t = meta.ok() ? fmt::format("{:020d}", meta->trigger_timestamp) : std::string();
      if (best.empty() || t > best_time) {
        best = *savepoint;
        best_time = t;
      }
      continue;
    }
    if (!job.best.empty() && (best.empty() || job.best_time > best_time)) {
      best = job.best;
      best_time = job.best_time;
    }
  }
  return best;
}

// The local lock file standing for an s3:// storage: one run per storage on this machine (an object store has
// no lock; two machines sharing one storage must be kept apart by whoever deploys them).
fs::path s3_lock_path(const std::string& storage) {
  return fs::temp_directory_path() / fmt::format("sluice-s3-{:016x}.lock", std::hash<std::string>{}(storage));
}

// remove_superseded_checkpoints() on s3://bucket/prefix: deletes the objects of every other job prefix.
int remove_superseded_s3_checkpoints(const std::string& pipeline, const std::string& storage, const std::string& own,
                                     const std::string& kept_job_dir) {
  auto client = S3Client::shared();
  auto uri = S3Uri::parse(storage);
  if (!client.ok() || !uri.ok()) return 0;
  const std::string prefix = uri->key.empty() ? std::string() : uri->key + "/";
  auto listing = (*client)->list(uri->bucket, prefix, "/");
  if (!listing.ok()) {
    spdlog::warn("pipeline '{}': cannot list the checkpoint storage {} to remove superseded checkpoints: {}", pipeline,
                 storage, listing.error().to_string());
    return 0;
  }
  int removed = 0;
  for (const std::string& job_prefix : listing->common_prefixes) {
    std::string name = job_prefix.substr(prefix.size());
    if (!name.empty() && name.back() == '/') name.pop_back();
    if (name == own || name == kept_job_dir || !is_job_id(name)) continue;
    auto deleted = (*client)->delete_prefix(uri->bucket, job_prefix);
    if (!deleted.ok()) {
      spdlog::warn("pipeline '{}': cannot remove the superseded checkpoints in s3://{}/{}: {}", pipeline, uri->bucket,
                   job_prefix, deleted.error().to_string());
      continue;
    }
    ++removed;
  }
  if (removed > 0) {
    spdlog::info("pipeline '{}': removed the checkpoints of {} earlier job(s) from {} (superseded by job {})", pipeline,
                 removed, storage, own);
  }
  return removed;
}

}  // namespace

std::string find_latest_checkpoint(const std::string& storage) {
  if (is_s3_uri(storage)) return find_latest_s3_checkpoint(storage);
  const fs::path root = storage_path(storage);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  std::string best;
  fs::file_time_type best_time{};
  for (const auto& job : fs::directory_iterator(root, ec)) {
    if (!job.is_directory(ec) || fs::exists(job.path() / kFinishedMarker, ec)) continue;
    if (const fs::path stopped = job.path() / kStoppedMarker; fs::exists(stopped, ec)) {
      // A stopped job resumes from its savepoint (taken after its last checkpoint), wherever it was written.
      std::ifstream in(stopped);
      std::string savepoint;
      std::getline(in, savepoint);
      const auto t = fs::last_write_time(stopped, ec);
      if (ec || savepoint.empty()) {
        ec.clear();
        continue;
      }
      if (best.empty() || t > best_time) {
        best = savepoint;
        best_time = t;
      }
      continue;
    }
    for (const auto& chk : fs::directory_iterator(job.path(), ec)) {
      if (FileCheckpointStorage::checkpoint_id_of(chk.path()) < 0) continue;
      const fs::path meta = chk.path() / kMetadataFileName;
      const auto t = fs::last_write_time(meta, ec);
      if (ec) {
        ec.clear();
        continue;
      }
      if (best.empty() || t > best_time) {
        best = chk.path().string();
        best_time = t;
      }
    }
  }
  return best;
}

struct PipelineRunner::State {
  PipelineSpec spec;
  Configuration config;
  std::unique_ptr<StreamEnvironment> env;
  std::shared_ptr<PipelineCounters> counters = std::make_shared<PipelineCounters>();
  SourceProbe probe;
  std::string restored_from;
  std::string dead_letter_dir;
  // Per sink: its dead-letter file (records it refused: too large for Kafka, failed bulk items, rows Postgres
  // refuses) and how many records the process had appended to that file before this run.
  struct SinkDeadLetters {
    std::string sink;
    std::string path;
    int64_t before = 0;
    std::map<std::string, int64_t> before_by_reason;
    int64_t count() const { return dead_letters_appended(path) - before; }
  };
  std::vector<SinkDeadLetters> sink_dead_letters;
  std::map<std::string, int64_t> source_dead_letters_before;  // by reason, at the start of this run
  int dead_letter_hook = -1;  // registry's refresh hook adding a series per new dead-letter reason
  int64_t start_wall_ms = 0;
  mutable std::mutex mu;
  std::optional<JobClient> client;
  int lock_fd = -1;                 // flock(2)ed while the runner lives: one run per checkpoint storage
  bool superseded_removed = false;  // remove_superseded_checkpoints() ran (once per run)
  std::string kept_job_dir;         // the job directory of an explicit execution.state-recovery.path, kept
  // Flink-named metrics of the job (metrics/), appended to metrics_text(); the job's registration goes before
  // the registry.
  metrics::MetricRegistry registry;
  std::unique_ptr<metrics::JobMetrics> job_metrics;
  // The filters' (seen, kept) counts over time, for the window of health.filter-window; guarded by diag_mu.
  struct FilterSnapshot {
    int64_t at_ms;
    std::vector<std::pair<int64_t, int64_t>> counts;  // per transform: seen, kept
  };
  mutable std::mutex diag_mu;
  mutable std::vector<FilterSnapshot> filter_history;
  std::set<std::string> logged_warnings;  // keys logged and still present (log_transform_warnings' thread)

  /// The source's lag, for /health.
  std::vector<SourceHealth> source_health(int64_t now) const;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (dead_letter_hook >= 0) registry.remove_refresh_hook(dead_letter_hook);
    if (lock_fd >= 0) ::close(lock_fd);
  }
};

namespace {

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

  Result<DataStream<cdc::ChangeEvent>> changes = detail::add_source(*s->env, spec, dead_letter_dir, s->probe);
  if (!changes.ok()) return changes.error();
  if (!s->probe.lag_ms) {
    // Sources without their own lag: now minus the source time of the latest change the transform saw.
    s->probe.lag_ms = [counters = s->counters](int64_t now_ms) -> int64_t {
      const int64_t ts = counters->last_source_ts_ms.load();
      return ts > 0 ? std::max<int64_t>(0, now_ms - ts) : -1;
    };
  }
  std::optional<DataStream<Value>> dead_letters;
  s->counters->init_filters(spec);
  Result<DataStream<RoutedEvent>> transformed = detail::add_transform(*changes, spec, s->counters, &dead_letters);
  if (!transformed.ok()) return transformed.error();
  DataStream<RoutedEvent> events = std::move(*transformed);
  events.name("Transform").uid("transform");
  auto keyed = events.key_by([](const RoutedEvent& r) { return r.entity_key; });
  for (size_t i = 0; i < spec.sinks.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(detail::add_sink(keyed, spec, i, dead_letter_dir, s->counters));
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
    std::string stop_savepoint;
    for (const CheckpointStats& st : c->checkpoint_stats()) {
      if (st.completed && st.type == "stop-with-savepoint") stop_savepoint = st.path;
    }
    const std::string storage = s_->config.get(options::kCheckpointDir);
    const fs::path job_dir = fs::path(storage_path(storage)) / r.job_id;
    std::error_code ec;
    if (!is_s3_uri(storage)) fs::create_directories(job_dir, ec);
    const fs::path marker = job_dir / (stop_savepoint.empty() ? kFinishedMarker : kStoppedMarker);
    if (is_s3_uri(storage)) {
      auto client = S3Client::shared();
      auto uri = S3Uri::parse(marker.native());
      Status put = client.ok() && uri.ok() ? (*client)->put_object(uri->bucket, uri->key, stop_savepoint)
                                           : Status(client.ok() ? uri.error() : client.error());
      if (!put.ok()) {
        spdlog::warn("pipeline '{}': cannot write {}: {}", s_->spec.pipeline.name, marker.string(),
                     put.error().to_string());
      }
    } else if (FILE* f = std::fopen(marker.c_str(), "w")) {
      if (!stop_savepoint.empty()) std::fputs(stop_savepoint.c_str(), f);
      if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
        spdlog::warn("pipeline '{}': cannot write {}: {}", s_->spec.pipeline.name, marker.string(),
                     std::strerror(errno));
      }
      std::fclose(f);
    }
    if (!stop_savepoint.empty()) {
      spdlog::info("pipeline '{}': stopped with the savepoint {}; the next `sluice run` resumes from it",
                   s_->spec.pipeline.name, stop_savepoint);
    }
  }
  return r;
}

int PipelineRunner::remove_superseded_checkpoints() {
  if (s_->superseded_removed || s_->spec.pipeline.checkpoint_interval_ms <= 0) return 0;
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  if (!c) return 0;
  bool own_checkpoint = false;
  for (const CheckpointStats& st : c->checkpoint_stats())
    own_checkpoint = own_checkpoint || (st.completed && st.type == "checkpoint");
  if (!own_checkpoint) return 0;
  s_->superseded_removed = true;
  // This job's completed checkpoint is durable (its _metadata was synced before it counted as completed), so
  // the next run resumes from it: earlier jobs' checkpoints will never be restored by `sluice run` again.
  const fs::path root = storage_path(s_->config.get(options::kCheckpointDir));
  const std::string own = c->job_id();
  if (is_s3_uri(root.native())) {
    return remove_superseded_s3_checkpoints(s_->spec.pipeline.name, root.native(), own, s_->kept_job_dir);
  }
  std::vector<fs::path> superseded;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_ec;
    if (name == own || name == s_->kept_job_dir || !is_job_id(name) || !entry.is_directory(type_ec)) continue;
    superseded.push_back(entry.path());
  }
  if (ec) {
    spdlog::warn("pipeline '{}': cannot list the checkpoint storage {} to remove superseded checkpoints: {}",
                 s_->spec.pipeline.name, root.string(), ec.message());
    return 0;
  }
  int removed = 0;
  for (const fs::path& dir : superseded) {
    std::error_code rm_ec;
    fs::remove_all(dir, rm_ec);
    if (rm_ec) {
      spdlog::warn("pipeline '{}': cannot remove the superseded checkpoints in {}: {}", s_->spec.pipeline.name,
                   dir.string(), rm_ec.message());
      continue;
    }
    ++removed;
  }
  if (removed > 0) {
    spdlog::info("pipeline '{}': removed the checkpoints of {} earlier job(s) from {} (superseded by job {})",
                 s_->spec.pipeline.name, removed, root.string(), own);
  }
  return removed;
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

std::vector<metrics::MetricSample> PipelineRunner::metric_samples() const {
  return s_->registry.collect();
}

std::string PipelineRunner::metrics_text() const {
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  const std::string job = metrics::escape_label_value(s_->spec.pipeline.name);
  std::string out;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const JobStatus st = c ? c->status() : JobStatus::kCreated;
  family("sluice_job_running", "gauge", "1 when the job is RUNNING, else 0.");
  out += fmt::format("sluice_job_running{{job=\"{}\",status=\"{}\"}} {}\n", job, job_status_name(st),
                     st == JobStatus::kRunning ? 1 : 0);
  if (c) {
    const std::vector<OperatorStats> ops = c->operator_stats();
    family("sluice_operator_records_in_total", "counter", "Records an operator received, over its subtasks.");
    for (const auto& o : ops) {
      out += fmt::format("sluice_operator_records_in_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_in);
    }
    family("sluice_operator_records_out_total", "counter", "Records an operator emitted, over its subtasks.");
    for (const auto& o : ops) {
      out += fmt::format("sluice_operator_records_out_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_out);
    }
    family("sluice_sink_dead_letters_total", "counter",
           "Records a sink refused and wrote to its dead-letter file (too large for Kafka, failed bulk items, rows "
           "Postgres refuses).");
    for (const auto& d : s_->sink_dead_letters) {
      out += fmt::format("sluice_sink_dead_letters_total{{job=\"{}\",sink=\"{}\"}} {}\n", job,
                         metrics::escape_label_value(d.sink), d.count());
    }
    family("sluice_job_restarts_total", "counter", "Failover restarts of the job.");
    out += fmt::format("sluice_job_restarts_total{{job=\"{}\"}} {}\n", job, c->restarts());
    family("sluice_job_restarting", "gauge", "1 while the job is RESTARTING (a failure, its backoff, the restart).");
    out += fmt::format("sluice_job_restarting{{job=\"{}\"}} {}\n", job, st == JobStatus::kRestarting ? 1 : 0);
    const std::vector<JobExceptionInfo> failures = c->exceptions();
    family("sluice_job_last_failure_timestamp_ms", "gauge", "When the job's latest failure happened (-1 none).");
    out += fmt::format("sluice_job_last_failure_timestamp_ms{{job=\"{}\"}} {}\n", job,
                       failures.empty() ? -1 : failures[0].timestamp_ms);
    const std::vector<CheckpointStats> cps = c->checkpoint_stats();
    int64_t completed = 0, failed = 0, last_duration = -1, last_completed_ms = -1;
    uint64_t last_size = 0;
    for (const auto& cp : cps) {
      if (cp.completed) {
        ++completed;
        last_duration = cp.duration_ms;
        last_size = cp.state_bytes;
        last_completed_ms = cp.trigger_time_ms + cp.duration_ms;
      } else if (!cp.failure.empty()) {
        ++failed;
      }
    }
    family("sluice_checkpoints_completed", "gauge", "Completed checkpoints among the recent ones kept in history.");
    out += fmt::format("sluice_checkpoints_completed{{job=\"{}\"}} {}\n", job, completed);
    family("sluice_checkpoints_failed", "gauge", "Failed checkpoints among the recent ones kept in history.");
    out += fmt::format("sluice_checkpoints_failed{{job=\"{}\"}} {}\n", job, failed);
    family("sluice_checkpoint_last_duration_ms", "gauge", "Duration of the last completed checkpoint (ms).");
    out += fmt::format("sluice_checkpoint_last_duration_ms{{job=\"{}\"}} {}\n", job, last_duration);
    family("sluice_checkpoint_last_size_bytes", "gauge", "State size of the last completed checkpoint (bytes).");
    out += fmt::format("sluice_checkpoint_last_size_bytes{{job=\"{}\"}} {}\n", job, last_size);
    family("sluice_checkpoint_age_ms", "gauge",
           "Time since the last completed checkpoint (since the start before the first), ms.");
    out += fmt::format("sluice_checkpoint_age_ms{{job=\"{}\"}} {}\n", job,
                       wall_ms() - (last_completed_ms >= 0 ? last_completed_ms : s_->start_wall_ms));
    family("sluice_checkpoints_failed_consecutive", "gauge",
           "The latest checkpoints that failed, counted back to the last completed one (savepoints aside).");
    out +=
        fmt::format("sluice_checkpoints_failed_consecutive{{job=\"{}\"}} {}\n", job, failed_checkpoints_in_a_row(cps));
  }
  // The bounds of /health, so that alert rules (deploy/monitoring/sluice-alerts.yml) fire on the same conditions
  // as /health without repeating each job's settings. A bound that is off is not exported.
  const JobHealthOptions bounds = health_options();
  if (const int64_t b = bounds.checkpoint_age_bound_ms(); b > 0) {
    family("sluice_health_checkpoint_age_bound_ms", "gauge",
           "health.max-checkpoint-age in force (default 3 x checkpoint interval + 10 s), ms.");
    out += fmt::format("sluice_health_checkpoint_age_bound_ms{{job=\"{}\"}} {}\n", job, b);
  }
  if (bounds.max_failed_checkpoints > 0) {
    family("sluice_health_failed_checkpoints_bound", "gauge", "health.max-failed-checkpoints (consecutive).");
    out += fmt::format("sluice_health_failed_checkpoints_bound{{job=\"{}\"}} {}\n", job, bounds.max_failed_checkpoints);
  }
  if (bounds.max_source_lag_ms > 0) {
    family("sluice_health_source_lag_bound_ms", "gauge", "health.max-source-lag, ms.");
    out += fmt::format("sluice_health_source_lag_bound_ms{{job=\"{}\"}} {}\n", job, bounds.max_source_lag_ms);
  }
  {
    const HealthReport h = health();
    family("sluice_job_healthy", "gauge", "1 when /health answers 200, else 0.");
    out += fmt::format("sluice_job_healthy{{job=\"{}\"}} {}\n", job, h.healthy ? 1 : 0);
  }
  const PipelineCounters& k = *s_->counters;
  auto counter = [&](std::string_view name, std::string_view help, int64_t v) {
    family(name, "counter", help);
    out += fmt::format("{}{{job=\"{}\"}} {}\n", name, job, v);
  };
  counter("sluice_pipeline_changes_total", "Change events that reached the transform.", k.changes_in.load());
  counter("sluice_pipeline_events_total", "Domain events emitted by the transform.", k.events_out.load());
  counter("sluice_pipeline_filtered_total", "Change events dropped by a filter.", k.filtered.load());
  counter("sluice_pipeline_unrouted_events_total", "Events that matched no route.", k.unrouted.load());
  counter("sluice_pipeline_dead_letters_total", "Records the transform sent to the dead-letter sink.",
          k.dead_letters.load());
  counter("sluice_pipeline_kafka_tombstones_total",
          "Tombstones (null values) Kafka sinks wrote after delete events (tombstones-on-delete).",
          k.tombstones.load());
  family("sluice_source_lag_ms", "gauge", "Now minus the source timestamp of the latest change (-1 unknown).");
  out += fmt::format("sluice_source_lag_ms{{job=\"{}\",source=\"{}\"}} {}\n", job,
                     metrics::escape_label_value(s_->probe.type), s_->probe.lag_ms(wall_ms()));
  if (s_->probe.gauges) {
    for (const auto& [name, v] : s_->probe.gauges()) {
      family(name, "gauge", "Reported by the source connector.");
      out +=
          fmt::format("{}{{job=\"{}\",source=\"{}\"}} {}\n", name, job, metrics::escape_label_value(s_->probe.type), v);
    }
  }
  out += s_->registry.prometheus_text();
  return out;
}

std::vector<PipelineRunner::TransformWarning> PipelineRunner::transform_warnings() const {
  constexpr int64_t kMinRecords = 100;  // "after some records": fewer say little about a filter
  const PipelineCounters& k = *s_->counters;
  const int64_t now = wall_ms();
  const bool ended = job_status_terminal(status());
  std::vector<std::pair<int64_t, int64_t>> counts;
  for (const auto& f : k.filters) {
    counts.emplace_back(f ? f->seen.load(std::memory_order_relaxed) : 0,
                        f ? f->kept.load(std::memory_order_relaxed) : 0);
  }
  // The window's start: the newest snapshot at least a window old (snapshots are taken at most once a second).
  std::vector<std::pair<int64_t, int64_t>> base;
  int64_t base_at = -1;
  {
    std::lock_guard lock(s_->diag_mu);
    auto& hist = s_->filter_history;
    if (hist.empty() || now - hist.back().at_ms >= 1000) hist.push_back({now, counts});
    const int64_t window = s_->spec.pipeline.health_filter_window_ms;
    size_t keep_from = 0;
    for (size_t i = 0; i < hist.size(); ++i) {
      if (now - hist[i].at_ms >= window) keep_from = i;
    }
    if (now - hist[keep_from].at_ms >= window) {
      base = hist[keep_from].counts;
      base_at = hist[keep_from].at_ms;
    }
    hist.erase(hist.begin(), hist.begin() + static_cast<std::ptrdiff_t>(keep_from));
  }
  std::vector<TransformWarning> out;
  for (size_t i = 0; i < k.filters.size(); ++i) {
    const detail::FilterStats* f = k.filters[i].get();
    if (f == nullptr) continue;
    const TransformSpec& t = s_->spec.transforms[i];
    const std::string which = fmt::format("transform #{} (match '{}', line {})", i + 1, t.match, t.mark.line);
    const int64_t seen = counts[i].first;
    const int64_t kept = counts[i].second;
    if (seen >= kMinRecords) {
      for (size_t p = 0; p < f->paths.size(); ++p) {
        if (f->present[p].load(std::memory_order_relaxed) > 0) continue;
        out.push_back({fmt::format("absent:{}:{}", i, f->paths[p]),
                       fmt::format("{}: the filter '{}' reads '{}', which is absent from all {} records it saw so far "
                                   "(a typo?); the records have {}",
                                   which, t.filter->text(), f->paths[p], seen, f->sample_fields())});
      }
    }
    if (ended && base_at < 0 && seen >= kMinRecords && kept == 0) {
      out.push_back({fmt::format("dropped:{}", i), fmt::format("{}: the filter '{}' dropped all {} records of the run",
                                                               which, t.filter->text(), seen)});
    } else if (base_at >= 0 && i < base.size() && seen - base[i].first >= kMinRecords && kept == base[i].second) {
      out.push_back({fmt::format("dropped:{}", i),
                     fmt::format("{}: the filter '{}' dropped all {} records of the last {} s (health.filter-window)",
                                 which, t.filter->text(), seen - base[i].first, (now - base_at) / 1000)});
    }
  }
  return out;
}

void PipelineRunner::log_transform_warnings() {
  std::set<std::string> now;
  for (const TransformWarning& w : transform_warnings()) {
    now.insert(w.key);
    if (!s_->logged_warnings.contains(w.key)) {
      spdlog::warn("pipeline '{}': {}", s_->spec.pipeline.name, w.text);
    }
  }
  s_->logged_warnings = std::move(now);
}

JobHealthOptions PipelineRunner::health_options() const {
  const PipelineSettings& p = s_->spec.pipeline;
  JobHealthOptions o;
  o.checkpoint_interval_ms = p.checkpoint_interval_ms;
  o.max_checkpoint_age_ms = p.health_max_checkpoint_age_ms;
  o.max_failed_checkpoints = p.health_max_failed_checkpoints;
  o.max_source_lag_ms = p.health_max_source_lag_ms;
  o.restart_grace_ms = p.health_restart_grace_ms;
  return o;
}

std::vector<SourceHealth> PipelineRunner::State::source_health(int64_t now) const {
  SourceHealth s;
  s.name = probe.type;
  s.description = probe.description;
  s.lag_ms = probe.lag_ms ? probe.lag_ms(now) : -1;
  if (probe.connections) {
    for (const SourceConnection& c : probe.connections()) {
      if (!c.connected) s.disconnected.push_back(SourceHealth::Disconnected{c.subtask, c.disconnected_ms, c.reason});
    }
  }
  return {s};
}

PipelineRunner::SourceConnections PipelineRunner::source_connections() const {
  SourceConnections out{s_->probe.type, s_->probe.description, {}};
  if (s_->probe.connections) out.readers = s_->probe.connections();
  return out;
}

HealthReport PipelineRunner::health() const {
  std::optional<JobClient> c;
  {
    std::lock_guard lock(s_->mu);
    c = s_->client;
  }
  const int64_t now = wall_ms();
  if (!c) {
    HealthReport h;
    h.status = job_status_name(JobStatus::kCreated);
    h.reasons.push_back(HealthReason{"job-not-running", "the job is CREATED"});
    h.reason = h.reasons.back().message;
    return h;
  }
  HealthReport h = evaluate_job_health(*c, health_options(), s_->start_wall_ms, s_->source_health(now), now);
  for (const TransformWarning& w : transform_warnings())
    h.warnings.push_back(w.text);
  return h;
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
  Result<std::string> path = detail::expand_env(spec.source.get_string("path"));
  if (!path.ok()) return path.error();
  Result<std::vector<std::string>> files = sluice::detail::expand_file_paths({*path});
  if (!files.ok()) return files.error();
  std::vector<cdc::ChangeEvent> changes;
  for (const std::string& file : *files) {
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
