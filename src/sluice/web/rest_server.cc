#include "sluice/web/rest_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "sluice/api/stream_environment.h"
#include "sluice/core/redact.h"
#include "sluice/core/value.h"
#include "sluice/metrics/job_metrics.h"
#include "sluice/metrics/prometheus_text.h"
#include "sluice/web/job_health.h"
#include "sluice/web/job_views.h"

namespace sluice {
namespace {

constexpr const char* kSluiceVersion = "sluice-" SLUICE_VERSION;

using Clock = std::chrono::system_clock;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

/// Flink's names of checkpoint types.
const char* flink_checkpoint_type(const std::string& type) {
  if (type == "savepoint") return "SAVEPOINT";
  if (type == "stop-with-savepoint") return "SYNC_SAVEPOINT";
  return "CHECKPOINT";
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

/// One savepoint or stop-with-savepoint triggered through the API.
struct Operation {
  std::shared_future<Result<std::string>> result;
  bool fetched = false;  ///< a client has read its final status
};

struct JobEntry {
  std::string name;
  JobClient client;
  std::shared_ptr<const JobPlan> plan;  // replaced whole by set_plan (under Impl::mu_)
  int64_t start_time_ms = 0;
  std::map<std::string, Operation> operations;   // by request id
  std::function<std::string()> status_message;   // what the job waits for; empty when nothing
  std::unique_ptr<metrics::JobMetrics> metrics;  // in the server's registry; null when the registry is external
  std::function<std::vector<RestSubtaskLocation>()> locations;  // guarded by Impl::mu_; cluster mode only
  std::function<std::vector<SourceHealth>()> sources;           // guarded by Impl::mu_; cluster mode only
  JobHealthOptions health;                                      // guarded by Impl::mu_
};

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

/// What `/` answers when the UI's files were not found: the REST API works, the page says how to get the UI.
constexpr const char* kNoUiPage = R"(<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice</title></head>
<body style="font-family: sans-serif; max-width: 46em; margin: 2em auto">
<h1>Sluice: the web UI is not installed</h1>
<p>This process serves the REST API (<a href="/jobs">/jobs</a>, <a href="/metrics">/metrics</a>,
<a href="/health">/health</a>), but the web UI's files were not found. They are built from <code>web-ui/</code>
by the CMake build when Node.js and npm are present (<code>npm ci &amp;&amp; npm run build</code>, into
<code>share/sluice/web-ui</code> of the build folder); this build had none, or the files were moved.</p>
<p>Point to a built UI with the environment variable <code>SLUICE_WEB_UI_DIR</code> (a folder with
<code>index.html</code>), or install Node.js (<code>scripts/setup</code>) and build again.
See docs/operations.md, "Web UI".</p>
</body></html>
)";

void reply(httplib::Response& res, int status, const Value& body) {
  res.status = status;
  res.set_content(body.to_json(), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, Value::object({{"errors", Value::array({Value(message)})}}));
}

}  // namespace

class RestServer::Impl {
 public:
  static constexpr size_t kMaxBody = 1 << 20;

