// PgOutputDecoder and decode_text_value on crafted pgoutput messages (protocol version 1, the layouts of
// Postgres' "Logical Replication Message Formats"): every message type, every type mapping, unchanged TOAST,
// numeric precision, and malformed bytes.
#include "sluice/connectors/postgres/pgoutput.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace sluice::postgres {
namespace {

/// Builds one message byte by byte (network byte order).
class Msg {
 public:
  explicit Msg(char type) { b_.push_back(type); }
  Msg& u8(uint8_t v) {
    b_.push_back(static_cast<char>(v));
    return *this;
  }
  Msg& i16(int16_t v) { return be(static_cast<uint16_t>(v), 2); }
  Msg& i32(int32_t v) { return be(static_cast<uint32_t>(v), 4); }
  Msg& i64(int64_t v) { return be(static_cast<uint64_t>(v), 8); }
  Msg& cstr(std::string_view s) {
    b_.append(s);
    b_.push_back('\0');
    return *this;
  }
  Msg& raw(std::string_view s) {
    b_.append(s);
    return *this;
  }
  /// A tuple: each entry is {kind, text}.
  Msg& tuple(const std::vector<std::pair<char, std::string>>& cols) {
    i16(static_cast<int16_t>(cols.size()));
    for (const auto& [k, v] : cols) {
      u8(static_cast<uint8_t>(k));
      if (k == 't' || k == 'b') {
        i32(static_cast<int32_t>(v.size()));
        raw(v);
      }
    }
    return *this;
  }
  const std::string& str() const { return b_; }

 private:
  Msg& be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i)
      b_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return *this;
  }
  std::string b_;
};

struct Col {
  std::string name;
  uint32_t type;
  bool key = false;
};

std::string relation_msg(uint32_t oid, std::string_view schema, std::string_view name, char ident,
                         const std::vector<Col>& cols) {
  Msg m('R');
  m.i32(static_cast<int32_t>(oid)).cstr(schema).cstr(name).u8(static_cast<uint8_t>(ident));
  m.i16(static_cast<int16_t>(cols.size()));
  for (const auto& c : cols)
    m.u8(c.key ? 1 : 0).cstr(c.name).i32(static_cast<int32_t>(c.type)).i32(-1);
  return m.str();
}

Value obj(std::initializer_list<std::pair<std::string_view, Value>> f) {
  return Value::object(f);
}

Value dec(std::string_view s) {
  return Value(Decimal::parse(s).value_or_throw());
}

Value decode_ok(uint32_t oid, std::string_view text) {
  auto v = decode_text_value(oid, text);
  EXPECT_TRUE(v.ok()) << text << ": " << (v.ok() ? "" : v.error().message());
  return v.ok() ? *v : Value();
}

std::string decode_err(uint32_t oid, std::string_view text) {
  auto v = decode_text_value(oid, text);
  EXPECT_FALSE(v.ok()) << text << " decoded to " << (v.ok() ? v->to_json() : "");
  return v.ok() ? "" : v.error().message();
}

int64_t micros(int64_t y, unsigned m, unsigned d, int64_t h = 0, int64_t mi = 0, int64_t s = 0, int64_t us = 0) {
  return ((days_from_civil(y, m, d) * 86400 + h * 3600 + mi * 60 + s) * 1'000'000) + us;
}

TEST(PgOutputLsn, FormatsAndParsesLikePostgres) {
  EXPECT_EQ(format_lsn(0x16B374D848ULL), "16/B374D848");
  EXPECT_EQ(format_lsn(0), "0/0");
  EXPECT_EQ(parse_lsn("16/B374D848").value_or_throw(), 0x16B374D848ULL);
  EXPECT_EQ(parse_lsn("0/1").value_or_throw(), 1u);
  EXPECT_FALSE(parse_lsn("16B374D848").ok());
  EXPECT_FALSE(parse_lsn("1/").ok());
  EXPECT_FALSE(parse_lsn("x/1").ok());
}

