// Grammar, loosest first (docs/expressions.md, "Precedence"):
//   or      := and (OR and)*
//   and     := not (AND not)*
//   not     := NOT not | cmp
//   cmp     := concat [ (= | <> | != | < | <= | > | >=) concat | IS [NOT] NULL
//                      | [NOT] IN '(' or (',' or)* ')' | [NOT] BETWEEN concat AND concat | [NOT] LIKE concat ]
//   concat  := add ('||' add)*
//   add     := mul (('+' | '-') mul)*
//   mul     := unary (('*' | '/' | '%') unary)*
//   unary   := ('-' | '+') unary | primary
//   primary := literal | '(' or ')' | CASE ... END | CAST '(' or AS type ')' | EXTRACT '(' unit FROM or ')'
//            | POSITION '(' concat IN concat ')' | name '(' [or (',' or)*] ')' | path
//   path    := field ('.' field | '[' integer ']')*
#include "sluice/pipeline/expression_parser.h"

#include <algorithm>
#include <charconv>

#include "sluice/pipeline/expression_functions.h"
#include "sluice/pipeline/expression_lexer.h"

namespace sluice::pipeline::detail {

namespace {

constexpr std::string_view kReserved[] = {"AND",  "OR",   "NOT", "IS", "IN",   "BETWEEN", "LIKE",  "CASE", "WHEN",
                                          "THEN", "ELSE", "END", "AS", "NULL", "TRUE",    "FALSE", "FROM", "FOR"};

bool is_reserved(const Token& t) {
  return std::any_of(std::begin(kReserved), std::end(kReserved), [&](std::string_view k) { return t.is_keyword(k); });
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kEnd:
      return "the end of the expression";
    case TokenKind::kString:
      return "string '" + t.text + "'";
    case TokenKind::kQuotedIdent:
      return "`" + t.text + "`";
    default:
      return "'" + t.text + "'";
  }
}

// Canonical path text (Value::at_path syntax).
void append_path_key(std::string& out, const std::string& key, bool first) {
  if (key.find_first_of(".[]\"\\") == std::string::npos && !key.empty()) {
    if (!first) out.push_back('.');
    out += key;
    return;
  }
  out += "[\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out += "\"]";
}

class Parser {
 public:
  explicit Parser(std::string_view text, std::vector<PathNode>* paths = nullptr)
      : text_(text), toks_(tokenize(text)), paths_(paths) {}

  NodePtr expression() {
    if (peek().kind == TokenKind::kEnd) throw CompileError{0, "empty expression"};
    NodePtr n = parse_or();
    if (peek().kind != TokenKind::kEnd) {
      throw CompileError{peek().offset, "unexpected token " + describe(peek()) + " after a complete expression"};
    }
    return n;
  }

  std::vector<ParsedItem> projection() {
    std::vector<ParsedItem> items;
    if (peek().kind == TokenKind::kEnd) throw CompileError{0, "empty projection: expected '*' or an expression"};
    while (true) {
      ParsedItem item;
      item.offset = peek().offset;
      if (peek().is_symbol("*") && (peek(1).is_symbol(",") || peek(1).kind == TokenKind::kEnd)) {
        next();
        item.name = "*";
        item.text = "*";
      } else {
        item.node = parse_or();
        item.text = std::string(text_.substr(item.offset, last_end() - item.offset));
        if (accept_keyword("AS")) {
          const Token& name = peek();
          if (name.kind != TokenKind::kIdent && name.kind != TokenKind::kQuotedIdent &&
              name.kind != TokenKind::kString) {
            throw CompileError{name.offset, "expected a name after AS, found " + describe(name)};
          }
          item.name = name.text;
          next();
        } else if (const auto* path = dynamic_cast<const PathNode*>(item.node.get());
                   path != nullptr && !path->segments.back().is_index) {
          item.name = path->segments.back().key;
        } else {
          throw CompileError{item.offset,
                             "projection item '" + item.text + "' needs a name: write '" + item.text + " AS <name>'"};
        }
        for (const ParsedItem& other : items) {
          if (other.name == item.name) {
            throw CompileError{item.offset, "duplicate output name '" + item.name + "' in the projection"};
          }
        }
      }
      items.push_back(std::move(item));
      if (accept_symbol(",")) continue;
      if (peek().kind == TokenKind::kEnd) break;
      throw CompileError{peek().offset, "expected ',' or the end of the projection, found " + describe(peek())};
    }
    return items;
  }

