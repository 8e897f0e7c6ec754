#include "sluice/core/s3_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "sluice/core/assign_or_return.h"

namespace sluice {
namespace {

constexpr int64_t kMinPartSize = 5LL << 20;  // S3 refuses smaller parts (except the last)

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string trim(std::string s) {
  auto blank = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && blank(static_cast<unsigned char>(s.back())))
    s.pop_back();
  size_t i = 0;
  while (i < s.size() && blank(static_cast<unsigned char>(s[i])))
    ++i;
  return s.substr(i);
}

std::string hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 0xf]);
  }
  return s;
}

// The digest `md` of `bytes` (EVP: SHA-256 for the signature's payload hash, MD5 for Content-MD5).
std::string digest(const EVP_MD* md, std::string_view bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out, &len, md, nullptr) != 1) throw std::bad_alloc();
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string base64(const std::string& raw) {
  std::string out(4 * ((raw.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(raw.data()), static_cast<int>(raw.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// AWS's URI encoding (RFC 3986 unreserved characters kept), '/' kept when `keep_slash`.
std::string aws_encode(std::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// A canonical query string: parameters sorted by name, names and values AWS-encoded, every one with '='
// (curl 7.88 signs the query as it is given, so it must already be canonical).
std::string canonical_query(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string q;
  for (const auto& [k, v] : params) {
    if (!q.empty()) q.push_back('&');
    q += aws_encode(k, false) + "=" + aws_encode(v, false);
  }
  return q;
}

// The text of the first element named `name` under `node` (depth first), or "".
xmlNode* find_element(xmlNode* node, std::string_view name) {
  for (xmlNode* n = node; n != nullptr; n = n->next) {
    if (n->type == XML_ELEMENT_NODE && name == reinterpret_cast<const char*>(n->name)) return n;
    if (xmlNode* found = find_element(n->children, name)) return found;
  }
  return nullptr;
}

std::string element_text(xmlNode* n) {
  if (n == nullptr) return {};
  xmlChar* text = xmlNodeGetContent(n);
  std::string s = text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text));
  xmlFree(text);
  return s;
}

struct XmlDoc {
  explicit XmlDoc(const std::string& body)
      : doc(xmlReadMemory(body.data(), static_cast<int>(body.size()), "s3.xml", nullptr,
                          XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING)) {}
  ~XmlDoc() {
    if (doc != nullptr) xmlFreeDoc(doc);
  }
  XmlDoc(const XmlDoc&) = delete;
  XmlDoc& operator=(const XmlDoc&) = delete;
  xmlNode* root() const { return doc == nullptr ? nullptr : xmlDocGetRootElement(doc); }
  xmlDoc* doc;
};

// "<Code>: <Message>" of an S3 error body, or the body's start.
std::string s3_error_text(const std::string& body) {
  XmlDoc doc(body);
  if (xmlNode* root = doc.root()) {
    std::string code = element_text(find_element(root, "Code"));
    std::string message = element_text(find_element(root, "Message"));
    if (!code.empty()) return message.empty() ? code : code + ": " + message;
  }
  return body.empty() ? std::string("(no body)") : body.substr(0, 200);
}

// Where a response body goes: `body`, or the file `fd` (from offset 0) when one is given and the answer is a 2xx
// (an error's XML body still goes to `body`).
struct BodySink {
  std::string* body = nullptr;
  int fd = -1;
  CURL* curl = nullptr;
  uint64_t written = 0;
  int write_errno = 0;  // set when writing the file failed (the transfer is then aborted)
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<BodySink*>(user);
  const size_t bytes = size * n;
  long status = 0;
  if (sink->fd >= 0) curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &status);
  if (sink->fd < 0 || status / 100 != 2) {
    sink->body->append(data, bytes);
    return bytes;
  }
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::pwrite(sink->fd, data + done, bytes - done, static_cast<off_t>(sink->written));
    if (w < 0) {
      if (errno == EINTR) continue;
      sink->write_errno = errno;
      return 0;  // CURLE_WRITE_ERROR
    }
    done += static_cast<size_t>(w);
    sink->written += static_cast<uint64_t>(w);
  }
  return bytes;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  std::string_view line(data, size * n);
  constexpr std::string_view kEtag = "etag:";
  if (line.size() > kEtag.size()) {
    std::string name(line.substr(0, kEtag.size()));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name == kEtag) *static_cast<std::string*>(user) = trim(std::string(line.substr(kEtag.size())));
  }
  return size * n;
}

struct UploadBody {
  std::string_view bytes;
  size_t offset = 0;
};

size_t on_read(char* buffer, size_t size, size_t n, void* user) {
  auto* body = static_cast<UploadBody*>(user);
  const size_t len = std::min(size * n, body->bytes.size() - body->offset);
  std::memcpy(buffer, body->bytes.data() + body->offset, len);
  body->offset += len;
  return len;
}

// curl's global init once per process (not thread-safe itself).
void curl_global_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    xmlInitParser();
  });
}

