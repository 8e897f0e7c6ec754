// FunctionWorker: one out-of-process worker (Node.js today) that runs a user's exported function for one
// subtask, spoken to over a versioned framing on two pipes (docs/functions.md "Protocol"): every frame is a
// 4-byte big-endian length and that many bytes of UTF-8 JSON. The engine writes on the worker's fd 3 and reads
// its fd 4; the worker's stdout and stderr are read by a thread that logs them and keeps a tail for messages.
//
// Lifecycle: start() spawns the process and completes the handshake (hello -> ready) -> send()/next_reply()
// any number of times -> the destructor kills the process (SIGKILL), reaps it and joins its threads.
//
// Threading: send(), next_reply(), wait_reply() and the destructor are for one thread (the task thread). The
// reader thread only fills the reply queue and calls `on_reply` (which must be thread-safe, e.g. post a mail).
// Errors: kRuntime naming the function, with the worker's exit status and the tail of its stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/error.h"

namespace sluice::udf {

/// The version of the framing and messages this engine speaks (the hello's "protocol").
inline constexpr int kProtocolVersion = 2;

/// How to start a worker.
struct FunctionWorkerOptions {
  std::vector<std::string> argv;  ///< the command, e.g. {"node", "--max-old-space-size=512", ".../worker.js"}
  std::string module;             ///< absolute path of the (compiled) module the worker loads
  std::string export_name;        ///< the exported function
  std::string display_name;       ///< for messages and logs, e.g. "chargeEvent (./domain/charges.ts)"
  std::chrono::milliseconds start_timeout{30'000};  ///< for the handshake
  int64_t memory_mb = 0;  ///< the worker's heap limit (for the out-of-memory message; 0 = not set)
};

class FunctionWorker {
 public:
  /// Spawns the worker and waits for its "ready" frame. `on_reply` is called by the reader thread after each
  /// frame it queues and once when the worker's output ends (it may be empty).
  [[nodiscard]] static Result<std::unique_ptr<FunctionWorker>> start(FunctionWorkerOptions options,
                                                                     std::function<void()> on_reply);
  ~FunctionWorker();
  FunctionWorker(const FunctionWorker&) = delete;
  FunctionWorker& operator=(const FunctionWorker&) = delete;

  /// Writes one frame (the JSON text `body`), waiting until `deadline` for room in the pipe. kRuntime when the
  /// worker died or the deadline passed (the worker does not read: it hangs).
  Status send(std::string_view body, std::chrono::steady_clock::time_point deadline);
  /// The next reply frame if one arrived (non-blocking); an error once the worker has died and every frame it
  /// sent was taken.
  Result<std::optional<std::string>> next_reply();
  /// The next reply frame, waiting until `deadline`; std::nullopt when the deadline passed first.
  Result<std::optional<std::string>> wait_reply(std::chrono::steady_clock::time_point deadline);
  /// Why the worker is gone (exit status or signal, out of memory, the tail of its stderr); kills and reaps it
  /// first when it still runs.
  std::string describe_exit();
  /// The worker's process id (for tests and logs).
  int pid() const;
  /// The "version" of the worker's ready frame (e.g. Node's "v20.11.1").
  const std::string& runtime_version() const;

  struct Impl;

 private:
  explicit FunctionWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::udf
