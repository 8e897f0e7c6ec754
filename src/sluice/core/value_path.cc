// Value::at_path: `a.b[2]["key.with.dots"]` lookups without allocating (value.h).
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "sluice/core/value.h"
#include "value_internals.h"

namespace sluice {

using value_internal::is_digit;

const Value* Value::at_path(std::string_view path) const {
  const Value* cur = this;
  std::string unescaped;
  size_t i = 0;
  const size_t n = path.size();
  while (i < n) {
    if (path[i] == '[') {
      ++i;
      if (i < n && path[i] == '"') {
        ++i;
        const size_t begin = i;
        bool escaped = false;
        while (i < n && path[i] != '"') {
          if (path[i] == '\\') {
            escaped = true;
            if (++i == n || (path[i] != '"' && path[i] != '\\')) return nullptr;
          }
          ++i;
        }
        if (i + 1 >= n || path[i + 1] != ']') return nullptr;
        std::string_view key = path.substr(begin, i - begin);
        if (escaped) {
          unescaped.clear();
          for (size_t k = 0; k < key.size(); ++k) {
            if (key[k] == '\\') ++k;
            unescaped.push_back(key[k]);
          }
          key = unescaped;
        }
        i += 2;
        cur = cur->find(key);
      } else {
        const size_t begin = i;
        uint64_t index = 0;
        while (i < n && is_digit(path[i])) {
          if (index > (std::numeric_limits<uint64_t>::max() - 9) / 10) return nullptr;
          index = index * 10 + static_cast<uint64_t>(path[i] - '0');
          ++i;
        }
        if (i == begin || i >= n || path[i] != ']') return nullptr;
        ++i;
        if (!cur->is_array()) return nullptr;
        const Array& a = *cur->load<const Array*>(8);
        if (index >= a.size()) return nullptr;
        cur = &a[index];
      }
    } else {
      if (i != 0) {
        if (path[i] != '.') return nullptr;
        ++i;
      }
      const size_t begin = i;
      while (i < n && path[i] != '.' && path[i] != '[')
        ++i;
      if (i == begin) return nullptr;
      cur = cur->find(path.substr(begin, i - begin));
    }
    if (cur == nullptr) return nullptr;
  }
  return cur;
}

Value* Value::mutable_at_path(std::string_view path) {
  return const_cast<Value*>(std::as_const(*this).at_path(path));
}
}  // namespace sluice
