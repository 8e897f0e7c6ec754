// Value's representation at work: construction, copy, destruction, typed access and object fields (value.h).
// Paths, order, the binary codec and JSON are in value_path.cc, value_order.cc, value_codec.cc, value_to_json.cc
// and value_from_json.cc; the representation they share in value_internals.h.
#include "sluice/core/value.h"

#include <fmt/format.h>

#include <new>
#include <string>
#include <utility>

#include "value_internals.h"

namespace sluice {
namespace {

detail::HeapBytes* allocate_heap_bytes(size_t capacity) {
  void* p = ::operator new(sizeof(detail::HeapBytes) + capacity);
  return new (p) detail::HeapBytes{0, capacity};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Value: lifetime and construction

Value::Value(const Decimal& d) {
  ValueInternals::init_decimal(*this, d);
}

void Value::init_bytes(Kind k, std::string_view b) {
  if (b.size() <= kInlineCapacity) {
    rep_[0] = static_cast<uint8_t>(k);
    rep_[1] = static_cast<uint8_t>(b.size());
    if (!b.empty()) std::memcpy(rep_ + 2, b.data(), b.size());
    return;
  }
  detail::HeapBytes* h = allocate_heap_bytes(b.size());
  std::memcpy(h->data(), b.data(), b.size());
  h->size = b.size();
  rep_[0] = static_cast<uint8_t>(k);
  rep_[1] = kHeapMarker;
  store(8, h);
}

void Value::init_big_unsigned(uint64_t v) {
  ValueInternals::init_decimal(*this, ValueInternals::decimal_of(static_cast<int128_t>(v), 0));
}

Value::Value(const Value& other) {
  switch (other.kind()) {
    case Kind::kDecimal:
      ValueInternals::init_decimal(*this, ValueInternals::decimal(other));
      break;
    case Kind::kString:
    case Kind::kBytes:
      init_bytes(other.kind(), other.payload_bytes());
      break;
    case Kind::kArray: {
      auto* p = new Array(*other.load<const Array*>(8));
      rep_[0] = static_cast<uint8_t>(Kind::kArray);
      store(8, p);
      break;
    }
    case Kind::kObject: {
      auto* p = new Object(*other.load<const Object*>(8));
      rep_[0] = static_cast<uint8_t>(Kind::kObject);
      store(8, p);
      break;
    }
    default:
      std::memcpy(rep_, other.rep_, sizeof(rep_));
      break;
  }
}

Value& Value::operator=(const Value& other) {
  if (this != &other) {
    Value copy(other);
    *this = std::move(copy);
  }
  return *this;
}

void Value::release_heap() noexcept {
  switch (kind()) {
    case Kind::kDecimal:
      if (rep_[1] == kHeapMarker) delete load<Decimal*>(8);
      break;
    case Kind::kString:
    case Kind::kBytes:
      if (rep_[1] == kHeapMarker) ::operator delete(load<detail::HeapBytes*>(8));
      break;
    case Kind::kArray:
      delete load<Array*>(8);
      break;
    case Kind::kObject:
      delete load<Object*>(8);
      break;
    default:
      break;
  }
}

Value Value::bytes(std::string_view b) {
  Value v;
  v.init_bytes(Kind::kBytes, b);
  return v;
}

Value Value::bytes(std::span<const uint8_t> b) {
  return bytes(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

Value Value::timestamp_micros(int64_t micros) noexcept {
  Value v;
  v.init_scalar(Kind::kTimestamp, micros);
  return v;
}

Value Value::array() {
  Value v;
  ValueInternals::make_array(v);
  return v;
}

Value Value::array(std::initializer_list<Value> elements) {
  return array(Array(elements));
}

Value Value::array(Array elements) {
  Value v;
  ValueInternals::make_array(v) = std::move(elements);
  return v;
}

Value Value::object() {
  Value v;
  ValueInternals::make_object(v);
  return v;
}

Value Value::object(std::initializer_list<std::pair<std::string_view, Value>> fields) {
  Value v;
  Object& o = ValueInternals::make_object(v);
  o.reserve(fields.size());
  for (const auto& [key, value] : fields)
    o.set(key, value);
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// Value: access

std::string_view value_kind_name(Value::Kind kind) noexcept {
  switch (kind) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt64:
      return "int64";
    case Value::Kind::kDouble:
      return "double";
    case Value::Kind::kDecimal:
      return "decimal";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kBytes:
      return "bytes";
    case Value::Kind::kTimestamp:
      return "timestamp";
    case Value::Kind::kArray:
      return "array";
    case Value::Kind::kObject:
      return "object";
  }
  return "unknown";
}

namespace {

// A short rendering of v for error messages: containers by size, long strings cut.
std::string describe(const Value& v) {
  std::string s(value_kind_name(v.kind()));
  switch (v.kind()) {
    case Value::Kind::kNull:
      break;
    case Value::Kind::kArray:
      s += fmt::format(" with {} elements", ValueInternals::array_of(v).size());
      break;
    case Value::Kind::kObject:
      s += fmt::format(" with {} fields", ValueInternals::object_of(v).size());
      break;
    case Value::Kind::kString:
    case Value::Kind::kBytes: {
      constexpr size_t kPreview = 48;
      std::string_view p = ValueInternals::payload(v);
      Value cut = v.is_string() ? Value::string(p.substr(0, kPreview)) : Value::bytes(p.substr(0, kPreview));
      s += ' ';
      cut.write_json(s);
      if (p.size() > kPreview) s += "...";
      break;
    }
    case Value::Kind::kDouble:
      s += fmt::format(" {}", ValueInternals::double_of(v));  // "nan" and "inf", unquoted
      break;
    default:
      s += ' ';
      v.write_json(s);
      break;
  }
  return s;
}

[[noreturn]] void throw_runtime(std::string message) {
  throw SluiceException(Error(ErrorCode::kRuntime, std::move(message)));
}

}  // namespace

void Value::throw_kind_mismatch(Kind expected) const {
  throw_runtime(fmt::format("Value: expected {}, found {}", value_kind_name(expected), describe(*this)));
}

Decimal Value::as_decimal() const {
  check_kind(Kind::kDecimal);
  return ValueInternals::decimal(*this);
}

const Value* Value::Object::find(std::string_view key) const noexcept {
  for (const auto& f : fields_) {
    if (f.first == key) return &f.second;
  }
  return nullptr;
}

Value* Value::Object::find(std::string_view key) noexcept {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::Object::operator[](std::string_view key) {
  if (Value* v = find(key)) return *v;
  fields_.emplace_back(std::string(key), Value());
  return fields_.back().second;
}

Value& Value::Object::set(std::string_view key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return *v;
  }
  fields_.emplace_back(std::string(key), std::move(value));
  return fields_.back().second;
}

bool Value::Object::erase(std::string_view key) {
  for (auto it = fields_.begin(); it != fields_.end(); ++it) {
    if (it->first == key) {
      fields_.erase(it);
      return true;
    }
  }
  return false;
}

const Value* Value::find(std::string_view key) const noexcept {
  if (!is_object()) return nullptr;
  return load<const Object*>(8)->find(key);
}

Value* Value::find(std::string_view key) noexcept {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::operator[](std::string_view key) {
  if (is_null()) ValueInternals::make_object(*this);
  return as_object()[key];
}

Value& Value::set(std::string_view key, Value value) {
  if (is_null()) ValueInternals::make_object(*this);
  return as_object().set(key, std::move(value));
}

void Value::push_back(Value element) {
  if (is_null()) ValueInternals::make_array(*this);
  as_array().push_back(std::move(element));
}

const Value& Value::at(size_t index) const {
  const Array& a = as_array();
  if (index >= a.size()) throw_runtime(fmt::format("Value: index {} out of range for an array of {}", index, a.size()));
  return a[index];
}

Value& Value::at(size_t index) {
  return const_cast<Value&>(std::as_const(*this).at(index));
}

size_t Value::size() const {
  if (is_array()) return load<const Array*>(8)->size();
  if (is_object()) return load<const Object*>(8)->size();
  throw_runtime(fmt::format("Value: size() needs an array or object, found {}", describe(*this)));
}
}  // namespace sluice
