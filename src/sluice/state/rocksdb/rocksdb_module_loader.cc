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

// Whether a dlopen() failure may pass (memory or file descriptors short: glibc's messages carry strerror's text)
// rather than come again on every attempt (a file that is not a shared object, a missing library).
bool transient_load_failure(std::string_view why) {
  return why.find("Cannot allocate memory") != std::string_view::npos ||
         why.find("Too many open files") != std::string_view::npos ||
         why.find("failed to map segment") != std::string_view::npos;
}

// Loads the module at `path` (absolute); returns its table, or nullptr with the reason appended to `tried` (and
// `transient` set when a retry may succeed).
const RocksDBModule* load(const std::filesystem::path& path, std::vector<std::string>& tried, bool& transient) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    const std::string why = error != nullptr ? error : "dlopen failed";
    if (transient_load_failure(why)) transient = true;
    tried.push_back(fmt::format("{} ({})", path.string(), why));
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
  if (token != kRocksDBModuleInterfaceToken) {
    return refuse(
        fmt::format("built from another RocksDBInstance interface or compiler ({} against this binary's "
                    "{}): a module of another build",
                    token, kRocksDBModuleInterfaceToken));
  }
  if (module->open == nullptr) return refuse("its table has no open function: not a usable module");
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
  bool transient = false;
  for (const std::filesystem::path& path : candidates()) {
    if (path.empty()) continue;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried.push_back(fmt::format("{} ({})", path.string(), ec ? ec.message() : "no such file"));
      continue;
    }
    loaded = load(path, tried, transient);
    if (loaded != nullptr) return *loaded;
  }
  const char* env = std::getenv("SLUICE_ROCKSDB_MODULE");
  const bool from_env = env != nullptr && *env != '\0';
  Error error(ErrorCode::kConfiguration,
              fmt::format("state.backend.type 'rocksdb' needs Sluice's RocksDB module {}, which could not be loaded; "
                          "tried: {}{}",
                          kRocksDBModuleFileName, fmt::join(tried, "; "),
                          from_env ? " (from SLUICE_ROCKSDB_MODULE)" : " (set SLUICE_ROCKSDB_MODULE to its path)"));
  // A missing or foreign module is found again by every restart: the job fails instead of restarting for ever. A
  // load that ran short of memory or file descriptors is left to the restart strategy.
  if (transient) throw SluiceException(std::move(error));
  throw SluiceException(
      mark_non_recoverable(error, "the module is missing or unusable, and a restart loads the same files"));
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