  explicit Impl(RestServerOptions options) : options_(std::move(options)) {
    std::random_device rd;  // only for unguessable request ids, never for data
    id_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  ~Impl() { stop(); }

  Status start() {
    if (options_.tls.enabled) {
      SLUICE_RETURN_IF_ERROR(make_tls_server());
    } else {
      server_ = std::make_unique<httplib::Server>();
    }
    const int threads = options_.threads;
    server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second process bind the same
    // port and silently take half of the requests.
    server_->set_socket_options([](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server_->set_keep_alive_timeout(2);
    server_->set_payload_max_length(kMaxBody);
    server_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error
      reply_error(res, res.status,
                  res.status == 404
                      ? fmt::format("not found: {} {} (see docs/operations.md for the endpoints)", req.method, req.path)
                      : fmt::format("HTTP {}", res.status));
      return httplib::Server::HandlerResponse::Handled;
    }));
    server_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("REST {} {} failed: {}", req.method, req.path, what);
      reply_error(res, 500, fmt::format("internal error: {}", what));
    });
    ui_dir_ = find_web_ui_dir(options_.ui_dir);
    // Before routing and before the mounted UI files: a request the tokens do not allow goes no further.
    server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!options_.auth.enabled() || is_open(req)) return httplib::Server::HandlerResponse::Unhandled;
      const RestAuthDecision d =
          authorize_rest_request(options_.auth, req.method, req.get_header_value("Authorization"));
      if (d.status == 200) return httplib::Server::HandlerResponse::Unhandled;
      if (d.status == 401) res.set_header("WWW-Authenticate", R"(Bearer realm="sluice")");
      reply_error(res, d.status, d.message);
      return httplib::Server::HandlerResponse::Handled;
    });
    route();
    if (!ui_dir_.empty()) {
      server_->set_mount_point("/", ui_dir_);
    } else {
      spdlog::info("REST: no web UI files found (set SLUICE_WEB_UI_DIR or build web-ui/ with Node.js); / says so");
    }

    if (options_.port == 0) {
      const int port = server_->bind_to_any_port(options_.address);
      if (port < 0) return bind_error();
      port_ = port;
    } else {
      if (!server_->bind_to_port(options_.address, options_.port)) return bind_error();
      port_ = options_.port;
    }
    listener_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sluice-rest");
      if (!server_->listen_after_bind()) spdlog::error("REST API at {} stopped serving", url());
      listener_done_.store(true);
    });
    // httplib's stop() is a no-op until the listener runs: wait for it so that stop() cannot be lost.
    while (!server_->is_running() && !listener_done_.load()) {
      std::this_thread::yield();
    }
    if (!server_->is_running()) {
      listener_.join();
      return Error(ErrorCode::kNetwork, fmt::format("the REST API at {} could not start serving", url()));
    }
    sampler_ = std::thread([this] { sample_metrics(); });
    spdlog::info("REST API at {}", url());
    return ok_status();
  }

  void stop() {
    {
      std::lock_guard lock(stop_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stopping_.store(true);
    {
      std::lock_guard lock(mu_);
      sampler_cv_.notify_all();
    }
    if (sampler_.joinable()) sampler_.join();
    if (server_) server_->stop();
    if (listener_.joinable()) listener_.join();
    std::vector<std::thread> cancellers;
    {
      std::lock_guard lock(mu_);
      cancellers.swap(cancellers_);
    }
    for (auto& t : cancellers)
      t.join();
  }

  std::string url() const {
    return fmt::format("{}://{}:{}", options_.tls.enabled ? "https" : "http", options_.address, port_);
  }

  void serve_configuration(const Configuration& config) {
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto& [key, value] : config.entries()) {
      // Flink hides sensitive values the same way (GlobalConfiguration.HIDDEN_CONTENT).
      const bool secret = is_secret_key(key) || key.starts_with("rest.auth.") || key.find("token") != std::string::npos;
      entries.emplace_back(key, secret ? std::string("******") : redact_secrets(value));
    }
    std::lock_guard lock(mu_);
    config_ = std::move(entries);
  }

  void register_job(std::string name, JobClient client, JobPlan plan, std::function<std::string()> status_message) {
    std::string id = client.job_id();
    auto entry = std::make_shared<JobEntry>(JobEntry{std::move(name),
                                                     client,
                                                     std::make_shared<const JobPlan>(std::move(plan)),
                                                     now_ms(),
                                                     {},
                                                     std::move(status_message),
                                                     nullptr});
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) {
      // The same job again: its metric groups (same labels) go before the new entry registers them.
      it->second->metrics.reset();
    } else {
      order_.push_back(id);
    }
    if (external_samples_ == nullptr) {
      entry->metrics = std::make_unique<metrics::JobMetrics>(registry_, std::move(client), entry->name);
    }
    jobs_[id] = std::move(entry);
    sampler_cv_.notify_all();
  }

  void serve_metric_samples(std::function<std::vector<metrics::MetricSample>()> samples) {
    std::lock_guard lock(mu_);
    external_samples_ = std::make_shared<std::function<std::vector<metrics::MetricSample>()>>(std::move(samples));
    for (auto& [id, job] : jobs_)
      job->metrics.reset();
  }

  bool wait_for_fetched_operations(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(mu_);
    auto unfetched = [&] {
      for (const auto& [id, job] : jobs_) {
        for (const auto& [rid, op] : job->operations) {
          if (!op.fetched && op.result.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return true;
        }
      }
      return false;
    };
    while (unfetched()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      // A fetch notifies fetched_cv_; the slice bounds how late an operation that just completed is noticed.
      fetched_cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
    }
    return true;
  }

  void serve_task_managers(std::function<std::vector<RestTaskManagerInfo>()> provider) {
    std::lock_guard lock(mu_);
    task_managers_ = std::move(provider);
  }
  void serve_metrics(std::function<std::string()> provider) {
    std::lock_guard lock(mu_);
    metrics_ = std::move(provider);
  }
  void serve_health(std::function<HealthResponse()> provider) {
    std::lock_guard lock(mu_);
    health_ = std::move(provider);
  }

  const RestServerOptions& options() const { return options_; }
  int port() const { return port_; }

  void set_plan(const std::string& job_id, JobPlan plan) {
    auto shared = std::make_shared<const JobPlan>(std::move(plan));
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) it->second->plan = std::move(shared);
  }
  void serve_subtask_locations(const std::string& job_id, std::function<std::vector<RestSubtaskLocation>()> provider) {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) it->second->locations = std::move(provider);
  }
  metrics::JobMetrics* job_metrics(const std::string& job_id) {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    return it == jobs_.end() ? nullptr : it->second->metrics.get();
  }
  void serve_health_options(const std::string& job_id, const JobHealthOptions& options) {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) it->second->health = options;
  }
  void serve_source_health(const std::string& job_id, std::function<std::vector<SourceHealth>()> provider) {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) it->second->sources = std::move(provider);
  }

 private:
  Error bind_error() const {
    return Error(ErrorCode::kNetwork,
                 fmt::format("cannot serve the REST API on {}:{} (the port is in use or the address is not local); "
                             "pick another port with --rest-port / {} (0 = any free port)",
                             options_.address, options_.port, options::kRestPort.key));
  }

  /// What needs no token: GET /health (probes) and the web UI's static files (the page asks for the token).
  bool is_open(const httplib::Request& req) const {
    if (req.method != "GET" && req.method != "HEAD") return false;
    if (req.path == "/health" || req.path == "/") return true;
    if (ui_dir_.empty() || req.path.find("..") != std::string::npos) return false;
    std::error_code ec;
    return std::filesystem::is_regular_file(std::filesystem::path(ui_dir_) / req.path.substr(1), ec);
  }

  /// An httplib::SSLServer on the PEM certificate chain and key of options_.tls, TLS 1.2 or newer. Errors:
  /// kConfiguration naming the file and OpenSSL's reason.
  Status make_tls_server() {
    const RestTlsOptions& tls = options_.tls;
    std::string problem;
    auto openssl_reason = [] {
      std::string all;
      while (const unsigned long e = ERR_get_error()) {
        char buf[256];
        ERR_error_string_n(e, buf, sizeof buf);
        all += all.empty() ? "" : "; ";
        all += buf;
      }
      return all.empty() ? std::string("unknown reason") : all;
    };
    ERR_clear_error();
    auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      if (SSL_CTX_use_certificate_chain_file(&ctx, tls.certificate_file.c_str()) != 1) {
        problem = fmt::format("{} = {}: cannot load the certificate (PEM): {}", options::kRestSslCertificate.key,
                              tls.certificate_file, openssl_reason());
        return false;
      }
      if (!tls.key_password.empty()) {
        SSL_CTX_set_default_passwd_cb_userdata(&ctx, const_cast<char*>(tls.key_password.c_str()));
      }
      const int loaded = SSL_CTX_use_PrivateKey_file(&ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM);
      SSL_CTX_set_default_passwd_cb_userdata(&ctx, nullptr);
      if (loaded != 1) {
        problem = fmt::format(
            "{} = {}: cannot load the private key (PEM{}): {}", options::kRestSslKey.key, tls.key_file,
            tls.key_password.empty() ? "; encrypted keys need " + std::string(options::kRestSslKeyPassword.key) : "",
            openssl_reason());
        return false;
      }
      if (SSL_CTX_check_private_key(&ctx) != 1) {
        problem = fmt::format("{} = {} does not match the certificate {}: {}", options::kRestSslKey.key, tls.key_file,
                              tls.certificate_file, openssl_reason());
        return false;
      }
      return true;
    });
    // OpenSSL writes with write(2), not send(MSG_NOSIGNAL) as httplib's plain sockets do: a client that goes away
    // mid-answer would raise SIGPIPE and end the process. Ignored unless the program installed its own handler.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    if (!server->is_valid()) {
      return Error(ErrorCode::kConfiguration,
                   problem.empty() ? fmt::format("cannot set up TLS for the REST API: {}", openssl_reason()) : problem);
    }
    server_ = std::move(server);
    return ok_status();
  }

  std::shared_ptr<JobEntry> find_job(const std::string& id) {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    return it == jobs_.end() ? nullptr : it->second;
  }

  /// Looks up the job of `req.matches[1]`; answers 404 and returns null when there is none.
  std::shared_ptr<JobEntry> job_or_404(const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto job = find_job(id);
    if (!job) {
      reply_error(
          res, 404,
          fmt::format("no job with id '{}' on this JobManager (GET /jobs or `sluice list` shows its jobs)", id));
    }
    return job;
  }

  /// Parses a JSON object body; an empty body is an empty object. Answers 400 and returns null on error.
  std::optional<Value> body_or_400(const std::string& body, httplib::Response& res) {
    if (body.find_first_not_of(" \t\r\n") == std::string::npos) return Value::object();
    auto v = Value::from_json(body);
    if (!v.ok()) {
      reply_error(res, 400, fmt::format("the request body is not valid JSON: {}", v.error().message()));
      return std::nullopt;
    }
    if (!v->is_object()) {
      reply_error(res, 400, "the request body must be a JSON object");
      return std::nullopt;
    }
    return std::move(*v);
  }

  /// Reads an optional string field; answers 400 when it has another type.
  static bool string_field(const Value& body, std::string_view key, std::string& out, httplib::Response& res) {
    const Value* v = body.find(key);
    if (v == nullptr || v->is_null()) return true;
    if (!v->is_string()) {
      reply_error(res, 400, fmt::format("\"{}\" must be a string (a directory)", key));
      return false;
    }
    out = std::string(v->as_string());
    return true;
  }
  static bool bool_field(const Value& body, std::string_view key, bool& out, httplib::Response& res) {
    const Value* v = body.find(key);
    if (v == nullptr || v->is_null()) return true;
    if (!v->is_bool()) {
      reply_error(res, 400, fmt::format("\"{}\" must be true or false", key));
      return false;
    }
    out = v->as_bool();
    return true;
  }

  std::string new_request_id() {
    const uint64_t n = request_counter_.fetch_add(1) + 1;
    const uint64_t a = splitmix(id_seed_ ^ n);
    return fmt::format("{:016x}{:016x}", a, splitmix(a));
  }
  static uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  }

  /// Answers 409 and returns false when the job no longer runs.
  static bool running_or_409(JobEntry& job, const char* action, httplib::Response& res) {
    const JobStatus s = job.client.status();
    if (s == JobStatus::kRunning) return true;
    reply_error(res, 409,
                fmt::format("cannot {} job '{}' ({}): it is {}, not RUNNING", action, job.name, job.client.job_id(),
                            job_status_name(s)));
    return false;
  }

  void add_operation(JobEntry& job, const std::string& rid, std::shared_future<Result<std::string>> f) {
    std::lock_guard lock(mu_);
    job.operations[rid] = Operation{std::move(f), false};
  }

  using BodyHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  /// Reads the request body first, and only when the request announces one (Content-Length or chunked):
  /// httplib's own reading waits for the connection to close when a client sends a POST or PATCH without a
  /// body and without Content-Length (`curl -X PATCH ...`), and answers 400 after its read timeout.
  static httplib::Server::HandlerWithContentReader with_body(BodyHandler handler) {
    return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
      std::string body;
      if (req.has_header("Content-Length") || req.get_header_value("Transfer-Encoding") == "chunked") {
        bool too_large = false;
        reader([&](const char* data, size_t n) {
          if (body.size() + n > kMaxBody) {
            too_large = true;
            return false;
          }
          body.append(data, n);
          return true;
        });
        if (too_large) {
          reply_error(res, 413, fmt::format("the request body is larger than {} bytes", kMaxBody));
          return;
        }
      }
      handler(req, body, res);
    };
  }

  std::vector<std::shared_ptr<JobEntry>> jobs_in_order() {
    std::vector<std::shared_ptr<JobEntry>> jobs;
    std::lock_guard lock(mu_);
    for (const auto& id : order_)
      jobs.push_back(jobs_.at(id));
    return jobs;
  }

  /// GET /metrics without a provider: the job-level metrics of every registered job, with the names
  /// `sluice run` uses for the same values.
  std::string default_metrics() {
    std::string out;
    auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    };
    struct Row {
      std::string job;
      JobStatus status;
      int restarts;
      std::vector<OperatorStats> operators;
      int64_t completed = 0;
      int64_t failed = 0;
    };
    std::vector<Row> rows;
    for (const auto& j : jobs_in_order()) {
      Row r{metrics::escape_label_value(j->name), j->client.status(), j->client.restarts(), j->client.operator_stats()};
      if (job_status_terminal(r.status)) {
        JobResult result = j->client.wait();  // returns at once: the job has ended
        if (!result.operators.empty()) r.operators = result.operators;
      }
      for (const auto& cp : j->client.checkpoint_stats()) {
        if (cp.completed) {
          ++r.completed;
        } else if (!cp.failure.empty()) {
          ++r.failed;
        }
      }
      rows.push_back(std::move(r));
    }
    family("sluice_job_running", "gauge", "1 when the job is RUNNING, else 0.");
    for (const auto& r : rows) {
      out += fmt::format("sluice_job_running{{job=\"{}\",status=\"{}\"}} {}\n", r.job, job_status_name(r.status),
                         r.status == JobStatus::kRunning ? 1 : 0);
    }
    family("sluice_job_restarts_total", "counter", "Failover restarts of the job.");
    for (const auto& r : rows)
      out += fmt::format("sluice_job_restarts_total{{job=\"{}\"}} {}\n", r.job, r.restarts);
    family("sluice_operator_records_in_total", "counter", "Records an operator received, over its subtasks.");
    for (const auto& r : rows) {
      for (const auto& o : r.operators) {
        out += fmt::format("sluice_operator_records_in_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", r.job,
                           metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_in);
      }
    }
    family("sluice_operator_records_out_total", "counter", "Records an operator emitted, over its subtasks.");
    for (const auto& r : rows) {
      for (const auto& o : r.operators) {
        out += fmt::format("sluice_operator_records_out_total{{job=\"{}\",operator=\"{}\",uid=\"{}\"}} {}\n", r.job,
                           metrics::escape_label_value(o.name), metrics::escape_label_value(o.uid), o.records_out);
      }
    }
    family("sluice_checkpoints_completed", "gauge", "Completed checkpoints among the recent ones kept in history.");
    for (const auto& r : rows)
      out += fmt::format("sluice_checkpoints_completed{{job=\"{}\"}} {}\n", r.job, r.completed);
    family("sluice_checkpoints_failed", "gauge", "Failed checkpoints among the recent ones kept in history.");
    for (const auto& r : rows)
      out += fmt::format("sluice_checkpoints_failed{{job=\"{}\"}} {}\n", r.job, r.failed);
    // The registry's Flink-named metrics of the same jobs (task, operator and job scopes).
    out += registry_.prometheus_text();
    return out;
  }

  /// GET /health without a provider: healthy while every registered job is RUNNING or FINISHED.
  HealthResponse default_health() {
    // Each job by evaluate_job_health (web/job_health.h) with its bounds (serve_health_options), else those every
    // job has: not RUNNING, a failure within the restart grace, consecutive failed checkpoints (without the job's
    // checkpoint interval, no checkpoint-age bound). A FINISHED job ended as it should and counts as healthy.
    Value jobs = Value::array();
    std::string reason;
    const auto entries = jobs_in_order();
    const int64_t now = now_ms();
    for (const auto& j : entries) {
      std::function<std::vector<SourceHealth>()> sources;
      JobHealthOptions bounds;
      {
        std::lock_guard lock(mu_);
        sources = j->sources;
        bounds = j->health;
      }
      const HealthReport h = evaluate_job_health(j->client, bounds, j->start_time_ms,
                                                 sources ? sources() : std::vector<SourceHealth>{}, now);
      const bool healthy = h.healthy || h.status == job_status_name(JobStatus::kFinished);
      Value reasons = Value::array();
      for (const auto& r : h.reasons)
        reasons.push_back(Value::object({{"code", r.code}, {"message", r.message}}));
      jobs.push_back(Value::object({{"id", j->client.job_id()},
                                    {"name", j->name},
                                    {"status", h.status},
                                    {"restarts", h.restarts},
                                    {"healthy", healthy},
                                    {"reasons", healthy ? Value::array() : std::move(reasons)}}));
      if (!healthy && reason.empty()) reason = fmt::format("job '{}' ({}): {}", j->name, j->client.job_id(), h.reason);
    }
    if (entries.empty()) reason = "no job is registered yet";
    const bool healthy = reason.empty();
    return HealthResponse{
        healthy, Value::object({{"healthy", healthy}, {"reason", reason}, {"jobs", std::move(jobs)}}).to_json()};
  }

  /// Every metric sample of the jobs now.
  std::vector<metrics::MetricSample> collect_samples() {
    std::shared_ptr<std::function<std::vector<metrics::MetricSample>()>> external;
    {
      std::lock_guard lock(mu_);
      external = external_samples_;
    }
    return external ? (*external)() : registry_.collect();
  }

  /// Samples every second, so that rates (busy, idle and backpressured ms per second over 5 s, records per
  /// second) are current when a client asks, however rarely it asks; requests read the latest samples.
  void sample_metrics() {
    pthread_setname_np(pthread_self(), "sluice-rest-mt");
    std::unique_lock lock(mu_);
    while (!stopping_.load()) {
      if (!jobs_.empty()) {
        lock.unlock();
        auto samples = std::make_shared<const std::vector<metrics::MetricSample>>(collect_samples());
        lock.lock();
        latest_samples_ = std::move(samples);
      }
      sampler_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_.load(); });
    }
  }

  std::shared_ptr<const std::vector<metrics::MetricSample>> samples_now() {
    {
      std::lock_guard lock(mu_);
      if (latest_samples_) return latest_samples_;
    }
    return std::make_shared<const std::vector<metrics::MetricSample>>(collect_samples());
  }

  web::JobSnapshot snapshot(JobEntry& job) {
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
        s.locations.push_back(web::SubtaskPlace{l.vertex_id, l.subtask, l.task_manager_id, l.address, l.slot});
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

  /// The vertex of `req.matches[2]` in `vertices`; answers 404 and returns null when there is none.
  static const JobPlanVertex* vertex_or_404(const std::vector<JobPlanVertex>& vertices, const httplib::Request& req,
                                            httplib::Response& res) {
    const std::string vid = req.matches[2];
    const JobPlanVertex* v = web::find_vertex(vertices, vid);
    if (v == nullptr) {
      std::string known;
      for (const auto& x : vertices)
        known += (known.empty() ? "" : ", ") + x.id + " (" + x.name + ")";
      reply_error(res, 404,
                  fmt::format("no vertex '{}' in this job; its vertices: {}", vid, known.empty() ? "none yet" : known));
    }
    return v;
  }

  static std::optional<std::string> get_param(const httplib::Request& req) {
    if (!req.has_param("get")) return std::nullopt;
    return req.get_param_value("get");
  }

  void route_flink_views() {
    // Flink's GET /overview: the cluster in one object. In local mode the process is its one TaskManager and
    // has as many slots as its jobs use.
    server_->Get("/overview", [this](const httplib::Request&, httplib::Response& res) {
      int64_t running = 0;
      int64_t finished = 0;
      int64_t cancelled = 0;
      int64_t failed = 0;
      int64_t slots_used = 0;
      for (const auto& j : jobs_in_order()) {
        const JobStatus st = j->client.status();
        if (st == JobStatus::kFinished) {
          ++finished;
        } else if (st == JobStatus::kCanceled) {
          ++cancelled;
        } else if (st == JobStatus::kFailed) {
          ++failed;
        } else {
          ++running;
          std::map<std::string, int> group_max;
          for (const auto& v : web::vertices_of(snapshot(*j)))
            group_max[v.slot_sharing_group] = std::max(group_max[v.slot_sharing_group], v.parallelism);
          for (const auto& [g, p] : group_max)
            slots_used += p;
        }
      }
      std::function<std::vector<RestTaskManagerInfo>()> tms;
      {
        std::lock_guard lock(mu_);
        tms = task_managers_;
      }
      int64_t taskmanagers = 1;
      int64_t slots_total = slots_used;
      int64_t slots_free = 0;
      if (tms) {
        const auto list = tms();
        taskmanagers = static_cast<int64_t>(list.size());
        slots_total = 0;
        for (const auto& t : list) {
          slots_total += t.slots_total;
          slots_free += t.slots_free;
        }
      }
      reply(res, 200,
            Value::object({{"taskmanagers", taskmanagers},
                           {"slots-total", slots_total},
                           {"slots-available", slots_free},
                           {"jobs-running", running},
                           {"jobs-finished", finished},
                           {"jobs-cancelled", cancelled},
                           {"jobs-failed", failed},
                           {"flink-version", kSluiceVersion},
                           {"flink-commit", ""}}));
    });

    // Flink's GET /config: what the web UI needs to know of the server.
    server_->Get("/config", [](const httplib::Request&, httplib::Response& res) {
      const std::time_t t = std::time(nullptr);
      std::tm local{};
      ::localtime_r(&t, &local);
      reply(
          res, 200,
          Value::object(
              {{"refresh-interval", 3000},
               {"timezone-name", local.tm_zone != nullptr ? local.tm_zone : "UTC"},
               {"timezone-offset", static_cast<int64_t>(local.tm_gmtoff) * 1000},
               {"flink-version", kSluiceVersion},
               {"flink-revision", ""},
               {"features",
                Value::object(
                    {{"web-submit", false}, {"web-cancel", true}, {"web-rescale", false}, {"web-history", false}})}}));
    });

    // Flink's GET /jobmanager/config: the process's configuration, secret values hidden.
    server_->Get("/jobmanager/config", [this](const httplib::Request&, httplib::Response& res) {
      Value list = Value::array();
      std::lock_guard lock(mu_);
      for (const auto& [key, value] : config_)
        list.push_back(Value::object({{"key", key}, {"value", value}}));
      reply(res, 200, list);
    });
    // Flink's GET /jobs/:id/config (JobConfigInfo); "user-config" is the served configuration.
    server_->Get(R"(/jobs/([^/]+)/config)", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      int parallelism = 1;
      std::shared_ptr<const JobPlan> plan;
      Value user = Value::object();
      std::string restart = "default";
      {
        std::lock_guard lock(mu_);
        plan = job->plan;
        for (const auto& [key, value] : config_) {
          user.set(key, value);
          if (key == options::kRestartStrategy.key) restart = value;
        }
      }
      for (const auto& o : plan->operators)
        parallelism = std::max(parallelism, o.parallelism);
      reply(res, 200,
            Value::object({{"jid", job->client.job_id()},
                           {"name", job->name},
                           {"execution-config", Value::object({{"execution-mode", "PIPELINED"},
                                                               {"restart-strategy", restart},
                                                               {"job-parallelism", parallelism},
                                                               {"object-reuse-mode", false},
                                                               {"user-config", std::move(user)}})}}));
    });

    server_->Get("/jobs/overview", [this](const httplib::Request&, httplib::Response& res) {
      Value list = Value::array();
      const int64_t now = now_ms();
      for (const auto& j : jobs_in_order())
        list.push_back(web::job_overview_json(snapshot(*j), now));
      reply(res, 200, Value::object({{"jobs", std::move(list)}}));
    });

    server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      const web::JobSnapshot snap = snapshot(*job);
      const auto vertices = web::vertices_of(snap);
      const JobPlanVertex* v = vertex_or_404(vertices, req, res);
      if (!v) return;
      reply(res, 200, web::vertex_details_json(snap, *v, *samples_now(), now_ms()));
    });

    server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/backpressure)",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   auto job = job_or_404(req, res);
                   if (!job) return;
                   const web::JobSnapshot snap = snapshot(*job);
                   const auto vertices = web::vertices_of(snap);
                   const JobPlanVertex* v = vertex_or_404(vertices, req, res);
                   if (!v) return;
                   reply(res, 200, web::backpressure_json(snap, *v, *samples_now(), now_ms()));
                 });

    server_->Get(
        R"(/jobs/([^/]+)/vertices/([^/]+)/metrics)", [this](const httplib::Request& req, httplib::Response& res) {
          auto job = job_or_404(req, res);
          if (!job) return;
          const web::JobSnapshot snap = snapshot(*job);
          const auto vertices = web::vertices_of(snap);
          const JobPlanVertex* v = vertex_or_404(vertices, req, res);
          if (!v) return;
          reply(res, 200, web::metrics_json(web::vertex_metrics(*samples_now(), snap.job_id, *v), get_param(req)));
        });

    server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/subtasks/metrics)", [this](const httplib::Request& req,
                                                                              httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      const web::JobSnapshot snap = snapshot(*job);
      const auto vertices = web::vertices_of(snap);
      const JobPlanVertex* v = vertex_or_404(vertices, req, res);
      if (!v) return;
      reply(res, 200,
            web::aggregated_metrics_json(web::vertex_metrics(*samples_now(), snap.job_id, *v), get_param(req),
                                         req.has_param("agg") ? req.get_param_value("agg") : ""));
    });

    // Flink's GET /jobs/:id/vertices/:vid/watermarks: each subtask's input watermark (of its chain's head).
    server_->Get(R"(/jobs/([^/]+)/vertices/([^/]+)/watermarks)",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   auto job = job_or_404(req, res);
                   if (!job) return;
                   const web::JobSnapshot snap = snapshot(*job);
                   const auto vertices = web::vertices_of(snap);
                   const JobPlanVertex* v = vertex_or_404(vertices, req, res);
                   if (!v) return;
                   Value list = Value::array();
                   for (const auto& m : snap.subtasks) {
                     if (m.vertex_id != v->index || m.operators.empty()) continue;
                     list.push_back(Value::object({{"id", fmt::format("{}.currentInputWatermark", m.subtask_index)},
                                                   {"value", std::to_string(m.operators.front().input_watermark)}}));
                   }
                   reply(res, 200, list);
                 });

    server_->Get(R"(/jobs/([^/]+)/metrics)", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      reply(res, 200, web::metrics_json(web::job_metrics(*samples_now(), job->client.job_id()), get_param(req)));
    });
  }

  void route() {
    // Reached only when no UI folder is mounted at / (a mounted folder's files are served before routes).
    server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
      res.set_content(kNoUiPage, "text/html; charset=utf-8");
    });
    route_flink_views();
    server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::function<std::string()> provider;
      {
        std::lock_guard lock(mu_);
        provider = metrics_;
      }
      res.set_content(provider ? provider() : default_metrics(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      std::function<HealthResponse()> provider;
      {
        std::lock_guard lock(mu_);
        provider = health_;
      }
      HealthResponse h = provider ? provider() : default_health();
      res.status = h.healthy ? 200 : 503;
      res.set_content(h.json, "application/json");
    });
    server_->Get("/jobs", [this](const httplib::Request&, httplib::Response& res) {
      std::vector<std::shared_ptr<JobEntry>> jobs;
      {
        std::lock_guard lock(mu_);
        for (const auto& id : order_)
          jobs.push_back(jobs_.at(id));
      }
      Value list = Value::array();
      for (const auto& j : jobs) {
        Value entry = Value::object({{"id", j->client.job_id()},
                                     {"name", j->name},
                                     {"status", job_status_name(j->client.status())},
                                     {"start-time", j->start_time_ms},
                                     {"restarts", j->client.restarts()}});
        add_failure_summary(entry, j->client);
        if (j->status_message) entry.set("status-message", j->status_message());
        list.push_back(std::move(entry));
      }
      reply(res, 200, Value::object({{"jobs", std::move(list)}}));
    });

    // Flink's GET /taskmanagers, plus the registration id, pid and times in ms since the epoch.
    // "timeSinceLastHeartbeat" keeps Flink's name and meaning: the time OF the last heartbeat (ms since the
    // epoch), not a duration; "ms-since-last-heartbeat" is the duration.
    server_->Get("/taskmanagers", [this](const httplib::Request&, httplib::Response& res) {
      std::function<std::vector<RestTaskManagerInfo>()> provider;
      {
        std::lock_guard lock(mu_);
        provider = task_managers_;
      }
      if (!provider) {
        reply_error(res, 404,
                    "this process runs its job on the local mini-cluster and has no TaskManagers to list; "
                    "GET /taskmanagers is served by a cluster's JobManager (sluice jobmanager, docs/cluster.md)");
        return;
      }
      const int64_t now = now_ms();
      Value list = Value::array();
      for (const auto& t : provider()) {
        list.push_back(Value::object({{"id", t.id},
                                      {"registration-id", t.registration_id},
                                      {"path", t.address},
                                      {"data-address", t.data_address},
                                      {"hostname", t.hostname},
                                      {"pid", t.pid},
                                      {"slotsNumber", t.slots_total},
                                      {"freeSlots", t.slots_free},
                                      {"registered", t.registered_ms},
                                      {"timeSinceLastHeartbeat", t.last_heartbeat_ms},
                                      {"ms-since-last-heartbeat", now - t.last_heartbeat_ms}}));
      }
      reply(res, 200, Value::object({{"taskmanagers", std::move(list)}}));
    });

    server_->Get(R"(/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      reply(res, 200, job_details(*job));
    });

    server_->Patch(
        R"(/jobs/([^/]+))", with_body([this](const httplib::Request& req, const std::string&, httplib::Response& res) {
          auto job = job_or_404(req, res);
          if (!job) return;
          const std::string mode = req.has_param("mode") ? req.get_param_value("mode") : "cancel";
          if (mode != "cancel") {
            reply_error(res, 400,
                        fmt::format("mode '{}' is not supported: use mode=cancel, or POST /jobs/:id/stop to stop with "
                                    "a savepoint",
                                    mode));
            return;
          }
          job->client.cancel();  // a no-op for a job that already ended (Flink also answers 202)
          reply(res, 202, Value::object());
        }));

    // Flink's GET /jobs/:jobid/exceptions (JobExceptionsInfoWithHistory): the newest failure as the root
    // exception, and the recent failures newest first.
    server_->Get(R"(/jobs/([^/]+)/exceptions)", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      const std::vector<JobExceptionInfo> ex = job->client.exceptions();
      Value entries = Value::array();
      for (const auto& e : ex)
        entries.push_back(exception_json(e, hostname_));
      const bool truncated = ex.size() >= JobClient::kMaxExceptionHistory;
      reply(res, 200,
            Value::object(
                {{"root-exception", ex.empty() ? Value() : Value(ex[0].stacktrace)},
                 {"timestamp", ex.empty() ? Value() : Value(ex[0].timestamp_ms)},
                 {"all-exceptions", Value::array()},
                 {"truncated", truncated},
                 {"exceptionHistory", Value::object({{"entries", std::move(entries)}, {"truncated", truncated}})}}));
    });

    server_->Get(R"(/jobs/([^/]+)/checkpoints)", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      reply(res, 200, checkpoints_json(job->client.checkpoint_stats()));
    });

    server_->Post(R"(/jobs/([^/]+)/savepoints)",
                  with_body([this](const httplib::Request& req, const std::string& text, httplib::Response& res) {
                    auto job = job_or_404(req, res);
                    if (!job) return;
                    auto body = body_or_400(text, res);
                    if (!body) return;
                    std::string target;
                    bool cancel_job = false;
                    if (!string_field(*body, "target-directory", target, res) ||
                        !bool_field(*body, "cancel-job", cancel_job, res)) {
                      return;
                    }
                    if (!running_or_409(*job, "take a savepoint of", res)) return;
                    const std::string rid = new_request_id();
                    std::shared_future<Result<std::string>> f = job->client.trigger_savepoint(target).share();
                    if (cancel_job) {
                      // Flink's cancel-with-savepoint: the job is cancelled once the savepoint has completed.
                      JobClient client = job->client;
                      std::lock_guard lock(mu_);
                      cancellers_.emplace_back([this, f, client]() mutable {
                        // Waits in slices: a job that ended resolves its savepoint only when destroyed, which this
                        // thread's client would prevent.
                        while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
                          if (stopping_.load() || job_status_terminal(client.status())) return;
                        }
                        if (await(f).ok()) client.cancel();
                      });
                    }
                    add_operation(*job, rid, f);
                    spdlog::info("REST: savepoint {} of job {} requested into '{}'", rid, job->client.job_id(), target);
                    reply(res, 202, Value::object({{"request-id", rid}}));
                  }));

    server_->Get(R"(/jobs/([^/]+)/savepoints/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = job_or_404(req, res);
      if (!job) return;
      const std::string rid = req.matches[2];
      std::shared_future<Result<std::string>> f;
      {
        std::lock_guard lock(mu_);
        auto it = job->operations.find(rid);
        if (it == job->operations.end()) {
          reply_error(res, 404, fmt::format("no savepoint request '{}' for job '{}'", rid, job->client.job_id()));
          return;
        }
        f = it->second.result;
      }
      if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        reply(res, 200, Value::object({{"status", Value::object({{"id", "IN_PROGRESS"}})}, {"operation", Value()}}));
        return;
      }
      Result<std::string> r = await(f);
      Value operation =
          r.ok() ? Value::object({{"location", *r}}) : Value::object({{"failure-cause", error_json(r.error())}});
      reply(res, 200,
            Value::object({{"status", Value::object({{"id", "COMPLETED"}})}, {"operation", std::move(operation)}}));
      {
        std::lock_guard lock(mu_);
        job->operations[rid].fetched = true;
      }
      fetched_cv_.notify_all();
    });

    server_->Post(
        R"(/jobs/([^/]+)/stop)",
        with_body([this](const httplib::Request& req, const std::string& text, httplib::Response& res) {
          auto job = job_or_404(req, res);
          if (!job) return;
          auto body = body_or_400(text, res);
          if (!body) return;
          std::string target;
          bool drain = false;
          if (!string_field(*body, "targetDirectory", target, res) || !bool_field(*body, "drain", drain, res)) return;
          if (drain) {
            reply_error(res, 400,
                        "drain=true (stop with a final MAX_WATERMARK that fires every timer and window) is not "
                        "supported yet; stop without drain: the job stops right after the savepoint and resumes "
                        "from it with its timers and windows intact");
            return;
          }
          if (!running_or_409(*job, "stop", res)) return;
          const std::string rid = new_request_id();
          add_operation(*job, rid, job->client.stop_with_savepoint(target).share());
          spdlog::info("REST: stop-with-savepoint {} of job {} requested into '{}'", rid, job->client.job_id(), target);
          reply(res, 202, Value::object({{"request-id", rid}}));
        }));
  }

  /// The result of a ready future; a broken promise (the job went away) becomes an error.
  static Result<std::string> await(const std::shared_future<Result<std::string>>& f) {
    try {
      return f.get();
    } catch (const std::future_error&) {
      return Error(ErrorCode::kCheckpoint, "the job ended before the savepoint completed");
    }
  }

  /// Flink's JobDetailsInfo (web/job_views.h) with Sluice's additions: restarts, the latest failure, the cause
  /// of a failed job and what a cluster's job waits for.
  Value job_details(JobEntry& job) {
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

  static Value checkpoints_json(const std::vector<CheckpointStats>& stats) {
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

  RestServerOptions options_;
  std::string ui_dir_;  // the mounted web UI folder, "" when none
  // Before jobs_: each entry's JobMetrics removes its groups from it when destroyed.
  metrics::MetricRegistry registry_;
  std::unique_ptr<httplib::Server> server_;  // an httplib::SSLServer with TLS; made by start()
  int port_ = 0;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::atomic<bool> stopping_{false};

  uint64_t id_seed_ = 0;
  std::atomic<uint64_t> request_counter_{0};

  std::mutex mu_;  // guards jobs_, order_, every JobEntry::operations and cancellers_
  std::condition_variable fetched_cv_;
  std::map<std::string, std::shared_ptr<JobEntry>> jobs_;
  std::vector<std::string> order_;  // job ids in registration order
  std::vector<std::thread> cancellers_;
  std::function<std::vector<RestTaskManagerInfo>()> task_managers_;  // guarded by mu_
  std::function<std::string()> metrics_;                             // guarded by mu_
  std::function<HealthResponse()> health_;                           // guarded by mu_
  std::vector<std::pair<std::string, std::string>> config_;          // served (redacted) config; guarded by mu_
  // Where the metric views read samples: the server's own registry (a JobMetrics per job), or a provider's
  // (a pipeline's registry, which also has its connectors' metrics). Guarded by mu_.
  std::shared_ptr<std::function<std::vector<metrics::MetricSample>()>> external_samples_;
  std::condition_variable sampler_cv_;
  std::thread sampler_;
  std::shared_ptr<const std::vector<metrics::MetricSample>> latest_samples_;  // guarded by mu_
  std::string hostname_ = this_hostname();
};

Result<std::unique_ptr<RestServer>> RestServer::start(RestServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("REST port {} is out of range; expected 0..65535 (0 = any free port)", options.port));
  }
  if (options.threads < 1) {
    return Error(ErrorCode::kConfiguration, fmt::format("REST threads = {}; expected at least 1", options.threads));
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  SLUICE_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<RestServer>(new RestServer(std::move(impl)));
}

