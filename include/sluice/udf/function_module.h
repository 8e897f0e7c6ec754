// Preparing a user's function module for the Node.js worker at start-up (docs/functions.md "Deploying"):
// TypeScript (and any module of a folder with a package.json) is bundled with esbuild from the folder's own
// npm dependencies (installed with `npm ci` when node_modules is missing or older than package-lock.json) into
// one CommonJS file with an inline source map, so the JavaScript stack of an error names the .ts lines.
//
// Threading: call from one thread at a time per project folder (the pipeline runner, before the job starts).
// Errors: kConfiguration naming the module and the failing command with the tail of its output.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "sluice/core/error.h"

namespace sluice::udf {

/// A module ready for a worker.
struct PreparedModule {
  std::string path;  ///< absolute path the worker imports (the bundle, or the module itself)
  bool bundled = false;
};

/// Prepares `module` (absolute). `project_dir` is the folder whose package.json and package-lock.json hold
/// the module's dependencies and esbuild; without a package.json only a .js/.mjs/.cjs module is accepted,
/// and it is loaded as it is. Bundles go to `<project_dir>/.sluice/functions/`.
[[nodiscard]] Result<PreparedModule> prepare_node_module(const std::filesystem::path& module,
                                                         const std::filesystem::path& project_dir);

/// The Node.js worker's command for a module: node with a heap limit, source maps and the runner script
/// runtime/node/worker.js (SLUICE_RUNTIME_DIR overrides the runtime folder, e.g. for an installed sluice).
std::vector<std::string> node_worker_command(int64_t memory_mb);

/// Checks a Python module (absolute path, a .py file): it is loaded as it is, its folder first on sys.path.
[[nodiscard]] Result<PreparedModule> prepare_python_module(const std::filesystem::path& module);

/// The Python worker's command: python3 runtime/python/worker.py with an address-space limit of `memory_mb`.
std::vector<std::string> python_worker_command(int64_t memory_mb);

/// The folder of the shipped runtime (runner scripts and type definitions).
std::filesystem::path runtime_dir();

}  // namespace sluice::udf
