// PostgresUpsertSink: its settings (validate, the table name) and the factory of its writers
// (postgres_upsert_writer.h).
#include "sluice/connectors/postgres/postgres_upsert_sink.h"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "postgres_upsert_internals.h"
#include "postgres_upsert_writer.h"
#include "sluice/api/functions.h"

namespace sluice {

using postgres_upsert_internal::kRole;
using postgres_upsert_internal::PostgresUpsertWriter;
using postgres_upsert_internal::split_table;

namespace postgres_upsert_internal {

std::pair<std::string, std::string> split_table(const std::string& t) {
  const size_t dot = t.find('.');
  if (dot == std::string::npos) return {"", t};
  return {t.substr(0, dot), t.substr(dot + 1)};
}

}  // namespace postgres_upsert_internal

Status validate(const PostgresUpsertSinkOptions& o) {
  auto bad = [](std::string what) { return Error(ErrorCode::kConfiguration, fmt::format("{}: {}", kRole, what)); };
  if (o.conninfo.empty()) return bad("no conninfo: set conninfo() to a libpq connection string or URI");
  if (o.table.empty()) return bad("no table: set table(\"schema.table\")");
  const auto [schema, name] = split_table(o.table);
  if (name.empty() || (o.table.find('.') != std::string::npos && schema.empty()) ||
      name.find('.') != std::string::npos) {
    return bad(fmt::format("invalid table name '{}': use \"schema.table\" or \"table\"", o.table));
  }
  if (o.key_columns.empty()) return bad(fmt::format("no key columns for table '{}': set key_columns()", o.table));
  std::set<std::string> seen;
  for (const auto& k : o.key_columns) {
    if (k.empty()) return bad("an empty key column name");
    if (!seen.insert(k).second) return bad(fmt::format("key column '{}' is given twice", k));
  }
  if (o.batch_size == 0) return bad("batch_size must be at least 1");
  if (o.flush_interval.count() < 0) return bad("flush_interval must not be negative");
  if (o.max_retries < 0) return bad("max_retries must not be negative");
  if (o.initial_backoff.count() < 0 || o.max_backoff.count() < 0) return bad("backoff delays must not be negative");
  if (o.on_bad_record == BadRecordPolicy::kDeadLetter && o.dead_letter_path.empty())
    return bad("on_bad_record(kDeadLetter) needs a dead-letter path");
  return ok_status();
}

Result<std::shared_ptr<PostgresUpsertSink>> PostgresUpsertSink::Builder::try_build() const {
  SLUICE_RETURN_IF_ERROR(validate(options_));
  return std::shared_ptr<PostgresUpsertSink>(new PostgresUpsertSink(options_));
}

std::shared_ptr<DeadLetterFile> PostgresUpsertSink::dead_letter_file() const {
  if (options_.on_bad_record != BadRecordPolicy::kDeadLetter) return nullptr;
  std::lock_guard lock(mu_);
  if (!dead_letter_) dead_letter_ = DeadLetterFile::open(options_.dead_letter_path).value_or_throw();
  return dead_letter_;
}

std::unique_ptr<SinkWriter<Value>> PostgresUpsertSink::create_writer(RuntimeContext& ctx) const {
  auto writer = std::make_unique<PostgresUpsertWriter>(
      options_, stats_, dead_letter_file(), ctx.clock(),
      fmt::format("{} '{}' subtask {}", kRole, ctx.operator_name(), ctx.subtask_index()));
  writer->open();
  return writer;
}

}  // namespace sluice
