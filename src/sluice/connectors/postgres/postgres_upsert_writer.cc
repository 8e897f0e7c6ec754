// PostgresUpsertWriter (see postgres_upsert_writer.h): opening, buffering records collapsed per key, bad records,
// and writing a batch in one transaction with retries and the row-by-row pass.
#include "postgres_upsert_writer.h"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include "sluice/core/cancellation.h"

namespace sluice {
namespace postgres_upsert_internal {

void PostgresUpsertWriter::open() {
  try {
    connect();
  } catch (const ConnectError& e) {
    fail(ErrorCode::kConnector, fmt::format("{}: cannot connect: {}", describe_, e.error.message));
  }
  load_catalog();
}

void PostgresUpsertWriter::write(const Value& record, const SinkWriterContext& /*ctx*/) {
  if (!pending_.empty() && o_.flush_interval.count() > 0 && clock_.now_ms() - first_ms_ >= o_.flush_interval.count()) {
    write_batch();
  }
  const bool is_delete = o_.is_delete && o_.is_delete(record);
  if (o_.row) {
    add(o_.row(record), is_delete);
  } else {
    add(record, is_delete);
  }
}

void PostgresUpsertWriter::flush(bool /*end_of_input*/) {
  write_batch();
  if (dead_letter_ && dead_letters_unsynced_) {
    dead_letter_->sync().value_or_throw();
    dead_letters_unsynced_ = false;
  }
}

TimestampMs PostgresUpsertWriter::next_timer_ms() const {
  if (pending_.empty() || o_.flush_interval.count() <= 0) return kNoTimer;
  return first_ms_ + o_.flush_interval.count();
}

void PostgresUpsertWriter::on_processing_time(TimestampMs now_ms) {
  if (!pending_.empty() && o_.flush_interval.count() > 0 && now_ms - first_ms_ >= o_.flush_interval.count()) {
    write_batch();
  }
}

void PostgresUpsertWriter::close() {
  conn_.reset();
  pending_.clear();
  index_.clear();
}

void PostgresUpsertWriter::add(const Value& row, bool is_delete) {
  const char* op = is_delete ? "delete" : "upsert";
  if (!row.is_object()) {
    bad_record(row, op, fmt::format("the row is not an object but a {}", value_kind_name(row.kind())), {});
    return;
  }
  key_params_.clear();
  key_text_.clear();
  for (size_t k = 0; k < o_.key_columns.size(); ++k) {
    const Value* v = row.find(o_.key_columns[k]);
    if (v == nullptr || v->is_null()) {
      bad_record(row, op, fmt::format("key column '{}' is missing or null", o_.key_columns[k]), {});
      return;
    }
    std::string text;
    if (Status s = postgres::append_text_parameter(*v, columns_[key_index_[k]].type, text); !s.ok()) {
      bad_record(row, op, fmt::format("key column '{}': {}", o_.key_columns[k], s.error().message()), {});
      return;
    }
    key_text_ += std::to_string(text.size());
    key_text_.push_back(':');
    key_text_ += text;
    key_params_.emplace_back(std::move(text));
  }
  // Validate and convert an upsert's columns before touching the batch.
  upsert_cols_.clear();
  if (!is_delete) {
    for (const auto& [name, v] : row.as_object()) {
      auto it = column_index_.find(name);
      if (it == column_index_.end()) {
        bad_record(row, op,
                   fmt::format("column '{}' does not exist in table '{}' (columns: {})", name, o_.table, column_list()),
                   {});
        return;
      }
      const Column& c = columns_[it->second];
      if (c.generated) {
        bad_record(row, op, fmt::format("column '{}' is a generated column and cannot be written", name), {});
        return;
      }
      std::optional<std::string> text;
      if (!v.is_null()) {
        text.emplace();
        if (Status s = postgres::append_text_parameter(v, c.type, *text); !s.ok()) {
          bad_record(row, op, fmt::format("column '{}': {}", name, s.error().message()), {});
          return;
        }
      }
      upsert_cols_.emplace_back(it->second, std::move(text));
    }
  }
  if (pending_.empty()) first_ms_ = clock_.now_ms();
  auto [it, inserted] = index_.try_emplace(key_text_, pending_.size());
  if (inserted) {
    pending_.emplace_back();
    pending_.back().key = key_params_;
  }
  Pending& p = pending_[it->second];
  if (is_delete) {
    p.delete_first = true;
    p.has_upsert = false;
    p.delete_row = row;
    p.row = Value();
  } else {
    if (!p.has_upsert) {
      p.has_upsert = true;
      p.has.assign(columns_.size(), 0);
      p.vals.assign(columns_.size(), std::nullopt);
      p.row = row;
    } else {
      for (const auto& [name, v] : row.as_object())
        p.row.set(name, v);
    }
    for (auto& [col, text] : upsert_cols_) {
      p.has[col] = 1;
      p.vals[col] = std::move(text);
    }
  }
  if (++buffered_records_ >= o_.batch_size) write_batch();
}

void PostgresUpsertWriter::bad_record(const Value& row, std::string_view op, const std::string& reason,
                                      std::string_view sqlstate) {
  stats_->failed.fetch_add(1, std::memory_order_relaxed);
  if (o_.on_bad_record == BadRecordPolicy::kFail) {
    fail(ErrorCode::kConnector, fmt::format("{}: cannot {} record {} in table '{}': {}", describe_, op,
                                            truncated_json(row), o_.table, reason));
  }
  Value entry = Value::object();
  entry.set("sink", Value::string("postgres"));
  entry.set("table", Value::string(o_.table));
  entry.set("op", Value::string(op));
  entry.set("reason", Value::string(sqlstate.empty() ? std::string(dead_letter_reason::kUnspecified)
                                                     : "sqlstate-" + std::string(sqlstate)));
  entry.set("error", Value::string(reason));
  entry.set("sqlstate", Value::string(sqlstate));
  entry.set("record", Value::string(row.to_json()));
  dead_letter_->append(entry).value_or_throw();
  dead_letters_unsynced_ = true;
  stats_->dead_letters.fetch_add(1, std::memory_order_relaxed);
}

std::optional<PgError> PostgresUpsertWriter::exec(const std::string& sql, const std::vector<const char*>& params,
                                                  int64_t* affected) {
  PgResult r(PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(params.size()), nullptr, params.data(), nullptr,
                          nullptr, 0));
  if (r && PQresultStatus(r.get()) == PGRES_COMMAND_OK) {
    if (affected != nullptr) *affected += std::atoll(PQcmdTuples(r.get()));
    return std::nullopt;
  }
  PgError e;
  const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
  e.sqlstate = state != nullptr ? state : "";
  // The server's primary message and detail ("invalid input syntax for type integer: \"x\""); libpq's text
  // when there is no server error (a broken connection).
  const char* primary = r ? PQresultErrorField(r.get(), PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  if (primary != nullptr) {
    e.message = primary;
    if (const char* detail = PQresultErrorField(r.get(), PG_DIAG_MESSAGE_DETAIL); detail != nullptr)
      e.message += fmt::format(" ({})", detail);
  } else {
    e.message = trimmed(r && PQresultErrorMessage(r.get())[0] != '\0' ? PQresultErrorMessage(r.get())
                                                                      : PQerrorMessage(conn_.get()));
  }
  e.connection_lost = PQstatus(conn_.get()) != CONNECTION_OK;
  return e;
}

std::optional<PgError> PostgresUpsertWriter::attempt_batched(Counts& counts) {
  if (auto e = exec("BEGIN")) return e;
  std::vector<const char*> params;
  // Deletes first: a key's delete precedes its upsert (Pending).
  std::vector<size_t> deletes;
  std::map<std::vector<int>, std::vector<size_t>> upserts;  // column set -> pending indexes
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].delete_first) deletes.push_back(i);
    if (pending_[i].has_upsert) upserts[columns_of(pending_[i])].push_back(i);
  }
  const size_t per_delete = std::max<size_t>(1, kMaxParams / key_index_.size());
  for (size_t b = 0; b < deletes.size(); b += per_delete) {
    const size_t n = std::min(per_delete, deletes.size() - b);
    params.clear();
    for (size_t i = b; i < b + n; ++i)
      push_key_params(pending_[deletes[i]], params);
    if (auto e = exec(delete_sql(n), params, &counts.deleted)) return e;
  }
  for (const auto& [cols, rows] : upserts) {
    const size_t per_stmt = std::max<size_t>(1, kMaxParams / cols.size());
    for (size_t b = 0; b < rows.size(); b += per_stmt) {
      const size_t n = std::min(per_stmt, rows.size() - b);
      params.clear();
      for (size_t i = b; i < b + n; ++i)
        push_upsert_params(pending_[rows[i]], cols, params);
      if (auto e = exec(upsert_sql(cols, n), params, &counts.upserted)) return e;
    }
  }
  return exec("COMMIT");
}