Result<std::unique_ptr<RestServer>> RestServer::start(const Configuration& config) {
  RestServerOptions options;
  try {
    options.port = config.get(options::kRestPort);
    options.address = config.get(options::kRestAddress);
  } catch (const SluiceException& e) {
    return e.error();
  }
  SLUICE_RETURN_IF_ERROR(apply_rest_security(config, options));
  if (options.port == -1) {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("the REST API is disabled ({} = -1); set a port, or 0 for any free port", options::kRestPort.key));
  }
  return start(std::move(options));
}

Status apply_rest_security(const Configuration& config, RestServerOptions& options) {
  Result<RestAuthOptions> auth = load_rest_auth(config);
  if (!auth.ok()) return auth.error();
  Result<RestTlsOptions> tls = load_rest_tls(config);
  if (!tls.ok()) return tls.error();
  options.auth = std::move(*auth);
  options.tls = std::move(*tls);
  return ok_status();
}

RestServer::RestServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RestServer::~RestServer() {
  stop();
}

const std::string& RestServer::address() const noexcept {
  return impl_->options().address;
}
int RestServer::port() const noexcept {
  return impl_->port();
}
std::string RestServer::url() const {
  return impl_->url();
}
void RestServer::register_job(std::string name, JobClient client, JobPlan plan) {
  impl_->register_job(std::move(name), std::move(client), std::move(plan), {});
}
void RestServer::register_job(std::string name, JobClient client, JobPlan plan,
                              std::function<std::string()> status_message) {
  impl_->register_job(std::move(name), std::move(client), std::move(plan), std::move(status_message));
}
void RestServer::serve_metric_samples(std::function<std::vector<metrics::MetricSample>()> samples) {
  impl_->serve_metric_samples(std::move(samples));
}
void RestServer::set_plan(const std::string& job_id, JobPlan plan) {
  impl_->set_plan(job_id, std::move(plan));
}