TEST(PgOutputValues, ScalarTypes) {
  EXPECT_EQ(decode_ok(oid::kBool, "t"), Value(true));
  EXPECT_EQ(decode_ok(oid::kBool, "f"), Value(false));
  decode_err(oid::kBool, "yes");
  EXPECT_EQ(decode_ok(oid::kInt2, "-32768"), Value(int64_t{-32768}));
  EXPECT_EQ(decode_ok(oid::kInt4, "2147483647"), Value(int64_t{2147483647}));
  EXPECT_EQ(decode_ok(oid::kInt8, "-9223372036854775808"), Value(std::numeric_limits<int64_t>::min()));
  decode_err(oid::kInt8, "12a");
  decode_err(oid::kInt8, "");
  EXPECT_EQ(decode_ok(oid::kOid, "16384"), Value(int64_t{16384}));
  EXPECT_EQ(decode_ok(oid::kFloat8, "1.5"), Value(1.5));
  EXPECT_EQ(decode_ok(oid::kFloat4, "-Infinity"), Value(-std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(std::isnan(decode_ok(oid::kFloat8, "NaN").as_double()));
  EXPECT_EQ(decode_ok(oid::kText, "héllo, \"world\""), Value("héllo, \"world\""));
  EXPECT_EQ(decode_ok(oid::kVarchar, ""), Value(""));
  EXPECT_EQ(decode_ok(oid::kBpchar, "ab  "), Value("ab  "));
  EXPECT_EQ(decode_ok(oid::kUuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            Value("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"));
  // Types without a mapping keep their text.
  EXPECT_EQ(decode_ok(1186 /* interval */, "1 day 02:00:00"), Value("1 day 02:00:00"));
  EXPECT_EQ(decode_ok(99999 /* an enum */, "paid"), Value("paid"));
}

TEST(PgOutputValues, Bytea) {
  EXPECT_EQ(decode_ok(oid::kBytea, "\\x00ff10"), Value::bytes(std::string("\x00\xff\x10", 3)));
  EXPECT_EQ(decode_ok(oid::kBytea, "\\x"), Value::bytes(std::string()));
  EXPECT_NE(decode_err(oid::kBytea, "\\000").find("hex"), std::string::npos);
  EXPECT_NE(decode_err(oid::kBytea, "\\x0g").find("character 3"), std::string::npos);
}

TEST(PgOutputValues, NumericKeepsEveryDigit) {
  EXPECT_EQ(decode_ok(oid::kNumeric, "123.4500"), dec("123.4500"));
  EXPECT_EQ(decode_ok(oid::kNumeric, "123.4500").as_decimal().scale(), 4);
  EXPECT_EQ(decode_ok(oid::kNumeric, "-0.000000000000000001"), dec("-0.000000000000000001"));
  // 38 significant digits: exact.
  const std::string d38 = "12345678901234567890.123456789012345678";
  EXPECT_EQ(decode_ok(oid::kNumeric, d38).as_decimal().to_string(), d38);
  // 39 digits: a clear error, never a rounded number.
  EXPECT_NE(decode_err(oid::kNumeric, "123456789012345678901234567890123456789").find("38 significant"),
            std::string::npos);
  // Leading zeros do not count: 19 significant digits at scale 57, exact.
  EXPECT_EQ(
      decode_ok(oid::kNumeric, "0.000000000000000000000000000000000000001234567890123456789").as_decimal().scale(), 57);
}

TEST(PgOutputValues, NumericNanAndInfinitiesAreTheDoubleSpecials) {
  // Exact (the same value, not a rounding), and written as Postgres prints them.
  const Value nan = decode_ok(oid::kNumeric, "NaN");
  ASSERT_TRUE(nan.is_double());
  EXPECT_TRUE(std::isnan(nan.as_double()));
  EXPECT_EQ(nan.to_json(), "\"NaN\"");
  EXPECT_EQ(decode_ok(oid::kNumeric, "Infinity"), Value(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(decode_ok(oid::kNumeric, "-Infinity"), Value(-std::numeric_limits<double>::infinity()));
  EXPECT_EQ(decode_ok(oid::kNumeric, "-Infinity").to_json(), "\"-Infinity\"");
  EXPECT_EQ(decode_ok(1231, "{1.5,NaN,Infinity}"),
            Value::array({dec("1.5"), Value(std::numeric_limits<double>::quiet_NaN()),
                          Value(std::numeric_limits<double>::infinity())}));
  decode_err(oid::kNumeric, "nan");
  decode_err(oid::kNumeric, "inf");
}

TEST(PgOutputValues, FloatSpecialsAndRange) {
  EXPECT_EQ(decode_ok(oid::kFloat8, "Infinity").to_json(), "\"Infinity\"");
  EXPECT_EQ(decode_ok(oid::kFloat8, "NaN").to_json(), "\"NaN\"");
  EXPECT_EQ(decode_ok(oid::kFloat8, "1.7976931348623157e+308"), Value(std::numeric_limits<double>::max()));
  EXPECT_EQ(decode_ok(oid::kFloat8, "4.9406564584124654e-324"), Value(5e-324));
  EXPECT_EQ(decode_ok(oid::kFloat8, "-0"), Value(-0.0));
  EXPECT_TRUE(std::signbit(decode_ok(oid::kFloat8, "-0").as_double()));
  EXPECT_EQ(decode_ok(oid::kFloat4, "3.4028235e+38"), Value(3.4028235e+38));
  // Text Postgres never sends, beyond the double range: an error, not infinity or zero.
  EXPECT_NE(decode_err(oid::kFloat8, "1e400").find("range"), std::string::npos);
  EXPECT_NE(decode_err(oid::kFloat8, "1e-400").find("range"), std::string::npos);
}

TEST(PgOutputValues, Json) {
  EXPECT_EQ(decode_ok(oid::kJsonb, R"({"a": [1, 2.5, "x"], "b": null})"),
            obj({{"a", Value::array({Value(int64_t{1}), Value(2.5), Value("x")})},
                 {"b", Value()}}));  // JSON numbers as from_json maps them
  EXPECT_EQ(decode_ok(oid::kJson, "42"), Value(int64_t{42}));
  EXPECT_NE(decode_err(oid::kJson, "{bad").find("json"), std::string::npos);
}

TEST(PgOutputValues, DatesAndTimestamps) {
  EXPECT_EQ(decode_ok(oid::kDate, "2024-02-29"), Value::timestamp_micros(micros(2024, 2, 29)));
  EXPECT_EQ(decode_ok(oid::kDate, "1970-01-01"), Value::timestamp_micros(0));
  EXPECT_EQ(decode_ok(oid::kDate, "0044-03-15 BC"), Value::timestamp_micros(micros(-43, 3, 15)));
  EXPECT_EQ(decode_ok(oid::kDate, "10000-01-01"), Value::timestamp_micros(micros(10000, 1, 1)));
  EXPECT_EQ(decode_ok(oid::kDate, "infinity"), Value::timestamp_micros(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(decode_ok(oid::kDate, "-infinity"), Value::timestamp_micros(std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(decode_ok(oid::kTimestamp, "2024-01-02 03:04:05.123456"),
            Value::timestamp_micros(micros(2024, 1, 2, 3, 4, 5, 123456)));
  EXPECT_EQ(decode_ok(oid::kTimestamp, "2024-01-02 03:04:05.5"),
            Value::timestamp_micros(micros(2024, 1, 2, 3, 4, 5, 500000)));
  EXPECT_EQ(decode_ok(oid::kTimestamp, "1969-12-31 23:59:59"), Value::timestamp_micros(-1'000'000));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "2024-01-02 03:04:05+00"),
            Value::timestamp_micros(micros(2024, 1, 2, 3, 4, 5)));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "2024-01-02 05:34:05.000001+02:30"),
            Value::timestamp_micros(micros(2024, 1, 2, 3, 4, 5, 1)));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "2024-01-01 23:00:00-01"), Value::timestamp_micros(micros(2024, 1, 2)));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "infinity"), Value::timestamp_micros(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "-infinity"), Value::timestamp_micros(std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(decode_ok(oid::kTimestamp, "infinity").to_json(), "\"infinity\"");
  EXPECT_EQ(decode_ok(oid::kDate, "-infinity").to_json(), "\"-infinity\"");
  EXPECT_NE(decode_err(oid::kDate, "01/02/2024").find("ISO"), std::string::npos);
  decode_err(oid::kTimestamp, "2024-01-02T03:04:05");
  decode_err(oid::kTimestamptz, "2024-01-02 03:04:05");  // no zone
  decode_err(oid::kTimestamp, "2024-13-02 03:04:05");
}

TEST(PgOutputValues, DatesAndTimestampsAtTheEndsOfTheirRanges) {
  // Postgres' first day (4713 BC) and the last finite Sluice instant.
  EXPECT_EQ(decode_ok(oid::kDate, "4714-11-24 BC"), Value::timestamp_micros(micros(-4713, 11, 24)));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "4714-11-24 00:00:00+00 BC"), Value::timestamp_micros(micros(-4713, 11, 24)));
  EXPECT_EQ(decode_ok(oid::kTimestamp, "4714-11-24 00:00:00 BC").to_json(), "\"-4713-11-24T00:00:00.000000Z\"");
  EXPECT_EQ(decode_ok(oid::kTimestamp, "294247-01-10 04:00:54.775806"),
            Value::timestamp_micros(std::numeric_limits<int64_t>::max() - 1));
  EXPECT_EQ(decode_ok(oid::kTimestamptz, "294247-01-10 06:00:54.775806+02"),
            Value::timestamp_micros(std::numeric_limits<int64_t>::max() - 1));
  EXPECT_EQ(decode_ok(oid::kDate, "294247-01-10"), Value::timestamp_micros(micros(294247, 1, 10)));
  // One microsecond later would be INT64_MAX, which means infinity: an error, as everything after it. These
  // used to wrap around to dates in the year -290308 or so.
  for (const auto& [type, text] :
       std::vector<std::pair<uint32_t, std::string>>{{oid::kTimestamp, "294247-01-10 04:00:54.775807"},
                                                     {oid::kTimestamp, "294276-12-31 23:59:59.999999"},
                                                     {oid::kTimestamptz, "294276-12-31 23:59:59.999999+00"},
                                                     {oid::kTimestamptz, "294247-01-10 02:00:54.775807-02"},
                                                     {oid::kDate, "294247-01-11"},
                                                     {oid::kDate, "5874897-12-31"},
                                                     {oid::kDate, "999999999-12-31"},
                                                     {1182, "{2024-01-01,5874897-12-31}"}}) {
    SCOPED_TRACE(text);
    const std::string e = decode_err(type, text);
    EXPECT_NE(e.find("outside the range of a Sluice timestamp"), std::string::npos) << e;
    EXPECT_NE(e.find(text.front() == '{' ? "5874897-12-31" : text), std::string::npos) << e;
  }
}

// A Value string is UTF-8: text that is not (a SQL_ASCII database's bytes) is an error naming the byte, never a
// string that JSON sinks would alter; valid UTF-8 of every length passes, in arrays too.
TEST(PgOutputValues, TextThatIsNotUtf8IsAnError) {
  EXPECT_EQ(decode_ok(oid::kText, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            Value("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_NE(decode_err(oid::kText, "caf\xe9").find("is not valid UTF-8 (byte 3 is 0xe9)"), std::string::npos);
  EXPECT_NE(decode_err(oid::kVarchar, "\xc0\xaf").find("byte 0 is 0xc0"), std::string::npos);       // overlong
  EXPECT_NE(decode_err(oid::kText, "a\xed\xa0\x80").find("byte 1 is 0xed"), std::string::npos);     // a surrogate
  EXPECT_NE(decode_err(oid::kText, "\xf4\x90\x80\x80").find("byte 0 is 0xf4"), std::string::npos);  // above U+10FFFF
  EXPECT_NE(decode_err(oid::kText, "ab\xe2\x82").find("byte 2 is 0xe2"), std::string::npos);        // cut short
  EXPECT_NE(decode_err(1009, "{ok,\"caf\xe9\"}").find("array element: text of 4 bytes"), std::string::npos);
}

TEST(PgOutputValues, Arrays) {
  EXPECT_EQ(array_element_type(1007), oid::kInt4);
  EXPECT_EQ(array_element_type(oid::kInt4), 0u);
  EXPECT_EQ(decode_ok(1007, "{1,2,NULL,-3}"),
            Value::array({Value(int64_t{1}), Value(int64_t{2}), Value(), Value(int64_t{-3})}));
  EXPECT_EQ(decode_ok(1009, R"({"a b","with \"quote\" and \\",NULL,"NULL",plain})"),
            Value::array({Value("a b"), Value("with \"quote\" and \\"), Value(), Value("NULL"), Value("plain")}));
  EXPECT_EQ(decode_ok(1007, "{{1,2},{3,4}}"), Value::array({Value::array({Value(int64_t{1}), Value(int64_t{2})}),
                                                            Value::array({Value(int64_t{3}), Value(int64_t{4})})}));
  EXPECT_EQ(decode_ok(1007, "[0:1]={7,8}"), Value::array({Value(int64_t{7}), Value(int64_t{8})}));
  EXPECT_EQ(decode_ok(1009, "{}"), Value::array());
  EXPECT_EQ(decode_ok(1231, "{1.10,-2}"), Value::array({dec("1.10"), dec("-2")}));
  EXPECT_EQ(decode_ok(1000, "{t,f}"), Value::array({Value(true), Value(false)}));
  EXPECT_EQ(decode_ok(1001, R"({"\\x01"})"), Value::array({Value::bytes(std::string("\x01", 1))}));
  EXPECT_EQ(decode_ok(3807, R"({"{\"a\": 1}"})"), Value::array({obj({{"a", Value(int64_t{1})}})}));
  EXPECT_EQ(decode_ok(1182, "{2024-01-02}"), Value::array({Value::timestamp_micros(micros(2024, 1, 2))}));
  EXPECT_EQ(decode_ok(1185, R"({"2024-01-02 00:00:00+00"})"),
            Value::array({Value::timestamp_micros(micros(2024, 1, 2))}));
  EXPECT_EQ(decode_ok(2951, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
            Value::array({Value("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")}));
  EXPECT_NE(decode_err(1007, "{1,2").find("unterminated"), std::string::npos);
  EXPECT_NE(decode_err(1007, "{1,x}").find("array element"), std::string::npos);
  decode_err(1007, "1,2");
  decode_err(1007, "{1}x");
}

class PgOutputDecoderTest : public ::testing::Test {
 protected:
  PgOutputMessage ok(const std::string& bytes) {
    auto m = dec_.decode(bytes);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message());
    return m.ok() ? std::move(*m) : PgOutputMessage{};
  }
  Error err(const std::string& bytes) {
    auto m = dec_.decode(bytes);
    EXPECT_FALSE(m.ok());
    return m.ok() ? Error(ErrorCode::kOk, "") : m.error();
  }
  void charges() {
    ok(relation_msg(16400, "public", "charges", 'd',
                    {{"id", oid::kInt8, true}, {"amount", oid::kNumeric}, {"note", oid::kText}, {"paid", oid::kBool}}));
  }
  PgOutputDecoder dec_;
};

TEST_F(PgOutputDecoderTest, BeginCommitOriginType) {
  // Commit time 2000-01-01 00:00:01 in the Postgres epoch.
  PgOutputMessage b = ok(Msg('B').i64(0x16B374D848).i64(1'000'000).i32(745).str());
  EXPECT_EQ(b.kind, PgOutputMessage::Kind::kBegin);
  EXPECT_EQ(b.begin.final_lsn, 0x16B374D848u);
  EXPECT_EQ(b.begin.commit_ts_us, kPostgresEpochMicros + 1'000'000);
  EXPECT_EQ(b.begin.xid, 745u);
  PgOutputMessage c = ok(Msg('C').u8(0).i64(0x100).i64(0x128).i64(2'000'000).str());
  EXPECT_EQ(c.kind, PgOutputMessage::Kind::kCommit);
  EXPECT_EQ(c.commit.commit_lsn, 0x100u);
  EXPECT_EQ(c.commit.end_lsn, 0x128u);
  EXPECT_EQ(c.commit.commit_ts_us, kPostgresEpochMicros + 2'000'000);
  PgOutputMessage o = ok(Msg('O').i64(0x42).cstr("upstream").str());
  EXPECT_EQ(o.kind, PgOutputMessage::Kind::kOrigin);
  EXPECT_EQ(o.origin.name, "upstream");
  PgOutputMessage y = ok(Msg('Y').i32(70000).cstr("public").cstr("mood").str());
  EXPECT_EQ(y.kind, PgOutputMessage::Kind::kType);
  ASSERT_NE(dec_.type(70000), nullptr);
  EXPECT_EQ(dec_.type(70000)->name, "mood");
}

TEST_F(PgOutputDecoderTest, RelationDescribesColumnsAndKey) {
  PgOutputMessage r =
      ok(relation_msg(16400, "public", "charges", 'd', {{"id", oid::kInt8, true}, {"amount", oid::kNumeric}}));
  EXPECT_EQ(r.kind, PgOutputMessage::Kind::kRelation);
  ASSERT_NE(r.relation, nullptr);
  EXPECT_EQ(r.relation->qualified_name(), "public.charges");
  ASSERT_EQ(r.relation->columns.size(), 2u);
  EXPECT_EQ(r.relation->columns[1].type_oid, oid::kNumeric);
  EXPECT_EQ(r.relation->key_columns, std::vector<std::string>{"id"});
  // An empty namespace means pg_catalog.
  EXPECT_EQ(ok(relation_msg(1, "", "x", 'n', {})).relation->schema, "pg_catalog");
}

TEST_F(PgOutputDecoderTest, InsertUpdateDeleteUnderReplicaIdentityDefault) {
  charges();
  PgOutputMessage i = ok(Msg('I').i32(16400).u8('N').tuple({{'t', "1"}, {'t', "10.50"}, {'n', ""}, {'t', "t"}}).str());
  EXPECT_EQ(i.kind, PgOutputMessage::Kind::kInsert);
  EXPECT_EQ(i.change.op, cdc::ChangeOp::kCreate);
  EXPECT_EQ(i.change.key, obj({{"id", Value(int64_t{1})}}));
  EXPECT_TRUE(i.change.before.is_null());
  EXPECT_EQ(i.change.after,
            obj({{"id", Value(int64_t{1})}, {"amount", dec("10.50")}, {"note", Value()}, {"paid", Value(true)}}));
  ASSERT_NE(i.change.relation, nullptr);
  EXPECT_EQ(i.change.relation->name, "charges");

  // Update without a key change: no old tuple, before is null.
  PgOutputMessage u = ok(Msg('U').i32(16400).u8('N').tuple({{'t', "1"}, {'t', "11"}, {'t', "x"}, {'t', "f"}}).str());
  EXPECT_EQ(u.change.op, cdc::ChangeOp::kUpdate);
  EXPECT_TRUE(u.change.before.is_null());
  EXPECT_EQ(u.change.after.find("note")->as_string(), "x");

  // Update that changes the key: 'K' old key, before holds only the key columns.
  PgOutputMessage uk = ok(Msg('U')
                              .i32(16400)
                              .u8('K')
                              .tuple({{'t', "1"}, {'n', ""}, {'n', ""}, {'n', ""}})
                              .u8('N')
                              .tuple({{'t', "2"}, {'t', "11"}, {'t', "x"}, {'t', "f"}})
                              .str());
  EXPECT_EQ(uk.change.before, obj({{"id", Value(int64_t{1})}}));
  EXPECT_EQ(uk.change.key, obj({{"id", Value(int64_t{2})}}));

  PgOutputMessage d = ok(Msg('D').i32(16400).u8('K').tuple({{'t', "2"}, {'n', ""}, {'n', ""}, {'n', ""}}).str());
  EXPECT_EQ(d.kind, PgOutputMessage::Kind::kDelete);
  EXPECT_EQ(d.change.op, cdc::ChangeOp::kDelete);
  EXPECT_EQ(d.change.before, obj({{"id", Value(int64_t{2})}}));
  EXPECT_EQ(d.change.key, obj({{"id", Value(int64_t{2})}}));
  EXPECT_TRUE(d.change.after.is_null());
}

TEST_F(PgOutputDecoderTest, ReplicaIdentityFullUsesTheResolvedPrimaryKeyAndFullBeforeImages) {
  PgOutputDecoder dec([](const PgRelation& rel) -> Result<std::vector<std::string>> {
    EXPECT_EQ(rel.name, "accounts");
    return std::vector<std::string>{"id"};
  });
  // Under FULL every column is flagged as part of the identity.
  ASSERT_TRUE(
      dec.decode(relation_msg(7, "app", "accounts", 'f', {{"id", oid::kInt4, true}, {"bal", oid::kInt8, true}})).ok());
  auto u = dec.decode(
      Msg('U').i32(7).u8('O').tuple({{'t', "1"}, {'t', "100"}}).u8('N').tuple({{'t', "1"}, {'t', "90"}}).str());
  ASSERT_TRUE(u.ok()) << u.error().message();
  EXPECT_EQ(u->change.key, obj({{"id", Value(int64_t{1})}}));
  EXPECT_EQ(u->change.before, obj({{"id", Value(int64_t{1})}, {"bal", Value(int64_t{100})}}));
  EXPECT_EQ(u->change.after, obj({{"id", Value(int64_t{1})}, {"bal", Value(int64_t{90})}}));
  auto d = dec.decode(Msg('D').i32(7).u8('O').tuple({{'t', "1"}, {'t', "90"}}).str());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->change.before, obj({{"id", Value(int64_t{1})}, {"bal", Value(int64_t{90})}}));
  // A resolver error names the table.
  PgOutputDecoder failing([](const PgRelation&) -> Result<std::vector<std::string>> {
    return Error(ErrorCode::kConnector, "catalog unavailable");
  });
  auto r = failing.decode(relation_msg(8, "app", "t", 'f', {{"id", oid::kInt4, true}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("app.t"), std::string::npos);
}

TEST_F(PgOutputDecoderTest, TableWithoutKeyUsesTheWholeRowAsKey) {
  ok(relation_msg(9, "public", "events", 'n', {{"a", oid::kInt4}, {"b", oid::kText}}));
  PgOutputMessage i = ok(Msg('I').i32(9).u8('N').tuple({{'t', "1"}, {'t', "x"}}).str());
  EXPECT_EQ(i.change.key, i.change.after);
}

TEST_F(PgOutputDecoderTest, UnchangedToastIsMarkedNeverNull) {
  charges();
  PgOutputMessage u = ok(Msg('U').i32(16400).u8('N').tuple({{'t', "1"}, {'t', "5"}, {'u', ""}, {'n', ""}}).str());
  const Value* note = u.change.after.find("note");
  ASSERT_NE(note, nullptr);
  EXPECT_FALSE(note->is_null());
  EXPECT_TRUE(is_unchanged_toast(*note));
  EXPECT_EQ(*note, obj({{"$unchanged_toast", Value(true)}}));
  EXPECT_TRUE(u.change.after.find("paid")->is_null());  // a real NULL stays null
  EXPECT_FALSE(is_unchanged_toast(Value()));
  EXPECT_FALSE(is_unchanged_toast(obj({{"$unchanged_toast", Value(false)}})));

  // Under FULL the old row's value fills an unchanged TOAST column.
  PgOutputDecoder dec;
  ASSERT_TRUE(
      dec.decode(relation_msg(3, "public", "docs", 'f', {{"id", oid::kInt4, true}, {"body", oid::kText, true}})).ok());
  auto full = dec.decode(
      Msg('U').i32(3).u8('O').tuple({{'t', "1"}, {'t', "big text"}}).u8('N').tuple({{'t', "1"}, {'u', ""}}).str());
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->change.after.find("body")->as_string(), "big text");
  // ...but not when the old value is unchanged TOAST too.
  auto both =
      dec.decode(Msg('U').i32(3).u8('O').tuple({{'t', "1"}, {'u', ""}}).u8('N').tuple({{'t', "2"}, {'u', ""}}).str());
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(is_unchanged_toast(*both->change.after.find("body")));
}

TEST_F(PgOutputDecoderTest, SchemaChangesThroughRelationMessages) {
  charges();
  // ALTER TABLE ... ADD COLUMN: a new Relation message for the same OID replaces the description.
  ok(relation_msg(16400, "public", "charges", 'd',
                  {{"id", oid::kInt8, true},
                   {"amount", oid::kNumeric},
                   {"note", oid::kText},
                   {"paid", oid::kBool},
                   {"tags", 1009}}));
  PgOutputMessage i =
      ok(Msg('I').i32(16400).u8('N').tuple({{'t', "3"}, {'t', "1"}, {'n', ""}, {'t', "t"}, {'t', "{a,b}"}}).str());
  EXPECT_EQ(*i.change.after.find("tags"), Value::array({Value("a"), Value("b")}));
  // A tuple with fewer columns than the relation (a column added later): the rest are null.
  PgOutputMessage shorter = ok(Msg('I').i32(16400).u8('N').tuple({{'t', "4"}}).str());
  EXPECT_TRUE(shorter.change.after.find("tags")->is_null());
}

TEST_F(PgOutputDecoderTest, TruncateAndMessage) {
  charges();
  PgOutputMessage t = ok(Msg('T').i32(2).u8(1).i32(16400).i32(555).str());
  EXPECT_EQ(t.kind, PgOutputMessage::Kind::kTruncate);
  EXPECT_EQ(t.truncate.options, 1);
  EXPECT_EQ(t.truncate.tables, (std::vector<std::string>{"public.charges", "oid 555"}));
  PgOutputMessage m = ok(Msg('M').u8(0).i64(0x99).cstr("sluice-heartbeat").i32(3).raw("abc").str());
  EXPECT_EQ(m.kind, PgOutputMessage::Kind::kMessage);
  EXPECT_FALSE(m.message.transactional);
  EXPECT_EQ(m.message.lsn, 0x99u);
  EXPECT_EQ(m.message.prefix, "sluice-heartbeat");
  EXPECT_EQ(m.message.content, "abc");
  EXPECT_TRUE(ok(Msg('M').u8(1).i64(1).cstr("p").i32(0).str()).message.transactional);
}

TEST_F(PgOutputDecoderTest, ValueErrorsNameTableAndColumnAndKeepTheDecoderUsable) {
  charges();
  const std::string wide(39, '9');
  auto bad = dec_.decode(Msg('I').i32(16400).u8('N').tuple({{'t', "1"}, {'t', wide}, {'n', ""}, {'t', "t"}}).str());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kSerialization);
  EXPECT_NE(bad.error().message().find("table public.charges: column amount"), std::string::npos)
      << bad.error().message();
  EXPECT_NE(bad.error().message().find(wide), std::string::npos);
  ok(Msg('I').i32(16400).u8('N').tuple({{'t', "2"}, {'t', "1"}, {'n', ""}, {'t', "t"}}).str());
  // Binary values are never requested.
  EXPECT_EQ(err(Msg('I').i32(16400).u8('N').tuple({{'b', "xx"}}).str()).code(), ErrorCode::kSerialization);
}

TEST_F(PgOutputDecoderTest, CommitTimestampsThatOverflowAreErrorsNotWrappedTimes) {
  // µs since 2000; moving them to 1970 must not overflow (it used to wrap to a time in the year -290308).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const std::string& bytes :
       {Msg('B').i64(1).i64(kMax).i32(3).str(), Msg('B').i64(1).i64(kMax - 1000).i32(3).str(),
        Msg('C').u8(0).i64(1).i64(2).i64(kMax).str()}) {
    const Error e = err(bytes);
    EXPECT_EQ(e.code(), ErrorCode::kConnector);
    EXPECT_NE(e.message().find("commit timestamp"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("out of range"), std::string::npos) << e.message();
  }
  // The most negative time still moves forward by 30 years without overflow.
  const PgOutputMessage b = ok(Msg('B').i64(1).i64(std::numeric_limits<int64_t>::min() + 1).i32(3).str());
  EXPECT_EQ(b.begin.commit_ts_us, std::numeric_limits<int64_t>::min() + 1 + kPostgresEpochMicros);
  // The last representable one.
  const PgOutputMessage c = ok(Msg('C').u8(0).i64(1).i64(2).i64(kMax - 1 - kPostgresEpochMicros).str());
  EXPECT_EQ(c.commit.commit_ts_us, kMax - 1);
}

TEST_F(PgOutputDecoderTest, MalformedBytesAreErrorsNamingThePosition) {
  charges();
  Error e = err(Msg('I').i32(16400).u8('N').i16(1).u8('t').i32(10).raw("abc").str());
  EXPECT_EQ(e.code(), ErrorCode::kConnector);
  EXPECT_NE(e.message().find("truncated at byte 13"), std::string::npos) << e.message();
  e = err(Msg('I').i32(777).u8('N').tuple({}).str());
  EXPECT_NE(e.message().find("relation OID 777"), std::string::npos) << e.message();
  e = err(Msg('I').i32(16400).u8('X').str());
  EXPECT_NE(e.message().find("at byte 6"), std::string::npos) << e.message();
  e = err(Msg('I').i32(16400).u8('N').i16(1).u8('z').str());
  EXPECT_NE(e.message().find("unknown column kind 'z'"), std::string::npos) << e.message();
  e = err(Msg('I').i32(16400).u8('N').i16(9).str());
  EXPECT_NE(e.message().find("9 columns"), std::string::npos) << e.message();
  e = err(Msg('B').i64(1).i64(2).i32(3).u8(0).str());
  EXPECT_NE(e.message().find("trailing"), std::string::npos) << e.message();
  e = err(Msg('Q').str());
  EXPECT_NE(e.message().find("unknown message type 0x51 at byte 0"), std::string::npos) << e.message();
  EXPECT_FALSE(dec_.decode("").ok());
  e = err(Msg('R').i32(1).raw("public").str());
  EXPECT_NE(e.message().find("NUL-terminated"), std::string::npos) << e.message();
  e = err(Msg('T').i32(1000000).u8(0).str());
  EXPECT_NE(e.message().find("truncated"), std::string::npos) << e.message();
}

TEST_F(PgOutputDecoderTest, EveryPrefixOfValidMessagesIsRejectedWithoutCrashing) {
  charges();
  const std::vector<std::string> msgs = {
      Msg('B').i64(1).i64(2).i32(3).str(),
      Msg('C').u8(0).i64(1).i64(2).i64(3).str(),
      Msg('U')
          .i32(16400)
          .u8('K')
          .tuple({{'t', "1"}, {'n', ""}, {'n', ""}, {'n', ""}})
          .u8('N')
          .tuple({{'t', "2"}, {'t', "1.5"}, {'u', ""}, {'t', "t"}})
          .str(),
      Msg('D').i32(16400).u8('K').tuple({{'t', "1"}, {'n', ""}, {'n', ""}, {'n', ""}}).str(),
      Msg('M').u8(0).i64(1).cstr("p").i32(2).raw("ab").str(),
      Msg('T').i32(1).u8(0).i32(16400).str(),
      Msg('Y').i32(1).cstr("s").cstr("n").str(),
      Msg('O').i64(1).cstr("o").str(),
  };
  for (const auto& full : msgs) {
    ASSERT_TRUE(dec_.decode(full).ok()) << full[0];
    for (size_t n = 1; n < full.size(); ++n) {
      auto r = dec_.decode(full.substr(0, n));
      EXPECT_FALSE(r.ok()) << "type " << full[0] << " prefix " << n;
      if (!r.ok()) {
        EXPECT_EQ(r.error().code(), ErrorCode::kConnector) << r.error().message();
      }
    }
  }
}

}  // namespace
}  // namespace sluice::postgres
