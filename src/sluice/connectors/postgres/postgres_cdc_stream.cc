// The Fetcher's replication stream (postgres_cdc_fetcher.h): START_REPLICATION, pgoutput messages into events, commit
// markers and heartbeats, keepalives, status updates, bad records.
#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>

#include "postgres_cdc_fetcher.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/non_recoverable.h"

namespace sluice {
namespace postgres_cdc_internal {

namespace {

constexpr const char* kHeartbeatPrefix = "sluice-heartbeat";

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

}  // namespace

void Fetcher::stream(Lsn start_lsn) {
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
    fail(fmt::format(
        "{} (slot {}): START_REPLICATION at {} failed: {}{}", kRole, s_.slot_name, format_lsn(start_lsn),
        r ? result_error(r.get()) : conn_error(rc),
        busy_since ? fmt::format(" (after {} s of waiting for the slot)", kSlotBusyDeadline.count()) : std::string()));
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
    stats_->stream_wakeups.fetch_add(1, std::memory_order_relaxed);
    maintenance();
    if (PQconsumeInput(rc) == 0) {
      lost(fmt::format("the replication connection failed: {}", conn_error(rc)));
      fail(fmt::format("{} (slot {}): the replication connection failed after {}: {}", kRole, s_.slot_name,
                       format_lsn(received_), conn_error(rc)));
    }
    bool received = false;
    for (;;) {
      char* buf = nullptr;
      const int n = PQgetCopyData(rc, &buf, 1);
      if (n == 0) break;
      if (n > 0) {
        last_rx_ = std::chrono::steady_clock::now();
        received = true;
      }
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
    // A ping is due once the stream has been silent for the ping interval, not merely at next_ping_: while
    // messages keep arriving closer together than that, next_ping_ stays in the past, and waking at it meant a
    // zero wait, a busy loop burning a core at a steady trickle of changes.
    const auto ping_due = std::max(next_ping_, last_rx_ + std::chrono::milliseconds(ping_interval_ms_));
    auto until = std::min({next_status_, ping_due, last_rx_ + std::chrono::milliseconds(liveness_ms_ + 1)});
    if (s_.heartbeat_interval_ms > 0) until = std::min(until, next_heartbeat_);
    // Rounded up: a timer due in under a millisecond would otherwise be polled for with 0 ms until it is due.
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(until - now);
    // After a pass that brought messages, look again before sleeping: over TLS the rest of a record can sit
    // decrypted inside OpenSSL, where a poll of the socket does not see it (libpq reads at most its buffer's room).
    wait_for_wake(received ? std::chrono::milliseconds(0)
                           : std::clamp(wait, std::chrono::milliseconds(0), std::chrono::milliseconds(1000)),
                  sock);
  }
}

void Fetcher::maintenance() {
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

void Fetcher::put_int64(char* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<char>(v & 0xFF);
    v >>= 8;
  }
}

uint64_t Fetcher::get_int64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void Fetcher::send_status(bool reply_requested) {
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

void Fetcher::handle(std::string_view msg, std::vector<Item>& batch) {
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

void Fetcher::bad_record(const std::string& table, Lsn lsn, int64_t xid, const std::string& reason,
                         const std::string& raw, bool raw_is_message) {
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
                               {"reason", Value(dead_letter_reason::kUndecodable)},
                               {"error", Value(reason)}});
  if (raw_is_message) {
    entry.set("record_base64", Value(base64(raw)));
  } else {
    entry.set("record", Value(raw));
  }
  dead_letter_->append(entry).value_or_throw();
  stats_->bad->bad_records.fetch_add(1);
}

}  // namespace postgres_cdc_internal
}  // namespace sluice
