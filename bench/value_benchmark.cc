// Micro benchmarks of the dynamic Value (core/value.h): JSON in and out, the binary codec, hash, order and
// path lookup on a CDC-shaped document, and decimal parsing. Results and the command in docs/benchmarks.md
// ("Core engine"). Run:
//   build/release/bench/value_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>

#include "sluice/core/data_io.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

// A Debezium-style change event of a payment (the shape the CDC sources and pipelines carry): 337 bytes.
constexpr std::string_view kChangeEvent = R"({"op":"u","key":"ch_3NfQ2a2eZvKYlo2C0x1y","before":null,
  "after":{"id":"ch_3NfQ2a2eZvKYlo2C0x1y","customer_id":"cus_9s6XKzkNRiz8i3","status":"paid","amount":129900,
  "fee":3.75,"total":"1299.00","currency":"eur","tags":["web","3ds"],"description":"Order #18234 \u00e9t\u00e9"},
  "source":{"connector":"mongodb","collection":"charges","ts_ms":1700000000000,"snapshot":false}})";

Value change_event() {
  auto v = Value::from_json(kChangeEvent);
  if (!v.ok()) throw SluiceException(v.error());
  Value out = std::move(*v);
  out["after"].set("exact_total", Decimal::parse("1299.00").value());
  out["after"].set("paid_at", Value::timestamp_micros(1'700'000'000'123'456));
  return out;
}

void BM_ValueFromJson(benchmark::State& state) {
  for (auto _ : state) {
    auto v = Value::from_json(kChangeEvent);
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kChangeEvent.size()));
}
BENCHMARK(BM_ValueFromJson);

void BM_ValueToJson(benchmark::State& state) {
  const Value v = change_event();
  std::string out;
  for (auto _ : state) {
    out.clear();
    v.write_json(out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_ValueToJson);

void BM_ValueBinaryRoundTrip(benchmark::State& state) {
  const Value v = change_event();
  DataOutput out(512);
  Value back;
  for (auto _ : state) {
    out.clear();
    v.write_binary(out);
    DataInput in(out.bytes());
    Value::read_binary(back, in);
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_ValueBinaryRoundTrip);

void BM_ValueHash(benchmark::State& state) {
  const Value v = change_event();
  for (auto _ : state)
    benchmark::DoNotOptimize(v.hash());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ValueHash);

void BM_ValueCompare(benchmark::State& state) {
  const Value a = change_event();
  Value b = change_event();
  b["source"].set("snapshot", true);  // differs in the last field: the whole tree is walked
  for (auto _ : state)
    benchmark::DoNotOptimize(Value::compare(a, b));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ValueCompare);

void BM_ValueCopy(benchmark::State& state) {
  const Value v = change_event();
  for (auto _ : state) {
    Value copy(v);
    benchmark::DoNotOptimize(copy);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ValueCopy);

void BM_ValueAtPath(benchmark::State& state) {
  const Value v = change_event();
  for (auto _ : state) {
    benchmark::DoNotOptimize(v.at_path("after.tags[1]"));
    benchmark::DoNotOptimize(v.at_path("source.ts_ms"));
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_ValueAtPath);

void BM_DecimalParseAndPrint(benchmark::State& state) {
  std::string out;
  for (auto _ : state) {
    out.clear();
    Decimal::parse("-12345678901234567890.123456789").value().append_to(out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecimalParseAndPrint);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
