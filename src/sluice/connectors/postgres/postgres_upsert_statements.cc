// The SQL of a Postgres upsert sink batch: multi-row DELETE ... WHERE (keys) IN (...) and INSERT ... ON CONFLICT
// (keys) DO UPDATE, and their text parameters (see postgres_upsert_writer.h).
#include <fmt/format.h>

#include <algorithm>

#include "postgres_upsert_writer.h"

namespace sluice {
namespace postgres_upsert_internal {

std::string PostgresUpsertWriter::delete_sql(size_t rows) const {
  std::string sql = "DELETE FROM " + qtable_ + " WHERE ";
  const size_t nk = key_index_.size();
  if (nk == 1) {
    sql += columns_[key_index_[0]].quoted + " IN (";
  } else {
    sql.push_back('(');
    for (size_t k = 0; k < nk; ++k)
      sql += (k ? ", " : "") + columns_[key_index_[k]].quoted;
    sql += ") IN (";
  }
  size_t n = 0;
  for (size_t r = 0; r < rows; ++r) {
    sql += r ? ", " : "";
    if (nk > 1) sql.push_back('(');
    for (size_t k = 0; k < nk; ++k)
      sql += fmt::format("{}${}", k ? ", " : "", ++n);
    if (nk > 1) sql.push_back(')');
  }
  sql.push_back(')');
  return sql;
}

std::string PostgresUpsertWriter::upsert_sql(const std::vector<int>& cols, size_t rows) const {
  std::string sql = "INSERT INTO " + qtable_ + " (";
  for (size_t i = 0; i < cols.size(); ++i)
    sql += (i ? ", " : "") + columns_[cols[i]].quoted;
  sql += ") VALUES ";
  size_t n = 0;
  for (size_t r = 0; r < rows; ++r) {
    sql += r ? ", (" : "(";
    for (size_t i = 0; i < cols.size(); ++i)
      sql += fmt::format("{}${}", i ? ", " : "", ++n);
    sql.push_back(')');
  }
  sql += " ON CONFLICT (";
  for (size_t k = 0; k < key_index_.size(); ++k)
    sql += (k ? ", " : "") + columns_[key_index_[k]].quoted;
  sql += ") DO ";
  std::string set;
  for (int c : cols) {
    if (std::find(key_index_.begin(), key_index_.end(), c) != key_index_.end()) continue;
    set += (set.empty() ? "" : ", ") + columns_[c].quoted + " = EXCLUDED." + columns_[c].quoted;
  }
  sql += set.empty() ? "NOTHING" : "UPDATE SET " + set;
  return sql;
}

std::vector<int> PostgresUpsertWriter::columns_of(const Pending& p) const {
  std::vector<int> cols;
  for (size_t c = 0; c < p.has.size(); ++c) {
    if (p.has[c]) cols.push_back(static_cast<int>(c));
  }
  return cols;
}

void PostgresUpsertWriter::push_upsert_params(const Pending& p, const std::vector<int>& cols,
                                              std::vector<const char*>& params) const {
  for (int c : cols)
    params.push_back(p.vals[c] ? p.vals[c]->c_str() : nullptr);
}

void PostgresUpsertWriter::push_key_params(const Pending& p, std::vector<const char*>& params) const {
  for (const auto& k : p.key)
    params.push_back(k->c_str());
}

}  // namespace postgres_upsert_internal
}  // namespace sluice
