#include "rest_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace sluice::cli {

struct RestClient::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

namespace {

size_t append_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

/// The first message of a {"errors": [...]} answer, or the raw body.
std::string server_message(const std::string& body) {
  auto v = Value::from_json(body);
  if (v.ok()) {
    if (const Value* errors = v->find("errors");
        errors != nullptr && errors->is_array() && errors->size() > 0 && errors->at(0).is_string()) {
      return std::string(errors->at(0).as_string());
    }
  }
  return body.empty() ? "(no message)" : body;
}

}  // namespace

Result<RestClient> RestClient::create(std::string_view host_port) {
  std::string_view s = host_port;
  std::string_view scheme = "http";
  if (s.starts_with("http://")) {
    s.remove_prefix(7);
  } else if (s.starts_with("https://")) {
    s.remove_prefix(8);
    scheme = "https";
  }
  while (s.ends_with('/'))
    s.remove_suffix(1);
  std::string_view host = s;
  std::string port = "8081";
  if (auto colon = s.rfind(':'); colon != std::string_view::npos) {
    host = s.substr(0, colon);
    std::string_view p = s.substr(colon + 1);
    int value = 0;
    auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
    if (ec != std::errc() || end != p.data() + p.size() || value < 1 || value > 65535) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("--jobmanager '{}': '{}' is not a port (1..65535); expected HOST:PORT", host_port, p));
    }
    port = std::string(p);
  }
  if (host.empty()) {
    return Error(ErrorCode::kConfiguration, fmt::format("--jobmanager '{}': no host; expected HOST:PORT", host_port));
  }
  return RestClient(fmt::format("{}://{}:{}", scheme, host, port), port);
}

RestClient::RestClient(std::string base_url, std::string port)
    : base_url_(std::move(base_url)), port_(std::move(port)), handle_(std::make_unique<Handle>()) {}
RestClient::RestClient(RestClient&&) noexcept = default;
RestClient& RestClient::operator=(RestClient&&) noexcept = default;
RestClient::~RestClient() = default;

Result<Value> RestClient::call(std::string_view method, const std::string& path, const Value* body) {
  if (handle_->curl == nullptr) {
    handle_->curl = curl_easy_init();
    if (handle_->curl == nullptr) return Error(ErrorCode::kInternal, "curl_easy_init failed");
  } else {
    curl_easy_reset(handle_->curl);  // keeps the connection for the next request
  }
  CURL* curl = handle_->curl;
  const std::string url = base_url_ + path;
  std::string response;
  std::string request_body = body != nullptr ? body->to_json() : std::string();
  const std::string method_str(method);
  char error_buffer[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_slist* accept = curl_slist_append(headers, "Accept: application/json");
  if (accept != nullptr) headers = accept;
  if (!token_.empty()) {
    const std::string authorization = "Authorization: Bearer " + token_;
    if (curl_slist* h = curl_slist_append(headers, authorization.c_str()); h != nullptr) headers = h;
  }
  if (!ca_file_.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file_.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_str.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request_body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request_body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request_timeout_.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // the JobManager is local or on the cluster's network
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    std::string what = error_buffer[0] != '\0' ? std::string(error_buffer) : curl_easy_strerror(rc);
    curl_off_t connected_us = 0;
    curl_easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connected_us);
    if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_CONNECT_ERROR) {
      return Error(ErrorCode::kNetwork,
                   fmt::format("TLS with the JobManager's REST API at {} failed: {}. Pass the CA certificate that "
                               "signed its certificate with --ca-file (and https:// only if it serves "
                               "security.ssl.rest.enabled)",
                               base_url_, what));
    }
    if (rc == CURLE_OPERATION_TIMEDOUT && connected_us > 0) {
      // Something listens there but does not answer: "is a job running?" would mislead.
      return Error(ErrorCode::kNetwork,
                   fmt::format("the JobManager's REST API at {} accepted the connection but did not answer {} {} "
                               "within {} ms: is that process paused (SIGSTOP) or overloaded? ({})",
                               base_url_, method, path, request_timeout_.count(), what));
    }
    return Error(ErrorCode::kNetwork,
                 fmt::format("cannot reach the JobManager's REST API at {}: {}. Is a job running with --rest-port "
                             "{}? Start one with, for example, `sluice example running-sum --rate 100 "
                             "--checkpoint-dir /tmp/ckpt --rest-port {}`, or pass --jobmanager HOST:PORT",
                             base_url_, what, port_, port_));
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 400) {
    return Error(status >= 500 ? ErrorCode::kRuntime : ErrorCode::kConfiguration,
                 fmt::format("{} {} answered HTTP {}: {}", method, url, status, server_message(response)));
  }
  if (response.empty()) return Value::object();
  auto parsed = Value::from_json(response);
  if (!parsed.ok()) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("{} {} answered something that is not JSON (is {} a Sluice JobManager?): {}", method, url,
                             base_url_, parsed.error().message()));
  }
  return std::move(*parsed);
}

Result<std::string> RestClient::load_token(const std::string& file, const std::string& env) {
  std::string token;
  if (!file.empty() && !env.empty()) {
    return Error(ErrorCode::kConfiguration, "--token-file and --token-env are both set; pass one of them");
  }
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Error(ErrorCode::kConfiguration, fmt::format("--token-file {}: cannot read the file", file));
    std::ostringstream text;
    text << in.rdbuf();
    token = text.str();
  } else if (!env.empty()) {
    const char* value = std::getenv(env.c_str());
    if (value == nullptr || *value == '\0') {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("--token-env {}: the environment variable is not set or empty", env));
    }
    token = value;
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
    token.pop_back();
  if ((!file.empty() || !env.empty()) && token.empty()) {
    return Error(ErrorCode::kConfiguration, fmt::format("--token-file {}: the file is empty", file));
  }
  return token;
}

}  // namespace sluice::cli
