// Finds the real services (Kafka, ...) that integration tests run against. The services are started by
// scripts/services/ and announced through environment variables (scripts/services/run-with exports each
// service's `env` lines before it runs the tests). See docs/services.md.
//
// A test that needs a service calls require_service() from its fixture's SetUp() (or uses
// SLUICE_REQUIRE_SERVICE in a test body). When the service's variables are missing the test FAILS, telling
// how to run it, so that no test silently skips in CI; with SLUICE_SKIP_SERVICES set (a developer's quick
// loop without services) it is skipped instead.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::testing {

/// One service's connection settings: the KEY=VALUE lines its script's `env` prints.
struct ServiceEnv {
  std::string name;
  bool available = false;
  std::map<std::string, std::string> vars;

  /// The value of one of the service's variables ("" when absent).
  const std::string& get(const std::string& key) const {
    static const std::string empty;
    auto it = vars.find(key);
    return it == vars.end() ? empty : it->second;
  }
};

/// The environment variables each service's script exports (its `env` output). Add a service here when its
/// script lands in scripts/services/.
inline const std::map<std::string, std::vector<std::string>>& known_services() {
  static const std::map<std::string, std::vector<std::string>> services = {
      {"kafka", {"KAFKA_BOOTSTRAP_SERVERS"}},
      {"mongodb", {"MONGODB_URI"}},
      {"opensearch", {"OPENSEARCH_URL"}},
      {"postgres", {"PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "POSTGRES_URL"}},
      {"prometheus", {"PROMETHEUS_URL", "PROMETHEUS_TARGETS_DIR", "PROMETHEUS_RULES_DIR"}},
      {"s3", {"S3_ENDPOINT", "S3_SERVER_BIN"}},
  };
  return services;
}

namespace detail {
inline ServiceEnv read_service_env(const std::string& name, std::string& missing) {
  ServiceEnv env;
  env.name = name;
  auto it = known_services().find(name);
  if (it == known_services().end()) {
    missing = "<unknown service '" + name + "': add it to known_services() in tests/integration/test_util/services.h>";
    return env;
  }
  for (const auto& key : it->second) {
    const char* v = std::getenv(key.c_str());
    if (v == nullptr || *v == '\0') {
      missing += (missing.empty() ? "" : ", ") + key;
    } else {
      env.vars[key] = v;
    }
  }
  env.available = missing.empty();
  return env;
}
}  // namespace detail

/// A name for a per-test resource in a shared service (a topic, a collection, a slot): `prefix`, the pid, the
/// wall clock and a counter, so that neither concurrent runs nor reruns against a kept service collide.
inline std::string unique_name(const std::string& prefix) {
  static std::atomic<int> n{0};
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(ms % 100000000) + "_" + std::to_string(n++);
}

/// The settings of a running service. When they are missing this records a fatal failure in the current
/// test (or a skip, with SLUICE_SKIP_SERVICES set) and returns an unavailable env: call it from SetUp(),
/// where gtest then does not run the test body, or use SLUICE_REQUIRE_SERVICE in a test body.
inline const ServiceEnv& require_service(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, ServiceEnv> cache;
  static std::map<std::string, std::string> missing_by_name;
  std::string missing;
  const ServiceEnv* env;
  {
    std::lock_guard lock(mu);
    auto it = cache.find(name);
    if (it == cache.end()) {
      it = cache.emplace(name, detail::read_service_env(name, missing_by_name[name])).first;
    }
    env = &it->second;
    missing = missing_by_name[name];
  }
  if (env->available) return *env;
  const char* skip = std::getenv("SLUICE_SKIP_SERVICES");
  if (skip != nullptr && *skip != '\0') {
    [&] {
      GTEST_SKIP() << "service '" << name << "' is not running (missing " << missing
                   << ") and SLUICE_SKIP_SERVICES is set: skipping";
    }();
  } else {
    [&] {
      GTEST_FAIL() << "service '" << name << "' is not running (missing " << missing << "). Run the tests through "
                   << "scripts/services/run-with " << name << " -- <test command>, e.g. scripts/services/run-with "
                   << name << " -- ctest --test-dir build/release -L integration; or start it with "
                   << "scripts/services/" << name << " start and export the lines of scripts/services/" << name
                   << " env. Set SLUICE_SKIP_SERVICES=1 to skip such tests locally instead (never in CI).";
    }();
  }
  return *env;
}

/// The Kafka bootstrap servers ("127.0.0.1:PORT"), or "" after recording a failure/skip (see require_service).
inline std::string kafka_bootstrap_servers() {
  return require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
}

}  // namespace sluice::testing

/// In a test body: binds VAR to the service's env, or returns from the test (failed, or skipped with
/// SLUICE_SKIP_SERVICES) when the service is not running.
#define SLUICE_REQUIRE_SERVICE(var, service_name)                                              \
  const ::sluice::testing::ServiceEnv& var = ::sluice::testing::require_service(service_name); \
  if (!var.available) return
