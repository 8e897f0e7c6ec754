// Evaluation of the expression tree's node kinds, and the value semantics they share (comparison across
// numeric kinds, exact decimal arithmetic, the string form used by || and CAST).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "sluice/pipeline/expression_node.h"
#include "sluice/pipeline/expression_time.h"

namespace sluice::pipeline::detail {

namespace {

const Value& null_value() {
  static const Value kNull;
  return kNull;
}
const Value& bool_value(bool b) {
  static const Value kTrue(true);
  static const Value kFalse(false);
  return b ? kTrue : kFalse;
}

std::string kind_name(const Value& v) {
  return std::string(value_kind_name(v.kind()));
}

int128_t pow10_128(int n) {
  int128_t r = 1;
  for (int i = 0; i < n; ++i)
    r *= 10;
  return r;
}

// Multiplies `u` by 10^n; throws EvalError on overflow.
int128_t scale_up(int128_t u, int64_t n, std::string_view what) {
  if (u == 0 || n == 0) return u;
  int128_t out = 0;
  if (n > 38 || __builtin_mul_overflow(u, pow10_128(static_cast<int>(n)), &out)) {
    throw EvalError{"decimal overflow (more than 38 digits) in `" + std::string(what) + "`"};
  }
  return out;
}

// Divides n by d (d != 0), rounding half away from zero.
int128_t div_round(int128_t n, int128_t d) {
  int128_t q = n / d;
  int128_t r = n % d;
  if (r != 0) {
    const int128_t abs_r = r < 0 ? -r : r;
    const int128_t abs_d = d < 0 ? -d : d;
    if (abs_r >= abs_d - abs_r) q += ((n < 0) != (d < 0)) ? -1 : 1;
  }
  return q;
}

double to_double_num(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kInt64:
      return static_cast<double>(v.as_int64());
    case Value::Kind::kDouble:
      return v.as_double();
    default:
      return v.as_decimal().to_double();
  }
}

const char* op_symbol(char op) {
  switch (op) {
    case '+':
      return "+";
    case '-':
      return "-";
    case '*':
      return "*";
    case '/':
      return "/";
    default:
      return "%";
  }
}

[[noreturn]] void throw_overflow(std::string_view what) {
  throw EvalError{"integer overflow in `" + std::string(what) +
                  "` (cast an operand to DECIMAL for exact wider arithmetic)"};
}

Value int_arithmetic(char op, int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  switch (op) {
    case '+':
      if (__builtin_add_overflow(a, b, &r)) throw_overflow(what);
      return r;
    case '-':
      if (__builtin_sub_overflow(a, b, &r)) throw_overflow(what);
      return r;
    case '*':
      if (__builtin_mul_overflow(a, b, &r)) throw_overflow(what);
      return r;
    case '/':
      if (b == 0) return Value();
      if (a == std::numeric_limits<int64_t>::min() && b == -1) throw_overflow(what);
      return a / b;
    default:
      if (b == 0) return Value();
      if (b == -1) return int64_t{0};
      return a % b;
  }
}

Value double_arithmetic(char op, double a, double b) {
  switch (op) {
    case '+':
      return a + b;
    case '-':
      return a - b;
    case '*':
      return a * b;
    case '/':
      if (b == 0.0) return Value();
      return a / b;
    default:
      if (b == 0.0) return Value();
      return std::fmod(a, b);
  }
}

Value decimal_arithmetic(char op, const Decimal& a, const Decimal& b, std::string_view what) {
  const int32_t sa = a.scale();
  const int32_t sb = b.scale();
  if (op == '*') {
    int128_t u = 0;
    if (__builtin_mul_overflow(a.unscaled(), b.unscaled(), &u)) {
      throw EvalError{"decimal overflow (more than 38 digits) in `" + std::string(what) + "`"};
    }
    return make_decimal(u, sa + sb, what);
  }
  if (op == '/') {
    if (b.unscaled() == 0) return Value();
    // Result scale: max(6, s1, s2), rounded half away from zero (docs/expressions.md).
    const int32_t s = std::max({6, sa, sb});
    const int64_t k = static_cast<int64_t>(s) - sa + sb;
    int128_t n = a.unscaled();
    int128_t d = b.unscaled();
    if (k >= 0) {
      n = scale_up(n, k, what);
    } else {
      d = scale_up(d, -k, what);
    }
    return make_decimal(div_round(n, d), s, what);
  }
  const int32_t s = std::max(sa, sb);
  const int128_t ua = scale_up(a.unscaled(), static_cast<int64_t>(s) - sa, what);
  const int128_t ub = scale_up(b.unscaled(), static_cast<int64_t>(s) - sb, what);
  int128_t u = 0;
  switch (op) {
    case '+':
      if (__builtin_add_overflow(ua, ub, &u)) throw EvalError{"decimal overflow in `" + std::string(what) + "`"};
      break;
    case '-':
      if (__builtin_sub_overflow(ua, ub, &u)) throw EvalError{"decimal overflow in `" + std::string(what) + "`"};
      break;
    default:
      if (ub == 0) return Value();
      u = ua % ub;
      break;
  }
  return make_decimal(u, s, what);
}

std::optional<bool> truth(const Value& v, std::string_view what, std::string_view op) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_bool()) {
    throw EvalError{std::string(op) + " needs a boolean, found " + kind_name(v) + " in `" + std::string(what) + "`"};
  }
  return v.as_bool();
}

