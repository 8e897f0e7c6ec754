#include "sluice/udf/function_worker.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/value.h"

namespace sluice::udf {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxFrameBytes = size_t{256} << 20;  // as the workers' limit
constexpr size_t kStderrTailBytes = 4096;

// A descriptor at 10 or above with close-on-exec: the child's dup2 onto 0..3 never collides with it.
int high_cloexec(int fd) {
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  return moved;
}

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

}  // namespace

struct FunctionWorker::Impl {
  FunctionWorkerOptions options;
  std::function<void()> on_reply;
  pid_t pid = -1;
  int channel = -1;    // our end of the socket pair (the worker's fd 3)
  int output_fd = -1;  // the worker's stdout and stderr
  std::string version;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> replies;  // guarded by mu
  bool ended = false;               // guarded by mu: the worker's side of the channel closed
  std::string read_error;           // guarded by mu
  std::string stderr_tail;          // guarded by mu
  bool stderr_done = false;         // guarded by mu
  std::thread reader;
  std::thread logger;
  bool reaped = false;
  int wait_status = 0;

  ~Impl() {
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      int st = 0;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
    // The worker is gone: its end of the channel and its output pipe are closed, so both threads end.
    if (channel >= 0) ::shutdown(channel, SHUT_RDWR);
    if (reader.joinable()) reader.join();
    if (logger.joinable()) logger.join();
    if (channel >= 0) ::close(channel);
    if (output_fd >= 0) ::close(output_fd);
  }

  void read_loop() {
    std::string buffer;
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::recv(channel, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::lock_guard lock(mu);
        if (n < 0) read_error = std::strerror(errno);
        if (!buffer.empty())
          read_error = fmt::format("the worker's output ended inside a frame ({} bytes)", buffer.size());
        ended = true;
        break;
      }
      buffer.append(chunk, static_cast<size_t>(n));
      size_t pos = 0;
      bool queued = false;
      while (buffer.size() - pos >= 4) {
        const auto* p = reinterpret_cast<const unsigned char*>(buffer.data() + pos);
        const size_t len = (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | size_t{p[3]};
        if (len > kMaxFrameBytes) {
          std::lock_guard lock(mu);
          read_error = fmt::format("the worker sent a frame of {} bytes, over the limit of {}", len, kMaxFrameBytes);
          ended = true;
          buffer.clear();
          pos = 0;
          break;
        }
        if (buffer.size() - pos - 4 < len) break;
        {
          std::lock_guard lock(mu);
          replies.emplace_back(buffer.data() + pos + 4, len);
        }
        queued = true;
        pos += 4 + len;
      }
      buffer.erase(0, pos);
      bool stop = false;
      {
        std::lock_guard lock(mu);
        stop = ended;
      }
      if (queued || stop) {
        cv.notify_all();
        if (on_reply) on_reply();
      }
      if (stop) {
        ::kill(pid, SIGKILL);  // it broke the protocol: nothing it sends can be trusted any more
        break;
      }
    }
    cv.notify_all();
    if (on_reply) on_reply();
  }

  void log_loop() {
    std::string line;
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(output_fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      std::lock_guard lock(mu);
      stderr_tail.append(chunk, static_cast<size_t>(n));
      if (stderr_tail.size() > 2 * kStderrTailBytes) stderr_tail.erase(0, stderr_tail.size() - kStderrTailBytes);
      for (ssize_t i = 0; i < n; ++i) {
        if (chunk[i] == '\n') {
          spdlog::info("function {} [pid {}]: {}", options.display_name, pid, line);
          line.clear();
        } else if (line.size() < 4096) {
          line.push_back(chunk[i]);
        }
      }
    }
    if (!line.empty()) spdlog::info("function {} [pid {}]: {}", options.display_name, pid, line);
    {
      std::lock_guard lock(mu);
      stderr_done = true;
    }
    cv.notify_all();
  }

