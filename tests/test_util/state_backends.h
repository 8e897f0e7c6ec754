// The keyed state backends the operator suites run against (issue 18: the keyed-state, window, join and timer
// suites pass on both): a parameterised test takes its backend name from kStateBackends and builds its
// StreamEnvironment from backend_configuration().
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "sluice/core/config.h"

namespace sluice::testing {

/// The backends: the heap (typed states), RocksDB (a database per keyed subtask under the temp directory, removed
/// when the subtask ends) with timers on the heap, and RocksDB with timers in the database too
/// (state.backend.rocksdb.timer-service.factory: rocksdb).
inline const auto kStateBackends =
    ::testing::Values(std::string("hashmap"), std::string("rocksdb"), std::string("rocksdb_timers"));

/// A job configuration on `backend` (a kStateBackends value); RocksDB gets a small fixed memory budget per
/// database (8 MiB), since a test runs many subtasks at once.
inline Configuration backend_configuration(const std::string& backend) {
  Configuration c;
  if (backend == "rocksdb_timers") {
    c.set(options::kStateBackendType, std::string("rocksdb"));
    c.set_string(std::string(options::kRocksDBTimerServiceFactory.key), "rocksdb");
  } else {
    c.set(options::kStateBackendType, backend);
  }
  c.set_string(std::string(options::kRocksDBMemoryFixedPerSlot.key), "8mb");
  return c;
}

/// The backend name as the test name's suffix (WindowTest.Tumbling/rocksdb).
inline std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace sluice::testing
