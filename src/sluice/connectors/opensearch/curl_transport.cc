// The libcurl BulkTransport of the OpenSearch sink (opensearch_sink.h): one easy handle per writer, so the
// connection is kept alive between requests; the I/O thread of the writer is its only user.
#include <curl/curl.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/core/redact.h"

namespace sluice::opensearch {

namespace {

void global_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

class CurlBulkTransport final : public BulkTransport {
 public:
  explicit CurlBulkTransport(const OpenSearchSinkOptions& options) : options_(options) {
    global_init_once();
    curl_ = curl_easy_init();
    headers_ = curl_slist_append(headers_, "Content-Type: application/x-ndjson");
    // No "Expect: 100-continue" round trip before large bodies.
    headers_ = curl_slist_append(headers_, "Expect:");
    if (!options_.api_key.empty()) {
      headers_ = curl_slist_append(headers_, ("Authorization: ApiKey " + options_.api_key).c_str());
    }
    query_ = "/_bulk?filter_path=errors,items.*.status,items.*.error";
    if (!options_.refresh.empty()) query_ += "&refresh=" + options_.refresh;
  }
  ~CurlBulkTransport() override {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
    curl_slist_free_all(headers_);
  }
  CurlBulkTransport(const CurlBulkTransport&) = delete;
  CurlBulkTransport& operator=(const CurlBulkTransport&) = delete;

  HttpResult post_bulk(std::string_view body) override {
    HttpResult r;
    if (curl_ == nullptr) {
      r.network_error = true;
      r.error = "curl_easy_init failed";
      return r;
    }
    if (aborted_.load(std::memory_order_relaxed)) {
      r.network_error = true;
      r.error = "aborted (the writer is closing)";
      return r;
    }
    std::string base = options_.urls[current_ % options_.urls.size()];
    while (!base.empty() && base.back() == '/')
      base.pop_back();
    const std::string url = base + query_;
    response_.clear();
    errbuf_[0] = '\0';
    CURL* c = curl_;
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout.count()));
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf_);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &CurlBulkTransport::on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, this);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &CurlBulkTransport::on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, this);
    if (!options_.username.empty() || !options_.password.empty()) {
      curl_easy_setopt(c, CURLOPT_HTTPAUTH, static_cast<long>(CURLAUTH_BASIC));
      curl_easy_setopt(c, CURLOPT_USERNAME, options_.username.c_str());
      curl_easy_setopt(c, CURLOPT_PASSWORD, options_.password.c_str());
    }
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, options_.tls_verify_peer ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, options_.tls_verify_host ? 2L : 0L);
    if (!options_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (!options_.client_cert_file.empty()) curl_easy_setopt(c, CURLOPT_SSLCERT, options_.client_cert_file.c_str());
    if (!options_.client_key_file.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, options_.client_key_file.c_str());
    const CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) {
      r.network_error = true;
      r.permanent = is_permanent(rc);
      r.error = redact_secrets(
          fmt::format("{} ({}){}{}", curl_easy_strerror(rc), base, errbuf_[0] != '\0' ? ": " : "", errbuf_));
      ++current_;  // the next URL of the list, if any
      return r;
    }
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    r.status = static_cast<int>(code);
    r.body = std::move(response_);
    response_ = std::string();
    return r;
  }

  void abort() override { aborted_.store(true, std::memory_order_relaxed); }

 private:
  // Failures of the configuration, not of the network: a retry or a restart meets them again. A handshake that
  // fails otherwise (CURLE_SSL_CONNECT_ERROR: a reset mid-handshake, a server still starting) stays retryable.
  static bool is_permanent(CURLcode rc) {
    switch (rc) {
      case CURLE_PEER_FAILED_VERIFICATION:  // the certificate is not signed by a trusted CA or names another host
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_SSL_CERTPROBLEM:  // the client certificate
      case CURLE_SSL_ISSUER_ERROR:
      case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      case CURLE_SSL_CRL_BADFILE:
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
        return true;
      default:
        return false;
    }
  }

  static size_t on_data(char* data, size_t size, size_t n, void* self) {
    static_cast<CurlBulkTransport*>(self)->response_.append(data, size * n);
    return size * n;
  }
  static int on_progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<CurlBulkTransport*>(self)->aborted_.load(std::memory_order_relaxed) ? 1 : 0;
  }

  OpenSearchSinkOptions options_;
  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string query_;
  std::string response_;
  char errbuf_[CURL_ERROR_SIZE] = {};
  size_t current_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<BulkTransport> make_curl_transport(const OpenSearchSinkOptions& options) {
  return std::make_unique<CurlBulkTransport>(options);
}

}  // namespace sluice::opensearch
