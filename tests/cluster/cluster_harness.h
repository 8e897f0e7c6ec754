// A multi-process test harness for cluster mode: starts a JobManager and N TaskManagers of the built `sluice`
// binary as child processes (on free ports: each binds port 0 and prints the port it got), collects their
// stderr, reads the JobManager's REST API, waits on conditions with deadlines, and signals children by pid
// (SIGKILL, SIGSTOP, SIGCONT, SIGTERM). Every child still running at the end is SIGKILLed and reaped.
//
// Thread-safety: a ChildProcess's output is appended by its reader thread and read under a mutex; everything
// else runs on the test's thread.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/polling.h"
#include "sluice/core/value.h"

#ifndef SLUICE_BINARY
#error "SLUICE_BINARY must name the built sluice executable"
#endif

extern char** environ;

namespace sluice::testing::cluster {

using namespace std::chrono_literals;

/// A child process of the sluice binary; stdout and stderr go to one buffer (the logs are on stderr).
class ChildProcess {
 public:
  ChildProcess(std::string role, std::vector<std::string> args) : role_(std::move(role)) {
    args.insert(args.begin(), SLUICE_BINARY);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(rc);
      pid_ = -1;
      ::close(fds[0]);
      return;
    }
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      while (true) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        std::lock_guard lock(mu_);
        output_.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
    });
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);  // also ends a SIGSTOPped child
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }
  const std::string& role() const { return role_; }
  std::string output() const {
    std::lock_guard lock(mu_);
    return output_;
  }
  /// Sends `sig` to the child by pid.
  void signal(int sig) const { ASSERT_EQ(::kill(pid_, sig), 0) << role_ << ": kill(" << sig << ")"; }

  /// Whether it has exited (reaps it when so).
  bool exited() {
    if (reaped_) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    reaped_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  /// Waits up to `timeout` for it to exit: its exit code (128 + signal when killed), or nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    if (!poll_until([&] { return exited(); }, timeout)) return std::nullopt;
    if (reader_.joinable()) reader_.join();
    return code_;
  }

  /// Waits for `pattern` in the output; returns the match's groups (0 = the whole match), or nullopt after the
  /// deadline.
  std::optional<std::vector<std::string>> await_line(const std::regex& pattern, std::chrono::milliseconds timeout) {
    std::vector<std::string> groups;
    auto found = [&] {
      const std::string out = output();
      std::smatch m;
      if (!std::regex_search(out, m, pattern)) return false;
      groups.assign(m.begin(), m.end());
      return true;
    };
    if (!poll_until(found, timeout, 20ms)) return std::nullopt;
    return groups;
  }
  /// How often `needle` occurs in the output.
  int count(const std::string& needle) const {
    const std::string out = output();
    int n = 0;
    for (size_t pos = out.find(needle); pos != std::string::npos; pos = out.find(needle, pos + 1))
      ++n;
    return n;
  }

 private:
  std::string role_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int code_ = -1;
  mutable std::mutex mu_;
  std::string output_;
  std::thread reader_;
};

/// A JobManager and its TaskManagers for one pipeline file.
class ClusterHarness {
 public:
  /// `pipeline` is the YAML file every process gets; `options` are -D key=value flags for every process.
  ClusterHarness(std::string pipeline, std::vector<std::string> options)
      : pipeline_(std::move(pipeline)), options_(std::move(options)) {}

