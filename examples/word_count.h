// The word-count example: text lines -> words -> count per word. Shared by the `sluice example wordcount`
// command, the standalone example binary and the tests.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sluice/api/stream_environment.h"

namespace sluice::examples {

/// Splits a line into lower-case words (letters, digits and inner apostrophes).
std::vector<std::string> split_words(std::string_view line);

/// Adds the word-count pipeline to `env`: reads `inputs` (files, directories or globs) and calls
/// `on_result` once at the end with every word's final count. Word counts run at the environment's
/// parallelism; the final collection runs at parallelism 1.
void build_word_count(StreamEnvironment& env, std::vector<std::string> inputs,
                      std::function<void(const std::map<std::string, int64_t>&)> on_result);

/// A count of charges for build_running_sum that never ends (the job runs until stopped or cancelled).
inline constexpr int64_t kEndless = std::numeric_limits<int64_t>::max();

/// Adds the running-sum example: `count` (or kEndless) seeded random charges (customer, amount) from
/// datagen, at most `records_per_second` over all subtasks (0 = no limit), summed per customer, printed as
/// they change. Its operators have stable uids ("charges", "sum-per-customer", "print"), so it can be stopped
/// with a savepoint and resumed from it, also at another parallelism.
void build_running_sum(StreamEnvironment& env, int64_t count, uint64_t seed, double records_per_second = 0);

}  // namespace sluice::examples
