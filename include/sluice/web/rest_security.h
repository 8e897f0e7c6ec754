// REST security: bearer-token authentication and TLS of the REST API and web UI (docs/operations.md, "Security").
//
// Flink leaves authentication of its REST API to a proxy; Sluice checks a bearer token itself. Two tokens:
//   * the admin token may do everything (GET, and the actions: POST savepoints/stop, PATCH cancel);
//   * the read token may only read (GET, HEAD); an action with it is answered 403.
// A request without a token, or with one that matches neither, is answered 401 with `WWW-Authenticate: Bearer`.
// Open without a token: GET /health (for load balancers and Kubernetes probes) and the web UI's static files
// (the page asks for the token and sends it with every API request). Tokens are read from a file or from an
// environment variable named in the configuration, never from the configuration itself, so they never appear in
// a command line, a configuration dump or a log. Tokens are compared in constant time (SHA-256 of both, then
// CRYPTO_memcmp), so neither the content nor the length leaks through timing.
//
// TLS (Flink's `security.ssl.rest.enabled`): the server certificate chain and the private key are PEM files
// (Flink reads a keystore; Sluice reads PEM, as OpenSSL does), TLS 1.2 or newer.
//
// Thread-safety: pure functions of their arguments (load_* read files and the environment).
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/config.h"
#include "sluice/core/error.h"

namespace sluice {

namespace options {
inline const ConfigOption<std::string> kRestAuthAdminTokenFile{
    "rest.auth.admin-token-file", "",
    "File holding the REST API's admin bearer token (every request, savepoint/stop/cancel included)."};
inline const ConfigOption<std::string> kRestAuthAdminTokenEnv{
    "rest.auth.admin-token-env", "", "Name of the environment variable holding the admin bearer token."};
inline const ConfigOption<std::string> kRestAuthReadTokenFile{
    "rest.auth.read-token-file", "", "File holding the REST API's read-only bearer token (GET requests only)."};
inline const ConfigOption<std::string> kRestAuthReadTokenEnv{
    "rest.auth.read-token-env", "", "Name of the environment variable holding the read-only bearer token."};
inline const ConfigOption<bool> kRestSslEnabled{"security.ssl.rest.enabled", false,
                                                "Serve the REST API and web UI over HTTPS (Flink's key)."};
inline const ConfigOption<std::string> kRestSslCertificate{
    "security.ssl.rest.certificate", "", "PEM file of the server certificate (and its chain) for HTTPS."};
inline const ConfigOption<std::string> kRestSslKey{"security.ssl.rest.key", "",
                                                   "PEM file of the server certificate's private key."};
inline const ConfigOption<std::string> kRestSslKeyPassword{
    "security.ssl.rest.key-password", "", "Password of an encrypted private key (Flink's key); never shown."};
}  // namespace options

/// Bearer tokens of the REST API. Both empty: no authentication (every request is allowed).
struct RestAuthOptions {
  std::string admin_token;  ///< may do every request
  std::string read_token;   ///< may do GET and HEAD only

  bool enabled() const noexcept { return !admin_token.empty() || !read_token.empty(); }
};

/// HTTPS of the REST API.
struct RestTlsOptions {
  bool enabled = false;
  std::string certificate_file;  ///< PEM: the server certificate, then its intermediates
  std::string key_file;          ///< PEM: its private key
  std::string key_password;      ///< "" when the key is not encrypted
};

/// Reads rest.auth.*: each token from its file (trailing whitespace and newlines dropped) or its environment
/// variable. Errors (kConfiguration, naming the key, never the token): both the file and the variable of one token
/// set; a file that cannot be read; an unset or empty variable; a token shorter than 16 characters or with
/// whitespace or control characters inside; the same token for admin and read. A token file others may read
/// (mode o+r) is logged as a warning.
[[nodiscard]] Result<RestAuthOptions> load_rest_auth(const Configuration& config);

/// Reads security.ssl.rest.*. Errors (kConfiguration): enabled without a certificate or key file, or a value that
/// does not parse. The files are loaded (and checked) when the server starts.
[[nodiscard]] Result<RestTlsOptions> load_rest_tls(const Configuration& config);

/// The verdict on one request.
struct RestAuthDecision {
  int status = 200;     ///< 200 allowed, 401 no or unknown token, 403 a read token for an action
  std::string message;  ///< why not (for the {"errors": [...]} body; never quotes the presented token)
};

/// Decides whether a request with `method` and the `Authorization` header value `authorization` ("" when absent)
/// may proceed under `auth`. Always allowed when auth is not enabled. Constant-time in the tokens.
RestAuthDecision authorize_rest_request(const RestAuthOptions& auth, std::string_view method,
                                        std::string_view authorization);

/// True when `a` equals `b`, in time independent of their contents and lengths (compares SHA-256 digests).
bool tokens_equal(std::string_view a, std::string_view b) noexcept;

}  // namespace sluice
