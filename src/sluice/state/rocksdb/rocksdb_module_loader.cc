// RocksDBInstance::open and open_existing: load libsluice_rocksdb.so on first use (rocksdb_module.h says where from
// and why) and open the database through it.
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "rocksdb_module.h"
#include "sluice/core/error.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {

namespace {

// Loads the module at `path` (absolute); returns its table, or nullptr with the reason appended to `tried`.
const RocksDBModule* load(const std::filesystem::path& path, std::vector<std::string>& tried) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    tried.push_back(fmt::format("{} ({})", path.string(), why != nullptr ? why : "dlopen failed"));
    return nullptr;
  }
  auto refuse = [&](std::string why) -> const RocksDBModule* {
    tried.push_back(fmt::format("{} ({})", path.string(), why));
    ::dlclose(handle);
    return nullptr;
  };
  using Entry = const RocksDBModule* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kRocksDBModuleEntry));
  if (entry == nullptr) return refuse(fmt::format("no {}: not Sluice's RocksDB module", kRocksDBModuleEntry));
  const RocksDBModule* module = entry();
  if (module == nullptr || module->abi_version != kRocksDBModuleAbiVersion) {
    return refuse(fmt::format("interface version {}, this binary needs {}: a module of another Sluice version",
                              module != nullptr ? module->abi_version : 0, kRocksDBModuleAbiVersion));
  }
  const std::string_view token = module->interface_token != nullptr ? module->interface_token : "";
  if (token != kRocksDBModuleInterfaceToken || module->open == nullptr) {
    return refuse(
        fmt::format("built from another RocksDBInstance interface or compiler ({} against this binary's "
                    "{}): a module of another build",
                    token, kRocksDBModuleInterfaceToken));
  }
  // Pinned once verified: instances, their snapshots and RocksDB's threads may outlive any handle.
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == nullptr) {
    const char* why = ::dlerror();
    return refuse(why != nullptr ? why : "cannot pin the module");
  }
  spdlog::debug("RocksDB state backend: loaded {}", path.string());
  return module;
}

std::vector<std::filesystem::path> candidates() {
  // Absolute, so that dlopen() opens the file named and never searches the library path for a bare name.
  if (const char* env = std::getenv("SLUICE_ROCKSDB_MODULE"); env != nullptr && *env != '\0') {
    std::error_code ec;
    std::filesystem::path path = std::filesystem::absolute(env, ec);
    return {ec ? std::filesystem::path(env) : path};
  }
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
      tried.push_back(fmt::format("{} ({})", path.string(), ec ? ec.message() : "no such file"));
      continue;
    }
    loaded = load(path, tried);
    if (loaded != nullptr) return *loaded;
  }
  const bool from_env = std::getenv("SLUICE_ROCKSDB_MODULE") != nullptr;
  // A restart finds the same files: the job fails instead of restarting for ever.
  throw SluiceException(mark_non_recoverable(
      Error(ErrorCode::kConfiguration,
            fmt::format("state.backend.type 'rocksdb' needs Sluice's RocksDB module {}, which could not be loaded; "
                        "tried: {}{}",
                        kRocksDBModuleFileName, fmt::join(tried, "; "),
                        from_env ? " (from SLUICE_ROCKSDB_MODULE)" : " (set SLUICE_ROCKSDB_MODULE to its path)")),
      "the module is missing or unusable, and a restart loads the same files"));
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
