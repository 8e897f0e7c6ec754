#include "sluice/pipeline/expression_time.h"

#include <cstdio>

namespace sluice::pipeline::detail {

namespace {

constexpr int64_t kMicrosPerSecond = 1'000'000;
constexpr int64_t kMicrosPerDay = 86'400 * kMicrosPerSecond;

// Howard Hinnant's days_from_civil / civil_from_days (public domain algorithms).
int64_t days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

void civil_from_days(int64_t z, int64_t& y, int& m, int& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  y = yoe + era * 400;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  d = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
  m = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
  y += m <= 2 ? 1 : 0;
}

bool is_leap(int64_t y) {
  return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

int days_in_month(int64_t y, int m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : kDays[m - 1];
}

// Reads exactly `count` digits (or 1..max_count when count is 0) at `pos`.
bool read_digits(std::string_view s, size_t& pos, size_t min_count, size_t max_count, int64_t& out) {
  size_t n = 0;
  int64_t v = 0;
  while (pos + n < s.size() && n < max_count && s[pos + n] >= '0' && s[pos + n] <= '9') {
    v = v * 10 + (s[pos + n] - '0');
    ++n;
  }
  if (n < min_count) return false;
  pos += n;
  out = v;
  return true;
}

void append_padded(std::string& out, int64_t v, size_t width) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  if (v < 0) out.push_back('-');
  if (digits.size() < width) out.append(width - digits.size(), '0');
  out += digits;
}

}  // namespace

CivilTime to_civil(int64_t epoch_micros) {
  int64_t days = epoch_micros / kMicrosPerDay;
  int64_t rem = epoch_micros % kMicrosPerDay;
  if (rem < 0) {
    rem += kMicrosPerDay;
    --days;
  }
  CivilTime t;
  civil_from_days(days, t.year, t.month, t.day);
  const int64_t secs = rem / kMicrosPerSecond;
  t.micros = static_cast<int>(rem % kMicrosPerSecond);
  t.hour = static_cast<int>(secs / 3600);
  t.minute = static_cast<int>(secs / 60 % 60);
  t.second = static_cast<int>(secs % 60);
  return t;
}

std::optional<int64_t> from_civil(const CivilTime& t) {
  if (t.month < 1 || t.month > 12 || t.day < 1 || t.day > days_in_month(t.year, t.month)) return std::nullopt;
  if (t.hour < 0 || t.hour > 23 || t.minute < 0 || t.minute > 59 || t.second < 0 || t.second > 59) {
    return std::nullopt;
  }
  if (t.micros < 0 || t.micros > 999'999 || t.year < -290'000 || t.year > 290'000) return std::nullopt;
  const int64_t days = days_from_civil(t.year, t.month, t.day);
  return days * kMicrosPerDay + ((t.hour * 60LL + t.minute) * 60 + t.second) * kMicrosPerSecond + t.micros;
}

std::optional<int64_t> parse_timestamp(std::string_view s) {
  while (!s.empty() && s.front() == ' ')
    s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ')
    s.remove_suffix(1);
  CivilTime t;
  size_t pos = 0;
  int64_t v = 0;
  if (!read_digits(s, pos, 4, 6, v)) return std::nullopt;
  t.year = v;
  if (pos >= s.size() || s[pos++] != '-' || !read_digits(s, pos, 1, 2, v)) return std::nullopt;
  t.month = static_cast<int>(v);
  if (pos >= s.size() || s[pos++] != '-' || !read_digits(s, pos, 1, 2, v)) return std::nullopt;
  t.day = static_cast<int>(v);
  int64_t offset_seconds = 0;
  if (pos < s.size()) {
    if (s[pos] != ' ' && s[pos] != 'T' && s[pos] != 't') return std::nullopt;
    ++pos;
    if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
    t.hour = static_cast<int>(v);
    if (pos >= s.size() || s[pos++] != ':' || !read_digits(s, pos, 2, 2, v)) return std::nullopt;
    t.minute = static_cast<int>(v);
    if (pos < s.size() && s[pos] == ':') {
      ++pos;
      if (!read_digits(s, pos, 2, 2, v)) return std::nullopt;
      t.second = static_cast<int>(v);
      if (pos < s.size() && s[pos] == '.') {
        ++pos;
        size_t start = pos;
        if (!read_digits(s, pos, 1, 9, v)) return std::nullopt;
        size_t digits = pos - start;
        while (digits < 6) {
          v *= 10;
          ++digits;
        }
        while (digits > 6) {
          v /= 10;
          --digits;
        }
        t.micros = static_cast<int>(v);
      }
    }
    if (pos < s.size()) {
      if (s[pos] == 'Z' || s[pos] == 'z') {
        ++pos;
      } else if (s[pos] == '+' || s[pos] == '-') {
        const int sign = s[pos] == '-' ? -1 : 1;
        ++pos;
        int64_t hh = 0, mm = 0;
        if (!read_digits(s, pos, 2, 2, hh)) return std::nullopt;
        if (pos < s.size() && s[pos] == ':') ++pos;
        if (pos < s.size() && !read_digits(s, pos, 2, 2, mm)) return std::nullopt;
        offset_seconds = sign * (hh * 3600 + mm * 60);
      }
    }
  }
  if (pos != s.size()) return std::nullopt;
  auto micros = from_civil(t);
  if (!micros) return std::nullopt;
  return *micros - offset_seconds * kMicrosPerSecond;
}

std::optional<int64_t> parse_timestamp(std::string_view s, std::string_view pattern) {
  CivilTime t;
  size_t pos = 0;
  size_t p = 0;
  while (p < pattern.size()) {
    const char c = pattern[p];
    if (c == '\'') {
      size_t q = p + 1;
      while (q < pattern.size() && pattern[q] != '\'') {
        if (pos >= s.size() || s[pos] != pattern[q]) return std::nullopt;
        ++pos;
        ++q;
      }
      if (q == p + 1) {  // '' is a literal quote
        if (pos >= s.size() || s[pos] != '\'') return std::nullopt;
        ++pos;
      }
      p = q + 1;
      continue;
    }
    size_t run = 1;
    while (p + run < pattern.size() && pattern[p + run] == c)
      ++run;
    int64_t v = 0;
    switch (c) {
      case 'y':
        if (!read_digits(s, pos, run == 2 ? 2 : 1, run == 2 ? 2 : 6, v)) return std::nullopt;
        t.year = run == 2 ? 2000 + v : v;
        break;
      case 'M':
        if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
        t.month = static_cast<int>(v);
        break;
      case 'd':
        if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
        t.day = static_cast<int>(v);
        break;
      case 'H':
        if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
        t.hour = static_cast<int>(v);
        break;
      case 'm':
        if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
        t.minute = static_cast<int>(v);
        break;
      case 's':
        if (!read_digits(s, pos, 1, 2, v)) return std::nullopt;
        t.second = static_cast<int>(v);
        break;
      case 'S': {
        const size_t start = pos;
        if (!read_digits(s, pos, 1, run, v)) return std::nullopt;
        size_t digits = pos - start;
        for (; digits < 6; ++digits)
          v *= 10;
        for (; digits > 6; --digits)
          v /= 10;
        t.micros = static_cast<int>(v);
        break;
      }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return std::nullopt;  // unsupported letter
        for (size_t k = 0; k < run; ++k) {
          if (pos >= s.size() || s[pos] != c) return std::nullopt;
          ++pos;
        }
        break;
    }
    p += run;
  }
  if (pos != s.size()) return std::nullopt;
  return from_civil(t);
}

std::string format_timestamp(int64_t epoch_micros, std::string_view pattern) {
  const CivilTime t = to_civil(epoch_micros);
  std::string out;
  size_t p = 0;
  while (p < pattern.size()) {
    const char c = pattern[p];
    if (c == '\'') {
      size_t q = p + 1;
      while (q < pattern.size() && pattern[q] != '\'')
        out.push_back(pattern[q++]);
      if (q == p + 1) out.push_back('\'');
      p = q + 1;
      continue;
    }
    size_t run = 1;
    while (p + run < pattern.size() && pattern[p + run] == c)
      ++run;
    switch (c) {
      case 'y':
        if (run == 2) {
          append_padded(out, ((t.year % 100) + 100) % 100, 2);
        } else {
          append_padded(out, t.year, run);
        }
        break;
      case 'M':
        append_padded(out, t.month, run);
        break;
      case 'd':
        append_padded(out, t.day, run);
        break;
      case 'H':
        append_padded(out, t.hour, run);
        break;
      case 'm':
        append_padded(out, t.minute, run);
        break;
      case 's':
        append_padded(out, t.second, run);
        break;
      case 'S': {
        std::string frac;
        append_padded(frac, t.micros, 6);
        if (run <= 6) {
          out += frac.substr(0, run);
        } else {
          out += frac;
          out.append(run - 6, '0');
        }
        break;
      }
      default:
        out.append(run, c);
        break;
    }
    p += run;
  }
  return out;
}

}  // namespace sluice::pipeline::detail
