// Seeded failure injection for the recovery tests: a job fails at record counts drawn from a logged seed, so a
// failing run can be replayed with SLUICE_TEST_SEED.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace sluice::testing {

/// The seed of a test's random choices: SLUICE_TEST_SEED when set, else a fixed default. Tests print it.
inline uint64_t test_seed() {
  const char* s = std::getenv("SLUICE_TEST_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 20261130ULL;
}

/// Counts the records one subtask sees and throws std::runtime_error("injected failure N") when the count
/// reaches the next threshold, `thresholds.size()` times over the whole job: every subtask and attempt shares
/// `fired` (the number of failures so far), so each failure fires once. Copied into map functions; each copy
/// counts its own records.
struct InjectedFailures {
  std::shared_ptr<std::atomic<int>> fired;
  std::shared_ptr<const std::vector<int64_t>> thresholds;
  int64_t seen = 0;

  void on_record() {
    int k = fired->load();
    if (k < static_cast<int>(thresholds->size()) && ++seen >= (*thresholds)[static_cast<size_t>(k)]) {
      if (fired->compare_exchange_strong(k, k + 1))
        throw std::runtime_error("injected failure " + std::to_string(k + 1));
    }
  }
};

/// A map function that passes records through unchanged and injects the failures.
template <class T>
struct FailingIdentity {
  InjectedFailures failures;
  T operator()(const T& record) {
    failures.on_record();
    return record;
  }
};

}  // namespace sluice::testing
