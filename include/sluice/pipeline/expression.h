// Expression and Projection: the SQL-expression language of pipeline transforms (`filter`, `projection`,
// `key`, `event`), compiled once and evaluated per record over one Value (DESIGN.md §11). The syntax and the
// functions follow Flink CDC's transform expressions (Flink SQL's scalar functions); docs/expressions.md is
// the reference.
//
// Evaluation input: an object Value, the change event (`op`, `key`, `before`, `after`, `source`). A field path
// `after.customer.id` resolves into it; a missing field is NULL, as in SQL. NULL propagates through operators
// and functions (three-valued logic for AND/OR/NOT); a filter keeps a record only when it evaluates to TRUE.
//
// Thread-safety: a compiled Expression or Projection is immutable; evaluate() may be called concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice::pipeline {

/// Where and why an expression failed to compile: `offset` is the byte offset into the expression text
/// (0-based), so a caller holding the text's position in a file can report a line and column.
struct ExpressionError {
  size_t offset = 0;
  std::string message;  ///< e.g. "unknown function 'UPPPER'", "expected ')' after the arguments of COALESCE"
};

namespace detail {
struct ExprNode;
struct PathNode;
}  // namespace detail

/// A compiled scalar expression.
class Expression {
 public:
  /// Compiles `text`. On failure returns false and fills `*error` (never null) with the offset and reason.
  static bool compile(std::string_view text, Expression* out, ExpressionError* error);
  /// As above, as a Result: the error is kConfiguration with "at offset N: reason" and the text.
  [[nodiscard]] static Result<Expression> compile(std::string_view text);

  Expression() = default;

  /// Evaluates over `input`. Errors (kRuntime) name the expression and the reason: a type mismatch
  /// ('abc' + 1), an integer overflow, a cast that does not parse. Division by zero yields NULL, as in Flink SQL.
  [[nodiscard]] Result<Value> evaluate(const Value& input) const;

  /// True when the expression is a bare field path (`after.id`); then path() is it, in Value::at_path syntax
  /// (`["a.b"].c[0]` for a back-quoted `a.b`). Note that evaluate() also applies the row-image resolution
  /// rule (docs/expressions.md), which at_path() does not.
  bool is_field_path() const noexcept;
  const std::string& path() const noexcept;
  /// The source text.
  const std::string& text() const noexcept { return text_; }

  /// The field paths the expression reads (`after.amount_cents`), in order of first appearance, without
  /// repeats, in path() syntax. Empty for a projection item.
  std::vector<std::string> field_paths() const;
  /// Whether the `i`th of field_paths() is present in `input`, with evaluate()'s row-image resolution; a
  /// field present with the value NULL counts as present. Thread-safe (reads only).
  bool has_field(size_t i, const Value& input) const;

 private:
  friend class Projection;
  /// Wraps a compiled tree (a projection item); `text` is the item's source text.
  Expression(std::shared_ptr<const detail::ExprNode> root, std::string text);

  std::shared_ptr<const detail::ExprNode> root_;
  std::string text_;
  std::string path_;
  std::shared_ptr<const std::vector<detail::PathNode>> paths_;  // the distinct field paths read
};

/// A compiled projection: a comma-separated list of `expr [AS name]` items and `*` (every field of the
/// input object). It evaluates to an object with one field per item, in order. A bare path item is named by
/// its last segment (`after.amount` -> "amount"); any other item without AS is a compile error.
class Projection {
 public:
  static bool compile(std::string_view text, Projection* out, ExpressionError* error);
  [[nodiscard]] static Result<Projection> compile(std::string_view text);

  Projection() = default;

  /// Evaluates every item over `input` into a new object. `*` copies the fields of `input` (an object; for a
  /// non-object input it adds nothing). Errors as Expression::evaluate, prefixed with the item's name.
  [[nodiscard]] Result<Value> evaluate(const Value& input) const;

  /// The output field names in order ("*" for a star item).
  std::vector<std::string> names() const;
  const std::string& text() const noexcept { return text_; }

 private:
  struct Item {
    std::string name;  ///< "*" for a star item
    Expression expr;   ///< empty for a star item
  };
  std::vector<Item> items_;
  std::string text_;
};

}  // namespace sluice::pipeline
