#include "sluice/core/json_mapping.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/core/value.h"

namespace shop {

enum class Status : uint8_t { kPending = 1, kPaid = 2 };

struct Customer {
  std::string id;
  std::string name;
  std::optional<std::string> email;
  friend bool operator==(const Customer&, const Customer&) = default;
};
SLUICE_FIELDS(Customer, id, name, email);

struct Item {
  std::string sku;
  int32_t quantity = 0;
  double price = 0;
  friend bool operator==(const Item&, const Item&) = default;
};
SLUICE_FIELDS(Item, sku, quantity, price);

struct Order {
  std::string id;
  Customer customer;
  std::vector<Item> items;
  std::optional<int64_t> coupon;
  Status status = Status::kPending;
  bool gift = false;
  std::map<std::string, std::string> tags;
  std::array<int16_t, 2> dims{};
  std::pair<std::string, int64_t> origin;
  std::tuple<int, std::string, bool> extra;
  sluice::Value meta;
  float ratio = 0;
  uint64_t big = 0;
  friend bool operator==(const Order&, const Order&) = default;
};
SLUICE_FIELDS(Order, id, customer, items, coupon, status, gift, tags, dims, origin, extra, meta, ratio, big);

struct WithDefaults {
  std::string name = "unnamed";
  int64_t count = 7;
};
SLUICE_FIELDS(WithDefaults, name, count);

}  // namespace shop

namespace sluice {
namespace {

using shop::Customer;
using shop::Item;
using shop::Order;

Order sample_order() {
  Order o;
  o.id = "o-1";
  o.customer = Customer{"c-9", "Zoë \"Z\" Müller\n", std::nullopt};
  o.items = {Item{"sku-1", 2, 9.99}, Item{"sku-2", 1, 0.1}};
  o.coupon = 42;
  o.status = shop::Status::kPaid;
  o.gift = true;
  o.tags = {{"channel", "web"}, {"region", "eu"}};
  o.dims = {3, -4};
  o.origin = {"berlin", 10115};
  o.extra = {7, "x", false};
  o.meta = Value::object({{"source", "api"}, {"retries", 2}});
  o.ratio = 0.25F;
  o.big = std::numeric_limits<uint64_t>::max();
  return o;
}

TEST(JsonMappingTest, StructWritesMembersInDeclarationOrder) {
  EXPECT_EQ(to_json(sample_order()),
            R"({"id":"o-1","customer":{"id":"c-9","name":"Zoë \"Z\" Müller\n","email":null},)"
            R"("items":[{"sku":"sku-1","quantity":2,"price":9.99},{"sku":"sku-2","quantity":1,"price":0.1}],)"
            R"("coupon":42,"status":2,"gift":true,"tags":{"channel":"web","region":"eu"},"dims":[3,-4],)"
            R"("origin":["berlin",10115],"extra":[7,"x",false],"meta":{"source":"api","retries":2},)"
            R"("ratio":0.25,"big":18446744073709551615})");
}

TEST(JsonMappingTest, NestedStructRoundTrips) {
  const Order in = sample_order();
  Order out;
  Status st = from_json(to_json(in), out);
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  EXPECT_EQ(out, in);
}

TEST(JsonMappingTest, RoundTripsThroughValue) {
  const Order in = sample_order();
  Result<Value> v = Value::from_json(to_json(in));
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_EQ(v->at_path("items[1].sku")->as_string(), "sku-2");
  Order out;
  ASSERT_TRUE(from_value(*v, out).ok());
  EXPECT_EQ(out, in);
}

TEST(JsonMappingTest, Scalars) {
  EXPECT_EQ(to_json(true), "true");
  EXPECT_EQ(to_json(int8_t{-5}), "-5");
  EXPECT_EQ(to_json(std::numeric_limits<int64_t>::min()), "-9223372036854775808");
  EXPECT_EQ(to_json(0.1), "0.1");
  EXPECT_EQ(to_json(3.0), "3.0");
  EXPECT_EQ(to_json(1e300), "1e+300");
  EXPECT_EQ(to_json(0.1F), "0.1");
  EXPECT_EQ(to_json(std::nan("")), "\"NaN\"");
  EXPECT_EQ(to_json(-std::numeric_limits<double>::infinity()), "\"-Infinity\"");
  EXPECT_EQ(to_json(std::numeric_limits<float>::infinity()), "\"Infinity\"");
  EXPECT_EQ(to_json(std::vector<double>{1.5, std::nan("")}), Value::array({Value(1.5), Value(std::nan(""))}).to_json());
  EXPECT_EQ(to_json(std::string("tab\there")), R"("tab\there")");
  EXPECT_EQ(to_json(std::string("\x01")), R"("\u0001")");
  EXPECT_EQ(to_json("literal"), R"("literal")");
  EXPECT_EQ(to_json(std::optional<int>{}), "null");
  EXPECT_EQ(to_json(std::set<int>{3, 1}), "[1,3]");
  EXPECT_EQ(to_json(std::vector<bool>{true, false}), "[true,false]");
  EXPECT_EQ(to_json(std::vector<std::vector<int>>{{1}, {}}), "[[1],[]]");
}

