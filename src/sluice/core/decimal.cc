// Decimal (value.h): limits, JSON number literals in and out, conversion to double, exact numeric order.
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include "sluice/core/value.h"
#include "value_internals.h"

namespace sluice {

using value_internal::is_digit;
using value_internal::three_way;
using value_internal::uint128_t;

namespace {

constexpr std::array<uint128_t, 39> kPow10 = [] {
  std::array<uint128_t, 39> t{};
  t[0] = 1;
  for (size_t i = 1; i < t.size(); ++i)
    t[i] = t[i - 1] * 10;
  return t;
}();
constexpr uint128_t kMaxUnscaledMagnitude = kPow10[Decimal::kMaxPrecision] - 1;

uint128_t magnitude(int128_t v) noexcept {
  return v < 0 ? uint128_t{0} - static_cast<uint128_t>(v) : static_cast<uint128_t>(v);
}

int digit_count(uint128_t m) noexcept {
  int d = 1;
  while (d < 39 && m >= kPow10[static_cast<size_t>(d)])
    ++d;
  return d;
}

}  // namespace

Result<Decimal> Decimal::of(int128_t unscaled, int32_t scale) {
  if (magnitude(unscaled) > kMaxUnscaledMagnitude) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("decimal unscaled value has more than {} digits", kMaxPrecision));
  }
  if (scale < kMinScale || scale > kMaxScale) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("decimal scale {} is outside [{}, {}]", scale, kMinScale, kMaxScale));
  }
  return Decimal(unscaled, scale);
}

namespace value_internal {

bool parse_decimal(std::string_view text, int128_t& unscaled_out, int32_t& scale_out, std::string& reason) {
  auto fail = [&](std::string why) {
    reason = std::move(why);
    return false;
  };
  // JSON number grammar (RFC 8259 §6): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  size_t i = 0;
  const size_t n = text.size();
  bool negative = false;
  if (i < n && text[i] == '-') {
    negative = true;
    ++i;
  }
  if (i >= n || !is_digit(text[i])) return fail("expected a digit");
  const size_t int_begin = i;
  if (text[i] == '0') {
    ++i;
    if (i < n && is_digit(text[i])) return fail("leading zeros are not allowed");
  } else {
    while (i < n && is_digit(text[i]))
      ++i;
  }
  const size_t int_end = i;
  size_t frac_begin = i;
  size_t frac_end = i;
  if (i < n && text[i] == '.') {
    ++i;
    frac_begin = i;
    while (i < n && is_digit(text[i]))
      ++i;
    frac_end = i;
    if (frac_end == frac_begin) return fail("expected a digit after '.'");
  }
  int64_t exponent = 0;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < n && (text[i] == '+' || text[i] == '-')) {
      exp_negative = text[i] == '-';
      ++i;
    }
    if (i >= n || !is_digit(text[i])) return fail("expected a digit in the exponent");
    while (i < n && is_digit(text[i])) {
      // Saturate: anything this large is out of the scale range anyway.
      if (exponent < 1'000'000'000) exponent = exponent * 10 + (text[i] - '0');
      ++i;
    }
    if (exp_negative) exponent = -exponent;
  }
  if (i != n) return fail(fmt::format("unexpected character at position {}", i));

  uint128_t value = 0;
  int significant = 0;
  auto add_digits = [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      int d = text[k] - '0';
      if (significant == 0 && d == 0) continue;  // leading zeros carry no precision
      if (++significant > Decimal::kMaxPrecision) return false;
      value = value * 10 + static_cast<uint128_t>(d);
    }
    return true;
  };
  if (!add_digits(int_begin, int_end) || !add_digits(frac_begin, frac_end)) {
    return fail(fmt::format("more than {} significant digits", Decimal::kMaxPrecision));
  }
  const int64_t scale = static_cast<int64_t>(frac_end - frac_begin) - exponent;
  if (scale < Decimal::kMinScale || scale > Decimal::kMaxScale) {
    return fail(fmt::format("scale {} is outside [{}, {}]", scale, Decimal::kMinScale, Decimal::kMaxScale));
  }
  const auto unscaled = static_cast<int128_t>(value);
  unscaled_out = negative ? -unscaled : unscaled;
  scale_out = static_cast<int32_t>(scale);
  return true;
}

}  // namespace value_internal

