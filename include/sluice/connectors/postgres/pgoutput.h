// Decoding of Postgres logical replication: the pgoutput plugin's messages (protocol version 1) and the text
// form of column values (what pgoutput sends without the `binary` option, and what a query in text format
// returns, so the snapshot and the stream share one conversion).
//
// Message format: Postgres docs, "Logical Replication Message Formats" (protocol.sgml). Each XLogData payload
// of a `START_REPLICATION ... LOGICAL` stream is one message, its first byte the type:
//   B Begin, C Commit, O Origin, R Relation, Y Type, I Insert, U Update, D Delete, T Truncate, M Message.
// Streamed-transaction and two-phase messages (protocol versions 2 and 3) are never requested and are
// rejected as unknown.
//
// Value mapping (decode_text_value), by the column's type OID:
//   bool -> bool; int2/int4/int8/oid -> int64; float4/float8 -> double (NaN, ±Infinity kept);
//   numeric -> decimal (exact, up to 38 significant digits; wider numbers are errors); numeric NaN and
//   ±Infinity -> the double NaN / ±infinity (exact; JSON writes them "NaN", "Infinity", "-Infinity");
//   text/varchar/bpchar/name/char -> string; uuid -> string (lower case, with dashes, as Postgres prints it);
//   bytea -> bytes (hex output form); json/jsonb -> the parsed document (Value::from_json);
//   date -> timestamp at 00:00 UTC of that day; timestamp -> timestamp (its wall time read as UTC);
//   timestamptz -> timestamp (the instant, UTC); 'infinity'/'-infinity' -> INT64_MAX/INT64_MIN µs (Postgres'
//   own internal representation; value_json.h), written "infinity"/"-infinity" in JSON; a date or timestamp
//   outside the finite range in between (after 294247-01-10T04:00:54.775806Z) is an error, never wrapped;
//   one-dimensional and multi-dimensional arrays of all of the above -> arrays (nested for more dimensions,
//   SQL NULL elements -> null); any other type (time, interval, enums, domains, geometric, ...) -> its text.
// The replication session must print dates in ISO style with UTC as the time zone and bytea in hex
// (PostgresCdcSource sets DateStyle=ISO, TimeZone=UTC, bytea_output=hex, extra_float_digits=3).
//
// Unchanged TOAST: an UPDATE that does not touch a large (TOASTed) column sends it as kind 'u' without a value.
// Its field then holds the marker object {"$unchanged_toast": true} (never null, which would be a different
// value); when the old row is known (REPLICA IDENTITY FULL, and the old value is not itself unchanged) the
// old value is used instead. is_unchanged_toast() recognizes the marker.
//
// Thread-safety: the free functions are thread-safe; a PgOutputDecoder is not (one per stream).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/connectors/cdc/change_event.h"
#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice::postgres {

/// A WAL position (Postgres XLogRecPtr): bytes since the start of the WAL. 0 is "invalid / none".
using Lsn = uint64_t;

/// Formats an LSN the way Postgres prints it: "16/B374D848" (upper-case hex, high and low 32 bits).
std::string format_lsn(Lsn lsn);
/// Parses "X/Y" (hex); a kConfiguration error for anything else.
[[nodiscard]] Result<Lsn> parse_lsn(std::string_view text);

/// Microseconds between the Unix epoch and the Postgres epoch (2000-01-01 00:00:00 UTC).
inline constexpr int64_t kPostgresEpochMicros = 946'684'800'000'000LL;

/// Type OIDs of the built-in types decode_text_value() knows (pg_type.dat).
namespace oid {
inline constexpr uint32_t kBool = 16, kBytea = 17, kChar = 18, kName = 19, kInt8 = 20, kInt2 = 21, kInt4 = 23,
                          kText = 25, kOid = 26, kJson = 114, kFloat4 = 700, kFloat8 = 701, kBpchar = 1042,
                          kVarchar = 1043, kDate = 1082, kTimestamp = 1114, kTimestamptz = 1184, kNumeric = 1700,
                          kUuid = 2950, kJsonb = 3802;
}  // namespace oid

/// The element type of a built-in array type (e.g. 1007 _int4 -> 23 int4), or 0 when `type_oid` is not one
/// of the arrays of the types above.
uint32_t array_element_type(uint32_t type_oid) noexcept;

/// Converts one column value in Postgres' text output form to a Value (mapping in the file comment).
/// Errors (kSerialization) say what was wrong with which text: "date \"5874897-12-31\" is outside the range".
[[nodiscard]] Result<Value> decode_text_value(uint32_t type_oid, std::string_view text);

/// The marker of an unchanged TOAST value: {"$unchanged_toast": true}.
Value unchanged_toast_marker();
/// True when `v` is the marker of an unchanged TOAST value.
bool is_unchanged_toast(const Value& v) noexcept;

/// A column of a relation, as the Relation message describes it.
struct PgColumn {
  std::string name;
  uint32_t type_oid = 0;
  int32_t type_modifier = -1;
  bool part_of_identity = false;  ///< flag 1: part of the replica identity (every column under FULL)
};

