// Timestamp helpers of the expression language: civil-time conversion (proleptic Gregorian, UTC), ISO-8601
// parsing and Java-style (SimpleDateFormat letters) formatting and parsing. Private to src/sluice/pipeline.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::pipeline::detail {

struct CivilTime {
  int64_t year = 1970;
  int month = 1;  ///< 1..12
  int day = 1;    ///< 1..31
  int hour = 0;
  int minute = 0;
  int second = 0;
  int micros = 0;  ///< 0..999999
};

CivilTime to_civil(int64_t epoch_micros);
/// Returns nullopt when a field is out of range (month 13, day 32, hour 24, ...).
std::optional<int64_t> from_civil(const CivilTime& t);

/// Parses "2024-01-02", "2024-01-02 03:04[:05[.123456]]", with 'T' instead of the space, and an optional
/// "Z" or "+hh:mm"/"-hh:mm" offset (converted to UTC). Returns µs since the epoch, or nullopt.
std::optional<int64_t> parse_timestamp(std::string_view text);
/// Parses `text` with a pattern of letters y M d H m s S ('quoted' literal text; other characters must
/// match themselves). Returns nullopt when it does not match.
std::optional<int64_t> parse_timestamp(std::string_view text, std::string_view pattern);
/// Formats with the same letters; S..S prints that many digits of the fraction of a second.
std::string format_timestamp(int64_t epoch_micros, std::string_view pattern);

}  // namespace sluice::pipeline::detail
