// RocksDBInstance::open and open_existing: load libsluice_rocksdb.so on first use (rocksdb_module.h says where from
// and why) and open the database through it.
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "rocksdb_module.h"
#include "sluice/core/error.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {

namespace {

// Loads the module at `path`; returns its table, or nullptr with the reason appended to `tried`.
const RocksDBModule* load(const std::filesystem::path& path, std::vector<std::string>& tried) {
  // RTLD_NODELETE: instances, their snapshots and RocksDB's threads may outlive any handle; the module stays.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    tried.push_back(fmt::format("{} ({})", path.string(), why != nullptr ? why : "dlopen failed"));
    return nullptr;
  }
  using Entry = const RocksDBModule* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kRocksDBModuleEntry));
  if (entry == nullptr) {
    tried.push_back(fmt::format("{} (no {}: not Sluice's RocksDB module)", path.string(), kRocksDBModuleEntry));
    return nullptr;
  }
  const RocksDBModule* module = entry();
  if (module == nullptr || module->abi_version != kRocksDBModuleAbiVersion || module->open == nullptr) {
    tried.push_back(fmt::format("{} (interface version {}, this binary needs {}: a module of another build)",
                                path.string(), module != nullptr ? module->abi_version : 0, kRocksDBModuleAbiVersion));
    return nullptr;
  }
  spdlog::debug("RocksDB state backend: loaded {}", path.string());
  return module;
}

std::vector<std::filesystem::path> candidates() {
  if (const char* env = std::getenv("SLUICE_ROCKSDB_MODULE"); env != nullptr && *env != '\0') return {env};
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back(exe.parent_path() / kRocksDBModuleFileName);
    paths.push_back(exe.parent_path().parent_path() / "lib" / "sluice" / kRocksDBModuleFileName);
  }
#ifdef SLUICE_ROCKSDB_MODULE_PATH
  paths.emplace_back(SLUICE_ROCKSDB_MODULE_PATH);
#endif
  return paths;
}

}  // namespace

const RocksDBModule& rocksdb_module() {
  static std::mutex mu;
  static const RocksDBModule* loaded = nullptr;
  std::lock_guard lock(mu);
  if (loaded != nullptr) return *loaded;
  std::vector<std::string> tried;
  for (const std::filesystem::path& path : candidates()) {
    if (path.empty()) continue;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried.push_back(path.string() + " (no such file)");
      continue;
    }
    loaded = load(path, tried);
    if (loaded != nullptr) return *loaded;
  }
  throw SluiceException(Error(
      ErrorCode::kConfiguration,
      fmt::format("state.backend.type 'rocksdb' needs Sluice's RocksDB module {}, which could not be loaded; tried: {}"
                  " (set SLUICE_ROCKSDB_MODULE to its path)",
                  kRocksDBModuleFileName, fmt::join(tried, "; "))));
}

std::shared_ptr<RocksDBInstance> RocksDBInstance::open(const std::filesystem::path& dir,
                                                       const RocksDBMemoryOptions& memory) {
  return rocksdb_module().open(dir, memory, /*existing=*/false);
}

std::shared_ptr<RocksDBInstance> RocksDBInstance::open_existing(const std::filesystem::path& dir,
                                                                const RocksDBMemoryOptions& memory) {
  return rocksdb_module().open(dir, memory, /*existing=*/true);
}

}  // namespace sluice
