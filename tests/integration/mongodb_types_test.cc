// Every BSON type, with the ends of its range, through the MongoDB-wire emulator of scripts/services/mongodb and
// the MongoDB CDC source (snapshot and change stream): double NaN, ±Infinity, -0.0, the largest and smallest
// doubles; Decimal128 NaN, ±Infinity, -0, the extreme exponents and 34 digits; dates at the ends of the int64
// millisecond range (beyond what microseconds hold) and around year 0; int32/int64 limits; binary subtypes 0, 3
// and 4 (those the emulator accepts);
// ObjectId, regex with options, timestamp, minKey/maxKey, JavaScript code, empty and Unicode strings.
//  * document -> server -> source -> Value -> BSON gives back the inserted document (canonical Extended JSON
//    compared), for the snapshot and the stream;
//  * the JSON text of the values JSON has no literal for is fixed: "NaN", "Infinity", "-Infinity", never null.
// Run: scripts/services/run-with mongodb -- build/<dir>/tests/mongodb_types_test
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "integration/test_util/change_events.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/mongodb/bson_value.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using cdc::ChangeEvent;
using cdc::ChangeOp;
using sluice::testing::unique_name;

constexpr auto kDeadline = 90s;

using sluice::testing::ReceivedEvents;
using sluice::testing::receiving_sink;

/// Whether events for `n` distinct _ids arrived (a document written while the snapshot starts may come twice:
/// from the snapshot and from the stream).
bool distinct_ids(const std::vector<ChangeEvent>& events, size_t n) {
  std::set<std::string> ids;
  for (const ChangeEvent& e : events)
    ids.insert(e.key.to_json());
  return ids.size() >= n;
}

