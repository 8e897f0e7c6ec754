// Transform expressions (docs/expressions.md): compile, then evaluate over a record. The input is the
// expression text, optionally followed by a line break and a JSON record (a fixed change event otherwise).
// Any text compiles or gives a compile error with an offset inside the text; evaluation gives a value or a
// kRuntime error, never a crash, a hang or an unbounded allocation (the 16 MiB string limit, the depth limit,
// RE2's linear-time matching).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "sluice/pipeline/expression.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::Value;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  static const Value kRecord = Value::from_json(R"({"op":"u","key":{"id":7},"before":{"id":7,"amount":50},
      "after":{"id":7,"amount":150,"name":" Alice ","email":"alice@example.com","price":12.5,"tags":["a","b"],
      "customer":{"id":42,"city":"Paris"},"ts":"2024-03-05T14:07:09.123Z","pattern":"b+","n":3},
      "source":{"connector":"postgres","db":"shop","collection":"public.orders","position":"0/1A","ts_ms":1709647629123}})")
                                   .value_or_throw();
  Value record = kRecord;
  if (const size_t nl = text.find('\n'); nl != std::string_view::npos) {
    sluice::Result<Value> r = Value::from_json(text.substr(nl + 1));
    if (r.ok()) record = std::move(*r);
    text = text.substr(0, nl);
  }
  sluice::pipeline::Expression e;
  sluice::pipeline::ExpressionError error;
  if (sluice::pipeline::Expression::compile(text, &e, &error)) {
    sluice::Result<Value> v = e.evaluate(record);
    if (!v.ok()) SLUICE_FUZZ_CHECK(v.error().code() == sluice::ErrorCode::kRuntime, v.error().to_string());
  } else {
    SLUICE_FUZZ_CHECK(error.offset <= text.size(), error.message);
  }
  sluice::pipeline::Projection p;
  if (sluice::pipeline::Projection::compile(text, &p, &error)) {
    sluice::Result<Value> v = p.evaluate(record);
    if (!v.ok()) SLUICE_FUZZ_CHECK(v.error().code() == sluice::ErrorCode::kRuntime, v.error().to_string());
  }
  return 0;
}
