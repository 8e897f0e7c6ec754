// A child process of the built `sluice` binary (no shell), its stdout and stderr collected by reader threads,
// for tests that run `sluice run` or a client command as a user would.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/polling.h"

extern char** environ;

namespace sluice::testing {

class ChildProcess {
 public:
  /// Starts `binary` with `args`.
  ChildProcess(const std::string& binary, std::vector<std::string> args) {
    args.insert(args.begin(), binary);
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(rc);
      pid_ = -1;
    }
    readers_.emplace_back([this, fd = out[0]] { drain(fd, out_); });
    readers_.emplace_back([this, fd = err[0]] { drain(fd, err_); });
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  /// SIGKILLs the process when it still runs.
  ~ChildProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    for (auto& t : readers_)
      t.join();
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) const {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }

  /// True while the process has not exited (reaps it once it has).
  bool running() {
    if (exited_ || pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return false;
    }
    return true;
  }

  /// Waits up to `timeout` for the process to exit; its exit code, or -1 (killed by a signal, or still running:
  /// a failure is recorded).
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (!poll_until([&] { return !running(); }, timeout)) {
      ADD_FAILURE() << "the process did not exit within the deadline; stderr:\n" << err();
      return -1;
    }
    for (auto& t : readers_)
      t.join();  // the pipes close with the process
    readers_.clear();
    return code_;
  }

  std::string out() const {
    std::lock_guard lock(mu_);
    return out_;
  }
  std::string err() const {
    std::lock_guard lock(mu_);
    return err_;
  }

 private:
  void drain(int fd, std::string& into) {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard lock(mu_);
      into.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
  mutable std::mutex mu_;
  std::string out_;
  std::string err_;
  std::vector<std::thread> readers_;
};

/// Runs a command to its end: exit code, stdout, stderr.
struct Ran {
  int code;
  std::string out;
  std::string err;
};
inline Ran run_to_end(const std::string& binary, std::vector<std::string> args) {
  ChildProcess p(binary, std::move(args));
  const int code = p.wait();
  return {code, p.out(), p.err()};
}

}  // namespace sluice::testing
