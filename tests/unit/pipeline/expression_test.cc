#include "sluice/pipeline/expression.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace sluice::pipeline {
namespace {

// 2024-03-05T14:07:09.123456Z
constexpr int64_t kTsMicros = 1709647629123456;

Value dec(const char* s) {
  return Value(*Decimal::parse(s));
}

Value event() {
  Value after = Value::object({
      {"id", 7},
      {"amount", 150},
      {"name", " Alice "},
      {"email", "alice@example.com"},
      {"price", dec("12.50")},
      {"ratio", 0.5},
      {"note", nullptr},
      {"active", true},
      {"tags", Value::array({"a", "b"})},
      {"customer", Value::object({{"id", 42}, {"city", "Paris"}})},
      {"ts", Value::timestamp_micros(kTsMicros)},
      {"ts_text", "2024-03-05T14:07:09.123Z"},
      {"weird name", "w"},
      {"a.b", Value::object({{"c", 3}})},
      {"big", INT64_MAX},
      {"pattern", "b+"},
  });
  return Value::object({
      {"op", "u"},
      {"key", Value::object({{"id", 7}})},
      {"before", Value::object({{"id", 7}, {"amount", 50}, {"name", "old"}})},
      {"after", std::move(after)},
      {"source", Value::object({{"table", "orders"}})},
  });
}

Value eval_ok(const std::string& text, const Value& input = event()) {
  auto e = Expression::compile(text);
  EXPECT_TRUE(e.ok()) << text << ": " << (e.ok() ? "" : e.error().message());
  if (!e.ok()) return Value("<compile error>");
  auto v = e->evaluate(input);
  EXPECT_TRUE(v.ok()) << text << ": " << (v.ok() ? "" : v.error().message());
  if (!v.ok()) return Value("<runtime error>");
  return std::move(v).value();
}

struct Case {
  const char* text;
  Value expected;
};

void run_cases(const std::vector<Case>& cases) {
  const Value input = event();
  for (const Case& c : cases) {
    const Value got = eval_ok(c.text, input);
    // == checks the kind (int64 1 != decimal 1); to_json also checks a decimal's scale.
    EXPECT_TRUE(got == c.expected && got.to_json() == c.expected.to_json())
        << c.text << "\n  got:      " << got << " (" << value_kind_name(got.kind()) << ")\n  expected: " << c.expected
        << " (" << value_kind_name(c.expected.kind()) << ")";
  }
}

TEST(ExpressionTest, LiteralsAndArithmetic) {
  run_cases({
      {"42", 42},
      {"12.50", dec("12.50")},
      {"1e3", 1000.0},
      {"2.5E-1", 0.25},
      {"'it''s'", "it's"},
      {"''", ""},
      {"TRUE", true},
      {"false", false},
      {"null", Value()},
      {"1 + 2 * 3", 7},
      {"(1 + 2) * 3", 9},
      {"10 - 4 - 3", 3},
      {"2 * 3 % 4", 2},
      {"7 / 2", 3},
      {"-7 / 2", -3},
      {"7 % 3", 1},
      {"-2 * -3", 6},
      {"- - 2", 2},
      {"+5", 5},
      {"0.1 + 0.2", dec("0.3")},
      {"0.1 + 0.2 = 0.3", true},
      {"1.50 * 2", dec("3.00")},
      {"1.5 - 2", dec("-0.5")},
      {"1 / 3.0", dec("0.333333")},
      {"2 / 3.0", dec("0.666667")},
      {"10.00 / 4", dec("2.500000")},
      {"7.5 % 2", dec("1.5")},
      {"1e3 + 1", 1001.0},
      {"1 + 0.5e0", 1.5},
      {"0.5 * 1e0", 0.5},
      {"1 / 0", Value()},
      {"1.0 / 0", Value()},
      {"1e0 / 0", Value()},
      {"5 % 0", Value()},
      {"1 + NULL", Value()},
      {"-NULL", Value()},
      {"9223372036854775807 + 0", INT64_MAX},
      {"99999999999999999999 + 1", dec("100000000000000000000")},
      {"amount * 2", 300},
      {"price * 2", dec("25.00")},
      {"amount * ratio", 75.0},
      {"price + amount", dec("162.50")},
  });
}

TEST(ExpressionTest, StringConcatenation) {
  run_cases({
      {"'a' || 'b'", "ab"},
      {"'a' || 1 || 2.50 || TRUE", "a12.50TRUE"},
      {"'d=' || 1.5e0", "d=1.5"},
      {"'d=' || 1e3", "d=1000.0"},
      {"'x' || NULL", Value()},
      {"'ts: ' || ts", "ts: 2024-03-05T14:07:09.123456Z"},
      {"'n' || 1 + 2", "n3"},         // + binds tighter than ||
      {"'ab' || 'c' = 'abc'", true},  // || binds tighter than =
  });
}

TEST(ExpressionTest, LogicAndNullSemantics) {
  run_cases({
      {"TRUE OR FALSE AND FALSE", true},
      {"(TRUE OR FALSE) AND FALSE", false},
      {"NOT FALSE AND FALSE", false},
      {"NOT 1 = 2", true},
      {"NOT NOT TRUE", true},
      {"1 + 1 = 2 AND 'a' || 'b' = 'ab'", true},
      {"NULL AND FALSE", false},
      {"FALSE AND NULL", false},
      {"NULL AND TRUE", Value()},
      {"NULL OR TRUE", true},
      {"TRUE OR NULL", true},
      {"NULL OR FALSE", Value()},
      {"NOT NULL", Value()},
      {"NULL = NULL", Value()},
      {"note = 1", Value()},
      {"note IS NULL", true},
      {"note IS NOT NULL", false},
      {"missing IS NULL", true},
      {"amount IS NOT NULL", true},
      {"1 < 2", true},
      {"2 <= 2", true},
      {"3 > 2", true},
      {"2 >= 3", false},
      {"1 <> 2", true},
      {"1 != 1", false},
      {"1 = 1.0", true},
      {"1 = 1e0", true},
      {"ratio = 0.5", true},
      {"price > 12.499e0", true},
      {"price = 12.5", true},
      {"'abc' < 'abd'", true},
      {"active = TRUE", true},
      {"ts > '2024-01-01'", true},
      {"'2025-01-01 00:00:00' > ts", true},
      {"ts = TO_TIMESTAMP('2024-03-05 14:07:09.123456')", true},
      {"amount > 100 AND op = 'u'", true},
      {"NOT note IS NULL", false},
      {"1.5 IN (1.50)", true},
      {"customer.id = key.id", false},
      {"cast(amount as string) = '150'", true},
  });
}

TEST(ExpressionTest, InBetweenLike) {
  run_cases({
      {"amount IN (100, 150)", true},
      {"amount NOT IN (100, 150)", false},
      {"amount IN (1, 2)", false},
      {"amount IN (1, NULL)", Value()},
      {"amount NOT IN (1, NULL)", Value()},
      {"amount IN (150, NULL)", true},
      {"NULL IN (1)", Value()},
      {"amount IN (150.0, 2)", true},
      {"op IN ('c', 'r')", false},
      {"amount BETWEEN 100 AND 200", true},
      {"amount BETWEEN 150 AND 150", true},
      {"amount NOT BETWEEN 100 AND 200", false},
      {"amount BETWEEN 200 AND NULL", false},
      {"amount BETWEEN 100 AND NULL", Value()},
      {"amount BETWEEN 100 AND 200 AND TRUE", true},
      {"email LIKE '%@example.com'", true},
      {"email LIKE 'a_ice%'", true},
      {"email NOT LIKE 'b%'", true},
      {"'abc' LIKE 'a%c'", true},
      {"'abc' LIKE 'a%b'", false},
      {"'abc' LIKE 'abc'", true},
      {"'abc' LIKE 'ab'", false},
      {"'h\xC3\xA9llo' LIKE 'h_llo'", true},
      {"'' LIKE '%'", true},
      {"'aXbXc' LIKE '%X%X%'", true},
      {"NULL LIKE 'a'", Value()},
      {"name LIKE NULL", Value()},
  });
}

TEST(ExpressionTest, CaseAndConditionals) {
  run_cases({
      {"CASE WHEN amount > 100 THEN 'big' ELSE 'small' END", "big"},
      {"CASE WHEN amount > 1000 THEN 'big' END", Value()},
      {"CASE WHEN amount > 1000 THEN 'huge' WHEN amount > 100 THEN 'big' ELSE 'small' END", "big"},
      {"case op when 'c' then 'create' when 'u' then 'update' else 'other' end", "update"},
      {"CASE op WHEN 'x' THEN 1 END", Value()},
      {"CASE note WHEN NULL THEN 'n' ELSE 'e' END", "e"},
      {"CASE WHEN NULL THEN 1 ELSE 2 END", 2},
      {"CASE WHEN amount > 100 THEN 1 ELSE 1 / 0 END + 1", 2},
      {"IF(amount > 100, 'y', 'n')", "y"},
      {"IF(NULL, 'y', 'n')", "n"},
      {"COALESCE(note, missing, 'd')", "d"},
      {"COALESCE(amount, 1)", 150},
      {"COALESCE(note)", Value()},
      {"NULLIF(amount, 150)", Value()},
      {"NULLIF(amount, 1)", 150},
      {"NULLIF(NULL, 1)", Value()},
  });
}

TEST(ExpressionTest, Cast) {
  run_cases({
      {"CAST('42' AS BIGINT)", 42},
      {"CAST(' -42 ' AS INT)", -42},
      {"CAST(3.9 AS BIGINT)", 3},
      {"CAST(-3.9e0 AS INTEGER)", -3},
      {"CAST(TRUE AS INT)", 1},
      {"CAST(amount AS STRING)", "150"},
      {"CAST(price AS VARCHAR(20))", "12.50"},
      {"CAST(TRUE AS STRING)", "TRUE"},
      {"CAST(1.5 AS DOUBLE)", 1.5},
      {"CAST('2.5' AS DOUBLE)", 2.5},
      {"CAST(amount AS DOUBLE)", 150.0},
      {"CAST('1.25' AS DECIMAL(10, 1))", dec("1.3")},
      {"CAST(2 AS DECIMAL(5, 2))", dec("2.00")},
      {"CAST('007.5' AS DECIMAL)", dec("7.5")},
      {"CAST(0.25e0 AS DECIMAL(4, 2))", dec("0.25")},
      {"CAST('true' AS BOOLEAN)", true},
      {"CAST('No' AS BOOLEAN)", false},
      {"CAST(0 AS BOOLEAN)", false},
      {"CAST('2024-03-05 14:07:09.123456' AS TIMESTAMP)", Value::timestamp_micros(kTsMicros)},
      {"CAST(ts_text AS TIMESTAMP(3))", Value::timestamp_micros(1709647629123000)},
      {"CAST(ts AS STRING)", "2024-03-05T14:07:09.123456Z"},
      {"CAST(NULL AS INT)", Value()},
      {"CAST(note AS STRING)", Value()},
      {"TRY_CAST('x' AS INT)", Value()},
      {"TRY_CAST('12' AS INT)", 12},
  });
}

TEST(ExpressionTest, StringFunctions) {
  run_cases({
      {"UPPER(name)", " ALICE "},
      {"upper('a')", "A"},
      {"Lower('AbC')", "abc"},
      {"TRIM(name)", "Alice"},
      {"LTRIM(name)", "Alice "},
      {"RTRIM(name)", " Alice"},
      {"CHAR_LENGTH('h\xC3\xA9llo')", 5},
      {"LENGTH(name)", 7},
      {"UPPER(NULL)", Value()},
      {"SUBSTRING('hello', 2)", "ello"},
      {"SUBSTRING('hello', 2, 3)", "ell"},
      {"SUBSTR('h\xC3\xA9llo', 2, 1)", "\xC3\xA9"},
      {"SUBSTRING('hello', -3)", "llo"},
      {"SUBSTRING('hello', 10)", ""},
      {"SUBSTRING('hello', 4, 10)", "lo"},
      {"CONCAT('a', 1, 'b')", "a1b"},
      {"CONCAT('a', NULL)", Value()},
      {"CONCAT_WS('-', 'a', NULL, 'b')", "a-b"},
      {"CONCAT_WS(NULL, 'a')", Value()},
      {"REPLACE('aXbXc', 'X', '--')", "a--b--c"},
      {"REPLACE('abc', '', 'x')", "abc"},
      {"POSITION('b' IN 'abc')", 2},
      {"POSITION('l' IN 'h\xC3\xA9llo')", 3},
      {"LOCATE('z', 'abc')", 0},
      {"LOCATE('a', 'banana', 3)", 4},
      {"SPLIT_INDEX('a,b,c', ',', 1)", "b"},
      {"SPLIT_INDEX('a,b,c', ',', 2)", "c"},
      {"SPLIT_INDEX('a,b,c', ',', 5)", Value()},
      {"REGEXP_REPLACE('a1b22', '[0-9]+', '#')", "a#b#"},
      {"REGEXP_REPLACE(email, '@.*', '')", "alice"},
      {"REGEXP_REPLACE('x-y', '(\\w)-(\\w)', '$2-$1')", "y-x"},
      {"REGEXP_REPLACE('abbc', pattern, 'X')", "aXc"},
      {"REGEXP(email, '^a.*com$')", true},
      {"REGEXP('abc', 'x')", false},
      {"LPAD('7', 3, '0')", "007"},
      {"RPAD('ab', 5, 'xy')", "abxyx"},
      {"LPAD('hello', 2, '0')", "he"},
      {"LPAD('a', -1, 'x')", Value()},
  });
}

TEST(ExpressionTest, NumericFunctions) {
  run_cases({
      {"ABS(-5)", 5},
      {"ABS(-1.50)", dec("1.50")},
      {"ABS(-2e0)", 2.0},
      {"ROUND(2.345, 2)", dec("2.35")},
      {"ROUND(-2.5)", dec("-3")},
      {"ROUND(1.5)", dec("2")},
      {"ROUND(2.5e0)", 3.0},
      {"ROUND(1234, -2)", 1200},
      {"ROUND(1250, -2)", 1300},
      {"ROUND(7)", 7},
      {"FLOOR(2.7)", dec("2")},
      {"FLOOR(-2.1)", dec("-3")},
      {"CEIL(2.1)", dec("3")},
      {"CEILING(-2.1)", dec("-2")},
      {"CEIL(2.5e0)", 3.0},
      {"FLOOR(5)", 5},
      {"MOD(7, 3)", 1},
      {"MOD(-7, 3)", -1},
      {"MOD(7.5, 2)", dec("1.5")},
      {"MOD(1, 0)", Value()},
      {"TYPEOF(amount)", "int64"},
      {"TYPEOF(price)", "decimal"},
      {"TYPEOF(note)", "null"},
      {"TYPEOF(ts)", "timestamp"},
      {"TYPEOF(tags)", "array"},
  });
}

TEST(ExpressionTest, TimeFunctions) {
  run_cases({
      {"TO_TIMESTAMP('2024-03-05 14:07:09')", Value::timestamp_micros(1709647629000000)},
      {"TO_TIMESTAMP('2024-03-05T14:07:09+01:00')", Value::timestamp_micros(1709647629000000 - 3600000000LL)},
      {"TO_TIMESTAMP('05/03/2024 14:07', 'dd/MM/yyyy HH:mm')", Value::timestamp_micros(1709647620000000)},
      {"TO_TIMESTAMP('garbage')", Value()},
      {"TO_TIMESTAMP_LTZ(1709647629123, 3)", Value::timestamp_micros(1709647629123000)},
      {"TO_TIMESTAMP_LTZ(1709647629, 0)", Value::timestamp_micros(1709647629000000)},
      {"DATE_FORMAT(ts, 'yyyy-MM-dd')", "2024-03-05"},
      {"DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss.SSS')", "2024-03-05 14:07:09.123"},
      {"DATE_FORMAT(ts, 'SSSSSS')", "123456"},
      {"DATE_FORMAT(ts_text, 'yyyy/MM/dd')", "2024/03/05"},
      {"DATE_FORMAT('2024-03-05', 'dd.MM.yy')", "05.03.24"},
      {"DATE_FORMAT(ts, 'dd.MM.yy ''at'' HH')", "05.03.24 at 14"},
      {"DATE_FORMAT('not a date', 'yyyy')", Value()},
      {"UNIX_TIMESTAMP(ts)", 1709647629},
      {"UNIX_TIMESTAMP('2024-03-05 14:07:09')", 1709647629},
      {"UNIX_TIMESTAMP('05/03/2024', 'dd/MM/yyyy')", 1709596800},
      {"UNIX_TIMESTAMP(TO_TIMESTAMP_LTZ(-1, 3))", -1},
      {"EXTRACT(YEAR FROM ts)", 2024},
      {"EXTRACT(QUARTER FROM ts)", 1},
      {"EXTRACT(MONTH FROM ts)", 3},
      {"EXTRACT(DAY FROM ts)", 5},
      {"EXTRACT(HOUR FROM ts)", 14},
      {"extract(minute from ts)", 7},
      {"EXTRACT(SECOND FROM ts)", 9},
      {"EXTRACT(MILLISECOND FROM ts)", 9123},
      {"EXTRACT(DAY FROM ts_text)", 5},
      {"EXTRACT(YEAR FROM TO_TIMESTAMP_LTZ(-1, 3))", 1969},
      {"EXTRACT(DAY FROM '2024-02-29')", 29},
  });
}

TEST(ExpressionTest, FieldPathsAndResolutionRule) {
  run_cases({
      {"amount", 150},  // not a field of the event: resolves into after
      {"before.amount", 50},
      {"after.amount", 150},
      {"after.customer.id", 42},
      {"customer.city", "Paris"},
      {"`weird name`", "w"},
      {"`a.b`.c", 3},
      {"tags[1]", "b"},
      {"tags[5]", Value()},
      {"op", "u"},  // a field of the event itself
      {"source.table", "orders"},
      {"key.id", 7},
      {"missing", Value()},
      {"missing.x", Value()},
      {"name.x", Value()},
      {"after.tags[0]", "a"},
  });
  // A delete has no after image: unqualified names resolve into before.
  Value del = event();
  del.set("after", Value());
  EXPECT_EQ(eval_ok("amount", del), Value(50));
  EXPECT_EQ(eval_ok("name", del), Value("old"));
  // Not an object: every path is NULL.
  EXPECT_EQ(eval_ok("amount", Value(5)), Value());
  // A plain object without images resolves directly.
  EXPECT_EQ(eval_ok("x + 1", Value::object({{"x", 1}})), Value(2));
}

TEST(ExpressionTest, FieldPathIntrospection) {
  auto e = Expression::compile("after.customer.id");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->is_field_path());
  EXPECT_EQ(e->path(), "after.customer.id");
  EXPECT_EQ(e->text(), "after.customer.id");
  auto q = Expression::compile("`a.b`.c[2]");
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->is_field_path());
  EXPECT_EQ(q->path(), "[\"a.b\"].c[2]");
  auto f = Expression::compile("amount + 1");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->is_field_path());
  EXPECT_EQ(f->path(), "");
}

