// function-bench: the cost of a function worker (docs/functions.md, docs/benchmarks.md "Functions"), driving
// FunctionWorker and the protocol's encoder and decoder (udf/function_protocol.h) exactly as the pipeline's
// function operator does: records (change envelopes) are appended to a batch frame, a batch is sent when the
// worker is idle or the batch holds --batch-size records (or 2 ms after its first record when paced), at most
// --max-in-flight batches are unanswered, and each reply is parsed into one Value per record. No source, sink or
// checkpoint: the figures are the function path alone, per worker.
//
//   build/release/bench/function-bench [--records 400000] [--batch-size 256] [--max-in-flight 2]
//                                      [--pix examples/pix] [--runs 3] [--only node|python|pix]
//   build/release/bench/function-bench --ceiling 1 [--records 400000] [--batch-size 256]
//
// Prints, for node identity, python identity and node Pix (when --pix names the example's folder and its npm
// dependencies install): events/s and CPU per event (this process + the worker) at parallelism 1 and 2 (one
// worker per thread), the added latency (p50/p99/max from a record's arrival to its result being parsed) at
// 1,000 events/s with a 2 ms batch delay and at full speed, and the worker's peak RSS. `--ceiling 1` prints
// instead the engine's encode and decode alone (no worker) and a Node.js loop's parse-call-stringify alone (no
// socket): the two bounds of the events/s one worker can reach.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "sluice/udf/function_module.h"
#include "sluice/udf/function_protocol.h"
#include "sluice/udf/function_worker.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Options {
  int64_t records = 400'000;
  size_t batch_size = 256;
  size_t max_in_flight = 2;
  int runs = 3;
  std::string pix;
  std::string only;      // run only the runtimes whose name contains this
  bool ceiling = false;  // the engine alone and a Node.js loop alone, then stop
};

struct Runtime {
  std::string name;
  std::vector<std::string> argv;
  std::string module;
  std::string export_name;
};

// The change envelopes of the pipeline benchmark (bench/functions_bench.sh): 1,000 distinct rows, amounts as
// int64, the Pix example's row fields.
std::vector<Value> make_changes(size_t n) {
  std::vector<Value> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t e = i % 1000;
    std::string json = fmt::format(
        R"({{"op":"u","key":{{"id":"ch_{0}"}},"before":null,"after":{{"id":"ch_{0}","customer_id":"cus_{1}",)"
        R"("status":"paid","amount":{2},"pix_key":"12345678000195","merchant_name":"Cafe Coracao",)"
        R"("merchant_city":"Belo Horizonte"}},"source":{{"connector":"postgres","db":"payments",)"
        R"("collection":"public.charges","position":"0/{3:X}","ts_ms":1790000000000,"snapshot":false,)"
        R"("txn_id":{2},"sequence":0}}}})",
        e, e % 97, i + 100, i + 1);
    out.push_back(*Value::from_json(json));
  }
  return out;
}

