#include "sluice/web/rest_security.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sluice/core/assign_or_return.h"

namespace sluice {
namespace {

constexpr size_t kMinTokenLength = 16;

Error config_error(std::string message) {
  return Error(ErrorCode::kConfiguration, std::move(message));
}

/// One token from `file_key` (a file) or `env_key` (an environment variable's name); "" when neither is set.
Result<std::string> load_token(const Configuration& config, const ConfigOption<std::string>& file_key,
                               const ConfigOption<std::string>& env_key) {
  std::string file;
  std::string env;
  try {
    file = config.get(file_key);
    env = config.get(env_key);
  } catch (const SluiceException& e) {
    return e.error();
  }
  if (!file.empty() && !env.empty()) {
    return config_error(fmt::format("{} and {} are both set; set one of them", file_key.key, env_key.key));
  }
  std::string token;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return config_error(fmt::format("{} = {}: cannot read the file ({})", file_key.key, file, std::strerror(errno)));
    }
    std::ostringstream text;
    text << in.rdbuf();
    token = text.str();
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
      spdlog::warn("{} = {}: the token file is readable by every user of this machine (chmod 600 it)", file_key.key,
                   file);
    }
  } else if (!env.empty()) {
    const char* value = std::getenv(env.c_str());
    if (value == nullptr || *value == '\0') {
      return config_error(fmt::format("{} = {}: the environment variable is not set or empty", env_key.key, env));
    }
    token = value;
  } else {
    return std::string();
  }
  while (!token.empty() &&
         (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  const std::string where =
      !file.empty() ? fmt::format("{} = {}", file_key.key, file) : fmt::format("{} = {}", env_key.key, env);
  if (token.size() < kMinTokenLength) {
    return config_error(
        fmt::format("{}: the token has {} characters, fewer than {}; make one with `openssl rand "
                    "-hex 32`",
                    where, token.size(), kMinTokenLength));
  }
  for (const char c : token) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return config_error(
          fmt::format("{}: the token has whitespace or control characters inside; a bearer token is "
                      "one word (e.g. `openssl rand -hex 32`)",
                      where));
    }
  }
  return token;
}

}  // namespace

Result<RestAuthOptions> load_rest_auth(const Configuration& config) {
  RestAuthOptions out;
  SLUICE_ASSIGN_OR_RETURN(std::string admin,
                          load_token(config, options::kRestAuthAdminTokenFile, options::kRestAuthAdminTokenEnv));
  SLUICE_ASSIGN_OR_RETURN(std::string read,
                          load_token(config, options::kRestAuthReadTokenFile, options::kRestAuthReadTokenEnv));
  out.admin_token = std::move(admin);
  out.read_token = std::move(read);
  if (!out.admin_token.empty() && tokens_equal(out.admin_token, out.read_token)) {
    return config_error(
        "the admin token and the read token are the same: the read token would allow every action; use two tokens");
  }
  return out;
}

Result<RestTlsOptions> load_rest_tls(const Configuration& config) {
  RestTlsOptions out;
  try {
    out.enabled = config.get(options::kRestSslEnabled);
    out.certificate_file = config.get(options::kRestSslCertificate);
    out.key_file = config.get(options::kRestSslKey);
    out.key_password = config.get(options::kRestSslKeyPassword);
  } catch (const SluiceException& e) {
    return e.error();
  }
  if (!out.enabled) return out;
  if (out.certificate_file.empty() || out.key_file.empty()) {
    return config_error(fmt::format("{} = true needs {} and {} (PEM files of the server certificate and its key)",
                                    options::kRestSslEnabled.key, options::kRestSslCertificate.key,
                                    options::kRestSslKey.key));
  }
  return out;
}

bool tokens_equal(std::string_view a, std::string_view b) noexcept {
  unsigned char da[SHA256_DIGEST_LENGTH];
  unsigned char db[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), da);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), db);
  return CRYPTO_memcmp(da, db, SHA256_DIGEST_LENGTH) == 0;
}

RestAuthDecision authorize_rest_request(const RestAuthOptions& auth, std::string_view method,
                                        std::string_view authorization) {
  if (!auth.enabled()) return {};
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.empty()) {
    return {401,
            "this REST API needs a bearer token: send `Authorization: Bearer <token>` (the sluice command: "
            "--token-file or --token-env; docs/operations.md, \"Security\")"};
  }
  if (authorization.size() < kScheme.size() ||
      !std::equal(kScheme.begin(), kScheme.end(), authorization.begin(),
                  [](char x, char y) { return std::tolower(static_cast<unsigned char>(x)) == std::tolower(y); })) {
    return {401, "the Authorization header is not `Bearer <token>`"};
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ')
    token.remove_prefix(1);
  // Both comparisons always run, so the time does not tell which token matched.
  const bool admin = !auth.admin_token.empty() && tokens_equal(token, auth.admin_token);
  const bool read = !auth.read_token.empty() && tokens_equal(token, auth.read_token);
  if (admin) return {};
  if (!read) return {401, "the bearer token is not valid for this REST API"};
  if (method == "GET" || method == "HEAD") return {};
  return {403, fmt::format("the read-only token may not {}: savepoint, stop and cancel need the admin token ({} or {})",
                           method, options::kRestAuthAdminTokenFile.key, options::kRestAuthAdminTokenEnv.key)};
}

}  // namespace sluice
