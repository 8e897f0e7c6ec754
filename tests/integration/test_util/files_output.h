// Reads a files sink's output back as a consumer would: the committed part files only (in-progress files start
// with '.'), counting the events by their payload's id, for tests that count missing and duplicated records.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "sluice/core/value.h"

namespace sluice::testing {

/// The `payload.id` of every event in the part files under `dir` (any depth), with how often each appears. A line
/// that does not parse (being written) is left out; a missing `dir` gives an empty map.
inline std::map<std::string, int> files_sink_ids(const std::filesystem::path& dir) {
  std::map<std::string, int> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file() || !f.path().filename().string().starts_with("part-")) continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      Result<Value> v = Value::from_json(line);
      if (!v.ok()) continue;  // a line being written
      const Value* payload = v->find("payload");
      const Value* id = payload != nullptr ? payload->find("id") : nullptr;
      if (id != nullptr && id->is_string()) ++out[std::string(id->as_string())];
    }
  }
  return out;
}

}  // namespace sluice::testing
