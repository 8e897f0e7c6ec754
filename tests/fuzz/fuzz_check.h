// A check for fuzz targets: a broken property (a round trip that changes a value) is a finding, reported as a
// crash with the reason so that libFuzzer saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define SLUICE_FUZZ_CHECK(cond, detail)                                                        \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz check failed: %s: %s\n", #cond, std::string(detail).c_str()); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