TEST(ExpressionTest, RuntimeErrors) {
  struct ErrorCase {
    const char* text;
    std::vector<std::string> fragments;
  };
  const std::vector<ErrorCase> cases = {
      {"name > 1", {"expression 'name > 1': ", "cannot compare string with int64", "`name > 1`"}},
      {"amount = 'x'", {"cannot compare int64 with string"}},
      {"big + 1", {"integer overflow", "`big + 1`"}},
      {"big * 2", {"integer overflow"}},
      {"-(-9223372036854775807 - 1)", {"integer overflow"}},
      {"'abc' + 1", {"operator '+' needs numbers, found string and int64"}},
      {"CAST('x' AS INT)", {"'x' is not an integer"}},
      {"CAST('2024-13-01' AS TIMESTAMP)", {"is not a timestamp"}},
      {"CAST(1234.5 AS DECIMAL(4, 1))", {"does not fit DECIMAL(4, 1)"}},
      {"amount AND TRUE", {"AND needs a boolean, found int64"}},
      {"CASE WHEN amount THEN 1 END", {"CASE WHEN needs a boolean"}},
      {"SUBSTRING(name, 'x')", {"SUBSTRING: start must be an integer"}},
      {"TO_TIMESTAMP_LTZ(1, 2)", {"precision must be 0"}},
      {"ABS('x')", {"ABS: needs a number, found string"}},
      {"ts > 'yesterday'", {"not a timestamp"}},
      {"99999999999999999999999999999999999999 + 1", {"decimal overflow"}},
      {"SUBSTRING('abc', 1, -1)", {"length must not be negative"}},
      {"tags < 1", {"cannot compare array with int64"}},
  };
  const Value input = event();
  for (const ErrorCase& c : cases) {
    auto e = Expression::compile(c.text);
    ASSERT_TRUE(e.ok()) << c.text << ": " << e.error().message();
    auto v = e->evaluate(input);
    ASSERT_FALSE(v.ok()) << c.text << " evaluated to " << *v;
    EXPECT_EQ(v.error().code(), ErrorCode::kRuntime) << c.text;
    EXPECT_EQ(v.error().message().rfind("expression '" + std::string(c.text) + "': ", 0), 0u) << v.error().message();
    for (const std::string& f : c.fragments) {
      EXPECT_NE(v.error().message().find(f), std::string::npos) << c.text << ": " << v.error().message();
    }
  }
  // A pattern that arrives in the record is compiled per call; a bad one is a runtime error.
  auto bad = Expression::compile("REGEXP('a', p)");
  ASSERT_TRUE(bad.ok());
  auto r = bad->evaluate(Value::object({{"p", "("}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("invalid regular expression '('"), std::string::npos) << r.error().message();
}

TEST(ExpressionTest, CompileErrorsWithOffsets) {
  struct ErrorCase {
    const char* text;
    size_t offset;
    const char* fragment;
  };
  const std::vector<ErrorCase> cases = {
      {"", 0, "empty expression"},
      {"UPPPER(name)", 0, "unknown function 'UPPPER' (did you mean UPPER?)"},
      {"amount > 1 AND lenght(name) > 2", 15, "unknown function 'lenght' (did you mean LENGTH?)"},
      {"frobnicate(1)", 0, "unknown function 'frobnicate'"},
      {"amount > ", 9, "unexpected end of the expression"},
      {"'abc", 0, "unterminated string literal"},
      {"name = 'abc", 7, "unterminated string literal"},
      {"a.`b", 2, "unterminated quoted identifier"},
      {"amount + )", 9, "unexpected token ')'"},
      {"COALESCE(a, b", 13, "expected ')' after the arguments of COALESCE"},
      {"UPPER(a, b)", 0, "UPPER takes 1 argument, found 2"},
      {"SUBSTRING(a)", 0, "SUBSTRING takes 2 to 3 arguments, found 1"},
      {"CONCAT_WS('-')", 0, "CONCAT_WS takes at least 2 arguments, found 1"},
      {"IF(a, b)", 0, "IF takes 3 arguments"},
      {"NOW()", 0, "non-deterministic"},
      {"CURRENT_TIMESTAMP", 0, "non-deterministic"},
      {"amount > 1 AND ts < current_timestamp", 20, "CURRENT_TIMESTAMP is not allowed"},
      {"RAND() > 0.5", 0, "non-deterministic"},
      {"UNIX_TIMESTAMP()", 0, "reads the clock"},
      {"a b", 2, "unexpected token 'b'"},
      {"(a + 1", 6, "expected ')' to close '(' at offset 0"},
      {"CAST(a AS FOO)", 10, "unknown type 'FOO'"},
      {"CAST(a BIGINT)", 7, "expected AS"},
      {"CAST(a AS DECIMAL(40, 2))", 18, "precision must be 1..38"},
      {"CASE WHEN a THEN 1", 18, "expected END"},
      {"CASE a END", 7, "expected WHEN"},
      {"a IS 5", 5, "expected NULL after IS"},
      {"a NOT 5", 2, "unexpected token 'NOT'"},
      {"a IN ()", 6, "IN needs at least one value"},
      {"a BETWEEN 1 OR 2", 12, "expected AND between the bounds of BETWEEN"},
      {"REGEXP(a, '(')", 10, "invalid regular expression '('"},
      {"EXTRACT(WEEK FROM ts)", 8, "expected a unit"},
      {"EXTRACT(YEAR ts)", 13, "expected FROM"},
      {"POSITION('a', b)", 12, "expected IN"},
      {"\"x\"", 0, "strings use single quotes"},
      {"items[x]", 6, "array index"},
      {"a.", 2, "expected a field name after '.'"},
      {"*", 0, "only allowed as a projection item"},
      {"amount # 2", 7, "unexpected character '#'"},
      {"1e", 1, "malformed number"},
      {"12abc", 0, "malformed number"},
      {"1 = = 2", 4, "unexpected token '='"},
      {"WHEN", 0, "unexpected keyword 'WHEN'"},
  };
  for (const ErrorCase& c : cases) {
    Expression out;
    ExpressionError error;
    EXPECT_FALSE(Expression::compile(c.text, &out, &error)) << c.text;
    EXPECT_EQ(error.offset, c.offset) << c.text << ": " << error.message;
    EXPECT_NE(error.message.find(c.fragment), std::string::npos) << c.text << ": " << error.message;
  }
}

// Issue 14: a deeply nested expression crashed `sluice validate` (SIGSEGV, the parser recursed per level).
TEST(ExpressionTest, NestingDeeperThanTheLimitIsACompileErrorNotACrash) {
  auto repeat = [](std::string_view s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i)
      out += s;
    return out;
  };
  struct DeepCase {
    std::string text;
    size_t min_offset, max_offset;  // where the limit is crossed
  };
  const std::vector<DeepCase> cases = {
      {repeat("(", 20000) + "a" + repeat(")", 20000), 990, 1010},
      {repeat("NOT ", 20000) + "a", 3960, 4040},
      {repeat("-", 20000) + "1", 990, 1010},
      {repeat("- ", 20000) + "a", 1980, 2020},
      {repeat("UPPER(", 20000) + "a" + repeat(")", 20000), 5940, 6060},
      {repeat("CASE WHEN ", 20000) + "a", 9900, 10100},
      // A left-associative chain grows the tree without recursing in the parser; evaluation would recurse.
      {"a" + repeat(" + a", 20000), 3960, 4040},
      {"a" + repeat(" || a", 20000), 4950, 5050},
      {"a" + repeat(" OR a", 20000), 4950, 5050},
  };
  for (const DeepCase& c : cases) {
    Expression out;
    ExpressionError error;
    ASSERT_FALSE(Expression::compile(c.text, &out, &error)) << c.text.substr(0, 40);
    EXPECT_NE(error.message.find("nested more than 1000 levels"), std::string::npos) << error.message;
    EXPECT_GE(error.offset, c.min_offset) << c.text.substr(0, 40);
    EXPECT_LE(error.offset, c.max_offset) << c.text.substr(0, 40);
  }
  // Projections too.
  EXPECT_FALSE(Projection::compile(repeat("(", 20000) + "a" + repeat(")", 20000) + " AS x").ok());
  // Below the limit, deep expressions compile and evaluate.
  const Value input = Value::object({{"a", 1}});
  auto nested = Expression::compile(repeat("(", 900) + "a + 1" + repeat(")", 900));
  ASSERT_TRUE(nested.ok()) << nested.error().message();
  EXPECT_EQ(*nested->evaluate(input), Value(2));
  auto chain = Expression::compile("a" + repeat(" + a", 900));
  ASSERT_TRUE(chain.ok()) << chain.error().message();
  EXPECT_EQ(*chain->evaluate(input), Value(901));
  auto list = Expression::compile("a IN (" + repeat("2, ", 50000) + "1)");  // wide is fine, only depth is bounded
  ASSERT_TRUE(list.ok()) << list.error().message();
  EXPECT_EQ(*list->evaluate(input), Value(true));
}

// Issue 14: std::regex recursed per character (SIGSEGV on a long value) and backtracked exponentially.
TEST(ExpressionTest, RegularExpressionsRunInLinearTimeOnLongValues) {
  const Value input = Value::object({{"s", std::string(1'000'000, 'a')}, {"t", std::string(40, 'a') + "!"}});
  run_cases({{"REGEXP('aaa', '(a|b)*c')", false}});
  auto long_value = Expression::compile("REGEXP(s, '(a|b)*c')");
  ASSERT_TRUE(long_value.ok());
  EXPECT_EQ(*long_value->evaluate(input), Value(false));
  auto long_replace = Expression::compile("CHAR_LENGTH(REGEXP_REPLACE(s, '(a|b)', 'xy'))");
  ASSERT_TRUE(long_replace.ok());
  EXPECT_EQ(*long_replace->evaluate(input), Value(2'000'000));
  // Exponential for a backtracking engine: (a*)*b over 40 a's.
  const auto start = std::chrono::steady_clock::now();
  auto catastrophic =
      Expression::compile("REGEXP(t, '^(a*)*b$') OR REGEXP('" + std::string(40, 'a') + "!', '^(a|aa)+$')");
  ASSERT_TRUE(catastrophic.ok()) << catastrophic.error().message();
  EXPECT_EQ(*catastrophic->evaluate(input), Value(false));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(ExpressionTest, RegexpReplaceSemantics) {
  run_cases({
      {"REGEXP_REPLACE('abc', 'x*', '-')", "-a-b-c-"},
      {"REGEXP_REPLACE('baaac', 'a*', '-')", "-b--c-"},
      {"REGEXP_REPLACE('h\xC3\xA9!', '', '.')", ".h.\xC3\xA9.!."},
      {"REGEXP_REPLACE('ab', '(a)(b)', '[$&|$2$1|$$|$3|$0|$x]')", "[ab|ba|$|$3|$0|$x]"},
      {"REGEXP_REPLACE('abcdefghijk', '(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)', '$10-$11')", "j-a1k"},
      {"REGEXP_REPLACE('a.b', '\\.', '$')", "a$b"},
      {"REGEXP_REPLACE('2024-03-05', '^(\\d+)-(\\d+)', '$2/$1')", "03/2024-05"},
      {"REGEXP('line1', '^line\\d$')", true},
      {"REGEXP('ab', '^a')", true},
      {"REGEXP_REPLACE('aaa', '^a', 'b')", "baa"},
  });
}

TEST(ExpressionTest, PatternsRe2CannotRunAreCompileErrorsNamingThePattern) {
  for (const char* text : {"REGEXP(a, '(x)\\1')", "REGEXP(a, '(?=x)')", "REGEXP_REPLACE(a, '(?<!x)y', '')"}) {
    Expression out;
    ExpressionError error;
    ASSERT_FALSE(Expression::compile(text, &out, &error)) << text;
    EXPECT_NE(error.message.find("invalid regular expression '"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("RE2 syntax"), std::string::npos) << error.message;
    EXPECT_EQ(error.offset, std::string_view(text).find('\'')) << text << ": " << error.message;
  }
}

// Issue 14: LPAD to 9e18 characters allocated until bad_alloc, which failed the job instead of the record.
TEST(ExpressionTest, SizesTakenFromDataAreBoundedAsRecordErrors) {
  const Value input = Value::object(
      {{"n", int64_t{9'000'000'000'000'000'000}}, {"m", int64_t{20'000'000}}, {"s", std::string(10'000'000, 'x')}});
  struct ErrorCase {
    const char* text;
    const char* fragment;
  };
  for (const ErrorCase& c : std::vector<ErrorCase>{
           {"LPAD('a', n, 'b')", "LPAD: length 9000000000000000000 is over the limit of 16777216 characters"},
           {"RPAD('a', n, 'b')", "RPAD: length 9000000000000000000 is over the limit"},
           {"LPAD('a', 9000000000000000000, 'b')", "over the limit"},  // folded at compile time: still a record error
           {"RPAD('a', m, 'b')", "over the limit of 16777216 characters"},
           {"LPAD('a', 16000000, '\xC3\xA9')", "over the limit of 16777216 bytes"},
           {"s || s", "over the limit of 16777216 bytes"},
           {"CONCAT(s, s)", "CONCAT: the result would be"},
           {"CONCAT_WS(',', s, s)", "over the limit"},
           {"REPLACE(s, 'x', 'yy')", "REPLACE: the result would be"},
           {"REGEXP_REPLACE(s, 'x', 'yy')", "REGEXP_REPLACE: the result would be"},
           {"REPLACE(REPLACE(REPLACE(REPLACE(REPLACE(REPLACE(REPLACE(REPLACE('ab', 'a', 'aaaaaaaaaaaa'), 'a', "
            "'aaaaaaaaaaaa'), 'a', 'aaaaaaaaaaaa'), 'a', 'aaaaaaaaaaaa'), 'a', 'aaaaaaaaaaaa'), 'a', 'aaaaaaaaaaaa'), "
            "'a', 'aaaaaaaaaaaa'), 'a', 'aaaaaaaaaaaa')",
            "over the limit"},
       }) {
    auto e = Expression::compile(c.text);
    ASSERT_TRUE(e.ok()) << c.text << ": " << e.error().message();
    auto v = e->evaluate(input);
    ASSERT_FALSE(v.ok()) << c.text;
    EXPECT_EQ(v.error().code(), ErrorCode::kRuntime);
    EXPECT_NE(v.error().message().find(c.fragment), std::string::npos) << c.text << ": " << v.error().message();
  }
  // At the limit exactly, it works.
  auto at = Expression::compile("CHAR_LENGTH(LPAD('', 16777216, 'x'))");
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(*at->evaluate(input), Value(16777216));
}

TEST(ExpressionTest, CompileErrorResultForm) {
  auto e = Expression::compile("amount >");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), ErrorCode::kConfiguration);
  EXPECT_EQ(e.error().message(),
            "expression 'amount >': at offset 8: unexpected end of the expression, expected a value");
}

TEST(ExpressionTest, ConstantFoldingKeepsRuntimeErrorsAtRuntime) {
  // 1 + 'a' cannot be folded; it compiles and fails when evaluated, like any other type error.
  auto e = Expression::compile("CASE WHEN amount > 1000 THEN 1 + 'a' ELSE 0 END");
  ASSERT_TRUE(e.ok());
  auto v = e->evaluate(event());
  ASSERT_TRUE(v.ok()) << v.error().message();
  EXPECT_EQ(*v, Value(0));
}

TEST(ExpressionTest, EmptyExpressionEvaluatesToAnError) {
  Expression e;
  auto v = e.evaluate(event());
  EXPECT_FALSE(v.ok());
}

TEST(ExpressionTest, ConcurrentEvaluation) {
  auto e = Expression::compile(
      "CASE WHEN amount > 100 THEN UPPER(TRIM(name)) || '-' || REGEXP_REPLACE(email, '@.*', '') END");
  ASSERT_TRUE(e.ok());
  const Value input = event();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto v = e->evaluate(input);
        if (!v.ok() || *v != Value("ALICE-alice")) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads)
    th.join();
  for (int m : mismatches)
    EXPECT_EQ(m, 0);
}

