// JSON -> Value (Value::from_json, simdjson) and back: any bytes parse to a Value or an error; a parsed Value
// prints to JSON that reads back as a Value printing the same JSON, and survives the binary codec unchanged.
// (The JSON round trip compares text, not kinds: a number that only a decimal holds exactly, such as
// 0.57777777777777777e17, reads as a decimal and prints as 57777777777777777, which reads back as an int64.)
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "sluice/core/value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::Value;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::Result<Value> v = Value::from_json(text);
  if (!v.ok()) return 0;
  const std::string json = v->to_json();
  sluice::Result<Value> again = Value::from_json(json);
  SLUICE_FUZZ_CHECK(again.ok(), json + " does not parse: " + again.error().message());
  SLUICE_FUZZ_CHECK(again->to_json() == json, json + " reads back as " + again->to_json());
  sluice::DataOutput out;
  v->write_binary(out);
  sluice::DataInput in(out.data(), out.size());
  Value decoded;
  Value::read_binary(decoded, in);
  SLUICE_FUZZ_CHECK(decoded == *v && in.at_end(), json + " changes in the binary codec: " + decoded.to_json());
  return 0;
}
