// The Fetcher's initial snapshot (postgres_cdc_fetcher.h): the tables read in the transaction of the slot's exported
// snapshot, as kRead events, before the stream starts at the slot's consistent point.
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

namespace sluice {
namespace postgres_cdc_internal {

void Fetcher::snapshot(const std::string& exported, Lsn resume_lsn) {
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

}  // namespace postgres_cdc_internal
}  // namespace sluice
