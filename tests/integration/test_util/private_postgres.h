// A Postgres server of a test's own, for tests that pause or stop their server: the shared server of
// scripts/services/postgres serves every other test at the same time and must never be disturbed. It is the same
// script run with its own SLUICE_SERVICES_DIR (a fresh temporary directory), so it has its own cluster, port, pid
// file and lock (as PrivateKafka, private_kafka.h). A start takes a few seconds (initdb).
// Needs SLUICE_SOURCE_DIR (the repository root) defined for the test target.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integration/test_util/private_kafka.h"  // run_command

namespace sluice::testing {

/// A private Postgres 15 cluster, started by the constructor (with the script's settings: wal_level logical, trust
/// on loopback) and stopped, its state removed, by the destructor. conninfo() is empty (and a test failure
/// recorded) when it did not start. Not thread-safe: one test thread.
class PrivatePostgres {
 public:
  PrivatePostgres() {
    char tmpl[] = "/tmp/sluice-private-pg-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    dir_ = tmpl;
    const std::string out = script("start");
    port_ = value_of(out, "PGPORT=");
    if (!port_.empty()) conninfo_ = "host=127.0.0.1 port=" + port_ + " dbname=sluice user=sluice";
  }
  ~PrivatePostgres() {
    if (dir_.empty()) return;
    resume();
    if (pid() > 0) script("stop");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivatePostgres(const PrivatePostgres&) = delete;
  PrivatePostgres& operator=(const PrivatePostgres&) = delete;

  /// "host=127.0.0.1 port=N dbname=sluice user=sluice".
  const std::string& conninfo() const { return conninfo_; }
  const std::string& port() const { return port_; }
  /// The cluster's data directory (postgresql.conf, pg_hba.conf).
  std::string data_dir() const { return dir_ + "/postgres/data"; }
  /// Gives `path` to the server's system user (sluice-svc when the tests run as root, see the script), mode `mode`.
  void give_to_server(const std::string& path, const std::string& mode) const {
    if (::getuid() == 0) run_command("chown sluice-svc:sluice-svc '" + path + "'");
    run_command("chmod " + mode + " '" + path + "'");
  }

  /// SIGSTOP to the postmaster and every server process (backends, walsenders): connections stay open and nothing
  /// answers, as a hung host or a network partition.
  void pause() {
    paused_ = processes();
    ASSERT_FALSE(paused_.empty()) << "the private server is not running";
    for (const pid_t p : paused_)
      ASSERT_EQ(::kill(p, SIGSTOP), 0) << p;
  }
  void resume() {
    for (const pid_t p : paused_)
      ::kill(p, SIGCONT);
    paused_.clear();
  }

 private:
  static std::string value_of(const std::string& text, const std::string& key) {
    const size_t at = text.find(key);
    if (at == std::string::npos) return {};
    return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  }
  std::string script(const std::string& verb) {
    return run_command("SLUICE_SERVICES_DIR='" + dir_ + "' '" + std::string(SLUICE_SOURCE_DIR) +
                       "/scripts/services/postgres' " + verb + " 2>&1");
  }
  // The postmaster's pid while it runs (the script's pid file), else -1.
  pid_t pid() const {
    std::ifstream f(dir_ + "/postgres/pid");
    long p = -1;
    if (!(f >> p)) return -1;
    return ::kill(static_cast<pid_t>(p), 0) == 0 ? static_cast<pid_t>(p) : -1;
  }
  // The postmaster and its children.
  std::vector<pid_t> processes() const {
    std::vector<pid_t> out;
    const pid_t root = pid();
    if (root <= 0) return out;
    out.push_back(root);
    std::ifstream children("/proc/" + std::to_string(root) + "/task/" + std::to_string(root) + "/children");
    long c = 0;
    while (children >> c)
      out.push_back(static_cast<pid_t>(c));
    return out;
  }

  std::string dir_;
  std::string port_;
  std::string conninfo_;
  std::vector<pid_t> paused_;
};

}  // namespace sluice::testing
