// MetricsServer: the operating endpoints of one process (DESIGN.md §9): `GET /metrics` in the Prometheus
// text format 0.0.4 and `GET /health`, which answers 200 when healthy and 503 when not, with a JSON body.
// It knows nothing of jobs: it calls the functions it is given on each request (what `sluice run` passes
// are PipelineRunner::metrics_text and health).
//
// Lifecycle: start() binds and serves on a background thread; stop() (or the destructor) stops serving and
// waits for requests in flight. Thread-safety: the provider functions are called from HTTP threads, so they
// must be thread-safe; every member function is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "sluice/core/error.h"

namespace sluice {

/// What /health reports: the HTTP status follows `healthy`, the body is `json`.
struct HealthResponse {
  bool healthy = false;
  std::string json;  ///< a JSON object saying why
};

/// Serves /metrics and /health on `address:port`. Thread-safe (see the file comment).
class MetricsServer {
 public:
  /// Binds `address:port` (port 0: an ephemeral port, see port()) and starts serving. Errors: kNetwork when
  /// the address cannot be bound, naming it; kConfiguration for a port outside 0..65535.
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(std::string address, int port,
                                                                    std::function<std::string()> metrics,
                                                                    std::function<HealthResponse()> health);
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer();

  /// The bound port.
  int port() const noexcept;
  /// Stops serving (idempotent).
  void stop();

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
