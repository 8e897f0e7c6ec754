// Redaction of secrets in text that is printed: error messages, logs, the REST API's failure causes.
//
// Connection strings carry passwords (a MongoDB or Postgres URI `scheme://user:password@host`, a libpq conninfo
// `password=...`, an OpenSearch URL with credentials, Kafka's `sasl.password` property), and the libraries that
// parse them echo them in their errors. Every place that prints such a string or a library's message about it
// passes it through redact_secrets() first.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace sluice {

/// What a redacted secret is replaced by.
inline constexpr std::string_view kRedacted = "****";

/// Returns `text` with every secret it contains replaced by kRedacted:
///  * the password of a URI's user information: `mongodb://app:s3cret@db:27017` -> `mongodb://app:****@db:27017`;
///  * the value after a key naming a secret (`password`, `passwd`, `pwd`, `sasl.password`, `ssl.key.password`,
///    any key containing `password` or `secret`, `api_key`, `apikey`, `sasl.jaas...`) followed by `=` or `:`, quoted or
///    not: libpq's `password='it''s'`, a URI query's `?password=x&`, JSON's `"password": "x"`.
/// Text without secrets comes back unchanged; a doubtful case is redacted (over-redacting is harmless).
std::string redact_secrets(std::string_view text);

/// True when `key` names a secret (the keys listed above, ASCII case-insensitive).
bool is_secret_key(std::string_view key) noexcept;

}  // namespace sluice