// One easy handle per thread, reset before each request (keeps its connection cache).
CURL* thread_handle() {
  struct Handle {
    CURL* curl = curl_easy_init();
    ~Handle() {
      if (curl != nullptr) curl_easy_cleanup(curl);
    }
  };
  thread_local Handle handle;
  curl_easy_reset(handle.curl);
  return handle.curl;
}

Result<std::pair<std::string, std::string>> read_credentials_file(const std::string& path, const std::string& profile,
                                                                  std::string* token) {
  std::ifstream in(path);
  if (!in) return Error(ErrorCode::kConfiguration, fmt::format("cannot read the credentials file {}", path));
  std::string line, section, key_id, secret;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    if (section != profile) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = trim(line.substr(0, eq));
    const std::string v = trim(line.substr(eq + 1));
    if (k == "aws_access_key_id") key_id = v;
    if (k == "aws_secret_access_key") secret = v;
    if (k == "aws_session_token") *token = v;
  }
  return std::make_pair(key_id, secret);
}

std::mutex& shared_mu() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<const S3Client>& shared_client() {
  static std::shared_ptr<const S3Client> client;
  return client;
}

}  // namespace

bool is_s3_uri(std::string_view uri) noexcept {
  return uri.starts_with("s3://") || uri.starts_with("s3a://") || uri.starts_with("s3p://");
}

Result<S3Uri> S3Uri::parse(std::string_view uri) {
  if (!is_s3_uri(uri)) return Error(ErrorCode::kConfiguration, fmt::format("'{}' is not an s3:// URI", uri));
  std::string_view rest = uri.substr(uri.find("://") + 3);
  const size_t slash = rest.find('/');
  S3Uri out;
  out.bucket = std::string(rest.substr(0, slash));
  std::string_view key = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!key.empty() && key.back() == '/')
    key.remove_suffix(1);
  out.key = std::string(key);
  if (out.bucket.empty()) {
    return Error(ErrorCode::kConfiguration, fmt::format("'{}' names no bucket: write s3://bucket/prefix", uri));
  }
  for (char c : out.bucket + out.key) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '/' || c == '.' || c == '_' || c == '-' || c == '=' || c == '+' || c == '~')) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("'{}' has the character '{}', which Sluice does not use in S3 keys (allowed: letters, "
                               "digits and / . _ - = + ~)",
                               uri, c));
    }
  }
  if (out.key.find("//") != std::string::npos) {
    return Error(ErrorCode::kConfiguration, fmt::format("'{}' has an empty path segment ('//')", uri));
  }
  return out;
}

std::string S3Uri::to_string() const {
  return key.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + key;
}

