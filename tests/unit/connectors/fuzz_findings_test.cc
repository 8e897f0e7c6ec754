// Regression tests for what the fuzz targets of tests/fuzz/ found (issue 14); their inputs are also in the seed
// corpora, so the short CI runs replay them.
#include <bson/bson.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/mongodb/bson_value.h"

namespace sluice {
namespace {

// change_event_fuzz: a negative txn_id read back as "unknown" (-1) after to_value() (which omits -1).
TEST(FuzzFindingsTest, ChangeEventNegativeTransactionIdIsAnErrorNotSilentlyUnknown) {
  auto envelope = [](const std::string& txn) {
    return Value::from_json(
               R"({"op":"c","key":{"id":1},"before":null,"after":{"id":1},"source":{"connector":"postgres",)"
               R"("db":"d","collection":"public.t","position":"0/1","ts_ms":1,"snapshot":false)" +
               txn + "}}")
        .value_or_throw();
  };
  Result<cdc::ChangeEvent> bad = cdc::ChangeEvent::from_value(envelope(R"(,"txn_id":-42)"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kSerialization);
  EXPECT_NE(bad.error().message().find("source.txn_id"), std::string::npos) << bad.error().message();
  for (const std::string& txn : {std::string(), std::string(R"(,"txn_id":-1)"), std::string(R"(,"txn_id":742)")}) {
    Result<cdc::ChangeEvent> e = cdc::ChangeEvent::from_value(envelope(txn));
    ASSERT_TRUE(e.ok()) << txn << ": " << e.error().message();
    Result<cdc::ChangeEvent> again = cdc::ChangeEvent::from_value(e->to_value());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *e) << txn;
  }
}

// bson_value_fuzz: a Decimal128 whose coefficient is over 34 digits (non-canonical) read as a 35-digit decimal that
// no Decimal128 can write back.
TEST(FuzzFindingsTest, NonCanonicalDecimal128IsAnError) {
  bson_t doc = BSON_INITIALIZER;
  bson_decimal128_t dec;
  dec.high = (uint64_t{6176} << 49) | ((uint64_t{1} << 49) - 1);  // exponent 0, coefficient 2^113 - 1
  dec.low = ~uint64_t{0};
  ASSERT_TRUE(bson_append_decimal128(&doc, "d", -1, &dec));
  Result<Value> v = mongodb::bson_to_value(doc);
  bson_destroy(&doc);
  ASSERT_FALSE(v.ok()) << v->to_json();
  EXPECT_EQ(v.error().code(), ErrorCode::kSerialization);
  EXPECT_NE(v.error().message().find("not canonical"), std::string::npos) << v.error().message();
  // The largest canonical coefficient still reads.
  bson_t ok = BSON_INITIALIZER;
  ASSERT_TRUE(bson_decimal128_from_string("9999999999999999999999999999999999", &dec));
  ASSERT_TRUE(bson_append_decimal128(&ok, "d", -1, &dec));
  Result<Value> nines = mongodb::bson_to_value(ok);
  bson_destroy(&ok);
  ASSERT_TRUE(nines.ok()) << nines.error().message();
  EXPECT_EQ(nines->find("d")->to_json(), "9999999999999999999999999999999999");
}

// bson_value_fuzz, again: a coefficient of 35 digits (0x1fffe... above 10^34) that libbson printed as 34 digits and
// a larger exponent (E+6112), so the digit count looked canonical and the value could not be written back.
TEST(FuzzFindingsTest, NonCanonicalDecimal128IsDecidedFromItsBitsNotFromItsText) {
  bson_decimal128_t dec;
  dec.high = 0xdffffffe00000000;
  dec.low = 0x16;
  bson_t doc = BSON_INITIALIZER;
  ASSERT_TRUE(bson_append_decimal128(&doc, "dec", -1, &dec));
  Result<Value> v = mongodb::bson_to_value(doc);
  bson_destroy(&doc);
  ASSERT_FALSE(v.ok()) << v->to_json();
  EXPECT_EQ(v.error().code(), ErrorCode::kSerialization);
  EXPECT_NE(v.error().message().find("not canonical"), std::string::npos) << v.error().message();
  // The "11" combination form of a finite number is non-canonical too (its implied coefficient is >= 2^113).
  dec.high = (uint64_t{0x3} << 61) | (uint64_t{6176} << 47);
  dec.low = 1;
  bson_t eleven = BSON_INITIALIZER;
  ASSERT_TRUE(bson_append_decimal128(&eleven, "d", -1, &dec));
  Result<Value> e = mongodb::bson_to_value(eleven);
  bson_destroy(&eleven);
  EXPECT_FALSE(e.ok()) << e->to_json();
  // Canonical values at the edges of the exponent range read and write back exactly.
  for (const char* text :
       {"10E+6111", "9999999999999999999999999999999999E+6111", "1E-6176", "-0E+6111", "NaN", "-Infinity"}) {
    ASSERT_TRUE(bson_decimal128_from_string(text, &dec)) << text;
    bson_t edge = BSON_INITIALIZER;
    ASSERT_TRUE(bson_append_decimal128(&edge, "d", -1, &dec));
    Result<Value> r = mongodb::bson_to_value(edge);
    ASSERT_TRUE(r.ok()) << text << ": " << r.error().message();
    Result<std::string> back = mongodb::value_to_bson(*r);
    ASSERT_TRUE(back.ok()) << text << ": " << back.error().message();
    EXPECT_EQ(*back, std::string(reinterpret_cast<const char*>(bson_get_data(&edge)), edge.len)) << text;
    bson_destroy(&edge);
  }
}

// bson_value_fuzz: a DBPointer whose namespace (a length-prefixed BSON string) holds a NUL was written back through
// bson_append_dbpointer, which takes a C string, so the namespace was cut at the NUL.
TEST(FuzzFindingsTest, DbPointerNamespaceWithANulIsWrittenBackWhole) {
  const std::string ns("db\0coll", 7);
  std::string element;
  element += '\x0c';  // DBPointer
  element += std::string("p\0", 2);
  const auto len = static_cast<int32_t>(ns.size() + 1);
  element.append(reinterpret_cast<const char*>(&len), 4);
  element += ns;
  element += '\0';
  for (int i = 0; i < 12; ++i)
    element += static_cast<char>(i);
  std::string doc;
  const auto total = static_cast<int32_t>(4 + element.size() + 1);
  doc.append(reinterpret_cast<const char*>(&total), 4);
  doc += element;
  doc += '\0';
  Result<Value> v = mongodb::bson_to_value(reinterpret_cast<const uint8_t*>(doc.data()), doc.size());
  ASSERT_TRUE(v.ok()) << v.error().message();
  const Value* ref = v->find("p")->find("$dbPointer")->find("$ref");
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(ref->as_string(), ns);
  Result<std::string> back = mongodb::value_to_bson(*v);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, doc);
  // A namespace that is not UTF-8 is refused as any other BSON string is.
  std::string bad = doc;
  bad[bad.find("db") + 3] = static_cast<char>(0xff);
  Result<Value> refused = mongodb::bson_to_value(reinterpret_cast<const uint8_t*>(bad.data()), bad.size());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kSerialization);
}

}  // namespace
}  // namespace sluice