TEST(JsonMappingTest, StringEscapingMatchesValue) {
  const std::vector<std::string> cases = {"plain", "q\"b\\", "\b\f\n\r\t\x1f", "é€𝄞", "bad \xff utf8", "\xc3"};
  for (const std::string& s : cases) {
    EXPECT_EQ(to_json(s), Value::string(s).to_json()) << s;
    std::string back;
    ASSERT_TRUE(from_json(to_json(s), back).ok()) << s;
  }
}

TEST(JsonMappingTest, DoublesRoundTripExactly) {
  for (double d : {0.1, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, -0.0, 123456789.125}) {
    double back = 0;
    ASSERT_TRUE(from_json(to_json(d), back).ok());
    EXPECT_EQ(back, d);
    EXPECT_EQ(std::signbit(back), std::signbit(d));
  }
  double nan_back = 0;
  ASSERT_TRUE(from_json(to_json(std::nan("")), nan_back).ok());
  EXPECT_TRUE(std::isnan(nan_back));
  // ±infinity came back as NaN when they were written as null.
  for (double d : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    double back = 0;
    ASSERT_TRUE(from_json(to_json(d), back).ok()) << to_json(d);
    EXPECT_EQ(back, d);
  }
  float f = 0;
  ASSERT_TRUE(from_json(to_json(-std::numeric_limits<float>::infinity()), f).ok());
  EXPECT_EQ(f, -std::numeric_limits<float>::infinity());
  // null still reads as NaN (what earlier releases wrote); other strings are errors.
  ASSERT_TRUE(from_json("null", nan_back).ok());
  EXPECT_TRUE(std::isnan(nan_back));
  EXPECT_FALSE(from_json("\"inf\"", nan_back).ok());
}

TEST(JsonMappingTest, Int64AcceptedForDoubles) {
  Item item;
  ASSERT_TRUE(from_json(R"({"sku":"a","quantity":1,"price":5})", item).ok());
  EXPECT_EQ(item.price, 5.0);
}

TEST(JsonMappingTest, MissingFieldsKeepDefaultsAndUnknownFieldsAreIgnored) {
  shop::WithDefaults w;
  ASSERT_TRUE(from_json(R"({"count":3,"unknown":{"deep":[1,2]}})", w).ok());
  EXPECT_EQ(w.name, "unnamed");
  EXPECT_EQ(w.count, 3);
}

TEST(JsonMappingTest, MapsWithStringKeys) {
  std::unordered_map<std::string, std::vector<int>> m;
  ASSERT_TRUE(from_json(R"({"a":[1,2],"b":[]})", m).ok());
  EXPECT_EQ(m.size(), 2U);
  EXPECT_EQ(m["a"], (std::vector<int>{1, 2}));
  std::map<std::string, int> sorted{{"b", 2}, {"a", 1}};
  EXPECT_EQ(to_json(sorted), R"({"a":1,"b":2})");
}

TEST(JsonMappingTest, WrongTypeNamesTheFieldPathAndKinds) {
  Order o;
  Status st = from_json(R"({"id":"o","customer":{"id":42}})", o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kSerialization);
  EXPECT_EQ(st.error().message(), "field 'customer.id': expected string, found int64 42");
}

TEST(JsonMappingTest, ErrorPathIncludesArrayIndexes) {
  Order o;
  Status st = from_json(R"({"items":[{"sku":"a"},{"sku":"b","quantity":"two"}]})", o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), R"(field 'items[1].quantity': expected integer, found string "two")");
}