 private:
  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  size_t last_end() const { return pos_ == 0 ? 0 : toks_[pos_ - 1].end; }
  // The source text of a node for its error messages, cut short: every node keeps its own copy, and a long
  // chain (a + b + c ...) would otherwise hold a quadratic amount of text.
  std::string snippet(size_t from) const {
    constexpr size_t kMaxSnippet = 200;
    const std::string_view s = text_.substr(from, last_end() - from);
    if (s.size() <= kMaxSnippet) return std::string(s);
    size_t cut = kMaxSnippet;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80)
      --cut;  // not inside a UTF-8 sequence
    return std::string(s.substr(0, cut)) + "...";
  }

  bool accept_symbol(std::string_view s) {
    if (!peek().is_symbol(s)) return false;
    next();
    return true;
  }
  bool accept_keyword(std::string_view k) {
    if (!peek().is_keyword(k)) return false;
    next();
    return true;
  }
  void expect_symbol(std::string_view s, std::string_view context) {
    if (!accept_symbol(s)) {
      throw CompileError{peek().offset,
                         "expected '" + std::string(s) + "' " + std::string(context) + ", found " + describe(peek())};
    }
  }
  void expect_keyword(std::string_view k, std::string_view context) {
    if (!accept_keyword(k)) {
      throw CompileError{peek().offset,
                         "expected " + std::string(k) + " " + std::string(context) + ", found " + describe(peek())};
    }
  }

  // Counts one level of parser recursion; the limit is checked on the way down, before the stack overflows.
  class Nesting {
   public:
    explicit Nesting(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxExpressionDepth) p_.too_deep();
    }
    ~Nesting() { --p_.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser& p_;
  };

  [[noreturn]] void too_deep() const {
    throw CompileError{peek().offset, "the expression is nested more than " + std::to_string(kMaxExpressionDepth) +
                                          " levels deep (parentheses, operators and function calls): simplify it "
                                          "(an IN list instead of a chain of OR, for example)"};
  }

  // Sets the height of `node` from its operands'. A chain of left-associative operators (a + b + c ...) grows
  // the tree without recursing in the parser, so the height is checked here too: evaluation recurses per level.
  void set_height(ExprNode& node, std::initializer_list<const ExprNode*> kids) const {
    uint32_t h = 0;
    for (const ExprNode* k : kids) {
      if (k != nullptr) h = std::max(h, k->height);
    }
    node.height = h + 1;
    if (node.height > kMaxExpressionDepth) too_deep();
  }
  void set_height(ExprNode& node, const std::vector<NodePtr>& kids) const {
    uint32_t h = 0;
    for (const NodePtr& k : kids)
      h = std::max(h, k->height);
    node.height = h + 1;
    if (node.height > kMaxExpressionDepth) too_deep();
  }

  // Replaces a node whose operands are all literals by its value (an operand error stays a runtime error).
  NodePtr fold(NodePtr node, std::initializer_list<const ExprNode*> kids) const {
    set_height(*node, kids);
    for (const ExprNode* k : kids) {
      if (k != nullptr && k->literal() == nullptr) return node;
    }
    return fold_now(std::move(node));
  }
  NodePtr fold_list(NodePtr node, const std::vector<NodePtr>& kids) const {
    set_height(*node, kids);
    for (const NodePtr& k : kids) {
      if (k->literal() == nullptr) return node;
    }
    return fold_now(std::move(node));
  }
  static NodePtr fold_now(NodePtr node) {
    try {
      return std::make_unique<LiteralNode>(eval_owned(*node, Value()));
    } catch (...) {
      return node;
    }
  }

