// The `sluice` command line: version, the bundled examples (the pipeline runner comes with `sluice run`), and
// the client commands of a running job's REST API (list, savepoint, stop, cancel), as Flink's `flink` CLI.
#include <curl/curl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster_command.h"
#include "ha_command.h"
#include "pipeline_command.h"
#include "rest_client.h"
#include "sluice/api/stream_environment.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/logging.h"
#include "sluice/web/rest_server.h"
#include "verify_command.h"
#include "word_count.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif
#ifndef SLUICE_EXAMPLES_DATA_DIR
#define SLUICE_EXAMPLES_DATA_DIR "examples/data"
#endif

namespace {

using sluice::Configuration;
using sluice::JobResult;
using sluice::StreamEnvironment;
using sluice::Value;

constexpr int kDefaultRestPort = 8081;
constexpr const char* kDefaultJobManager = "127.0.0.1:8081";

/// The flags of every command that runs a job (the examples now, `sluice run` later).
struct JobFlags {
  int parallelism = 2;
  std::vector<std::string> props;
  std::string checkpoint_dir;
  std::string checkpoint_interval;
  std::string from_savepoint;
  bool allow_non_restored_state = false;
  int rest_port = kDefaultRestPort;
};

void add_job_flags(CLI::App* cmd, JobFlags& f) {
  cmd->add_option("-p,--parallelism", f.parallelism,
                  "Parallelism (with --from-savepoint: the new parallelism; keyed state is redistributed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--checkpoint-dir", f.checkpoint_dir,
                  "Directory of checkpoints (execution.checkpointing.dir); savepoints go to DIR/savepoints unless "
                  "execution.checkpointing.savepoint-dir is set");
  cmd->add_option("--checkpoint-interval", f.checkpoint_interval,
                  "Time between checkpoints, e.g. 10s or 200ms (execution.checkpointing.interval); needs "
                  "--checkpoint-dir");
  cmd->add_option("-s,--from-savepoint", f.from_savepoint,
                  "Start from this savepoint or retained checkpoint (execution.state-recovery.path)");
  cmd->add_flag("--allow-non-restored-state", f.allow_non_restored_state,
                "Start even if the savepoint holds state of an operator the job no longer has "
                "(execution.state-recovery.ignore-unclaimed-state)");
  cmd->add_option("--rest-port", f.rest_port,
                  "Port of the job's REST API (sluice list/savepoint/stop/cancel talk to it); 0 = any free port, "
                  "-1 = no REST API")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  cmd->add_option("-D", f.props, "Configuration key=value (repeatable)");
}

/// Applies `-D key=value` flags to the environment's configuration; returns false on a malformed one.
bool apply_properties(StreamEnvironment& env, const std::vector<std::string>& props) {
  for (const auto& p : props) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      fmt::print(stderr, "error: -D {} is not of the form key=value\n", p);
      return false;
    }
    env.config().set_string(p.substr(0, eq), p.substr(eq + 1));
  }
  return true;
}

/// Turns the job flags into configuration: -p first (so -D parallelism.default wins over it), then -D, then
/// the other flags, which override -D. False after printing an error.
bool apply_job_flags(StreamEnvironment& env, const JobFlags& f) {
  namespace opt = sluice::options;
  env.set_parallelism(f.parallelism);
  if (!apply_properties(env, f.props)) return false;
  Configuration& c = env.config();
  if (!f.checkpoint_interval.empty()) {
    auto ms = sluice::parse_duration_ms(f.checkpoint_interval);
    if (!ms.ok() || *ms <= 0) {
      fmt::print(stderr, "error: --checkpoint-interval '{}' is not a positive duration (e.g. 10s, 200ms, 1min)\n",
                 f.checkpoint_interval);
      return false;
    }
    if (f.checkpoint_dir.empty() && !c.contains(opt::kCheckpointDir.key)) {
      fmt::print(stderr, "error: --checkpoint-interval needs --checkpoint-dir DIR (where checkpoints are kept)\n");
      return false;
    }
    c.set(opt::kCheckpointInterval, *ms);
  }
  if (!f.checkpoint_dir.empty()) {
    c.set(opt::kCheckpointDir, f.checkpoint_dir);
    if (!c.contains(opt::kSavepointDir.key)) {
      c.set(opt::kSavepointDir, (std::filesystem::path(f.checkpoint_dir) / "savepoints").string());
    }
  }
  if (!f.from_savepoint.empty()) c.set(opt::kStateRecoveryPath, f.from_savepoint);
  if (f.allow_non_restored_state) c.set(opt::kIgnoreUnclaimedState, true);
  return true;
}

