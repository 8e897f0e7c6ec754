// The keyed counting job of the checkpoint tests: every record v counts towards key v % keys, and the job
// emits "key,count" per record. Its exactly-once output is known in advance (expected_counts), so a run with
// failures can be compared line by line with a failure-free one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "sluice/api/keyed_process_function.h"
#include "sluice/state/keyed_state_store.h"  // keyed_state().get_state()

namespace sluice::testing {

/// Counts records per key in ValueState and emits "key,count" for every record.
class CountPerKey final : public KeyedProcessFunction<int64_t, int64_t, std::string> {
 public:
  explicit CountPerKey(int64_t keys) : keys_(keys) {}
  void open(RuntimeContext&) override { count_ = &keyed_state().get_state(ValueStateDescriptor<int64_t>{"count", 0}); }
  void process_element(const int64_t& value, Context&, Collector<std::string>& out) override {
    int64_t c = count_->value() + 1;
    count_->update(c);
    out.collect(std::to_string(value % keys_) + "," + std::to_string(c));
  }

 private:
  int64_t keys_;
  ValueState<int64_t>* count_ = nullptr;
};

/// The lines (with multiplicity) the counting job emits for the records 0..records-1.
inline std::map<std::string, int64_t> expected_counts(int64_t records, int64_t keys) {
  std::map<std::string, int64_t> expected;
  std::vector<int64_t> per_key(static_cast<size_t>(keys), 0);
  for (int64_t v = 0; v < records; ++v) {
    const int64_t k = v % keys;
    ++expected[std::to_string(k) + "," + std::to_string(++per_key[static_cast<size_t>(k)])];
  }
  return expected;
}

/// Committed output lines of a FileSink directory with their multiplicity (hidden in-progress files are not
/// output).
inline std::map<std::string, int64_t> read_committed(const std::filesystem::path& dir) {
  std::map<std::string, int64_t> lines;
  if (!std::filesystem::exists(dir)) return lines;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string().starts_with(".")) continue;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) ++lines[line];
    }
  }
  return lines;
}

}  // namespace sluice::testing