double process_cpu_seconds(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields;
  size_t pos = close + 2;
  while (pos < s.size()) {
    const size_t sp = s.find(' ', pos);
    fields.push_back(s.substr(pos, sp - pos));
    if (sp == std::string::npos) break;
    pos = sp + 1;
  }
  // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ')' (state is field 3).
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

double peak_rss_mib_of(int pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::unique_ptr<udf::FunctionWorker> start(const Runtime& rt) {
  udf::FunctionWorkerOptions o;
  o.argv = rt.argv;
  o.module = rt.module;
  o.export_name = rt.export_name;
  o.display_name = rt.name;
  o.memory_mb = 512;
  auto w = udf::FunctionWorker::start(std::move(o), [] {});
  if (!w.ok()) {
    std::fprintf(stderr, "cannot start %s: %s\n", rt.name.c_str(), w.error().message().c_str());
    std::exit(1);
  }
  return std::move(*w);
}

// One worker's full-speed run: what the operator does, without its queue of pending changes.
struct RunResult {
  double seconds = 0;
  double engine_cpu = 0;  // this thread (encode, send, parse) + the worker's reader thread is not counted here
  double worker_cpu = 0;
  double rss_mib = 0;
  std::vector<double> latency_ms;  // per record, arrival (= when appended) to result parsed
  int64_t checksum = 0;
};

class Driver {
 public:
  Driver(const Runtime& rt, const Options& o) : worker_(start(rt)), options_(o) {}

  // Sends `changes` (cycled to `n` records); `interval_us` > 0 paces arrivals (one record per interval) and closes
  // a batch `delay_ms` after its first record, as the operator's timer does.
  RunResult run(const std::vector<Value>& changes, int64_t n, int64_t interval_us, int64_t delay_ms) {
    RunResult r;
    const double cpu0 = thread_cpu_seconds();
    const double wcpu0 = process_cpu_seconds(worker_->pid());
    const auto t0 = Clock::now();
    int64_t next_id = 1;
    std::deque<std::pair<int64_t, size_t>> in_flight;  // batch id, count
    std::deque<Clock::time_point> arrivals;            // of records sent and not answered
    std::vector<Clock::time_point> open_arrivals;
    Clock::time_point open_since{};
    frame_.open(next_id);
    auto send = [&] {
      std::string_view text = frame_.close();
      Status s = worker_->send(text, Clock::now() + std::chrono::seconds(30));
      if (!s.ok()) fail(s.error().message());
      in_flight.emplace_back(frame_.id(), frame_.count());
      for (auto t : open_arrivals)
        arrivals.push_back(t);
      open_arrivals.clear();
      frame_.open(++next_id);
    };
    auto take = [&](bool block) -> bool {
      auto reply = block ? worker_->wait_reply(Clock::now() + std::chrono::seconds(30)) : worker_->next_reply();
      if (!reply.ok()) fail(reply.error().message());
      if (!reply->has_value()) {
        if (block) fail("no reply within 30 s");
        return false;
      }
      auto [id, count] = in_flight.front();
      in_flight.pop_front();
      auto results = udf::parse_result_frame(**reply, id, count);
      if (!results.ok()) fail(results.error().message());
      const auto now = Clock::now();
      for (const udf::RecordResult& res : *results) {
        if (res.failed) fail("a record failed: " + res.message);
        if (res.ok.is_object()) r.checksum += static_cast<int64_t>(res.ok.as_object().size());
        r.latency_ms.push_back(std::chrono::duration<double, std::milli>(now - arrivals.front()).count());
        arrivals.pop_front();
      }
      return true;
    };
    for (int64_t i = 0; i < n; ++i) {
      Clock::time_point arrival = Clock::now();
      if (interval_us > 0) {
        const auto due = t0 + std::chrono::microseconds(interval_us * i);
        // Waiting for the next arrival, take the replies and close a batch whose delay ran out (the timer).
        while (Clock::now() < due) {
          while (!in_flight.empty() && take(false)) {
          }
          if (frame_.count() > 0 && in_flight.empty()) send();  // the worker became idle
          if (frame_.count() > 0 && Clock::now() >= open_since + std::chrono::milliseconds(delay_ms)) send();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        arrival = due;
      } else {
        // The operator takes replies when the reader thread's mail runs, between records.
        while (!in_flight.empty() && take(false)) {
        }
        if (frame_.count() > 0 && in_flight.empty()) send();
      }
      if (frame_.count() == 0) open_since = arrival;
      Status s = frame_.append(changes[static_cast<size_t>(i) % changes.size()]);
      if (!s.ok()) fail(s.error().message());
      open_arrivals.push_back(arrival);
      if (frame_.count() >= options_.batch_size || in_flight.empty()) {  // full, or the worker is idle
        while (in_flight.size() >= options_.max_in_flight)
          take(true);
        send();
      }
    }
    if (frame_.count() > 0) {
      while (in_flight.size() >= options_.max_in_flight)
        take(true);
      send();
    }
    while (!in_flight.empty())
      take(true);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.engine_cpu = thread_cpu_seconds() - cpu0;
    r.worker_cpu = process_cpu_seconds(worker_->pid()) - wcpu0;
    r.rss_mib = peak_rss_mib_of(worker_->pid());
    return r;
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    std::fprintf(stderr, "function-bench: %s\n", what.c_str());
    std::exit(1);
  }
  std::unique_ptr<udf::FunctionWorker> worker_;
  Options options_;
  udf::BatchFrame frame_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void throughput(const Runtime& rt, const Options& o, const std::vector<Value>& changes, int parallelism) {
  std::vector<double> rates, cpu_us, worker_us, rss;
  for (int run = 0; run < o.runs; ++run) {
    std::vector<std::unique_ptr<Driver>> drivers;
    for (int p = 0; p < parallelism; ++p)
      drivers.push_back(std::make_unique<Driver>(rt, o));
    std::vector<RunResult> results(static_cast<size_t>(parallelism));
    const double proc0 = bench::cpu_seconds();
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int p = 0; p < parallelism; ++p) {
      threads.emplace_back(
          [&, p] { results[static_cast<size_t>(p)] = drivers[static_cast<size_t>(p)]->run(changes, o.records, 0, 0); });
    }
    for (auto& t : threads)
      t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double proc = bench::cpu_seconds() - proc0;  // every thread of this process (encode, parse, readers)
    double wcpu = 0, peak = 0;
    for (const RunResult& r : results) {
      wcpu += r.worker_cpu;
      peak = std::max(peak, r.rss_mib);
    }
    const double events = static_cast<double>(o.records) * parallelism;
    rates.push_back(events / seconds);
    cpu_us.push_back(proc / events * 1e6);
    worker_us.push_back(wcpu / events * 1e6);
    rss.push_back(peak);
  }
  std::printf("%-16s p=%d  %9.0f events/s (runs:", rt.name.c_str(), parallelism, bench::median(rates));
  for (double r : rates)
    std::printf(" %.0f", r);
  std::printf(")  CPU/event: engine %.2f us + worker %.2f us  worker peak RSS %.0f MiB\n", bench::median(cpu_us),
              bench::median(worker_us), bench::median(rss));
  std::fflush(stdout);
}

void latency(const Runtime& rt, const Options& o, const std::vector<Value>& changes) {
  {
    Driver d(rt, o);
    RunResult r = d.run(changes, 5000, 1000, 2);  // 1,000 events/s for 5 s, batch-max-delay 2 ms
    std::printf("%-16s added latency at 1,000 events/s (batch-max-delay 2 ms): p50 %.2f ms  p99 %.2f ms  max %.2f ms\n",
                rt.name.c_str(), percentile(r.latency_ms, 0.5), percentile(r.latency_ms, 0.99),
                percentile(r.latency_ms, 1.0));
  }
  {
    Driver d(rt, o);
    RunResult r = d.run(changes, o.records, 0, 0);
    std::printf("%-16s added latency at full speed (batch-size %zu, max-in-flight %zu): p50 %.2f ms  p99 %.2f ms\n",
                rt.name.c_str(), o.batch_size, o.max_in_flight, percentile(r.latency_ms, 0.5),
                percentile(r.latency_ms, 0.99));
  }
  std::fflush(stdout);
}

// The engine's side alone, no worker: encoding `batch_size` records into a batch frame, and parsing the result
// frame an identity function's worker sends back for them (into one Value per record, then dropped as the
// operator does after emitting), in µs per record of this thread's CPU. With the worker's own ceiling (a Node.js
// loop that only parses a batch frame, calls the function and stringifies the results: `--ceiling`), the bound
// of events/s per worker on two free cores is 1 / max(engine, worker).
void engine_only(const Options& o, const std::vector<Value>& changes) {
  udf::BatchFrame frame;
  std::string reply;
  const int rounds = static_cast<int>(std::max<int64_t>(1, o.records / static_cast<int64_t>(o.batch_size)));
  // The reply an identity worker sends: {"type":"result","id":1,"results":[{"ok":<record>},...]}.
  reply = R"({"type":"result","id":1,"results":[)";
  for (size_t i = 0; i < o.batch_size; ++i) {
    if (i > 0) reply += ',';
    reply += R"({"ok":)";
    changes[i % changes.size()].write_json(reply);
    reply += '}';
  }
  reply += "]}";
  double encode = 0, decode = 0;
  int64_t checksum = 0;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = thread_cpu_seconds();
    frame.open(1);
    for (size_t i = 0; i < o.batch_size; ++i) {
      if (!frame.append(changes[(static_cast<size_t>(r) * o.batch_size + i) % changes.size()]).ok()) std::exit(1);
    }
    checksum += static_cast<int64_t>(frame.close().size());
    const double t1 = thread_cpu_seconds();
    {
      auto results = udf::parse_result_frame(reply, 1, o.batch_size);
      if (!results.ok()) {
        std::fprintf(stderr, "%s\n", results.error().message().c_str());
        std::exit(1);
      }
      checksum += static_cast<int64_t>(results->size());
    }
    decode += thread_cpu_seconds() - t1;
    encode += t1 - t0;
  }
  const double n = static_cast<double>(rounds) * static_cast<double>(o.batch_size);
  std::printf(
      "engine alone (no worker): encode %.2f us + decode %.2f us = %.2f us per record (%.0f records/s on "
      "one core; checksum %lld)\n",
      encode / n * 1e6, decode / n * 1e6, (encode + decode) / n * 1e6, n / (encode + decode),
      static_cast<long long>(checksum));
  std::fflush(stdout);
}

// The Node.js worker's ceiling: the worker's own per-batch work (JSON.parse of the frame's text, the call of an
// identity function, the {ok} wrappers, one JSON.stringify, the UTF-8 encoding into a frame buffer) in a loop in
// one node process, without the socket, in µs per record of that process's CPU.
void node_ceiling(const Options& o, const std::vector<Value>& changes) {
  udf::BatchFrame frame;
  frame.open(1);
  for (size_t i = 0; i < o.batch_size; ++i)
    if (!frame.append(changes[i % changes.size()]).ok()) std::exit(1);
  const fs::path dir = fs::temp_directory_path() / fmt::format("sluice-function-ceiling-{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "frame.json") << frame.close();
  std::ofstream(dir / "ceiling.js") << R"(
const fs = require('fs');
const frame = fs.readFileSync(process.argv[2]);
const rounds = Number(process.argv[3]);
const fn = (change) => change;
function once() {
  const batch = JSON.parse(frame.toString('utf8'));
  const records = batch.records;
  const results = new Array(records.length);
  for (let i = 0; i < records.length; i++) results[i] = { ok: fn(records[i]) };
  const text = '{"type":"result","id":' + batch.id + ',"results":' + JSON.stringify(results) + '}';
  const n = Buffer.byteLength(text, 'utf8');
  const out = Buffer.allocUnsafe(4 + n);
  out.writeUInt32BE(n, 0);
  out.write(text, 4, n, 'utf8');
  return records.length;
}
for (let i = 0; i < 200; i++) once();
const c0 = process.cpuUsage();
let n = 0;
for (let i = 0; i < rounds; i++) n += once();
const c = process.cpuUsage(c0);
const us = (c.user + c.system) / n;
console.log(`node alone (parse, call, stringify; no socket): ${us.toFixed(2)} us per record (${Math.round(1e6 / us)} records/s on one core)`);
)";
  const int rounds = static_cast<int>(std::max<int64_t>(1, o.records / static_cast<int64_t>(o.batch_size)));
  const std::string cmd =
      fmt::format("node {} {} {}", (dir / "ceiling.js").string(), (dir / "frame.json").string(), rounds);
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "function-bench: %s failed\n", cmd.c_str());
  fs::remove_all(dir);
}

int main_impl(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--records")
      o.records = std::stoll(v);
    else if (k == "--batch-size")
      o.batch_size = std::stoul(v);
    else if (k == "--max-in-flight")
      o.max_in_flight = std::stoul(v);
    else if (k == "--runs")
      o.runs = std::stoi(v);
    else if (k == "--pix")
      o.pix = v;
    else if (k == "--only")
      o.only = v;
    else if (k == "--ceiling")
      o.ceiling = v == "1" || v == "true";
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("sluice-function-bench-{}", ::getpid());
  fs::create_directories(dir);
  {
    std::ofstream(dir / "identity.js") << "exports.identity = (change) => change;\n";
    std::ofstream(dir / "identity.py") << "def identity(change):\n    return change\n";
  }
  std::vector<Runtime> runtimes;
  runtimes.push_back({"node identity", udf::node_worker_command(512), (dir / "identity.js").string(), "identity"});
  runtimes.push_back({"python identity", udf::python_worker_command(512), (dir / "identity.py").string(), "identity"});
  if (!o.pix.empty()) {
    const fs::path project = fs::absolute(o.pix);
    auto prepared = udf::prepare_node_module(project / "domain" / "charges.ts", project);
    if (!prepared.ok()) {
      std::fprintf(stderr, "the Pix example does not build: %s\n", prepared.error().message().c_str());
      return 1;
    }
    runtimes.push_back({"node pix", udf::node_worker_command(512), prepared->path, "chargeEvent"});
  }
  const std::vector<Value> changes = make_changes(1000);
  std::printf("function-bench: %lld records per run, batch-size %zu, max-in-flight %zu, %d runs (median), %u cores\n",
              static_cast<long long>(o.records), o.batch_size, o.max_in_flight, o.runs,
              std::thread::hardware_concurrency());
  if (o.ceiling) {
    engine_only(o, changes);
    node_ceiling(o, changes);
    fs::remove_all(dir);
    return 0;
  }
  for (const Runtime& rt : runtimes) {
    if (!o.only.empty() && rt.name.find(o.only) == std::string::npos) continue;
    throughput(rt, o, changes, 1);
    throughput(rt, o, changes, 2);
    latency(rt, o, changes);
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::main_impl(argc, argv);
}
