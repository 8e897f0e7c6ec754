#include "pipeline_command.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <optional>
#include <thread>

#include "sluice/cluster/ha/ha_options.h"
#include "sluice/core/config.h"
#include "sluice/core/error.h"
#include "sluice/graph/job_graph.h"
#include "sluice/graph/stream_graph.h"
#include "sluice/pipeline/pipeline_runner.h"
#include "sluice/pipeline/pipeline_spec.h"
#include "sluice/web/rest_server.h"

namespace sluice::cli {
namespace {

std::atomic<int> g_signal{0};

extern "C" void on_signal(int sig) {
  g_signal.store(sig);
}

Result<Configuration> overrides(const PipelineFlags& f) {
  Configuration c;
  for (const auto& p : f.props) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Error(ErrorCode::kConfiguration, fmt::format("-D {} is not of the form key=value", p));
    }
    std::string key = p.substr(0, eq);
    std::string value = p.substr(eq + 1);
    // HA is a cluster's (sluice jobmanager); a single process has no standby. Refused rather than dropped with a
    // "not an engine option" warning, so that nobody believes a `sluice run` is highly available.
    if (key.starts_with("high-availability.") && !(key == ha::options::kHaType.key && value == "none")) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("-D {}: high availability is for a cluster's JobManagers (sluice jobmanager, "
                               "docs/high-availability.md); sluice run runs the job in this one process, with no "
                               "standby to take over",
                               key));
    }
    c.set_string(std::move(key), std::move(value));
  }
  if (!f.from_savepoint.empty()) c.set_string(std::string(options::kStateRecoveryPath.key), f.from_savepoint);
  if (f.parallelism > 0) c.set(options::kParallelism, f.parallelism);
  if (f.allow_non_restored_state) c.set(options::kIgnoreUnclaimedState, true);
  return c;
}

// The file parsed and its job built (nothing started); prints the error and returns null when either fails.
struct Loaded {
  pipeline::PipelineSpec spec;
  std::unique_ptr<pipeline::PipelineRunner> runner;
};
std::optional<Loaded> load(const PipelineFlags& f) {
  Result<pipeline::PipelineSpec> spec = pipeline::load_pipeline(f.file);
  if (!spec.ok()) {
    fmt::print(stderr, "{}\n", spec.error().message());
    return std::nullopt;
  }
  Result<Configuration> o = overrides(f);
  if (!o.ok()) {
    fmt::print(stderr, "error: {}\n", o.error().message());
    return std::nullopt;
  }
  Result<std::unique_ptr<pipeline::PipelineRunner>> runner = pipeline::PipelineRunner::create(*spec, *o);
  if (!runner.ok()) {
    fmt::print(stderr, "{}\n", runner.error().message());
    return std::nullopt;
  }
  return Loaded{std::move(*spec), std::move(*runner)};
}

std::string describe(const pipeline::PipelineSpec& spec) {
  std::string sinks;
  for (const auto& s : spec.sinks)
    sinks += fmt::format("{}{} ({})", sinks.empty() ? "" : ", ", s.name, s.options.type);
  return fmt::format("pipeline '{}': source {}, {} transform(s), {} route(s), sinks {}", spec.pipeline.name,
                     spec.source.type, spec.transforms.size(), spec.routes.size(), sinks);
}

}  // namespace

