// Tokenizer of the transform-expression language (docs/expressions.md): splits the text into identifiers,
// literals and symbols, each with its byte offset. Private to src/sluice/pipeline.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::pipeline::detail {

/// Thrown by the lexer and the parser; Expression::compile turns it into an ExpressionError.
struct CompileError {
  size_t offset = 0;
  std::string message;
};

enum class TokenKind {
  kEnd,          ///< after the last token; offset is the text's length
  kIdent,        ///< bare identifier or keyword, as written (keywords are matched case-insensitively)
  kQuotedIdent,  ///< `back quoted`, text unescaped; never a keyword
  kInteger,      ///< digits only
  kDecimal,      ///< digits with a '.' and no exponent (exact)
  kDouble,       ///< a number with an exponent
  kString,       ///< 'single quoted', text unescaped ('' -> ')
  kSymbol,       ///< ( ) [ ] , . * + - / % || = <> != < <= > >=
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  size_t offset = 0;  ///< byte offset of the token's first character
  size_t end = 0;     ///< byte offset one past its last character
  std::string text;

  bool is_symbol(std::string_view s) const { return kind == TokenKind::kSymbol && text == s; }
  /// True for a bare identifier equal to `upper_keyword` ignoring ASCII case.
  bool is_keyword(std::string_view upper_keyword) const;
};

/// Splits `text` into tokens ending with one kEnd token. Throws CompileError (unterminated string or
/// quoted identifier, unexpected character).
std::vector<Token> tokenize(std::string_view text);

/// ASCII upper-case copy.
std::string to_upper_ascii(std::string_view s);

}  // namespace sluice::pipeline::detail