  std::string describe_exit() {
    if (!reaped && pid > 0) {
      // Give a worker that is exiting (its channel ended) a moment to be reaped with its own status.
      const auto until = Clock::now() + std::chrono::milliseconds(2000);
      int st = 0;
      pid_t r = 0;
      while ((r = ::waitpid(pid, &st, WNOHANG)) == 0 && Clock::now() < until) {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(10));
      }
      if (r == 0) {
        ::kill(pid, SIGKILL);
        while ((r = ::waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
        }
      }
      reaped = true;
      wait_status = st;
    }
    std::string tail;
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(1000), [&] { return stderr_done; });
      tail = stderr_tail.size() > kStderrTailBytes ? stderr_tail.substr(stderr_tail.size() - kStderrTailBytes)
                                                   : stderr_tail;
    }
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' '))
      tail.pop_back();
    std::string how;
    if (WIFEXITED(wait_status)) {
      how = fmt::format("exited with status {}", WEXITSTATUS(wait_status));
    } else if (WIFSIGNALED(wait_status)) {
      how = fmt::format("was killed by signal {} ({})", WTERMSIG(wait_status), strsignal(WTERMSIG(wait_status)));
    } else {
      how = "ended";
    }
    std::string out = fmt::format("the worker (pid {}) {}", pid, how);
    if (tail.find("heap out of memory") != std::string::npos || tail.find("Reached heap limit") != std::string::npos ||
        tail.find("worker: out of memory") != std::string::npos) {
      out +=
          fmt::format(": it ran out of memory (its limit is {} MiB; raise the function's `memory`)", options.memory_mb);
    }
    {
      std::lock_guard lock(mu);
      if (!read_error.empty()) out += fmt::format(" ({})", read_error);
    }
    if (!tail.empty()) out += fmt::format("; its last output: {}", tail);
    return out;
  }

  Error failure(std::string_view what) {
    return Error(ErrorCode::kRuntime, fmt::format("function {}: {}: {}", options.display_name, what, describe_exit()));
  }
};

FunctionWorker::FunctionWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FunctionWorker::~FunctionWorker() = default;

int FunctionWorker::pid() const {
  return impl_->pid;
}
const std::string& FunctionWorker::runtime_version() const {
  return impl_->version;
}
std::string FunctionWorker::describe_exit() {
  return impl_->describe_exit();
}