std::pair<CLI::App*, CLI::App*> add_pipeline_commands(CLI::App& app, PipelineFlags& f) {
  auto* run = app.add_subcommand("run", "Run a pipeline file (CDC to domain events; docs/pipelines.md)");
  run->add_option("PIPELINE", f.file, "The pipeline YAML file")->required();
  run->add_option("-D", f.props, "Engine option key=value (repeatable), over the file's pipeline.config");
  run->add_option("-s,--from-savepoint", f.from_savepoint,
                  "Start from this savepoint or retained checkpoint (execution.state-recovery.path; by default "
                  "a run resumes from the latest checkpoint, or from the savepoint of `sluice stop`)");
  run->add_option("-p,--parallelism", f.parallelism,
                  "Parallelism of the job (parallelism.default), over the file's pipeline.parallelism; with -s "
                  "the new parallelism (keyed state is redistributed)")
      ->check(CLI::Range(1, 1024));
  run->add_flag("--allow-non-restored-state", f.allow_non_restored_state,
                "Start even if the savepoint holds state of an operator the job no longer has "
                "(execution.state-recovery.ignore-unclaimed-state)");
  run->add_option("--http-port,--rest-port", f.http_port,
                  "The one port of the job's REST API (sluice list/savepoint/stop/cancel), /metrics and /health "
                  "(overrides pipeline.http.port; 0 = any free port, -1 = off)")
      ->check(CLI::Range(-1, 65535));
  run->add_option("--linger", f.linger,
                  "Keep the port serving this long after the job ended (e.g. 10s): the job stays listed with its "
                  "final state, and /metrics and /health can be scraped")
      ->capture_default_str();
  run->add_flag("-q,--quiet", f.quiet, "Do not print the summary at the end");
  run->fallthrough();  // `sluice run FILE --log-level debug` works as well as `sluice --log-level debug run FILE`
  auto* validate = app.add_subcommand("validate", "Check a pipeline file without running it");
  validate->add_option("PIPELINE", f.file, "The pipeline YAML file")->required();
  validate->add_option("-D", f.props, "Engine option key=value (repeatable)");
  validate
      ->add_option("--sample", f.sample,
                   "Also run the transform over the first N records of the `files` source and print what each "
                   "step did to each (filter, key, event, routes), and the filters' warnings")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  validate->fallthrough();
  return {run, validate};
}

int validate_pipeline(const PipelineFlags& f) {
  std::optional<Loaded> loaded = load(f);
  if (!loaded) return 2;
  // The checks `sluice run` makes before it starts: the engine options (a bad value is an error, an unknown key a
  // warning) and the job graph (parallelism, uids), on a copy of the graph.
  StreamGraph graph = loaded->runner->stream_graph();
  Result<JobGraph> jg = [&]() -> Result<JobGraph> {
    try {
      return build_job_graph(graph);
    } catch (const SluiceException& e) {
      return e.error();
    }
  }();
  if (!jg.ok()) {
    fmt::print(stderr, "{}: {}\n", f.file, jg.error().to_string());
    return 2;
  }
  fmt::print("{}: valid; {}\n", f.file, describe(loaded->spec));
  if (f.sample > 0) {
    Result<std::string> sampled = pipeline::sample_transforms(loaded->spec, f.sample);
    if (!sampled.ok()) {
      fmt::print(stderr, "error: {}\n", sampled.error().message());
      return 2;
    }
    fmt::print("{}", *sampled);
  }
  return 0;
}

