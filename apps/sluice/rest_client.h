// RestClient: the `sluice` command's client of a JobManager's REST API (sluice list/savepoint/stop/cancel),
// over libcurl. Requests and answers are JSON (Value); error answers ({"errors": [...]}) become Errors that
// carry the server's message.
//
// Threading: one RestClient per thread (it owns a curl handle). Call curl_global_init() once in main()
// before creating one.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice::cli {

class RestClient {
 public:
  /// A client of `host_port` ("HOST:PORT", "HOST" for port 8081, "http://HOST:PORT" or "https://HOST:PORT").
  /// Errors: kConfiguration for an empty host or a port outside 1..65535.
  [[nodiscard]] static Result<RestClient> create(std::string_view host_port);

  RestClient(RestClient&&) noexcept;
  RestClient& operator=(RestClient&&) noexcept;
  ~RestClient();

  /// "http://HOST:PORT" or "https://HOST:PORT".
  const std::string& base_url() const noexcept { return base_url_; }

  /// Sends `method` (GET, POST, PATCH) to `path` (with its query) with an optional JSON body and returns the
  /// parsed JSON answer of a 2xx status. Errors: kNetwork when the server cannot be reached (naming the
  /// address and how to start a job that serves it); kConfiguration for a 4xx answer with the server's
  /// message (a 404 for an unknown job says so); kRuntime for a 5xx answer; kSerialization for an answer
  /// that is not JSON.
  [[nodiscard]] Result<Value> call(std::string_view method, const std::string& path, const Value* body = nullptr);

  /// Longest wait for one answer, connection included (default 60 s); a server that accepted the connection and
  /// did not answer in time (a paused or overloaded process) is a kNetwork error saying so.
  void set_request_timeout(std::chrono::milliseconds timeout) noexcept { request_timeout_ = timeout; }

  /// Sends `Authorization: Bearer <token>` with every request ("" = none).
  void set_token(std::string token) { token_ = std::move(token); }
  /// Verifies an https server's certificate against the CA certificates of this PEM file ("" = the system's).
  void set_ca_file(std::string path) { ca_file_ = std::move(path); }

  /// The token of `--token-file` (the file's text without trailing whitespace) or `--token-env` (that environment
  /// variable's value); "" when both are empty. Errors: kConfiguration naming the file or variable.
  [[nodiscard]] static Result<std::string> load_token(const std::string& file, const std::string& env);

 private:
  struct Handle;
  RestClient(std::string base_url, std::string port);
  std::string base_url_;
  std::string port_;
  std::chrono::milliseconds request_timeout_{60'000};
  std::string token_;
  std::string ca_file_;
  std::unique_ptr<Handle> handle_;
};

}  // namespace sluice::cli
