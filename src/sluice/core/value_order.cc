// Value equality and total order (value.h; the rules in docs/value.md).
#include <algorithm>
#include <cmath>
#include <string_view>

#include "sluice/core/value.h"
#include "value_internals.h"

namespace sluice {

using value_internal::three_way;

namespace {

int compare_bytes(std::string_view a, std::string_view b) noexcept {
  // char_traits<char> compares as unsigned char, so this is bytewise (and code point order for UTF-8).
  int c = a.compare(b);
  return (c > 0) - (c < 0);
}

int compare_doubles(double a, double b) noexcept {
  bool na = std::isnan(a);
  bool nb = std::isnan(b);
  if (na || nb) return static_cast<int>(na) - static_cast<int>(nb);
  return three_way(a, b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Equality and order

bool operator==(const Value& a, const Value& b) noexcept {
  using K = Value::Kind;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kNull:
      return true;
    case K::kBool:
      return ValueInternals::bool_of(a) == ValueInternals::bool_of(b);
    case K::kInt64:
    case K::kTimestamp:
      return ValueInternals::int_of(a) == ValueInternals::int_of(b);
    case K::kDouble:
      return compare_doubles(ValueInternals::double_of(a), ValueInternals::double_of(b)) == 0;
    case K::kDecimal:
      return ValueInternals::decimal(a) == ValueInternals::decimal(b);
    case K::kString:
    case K::kBytes:
      return ValueInternals::payload(a) == ValueInternals::payload(b);
    case K::kArray:
      return ValueInternals::array_of(a) == ValueInternals::array_of(b);
    case K::kObject: {
      const auto& fa = ValueInternals::object_of(a);
      const auto& fb = ValueInternals::object_of(b);
      if (fa.size() != fb.size()) return false;
      for (size_t i = 0; i < fa.size(); ++i) {
        if (fa.field_at(i).first != fb.field_at(i).first || !(fa.field_at(i).second == fb.field_at(i).second)) {
          return false;
        }
      }
      return true;
    }
  }
  return false;
}

int Value::compare(const Value& a, const Value& b) noexcept {
  using K = Value::Kind;
  if (a.kind() != b.kind()) return three_way(static_cast<int>(a.kind()), static_cast<int>(b.kind()));
  switch (a.kind()) {
    case K::kNull:
      return 0;
    case K::kBool:
      return three_way(ValueInternals::bool_of(a), ValueInternals::bool_of(b));
    case K::kInt64:
    case K::kTimestamp:
      return three_way(ValueInternals::int_of(a), ValueInternals::int_of(b));
    case K::kDouble:
      return compare_doubles(ValueInternals::double_of(a), ValueInternals::double_of(b));
    case K::kDecimal:
      return Decimal::compare(ValueInternals::decimal(a), ValueInternals::decimal(b));
    case K::kString:
    case K::kBytes:
      return compare_bytes(ValueInternals::payload(a), ValueInternals::payload(b));
    case K::kArray: {
      const auto& xa = ValueInternals::array_of(a);
      const auto& xb = ValueInternals::array_of(b);
      const size_t n = std::min(xa.size(), xb.size());
      for (size_t i = 0; i < n; ++i) {
        if (int c = compare(xa[i], xb[i]); c != 0) return c;
      }
      return three_way(xa.size(), xb.size());
    }
    case K::kObject: {
      const auto& oa = ValueInternals::object_of(a);
      const auto& ob = ValueInternals::object_of(b);
      const size_t n = std::min(oa.size(), ob.size());
      for (size_t i = 0; i < n; ++i) {
        if (int c = compare_bytes(oa.field_at(i).first, ob.field_at(i).first); c != 0) return c;
        if (int c = compare(oa.field_at(i).second, ob.field_at(i).second); c != 0) return c;
      }
      return three_way(oa.size(), ob.size());
    }
  }
  return 0;
}
}  // namespace sluice
