#include "sluice/connectors/postgres/postgres_upsert_sink.h"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "libpq_handles.h"
#include "sluice/api/functions.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/clock.h"
#include "sluice/core/redact.h"
#include "sluice/core/value_json.h"

namespace sluice {

namespace {

constexpr const char* kRole = "Postgres upsert sink";
// The wire protocol's limit of parameters per statement.
constexpr size_t kMaxParams = 65535;
// Record JSON in error messages is cut to this many bytes.
constexpr size_t kMaxRecordJson = 1000;

[[noreturn]] void fail(ErrorCode code, std::string message) {
  throw SluiceException(Error(code, std::move(message)));
}

using postgres::PgConn;
using postgres::PgResult;

std::string trimmed(std::string e) {
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

std::string truncated_json(const Value& v) {
  std::string s = v.to_json();
  if (s.size() > kMaxRecordJson) {
    s.resize(kMaxRecordJson);
    s += "...";
  }
  return s;
}

/// "schema.table" -> ("schema", "table"); "table" -> ("", "table").
std::pair<std::string, std::string> split_table(const std::string& t) {
  const size_t dot = t.find('.');
  if (dot == std::string::npos) return {"", t};
  return {t.substr(0, dot), t.substr(dot + 1)};
}

void append_hex(std::string_view bytes, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
}

Status nul_error(std::string_view what) {
  return Error(ErrorCode::kConnector, fmt::format("{} contains a NUL byte, which Postgres text cannot hold", what));
}

// A finite decimal number's text ("-1.50e-3", "42") as its significant digits (no leading or trailing zeros) and
// the place of the point: value = ±0.<digits> × 10^point. Zero has no digits. nullopt for any other text (NaN,
// Infinity, ...).
struct DecimalDigits {
  std::string digits;
  int64_t point = 0;
  bool operator==(const DecimalDigits&) const = default;
};

std::optional<DecimalDigits> decimal_digits(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  DecimalDigits d;
  int64_t before_point = 0;
  bool seen_point = false, any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && !seen_point) {
      seen_point = true;
    } else if (c >= '0' && c <= '9') {
      any = true;
      if (d.digits.empty() && c == '0') {
        if (seen_point) --d.point;  // a leading zero after the point moves the first digit right
        continue;
      }
      d.digits.push_back(c);
      if (!seen_point) ++before_point;
    } else {
      break;
    }
  }
  if (!any) return std::nullopt;
  int64_t exponent = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    auto [end, ec] = std::from_chars(s.data() + i + 1 + (i + 1 < s.size() && s[i + 1] == '+' ? 1 : 0),
                                     s.data() + s.size(), exponent);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  } else if (i != s.size()) {
    return std::nullopt;
  }
  while (!d.digits.empty() && d.digits.back() == '0')
    d.digits.pop_back();
  if (d.digits.empty()) return DecimalDigits{};
  d.point += before_point + exponent;
  return d;
}

// The shortest text of `text` read as a float (F = float) or double, as Postgres prints it back; nullopt when it is
// out of the type's range (Postgres refuses it itself).
template <class F>
std::optional<std::string> float_round_trip(std::string_view text) {
  F f{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), f);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(f)) return std::nullopt;
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, r.ptr);
}

// Refuses a scalar `v` (already spelled as `text`) that a column of `type` would alter without an error.
Status check_exact(const Value& v, const postgres::PgColumnType& type, std::string_view text) {
  using Base = postgres::PgColumnType::Base;
  const bool number = v.is_int64() || v.is_double() || v.is_decimal();
  if (number && (type.base == Base::kFloat4 || type.base == Base::kFloat8)) {
    const bool f4 = type.base == Base::kFloat4;
    const std::optional<DecimalDigits> want = decimal_digits(text);
    if (!want) return ok_status();  // NaN, Infinity: both types hold them
    const std::optional<std::string> stored = f4 ? float_round_trip<float>(text) : float_round_trip<double>(text);
    if (!stored) return ok_status();  // out of range: Postgres refuses it (22003)
    // Exact when Postgres prints back the same number (a float4 value read as the double of its text, 0.1, stays
    // 0.1), or, for a double, when its binary value is a float's (float4's largest, 3.4028234663852886e+38).
    const bool binary_exact =
        f4 && v.is_double() && static_cast<double>(static_cast<float>(v.as_double())) == v.as_double();
    if (!binary_exact && decimal_digits(*stored) != want) {
      return Error(ErrorCode::kConnector,
                   fmt::format("{} {} has no exact {} value: Postgres would store {}", value_kind_name(v.kind()), text,
                               f4 ? "float4 (real)" : "float8 (double precision)", *stored));
    }
    return ok_status();
  }
  if (number && type.base == Base::kNumeric && type.numeric_constrained) {
    const std::optional<DecimalDigits> d = decimal_digits(text);
    if (d && static_cast<int64_t>(d->digits.size()) - d->point > type.numeric_scale) {
      return Error(ErrorCode::kConnector,
                   fmt::format("{} {} has more decimal places than the column's numeric scale {}: Postgres would "
                               "round it",
                               value_kind_name(v.kind()), text, type.numeric_scale));
    }
    return ok_status();
  }
  if (v.is_timestamp() && !is_infinite_timestamp(v.as_timestamp_micros())) {
    const int64_t micros = v.as_timestamp_micros();
    if (type.base == Base::kDate && micros % 86'400'000'000 != 0) {
      return Error(ErrorCode::kConnector,
                   fmt::format("timestamp {} has a time of day, which a date column would drop", text));
    }
    if (type.base == Base::kTimestamp && type.timestamp_precision < 6) {
      int64_t unit = 1;
      for (int i = type.timestamp_precision; i < 6; ++i)
        unit *= 10;
      if (micros % unit != 0) {
        return Error(ErrorCode::kConnector,
                     fmt::format("timestamp {} has more fractional digits than the column's precision {}: Postgres "
                                 "would round it",
                                 text, type.timestamp_precision));
      }
    }
  }
  return ok_status();
}

