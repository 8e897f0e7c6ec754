// Postgres' text form of column values (decode_text_value: what pgoutput sends and a text-format query
// returns), by type OID. The first byte picks one of the types the decoder knows (or an unknown one, which
// stays text); the rest is the text. Any text gives a Value or a kSerialization error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "sluice/connectors/postgres/pgoutput.h"

namespace {

// bool, bytea, char, name, int8, int2, int4, text, oid, json, float4, float8, bpchar, varchar, date, time,
// timestamp, timestamptz, interval, numeric, uuid, jsonb, and arrays of int4, text, float8, numeric, timestamp,
// jsonb, bool, bytea; 0 is unknown.
constexpr uint32_t kOids[] = {16,   17,   18,   19,   20,   21,   23,   25,   26,   114,  700,
                              701,  1042, 1043, 1082, 1083, 1114, 1184, 1186, 1700, 2950, 3802,
                              1007, 1009, 1022, 1231, 1115, 3807, 1000, 1001, 0};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t oid = kOids[data[0] % (sizeof(kOids) / sizeof(kOids[0]))];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  sluice::Result<sluice::Value> v = sluice::postgres::decode_text_value(oid, text);
  if (!v.ok()) {
    SLUICE_FUZZ_CHECK(v.error().code() == sluice::ErrorCode::kSerialization, v.error().to_string());
    return 0;
  }
  (void)v->to_json();
  return 0;
}
