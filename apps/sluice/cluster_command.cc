#include "cluster_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "sluice/api/job.h"
#include "sluice/checkpoint/checkpoint_coordinator.h"
#include "sluice/cluster/cluster_options.h"
#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_options.h"
#include "sluice/cluster/ha/ha_store.h"
#include "sluice/cluster/ha/leader_election.h"
#include "sluice/cluster/job_graph_fingerprint.h"
#include "sluice/cluster/jobmanager/job_master.h"
#include "sluice/cluster/jobmanager/jobmanager_server.h"
#include "sluice/cluster/source_connection_report.h"
#include "sluice/cluster/source_lag_report.h"
#include "sluice/cluster/taskmanager/task_executor.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/config.h"
#include "sluice/core/s3_client.h"
#include "sluice/graph/job_graph.h"
#include "sluice/graph/stream_graph.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/pipeline/pipeline_spec.h"
#include "sluice/web/rest_server.h"
#include "taskmanager_http.h"

namespace sluice::cli {
namespace {

std::atomic<int> g_signal{0};

extern "C" void on_cluster_signal(int sig) {
  g_signal.store(sig);
}

/// The pipeline loaded, its graph fingerprinted, and the options split into cluster and engine options.
struct Prepared {
  pipeline::PipelineSpec spec;
  std::unique_ptr<pipeline::PipelineRunner> runner;
  JobGraphFingerprint fingerprint;
  Configuration cluster;  // heartbeat.*, jobmanager.rpc.*, taskmanager.* (never handed to the job)
  ha::HaOptions ha;       // high-availability.* (docs/high-availability.md)
  std::string text;       // the pipeline file's text (the HA store keeps it as the job's graph)
};

std::optional<Prepared> prepare(const ClusterFlags& f) {
  Configuration engine;
  Configuration high_availability;
  Prepared p;
  for (const auto& prop : f.props) {
    const auto eq = prop.find('=');
    if (eq == std::string::npos || eq == 0) {
      fmt::print(stderr, "error: -D {} is not of the form key=value\n", prop);
      return std::nullopt;
    }
    std::string key = prop.substr(0, eq);
    std::string value = prop.substr(eq + 1);
    if (is_cluster_option(key) || key == options::kTaskSlots.key) {
      p.cluster.set_string(std::move(key), std::move(value));
    } else if (key.starts_with("high-availability.")) {
      // A misspelt HA key would otherwise pass unnoticed (HA keys are not engine options, so no typo warning).
      if (!ha::is_ha_option(key)) {
        fmt::print(stderr,
                   "error: -D {}: unknown high-availability option (known: {}, {}, {}, {}; "
                   "docs/high-availability.md)\n",
                   key, ha::options::kHaType.key, ha::options::kEtcdEndpoints.key, ha::options::kClusterId.key,
                   ha::options::kLeaseTtl.key);
        return std::nullopt;
      }
      high_availability.set_string(std::move(key), std::move(value));
    } else {
      engine.set_string(std::move(key), std::move(value));
    }
  }
  Result<ha::HaOptions> ha_options = ha::HaOptions::from_configuration(high_availability);
  if (!ha_options.ok()) {
    fmt::print(stderr, "error: {}\n", ha_options.error().message());
    return std::nullopt;
  }
  p.ha = std::move(*ha_options);
  // The JobManager's restore point (TaskManagers get it with their deployment).
  if (!f.from_savepoint.empty()) engine.set(options::kStateRecoveryPath, f.from_savepoint);
  if (f.allow_non_restored) engine.set(options::kIgnoreUnclaimedState, true);
  Result<pipeline::PipelineSpec> spec = pipeline::load_pipeline(f.file);
  if (!spec.ok()) {
    fmt::print(stderr, "{}\n", spec.error().message());
    return std::nullopt;
  }
  Result<std::unique_ptr<pipeline::PipelineRunner>> runner = pipeline::PipelineRunner::create(*spec, engine);
  if (!runner.ok()) {
    fmt::print(stderr, "{}\n", runner.error().message());
    return std::nullopt;
  }
  // The process's S3 client from the job's s3.* options and the AWS environment, as `sluice run` configures it: the
  // JobManager writes _metadata and the TaskManagers write their state files to s3:// checkpoint directories.
  if (Status st = S3Client::configure((*runner)->stream_graph().config()); !st.ok()) {
    fmt::print(stderr, "error: {}\n", st.error().to_string());
    return std::nullopt;
  }
  Result<JobGraphFingerprint> fp = fingerprint_job_graph((*runner)->stream_graph());
  if (!fp.ok()) {
    fmt::print(stderr, "error: {}\n", fp.error().to_string());
    return std::nullopt;
  }
  {
    std::ifstream in(f.file, std::ios::binary);
    p.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  p.spec = std::move(*spec);
  p.runner = std::move(*runner);
  p.fingerprint = std::move(*fp);
  spdlog::debug("job graph of '{}' (fingerprint {}):\n{}", p.spec.pipeline.name, p.fingerprint.hex,
                p.fingerprint.canonical);
  return p;
}

template <class T>
std::optional<T> option(const Configuration& c, const ConfigOption<T>& o) {
  try {
    return c.get(o);
  } catch (const SluiceException& e) {
    fmt::print(stderr, "error: {}\n", e.error().message());
    return std::nullopt;
  }
}

/// The job graph every process builds from the pipeline (build_job_graph fills derived uids in its copy).
struct BuiltJob {
  std::unique_ptr<StreamGraph> graph;
  JobGraph jg;
};

std::optional<BuiltJob> build_job(const Prepared& p) {
  const StreamGraph& g = p.runner->stream_graph();
  BuiltJob b;
  b.graph = std::make_unique<StreamGraph>(g);
  Result<JobGraph> jg = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(*b.graph);
    } catch (const SluiceException& e) {
      return e.error();
    }
  }();
  if (!jg.ok()) {
    fmt::print(stderr, "error: {}\n", jg.error().to_string());
    return std::nullopt;
  }
  b.jg = std::move(*jg);
  return b;
}

std::unique_ptr<ha::EtcdClient> etcd_client(const ha::HaOptions& o) {
  ha::EtcdClientOptions eo;
  eo.endpoints = o.endpoints;
  eo.request_timeout = std::chrono::milliseconds(1000);
  eo.connect_timeout = std::chrono::milliseconds(500);
  auto c = ha::EtcdClient::create(std::move(eo));
  if (!c.ok()) {
    fmt::print(stderr, "error: {}\n", c.error().to_string());
    return nullptr;
  }
  return std::move(*c);
}

bool job_status_terminal_name(std::string_view s) {
  return s == "FINISHED" || s == "CANCELED" || s == "FAILED";
}

/// A JobManager that is no longer the leader stops at once, before anything else of it runs: no checkpoint
/// completes, no sink commits (Flink's JobManager also ends on a lost leadership; its supervisor restarts it).
[[noreturn]] void stop_as_former_leader(const std::string& reason) {
  spdlog::critical(
      "JobManager: no longer the leader ({}); exiting now without completing a checkpoint or letting "
      "sinks commit (a standby takes over the job)",
      reason);
  spdlog::default_logger()->flush();
  ::_exit(1);
}

/// A fenced write of the leader to the HA store, retried while etcd is briefly unavailable (a member restarting,
/// an etcd leader election) for at most one lease TTL: longer than that and this JobManager has lost its
/// leadership anyway. `write` gets the attempt number (1, 2, ...); a fenced write ends this JobManager.
Status write_as_leader(std::chrono::seconds ttl, const std::string& what,
                       const std::function<Result<ha::FencedWrite>(int attempt)>& write) {
  const auto deadline = std::chrono::steady_clock::now() + ttl;
  for (int attempt = 1;; ++attempt) {
    auto w = write(attempt);
    if (w.ok() && *w == ha::FencedWrite::kFenced) stop_as_former_leader(what + " was fenced");
    if (w.ok()) return ok_status();
    if (w.error().code() != ErrorCode::kConnector || std::chrono::steady_clock::now() >= deadline) {
      return w.error().with_context(fmt::format("{} in etcd ({} attempt(s))", what, attempt));
    }
    spdlog::warn("JobManager: {} failed, retrying: {}", what, w.error().to_string());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // etcd is electing or restarting a member
  }
}

void install_signals() {
  std::signal(SIGINT, on_cluster_signal);
  std::signal(SIGTERM, on_cluster_signal);
}

}  // namespace

