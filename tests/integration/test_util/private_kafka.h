// A Kafka broker of a test's own, for tests that pause, bounce or stop their broker: the shared broker of
// scripts/services/kafka serves every other test at the same time and must never be disturbed. It is the same
// script run with its own SLUICE_SERVICES_DIR (a fresh temporary directory), so it has its own state, data, pid
// file, lock and two free loopback ports (the script picks them with svc_free_port). The default instance's
// `start|stop|env` are untouched. A start takes 10-40 s on a busy machine (a JVM).
// Needs SLUICE_SOURCE_DIR (the repository root) defined for the test target.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace sluice::testing {

/// Runs `cmd` through the shell and returns its stdout ("" and a test failure when it exits non-zero).
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen " << cmd;
    return out;
  }
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    out.append(buf.data(), n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << cmd << " failed:\n" << out;
  return rc == 0 ? out : std::string();
}

/// A private single-node broker, started by the constructor and stopped (its state removed) by the destructor.
/// bootstrap() is empty (and a test failure recorded) when it did not start. Not thread-safe: one test thread.
class PrivateKafka {
 public:
  /// `env`: variables for the script's start, e.g. "SLUICE_KAFKA_SASL_PLAIN_USERS='alice:secret'" (a SASL_PLAINTEXT
  /// listener, then in sasl_bootstrap()), "SLUICE_KAFKA_SSL_CERT=s.crt SLUICE_KAFKA_SSL_KEY=s.key" (an SSL listener,
  /// then in ssl_bootstrap()).
  explicit PrivateKafka(std::string env = "") : env_(std::move(env)) {
    char tmpl[] = "/tmp/sluice-private-kafka-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    dir_ = tmpl;
    const std::string out = script("start");
    bootstrap_ = value_of(out, "KAFKA_BOOTSTRAP_SERVERS=");
    sasl_bootstrap_ = value_of(out, "KAFKA_SASL_BOOTSTRAP_SERVERS=");
    ssl_bootstrap_ = value_of(out, "KAFKA_SSL_BOOTSTRAP_SERVERS=");
  }
  ~PrivateKafka() {
    if (dir_.empty()) return;
    resume();
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateKafka(const PrivateKafka&) = delete;
  PrivateKafka& operator=(const PrivateKafka&) = delete;

  /// host:port of its client listener, e.g. "127.0.0.1:40123".
  const std::string& bootstrap() const { return bootstrap_; }
  /// host:port of its SASL_PLAINTEXT listener ("" without SLUICE_KAFKA_SASL_PLAIN_USERS).
  const std::string& sasl_bootstrap() const { return sasl_bootstrap_; }
  /// host:port of its SSL listener ("" without SLUICE_KAFKA_SSL_CERT).
  const std::string& ssl_bootstrap() const { return ssl_bootstrap_; }

  /// SIGSTOP: the broker's connections stay open and nothing answers (a hung broker, a network partition).
  void pause() {
    const pid_t p = pid();
    ASSERT_GT(p, 0) << "the private broker is not running";
    ASSERT_EQ(::kill(p, SIGSTOP), 0);
  }
  void resume() {
    if (pid() > 0) ::kill(pid(), SIGCONT);
  }
  /// A broker bounce (`kafka restart`): stopped (SIGTERM, controlled shutdown) and started again on the same
  /// ports and data; returns when it answers again. False (and a test failure) when the script failed.
  bool restart() { return !script("restart").empty(); }
  void stop() {
    if (pid() > 0) script("stop");
  }
  /// Runs Kafka's kafka-transactions.sh (TransactionsCommand, KIP-664) against this broker with `args`, e.g.
  /// "abort --topic t --partition 0 --start-offset 5"; returns its output followed by "(exit 0)", or "" when it
  /// failed (abort prints nothing when it succeeds).
  std::string transactions(const std::string& args) {
    return script("transactions " + args + " 2>&1 && echo '(exit 0)'");
  }

 private:
  static std::string value_of(const std::string& text, const std::string& key) {
    const size_t at = text.find(key);
    if (at == std::string::npos || (at > 0 && text[at - 1] != '\n')) {
      const size_t again = text.find("\n" + key);
      if (again == std::string::npos) return {};
      return value_of(text.substr(again + 1), key);
    }
    return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  }
  std::string script(const std::string& verb) {
    return run_command(env_ + " SLUICE_SERVICES_DIR='" + dir_ + "' '" + std::string(SLUICE_SOURCE_DIR) +
                       "/scripts/services/kafka' " + verb + " 2>&1");
  }
  // The broker's pid while it runs (the script's pid file), else -1.
  pid_t pid() const {
    std::ifstream f(dir_ + "/kafka/pid");
    long p = -1;
    if (!(f >> p)) return -1;
    return ::kill(static_cast<pid_t>(p), 0) == 0 ? static_cast<pid_t>(p) : -1;
  }

  std::string env_;
  std::string dir_;
  std::string bootstrap_;
  std::string sasl_bootstrap_;
  std::string ssl_bootstrap_;
};

}  // namespace sluice::testing