TEST(JsonMappingTest, ErrorPathQuotesKeysWithDots) {
  std::map<std::string, int> m;
  Status st = from_json(R"({"a.b":"x"})", m);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), R"(field '["a.b"]': expected integer, found string "x")");
}

TEST(JsonMappingTest, TopLevelMismatch) {
  Order o;
  Status st = from_json("[1,2]", o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "JSON value: expected object, found array [1,2]");
}

TEST(JsonMappingTest, IntegerRangeIsChecked) {
  int8_t small = 0;
  Status st = from_json("300", small);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "JSON value: 300 is out of range for int8");
  uint32_t u = 0;
  EXPECT_FALSE(from_json("-1", u).ok());
  uint64_t big = 0;
  ASSERT_TRUE(from_json("18446744073709551615", big).ok());
  EXPECT_EQ(big, std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(from_json("18446744073709551616", big).ok());
  int64_t i = 0;
  ASSERT_TRUE(from_json("1E+3", i).ok());  // an integral double
  EXPECT_EQ(i, 1000);
  EXPECT_FALSE(from_json("-92233720368547758080", i).ok());  // a decimal beyond int64
  EXPECT_FALSE(from_json("1e300", i).ok());
  ASSERT_TRUE(from_value(Value(Decimal::parse("12.000").value()), i).ok());  // an integral decimal
  EXPECT_EQ(i, 12);
  st = from_value(Value(Decimal::parse("12.5").value()), i);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "JSON value: expected integer, found decimal 12.5");
  st = from_json("1.5", i);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "JSON value: expected integer, found double 1.5");
}

TEST(JsonMappingTest, NullOnlyForOptionalValueAndFloatingPoint) {
  Customer c;
  Status st = from_json(R"({"id":null})", c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "field 'id': expected string, found null");
  c.email = "old@example.com";
  ASSERT_TRUE(from_json(R"({"id":"c","email":null})", c).ok());
  EXPECT_FALSE(c.email.has_value());
}

TEST(JsonMappingTest, FixedSizeContainersNeedTheExactSize) {
  std::array<int, 3> a{};
  Status st = from_json("[1,2]", a);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "JSON value: expected array of 3 elements, found array [1,2]");
  std::pair<int, std::string> p;
  EXPECT_FALSE(from_json(R"([1,"a",2])", p).ok());
  ASSERT_TRUE(from_json(R"([1,"a"])", p).ok());
  EXPECT_EQ(p, (std::pair<int, std::string>{1, "a"}));
}

TEST(JsonMappingTest, VectorElementsStartFromDefaults) {
  std::vector<shop::WithDefaults> v(2);
  v[0].name = "stale";
  ASSERT_TRUE(from_json(R"([{"count":1}])", v).ok());
  ASSERT_EQ(v.size(), 1U);
  EXPECT_EQ(v[0].name, "unnamed");
}

TEST(JsonMappingTest, ParseErrorsPassThrough) {
  Customer c;
  Status st = from_json(R"({"id":)", c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kSerialization);
}

TEST(JsonMappingTest, ValueReadsAnything) {
  Value v;
  ASSERT_TRUE(from_json(R"({"a":[1,"x",null]})", v).ok());
  EXPECT_EQ(v.to_json(), R"({"a":[1,"x",null]})");
  EXPECT_EQ(to_json(v), v.to_json());
}

TEST(JsonMappingTest, DisplayString) {
  EXPECT_EQ(to_display_string(std::string("hello \"world\"")), "hello \"world\"");
  EXPECT_EQ(to_display_string("literal"), "literal");
  EXPECT_EQ(to_display_string(int64_t{-12}), "-12");
  EXPECT_EQ(to_display_string(2.5), "2.5");
  EXPECT_EQ(to_display_string(std::nan("")), "NaN");
  EXPECT_EQ(to_display_string(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(to_display_string(false), "false");
  EXPECT_EQ(to_display_string(Value("s")), R"("s")");
  EXPECT_EQ(to_display_string(std::vector<std::string>{"a"}), R"(["a"])");
  EXPECT_EQ(to_display_string(Item{"x", 1, 2.0}), R"({"sku":"x","quantity":1,"price":2.0})");
}

static_assert(JsonMappable<Order>);
static_assert(JsonMappable<std::map<std::string, std::vector<Value>>>);
static_assert(!JsonMappable<std::map<int, int>>);
static_assert(!JsonMappable<long double>);

}  // namespace
}  // namespace sluice