std::optional<PgError> PostgresUpsertWriter::attempt_row_by_row(Counts& counts, std::vector<BadRow>& bad) {
  bad.clear();
  if (auto e = exec("BEGIN")) return e;
  std::vector<const char*> params;
  auto one = [&](size_t i, bool is_delete) -> std::optional<PgError> {
    const Pending& p = pending_[i];
    if (auto e = exec("SAVEPOINT sluice_row")) return e;
    params.clear();
    std::optional<PgError> e;
    if (is_delete) {
      push_key_params(p, params);
      e = exec(delete_sql(1), params, &counts.deleted);
    } else {
      const std::vector<int> cols = columns_of(p);
      push_upsert_params(p, cols, params);
      e = exec(upsert_sql(cols, 1), params, &counts.upserted);
    }
    if (!e) return exec("RELEASE SAVEPOINT sluice_row");
    if (!postgres::is_data_error_sqlstate(e->sqlstate) || e->connection_lost) return e;
    if (o_.on_bad_record == BadRecordPolicy::kFail) {
      (void)exec("ROLLBACK");
      report_bad({i, is_delete, *e});  // throws
    }
    bad.push_back({i, is_delete, std::move(*e)});
    return exec("ROLLBACK TO SAVEPOINT sluice_row");
  };
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].delete_first) {
      if (auto e = one(i, true)) return e;
    }
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].has_upsert) {
      if (auto e = one(i, false)) return e;
    }
  }
  return exec("COMMIT");
}