std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

Decimal parse_decimal_text(std::string_view text) {
  std::string_view s = trim_spaces(text);
  std::string norm;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    if (s.front() == '-') norm.push_back('-');
    s.remove_prefix(1);
  }
  while (s.size() > 1 && s.front() == '0' && s[1] >= '0' && s[1] <= '9')
    s.remove_prefix(1);
  if (!s.empty() && s.front() == '.') norm.push_back('0');
  norm.append(s);
  auto d = Decimal::parse(norm);
  if (!d.ok()) throw EvalError{"'" + std::string(text) + "' is not a decimal number"};
  return *d;
}

Decimal double_to_decimal(double v) {
  if (!std::isfinite(v)) throw EvalError{"cannot convert a non-finite double to DECIMAL"};
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return parse_decimal_text(std::string_view(buf, static_cast<size_t>(res.ptr - buf)));
}

int decimal_digits(int128_t u) {
  if (u < 0) u = -u;
  int n = 1;
  while (u >= 10) {
    u /= 10;
    ++n;
  }
  return n;
}

}  // namespace

// ---- shared helpers ----

Value make_decimal(int128_t unscaled, int32_t scale, std::string_view what) {
  auto d = Decimal::of(unscaled, scale);
  if (!d.ok()) throw EvalError{"decimal overflow (more than 38 digits) in `" + std::string(what) + "`"};
  return Value(*d);
}

Decimal to_decimal(const Value& v) {
  if (v.is_int64()) return *Decimal::of(v.as_int64(), 0);
  if (v.is_double()) return double_to_decimal(v.as_double());
  return v.as_decimal();
}

void append_text(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kNull:
      out += "NULL";
      break;
    case Value::Kind::kBool:
      out += v.as_bool() ? "TRUE" : "FALSE";
      break;
    case Value::Kind::kInt64:
      out += std::to_string(v.as_int64());
      break;
    case Value::Kind::kDouble: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        char buf[64];
        auto res = std::to_chars(buf, buf + sizeof(buf), d);
        std::string_view s(buf, static_cast<size_t>(res.ptr - buf));
        out += s;
        if (s.find_first_of(".e") == std::string_view::npos) out += ".0";
      }
      break;
    }
    case Value::Kind::kDecimal:
      v.as_decimal().append_to(out);
      break;
    case Value::Kind::kString:
      out += v.as_string();
      break;
    case Value::Kind::kBytes:
      out += v.as_bytes();
      break;
    case Value::Kind::kTimestamp:
      append_iso8601_micros(v.as_timestamp_micros(), out);
      break;
    default:
      v.write_json(out);
      break;
  }
}

std::string to_text(const Value& v) {
  std::string out;
  append_text(v, out);
  return out;
}

