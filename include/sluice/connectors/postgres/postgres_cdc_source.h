// PostgresCdcSource: the changes of Postgres tables as cdc::ChangeEvent records, read through logical
// replication with the built-in pgoutput plugin over libpq (DESIGN.md §8, §10; the user guide is the Postgres
// section of docs/cdc.md).
//
//   auto source = PostgresCdcSource::builder()
//                     .conninfo("host=127.0.0.1 port=5432 dbname=payments user=cdc")
//                     .tables({"public.charges", "public.refunds"})
//                     .slot_name("sluice_payments")
//                     .publication_name("sluice_payments")
//                     .start_mode(PostgresStartMode::kInitial)
//                     .heartbeat_interval(std::chrono::seconds(10))
//                     .build();
//   env.from_source(source, "payments-cdc").uid("payments-cdc").set_parallelism(1)
//      .key_by([](const cdc::ChangeEvent& e) { return e.entity_id().to_json(); }) ...
//
// One split. A replication slot is one ordered stream, so the source has exactly one split
// (PostgresCdcSplit); with a parallelism above 1 the other readers finish at once. Spread the work
// downstream with key_by(entity id), which keeps per-entity order.
//
// Start. The split's reader connects twice: a normal connection (catalog queries, publication creation,
// heartbeats) and a replication connection (`replication=database`). The publication is created when absent
// (`FOR TABLE <tables>`, or `FOR ALL TABLES` without a table list; off with create_publication(false): then a
// missing publication fails the job). The slot (pgoutput) is created when absent (off with
// create_slot(false)).
//   * kInitial: when this source creates the slot, CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT gives a
//     snapshot exactly at the slot's consistent point; a third connection reads every published table in a
//     REPEATABLE READ transaction on that snapshot (SET TRANSACTION SNAPSHOT) and emits op 'r' events, then
//     the stream starts at the consistent point: no change is lost or repeated. When the slot already exists
//     (a restart before the snapshot's end was checkpointed, or a slot made by someone else) the snapshot is
//     a fresh REPEATABLE READ one and the stream starts at the slot's confirmed position: changes committed
//     before the snapshot may then arrive again after it (at-least-once); they carry source.snapshot = true.
//   * kLatest: no snapshot; the stream starts at the slot's confirmed position (a new slot: the current WAL
//     end).
// A checkpoint taken during the snapshot stores "snapshot not finished" and the rows emitted: a restore reads the
// snapshot again when none were emitted, else fails (kFail, default) or reads it again (kRepeat, rows repeat):
// on_interrupted_snapshot.
//
// Streaming. START_REPLICATION SLOT <slot> LOGICAL <lsn> (proto_version '1', publication_names '<pub>',
// messages 'true'); pgoutput messages are decoded by PgOutputDecoder (pgoutput.h: message kinds, type
// mapping, unchanged TOAST marker). Each Insert/Update/Delete becomes one event (an Update that changes the key:
// a delete of the old key, then a create of the new one) with source.position = the
// transaction's commit LSN ("X/Y"), source.ts_ms = the commit time, source.txn_id = the xid and the record's
// event timestamp = the commit time (ms). Truncate fails the job by default (TruncatePolicy).
//
// Positions and the slot. The split's position is the end LSN of the last transaction whose changes were all
// emitted (or the LSN of the last heartbeat message), plus the commit LSN and emitted-event count of a partly
// emitted transaction (PostgresCdcSplit). Checkpoints store it; on restore the stream restarts at the end LSN,
// transactions whose commit LSN is below it (end LSN <= the position) are skipped, and so are the counted
// events of the partly emitted one: exactly-once with a transactional sink. The slot's flush
// LSN (the Standby Status Update that moves confirmed_flush_lsn) is reported ONLY in
// notify_checkpoint_complete, with the position of that completed checkpoint — never on receipt, never for
// a checkpoint still in flight; until the first completion the flush LSN sent is 0 (no confirmation).
// Keepalives that ask for a reply are answered at once, and a status update goes out at least every
// min(status_interval, wal_sender_timeout / 2), also while backpressure stops reading. Liveness: no message for
// liveness_timeout (default wal_sender_timeout + 10 s; an idle stream pings every min(1 s, timeout / 4)) fails
// the source; queries on the normal connection are bounded by it and interruptible by close(). Before that, a
// stream silent for the ping interval + 2 s (3 s by default) shows the reader disconnected (connections(),
// source_connection.h: /health's `source-disconnected`, the `sourceConnected` gauge, a log line when lost and one
// when back), as does a connection that failed, also while the job restarts and cannot connect.
//
// Heartbeats. With heartbeat_interval() > 0, the reader runs `SELECT pg_logical_emit_message(false,
// 'sluice-heartbeat', ...)` on its normal connection at that interval while streaming. The message passes
// through the slot like a change, so the position — and after the next completed checkpoint the slot's
// confirmed_flush_lsn — advances even when the published tables are idle, and the server can recycle WAL.
// Without heartbeats an idle slot holds WAL back until the next change to a published table.
//
// Errors. Connection, authentication, catalog and protocol errors fail the task (SluiceException,
// kConnector) with libpq's/the server's text, the slot and the LSN; the job then restarts under its restart
// strategy. A restored position the slot can no longer serve (slot dropped, or its confirmed_flush_lsn is
// past the checkpoint's position, e.g. an old savepoint) fails naming both LSNs and the remedy (start a new
// job without state: a new snapshot). A change whose values cannot be converted (numeric NaN, a number of
// more than 38 digits, bad JSON) follows the bad-record policy: kFail (default) fails naming table, LSN,
// column and reason; kDeadLetter writes {"source":"postgres","slot":..,"table":..,"lsn":..,"xid":..,
// "error":..,"record_base64":<the pgoutput message>} to the dead-letter file and goes on.
//
// Threading. PostgresCdcSource is an immutable, thread-safe factory. The enumerator hands out the one split.
// Each reader owns a fetcher thread that does all libpq I/O (connects, snapshot, replication stream,
// keepalives, status updates, heartbeats) and fills a bounded queue (backpressure: a full queue stops reading
// the socket); the task thread drains the queue in poll_next and keeps the position. snapshot_state never
// waits for I/O. close() cancels running queries (PQcancel), stops and joins the fetcher.
// metrics() may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/postgres/pgoutput.h"
#include "sluice/connectors/source_connection.h"
#include "sluice/core/error.h"
#include "sluice/core/type_serializer.h"

