#include "sluice/core/type_serializer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/core/data_io.h"
#include "sluice/core/error.h"

namespace shop {

enum class Status : uint8_t { kPending = 1, kPaid = 2, kRefunded = 3 };

struct Charge {
  std::string id, customer;
  Status status = Status::kPending;
  int64_t amount_cents = 0;
  int64_t ts_ms = 0;
  friend bool operator==(const Charge&, const Charge&) = default;
};
SLUICE_FIELDS(Charge, id, customer, status, amount_cents, ts_ms);

struct Address {
  std::string street;
  std::optional<std::string> zip;
  friend bool operator==(const Address&, const Address&) = default;
};
SLUICE_FIELDS(Address, street, zip);

// Twelve members of every kind, to exercise the macro's longer expansions and nesting.
struct Customer {
  int32_t id = 0;
  std::string name;
  bool active = false;
  double score = 0;
  uint16_t region = 0;
  std::vector<std::string> tags;
  std::optional<Address> address;
  std::map<std::string, int64_t> counters;
  std::variant<std::monostate, int64_t, std::string> external_ref;
  std::array<float, 3> embedding{};
  std::vector<Charge> charges;
  std::pair<int8_t, char> grade{};
  friend bool operator==(const Customer&, const Customer&) = default;
};
SLUICE_FIELDS(Customer, id, name, active, score, region, tags, address, counters, external_ref, embedding, charges,
              grade);

// Recursive through a vector (allowed for incomplete element types since C++17).
struct TreeNode {
  std::string label;
  std::vector<TreeNode> children;
  friend bool operator==(const TreeNode&, const TreeNode&) = default;
};
SLUICE_FIELDS(TreeNode, label, children);

struct Wide {
  int8_t f1 = 0, f2 = 0, f3 = 0, f4 = 0, f5 = 0, f6 = 0, f7 = 0, f8 = 0;
  int8_t f9 = 0, f10 = 0, f11 = 0, f12 = 0, f13 = 0, f14 = 0, f15 = 0, f16 = 0, f17 = 0;
  friend bool operator==(const Wide&, const Wide&) = default;
};
SLUICE_FIELDS(Wide, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17);

}  // namespace shop

namespace sluice {
namespace {

struct NoFields {
  int x = 0;
};

struct Base {
  int32_t a = 0;
};
SLUICE_FIELDS(Base, a);
struct Derived : Base {
  int32_t b = 0;
};

// Copying throws, which leaves a variant that tries to hold one valueless.
struct Bomb {
  int32_t x = 0;
  Bomb() = default;
  Bomb(const Bomb&) { throw 1; }
  Bomb& operator=(const Bomb&) = default;
};
SLUICE_FIELDS(Bomb, x);

// ---- compile-time contract --------------------------------------------------------------------------------

static_assert(Serializable<int32_t> && Serializable<double> && Serializable<bool> && Serializable<std::string>);
static_assert(Serializable<shop::Status> && Serializable<std::byte>);
static_assert(Serializable<std::vector<std::optional<shop::Charge>>>);
static_assert(Serializable<std::map<std::string, std::vector<int>>>);
static_assert(Serializable<std::variant<std::monostate, shop::Charge>>);
static_assert(Serializable<std::tuple<>> && Serializable<std::array<int, 0>>);
static_assert(Serializable<shop::Customer> && Serializable<shop::TreeNode>);
static_assert(!Serializable<NoFields>);
static_assert(!Serializable<std::vector<NoFields>>);
static_assert(!Serializable<std::optional<NoFields>>);
static_assert(!Serializable<std::map<std::string, NoFields>>);
static_assert(!Serializable<std::variant<int, NoFields>>);
static_assert(!Serializable<std::pair<NoFields, int>>);
static_assert(!Serializable<long double>);
static_assert(!Serializable<int*>);
static_assert(!Serializable<void>);
static_assert(!Serializable<int&>);
static_assert(!Serializable<Derived>, "a derived struct must not inherit its base's field list");

static_assert(kFieldCount<shop::Charge> == 5);
static_assert(kFieldCount<shop::Customer> == 12);
static_assert(kFieldCount<shop::Wide> == 17);
static_assert(std::get<0>(kFieldsOf<shop::Charge>).name == "id");
static_assert(std::get<0>(kFieldsOf<shop::Charge>).pointer == &shop::Charge::id);
static_assert(std::get<4>(kFieldsOf<shop::Charge>).name == "ts_ms");
static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::get<2>(kFieldsOf<shop::Charge>))>,
                             Field<shop::Charge, shop::Status>>);
