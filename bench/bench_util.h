// Small measurement helpers shared by the benchmark programs in bench/.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <vector>

namespace sluice::bench {

/// User plus system CPU time of this process so far, in seconds (getrusage).
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

/// Peak resident set size of this process so far, in MiB (getrusage's ru_maxrss).
inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

/// The median (the mean of the two middle values for an even count); 0 for no values.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace sluice::bench