/// A table as the last Relation message described it.
struct PgRelation {
  uint32_t oid = 0;
  std::string schema;  ///< "" means pg_catalog in the protocol; kept as sent
  std::string name;
  char replica_identity = 'd';  ///< 'd' default (primary key), 'n' nothing, 'f' full, 'i' index
  std::vector<PgColumn> columns;
  /// The columns of the entity key: the replica identity's columns, except under FULL (where every column is
  /// flagged) the primary key the KeyResolver found. Empty: the key is the whole row.
  std::vector<std::string> key_columns;
  /// "schema.table".
  std::string qualified_name() const { return schema + "." + name; }
};

/// Begin: a transaction's changes follow.
struct PgBegin {
  Lsn final_lsn = 0;         ///< the LSN of the transaction's commit record
  int64_t commit_ts_us = 0;  ///< commit time, µs since the Unix epoch
  uint32_t xid = 0;          ///< transaction id
};

/// Commit: the transaction ends.
struct PgCommit {
  uint8_t flags = 0;
  Lsn commit_lsn = 0;        ///< LSN of the commit record (== Begin's final_lsn)
  Lsn end_lsn = 0;           ///< the end of the commit record: the position after the transaction
  int64_t commit_ts_us = 0;  ///< µs since the Unix epoch
};

/// Origin (replication origin of the transaction; ignored by the source).
struct PgOrigin {
  Lsn lsn = 0;
  std::string name;
};

/// Type: a non-built-in type's name (for columns of that type).
struct PgType {
  uint32_t oid = 0;
  std::string schema;
  std::string name;
};

/// Truncate of one or more tables.
struct PgTruncate {
  uint8_t options = 0;  ///< bit 1 CASCADE, bit 2 RESTART IDENTITY
  std::vector<uint32_t> relation_oids;
  std::vector<std::string> tables;  ///< "schema.table" of each known relation (unknown OIDs as "oid <n>")
};

/// A logical decoding message (pg_logical_emit_message).
struct PgLogicalMessage {
  bool transactional = false;
  Lsn lsn = 0;
  std::string prefix;
  std::string content;
};

/// An Insert ('c'), Update ('u') or Delete ('d') of one row.
struct PgRowChange {
  cdc::ChangeOp op = cdc::ChangeOp::kCreate;
  const PgRelation* relation = nullptr;  ///< owned by the decoder, valid until the next Relation for its OID
  Value key;                             ///< object of the key columns (see PgRelation::key_columns)
  Value before;  ///< null, the old key columns ('K'), or the whole old row ('O', REPLICA IDENTITY FULL)
  Value after;   ///< the new row; null for deletes
};

/// One decoded message.
struct PgOutputMessage {
  enum class Kind : char {
    kBegin = 'B',
    kCommit = 'C',
    kOrigin = 'O',
    kRelation = 'R',
    kType = 'Y',
    kInsert = 'I',
    kUpdate = 'U',
    kDelete = 'D',
    kTruncate = 'T',
    kMessage = 'M',
  };
  Kind kind = Kind::kBegin;
  PgBegin begin;                         ///< kBegin
  PgCommit commit;                       ///< kCommit
  PgOrigin origin;                       ///< kOrigin
  PgType type;                           ///< kType
  const PgRelation* relation = nullptr;  ///< kRelation (the new description), and the row's table for I/U/D
  PgRowChange change;                    ///< kInsert, kUpdate, kDelete
  PgTruncate truncate;                   ///< kTruncate
  PgLogicalMessage message;              ///< kMessage
};

/// Decodes pgoutput messages (protocol version 1) and keeps the relation and type descriptions they refer to.
/// Not thread-safe; one per replication stream. Lifecycle: construct -> decode()...
class PgOutputDecoder {
 public:
  /// Finds the primary-key columns of a table whose replica identity is FULL (the source asks the catalog).
  /// Returns an empty list when the table has no primary key (the key is then the whole row).
  using KeyResolver = std::function<Result<std::vector<std::string>>(const PgRelation&)>;

  /// `resolver` may be empty: under FULL the key is then the whole row.
  explicit PgOutputDecoder(KeyResolver resolver = {}) : resolver_(std::move(resolver)) {}

  /// Decodes one message. Errors:
  ///  * kConnector: the bytes are not a valid message (truncated, unknown type, a row of a relation never
  ///    described, a commit timestamp out of range); the message names the message type and the byte offset
  ///    where decoding stopped;
  ///  * kSerialization: the message is valid but a column value cannot be converted (a numeric of more than
  ///    38 digits, a date or timestamp beyond the year 294247, bad JSON);
  ///    the message names the table and column. Relation/type state stays consistent either way.
  [[nodiscard]] Result<PgOutputMessage> decode(std::string_view bytes);

  /// The relation with this OID, or nullptr when no Relation message described it.
  const PgRelation* relation(uint32_t oid) const;
  /// The type with this OID from a Type message, or nullptr.
  const PgType* type(uint32_t oid) const;

 private:
  std::map<uint32_t, std::unique_ptr<PgRelation>> relations_;
  std::map<uint32_t, PgType> types_;
  KeyResolver resolver_;
};

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering: 1 BC is year 0).
int64_t days_from_civil(int64_t year, unsigned month, unsigned day) noexcept;

}  // namespace sluice::postgres