static_assert(field_names<shop::Address>() == std::array<std::string_view, 2>{"street", "zip"});

// ---- helpers ----------------------------------------------------------------------------------------------

template <class T>
std::vector<uint8_t> bytes_of(const T& value) {
  DataOutput out;
  serialize(value, out);
  return {out.data(), out.data() + out.size()};
}

template <class T>
T round_trip(const T& value) {
  DataOutput out;
  serialize(value, out);
  DataInput in(out.bytes());
  T result{};
  deserialize(result, in);
  EXPECT_TRUE(in.at_end()) << "trailing bytes after decoding";
  return result;
}

template <class T>
void expect_round_trip(const T& value) {
  EXPECT_EQ(round_trip(value), value);
}

template <class T>
void expect_serialization_error(std::vector<uint8_t> bytes) {
  DataInput in(std::span<const uint8_t>(bytes.data(), bytes.size()));
  T target{};
  try {
    deserialize(target, in);
    ADD_FAILURE() << "decoding corrupt input did not throw";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kSerialization) << e.what();
  }
}

shop::Customer sample_customer() {
  shop::Customer c;
  c.id = -17;
  c.name = "Ada Lovelace";
  c.active = true;
  c.score = 98.25;
  c.region = 40000;
  c.tags = {"vip", "", "beta"};
  c.address = shop::Address{"1 Analytical Way", "EC1"};
  c.counters = {{"logins", 12}, {"refunds", -1}};
  c.external_ref = std::string("crm-991");
  c.embedding = {0.5f, -1.25f, 3.0f};
  c.charges = {{"ch_1", "cus_1", shop::Status::kPaid, 1999, 1700000000000},
               {"ch_2", "cus_1", shop::Status::kRefunded, -500, 1700000000500}};
  c.grade = {-3, 'B'};
  return c;
}

// ---- exact bytes ------------------------------------------------------------------------------------------

TEST(TypeSerializerTest, ExactBytesOfScalars) {
  EXPECT_THAT(bytes_of(int32_t{1}), ::testing::ElementsAre(0x01, 0x00, 0x00, 0x00));
  EXPECT_THAT(bytes_of(int16_t{-2}), ::testing::ElementsAre(0xFE, 0xFF));
  EXPECT_THAT(bytes_of(uint64_t{0x0102030405060708}),
              ::testing::ElementsAre(0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01));
  EXPECT_THAT(bytes_of(1.0), ::testing::ElementsAre(0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF0, 0x3F));
  EXPECT_THAT(bytes_of(true), ::testing::ElementsAre(0x01));
  EXPECT_THAT(bytes_of(false), ::testing::ElementsAre(0x00));
  EXPECT_THAT(bytes_of(shop::Status::kRefunded), ::testing::ElementsAre(0x03));
}

TEST(TypeSerializerTest, ExactBytesOfVarintsAndStrings) {
  DataOutput out;
  out.write_varint(300);
  EXPECT_THAT(std::vector<uint8_t>(out.data(), out.data() + out.size()), ::testing::ElementsAre(0xAC, 0x02));
  out.clear();
  out.write_signed_varint(-1);
  out.write_signed_varint(1);
  EXPECT_THAT(std::vector<uint8_t>(out.data(), out.data() + out.size()), ::testing::ElementsAre(0x01, 0x02));

  EXPECT_THAT(bytes_of(std::string("ab")), ::testing::ElementsAre(0x02, 0x61, 0x62));
  EXPECT_THAT(bytes_of(std::string()), ::testing::ElementsAre(0x00));
  std::vector<uint8_t> long_string = bytes_of(std::string(300, 'x'));
  ASSERT_EQ(long_string.size(), 302u);
  EXPECT_EQ(long_string[0], 0xAC);
  EXPECT_EQ(long_string[1], 0x02);
}

