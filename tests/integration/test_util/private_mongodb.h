// A MongoDB-wire emulator of a test's own (scripts/services/mongodb with its own SLUICE_SERVICES_DIR, as
// PrivateKafka, private_kafka.h), for tests that pause it: the shared one serves other tests at the same time.
// Needs SLUICE_SOURCE_DIR (the repository root) defined for the test target.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "integration/test_util/private_kafka.h"  // run_command

namespace sluice::testing {

/// Started by the constructor, stopped (SIGCONT first) and removed by the destructor; uri() is empty (and a test
/// failure recorded) when it did not start. Not thread-safe: one test thread.
class PrivateMongoDb {
 public:
  /// `env`: variables for the script's start, e.g. "SLUICE_MONGODB_TLS_CERT=... SLUICE_MONGODB_TLS_KEY=...
  /// SLUICE_MONGODB_TLS_CA=..." (a TLS-only server; uri() then carries tls=true&tlsCAFile=...).
  explicit PrivateMongoDb(std::string env = "") : env_(std::move(env)) {
    char tmpl[] = "/tmp/sluice-private-mongo-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    dir_ = tmpl;
    const std::string out = script("start");
    const std::string key = "MONGODB_URI=";
    const size_t at = out.find(key);
    if (at != std::string::npos) uri_ = out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  }
  ~PrivateMongoDb() {
    if (dir_.empty()) return;
    resume();
    if (pid() > 0) script("stop");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateMongoDb(const PrivateMongoDb&) = delete;
  PrivateMongoDb& operator=(const PrivateMongoDb&) = delete;

  /// "mongodb://127.0.0.1:PORT" (with "/?tls=true&tlsCAFile=CA" for a TLS-only server).
  const std::string& uri() const { return uri_; }
  /// SIGSTOP: connections stay open and nothing answers.
  void pause() {
    const pid_t p = pid();
    ASSERT_GT(p, 0) << "the private server is not running";
    ASSERT_EQ(::kill(p, SIGSTOP), 0);
    paused_ = p;
  }
  void resume() {
    if (paused_ > 0) ::kill(paused_, SIGCONT);
    paused_ = -1;
  }

 private:
  std::string script(const std::string& verb) {
    return run_command(env_ + " SLUICE_SERVICES_DIR='" + dir_ + "' '" + std::string(SLUICE_SOURCE_DIR) +
                       "/scripts/services/mongodb' " + verb + " 2>&1");
  }
  pid_t pid() const {
    std::ifstream f(dir_ + "/mongodb/pid");
    long p = -1;
    if (!(f >> p)) return -1;
    return ::kill(static_cast<pid_t>(p), 0) == 0 ? static_cast<pid_t>(p) : -1;
  }

  std::string env_;
  std::string dir_;
  std::string uri_;
  pid_t paused_ = -1;
};

}  // namespace sluice::testing
