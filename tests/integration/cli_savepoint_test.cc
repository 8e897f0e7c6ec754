// The savepoint workflow of the `sluice` command, end to end with the built binary and no shell: start an
// endless running-sum job with checkpoints and a REST API on a free port, list it, take a savepoint, stop it
// with a savepoint (the job process exits 0, FINISHED), resume from that savepoint at another parallelism
// (its sums continue where they stopped), cancel it; and the client commands' errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util/collect_sink.h"

#ifndef SLUICE_BINARY
#error "SLUICE_BINARY must name the built sluice executable"
#endif

extern char** environ;

namespace sluice {
namespace {

namespace fs = std::filesystem;
constexpr auto kDeadline = std::chrono::seconds(60);

/// A fresh directory under the system temp dir, removed with its contents when the test ends (also when an
/// assertion returns early).
struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("sluice-cli-test-" + name + "-" + std::to_string(::getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path path;
};

/// A child process running the sluice binary, its stdout and stderr collected by reader threads.
class Process {
 public:
  explicit Process(std::vector<std::string> args) {
    args.insert(args.begin(), SLUICE_BINARY);
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
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    for (auto& t : readers_)
      t.join();
  }

  /// Waits up to the deadline for the process to exit; its exit code, or -1 (killed by a signal or still
  /// running: a failed test).
  int wait() {
    int status = 0;
    const bool ended =
        testing::wait_until([&] { return exited_ || ::waitpid(pid_, &status, WNOHANG) == pid_; }, kDeadline);
    if (!ended) {
      ADD_FAILURE() << "the process did not exit within the deadline; stderr:\n" << err();
      return -1;
    }
    if (!exited_) {
      exited_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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
      ssize_t n = ::read(fd, buf, sizeof buf);
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

/// Runs a client command to its end.
struct Ran {
  int code;
  std::string out;
  std::string err;
};
Ran run(std::vector<std::string> args) {
  Process p(std::move(args));
  int code = p.wait();
  return {code, p.out(), p.err()};
}

/// The port and job id a job process prints on stderr ("REST API at http://127.0.0.1:PORT, job id ID").
struct Served {
  std::string jobmanager;
  std::string job_id;
};
Served await_rest_line(const Process& p) {
  static const std::regex line(R"(REST API at http://([0-9.]+:[0-9]+), job id ([0-9a-f]+))");
  std::smatch m;
  std::string err;
  const bool found = testing::wait_until(
      [&] {
        err = p.err();
        return std::regex_search(err, m, line);
      },
      kDeadline);
  EXPECT_TRUE(found) << "no REST line on stderr:\n" << err;
  return found ? Served{m[1], m[2]} : Served{};
}

std::string savepoint_path(const std::string& out) {
  static const std::regex line(R"(Savepoint completed\. Path: (\S+))");
  std::smatch m;
  return std::regex_search(out, m, line) ? std::string(m[1]) : std::string();
}

/// A port nothing listens on: bound once to get a free number, then closed.
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// The first running sum printed ("N> {"customer":"customer-3","amount_cents":1234}"), or -1.
int64_t first_sum(const std::string& out) {
  static const std::regex sum(R"("amount_cents":([0-9]+))");
  std::smatch m;
  return std::regex_search(out, m, sum) ? std::stoll(m[1]) : -1;
}

TEST(CliSavepointTest, StopWithSavepointAndResumeAtAnotherParallelism) {
  const TempDir tmp("stop");
  const fs::path& root = tmp.path;
  const std::string checkpoints = (root / "checkpoints").string();
  Process job({"example", "running-sum", "--rate", "400", "-p", "1", "--checkpoint-dir", checkpoints,
               "--checkpoint-interval", "200ms", "--rest-port", "0"});
  Served served = await_rest_line(job);
  ASSERT_FALSE(served.job_id.empty());

  // Periodic checkpoints land in <checkpoint-dir>/<job id>/chk-<n>/_metadata.
  ASSERT_TRUE(testing::wait_until(
      [&] {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(fs::path(checkpoints) / served.job_id, ec)) {
          if (fs::exists(e.path() / "_metadata")) return true;
        }
        return false;
      },
      kDeadline))
      << job.err();

  Ran list = run({"list", "--jobmanager", served.jobmanager});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find(served.job_id + " : running sum (RUNNING)"), std::string::npos) << list.out;

  Ran savepoint = run({"savepoint", "-m", served.jobmanager, served.job_id, (root / "savepoints").string()});
  ASSERT_EQ(savepoint.code, 0) << savepoint.err;
  const std::string sp1 = savepoint_path(savepoint.out);
  ASSERT_FALSE(sp1.empty()) << savepoint.out;
  EXPECT_TRUE(fs::exists(fs::path(sp1) / "_metadata"));

  Ran stop =
      run({"stop", "--jobmanager", served.jobmanager, "--savepoint-dir", (root / "final").string(), served.job_id});
  ASSERT_EQ(stop.code, 0) << stop.err;
  const std::string sp2 = savepoint_path(stop.out);
  ASSERT_FALSE(sp2.empty()) << stop.out;
  EXPECT_TRUE(fs::exists(fs::path(sp2) / "_metadata"));
  EXPECT_EQ(job.wait(), 0) << job.err();
  EXPECT_NE(job.err().find("job 'running sum' finished"), std::string::npos) << job.err();

  // Resume at parallelism 2: the first sum printed continues from the savepoint's state, so it is larger
  // than any single charge (< 10000).
  Process resumed({"example", "running-sum", "--rate", "400", "-p", "2", "--from-savepoint", sp2, "--checkpoint-dir",
                   checkpoints, "--rest-port", "0"});
  Served again = await_rest_line(resumed);
  ASSERT_FALSE(again.job_id.empty());
  ASSERT_TRUE(testing::wait_until([&] { return first_sum(resumed.out()) >= 0; }, kDeadline)) << resumed.err();
  EXPECT_GT(first_sum(resumed.out()), 10'000) << resumed.out().substr(0, 500);
  Ran listed = run({"list", "-m", again.jobmanager});
  EXPECT_NE(listed.out.find(again.job_id + " : running sum (RUNNING)"), std::string::npos) << listed.out;

  Ran cancel = run({"cancel", "-m", again.jobmanager, again.job_id});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_NE(cancel.out.find("Cancelled job " + again.job_id), std::string::npos);
  EXPECT_EQ(resumed.wait(), 1);  // a cancelled job is not a success
  EXPECT_NE(resumed.err().find("CANCELED"), std::string::npos) << resumed.err();
}

TEST(CliSavepointTest, ClientErrorsAreClear) {
  const std::string nobody = "127.0.0.1:" + std::to_string(closed_port());
  Ran refused = run({"list", "--jobmanager", nobody});
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("cannot reach the JobManager's REST API at http://" + nobody), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("--rest-port"), std::string::npos) << refused.err;

  // A server that accepts but never answers (a SIGSTOPped job: the kernel still completes the handshake) is named
  // as such, within the savepoint's --timeout rather than after the 60 s default.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    const std::string silent = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    // list and cancel take --timeout too (list waited the fixed 60 s).
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"list", "-m", silent, "--timeout", "2"},
          std::vector<std::string>{"cancel", "-m", silent, "--timeout", "2", "0123456789abcdef0123456789abcdef"}}) {
      const auto begin = std::chrono::steady_clock::now();
      Ran r = run(args);
      const auto took = std::chrono::steady_clock::now() - begin;
      EXPECT_EQ(r.code, 1) << args[0];
      EXPECT_NE(r.err.find("within 2000 ms: is that process paused"), std::string::npos) << args[0] << ": " << r.err;
      EXPECT_LT(took, std::chrono::seconds(30)) << args[0];
    }
    const auto start = std::chrono::steady_clock::now();
    Ran paused = run({"savepoint", "-m", silent, "--timeout", "2", "0123456789abcdef0123456789abcdef"});
    const auto took = std::chrono::steady_clock::now() - start;
    ::close(fd);
    EXPECT_EQ(paused.code, 1);
    EXPECT_NE(paused.err.find("accepted the connection but did not answer POST"), std::string::npos) << paused.err;
    EXPECT_NE(paused.err.find("within 2000 ms: is that process paused"), std::string::npos) << paused.err;
    EXPECT_LT(took, std::chrono::seconds(30));
  }