int compare_values(const Value& a, const Value& b, std::string_view what) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int64() && b.is_int64()) {
      const int64_t x = a.as_int64(), y = b.as_int64();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_double() || b.is_double()) {
      const double x = to_double_num(a), y = to_double_num(b);
      if (std::isnan(x) || std::isnan(y)) return Value::compare(Value(x), Value(y));
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return Decimal::compare(to_decimal(a), to_decimal(b));
  }
  if (a.kind() == b.kind()) return Value::compare(a, b);
  if (a.is_timestamp() && b.is_string()) {
    auto t = parse_timestamp(b.as_string());
    if (!t) {
      throw EvalError{"cannot compare timestamp with string '" + std::string(b.as_string()) +
                      "' (not a timestamp) in `" + std::string(what) + "`"};
    }
    const int64_t x = a.as_timestamp_micros();
    return x < *t ? -1 : x > *t ? 1 : 0;
  }
  if (a.is_string() && b.is_timestamp()) return -compare_values(b, a, what);
  throw EvalError{"cannot compare " + kind_name(a) + " with " + kind_name(b) + " in `" + std::string(what) +
                  "` (use CAST to convert one side)"};
}

Value arithmetic(char op, const Value& a, const Value& b, std::string_view what) {
  if (!a.is_number() || !b.is_number()) {
    throw EvalError{std::string("operator '") + op_symbol(op) + "' needs numbers, found " + kind_name(a) + " and " +
                    kind_name(b) + " in `" + std::string(what) + "`"};
  }
  if (a.is_int64() && b.is_int64()) return int_arithmetic(op, a.as_int64(), b.as_int64(), what);
  if (a.is_double() || b.is_double()) return double_arithmetic(op, to_double_num(a), to_double_num(b));
  return decimal_arithmetic(op, to_decimal(a), to_decimal(b), what);
}

Value negate(const Value& v, std::string_view what) {
  switch (v.kind()) {
    case Value::Kind::kInt64:
      if (v.as_int64() == std::numeric_limits<int64_t>::min()) throw_overflow(what);
      return -v.as_int64();
    case Value::Kind::kDouble:
      return -v.as_double();
    case Value::Kind::kDecimal: {
      const Decimal d = v.as_decimal();
      return make_decimal(-d.unscaled(), d.scale(), what);
    }
    default:
      throw EvalError{"unary '-' needs a number, found " + kind_name(v) + " in `" + std::string(what) + "`"};
  }
}

Decimal round_decimal(const Decimal& d, int32_t scale) {
  if (d.scale() <= scale) return d;
  const int64_t diff = static_cast<int64_t>(d.scale()) - scale;
  int128_t q = diff > 38 ? 0 : div_round(d.unscaled(), pow10_128(static_cast<int>(diff)));
  if (scale < 0) {
    q = scale_up(q, -static_cast<int64_t>(scale), "ROUND");
    scale = 0;
  }
  auto r = Decimal::of(q, scale);
  if (!r.ok()) throw EvalError{"decimal overflow in ROUND"};
  return *r;
}