namespace sluice {

/// Where a PostgresCdcSource starts when it has no checkpointed position.
enum class PostgresStartMode {
  kInitial,  ///< snapshot of the published tables (op 'r'), then the stream (the default)
  kLatest,   ///< only the stream, from the slot's confirmed position
};

/// What restoring a checkpoint taken in the middle of the initial snapshot does (some of its rows were emitted
/// before the checkpoint, and an exactly-once sink has committed them).
enum class PostgresInterruptedSnapshot {
  /// Fail the job naming the slot, the rows emitted and the remedies (the default: reading the snapshot again
  /// would deliver those rows twice, which exactly-once must not do).
  kFail,
  /// Read the snapshot again from its start (a warning): the rows emitted before the checkpoint come again
  /// (at-least-once; the final state per key is right).
  kRepeat,
};

/// What a Truncate of a published table does.
enum class PostgresTruncatePolicy {
  kFail,  ///< fail the job naming the tables and LSN (the default: downstream state would silently diverge)
  kSkip,  ///< log a warning, count it in metrics().truncates_skipped and go on
};

/// The one split of a PostgresCdcSource: the slot and the position to resume from.
///
/// The position of an emitted change is (lsn, txn_lsn, txn_events): the stream restarts at `lsn` and, in the
/// transaction whose commit LSN is `txn_lsn`, skips its first `txn_events` events (they were emitted before
/// the checkpoint). pgoutput protocol 1 sends a transaction only after its commit, whole and in commit order,
/// with the commit LSN in its Begin message, so the events of one transaction come out in the same order on
/// every replay and (commit LSN, index) names each of them.
struct PostgresCdcSplit {
  std::string slot;
  /// False until the initial snapshot has been emitted completely (always true with kLatest).
  bool snapshot_done = false;
  /// Where the stream restarts (an Lsn stored as int64 bits): the end LSN of the last fully emitted
  /// transaction or heartbeat; 0 = the slot's confirmed position. Also what a completed checkpoint confirms
  /// to the slot.
  int64_t lsn = 0;
  /// The commit LSN (Begin's final_lsn) of the transaction that was partly emitted when the checkpoint was
  /// taken; 0 = none (the checkpoint fell between transactions).
  int64_t txn_lsn = 0;
  /// How many events of that transaction were emitted (a primary-key update counts as its two events).
  int64_t txn_events = 0;
  /// While snapshot_done is false: the snapshot rows emitted before the checkpoint (0 = none: reading the
  /// snapshot again repeats nothing).
  int64_t snapshot_events = 0;
  /// Once snapshot_done: the end of the overlap of a snapshot that the slot did not export (an Lsn as int64
  /// bits): stream transactions whose commit LSN is at or before it may repeat snapshot rows and carry
  /// `source.snapshot = true`, also after a restore. 0 = no overlap (an exported snapshot).
  int64_t overlap_lsn = 0;
  /// The split id: the slot name.
  std::string split_id() const { return slot; }
  friend bool operator==(const PostgresCdcSplit&, const PostgresCdcSplit&) = default;
};

/// The binary form of a PostgresCdcSplit in checkpoints. Version 0 (written before the in-transaction
/// position existed, by SLUICE_FIELDS) is slot, snapshot_done (byte 0/1), lsn; version 1 writes the byte
/// 2 | snapshot_done, then lsn and a length-prefixed block of the newer fields, so that both versions restore
/// (a version-0 split has no partial transaction and no snapshot progress) and fields appended to the block
/// later are skipped by older readers.
template <>
struct TypeSerializer<PostgresCdcSplit> {
  static void serialize(const PostgresCdcSplit& v, DataOutput& out);
  static void deserialize(PostgresCdcSplit& target, DataInput& in);
  static constexpr size_t min_encoded_size() { return 1 + 1 + 8; }
};

/// A snapshot of a source's metrics (summed over its readers; in practice one).
struct PostgresCdcMetrics {
  int64_t events = 0;             ///< events emitted (snapshot and stream)
  int64_t snapshot_events = 0;    ///< of which op 'r'
  int64_t transactions = 0;       ///< transactions completely emitted
  int64_t heartbeats = 0;         ///< heartbeat messages seen in the stream
  int64_t truncates_skipped = 0;  ///< Truncate messages skipped under kSkip
  int64_t bad_records = 0;        ///< changes sent to the dead-letter file
  /// Times the streaming loop woke up to read the replication connection: about once per batch of messages
  /// that arrive together, per status update and per ping of a quiet stream (a loop that never waits shows here).
  int64_t stream_wakeups = 0;
  double events_per_second = 0;  ///< over the last completed second of reading
  /// How far the reader is behind the server (ms): 0 while the server confirms, with a keepalive at least
  /// every ping interval, that it has sent everything it has and every event received was emitted (an idle
  /// source); otherwise the smaller of now − the commit time of the last emitted event and now − the last
  /// such confirmation (less the ping interval + 2 s). -1 before the first of either.
  int64_t lag_ms = -1;
  postgres::Lsn position = 0;       ///< the split's current position
  postgres::Lsn confirmed_lsn = 0;  ///< the last flush LSN reported to the slot (a completed checkpoint's)
  postgres::Lsn received_lsn = 0;   ///< the end of the last WAL data received
  bool snapshot_done = false;
  /// How long (ms) the reader has been waiting for its slot, held by another connection (SQLSTATE 55006,
  /// usually a previous reader's that the server has not ended yet); 0 = not waiting. The wait fails the
  /// source after 30 s.
  int64_t slot_busy_ms = 0;
};

namespace detail {

/// The validated settings of a PostgresCdcSource (set by its builder).
struct PostgresCdcSettings {
  std::string conninfo;             ///< libpq connection string or URI (without `replication`)
  std::vector<std::string> tables;  ///< "schema.table" (or "table" = public.table); empty = the publication's
  std::string slot_name = "sluice";
  std::string publication_name = "sluice";
  /// Whose slot it is (a pipeline's name; "" = unnamed): carried in the connections' application_name, so that a
  /// fresh start tells its own earlier run's walsender on the slot from another job's.
  std::string owner;
  bool create_slot = true;
  bool create_publication = true;
  PostgresStartMode start_mode = PostgresStartMode::kInitial;
  PostgresTruncatePolicy truncate_policy = PostgresTruncatePolicy::kFail;
  PostgresInterruptedSnapshot interrupted_snapshot = PostgresInterruptedSnapshot::kFail;
  int64_t heartbeat_interval_ms = 0;    ///< 0 = no heartbeats
  int64_t status_interval_ms = 10'000;  ///< at most this long between status updates
  /// Fail the stream when the server sent nothing for this long (ms); 0 = wal_sender_timeout + 10 s (70 s
  /// when the server's wal_sender_timeout is 0).
  int64_t liveness_timeout_ms = 0;
  int64_t snapshot_fetch_rows = 4096;  ///< rows per FETCH of a snapshot cursor
  size_t queue_capacity = 16'384;      ///< events buffered between the fetcher and the task thread
  BadRecordPolicy bad_record_policy = BadRecordPolicy::kFail;
  std::string dead_letter_path;
  std::string database;  ///< filled at start from the server (current_database())
};

/// The counters the readers of one source share (postgres_cdc_stats.h, private to src/sluice/connectors/postgres/).
struct PostgresCdcStats;

}  // namespace detail

class PostgresCdcSourceBuilder;

/// A change-data-capture source over Postgres logical replication (see the file comment).
class PostgresCdcSource final : public Source<cdc::ChangeEvent, PostgresCdcSplit> {
 public:
  /// A builder with the defaults of the file comment.
  static PostgresCdcSourceBuilder builder();