/// Starts the REST API the job flags ask for: --rest-port, else -D rest.port, else 8081. A busy default port
/// only disables the API (with a warning); a port the user chose must be free. Null when disabled; false in
/// `ok` after printing an error.
std::unique_ptr<sluice::RestServer> start_rest(CLI::App* cmd, StreamEnvironment& env, const JobFlags& f, bool& ok) {
  ok = true;
  const bool flag_given = cmd->count("--rest-port") > 0;
  const bool key_given = env.config().contains(sluice::options::kRestPort.key);
  sluice::RestServerOptions options;
  try {
    options.port = flag_given ? f.rest_port : key_given ? env.config().get(sluice::options::kRestPort) : f.rest_port;
    options.address = env.config().get(sluice::options::kRestAddress);
  } catch (const sluice::SluiceException& e) {
    fmt::print(stderr, "error: {}\n", e.error().to_string());
    ok = false;
    return nullptr;
  }
  if (options.port == -1) return nullptr;
  if (sluice::Status st = sluice::apply_rest_security(env.config(), options); !st.ok()) {
    fmt::print(stderr, "error: {}\n", st.error().message());
    ok = false;
    return nullptr;
  }
  env.config().set(sluice::options::kRestPort, static_cast<int32_t>(options.port));
  auto server = sluice::RestServer::start(options);
  if (server.ok()) {
    (*server)->serve_configuration(env.config());
    return std::move(*server);
  }
  if (server.error().code() == sluice::ErrorCode::kConfiguration) {  // TLS files: never only a warning
    fmt::print(stderr, "error: {}\n", server.error().message());
    ok = false;
    return nullptr;
  }
  if (!flag_given && !key_given) {
    fmt::print(stderr, "warning: no REST API for this job: {}\n", server.error().message());
    return nullptr;
  }
  fmt::print(stderr, "error: {}\n", server.error().to_string());
  ok = false;
  return nullptr;
}

/// Runs the job, serving it on the REST API when enabled; SIGINT or SIGTERM cancels it (the job then reports
/// CANCELED) instead of killing the process. False in `ok` when it could not start (an error was printed).
JobResult run_job(CLI::App* cmd, StreamEnvironment& env, const std::string& name, const JobFlags& flags, bool& ok) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Before any thread starts: task and HTTP threads inherit the mask, and one thread waits below.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::unique_ptr<sluice::RestServer> rest = start_rest(cmd, env, flags, ok);
  if (!ok) return {};
  sluice::JobPlan plan = sluice::job_plan_of(env.stream_graph());
  sluice::JobClient client = env.execute_async(name);
  if (rest) {
    rest->register_job(name, client, std::move(plan));
    fmt::print(stderr, "REST API at {}, job id {}\n", rest->url(), client.job_id());
  }
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      timespec timeout{0, 100'000'000};
      if (sigtimedwait(&signals, nullptr, &timeout) > 0) {
        fmt::print(stderr, "cancelling job '{}'\n", name);
        client.cancel();
        return;
      }
    }
  });
  JobResult r = client.wait();
  done.store(true);
  watcher.join();
  if (rest && !rest->wait_for_fetched_operations(std::chrono::seconds(10))) {
    fmt::print(stderr, "warning: a savepoint's result was not fetched by a REST client within 10 s\n");
  }
  return r;
}

int report(const JobResult& r) {
  std::fflush(stdout);  // the job's output first, then the summary on stderr
  if (r.ok()) {
    fmt::print(stderr, "job '{}' finished in {} ms\n", r.job_name, r.duration.count());
    for (const auto& op : r.operators) {
      fmt::print(stderr, "  {:<28} parallelism {:>2}  records in {:>10}  out {:>10}\n", op.name, op.parallelism,
                 op.records_in, op.records_out);
    }
    if (!r.latest_checkpoint_path.empty()) {
      fmt::print(stderr, "latest checkpoint or savepoint: {}\n", r.latest_checkpoint_path);
    }
    return 0;
  }
  if (r.status == sluice::JobStatus::kCanceled && !r.error) {
    fmt::print(stderr, "job '{}' CANCELED after {} ms\n", r.job_name, r.duration.count());
  } else {
    fmt::print(stderr, "job '{}' {}: {}\n", r.job_name, sluice::job_status_name(r.status),
               r.error ? r.error->to_string() : "no error recorded");
  }
  return 1;
}

