// The entry of the loadable module libsluice_rocksdb.so (rocksdb_database.cc), shared by the module and its loader
// (rocksdb_module_loader.cc): the process dlopen()s the module on its first RocksDBInstance::open() and calls
// `sluice_rocksdb_module()` (extern "C") for this table. A process that never opens a database never maps librocksdb.
//
// Where the loader looks, first match wins:
//   1. $SLUICE_ROCKSDB_MODULE, the module's path, when set (and nowhere else then);
//   2. libsluice_rocksdb.so beside the running executable (/proc/self/exe): a binary copied with its module;
//   3. <executable's directory>/../lib/sluice/libsluice_rocksdb.so: an installed layout (/usr/local/bin/sluice and
//      /usr/local/lib/sluice/, as deploy/docker/Dockerfile lays out the image);
//   4. the module's path in the build tree the binary was built in (SLUICE_ROCKSDB_MODULE_PATH).
//
// Threading: the table is immutable; the loader loads once per process under a mutex.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "sluice/state/rocksdb_instance.h"

namespace sluice {

/// Bumped whenever RocksDBInstance's interface or this table changes, so a module of another build is refused
/// instead of called through a different vtable layout.
inline constexpr uint32_t kRocksDBModuleAbiVersion = 2;

/// The file name of the module, and the name of its entry function.
inline constexpr const char* kRocksDBModuleFileName = "libsluice_rocksdb.so";
inline constexpr const char* kRocksDBModuleEntry = "sluice_rocksdb_module";

/// A digest of the interface's headers (rocksdb_instance.h, this file, core/error.h), the compiler, the C++ standard
/// and the build's flags, computed by CMake
/// for the module and its loader alike: a module built from another interface is refused even when
/// kRocksDBModuleAbiVersion was not bumped (a binary copied from an older build, a module replaced under a running
/// process).
inline constexpr const char* kRocksDBModuleInterfaceToken = SLUICE_ROCKSDB_INTERFACE_TOKEN;

/// What the module's entry returns. `abi_version` stays the first member, so any module's can be read.
struct RocksDBModule {
  uint32_t abi_version = 0;
  const char* interface_token = nullptr;  ///< the module's kRocksDBModuleInterfaceToken
  /// RocksDBInstance::open (existing = false) and open_existing (true); throws as they do.
  std::shared_ptr<RocksDBInstance> (*open)(const std::filesystem::path& dir, const RocksDBMemoryOptions& memory,
                                           bool existing) = nullptr;
};

/// The module's table, loaded on the first call (thread-safe). Throws SluiceException (kConfiguration) naming every
/// place tried and why each failed (dlerror(), or an ABI version of another build).
const RocksDBModule& rocksdb_module();

}  // namespace sluice