Result<S3Options> S3Options::from_config(const Configuration& config) {
  S3Options o;
  o.endpoint = config.get(options::kS3Endpoint);
  if (o.endpoint.empty()) o.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = env("AWS_ENDPOINT_URL");
  while (!o.endpoint.empty() && o.endpoint.back() == '/')
    o.endpoint.pop_back();
  o.path_style = config.get(options::kS3PathStyleAccess);
  o.region = config.get(options::kS3Region);
  if (o.region.empty()) o.region = env("AWS_REGION");
  if (o.region.empty()) o.region = env("AWS_DEFAULT_REGION");
  if (o.region.empty()) o.region = "us-east-1";
  o.multipart_threshold = config.get(options::kS3MultipartThreshold);
  o.part_size = config.get(options::kS3MultipartPartSize);
  o.max_attempts = config.get(options::kS3MaxAttempts);
  o.initial_backoff_ms = config.get(options::kS3RetryInitialBackoff);
  o.max_backoff_ms = config.get(options::kS3RetryMaxBackoff);
  o.request_timeout_ms = config.get(options::kS3RequestTimeout);
  o.connect_timeout_ms = config.get(options::kS3ConnectTimeout);
  if (o.part_size < kMinPartSize) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} is {} bytes; S3 needs parts of at least 5 MiB",
                                                        options::kS3MultipartPartSize.key, o.part_size));
  }
  if (o.multipart_threshold < 0) {
    return Error(ErrorCode::kConfiguration, fmt::format("{} is negative", options::kS3MultipartThreshold.key));
  }
  if (o.max_attempts < 1) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} is {}; it must be at least 1", options::kS3MaxAttempts.key, o.max_attempts));
  }
  if (o.request_timeout_ms <= 0 || o.connect_timeout_ms <= 0 || o.initial_backoff_ms < 0 || o.max_backoff_ms < 0) {
    return Error(ErrorCode::kConfiguration, "s3 timeouts must be positive and backoffs not negative");
  }

  o.access_key = config.get(options::kS3AccessKey);
  o.secret_key = config.get(options::kS3SecretKey);
  if (o.access_key.empty() != o.secret_key.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("set both {} and {}, or neither", options::kS3AccessKey.key, options::kS3SecretKey.key));
  }
  if (o.access_key.empty()) {
    o.access_key = env("AWS_ACCESS_KEY_ID");
    o.secret_key = env("AWS_SECRET_ACCESS_KEY");
    o.session_token = env("AWS_SESSION_TOKEN");
  }
  if (o.access_key.empty() || o.secret_key.empty()) {
    std::string file = config.get(options::kS3CredentialsFile);
    const bool named = !file.empty();
    if (file.empty()) file = env("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty() && !env("HOME").empty()) file = env("HOME") + "/.aws/credentials";
    std::string profile = env("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    std::string token;
    auto creds = read_credentials_file(file, profile, &token);
    if (creds.ok() && !creds->first.empty()) {
      o.access_key = creds->first;
      o.secret_key = creds->second;
      o.session_token = token;
    } else if (named) {
      return creds.ok()
                 ? Error(ErrorCode::kConfiguration,
                         fmt::format("the credentials file {} has no aws_access_key_id in profile [{}]", file, profile))
                 : creds.error();
    } else {
      o.access_key.clear();
      o.secret_key.clear();
    }
  }
  return o;
}

S3Client::S3Client(S3Options options) : options_(std::move(options)) {
  curl_global_once();
}
S3Client::~S3Client() = default;

Status S3Client::configure(const Configuration& config) {
  SLUICE_ASSIGN_OR_RETURN(auto o, S3Options::from_config(config));
  auto client = std::make_shared<const S3Client>(std::move(o));
  std::lock_guard lock(shared_mu());
  shared_client() = std::move(client);
  return ok_status();
}

Result<std::shared_ptr<const S3Client>> S3Client::shared() {
  std::lock_guard lock(shared_mu());
  if (shared_client() == nullptr) {
    SLUICE_ASSIGN_OR_RETURN(auto o, S3Options::from_config(Configuration()));
    shared_client() = std::make_shared<const S3Client>(std::move(o));
  }
  return shared_client();
}

Result<S3Client::Response> S3Client::request(std::string_view method, const std::string& bucket, const std::string& key,
                                             const std::string& query, std::string_view body, int body_fd) const {
  std::string url;
  std::string endpoint =
      options_.endpoint.empty() ? fmt::format("https://s3.{}.amazonaws.com", options_.region) : options_.endpoint;
  const std::string path = key.empty() ? std::string() : aws_encode(key, true);
  if (options_.path_style) {
    url = fmt::format("{}/{}/{}", endpoint, bucket, path);
  } else {
    const size_t scheme = endpoint.find("://");
    url = scheme == std::string::npos
              ? fmt::format("https://{}.{}/{}", bucket, endpoint, path)
              : fmt::format("{}{}.{}/{}", endpoint.substr(0, scheme + 3), bucket, endpoint.substr(scheme + 3), path);
  }
  if (!query.empty()) url += "?" + query;
  const std::string what = fmt::format("S3 {} s3://{}/{}{}{}", method, bucket, key, query.empty() ? "" : "?", query);

  const std::string payload_hash = hex(reinterpret_cast<const unsigned char*>(digest(EVP_sha256(), body).data()), 32);
  const bool has_body = method == "PUT" || method == "POST";
  const std::string md5 = has_body ? base64(digest(EVP_md5(), body)) : std::string();
  const std::string sigv4 = fmt::format("aws:amz:{}:s3", options_.region);
  const std::string userpwd = options_.access_key + ":" + options_.secret_key;

  thread_local std::mt19937_64 rng{std::random_device{}()};
  int64_t backoff = options_.initial_backoff_ms;
  std::string last_failure;
  for (int attempt = 1;; ++attempt) {
    CURL* curl = thread_handle();
    if (curl == nullptr) return Error(ErrorCode::kCheckpoint, what + ": curl_easy_init failed");
    Response response;
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, ("x-amz-content-sha256: " + payload_hash).c_str());
    if (!options_.session_token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + options_.session_token).c_str());
    if (has_body) {
      headers = curl_slist_append(headers, ("Content-MD5: " + md5).c_str());
      headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    }
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    UploadBody upload{body, 0};
    BodySink sink{&response.body, body_fd, curl, 0, 0};
    if (body_fd >= 0 && ::ftruncate(body_fd, 0) != 0) {  // a retry starts the file again
      const int err = errno;
      curl_slist_free_all(headers);
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("{}: the download file cannot be truncated: {}", what, std::strerror(err)));
    }
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (body_fd >= 0) {
      // A download into a file may be larger than any fixed time allows (a state file of many GiB): no total
      // timeout, but one that is slower than 1 KiB/s for the request timeout has stalled.
      curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 0L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                       std::max(1L, static_cast<long>(options_.request_timeout_ms / 1000)));
    } else {
      curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout_ms));
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 0L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 0L);
    }
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.etag);
    if (!options_.access_key.empty()) {
      curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd.c_str());
    }
    if (method == "PUT") {
      curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(curl, CURLOPT_READDATA, &upload);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
    } else if (method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    } else if (method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
    }
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    if (sink.write_errno != 0) {  // the local disk, not S3: retrying would not help
      return Error(ErrorCode::kCheckpoint, fmt::format("{}: writing the download to a local file failed: {}", what,
                                                       std::strerror(sink.write_errno)));
    }
    bool retry = false;
    if (rc != CURLE_OK) {
      last_failure = fmt::format("{} (curl error {})", curl_easy_strerror(rc), static_cast<int>(rc));
      retry = true;
    } else {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
      curl_off_t length = -1;
      if (curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK) {
        response.content_length = static_cast<int64_t>(length);
      }
      if (response.status >= 500 || response.status == 429) {
        last_failure = fmt::format("HTTP {}: {}", response.status, s3_error_text(response.body));
        retry = true;
      } else {
        return response;
      }
    }
    if (!retry || attempt >= options_.max_attempts) {
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("{} failed after {} attempt(s): {}", what, attempt, last_failure));
    }
    const int64_t wait = std::min(backoff, options_.max_backoff_ms);
    const int64_t jittered = wait / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(wait / 2 + 1));
    spdlog::warn("{} attempt {} of {} failed: {}; retrying in {} ms", what, attempt, options_.max_attempts,
                 last_failure, jittered);
    std::this_thread::sleep_for(std::chrono::milliseconds(jittered));
    backoff = std::min(backoff * 2, options_.max_backoff_ms);
  }
}