// --- client commands (Flink's `flink list / savepoint / stop / cancel`) ---

std::string string_at(const Value& v, std::string_view path) {
  const Value* f = v.at_path(path);
  return f != nullptr && f->is_string() ? std::string(f->as_string()) : std::string();
}

int fail(const sluice::Error& e) {
  fmt::print(stderr, "error: {}\n", e.message());
  return 1;
}

int list_jobs(sluice::cli::RestClient& rest) {
  auto jobs = rest.call("GET", "/jobs");
  if (!jobs.ok()) return fail(jobs.error());
  const Value* list = jobs->find("jobs");
  std::vector<std::string> running;
  std::vector<std::string> ended;
  if (list != nullptr && list->is_array()) {
    for (const auto& j : list->as_array()) {
      const Value* start = j.find("start-time");
      std::string when = "-";
      if (start != nullptr && start->is_int64()) {
        const std::time_t t = static_cast<std::time_t>(start->as_int64() / 1000);
        std::tm tm{};
        localtime_r(&t, &tm);
        when = fmt::format("{:%d.%m.%Y %H:%M:%S}", tm);
      }
      const std::string status = string_at(j, "status");
      std::string line = fmt::format("{} : {} : {} ({})", when, string_at(j, "id"), string_at(j, "name"), status);
      // A job in trouble says so on its line: its restarts and its latest failure (cause and time).
      const Value* restarts = j.find("restarts");
      const Value* failure = j.find("last-failure");
      if (restarts != nullptr && restarts->is_int64() && restarts->as_int64() > 0) {
        line += fmt::format(" restarts: {}", restarts->as_int64());
      }
      if (status != "RUNNING" && failure != nullptr && failure->is_object()) {
        const Value* ts = failure->find("timestamp");
        std::string at;
        if (ts != nullptr && ts->is_int64()) {
          const std::time_t t = static_cast<std::time_t>(ts->as_int64() / 1000);
          std::tm tm{};
          localtime_r(&t, &tm);
          at = fmt::format(" at {:%d.%m.%Y %H:%M:%S}", tm);
        }
        line += fmt::format(" last failure{}: {}", at, string_at(*failure, "message"));
      }
      const bool live = status == "RUNNING" || status == "CREATED" || status == "RESTARTING" || status == "FAILING";
      (live ? running : ended).push_back(std::move(line));
    }
  }
  if (running.empty()) {
    fmt::print("No running jobs.\n");
  } else {
    fmt::print("------------------ Running/Restarting Jobs -------------------\n");
    for (const auto& l : running)
      fmt::print("{}\n", l);
    fmt::print("--------------------------------------------------------------\n");
  }
  if (!ended.empty()) {
    fmt::print("---------------------- Terminated Jobs -----------------------\n");
    for (const auto& l : ended)
      fmt::print("{}\n", l);
    fmt::print("--------------------------------------------------------------\n");
  }
  return 0;
}

