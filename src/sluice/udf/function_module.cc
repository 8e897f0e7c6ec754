#include "sluice/udf/function_module.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "sluice/core/assign_or_return.h"

extern char** environ;

namespace sluice::udf {
namespace fs = std::filesystem;
namespace {

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

// Runs `argv` in `cwd`, collecting its output. The commands (npm, esbuild) are the user's toolchain: their
// output is what the user needs when they fail.
Result<CommandResult> run_command(const std::vector<std::string>& argv, const fs::path& cwd) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Error(ErrorCode::kRuntime, fmt::format("pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  std::vector<std::string> args = argv;
  std::vector<char*> raw;
  for (std::string& a : args)
    raw.push_back(a.data());
  raw.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, raw[0], &actions, nullptr, raw.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return Error(ErrorCode::kConfiguration, fmt::format("cannot run '{}': {}", argv[0], std::strerror(rc)));
  }
  CommandResult r;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

std::string tail(const std::string& text, size_t n = 3000) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

bool newer(const fs::path& a, const fs::path& b) {
  std::error_code ec1, ec2;
  const auto ta = fs::last_write_time(a, ec1);
  const auto tb = fs::last_write_time(b, ec2);
  return ec1 || ec2 || ta > tb;
}

}  // namespace

fs::path runtime_dir() {
  if (const char* dir = std::getenv("SLUICE_RUNTIME_DIR"); dir != nullptr && *dir != '\0') return dir;
  return SLUICE_DEFAULT_RUNTIME_DIR;
}

std::vector<std::string> node_worker_command(int64_t memory_mb) {
  return {"node", fmt::format("--max-old-space-size={}", memory_mb), "--enable-source-maps",
          (runtime_dir() / "node" / "worker.js").string()};
}

std::vector<std::string> python_worker_command(int64_t memory_mb) {
  return {"python3", (runtime_dir() / "python" / "worker.py").string(), "--memory-mb", std::to_string(memory_mb)};
}

Result<PreparedModule> prepare_python_module(const fs::path& module) {
  std::error_code ec;
  if (!fs::is_regular_file(module, ec)) {
    return Error(ErrorCode::kConfiguration, fmt::format("function module '{}' does not exist", module.string()));
  }
  if (module.extension() != ".py") {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("function module '{}': runtime python expects a .py file", module.string()));
  }
  return PreparedModule{fs::absolute(module).string(), false};
}

Result<PreparedModule> prepare_node_module(const fs::path& module, const fs::path& project_dir) {
  std::error_code ec;
  if (!fs::is_regular_file(module, ec)) {
    return Error(ErrorCode::kConfiguration, fmt::format("function module '{}' does not exist", module.string()));
  }
  const std::string ext = module.extension().string();
  const bool typescript = ext == ".ts" || ext == ".mts" || ext == ".cts" || ext == ".tsx";
  if (!typescript && ext != ".js" && ext != ".mjs" && ext != ".cjs") {
    return Error(
        ErrorCode::kConfiguration,
        fmt::format("function module '{}': expected a .ts, .mts, .cts, .js, .mjs or .cjs file", module.string()));
  }
  const fs::path package = project_dir / "package.json";
  if (!fs::exists(package, ec)) {
    if (typescript) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("function module '{}' is TypeScript, but {} has no package.json: add one with esbuild "
                               "in its devDependencies (`npm install --save-dev esbuild`) and commit it with its "
                               "package-lock.json",
                               module.string(), project_dir.string()));
    }
    return PreparedModule{fs::absolute(module).string(), false};
  }
  const fs::path lock = project_dir / "package-lock.json";
  if (!fs::exists(lock, ec)) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{} has no package-lock.json: run `npm install` there once and commit the lock file "
                             "(sluice installs exactly what it pins with `npm ci`)",
                             project_dir.string()));
  }
  const fs::path installed = project_dir / "node_modules" / ".package-lock.json";
  if (!fs::exists(installed, ec) || newer(lock, installed)) {
    spdlog::info("functions: npm ci in {}", project_dir.string());
    SLUICE_ASSIGN_OR_RETURN(CommandResult ran,
                            run_command({"npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"}, project_dir));
    const CommandResult& npm = ran;
    if (npm.status != 0) {
      return Error(ErrorCode::kConfiguration, fmt::format("`npm ci` in {} failed (status {}): {}", project_dir.string(),
                                                          npm.status, tail(npm.output)));
    }
  }
  const fs::path esbuild = project_dir / "node_modules" / ".bin" / "esbuild";
  if (!fs::exists(esbuild, ec)) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("{}: esbuild is not among the installed packages; add it (`npm install --save-dev "
                             "esbuild`) to bundle function module '{}'",
                             package.string(), module.string()));
  }
  const fs::path out_dir = project_dir / ".sluice" / "functions";
  fs::create_directories(out_dir, ec);
  if (ec) {
    return Error(ErrorCode::kConfiguration, fmt::format("cannot create {}: {}", out_dir.string(), ec.message()));
  }
  // One bundle per module path; written under a temporary name and renamed, so two runs never read half a file.
  std::string stem = fs::relative(module, project_dir, ec).string();
  if (ec || stem.empty() || stem.starts_with("..")) stem = module.filename().string();
  for (char& c : stem)
    if (c == '/' || c == '.') c = '_';
  const fs::path bundle = out_dir / (stem + ".cjs");
  const fs::path tmp = out_dir / fmt::format("{}.{}.tmp.cjs", stem, ::getpid());
  Result<CommandResult> built =
      run_command({esbuild.string(), fs::absolute(module).string(), "--bundle", "--platform=node", "--format=cjs",
                   "--target=node18", "--sourcemap=inline", "--log-level=warning", "--outfile=" + tmp.string()},
                  project_dir);
  if (!built.ok()) return built.error();
  const CommandResult& build = *built;
  if (build.status != 0) {
    fs::remove(tmp, ec);
    return Error(ErrorCode::kConfiguration,
                 fmt::format("function module '{}' does not compile (esbuild, status {}):\n{}", module.string(),
                             build.status, tail(build.output)));
  }
  fs::rename(tmp, bundle, ec);
  if (ec) return Error(ErrorCode::kConfiguration, fmt::format("cannot write {}: {}", bundle.string(), ec.message()));
  return PreparedModule{bundle.string(), true};
}

}  // namespace sluice::udf
