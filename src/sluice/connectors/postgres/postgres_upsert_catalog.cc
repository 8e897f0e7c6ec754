// PostgresUpsertWriter's connection and the table's catalog: its columns and their types, the key columns and the
// unique index ON CONFLICT needs (see postgres_upsert_writer.h).
#include <fmt/format.h>
#include <libpq-fe.h>

#include <cstdlib>
#include <set>
#include <sstream>

#include "postgres_upsert_writer.h"
#include "sluice/core/redact.h"

namespace sluice {
namespace postgres_upsert_internal {

void PostgresUpsertWriter::connect() {
  conn_.reset();
  const char* keys[] = {"fallback_application_name", "connect_timeout", "dbname", nullptr};
  const char* vals[] = {"sluice-upsert-sink", "10", o_.conninfo.c_str(), nullptr};
  PgConn c(PQconnectdbParams(keys, vals, 1));
  if (!c || PQstatus(c.get()) != CONNECTION_OK) {
    // libpq quotes a malformed connection URI whole, password included.
    PgError e{"08000", c ? redact_secrets(trimmed(PQerrorMessage(c.get()))) : "out of memory", true};
    throw ConnectError{std::move(e)};
  }
  conn_ = std::move(c);
}

std::string PostgresUpsertWriter::quote(std::string_view s) {
  char* q = PQescapeIdentifier(conn_.get(), s.data(), s.size());
  if (q == nullptr) fail(ErrorCode::kConnector, fmt::format("{}: cannot quote identifier '{}'", describe_, s));
  std::string out(q);
  PQfreemem(q);
  return out;
}

PgResult PostgresUpsertWriter::catalog_query(const std::string& sql, const std::vector<const char*>& params) {
  PgResult r(PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(params.size()), nullptr, params.data(), nullptr,
                          nullptr, 0));
  if (!r || PQresultStatus(r.get()) != PGRES_TUPLES_OK) {
    fail(ErrorCode::kConnector, fmt::format("{}: reading the catalog of table '{}' failed: {}", describe_, o_.table,
                                            trimmed(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn_.get()))));
  }
  return r;
}

void PostgresUpsertWriter::load_catalog() {
  const auto [schema, name] = split_table(o_.table);
  qtable_ = schema.empty() ? quote(name) : quote(schema) + "." + quote(name);
  PgResult t = catalog_query("SELECT to_regclass($1)::oid, current_database()", {qtable_.c_str()});
  const std::string database = PQgetvalue(t.get(), 0, 1);
  if (PQgetisnull(t.get(), 0, 0)) {
    fail(ErrorCode::kConfiguration,
         fmt::format("{}: table '{}' does not exist in database '{}' (names are case-sensitive; an unqualified "
                     "name is looked up in the search_path): create it or fix table()",
                     describe_, o_.table, database));
  }
  const std::string oid = PQgetvalue(t.get(), 0, 0);
  // The type of each column (a domain's base type and typmod), and an array's element type: how values are
  // spelled for it and which ones it would round (PgColumnType).
  PgResult cols = catalog_query(
      "SELECT a.attname, a.attnum, t.typcategory = 'A', a.attgenerated <> '', a.attndims, "
      "CASE WHEN d.typtype = 'd' THEN d.typtypmod ELSE a.atttypmod END, "
      "CASE WHEN COALESCE(e.typnamespace, t.typnamespace) = 'pg_catalog'::regnamespace "
      "THEN COALESCE(e.typname, t.typname) ELSE '' END "
      "FROM pg_attribute a JOIN pg_type d ON d.oid = a.atttypid "
      "JOIN pg_type t ON t.oid = CASE WHEN d.typtype = 'd' THEN d.typbasetype ELSE d.oid END "
      "LEFT JOIN pg_type e ON t.typcategory = 'A' AND e.oid = t.typelem "
      "WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
      {oid.c_str()});
  for (int i = 0; i < PQntuples(cols.get()); ++i) {
    Column c;
    c.name = PQgetvalue(cols.get(), i, 0);
    c.quoted = quote(c.name);
    c.attnum = std::atoi(PQgetvalue(cols.get(), i, 1));
    c.is_array = PQgetvalue(cols.get(), i, 2)[0] == 't';
    c.generated = PQgetvalue(cols.get(), i, 3)[0] == 't';
    c.type = postgres::PgColumnType::from_catalog(PQgetvalue(cols.get(), i, 6), std::atoi(PQgetvalue(cols.get(), i, 5)),
                                                  c.is_array, std::atoi(PQgetvalue(cols.get(), i, 4)));
    column_index_.emplace(c.name, static_cast<int>(columns_.size()));
    columns_.push_back(std::move(c));
  }
  std::string missing;
  for (const auto& k : o_.key_columns) {
    auto it = column_index_.find(k);
    if (it == column_index_.end()) {
      missing += (missing.empty() ? "'" : ", '") + k + "'";
    } else {
      key_index_.push_back(it->second);
    }
  }
  if (!missing.empty()) {
    fail(ErrorCode::kConfiguration, fmt::format("{}: key column(s) {} do not exist in table '{}' (columns: {})",
                                                describe_, missing, o_.table, column_list()));
  }
  // ON CONFLICT (keys) needs a unique index on exactly these columns: non-partial, without expressions, not
  // deferrable.
  PgResult idx = catalog_query(
      "SELECT indkey::text, indnkeyatts FROM pg_index WHERE indrelid = $1::oid AND indisunique AND indimmediate "
      "AND indisvalid AND indpred IS NULL AND indexprs IS NULL",
      {oid.c_str()});
  const std::set<std::string> want(o_.key_columns.begin(), o_.key_columns.end());
  std::vector<std::string> found;
  bool ok = false;
  for (int i = 0; i < PQntuples(idx.get()); ++i) {
    std::istringstream in(PQgetvalue(idx.get(), i, 0));
    const int nkeys = std::atoi(PQgetvalue(idx.get(), i, 1));
    std::set<std::string> have;
    int attnum = 0;
    for (int k = 0; k < nkeys && (in >> attnum); ++k) {
      for (const auto& c : columns_) {
        if (c.attnum == attnum) have.insert(c.name);
      }
    }
    std::string desc;
    for (const auto& h : have)
      desc += (desc.empty() ? "" : ", ") + h;
    found.push_back("(" + desc + ")");
    if (have == want) ok = true;
  }
  if (!ok) {
    std::string keys;
    for (const auto& k : o_.key_columns)
      keys += (keys.empty() ? "" : ", ") + k;
    std::string uniques;
    for (const auto& f : found)
      uniques += (uniques.empty() ? "" : ", ") + f;
    fail(ErrorCode::kConfiguration,
         fmt::format("{}: the key columns ({}) of table '{}' are not the columns of its primary key or of a "
                     "unique index, which INSERT ... ON CONFLICT needs (unique keys of the table: {}): add a "
                     "unique constraint on them or change key_columns()",
                     describe_, keys, o_.table, uniques.empty() ? "none" : uniques));
  }
}

std::string PostgresUpsertWriter::column_list() const {
  std::string s;
  for (const auto& c : columns_)
    s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

}  // namespace postgres_upsert_internal
}  // namespace sluice