Status append_scalar(const Value& v, const postgres::PgColumnType& type, std::string& out);

// `array` at `depth` (1: the outermost) as a Postgres array literal: every non-null element double-quoted with '"'
// and '\' escaped, so commas, braces, spaces, quotes and the text NULL stay text; NULL only for a null element.
Status append_array_literal(const Value& array, const postgres::PgColumnType& type, int depth, std::string& out) {
  using Base = postgres::PgColumnType::Base;
  out.push_back('{');
  bool first = true;
  std::string element;
  for (const Value& e : array.as_array()) {
    if (!first) out.push_back(',');
    first = false;
    if (e.is_null()) {
      out += "NULL";
    } else if (e.is_array() && (type.base != Base::kJson || depth < type.dimensions)) {
      SLUICE_RETURN_IF_ERROR(append_array_literal(e, type, depth + 1, out));
    } else {
      element.clear();
      SLUICE_RETURN_IF_ERROR(append_scalar(e, type, element));
      out.push_back('"');
      for (char c : element) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
      }
      out.push_back('"');
    }
  }
  out.push_back('}');
  return ok_status();
}

// One value of a column (or array element) of `type`, not null.
Status append_scalar(const Value& v, const postgres::PgColumnType& type, std::string& out) {
  using Base = postgres::PgColumnType::Base;
  if (type.base == Base::kJson) {
    v.write_json(out);  // NaN, ±Infinity, bytes and timestamps as Value::to_json writes them (docs/value.md)
    return ok_status();
  }
  const size_t start = out.size();
  switch (v.kind()) {
    case Value::Kind::kNull:
      return Error(ErrorCode::kInternal, "append_text_parameter: null has no text parameter");
    case Value::Kind::kBool:
      out.push_back(v.as_bool() ? 't' : 'f');
      return ok_status();
    case Value::Kind::kInt64:
      out += std::to_string(v.as_int64());
      break;
    case Value::Kind::kDouble: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        char buf[64];
        auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
        out.append(buf, end);
      }
      break;
    }
    case Value::Kind::kDecimal:
      v.as_decimal().append_to(out);
      break;
    case Value::Kind::kString: {
      const std::string_view s = v.as_string();
      if (s.find('\0') != std::string_view::npos) return nul_error("a string");
      out += s;
      return ok_status();
    }
    case Value::Kind::kBytes:
      append_hex(v.as_bytes(), out);
      return ok_status();
    case Value::Kind::kTimestamp:
      postgres::append_pg_timestamp(v.as_timestamp_micros(), out);
      break;
    case Value::Kind::kArray:
      if (type.array) return append_array_literal(v, type, 1, out);
      v.write_json(out);
      return ok_status();
    case Value::Kind::kObject:
      v.write_json(out);
      return ok_status();
  }
  return check_exact(v, type, std::string_view(out).substr(start));
}

/// A failed statement.
struct PgError {
  std::string sqlstate;  // "" when the server sent none (e.g. the connection broke)
  std::string message;
  bool connection_lost = false;
};

}  // namespace

