// A module that answers like Sluice's RocksDB module but was built from another RocksDBInstance interface (its
// interface token is not this build's): what a module left from an older build looks like to the loader.
// rocksdb_module_test expects it to be refused before anything in it is called.
#include <cstdio>
#include <cstdlib>

#include "sluice/state/rocksdb/rocksdb_module.h"

namespace {
// Called only if the loader let this module through: says so where the test looks, and dies.
std::shared_ptr<sluice::RocksDBInstance> open_from_another_build(const std::filesystem::path&,
                                                                 const sluice::RocksDBMemoryOptions&, bool) {
  std::fprintf(stderr, "FAKE MODULE CALLED\n");
  std::abort();
}
const sluice::RocksDBModule kOtherBuild{sluice::kRocksDBModuleAbiVersion, "0123456789abcdef", &open_from_another_build};
}  // namespace

extern "C" __attribute__((visibility("default"))) const sluice::RocksDBModule* sluice_rocksdb_module() {
  return &kOtherBuild;
}
