// A plain libpq connection for an integration test's own SQL against the real Postgres of
// scripts/services/postgres: failures are recorded as gtest failures naming the statement.
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <string>
#include <vector>

#include "integration/test_util/polling.h"

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

/// A name for the current test's own Postgres objects (slot, publication, tables, types), unique per process and
/// per run (also under --gtest_repeat): <prefix><pid>_<n>_<the test's name in lower case, at most `max_chars`>.
inline std::string test_object_name(const std::string& prefix, size_t max_chars) {
  static std::atomic<int> run{0};
  std::string n = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::transform(n.begin(), n.end(), n.begin(),
                 [](unsigned char c) { return std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '_'; });
  return prefix + std::to_string(::getpid()) + "_" + std::to_string(++run) + "_" + n.substr(0, max_chars);
}

/// Drops the replication slot `name` (if it exists) once no walsender holds it any more: a job's connections close
/// when it ends, but the server's walsender releases the slot a moment later, so dropping at once can fail with
/// "replication slot ... is active for PID ...".
inline void drop_slot(PgClient& pg, const std::string& name,
                      std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  const bool released = poll_until(
      [&] {
        return pg.scalar("SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = '" + name + "'") ==
               "0";
      },
      deadline);
  EXPECT_TRUE(released) << "replication slot " << name << " still active after " << deadline.count() << " ms";
  pg.exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + name + "'");
}

/// Drops the replication slot (drop_slot) and the publication named `name`.
inline void drop_slot_and_publication(PgClient& pg, const std::string& name,
                                      std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  drop_slot(pg, name, deadline);
  pg.exec("DROP PUBLICATION IF EXISTS " + name);
}

}  // namespace sluice::testing
