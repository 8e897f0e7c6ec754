// The `sluice` command line: version, and the bundled examples (the pipeline runner comes with `sluice run`).
#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/stream_environment.h"
#include "sluice/core/logging.h"
#include "word_count.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif
#ifndef SLUICE_EXAMPLES_DATA_DIR
#define SLUICE_EXAMPLES_DATA_DIR "examples/data"
#endif

namespace {

using sluice::Configuration;
using sluice::JobResult;
using sluice::StreamEnvironment;

/// Applies `-D key=value` flags to the environment's configuration; returns false on a malformed one.
bool apply_properties(StreamEnvironment& env, const std::vector<std::string>& props) {
  for (const auto& p : props) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      fmt::print(stderr, "error: -D {} is not of the form key=value\n", p);
      return false;
    }
    env.config().set_string(p.substr(0, eq), p.substr(eq + 1));
  }
  return true;
}

/// Runs the job; SIGINT or SIGTERM cancels it (the job then reports CANCELED) instead of killing the process.
JobResult run_cancellable(StreamEnvironment& env, const std::string& name) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // task threads inherit the mask; one thread waits below
  sluice::JobClient client = env.execute_async(name);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      timespec timeout{0, 100'000'000};
      if (sigtimedwait(&signals, nullptr, &timeout) > 0) {
        fmt::print(stderr, "cancelling job '{}'\n", name);
        client.cancel();
        return;
      }
    }
  });
  JobResult r = client.wait();
  done.store(true);
  watcher.join();
  return r;
}

int report(const JobResult& r) {
  std::fflush(stdout);  // the job's output first, then the summary on stderr
  if (r.ok()) {
    fmt::print(stderr, "job '{}' finished in {} ms\n", r.job_name, r.duration.count());
    for (const auto& op : r.operators) {
      fmt::print(stderr, "  {:<28} parallelism {:>2}  records in {:>10}  out {:>10}\n", op.name, op.parallelism,
                 op.records_in, op.records_out);
    }
    return 0;
  }
  fmt::print(stderr, "job '{}' {}: {}\n", r.job_name, sluice::job_status_name(r.status),
             r.error ? r.error->to_string() : "no error recorded");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sluice: a stateful stream processor (the Flink model, as native code)", "sluice"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();

  auto* version = app.add_subcommand("version", "Print the version");

  auto* example = app.add_subcommand("example", "Run a bundled example job on the local mini-cluster");
  example->require_subcommand(1);
  auto* list = example->add_subcommand("list", "List the examples");

  int parallelism = 2;
  std::vector<std::string> props;
  auto* wc = example->add_subcommand("wordcount", "Count words in text files (default: a bundled text)");
  std::vector<std::string> inputs{std::string(SLUICE_EXAMPLES_DATA_DIR) + "/hamlet.txt"};
  int top = 15;
  std::string output;
  wc->add_option("-i,--input", inputs, "Files, directories or glob patterns")->capture_default_str();
  wc->add_option("-p,--parallelism", parallelism, "Parallelism")->capture_default_str()->check(CLI::Range(1, 1024));
  wc->add_option("--top", top, "How many of the most frequent words to print")
      ->capture_default_str()
      ->check(CLI::Range(0, 1'000'000'000));
  wc->add_option("-o,--output", output, "Write every word's count to this file (word<TAB>count)");
  wc->add_option("-D", props, "Configuration key=value (repeatable)");

  auto* rs = example->add_subcommand("running-sum", "Per-customer running sum over generated charges");
  int64_t count = 20;
  uint64_t seed = 42;
  rs->add_option("-n,--count", count, "Number of charges")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 53));
  rs->add_option("--seed", seed, "Random seed (runs are reproducible)")->capture_default_str();
  rs->add_option("-p,--parallelism", parallelism, "Parallelism")->capture_default_str()->check(CLI::Range(1, 1024));
  rs->add_option("-D", props, "Configuration key=value (repeatable)");

  CLI11_PARSE(app, argc, argv);
  sluice::init_logging();
  spdlog::set_level(spdlog::level::from_str(log_level));

  if (version->parsed()) {
    fmt::print("sluice {}\n", SLUICE_VERSION);
    return 0;
  }
  if (list->parsed()) {
    fmt::print("wordcount     count words in text files (bundled: {}/hamlet.txt)\n", SLUICE_EXAMPLES_DATA_DIR);
    fmt::print("running-sum   per-customer running sum over seeded random charges (datagen)\n");
    return 0;
  }
  StreamEnvironment env;
  env.set_parallelism(parallelism);
  if (!apply_properties(env, props)) return 2;

  try {
    if (wc->parsed()) {
      std::map<std::string, int64_t> result;
      std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_file(nullptr, &std::fclose);
      if (!output.empty()) {  // open before the job runs, so a bad path fails at once
        out_file.reset(std::fopen(output.c_str(), "w"));
        if (!out_file) {
          fmt::print(stderr, "error: cannot write '{}': {}\n", output, std::strerror(errno));
          return 1;
        }
      }
      sluice::examples::build_word_count(env, inputs,
                                         [&](const std::map<std::string, int64_t>& counts) { result = counts; });
      JobResult r = run_cancellable(env, "word count");
      if (!r.ok()) return report(r);
      std::vector<std::pair<std::string, int64_t>> sorted(result.begin(), result.end());
      std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
      int64_t total = 0;
      for (const auto& [w, c] : sorted)
        total += c;
      fmt::print("{} words, {} distinct; the {} most frequent:\n", total, sorted.size(),
                 std::min<size_t>(static_cast<size_t>(top), sorted.size()));
      for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(top); ++i) {
        fmt::print("{:>6}  {}\n", sorted[i].second, sorted[i].first);
      }
      if (out_file) {
        for (const auto& [w, c] : result)
          fmt::print(out_file.get(), "{}\t{}\n", w, c);
        if (std::fflush(out_file.get()) != 0 || std::ferror(out_file.get()) != 0) {
          fmt::print(stderr, "error: writing '{}' failed: {}\n", output, std::strerror(errno));
          return 1;
        }
      }
      if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
        fmt::print(stderr, "error: writing to stdout failed: {}\n", std::strerror(errno));
        return 1;
      }
      return report(r);
    }
    if (rs->parsed()) {
      sluice::examples::build_running_sum(env, count, seed);
      return report(run_cancellable(env, "running sum"));
    }
  } catch (const sluice::SluiceException& e) {
    fmt::print(stderr, "error: {}\n", e.error().to_string());
    return 1;
  }
  return 0;
}
