// DataOutput and DataInput: the byte sinks and sources every TypeSerializer writes to and reads from.
//
// Encoding primitives (the building blocks of the binary format in docs/serialization.md):
//  * fixed-width integers and IEEE-754 doubles: little-endian, their natural width;
//  * varint: unsigned LEB128 (7 bits a byte, low group first, high bit = more), as Protocol Buffers;
//  * signed varint: ZigZag then varint, as Protocol Buffers ("Encoding", protobuf.dev);
//  * byte strings: varint length followed by the bytes.
// Neither class is thread-safe; each belongs to one task thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <string_view>

#include "sluice/core/error.h"

namespace sluice {

/// A growable byte buffer that serializers append to. Reusing one DataOutput (clear() between records)
/// keeps its capacity, so steady-state serialization does not allocate.
class DataOutput {
 public:
  DataOutput() = default;
  explicit DataOutput(size_t initial_capacity) { reserve(initial_capacity); }
  DataOutput(const DataOutput&) = delete;
  DataOutput& operator=(const DataOutput&) = delete;
  DataOutput(DataOutput&& o) noexcept : data_(o.data_), size_(o.size_), cap_(o.cap_) {
    o.data_ = nullptr;
    o.size_ = o.cap_ = 0;
  }
  ~DataOutput() { std::free(data_); }

  const uint8_t* data() const noexcept { return data_; }
  uint8_t* data() noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  size_t capacity() const noexcept { return cap_; }
  std::span<const uint8_t> bytes() const noexcept { return {data_, size_}; }
  std::string_view view() const noexcept { return {reinterpret_cast<const char*>(data_), size_}; }
  void clear() noexcept { size_ = 0; }

  void reserve(size_t n) {
    if (n <= cap_) return;
    size_t c = cap_ == 0 ? 64 : cap_;
    while (c < n)
      c *= 2;
    auto* p = static_cast<uint8_t*>(std::realloc(data_, c));
    if (p == nullptr) throw std::bad_alloc();
    data_ = p;
    cap_ = c;
  }

  /// Appends n raw bytes.
  void write_bytes(const void* src, size_t n) {
    if (size_ + n > cap_) reserve(size_ + n);
    if (n != 0) std::memcpy(data_ + size_, src, n);
    size_ += n;
  }

  /// Appends a trivially copyable value as its little-endian bytes (Sluice only targets little-endian hosts).
  template <class T>
  void write_fixed(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (size_ + sizeof(T) > cap_) reserve(size_ + sizeof(T));
    std::memcpy(data_ + size_, &v, sizeof(T));
    size_ += sizeof(T);
  }

  void write_u8(uint8_t v) { write_fixed(v); }

  /// Appends an unsigned LEB128 varint (1..10 bytes).
  void write_varint(uint64_t v) {
    if (size_ + 10 > cap_) reserve(size_ + 10);
    uint8_t* p = data_ + size_;
    while (v >= 0x80) {
      *p++ = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<uint8_t>(v);
    size_ = static_cast<size_t>(p - data_);
  }

  /// Appends a ZigZag-encoded signed varint.
  void write_signed_varint(int64_t v) {
    write_varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
  }

  /// Appends a varint length followed by the bytes.
  void write_string(std::string_view s) {
    write_varint(s.size());
    write_bytes(s.data(), s.size());
  }

  /// Overwrites previously written bytes at `offset` (used to back-patch lengths).
  void write_at(size_t offset, const void* src, size_t n) {
    assert(offset + n <= size_);
    std::memcpy(data_ + offset, src, n);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

/// A bounds-checked reader over borrowed bytes. Reading past the end throws SluiceException with
/// ErrorCode::kSerialization naming the offset, so corrupt or truncated input never reads out of bounds.
class DataInput {
 public:
  DataInput() = default;
  DataInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit DataInput(std::span<const uint8_t> s) : data_(s.data()), size_(s.size()) {}
  explicit DataInput(std::string_view s) : data_(reinterpret_cast<const uint8_t*>(s.data())), size_(s.size()) {}

  size_t position() const noexcept { return pos_; }
  size_t size() const noexcept { return size_; }
  size_t remaining() const noexcept { return size_ - pos_; }
  bool at_end() const noexcept { return pos_ == size_; }
  const uint8_t* current() const noexcept { return data_ + pos_; }

  void read_bytes(void* dst, size_t n) {
    need(n);
    if (n != 0) std::memcpy(dst, data_ + pos_, n);
    pos_ += n;
  }

  /// Returns a view of the next n bytes and advances past them.
  std::string_view read_view(size_t n) {
    need(n);
    std::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return v;
  }

  void skip(size_t n) {
    need(n);
    pos_ += n;
  }

  template <class T>
  T read_fixed() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  uint8_t read_u8() { return read_fixed<uint8_t>(); }

  uint64_t read_varint() {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      uint8_t b = data_[pos_++];
      result |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return result;
    }
    fail("varint longer than 10 bytes");
  }

  int64_t read_signed_varint() {
    uint64_t u = read_varint();
    return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
  }

  /// Reads a varint length, checks it against the remaining bytes, and returns it.
  size_t read_length() {
    uint64_t n = read_varint();
    if (n > remaining())
      fail("length " + std::to_string(n) + " exceeds the " + std::to_string(remaining()) + " remaining bytes");
    return static_cast<size_t>(n);
  }

  /// Reads a varint-prefixed byte string into `out`, reusing its capacity.
  void read_string(std::string& out) {
    size_t n = read_length();
    out.assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw SluiceException(Error(ErrorCode::kSerialization, "corrupt or truncated data at byte " + std::to_string(pos_) +
                                                               " of " + std::to_string(size_) + ": " + what));
  }

 private:
  void need(size_t n) const {
    if (n > size_ - pos_) [[unlikely]]
      fail("needed " + std::to_string(n) + " more bytes");
  }

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t pos_ = 0;
};

}  // namespace sluice