Error S3Client::http_error(std::string_view what, const std::string& bucket, const std::string& key, long status,
                           const std::string& body) const {
  std::string hint;
  if (status == 401 || status == 403) {
    hint = options_.access_key.empty()
               ? fmt::format(
                     " (this process has no S3 credentials, so the request was sent unsigned: set {} and {}, "
                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a credentials file)",
                     options::kS3AccessKey.key, options::kS3SecretKey.key)
               : " (the request was signed with this process's credentials: check their access to the bucket and "
                 "s3.region)";
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("S3 {} s3://{}/{}: HTTP {}: {}{}", what, bucket, key, status, s3_error_text(body), hint));
}

Status S3Client::put_object(const std::string& bucket, const std::string& key, std::string_view bytes) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("PUT", bucket, key, "", bytes));
  if (r.status / 100 != 2) return http_error("PUT", bucket, key, r.status, r.body);
  return ok_status();
}

Result<std::string> S3Client::get_object(const std::string& bucket, const std::string& key, bool* found) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("GET", bucket, key, "", {}));
  if (found != nullptr) *found = r.status != 404;
  if (r.status == 404 && found != nullptr) return std::string();
  if (r.status / 100 != 2) return http_error("GET", bucket, key, r.status, r.body);
  return std::move(r.body);
}