namespace postgres {

void append_pg_timestamp(int64_t micros, std::string& out) {
  // ISO-8601 as Value writes it, except where Postgres reads it differently: it refuses the signed years of
  // ISO-8601's extended form ("+10000-...", "-0001-...": "time zone displacement out of range"), and counts
  // years BC (year 0 of ISO-8601 is 1 BC). The infinities are "infinity"/"-infinity" in both.
  std::string iso;
  append_iso8601_micros(micros, iso);
  if (is_infinite_timestamp(micros) || (iso[0] != '+' && iso[0] != '-' && !iso.starts_with("0000-"))) {
    out += iso;
    return;
  }
  if (iso[0] == '+') {
    out.append(iso, 1);
    return;
  }
  const bool negative = iso[0] == '-';
  const size_t year_end = iso.find('-', 1);
  int64_t year = 0;
  std::from_chars(iso.data() + (negative ? 1 : 0), iso.data() + year_end, year);
  fmt::format_to(std::back_inserter(out), "{:04}{} BC", (negative ? year : -year) + 1, iso.substr(year_end));
}

PgColumnType PgColumnType::from_catalog(std::string_view type_name, int typmod, bool array, int dimensions) {
  PgColumnType t;
  t.array = array;
  t.dimensions = std::max(1, dimensions);
  if (type_name == "json" || type_name == "jsonb") {
    t.base = Base::kJson;
  } else if (type_name == "numeric") {
    t.base = Base::kNumeric;
    if (typmod >= 4) {  // ((precision << 16) | scale) + VARHDRSZ; the scale is an 11-bit signed field (PG 15)
      t.numeric_constrained = true;
      t.numeric_scale = (((typmod - 4) & 0x7ff) ^ 1024) - 1024;
    }
  } else if (type_name == "float4") {
    t.base = Base::kFloat4;
  } else if (type_name == "float8") {
    t.base = Base::kFloat8;
  } else if (type_name == "date") {
    t.base = Base::kDate;
  } else if (type_name == "timestamp" || type_name == "timestamptz") {
    t.base = Base::kTimestamp;
    if (typmod >= 0 && typmod < 6) t.timestamp_precision = typmod;
  }
  return t;
}

Status append_text_parameter(const Value& v, const PgColumnType& type, std::string& out) {
  if (v.is_null()) return Error(ErrorCode::kInternal, "append_text_parameter: null has no text parameter");
  if (type.array && v.is_array()) return append_array_literal(v, type, 1, out);
  return append_scalar(v, type, out);
}

Status append_text_parameter(const Value& v, bool array_column, std::string& out) {
  PgColumnType type;
  type.array = array_column;
  return append_text_parameter(v, type, out);
}

bool is_retryable_sqlstate(std::string_view s) noexcept {
  return s == "40001" || s == "40P01" || s.starts_with("08") || s == "57P01" || s == "57P02" || s == "57P03";
}

bool is_data_error_sqlstate(std::string_view s) noexcept {
  return s.starts_with("22") || s.starts_with("23") || s == "42804" || s == "54000";
}

}  // namespace postgres

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

namespace {

/// One column of the target table.
struct Column {
  std::string name;
  std::string quoted;
  int attnum = 0;
  bool is_array = false;
  bool generated = false;
  postgres::PgColumnType type;
};

/// What a batch holds for one key: an optional delete (of the row before the batch), then an optional upsert of
/// the merged columns.
struct Pending {
  std::vector<std::optional<std::string>> key;  // text parameters of the key columns
  bool delete_first = false;
  bool has_upsert = false;
  std::vector<uint8_t> has;                      // per table column: set by the upsert
  std::vector<std::optional<std::string>> vals;  // per table column: the parameter (nullopt: NULL)
  Value row;                                     // the merged upsert row, or the delete's row (messages)
  Value delete_row;                              // the row of the delete (messages)
};

/// A statement's outcome in the row-by-row pass.
struct BadRow {
  size_t pending = 0;
  bool is_delete = false;
  PgError error;
};

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
  void open() {
    try {
      connect();
    } catch (const ConnectError& e) {
      fail(ErrorCode::kConnector, fmt::format("{}: cannot connect: {}", describe_, e.error.message));
    }
    load_catalog();
  }

  void write(const Value& record, const SinkWriterContext& /*ctx*/) override {
    if (!pending_.empty() && o_.flush_interval.count() > 0 &&
        clock_.now_ms() - first_ms_ >= o_.flush_interval.count()) {
      write_batch();
    }
    const bool is_delete = o_.is_delete && o_.is_delete(record);
    if (o_.row) {
      add(o_.row(record), is_delete);
    } else {
      add(record, is_delete);
    }
  }

  void flush(bool /*end_of_input*/) override {
    write_batch();
    if (dead_letter_ && dead_letters_unsynced_) {
      dead_letter_->sync().value_or_throw();
      dead_letters_unsynced_ = false;
    }
  }

