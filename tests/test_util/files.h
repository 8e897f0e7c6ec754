// Whole-file reads and writes for tests that plant, corrupt or inspect checkpoint files.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace sluice::testing {

/// The bytes of `p`; empty when it cannot be opened (the caller's assertions then fail on the content).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Replaces the content of `p` with `bytes` (creates it).
inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace sluice::testing
