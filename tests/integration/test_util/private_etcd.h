// A three-member etcd cluster of one test binary's own (scripts/services/etcd with a private SLUICE_SERVICES_DIR),
// for tests that stop and restart members and so must not touch the shared service. Started by the constructor
// (empty data), stopped and removed by the destructor; script() runs the service script's other verbs on it
// (member-restart N, member-kill N, member-start N, status). Needs SLUICE_SOURCE_DIR. Test-thread only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "integration/test_util/private_kafka.h"  // run_command

#ifndef SLUICE_SOURCE_DIR
#error "SLUICE_SOURCE_DIR must name the source tree (for scripts/services/etcd)"
#endif

namespace sluice::testing {

class PrivateEtcd {
 public:
  PrivateEtcd() {
    char tmpl[] = "/tmp/sluice-private-etcd-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    const std::string out = script("start");
    const std::string key = "ETCD_ENDPOINTS=";
    const size_t at = out.find(key);
    if (at != std::string::npos) endpoints_ = out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  }
  ~PrivateEtcd() {
    if (dir_.empty()) return;
    script("stop");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateEtcd(const PrivateEtcd&) = delete;
  PrivateEtcd& operator=(const PrivateEtcd&) = delete;

  /// "http://127.0.0.1:P0,http://127.0.0.1:P1,http://127.0.0.1:P2"; empty when the cluster did not start.
  const std::string& endpoints() const { return endpoints_; }
  /// Runs `scripts/services/etcd <args>` on this cluster; its output (stdout and stderr).
  std::string script(const std::string& args) {
    return run_command("SLUICE_SERVICES_DIR=" + dir_ +
                       " SLUICE_ETCD_MEMBERS=3 " SLUICE_SOURCE_DIR "/scripts/services/etcd " + args + " 2>&1");
  }

 private:
  std::string dir_;
  std::string endpoints_;
};

}  // namespace sluice::testing
