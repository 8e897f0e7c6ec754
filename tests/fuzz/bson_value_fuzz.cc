// BSON <-> Value (the MongoDB connector's document mapping, connectors/mongodb/bson_value.h): any bytes give a
// Value or a kSerialization error; a Value read from BSON converts back to BSON that reads as the same Value.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "sluice/connectors/mongodb/bson_value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::Result<sluice::Value> v = sluice::mongodb::bson_to_value(data, size);
  if (!v.ok()) {
    SLUICE_FUZZ_CHECK(v.error().code() == sluice::ErrorCode::kSerialization, v.error().to_string());
    return 0;
  }
  sluice::Result<std::string> bson = sluice::mongodb::value_to_bson(*v);
  if (!bson.ok()) {
    // What BSON cannot hold is refused loudly; a document read from BSON can always be written back, except a
    // key or a regex with a NUL, which bson_to_value never produces.
    SLUICE_FUZZ_CHECK(false, v->to_json() + " read from BSON cannot be written back: " + bson.error().message());
  }
  sluice::Result<sluice::Value> again =
      sluice::mongodb::bson_to_value(reinterpret_cast<const uint8_t*>(bson->data()), bson->size());
  SLUICE_FUZZ_CHECK(again.ok(), again.error().message());
  SLUICE_FUZZ_CHECK(*again == *v, v->to_json() + " reads back as " + again->to_json());
  (void)sluice::mongodb::bson_to_canonical_json(data, size);
  return 0;
}
