// opensearch-bench: documents/s of the OpenSearch sink into a real node (docs/benchmarks.md, "OpenSearch sink").
//
//   scripts/services/run-with opensearch -- build/<dir>/bench/opensearch-bench [--docs N] [--batches 500,5000] ...
//
// For each batch size (--batches, actions per bulk request) and each of --runs runs: a fresh index (1 shard, 0
// replicas, refresh_interval -1 during the load, as bulk loads are usually run), then datagen -> OpenSearchSink of
// --docs documents with ids, about 200 bytes each (a charge: id, customer, status, amount, currency, timestamps),
// parallelism --parallelism, checkpoints every second (each one a flush of the open requests). The figure is
// documents/s from job start to FINISHED (every action acknowledged), checked against the index's _count after a
// refresh, and the CPU time of this process (the whole Sluice job: datagen, encoding, curl) per document. A first
// run (run 0) at the first batch size warms the node's JIT and is not counted. Prints one line per run and the
// median per batch size.
// Options: --docs N (200000), --batches 500,5000, --runs R (3), --parallelism P (1), --no-warmup,
// --url URL (OPENSEARCH_URL).
#include <curl/curl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/opensearch/opensearch_sink.h"
#include "sluice/core/config.h"
#include "sluice/core/logging.h"

namespace {

using sluice::bench::cpu_seconds;

struct Options {
  std::string url;
  int64_t docs = 200'000;
  std::vector<int64_t> batches = {500, 5000};
  int runs = 3;
  int parallelism = 1;
  bool warmup = true;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "opensearch-bench: %s\n", what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* u = std::getenv("OPENSEARCH_URL")) o.url = u;
  CLI::App app{"Documents/s of the OpenSearch sink by bulk request size", "opensearch-bench"};
  app.add_option("--docs", o.docs, "Documents per run")->capture_default_str();
  app.add_option("--batches", o.batches, "Bulk request sizes, comma-separated")->delimiter(',')->capture_default_str();
  app.add_option("--runs", o.runs, "Runs per batch size")->capture_default_str();
  app.add_option("--parallelism", o.parallelism, "Sink parallelism")->capture_default_str();
  app.add_flag("!--no-warmup", o.warmup, "Skip the uncounted warm-up run");
  app.add_option("--url", o.url, "OpenSearch URL (default: $OPENSEARCH_URL)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.url.empty()) die("no OPENSEARCH_URL: run it through scripts/services/run-with opensearch, or pass --url");
  return o;
}

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// One REST call to the node; dies on a transport error or a status >= 300.
std::string rest(const std::string& method, const std::string& url, const std::string& body = "") {
  CURL* c = curl_easy_init();
  std::string out;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (!body.empty()) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  if (rc != CURLE_OK) die(method + " " + url + ": " + curl_easy_strerror(rc));
  if (status >= 300) die(method + " " + url + ": HTTP " + std::to_string(status) + ": " + out);
  return out;
}

int64_t count_docs(const std::string& base, const std::string& index) {
  rest("POST", base + "/" + index + "/_refresh");
  const std::string body = rest("GET", base + "/" + index + "/_count");
  sluice::Value v = sluice::Value::from_json(body).value_or_throw();
  return v.find("count")->as_int64();
}

struct Run {
  double docs_per_s = 0;
  int64_t requests = 0;
  int64_t bytes = 0;
};

Run run_once(const Options& o, int64_t batch, int run) {
  const std::string index =
      "bench-" + std::to_string(::getpid()) + "-" + std::to_string(batch) + "-" + std::to_string(run);
  rest("PUT", o.url + "/" + index,
       R"({"settings":{"number_of_shards":1,"number_of_replicas":0,"refresh_interval":"-1"}})");
  auto sink = sluice::OpenSearchSink<int64_t>::builder()
                  .url(o.url)
                  .index(index)
                  .id([](const int64_t& i) { return "ch_" + std::to_string(i); })
                  .document_json([](const int64_t& i, std::string& out) {
                    char buf[256];
                    const int n = std::snprintf(
                        buf, sizeof buf,
                        R"({"id":"ch_%lld","customer":"cus_%lld","status":"%s","amount_cents":%lld,)"
                        R"("currency":"eur","created_ms":%lld,"updated_ms":%lld,"note":"benchmark charge"})",
                        static_cast<long long>(i), static_cast<long long>(i % 5000), i % 3 == 0 ? "paid" : "created",
                        static_cast<long long>((i * 7919) % 100000), static_cast<long long>(1796083199999 - i),
                        static_cast<long long>(1796083199999));
                    out.append(buf, static_cast<size_t>(n));
                  })
                  .batch(batch, 64LL << 20)
                  .build();
  sluice::Configuration c;
  c.set(sluice::options::kParallelism, o.parallelism);
  const std::filesystem::path chk =
      std::filesystem::temp_directory_path() / ("opensearch-bench-" + std::to_string(::getpid()));
  c.set_string(std::string(sluice::options::kCheckpointInterval.key), "1000ms");
  c.set(sluice::options::kCheckpointDir, "file://" + chk.string());
  sluice::StreamEnvironment env(c);
  env.from_source(sluice::datagen::sequence(0, o.docs - 1), "charges").sink_to(sink, "OpenSearch");
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  sluice::JobResult r = env.execute("opensearch-bench");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_us_per_doc = (cpu_seconds() - cpu0) * 1e6 / static_cast<double>(o.docs);
  std::filesystem::remove_all(chk);
  if (!r.ok()) die("job failed: " + (r.error ? r.error->to_string() : std::string("?")));
  const int64_t n = count_docs(o.url, index);
  if (n != o.docs)
    die("index " + index + " holds " + std::to_string(n) + " documents, expected " + std::to_string(o.docs));
  rest("DELETE", o.url + "/" + index);
  Run out;
  out.docs_per_s = static_cast<double>(o.docs) / secs;
  out.requests = sink->stats()->requests.load();
  out.bytes = sink->stats()->bytes_sent.load();
  std::printf(
      "batch %6lld run %d: %9.0f docs/s (%.2f s; sluice %.2f CPU us/doc; %lld requests, %.1f MB sent, %lld "
      "retries)\n",
      static_cast<long long>(batch), run, out.docs_per_s, secs, cpu_us_per_doc, static_cast<long long>(out.requests),
      static_cast<double>(out.bytes) / 1e6, static_cast<long long>(sink->stats()->retries.load()));
  std::fflush(stdout);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  sluice::init_logging();
  curl_global_init(CURL_GLOBAL_DEFAULT);
  std::printf("opensearch-bench: %lld documents per run into %s, parallelism %d\n", static_cast<long long>(o.docs),
              o.url.c_str(), o.parallelism);
  if (o.warmup) run_once(o, o.batches.front(), 0);  // warms the node's JIT; not counted
  for (int64_t batch : o.batches) {
    std::vector<double> rates;
    for (int run = 1; run <= o.runs; ++run)
      rates.push_back(run_once(o, batch, run).docs_per_s);
    std::sort(rates.begin(), rates.end());
    std::printf("batch %6lld: median %9.0f docs/s over %d runs (min %.0f, max %.0f)\n", static_cast<long long>(batch),
                rates[rates.size() / 2], o.runs, rates.front(), rates.back());
  }
  curl_global_cleanup();
  return 0;
}