std::pair<CLI::App*, CLI::App*> add_cluster_commands(CLI::App& app, ClusterFlags& f) {
  auto* jm = app.add_subcommand(
      "jobmanager",
      "Run a cluster's JobManager for a pipeline file: waits for TaskManagers' slots, "
      "deploys the job's tasks to them, coordinates checkpoints, exits when the job ends "
      "(a failure restarts the whole job from its latest checkpoint; savepoints and stop-with-savepoint through the "
      "REST API, sluice savepoint/stop; -s restores one at any parallelism; docs/cluster.md). With "
      "-D high-availability.type=etcd it campaigns first and a standby takes over from the latest checkpoint; "
      "SIGTERM then suspends the job for the standby instead of cancelling it, as it does without "
      "(docs/high-availability.md)");
  jm->add_option("PIPELINE", f.file, "The pipeline YAML file (every process of the cluster gets the same one)")
      ->required();
  jm->add_option("--rpc-port", f.rpc_port,
                 "Port of the RPC service TaskManagers register with (jobmanager.rpc.port, default 6123; 0 = any "
                 "free port, printed at start)")
      ->check(CLI::Range(0, 65535));
  jm->add_option("--rest-port", f.rest_port, "Port of the REST API (jobs, /taskmanagers); 0 = any free port, -1 = none")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  jm->add_option("-D", f.props,
                 "Option key=value (repeatable): heartbeat.interval, heartbeat.timeout, jobmanager.rpc.address, "
                 "... and the job's engine options");
  jm->add_option("-s,--from-savepoint", f.from_savepoint,
                 "Start the job from this savepoint or retained checkpoint (execution.state-recovery.path), at the "
                 "parallelism of this run: keyed state moves by key group, operator state round robin");
  jm->add_flag("--allow-non-restored-state", f.allow_non_restored,
               "Start even if the savepoint holds state of an operator the job no longer has "
               "(execution.state-recovery.ignore-unclaimed-state)");
  jm->add_option("--linger", f.linger,
                 "Keep the REST API serving this long after the job ended (e.g. 10s): the job stays listed with its "
                 "final state and counts, and /metrics and /health can be scraped")
      ->capture_default_str();
  jm->fallthrough();

  auto* tm = app.add_subcommand(
      "taskmanager",
      "Run a cluster's TaskManager: registers its slots with the JobManager and runs the tasks it deploys "
      "(docs/cluster.md)");
  tm->add_option("PIPELINE", f.file, "The same pipeline YAML file as the JobManager's")->required();
  tm->add_option("--jobmanager", f.jobmanager,
                 "HOST:PORT of the JobManager's RPC service (required unless high-availability.type: etcd, where "
                 "the TaskManager finds the leader through etcd)");
  tm->add_option("--slots", f.slots, "Task slots it offers (taskmanager.numberOfTaskSlots; default 1)")
      ->check(CLI::Range(1, 1024));
  tm->add_option("--rpc-port", f.rpc_port, "Port of its own RPC service (taskmanager.rpc.port; default 0 = any)")
      ->check(CLI::Range(0, 65535));
  tm->add_option("--http-port", f.http_port,
                 "Port of its /health (200 while registered with a JobManager) and /metrics, on taskmanager.host; "
                 "0 = any free port; default none")
      ->check(CLI::Range(0, 65535));
  tm->add_option("-D", f.props,
                 "Option key=value (repeatable): heartbeat.interval, heartbeat.timeout, taskmanager.host, "
                 "cluster.registration.*, ... and the job's engine options (the same as the JobManager's)");
  tm->fallthrough();
  return {jm, tm};
}

