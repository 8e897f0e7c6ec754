// The event-time window job of the RocksDB tests: records 0..n-1 with event time = value (ms), keyed v % keys,
// summed per 1-second tumbling window, and emitted as "key,window start,sum". Its exactly-once output is known in
// advance (expected_window_sums), so a run with failures or kills can be compared line by line with a failure-free
// one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/windowed_stream.h"

namespace sluice::testing {

/// Emits "key,window start,sum" for a window whose reduce left its sum as the only element.
struct WindowSumLine final : ProcessWindowFunction<int64_t, std::string, int64_t, TimeWindow> {
  void process(const int64_t& key, Context& ctx, const std::vector<int64_t>& sums,
               Collector<std::string>& out) override {
    out.collect(std::to_string(key) + "," + std::to_string(ctx.window().start) + "," + std::to_string(sums.front()));
  }
};

/// "key,window start,sum" (with multiplicity) for every key and 1-second tumbling window of the records
/// 0..records-1 keyed v % keys, whose event time is their value in milliseconds.
inline std::map<std::string, int64_t> expected_window_sums(int64_t records, int64_t keys) {
  std::map<std::pair<int64_t, int64_t>, int64_t> sums;
  for (int64_t v = 0; v < records; ++v)
    sums[{v % keys, v / 1000 * 1000}] += v;
  std::map<std::string, int64_t> lines;
  for (const auto& [kw, sum] : sums)
    ++lines[std::to_string(kw.first) + "," + std::to_string(kw.second) + "," + std::to_string(sum)];
  return lines;
}

}  // namespace sluice::testing