  const TempDir tmp("errors");
  const fs::path& root = tmp.path;
  // No checkpoint directory: a savepoint fails with the engine's reason.
  Process job({"example", "running-sum", "--rate", "100", "--rest-port", "0"});
  Served served = await_rest_line(job);
  ASSERT_FALSE(served.job_id.empty());

  Ran unknown = run({"savepoint", "-m", served.jobmanager, "0123456789abcdef", (root / "sp").string()});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("no job with id '0123456789abcdef'"), std::string::npos) << unknown.err;

  Ran failed = run({"savepoint", "-m", served.jobmanager, served.job_id, (root / "sp").string()});
  EXPECT_EQ(failed.code, 1);
  EXPECT_NE(failed.err.find("savepoint of job " + served.job_id + " failed"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("checkpoint storage"), std::string::npos) << failed.err;

  Ran drain =
      run({"stop", "-m", served.jobmanager, "--drain", "--savepoint-dir", (root / "sp").string(), served.job_id});
  EXPECT_EQ(drain.code, 1);
  EXPECT_NE(drain.err.find("not supported yet"), std::string::npos) << drain.err;

  Ran bad_interval = run({"example", "running-sum", "--checkpoint-interval", "soon", "--rest-port", "-1"});
  EXPECT_EQ(bad_interval.code, 2);
  EXPECT_NE(bad_interval.err.find("--checkpoint-interval 'soon'"), std::string::npos) << bad_interval.err;

  Ran cancel = run({"cancel", "-m", served.jobmanager, served.job_id});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_EQ(job.wait(), 1);
}

}  // namespace
}  // namespace sluice
