// Owning handles of libpq objects, shared by the Postgres source and sink (private to connectors/postgres/).
#pragma once

#include <libpq-fe.h>

#include <memory>

namespace sluice::postgres {

struct PgConnDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct PgResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
/// A connection, closed (PQfinish) with its handle.
using PgConn = std::unique_ptr<PGconn, PgConnDeleter>;
/// A result, freed (PQclear) with its handle.
using PgResult = std::unique_ptr<PGresult, PgResultDeleter>;

}  // namespace sluice::postgres
