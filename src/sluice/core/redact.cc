#include "sluice/core/redact.h"

#include <cctype>

namespace sluice {

namespace {

char lower(char c) noexcept {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool contains_ci(std::string_view s, std::string_view needle) noexcept {
  if (needle.size() > s.size()) return false;
  for (size_t i = 0; i + needle.size() <= s.size(); ++i) {
    size_t j = 0;
    while (j < needle.size() && lower(s[i + j]) == needle[j])
      ++j;
    if (j == needle.size()) return true;
  }
  return false;
}

bool equals_ci(std::string_view s, std::string_view t) noexcept {
  return s.size() == t.size() && contains_ci(s, t);
}

bool is_key_char(char c) noexcept {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-';
}

bool is_space(char c) noexcept {
  return c == ' ' || c == '\t';
}

// Characters that end a URI (or a bare value): whitespace, quotes and the brackets that enclose one in text.
bool ends_uri(char c) noexcept {
  return std::isspace(static_cast<unsigned char>(c)) != 0 || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`';
}

// Replaces the password of each `scheme://user:password@` in `s`.
std::string redact_uris(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t sep = s.find("://", pos);
    if (sep == std::string_view::npos) break;
    const size_t start = sep + 3;
    size_t end = start;
    while (end < s.size() && !ends_uri(s[end]))
      ++end;
    // The user information ends at the last '@' of the URI (a password may hold '/', '?' or '#' when it is not
    // percent-encoded, and host names never hold '@').
    const std::string_view uri = s.substr(start, end - start);
    const size_t at = uri.rfind('@');
    const size_t colon = at == std::string_view::npos ? std::string_view::npos : uri.find(':');
    if (colon != std::string_view::npos && colon < at) {
      out.append(s.substr(pos, start + colon + 1 - pos));
      out.append(kRedacted);
      pos = start + at;
    } else {
      out.append(s.substr(pos, end - pos));
      pos = end;
    }
  }
  out.append(s.substr(pos));
  return out;
}

// Replaces the value of each `secret-key = value` / `"secret-key": "value"` in `s`.
std::string redact_key_values(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_key_char(s[i]) || (i > 0 && is_key_char(s[i - 1]))) {
      ++i;
      continue;
    }
    size_t key_end = i;
    while (key_end < s.size() && is_key_char(s[key_end]))
      ++key_end;
    const std::string_view key = s.substr(i, key_end - i);
    size_t j = key_end;
    if (j < s.size() && s[j] == '"' && i > 0 && s[i - 1] == '"') ++j;  // "key": value
    while (j < s.size() && is_space(s[j]))
      ++j;
    if (j >= s.size() || (s[j] != '=' && s[j] != ':') || !is_secret_key(key)) {
      i = key_end;
      continue;
    }
    ++j;
    while (j < s.size() && is_space(s[j]))
      ++j;
    size_t value_start = j, value_end = j;
    if (j < s.size() && (s[j] == '\'' || s[j] == '"')) {
      // Quoted: up to the closing quote; a backslash escapes, and libpq doubles a quote ('it''s').
      const char q = s[j];
      value_start = j + 1;
      size_t k = value_start;
      while (k < s.size()) {
        if (s[k] == '\\' && k + 1 < s.size()) {
          k += 2;
        } else if (s[k] == q && k + 1 < s.size() && s[k + 1] == q && q == '\'') {
          k += 2;
        } else if (s[k] == q) {
          break;
        } else {
          ++k;
        }
      }
      value_end = k;
    } else {
      while (value_end < s.size() && !ends_uri(s[value_end]) && s[value_end] != '&' && s[value_end] != ';' &&
             s[value_end] != ',' && s[value_end] != ')' && s[value_end] != '}' && s[value_end] != ']')
        ++value_end;
    }
    if (value_end > value_start) {
      out.append(s.substr(copied, value_start - copied));
      out.append(kRedacted);
      copied = value_end;
    }
    i = value_end > j ? value_end : j;
  }
  out.append(s.substr(copied));
  return out;
}

}  // namespace

bool is_secret_key(std::string_view key) noexcept {
  return contains_ci(key, "password") || contains_ci(key, "passwd") || contains_ci(key, "secret") ||
         equals_ci(key, "pwd") || equals_ci(key, "api_key") || equals_ci(key, "apikey") || equals_ci(key, "api-key") ||
         contains_ci(key, "sasl.jaas");
}

std::string redact_secrets(std::string_view text) {
  if (text.find("://") == std::string_view::npos && text.find('=') == std::string_view::npos &&
      text.find(':') == std::string_view::npos) {
    return std::string(text);
  }
  return redact_key_values(redact_uris(text));
}

}  // namespace sluice
