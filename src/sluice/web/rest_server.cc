// RestServer: start and stop (the httplib server or, with TLS, SSLServer; the bearer-token check before routing),
// the registration of jobs and providers, and the public functions. The routes and views are in the other
// rest_server_*.cc files (rest_server_internals.h lists them).
#include <fmt/format.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>

#include "rest_server_internals.h"
#include "sluice/api/stream_environment.h"
#include "sluice/core/assign_or_return.h"
#include "sluice/core/redact.h"

namespace sluice {

Status RestServer::Impl::start() {
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
    const RestAuthDecision d = authorize_rest_request(options_.auth, req.method, req.get_header_value("Authorization"));
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

void RestServer::Impl::stop() {
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

std::string RestServer::Impl::url() const {
  return fmt::format("{}://{}:{}", options_.tls.enabled ? "https" : "http", options_.address, port_);
}

void RestServer::Impl::serve_configuration(const Configuration& config) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& [key, value] : config.entries()) {
    // Flink hides sensitive values the same way (GlobalConfiguration.HIDDEN_CONTENT).
    const bool secret = is_secret_key(key) || key.starts_with("rest.auth.") || key.find("token") != std::string::npos;
    entries.emplace_back(key, secret ? std::string("******") : redact_secrets(value));
  }
  std::lock_guard lock(mu_);
  config_ = std::move(entries);
}

void RestServer::Impl::register_job(std::string name, JobClient client, JobPlan plan,
                                    std::function<std::string()> status_message) {
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

void RestServer::Impl::serve_metric_samples(std::function<std::vector<metrics::MetricSample>()> samples) {
  std::lock_guard lock(mu_);
  external_samples_ = std::make_shared<std::function<std::vector<metrics::MetricSample>()>>(std::move(samples));
  for (auto& [id, job] : jobs_)
    job->metrics.reset();
}

bool RestServer::Impl::wait_for_fetched_operations(std::chrono::milliseconds timeout) {
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

void RestServer::Impl::serve_task_managers(std::function<std::vector<RestTaskManagerInfo>()> provider) {
  std::lock_guard lock(mu_);
  task_managers_ = std::move(provider);
}

void RestServer::Impl::serve_metrics(std::function<std::string()> provider) {
  std::lock_guard lock(mu_);
  metrics_ = std::move(provider);
}

void RestServer::Impl::serve_health(std::function<HealthResponse()> provider) {
  std::lock_guard lock(mu_);
  health_ = std::move(provider);
}

void RestServer::Impl::set_plan(const std::string& job_id, JobPlan plan) {
  auto shared = std::make_shared<const JobPlan>(std::move(plan));
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->plan = std::move(shared);
}

void RestServer::Impl::serve_subtask_locations(const std::string& job_id,
                                               std::function<std::vector<RestSubtaskLocation>()> provider) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->locations = std::move(provider);
}

metrics::JobMetrics* RestServer::Impl::job_metrics(const std::string& job_id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second->metrics.get();
}

void RestServer::Impl::serve_health_options(const std::string& job_id, const JobHealthOptions& options) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->health = options;
}

void RestServer::Impl::serve_source_health(const std::string& job_id,
                                           std::function<std::vector<SourceHealth>()> provider) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->sources = std::move(provider);
}

Error RestServer::Impl::bind_error() const {
  return Error(ErrorCode::kNetwork,
               fmt::format("cannot serve the REST API on {}:{} (the port is in use or the address is not local); "
                           "pick another port with --rest-port / {} (0 = any free port)",
                           options_.address, options_.port, options::kRestPort.key));
}

bool RestServer::Impl::is_open(const httplib::Request& req) const {
  if (req.method != "GET" && req.method != "HEAD") return false;
  if (req.path == "/health" || req.path == "/") return true;
  if (ui_dir_.empty() || req.path.find("..") != std::string::npos) return false;
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(ui_dir_) / req.path.substr(1), ec);
}

Status RestServer::Impl::make_tls_server() {
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

namespace rest_server_internal {

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace rest_server_internal

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
  SLUICE_ASSIGN_OR_RETURN(RestAuthOptions auth, load_rest_auth(config));
  SLUICE_ASSIGN_OR_RETURN(RestTlsOptions tls, load_rest_tls(config));
  options.auth = std::move(auth);
  options.tls = std::move(tls);
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