TEST(TypeSerializerTest, ExactBytesOfContainers) {
  EXPECT_THAT(bytes_of(std::optional<int32_t>()), ::testing::ElementsAre(0x00));
  EXPECT_THAT(bytes_of(std::optional<int16_t>(5)), ::testing::ElementsAre(0x01, 0x05, 0x00));
  EXPECT_THAT(bytes_of(std::vector<int32_t>{1, 2}),
              ::testing::ElementsAre(0x02, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00));
  EXPECT_THAT(bytes_of(std::vector<bool>{true, false, true}), ::testing::ElementsAre(0x03, 0x01, 0x00, 0x01));
  EXPECT_THAT(bytes_of(std::vector<std::string>{"a", ""}), ::testing::ElementsAre(0x02, 0x01, 0x61, 0x00));
  EXPECT_THAT(bytes_of(std::array<uint16_t, 2>{1, 2}), ::testing::ElementsAre(0x01, 0x00, 0x02, 0x00));
  EXPECT_THAT(bytes_of(std::map<std::string, int8_t>{{"b", 2}, {"a", 1}}),
              ::testing::ElementsAre(0x02, 0x01, 0x61, 0x01, 0x01, 0x62, 0x02));
  EXPECT_THAT(bytes_of(std::pair<int8_t, std::string>{7, "z"}), ::testing::ElementsAre(0x07, 0x01, 0x7A));
  EXPECT_THAT(bytes_of(std::tuple<uint8_t, bool, int8_t>{9, true, -1}), ::testing::ElementsAre(0x09, 0x01, 0xFF));
  EXPECT_THAT(bytes_of(std::variant<int32_t, std::string>(std::string("x"))), ::testing::ElementsAre(0x01, 0x01, 0x78));
  EXPECT_THAT(bytes_of(std::variant<std::monostate, int8_t>()), ::testing::ElementsAre(0x00));
  EXPECT_TRUE(bytes_of(std::tuple<>()).empty());
}

TEST(TypeSerializerTest, ExactBytesOfStructAreMembersInOrderWithoutNames) {
  shop::Charge c{"c1", "u", shop::Status::kPaid, 258, -1};
  EXPECT_THAT(bytes_of(c), ::testing::ElementsAre(0x02, 0x63, 0x31,                                  // id
                                                  0x01, 0x75,                                        // customer
                                                  0x02,                                              // status
                                                  0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,    // amount_cents
                                                  0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF));  // ts_ms
}

TEST(TypeSerializerTest, BulkCopiedVectorsMatchElementWiseEncoding) {
  std::vector<int64_t> v = {1, -2, std::numeric_limits<int64_t>::min(), 42};
  DataOutput manual;
  manual.write_varint(v.size());
  for (int64_t x : v)
    serialize(x, manual);
  EXPECT_EQ(bytes_of(v), std::vector<uint8_t>(manual.data(), manual.data() + manual.size()));

  std::vector<shop::Status> statuses = {shop::Status::kPaid, shop::Status::kPending};
  EXPECT_THAT(bytes_of(statuses), ::testing::ElementsAre(0x02, 0x02, 0x01));
}

// ---- round trips ------------------------------------------------------------------------------------------

TEST(TypeSerializerTest, RoundTripsScalars) {
  expect_round_trip(int8_t{-128});
  expect_round_trip(uint8_t{255});
  expect_round_trip(int16_t{-12345});
  expect_round_trip(uint16_t{65535});
  expect_round_trip(std::numeric_limits<int32_t>::min());
  expect_round_trip(std::numeric_limits<uint32_t>::max());
  expect_round_trip(std::numeric_limits<int64_t>::min());
  expect_round_trip(std::numeric_limits<uint64_t>::max());
  expect_round_trip(3.5f);
  expect_round_trip(-0.0);
  expect_round_trip(std::numeric_limits<double>::infinity());
  expect_round_trip('q');
  expect_round_trip(true);
  expect_round_trip(false);
  expect_round_trip(shop::Status::kRefunded);
  expect_round_trip(std::byte{0xAB});
  EXPECT_TRUE(std::isnan(round_trip(std::numeric_limits<double>::quiet_NaN())));
}