/// The test documents: _id = id, then the typed fields. Returns a new bson_t (the caller destroys it).
bson_t* document(int64_t id, int kind) {
  bson_t* d = bson_new();
  BSON_APPEND_INT64(d, "_id", id);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  switch (kind) {
    case 0: {  // doubles
      BSON_APPEND_DOUBLE(d, "nan", std::numeric_limits<double>::quiet_NaN());
      BSON_APPEND_DOUBLE(d, "inf", kInf);
      BSON_APPEND_DOUBLE(d, "ninf", -kInf);
      BSON_APPEND_DOUBLE(d, "nzero", -0.0);
      BSON_APPEND_DOUBLE(d, "max", std::numeric_limits<double>::max());
      BSON_APPEND_DOUBLE(d, "lowest", std::numeric_limits<double>::lowest());
      BSON_APPEND_DOUBLE(d, "min", std::numeric_limits<double>::min());
      BSON_APPEND_DOUBLE(d, "denorm", std::numeric_limits<double>::denorm_min());
      BSON_APPEND_DOUBLE(d, "tenth", 0.1);
      break;
    }
    case 1: {  // Decimal128
      const char* texts[] = {"NaN",
                             "Infinity",
                             "-Infinity",
                             "-0",
                             "1E+6111",
                             "1E-6176",
                             "9.999999999999999999999999999999999E+6144",
                             "-9999999999999999999999999999999999",
                             "1.50",
                             "0E-6176"};
      for (int i = 0; i < 10; ++i) {
        bson_decimal128_t dec;
        EXPECT_TRUE(bson_decimal128_from_string(texts[i], &dec)) << texts[i];
        const std::string key = "d" + std::to_string(i);
        bson_append_decimal128(d, key.c_str(), -1, &dec);
      }
      break;
    }
    case 2: {  // dates (ms since 1970): the int64 ends, the last ones microseconds hold, years 0 and 9999
      const int64_t dates[] = {std::numeric_limits<int64_t>::max(),
                               std::numeric_limits<int64_t>::min(),
                               9'223'372'036'854'775,   // largest ms whose µs fit int64
                               9'223'372'036'854'776,   // the next: kept as {"$date": {"$numberLong"}}
                               -9'223'372'036'854'775,  // the negative end
                               -9'223'372'036'854'776,
                               253'402'300'799'999,  // 9999-12-31T23:59:59.999Z
                               -62'167'219'200'000,  // 0000-01-01T00:00:00Z
                               -62'167'219'200'001,  // one ms before
                               0,
                               -1};
      for (size_t i = 0; i < std::size(dates); ++i) {
        const std::string key = "t" + std::to_string(i);
        bson_append_date_time(d, key.c_str(), -1, dates[i]);
      }
      break;
    }
    case 3: {  // integers
      BSON_APPEND_INT32(d, "i32min", std::numeric_limits<int32_t>::min());
      BSON_APPEND_INT32(d, "i32max", std::numeric_limits<int32_t>::max());
      BSON_APPEND_INT64(d, "i64min", std::numeric_limits<int64_t>::min());
      BSON_APPEND_INT64(d, "i64max", std::numeric_limits<int64_t>::max());
      BSON_APPEND_INT32(d, "zero", 0);
      break;
    }
    case 4: {  // binary subtypes
      const uint8_t bytes[16] = {0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, 7, 8, 9, 10, 11, 12, 13, 14, 15};
      // The emulator refuses subtypes other than 0, 3 and 4 ("Unknown subtype: 1"); the others are covered
      // without a server by bson_value_test.
      const bson_subtype_t subtypes[] = {BSON_SUBTYPE_BINARY, BSON_SUBTYPE_UUID_DEPRECATED, BSON_SUBTYPE_UUID};
      for (size_t i = 0; i < std::size(subtypes); ++i) {
        const std::string key = "b" + std::to_string(i);
        bson_append_binary(d, key.c_str(), -1, subtypes[i], bytes, 16);
      }
      bson_append_binary(d, "empty", -1, BSON_SUBTYPE_BINARY, bytes, 0);
      break;
    }
    case 5: {  // the rest
      bson_oid_t oid;
      bson_oid_init_from_string(&oid, "0123456789abcdefABCDEF01");
      BSON_APPEND_OID(d, "oid", &oid);
      BSON_APPEND_REGEX(d, "re", "^a.*b$", "imsx");
      BSON_APPEND_REGEX(d, "re_plain", "x", "");
      BSON_APPEND_TIMESTAMP(d, "ts", std::numeric_limits<uint32_t>::max(), std::numeric_limits<uint32_t>::max());
      BSON_APPEND_TIMESTAMP(d, "ts1", 1, 2);
      BSON_APPEND_MINKEY(d, "min");
      BSON_APPEND_MAXKEY(d, "max");
      BSON_APPEND_CODE(d, "code", "function () { return 1; }");
      BSON_APPEND_UTF8(d, "empty", "");
      BSON_APPEND_UTF8(d, "unicode", "Zoë 😀 \"q\" \\ \n\t");
      BSON_APPEND_NULL(d, "null");
      BSON_APPEND_BOOL(d, "t", true);
      BSON_APPEND_BOOL(d, "f", false);
      bson_t child;
      BSON_APPEND_ARRAY_BEGIN(d, "arr", &child);
      BSON_APPEND_DOUBLE(&child, "0", std::numeric_limits<double>::quiet_NaN());
      BSON_APPEND_INT32(&child, "1", -1);
      BSON_APPEND_DATE_TIME(&child, "2", std::numeric_limits<int64_t>::max());
      bson_append_array_end(d, &child);
      BSON_APPEND_DOCUMENT_BEGIN(d, "doc", &child);
      BSON_APPEND_DOUBLE(&child, "inf", kInf);
      BSON_APPEND_UTF8(&child, "k", "");
      bson_append_document_end(d, &child);
      break;
    }
    default:
      break;
  }
  return d;
}

constexpr int kKinds = 6;

class MongoTypesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uri_ = sluice::testing::require_service("mongodb").get("MONGODB_URI");
    if (uri_.empty()) return;
    mongoc_init();
    client_ = mongoc_client_new(uri_.c_str());
    db_ = unique_name("sluice_types");
  }
  void TearDown() override {
    if (client_ != nullptr) mongoc_client_destroy(client_);
  }

  void insert(const std::string& coll, const bson_t& doc) {
    mongoc_collection_t* c = mongoc_client_get_collection(client_, db_.c_str(), coll.c_str());
    bson_error_t e;
    EXPECT_TRUE(mongoc_collection_insert_one(c, &doc, nullptr, nullptr, &e)) << e.message;
    mongoc_collection_destroy(c);
  }

  std::string uri_;
  std::string db_;
  mongoc_client_t* client_ = nullptr;
};

