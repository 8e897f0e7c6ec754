// The helpers of postgres_cdc_internals.h.
#include "postgres_cdc_internals.h"

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "sluice/core/non_recoverable.h"
#include "sluice/core/redact.h"

namespace sluice {
namespace postgres_cdc_internal {

[[noreturn]] void fail(std::string message) {
  throw SluiceException(Error(ErrorCode::kConnector, std::move(message)));
}

[[noreturn]] void fail_for_good(std::string message, std::string_view reason) {
  throw SluiceException(mark_non_recoverable(Error(ErrorCode::kConnector, std::move(message)), reason));
}

std::string non_recoverable_sqlstate(std::string_view sqlstate, std::string_view message) {
  if (sqlstate.substr(0, 2) == "28") return "the server refused the credentials";
  if (sqlstate == "42501") return "the role lacks a privilege the source needs";
  if (sqlstate == "3D000") return "the database does not exist";
  // undefined_table: a table of `tables` that does not exist (CREATE PUBLICATION ... FOR TABLE), which only its
  // creation cures (found by a fresh-user trial: the job restarted for ever while a missing role failed at once).
  if (sqlstate == "42P01") return "a table the source reads does not exist";
  // character_not_in_repertoire: stored bytes that are not valid in UTF-8 (a SQL_ASCII database); the same rows or
  // WAL records are met again after any restart.
  if (sqlstate == "22021") return "the database holds text that is not valid UTF-8";
  if (sqlstate == "55000" && message.find("wal_level") != std::string_view::npos) {
    return "the server's wal_level is not logical (a server setting; changing it needs a server restart)";
  }
  return "";
}

std::string non_recoverable_connect(std::string_view message) {
  for (std::string_view m : {"password authentication failed", "no pg_hba.conf entry", "no password supplied",
                             "authentication failed for user"}) {
    if (message.find(m) != std::string_view::npos) return "the server refused the credentials";
  }
  if (message.find("role \"") != std::string_view::npos && message.find("does not exist") != std::string_view::npos) {
    return "the role does not exist";
  }
  if (message.find("database \"") != std::string_view::npos &&
      message.find("does not exist") != std::string_view::npos) {
    return "the database does not exist";
  }
  return "";
}

std::string conn_error(PGconn* c) {
  std::string e = redact_secrets(PQerrorMessage(c));
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

std::string result_error(const PGresult* r) {
  std::string e = PQresultErrorMessage(r);
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

std::string quote_ident(PGconn* c, std::string_view s) {
  char* q = PQescapeIdentifier(c, s.data(), s.size());
  if (q == nullptr) fail(fmt::format("{}: cannot quote identifier {}: {}", kRole, s, conn_error(c)));
  std::string out(q);
  PQfreemem(q);
  return out;
}

std::string quote_literal(PGconn* c, std::string_view s) {
  char* q = PQescapeLiteral(c, s.data(), s.size());
  if (q == nullptr) fail(fmt::format("{}: cannot quote literal: {}", kRole, conn_error(c)));
  std::string out(q);
  PQfreemem(q);
  return out;
}

std::pair<std::string, std::string> split_table(const std::string& t) {
  const size_t dot = t.find('.');
  if (dot == std::string::npos) return {"public", t};
  return {t.substr(0, dot), t.substr(dot + 1)};
}

}  // namespace postgres_cdc_internal
}  // namespace sluice
