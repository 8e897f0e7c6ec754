#include "sluice/state/keyed_state_store.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

#include "sluice/core/config.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

[[noreturn]] void refuse(std::string message) {
  throw SluiceException(Error(ErrorCode::kConfiguration, std::move(message)));
}

constexpr std::string_view kProcessDirPrefix = "sluice-rocksdb-";

// Removes the per-process directories of processes that are gone (a SIGKILL leaves its databases behind;
// RocksDB's WAL is off, so nothing in them is ever read again: state comes back from checkpoints).
void remove_dead_process_dirs(const fs::path& root) {
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kProcessDirPrefix, 0) != 0) continue;
    const std::string digits = name.substr(kProcessDirPrefix.size());
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
      continue;
    const long pid = std::strtol(digits.c_str(), nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) {
      spdlog::warn("rocksdb state backend: cannot remove {} left by process {}: {}", it->path().string(), pid,
                   rm.message());
    } else {
      spdlog::info("rocksdb state backend: removed {} left by process {}, which no longer runs", it->path().string(),
                   pid);
    }
  }
}

// This process's directories (one per state.backend.rocksdb.localdir in use), removed at exit when their databases
// are all gone (each removes its own directory when it closes), so that a clean run leaves nothing behind; one still
// in use stays for the next process to remove.
struct OwnProcessDirs {
  std::mutex mu;
  std::set<fs::path> dirs;
};

OwnProcessDirs& own_process_dirs() {
  static OwnProcessDirs* d = new OwnProcessDirs();  // never destroyed: read by the exit handler
  return *d;
}

void remove_own_process_dirs_if_empty() {
  OwnProcessDirs& d = own_process_dirs();
  std::lock_guard lock(d.mu);
  for (const fs::path& dir : d.dirs) {
    std::error_code ec;
    fs::remove(dir, ec);  // fails, harmlessly, while a database directory is left in it
  }
}

void remember_own_process_dir(const fs::path& dir) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(remove_own_process_dirs_if_empty); });
  OwnProcessDirs& d = own_process_dirs();
  std::lock_guard lock(d.mu);
  d.dirs.insert(dir);
}

}  // namespace

StateBackendOptions StateBackendOptions::from_config(const Configuration* config) {
  StateBackendOptions o;
  if (config == nullptr) return o;
  const std::string type = lower(config->get(options::kStateBackendType));
  if (type == "rocksdb") {
    o.type = Type::kRocksDB;
  } else if (type != "hashmap") {
    refuse(fmt::format("{} = '{}'; expected hashmap or rocksdb", options::kStateBackendType.key,
                       config->get(options::kStateBackendType)));
  }
  o.incremental = config->get(options::kStateBackendIncremental);
  const std::string timers = lower(config->get(options::kRocksDBTimerServiceFactory));
  if (timers == "rocksdb") {
    o.rocksdb_timers = true;
  } else if (timers != "heap") {
    refuse(fmt::format("{} = '{}'; expected heap or rocksdb", options::kRocksDBTimerServiceFactory.key,
                       config->get(options::kRocksDBTimerServiceFactory)));
  }
  o.local_dir = config->get(options::kRocksDBLocalDir);
  if (config->get(options::kRocksDBMemoryManaged)) {
    const int64_t budget = config->get(options::kRocksDBMemoryFixedPerSlot);
    if (budget <= 0) {
      refuse(fmt::format("{} = {}; expected a positive memory size", options::kRocksDBMemoryFixedPerSlot.key, budget));
    }
    o.memory.managed_bytes = static_cast<uint64_t>(budget);
  }
  o.memory.write_buffer_ratio = config->get(options::kRocksDBWriteBufferRatio);
  o.memory.high_priority_pool_ratio = config->get(options::kRocksDBHighPrioPoolRatio);
  return o;
}

StateBackendOptions StateBackendOptions::for_subtask(const Configuration* config, int subtask_index) {
  StateBackendOptions o = from_config(config);
  // The configuration object identifies the job within the process for as long as its tasks run (every task of a
  // job gets the same one); a job without one (a bare test context) keeps a budget per database.
  if (config != nullptr) {
    o.memory.shared_scope = fmt::format("job {}, slot {}", static_cast<const void*>(config), subtask_index);
  }
  return o;
}

fs::path make_rocksdb_working_dir(const StateBackendOptions& options, std::string_view operator_name, int subtask_index,
                                  int attempt) {
  static std::atomic<uint64_t> counter{0};
  static std::once_flag cleaned;
  std::error_code ec;
  fs::path root = options.local_dir;
  if (root.empty()) {
    root = fs::temp_directory_path(ec);
    if (ec) root = "/tmp";
  }
  std::call_once(cleaned, [&root] { remove_dead_process_dirs(root); });
  std::string op;
  for (char c : operator_name) {
    op.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ? c : '_');
  }
  if (op.size() > 64) op.resize(64);
  const fs::path dir = root / fmt::format("{}{}", kProcessDirPrefix, ::getpid()) /
                       fmt::format("{}-{}-{}-{}", op, subtask_index, attempt, counter.fetch_add(1));
  fs::create_directories(dir.parent_path(), ec);
  if (ec) {
    throw SluiceException(
        Error(ErrorCode::kState, fmt::format("rocksdb state backend: cannot create {} ({}): {}",
                                             dir.parent_path().string(), options::kRocksDBLocalDir.key, ec.message())));
  }
  remember_own_process_dir(dir.parent_path());
  return dir;
}

}  // namespace sluice