Result<uint64_t> S3Client::get_object_to_file(const std::string& bucket, const std::string& key, int fd,
                                              bool* found) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("GET", bucket, key, "", {}, fd));
  if (found != nullptr) *found = r.status != 404;
  if (r.status == 404 && found != nullptr) return uint64_t{0};
  if (r.status / 100 != 2) return http_error("GET", bucket, key, r.status, r.body);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Error(ErrorCode::kCheckpoint, fmt::format("S3 GET s3://{}/{}: the download file cannot be read: {}", bucket,
                                                     key, std::strerror(errno)));
  }
  return static_cast<uint64_t>(st.st_size);
}

Result<bool> S3Client::exists(const std::string& bucket, const std::string& key) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("HEAD", bucket, key, "", {}));
  if (r.status == 404) return false;
  if (r.status / 100 != 2) return http_error("HEAD", bucket, key, r.status, r.body);
  return true;
}

Result<std::optional<S3Object>> S3Client::head_object(const std::string& bucket, const std::string& key) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("HEAD", bucket, key, "", {}));
  if (r.status == 404) return std::optional<S3Object>();
  if (r.status / 100 != 2) return http_error("HEAD", bucket, key, r.status, r.body);
  S3Object o;
  o.key = key;
  o.size = r.content_length;
  o.etag = std::move(r.etag);
  return std::optional<S3Object>(std::move(o));
}

Result<S3Listing> S3Client::list(const std::string& bucket, const std::string& prefix,
                                 std::string_view delimiter) const {
  S3Listing out;
  std::string token;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> params{{"list-type", "2"}, {"prefix", prefix}};
    if (!delimiter.empty()) params.emplace_back("delimiter", std::string(delimiter));
    if (!token.empty()) params.emplace_back("continuation-token", token);
    SLUICE_ASSIGN_OR_RETURN(auto r, request("GET", bucket, "", canonical_query(std::move(params)), {}));
    if (r.status / 100 != 2) return http_error("LIST", bucket, prefix, r.status, r.body);
    XmlDoc doc(r.body);
    xmlNode* root = doc.root();
    if (root == nullptr) {
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("S3 LIST s3://{}/{}: the answer is not XML: {}", bucket, prefix, r.body.substr(0, 200)));
    }
    bool truncated = false;
    token.clear();
    for (xmlNode* n = root->children; n != nullptr; n = n->next) {
      if (n->type != XML_ELEMENT_NODE) continue;
      std::string_view name = reinterpret_cast<const char*>(n->name);
      if (name == "Contents") {
        S3Object o;
        o.key = element_text(find_element(n->children, "Key"));
        o.size = std::atoll(element_text(find_element(n->children, "Size")).c_str());
        o.last_modified = element_text(find_element(n->children, "LastModified"));
        o.etag = element_text(find_element(n->children, "ETag"));
        out.objects.push_back(std::move(o));
      } else if (name == "CommonPrefixes") {
        out.common_prefixes.push_back(element_text(find_element(n->children, "Prefix")));
      } else if (name == "IsTruncated") {
        truncated = element_text(n) == "true";
      } else if (name == "NextContinuationToken") {
        token = element_text(n);
      }
    }
    if (!truncated || token.empty()) break;
  }
  return out;
}

Status S3Client::delete_object(const std::string& bucket, const std::string& key) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("DELETE", bucket, key, "", {}));
  if (r.status / 100 != 2 && r.status != 404) return http_error("DELETE", bucket, key, r.status, r.body);
  return ok_status();
}