  /// flush-interval on a processing-time timer: an idle stream's rows are written flush-interval after the
  /// first of them was buffered, not only at the next write or checkpoint.
  TimestampMs next_timer_ms() const override {
    if (pending_.empty() || o_.flush_interval.count() <= 0) return kNoTimer;
    return first_ms_ + o_.flush_interval.count();
  }
  void on_processing_time(TimestampMs now_ms) override {
    if (!pending_.empty() && o_.flush_interval.count() > 0 && now_ms - first_ms_ >= o_.flush_interval.count()) {
      write_batch();
    }
  }

  void close() override {
    conn_.reset();
    pending_.clear();
    index_.clear();
  }

 private:
  // ---- connection and catalog

  void connect() {
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

  /// Thrown by connect(): retryable inside write_batch(), fatal in open().
  struct ConnectError {
    PgError error;
  };

  std::string quote(std::string_view s) {
    char* q = PQescapeIdentifier(conn_.get(), s.data(), s.size());
    if (q == nullptr) fail(ErrorCode::kConnector, fmt::format("{}: cannot quote identifier '{}'", describe_, s));
    std::string out(q);
    PQfreemem(q);
    return out;
  }

  PgResult catalog_query(const std::string& sql, const std::vector<const char*>& params) {
    PgResult r(PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(params.size()), nullptr, params.data(), nullptr,
                            nullptr, 0));
    if (!r || PQresultStatus(r.get()) != PGRES_TUPLES_OK) {
      fail(ErrorCode::kConnector,
           fmt::format("{}: reading the catalog of table '{}' failed: {}", describe_, o_.table,
                       trimmed(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn_.get()))));
    }
    return r;
  }

  void load_catalog() {
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
      c.type =
          postgres::PgColumnType::from_catalog(PQgetvalue(cols.get(), i, 6), std::atoi(PQgetvalue(cols.get(), i, 5)),
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

  std::string column_list() const {
    std::string s;
    for (const auto& c : columns_)
      s += (s.empty() ? "" : ", ") + c.name;
    return s;
  }

  // ---- buffering

  /// Buffers one record's row, or handles it as a bad record.
  void add(const Value& row, bool is_delete) {
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
          bad_record(
              row, op,
              fmt::format("column '{}' does not exist in table '{}' (columns: {})", name, o_.table, column_list()), {});
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

  /// Fails the task (kFail) or writes a dead letter (kDeadLetter).
  void bad_record(const Value& row, std::string_view op, const std::string& reason, std::string_view sqlstate) {
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

  // ---- writing

  /// Runs one statement; on failure returns the error and leaves the transaction aborted.
  std::optional<PgError> exec(const std::string& sql, const std::vector<const char*>& params, int64_t* affected) {
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
  std::optional<PgError> exec(const std::string& sql) { return exec(sql, {}, nullptr); }

  /// The statements of one attempt; each returns an error or nullopt.
  struct Counts {
    int64_t upserted = 0;
    int64_t deleted = 0;
  };

  std::string delete_sql(size_t rows) const {
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

  std::string upsert_sql(const std::vector<int>& cols, size_t rows) const {
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

  std::vector<int> columns_of(const Pending& p) const {
    std::vector<int> cols;
    for (size_t c = 0; c < p.has.size(); ++c) {
      if (p.has[c]) cols.push_back(static_cast<int>(c));
    }
    return cols;
  }

  void push_upsert_params(const Pending& p, const std::vector<int>& cols, std::vector<const char*>& params) const {
    for (int c : cols)
      params.push_back(p.vals[c] ? p.vals[c]->c_str() : nullptr);
  }
  void push_key_params(const Pending& p, std::vector<const char*>& params) const {
    for (const auto& k : p.key)
      params.push_back(k->c_str());
  }

  /// One attempt of the whole batch in one transaction, with multi-row statements.
  std::optional<PgError> attempt_batched(Counts& counts) {
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

  /// One attempt row by row, each statement under a savepoint, collecting the rows Postgres rejects with a data
  /// error (the first one fails the task under kFail).
  std::optional<PgError> attempt_row_by_row(Counts& counts, std::vector<BadRow>& bad) {
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

  void report_bad(const BadRow& b) {
    const Pending& p = pending_[b.pending];
    bad_record(b.is_delete ? p.delete_row : p.row, b.is_delete ? "delete" : "upsert",
               fmt::format("Postgres error {}: {}", b.error.sqlstate, b.error.message), b.error.sqlstate);
  }

  /// Writes and commits everything buffered (see the file comment: retries, row-by-row pass).
  void write_batch() {
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

}  // namespace

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