void RestServer::serve_subtask_locations(const std::string& job_id,
                                         std::function<std::vector<RestSubtaskLocation>()> provider) {
  impl_->serve_subtask_locations(job_id, std::move(provider));
}
metrics::JobMetrics* RestServer::job_metrics(const std::string& job_id) {
  return impl_->job_metrics(job_id);
}
void RestServer::serve_health_options(const std::string& job_id, const JobHealthOptions& options) {
  impl_->serve_health_options(job_id, options);
}

void RestServer::serve_source_health(const std::string& job_id, std::function<std::vector<SourceHealth>()> provider) {
  impl_->serve_source_health(job_id, std::move(provider));
}
JobClient RestServer::execute(StreamEnvironment& env, std::string name) {
  JobPlan plan = job_plan_of(env.stream_graph());
  JobClient client = env.execute_async(name);
  register_job(std::move(name), client, std::move(plan));
  return client;
}
void RestServer::serve_metrics(std::function<std::string()> provider) {
  impl_->serve_metrics(std::move(provider));
}
void RestServer::serve_health(std::function<HealthResponse()> provider) {
  impl_->serve_health(std::move(provider));
}
void RestServer::serve_configuration(const Configuration& config) {
  impl_->serve_configuration(config);
}
void RestServer::serve_task_managers(std::function<std::vector<RestTaskManagerInfo>()> provider) {
  impl_->serve_task_managers(std::move(provider));
}
bool RestServer::wait_for_fetched_operations(std::chrono::milliseconds timeout) {
  return impl_->wait_for_fetched_operations(timeout);
}
void RestServer::stop() {
  impl_->stop();
}

std::vector<OperatorStats> operators_of(const StreamGraph& graph) {
  std::vector<OperatorStats> out;
  for (const auto& node : graph.nodes()) {
    OperatorStats s;
    s.name = node.name;
    s.uid = node.uid.value_or(node.derived_uid);
    try {
      s.parallelism = graph.parallelism_of(node);
    } catch (const SluiceException&) {
      s.parallelism = node.parallelism;  // a malformed default: execute() reports it
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string find_web_ui_dir(const std::string& configured) {
  namespace fs = std::filesystem;
  auto has_index = [](const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / "index.html", ec);
  };
  if (!configured.empty()) return has_index(configured) ? configured : std::string();
  if (const char* env = std::getenv("SLUICE_WEB_UI_DIR"); env != nullptr && *env != '\0') {
    return has_index(env) ? std::string(env) : std::string();
  }
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return {};
  for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
    const fs::path candidate = dir / "share" / "sluice" / "web-ui";
    if (has_index(candidate)) return candidate.string();
    if (dir == dir.root_path()) break;
  }
  return {};
}

}  // namespace sluice
