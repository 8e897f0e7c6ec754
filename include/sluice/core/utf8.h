// UTF-8 validation (RFC 3629 §4): the one validator for the places that must say where text stops being UTF-8
// (JSON parsing and writing in Value, the Kafka source's string and JSON values, Postgres text). A valid sequence
// is 1 to 4 bytes with no overlong form, no surrogate (U+D800..U+DFFF) and nothing above U+10FFFF.
//
// Where only a yes/no is needed on a hot path, simdjson::validate_utf8 is faster; these functions also give the
// offset of the first bad byte, for error messages that name it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sluice {

/// The length (1 to 4) of the valid UTF-8 sequence that starts at `p`, given the `avail` (>= 1) bytes readable
/// there, or 0 when no valid sequence starts there (a bad lead byte, a bad or missing continuation byte, an
/// overlong form, a surrogate, or a code point above U+10FFFF).
inline size_t utf8_sequence_length(const unsigned char* p, size_t avail) noexcept {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  auto cont = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < avail && p[i] >= lo && p[i] <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

/// The offset of the first byte of `s` that does not start a valid UTF-8 sequence, or std::string_view::npos
/// when all of `s` is valid UTF-8.
inline size_t first_invalid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    // ASCII eight bytes at a time: most text columns and JSON strings are ASCII, and one call per byte was
    // a visible part of decoding a Postgres row (callgrind).
    while (i + 8 <= s.size()) {
      uint64_t word;
      std::memcpy(&word, p + i, sizeof(word));
      if ((word & 0x8080808080808080ULL) != 0) break;
      i += 8;
    }
    if (i == s.size()) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(p + i, s.size() - i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

/// True when all of `s` is valid UTF-8.
inline bool is_valid_utf8(std::string_view s) noexcept {
  return first_invalid_utf8(s) == std::string_view::npos;
}

}  // namespace sluice