TEST(TypeSerializerTest, RoundTripsStringsAndSequences) {
  expect_round_trip(std::string());
  expect_round_trip(std::string("hello, sluice"));
  expect_round_trip(std::string("\0binary\xff", 8));
  expect_round_trip(std::string(100000, 'k'));
  expect_round_trip(std::vector<int32_t>{});
  expect_round_trip(std::vector<int32_t>{1, -1, 7});
  expect_round_trip(std::vector<uint8_t>{0, 1, 254, 255});
  expect_round_trip(std::vector<std::byte>{std::byte{1}, std::byte{2}});
  expect_round_trip(std::vector<double>{1.5, -2.25});
  expect_round_trip(std::vector<bool>{true, false, false, true, true});
  expect_round_trip(std::vector<std::string>{"a", "", "ccc"});
  expect_round_trip(std::vector<std::vector<int16_t>>{{1, 2}, {}, {3}});
  expect_round_trip(std::array<int32_t, 4>{1, 2, 3, 4});
  expect_round_trip(std::array<std::string, 2>{"x", "yy"});
  expect_round_trip(std::array<std::array<float, 2>, 2>{{{1.f, 2.f}, {3.f, 4.f}}});
  expect_round_trip(std::vector<std::array<float, 3>>{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
}

TEST(TypeSerializerTest, RoundTripsOptionalsPairsTuplesVariants) {
  expect_round_trip(std::optional<int64_t>());
  expect_round_trip(std::optional<int64_t>(-9));
  expect_round_trip(std::optional<std::string>("set"));
  expect_round_trip(std::optional<std::optional<bool>>(std::optional<bool>()));
  expect_round_trip(std::pair<std::string, double>{"pi", 3.14159});
  expect_round_trip(std::tuple<>());
  expect_round_trip(std::tuple<int8_t, std::string, std::vector<bool>>{-1, "t", {true}});
  using V = std::variant<std::monostate, int32_t, std::string, shop::Charge>;
  expect_round_trip(V());
  expect_round_trip(V(int32_t{5}));
  expect_round_trip(V(std::string("five")));
  expect_round_trip(V(shop::Charge{"ch", "cu", shop::Status::kPaid, 5, 6}));
  // Duplicate alternative types are told apart by index.
  using Twin = std::variant<int32_t, int32_t>;
  Twin second(std::in_place_index<1>, 8);
  EXPECT_EQ(round_trip(second).index(), 1u);
  EXPECT_EQ(std::get<1>(round_trip(second)), 8);
}

TEST(TypeSerializerTest, RoundTripsMaps) {
  expect_round_trip(std::map<std::string, std::vector<int32_t>>{{"a", {1, 2}}, {"b", {}}, {"c", {3}}});
  expect_round_trip(std::map<int32_t, std::string>{});
  expect_round_trip(std::map<std::pair<int32_t, int32_t>, bool>{{{1, 2}, true}, {{0, 5}, false}});
  std::unordered_map<std::string, std::optional<int64_t>> um;
  for (int i = 0; i < 100; ++i)
    um["k" + std::to_string(i)] = i % 3 == 0 ? std::nullopt : std::optional<int64_t>(i);
  expect_round_trip(um);
}

TEST(TypeSerializerTest, RoundTripsNestedTypes) {
  std::vector<std::optional<shop::Charge>> charges = {shop::Charge{"a", "b", shop::Status::kPaid, 1, 2}, std::nullopt,
                                                      shop::Charge{}};
  expect_round_trip(charges);
  std::map<std::string, std::vector<std::variant<int32_t, shop::Address>>> m = {
      {"home", {shop::Address{"Main St", "12345"}, int32_t{4}}}, {"none", {}}};
  expect_round_trip(m);
}

TEST(TypeSerializerTest, RoundTripsStructWithTwelveMembers) {
  expect_round_trip(sample_customer());
  expect_round_trip(shop::Customer{});
}

TEST(TypeSerializerTest, RoundTripsRecursiveAndWideStructs) {
  shop::TreeNode tree{"root", {{"left", {{"leaf", {}}}}, {"right", {}}}};
  expect_round_trip(tree);
  shop::Wide w{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  std::vector<uint8_t> b = bytes_of(w);
  EXPECT_EQ(b, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  expect_round_trip(w);
}

TEST(TypeSerializerTest, ForEachFieldVisitsNamesAndMembersInOrder) {
  shop::Charge c{"ch_9", "cus_3", shop::Status::kPaid, 100, 5};
  std::vector<std::string> names;
  for_each_field(c, [&](std::string_view name, auto& member) {
    names.emplace_back(name);
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(member)>, int64_t>) member += 1;
  });
  EXPECT_THAT(names, ::testing::ElementsAre("id", "customer", "status", "amount_cents", "ts_ms"));
  EXPECT_EQ(c.amount_cents, 101);
  EXPECT_EQ(c.ts_ms, 6);
  const shop::Charge& cref = c;
  int visited = 0;
  for_each_field(cref, [&](std::string_view, const auto&) { ++visited; });
  EXPECT_EQ(visited, 5);
}

// ---- reuse of the target ----------------------------------------------------------------------------------

TEST(TypeSerializerTest, DeserializationReusesStringCapacity) {
  std::string target;
  target.reserve(1000);
  const char* storage = target.data();
  size_t capacity = target.capacity();
  DataOutput out;
  serialize(std::string("a string longer than the small-string buffer"), out);
  DataInput in(out.bytes());
  deserialize(target, in);
  EXPECT_EQ(target, "a string longer than the small-string buffer");
  EXPECT_EQ(target.capacity(), capacity);
  EXPECT_EQ(target.data(), storage);
}

TEST(TypeSerializerTest, DeserializationReusesNestedStorage) {
  // A vector of strings: the vector's buffer and each kept element's string buffer survive.
  std::vector<std::string> v = {std::string(200, 'a'), std::string(200, 'b'), "gone"};
  const std::string* vbuf = v.data();
  const char* s0 = v[0].data();
  DataOutput out;
  serialize(std::vector<std::string>{"first, but long enough to leave the SSO buffer", "second"}, out);
  DataInput in(out.bytes());
  deserialize(v, in);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], "first, but long enough to leave the SSO buffer");
  EXPECT_EQ(v.data(), vbuf);
  EXPECT_EQ(v[0].data(), s0);

  // A struct: its string members keep their buffers.
  shop::Charge c{std::string(100, 'i'), std::string(100, 'c'), shop::Status::kPending, 0, 0};
  const char* id_buf = c.id.data();
  out.clear();
  serialize(shop::Charge{"ch_0123456789012345678901234567890", "cus", shop::Status::kPaid, 1, 2}, out);
  DataInput in2(out.bytes());
  deserialize(c, in2);
  EXPECT_EQ(c.id, "ch_0123456789012345678901234567890");
  EXPECT_EQ(c.id.data(), id_buf);

  // An engaged optional and the active variant alternative are decoded in place.
  std::optional<std::string> o(std::string(100, 'o'));
  const char* o_buf = o->data();
  out.clear();
  serialize(std::optional<std::string>("replaced in place, long enough for heap"), out);
  DataInput in3(out.bytes());
  deserialize(o, in3);
  EXPECT_EQ(*o, "replaced in place, long enough for heap");
  EXPECT_EQ(o->data(), o_buf);

  std::variant<int32_t, std::string> var(std::string(100, 'v'));
  const char* var_buf = std::get<1>(var).data();
  out.clear();
  serialize(std::variant<int32_t, std::string>(std::string("another long string for the variant")), out);
  DataInput in4(out.bytes());
  deserialize(var, in4);
  EXPECT_EQ(std::get<1>(var), "another long string for the variant");
  EXPECT_EQ(std::get<1>(var).data(), var_buf);
}

TEST(TypeSerializerTest, DeserializationRecyclesMapNodes) {
  std::map<std::string, std::string> m = {{"k1", std::string(100, 'x')}, {"k2", std::string(100, 'y')}};
  std::vector<const char*> old_values = {m["k1"].data(), m["k2"].data()};
  DataOutput out;
  serialize(std::map<std::string, std::string>{{"a", "value a, long enough to need the heap......"},
                                               {"b", "value b, long enough to need the heap......"},
                                               {"c", "c"}},
            out);
  DataInput in(out.bytes());
  deserialize(m, in);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m["a"], "value a, long enough to need the heap......");
  EXPECT_EQ(m["c"], "c");
  // The first two entries were decoded into the recycled nodes, whose value strings kept their buffers.
  EXPECT_THAT(old_values, ::testing::UnorderedElementsAre(m["a"].data(), m["b"].data()));

  std::unordered_map<int32_t, std::vector<int32_t>> um = {{1, {1, 2, 3}}, {2, {4}}};
  DataOutput out2;
  serialize(std::unordered_map<int32_t, std::vector<int32_t>>{{7, {7}}}, out2);
  DataInput in2(out2.bytes());
  deserialize(um, in2);
  EXPECT_EQ(um, (std::unordered_map<int32_t, std::vector<int32_t>>{{7, {7}}}));
}