Value cast_value(const Value& v, CastType type, std::optional<int32_t> precision, std::optional<int32_t> scale) {
  switch (type) {
    case CastType::kString:
      return Value(to_text(v));
    case CastType::kBigint:
      switch (v.kind()) {
        case Value::Kind::kInt64:
          return v;
        case Value::Kind::kBool:
          return int64_t{v.as_bool() ? 1 : 0};
        case Value::Kind::kDouble: {
          const double d = std::trunc(v.as_double());
          if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
            throw EvalError{"double " + to_text(v) + " is out of the BIGINT range"};
          }
          return static_cast<int64_t>(d);
        }
        case Value::Kind::kDecimal: {
          const Decimal d = v.as_decimal();
          int128_t u = d.unscaled();
          if (d.scale() > 0) {
            u = d.scale() > 38 ? 0 : u / pow10_128(d.scale());
          } else {
            u = scale_up(u, -static_cast<int64_t>(d.scale()), "CAST");
          }
          if (u > std::numeric_limits<int64_t>::max() || u < std::numeric_limits<int64_t>::min()) {
            throw EvalError{"decimal " + d.to_string() + " is out of the BIGINT range"};
          }
          return static_cast<int64_t>(u);
        }
        case Value::Kind::kString: {
          std::string_view s = trim_spaces(v.as_string());
          if (!s.empty() && s.front() == '+') s.remove_prefix(1);
          int64_t out = 0;
          auto res = std::from_chars(s.data(), s.data() + s.size(), out);
          if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
            throw EvalError{"'" + std::string(v.as_string()) + "' is not an integer"};
          }
          return out;
        }
        default:
          throw EvalError{kind_name(v) + " does not convert to BIGINT"};
      }
    case CastType::kDouble:
      switch (v.kind()) {
        case Value::Kind::kInt64:
        case Value::Kind::kDecimal:
        case Value::Kind::kDouble:
          return to_double_num(v);
        case Value::Kind::kString: {
          std::string_view s = trim_spaces(v.as_string());
          if (!s.empty() && s.front() == '+') s.remove_prefix(1);
          double out = 0;
          auto res = std::from_chars(s.data(), s.data() + s.size(), out);
          if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
            throw EvalError{"'" + std::string(v.as_string()) + "' is not a number"};
          }
          return out;
        }
        default:
          throw EvalError{kind_name(v) + " does not convert to DOUBLE"};
      }
    case CastType::kDecimal: {
      Decimal d;
      switch (v.kind()) {
        case Value::Kind::kInt64:
        case Value::Kind::kDecimal:
        case Value::Kind::kDouble:
          d = to_decimal(v);
          break;
        case Value::Kind::kString:
          d = parse_decimal_text(v.as_string());
          break;
        default:
          throw EvalError{kind_name(v) + " does not convert to DECIMAL"};
      }
      if (scale) {
        if (d.scale() > *scale) {
          d = round_decimal(d, *scale);
        } else if (d.scale() < *scale) {
          auto r = Decimal::of(scale_up(d.unscaled(), static_cast<int64_t>(*scale) - d.scale(), "CAST"), *scale);
          if (!r.ok()) throw EvalError{"decimal overflow"};
          d = *r;
        }
      }
      if (precision && decimal_digits(d.unscaled()) > *precision) {
        throw EvalError{"decimal " + d.to_string() + " does not fit DECIMAL(" + std::to_string(*precision) + ", " +
                        std::to_string(scale.value_or(0)) + ")"};
      }
      return Value(d);
    }
    case CastType::kBoolean:
      switch (v.kind()) {
        case Value::Kind::kBool:
          return v;
        case Value::Kind::kInt64:
          return v.as_int64() != 0;
        case Value::Kind::kDouble:
          return v.as_double() != 0.0;
        case Value::Kind::kDecimal:
          return v.as_decimal().unscaled() != 0;
        case Value::Kind::kString: {
          std::string s(trim_spaces(v.as_string()));
          for (char& c : s)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (s == "true" || s == "t" || s == "yes" || s == "y" || s == "1") return true;
          if (s == "false" || s == "f" || s == "no" || s == "n" || s == "0") return false;
          throw EvalError{"'" + std::string(v.as_string()) + "' is not a boolean"};
        }
        default:
          throw EvalError{kind_name(v) + " does not convert to BOOLEAN"};
      }
    case CastType::kTimestamp:
      if (v.is_timestamp()) return v;
      if (v.is_string()) {
        auto t = parse_timestamp(v.as_string());
        if (!t) throw EvalError{"'" + std::string(v.as_string()) + "' is not a timestamp (yyyy-MM-dd HH:mm:ss[.S])"};
        return Value::timestamp_micros(*t);
      }
      throw EvalError{kind_name(v) + " does not convert to TIMESTAMP (for epoch numbers use TO_TIMESTAMP_LTZ(n, 3))"};
  }
  return Value();
}