Result<std::unique_ptr<FunctionWorker>> FunctionWorker::start(FunctionWorkerOptions options,
                                                              std::function<void()> on_reply) {
  if (options.argv.empty()) return Error(ErrorCode::kInternal, "FunctionWorker: empty command");
  const std::string exe = find_executable(options.argv[0]);
  if (exe.empty()) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("function {}: cannot find '{}' on the PATH (install Node.js 20 or later)",
                             options.display_name, options.argv[0]));
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Error(ErrorCode::kRuntime, fmt::format("socketpair: {}", std::strerror(errno)));
  }
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return Error(ErrorCode::kRuntime, fmt::format("pipe: {}", std::strerror(errno)));
  }
  const int parent_end = sv[0];
  const int child_end = high_cloexec(sv[1]);
  const int out_read = out_pipe[0];
  const int out_write = high_cloexec(out_pipe[1]);
  const int devnull = high_cloexec(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // A batch of a few hundred KiB fits without waiting for the worker to read it.
  const int buffer_bytes = 1 << 20;
  ::setsockopt(parent_end, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
  ::setsockopt(parent_end, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);

  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. The worker dies with the thread that started it
    // (a SIGKILLed `sluice run` leaves no worker spinning in a user's endless loop).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(devnull, 0);
    ::dup2(out_write, 1);
    ::dup2(out_write, 2);
    ::dup2(child_end, 3);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(child_end);
  ::close(out_write);
  ::close(devnull);
  if (pid < 0) {
    ::close(parent_end);
    ::close(out_read);
    return Error(ErrorCode::kRuntime, fmt::format("fork: {}", std::strerror(fork_errno)));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->on_reply = std::move(on_reply);
  impl->pid = pid;
  impl->channel = parent_end;
  impl->output_fd = out_read;
  Impl* raw = impl.get();
  impl->logger = std::thread([raw] { raw->log_loop(); });
  impl->reader = std::thread([raw] { raw->read_loop(); });
  std::unique_ptr<FunctionWorker> worker(new FunctionWorker(std::move(impl)));

  const auto deadline = Clock::now() + raw->options.start_timeout;
  const std::string hello = Value::object({{"type", Value("hello")},
                                           {"protocol", Value(int64_t{kProtocolVersion})},
                                           {"module", Value(raw->options.module)},
                                           {"export", Value(raw->options.export_name)}})
                                .to_json();
  SLUICE_RETURN_IF_ERROR(worker->send(hello, deadline));
  SLUICE_ASSIGN_OR_RETURN(std::optional<std::string> reply, worker->wait_reply(deadline));
  if (!reply.has_value()) {
    return raw->failure(
        fmt::format("the worker did not answer the handshake within {} ms", raw->options.start_timeout.count()));
  }
  Result<Value> ready = Value::from_json(*reply);
  if (!ready.ok()) return raw->failure("the worker's handshake is not JSON");
  const Value* type = ready->find("type");
  if (type != nullptr && type->is_string() && type->as_string() == "fatal") {
    const Value* message = ready->find("message");
    const Value* stack = ready->find("stack");
    std::string text = message != nullptr && message->is_string() ? std::string(message->as_string()) : "";
    if (stack != nullptr && stack->is_string() && !stack->as_string().empty()) {
      text += fmt::format("\n{}", stack->as_string());
    }
    return Error(ErrorCode::kConfiguration, fmt::format("function {}: {}", raw->options.display_name, text));
  }
  const Value* protocol = ready->find("protocol");
  if (type == nullptr || !type->is_string() || type->as_string() != "ready" || protocol == nullptr ||
      !protocol->is_int64() || protocol->as_int64() != kProtocolVersion) {
    return raw->failure(
        fmt::format("the worker answered the handshake with {} (expected a ready frame of "
                    "protocol {})",
                    ready->to_json(), kProtocolVersion));
  }
  if (const Value* v = ready->find("version"); v != nullptr && v->is_string()) raw->version = v->as_string();
  return worker;
}

Status FunctionWorker::send(std::string_view body, Clock::time_point deadline) {
  Impl& d = *impl_;
  if (body.size() > kMaxFrameBytes) {
    return Error(ErrorCode::kRuntime, fmt::format("function {}: a batch of {} bytes is over the frame limit of {} "
                                                  "bytes (lower the function's batch-size)",
                                                  d.options.display_name, body.size(), kMaxFrameBytes));
  }
  const uint32_t n = static_cast<uint32_t>(body.size());
  const unsigned char header[4] = {static_cast<unsigned char>(n >> 24), static_cast<unsigned char>(n >> 16),
                                   static_cast<unsigned char>(n >> 8), static_cast<unsigned char>(n)};
  auto write_all = [&](const char* p, size_t size) -> Status {
    while (size > 0) {
      const ssize_t w = ::send(d.channel, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w;
        size -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return Error(ErrorCode::kRuntime, "timeout");
        pollfd pfd{d.channel, POLLOUT, 0};
        ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 100)));
        continue;
      }
      return d.failure("the worker stopped reading its input");
    }
    return ok_status();
  };
  Status s = write_all(reinterpret_cast<const char*>(header), 4);
  if (s.ok()) s = write_all(body.data(), body.size());
  if (!s.ok() && s.error().message() == "timeout") {
    return Error(ErrorCode::kRuntime, fmt::format("function {}: the worker (pid {}) did not read its input in time "
                                                  "(it hangs); it was killed",
                                                  d.options.display_name, d.pid));
  }
  return s;
}

Result<std::optional<std::string>> FunctionWorker::next_reply() {
  Impl& d = *impl_;
  {
    std::lock_guard lock(d.mu);
    if (!d.replies.empty()) {
      std::string r = std::move(d.replies.front());
      d.replies.pop_front();
      return std::optional<std::string>(std::move(r));
    }
    if (!d.ended) return std::optional<std::string>();
  }
  return d.failure("the worker died");
}

Result<std::optional<std::string>> FunctionWorker::wait_reply(Clock::time_point deadline) {
  Impl& d = *impl_;
  {
    std::unique_lock lock(d.mu);
    d.cv.wait_until(lock, deadline, [&] { return !d.replies.empty() || d.ended; });
  }
  return next_reply();
}

}  // namespace sluice::udf