TEST(TypeSerializerTest, DeserializationShrinksAndClears) {
  std::vector<int32_t> v = {1, 2, 3, 4};
  std::optional<int32_t> o = 5;
  std::map<int32_t, int32_t> m = {{1, 1}};
  DataOutput out;
  serialize(std::vector<int32_t>{9}, out);
  serialize(std::optional<int32_t>(), out);
  serialize(std::map<int32_t, int32_t>(), out);
  DataInput in(out.bytes());
  deserialize(v, in);
  deserialize(o, in);
  deserialize(m, in);
  EXPECT_EQ(v, std::vector<int32_t>{9});
  EXPECT_FALSE(o.has_value());
  EXPECT_TRUE(m.empty());
  EXPECT_TRUE(in.at_end());
}

// ---- corrupt and truncated input --------------------------------------------------------------------------

TEST(TypeSerializerTest, EveryTruncationThrowsSerializationError) {
  std::vector<uint8_t> full = bytes_of(sample_customer());
  for (size_t len = 0; len < full.size(); ++len) {
    SCOPED_TRACE("prefix length " + std::to_string(len));
    expect_serialization_error<shop::Customer>(std::vector<uint8_t>(full.begin(), full.begin() + len));
  }
}

TEST(TypeSerializerTest, CorruptTagsAndIndicesThrow) {
  expect_serialization_error<bool>({0x02});
  expect_serialization_error<std::optional<int8_t>>({0x02, 0x00});
  expect_serialization_error<std::variant<int8_t, bool>>({0x02, 0x00});
  expect_serialization_error<std::vector<bool>>({0x01, 0x07});
  expect_serialization_error<std::map<int8_t, int8_t>>({0x02, 0x01, 0x00, 0x01, 0x00});  // key 1 twice
  expect_serialization_error<std::unordered_map<int8_t, int8_t>>({0x02, 0x01, 0x00, 0x01, 0x00});
  // A varint longer than ten bytes.
  expect_serialization_error<std::string>(std::vector<uint8_t>(11, 0xFF));
}

