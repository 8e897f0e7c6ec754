// net-bench: records/s of the TCP data plane (net/) against the in-process LocalChannel, 1 producer -> 1
// consumer, for 16-byte and 200-byte records (docs/benchmarks.md, "Cluster data plane").
//
//   build/release/bench/net-bench [--runs 5] [--records16 20000000] [--records200 5000000] [--mode all]
//
// Modes (each a producer running a RecordWriter and a consumer running a StreamInputProcessor, the task's own
// classes; the consumer reads every record's bytes):
//   local      producer and consumer threads over a LocalChannel (4 buffers of 32 KiB, Sluice's default);
//   local16    the same with 16 buffers (as many as the TCP channel may hold in flight: 4 + 4 + 8);
//   tcp        two processes (fork): the producer's TaskManager data plane in this process, the consumer's in a
//              child, over a loopback TCP connection (sender 4 buffers; receiver 4 exclusive + 8 floating);
//   tcp-thread the same over loopback TCP with both data planes in this process (two threads + two I/O threads).
// Each run times from the first record written to the consumer's end of input; CPU seconds are user + system
// of every process and thread involved (getrusage). Medians over --runs are printed side by side with the
// ratio to the local channel.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sluice/net/connection_manager.h"
#include "sluice/runtime/input_processor.h"
#include "sluice/runtime/record_writer.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kSegment = 32 * 1024;

class Waiter final : public CreditWaiter {
 public:
  void prepare_wait_for_credit() override { wakeup.clear(); }
  void wait_for_credit() override { wakeup.wait_until(Clock::now() + std::chrono::milliseconds(50)); }
  WakeupSignal wakeup;
};

/// Reads each record's bytes (a 16-byte record as two int64, a larger one as a view) and sums a field.
class SumInput final : public RecordInput {
 public:
  void process_record(DataInput& in, TimestampMs) override {
    int64_t a, b;
    in.read_bytes(&a, 8);
    in.read_bytes(&b, 8);
    if (in.remaining() > 0) sum += static_cast<uint8_t>(in.read_view(in.remaining())[0]);
    sum += b;
    ++records;
  }
  void process_watermark(TimestampMs) override {}
  void process_watermark_status(bool) override {}
  int64_t sum = 0;
  int64_t records = 0;
};

void produce(ChannelSender& ch, int64_t n, size_t size) {
  Waiter waiter;
  ch.set_sender_wakeup(&waiter.wakeup);
  {
    RecordWriter writer({&ch}, waiter);
    std::vector<uint8_t> rec(size, 7);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(rec.data(), &i, 8);
      std::memcpy(rec.data() + 8, &i, 8);
      writer.write_record(0, rec, kNoTimestamp);
    }
    writer.finish();
  }
  ch.set_sender_wakeup(nullptr);
}

int64_t consume(ChannelReceiver& ch) {
  WakeupSignal wakeup;
  ch.set_receiver_wakeup(&wakeup);
  SumInput input;
  {
    StreamInputProcessor proc({&ch}, input);
    for (;;) {
      wakeup.clear();
      auto s = proc.process_next();
      if (s == StreamInputProcessor::Status::kEndOfInput) break;
      if (s == StreamInputProcessor::Status::kNothingAvailable)
        wakeup.wait_until(Clock::now() + std::chrono::milliseconds(50));
    }
  }
  ch.set_receiver_wakeup(nullptr);
  return input.records;
}

double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Run {
  double seconds = 0;
  double cpu = 0;
};

Run run_local(int64_t n, size_t size, size_t buffers) {
  NetworkBufferPool pool(kSegment, buffers);
  LocalChannel ch(pool, pool.allocate(buffers).value_or_throw());
  double cpu0 = cpu_seconds(RUSAGE_SELF);
  auto t0 = Clock::now();
  int64_t got = 0;
  std::thread consumer([&] { got = consume(ch); });
  produce(ch, n, size);
  consumer.join();
  Run r{std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds(RUSAGE_SELF) - cpu0};
  if (got != n)
    std::fprintf(stderr, "local: %lld of %lld records\n", static_cast<long long>(got), static_cast<long long>(n));
  return r;
}

// The pool outlives the data plane (declared first): channel states still held by the I/O thread give their
// buffers back to it.
struct Endpoints {
  NetworkBufferPool pool{kSegment, 64};
  std::unique_ptr<net::ConnectionManager> manager;
};

