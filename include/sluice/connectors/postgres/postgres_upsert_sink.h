// The Postgres upsert sink (DESIGN.md §8, "Postgres / JDBC-style upsert"): writes Value records as rows of one
// table over libpq, at-least-once and idempotent by the table's key.
//
//   auto sink = PostgresUpsertSink::builder()
//                   .conninfo("postgresql://app@db:5432/shop?application_name=orders-sink")
//                   .table("public.orders")
//                   .key_columns({"order_id"})
//                   .is_delete([](const Value& r) { return r.find("deleted") != nullptr; })
//                   .row([](const Value& r) { return *r.find("after"); })  // default: the record itself
//                   .build();
//   stream.sink_to(sink).uid("orders-pg");
//
// Records. row(record) (default: the record) must be an object of column -> value. An upsert writes the columns
// it names: a new key gets the table's defaults for the others, an existing key keeps their values (a partial
// update). A delete (is_delete(record) is true; default: never) needs only the key columns. Every key column
// must be present and non-null. Values become text parameters (never interpolated into SQL) and Postgres converts
// them to the column's type: strings as they are, int64/double/decimal as their text (NaN and ±Infinity as
// Postgres spells them), bool 't'/'f', timestamps ISO-8601 UTC ("2024-01-02T03:04:05.123456Z"; append_pg_timestamp),
// bytes as '\x..' hex (bytea), arrays as Postgres array literals ('{1,2}') for array columns and as JSON otherwise,
// objects as JSON, null as SQL NULL; a json/jsonb column (or element) gets the Value's JSON, whatever its kind (a
// string "x" as the JSON string "x", never as JSON text to parse). A value the column's type would alter without an
// error (more decimals than a numeric's scale, digits a float4/float8 cannot hold, fractional seconds beyond a
// timestamp's precision, a time of day for a date) is a bad record, never rounded (PgColumnType).
//
// Batches. Records are buffered and written when batch_size records are buffered, when the first buffered record
// is flush_interval old (on a processing-time timer of its task, so an idle stream is written too), and at every
// checkpoint (SinkWriter::flush). A batch is collapsed by key: per key the later upserts' columns override the
// earlier ones', a delete drops what came before it, and a delete followed by upserts is written as a delete then
// an upsert. So the table ends in the same state as after writing the records one by one, with one statement per
// ≤ 65535 parameters instead of one per record. A batch is one transaction: the deletes
// (`DELETE FROM t WHERE (k1, k2) IN (($1, $2), ...)`), then per distinct column set one
// `INSERT INTO t (c...) VALUES (...), ... ON CONFLICT (keys) DO UPDATE SET c = EXCLUDED.c, ...` (DO NOTHING when
// the row has only key columns), then COMMIT.
//
// Delivery guarantee: at-least-once. flush() returns once everything written before it is committed; after a
// restore the records since the last checkpoint are written again, which is harmless: an upsert or delete by key
// written twice leaves the same row. With parallelism > 1, route each key to one subtask (key_by) so that two
// writers never race on a key.
//
// Checks at open (create_writer): the table exists (unqualified names resolve through the search_path; names are
// taken literally, case included), every key column exists and the key columns are exactly the columns of a
// non-partial, non-deferrable unique index or primary key (which ON CONFLICT needs). Otherwise create_writer throws
// a kConfiguration error naming the table and columns.
//
// Retries. Serialization failures (40001), deadlocks (40P01), connection loss (08xxx, a dropped connection) and an
// administrator's shutdown or termination of the backend (57P01-57P03) roll back and retry the whole batch after
// an exponential backoff (initial_backoff doubling up to max_backoff), reconnecting when the connection is gone,
// at most max_retries times; then the task fails with the last error. A commit whose outcome is unknown (the
// connection broke during COMMIT) is retried too: the batch is idempotent.
//
// Bad records. A record that cannot be written: not an object, a missing or null key column, a column the table
// does not have (or a generated one), a string with a NUL byte, a value its column would alter (above), or a row
// Postgres rejects with a data error (class 22, e.g. 22P02 invalid_text_representation; class 23 other than the
// key's conflict; 42804; 54000). Client-side problems are found by write(); a Postgres rejection makes the batch be
// written again row by row (one savepoint per row) to find the rows at fault. BadRecordPolicy::kFail (the default)
// fails the task with a kConnector error naming the table, the record (JSON, truncated to 1000 bytes), and the reason
// (Postgres's SQLSTATE and message). kDeadLetter appends
//   {"sink":"postgres","table":..,"op":"upsert"|"delete","error":..,"sqlstate":..,"record":"<JSON>"}
// to the dead-letter file (bad_record.h), counts it in stats()->dead_letters and writes the rest of the batch; a
// record rejected by Postgres is the collapsed row of its key (it may merge several records). Dead letters are
// synced before flush() returns. Other errors (permission denied, the table dropped) fail the task.
//
// Threading: the sink and its builder are configured on one thread before the job starts; the sink is then a
// thread-safe factory. A writer belongs to one subtask and runs on its task thread only, with its own connection
// (opened by create_writer, closed by close()); backoffs sleep on the task thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/api/sink.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice {

/// Settings of a Postgres upsert sink (the builder fills them). A plain value type.
struct PostgresUpsertSinkOptions {
  /// libpq connection string or URI. Without an application_name the connection uses "sluice-upsert-sink".
  std::string conninfo;
  /// The target table: "schema.table" or "table" (search_path). Taken literally: no case folding.
  std::string table;
  /// The columns of the table's primary key or of a unique index (exactly its columns, any order). At least one.
  std::vector<std::string> key_columns;
  /// Write when this many records are buffered (>= 1).
  size_t batch_size = 1000;
  /// ... or when the first buffered record is this old (a processing-time timer of the task, so also on an idle
  /// stream); 0: only by size and at checkpoints.
  std::chrono::milliseconds flush_interval{1000};
  /// True for a record that deletes its key. Empty: no record deletes.
  std::function<bool(const Value&)> is_delete;
  /// The row (object of column -> value) of a record. Empty: the record itself.
  std::function<Value(const Value&)> row;
  /// Retries of a batch after a retryable error (see the file comment); 0: none.
  int max_retries = 5;
  std::chrono::milliseconds initial_backoff{100};  ///< delay before the first retry
  std::chrono::milliseconds max_backoff{5'000};    ///< cap of one delay
  /// What to do with a record that cannot be written (default kFail); kDeadLetter needs dead_letter_path.
  BadRecordPolicy on_bad_record = BadRecordPolicy::kFail;
  std::string dead_letter_path;
};

/// Checks `options`: a kConfiguration error naming the setting (no conninfo, no table, no key columns, a repeated
/// key column, batch_size 0, negative durations or retries, kDeadLetter without a path).
[[nodiscard]] Status validate(const PostgresUpsertSinkOptions& options);

/// Counters of one sink instance, shared by its writers; readable from any thread while the job runs. Row counts
/// are those of committed transactions, as Postgres reported them (an upsert that changes nothing still counts).
struct PostgresUpsertSinkStats {
  std::atomic<int64_t> rows_upserted{0};  ///< rows inserted or updated
  std::atomic<int64_t> rows_deleted{0};   ///< rows deleted (a delete of an absent key counts 0)
  std::atomic<int64_t> batches{0};        ///< committed batch transactions
  std::atomic<int64_t> retries{0};        ///< batch attempts repeated after a retryable error
  std::atomic<int64_t> failed{0};         ///< records that could not be written (dead-lettered or failing the task)
  std::atomic<int64_t> dead_letters{0};   ///< records written to the dead-letter file
};

namespace postgres {

/// What append_text_parameter knows of a target column's type (read from the catalog at open): how to spell a
/// Value for it, and which Values Postgres would alter on assignment without an error (it rounds to a numeric's
/// scale, a float4's or float8's precision and a timestamp's precision, and drops a timestamp's time of day for a
/// date), which are refused instead.
struct PgColumnType {
  enum class Base : uint8_t { kOther, kJson, kNumeric, kFloat4, kFloat8, kDate, kTimestamp };
  Base base = Base::kOther;  ///< the column's type; an array column's element type
  bool array = false;        ///< an array column: a Value array is a Postgres array literal
  int dimensions = 1;        ///< an array column's declared dimensions (at least 1; json elements below them)
  int numeric_scale = 0;     ///< numeric(p, s): s (may be negative); only when numeric_constrained
  bool numeric_constrained = false;
  int timestamp_precision = 6;  ///< timestamp(p) / timestamptz(p): the fractional digits kept