TEST(TypeSerializerTest, HugeCountsAreRejectedBeforeAllocating) {
  // Count 2^62 followed by a few bytes: must throw, not try to allocate.
  std::vector<uint8_t> huge = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 1, 2, 3};
  expect_serialization_error<std::vector<uint8_t>>(huge);
  expect_serialization_error<std::vector<std::string>>(huge);
  expect_serialization_error<std::vector<bool>>(huge);
  expect_serialization_error<std::vector<std::vector<int32_t>>>(huge);
  expect_serialization_error<std::map<std::string, std::string>>(huge);
  expect_serialization_error<std::unordered_map<int64_t, int64_t>>(huge);
  expect_serialization_error<std::string>(huge);
  // The bound scales with the element size: 3 int32 elements cannot fit in 8 bytes.
  expect_serialization_error<std::vector<int32_t>>({0x03, 1, 0, 0, 0, 2, 0, 0, 0});
  expect_serialization_error<std::map<int64_t, int64_t>>({0x02, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0});
}

TEST(TypeSerializerTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(20240601);  // fixed seed: reproducible
  std::vector<uint8_t> valid = bytes_of(sample_customer());
  int decoded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = valid;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    DataInput in(std::span<const uint8_t>(bytes.data(), bytes.size()));
    shop::Customer target = sample_customer();
    try {
      deserialize(target, in);
      ++decoded;
    } catch (const SluiceException& e) {
      ASSERT_EQ(e.error().code(), ErrorCode::kSerialization);
    }
  }
  EXPECT_GT(decoded, 0);
}

TEST(TypeSerializerTest, ValuelessVariantThrowsOnSerialize) {
  std::variant<int32_t, Bomb> v;
  try {
    v.emplace<1>(Bomb{});
  } catch (int) {
  }
  ASSERT_TRUE(v.valueless_by_exception());
  DataOutput out;
  try {
    serialize(v, out);
    ADD_FAILURE() << "serializing a valueless variant did not throw";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kSerialization);
  }
}

}  // namespace
}  // namespace sluice
