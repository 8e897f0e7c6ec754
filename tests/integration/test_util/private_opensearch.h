// An OpenSearch node of a test's own (scripts/services/opensearch with its own SLUICE_SERVICES_DIR, as
// PrivateMongoDb, private_mongodb.h), for tests that need it configured differently from the shared one: with the
// security plugin (HTTPS, users). Needs SLUICE_SOURCE_DIR (the repository root) defined for the test target.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "integration/test_util/private_kafka.h"  // run_command

namespace sluice::testing {

/// Started by the constructor, stopped and removed by the destructor; url() is empty (and a test failure
/// recorded) when it did not start. Not thread-safe: one test thread.
class PrivateOpenSearch {
 public:
  /// `env`: variables for the script's start, e.g. "SLUICE_OPENSEARCH_TLS_CERT=... SLUICE_OPENSEARCH_TLS_KEY=...
  /// SLUICE_OPENSEARCH_TLS_CA=... SLUICE_OPENSEARCH_USERS=user:password" (the security plugin: HTTPS only, basic
  /// authentication; url() is then https://...).
  explicit PrivateOpenSearch(std::string env = "") : env_(std::move(env)) {
    char tmpl[] = "/tmp/sluice-private-opensearch-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    dir_ = tmpl;
    // As root the node runs as the services' own user (scripts/services/opensearch), which must reach its folder.
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                           std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                           std::filesystem::perms::others_exec);
    const std::string out = script("start");
    const std::string key = "OPENSEARCH_URL=";
    const size_t at = out.find(key);
    if (at != std::string::npos) url_ = out.substr(at + key.size(), out.find('\n', at) - at - key.size());
    if (url_.empty()) ADD_FAILURE() << "the private OpenSearch did not start: " << out;
  }
  ~PrivateOpenSearch() {
    if (dir_.empty()) return;
    script("stop");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateOpenSearch(const PrivateOpenSearch&) = delete;
  PrivateOpenSearch& operator=(const PrivateOpenSearch&) = delete;

  /// "http://127.0.0.1:PORT", or "https://..." with the security plugin.
  const std::string& url() const { return url_; }

 private:
  std::string script(const std::string& verb) {
    return run_command(env_ + " SLUICE_SERVICES_DIR='" + dir_ + "' '" + std::string(SLUICE_SOURCE_DIR) +
                       "/scripts/services/opensearch' " + verb + " 2>&1");
  }

  std::string env_;
  std::string dir_;
  std::string url_;
};

}  // namespace sluice::testing
