// EtcdClient over etcd's JSON gateway (grpc-gateway in front of the v3 gRPC API): requests are the protobuf
// messages as JSON with bytes in base64 and int64 as decimal strings; answers omit fields at their default (false, 0,
// empty), so an absent field is read as its default here too.
#include "sluice/cluster/ha/etcd_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include <charconv>
#include <mutex>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/value.h"

namespace sluice::ha {

namespace {

void global_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string base64_encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  if (in.empty()) return std::string();
  if (in.size() % 4 != 0) return Error(ErrorCode::kConnector, fmt::format("etcd returned bad base64 '{}'", in));
  std::string out(3 * (in.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return Error(ErrorCode::kConnector, fmt::format("etcd returned bad base64 '{}'", in));
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t len = static_cast<size_t>(n);
  if (in.ends_with("==")) {
    len -= 2;
  } else if (in.ends_with("=")) {
    len -= 1;
  }
  out.resize(len);
  return out;
}

/// An int64 field of a gateway answer: a decimal string (the protobuf JSON mapping), a number, or absent (0).
Result<int64_t> int_field(const Value& obj, std::string_view name) {
  const Value* v = obj.find(name);
  if (v == nullptr || v->is_null()) return int64_t{0};
  if (v->is_int64()) return v->as_int64();
  if (v->is_string()) {
    const std::string_view s = v->as_string();
    int64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && p == s.data() + s.size()) return out;
  }
  return Error(ErrorCode::kConnector, fmt::format("etcd's answer has a non-integer '{}'", name));
}

bool bool_field(const Value& obj, std::string_view name) {
  const Value* v = obj.find(name);
  return v != nullptr && v->is_bool() && v->as_bool();
}

Result<std::string> bytes_field(const Value& obj, std::string_view name) {
  const Value* v = obj.find(name);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string()) return Error(ErrorCode::kConnector, fmt::format("etcd's answer has a non-string '{}'", name));
  return base64_decode(v->as_string());
}

Result<EtcdKeyValue> parse_kv(const Value& kv) {
  EtcdKeyValue out;
  SLUICE_ASSIGN_OR_RETURN(auto key, bytes_field(kv, "key"));
  out.key = std::move(key);
  SLUICE_ASSIGN_OR_RETURN(auto value, bytes_field(kv, "value"));
  out.value = std::move(value);
  for (auto [name, field] : {std::pair<std::string_view, int64_t*>{"create_revision", &out.create_revision},
                             {"mod_revision", &out.mod_revision},
                             {"version", &out.version},
                             {"lease", &out.lease}}) {
    SLUICE_ASSIGN_OR_RETURN(auto n, int_field(kv, name));
    *field = n;
  }
  return out;
}

Result<std::vector<EtcdKeyValue>> parse_kvs(const Value& range_response) {
  std::vector<EtcdKeyValue> out;
  const Value* kvs = range_response.find("kvs");
  if (kvs == nullptr || kvs->is_null()) return out;
  if (!kvs->is_array()) return Error(ErrorCode::kConnector, "etcd's range answer has a non-array 'kvs'");
  for (const Value& kv : kvs->as_array()) {
    SLUICE_ASSIGN_OR_RETURN(auto parsed, parse_kv(kv));
    out.push_back(std::move(parsed));
  }
  return out;
}

/// "\"<b64>\"": a JSON string of the key's base64 (base64 needs no escaping).
std::string b64_json(std::string_view bytes) {
  return "\"" + base64_encode(bytes) + "\"";
}

/// The range_end that selects every key starting with `prefix` (etcd's "prefix + 1" rule).
std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string_view target_name(EtcdCompare::Target t) {
  switch (t) {
    case EtcdCompare::Target::kCreateRevision:
      return "CREATE";
    case EtcdCompare::Target::kModRevision:
      return "MOD";
    case EtcdCompare::Target::kVersion:
      return "VERSION";
    case EtcdCompare::Target::kValue:
      return "VALUE";
    case EtcdCompare::Target::kLease:
      return "LEASE";
  }
  return "CREATE";
}

std::string_view target_field(EtcdCompare::Target t) {
  switch (t) {
    case EtcdCompare::Target::kCreateRevision:
      return "create_revision";
    case EtcdCompare::Target::kModRevision:
      return "mod_revision";
    case EtcdCompare::Target::kVersion:
      return "version";
    case EtcdCompare::Target::kValue:
      return "value";
    case EtcdCompare::Target::kLease:
      return "lease";
  }
  return "create_revision";
}

std::string_view op_name(EtcdCompare::Op op) {
  switch (op) {
    case EtcdCompare::Op::kEqual:
      return "EQUAL";
    case EtcdCompare::Op::kNotEqual:
      return "NOT_EQUAL";
    case EtcdCompare::Op::kGreater:
      return "GREATER";
    case EtcdCompare::Op::kLess:
      return "LESS";
  }
  return "EQUAL";
}

std::string op_json(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut:
      return fmt::format(R"({{"request_put":{{"key":{},"value":{},"lease":"{}"}}}})", b64_json(op.key),
                         b64_json(op.value), op.lease);
    case EtcdOp::Kind::kRange:
      return fmt::format(R"({{"request_range":{{"key":{}}}}})", b64_json(op.key));
    case EtcdOp::Kind::kDelete:
      return fmt::format(R"({{"request_delete_range":{{"key":{}}}}})", b64_json(op.key));
  }
  return "{}";
}