Result<int64_t> S3Client::delete_prefix(const std::string& bucket, const std::string& prefix) const {
  SLUICE_ASSIGN_OR_RETURN(auto listing, list(bucket, prefix));
  for (const S3Object& o : listing.objects)
    SLUICE_RETURN_IF_ERROR(delete_object(bucket, o.key));
  return static_cast<int64_t>(listing.objects.size());
}

Status S3Client::create_bucket(const std::string& bucket) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("PUT", bucket, "", "", {}));
  if (r.status / 100 == 2) return ok_status();
  if (r.status == 409 && s3_error_text(r.body).starts_with("BucketAlreadyOwnedByYou")) return ok_status();
  return http_error("CreateBucket", bucket, "", r.status, r.body);
}

Result<std::string> S3Client::create_multipart_upload(const std::string& bucket, const std::string& key) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("POST", bucket, key, "uploads=", {}));
  if (r.status / 100 != 2) return http_error("CreateMultipartUpload", bucket, key, r.status, r.body);
  XmlDoc doc(r.body);
  std::string id = element_text(find_element(doc.root(), "UploadId"));
  if (id.empty()) {
    return Error(ErrorCode::kCheckpoint,
                 fmt::format("S3 CreateMultipartUpload s3://{}/{}: no UploadId in the answer", bucket, key));
  }
  return id;
}

Result<std::string> S3Client::upload_part(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id, int part_number, std::string_view bytes) const {
  SLUICE_ASSIGN_OR_RETURN(
      auto r, request("PUT", bucket, key,
                      canonical_query({{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}}), bytes));
  if (r.status / 100 != 2) return http_error(fmt::format("UploadPart {}", part_number), bucket, key, r.status, r.body);
  if (r.etag.empty()) {
    return Error(ErrorCode::kCheckpoint,
                 fmt::format("S3 UploadPart {} s3://{}/{}: no ETag in the answer", part_number, bucket, key));
  }
  return std::move(r.etag);
}

Status S3Client::complete_multipart_upload(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id, const std::vector<std::string>& etags,
                                           bool* no_such_upload) const {
  if (no_such_upload != nullptr) *no_such_upload = false;
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", i + 1, etags[i]);
  xml += "</CompleteMultipartUpload>";
  SLUICE_ASSIGN_OR_RETURN(auto r, request("POST", bucket, key, canonical_query({{"uploadId", upload_id}}), xml));
  if (r.status == 404 && no_such_upload != nullptr) *no_such_upload = true;
  // S3 may answer 200 with an <Error> body when the completion failed after the headers were sent.
  if (r.status / 100 != 2 || r.body.find("<Error>") != std::string::npos)
    return http_error("CompleteMultipartUpload", bucket, key, r.status, r.body);
  return ok_status();
}

Status S3Client::abort_multipart_upload(const std::string& bucket, const std::string& key,
                                        const std::string& upload_id) const {
  SLUICE_ASSIGN_OR_RETURN(auto r, request("DELETE", bucket, key, canonical_query({{"uploadId", upload_id}}), {}));
  if (r.status / 100 != 2 && r.status != 404) return http_error("AbortMultipartUpload", bucket, key, r.status, r.body);
  return ok_status();
}

Result<std::vector<S3MultipartUpload>> S3Client::list_multipart_uploads(const std::string& bucket,
                                                                        const std::string& prefix) const {
  std::vector<S3MultipartUpload> out;
  std::string key_marker, upload_id_marker;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> params{{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) params.emplace_back("key-marker", key_marker);
    if (!upload_id_marker.empty()) params.emplace_back("upload-id-marker", upload_id_marker);
    SLUICE_ASSIGN_OR_RETURN(auto r, request("GET", bucket, "", canonical_query(std::move(params)), {}));
    if (r.status / 100 != 2) return http_error("ListMultipartUploads", bucket, prefix, r.status, r.body);
    XmlDoc doc(r.body);
    xmlNode* root = doc.root();
    if (root == nullptr) {
      return Error(ErrorCode::kCheckpoint, fmt::format("S3 ListMultipartUploads s3://{}/{}: the answer is not XML: {}",
                                                       bucket, prefix, r.body.substr(0, 200)));
    }
    bool truncated = false;
    key_marker.clear();
    upload_id_marker.clear();
    for (xmlNode* n = root->children; n != nullptr; n = n->next) {
      if (n->type != XML_ELEMENT_NODE) continue;
      std::string_view name = reinterpret_cast<const char*>(n->name);
      if (name == "Upload") {
        S3MultipartUpload u;
        u.key = element_text(find_element(n->children, "Key"));
        u.upload_id = element_text(find_element(n->children, "UploadId"));
        u.initiated = element_text(find_element(n->children, "Initiated"));
        out.push_back(std::move(u));
      } else if (name == "IsTruncated") {
        truncated = element_text(n) == "true";
      } else if (name == "NextKeyMarker") {
        key_marker = element_text(n);
      } else if (name == "NextUploadIdMarker") {
        upload_id_marker = element_text(n);
      }
    }
    if (!truncated || (key_marker.empty() && upload_id_marker.empty())) break;
  }
  return out;
}

