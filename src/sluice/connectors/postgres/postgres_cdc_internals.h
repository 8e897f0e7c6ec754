// Private to src/sluice/connectors/postgres/: what the files of the Postgres CDC source share (the fetcher's
// files postgres_cdc_fetcher.cc, postgres_cdc_snapshot.cc and postgres_cdc_stream.cc, the reader and the builder):
// constants, libpq error text, quoting, the errors that fail the source, and the Item the fetcher hands to the task
// thread. Not installed. Thread-safety: free functions on arguments the caller owns.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "libpq_handles.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/postgres/pgoutput.h"
#include "sluice/core/error.h"

namespace sluice {
namespace postgres_cdc_internal {

using postgres::format_lsn;
using postgres::Lsn;
using postgres::PgConn;
using postgres::PgResult;

inline constexpr const char* kRole = "Postgres CDC source";
// Items the fetcher hands over in one lock acquisition.
inline constexpr size_t kPushBatch = 256;
// How long START_REPLICATION is retried while the slot is still held by a previous (failed) reader.
inline constexpr auto kSlotBusyDeadline = std::chrono::seconds(30);

inline int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Throws SluiceException (kConnector) with `message`.
[[noreturn]] void fail(std::string message);

/// Fails with an error that no restart can cure (core/non_recoverable.h): the job fails at once with `reason`
/// instead of restarting from the same checkpoint into the same failure for ever.
[[noreturn]] void fail_for_good(std::string message, std::string_view reason);

/// Why a failed statement can never succeed on a retry, from its SQLSTATE and message: bad credentials (class
/// 28), a missing privilege (42501), a database that does not exist (3D000), text that is not UTF-8 (22021), a
/// server without logical decoding
/// (wal_level below logical: a server restart by its administrator). Empty for anything else (a connection
/// lost, a timeout, a conflict): those may pass.
std::string non_recoverable_sqlstate(std::string_view sqlstate, std::string_view message);

/// Why a failed connection attempt can never succeed on a retry, from libpq's message (a failed connection has no
/// SQLSTATE in libpq's API; the server's messages are English unless its lc_messages says otherwise): a refused
/// password, no pg_hba.conf entry for this client, a role or database that does not exist. Empty for anything
/// else (connection refused, a timeout, the server starting up or shutting down): those may pass.
std::string non_recoverable_connect(std::string_view message);

// libpq's message, with any password it echoes from the connection string (a malformed URI is quoted whole).
std::string conn_error(PGconn* c);

// A result's message without libpq's trailing newline (it would split the log line that quotes it).
std::string result_error(const PGresult* r);

/// `s` quoted as an identifier (PQescapeIdentifier); fails (SluiceException) when libpq cannot.
std::string quote_ident(PGconn* c, std::string_view s);

/// `s` quoted as a literal (PQescapeLiteral); fails (SluiceException) when libpq cannot.
std::string quote_literal(PGconn* c, std::string_view s);

/// "schema.table" -> ("schema", "table"); "table" -> ("public", "table").
std::pair<std::string, std::string> split_table(const std::string& t);

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

}  // namespace postgres_cdc_internal
}  // namespace sluice
