#include "sluice/web/metrics_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

namespace sluice {

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread listener;
  std::atomic<bool> listener_done{false};
  int port = 0;
  std::function<std::string()> metrics;
  std::function<HealthResponse()> health;

  ~Impl() { stop(); }
  void stop() {
    server.stop();
    if (listener.joinable()) listener.join();
  }
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::string address, int port,
                                                            std::function<std::string()> metrics,
                                                            std::function<HealthResponse()> health) {
  if (port < 0 || port > 65535) {
    return Error(ErrorCode::kConfiguration, fmt::format("metrics/health port {} is outside 0..65535", port));
  }
  auto impl = std::make_unique<Impl>();
  impl->metrics = std::move(metrics);
  impl->health = std::move(health);
  Impl* self = impl.get();
  impl->server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which would let a second process share the port).
  impl->server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl->server.set_keep_alive_timeout(2);
  impl->server.Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  impl->server.Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    HealthResponse h = self->health();
    res.status = h.healthy ? 200 : 503;
    res.set_content(h.json, "application/json");
  });
  if (port == 0) {
    const int p = impl->server.bind_to_any_port(address);
    if (p < 0) {
      return Error(ErrorCode::kNetwork, fmt::format("cannot bind the metrics/health endpoint to {}:0", address));
    }
    impl->port = p;
  } else {
    if (!impl->server.bind_to_port(address, port)) {
      return Error(ErrorCode::kNetwork,
                   fmt::format("cannot bind the metrics/health endpoint to {}:{} (in use? pick another "
                               "port: pipeline.http.port / --http-port, or 0 for any free port)",
                               address, port));
    }
    impl->port = port;
  }
  impl->listener = std::thread([self] {
    pthread_setname_np(pthread_self(), "sluice-metrics");
    if (!self->server.listen_after_bind()) spdlog::error("the metrics/health endpoint stopped serving");
    self->listener_done.store(true);
  });
  // httplib's stop() does nothing until the listener runs: a stop() right after start() (a second `sluice run`
  // that finds the job locked) was lost, and the join then waited in accept() for ever. Wait until it serves.
  while (!impl->server.is_running() && !impl->listener_done.load()) {
    std::this_thread::yield();
  }
  if (!impl->server.is_running()) {
    impl->listener.join();
    return Error(ErrorCode::kNetwork,
                 fmt::format("the metrics/health endpoint at {}:{} could not start serving", address, impl->port));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;
int MetricsServer::port() const noexcept {
  return impl_->port;
}
void MetricsServer::stop() {
  impl_->stop();
}

}  // namespace sluice