/// Polls a savepoint operation until it completes; prints its path, or its failure.
int await_savepoint(sluice::cli::RestClient& rest, const std::string& job_id, const std::string& request_id,
                    std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int job_gone = 0;  // consecutive polls that found the job ended with the savepoint still in progress
  while (true) {
    auto st = rest.call("GET", fmt::format("/jobs/{}/savepoints/{}", job_id, request_id));
    if (!st.ok()) return fail(st.error());
    if (string_at(*st, "status.id") == "COMPLETED") {
      const std::string location = string_at(*st, "operation.location");
      if (location.empty()) {
        std::string cause = string_at(*st, "operation.failure-cause.message");
        fmt::print(stderr, "error: the savepoint of job {} failed: {}\n", job_id,
                   cause.empty() ? "no reason given" : cause);
        if (cause.find(sluice::options::kCheckpointDir.key) != std::string::npos) {
          fmt::print(stderr, "hint: start the job with --checkpoint-dir DIR to take savepoints of it\n");
        }
        return 1;
      }
      fmt::print("Savepoint completed. Path: {}\n", location);
      fmt::print("You can resume your program from this savepoint with --from-savepoint {}\n", location);
      return 0;
    }
    auto job = rest.call("GET", "/jobs/" + job_id);
    const std::string state = job.ok() ? string_at(*job, "state") : "";
    if (state == "FINISHED" || state == "FAILED" || state == "CANCELED") {
      if (++job_gone >= 2) {
        fmt::print(stderr, "error: job {} is {} and its savepoint did not complete\n", job_id,
                   string_at(*job, "state"));
        return 1;
      }
    } else {
      job_gone = 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fmt::print(stderr, "error: the savepoint of job {} did not complete within {} s (request {})\n", job_id,
                 timeout.count(), request_id);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a CLI polling a server, as `flink` does
  }
}

int trigger_savepoint(sluice::cli::RestClient& rest, const std::string& job_id, const std::string& target,
                      std::chrono::seconds timeout) {
  fmt::print("Triggering savepoint for job {}.\n", job_id);
  Value body = Value::object({{"target-directory", target.empty() ? Value() : Value(target)}, {"cancel-job", false}});
  auto r = rest.call("POST", fmt::format("/jobs/{}/savepoints", job_id), &body);
  if (!r.ok()) return fail(r.error());
  fmt::print("Waiting for response...\n");
  std::fflush(stdout);
  return await_savepoint(rest, job_id, string_at(*r, "request-id"), timeout);
}

int stop_job(sluice::cli::RestClient& rest, const std::string& job_id, const std::string& target, bool drain,
             std::chrono::seconds timeout) {
  fmt::print("Suspending job {}.\n", job_id);
  Value body = Value::object({{"targetDirectory", target.empty() ? Value() : Value(target)}, {"drain", drain}});
  auto r = rest.call("POST", fmt::format("/jobs/{}/stop", job_id), &body);
  if (!r.ok()) return fail(r.error());
  std::fflush(stdout);
  return await_savepoint(rest, job_id, string_at(*r, "request-id"), timeout);
}

int cancel_job(sluice::cli::RestClient& rest, const std::string& job_id) {
  fmt::print("Cancelling job {}.\n", job_id);
  auto r = rest.call("PATCH", fmt::format("/jobs/{}?mode=cancel", job_id));
  if (!r.ok()) return fail(r.error());
  fmt::print("Cancelled job {}.\n", job_id);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sluice: a stateful stream processor (the Flink model, as native code)", "sluice"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();

  auto* version = app.add_subcommand("version", "Print the version");

  sluice::cli::PipelineFlags pipeline_flags;
  auto [run_cmd, validate_cmd] = sluice::cli::add_pipeline_commands(app, pipeline_flags);
  sluice::cli::ClusterFlags cluster_flags;
  auto [jobmanager_cmd, taskmanager_cmd] = sluice::cli::add_cluster_commands(app, cluster_flags);
  sluice::cli::VerifyFlags verify_flags;
  auto* verify_cmd = sluice::cli::add_verify_command(app, verify_flags);
  sluice::cli::HaFlags ha_flags;
  auto* ha_status_cmd = sluice::cli::add_ha_command(app, ha_flags);

  auto* example = app.add_subcommand("example", "Run a bundled example job on the local mini-cluster");
  example->require_subcommand(1);
  auto* list_examples = example->add_subcommand("list", "List the examples");

  JobFlags job_flags;
  auto* wc = example->add_subcommand("wordcount", "Count words in text files (default: a bundled text)");
  std::vector<std::string> inputs{std::string(SLUICE_EXAMPLES_DATA_DIR) + "/hamlet.txt"};
  int top = 15;
  std::string output;
  wc->add_option("-i,--input", inputs, "Files, directories or glob patterns")->capture_default_str();
  wc->add_option("--top", top, "How many of the most frequent words to print")
      ->capture_default_str()
      ->check(CLI::Range(0, 1'000'000'000));
  wc->add_option("-o,--output", output, "Write every word's count to this file (word<TAB>count)");
  add_job_flags(wc, job_flags);

  auto* rs = example->add_subcommand("running-sum", "Per-customer running sum over generated charges");
  int64_t count = 20;
  uint64_t seed = 42;
  double rate = 0;
  auto* count_opt = rs->add_option("-n,--count", count, "Number of charges (default: 20; endless with --rate)")
                        ->check(CLI::Range(int64_t{0}, int64_t{1} << 53));
  rs->add_option("--seed", seed, "Random seed (runs are reproducible)")->capture_default_str();
  rs->add_option("--rate", rate,
                 "Charges per second over all subtasks (0 = as fast as possible); with --rate and without "
                 "-n the job runs until stopped (sluice stop / cancel, or Ctrl-C)")
      ->check(CLI::Range(0.0, 1e9));
  add_job_flags(rs, job_flags);

  // Client commands of a running job's REST API.
  std::string jobmanager = kDefaultJobManager;
  std::string job_id;
  std::string target_dir;
  bool drain = false;
  int timeout_s = 600;
  std::string token_file;
  std::string token_env;
  std::string ca_file;
  auto add_jobmanager = [&](CLI::App* cmd) {
    cmd->add_option("-m,--jobmanager", jobmanager,
                    "The REST API of the JobManager (HOST:PORT, or https://HOST:PORT when it serves TLS)")
        ->capture_default_str();
    cmd->add_option("--token-file", token_file,
                    "File holding the bearer token of a REST API with rest.auth.* (list: the read or admin token; "
                    "savepoint, stop, cancel: the admin token)");
    cmd->add_option("--token-env", token_env,
                    "Environment variable holding the bearer token (instead of --token-file)");
    cmd->add_option("--ca-file", ca_file, "PEM file of the CA that signed an https REST API's certificate");
  };
  auto* list = app.add_subcommand("list", "List the jobs of a JobManager");
  add_jobmanager(list);
  list->add_option("--timeout", timeout_s, "Seconds to wait for the JobManager's answer (at most 60)")
      ->default_str("60");
  auto* savepoint = app.add_subcommand("savepoint", "Take a savepoint of a running job and wait for it");
  add_jobmanager(savepoint);
  savepoint->add_option("JOB_ID", job_id, "The job (sluice list shows the ids)")->required();
  savepoint->add_option("TARGET_DIR", target_dir,
                        "Directory of the savepoint (default: the job's execution.checkpointing.savepoint-dir)");
  savepoint->add_option("--timeout", timeout_s, "Seconds to wait for the savepoint")->capture_default_str();
  auto* stop = app.add_subcommand("stop", "Stop a job with a savepoint (the job ends FINISHED)");
  add_jobmanager(stop);
  stop->add_option("JOB_ID", job_id, "The job (sluice list shows the ids)")->required();
  stop->add_option("--savepoint-dir", target_dir,
                   "Directory of the savepoint (default: the job's execution.checkpointing.savepoint-dir)");
  stop->add_flag("-d,--drain", drain, "Emit a final watermark before stopping (not supported yet)");
  stop->add_option("--timeout", timeout_s, "Seconds to wait for the savepoint")->capture_default_str();
  auto* cancel = app.add_subcommand("cancel", "Cancel a job (no savepoint)");
  add_jobmanager(cancel);
  cancel->add_option("JOB_ID", job_id, "The job (sluice list shows the ids)")->required();
  cancel->add_option("--timeout", timeout_s, "Seconds to wait for the JobManager's answer (at most 60)")
      ->default_str("60");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; a malformed command line exits 2 as docs/operations.md and docs/verify.md say
    // (CLI11's own codes, 101-114, would read as job results to a script).
    return app.exit(e) == 0 ? 0 : 2;
  }
  sluice::init_logging();
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Crash tests arm named fault points in a child `sluice run` (sluice/core/fault_points.h).
  if (sluice::Status armed = sluice::fault::arm_from_environment(); !armed.ok()) return fail(armed.error());

  if (version->parsed()) {
    fmt::print("sluice {}\n", SLUICE_VERSION);
    return 0;
  }
  if (validate_cmd->parsed()) return sluice::cli::validate_pipeline(pipeline_flags);
  if (verify_cmd->parsed()) return sluice::cli::run_verify(verify_flags);
  if (ha_status_cmd->parsed()) return sluice::cli::run_ha_status(ha_flags);
  if (run_cmd->parsed()) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const int rc = sluice::cli::run_pipeline(pipeline_flags, app.count("--log-level") > 0);
    curl_global_cleanup();
    return rc;
  }
  if (jobmanager_cmd->parsed()) {
    return sluice::cli::run_jobmanager(cluster_flags, SLUICE_VERSION, app.count("--log-level") > 0);
  }
  if (taskmanager_cmd->parsed()) {
    return sluice::cli::run_taskmanager(cluster_flags, SLUICE_VERSION, app.count("--log-level") > 0);
  }
  if (list_examples->parsed()) {
    fmt::print("wordcount     count words in text files (bundled: {}/hamlet.txt)\n", SLUICE_EXAMPLES_DATA_DIR);
    fmt::print(
        "running-sum   per-customer running sum over seeded random charges (datagen; --rate for an endless "
        "stream to take savepoints of)\n");
    return 0;
  }

  if (list->parsed() || savepoint->parsed() || stop->parsed() || cancel->parsed()) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    auto rest = sluice::cli::RestClient::create(jobmanager);
    if (!rest.ok()) return fail(rest.error());
    auto token = sluice::cli::RestClient::load_token(token_file, token_env);
    if (!token.ok()) return fail(token.error());
    rest->set_token(std::move(*token));
    rest->set_ca_file(ca_file);
    const std::chrono::seconds timeout(std::max(1, timeout_s));
    // --timeout bounds each request too, not only the wait for the savepoint (a paused JobManager); list and
    // cancel make one request, which --timeout bounds (60 s by default, as before).
    rest->set_request_timeout(std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(60)));
    int rc = 0;
    if (list->parsed()) rc = list_jobs(*rest);
    if (savepoint->parsed()) rc = trigger_savepoint(*rest, job_id, target_dir, timeout);
    if (stop->parsed()) rc = stop_job(*rest, job_id, target_dir, drain, timeout);
    if (cancel->parsed()) rc = cancel_job(*rest, job_id);
    curl_global_cleanup();
    return rc;
  }

  StreamEnvironment env;
  if (!apply_job_flags(env, job_flags)) return 2;

  try {
    bool started = true;
    if (wc->parsed()) {
      std::map<std::string, int64_t> result;
      std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_file(nullptr, &std::fclose);
      if (!output.empty()) {  // open before the job runs, so a bad path fails at once
        out_file.reset(std::fopen(output.c_str(), "w"));
        if (!out_file) {
          fmt::print(stderr, "error: cannot write '{}': {}\n", output, std::strerror(errno));
          return 1;
        }
      }
      sluice::examples::build_word_count(env, inputs,
                                         [&](const std::map<std::string, int64_t>& counts) { result = counts; });
      JobResult r = run_job(wc, env, "word count", job_flags, started);
      if (!started) return 1;
      if (!r.ok()) return report(r);
      std::vector<std::pair<std::string, int64_t>> sorted(result.begin(), result.end());
      std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
      int64_t total = 0;
      for (const auto& [w, c] : sorted)
        total += c;
      fmt::print("{} words, {} distinct; the {} most frequent:\n", total, sorted.size(),
                 std::min<size_t>(static_cast<size_t>(top), sorted.size()));
      for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(top); ++i) {
        fmt::print("{:>6}  {}\n", sorted[i].second, sorted[i].first);
      }
      if (out_file) {
        for (const auto& [w, c] : result)
          fmt::print(out_file.get(), "{}\t{}\n", w, c);
        if (std::fflush(out_file.get()) != 0 || std::ferror(out_file.get()) != 0) {
          fmt::print(stderr, "error: writing '{}' failed: {}\n", output, std::strerror(errno));
          return 1;
        }
      }
      if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
        fmt::print(stderr, "error: writing to stdout failed: {}\n", std::strerror(errno));
        return 1;
      }
      return report(r);
    }
    if (rs->parsed()) {
      const int64_t charges = rate > 0 && count_opt->count() == 0 ? sluice::examples::kEndless : count;
      sluice::examples::build_running_sum(env, charges, seed, rate);
      JobResult r = run_job(rs, env, "running sum", job_flags, started);
      if (!started) return 1;
      return report(r);
    }
  } catch (const sluice::SluiceException& e) {
    fmt::print(stderr, "error: {}\n", e.error().to_string());
    return 1;
  }
  return 0;
}
