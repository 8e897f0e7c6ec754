// Named fault points: skip and fire counts, disarming, exact names, lazy names and concurrent hits.
// Fault points are compiled into every build; the crash action is tested on a forked child (it SIGKILLs it).
#include "sluice/core/fault_points.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "sluice/core/error.h"

namespace sluice {
namespace {

class FaultPointsTest : public ::testing::Test {
 protected:
  void SetUp() override { fault::disarm_all(); }
  void TearDown() override { fault::disarm_all(); }
};

/// Hits the point `name` once; returns whether it threw the injected fault.
bool hit(const std::string& name) {
  try {
    SLUICE_FAULT_POINT(name);
    return false;
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kRuntime);
    EXPECT_EQ(e.error().message(), "injected fault at '" + name + "'");
    return true;
  }
}

TEST_F(FaultPointsTest, CompiledInThisBuild) {
  EXPECT_TRUE(fault::compiled_in());
}

TEST_F(FaultPointsTest, UnarmedPointsNeverThrow) {
  for (int i = 0; i < 10; ++i)
    EXPECT_FALSE(hit("operator.process:Map"));
  EXPECT_EQ(fault::fired("operator.process:Map"), 0);
  EXPECT_EQ(fault::hits("operator.process:Map"), 0);
}

TEST_F(FaultPointsTest, FiresAfterSkipHitsForFireCountHits) {
  fault::arm("operator.process:Map", 3, 2);
  std::vector<bool> threw;
  for (int i = 0; i < 8; ++i)
    threw.push_back(hit("operator.process:Map"));
  EXPECT_EQ(threw, (std::vector<bool>{false, false, false, true, true, false, false, false}));
  EXPECT_EQ(fault::fired("operator.process:Map"), 2);
  EXPECT_GE(fault::hits("operator.process:Map"), 5);  // exact up to the last fire
}

TEST_F(FaultPointsTest, DefaultFiresOnceAndZeroSkipFiresOnTheFirstHit) {
  fault::arm("checkpoint.snapshot:Source: n -> Map", 0);
  EXPECT_TRUE(hit("checkpoint.snapshot:Source: n -> Map"));
  EXPECT_FALSE(hit("checkpoint.snapshot:Source: n -> Map"));
  EXPECT_EQ(fault::fired("checkpoint.snapshot:Source: n -> Map"), 1);
}

TEST_F(FaultPointsTest, ForeverKeepsFiring) {
  fault::arm("sink.after-precommit:Sink: out", 1, fault::kForever);
  EXPECT_FALSE(hit("sink.after-precommit:Sink: out"));
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(hit("sink.after-precommit:Sink: out"));
  EXPECT_EQ(fault::fired("sink.after-precommit:Sink: out"), 5);
}

TEST_F(FaultPointsTest, OnlyTheExactNameFires) {
  fault::arm("operator.process:Map", 0);
  EXPECT_FALSE(hit("operator.process:Map2"));
  EXPECT_FALSE(hit("operator.process:map"));
  EXPECT_FALSE(hit("operator.process:"));
  EXPECT_FALSE(hit("checkpoint.restore:Map"));
  EXPECT_EQ(fault::hits("operator.process:Map"), 0);
  EXPECT_TRUE(hit("operator.process:Map"));
}

TEST_F(FaultPointsTest, DisarmStopsAPointAndForgetsItsCounts) {
  fault::arm("a", 0, fault::kForever);
  fault::arm("b", 0, fault::kForever);
  EXPECT_TRUE(hit("a"));
  fault::disarm("a");
  EXPECT_FALSE(hit("a"));
  EXPECT_EQ(fault::fired("a"), 0);
  EXPECT_TRUE(hit("b"));  // other points stay armed
  fault::disarm("never-armed");
  fault::disarm_all();
  EXPECT_FALSE(hit("b"));
  EXPECT_EQ(fault::fired("b"), 0);
}

TEST_F(FaultPointsTest, RearmingResetsTheCounts) {
  fault::arm("a", 0);
  EXPECT_TRUE(hit("a"));
  EXPECT_FALSE(hit("a"));
  fault::arm("a", 1);
  EXPECT_EQ(fault::fired("a"), 0);
  EXPECT_EQ(fault::hits("a"), 0);
  EXPECT_FALSE(hit("a"));
  EXPECT_TRUE(hit("a"));
}

TEST_F(FaultPointsTest, NameIsEvaluatedOnlyWhileSomethingIsArmed) {
  int evaluations = 0;
  auto name = [&evaluations] {
    ++evaluations;
    return std::string("checkpoint.restore:v");
  };
  SLUICE_FAULT_POINT(name());
  EXPECT_EQ(evaluations, 0);
  fault::arm("other", 0);
  SLUICE_FAULT_POINT(name());
  EXPECT_EQ(evaluations, 1);
  EXPECT_TRUE(hit("other"));  // "other" is now exhausted: nothing is live, so the fast path skips again
  SLUICE_FAULT_POINT(name());
  EXPECT_EQ(evaluations, 1);
}

TEST_F(FaultPointsTest, ConcurrentHitsFireExactlyFireCountTimes) {
  constexpr int kThreads = 4;
  constexpr int kHitsPerThread = 2000;
  fault::arm("operator.process:Hot", 100, 50);
  std::atomic<int> thrown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&thrown] {
      for (int i = 0; i < kHitsPerThread; ++i) {
        try {
          SLUICE_FAULT_POINT("operator.process:Hot");
          SLUICE_FAULT_POINT(std::string_view("operator.process:Cold"));
        } catch (const SluiceException&) {
          thrown.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(thrown.load(), 50);
  EXPECT_EQ(fault::fired("operator.process:Hot"), 50);
  EXPECT_GE(fault::hits("operator.process:Hot"), 150);
}

TEST_F(FaultPointsTest, ThrowInjectedFaultNamesThePoint) {
  try {
    fault::throw_injected_fault("checkpoint.restore:Source: n");
    FAIL() << "no exception";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kRuntime);
    EXPECT_EQ(e.error().message(), "injected fault at 'checkpoint.restore:Source: n'");
  }
}

// Forks a child that runs `body` and then exits 0; returns the child's wait status.
template <class Fn>
int run_in_child(Fn body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

TEST_F(FaultPointsTest, CrashKillsTheProcessWithSigkillAtTheArmedHit) {
  // The child counts its hits in a pipe: the crash must come at the third hit exactly, not earlier or later.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int status = run_in_child([&] {
    ::close(fds[0]);
    fault::arm("files.before-rename", 2, 1, fault::Action::kCrash);
    for (char i = 0; i < 5; ++i) {
      [[maybe_unused]] ssize_t n = ::write(fds[1], &i, 1);
      SLUICE_FAULT_POINT("files.before-rename");
    }
  });
  ::close(fds[1]);
  std::string seen;
  char c;
  while (::read(fds[0], &c, 1) == 1)
    seen.push_back(static_cast<char>('0' + c));
  ::close(fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_EQ(seen, "012");
}

TEST_F(FaultPointsTest, ArmFromSpecArmsEachEntry) {
  ASSERT_TRUE(fault::arm_from_spec(" a=throw ; operator.process:Sink: out=throw@2;;").ok());
  EXPECT_TRUE(hit("a"));
  EXPECT_FALSE(hit("a"));
  EXPECT_FALSE(hit("operator.process:Sink: out"));
  EXPECT_FALSE(hit("operator.process:Sink: out"));
  EXPECT_TRUE(hit("operator.process:Sink: out"));
  EXPECT_EQ(fault::fired("operator.process:Sink: out"), 1);
}

TEST_F(FaultPointsTest, ArmFromSpecCrashAction) {
  const int status = run_in_child([] {
    if (!fault::arm_from_spec("files.after-rename=crash@1").ok()) ::_exit(3);
    SLUICE_FAULT_POINT("files.after-rename");
    SLUICE_FAULT_POINT("files.after-rename");
    ::_exit(4);  // not reached
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST_F(FaultPointsTest, ArmFromSpecRejectsBadEntriesNamingThem) {
  for (const char* bad : {"a", "=crash", "a=explode", "a=crash@", "a=crash@x", "a=crash@-1", "ok=throw;b=boom"}) {
    Status st = fault::arm_from_spec(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().code(), ErrorCode::kConfiguration) << bad;
    EXPECT_NE(st.error().message().find("bad entry"), std::string::npos) << st.error().message();
  }
  // Nothing of a bad spec is armed, not even its good entries.
  EXPECT_FALSE(hit("ok"));
}

TEST_F(FaultPointsTest, ArmFromEnvironment) {
  ::setenv("SLUICE_FAULT_POINTS", "env.point=throw", 1);
  Status st = fault::arm_from_environment();
  ::unsetenv("SLUICE_FAULT_POINTS");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(hit("env.point"));
  EXPECT_TRUE(fault::arm_from_environment().ok());  // unset: nothing to arm
}

}  // namespace
}  // namespace sluice