Result<Decimal> Decimal::parse(std::string_view text) {
  int128_t unscaled = 0;
  int32_t scale = 0;
  std::string reason;
  if (!value_internal::parse_decimal(text, unscaled, scale, reason)) {
    return Error(ErrorCode::kSerialization, fmt::format("invalid decimal '{}': {}", text, reason));
  }
  return Decimal(unscaled, scale);
}

int Decimal::precision() const noexcept {
  return digit_count(magnitude(unscaled_));
}

void Decimal::append_to(std::string& out) const {
  char digits[40];
  int len = 0;
  uint128_t m = magnitude(unscaled_);
  do {
    digits[len++] = static_cast<char>('0' + static_cast<int>(m % 10));
    m /= 10;
  } while (m != 0);
  if (unscaled_ < 0) out.push_back('-');
  auto put_digits = [&](int from, int to) {  // digits[from-1] down to digits[to], most significant first
    for (int k = from - 1; k >= to; --k)
      out.push_back(digits[k]);
  };
  if (scale_ <= 0) {
    put_digits(len, 0);
    if (scale_ < 0) {
      out += "E+";
      out += std::to_string(-static_cast<int64_t>(scale_));
    }
  } else if (len > scale_) {
    put_digits(len, scale_);
    out.push_back('.');
    put_digits(scale_, 0);
  } else {
    out += "0.";
    out.append(static_cast<size_t>(scale_ - len), '0');
    put_digits(len, 0);
  }
}

std::string Decimal::to_string() const {
  std::string s;
  append_to(s);
  return s;
}

double Decimal::to_double() const {
  // Going through the exact text lets from_chars round correctly, which scaling in floating point does
  // not.
  const std::string text = to_string();
  double d = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), d);
  if (r.ec == std::errc::result_out_of_range) {
    // from_chars reports both overflow and underflow this way; the exponent tells which.
    bool overflow = precision() - scale_ > 0;
    if (!overflow) return unscaled_ < 0 ? -0.0 : 0.0;
    return unscaled_ < 0 ? -HUGE_VAL : HUGE_VAL;
  }
  return d;
}

Decimal Decimal::normalized() const noexcept {
  if (unscaled_ == 0) return Decimal();
  int128_t u = unscaled_;
  int32_t s = scale_;
  while (s > kMinScale && u % 10 == 0) {
    u /= 10;
    --s;
  }
  return Decimal(u, s);
}

int Decimal::compare(const Decimal& a, const Decimal& b) noexcept {
  const int sa = three_way(a.unscaled_, int128_t{0});
  const int sb = three_way(b.unscaled_, int128_t{0});
  if (sa != sb) return three_way(sa, sb);
  if (sa == 0) return 0;
  uint128_t ma = magnitude(a.unscaled_);
  uint128_t mb = magnitude(b.unscaled_);
  // The position of the leading digit decides unless it is the same; then the scales differ by at most
  // 37 and aligning the smaller-scale magnitude yields at most 38 digits, which fits in 128 bits.
  const int64_t ea = static_cast<int64_t>(digit_count(ma)) - a.scale_;
  const int64_t eb = static_cast<int64_t>(digit_count(mb)) - b.scale_;
  int mag;
  if (ea != eb) {
    mag = three_way(ea, eb);
  } else {
    if (a.scale_ < b.scale_) {
      ma *= kPow10[static_cast<size_t>(b.scale_ - a.scale_)];
    } else {
      mb *= kPow10[static_cast<size_t>(a.scale_ - b.scale_)];
    }
    mag = three_way(ma, mb);
  }
  return sa > 0 ? mag : -mag;
}
}  // namespace sluice