TEST_F(MongoTypesTest, EveryBsonTypeWithItsExtremesRoundTripsThroughSnapshotAndStream) {
  const std::string coll = unique_name("types");
  std::map<int64_t, std::string> inserted;  // _id -> canonical Extended JSON
  // Documents 0..5 before the job starts (read by the snapshot), 100..105 after (read from the stream).
  for (int k = 0; k < kKinds; ++k) {
    bson_t* doc = document(k, k);
    inserted[k] = mongodb::bson_to_canonical_json(*doc);
    insert(coll, *doc);
    bson_destroy(doc);
  }
  ASSERT_FALSE(HasFailure()) << "the server refused a document";
  StreamEnvironment env([] {
    Configuration c;
    c.set(options::kParallelism, 1);
    c.set(options::kRestartStrategy, std::string("none"));
    return c;
  }());
  auto out = std::make_shared<ReceivedEvents>(kDeadline);
  env.from_source(MongoCdcSource::builder()
                      .uri(uri_)
                      .database(db_)
                      .collections({coll})
                      .poll_interval(5ms)
                      .start_mode(MongoStartMode::kInitial)
                      .int32_mapping(mongodb::Int32Mapping::kTagged)
                      .build(),
                  "mongo")
      .uid("mongo")
      .sink_to(receiving_sink(out))
      .uid("sink");
  JobClient job = env.execute_async("types");
  ASSERT_TRUE(out->wait_until([](const std::vector<ChangeEvent>& e) { return distinct_ids(e, kKinds); }))
      << "snapshot: got " << out->size();
  for (int k = 0; k < kKinds; ++k) {
    bson_t* doc = document(100 + k, k);
    inserted[100 + k] = mongodb::bson_to_canonical_json(*doc);
    insert(coll, *doc);
    bson_destroy(doc);
  }
  ASSERT_TRUE(out->wait_until([](const std::vector<ChangeEvent>& e) { return distinct_ids(e, 2 * kKinds); }))
      << "stream: got " << out->size();
  job.cancel();
  job.wait();

  std::map<int64_t, Value> after;
  for (const ChangeEvent& e : out->all()) {
    const int64_t id = e.key.find("_id")->as_int64();
    if (id >= 100) {
      EXPECT_EQ(e.op, ChangeOp::kCreate) << id;
    }
    after[id] = e.after;
  }
  ASSERT_EQ(after.size(), inserted.size());
  for (const auto& [id, json] : inserted) {
    SCOPED_TRACE("document " + std::to_string(id));
    ASSERT_TRUE(after.count(id));
    Result<std::string> back = mongodb::value_to_bson(after[id]);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(mongodb::bson_to_canonical_json(reinterpret_cast<const uint8_t*>(back->data()), back->size()), json)
        << after[id].to_json();
  }
  // JSON text: no value becomes null; the specials and the date ends as documented (docs/cdc.md).
  for (const int64_t base : {0, 100}) {
    const Value& dbl = after[base + 0];
    EXPECT_EQ(dbl.find("nan")->to_json(), "\"NaN\"");
    EXPECT_EQ(dbl.find("inf")->to_json(), "\"Infinity\"");
    EXPECT_EQ(dbl.find("ninf")->to_json(), "\"-Infinity\"");
    EXPECT_EQ(dbl.find("nzero")->to_json(), "-0.0");
    EXPECT_EQ(dbl.find("denorm")->to_json(), "5e-324");
    const Value& dec = after[base + 1];
    EXPECT_EQ(dec.find("d0")->to_json(), R"({"$numberDecimal":"NaN"})");
    EXPECT_EQ(dec.find("d2")->to_json(), R"({"$numberDecimal":"-Infinity"})");
    EXPECT_EQ(dec.find("d3")->to_json(), R"({"$numberDecimal":"-0"})");
    EXPECT_EQ(dec.find("d8")->to_json(), "1.50");
    const Value& dates = after[base + 2];
    EXPECT_EQ(dates.find("t0")->to_json(), R"({"$date":{"$numberLong":"9223372036854775807"}})");
    EXPECT_EQ(dates.find("t2")->to_json(), "\"+294247-01-10T04:00:54.775000Z\"");
    EXPECT_EQ(dates.find("t3")->to_json(), R"({"$date":{"$numberLong":"9223372036854776"}})");
    EXPECT_EQ(dates.find("t7")->to_json(), "\"0000-01-01T00:00:00.000000Z\"");
    EXPECT_EQ(dates.find("t8")->to_json(), "\"-0001-12-31T23:59:59.999000Z\"");
    const Value& ints = after[base + 3];
    EXPECT_EQ(ints.find("i64min")->to_json(), "-9223372036854775808");
    EXPECT_EQ(ints.find("i32min")->to_json(), R"({"$numberInt":"-2147483648"})");
    EXPECT_EQ(after[base + 5].find("arr")->to_json(),
              R"(["NaN",{"$numberInt":"-1"},{"$date":{"$numberLong":"9223372036854775807"}}])");
  }
}

}  // namespace
}  // namespace sluice