std::string S3Client::multipart_etag(const std::vector<std::string>& part_etags) {
  std::string md5s;
  for (const std::string& etag : part_etags) {
    std::string_view h = etag;
    if (h.size() >= 2 && h.front() == '"' && h.back() == '"') h = h.substr(1, h.size() - 2);
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
      unsigned value = 0;
      std::from_chars(h.data() + i, h.data() + i + 2, value, 16);
      md5s.push_back(static_cast<char>(value));
    }
  }
  const std::string d = digest(EVP_md5(), md5s);
  return fmt::format("\"{}-{}\"", hex(reinterpret_cast<const unsigned char*>(d.data()), d.size()), part_etags.size());
}

S3ObjectWriter::S3ObjectWriter(std::shared_ptr<const S3Client> client, std::string bucket, std::string key)
    : client_(std::move(client)), bucket_(std::move(bucket)), key_(std::move(key)) {}

S3ObjectWriter::~S3ObjectWriter() {
  if (!done_) abort();
}

Status S3ObjectWriter::append(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  const auto& o = client_->options();
  while (n > 0) {
    // Under the threshold everything is kept for one PUT; past it, parts go out as they fill.
    if (upload_id_.empty() && static_cast<int64_t>(buffer_.size() + n) <= o.multipart_threshold) {
      buffer_.append(p, n);
      return ok_status();
    }
    if (upload_id_.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto id, client_->create_multipart_upload(bucket_, key_));
      upload_id_ = std::move(id);
    }
    const size_t room = static_cast<size_t>(o.part_size) - std::min(buffer_.size(), static_cast<size_t>(o.part_size));
    const size_t take = std::min(room, n);
    buffer_.append(p, take);
    p += take;
    n -= take;
    while (static_cast<int64_t>(buffer_.size()) >= o.part_size)
      SLUICE_RETURN_IF_ERROR(flush_part());
  }
  return ok_status();
}

Status S3ObjectWriter::flush_part() {
  const size_t len = std::min(buffer_.size(), static_cast<size_t>(client_->options().part_size));
  SLUICE_ASSIGN_OR_RETURN(auto etag,
                          client_->upload_part(bucket_, key_, upload_id_, static_cast<int>(etags_.size()) + 1,
                                               std::string_view(buffer_).substr(0, len)));
  etags_.push_back(std::move(etag));
  buffer_.erase(0, len);
  return ok_status();
}

Status S3ObjectWriter::finish() {
  if (upload_id_.empty()) {
    SLUICE_RETURN_IF_ERROR(client_->put_object(bucket_, key_, buffer_));
  } else {
    if (!buffer_.empty() || etags_.empty()) SLUICE_RETURN_IF_ERROR(flush_part());
    SLUICE_RETURN_IF_ERROR(client_->complete_multipart_upload(bucket_, key_, upload_id_, etags_));
  }
  done_ = true;
  buffer_.clear();
  buffer_.shrink_to_fit();
  return ok_status();
}

void S3ObjectWriter::abort() noexcept {
  done_ = true;
  if (upload_id_.empty()) return;
  try {
    Status s = client_->abort_multipart_upload(bucket_, key_, upload_id_);
    if (!s.ok()) spdlog::warn("aborting the multipart upload of s3://{}/{}: {}", bucket_, key_, s.error().to_string());
  } catch (const std::exception& e) {
    spdlog::warn("aborting the multipart upload of s3://{}/{}: {}", bucket_, key_, e.what());
  }
  upload_id_.clear();
}

}  // namespace sluice