Run run_tcp_threads(int64_t n, size_t size) {
  Endpoints a, b;
  a.manager = net::ConnectionManager::start({"tm-a", {}, &SystemClock::instance(), 10'000}).value_or_throw();
  b.manager = net::ConnectionManager::start({"tm-b", {}, &SystemClock::instance(), 10'000}).value_or_throw();
  net::ChannelId id{0, 0, 0, 0};
  auto floating = net::FloatingBufferPool::create(b.pool, 8).value_or_throw();
  auto in = b.manager->create_input_channel({"tm-a", a.manager->endpoint()}, id, b.pool, 4, floating).value_or_throw();
  auto out = a.manager->create_output_channel({"tm-b", b.manager->endpoint()}, id, a.pool, 4).value_or_throw();
  double cpu0 = cpu_seconds(RUSAGE_SELF);
  auto t0 = Clock::now();
  int64_t got = 0;
  std::thread consumer([&] { got = consume(*in); });
  produce(*out, n, size);
  consumer.join();
  Run r{std::chrono::duration<double>(Clock::now() - t0).count(), cpu_seconds(RUSAGE_SELF) - cpu0};
  if (got != n)
    std::fprintf(stderr, "tcp-thread: %lld of %lld records\n", static_cast<long long>(got), static_cast<long long>(n));
  return r;
}

// The consumer TaskManager in a child process; this process is the producer's.
Run run_tcp_processes(int64_t n, size_t size) {
  int to_parent[2];
  if (pipe(to_parent) != 0) std::abort();
  pid_t child = fork();
  if (child == 0) {
    close(to_parent[0]);
    Endpoints b;
    b.manager = net::ConnectionManager::start({"tm-b", {}, &SystemClock::instance(), 10'000}).value_or_throw();
    uint16_t port = b.manager->endpoint().port;
    auto floating = net::FloatingBufferPool::create(b.pool, 8).value_or_throw();
    // tm-a < tm-b: tm-a dials, so its endpoint is not needed here.
    auto in = b.manager->create_input_channel({"tm-a", {}}, net::ChannelId{}, b.pool, 4, floating).value_or_throw();
    if (write(to_parent[1], &port, sizeof port) != sizeof port) _exit(2);
    int64_t got = consume(*in);
    if (write(to_parent[1], &got, sizeof got) != sizeof got) _exit(2);
    in.reset();
    floating.reset();
    b.manager.reset();
    _exit(0);
  }
  close(to_parent[1]);
  uint16_t port = 0;
  if (read(to_parent[0], &port, sizeof port) != sizeof port) std::abort();
  Endpoints a;
  a.manager = net::ConnectionManager::start({"tm-a", {}, &SystemClock::instance(), 10'000}).value_or_throw();
  auto out =
      a.manager->create_output_channel({"tm-b", {"127.0.0.1", port}}, net::ChannelId{}, a.pool, 4).value_or_throw();
  double cpu0 = cpu_seconds(RUSAGE_SELF);
  auto t0 = Clock::now();
  produce(*out, n, size);
  int64_t got = 0;
  if (read(to_parent[0], &got, sizeof got) != sizeof got) std::abort();
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu = cpu_seconds(RUSAGE_SELF) - cpu0;
  int status = 0;
  rusage child_usage{};
  wait4(child, &status, 0, &child_usage);
  cpu += static_cast<double>(child_usage.ru_utime.tv_sec + child_usage.ru_stime.tv_sec) +
         static_cast<double>(child_usage.ru_utime.tv_usec + child_usage.ru_stime.tv_usec) / 1e6;
  close(to_parent[0]);
  if (got != n)
    std::fprintf(stderr, "tcp: %lld of %lld records\n", static_cast<long long>(got), static_cast<long long>(n));
  return {seconds, cpu};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  using namespace sluice;
  int runs = 5;
  int64_t n16 = 20'000'000, n200 = 5'000'000;
  std::string mode = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--runs")
      runs = std::stoi(argv[i + 1]);
    else if (k == "--records16")
      n16 = std::stoll(argv[i + 1]);
    else if (k == "--records200")
      n200 = std::stoll(argv[i + 1]);
    else if (k == "--mode")
      mode = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::vector<std::string> modes = mode == "all" ? std::vector<std::string>{"local", "local16", "tcp", "tcp-thread"}
                                                 : std::vector<std::string>{mode};
  std::printf("%-11s %6s %10s %14s %10s %12s %8s\n", "mode", "bytes", "records", "records/s", "CPU-s", "rec/CPU-s",
              "vs local");
  for (size_t size : {size_t{16}, size_t{200}}) {
    const int64_t n = size == 16 ? n16 : n200;
    double local_rate = 0;
    for (const auto& m : modes) {
      std::vector<double> rates, cpus;
      for (int r = 0; r < runs; ++r) {
        Run run = m == "local"     ? run_local(n, size, 4)
                  : m == "local16" ? run_local(n, size, 16)
                  : m == "tcp"     ? run_tcp_processes(n, size)
                                   : run_tcp_threads(n, size);
        rates.push_back(static_cast<double>(n) / run.seconds);
        cpus.push_back(run.cpu);
      }
      double rate = median(rates), cpu = median(cpus);
      if (m == "local") local_rate = rate;
      std::string runs_text;
      for (double x : rates)
        runs_text += " " + std::to_string(static_cast<int64_t>(x / 1e6 * 100) / 100.0).substr(0, 5);
      std::printf("%-11s %6zu %10lld %14.0f %10.2f %12.0f %8s   (runs, M/s:%s)\n", m.c_str(), size,
                  static_cast<long long>(n), rate, cpu, static_cast<double>(n) / cpu,
                  local_rate > 0 ? (std::to_string(rate / local_rate).substr(0, 4)).c_str() : "-", runs_text.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
