// The pgoutput decoder (Postgres logical replication, protocol version 1): a stream of messages from the
// server, each decoded by one PgOutputDecoder that keeps the Relation and Type messages it saw. The input is
// split into messages at each 2-byte big-endian length, so a Relation followed by Inserts of that relation
// is reachable. Any bytes give a message or an error (kConnector / kSerialization), never a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "sluice/connectors/postgres/pgoutput.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::postgres::PgOutputDecoder;
  // A resolver as the source's: the key of a FULL table is its first column when there is one.
  PgOutputDecoder decoder([](const sluice::postgres::PgRelation& r) -> sluice::Result<std::vector<std::string>> {
    if (r.columns.empty()) return std::vector<std::string>{};
    return std::vector<std::string>{r.columns.front().name};
  });
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t len = (size_t{data[pos]} << 8) | data[pos + 1];
    pos += 2;
    const size_t n = len < size - pos ? len : size - pos;
    const std::string_view msg(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    sluice::Result<sluice::postgres::PgOutputMessage> m = decoder.decode(msg);
    if (!m.ok()) {
      const auto code = m.error().code();
      SLUICE_FUZZ_CHECK(code == sluice::ErrorCode::kConnector || code == sluice::ErrorCode::kSerialization,
                        m.error().to_string());
    }
  }
  return 0;
}