TEST(ProjectionTest, StarNamesAndValues) {
  auto p = Projection::compile("*, UPPER(TRIM(name)) AS name_upper, after.amount, amount * 2 AS doubled");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->names(), (std::vector<std::string>{"*", "name_upper", "amount", "doubled"}));
  auto v = p->evaluate(event());
  ASSERT_TRUE(v.ok()) << v.error().message();
  const Value::Object& o = v->as_object();
  ASSERT_EQ(o.size(), 8u);
  EXPECT_EQ(o.field_at(0).first, "op");
  EXPECT_EQ(o.field_at(4).first, "source");
  EXPECT_EQ(*v->find("name_upper"), Value("ALICE"));
  EXPECT_EQ(*v->find("amount"), Value(150));
  EXPECT_EQ(*v->find("doubled"), Value(300));
}

TEST(ProjectionTest, CommasInsideCallsAndStringsAndQuotedNames) {
  auto p = Projection::compile(
      "id, `weird name`, CONCAT(TRIM(name), ',', 'x') AS c, amount IN (1, 150) AS `in list`, "
      "customer.city AS 'city'");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->names(), (std::vector<std::string>{"id", "weird name", "c", "in list", "city"}));
  auto v = p->evaluate(event());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->to_json(), R"({"id":7,"weird name":"w","c":"Alice,x","in list":true,"city":"Paris"})");
}

