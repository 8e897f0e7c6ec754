// A module that answers like Sluice's RocksDB module but was built from another RocksDBInstance interface (its
// interface token is not this build's): what a module left from an older build looks like to the loader.
// rocksdb_module_test expects it to be refused before anything in it is called.
#include "sluice/state/rocksdb/rocksdb_module.h"

namespace {
const sluice::RocksDBModule kOtherBuild{sluice::kRocksDBModuleAbiVersion, "0123456789abcdef", nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) const sluice::RocksDBModule* sluice_rocksdb_module() {
  return &kOtherBuild;
}