size_t on_data(char* ptr, size_t size, size_t nmemb, void* userdata) {
  static_cast<std::string*>(userdata)->append(ptr, size * nmemb);
  return size * nmemb;
}

}  // namespace

Result<std::vector<std::string>> parse_etcd_endpoints(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = text.find_first_of(", \t\n", i);
    const std::string_view item = text.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i);
    if (!item.empty()) {
      std::string url(item);
      if (url.find("://") == std::string::npos) url = "http://" + url;
      while (url.ends_with('/'))
        url.pop_back();
      if (url.starts_with("https://")) {
        return Error(ErrorCode::kConfiguration,
                     fmt::format("high-availability.etcd.endpoints: '{}' uses https, which Sluice's etcd client does "
                                 "not support yet (use http:// on a trusted network)",
                                 item));
      }
      out.push_back(std::move(url));
    }
    if (end == std::string_view::npos) break;
    i = end + 1;
  }
  if (out.empty()) {
    return Error(ErrorCode::kConfiguration,
                 "high-availability.etcd.endpoints is empty: give etcd's client URLs, e.g. "
                 "http://10.0.0.1:2379,http://10.0.0.2:2379");
  }
  return out;
}

struct EtcdClient::Impl {
  EtcdClientOptions options;
  std::mutex mu;
  std::vector<CURL*> idle;  // guarded by mu
  size_t preferred = 0;     // guarded by mu: the endpoint that answered last

  ~Impl() {
    for (CURL* c : idle)
      curl_easy_cleanup(c);
  }

  CURL* take() {
    {
      std::lock_guard lock(mu);
      if (!idle.empty()) {
        CURL* c = idle.back();
        idle.pop_back();
        return c;
      }
    }
    return curl_easy_init();
  }
  void give_back(CURL* c) {
    std::lock_guard lock(mu);
    if (idle.size() < 8) {
      idle.push_back(c);
      return;
    }
    curl_easy_cleanup(c);
  }

  /// POSTs `body` to `path` on the preferred endpoint, then on each other one while the failure is the endpoint's
  /// (unreachable, timeout, 5xx). Returns the parsed JSON answer of a 200, or the error naming every attempt.
  Result<Value> call(std::string_view path, const std::string& body) {
    size_t first;
    {
      std::lock_guard lock(mu);
      first = preferred;
    }
    const size_t n = options.endpoints.size();
    std::string failures;
    for (size_t k = 0; k < n; ++k) {
      const size_t idx = (first + k) % n;
      const std::string url = options.endpoints[idx] + std::string(path);
      std::string response;
      long status = 0;
      char errbuf[CURL_ERROR_SIZE] = {0};
      CURL* c = take();
      if (c == nullptr) return Error(ErrorCode::kConnector, "etcd: curl_easy_init failed");
      curl_easy_reset(c);
      curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout.count()));
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.request_timeout.count()));
      curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_data);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
      const CURLcode rc = curl_easy_perform(c);
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
      curl_slist_free_all(headers);
      give_back(c);
      if (rc != CURLE_OK) {
        failures += fmt::format("{}{}: {}", failures.empty() ? "" : "; ", options.endpoints[idx],
                                errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc));
        continue;
      }
      // A streaming gateway call (lease keep-alive) answers newline-separated objects: the first is the answer.
      const size_t nl = response.find('\n');
      const std::string_view first_object =
          nl == std::string::npos ? std::string_view(response) : std::string_view(response).substr(0, nl);
      auto parsed = Value::from_json(first_object);
      if (status >= 500 || (status == 200 && !parsed.ok())) {
        failures += fmt::format("{}{}: HTTP {} {}", failures.empty() ? "" : "; ", options.endpoints[idx], status,
                                response.substr(0, 300));
        continue;
      }
      if (status != 200) {
        std::string message = response.substr(0, 300);
        if (parsed.ok() && parsed->is_object()) {
          const Value* m = parsed->find("message");
          if (m == nullptr || !m->is_string()) m = parsed->find("error");
          if (m != nullptr && m->is_string()) message = std::string(m->as_string());
        }
        return Error(ErrorCode::kConnector,
                     fmt::format("etcd {} refused {}: HTTP {}: {}", options.endpoints[idx], path, status, message));
      }
      {
        std::lock_guard lock(mu);
        preferred = idx;
      }
      return std::move(parsed).value();
    }
    return Error(ErrorCode::kConnector, fmt::format("etcd: no endpoint answered {} ({})", path, failures));
  }
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdClientOptions options) {
  if (options.endpoints.empty()) {
    return Error(ErrorCode::kConfiguration, "etcd client: no endpoint given (high-availability.etcd.endpoints)");
  }
  global_init_once();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

const std::vector<std::string>& EtcdClient::endpoints() const {
  return impl_->options.endpoints;
}

Result<std::optional<EtcdKeyValue>> EtcdClient::get(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/kv/range", fmt::format(R"({{"key":{}}})", b64_json(key))));
  SLUICE_ASSIGN_OR_RETURN(auto kvs, parse_kvs(r));
  if (kvs.empty()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(std::move(kvs.front()));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::get_prefix(std::string_view prefix) {
  SLUICE_ASSIGN_OR_RETURN(auto r,
                          impl_->call("/v3/kv/range", fmt::format(R"({{"key":{},"range_end":{}}})", b64_json(prefix),
                                                                  b64_json(prefix_end(prefix)))));
  return parse_kvs(r);
}

Result<int64_t> EtcdClient::put(std::string_view key, std::string_view value, int64_t lease) {
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/kv/put", fmt::format(R"({{"key":{},"value":{},"lease":"{}"}})",
                                                                        b64_json(key), b64_json(value), lease)));
  const Value* header = r.find("header");
  if (header == nullptr) return Error(ErrorCode::kConnector, "etcd's put answer has no header");
  return int_field(*header, "revision");
}