  /// Starts a JobManager on free ports (or RPC port `rpc_port`) and waits until it serves; null on failure.
  /// `extra` are more flags for it (such as `-s SAVEPOINT`).
  ChildProcess* start_jobmanager(int rpc_port = 0, std::chrono::milliseconds timeout = 60s,
                                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"jobmanager",  pipeline_, "--rpc-port", std::to_string(rpc_port),
                                     "--rest-port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const auto& o : options_) {
      args.push_back("-D");
      args.push_back(o);
    }
    children_.push_back(std::make_unique<ChildProcess>("jobmanager", std::move(args)));
    ChildProcess* jm = children_.back().get();
    static const std::regex rpc_line(R"(JobManager of pipeline .*: RPC at ([0-9.]+:[0-9]+))");
    static const std::regex rest_line(R"(JobManager REST API at (http://[0-9.]+:[0-9]+), job id ([0-9a-f]+))");
    auto rpc = jm->await_line(rpc_line, timeout);
    auto rest = jm->await_line(rest_line, timeout);
    if (!rpc || !rest) {
      ADD_FAILURE() << "the JobManager did not start within the deadline; its output:\n" << jm->output();
      return nullptr;
    }
    rpc_target_ = (*rpc)[1];
    rest_url_ = (*rest)[1];
    job_id_ = (*rest)[2];
    return jm;
  }

  /// Starts a TaskManager with `slots` slots against the current JobManager; `pipeline` overrides the file.
  ChildProcess* start_taskmanager(int slots, const std::string& pipeline = "") {
    std::vector<std::string> args = {"taskmanager",  pipeline.empty() ? pipeline_ : pipeline,
                                     "--jobmanager", rpc_target_,
                                     "--slots",      std::to_string(slots)};
    for (const auto& o : options_) {
      args.push_back("-D");
      args.push_back(o);
    }
    children_.push_back(std::make_unique<ChildProcess>("taskmanager", std::move(args)));
    return children_.back().get();
  }

  /// GET `path` on the JobManager's REST API: {status, body}; {0, ""} when nothing answered.
  std::pair<int, std::string> http_get(const std::string& path) const {
    httplib::Client client(rest_url_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    auto res = client.Get(path);
    if (!res) return {0, ""};
    return {res->status, res->body};
  }

  /// GET `path` on the JobManager's REST API as JSON; nullopt when it does not answer 200 with JSON.
  std::optional<Value> get(const std::string& path) const {
    auto [status, body] = http_get(path);
    if (status != 200) return std::nullopt;
    auto v = Value::from_json(body);
    if (!v.ok()) return std::nullopt;
    return std::move(*v);
  }

  /// The TaskManagers GET /taskmanagers lists (empty when it does not answer).
  std::vector<Value> task_managers() const {
    std::vector<Value> out;
    auto v = get("/taskmanagers");
    if (!v) return out;
    const Value* list = v->find("taskmanagers");
    if (list == nullptr || !list->is_array()) return out;
    for (const auto& t : list->as_array())
      out.push_back(t);
    return out;
  }

  /// Polls the REST API until `pred(task_managers())` holds or `timeout` passes.
  template <class Pred>
  bool await_task_managers(Pred pred, std::chrono::milliseconds timeout) const {
    return poll_until([&] { return pred(task_managers()); }, timeout, 50ms);
  }

  /// Everything the children printed, for a failure message.
  std::string logs() const {
    std::string out;
    for (const auto& c : children_)
      out += "---- " + c->role() + " (pid " + std::to_string(c->pid()) + ") ----\n" + c->output();
    return out;
  }

  const std::string& rpc_target() const { return rpc_target_; }
  const std::string& rest_url() const { return rest_url_; }
  const std::string& job_id() const { return job_id_; }
  int rpc_port() const { return std::stoi(rpc_target_.substr(rpc_target_.rfind(':') + 1)); }

 private:
  std::string pipeline_;
  std::vector<std::string> options_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::string rpc_target_;
  std::string rest_url_;
  std::string job_id_;
};

/// A fresh directory under the system's temporary directory, named `prefix` + pid + a clock tick, removed with
/// everything in it when the object goes.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() /
              (prefix + std::to_string(::getpid()) + "-" +
               std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()))) {
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A field of a /taskmanagers entry.
inline std::string str(const Value& v, std::string_view key) {
  const Value* f = v.find(key);
  return f != nullptr && f->is_string() ? std::string(f->as_string()) : std::string();
}
inline int64_t num(const Value& v, std::string_view key) {
  const Value* f = v.find(key);
  return f != nullptr && f->is_int64() ? f->as_int64() : -1;
}

}  // namespace sluice::testing::cluster
