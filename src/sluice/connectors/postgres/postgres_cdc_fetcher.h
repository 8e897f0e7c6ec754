// Private to src/sluice/connectors/postgres/: the Fetcher, all libpq I/O of one Postgres CDC reader on a thread of
// its own: connections, publication and slot, the exported-snapshot read (postgres_cdc_snapshot.cc), the replication
// stream with keepalives, status updates and heartbeats (postgres_cdc_stream.cc); the thread, the hand-over queue and
// the slot's life in postgres_cdc_fetcher.cc. The task thread (PostgresCdcReader, postgres_cdc_reader.cc) calls
// start(), stop(), take() and confirm(); everything else runs on the fetcher thread.
#pragma once

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "postgres_cdc_internals.h"
#include "postgres_cdc_stats.h"
#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"

namespace sluice {
namespace postgres_cdc_internal {

class Fetcher {
 public:
  Fetcher(const detail::PostgresCdcSettings& settings, PostgresCdcSplit split, SourceReaderContext& ctx,
          std::shared_ptr<detail::PostgresCdcStats> stats, std::shared_ptr<DeadLetterFile> dead_letter);
  ~Fetcher();

  void start();

  /// Stops the thread (cancels a running query) and waits for it. Idempotent. Task thread.
  void stop();

  /// Moves up to `max` items into `out`. Task thread.
  void take(std::vector<Item>& out, size_t max);

  /// Reports `lsn` as the slot's flush position at the next chance (soon). Task thread.
  void confirm(Lsn lsn);

 private:
  void wake();
  void drain_wake();

  // ---- connections

  PgConn connect(bool replication);

  // ---- the connection's state, for /health (PostgresCdcStats::connections)

  /// The connection is lost (since the first call after it was up): `why`.
  void lost(std::string why);
  /// The connection is up (again).
  void found();
  /// While streaming: lost when no message came for the ping interval + 2 s (a keepalive answers every ping).
  void watch_stream(std::chrono::steady_clock::time_point now);

  void forget_cancels();

  /// Runs `sql` without blocking on the server: stop() ends the wait at once (also when the server process is
  /// paused and a cancel request cannot reach it), and while streaming a server that does not answer within
  /// the liveness timeout fails the stream. Returns the last result (the first error, if any).
  PgResult run(PGconn* c, const std::string& sql, std::string_view what);

  PgResult exec(PGconn* c, const std::string& sql, ExecStatusType want, std::string_view what);
  PgResult query(PGconn* c, const std::string& sql, std::string_view what);
  void command(PGconn* c, const std::string& sql, std::string_view what) { exec(c, sql, PGRES_COMMAND_OK, what); }

  /// The key columns of a table: its replica identity index under USING INDEX, else its primary key; empty
  /// when it has neither (or REPLICA IDENTITY NOTHING).
  std::vector<std::string> key_columns(PGconn* c, const std::string& relid_expr);

  // ---- the hand-over queue

  /// Hands `batch` to the task thread, waiting (with status updates) while the queue is full.
  void push(std::vector<Item>& batch);

  bool queue_empty();

  void wait_for_wake(std::chrono::milliseconds timeout, int also_fd = -1);

  // ---- the thread

  struct Stopped {};

  void run();

  /// Hands over what was decoded before the error (regardless of the capacity), then the error.
  void push_error(Error e);

  void run_inner();

  void ensure_publication(PGconn* n);

  /// The slot is held by another connection (SQLSTATE 55006): usually the previous reader's, which the server
  /// ends shortly after that reader died. Returns true while the wait may go on (kSlotBusyDeadline); warns on
  /// the first retry and every 5 s, naming the process holding the slot, and shows the wait in the metrics.
  bool slot_busy(std::string_view what, std::optional<std::chrono::steady_clock::time_point>& since,
                 std::chrono::steady_clock::time_point& next_log);
  void slot_free(std::optional<std::chrono::steady_clock::time_point>& since);
  /// "pid N" of the process holding the slot (pg_replication_slots.active_pid), for messages.
  std::string slot_holder();

