// ThreadChecker (core/thread_checker.h): unbound it lets every thread pass; bound, only its owner; detached, every
// thread again. SLUICE_DCHECK_ON_THREAD aborts naming the member when asserts are on (the debug, asan and tsan
// presets) and is compiled out under NDEBUG (release).
#include "sluice/core/thread_checker.h"

#include <gtest/gtest.h>

#include <thread>

namespace sluice {
namespace {

bool current_on_another_thread(const ThreadChecker& c) {
  bool current = false;
  std::thread([&] { current = c.is_current(); }).join();
  return current;
}

TEST(ThreadCheckerTest, UnboundEveryThreadPassesBoundOnlyTheOwnerDetachedEveryThreadAgain) {
  ThreadChecker c;
  EXPECT_TRUE(c.is_current());
  EXPECT_TRUE(current_on_another_thread(c));
  c.bind();
  EXPECT_TRUE(c.is_current());
  EXPECT_FALSE(current_on_another_thread(c));
  c.detach();
  EXPECT_TRUE(current_on_another_thread(c));
  std::thread([&] { c.bind(); }).join();
  EXPECT_FALSE(c.is_current()) << "bound to the thread that called bind()";
}

TEST(ThreadCheckerDeathTest, ACallFromAnotherThreadAbortsNamingTheMember) {
#ifdef NDEBUG
  GTEST_SKIP() << "the check is compiled out under NDEBUG (release); the debug, asan and tsan presets run it";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadChecker c;
  c.bind();
  SLUICE_DCHECK_ON_THREAD(c, "Owner::member");  // the owner passes
  EXPECT_DEATH(std::thread([&] { SLUICE_DCHECK_ON_THREAD(c, "Owner::member"); }).join(),
               "Owner::member called on a thread that does not own it");
#endif
}

}  // namespace
}  // namespace sluice