Result<int64_t> EtcdClient::remove(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/kv/deleterange", fmt::format(R"({{"key":{}}})", b64_json(key))));
  return int_field(r, "deleted");
}

Result<EtcdTxnResult> EtcdClient::txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
                                      const std::vector<EtcdOp>& failure) {
  std::string body = R"({"compare":[)";
  for (size_t i = 0; i < compares.size(); ++i) {
    const EtcdCompare& c = compares[i];
    const std::string operand =
        c.target == EtcdCompare::Target::kValue ? b64_json(c.value) : fmt::format("\"{}\"", c.number);
    body += fmt::format(R"({}{{"key":{},"target":"{}","result":"{}","{}":{}}})", i == 0 ? "" : ",", b64_json(c.key),
                        target_name(c.target), op_name(c.op), target_field(c.target), operand);
  }
  body += R"(],"success":[)";
  for (size_t i = 0; i < success.size(); ++i)
    body += (i == 0 ? "" : ",") + op_json(success[i]);
  body += R"(],"failure":[)";
  for (size_t i = 0; i < failure.size(); ++i)
    body += (i == 0 ? "" : ",") + op_json(failure[i]);
  body += "]}";
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/kv/txn", body));
  EtcdTxnResult out;
  out.succeeded = bool_field(r, "succeeded");
  if (const Value* header = r.find("header"); header != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(auto rev, int_field(*header, "revision"));
    out.revision = rev;
  }
  const Value* responses = r.find("responses");
  if (responses != nullptr && responses->is_array()) {
    for (const Value& resp : responses->as_array()) {
      std::vector<EtcdKeyValue> kvs;
      if (const Value* range = resp.find("response_range"); range != nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto parsed, parse_kvs(*range));
        kvs = std::move(parsed);
      }
      out.ranges.push_back(std::move(kvs));
    }
  }
  return out;
}

Result<EtcdLease> EtcdClient::grant_lease(std::chrono::seconds ttl) {
  if (ttl.count() < 1) return Error(ErrorCode::kConfiguration, "etcd lease TTL must be at least 1 s");
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/lease/grant", fmt::format(R"({{"TTL":"{}"}})", ttl.count())));
  EtcdLease lease;
  SLUICE_ASSIGN_OR_RETURN(auto id, int_field(r, "ID"));
  SLUICE_ASSIGN_OR_RETURN(auto granted, int_field(r, "TTL"));
  if (id == 0) return Error(ErrorCode::kConnector, "etcd granted no lease (ID 0)");
  lease.id = id;
  lease.ttl_s = granted;
  return lease;
}

Result<int64_t> EtcdClient::keep_alive_once(int64_t lease_id) {
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/lease/keepalive", fmt::format(R"({{"ID":"{}"}})", lease_id)));
  // The gateway wraps each message of the stream in {"result": ...} (or {"error": ...}).
  const Value* result = r.find("result");
  if (result == nullptr) {
    const Value* err = r.find("error");
    std::string text;
    if (err != nullptr) err->write_json(text);
    return Error(ErrorCode::kConnector, fmt::format("etcd lease keep-alive of {} failed: {}", lease_id, text));
  }
  return int_field(*result, "TTL");
}

Status EtcdClient::revoke_lease(int64_t lease_id) {
  auto r = impl_->call("/v3/lease/revoke", fmt::format(R"({{"ID":"{}"}})", lease_id));
  if (!r.ok()) {
    if (r.error().message().find("lease not found") != std::string::npos) return ok_status();
    return r.error();
  }
  return ok_status();
}

Result<int64_t> EtcdClient::lease_time_to_live(int64_t lease_id) {
  SLUICE_ASSIGN_OR_RETURN(auto r, impl_->call("/v3/lease/timetolive", fmt::format(R"({{"ID":"{}"}})", lease_id)));
  return int_field(r, "TTL");
}

}  // namespace sluice::ha