  NodePtr parse_or() {
    const Nesting nesting(*this);
    const size_t start = peek().offset;
    NodePtr lhs = parse_and();
    while (accept_keyword("OR")) {
      auto n = std::make_unique<LogicNode>();
      n->is_and = false;
      n->lhs = std::move(lhs);
      n->rhs = parse_and();
      n->snippet = snippet(start);
      const ExprNode *a = n->lhs.get(), *b = n->rhs.get();
      lhs = fold(std::move(n), {a, b});
    }
    return lhs;
  }

  NodePtr parse_and() {
    const size_t start = peek().offset;
    NodePtr lhs = parse_not();
    while (accept_keyword("AND")) {
      auto n = std::make_unique<LogicNode>();
      n->is_and = true;
      n->lhs = std::move(lhs);
      n->rhs = parse_not();
      n->snippet = snippet(start);
      const ExprNode *a = n->lhs.get(), *b = n->rhs.get();
      lhs = fold(std::move(n), {a, b});
    }
    return lhs;
  }

  NodePtr parse_not() {
    const size_t start = peek().offset;
    if (accept_keyword("NOT")) {
      const Nesting nesting(*this);
      auto n = std::make_unique<NotNode>();
      n->arg = parse_not();
      n->snippet = snippet(start);
      const ExprNode* a = n->arg.get();
      return fold(std::move(n), {a});
    }
    return parse_comparison();
  }

  NodePtr parse_comparison() {
    const size_t start = peek().offset;
    NodePtr lhs = parse_concat();
    const Token& t = peek();
    static constexpr std::pair<std::string_view, BinaryOp> kOps[] = {
        {"=", BinaryOp::kEq},  {"<>", BinaryOp::kNe}, {"!=", BinaryOp::kNe}, {"<", BinaryOp::kLt},
        {"<=", BinaryOp::kLe}, {">", BinaryOp::kGt},  {">=", BinaryOp::kGe}};
    for (const auto& [sym, op] : kOps) {
      if (t.is_symbol(sym)) {
        next();
        return binary(op, std::move(lhs), parse_concat(), start);
      }
    }
    if (accept_keyword("IS")) {
      auto n = std::make_unique<IsNullNode>();
      n->negated = accept_keyword("NOT");
      expect_keyword("NULL", n->negated ? "after IS NOT" : "after IS");
      n->arg = std::move(lhs);
      const ExprNode* a = n->arg.get();
      return fold(std::move(n), {a});
    }
    bool negated = false;
    if (t.is_keyword("NOT") &&
        (peek(1).is_keyword("IN") || peek(1).is_keyword("BETWEEN") || peek(1).is_keyword("LIKE"))) {
      next();
      negated = true;
    }
    if (accept_keyword("IN")) {
      const size_t open = peek().offset;
      expect_symbol("(", "after IN");
      auto n = std::make_unique<InNode>();
      n->negated = negated;
      n->arg = std::move(lhs);
      if (peek().is_symbol(")")) throw CompileError{peek().offset, "IN needs at least one value"};
      do {
        n->list.push_back(parse_or());
      } while (accept_symbol(","));
      expect_symbol(")", "to close the IN list opened at offset " + std::to_string(open));
      n->snippet = snippet(start);
      if (n->arg->literal() == nullptr) {
        set_height(*n, n->list);
        n->height = std::max(n->height, n->arg->height + 1);
        return n;
      }
      const std::vector<NodePtr>& kids = n->list;
      return fold_list(std::move(n), kids);
    }
    if (accept_keyword("BETWEEN")) {
      auto n = std::make_unique<BetweenNode>();
      n->negated = negated;
      n->arg = std::move(lhs);
      n->low = parse_concat();
      expect_keyword("AND", "between the bounds of BETWEEN");
      n->high = parse_concat();
      n->snippet = snippet(start);
      const ExprNode *a = n->arg.get(), *b = n->low.get(), *c = n->high.get();
      return fold(std::move(n), {a, b, c});
    }
    if (accept_keyword("LIKE")) {
      auto n = std::make_unique<LikeNode>();
      n->negated = negated;
      n->arg = std::move(lhs);
      n->pattern = parse_concat();
      n->snippet = snippet(start);
      const ExprNode *a = n->arg.get(), *b = n->pattern.get();
      return fold(std::move(n), {a, b});
    }
    return lhs;
  }

