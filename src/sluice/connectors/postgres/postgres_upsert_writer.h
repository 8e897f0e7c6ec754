// Private to src/sluice/connectors/postgres/: PostgresUpsertWriter, the writer of one subtask of the Postgres upsert
// sink (postgres_upsert_sink.h's file comment: batches, retries, bad records). Task thread only. Implemented in
// postgres_upsert_writer.cc (buffering and writing), postgres_upsert_catalog.cc (connection and the table's
// catalog) and postgres_upsert_statements.cc (the SQL of a batch). Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "postgres_upsert_internals.h"
#include "sluice/api/sink.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/postgres/postgres_upsert_sink.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace postgres_upsert_internal {

/// Writes the records of one subtask (see the file comment).
class PostgresUpsertWriter final : public SinkWriter<Value> {
 public:
  PostgresUpsertWriter(const PostgresUpsertSinkOptions& options, std::shared_ptr<PostgresUpsertSinkStats> stats,
                       std::shared_ptr<DeadLetterFile> dead_letter, const Clock& clock, std::string describe)
      : o_(options),
        stats_(std::move(stats)),
        dead_letter_(std::move(dead_letter)),
        clock_(clock),
        describe_(std::move(describe)) {}

  /// Connects and reads the table's columns and unique keys; throws on any problem (see the header).
  void open();

  void write(const Value& record, const SinkWriterContext& /*ctx*/) override;

  void flush(bool /*end_of_input*/) override;

  /// flush-interval on a processing-time timer: an idle stream's rows are written flush-interval after the
  /// first of them was buffered, not only at the next write or checkpoint.
  TimestampMs next_timer_ms() const override;
  void on_processing_time(TimestampMs now_ms) override;

  void close() override;

 private:
  // ---- connection and catalog

  void connect();

  /// Thrown by connect(): retryable inside write_batch(), fatal in open().
  struct ConnectError {
    PgError error;
  };

  std::string quote(std::string_view s);

  PgResult catalog_query(const std::string& sql, const std::vector<const char*>& params);

  void load_catalog();

  std::string column_list() const;

  // ---- buffering

  /// Buffers one record's row, or handles it as a bad record.
  void add(const Value& row, bool is_delete);

  /// Fails the task (kFail) or writes a dead letter (kDeadLetter).
  void bad_record(const Value& row, std::string_view op, const std::string& reason, std::string_view sqlstate);

  // ---- writing

  /// Runs one statement; on failure returns the error and leaves the transaction aborted.
  std::optional<PgError> exec(const std::string& sql, const std::vector<const char*>& params, int64_t* affected);
  std::optional<PgError> exec(const std::string& sql) { return exec(sql, {}, nullptr); }

  /// The statements of one attempt; each returns an error or nullopt.
  struct Counts {
    int64_t upserted = 0;
    int64_t deleted = 0;
  };

  std::string delete_sql(size_t rows) const;

  std::string upsert_sql(const std::vector<int>& cols, size_t rows) const;

  std::vector<int> columns_of(const Pending& p) const;

  void push_upsert_params(const Pending& p, const std::vector<int>& cols, std::vector<const char*>& params) const;
  void push_key_params(const Pending& p, std::vector<const char*>& params) const;

  /// One attempt of the whole batch in one transaction, with multi-row statements.
  std::optional<PgError> attempt_batched(Counts& counts);

  /// One attempt row by row, each statement under a savepoint, collecting the rows Postgres rejects with a data
  /// error (the first one fails the task under kFail).
  std::optional<PgError> attempt_row_by_row(Counts& counts, std::vector<BadRow>& bad);

  void report_bad(const BadRow& b);

  /// Writes and commits everything buffered (see the file comment: retries, row-by-row pass).
  void write_batch();

  const PostgresUpsertSinkOptions& o_;
  std::shared_ptr<PostgresUpsertSinkStats> stats_;
  std::shared_ptr<DeadLetterFile> dead_letter_;
  const Clock& clock_;
  std::string describe_;

  PgConn conn_;
  std::string qtable_;
  std::vector<Column> columns_;
  std::unordered_map<std::string, int> column_index_;
  std::vector<int> key_index_;  // per key column: its index in columns_

  std::vector<Pending> pending_;
  std::unordered_map<std::string, size_t> index_;  // encoded key -> pending_ index
  size_t buffered_records_ = 0;
  TimestampMs first_ms_ = 0;  // when the oldest pending row was buffered (the job's Clock)
  bool dead_letters_unsynced_ = false;
  // Scratch of add(), kept for their capacity.
  std::vector<std::optional<std::string>> key_params_;
  std::string key_text_;
  std::vector<std::pair<int, std::optional<std::string>>> upsert_cols_;
};

}  // namespace postgres_upsert_internal
}  // namespace sluice