  /// From the catalog: the (element) type's name in pg_catalog (`numeric`, `float4`, `jsonb`, ...), its typmod
  /// (pg_attribute.atttypmod, -1 none), whether the column is an array and its attndims.
  static PgColumnType from_catalog(std::string_view type_name, int typmod, bool array, int dimensions);
};

/// Appends the text parameter of `v` for a column of type `type` (see the file comment): json/jsonb columns (and
/// elements) get the Value's JSON (a string as a JSON string); arrays of an array column become Postgres array
/// literals, every element double-quoted and escaped (a JSON element nested below the declared dimensions is one
/// element). Returns a kConnector error for a string or an array element with a NUL byte (Postgres text cannot hold
/// it) and for a value the column would alter silently (PgColumnType). Must not be called for null (an SQL NULL).
[[nodiscard]] Status append_text_parameter(const Value& v, const PgColumnType& type, std::string& out);

/// append_text_parameter for a column of no particular type: an array column (`array_column`) or not.
[[nodiscard]] Status append_text_parameter(const Value& v, bool array_column, std::string& out);

/// Appends a timestamp (µs since 1970, UTC) as Postgres reads it: ISO-8601 ("2024-01-02T03:04:05.123456Z"),
/// years after 9999 unsigned ("294247-01-10T..."), years before 1 as BC ("4714-11-24T00:00:00.000000Z BC"),
/// and the infinities as "infinity" / "-infinity".
void append_pg_timestamp(int64_t micros, std::string& out);

/// True for the SQLSTATEs a batch is retried on: 40001, 40P01, class 08, 57P01, 57P02, 57P03.
bool is_retryable_sqlstate(std::string_view sqlstate) noexcept;

/// True for the SQLSTATEs that blame a row's values (bad record): class 22, class 23, 42804, 54000.
bool is_data_error_sqlstate(std::string_view sqlstate) noexcept;

}  // namespace postgres

/// Writes Value records as upserts and deletes into a Postgres table (see the file comment). Build with
/// PostgresUpsertSink::builder(). A thread-safe factory.
class PostgresUpsertSink final : public Sink<Value> {
 public:
  class Builder;
  static Builder builder();

  /// The settings the builder made.
  const PostgresUpsertSinkOptions& options() const noexcept { return options_; }
  /// Counters of every writer of this sink (across jobs that use it).
  const std::shared_ptr<PostgresUpsertSinkStats>& stats() const noexcept { return stats_; }

  /// Connects, checks the table and key (file comment) and opens the dead-letter file (kDeadLetter). Throws
  /// SluiceException: kConfiguration for a missing table, key column or unique index; kConnector when the
  /// connection or a catalog query fails.
  std::unique_ptr<SinkWriter<Value>> create_writer(RuntimeContext& ctx) const override;

 private:
  explicit PostgresUpsertSink(PostgresUpsertSinkOptions options) : options_(std::move(options)) {}
  std::shared_ptr<DeadLetterFile> dead_letter_file() const;

  PostgresUpsertSinkOptions options_;
  std::shared_ptr<PostgresUpsertSinkStats> stats_ = std::make_shared<PostgresUpsertSinkStats>();
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;  // opened by the first writer, under mu_
};

/// Configures a PostgresUpsertSink. Methods return *this; try_build() checks the settings (validate()).
class PostgresUpsertSink::Builder {
 public:
  /// libpq connection string or URI. Required.
  Builder& conninfo(std::string conninfo) {
    options_.conninfo = std::move(conninfo);
    return *this;
  }
  /// The target table, "schema.table" or "table". Required.
  Builder& table(std::string table) {
    options_.table = std::move(table);
    return *this;
  }
  /// The key columns (a primary key or unique index of the table). Required.
  Builder& key_columns(std::vector<std::string> columns) {
    options_.key_columns = std::move(columns);
    return *this;
  }
  /// Write a batch once `records` are buffered (default 1000).
  Builder& batch_size(size_t records) {
    options_.batch_size = records;
    return *this;
  }
  /// Write a batch once its first record is `interval` old, on a processing-time timer (default 1 s; 0: off).
  Builder& flush_interval(std::chrono::milliseconds interval) {
    options_.flush_interval = interval;
    return *this;
  }
  /// Which records delete their key (default: none).
  Builder& is_delete(std::function<bool(const Value&)> predicate) {
    options_.is_delete = std::move(predicate);
    return *this;
  }
  /// The row of a record (default: the record itself).
  Builder& row(std::function<Value(const Value&)> row) {
    options_.row = std::move(row);
    return *this;
  }
  /// Retries of a batch and their backoff (defaults 5, 100 ms, 5 s).
  Builder& retries(int max_retries, std::chrono::milliseconds initial_backoff = std::chrono::milliseconds(100),
                   std::chrono::milliseconds max_backoff = std::chrono::milliseconds(5'000)) {
    options_.max_retries = max_retries;
    options_.initial_backoff = initial_backoff;
    options_.max_backoff = max_backoff;
    return *this;
  }
  /// What to do with records that cannot be written (default kFail); kDeadLetter needs `dead_letter_path`.
  Builder& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "") {
    options_.on_bad_record = policy;
    options_.dead_letter_path = std::move(dead_letter_path);
    return *this;
  }

  /// The sink, or a kConfiguration error (validate()).
  [[nodiscard]] Result<std::shared_ptr<PostgresUpsertSink>> try_build() const;
  /// try_build(), throwing SluiceException on an invalid configuration.
  std::shared_ptr<PostgresUpsertSink> build() const { return try_build().value_or_throw(); }

 private:
  PostgresUpsertSinkOptions options_;
};

inline PostgresUpsertSink::Builder PostgresUpsertSink::builder() {
  return Builder();
}

}  // namespace sluice