void PostgresUpsertWriter::report_bad(const BadRow& b) {
  const Pending& p = pending_[b.pending];
  bad_record(b.is_delete ? p.delete_row : p.row, b.is_delete ? "delete" : "upsert",
             fmt::format("Postgres error {}: {}", b.error.sqlstate, b.error.message), b.error.sqlstate);
}

void PostgresUpsertWriter::write_batch() {
  if (pending_.empty()) {
    buffered_records_ = 0;
    return;
  }
  // A stale task (its TaskManager declared lost, then woken) must not overwrite what the new attempt wrote.
  throw_if_current_task_cancelled();
  bool row_by_row = false;
  std::vector<BadRow> bad;
  for (int retry = 0;;) {
    Counts counts;
    std::optional<PgError> e;
    try {
      if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) connect();
      e = row_by_row ? attempt_row_by_row(counts, bad) : attempt_batched(counts);
    } catch (ConnectError& ce) {
      e = std::move(ce.error);
    }
    if (!e) {
      stats_->rows_upserted.fetch_add(counts.upserted, std::memory_order_relaxed);
      stats_->rows_deleted.fetch_add(counts.deleted, std::memory_order_relaxed);
      stats_->batches.fetch_add(1, std::memory_order_relaxed);
      for (const BadRow& b : bad)
        report_bad(b);
      pending_.clear();
      index_.clear();
      buffered_records_ = 0;
      return;
    }
    if (!e->connection_lost) (void)exec("ROLLBACK");
    const bool retryable = e->connection_lost || postgres::is_retryable_sqlstate(e->sqlstate);
    if (retryable && retry < o_.max_retries) {
      ++retry;
      stats_->retries.fetch_add(1, std::memory_order_relaxed);
      const int64_t delay =
          std::min<int64_t>(o_.max_backoff.count(), o_.initial_backoff.count() << std::min(retry - 1, 30));
      spdlog::warn("{}: writing {} keys to '{}' failed ({}{}); retry {}/{} in {} ms", describe_, pending_.size(),
                   o_.table, e->sqlstate.empty() ? "" : e->sqlstate + ": ", e->message, retry, o_.max_retries, delay);
      if (e->connection_lost) conn_.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      continue;
    }
    if (!row_by_row && !retryable && postgres::is_data_error_sqlstate(e->sqlstate)) {
      row_by_row = true;  // find the rows at fault
      continue;
    }
    fail(ErrorCode::kConnector,
         fmt::format("{}: writing a batch of {} keys to table '{}' failed{}: {}{}", describe_, pending_.size(),
                     o_.table, retryable ? fmt::format(" after {} retries", retry) : "",
                     e->sqlstate.empty() ? "" : "Postgres error " + e->sqlstate + ": ", e->message));
  }
}

}  // namespace postgres_upsert_internal
}  // namespace sluice
