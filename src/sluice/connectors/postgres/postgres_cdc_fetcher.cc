// The Fetcher's thread, connections, hand-over queue, publication and slot (postgres_cdc_fetcher.h); the snapshot
// and the stream are in postgres_cdc_snapshot.cc and postgres_cdc_stream.cc.
#include "postgres_cdc_fetcher.h"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <map>

#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/redact.h"

namespace sluice {
namespace postgres_cdc_internal {

namespace {

// GUCs every connection sets so that values print in the forms pgoutput.cc parses.
constexpr const char* kSessionOptions =
    "-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3 -c IntervalStyle=postgres";

}  // namespace

Fetcher::Fetcher(const detail::PostgresCdcSettings& settings, PostgresCdcSplit split, SourceReaderContext& ctx,
                 std::shared_ptr<detail::PostgresCdcStats> stats, std::shared_ptr<DeadLetterFile> dead_letter)
    : s_(settings),
      split_(std::move(split)),
      ctx_(ctx),
      stats_(std::move(stats)),
      dead_letter_(std::move(dead_letter)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) fail(fmt::format("{}: eventfd: {}", kRole, std::strerror(errno)));
}

Fetcher::~Fetcher() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Fetcher::start() {
  thread_ = std::thread([this] { run(); });
}

void Fetcher::stop() {
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

void Fetcher::take(std::vector<Item>& out, size_t max) {
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

void Fetcher::confirm(Lsn lsn) {
  Lsn cur = confirm_.load();
  while (lsn > cur && !confirm_.compare_exchange_weak(cur, lsn)) {
  }
  wake();
}

void Fetcher::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void Fetcher::drain_wake() {
  uint64_t v;
  while (::read(wake_fd_, &v, sizeof v) > 0) {
  }
}

PgConn Fetcher::connect(bool replication) {
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
  const std::string app = application_name(replication);
  const char* vals[] = {"1",
                        "10",
                        "5",
                        "3",
                        s_.conninfo.c_str(),
                        kSessionOptions,
                        "UTF8",
                        app.c_str(),
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

void Fetcher::lost(std::string why) {
  const int64_t now = SourceConnectionBoard::steady_now_ms();
  stats_->connections->set_disconnected(subtask_, lost_ ? lost_since_ : now, std::move(why));
  if (!lost_) lost_since_ = now;
  lost_ = true;
}

void Fetcher::found() {
  if (lost_ || !reported_) stats_->connections->set_connected(subtask_, SourceConnectionBoard::steady_now_ms());
  lost_ = false;
  reported_ = true;
}

void Fetcher::watch_stream(std::chrono::steady_clock::time_point now) {
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

void Fetcher::forget_cancels() {
  std::lock_guard lock(cancel_mu_);
  for (PGcancel* c : cancels_)
    PQfreeCancel(c);
  cancels_.clear();
}

PgResult Fetcher::run(PGconn* c, const std::string& sql, std::string_view what) {
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

PgResult Fetcher::exec(PGconn* c, const std::string& sql, ExecStatusType want, std::string_view what) {
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

PgResult Fetcher::query(PGconn* c, const std::string& sql, std::string_view what) {
  return exec(c, sql, PGRES_TUPLES_OK, what);
}

std::vector<std::string> Fetcher::key_columns(PGconn* c, const std::string& relid_expr) {
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

void Fetcher::push(std::vector<Item>& batch) {
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

bool Fetcher::queue_empty() {
  std::lock_guard lock(mu_);
  return queue_.empty();
}

void Fetcher::wait_for_wake(std::chrono::milliseconds timeout, int also_fd) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {also_fd, POLLIN, 0}};
  ::poll(fds, also_fd >= 0 ? 2 : 1, static_cast<int>(std::max<int64_t>(0, timeout.count())));
  if (fds[0].revents & POLLIN) drain_wake();
}

void Fetcher::run() {
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

void Fetcher::push_error(Error e) {
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

void Fetcher::run_inner() {
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
        fail_for_good(fmt::format("{}: slot {} exists but is not a logical pgoutput slot of database {} (plugin '{}', "
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
    // Unless another job (or a tool) streams from it: dropping its slot would lose that reader's position.
    refuse_foreign_holder(n);
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
    spdlog::info("{}: slot {} resumes inside the transaction committed at {}: its first {} events were emitted", kRole,
                 s_.slot_name, format_lsn(resume_txn_lsn_), resume_txn_events_);
  }
  stream(start_lsn);
}

void Fetcher::ensure_publication(PGconn* n) {
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

bool Fetcher::slot_busy(std::string_view what, std::optional<std::chrono::steady_clock::time_point>& since,
                        std::chrono::steady_clock::time_point& next_log) {
  const auto now = std::chrono::steady_clock::now();
  if (!since) {
    since = now;
    stats_->slot_busy_since_ms.store(wall_ms());
  }
  if (now - *since >= kSlotBusyDeadline) return false;
  if (now >= next_log) {
    next_log = now + std::chrono::seconds(5);
    spdlog::warn("{}: slot {} is in use by another connection ({}): {} is retried for up to {} s ({} s so far)", kRole,
                 s_.slot_name, slot_holder(), what, kSlotBusyDeadline.count(),
                 std::chrono::duration_cast<std::chrono::seconds>(now - *since).count());
  }
  return true;
}

void Fetcher::slot_free(std::optional<std::chrono::steady_clock::time_point>& since) {
  if (!since) return;
  spdlog::info(
      "{}: slot {} is free after {} ms", kRole, s_.slot_name,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - *since).count());
  since.reset();
  stats_->slot_busy_since_ms.store(-1);
}

std::string Fetcher::slot_holder() {
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

std::string Fetcher::application_name(bool replication) const {
  std::string name = replication ? "sluice-cdc-replication" : "sluice-cdc";
  if (s_.owner.empty()) return name;
  // Only characters every server version keeps as they are (15 and older replace other bytes with '?', 16 and later
  // escape them as \xNN), so that refuse_foreign_holder() compares like with like.
  std::string owner = s_.owner;
  for (char& c : owner) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  // The server keeps at most 63 bytes: a longer owner keeps its start and a digest of the whole (FNV-1a, the same
  // in every build), so that two long names sharing a prefix stay apart.
  constexpr size_t kMax = 63;
  if (name.size() + 1 + owner.size() > kMax) {
    uint32_t h = 2166136261u;
    for (unsigned char c : s_.owner)
      h = (h ^ c) * 16777619u;
    owner = owner.substr(0, kMax - name.size() - 1 - 9) + fmt::format("~{:08x}", h);
  }
  return name + " " + owner;
}

void Fetcher::refuse_foreign_holder(PGconn* n) {
  // client_port: NULL when the holder's address is hidden from this role, -1 for a local socket.
  PgResult r = query(n,
                     "SELECT s.active_pid, a.pid IS NOT NULL, coalesce(a.application_name, ''), CASE WHEN "
                     "a.client_port IS NULL THEN 'an address hidden from this role' WHEN a.client_port = -1 THEN 'a "
                     "local socket' ELSE host(a.client_addr) END FROM pg_replication_slots s LEFT JOIN "
                     "pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = " +
                         quote_literal(n, s_.slot_name) + " AND s.active_pid IS NOT NULL",
                     "reading who streams from the replication slot");
  if (PQntuples(r.get()) == 0) return;  // nobody: the slot is free (or gone meanwhile)
  // A walsender not in the activity view yet (it just started) is not judged now: drop_slot() waits while the slot
  // is busy and asks again.
  if (std::string_view(PQgetvalue(r.get(), 0, 1)) != "t") return;
  const std::string holder = PQgetvalue(r.get(), 0, 2);
  // This owner's earlier run, or a reader of a build that named no owner: drop_slot() waits for it to end.
  if (holder == application_name(true) || holder == "sluice-cdc-replication") return;
  fail_for_good(
      fmt::format("{}: slot {} exists and is streamed by another connection (pid {}, application_name '{}', from {}), "
                  "not by an earlier run of this job ('{}'); this job starts without state, and re-creating the slot "
                  "would drop it and with it the other reader's position. Each job needs a replication slot of its "
                  "own: give this one another slot name, or stop the other reader",
                  kRole, s_.slot_name, PQgetvalue(r.get(), 0, 0), holder, PQgetvalue(r.get(), 0, 3),
                  application_name(true)),
      "the replication slot is streamed by another job or tool; this job must not take it over");
}

void Fetcher::drop_slot(PGconn* n) {
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
      // Whoever holds it now: another job's reader may have taken it since the first look.
      refuse_foreign_holder(n);
      wait_for_wake(std::chrono::milliseconds(200));
      continue;
    }
    fail(fmt::format("{} (slot {}): dropping the replication slot failed: {}{}", kRole, s_.slot_name,
                     r ? result_error(r.get()) : conn_error(n),
                     busy_since ? fmt::format(" ({}, after {} s of waiting)", slot_holder(), kSlotBusyDeadline.count())
                                : std::string()));
  }
  slot_free(busy_since);
}

}  // namespace postgres_cdc_internal
}  // namespace sluice