TEST(ProjectionTest, StarOverriddenByAnItem) {
  auto p = Projection::compile("*, 'x' AS op");
  ASSERT_TRUE(p.ok());
  auto v = p->evaluate(event());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->as_object().field_at(0).first, "op");
  EXPECT_EQ(v->as_object().field_at(0).second, Value("x"));
  EXPECT_EQ(v->size(), 5u);
}

TEST(ProjectionTest, StarOverNonObjectAddsNothing) {
  auto p = Projection::compile("*, 1 AS one");
  ASSERT_TRUE(p.ok());
  auto v = p->evaluate(Value(5));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->to_json(), R"({"one":1})");
}

TEST(ProjectionTest, CompileErrors) {
  struct ErrorCase {
    const char* text;
    size_t offset;
    const char* fragment;
  };
  const std::vector<ErrorCase> cases = {
      {"", 0, "empty projection"},
      {"id, amount + 1", 4, "projection item 'amount + 1' needs a name: write 'amount + 1 AS <name>'"},
      {"tags[0]", 0, "needs a name"},
      {"id, id", 4, "duplicate output name 'id'"},
      {"id, amount AS id", 4, "duplicate output name 'id'"},
      {"id,, x", 3, "unexpected token ','"},
      {"id x", 3, "expected ',' or the end of the projection"},
      {"id AS 1", 6, "expected a name after AS"},
      {"UPPER(name, 1) AS n", 0, "UPPER takes 1 argument"},
      {"id, NOW() AS t", 4, "non-deterministic"},
  };
  for (const ErrorCase& c : cases) {
    Projection out;
    ExpressionError error;
    EXPECT_FALSE(Projection::compile(c.text, &out, &error)) << c.text;
    EXPECT_EQ(error.offset, c.offset) << c.text << ": " << error.message;
    EXPECT_NE(error.message.find(c.fragment), std::string::npos) << c.text << ": " << error.message;
  }
  auto r = Projection::compile("id, amount + 1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kConfiguration);
  EXPECT_EQ(r.error().message().rfind("expression 'id, amount + 1': at offset 4: ", 0), 0u) << r.error().message();
}

TEST(ProjectionTest, RuntimeErrorNamesTheItem) {
  auto p = Projection::compile("id, name + 1 AS bad");
  ASSERT_TRUE(p.ok());
  auto v = p->evaluate(event());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code(), ErrorCode::kRuntime);
  EXPECT_EQ(v.error().message().rfind("projection item 'bad': expression 'name + 1': ", 0), 0u) << v.error().message();
}

}  // namespace
}  // namespace sluice::pipeline
