#include "sluice/connectors/postgres/postgres_cdc_source.h"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "libpq_handles.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/redact.h"

namespace sluice {

using postgres::format_lsn;
using postgres::Lsn;

namespace {

constexpr const char* kRole = "Postgres CDC source";
constexpr const char* kHeartbeatPrefix = "sluice-heartbeat";
// Items the fetcher hands over in one lock acquisition.
constexpr size_t kPushBatch = 256;
// Items the task takes per poll_next.
constexpr size_t kPollBatch = 1024;
// How long START_REPLICATION is retried while the slot is still held by a previous (failed) reader.
constexpr auto kSlotBusyDeadline = std::chrono::seconds(30);
// GUCs every connection sets so that values print in the forms pgoutput.cc parses.
constexpr const char* kSessionOptions =
    "-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3 -c IntervalStyle=postgres";

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string base64(std::string_view in) {
  static constexpr char kTable[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v =
        (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) | static_cast<uint8_t>(in[i + 2]);
    out.push_back(kTable[(v >> 18) & 63]);
    out.push_back(kTable[(v >> 12) & 63]);
    out.push_back(kTable[(v >> 6) & 63]);
    out.push_back(kTable[v & 63]);
  }
  if (i < in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    out.push_back(kTable[(v >> 18) & 63]);
    out.push_back(kTable[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kTable[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

[[noreturn]] void fail(std::string message) {
  throw SluiceException(Error(ErrorCode::kConnector, std::move(message)));
}

/// Fails with an error that no restart can cure (core/non_recoverable.h): the job fails at once with `reason`
/// instead of restarting from the same checkpoint into the same failure for ever.
[[noreturn]] void fail_for_good(std::string message, std::string_view reason) {
  throw SluiceException(mark_non_recoverable(Error(ErrorCode::kConnector, std::move(message)), reason));
}

/// Why a failed statement can never succeed on a retry, from its SQLSTATE and message: bad credentials (class
/// 28), a missing privilege (42501), a database that does not exist (3D000), text that is not UTF-8 (22021), a
/// server without logical decoding
/// (wal_level below logical: a server restart by its administrator). Empty for anything else (a connection
/// lost, a timeout, a conflict): those may pass.
std::string non_recoverable_sqlstate(std::string_view sqlstate, std::string_view message) {
  if (sqlstate.substr(0, 2) == "28") return "the server refused the credentials";
  if (sqlstate == "42501") return "the role lacks a privilege the source needs";
  if (sqlstate == "3D000") return "the database does not exist";
  // character_not_in_repertoire: stored bytes that are not valid in UTF-8 (a SQL_ASCII database); the same rows or
  // WAL records are met again after any restart.
  if (sqlstate == "22021") return "the database holds text that is not valid UTF-8";
  if (sqlstate == "55000" && message.find("wal_level") != std::string_view::npos) {
    return "the server's wal_level is not logical (a server setting; changing it needs a server restart)";
  }
  return "";
}

/// Why a failed connection attempt can never succeed on a retry, from libpq's message (a failed connection has no
/// SQLSTATE in libpq's API; the server's messages are English unless its lc_messages says otherwise): a refused
/// password, no pg_hba.conf entry for this client, a role or database that does not exist. Empty for anything
/// else (connection refused, a timeout, the server starting up or shutting down): those may pass.
std::string non_recoverable_connect(std::string_view message) {
  for (std::string_view m : {"password authentication failed", "no pg_hba.conf entry", "no password supplied",
                             "authentication failed for user"}) {
    if (message.find(m) != std::string_view::npos) return "the server refused the credentials";
  }
  if (message.find("role \"") != std::string_view::npos && message.find("does not exist") != std::string_view::npos) {
    return "the role does not exist";
  }
  if (message.find("database \"") != std::string_view::npos &&
      message.find("does not exist") != std::string_view::npos) {
    return "the database does not exist";
  }
  return "";
}

using postgres::PgConn;
using postgres::PgResult;

// libpq's message, with any password it echoes from the connection string (a malformed URI is quoted whole).
std::string conn_error(PGconn* c) {
  std::string e = redact_secrets(PQerrorMessage(c));
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

// A result's message without libpq's trailing newline (it would split the log line that quotes it).
std::string result_error(const PGresult* r) {
  std::string e = PQresultErrorMessage(r);
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

std::string quote_ident(PGconn* c, std::string_view s) {
  char* q = PQescapeIdentifier(c, s.data(), s.size());
  if (q == nullptr) fail(fmt::format("{}: cannot quote identifier {}: {}", kRole, s, conn_error(c)));
  std::string out(q);
  PQfreemem(q);
  return out;
}

std::string quote_literal(PGconn* c, std::string_view s) {
  char* q = PQescapeLiteral(c, s.data(), s.size());
  if (q == nullptr) fail(fmt::format("{}: cannot quote literal: {}", kRole, conn_error(c)));
  std::string out(q);
  PQfreemem(q);
  return out;
}

/// "schema.table" -> ("schema", "table"); "table" -> ("public", "table").
std::pair<std::string, std::string> split_table(const std::string& t) {
  const size_t dot = t.find('.');
  if (dot == std::string::npos) return {"public", t};
  return {t.substr(0, dot), t.substr(dot + 1)};
}

/// The in-memory hand-over between the fetcher thread and the task thread.
struct Item {
  enum class Kind : uint8_t { kEvent, kCommit, kHeartbeat, kSnapshotDone, kError };
  Kind kind = Kind::kEvent;
  cdc::ChangeEvent event;
  Lsn lsn = 0;        // kCommit: end LSN; kHeartbeat: message LSN; kSnapshotDone: the stream's start;
                      // kEvent: the commit LSN of its transaction (0 for snapshot reads)
  int64_t ts_ms = 0;  // kCommit: commit time
  Lsn overlap = 0;    // kSnapshotDone: the end of the snapshot's overlap with the stream (0 = none)
  std::optional<Error> error;
};

// -----------------------------------------------------------------------------------------------------------
// The fetcher: all libpq I/O of one reader, on its own thread.

class Fetcher {
 public:
  Fetcher(const detail::PostgresCdcSettings& settings, PostgresCdcSplit split, SourceReaderContext& ctx,
          std::shared_ptr<detail::PostgresCdcStats> stats, std::shared_ptr<DeadLetterFile> dead_letter)
      : s_(settings),
        split_(std::move(split)),
        ctx_(ctx),
        stats_(std::move(stats)),
        dead_letter_(std::move(dead_letter)) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) fail(fmt::format("{}: eventfd: {}", kRole, std::strerror(errno)));
  }
  ~Fetcher() {
    stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  /// Stops the thread (cancels a running query) and waits for it. Idempotent. Task thread.
  void stop() {
    stop_.store(true);
    wake();
    {
      std::lock_guard lock(cancel_mu_);
      char err[256];
      for (PGcancel* c : cancels_)
        PQcancel(c, err, sizeof err);
    }
    if (thread_.joinable()) thread_.join();
  }

  /// Moves up to `max` items into `out`. Task thread.
  void take(std::vector<Item>& out, size_t max) {
    bool was_full = false;
    {
      std::lock_guard lock(mu_);
      was_full = queue_.size() >= s_.queue_capacity;
      const size_t n = std::min(max, queue_.size());
      for (size_t i = 0; i < n; ++i) {
        out.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (was_full) wake();
  }

  /// Reports `lsn` as the slot's flush position at the next chance (soon). Task thread.
  void confirm(Lsn lsn) {
    Lsn cur = confirm_.load();
    while (lsn > cur && !confirm_.compare_exchange_weak(cur, lsn)) {
    }
    wake();
  }

 private:
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }
  void drain_wake() {
    uint64_t v;
    while (::read(wake_fd_, &v, sizeof v) > 0) {
    }
  }

  // ---- connections

  PgConn connect(bool replication) {
    // TCP keepalives first, so that the same keys in `conninfo` (expanded in place of dbname) override them: a
    // peer that vanished (a network partition, a host gone) breaks the socket within about 25 s even while
    // nothing is sent. A paused server process still has its kernel answer the probes: the stream's liveness
    // timeout covers that.
    // client_encoding after dbname, so that the conninfo cannot override it: the server converts text from the
    // database's encoding (LATIN1, ...) to UTF-8, in the snapshot and in pgoutput's stream alike, instead of sending
    // bytes that are not UTF-8.
    const char* keys[] = {"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "dbname",
                          "options",    "client_encoding", "application_name",    "connect_timeout",  "replication",
                          nullptr};
    const char* vals[] = {"1",
                          "10",
                          "5",
                          "3",
                          s_.conninfo.c_str(),
                          kSessionOptions,
                          "UTF8",
                          replication ? "sluice-cdc-replication" : "sluice-cdc",
                          "10",
                          replication ? "database" : nullptr,
                          nullptr};
    if (!replication) keys[9] = nullptr;
    PgConn c(PQconnectdbParams(keys, vals, 1));
    if (!c || PQstatus(c.get()) != CONNECTION_OK) {
      const std::string why = c ? conn_error(c.get()) : "out of memory";
      lost(fmt::format("cannot connect{}: {}", replication ? " for replication" : "", why));
      std::string message = fmt::format("{} (slot {}): cannot connect{}: {}", kRole, s_.slot_name,
                                        replication ? " for replication" : "", why);
      if (std::string reason = non_recoverable_connect(why); !reason.empty()) {
        fail_for_good(std::move(message), std::move(reason));
      }
      fail(std::move(message));
    }
    // Not yet streaming: connected as far as anyone can tell (the stream's silence is watched once it runs).
    if (!streaming_) found();
    std::lock_guard lock(cancel_mu_);
    cancels_.push_back(PQgetCancel(c.get()));
    return c;
  }

  // ---- the connection's state, for /health (PostgresCdcStats::connections)

  /// The connection is lost (since the first call after it was up): `why`.
  void lost(std::string why) {
    const int64_t now = SourceConnectionBoard::steady_now_ms();
    stats_->connections->set_disconnected(subtask_, lost_ ? lost_since_ : now, std::move(why));
    if (!lost_) lost_since_ = now;
    lost_ = true;
  }
  /// The connection is up (again).
  void found() {
    if (lost_ || !reported_) stats_->connections->set_connected(subtask_, SourceConnectionBoard::steady_now_ms());
    lost_ = false;
    reported_ = true;
  }
  /// While streaming: lost when no message came for the ping interval + 2 s (a keepalive answers every ping).
  void watch_stream(std::chrono::steady_clock::time_point now) {
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_rx_);
    if (silent.count() > ping_interval_ms_ + 2000) {
      if (!lost_) {
        lost_since_ = SourceConnectionBoard::steady_now_ms() - silent.count();
        lost_ = true;
        reported_ = true;
        stats_->connections->set_disconnected(
            subtask_, lost_since_,
            fmt::format("no message on the replication connection of slot {} (the server is paused, hung or "
                        "unreachable; liveness timeout {} ms)",
                        s_.slot_name, liveness_ms_));
      }
    } else if (lost_) {
      found();
    }
  }

  void forget_cancels() {
    std::lock_guard lock(cancel_mu_);
    for (PGcancel* c : cancels_)
      PQfreeCancel(c);
    cancels_.clear();
  }

  /// Runs `sql` without blocking on the server: stop() ends the wait at once (also when the server process is
  /// paused and a cancel request cannot reach it), and while streaming a server that does not answer within
  /// the liveness timeout fails the stream. Returns the last result (the first error, if any).
  PgResult run(PGconn* c, const std::string& sql, std::string_view what) {
    if (PQsendQuery(c, sql.c_str()) == 0) {
      if (stop_.load()) throw Stopped{};
      fail(fmt::format("{} (slot {}): {} failed: {} [{}]", kRole, s_.slot_name, what, conn_error(c), sql));
    }
    const auto start = std::chrono::steady_clock::now();
    const int sock = PQsocket(c);
    PgResult out;
    for (;;) {
      while (PQisBusy(c) != 0) {
        if (stop_.load()) throw Stopped{};
        const auto waited = std::chrono::steady_clock::now() - start;
        if (streaming_ && waited > std::chrono::milliseconds(liveness_ms_)) {
          fail(
              fmt::format("{} (slot {}): {}: the server did not answer within {} ms (liveness timeout{}): the "
                          "server is hung or unreachable",
                          kRole, s_.slot_name, what, liveness_ms_, liveness_origin_));
        }
        wait_for_wake(std::chrono::milliseconds(200), sock);
        if (PQconsumeInput(c) == 0) break;  // the error comes as a result, or as the connection's message
      }
      PGresult* r = PQgetResult(c);
      if (r == nullptr) break;
      const ExecStatusType st = PQresultStatus(r);
      const bool failed = st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE;
      if (!out || (failed && PQresultStatus(out.get()) != PGRES_FATAL_ERROR)) {
        out = PgResult(r);
      } else {
        PQclear(r);
      }
      if (PQstatus(c) == CONNECTION_BAD) break;
    }
    return out;
  }

  PgResult exec(PGconn* c, const std::string& sql, ExecStatusType want, std::string_view what) {
    PgResult r = run(c, sql, what);
    if (!r || PQresultStatus(r.get()) != want) {
      if (stop_.load()) throw Stopped{};
      const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      last_sqlstate_ = state != nullptr ? state : "";
      const std::string why = r ? result_error(r.get()) : conn_error(c);
      std::string message = fmt::format("{} (slot {}): {} failed: {} [{}]", kRole, s_.slot_name, what, why, sql);
      if (std::string reason = non_recoverable_sqlstate(last_sqlstate_, why); !reason.empty()) {
        fail_for_good(std::move(message), std::move(reason));
      }
      fail(std::move(message));
    }
    return r;
  }
  PgResult query(PGconn* c, const std::string& sql, std::string_view what) {
    return exec(c, sql, PGRES_TUPLES_OK, what);
  }
  void command(PGconn* c, const std::string& sql, std::string_view what) { exec(c, sql, PGRES_COMMAND_OK, what); }

  /// The key columns of a table: its replica identity index under USING INDEX, else its primary key; empty
  /// when it has neither (or REPLICA IDENTITY NOTHING).
  std::vector<std::string> key_columns(PGconn* c, const std::string& relid_expr) {
    PgResult r = query(c,
                       "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
                       "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                       "WHERE i.indrelid = " +
                           relid_expr +
                           " AND ((c.relreplident = 'i' AND i.indisreplident) OR "
                           "(c.relreplident IN ('d', 'f') AND i.indisprimary)) "
                           "ORDER BY array_position(i.indkey::int2[], a.attnum)",
                       "reading a table's key columns");
    std::vector<std::string> out;
    for (int i = 0; i < PQntuples(r.get()); ++i)
      out.emplace_back(PQgetvalue(r.get(), i, 0));
    return out;
  }

  // ---- the hand-over queue

  /// Hands `batch` to the task thread, waiting (with status updates) while the queue is full.
  void push(std::vector<Item>& batch) {
    if (batch.empty()) return;
    bool was_empty = false;
    for (;;) {
      if (stop_.load()) throw Stopped{};
      {
        std::lock_guard lock(mu_);
        if (queue_.size() < s_.queue_capacity) {
          was_empty = queue_.empty();
          for (auto& it : batch)
            queue_.push_back(std::move(it));
          break;
        }
      }
      wait_for_wake(std::chrono::milliseconds(200));
      // Not reading the socket: the server's silence meanwhile says nothing about its health.
      last_rx_ = std::chrono::steady_clock::now();
      if (streaming_) maintenance();
    }
    batch.clear();
    if (was_empty) ctx_.wakeup();
  }

  bool queue_empty() {
    std::lock_guard lock(mu_);
    return queue_.empty();
  }

  void wait_for_wake(std::chrono::milliseconds timeout, int also_fd = -1) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {also_fd, POLLIN, 0}};
    ::poll(fds, also_fd >= 0 ? 2 : 1, static_cast<int>(std::max<int64_t>(0, timeout.count())));
    if (fds[0].revents & POLLIN) drain_wake();
  }

  // ---- the thread

  struct Stopped {};

  void run() {
    try {
      run_inner();
    } catch (const Stopped&) {
    } catch (const SluiceException& e) {
      push_error(e.error());
    } catch (const std::exception& e) {
      push_error(Error(ErrorCode::kConnector, fmt::format("{} (slot {}): {}", kRole, s_.slot_name, e.what())));
    }
    forget_cancels();
    repl_.reset();
    normal_.reset();
    stats_->streaming_subtask.store(-1);
  }

  /// Hands over what was decoded before the error (regardless of the capacity), then the error.
  void push_error(Error e) {
    {
      std::lock_guard lock(mu_);
      for (auto& p : pending_)
        queue_.push_back(std::move(p));
      pending_.clear();
      Item it;
      it.kind = Item::Kind::kError;
      it.error = std::move(e);
      queue_.push_back(std::move(it));
    }
    ctx_.wakeup();
  }

  void run_inner() {
    normal_ = connect(false);
    PGconn* n = normal_.get();
    {
      PgResult r = query(n,
                         "SELECT current_database(), setting::bigint FROM pg_settings WHERE name = "
                         "'wal_sender_timeout'",
                         "reading the database name");
      database_ = PQgetvalue(r.get(), 0, 0);
      const int64_t timeout_ms = std::strtoll(PQgetvalue(r.get(), 0, 1), nullptr, 10);
      status_interval_ms_ = s_.status_interval_ms;
      if (timeout_ms > 0) status_interval_ms_ = std::min<int64_t>(status_interval_ms_, timeout_ms / 2);
      status_interval_ms_ = std::max<int64_t>(status_interval_ms_, 100);
      if (s_.liveness_timeout_ms > 0) {
        liveness_ms_ = s_.liveness_timeout_ms;
        liveness_origin_ = "";
      } else {
        // The server drops a silent client after wal_sender_timeout; the client gives the server as long, plus
        // a margin for a busy machine.
        liveness_ms_ = (timeout_ms > 0 ? timeout_ms : 60'000) + 10'000;
        liveness_origin_ = fmt::format(", wal_sender_timeout {} ms + 10 s", timeout_ms);
      }
      ping_interval_ms_ = std::clamp<int64_t>(liveness_ms_ / 4, 50, 1000);
      stats_->ping_interval_ms.store(ping_interval_ms_);
    }
    ensure_publication(n);

    // The slot as it is now.
    bool slot_exists = false;
    Lsn slot_confirmed = 0;
    {
      PgResult r = query(n,
                         "SELECT coalesce(confirmed_flush_lsn::text, ''), plugin, database FROM "
                         "pg_replication_slots WHERE slot_name = " +
                             quote_literal(n, s_.slot_name),
                         "reading the replication slot");
      if (PQntuples(r.get()) > 0) {
        slot_exists = true;
        const std::string plugin = PQgetvalue(r.get(), 0, 1);
        const std::string db = PQgetisnull(r.get(), 0, 2) ? "" : PQgetvalue(r.get(), 0, 2);
        if (plugin != "pgoutput" || db != database_) {
          fail_for_good(
              fmt::format("{}: slot {} exists but is not a logical pgoutput slot of database {} (plugin '{}', "
                          "database '{}'): choose another slot_name or drop it",
                          kRole, s_.slot_name, database_, plugin, db),
              "the replication slot belongs to another plugin or database");
        }
        if (auto l = postgres::parse_lsn(PQgetvalue(r.get(), 0, 0)); l) slot_confirmed = *l;
      }
    }
    const Lsn restored = static_cast<Lsn>(split_.lsn);
    if (slot_exists && s_.create_slot && !split_.snapshot_done && split_.snapshot_events == 0 && restored == 0) {
      // Nothing of this split was emitted before the state it starts from (a fresh start, or a checkpoint taken
      // before the snapshot's first row, e.g. while the crashed run was creating this slot): nothing read
      // through the slot can be committed downstream. A snapshot that the slot did not export would overlap
      // the stream from the slot's older position (its changes delivered again); a new slot exports the
      // snapshot the stream starts from exactly.
      spdlog::info(
          "{}: slot {} exists but nothing has been emitted from it yet (confirmed at {}): dropping and "
          "re-creating it, so that the initial snapshot is the one the slot exports and nothing repeats",
          kRole, s_.slot_name, format_lsn(slot_confirmed));
      drop_slot(n);
      slot_exists = false;
      slot_confirmed = 0;
    }
    if (restored != 0) {
      if (!slot_exists) {
        fail_for_good(
            fmt::format("{}: the checkpoint resumes slot {} at LSN {}, but the slot no longer exists: the changes "
                        "since then are lost. Remedy: start the job without its state (a new snapshot)",
                        kRole, s_.slot_name, format_lsn(restored)),
            "the checkpoint's replication slot is gone, and with it the changes since the checkpoint");
      }
      if (slot_confirmed > restored) {
        fail_for_good(
            fmt::format("{}: the checkpoint resumes slot {} at LSN {}, but the slot has already confirmed LSN {} "
                        "(restoring an older checkpoint or savepoint?): the changes in between are no longer "
                        "available. Remedy: restore the latest checkpoint, or start without state (a new "
                        "snapshot)",
                        kRole, s_.slot_name, format_lsn(restored), format_lsn(slot_confirmed)),
            "the replication slot has confirmed past the checkpoint: the changes in between are gone");
      }
    }
    if (!slot_exists && !s_.create_slot) {
      fail_for_good(fmt::format("{}: replication slot {} does not exist and create_slot is off. Remedy: SELECT "
                                "pg_create_logical_replication_slot('{}', 'pgoutput'), or turn create_slot on",
                                kRole, s_.slot_name, s_.slot_name),
                    "the replication slot does not exist and the source may not create it (create_slot off)");
    }

    repl_ = connect(true);
    PGconn* rc = repl_.get();
    // An existing slot without a restored position streams from where it has confirmed (what 0/0 would mean
    // to START_REPLICATION too; explicit, so that the log says where).
    Lsn start_lsn = restored != 0 ? restored : slot_confirmed;
    std::string exported;
    if (!slot_exists) {
      const bool want_snapshot = !split_.snapshot_done;
      PgResult r = query(rc,
                         "CREATE_REPLICATION_SLOT " + quote_ident(rc, s_.slot_name) + " LOGICAL pgoutput " +
                             (want_snapshot ? "EXPORT_SNAPSHOT" : "NOEXPORT_SNAPSHOT"),
                         "creating the replication slot");
      auto cp = postgres::parse_lsn(PQgetvalue(r.get(), 0, 1));
      if (!cp) fail(fmt::format("{}: CREATE_REPLICATION_SLOT returned a bad LSN", kRole));
      start_lsn = *cp;
      if (want_snapshot) exported = PQgetvalue(r.get(), 0, 2);
      spdlog::info("{}: created replication slot {} at {}", kRole, s_.slot_name, format_lsn(*cp));
      SLUICE_FAULT_POINT("postgres.after-create-slot");
    }

    if (!split_.snapshot_done && split_.snapshot_events > 0) {
      // The checkpoint was taken in the middle of the snapshot: its rows emitted before it may be committed
      // downstream. The snapshot cannot go on where it stopped (its exported snapshot ended with the
      // connection that made the slot), and reading it again delivers those rows twice.
      if (s_.interrupted_snapshot == PostgresInterruptedSnapshot::kFail) {
        fail_for_good(
            fmt::format(
                "{}: the checkpoint was taken during the initial snapshot of slot {}, after {} of its rows were "
                "emitted (an exactly-once sink has committed them); the snapshot cannot resume where it stopped, and "
                "reading it again would deliver those rows twice. Remedy: start the job without its state and drop "
                "the slot (SELECT pg_drop_replication_slot('{}')) for a new snapshot, or accept the repeated rows with "
                "on_interrupted_snapshot(kRepeat) (pipelines: snapshot-resume: repeat)",
                kRole, s_.slot_name, split_.snapshot_events, s_.slot_name),
            "the checkpoint was taken during the initial snapshot, which cannot resume exactly where it stopped "
            "(snapshot-resume: fail)");
      }
      spdlog::warn(
          "{}: slot {}: the checkpoint was taken during the initial snapshot after {} of its rows were emitted; "
          "reading the snapshot again from its start (those rows are delivered again: at-least-once)",
          kRole, s_.slot_name, split_.snapshot_events);
    }
    if (!split_.snapshot_done) {
      // Exported: exactly consistent with the slot. Otherwise the stream from the slot's position overlaps.
      snapshot(exported, exported.empty() ? (start_lsn != 0 ? start_lsn : slot_confirmed) : start_lsn);
    }
    // A restore after the snapshot: its overlap with the stream, if any, is still marked.
    if (split_.snapshot_done) overlap_until_ = static_cast<Lsn>(split_.overlap_lsn);
    skip_before_ = restored;
    resume_txn_lsn_ = static_cast<Lsn>(split_.txn_lsn);
    resume_txn_events_ = split_.txn_events;
    if (resume_txn_lsn_ != 0) {
      spdlog::info("{}: slot {} resumes inside the transaction committed at {}: its first {} events were emitted",
                   kRole, s_.slot_name, format_lsn(resume_txn_lsn_), resume_txn_events_);
    }
    stream(start_lsn);
  }

  void ensure_publication(PGconn* n) {
    PgResult r = query(n, "SELECT 1 FROM pg_publication WHERE pubname = " + quote_literal(n, s_.publication_name),
                       "reading the publication");
    if (PQntuples(r.get()) > 0) return;
    if (!s_.create_publication) {
      fail_for_good(fmt::format("{}: publication {} does not exist and create_publication is off. Remedy: CREATE "
                                "PUBLICATION {} FOR TABLE ...",
                                kRole, s_.publication_name, s_.publication_name),
                    "the publication does not exist and the source may not create it (create_publication off)");
    }
    std::string sql = "CREATE PUBLICATION " + quote_ident(n, s_.publication_name);
    if (s_.tables.empty()) {
      sql += " FOR ALL TABLES";
    } else {
      sql += " FOR TABLE ";
      for (size_t i = 0; i < s_.tables.size(); ++i) {
        auto [schema, table] = split_table(s_.tables[i]);
        sql += (i > 0 ? ", " : "") + quote_ident(n, schema) + "." + quote_ident(n, table);
      }
    }
    try {
      command(n, sql, "creating the publication");
    } catch (const SluiceException&) {
      if (last_sqlstate_ != "42710") throw;  // duplicate_object: another reader created it meanwhile
    }
  }

  /// The slot is held by another connection (SQLSTATE 55006): usually the previous reader's, which the server
  /// ends shortly after that reader died. Returns true while the wait may go on (kSlotBusyDeadline); warns on
  /// the first retry and every 5 s, naming the process holding the slot, and shows the wait in the metrics.
  bool slot_busy(std::string_view what, std::optional<std::chrono::steady_clock::time_point>& since,
                 std::chrono::steady_clock::time_point& next_log) {
    const auto now = std::chrono::steady_clock::now();
    if (!since) {
      since = now;
      stats_->slot_busy_since_ms.store(wall_ms());
    }
    if (now - *since >= kSlotBusyDeadline) return false;
    if (now >= next_log) {
      next_log = now + std::chrono::seconds(5);
      spdlog::warn("{}: slot {} is in use by another connection ({}): {} is retried for up to {} s ({} s so far)",
                   kRole, s_.slot_name, slot_holder(), what, kSlotBusyDeadline.count(),
                   std::chrono::duration_cast<std::chrono::seconds>(now - *since).count());
    }
    return true;
  }
  void slot_free(std::optional<std::chrono::steady_clock::time_point>& since) {
    if (!since) return;
    spdlog::info(
        "{}: slot {} is free after {} ms", kRole, s_.slot_name,
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - *since).count());
    since.reset();
    stats_->slot_busy_since_ms.store(-1);
  }
  /// "pid N" of the process holding the slot (pg_replication_slots.active_pid), for messages.
  std::string slot_holder() {
    try {
      PgResult r = query(normal_.get(),
                         "SELECT coalesce(active_pid::text, 'none') FROM pg_replication_slots WHERE slot_name = " +
                             quote_literal(normal_.get(), s_.slot_name),
                         "reading the slot's active_pid");
      if (PQntuples(r.get()) == 0) return "the slot is gone";
      return std::string("held by pid ") + PQgetvalue(r.get(), 0, 0);
    } catch (const SluiceException& e) {
      return "holder unknown: " + e.error().message();
    }
  }

  /// Drops the slot (pg_drop_replication_slot), waiting while another connection still holds it.
  void drop_slot(PGconn* n) {
    const std::string sql = "SELECT pg_drop_replication_slot(" + quote_literal(n, s_.slot_name) + ")";
    std::optional<std::chrono::steady_clock::time_point> busy_since;
    std::chrono::steady_clock::time_point next_busy_log{};
    for (;;) {
      PgResult r = run(n, sql, "dropping the replication slot");
      if (r && PQresultStatus(r.get()) == PGRES_TUPLES_OK) break;
      if (stop_.load()) throw Stopped{};
      const char* st = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      const std::string_view state = st != nullptr ? st : "";
      if (state == "42704") break;  // undefined_object: gone meanwhile
      if (state == "55006" && slot_busy("dropping it", busy_since, next_busy_log)) {
        wait_for_wake(std::chrono::milliseconds(200));
        continue;
      }
      fail(fmt::format("{} (slot {}): dropping the replication slot failed: {}{}", kRole, s_.slot_name,
                       r ? result_error(r.get()) : conn_error(n),
                       busy_since
                           ? fmt::format(" ({}, after {} s of waiting)", slot_holder(), kSlotBusyDeadline.count())
                           : std::string()));
    }
    slot_free(busy_since);
  }

  // ---- snapshot

  void snapshot(const std::string& exported, Lsn resume_lsn) {
    PgConn sc = connect(false);
    PGconn* c = sc.get();
    const int64_t started_ms = wall_ms();
    command(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "starting the snapshot transaction");
    if (!exported.empty()) {
      command(c, "SET TRANSACTION SNAPSHOT " + quote_literal(c, exported), "importing the slot's snapshot");
    } else {
      // The first statement takes the transaction's snapshot, then reads the WAL *insert* position: every
      // transaction the snapshot sees has its commit record before it. (pg_current_wal_lsn() is the write
      // position, which can trail recent commits under synchronous_commit = off: their changes would then be
      // in the snapshot and again, unmarked, in the stream.)
      PgResult r = query(c, "SELECT pg_current_wal_insert_lsn()::text", "reading the snapshot's LSN");
      if (auto l = postgres::parse_lsn(PQgetvalue(r.get(), 0, 0)); l) overlap_until_ = *l;
      spdlog::warn(
          "{}: slot {} already existed: the snapshot is not exported by the slot, changes up to {} may "
          "be delivered again after it (marked source.snapshot = true)",
          kRole, s_.slot_name, format_lsn(overlap_until_));
    }
    PgResult tables = query(c,
                            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = " +
                                quote_literal(c, s_.publication_name) + " ORDER BY 1, 2",
                            "listing the publication's tables");
    const std::string position = format_lsn(resume_lsn);
    std::vector<Item>& batch = pending_;
    int64_t total = 0;
    for (int t = 0; t < PQntuples(tables.get()); ++t) {
      const std::string schema = PQgetvalue(tables.get(), t, 0), table = PQgetvalue(tables.get(), t, 1);
      const std::string qualified = schema + "." + table;
      const std::string ident = quote_ident(c, schema) + "." + quote_ident(c, table);
      const std::vector<std::string> keys = key_columns(c, quote_literal(c, ident) + "::regclass");
      command(c, "DECLARE sluice_snapshot NO SCROLL CURSOR FOR SELECT * FROM " + ident, "opening a snapshot cursor");
      const std::string fetch = fmt::format("FETCH FORWARD {} FROM sluice_snapshot", s_.snapshot_fetch_rows);
      for (;;) {
        PgResult rows = query(c, fetch, "reading table " + qualified);
        const int nrows = PQntuples(rows.get());
        if (nrows == 0) break;
        const int ncols = PQnfields(rows.get());
        for (int i = 0; i < nrows; ++i) {
          Value row = Value::object();
          row.as_object().reserve(static_cast<size_t>(ncols));
          std::optional<Error> err;
          for (int k = 0; k < ncols; ++k) {
            if (PQgetisnull(rows.get(), i, k)) {
              row.set(PQfname(rows.get(), k), Value());
              continue;
            }
            auto v = postgres::decode_text_value(
                PQftype(rows.get(), k),
                std::string_view(PQgetvalue(rows.get(), i, k), static_cast<size_t>(PQgetlength(rows.get(), i, k))));
            if (!v) {
              if (!err) {
                err = Error(v.error().code(), fmt::format("column {} (type oid {}): {}", PQfname(rows.get(), k),
                                                          PQftype(rows.get(), k), v.error().message()));
              }
              continue;
            }
            row.set(PQfname(rows.get(), k), std::move(*v));
          }
          if (err) {
            bad_record(qualified, resume_lsn, -1, fmt::format("snapshot of table {}: {}", qualified, err->message()),
                       row.to_json());
            continue;
          }
          Item it;
          it.kind = Item::Kind::kEvent;
          cdc::ChangeEvent& e = it.event;
          e.op = cdc::ChangeOp::kRead;
          if (keys.empty()) {
            e.key = row;
          } else {
            e.key = Value::object();
            for (const auto& kc : keys) {
              const Value* kv = row.find(kc);
              e.key.set(kc, kv != nullptr ? *kv : Value());
            }
          }
          e.after = std::move(row);
          e.source = cdc::SourceInfo{"postgres", database_, qualified, position, started_ms, true, -1};
          batch.push_back(std::move(it));
          if (batch.size() >= kPushBatch) {
            push(batch);
            SLUICE_FAULT_POINT("postgres.snapshot-push");
          }
        }
        total += nrows;
      }
      command(c, "CLOSE sluice_snapshot", "closing a snapshot cursor");
    }
    command(c, "COMMIT", "ending the snapshot transaction");
    Item done;
    done.kind = Item::Kind::kSnapshotDone;
    done.lsn = resume_lsn;
    done.overlap = overlap_until_;
    batch.push_back(std::move(done));
    push(batch);
    spdlog::info("{}: snapshot of slot {} read {} rows from {} tables in {} ms", kRole, s_.slot_name, total,
                 PQntuples(tables.get()), wall_ms() - started_ms);
  }

  // ---- stream

  void stream(Lsn start_lsn) {
    PGconn* rc = repl_.get();
    const std::string sql = fmt::format(
        "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}, messages 'true')",
        quote_ident(rc, s_.slot_name), format_lsn(start_lsn), quote_literal(rc, quote_ident(rc, s_.publication_name)));
    std::optional<std::chrono::steady_clock::time_point> busy_since;
    std::chrono::steady_clock::time_point next_busy_log{};
    for (;;) {
      PgResult r(PQexec(rc, sql.c_str()));
      if (r && PQresultStatus(r.get()) == PGRES_COPY_BOTH) break;
      if (stop_.load()) throw Stopped{};
      const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      // 55006 object_in_use: a previous reader's connection still holds the slot (it ends shortly).
      if (state != nullptr && std::string_view(state) == "55006" &&
          slot_busy("START_REPLICATION", busy_since, next_busy_log)) {
        wait_for_wake(std::chrono::milliseconds(200));
        continue;
      }
      fail(fmt::format("{} (slot {}): START_REPLICATION at {} failed: {}{}", kRole, s_.slot_name, format_lsn(start_lsn),
                       r ? result_error(r.get()) : conn_error(rc),
                       busy_since ? fmt::format(" (after {} s of waiting for the slot)", kSlotBusyDeadline.count())
                                  : std::string()));
    }
    slot_free(busy_since);
    spdlog::info("{}: streaming slot {} from {}", kRole, s_.slot_name, format_lsn(start_lsn));
    streaming_ = true;
    found();
    stats_->streaming_subtask.store(subtask_);
    received_ = start_lsn;
    decoder_ = std::make_unique<postgres::PgOutputDecoder>(
        [this](const postgres::PgRelation& rel) -> Result<std::vector<std::string>> {
          return key_columns(normal_.get(), std::to_string(rel.oid) + "::oid");
        });
    const int sock = PQsocket(rc);
    next_status_ = std::chrono::steady_clock::now();
    next_heartbeat_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(s_.heartbeat_interval_ms);
    last_rx_ = std::chrono::steady_clock::now();
    next_ping_ = last_rx_ + std::chrono::milliseconds(ping_interval_ms_);
    std::vector<Item>& batch = pending_;
    for (;;) {
      if (stop_.load()) return;
      maintenance();
      if (PQconsumeInput(rc) == 0) {
        lost(fmt::format("the replication connection failed: {}", conn_error(rc)));
        fail(fmt::format("{} (slot {}): the replication connection failed after {}: {}", kRole, s_.slot_name,
                         format_lsn(received_), conn_error(rc)));
      }
      for (;;) {
        char* buf = nullptr;
        const int n = PQgetCopyData(rc, &buf, 1);
        if (n == 0) break;
        if (n > 0) last_rx_ = std::chrono::steady_clock::now();
        if (n == -1) {
          PgResult r(PQgetResult(rc));
          const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
          const std::string why = r ? result_error(r.get()) : "no reason given";
          std::string message = fmt::format("{} (slot {}): the server ended the replication stream after {}: {}", kRole,
                                            s_.slot_name, format_lsn(received_), why);
          lost(fmt::format("the server ended the replication stream: {}", why));
          // E.g. bytes of a SQL_ASCII database that are not UTF-8 (22021): every restart meets the same WAL record.
          if (std::string reason = non_recoverable_sqlstate(state != nullptr ? state : "", why); !reason.empty()) {
            fail_for_good(std::move(message), reason);
          }
          fail(std::move(message));
        }
        if (n < 0) {
          lost(fmt::format("reading the replication stream failed: {}", conn_error(rc)));
          fail(fmt::format("{} (slot {}): reading the replication stream after {} failed: {}", kRole, s_.slot_name,
                           format_lsn(received_), conn_error(rc)));
        }
        std::unique_ptr<char, void (*)(void*)> owned(buf, PQfreemem);
        handle(std::string_view(buf, static_cast<size_t>(n)), batch);
        if (batch.size() >= kPushBatch) push(batch);
      }
      push(batch);
      auto now = std::chrono::steady_clock::now();
      stats_->last_rx_steady_ms.store(
          std::chrono::duration_cast<std::chrono::milliseconds>(last_rx_.time_since_epoch()).count(),
          std::memory_order_relaxed);
      watch_stream(now);
      const auto silent = now - last_rx_;
      if (silent > std::chrono::milliseconds(liveness_ms_)) {
        fail(
            fmt::format("{} (slot {}): no message on the replication connection for {} ms (liveness timeout {} "
                        "ms{}) after {}: the server is hung or unreachable",
                        kRole, s_.slot_name, std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(),
                        liveness_ms_, liveness_origin_, format_lsn(received_)));
      }
      if (silent >= std::chrono::milliseconds(ping_interval_ms_) && now >= next_ping_) {
        // A quiet stream: ask for a keepalive. It proves the server alive and, arriving with nothing pending
        // here, that the reader is caught up (the lag metric).
        send_status(true);
        next_ping_ = now + std::chrono::milliseconds(ping_interval_ms_);
      }
      now = std::chrono::steady_clock::now();
      auto until = std::min({next_status_, next_ping_, last_rx_ + std::chrono::milliseconds(liveness_ms_ + 1)});
      if (s_.heartbeat_interval_ms > 0) until = std::min(until, next_heartbeat_);
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
      wait_for_wake(std::clamp(wait, std::chrono::milliseconds(0), std::chrono::milliseconds(1000)), sock);
    }
  }

  /// Status updates (periodic, and at once when a checkpoint completed) and heartbeats.
  void maintenance() {
    const auto now = std::chrono::steady_clock::now();
    const Lsn confirm = confirm_.load();
    if (confirm != sent_flush_ || now >= next_status_) send_status(false);
    if (s_.heartbeat_interval_ms > 0 && now >= next_heartbeat_) {
      next_heartbeat_ = now + std::chrono::milliseconds(s_.heartbeat_interval_ms);
      command_or_tuples(normal_.get(),
                        fmt::format("SELECT pg_logical_emit_message(false, '{}', {})", kHeartbeatPrefix,
                                    quote_literal(normal_.get(), fmt::format("{}:{}", s_.slot_name, wall_ms()))));
    }
  }

  void command_or_tuples(PGconn* c, const std::string& sql) { query(c, sql, "emitting a heartbeat"); }

  void put_int64(char* p, uint64_t v) {
    for (int i = 7; i >= 0; --i) {
      p[i] = static_cast<char>(v & 0xFF);
      v >>= 8;
    }
  }
  static uint64_t get_int64(const char* p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v = (v << 8) | static_cast<uint8_t>(p[i]);
    return v;
  }

  /// Standby Status Update: write = received, flush = apply = the last completed checkpoint's position.
  void send_status(bool reply_requested) {
    const Lsn flush = confirm_.load();
    char buf[34];
    buf[0] = 'r';
    put_int64(buf + 1, std::max(received_, flush));
    put_int64(buf + 9, flush);
    put_int64(buf + 17, flush);
    const int64_t now_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count() -
        postgres::kPostgresEpochMicros;
    put_int64(buf + 25, static_cast<uint64_t>(now_us));
    buf[33] = reply_requested ? 1 : 0;
    PGconn* rc = repl_.get();
    if (PQputCopyData(rc, buf, sizeof buf) != 1 || PQflush(rc) != 0) {
      fail(fmt::format("{} (slot {}): sending a status update failed: {}", kRole, s_.slot_name, conn_error(rc)));
    }
    if (flush != sent_flush_) {
      sent_flush_ = flush;
      stats_->confirmed_lsn.store(flush);
    }
    next_status_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(status_interval_ms_);
  }

  void handle(std::string_view msg, std::vector<Item>& batch) {
    if (msg.empty()) return;
    if (msg[0] == 'k') {
      if (msg.size() < 18) fail(fmt::format("{}: malformed keepalive ({} bytes)", kRole, msg.size()));
      const bool reply = msg[17] != 0;
      if (reply) send_status(false);
      // The server sends messages in order: a keepalive says it has sent everything before it. With nothing
      // of it left to emit here, the reader is caught up now.
      if (!in_txn_ && batch.empty() && queue_empty()) stats_->caught_up_ms.store(wall_ms());
      return;
    }
    if (msg[0] != 'w') {
      fail(fmt::format("{} (slot {}): unexpected replication message type 0x{:02x} after {}", kRole, s_.slot_name,
                       static_cast<unsigned>(static_cast<uint8_t>(msg[0])), format_lsn(received_)));
    }
    if (msg.size() < 25) fail(fmt::format("{}: malformed XLogData ({} bytes)", kRole, msg.size()));
    const Lsn data_start = get_int64(msg.data() + 1);
    received_ = std::max(received_, data_start);
    stats_->received_lsn.store(received_);
    const std::string_view payload = msg.substr(25);
    auto decoded = decoder_->decode(payload);
    if (!decoded) {
      const Error& e = decoded.error();
      if (e.code() != ErrorCode::kSerialization) {
        fail(fmt::format("{} (slot {}): at LSN {}{}: {}", kRole, s_.slot_name, format_lsn(data_start),
                         in_txn_ ? fmt::format(" (transaction {})", xid_) : "", e.message()));
      }
      if (skipping_) return;
      bad_record("", data_start, in_txn_ ? static_cast<int64_t>(xid_) : -1, e.message(), std::string(payload), true);
      return;
    }
    postgres::PgOutputMessage& m = *decoded;
    using K = postgres::PgOutputMessage::Kind;
    switch (m.kind) {
      case K::kBegin:
        in_txn_ = true;
        xid_ = m.begin.xid;
        commit_ts_ms_ = m.begin.commit_ts_us / 1000;
        txn_position_ = format_lsn(m.begin.final_lsn);
        // Restore: a transaction whose commit record starts before the checkpointed position ended at or
        // before it (end LSN <= position): it was emitted completely before the checkpoint.
        skipping_ = skip_before_ != 0 && m.begin.final_lsn < skip_before_;
        overlap_ = overlap_until_ != 0 && m.begin.final_lsn <= overlap_until_;
        txn_final_lsn_ = m.begin.final_lsn;
        txn_skip_events_ = 0;
        if (resume_txn_lsn_ != 0 && !skipping_) {
          // The checkpoint was taken inside the transaction committed at resume_txn_lsn_: its first
          // resume_txn_events_ events were emitted (and may be committed downstream) before it.
          if (m.begin.final_lsn == resume_txn_lsn_) {
            txn_skip_events_ = resume_txn_events_;
          } else if (m.begin.final_lsn > resume_txn_lsn_) {
            fail(fmt::format(
                "{} (slot {}): the checkpoint resumes inside the transaction committed at {} after {} "
                "of its events, but the stream went on to a transaction committed at {} without it: "
                "the slot no longer serves that transaction. Remedy: start the job without state (a "
                "new snapshot)",
                kRole, s_.slot_name, format_lsn(resume_txn_lsn_), resume_txn_events_, format_lsn(m.begin.final_lsn)));
          }
        }
        return;
      case K::kCommit: {
        in_txn_ = false;
        if (skipping_) {
          skipping_ = false;
          return;
        }
        if (resume_txn_lsn_ != 0 && txn_final_lsn_ == resume_txn_lsn_) {
          if (txn_skip_events_ > 0) {
            // Fewer events than the checkpoint counted: the decoding differs from the run that took it (a
            // changed publication or bad-record policy). What was emitted stays emitted; nothing is repeated.
            spdlog::warn(
                "{} (slot {}): the transaction committed at {} has {} events fewer than the checkpoint counted "
                "as emitted ({})",
                kRole, s_.slot_name, format_lsn(resume_txn_lsn_), txn_skip_events_, resume_txn_events_);
          }
          resume_txn_lsn_ = 0;
        }
        Item it;
        it.kind = Item::Kind::kCommit;
        it.lsn = m.commit.end_lsn;
        it.ts_ms = m.commit.commit_ts_us / 1000;
        batch.push_back(std::move(it));
        return;
      }
      case K::kInsert:
      case K::kUpdate:
      case K::kDelete: {
        if (skipping_) return;
        const postgres::PgRelation& rel = *m.change.relation;
        auto event = [&](cdc::ChangeOp op, Value key, Value before, Value after) {
          Item it;
          it.kind = Item::Kind::kEvent;
          it.lsn = txn_final_lsn_;
          cdc::ChangeEvent& e = it.event;
          e.op = op;
          e.key = std::move(key);
          e.before = std::move(before);
          e.after = std::move(after);
          e.source = cdc::SourceInfo{"postgres",    database_, rel.qualified_name(),      txn_position_,
                                     commit_ts_ms_, overlap_,  static_cast<int64_t>(xid_)};
          e.source.sequence = static_cast<int64_t>(data_start);
          return it;
        };
        auto emit = [&](Item it) {
          // Events of a transaction the restored checkpoint had already emitted in part.
          if (txn_skip_events_ > 0) {
            --txn_skip_events_;
            return;
          }
          batch.push_back(std::move(it));
        };
        if (m.kind == K::kUpdate && !rel.key_columns.empty() && !m.change.before.is_null()) {
          // The old key: from the old key tuple ('K', sent under DEFAULT / USING INDEX only when the key
          // changed) or the old row ('O', FULL). A changed key is a delete of the old key, then a create of the
          // new one, as Debezium emits it: keyed consumers (an upsert mirror, a compacted topic) drop the old
          // row, and the two keys may live on different partitions.
          Value old_key = Value::object();
          for (const auto& c : rel.key_columns) {
            const Value* v = m.change.before.find(c);
            old_key.set(c, v != nullptr ? *v : Value());
          }
          if (old_key != m.change.key) {
            emit(event(cdc::ChangeOp::kDelete, std::move(old_key), std::move(m.change.before), Value()));
            emit(event(cdc::ChangeOp::kCreate, std::move(m.change.key), Value(), std::move(m.change.after)));
            return;
          }
        }
        emit(event(m.change.op, std::move(m.change.key), std::move(m.change.before), std::move(m.change.after)));
        return;
      }
      case K::kTruncate: {
        if (skipping_) return;
        std::string tables;
        for (const auto& t : m.truncate.tables)
          tables += (tables.empty() ? "" : ", ") + t;
        if (s_.truncate_policy == PostgresTruncatePolicy::kFail) {
          fail(
              fmt::format("{} (slot {}): TRUNCATE of {} at LSN {} (transaction {}): the source does not turn a "
                          "truncate into events. Remedy: set truncate_policy(kSkip) to go on past it (downstream "
                          "keeps the rows), or publish without truncate (ALTER PUBLICATION {} SET (publish = "
                          "'insert, update, delete'))",
                          kRole, s_.slot_name, tables, format_lsn(data_start), xid_, s_.publication_name));
        }
        spdlog::warn("{} (slot {}): skipped TRUNCATE of {} at LSN {}", kRole, s_.slot_name, tables,
                     format_lsn(data_start));
        stats_->truncates_skipped.fetch_add(1);
        return;
      }
      case K::kMessage:
        if (!m.message.transactional && m.message.prefix == kHeartbeatPrefix && m.message.lsn > skip_before_) {
          Item it;
          it.kind = Item::Kind::kHeartbeat;
          it.lsn = m.message.lsn;
          batch.push_back(std::move(it));
        }
        return;
      case K::kRelation:
      case K::kType:
      case K::kOrigin:
        return;
    }
  }

  /// A change that cannot be decoded: fail (default) or a dead letter.
  void bad_record(const std::string& table, Lsn lsn, int64_t xid, const std::string& reason, const std::string& raw,
                  bool raw_is_message = false) {
    if (s_.bad_record_policy == BadRecordPolicy::kFail || !dead_letter_) {
      throw SluiceException(Error(
          ErrorCode::kConnector,
          fmt::format("{} (slot {}): cannot decode a change at LSN {}{}: {}. Remedy: fix the value at its source, or "
                      "run with on_bad_record(kDeadLetter, path) to divert such changes",
                      kRole, s_.slot_name, format_lsn(lsn), xid >= 0 ? fmt::format(" (transaction {})", xid) : "",
                      reason)));
    }
    Value entry = Value::object({{"source", Value("postgres")},
                                 {"slot", Value(s_.slot_name)},
                                 {"table", Value(table)},
                                 {"lsn", Value(format_lsn(lsn))},
                                 {"xid", Value(xid)},
                                 {"error", Value(reason)}});
    if (raw_is_message) {
      entry.set("record_base64", Value(base64(raw)));
    } else {
      entry.set("record", Value(raw));
    }
    dead_letter_->append(entry).value_or_throw();
    stats_->bad->bad_records.fetch_add(1);
  }

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

// -----------------------------------------------------------------------------------------------------------
// The reader: task-thread side.

class PostgresCdcReader final : public SourceReader<cdc::ChangeEvent, PostgresCdcSplit> {
 public:
  PostgresCdcReader(const detail::PostgresCdcSettings& settings, SourceReaderContext& ctx,
                    std::shared_ptr<detail::PostgresCdcStats> stats, std::shared_ptr<DeadLetterFile> dead_letter)
      : s_(settings), ctx_(ctx), stats_(std::move(stats)), dead_letter_(std::move(dead_letter)) {}
  ~PostgresCdcReader() override { close(); }

  void start() override { ctx_.send_split_request(); }

  InputStatus poll_next(ReaderOutput<cdc::ChangeEvent>& output) override {
    if (!split_) return no_more_splits_ ? InputStatus::kEndOfInput : InputStatus::kNothingAvailable;
    items_.clear();
    fetcher_->take(items_, kPollBatch);
    int64_t events = 0;
    for (Item& it : items_) {
      switch (it.kind) {
        case Item::Kind::kEvent: {
          const int64_t ts = it.event.source.ts_ms;
          if (it.lsn != 0) {
            // An event of a streamed transaction: the position now names it (commit LSN, index).
            if (it.lsn != txn_lsn_) {
              txn_lsn_ = it.lsn;
              txn_events_ = 0;
              stats_->last_commit_ts_ms.store(ts, std::memory_order_relaxed);
            }
            ++txn_events_;
          }
          if (it.event.op == cdc::ChangeOp::kRead) {
            stats_->snapshot_events.fetch_add(1, std::memory_order_relaxed);
            ++snapshot_events_;
          }
          output.collect(std::move(it.event), ts);
          ++events;
          break;
        }
        case Item::Kind::kCommit:
          position_ = std::max(position_, it.lsn);
          txn_lsn_ = 0;
          txn_events_ = 0;
          stats_->transactions.fetch_add(1, std::memory_order_relaxed);
          stats_->last_commit_ts_ms.store(it.ts_ms, std::memory_order_relaxed);
          break;
        case Item::Kind::kHeartbeat:
          position_ = std::max(position_, it.lsn);
          stats_->heartbeats.fetch_add(1, std::memory_order_relaxed);
          break;
        case Item::Kind::kSnapshotDone:
          snapshot_done_ = true;
          overlap_lsn_ = it.overlap;
          position_ = std::max(position_, it.lsn);
          stats_->snapshot_done.store(true);
          break;
        case Item::Kind::kError:
          throw SluiceException(*it.error);
      }
    }
    stats_->events.fetch_add(events, std::memory_order_relaxed);
    stats_->position.store(position_, std::memory_order_relaxed);
    update_rate(events);
    return items_.empty() ? InputStatus::kNothingAvailable : InputStatus::kMoreAvailable;
  }

  void add_splits(std::vector<PostgresCdcSplit> splits) override {
    for (auto& sp : splits) {
      if (split_) {
        spdlog::warn("{}: reader already reads slot {}; ignoring another split for slot {}", kRole, split_->slot,
                     sp.slot);
        continue;
      }
      split_ = sp;
      snapshot_done_ = sp.snapshot_done;
      overlap_lsn_ = sp.snapshot_done ? static_cast<Lsn>(sp.overlap_lsn) : 0;
      position_ = static_cast<Lsn>(sp.lsn);
      txn_lsn_ = static_cast<Lsn>(sp.txn_lsn);
      txn_events_ = sp.txn_events;
      // An unfinished snapshot is read from its start (or refused, per on_interrupted_snapshot): its rows are
      // counted from 0 again.
      snapshot_events_ = 0;
      stats_->snapshot_done.store(snapshot_done_);
      stats_->position.store(position_);
      fetcher_ = std::make_unique<Fetcher>(s_, sp, ctx_, stats_, dead_letter_);
      fetcher_->start();
    }
  }
  void notify_no_more_splits() override { no_more_splits_ = true; }

  std::vector<PostgresCdcSplit> snapshot_state(int64_t checkpoint_id) override {
    if (!split_) return {};
    if (dead_letter_) dead_letter_->sync().value_or_throw();
    // The slot is confirmed up to the last complete transaction only: a partly emitted one must be streamed
    // again after a restore (its first txn_events_ events are then skipped).
    if (snapshot_done_) pending_[checkpoint_id] = position_;
    PostgresCdcSplit sp = *split_;
    sp.snapshot_done = snapshot_done_;
    sp.lsn = static_cast<int64_t>(position_);
    sp.txn_lsn = static_cast<int64_t>(txn_lsn_);
    sp.txn_events = txn_events_;
    sp.snapshot_events = snapshot_done_ ? 0 : snapshot_events_;
    // The overlap mark must survive restores: a restore inside the overlap streams its transactions again.
    sp.overlap_lsn = snapshot_done_ ? static_cast<int64_t>(overlap_lsn_) : 0;
    return {sp};
  }

  void notify_checkpoint_complete(int64_t checkpoint_id) override {
    auto it = pending_.find(checkpoint_id);
    if (it == pending_.end()) return;
    const Lsn lsn = it->second;
    pending_.erase(pending_.begin(), std::next(it));
    if (lsn != 0 && fetcher_) fetcher_->confirm(lsn);
  }

  void notify_checkpoint_aborted(int64_t checkpoint_id) override { pending_.erase(checkpoint_id); }

  void close() override {
    if (fetcher_) fetcher_->stop();
  }

 private:
  void update_rate(int64_t events) {
    rate_events_ += events;
    const auto now = std::chrono::steady_clock::now();
    if (rate_start_ == std::chrono::steady_clock::time_point{}) {
      rate_start_ = now;
      return;
    }
    const double secs = std::chrono::duration<double>(now - rate_start_).count();
    if (secs >= 1.0) {
      stats_->events_per_second.store(static_cast<double>(rate_events_) / secs, std::memory_order_relaxed);
      rate_events_ = 0;
      rate_start_ = now;
    }
  }

  const detail::PostgresCdcSettings s_;
  SourceReaderContext& ctx_;
  std::shared_ptr<detail::PostgresCdcStats> stats_;
  std::shared_ptr<DeadLetterFile> dead_letter_;
  std::optional<PostgresCdcSplit> split_;
  std::unique_ptr<Fetcher> fetcher_;
  std::vector<Item> items_;
  bool no_more_splits_ = false;
  bool snapshot_done_ = false;
  Lsn overlap_lsn_ = 0;  // the snapshot's overlap with the stream (PostgresCdcSplit::overlap_lsn)
  Lsn position_ = 0;
  Lsn txn_lsn_ = 0;                 // the commit LSN of the transaction being emitted (0 between transactions)
  int64_t txn_events_ = 0;          // its events emitted so far
  int64_t snapshot_events_ = 0;     // snapshot rows emitted by this reader (while the snapshot is not done)
  std::map<int64_t, Lsn> pending_;  // checkpoint id -> position
  int64_t rate_events_ = 0;
  std::chrono::steady_clock::time_point rate_start_{};
};

}  // namespace

namespace detail {

std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> make_postgres_cdc_reader(
    const PostgresCdcSettings& settings, SourceReaderContext& ctx, std::shared_ptr<PostgresCdcStats> stats,
    std::shared_ptr<DeadLetterFile> dead_letter) {
  return std::make_unique<PostgresCdcReader>(settings, ctx, std::move(stats), std::move(dead_letter));
}

}  // namespace detail

// -----------------------------------------------------------------------------------------------------------

void TypeSerializer<PostgresCdcSplit>::serialize(const PostgresCdcSplit& v, DataOutput& out) {
  out.write_string(v.slot);
  out.write_u8(static_cast<uint8_t>(2 | (v.snapshot_done ? 1 : 0)));  // version 1
  out.write_fixed(v.lsn);
  DataOutput block;
  block.write_fixed(v.txn_lsn);
  block.write_varint(static_cast<uint64_t>(v.txn_events));
  block.write_varint(static_cast<uint64_t>(v.snapshot_events));
  block.write_fixed(v.overlap_lsn);
  out.write_string(block.view());
}

void TypeSerializer<PostgresCdcSplit>::deserialize(PostgresCdcSplit& target, DataInput& in) {
  in.read_string(target.slot);
  const uint8_t flags = in.read_u8();
  if (flags > 3) in.fail(fmt::format("Postgres CDC split: unknown format byte {}", flags));
  target.snapshot_done = (flags & 1) != 0;
  target.lsn = in.read_fixed<int64_t>();
  target.txn_lsn = 0;
  target.txn_events = 0;
  target.snapshot_events = 0;
  target.overlap_lsn = 0;
  if ((flags & 2) == 0) return;  // version 0: no partial transaction, no snapshot progress
  DataInput block(in.read_view(in.read_length()));
  target.txn_lsn = block.read_fixed<int64_t>();
  const uint64_t events = block.read_varint();
  if (events > static_cast<uint64_t>(INT64_MAX)) block.fail("Postgres CDC split: event count out of range");
  target.txn_events = static_cast<int64_t>(events);
  if (block.at_end()) return;  // written before snapshot_events existed
  const uint64_t snapshot_events = block.read_varint();
  if (snapshot_events > static_cast<uint64_t>(INT64_MAX)) block.fail("Postgres CDC split: row count out of range");
  target.snapshot_events = static_cast<int64_t>(snapshot_events);
  if (block.at_end()) return;  // written before overlap_lsn existed
  target.overlap_lsn = block.read_fixed<int64_t>();
  // Anything after is a field of a later version: skipped.
}

PostgresCdcSourceBuilder PostgresCdcSource::builder() {
  return PostgresCdcSourceBuilder();
}

PostgresCdcSource::PostgresCdcSource(detail::PostgresCdcSettings settings) : settings_(std::move(settings)) {
  stats_->connections =
      std::make_shared<SourceConnectionBoard>("Postgres CDC source (slot " + settings_.slot_name + ")");
}

std::unique_ptr<SplitEnumerator<PostgresCdcSplit>> PostgresCdcSource::create_enumerator(
    SplitEnumeratorContext<PostgresCdcSplit>& ctx) const {
  dead_letter_file();  // a dead-letter file that cannot be opened fails the job at start
  PostgresCdcSplit split;
  split.slot = settings_.slot_name;
  split.snapshot_done = settings_.start_mode == PostgresStartMode::kLatest;
  return std::make_unique<StaticSplitEnumerator<PostgresCdcSplit>>(ctx, std::vector<PostgresCdcSplit>{split});
}

std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> PostgresCdcSource::create_reader(
    SourceReaderContext& ctx) const {
  return detail::make_postgres_cdc_reader(settings_, ctx, stats_, dead_letter_file());
}

std::shared_ptr<DeadLetterFile> PostgresCdcSource::dead_letter_file() const {
  if (settings_.bad_record_policy != BadRecordPolicy::kDeadLetter) return nullptr;
  std::lock_guard lock(mu_);
  if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
  return dead_letter_;
}

PostgresCdcMetrics PostgresCdcSource::metrics() const {
  const auto& st = *stats_;
  PostgresCdcMetrics m;
  m.events = st.events.load();
  m.snapshot_events = st.snapshot_events.load();
  m.transactions = st.transactions.load();
  m.heartbeats = st.heartbeats.load();
  m.truncates_skipped = st.truncates_skipped.load();
  m.bad_records = st.bad->bad_records.load();
  m.events_per_second = st.events_per_second.load();
  // Behind the server's position, not the age of the last change: an idle source that the server keeps
  // confirming (keepalives with nothing pending) is at 0; a source with a backlog is as far behind as the
  // commit time of what it emits now; a silent server (hung, unreachable) makes the lag grow from the last
  // confirmation until the liveness timeout fails the source.
  const int64_t now = wall_ms();
  const int64_t last = st.last_commit_ts_ms.load();
  const int64_t caught = st.caught_up_ms.load();
  int64_t lag = -1;
  if (caught >= 0) lag = std::max<int64_t>(0, now - caught - st.ping_interval_ms.load() - 2000);
  if (last >= 0) lag = lag < 0 ? std::max<int64_t>(0, now - last) : std::min(lag, std::max<int64_t>(0, now - last));
  m.lag_ms = lag;
  m.position = st.position.load();
  m.confirmed_lsn = st.confirmed_lsn.load();
  m.received_lsn = st.received_lsn.load();
  m.snapshot_done = st.snapshot_done.load();
  const int64_t busy = st.slot_busy_since_ms.load();
  m.slot_busy_ms = busy < 0 ? 0 : std::max<int64_t>(1, now - busy);
  return m;
}

std::vector<SourceConnection> PostgresCdcSource::connections() const {
  const int64_t now = SourceConnectionBoard::steady_now_ms();
  std::vector<SourceConnection> out = stats_->connections->snapshot(now);
  // A fetcher blocked in a query (a heartbeat to a paused server) reports late: the stream's silence says it now.
  const int streaming = stats_->streaming_subtask.load();
  const int64_t last_rx = stats_->last_rx_steady_ms.load(std::memory_order_relaxed);
  const int64_t silent = now - last_rx;
  if (streaming >= 0 && last_rx >= 0 && silent > stats_->ping_interval_ms.load() + 2000) {
    for (SourceConnection& c : out) {
      if (c.subtask == streaming && c.connected) {
        c.connected = false;
        c.disconnected_ms = silent;
        c.reason = fmt::format(
            "no message on the replication connection of slot {} (the server is paused, hung "
            "or unreachable)",
            settings_.slot_name);
      }
    }
  }
  return out;
}

PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::conninfo(std::string conninfo) {
  s_.conninfo = std::move(conninfo);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::tables(std::vector<std::string> tables) {
  s_.tables = std::move(tables);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::slot_name(std::string name) {
  s_.slot_name = std::move(name);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::publication_name(std::string name) {
  s_.publication_name = std::move(name);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::create_slot(bool create) {
  s_.create_slot = create;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::create_publication(bool create) {
  s_.create_publication = create;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::start_mode(PostgresStartMode mode) {
  s_.start_mode = mode;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::truncate_policy(PostgresTruncatePolicy policy) {
  s_.truncate_policy = policy;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::on_interrupted_snapshot(PostgresInterruptedSnapshot policy) {
  s_.interrupted_snapshot = policy;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::heartbeat_interval(std::chrono::milliseconds interval) {
  s_.heartbeat_interval_ms = interval.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::status_interval(std::chrono::milliseconds interval) {
  s_.status_interval_ms = interval.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::liveness_timeout(std::chrono::milliseconds timeout) {
  s_.liveness_timeout_ms = timeout.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::snapshot_fetch_rows(int64_t rows) {
  s_.snapshot_fetch_rows = rows;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::queue_capacity(size_t events) {
  s_.queue_capacity = events;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::on_bad_record(BadRecordPolicy policy,
                                                                  std::string dead_letter_path) {
  s_.bad_record_policy = policy;
  s_.dead_letter_path = std::move(dead_letter_path);
  return *this;
}

Result<std::shared_ptr<PostgresCdcSource>> PostgresCdcSourceBuilder::try_build() const {
  auto bad = [](std::string m) { return Error(ErrorCode::kConfiguration, fmt::format("{}: {}", kRole, m)); };
  if (s_.conninfo.empty()) return bad("no connection: set conninfo(\"host=... dbname=... user=...\")");
  if (!valid_name(s_.slot_name)) {
    return bad(fmt::format("slot name '{}' is invalid: use 1-63 lower-case letters, digits and '_'", s_.slot_name));
  }
  if (!valid_name(s_.publication_name)) {
    return bad(fmt::format("publication name '{}' is invalid: use 1-63 lower-case letters, digits and '_'",
                           s_.publication_name));
  }
  for (const auto& t : s_.tables) {
    auto [schema, table] = split_table(t);
    if (schema.empty() || table.empty() || table.find('.') != std::string::npos) {
      return bad(fmt::format("table '{}' is not \"schema.table\" or \"table\"", t));
    }
  }
  if (s_.heartbeat_interval_ms < 0) return bad("heartbeat_interval must be >= 0");
  if (s_.status_interval_ms <= 0) return bad("status_interval must be > 0");
  if (s_.liveness_timeout_ms < 0) return bad("liveness_timeout must be >= 0 (0 = from wal_sender_timeout)");
  if (s_.snapshot_fetch_rows <= 0) return bad("snapshot_fetch_rows must be > 0");
  if (s_.queue_capacity == 0) return bad("queue_capacity must be > 0");
  if (s_.bad_record_policy == BadRecordPolicy::kDeadLetter && s_.dead_letter_path.empty()) {
    return bad("on_bad_record(kDeadLetter) needs a dead-letter file path");
  }
  return std::make_shared<PostgresCdcSource>(s_);
}

}  // namespace sluice
