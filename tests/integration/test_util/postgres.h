// A plain libpq connection for an integration test's own SQL against the real Postgres of
// scripts/services/postgres: failures are recorded as gtest failures naming the statement.
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <string>
#include <vector>

namespace sluice::testing {

class PgClient {
 public:
  explicit PgClient(const std::string& conninfo) : c_(PQconnectdb(conninfo.c_str())) {
    if (PQstatus(c_) != CONNECTION_OK) ADD_FAILURE() << "connect: " << PQerrorMessage(c_);
  }
  ~PgClient() { PQfinish(c_); }
  PgClient(const PgClient&) = delete;
  PgClient& operator=(const PgClient&) = delete;

  /// Runs `sql` (one or more statements); records a failure when it fails.
  void exec(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const auto st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) ADD_FAILURE() << sql << ": " << PQresultErrorMessage(r);
    PQclear(r);
  }
  /// Rows as vectors of text (NULL as "<null>"), in the query's order.
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    std::vector<std::vector<std::string>> out;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      ADD_FAILURE() << sql << ": " << PQresultErrorMessage(r);
    } else {
      for (int i = 0; i < PQntuples(r); ++i) {
        std::vector<std::string> row;
        for (int k = 0; k < PQnfields(r); ++k)
          row.emplace_back(PQgetisnull(r, i, k) ? "<null>" : PQgetvalue(r, i, k));
        out.push_back(std::move(row));
      }
    }
    PQclear(r);
    return out;
  }
  /// Rows as "a|b|c" lines, for comparisons with expected tables.
  std::vector<std::string> lines(const std::string& sql) {
    std::vector<std::string> out;
    for (const auto& row : rows(sql)) {
      std::string line;
      for (size_t k = 0; k < row.size(); ++k)
        line += (k ? "|" : "") + row[k];
      out.push_back(std::move(line));
    }
    return out;
  }
  /// The first column of every row.
  std::vector<std::string> column(const std::string& sql) {
    std::vector<std::string> out;
    for (auto& row : rows(sql))
      out.push_back(row.empty() ? std::string() : std::move(row[0]));
    return out;
  }
  /// The first column of the first row ("" when there is none).
  std::string scalar(const std::string& sql) {
    auto v = column(sql);
    return v.empty() ? "" : v[0];
  }

 private:
  PGconn* c_;
};

}  // namespace sluice::testing