  NodePtr binary(BinaryOp op, NodePtr lhs, NodePtr rhs, size_t start) {
    auto n = std::make_unique<BinaryNode>();
    n->op = op;
    n->lhs = std::move(lhs);
    n->rhs = std::move(rhs);
    n->snippet = snippet(start);
    const ExprNode *a = n->lhs.get(), *b = n->rhs.get();
    return fold(std::move(n), {a, b});
  }

  NodePtr parse_concat() {
    const size_t start = peek().offset;
    NodePtr lhs = parse_additive();
    while (accept_symbol("||"))
      lhs = binary(BinaryOp::kConcat, std::move(lhs), parse_additive(), start);
    return lhs;
  }

  NodePtr parse_additive() {
    const size_t start = peek().offset;
    NodePtr lhs = parse_multiplicative();
    while (true) {
      if (accept_symbol("+")) {
        lhs = binary(BinaryOp::kAdd, std::move(lhs), parse_multiplicative(), start);
      } else if (accept_symbol("-")) {
        lhs = binary(BinaryOp::kSub, std::move(lhs), parse_multiplicative(), start);
      } else {
        return lhs;
      }
    }
  }

  NodePtr parse_multiplicative() {
    const size_t start = peek().offset;
    NodePtr lhs = parse_unary();
    while (true) {
      if (accept_symbol("*")) {
        lhs = binary(BinaryOp::kMul, std::move(lhs), parse_unary(), start);
      } else if (accept_symbol("/")) {
        lhs = binary(BinaryOp::kDiv, std::move(lhs), parse_unary(), start);
      } else if (accept_symbol("%")) {
        lhs = binary(BinaryOp::kMod, std::move(lhs), parse_unary(), start);
      } else {
        return lhs;
      }
    }
  }

  NodePtr parse_unary() {
    const size_t start = peek().offset;
    if (accept_symbol("-")) {
      const Nesting nesting(*this);
      auto n = std::make_unique<NegateNode>();
      n->arg = parse_unary();
      n->snippet = snippet(start);
      const ExprNode* a = n->arg.get();
      return fold(std::move(n), {a});
    }
    if (accept_symbol("+")) {
      const Nesting nesting(*this);
      return parse_unary();
    }
    return parse_primary();
  }

  NodePtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kInteger: {
        next();
        int64_t v = 0;
        auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (res.ec == std::errc() && res.ptr == t.text.data() + t.text.size()) return literal(Value(v));
        return literal(Value(decimal_literal(t)));  // beyond int64: exact decimal
      }
      case TokenKind::kDecimal:
        next();
        return literal(Value(decimal_literal(t)));
      case TokenKind::kDouble: {
        next();
        double v = 0;
        auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (res.ec != std::errc()) throw CompileError{t.offset, "number " + t.text + " is out of the double range"};
        return literal(Value(v));
      }
      case TokenKind::kString:
        next();
        return literal(Value(t.text));
      case TokenKind::kQuotedIdent:
        return parse_path();
      case TokenKind::kEnd:
        throw CompileError{t.offset, "unexpected end of the expression, expected a value"};
      case TokenKind::kSymbol:
        if (t.is_symbol("(")) {
          const size_t open = t.offset;
          next();
          NodePtr inner = parse_or();
          expect_symbol(")", "to close '(' at offset " + std::to_string(open));
          return inner;
        }
        if (t.is_symbol("*")) {
          throw CompileError{t.offset, "unexpected '*': a star is only allowed as a projection item"};
        }
        throw CompileError{t.offset, "unexpected token " + describe(t) + ", expected a value"};
      case TokenKind::kIdent:
        break;
    }
    if (t.is_keyword("TRUE") || t.is_keyword("FALSE")) {
      next();
      return literal(Value(t.is_keyword("TRUE")));
    }
    if (t.is_keyword("NULL")) {
      next();
      return literal(Value());
    }
    if (t.is_keyword("CASE")) return parse_case();
    const std::string upper = to_upper_ascii(t.text);
    if (is_nondeterministic_function(upper) &&
        (peek(1).is_symbol("(") || upper.starts_with("CURRENT_") || upper.starts_with("LOCAL"))) {
      throw CompileError{t.offset, upper +
                                       " is not allowed: it is non-deterministic, and a replay after a failure must "
                                       "produce the same output (use a time field of the record instead)"};
    }
    if (peek(1).is_symbol("(")) return parse_call(upper);
    if (is_reserved(t)) throw CompileError{t.offset, "unexpected keyword " + describe(t) + ", expected a value"};
    return parse_path();
  }

  Decimal decimal_literal(const Token& t) {
    std::string s = t.text;
    while (s.size() > 1 && s[0] == '0' && s[1] != '.')
      s.erase(0, 1);
    if (!s.empty() && s.back() == '.') s.push_back('0');
    auto d = Decimal::parse(s);
    if (!d.ok()) throw CompileError{t.offset, "number " + t.text + " has more than 38 digits"};
    return *d;
  }

  static NodePtr literal(Value v) { return std::make_unique<LiteralNode>(std::move(v)); }

  NodePtr parse_path() {
    auto n = std::make_unique<PathNode>();
    const Token& first = next();
    n->segments.push_back(PathSegment{first.text, 0, false});
    append_path_key(n->path_text, first.text, true);
    while (true) {
      if (accept_symbol(".")) {
        const Token& f = peek();
        if (f.kind != TokenKind::kIdent && f.kind != TokenKind::kQuotedIdent) {
          throw CompileError{f.offset, "expected a field name after '.', found " + describe(f)};
        }
        next();
        n->segments.push_back(PathSegment{f.text, 0, false});
        append_path_key(n->path_text, f.text, false);
      } else if (accept_symbol("[")) {
        const Token& i = peek();
        size_t index = 0;
        auto res = std::from_chars(i.text.data(), i.text.data() + i.text.size(), index);
        if (i.kind != TokenKind::kInteger || res.ec != std::errc()) {
          throw CompileError{i.offset,
                             "expected an array index (a non-negative integer) after '[', found " + describe(i)};
        }
        next();
        expect_symbol("]", "after the array index");
        n->segments.push_back(PathSegment{{}, index, true});
        n->path_text += "[" + std::to_string(index) + "]";
      } else {
        if (paths_ != nullptr) paths_->push_back(*n);
        return n;
      }
    }
  }

  NodePtr parse_case() {
    const size_t start = peek().offset;
    next();
    auto n = std::make_unique<CaseNode>();
    if (!peek().is_keyword("WHEN")) n->operand = parse_or();
    if (!peek().is_keyword("WHEN"))
      throw CompileError{peek().offset, "expected WHEN in CASE, found " + describe(peek())};
    while (accept_keyword("WHEN")) {
      NodePtr when = parse_or();
      expect_keyword("THEN", "after the WHEN condition");
      n->branches.emplace_back(std::move(when), parse_or());
    }
    if (accept_keyword("ELSE")) n->otherwise = parse_or();
    expect_keyword("END", "to close the CASE at offset " + std::to_string(start));
    n->snippet = snippet(start);
    set_case_height(*n);
    return n;
  }

  void set_case_height(CaseNode& n) const {
    uint32_t h = 0;
    for (const auto& [when, then] : n.branches)
      h = std::max({h, when->height, then->height});
    for (const ExprNode* k : {n.operand.get(), n.otherwise.get()}) {
      if (k != nullptr) h = std::max(h, k->height);
    }
    n.height = h + 1;
    if (n.height > kMaxExpressionDepth) too_deep();
  }

  std::vector<NodePtr> parse_args(const std::string& name, std::vector<size_t>& offsets) {
    expect_symbol("(", "after " + name);
    std::vector<NodePtr> args;
    if (accept_symbol(")")) return args;
    do {
      offsets.push_back(peek().offset);
      args.push_back(parse_or());
    } while (accept_symbol(","));
    expect_symbol(")", "after the arguments of " + name);
    return args;
  }

  static std::string arity_text(int min, int max) {
    auto plural = [](int n) { return std::to_string(n) + (n == 1 ? " argument" : " arguments"); };
    if (max < 0) return "at least " + plural(min);
    if (min == max) return plural(min);
    return std::to_string(min) + " to " + plural(max);
  }

  NodePtr parse_call(const std::string& upper) {
    const Token& name_tok = peek();
    const size_t start = name_tok.offset;
    if (upper == "CAST" || upper == "TRY_CAST") return parse_cast(upper == "TRY_CAST");
    if (upper == "EXTRACT") return parse_extract();
    if (upper == "POSITION") return parse_position();
    if (is_reserved(name_tok)) throw CompileError{start, "unexpected keyword " + describe(name_tok)};
    const FunctionSpec* spec = find_function(upper);
    if (spec == nullptr && upper != "IF" && upper != "COALESCE") {
      std::string msg = "unknown function '" + name_tok.text + "'";
      const std::string hint = suggest_function(upper);
      if (!hint.empty()) msg += " (did you mean " + hint + "?)";
      throw CompileError{start, msg};
    }
    next();
    std::vector<size_t> offsets;
    std::vector<NodePtr> args = parse_args(upper, offsets);
    const int n = static_cast<int>(args.size());
    if (upper == "IF") {
      if (n != 3) throw CompileError{start, "IF takes 3 arguments (condition, then, else), found " + std::to_string(n)};
      auto c = std::make_unique<CaseNode>();
      c->otherwise = std::move(args[2]);
      c->branches.emplace_back(std::move(args[0]), std::move(args[1]));
      c->snippet = snippet(start);
      set_case_height(*c);
      return c;
    }
    if (upper == "COALESCE") {
      if (n < 1) throw CompileError{start, "COALESCE takes at least 1 argument, found 0"};
      auto c = std::make_unique<CoalesceNode>();
      c->args = std::move(args);
      set_height(*c, c->args);
      return c;
    }
    if (upper == "UNIX_TIMESTAMP" && n == 0) {
      throw CompileError{start,
                         "UNIX_TIMESTAMP() without an argument is not allowed: it reads the clock, and a "
                         "replay must produce the same output (pass a timestamp)"};
    }
    if (n < spec->min_args || (spec->max_args >= 0 && n > spec->max_args)) {
      throw CompileError{
          start, upper + " takes " + arity_text(spec->min_args, spec->max_args) + ", found " + std::to_string(n)};
    }
    auto f = std::make_unique<FunctionNode>();
    f->name = upper;
    f->impl = spec->impl;
    f->null_on_null = spec->null_on_null;
    if (spec->regex_arg >= 0 && spec->regex_arg < n) {
      const Value* pattern = args[spec->regex_arg]->literal();
      if (pattern != nullptr && pattern->is_string()) {
        try {
          f->state.regex = compile_regex(pattern->as_string());
        } catch (const EvalError& e) {
          throw CompileError{offsets[spec->regex_arg], e.message};
        }
      }
    }
    f->args = std::move(args);
    const std::vector<NodePtr>& kids = f->args;
    return fold_list(std::move(f), kids);
  }

  NodePtr parse_cast(bool try_cast) {
    const size_t start = peek().offset;
    const std::string name = try_cast ? "TRY_CAST" : "CAST";
    next();
    expect_symbol("(", "after " + name);
    auto n = std::make_unique<CastNode>();
    n->try_cast = try_cast;
    n->arg = parse_or();
    expect_keyword("AS", "in " + name + "(value AS type)");
    const Token& type = peek();
    const std::string t = type.kind == TokenKind::kIdent ? to_upper_ascii(type.text) : std::string();
    bool takes_length = false, takes_precision_scale = false;
    if (t == "STRING" || t == "VARCHAR" || t == "CHAR" || t == "TEXT") {
      n->type = CastType::kString;
      takes_length = true;
    } else if (t == "BIGINT" || t == "INT" || t == "INTEGER" || t == "SMALLINT" || t == "TINYINT") {
      n->type = CastType::kBigint;
    } else if (t == "DOUBLE" || t == "FLOAT" || t == "REAL") {
      n->type = CastType::kDouble;
    } else if (t == "DECIMAL" || t == "NUMERIC" || t == "DEC") {
      n->type = CastType::kDecimal;
      takes_precision_scale = true;
    } else if (t == "BOOLEAN" || t == "BOOL") {
      n->type = CastType::kBoolean;
    } else if (t == "TIMESTAMP" || t == "TIMESTAMP_LTZ") {
      n->type = CastType::kTimestamp;
      takes_length = true;
    } else {
      throw CompileError{type.offset, "unknown type " + describe(type) +
                                          " (expected STRING, VARCHAR, BIGINT, INT, DOUBLE, DECIMAL, BOOLEAN or "
                                          "TIMESTAMP)"};
    }
    next();
    if ((takes_length || takes_precision_scale) && accept_symbol("(")) {
      const int32_t p = small_int("a precision");
      if (takes_precision_scale) {
        if (p < 1 || p > 38) throw CompileError{toks_[pos_ - 1].offset, "DECIMAL precision must be 1..38"};
        n->precision = p;
        n->scale = 0;
        if (accept_symbol(",")) {
          const int32_t s = small_int("a scale");
          if (s < 0 || s > p) throw CompileError{toks_[pos_ - 1].offset, "DECIMAL scale must be 0..precision"};
          n->scale = s;
        }
      }
      expect_symbol(")", "after the type's precision");
    }
    expect_symbol(")", "to close " + name);
    n->snippet = snippet(start);
    const ExprNode* a = n->arg.get();
    return fold(std::move(n), {a});
  }

  int32_t small_int(std::string_view what) {
    const Token& t = peek();
    int32_t v = 0;
    auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (t.kind != TokenKind::kInteger || res.ec != std::errc()) {
      throw CompileError{t.offset, "expected " + std::string(what) + ", found " + describe(t)};
    }
    next();
    return v;
  }

  NodePtr parse_extract() {
    next();
    expect_symbol("(", "after EXTRACT");
    const Token& unit = peek();
    const std::string u = to_upper_ascii(unit.text);
    static constexpr std::string_view kUnits[] = {"YEAR",   "QUARTER", "MONTH",       "DAY",        "HOUR",
                                                  "MINUTE", "SECOND",  "MILLISECOND", "MICROSECOND"};
    if (unit.kind != TokenKind::kIdent || std::find(std::begin(kUnits), std::end(kUnits), u) == std::end(kUnits)) {
      throw CompileError{unit.offset,
                         "expected a unit (YEAR, QUARTER, MONTH, DAY, HOUR, MINUTE, SECOND, "
                         "MILLISECOND, MICROSECOND) after EXTRACT(, found " +
                             describe(unit)};
    }
    next();
    expect_keyword("FROM", "in EXTRACT(unit FROM value)");
    auto f = std::make_unique<FunctionNode>();
    const FunctionSpec* spec = find_function("EXTRACT");
    f->name = "EXTRACT";
    f->impl = spec->impl;
    f->args.push_back(literal(Value(u)));
    f->args.push_back(parse_or());
    expect_symbol(")", "to close EXTRACT");
    const std::vector<NodePtr>& kids = f->args;
    return fold_list(std::move(f), kids);
  }

  NodePtr parse_position() {
    next();
    expect_symbol("(", "after POSITION");
    auto f = std::make_unique<FunctionNode>();
    const FunctionSpec* spec = find_function("LOCATE");
    f->name = "POSITION";
    f->impl = spec->impl;
    f->args.push_back(parse_concat());
    expect_keyword("IN", "in POSITION(substring IN string)");
    f->args.push_back(parse_concat());
    expect_symbol(")", "to close POSITION");
    const std::vector<NodePtr>& kids = f->args;
    return fold_list(std::move(f), kids);
  }

  std::string_view text_;
  std::vector<Token> toks_;
  std::vector<PathNode>* paths_ = nullptr;  // collects every field path parsed, when set
  size_t pos_ = 0;
  uint32_t nesting_ = 0;  // parse_or / NOT / unary sign levels currently on the stack
};

}  // namespace

NodePtr parse_expression(std::string_view text, std::vector<PathNode>* paths) {
  return Parser(text, paths).expression();
}

std::vector<ParsedItem> parse_projection(std::string_view text) {
  return Parser(text).projection();
}

}  // namespace sluice::pipeline::detail