bool like_match(std::string_view text, std::string_view pat) {
  auto cp_len = [&](size_t i) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return std::min(len, text.size() - i);
  };
  size_t t = 0, p = 0, star_p = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pat.size() && pat[p] == '%') {
      star_p = p++;
      star_t = t;
    } else if (p < pat.size() && pat[p] == '_') {
      t += cp_len(t);
      ++p;
    } else if (p < pat.size() && pat[p] == text[t]) {
      ++p;
      ++t;
    } else if (star_p != std::string_view::npos) {
      p = star_p + 1;
      star_t += cp_len(star_t);
      t = star_t;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '%')
    ++p;
  return p == pat.size();
}

// ---- nodes ----

const Value& PathNode::eval(const Value& input, Value&) const {
  const Value* cur = find(input);
  return cur != nullptr ? *cur : null_value();
}

const Value* PathNode::find(const Value& input) const {
  const PathSegment& first = segments.front();
  const Value* cur = input.find(first.key);
  if (cur == nullptr) {
    const Value* image = input.find("after");
    if (image == nullptr || !image->is_object()) image = input.find("before");
    if (image != nullptr && image->is_object()) cur = image->find(first.key);
  }
  for (size_t i = 1; i < segments.size() && cur != nullptr; ++i) {
    const PathSegment& seg = segments[i];
    if (seg.is_index) {
      cur = cur->is_array() && seg.index < cur->as_array().size() ? &cur->as_array()[seg.index] : nullptr;
    } else {
      cur = cur->find(seg.key);
    }
  }
  return cur;
}

const Value& BinaryNode::eval(const Value& input, Value& scratch) const {
  Value ls, rs;
  const Value& l = lhs->eval(input, ls);
  const Value& r = rhs->eval(input, rs);
  if (l.is_null() || r.is_null()) return null_value();
  switch (op) {
    case BinaryOp::kAdd:
      scratch = arithmetic('+', l, r, snippet);
      return scratch;
    case BinaryOp::kSub:
      scratch = arithmetic('-', l, r, snippet);
      return scratch;
    case BinaryOp::kMul:
      scratch = arithmetic('*', l, r, snippet);
      return scratch;
    case BinaryOp::kDiv:
      scratch = arithmetic('/', l, r, snippet);
      return scratch;
    case BinaryOp::kMod:
      scratch = arithmetic('%', l, r, snippet);
      return scratch;
    case BinaryOp::kConcat: {
      std::string s;
      append_text(l, s);
      append_text(r, s);
      check_string_size(s.size(), "the result of " + snippet);
      scratch = Value(s);
      return scratch;
    }
    case BinaryOp::kEq:
      return bool_value(compare_values(l, r, snippet) == 0);
    case BinaryOp::kNe:
      return bool_value(compare_values(l, r, snippet) != 0);
    case BinaryOp::kLt:
      return bool_value(compare_values(l, r, snippet) < 0);
    case BinaryOp::kLe:
      return bool_value(compare_values(l, r, snippet) <= 0);
    case BinaryOp::kGt:
      return bool_value(compare_values(l, r, snippet) > 0);
    case BinaryOp::kGe:
      return bool_value(compare_values(l, r, snippet) >= 0);
  }
  return null_value();
}

const Value& NegateNode::eval(const Value& input, Value& scratch) const {
  Value s;
  const Value& v = arg->eval(input, s);
  if (v.is_null()) return null_value();
  scratch = negate(v, snippet);
  return scratch;
}

const Value& LogicNode::eval(const Value& input, Value&) const {
  const char* name = is_and ? "AND" : "OR";
  Value ls;
  const std::optional<bool> l = truth(lhs->eval(input, ls), snippet, name);
  if (l && *l != is_and) return bool_value(*l);  // FALSE AND x, TRUE OR x
  Value rs;
  const std::optional<bool> r = truth(rhs->eval(input, rs), snippet, name);
  if (r && *r != is_and) return bool_value(*r);
  if (l && r) return bool_value(is_and);
  return null_value();
}

const Value& NotNode::eval(const Value& input, Value&) const {
  Value s;
  const std::optional<bool> v = truth(arg->eval(input, s), snippet, "NOT");
  return v ? bool_value(!*v) : null_value();
}

const Value& IsNullNode::eval(const Value& input, Value&) const {
  Value s;
  return bool_value(arg->eval(input, s).is_null() != negated);
}