  /// Drops the slot (pg_drop_replication_slot), waiting while another connection still holds it.
  void drop_slot(PGconn* n);
  /// The application_name of this source's connections: "sluice-cdc" or "sluice-cdc-replication", then " <owner>"
  /// when set, as every server version keeps it (the owner's characters other than letters, digits, '-', '_' and
  /// '.' as '_'; at most 63 bytes, a longer owner shortened with a digest of the whole).
  std::string application_name(bool replication) const;
  /// Before a fresh start drops the slot it found: fails for good when another owner's connection streams from it
  /// (another job, a tool), naming the holder; a walsender of this owner (its own earlier run) is waited for.
  void refuse_foreign_holder(PGconn* n);

  // ---- snapshot

  void snapshot(const std::string& exported, Lsn resume_lsn);

  // ---- stream

  void stream(Lsn start_lsn);

  /// Status updates (periodic, and at once when a checkpoint completed) and heartbeats.
  void maintenance();

  void command_or_tuples(PGconn* c, const std::string& sql) { query(c, sql, "emitting a heartbeat"); }

  void put_int64(char* p, uint64_t v);
  static uint64_t get_int64(const char* p);

  /// Standby Status Update: write = received, flush = apply = the last completed checkpoint's position.
  void send_status(bool reply_requested);

  void handle(std::string_view msg, std::vector<Item>& batch);

  /// A change that cannot be decoded: fail (default) or a dead letter.
  void bad_record(const std::string& table, Lsn lsn, int64_t xid, const std::string& reason, const std::string& raw,
                  bool raw_is_message = false);

  const detail::PostgresCdcSettings s_;
  PostgresCdcSplit split_;
  SourceReaderContext& ctx_;
  std::shared_ptr<detail::PostgresCdcStats> stats_;
  std::shared_ptr<DeadLetterFile> dead_letter_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;
  std::mutex cancel_mu_;
  std::vector<PGcancel*> cancels_;

  std::mutex mu_;
  std::deque<Item> queue_;
  std::vector<Item> pending_;  // fetcher thread: decoded, not yet handed over
  std::atomic<Lsn> confirm_{0};

  // Fetcher thread only.
  PgConn normal_, repl_;
  std::string database_;
  std::string last_sqlstate_;
  int64_t status_interval_ms_ = 10'000;
  int64_t liveness_ms_ = 70'000;
  std::string liveness_origin_;
  int64_t ping_interval_ms_ = 1000;
  std::chrono::steady_clock::time_point last_rx_, next_ping_;
  std::unique_ptr<postgres::PgOutputDecoder> decoder_;
  bool streaming_ = false;
  // The connection's state as last reported (lost(), found(), watch_stream(); fetcher thread).
  const int subtask_ = ctx_.subtask_index();
  bool lost_ = false;
  bool reported_ = false;
  int64_t lost_since_ = 0;  // steady ms
  Lsn received_ = 0, sent_flush_ = 0, skip_before_ = 0, overlap_until_ = 0;
  // The restored checkpoint's partly emitted transaction (0 = none, or already passed) and its emitted events.
  Lsn resume_txn_lsn_ = 0;
  int64_t resume_txn_events_ = 0;
  // The current transaction's commit LSN, and how many of its next events to drop (emitted before the restore).
  Lsn txn_final_lsn_ = 0;
  int64_t txn_skip_events_ = 0;
  bool in_txn_ = false, skipping_ = false, overlap_ = false;
  uint32_t xid_ = 0;
  int64_t commit_ts_ms_ = 0;
  std::string txn_position_;
  std::chrono::steady_clock::time_point next_status_, next_heartbeat_;
};

}  // namespace postgres_cdc_internal
}  // namespace sluice
