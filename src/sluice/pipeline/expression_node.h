// The compiled form of an expression: a tree of ExprNode, built once by the parser and evaluated per record.
// Private to src/sluice/pipeline.
//
// eval(input, scratch) returns a reference either into `input` (a field path: no copy), into the node (a
// literal) or to `scratch`, which the caller owns and which lives as long as it uses the result. Runtime
// failures throw EvalError; Expression::evaluate turns them into a kRuntime Error. Nodes are immutable, so
// one tree may be evaluated from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/value.h"

namespace re2 {
class RE2;
}

namespace sluice::pipeline::detail {

/// The deepest expression tree the parser accepts (docs/expressions.md, "Limits"): evaluation recurses once per
/// level, so an unbounded depth would overflow the stack (SIGSEGV) instead of failing with a message.
inline constexpr uint32_t kMaxExpressionDepth = 1000;
/// The largest string a function or operator may produce, in bytes (docs/expressions.md, "Limits"): a size
/// taken from data (LPAD to 9e18 characters) is a record error, not an allocation until the process dies.
inline constexpr size_t kMaxStringBytes = size_t{16} << 20;

/// Throws EvalError naming `what` when a result of `bytes` would exceed kMaxStringBytes.
void check_string_size(size_t bytes, std::string_view what);

/// A runtime failure inside an expression (type mismatch, overflow, bad cast).
struct EvalError {
  std::string message;
};

struct ExprNode {
  virtual ~ExprNode() = default;
  virtual const Value& eval(const Value& input, Value& scratch) const = 0;
  /// The value of a literal node, else nullptr (for constant folding and pre-compiled patterns).
  virtual const Value* literal() const noexcept { return nullptr; }
  /// Levels of the tree below and including this node (a leaf is 1); set by the parser.
  uint32_t height = 1;
};
using NodePtr = std::unique_ptr<ExprNode>;

/// Evaluates `node` into a Value the caller owns (copies when the node returned a reference elsewhere).
inline Value eval_owned(const ExprNode& node, const Value& input) {
  Value scratch;
  const Value& v = node.eval(input, scratch);
  if (&v == &scratch) return scratch;  // implicitly moved
  return v;
}

// ---- shared helpers (expression_eval.cc) ----

/// The string form used by ||, CONCAT and CAST(... AS STRING): numbers as written, TRUE/FALSE, timestamps
/// ISO-8601, arrays and objects as JSON; bytes as their raw content.
void append_text(const Value& v, std::string& out);
std::string to_text(const Value& v);
/// Compares two non-null values: numbers across kinds numerically; a timestamp with a string by parsing the
/// string; otherwise same kinds only. Throws EvalError naming `what` and both kinds on a mismatch.
int compare_values(const Value& a, const Value& b, std::string_view what);
/// Arithmetic over non-null operands: op is one of + - * / %. Returns NULL for division by zero.
Value arithmetic(char op, const Value& a, const Value& b, std::string_view what);
/// -v for a number.
Value negate(const Value& v, std::string_view what);
/// Rounds a decimal to `scale` fraction digits, half away from zero.
Decimal round_decimal(const Decimal& d, int32_t scale);
/// Decimal from an int64 or a decimal Value.
Decimal to_decimal(const Value& v);
/// A Value from a decimal computation; throws EvalError when it exceeds 38 digits.
Value make_decimal(int128_t unscaled, int32_t scale, std::string_view what);

// ---- node kinds (expression_eval.cc) ----

struct LiteralNode final : ExprNode {
  explicit LiteralNode(Value v) : value(std::move(v)) {}
  const Value& eval(const Value&, Value&) const override { return value; }
  const Value* literal() const noexcept override { return &value; }
  Value value;
};

struct PathSegment {
  std::string key;   ///< field name, when !is_index
  size_t index = 0;  ///< array index, when is_index
  bool is_index = false;
};

/// A field path, pre-split. The first segment falls back to the row image (after, else before) when it
/// is not a field of the input (docs/expressions.md, "Name resolution").
struct PathNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  /// The field in `input`, or nullptr when it is absent (eval() gives NULL for both).
  const Value* find(const Value& input) const;
  std::vector<PathSegment> segments;  ///< the first is always a field name
  std::string path_text;              ///< canonical text: `a.b[0]`, `["key.with.dots"]` (Value::at_path syntax)
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMod, kConcat, kEq, kNe, kLt, kLe, kGt, kGe };

struct BinaryNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  BinaryOp op = BinaryOp::kAdd;
  NodePtr lhs, rhs;
  std::string snippet;  ///< the source text of this operation, for error messages
};

struct NegateNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg;
  std::string snippet;
};

/// AND / OR with three-valued logic and short-circuit.
struct LogicNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  bool is_and = true;
  NodePtr lhs, rhs;
  std::string snippet;
};

struct NotNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg;
  std::string snippet;
};

struct IsNullNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg;
  bool negated = false;
};

struct InNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg;
  std::vector<NodePtr> list;
  bool negated = false;
  std::string snippet;
};

struct BetweenNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg, low, high;
  bool negated = false;
  std::string snippet;
};

struct LikeNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg, pattern;
  bool negated = false;
  std::string snippet;
};

/// Matches SQL LIKE: % any sequence, _ one character (code point); no escape character.
bool like_match(std::string_view text, std::string_view pattern);

/// CASE [operand] WHEN .. THEN .. [ELSE ..] END.
struct CaseNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr operand;  ///< null for the searched form
  std::vector<std::pair<NodePtr, NodePtr>> branches;
  NodePtr otherwise;  ///< null: ELSE NULL
  std::string snippet;
};

struct CoalesceNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  std::vector<NodePtr> args;
};

enum class CastType { kString, kBigint, kDouble, kDecimal, kBoolean, kTimestamp };

struct CastNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  NodePtr arg;
  CastType type = CastType::kString;
  std::optional<int32_t> precision, scale;  ///< DECIMAL(p, s)
  bool try_cast = false;                    ///< TRY_CAST: NULL instead of an error
  std::string snippet;
};

/// Casts a non-null value; throws EvalError when it does not convert.
Value cast_value(const Value& v, CastType type, std::optional<int32_t> precision, std::optional<int32_t> scale);

/// State a function may prepare at compile time (a regular expression given as a literal).
struct FunctionState {
  std::shared_ptr<const re2::RE2> regex;
};

/// A function's evaluated arguments, by reference (a field read is not copied).
class ArgList {
 public:
  ArgList(const Value* const* args, size_t size) noexcept : args_(args), size_(size) {}
  const Value& operator[](size_t i) const noexcept { return *args_[i]; }
  size_t size() const noexcept { return size_; }

 private:
  const Value* const* args_;
  size_t size_;
};

using FunctionImpl = Value (*)(const ArgList& args, const FunctionState& state);

struct FunctionNode final : ExprNode {
  const Value& eval(const Value& input, Value& scratch) const override;
  std::string name;  ///< upper case
  FunctionImpl impl = nullptr;
  bool null_on_null = true;  ///< returns NULL when any argument is NULL, without calling impl
  std::vector<NodePtr> args;
  FunctionState state;
};

}  // namespace sluice::pipeline::detail