int run_jobmanager(const ClusterFlags& f, const std::string& version, bool log_level_given) {
  if (!log_level_given) spdlog::set_level(spdlog::level::info);
  std::optional<Prepared> p = prepare(f);
  if (!p) return 2;
  Result<HeartbeatOptions> hb = heartbeat_options(p->cluster);
  if (!hb.ok()) {
    fmt::print(stderr, "error: {}\n", hb.error().message());
    return 2;
  }
  std::optional<std::string> address = option(p->cluster, options::kJobManagerRpcAddress);
  std::optional<int32_t> port = option(p->cluster, options::kJobManagerRpcPort);
  if (!address || !port) return 2;
  Result<int64_t> linger_ms = parse_duration_ms(f.linger);
  if (!linger_ms.ok() || *linger_ms < 0) {
    fmt::print(stderr, "error: --linger '{}' is not a duration (e.g. 0, 500ms, 10s)\n", f.linger);
    return 2;
  }
  const std::string& name = p->spec.pipeline.name;
  const int needed = p->fingerprint.required_slots;
  std::optional<BuiltJob> built = build_job(*p);
  if (!built) return 2;
  // Every option is checked before the RPC service starts: a bad value exits 2 without serving anything.
  std::optional<int64_t> slot_timeout = option(p->cluster, options::kSlotRequestTimeout);
  std::optional<bool> evenly = option(p->cluster, options::kEvenlySpreadOutSlots);
  if (!slot_timeout || !evenly) return 2;

  JobManagerServerOptions o;
  o.address = *address;
  o.port = f.rpc_port != -2 ? f.rpc_port : *port;
  o.heartbeat = *hb;
  o.job = JobGraphIdentity{p->fingerprint.hex, name, version, digest_pipeline_text(p->text)};
  auto server = JobManagerServer::start(o, SystemClock::instance());
  if (!server.ok()) {
    fmt::print(stderr, "error: {}\n", server.error().message());
    return 1;
  }
  JobManagerServer& jm = **server;
  spdlog::info("JobManager of pipeline '{}' (job graph fingerprint {}, sluice {}): RPC at {}", name, p->fingerprint.hex,
               version, jm.target());

  std::random_device rd;  // a job id, not data
  JobMasterOptions mo;
  mo.job_id = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
  mo.job_name = name;
  mo.slot_request_timeout_ms = *slot_timeout;
  mo.evenly_spread = *evenly;
  mo.unreachable_exclusion_ms = hb->timeout_ms;
  Configuration job_config = built->graph->config();

  // High availability: campaign before serving anything; a standby blocks here until it leads.
  install_signals();
  std::unique_ptr<ha::EtcdClient> etcd;
  std::unique_ptr<ha::EtcdLeaderElection> election;
  std::unique_ptr<ha::EtcdHaStore> store;
  ha::LeaderEpoch epoch;
  if (p->ha.enabled) {
    etcd = etcd_client(p->ha);
    if (!etcd) return 2;
    const ha::HaKeys keys(p->ha.cluster_id);
    ha::LeaderElectionOptions eo;
    eo.leader_key = keys.leader();
    eo.address = jm.target();
    eo.lease_ttl = p->ha.lease_ttl;
    eo.on_lost = [](const std::string& reason) { stop_as_former_leader(reason); };
    election = std::make_unique<ha::EtcdLeaderElection>(*etcd, eo);
    store = std::make_unique<ha::EtcdHaStore>(*etcd, keys);
    spdlog::info("JobManager {} campaigns for the leadership of cluster '{}' on etcd {} (lease TTL {} s)", jm.target(),
                 p->ha.cluster_id, fmt::join(p->ha.endpoints, ","), p->ha.lease_ttl.count());
    std::string last_error;
    for (;;) {
      if (g_signal.load() != 0) {
        spdlog::info("JobManager: signal {} received while standing by; shutting down", g_signal.load());
        jm.stop();
        return 0;
      }
      auto r = election->campaign(std::chrono::milliseconds(1000));
      if (!r.ok()) {
        if (r.error().message() != last_error) spdlog::warn("JobManager: {}", r.error().to_string());
        last_error = r.error().message();
        continue;
      }
      if (r->has_value()) {
        epoch = **r;
        break;
      }
    }
    jm.set_leader_epoch(epoch.create_revision);
    spdlog::info("JobManager {} is the leader of cluster '{}' (epoch {}, lease {:x})", jm.target(), p->ha.cluster_id,
                 epoch.create_revision, epoch.lease_id);
    // The job of this pipeline file that a former leader ran, if any: resumed with its id from its pointer.
    auto fail = [&](const Error& e) {
      fmt::print(stderr, "error: {}\n", e.to_string());
      (void)election->resign();
      jm.stop();
      return 1;
    };
    auto ids = store->job_ids();
    if (!ids.ok()) return fail(ids.error());
    bool resumed = false;
    for (const std::string& id : *ids) {
      auto record = store->job(id);
      auto status = store->job_status(id);
      if (!record.ok()) return fail(record.error());
      if (!status.ok()) return fail(status.error());
      const std::string st = status->value_or("");
      if (!record->has_value()) continue;
      if ((*record)->graph != p->text) {
        if (job_status_terminal_name(st)) continue;
        fmt::print(stderr,
                   "error: cluster '{}' in etcd runs job {} ('{}', {}) of another pipeline file; give this JobManager "
                   "the same file, or another high-availability.cluster-id\n",
                   p->ha.cluster_id, id, (*record)->name, st);
        (void)election->resign();
        jm.stop();
        return 2;
      }
      if (job_status_terminal_name(st)) {
        // Flink's job result store: a job that reached a terminal state is not run again by a new leader.
        spdlog::info(
            "job '{}' ({}) of this pipeline already ended {} under a former leader: nothing to recover; the "
            "JobManager shuts down (remove /sluice/{}/jobs/{}/ from etcd, or use another "
            "high-availability.cluster-id, to run it again)",
            name, id, st, p->ha.cluster_id, id);
        (void)election->resign();
        jm.stop();
        return st == "FAILED" ? 1 : 0;
      }
      mo.job_id = id;
      resumed = true;
      if (st == "SUSPENDED") {
        spdlog::info("job '{}' ({}) was suspended by its former leader at that JobManager's shutdown: resuming it",
                     name, id);
      }
      auto pointer = store->latest_checkpoint(id);
      if (!pointer.ok()) return fail(pointer.error());
      mo.resumed_checkpoint_id = pointer->has_value() ? (*pointer)->checkpoint_id : 0;
      // Above every attempt a former leader deployed (one that recorded none, of an older build, ran attempt 0 at
      // least).
      auto last_attempt = store->attempt(id);
      if (!last_attempt.ok()) return fail(last_attempt.error());
      mo.first_attempt = last_attempt->value_or(0) + 1;
      if (pointer->has_value()) {
        job_config.set_string(std::string(options::kStateRecoveryPath.key), (*pointer)->external_path);
        spdlog::info(
            "job '{}' ({}) resumes from checkpoint {} at {} (the latest-checkpoint pointer in etcd, written "
            "by epoch {})",
            name, id, (*pointer)->checkpoint_id, (*pointer)->external_path, (*pointer)->leader_epoch);
      } else {
        spdlog::info("job '{}' ({}) resumes from its start: a former leader ran it ({}) but completed no checkpoint",
                     name, id, st);
      }
      break;
    }
    ha::HaJobRecord record{mo.job_id, name, p->text, "pipeline"};
    auto put = resumed ? store->set_job_status(epoch, mo.job_id, "CREATED") : store->put_job(epoch, record, "CREATED");
    if (!put.ok()) return fail(put.error());
    if (*put == ha::FencedWrite::kFenced) stop_as_former_leader("recording the job in etcd was fenced");
    mo.publish_checkpoint = [s = store.get(), epoch, job_id = mo.job_id, ttl = p->ha.lease_ttl](
                                int64_t id, const std::string& path) -> Status {
      ha::CheckpointPointer pointer;
      pointer.checkpoint_id = id;
      pointer.external_path = path;
      pointer.completed_at_ms = SystemClock::instance().now_ms();
      pointer.leader_epoch = epoch.create_revision;
      return write_as_leader(ttl, fmt::format("moving the latest-checkpoint pointer to checkpoint {}", id),
                             [&](int attempt) -> Result<ha::FencedWrite> {
                               if (attempt > 1) {
                                 // An earlier attempt may have applied with its answer lost: then the pointer is
                                 // already ours.
                                 auto now = s->latest_checkpoint(job_id);
                                 if (now.ok() && now->has_value() && (*now)->checkpoint_id == id &&
                                     (*now)->leader_epoch == epoch.create_revision) {
                                   return ha::FencedWrite::kApplied;
                                 }
                               }
                               return s->set_latest_checkpoint(epoch, job_id, pointer);
                             });
    };
    // Recording the same attempt again is applied, so a retry after a lost answer needs no check of its own.
    mo.record_attempt = [s = store.get(), epoch, job_id = mo.job_id, ttl = p->ha.lease_ttl](int attempt) -> Status {
      return write_as_leader(ttl, fmt::format("recording deployment attempt {}", attempt),
                             [&](int) { return s->set_attempt(epoch, job_id, attempt); });
    };
    mo.is_leader = [e = election.get()] { return e->is_leader(); };
  }

  // Without high availability a JobManager started again (after a crash, a kill, a SIGTERM) resumes the pipeline
  // as `sluice run` does: from the latest checkpoint in the pipeline's checkpoint storage, skipping jobs that
  // finished (their `_finished` marker) and resuming a stopped one from its savepoint. Starting over instead
  // would write every record again: an exactly-once sink's output held each record twice. -s PATH chooses.
  // The pipeline's checkpoint storage, "" when it does not checkpoint.
  const std::string checkpoint_storage = [&] {
    auto ck = CheckpointCoordinatorOptions::from_config(job_config);
    return ck.ok() && ck->interval_ms > 0 ? job_config.get(options::kCheckpointDir) : std::string();
  }();
  if (!p->ha.enabled && !job_config.contains(options::kStateRecoveryPath.key) && !checkpoint_storage.empty()) {
    const std::string latest = pipeline::find_latest_checkpoint(checkpoint_storage);
    if (!latest.empty()) {
      job_config.set(options::kStateRecoveryPath, latest);
      spdlog::info(
          "job '{}' resumes from {}, the latest checkpoint of an earlier run of this pipeline in {} (as "
          "`sluice run` does; -s PATH restores another one)",
          name, latest, checkpoint_storage);
    }
  }

  auto master = std::make_shared<JobMaster>(mo, built->jg, jm, SystemClock::instance());
  if (Status st = master->init_checkpoints(job_config); !st.ok()) {
    fmt::print(stderr, "error: {}\n", st.error().to_string());
    return 2;
  }
  if (Status st = master->init_restart_strategy(built->graph->config()); !st.ok()) {
    fmt::print(stderr, "error: {}\n", st.error().to_string());
    return 2;
  }
  JobClient client(master);
  std::unique_ptr<RestServer> rest;
  if (f.rest_port >= 0) {
    RestServerOptions ro;
    ro.port = f.rest_port;
    // rest.address binds the REST API elsewhere than the RPC service (0.0.0.0 on Kubernetes, where
    // jobmanager.rpc.address is the pod's IP that the leader publishes and kubectl port-forward comes from localhost).
    const Configuration& engine_config = p->runner->stream_graph().config();
    ro.address =
        engine_config.contains(options::kRestAddress.key) ? engine_config.get(options::kRestAddress) : *address;
    if (Status st = apply_rest_security(engine_config, ro); !st.ok()) {
      fmt::print(stderr, "error: {}\n", st.error().message());
      return 2;
    }
    auto r = RestServer::start(ro);
    if (!r.ok()) {
      fmt::print(stderr, "error: {}\n", r.error().message());
      return r.error().code() == ErrorCode::kConfiguration ? 2 : 1;
    }
    rest = std::move(*r);
    rest->serve_configuration(p->runner->stream_graph().config());
    rest->register_job(name, client, job_plan_of(p->runner->stream_graph()),
                       [m = master.get()] { return m->status_message(); });
    rest->serve_subtask_locations(client.job_id(), [&jm, m = master.get()] {
      std::map<std::string, std::string> address;  // resource id -> RPC address of the registered ones
      for (const auto& t : jm.task_managers())
        address[t.resource_id] = t.rpc_address;
      std::vector<RestSubtaskLocation> out;
      for (const SubtaskLocation& l : m->placement()) {
        auto it = address.find(l.task_manager);
        out.push_back(RestSubtaskLocation{l.vertex, l.subtask, l.task_manager,
                                          it == address.end() ? std::string() : it->second, l.slot, l.attempt,
                                          l.execution_state});
      }
      return out;
    });
    // The pipeline's health.* bounds and checkpoint interval, as `sluice run` applies them.
    rest->serve_health_options(client.job_id(), p->runner->health_options());
    // The TaskManagers' heartbeats carry their source readers' connections: /health names a disconnected one
    // (source-disconnected, with its subtask and TaskManager) as `sluice run`'s does. They also carry each
    // source's lag as the readers in their process measure it: a source lags as much as its most lagging
    // TaskManager says (source-lag past health.max-source-lag; `sluice_source_lag_ms` on /metrics).
    rest->serve_source_health(client.job_id(), [&jm] {
      std::map<std::pair<std::string, std::string>, SourceHealth> by_source;
      for (const ReportedSourceLag& r : jm.source_lags()) {
        SourceHealth& s = by_source[{r.lag.source, r.lag.description}];
        s.name = r.lag.source;
        s.description = r.lag.description;
        s.lag_ms = std::max(s.lag_ms, r.lag.lag_ms);
      }
      for (const ReportedSourceConnection& r : jm.source_connections()) {
        const SourceConnectionReport& c = r.connection;
        SourceHealth& s = by_source[{c.source, c.description}];
        s.name = c.source;
        s.description = c.description;
        if (!c.connected) {
          s.disconnected.push_back(SourceHealth::Disconnected{c.subtask, c.disconnected_ms, c.reason, r.task_manager});
        }
      }
      std::vector<SourceHealth> out;
      for (auto& [key, s] : by_source)
        out.push_back(std::move(s));
      return out;
    });
    // The `sourceConnected` gauge per source subtask, as `sluice run`'s /metrics has it (the alert rule
    // SluiceSourceDisconnected reads it): 1 connected, 0 disconnected, -1 when no TaskManager reports the reader.
    if (metrics::JobMetrics* job_metrics = rest->job_metrics(client.job_id())) {
      for (const JobVertex& v : built->jg.vertices) {
        for (const int id : v.chained_nodes) {
          const StreamNode& n = built->graph->node(id);
          const std::string uid = n.uid.value_or(n.derived_uid);
          if (uid != "source") continue;  // the pipeline's source operator (pipeline_sources.cc)
          for (int subtask = 0; subtask < v.parallelism; ++subtask) {
            job_metrics->task_job_group()
                .add_group("task", {{"task_name", v.name}, {"subtask_index", std::to_string(subtask)}})
                .add_group("operator", {{"operator_name", n.name}, {"operator_id", uid}})
                .gauge(
                    "sourceConnected",
                    [&jm, subtask] {
                      for (const ReportedSourceConnection& r : jm.source_connections()) {
                        if (r.connection.subtask == subtask) return r.connection.connected ? 1.0 : 0.0;
                      }
                      return -1.0;
                    },
                    "1 while the source subtask is connected to its system, 0 while disconnected, -1 when no "
                    "TaskManager reports its reader (as their heartbeats say).");
          }
        }
      }
    }
    rest->serve_task_managers([&jm] {
      std::vector<RestTaskManagerInfo> out;
      for (const auto& t : jm.task_managers()) {
        out.push_back(RestTaskManagerInfo{t.resource_id, t.registration_id, t.rpc_address, t.data_address, t.hostname,
                                          t.pid, t.slots_total, t.slots_free, t.registered_ms, t.last_heartbeat_ms});
      }
      return out;
    });
    // On a line of its own: scripts and tests find an ephemeral port there.
    spdlog::info("JobManager REST API at {}, job id {}", rest->url(), client.job_id());
  }
  spdlog::info(
      "job '{}' needs {} slots ({} tasks in {} vertices)", name, needed,
      [&] {
        int n = 0;
        for (const auto& v : built->jg.vertices)
          n += v.parallelism;
        return n;
      }(),
      built->jg.vertices.size());
  master->start();

  // With HA the job's status is kept in etcd (fenced), so a new leader knows whether to resume it.
  std::optional<JobStatus> stored;
  auto store_status = [&](JobStatus now) {
    if (!store || stored == now) return;
    auto w = store->set_job_status(epoch, mo.job_id, job_status_name(now));
    if (!w.ok()) {
      spdlog::warn("JobManager: cannot record the job's status {} in etcd: {}", job_status_name(now),
                   w.error().to_string());
      return;
    }
    if (*w == ha::FencedWrite::kFenced) stop_as_former_leader("recording the job's status in etcd was fenced");
    stored = now;
  };
  while (g_signal.load() == 0 && !job_status_terminal(client.status())) {
    store_status(client.status());
    client.wait_for(std::chrono::milliseconds(100));
  }
  if (const int sig = g_signal.load(); sig != 0) {
    if (store) {
      // Flink's behaviour on a JobManager shutdown with HA (a rolling update, a deleted pod): the job is suspended,
      // not cancelled. Its checkpoints and its non-terminal status in etcd stay; a standby (or this JobManager
      // started again) resumes it from the latest checkpoint. Only `sluice cancel` ends it for good.
      spdlog::info(
          "JobManager: signal {} received with high availability: suspending job '{}' ({}) instead of cancelling it "
          "(its tasks are cancelled, its checkpoints kept, its status in etcd stays non-terminal) and releasing the "
          "leadership so that a standby resumes it from the latest checkpoint",
          sig, name, mo.job_id);
      master->suspend(fmt::format("the JobManager leader received signal {} and shuts down", sig));
    } else {
      spdlog::info("JobManager: signal {} received, cancelling the job and shutting down", sig);
      client.cancel();
    }
    client.wait_for(std::chrono::seconds(30));
  }
  const JobStatus final_status = client.status();
  if (final_status == JobStatus::kCanceled) spdlog::info("job '{}' CANCELED; the JobManager shuts down", name);
  if (final_status == JobStatus::kFinished) {
    spdlog::info("job '{}' FINISHED; the JobManager shuts down", name);
    // The next run of this pipeline is a new job (or resumes from the savepoint of `sluice stop`), not a resumption
    // of this one's last checkpoint.
    if (!checkpoint_storage.empty()) {
      pipeline::mark_job_ended(checkpoint_storage, mo.job_id, client.checkpoint_stats(), name);
    }
  }
  if (store && job_status_terminal(final_status)) {
    // The end of the job must reach etcd before the leadership goes, or a standby would run an ended job again:
    // retried while etcd is briefly unavailable, for at most one lease TTL.
    const auto deadline = std::chrono::steady_clock::now() + p->ha.lease_ttl;
    while (stored != final_status && std::chrono::steady_clock::now() < deadline) {
      store_status(final_status);
      if (stored != final_status) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (stored != final_status) {
      spdlog::error("JobManager: the job's end ({}) could not be recorded in etcd; a new leader may run it again",
                    job_status_name(final_status));
    }
  } else {
    store_status(final_status);
  }
  if (final_status == JobStatus::kSuspended) {
    auto pointer = store->latest_checkpoint(mo.job_id);
    spdlog::info("job '{}' ({}) SUSPENDED; the next leader resumes it from {}", name, mo.job_id,
                 !pointer.ok() ? "the latest checkpoint in etcd"
                 : pointer->has_value()
                     ? fmt::format("checkpoint {} at {}", (*pointer)->checkpoint_id, (*pointer)->external_path)
                     : std::string("its start (no checkpoint completed)"));
  }
  // A stop-with-savepoint ends the job: `sluice stop` (or any REST client) still has to fetch its result.
  if (rest && !rest->wait_for_fetched_operations(std::chrono::seconds(10))) {
    spdlog::warn("a savepoint's result was not fetched by a REST client within 10 s");
  }
  if (rest && *linger_ms > 0 && g_signal.load() == 0) {
    spdlog::info("JobManager: the REST API serves the ended job for {} ms more (--linger)", *linger_ms);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(*linger_ms);
    while (std::chrono::steady_clock::now() < until && g_signal.load() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (rest) rest->stop();
  master.reset();
  client = JobClient(nullptr);
  if (election) {
    // The job's end (or its suspension) is recorded: a standby elected now finds it ended and shuts down too, or
    // resumes the suspended job. Resigning deletes the leader key and revokes the lease, so the standby need not
    // wait for the lease TTL.
    if (Status st = election->resign(); !st.ok()) {
      spdlog::warn("JobManager: resigning: {} (a standby leads once the lease expires, within {} s)",
                   st.error().to_string(), p->ha.lease_ttl.count());
    } else {
      spdlog::info("JobManager {} released the leadership of cluster '{}' (leader key deleted, lease {:x} revoked)",
                   jm.target(), p->ha.cluster_id, epoch.lease_id);
    }
  }
  jm.stop();
  return final_status == JobStatus::kFailed ? 1 : 0;
}

int run_taskmanager(const ClusterFlags& f, const std::string& version, bool log_level_given) {
  if (!log_level_given) spdlog::set_level(spdlog::level::info);
  // A bad address would only show as endless failed registrations (gRPC wraps port 99999 to 34463 and retries).
  if (!f.jobmanager.empty() && f.jobmanager.find("://") == std::string::npos && !f.jobmanager.starts_with("unix:")) {
    const auto colon = f.jobmanager.rfind(':');
    int port = 0;
    const char* first = colon == std::string::npos ? nullptr : f.jobmanager.data() + colon + 1;
    const char* last = f.jobmanager.data() + f.jobmanager.size();
    const bool port_ok = first != nullptr && std::from_chars(first, last, port).ptr == last && first != last &&
                         port >= 1 && port <= 65535;
    if (colon == 0 || !port_ok) {
      fmt::print(stderr,
                 "error: --jobmanager '{}' is not HOST:PORT with a port of 1..65535 (the JobManager's "
                 "--rpc-port, default 6123)\n",
                 f.jobmanager);
      return 2;
    }
  }
  std::optional<Prepared> p = prepare(f);
  if (!p) return 2;
  if (p->ha.enabled && !f.jobmanager.empty()) {
    fmt::print(stderr,
               "error: --jobmanager is not used with high-availability.type: etcd: a TaskManager finds the JobManager "
               "leader through etcd (docs/high-availability.md)\n");
    return 2;
  }
  if (!p->ha.enabled && f.jobmanager.empty()) {
    fmt::print(stderr,
               "error: --jobmanager HOST:PORT is required (the JobManager's RPC service), unless "
               "high-availability.type: etcd names where to find the leader\n");
    return 2;
  }
  Result<HeartbeatOptions> hb = heartbeat_options(p->cluster);
  Result<RegistrationBackoff> backoff = registration_backoff(p->cluster);
  if (!hb.ok() || !backoff.ok()) {
    fmt::print(stderr, "error: {}\n", (!hb.ok() ? hb.error() : backoff.error()).message());
    return 2;
  }
  std::optional<std::string> address = option(p->cluster, options::kTaskManagerRpcAddress);
  std::optional<int32_t> port = option(p->cluster, options::kTaskManagerRpcPort);
  std::optional<int32_t> slots = option(p->cluster, options::kTaskSlots);
  if (!address || !port || !slots) return 2;

  std::optional<BuiltJob> built = build_job(*p);
  if (!built) return 2;
  std::optional<int32_t> data_port = option(p->cluster, options::kTaskManagerDataPort);
  if (!data_port) return 2;

  TaskExecutorOptions o;
  o.graph = built->graph.get();
  o.job_graph = &built->jg;
  o.data_port = *data_port;
  o.jobmanager = f.jobmanager;
  o.address = *address;
  o.port = f.rpc_port != -2 ? f.rpc_port : *port;
  o.slots = f.slots > 0 ? f.slots : (*slots > 0 ? *slots : 1);
  o.job = JobGraphIdentity{p->fingerprint.hex, p->spec.pipeline.name, version, digest_pipeline_text(p->text)};
  o.heartbeat = *hb;
  o.backoff = *backoff;
  // The readers of the job's source that run here (the tasks are built from p->runner's graph, so its source
  // object is theirs), reported with every heartbeat for the JobManager's /health.
  o.source_connections = [runner = p->runner.get()] {
    const pipeline::PipelineRunner::SourceConnections c = runner->source_connections();
    std::vector<SourceConnectionReport> out;
    out.reserve(c.readers.size());
    for (const SourceConnection& r : c.readers)
      out.push_back(
          SourceConnectionReport{c.source, c.description, r.subtask, r.connected, r.disconnected_ms, r.reason});
    return out;
  };
  // The source's lag as this process's readers measure it, with every heartbeat: the JobManager's /health says
  // `source-lag` past health.max-source-lag as `sluice run`'s does.
  o.source_lags = [runner = p->runner.get()] {
    const pipeline::PipelineRunner::SourceConnections c = runner->source_connections();
    return std::vector<SourceLagReport>{SourceLagReport{c.source, c.description, runner->source_lag_ms()}};
  };
  std::shared_ptr<ha::EtcdClient> etcd;
  if (p->ha.enabled) {
    etcd = etcd_client(p->ha);
    if (!etcd) return 2;
    o.find_leader = [etcd, key = ha::HaKeys(p->ha.cluster_id).leader()]() -> Result<std::optional<JobManagerLeader>> {
      SLUICE_ASSIGN_OR_RETURN(auto l, ha::read_leader(*etcd, key));
      if (!l.has_value()) return std::optional<JobManagerLeader>();
      return std::optional<JobManagerLeader>(JobManagerLeader{l->address, l->epoch.create_revision});
    };
    o.leader_poll_ms = std::min<int64_t>(250, hb->interval_ms);
  }
  auto executor = TaskExecutor::start(o, SystemClock::instance());
  if (!executor.ok()) {
    fmt::print(stderr, "error: {}\n", executor.error().message());
    return executor.error().code() == ErrorCode::kConfiguration ? 2 : 1;
  }
  spdlog::info("TaskManager {} of pipeline '{}' (job graph fingerprint {}, sluice {}): RPC at {}, data plane at {}",
               (*executor)->resource_id(), p->spec.pipeline.name, p->fingerprint.hex, version,
               (*executor)->rpc_address(), (*executor)->data_address());
  std::unique_ptr<MetricsServer> http;
  if (f.http_port >= 0) {
    TaskExecutor* ex = executor->get();
    auto h = MetricsServer::start(
        o.address, f.http_port,
        [ex, slots = o.slots] { return taskmanager_metrics(ex->status(), slots, ex->resource_id()); },
        [ex, jm = o.jobmanager] { return taskmanager_health(ex->status(), jm); });
    if (!h.ok()) {
      fmt::print(stderr, "error: {}\n", h.error().message());
      (*executor)->stop();
      (void)(*executor)->wait();
      return 1;
    }
    http = std::move(*h);
    // On a line of its own: scripts and tests find an ephemeral port there.
    spdlog::info("TaskManager /health and /metrics at http://{}:{}", o.address, http->port());
  }
  install_signals();
  while (g_signal.load() == 0 && !(*executor)->done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a process waiting for a signal
  }
  if (g_signal.load() != 0) spdlog::info("TaskManager: signal {} received, shutting down", g_signal.load());
  if (http) http->stop();
  (*executor)->stop();
  Status st = (*executor)->wait();
  if (!st.ok()) {
    fmt::print(stderr, "error: {}\n", st.error().message());
    return 1;
  }
  return 0;
}

}  // namespace sluice::cli