  /// Use builder(). `settings` must be validated.
  explicit PostgresCdcSource(detail::PostgresCdcSettings settings);

  /// Always unbounded: a change stream has no end.
  Boundedness boundedness() const override { return Boundedness::kContinuousUnbounded; }
  /// An enumerator with the one split (snapshot_done = start mode is kLatest, lsn 0).
  std::unique_ptr<SplitEnumerator<PostgresCdcSplit>> create_enumerator(
      SplitEnumeratorContext<PostgresCdcSplit>& ctx) const override;
  /// A reader; it connects when its split arrives. Throws SluiceException when the dead-letter file cannot
  /// be opened.
  std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> create_reader(
      SourceReaderContext& ctx) const override;

  /// The current metrics (thread-safe).
  PostgresCdcMetrics metrics() const;
  /// The reading subtask's connection to the server (see PostgresCdcStats::connections; thread-safe).
  std::vector<SourceConnection> connections() const;
  /// The validated settings (for tests and tools).
  const detail::PostgresCdcSettings& settings() const noexcept { return settings_; }

 private:
  std::shared_ptr<DeadLetterFile> dead_letter_file() const;

  detail::PostgresCdcSettings settings_;
  std::shared_ptr<detail::PostgresCdcStats> stats_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<DeadLetterFile> dead_letter_;
};

/// Configures a PostgresCdcSource. Not thread-safe; a value type.
class PostgresCdcSourceBuilder {
 public:
  /// libpq connection string ("host=... port=... dbname=... user=...") or URI ("postgresql://..."). Required.
  PostgresCdcSourceBuilder& conninfo(std::string conninfo);
  /// The tables to capture, "schema.table" or "table" (schema public). Used to create the publication; with
  /// an existing publication its own table list is what is read. Empty (default): FOR ALL TABLES when the
  /// publication is created (needs superuser).
  PostgresCdcSourceBuilder& tables(std::vector<std::string> tables);
  /// The replication slot (default "sluice"). Each job needs its own slot. Letters, digits and '_' only.
  PostgresCdcSourceBuilder& slot_name(std::string name);
  /// The publication (default "sluice").
  PostgresCdcSourceBuilder& publication_name(std::string name);
  /// Whose slot it is, e.g. the job's name (default "": unnamed). The source's connections carry it in their
  /// application_name ("sluice-cdc-replication <owner>": characters other than letters, digits, '-', '_' and '.'
  /// become '_', and an owner past the server's 63 bytes is shortened with a digest of the whole). A job that starts
  /// without state and finds its slot streamed by a connection of another owner (another job, a tool) fails at
  /// once naming the holder instead of dropping the slot (create_slot) and with it the other reader's position;
  /// one of its own owner (its own earlier run) or of none is waited for, then replaced. A slot nobody streams at
  /// that moment (its job between two attempts, or in its initial snapshot) cannot be told apart: give every job
  /// a slot of its own.
  PostgresCdcSourceBuilder& owner(std::string owner);
  /// Whether to create the slot when absent (default true); false: a missing slot fails the job.
  PostgresCdcSourceBuilder& create_slot(bool create);
  /// Whether to create the publication when absent (default true); false: a missing one fails the job.
  PostgresCdcSourceBuilder& create_publication(bool create);
  /// kInitial (default) or kLatest.
  PostgresCdcSourceBuilder& start_mode(PostgresStartMode mode);
  /// kFail (default) or kSkip.
  PostgresCdcSourceBuilder& truncate_policy(PostgresTruncatePolicy policy);
  /// Restoring a checkpoint taken during the initial snapshot after some of its rows were emitted: kFail
  /// (default) or kRepeat (see PostgresInterruptedSnapshot).
  PostgresCdcSourceBuilder& on_interrupted_snapshot(PostgresInterruptedSnapshot policy);
  /// Emit a heartbeat message at this interval while streaming (0 = off, the default).
  PostgresCdcSourceBuilder& heartbeat_interval(std::chrono::milliseconds interval);
  /// The longest time between two status updates (default 10 s; also capped at wal_sender_timeout / 2).
  PostgresCdcSourceBuilder& status_interval(std::chrono::milliseconds interval);
  /// Fail the source when the replication connection brought no message for this long (default 0 =
  /// wal_sender_timeout + 10 s). An idle stream pings the server (a status update asking for a reply) every
  /// min(1 s, timeout / 4), so a healthy server always answers well within it; a hung or unreachable one
  /// (paused process, network partition) fails the job, whose restart strategy takes over.
  PostgresCdcSourceBuilder& liveness_timeout(std::chrono::milliseconds timeout);
  /// Rows per FETCH while reading the snapshot (default 4096).
  PostgresCdcSourceBuilder& snapshot_fetch_rows(int64_t rows);
  /// Events buffered between the fetcher thread and the task (default 16384): the memory bound.
  PostgresCdcSourceBuilder& queue_capacity(size_t events);
  /// kFail (default) or kDeadLetter with a dead-letter file path.
  PostgresCdcSourceBuilder& on_bad_record(BadRecordPolicy policy, std::string dead_letter_path = "");

  /// The source, or a kConfiguration error saying what is missing or invalid.
  [[nodiscard]] Result<std::shared_ptr<PostgresCdcSource>> try_build() const;
  /// As try_build(), throwing SluiceException on an error.
  std::shared_ptr<PostgresCdcSource> build() const { return try_build().value_or_throw(); }

 private:
  detail::PostgresCdcSettings s_;
};

}  // namespace sluice