const Value& InNode::eval(const Value& input, Value&) const {
  Value s;
  const Value& v = arg->eval(input, s);
  if (v.is_null()) return null_value();
  bool saw_null = false;
  for (const NodePtr& item : list) {
    Value is;
    const Value& w = item->eval(input, is);
    if (w.is_null()) {
      saw_null = true;
    } else if (compare_values(v, w, snippet) == 0) {
      return bool_value(!negated);
    }
  }
  return saw_null ? null_value() : bool_value(negated);
}

const Value& BetweenNode::eval(const Value& input, Value&) const {
  Value s, ls, hs;
  const Value& v = arg->eval(input, s);
  if (v.is_null()) return null_value();
  const Value& lo = low->eval(input, ls);
  const Value& hi = high->eval(input, hs);
  std::optional<bool> ge, le;
  if (!lo.is_null()) ge = compare_values(v, lo, snippet) >= 0;
  if (!hi.is_null()) le = compare_values(v, hi, snippet) <= 0;
  std::optional<bool> in;
  if ((ge && !*ge) || (le && !*le)) {
    in = false;
  } else if (ge && le) {
    in = true;
  }
  if (!in) return null_value();
  return bool_value(*in != negated);
}

const Value& LikeNode::eval(const Value& input, Value&) const {
  Value s, ps;
  const Value& v = arg->eval(input, s);
  const Value& p = pattern->eval(input, ps);
  if (v.is_null() || p.is_null()) return null_value();
  if (!p.is_string()) {
    throw EvalError{"LIKE needs a string pattern, found " + kind_name(p) + " in `" + snippet + "`"};
  }
  const bool match = v.is_string() ? like_match(v.as_string(), p.as_string()) : like_match(to_text(v), p.as_string());
  return bool_value(match != negated);
}

const Value& CaseNode::eval(const Value& input, Value& scratch) const {
  if (operand) {
    Value os;
    const Value& v = operand->eval(input, os);
    if (!v.is_null()) {
      for (const auto& [when, then] : branches) {
        Value ws;
        const Value& w = when->eval(input, ws);
        if (!w.is_null() && compare_values(v, w, snippet) == 0) return then->eval(input, scratch);
      }
    }
  } else {
    for (const auto& [when, then] : branches) {
      Value ws;
      const std::optional<bool> c = truth(when->eval(input, ws), snippet, "CASE WHEN");
      if (c && *c) return then->eval(input, scratch);
    }
  }
  return otherwise ? otherwise->eval(input, scratch) : null_value();
}

const Value& CoalesceNode::eval(const Value& input, Value& scratch) const {
  for (const NodePtr& a : args) {
    const Value& v = a->eval(input, scratch);
    if (!v.is_null()) return v;
  }
  return null_value();
}

const Value& CastNode::eval(const Value& input, Value& scratch) const {
  Value s;
  const Value& v = arg->eval(input, s);
  if (v.is_null()) return null_value();
  try {
    scratch = cast_value(v, type, precision, scale);
  } catch (const EvalError& e) {
    if (try_cast) return null_value();
    throw EvalError{"cannot " + snippet + ": " + e.message};
  }
  return scratch;
}

const Value& FunctionNode::eval(const Value& input, Value& scratch) const {
  constexpr size_t kInline = 4;
  const size_t n = args.size();
  Value inline_scratch[kInline];
  const Value* inline_refs[kInline];
  std::vector<Value> heap_scratch;
  std::vector<const Value*> heap_refs;
  Value* scratches = inline_scratch;
  const Value** refs = inline_refs;
  if (n > kInline) {
    heap_scratch.resize(n);
    heap_refs.resize(n);
    scratches = heap_scratch.data();
    refs = heap_refs.data();
  }
  for (size_t i = 0; i < n; ++i) {
    refs[i] = &args[i]->eval(input, scratches[i]);
    if (null_on_null && refs[i]->is_null()) return null_value();
  }
  try {
    scratch = impl(ArgList(refs, n), state);
  } catch (const EvalError& e) {
    throw EvalError{name + ": " + e.message};
  }
  return scratch;
}

}  // namespace sluice::pipeline::detail