int run_pipeline(const PipelineFlags& f, bool log_level_given) {
  // One line per completed checkpoint is logged at info level; keep it unless the user chose a level.
  if (!log_level_given) spdlog::set_level(spdlog::level::info);
  // A fixed mmap threshold: glibc's dynamic one rises to the largest block freed (1–5 MiB request and batch
  // buffers of the sinks), after which such buffers come from the per-thread arenas, which keep the memory.
  // Measured on the CDC pipeline under load: 78–93 MiB peak RSS with the default, 53 MiB with this
  // (docs/benchmarks.md, "Pipelines"). Live heap was about 15 MiB in both (valgrind massif).
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  Result<int64_t> linger_ms = parse_duration_ms(f.linger);
  if (!linger_ms.ok() || *linger_ms < 0) {
    fmt::print(stderr, "error: --linger '{}' is not a duration (e.g. 0, 500ms, 10s)\n", f.linger);
    return 2;
  }
  std::optional<Loaded> loaded = load(f);
  if (!loaded) return 2;
  const pipeline::PipelineSpec* spec = &loaded->spec;
  pipeline::PipelineRunner& runner = *loaded->runner;
  // The operators as the REST API shows them while the job runs (start() hands the graph to the job).
  const JobPlan pipeline_plan = job_plan_of(runner.stream_graph());

  const int port = f.http_port != -2 ? f.http_port : spec->pipeline.http_port;
  // One port for everything an operator uses: the jobs REST API (sluice list/savepoint/stop/cancel), /metrics
  // and /health. Bound before the job starts, so a busy port fails the run before it touches any state.
  std::unique_ptr<RestServer> http;
  if (port >= 0) {
    RestServerOptions options;
    options.address = spec->pipeline.http_address;
    options.port = port;
    // rest.auth.* and security.ssl.rest.* from the file's pipeline.config and -D.
    if (Status st = apply_rest_security(runner.stream_graph().config(), options); !st.ok()) {
      fmt::print(stderr, "error: {}\n", st.error().message());
      return 2;
    }
    auto server = RestServer::start(options);
    if (!server.ok()) {
      fmt::print(stderr, "error: {}\n", server.error().message());
      return server.error().code() == ErrorCode::kConfiguration ? 2 : 1;
    }
    http = std::move(*server);
    http->serve_configuration(runner.stream_graph().config());
    http->serve_metrics([&runner] { return runner.metrics_text(); });
    http->serve_metric_samples([&runner] { return runner.metric_samples(); });
    http->serve_health([&runner] {
      pipeline::HealthReport h = runner.health();
      return HealthResponse{h.healthy, h.to_json()};
    });
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (Status st = runner.start(); !st.ok()) {
    fmt::print(stderr, "error: pipeline '{}' could not start: {}\n", spec->pipeline.name, st.error().to_string());
    return 1;
  }
  spdlog::info("pipeline '{}' started: {}", spec->pipeline.name, describe(*spec));
  if (http) {
    std::optional<JobClient> client = runner.client();
    if (client) http->register_job(spec->pipeline.name, *client, pipeline_plan);
    // The port and job id on one line of their own, so scripts and tests find an ephemeral port there.
    spdlog::info("pipeline '{}': REST API, /metrics and /health at {}, job id {}", spec->pipeline.name, http->url(),
                 client ? client->job_id() : std::string("-"));
  }
  // The job runs on its own threads; this thread waits for it or for a signal.
  bool signalled = false;
  while (true) {
    const JobStatus s = runner.status();
    if (job_status_terminal(s)) break;  // RESTARTING and FAILING jobs are still live
    runner.remove_superseded_checkpoints();
    runner.log_transform_warnings();
    if (g_signal.load() != 0 && !signalled) {
      signalled = true;
      spdlog::info("pipeline '{}': signal {} received, cancelling the job", spec->pipeline.name, g_signal.load());
      runner.cancel();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  JobResult result = runner.wait();
  runner.remove_superseded_checkpoints();  // a short run may have completed its first checkpoint only at its end
  runner.log_transform_warnings();         // a bounded run may end before the loop saw its filters' records
  if (!f.quiet) fmt::print("{}\n", runner.summary(result));
  std::fflush(stdout);  // before a linger: whoever reads the pipe sees the summary when the job ends
  // SIGTERM is how services are stopped: a clean cancel exits 0. SIGINT (Ctrl-C) exits 130, as shells expect,
  // so a script running `sluice run` stops too instead of going on as if the pipeline had finished.
  int rc = result.status == JobStatus::kFinished || (signalled && result.status == JobStatus::kCanceled) ? 0 : 1;
  if (rc == 0 && signalled && g_signal.load() == SIGINT) rc = 130;
  if (rc == 1) {
    fmt::print(stderr, "error: pipeline '{}' {}{}\n", spec->pipeline.name, job_status_name(result.status),
               result.error ? ": " + result.error->to_string() : "");
  }
  // `sluice stop` and `sluice savepoint` read the savepoint's path after the job ended: serve it first.
  if (http && !http->wait_for_fetched_operations(std::chrono::seconds(10))) {
    spdlog::warn("pipeline '{}': a savepoint's result was not fetched by a REST client within 10 s",
                 spec->pipeline.name);
  }
  if (http && *linger_ms > 0 && g_signal.load() == 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(*linger_ms);
    while (std::chrono::steady_clock::now() < until && g_signal.load() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return rc;
}

}  // namespace sluice::cli
