// Engine throughput benchmarks (issue: core engine). Each iteration runs a whole bounded job on the local
// mini-cluster and reports records/s; ns/record is 1e9 / records/s. Run:
//   build/release/bench/engine_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <memory>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/value.h"

namespace sluice {
namespace {

/// The 16-byte record of the benchmarks.
struct Rec16 {
  int64_t key = 0;
  int64_t value = 0;
};
SLUICE_FIELDS(Rec16, key, value);

/// Counts records and otherwise discards them.
template <class T>
class DiscardingSink final : public Sink<T> {
 public:
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext&) const override { return std::make_unique<Writer>(); }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    void write(const T& r, const SinkWriterContext&) override { benchmark::DoNotOptimize(&r); }
    void flush(bool) override {}
  };
};

std::shared_ptr<DataGeneratorSource<Rec16>> rec16_source(int64_t n) {
  return std::make_shared<DataGeneratorSource<Rec16>>([](int64_t i) { return Rec16{i & 1023, i}; }, n);
}

void run_job(benchmark::State& state, StreamEnvironment& env, int64_t n) {
  JobResult r = env.execute("bench");
  if (!r.ok()) state.SkipWithError(r.error ? r.error->to_string().c_str() : "job failed");
  state.SetItemsProcessed(state.items_processed() + n);
}

// (1) source -> map -> filter -> discarding sink, chained into one task.
void BM_ChainedPipeline(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    StreamEnvironment env;
    env.from_source(rec16_source(n), "gen")
        .map([](Rec16 r) {
          r.value += 1;
          return r;
        })
        .filter([](const Rec16& r) { return r.value >= 0; })
        .sink_to(std::make_shared<DiscardingSink<Rec16>>());
    run_job(state, env, n);
  }
}
BENCHMARK(BM_ChainedPipeline)->Arg(20'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();

// (2) the same with a hash-partitioned exchange (key_by) between map and filter, at p -> p.
void BM_HashExchange(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int p = static_cast<int>(state.range(1));
  for (auto _ : state) {
    StreamEnvironment env;
    env.set_parallelism(p);
    env.from_source(rec16_source(n), "gen")
        .map([](Rec16 r) {
          r.value += 1;
          return r;
        })
        .key_by(&Rec16::key)
        .filter([](const Rec16& r) { return r.value >= 0; })
        .sink_to(std::make_shared<DiscardingSink<Rec16>>());
    run_job(state, env, n);
  }
}
BENCHMARK(BM_HashExchange)->Args({10'000'000, 1})->Args({10'000'000, 2})->Unit(benchmark::kMillisecond)->UseRealTime();

// (3) serializer throughput: a struct and a CDC-shaped Value, serialize + deserialize into a reused object.
struct Charge {
  std::string id;
  std::string customer;
  std::string status;
  int64_t amount_cents = 0;
  int64_t ts_ms = 0;
};
SLUICE_FIELDS(Charge, id, customer, status, amount_cents, ts_ms);

void BM_SerializeStruct(benchmark::State& state) {
  Charge c{"ch_3NfQ2a2eZvKYlo2C0x1y", "cus_9s6XKzkNRiz8i3", "paid", 129900, 1'700'000'000'000};
  DataOutput out(256);
  Charge back;
  for (auto _ : state) {
    out.clear();
    serialize(c, out);
    DataInput in(out.bytes());
    deserialize(back, in);
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_SerializeStruct);

void BM_SerializeValue(benchmark::State& state) {
  auto v = Value::from_json(R"({"op":"u","key":"ch_3NfQ2a2eZvKYlo2C0x1y","after":{"id":"ch_3NfQ2a2eZvKYlo2C0x1y",
    "customer_id":"cus_9s6XKzkNRiz8i3","status":"paid","amount":129900,"currency":"eur","tags":["web","3ds"]},
    "source":{"connector":"mongodb","collection":"charges","ts_ms":1700000000000}})");
  if (!v.ok()) {
    state.SkipWithError("bad json");
    return;
  }
  DataOutput out(512);
  Value back;
  for (auto _ : state) {
    out.clear();
    serialize(*v, out);
    DataInput in(out.bytes());
    deserialize(back, in);
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_SerializeValue);

}  // namespace
}  // namespace sluice

BENCHMARK_MAIN();
