// ChangeEvent: the one change-event envelope every CDC source emits (MongoDB change streams, Postgres logical
// replication). The shape follows Debezium's envelope, which Flink CDC users already know: an operation, the
// row/document before and after the change, the entity key, and where in the source it came from.
//
//   op      'c' insert, 'u' update (and MongoDB replace), 'd' delete, 'r' read by an initial snapshot
//   key     the entity key as an object: {"_id": ...} for MongoDB, the primary-key columns for Postgres
//   before  the old row/document when the source knows it (Postgres REPLICA IDENTITY FULL, or the key
//           columns under DEFAULT; MongoDB pre-images), null otherwise
//   after   the new row/document; null for deletes
//   source  connector, database, collection ("schema.table" for Postgres), position (MongoDB resume token
//           as extended JSON text, Postgres commit LSN as "X/Y"), source timestamp (ms since epoch),
//           snapshot flag
//
// The user guide (docs/cdc.md) documents every field with examples. The envelope is a plain value type with a
// TypeSerializer (SLUICE_FIELDS), so it crosses key_by exchanges and sits in state like any record.
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"

namespace sluice::cdc {

/// The change operation, with Debezium's one-letter codes.
enum class ChangeOp : char {
  kCreate = 'c',  ///< insert
  kUpdate = 'u',  ///< update or (MongoDB) replace
  kDelete = 'd',  ///< delete
  kRead = 'r',    ///< a row/document read by the initial snapshot
};

/// Returns the one-letter code ("c", "u", "d", "r").
std::string_view to_string(ChangeOp op) noexcept;

/// Parses a one-letter code; a kConfiguration error for anything else.
Result<ChangeOp> parse_change_op(std::string_view code);

/// Where a change came from.
struct SourceInfo {
  std::string connector;   ///< "mongodb" or "postgres"
  std::string database;    ///< the database name
  std::string collection;  ///< MongoDB collection, or Postgres "schema.table"
  /// The position to resume after this change: a MongoDB resume token (canonical extended JSON of the
  /// `_id` document), a Postgres transaction's commit LSN ("16/B374D848"). For snapshot reads, the position the
  /// stream resumes from after the snapshot.
  std::string position;
  int64_t ts_ms = 0;      ///< source timestamp of the change (commit time / cluster time), ms since epoch; 0 unknown
  bool snapshot = false;  ///< true for snapshot reads, and for stream events a resnapshot/overlap marks
  /// Postgres: the transaction id; MongoDB: the `txnNumber` when the change was in a transaction; else -1.
  int64_t txn_id = -1;
  /// Orders the changes that share one position: Postgres the LSN of the change's own WAL record (every
  /// change of a transaction has the transaction's commit LSN as position); 0 when the position alone is
  /// unique (MongoDB resume tokens, snapshot reads). Deterministic on replay, so domain-event ids use it.
  int64_t sequence = 0;
  friend bool operator==(const SourceInfo&, const SourceInfo&) = default;
};
SLUICE_FIELDS(SourceInfo, connector, database, collection, position, ts_ms, snapshot, txn_id, sequence);

/// One change to one entity (row or document).
struct ChangeEvent {
  ChangeOp op = ChangeOp::kCreate;
  Value key;     ///< object of key fields; never null for a well-formed event
  Value before;  ///< object, or null when unknown
  Value after;   ///< object, or null for deletes
  SourceInfo source;

  /// True when the event comes from an initial snapshot (op == kRead).
  bool is_snapshot_read() const noexcept { return op == ChangeOp::kRead; }
  /// The document/row that represents the entity after the change: `after`, or `before` for deletes.
  const Value& current() const noexcept { return op == ChangeOp::kDelete ? before : after; }
  /// The key's single field when the key has exactly one field (`_id`, or a one-column primary key), else
  /// the key object itself.
  const Value& entity_id() const;

  /// The envelope as one Value object {op, key, before, after, source:{...}} (what docs/cdc.md shows and
  /// what the JSON serializers of sinks write).
  Value to_value() const;
  /// Reads an envelope produced by to_value(); a kSerialization error naming the missing or mistyped field.
  static Result<ChangeEvent> from_value(const Value& v);

  friend bool operator==(const ChangeEvent&, const ChangeEvent&) = default;
};
SLUICE_FIELDS(ChangeEvent, op, key, before, after, source);

}  // namespace sluice::cdc
