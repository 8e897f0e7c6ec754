// Value's binary encoding (write_binary, read_binary) and its stable hash, XXH3 of the canonical encoding
// (value.h; the bytes in docs/value.md).
#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <new>

#include "sluice/core/data_io.h"
#include "sluice/core/value.h"
#include "value_internals.h"

namespace sluice {

using value_internal::uint128_t;

// ---------------------------------------------------------------------------------------------------------
// Binary encoding (docs/value.md)

namespace {

enum Tag : uint8_t {
  kTagNull = 0x00,
  kTagFalse = 0x01,
  kTagTrue = 0x02,
  kTagInt64 = 0x03,
  kTagDouble = 0x04,
  kTagDecimal = 0x05,
  kTagString = 0x06,
  kTagBytes = 0x07,
  kTagTimestamp = 0x08,
  kTagArray = 0x09,
  kTagObject = 0x0A,
};

constexpr uint64_t kCanonicalNaNBits = 0x7FF8000000000000ULL;

void write_varint128(DataOutput& out, uint128_t v) {
  while (v >= 0x80) {
    out.write_u8(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out.write_u8(static_cast<uint8_t>(v));
}

uint128_t read_varint128(DataInput& in) {
  uint128_t result = 0;
  for (int shift = 0; shift < 128; shift += 7) {
    const uint8_t b = in.read_u8();
    if (shift == 126 && (b & 0x7C) != 0) in.fail("decimal varint overflows 128 bits");
    result |= static_cast<uint128_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return result;
  }
  in.fail("decimal varint longer than 19 bytes");
}

// Writes to a DataOutput and, for hashing, flushes it into a streaming XXH3 state whenever it grows past
// kFlushBytes, so hashing a huge value needs only a bounded buffer.
class HashSink {
 public:
  static constexpr size_t kFlushBytes = 64 * 1024;

  explicit HashSink(DataOutput& buf) : buf_(buf) {}
  HashSink(const HashSink&) = delete;
  HashSink& operator=(const HashSink&) = delete;
  ~HashSink() {
    if (state_ != nullptr) XXH3_freeState(state_);
  }

  void maybe_flush() {
    if (buf_.size() < kFlushBytes) return;
    if (state_ == nullptr) {
      state_ = XXH3_createState();
      if (state_ == nullptr) throw std::bad_alloc();
      XXH3_64bits_reset(state_);
    }
    XXH3_64bits_update(state_, buf_.data(), buf_.size());
    buf_.clear();
  }

  uint64_t digest() {
    if (state_ == nullptr) return XXH3_64bits(buf_.data(), buf_.size());
    XXH3_64bits_update(state_, buf_.data(), buf_.size());
    return XXH3_64bits_digest(state_);
  }

 private:
  DataOutput& buf_;
  XXH3_state_t* state_ = nullptr;
};

// Encodes v; `canonical` (for hashing) maps values that compare equal to the same bytes: decimals are
// normalized, -0.0 becomes 0.0 and every NaN the same quiet NaN.
void encode(const Value& v, DataOutput& out, bool canonical, HashSink* sink) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kNull:
      out.write_u8(kTagNull);
      break;
    case K::kBool:
      out.write_u8(ValueInternals::bool_of(v) ? kTagTrue : kTagFalse);
      break;
    case K::kInt64:
      out.write_u8(kTagInt64);
      out.write_signed_varint(ValueInternals::int_of(v));
      break;
    case K::kDouble: {
      double d = ValueInternals::double_of(v);
      out.write_u8(kTagDouble);
      if (canonical && std::isnan(d)) {
        out.write_fixed(kCanonicalNaNBits);
      } else {
        if (canonical && d == 0) d = 0.0;
        out.write_fixed(d);
      }
      break;
    }
    case K::kDecimal: {
      Decimal d = ValueInternals::decimal(v);
      if (canonical) d = d.normalized();
      out.write_u8(kTagDecimal);
      out.write_signed_varint(d.scale());
      const int128_t u = d.unscaled();
      write_varint128(out, (static_cast<uint128_t>(u) << 1) ^ static_cast<uint128_t>(u >> 127));
      break;
    }
    case K::kString:
    case K::kBytes:
      out.write_u8(v.is_string() ? kTagString : kTagBytes);
      out.write_string(ValueInternals::payload(v));
      break;
    case K::kTimestamp:
      out.write_u8(kTagTimestamp);
      out.write_signed_varint(ValueInternals::int_of(v));
      break;
    case K::kArray: {
      const auto& a = ValueInternals::array_of(v);
      out.write_u8(kTagArray);
      out.write_varint(a.size());
      for (const Value& e : a) {
        encode(e, out, canonical, sink);
        if (sink != nullptr) sink->maybe_flush();
      }
      break;
    }
    case K::kObject: {
      const auto& o = ValueInternals::object_of(v);
      out.write_u8(kTagObject);
      out.write_varint(o.size());
      for (const auto& [key, value] : o) {
        out.write_string(key);
        encode(value, out, canonical, sink);
        if (sink != nullptr) sink->maybe_flush();
      }
      break;
    }
  }
}

void decode(Value& target, DataInput& in, int depth) {
  const uint8_t tag = in.read_u8();
  switch (tag) {
    case kTagNull:
      ValueInternals::reset(target);
      break;
    case kTagFalse:
    case kTagTrue:
      target = Value(tag == kTagTrue);
      break;
    case kTagInt64:
      target = Value(in.read_signed_varint());
      break;
    case kTagDouble:
      target = Value(in.read_fixed<double>());
      break;
    case kTagDecimal: {
      const int64_t scale = in.read_signed_varint();
      const uint128_t z = read_varint128(in);
      const auto unscaled = static_cast<int128_t>((z >> 1) ^ (uint128_t{0} - (z & 1)));
      if (scale < Decimal::kMinScale || scale > Decimal::kMaxScale) {
        in.fail(fmt::format("decimal scale {} is out of range", scale));
      }
      auto d = Decimal::of(unscaled, static_cast<int32_t>(scale));
      if (!d.ok()) in.fail(d.error().message());
      ValueInternals::assign_decimal(target, *d);
      break;
    }
    case kTagString:
    case kTagBytes: {
      const size_t n = in.read_length();
      ValueInternals::assign_bytes(target, tag == kTagString ? Value::Kind::kString : Value::Kind::kBytes,
                                   in.read_view(n));
      break;
    }
    case kTagTimestamp:
      target = Value::timestamp_micros(in.read_signed_varint());
      break;
    case kTagArray: {
      if (depth >= kMaxValueDepth) in.fail(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
      const uint64_t n = in.read_varint();
      // Every element takes at least one byte, so a larger count is corrupt (and must not be allocated).
      if (n > in.remaining()) in.fail(fmt::format("array of {} elements exceeds the remaining bytes", n));
      Value::Array& a = ValueInternals::make_array(target);
      a.resize(static_cast<size_t>(n));
      for (Value& e : a)
        decode(e, in, depth + 1);
      break;
    }
    case kTagObject: {
      if (depth >= kMaxValueDepth) in.fail(fmt::format("values nest deeper than {} levels", kMaxValueDepth));
      const uint64_t n = in.read_varint();
      // Every field takes at least two bytes (key length and value tag).
      if (n > in.remaining() / 2) in.fail(fmt::format("object of {} fields exceeds the remaining bytes", n));
      auto& fields = ValueInternals::fields(ValueInternals::make_object(target));
      fields.resize(static_cast<size_t>(n));
      for (auto& [key, value] : fields) {
        in.read_string(key);
        decode(value, in, depth + 1);
      }
      break;
    }
    default:
      in.fail(fmt::format("unknown value tag 0x{:02x}", tag));
  }
}

}  // namespace

void Value::write_binary(DataOutput& out) const {
  encode(*this, out, false, nullptr);
}

void Value::read_binary(Value& target, DataInput& in) {
  decode(target, in, 0);
}

uint64_t Value::hash() const {
  // One buffer per thread: hashing runs per record (key-by on a Value) and must not allocate each time.
  thread_local DataOutput buffer(256);
  buffer.clear();
  HashSink sink(buffer);
  encode(*this, buffer, true, &sink);
  return sink.digest();
}
}  // namespace sluice
