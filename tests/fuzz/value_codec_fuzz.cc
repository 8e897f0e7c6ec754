// The binary codecs of records and state (TypeSerializer, docs/value.md "Binary encoding"): corrupt or
// truncated bytes decode to a value or a kSerialization error (SluiceException), never read out of bounds or
// allocate without bound; whatever decodes encodes and decodes again to the same value.
// The first byte chooses the type: Value, ChangeEvent (a SLUICE_FIELDS struct with an enum and Values),
// std::vector<std::string>, std::map<std::string, int64_t>.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/core/type_serializer.h"
#include "sluice/core/value.h"

namespace {

template <class T>
void round_trip(const uint8_t* data, size_t size) {
  T value{};
  try {
    sluice::DataInput in(data, size);
    sluice::deserialize(value, in);
  } catch (const sluice::SluiceException& e) {
    SLUICE_FUZZ_CHECK(e.error().code() == sluice::ErrorCode::kSerialization, e.error().to_string());
    return;
  }
  sluice::DataOutput out;
  sluice::serialize(value, out);
  T again{};
  sluice::DataInput in(out.data(), out.size());
  sluice::deserialize(again, in);
  SLUICE_FUZZ_CHECK(again == value && in.at_end(), "a decoded value changes when encoded again");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 4) {
    case 0:
      round_trip<sluice::Value>(data + 1, size - 1);
      break;
    case 1:
      round_trip<sluice::cdc::ChangeEvent>(data + 1, size - 1);
      break;
    case 2:
      round_trip<std::vector<std::string>>(data + 1, size - 1);
      break;
    default:
      round_trip<std::map<std::string, int64_t>>(data + 1, size - 1);
      break;
  }
  return 0;
}
