#include "sluice/core/thread_checker.h"

#include <cstdio>
#include <cstdlib>

namespace sluice {

void thread_check_failed(const char* what, const char* file, int line) noexcept {
  // No logger: this may run on any thread while the process is in an unknown state; stderr is enough to find it.
  std::fprintf(stderr, "%s:%d: %s called on a thread that does not own it (a \"task thread only\" member)\n", file,
               line, what);
  std::fflush(stderr);
  std::abort();
}

}  // namespace sluice
