#include "sluice/pipeline/expression_lexer.h"

#include <cctype>

namespace sluice::pipeline::detail {

namespace {

bool is_ident_start(unsigned char c) {
  return std::isalpha(c) || c == '_' || c >= 0x80;
}
bool is_ident_char(unsigned char c) {
  return std::isalnum(c) || c == '_' || c == '$' || c >= 0x80;
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

std::string to_upper_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

bool Token::is_keyword(std::string_view upper_keyword) const {
  if (kind != TokenKind::kIdent || text.size() != upper_keyword.size()) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (c != upper_keyword[i]) return false;
  }
  return true;
}

std::vector<Token> tokenize(std::string_view text) {
  std::vector<Token> tokens;
  size_t i = 0;
  const size_t n = text.size();
  auto push = [&](TokenKind kind, size_t start, size_t end, std::string s) {
    tokens.push_back(Token{kind, start, end, std::move(s)});
  };
  while (i < n) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      ++i;
      continue;
    }
    const size_t start = i;
    if (c == '\'' || c == '`') {
      const char quote = c;
      std::string s;
      ++i;
      bool closed = false;
      while (i < n) {
        if (text[i] == quote) {
          if (i + 1 < n && text[i + 1] == quote) {
            s.push_back(quote);
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        s.push_back(text[i++]);
      }
      if (!closed) {
        throw CompileError{start, quote == '\'' ? "unterminated string literal (close it with ')"
                                                : "unterminated quoted identifier (close it with `)"};
      }
      push(quote == '\'' ? TokenKind::kString : TokenKind::kQuotedIdent, start, i, std::move(s));
      continue;
    }
    if (is_digit(c)) {
      bool has_dot = false;
      bool has_exp = false;
      while (i < n && is_digit(text[i]))
        ++i;
      if (i < n && text[i] == '.' &&
          (i + 1 >= n || !is_ident_start(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == 'e' ||
           text[i + 1] == 'E')) {
        has_dot = true;
        ++i;
        while (i < n && is_digit(text[i]))
          ++i;
      }
      if (i < n && (text[i] == 'e' || text[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (text[j] == '+' || text[j] == '-')) ++j;
        if (j < n && is_digit(text[j])) {
          has_exp = true;
          i = j;
          while (i < n && is_digit(text[i]))
            ++i;
        } else {
          throw CompileError{i, "malformed number: expected digits after the exponent 'e'"};
        }
      }
      if (i < n && is_ident_start(static_cast<unsigned char>(text[i]))) {
        throw CompileError{start, "malformed number '" + std::string(text.substr(start, i + 1 - start)) + "'"};
      }
      const TokenKind kind = has_exp ? TokenKind::kDouble : has_dot ? TokenKind::kDecimal : TokenKind::kInteger;
      push(kind, start, i, std::string(text.substr(start, i - start)));
      continue;
    }
    if (is_ident_start(static_cast<unsigned char>(c))) {
      while (i < n && is_ident_char(static_cast<unsigned char>(text[i])))
        ++i;
      push(TokenKind::kIdent, start, i, std::string(text.substr(start, i - start)));
      continue;
    }
    auto two = [&](std::string_view s) { return text.substr(i, 2) == s; };
    if (two("||") || two("<>") || two("!=") || two("<=") || two(">=")) {
      push(TokenKind::kSymbol, start, i + 2, std::string(text.substr(i, 2)));
      i += 2;
      continue;
    }
    switch (c) {
      case '(':
      case ')':
      case '[':
      case ']':
      case ',':
      case '.':
      case '*':
      case '+':
      case '-':
      case '/':
      case '%':
      case '=':
      case '<':
      case '>':
        push(TokenKind::kSymbol, start, i + 1, std::string(1, c));
        ++i;
        continue;
      default:
        break;
    }
    if (c == '"') {
      throw CompileError{start,
                         "unexpected character '\"': strings use single quotes ('text'), identifiers back quotes"};
    }
    throw CompileError{start, "unexpected character '" + std::string(1, c) + "'"};
  }
  tokens.push_back(Token{TokenKind::kEnd, n, n, {}});
  return tokens;
}

}  // namespace sluice::pipeline::detail
