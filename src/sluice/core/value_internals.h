// Private to core/: the representation of Value and Decimal as the files that implement them see it
// (value.cc, decimal.cc, value_order.cc, value_path.cc, value_codec.cc, value_to_json.cc, value_from_json.cc),
// and the few helpers more than one of them needs. Not installed; nothing outside src/sluice/core/ includes it.
//
// Thread-safety: as Value's (free functions and static members on values the caller owns).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/value.h"

namespace sluice {
namespace value_internal {

__extension__ typedef unsigned __int128 uint128_t;

inline bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

/// -1, 0 or 1 as a <, ==, > b.
template <class T>
int three_way(T a, T b) noexcept {
  return (a > b) - (a < b);
}

/// Parses a JSON number literal into (unscaled, scale) within Decimal's limits; on failure returns false with
/// `reason` set (Decimal::parse's error without the text). Defined in decimal.cc.
bool parse_decimal(std::string_view text, int128_t& unscaled_out, int32_t& scale_out, std::string& reason);

}  // namespace value_internal

/// Access to the representation for the codecs, the order and the JSON reader and writer.
class ValueInternals {
 public:
  static std::vector<Value::Object::Field>& fields(Value::Object& o) noexcept { return o.fields_; }

  static Decimal decimal_of(int128_t unscaled, int32_t scale) noexcept { return Decimal(unscaled, scale); }

  static void reset(Value& v) noexcept {
    v.release();
    std::memset(v.rep_, 0, sizeof(v.rep_));
  }

  /// Makes v a string or bytes value holding b, reusing v's heap block when it is big enough.
  static void assign_bytes(Value& v, Value::Kind k, std::string_view b) {
    if ((v.kind() == Value::Kind::kString || v.kind() == Value::Kind::kBytes) && v.rep_[1] == Value::kHeapMarker &&
        b.size() > Value::kInlineCapacity) {
      auto* h = v.load<detail::HeapBytes*>(8);
      if (h->capacity >= b.size()) {
        std::memcpy(h->data(), b.data(), b.size());
        h->size = b.size();
        v.rep_[0] = static_cast<uint8_t>(k);
        return;
      }
    }
    reset(v);
    v.init_bytes(k, b);
  }

  /// Makes v a decimal, reusing its heap box when it has one and d needs one.
  static void assign_decimal(Value& v, const Decimal& d) {
    if (v.kind() == Value::Kind::kDecimal && v.rep_[1] == Value::kHeapMarker && !fits_inline(d)) {
      *v.load<Decimal*>(8) = d;
      return;
    }
    reset(v);
    init_decimal(v, d);
  }

  static bool fits_inline(const Decimal& d) noexcept {
    return d.unscaled_ >= std::numeric_limits<int64_t>::min() && d.unscaled_ <= std::numeric_limits<int64_t>::max();
  }

  static void init_decimal(Value& v, const Decimal& d) {
    if (fits_inline(d)) {
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kDecimal);
      v.rep_[1] = 0;
      v.store<int32_t>(4, d.scale_);
      v.store<int64_t>(8, static_cast<int64_t>(d.unscaled_));
    } else {
      auto* p = new Decimal(d);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kDecimal);
      v.rep_[1] = Value::kHeapMarker;
      v.store(8, p);
    }
  }

  static Decimal decimal(const Value& v) noexcept {
    if (v.rep_[1] == Value::kHeapMarker) return *v.load<const Decimal*>(8);
    return Decimal(v.load<int64_t>(8), v.load<int32_t>(4));
  }

  static std::string_view payload(const Value& v) noexcept { return v.payload_bytes(); }
  static bool bool_of(const Value& v) noexcept { return v.rep_[8] != 0; }
  static int64_t int_of(const Value& v) noexcept { return v.load<int64_t>(8); }
  static double double_of(const Value& v) noexcept { return v.load<double>(8); }
  static const Value::Array& array_of(const Value& v) noexcept { return *v.load<const Value::Array*>(8); }
  static const Value::Object& object_of(const Value& v) noexcept { return *v.load<const Value::Object*>(8); }

  /// Makes v an array; an existing array is kept with its elements, whose storage the caller may reuse.
  static Value::Array& make_array(Value& v) {
    if (v.kind() != Value::Kind::kArray) {
      auto* p = new Value::Array();
      reset(v);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kArray);
      v.store(8, p);
    }
    return *v.load<Value::Array*>(8);
  }

  /// Makes v an object; an existing object is kept with its fields, whose storage the caller may reuse.
  static Value::Object& make_object(Value& v) {
    if (v.kind() != Value::Kind::kObject) {
      auto* p = new Value::Object();
      reset(v);
      v.rep_[0] = static_cast<uint8_t>(Value::Kind::kObject);
      v.store(8, p);
    }
    return *v.load<Value::Object*>(8);
  }
};

}  // namespace sluice
