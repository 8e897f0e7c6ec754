// Private to src/sluice/connectors/postgres/: what the files of the Postgres upsert sink share (the sink and its
// settings, the writer, its catalog reads, statements and errors): constants, `fail`, message text, the table
// name's parts, and the writer's rows (Column, Pending, BadRow) and statement errors (PgError). Not installed;
// postgres_upsert_sink.h's file comment describes the sink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "libpq_handles.h"
#include "sluice/connectors/postgres/postgres_upsert_sink.h"
#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice {
namespace postgres_upsert_internal {

constexpr const char* kRole = "Postgres upsert sink";
// The wire protocol's limit of parameters per statement.
constexpr size_t kMaxParams = 65535;
// Record JSON in error messages is cut to this many bytes.
constexpr size_t kMaxRecordJson = 1000;

[[noreturn]] inline void fail(ErrorCode code, std::string message) {
  throw SluiceException(Error(code, std::move(message)));
}

using postgres::PgConn;
using postgres::PgResult;

// libpq's message without its trailing newline and spaces. Defined in postgres_upsert_errors.cc.
std::string trimmed(std::string e);

// The record's JSON for error messages, cut to kMaxRecordJson bytes. Defined in postgres_upsert_errors.cc.
std::string truncated_json(const Value& v);

/// "schema.table" -> ("schema", "table"); "table" -> ("", "table"). Defined in postgres_upsert_sink.cc.
std::pair<std::string, std::string> split_table(const std::string& t);

/// A failed statement.
struct PgError {
  std::string sqlstate;  // "" when the server sent none (e.g. the connection broke)
  std::string message;
  bool connection_lost = false;
};

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

}  // namespace postgres_upsert_internal
}  // namespace sluice
