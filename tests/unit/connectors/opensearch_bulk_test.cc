// Unit tests of the OpenSearch sink without a cluster: the NDJSON bulk encoding, bulk response parsing and item
// classification, the backoff on a manual clock, date-based index names, change-event versions, BulkSender's
// retries against a scripted transport, and the writer core (batching, flush interval, failed items).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/connectors/dead_letter_counts.h"
#include "sluice/connectors/opensearch/opensearch_sink.h"

namespace sluice::opensearch {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

BulkAction index_action(std::string index, std::string id, std::string doc,
                        std::optional<int64_t> version = std::nullopt) {
  BulkAction a;
  a.op = BulkOp::kIndex;
  a.index = std::move(index);
  a.id = std::move(id);
  a.document = std::move(doc);
  a.version = version;
  return a;
}

std::string encode(const BulkAction& a) {
  std::string out;
  Status st = append_bulk_action(a, out);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  return out;
}

TEST(BulkEncodingTest, IndexWithIdAndExternalVersion) {
  EXPECT_EQ(encode(index_action("charges", "c1", R"({"amount":5})", 42)),
            "{\"index\":{\"_index\":\"charges\",\"_id\":\"c1\",\"version\":42,\"version_type\":\"external\"}}\n"
            "{\"amount\":5}\n");
  BulkAction gte = index_action("charges", "c1", "{}", 7);
  gte.version_type = VersionType::kExternalGte;
  EXPECT_THAT(encode(gte), HasSubstr("\"version\":7,\"version_type\":\"external_gte\""));
}

TEST(BulkEncodingTest, AutoIdDeleteUpdateUpsertCreate) {
  EXPECT_EQ(encode(index_action("i", "", "{}")), "{\"index\":{\"_index\":\"i\"}}\n{}\n");
  BulkAction del;
  del.op = BulkOp::kDelete;
  del.index = "i";
  del.id = "d1";
  del.version = 9;
  EXPECT_EQ(encode(del),
            "{\"delete\":{\"_index\":\"i\",\"_id\":\"d1\",\"version\":9,\"version_type\":\"external\"}}\n");
  BulkAction up = index_action("i", "u1", R"({"a":1})");
  up.op = BulkOp::kUpdate;
  EXPECT_EQ(encode(up), "{\"update\":{\"_index\":\"i\",\"_id\":\"u1\"}}\n{\"doc\":{\"a\":1}}\n");
  up.op = BulkOp::kUpsert;
  EXPECT_EQ(encode(up), "{\"update\":{\"_index\":\"i\",\"_id\":\"u1\"}}\n{\"doc\":{\"a\":1},\"doc_as_upsert\":true}\n");
  BulkAction cr = index_action("i", "c", "{}");
  cr.op = BulkOp::kCreate;
  EXPECT_EQ(encode(cr), "{\"create\":{\"_index\":\"i\",\"_id\":\"c\"}}\n{}\n");
}

TEST(BulkEncodingTest, EscapesIndexAndId) {
  EXPECT_EQ(encode(index_action("i", "a\"b\\c\nd", "{}")),
            "{\"index\":{\"_index\":\"i\",\"_id\":\"a\\\"b\\\\c\\nd\"}}\n{}\n");
}

TEST(BulkEncodingTest, RejectsInvalidActions) {
  std::string out;
  BulkAction del;
  del.op = BulkOp::kDelete;
  del.index = "i";
  Status st = append_bulk_action(del, out);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message(), HasSubstr("without a document id"));
  BulkAction up = index_action("i", "u", "{}", 3);
  up.op = BulkOp::kUpdate;
  st = append_bulk_action(up, out);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message(), HasSubstr("external version"));
  st = append_bulk_action(index_action("", "x", "{}"), out);
  ASSERT_FALSE(st.ok());
  st = append_bulk_action(index_action("i", "x", ""), out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(out, "") << "a rejected action appends nothing";
}

// A response OpenSearch 2.19.6 gave (copied from curl): created, version conflict, mapping error, delete of a
// missing id, updated, upsert.
constexpr std::string_view kFullResponse =
    R"({"took":70,"errors":true,"items":[)"
    R"({"index":{"_index":"t1","_id":"a","_version":5,"result":"created","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":0,"_primary_term":1,"status":201}},)"
    R"({"index":{"_index":"t1","_id":"a","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[a]: version conflict, current version [5] is higher or equal to the one provided [3]","index":"t1","shard":"0","index_uuid":"hbX4RmK9RiSNkAgDy01upw"}}},)"
    R"({"index":{"_index":"t1","_id":"b","status":400,"error":{"type":"mapper_parsing_exception","reason":"failed to parse field [n] of type [long] in document with id 'b'. Preview of field's value: 'notanumber'","caused_by":{"type":"illegal_argument_exception","reason":"For input string: \"notanumber\""}}}},)"
    R"({"delete":{"_index":"t1","_id":"zz","_version":7,"result":"not_found","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":1,"_primary_term":1,"status":404}},)"
    R"({"index":{"_index":"t1","_id":"a","_version":5,"result":"updated","status":200}},)"
    R"({"update":{"_index":"t1","_id":"c","_version":1,"result":"created","status":201}}]})";

TEST(BulkResponseTest, ParsesFullResponse) {
  Result<BulkResponse> r = parse_bulk_response(kFullResponse);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->errors);
  ASSERT_EQ(r->items.size(), 6u);
  EXPECT_EQ(r->items[0].op, "index");
  EXPECT_EQ(r->items[0].status, 201);
  EXPECT_EQ(r->items[0].error, "");
  EXPECT_EQ(r->items[1].status, 409);
  EXPECT_EQ(r->items[1].error_type, "version_conflict_engine_exception");
  EXPECT_EQ(r->items[2].status, 400);
  EXPECT_EQ(r->items[2].error_type, "mapper_parsing_exception");
  EXPECT_THAT(r->items[2].error, HasSubstr("mapper_parsing_exception: failed to parse field [n] of type [long]"));
  EXPECT_THAT(r->items[2].error, HasSubstr("caused by illegal_argument_exception: For input string"));
  EXPECT_EQ(r->items[3].op, "delete");
  EXPECT_EQ(r->items[3].status, 404);
  EXPECT_EQ(r->items[5].op, "update");
}

TEST(BulkResponseTest, ParsesFilteredResponses) {
  Result<BulkResponse> r = parse_bulk_response(
      R"({"errors":true,"items":[{"index":{"status":201}},{"index":{"status":429,"error":{"type":"es_rejected_execution_exception","reason":"rejected execution"}}}]})");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->items.size(), 2u);
  EXPECT_EQ(r->items[1].status, 429);
  EXPECT_EQ(r->items[1].error, "es_rejected_execution_exception: rejected execution");
  Result<BulkResponse> none = parse_bulk_response(R"({"errors":false})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->errors);
  EXPECT_TRUE(none->items.empty());
  Result<BulkResponse> text_error =
      parse_bulk_response(R"({"errors":true,"items":[{"index":{"status":400,"error":"x"}}]})");
  ASSERT_TRUE(text_error.ok());
  EXPECT_EQ(text_error->items[0].error, "x");
}

TEST(BulkResponseTest, RejectsOtherBodies) {
  for (std::string_view body : {"", "<html>bad gateway</html>", "[]", R"({"items":[]})",
                                R"({"errors":true,"items":[{"index":{}}]})", R"({"errors":true,"items":[1]})"}) {
    Result<BulkResponse> r = parse_bulk_response(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().code(), ErrorCode::kConnector);
    EXPECT_THAT(r.error().message(), HasSubstr("unreadable _bulk response")) << body;
  }
}

TEST(BulkResponseTest, ClassifiesItems) {
  auto item = [](int status, std::string type = "") {
    BulkItemResult r;
    r.status = status;
    r.error_type = std::move(type);
    return r;
  };
  EXPECT_EQ(classify_item(item(201), BulkOp::kIndex, false), ItemOutcome::kSuccess);
  EXPECT_EQ(classify_item(item(200), BulkOp::kUpdate, false), ItemOutcome::kSuccess);
  EXPECT_EQ(classify_item(item(404), BulkOp::kDelete, true), ItemOutcome::kSuccess);
  EXPECT_EQ(classify_item(item(404, "document_missing_exception"), BulkOp::kUpdate, false), ItemOutcome::kFailed);
  EXPECT_EQ(classify_item(item(409, "version_conflict_engine_exception"), BulkOp::kIndex, true),
            ItemOutcome::kVersionConflict);
  EXPECT_EQ(classify_item(item(409, "version_conflict_engine_exception"), BulkOp::kCreate, false),
            ItemOutcome::kFailed);
  EXPECT_EQ(classify_item(item(429), BulkOp::kIndex, true), ItemOutcome::kRetry);
  EXPECT_EQ(classify_item(item(503), BulkOp::kIndex, false), ItemOutcome::kRetry);
  EXPECT_EQ(classify_item(item(400, "mapper_parsing_exception"), BulkOp::kIndex, true), ItemOutcome::kFailed);
  EXPECT_TRUE(is_retryable_status(429));
  EXPECT_TRUE(is_retryable_status(502));
  EXPECT_FALSE(is_retryable_status(400));
  EXPECT_FALSE(is_retryable_status(413));
}

TEST(BackoffTest, ExponentialDelaysOnAManualClock) {
  BackoffPolicy p;
  p.initial = 100ms;
  p.max = 1000ms;
  p.multiplier = 3.0;
  p.max_retries = 5;
  EXPECT_EQ(p.delay_ms(1), 100);
  EXPECT_EQ(p.delay_ms(2), 300);
  EXPECT_EQ(p.delay_ms(3), 900);
  EXPECT_EQ(p.delay_ms(4), 1000);
  EXPECT_EQ(p.delay_ms(60), 1000);
  ManualClock clock(10'000);
  Backoff b(p, clock);
  std::vector<int64_t> waits;
  while (std::optional<TimestampMs> at = b.next_attempt()) {
    waits.push_back(*at - clock.now_ms());
    clock.set(*at);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 300, 900, 1000, 1000}));
  EXPECT_EQ(b.retries(), 5);
  EXPECT_EQ(clock.now_ms(), 10'000 + 3300);
  BackoffPolicy none = p;
  none.max_retries = 0;
  Backoff nb(none, clock);
  EXPECT_FALSE(nb.next_attempt().has_value());
}

TEST(DateIndexTest, FormatsUtcFields) {
  Result<DateIndexPattern> p = DateIndexPattern::parse("charges-{yyyy.MM.dd}");
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  // 2026-11-30T23:59:59.999Z and the next millisecond.
  EXPECT_EQ(p->format(1796083199999), "charges-2026.11.30");
  EXPECT_EQ(p->format(1796083200000), "charges-2026.12.01");
  EXPECT_EQ(p->format(0), "charges-1970.01.01");
  EXPECT_EQ(p->format(-1), "charges-1969.12.31");
  Result<DateIndexPattern> q = DateIndexPattern::parse("logs-{yy-MM}-x-{dd_HH.mm.ss}");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format(1796083199999), "logs-26-11-x-30_23.59.59");
  EXPECT_EQ(DateIndexPattern::parse("plain")->format(5), "plain");
}

TEST(DateIndexTest, RejectsBadPatterns) {
  Result<DateIndexPattern> open = DateIndexPattern::parse("a-{yyyy");
  ASSERT_FALSE(open.ok());
  EXPECT_THAT(open.error().message(), HasSubstr("not closed"));
  Result<DateIndexPattern> unknown = DateIndexPattern::parse("a-{yyyy.QQ}");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.error().message(), HasSubstr("unknown field 'QQ'"));
}

TEST(ChangeEventVersionTest, PostgresLsn) {
  EXPECT_EQ(postgres_lsn_version("16/B374D848").value_or_throw(), (int64_t{0x16} << 32) | 0xB374D848);
  EXPECT_EQ(postgres_lsn_version("0/0").value_or_throw(), 0);
  EXPECT_LT(postgres_lsn_version("0/FFFFFFFF").value_or_throw(), postgres_lsn_version("1/0").value_or_throw());
  EXPECT_FALSE(postgres_lsn_version("16B374D848").ok());
  EXPECT_FALSE(postgres_lsn_version("1/G").ok());
  EXPECT_FALSE(postgres_lsn_version("100000000/0").ok());
  EXPECT_FALSE(postgres_lsn_version("FFFFFFFF/0").ok()) << "beyond int64";
}

TEST(ChangeEventVersionTest, MongoResumeTokens) {
  // mongo-java-server: the BSON timestamp's value in hex (t = 0x65a1b2c3, i = 7).
  EXPECT_EQ(mongodb_resume_token_version(R"({"_data":"65a1b2c300000007"})").value_or_throw(),
            (int64_t{0x65a1b2c3} << 32) | 7);
  // A server's KeyString token: 0x82, then the timestamp's 8 bytes big-endian, then more fields.
  EXPECT_EQ(mongodb_resume_token_version(R"({"_data":"8265A1B2C3000000072B022C0100296E5A1004"})").value_or_throw(),
            (int64_t{0x65a1b2c3} << 32) | 7);
  EXPECT_FALSE(mongodb_resume_token_version(R"({"_data":"9965A1B2C3000000072B022C01"})").ok());
  EXPECT_FALSE(mongodb_resume_token_version(R"({"token":"x"})").ok());
  EXPECT_FALSE(mongodb_resume_token_version("not json").ok());
}

TEST(ChangeEventVersionTest, EventHelpers) {
  cdc::ChangeEvent e;
  e.op = cdc::ChangeOp::kUpdate;
  e.key = Value::object({{"id", Value("c-1")}});
  e.after = Value::object({{"id", Value("c-1")}, {"amount", Value(int64_t{5})}});
  e.source.connector = "postgres";
  e.source.position = "0/16B3748";
  EXPECT_EQ(change_event_version(e).value_or_throw(), 0x16B3748);
  EXPECT_EQ(change_event_id(e), "c-1");
  EXPECT_EQ(change_event_op(e), BulkOp::kIndex);
  e.op = cdc::ChangeOp::kDelete;
  EXPECT_EQ(change_event_op(e), BulkOp::kDelete);
  e.key = Value::object({{"_id", Value(int64_t{42})}});
  EXPECT_EQ(change_event_id(e), "42");
  e.key = Value::object({{"a", Value(int64_t{1})}, {"b", Value("x")}});
  EXPECT_EQ(change_event_id(e), R"({"a":1,"b":"x"})");
  e.source.connector = "mysql";
  Result<int64_t> v = change_event_version(e);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.error().message(), HasSubstr("no external version for connector 'mysql'"));
  e.source.connector = "postgres";
  e.source.position = "garbage";
  ASSERT_FALSE(change_event_version(e).ok());
  EXPECT_THAT(change_event_version(e).error().message(), HasSubstr("position 'garbage'"));
}

// A transport that answers from a script and records every body. Thread-safe (the writer core calls it from its
// I/O thread).
class ScriptedTransport final : public BulkTransport {
 public:
  void push(HttpResult r) {
    std::lock_guard lock(mu_);
    script_.push_back(std::move(r));
  }
  HttpResult post_bulk(std::string_view body) override {
    std::lock_guard lock(mu_);
    bodies_.emplace_back(body);
    cv_.notify_all();
    if (script_.empty()) return ok_for(body);
    HttpResult r = std::move(script_.front());
    script_.pop_front();
    return r;
  }
  std::vector<std::string> bodies() const {
    std::lock_guard lock(mu_);
    return bodies_;
  }
  /// Waits until `n` requests arrived or `timeout` passed.
  bool wait_for_requests(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return bodies_.size() >= n; });
  }
  /// A 200 response accepting every action of `body`.
  static HttpResult ok_for(std::string_view body) {
    std::string items;
    size_t actions = 0;
    size_t pos = 0;
    while (pos < body.size()) {
      const size_t nl = body.find('\n', pos);
      std::string_view line = body.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.starts_with("{\"delete\"")) {
        ++actions;
      } else if (line.starts_with("{\"index\"") || line.starts_with("{\"create\"") || line.starts_with("{\"update\"")) {
        ++actions;
        pos = body.find('\n', pos) + 1;  // the document line
      }
    }
    for (size_t i = 0; i < actions; ++i)
      items += std::string(i ? "," : "") + R"({"index":{"status":201}})";
    return HttpResult{false, 200, R"({"errors":false,"items":[)" + items + "]}", ""};
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HttpResult> script_;
  std::vector<std::string> bodies_;
};

HttpResult http(int status, std::string body) {
  return HttpResult{false, status, std::move(body), ""};
}

BulkBatch batch_of(std::initializer_list<BulkAction> actions) {
  BulkBatch b;
  for (const BulkAction& a : actions)
    EXPECT_TRUE(b.add(a, "pos-" + a.id).ok());
  return b;
}

struct SenderHarness {
  ScriptedTransport transport;
  ManualClock clock{1'000};
  std::vector<int64_t> sleeps;
  OpenSearchSinkStats stats;
  BackoffPolicy policy{100ms, 1000ms, 2.0, 3};
  BulkSender sender{transport, policy, clock,
                    [this](int64_t ms) {
                      sleeps.push_back(ms);
                      clock.advance(ms);
                      return true;
                    },
                    &stats};
};

TEST(BulkSenderTest, RetriesWholeRequestOn429And5xxAndNetworkErrors) {
  SenderHarness h;
  h.transport.push(http(429, R"({"error":"too many requests"})"));
  h.transport.push(HttpResult{true, 0, "", "Couldn't connect to server"});
  h.transport.push(http(503, "unavailable"));
  BulkBatch b = batch_of({index_action("i", "1", "{}"), index_action("i", "2", "{}")});
  BulkSender::Outcome o = h.sender.send(b);
  EXPECT_FALSE(o.error.has_value()) << o.error->to_string();
  EXPECT_EQ(o.acknowledged, 2);
  EXPECT_EQ(h.sleeps, (std::vector<int64_t>{100, 200, 400}));
  std::vector<std::string> bodies = h.transport.bodies();
  ASSERT_EQ(bodies.size(), 4u);
  for (const std::string& body : bodies)
    EXPECT_EQ(body, b.body) << "a whole-request retry resends everything";
  EXPECT_EQ(h.stats.retries.load(), 3);
  EXPECT_EQ(h.stats.requests.load(), 4);
}

TEST(BulkSenderTest, RetriesOnlyTheItemsThatFailedWith429Or5xx) {
  SenderHarness h;
  h.transport.push(http(
      200,
      R"({"errors":true,"items":[{"index":{"status":201}},)"
      R"({"index":{"status":429,"error":{"type":"es_rejected_execution_exception","reason":"queue full"}}},)"
      R"({"delete":{"status":404}},)"
      R"({"index":{"status":503,"error":{"type":"unavailable_shards_exception","reason":"primary not active"}}}]})"));
  h.transport.push(
      http(200, R"({"errors":true,"items":[{"index":{"status":201}},)"
                R"({"index":{"status":409,"error":{"type":"version_conflict_engine_exception","reason":"newer"}}}]})"));
  BulkAction del;
  del.op = BulkOp::kDelete;
  del.index = "i";
  del.id = "3";
  BulkBatch b = batch_of({index_action("i", "1", R"({"n":1})"), index_action("i", "2", R"({"n":2})", 5), del,
                          index_action("i", "4", R"({"n":4})", 6)});
  BulkSender::Outcome o = h.sender.send(b);
  ASSERT_FALSE(o.error.has_value()) << o.error->to_string();
  EXPECT_EQ(o.acknowledged, 4);
  EXPECT_EQ(o.version_conflicts, 1);
  EXPECT_TRUE(o.failed.empty());
  std::vector<std::string> bodies = h.transport.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(bodies[1],
            "{\"index\":{\"_index\":\"i\",\"_id\":\"2\",\"version\":5,\"version_type\":\"external\"}}\n{\"n\":2}\n"
            "{\"index\":{\"_index\":\"i\",\"_id\":\"4\",\"version\":6,\"version_type\":\"external\"}}\n{\"n\":4}\n");
  EXPECT_EQ(h.sleeps, (std::vector<int64_t>{100}));
  EXPECT_EQ(h.stats.retried_items.load(), 2);
}

TEST(BulkSenderTest, ReportsNonRetryableItemsWithIndexIdAndReason) {
  SenderHarness h;
  h.transport.push(http(200, std::string(kFullResponse)));
  BulkAction del;
  del.op = BulkOp::kDelete;
  del.index = "t1";
  del.id = "zz";
  del.version = 7;
  BulkAction up = index_action("t1", "c", R"({"n":4})");
  up.op = BulkOp::kUpsert;
  BulkBatch b =
      batch_of({index_action("t1", "a", R"({"n":1})", 5), index_action("t1", "a", R"({"n":2})", 3),
                index_action("t1", "b", R"({"n":"notanumber"})"), del, index_action("t1", "a", R"({"n":3})", 5), up});
  BulkSender::Outcome o = h.sender.send(b);
  ASSERT_FALSE(o.error.has_value()) << o.error->to_string();
  EXPECT_EQ(o.acknowledged, 5);
  EXPECT_EQ(o.version_conflicts, 1);
  ASSERT_EQ(o.failed.size(), 1u);
  const FailedItem& f = o.failed[0];
  EXPECT_EQ(f.index, "t1");
  EXPECT_EQ(f.id, "b");
  EXPECT_EQ(f.action, "index");
  EXPECT_EQ(f.status, 400);
  EXPECT_EQ(f.position, "pos-b");
  EXPECT_EQ(f.document, R"({"n":"notanumber"})");
  EXPECT_THAT(f.describe(), HasSubstr("index 't1', id 'b', action index, position pos-b, status 400: "
                                      "mapper_parsing_exception: failed to parse field [n]"));
  EXPECT_EQ(
      f.to_dead_letter().to_json(),
      R"({"sink":"opensearch","index":"t1","id":"b","action":"index","version":null,"status":400,)"
      R"("reason":"mapper_parsing_exception","error":)"
      R"("mapper_parsing_exception: failed to parse field [n] of type [long] in document with id 'b'. Preview of )"
      R"(field's value: 'notanumber'; caused by illegal_argument_exception: For input string: \"notanumber\"",)"
      R"("position":"pos-b","document":"{\"n\":\"notanumber\"}"})");
  EXPECT_TRUE(h.sleeps.empty());
}

// The dead-letter reason is the cluster's error type, a bounded set; an error without one falls back to the status.
TEST(FailedItemTest, ReasonCodeIsTheErrorTypeOrTheStatus) {
  FailedItem f;
  f.status = 400;
  f.error = "mapper_parsing_exception: failed to parse field [n] of type [long]";
  EXPECT_EQ(f.reason_code(), "mapper_parsing_exception");
  f.status = 409;
  f.error = "version_conflict_engine_exception: [b]: version conflict";
  EXPECT_EQ(f.reason_code(), "version_conflict_engine_exception");
  f.status = 500;
  f.error = "Internal Server Error: something odd";  // not an identifier: a free text, not a type
  EXPECT_EQ(f.reason_code(), "status-500");
  f.error.clear();
  EXPECT_EQ(f.reason_code(), "status-500");
}

TEST(BulkSenderTest, GivesUpAfterMaxRetries) {
  SenderHarness h;
  for (int i = 0; i < 4; ++i)
    h.transport.push(http(429, "slow down"));
  BulkBatch b = batch_of({index_action("i", "1", "{}")});
  BulkSender::Outcome o = h.sender.send(b);
  ASSERT_TRUE(o.error.has_value());
  EXPECT_THAT(o.error->message(), HasSubstr("gave up after 3 retries: HTTP 429: slow down"));
  EXPECT_EQ(h.sleeps, (std::vector<int64_t>{100, 200, 400}));
  EXPECT_EQ(h.transport.bodies().size(), 4u);
}

// A certificate the sink does not trust is a setting to fix, not a network blip: no retry, and the error is marked
// so the restart strategy does not restart the job into the same failure.
TEST(BulkSenderTest, DoesNotRetryAPermanentTransportErrorAndMarksItNonRecoverable) {
  SenderHarness h;
  h.transport.push(HttpResult{true, 0, "", "SSL peer certificate or SSH remote key was not OK (https://127.0.0.1:9200)",
                              /*permanent=*/true});
  BulkBatch b = batch_of({index_action("i", "1", "{}")});
  BulkSender::Outcome o = h.sender.send(b);
  ASSERT_TRUE(o.error.has_value());
  EXPECT_THAT(o.error->message(), HasSubstr("SSL peer certificate or SSH remote key was not OK"));
  EXPECT_THAT(o.error->message(), HasSubstr("not recoverable by a restart"));
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_EQ(h.transport.bodies().size(), 1u);
}

TEST(BulkSenderTest, DoesNotRetryOtherStatuses) {
  SenderHarness h;
  h.transport.push(http(413, "too large"));
  BulkBatch b = batch_of({index_action("i", "1", "{}")});
  BulkSender::Outcome o = h.sender.send(b);
  ASSERT_TRUE(o.error.has_value());
  EXPECT_THAT(o.error->message(), HasSubstr("HTTP 413 (request too large"));
  EXPECT_TRUE(h.sleeps.empty());
  h.transport.push(http(200, R"({"errors":true,"items":[]})"));
  o = h.sender.send(b);
  ASSERT_TRUE(o.error.has_value());
  EXPECT_THAT(o.error->message(), HasSubstr("0 items for 1 actions"));
}

TEST(BulkSenderTest, StopsWhenTheSleeperIsInterrupted) {
  ScriptedTransport transport;
  ManualClock clock;
  transport.push(http(503, "x"));
  BulkSender sender(
      transport, BackoffPolicy{}, clock, [](int64_t) { return false; }, nullptr);
  BulkBatch b = batch_of({index_action("i", "1", "{}")});
  BulkSender::Outcome o = sender.send(b);
  EXPECT_TRUE(o.abandoned);
  EXPECT_EQ(transport.bodies().size(), 1u);
}

// ---- the writer core (I/O thread) ----

OpenSearchSinkOptions core_options() {
  OpenSearchSinkOptions o;
  o.urls = {"http://unused"};
  o.flush_interval = 0ms;
  o.backoff = BackoffPolicy{1ms, 1ms, 1.0, 2};
  return o;
}

TEST(OpenSearchWriterCoreTest, SendsFullRequestsAndFlushesTheRest) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport* t = transport.get();
  OpenSearchSinkOptions o = core_options();
  o.max_batch_actions = 2;
  auto stats = std::make_shared<OpenSearchSinkStats>();
  OpenSearchWriterCore core(o, std::move(transport), SystemClock::instance(), nullptr, stats, "test writer");
  for (int i = 0; i < 5; ++i)
    core.add(index_action("i", std::to_string(i), "{}"));
  core.flush();
  std::vector<std::string> bodies = t->bodies();
  ASSERT_EQ(bodies.size(), 3u);
  EXPECT_THAT(bodies[0], HasSubstr("\"_id\":\"0\""));
  EXPECT_THAT(bodies[0], HasSubstr("\"_id\":\"1\""));
  EXPECT_THAT(bodies[2], HasSubstr("\"_id\":\"4\""));
  EXPECT_EQ(stats->acknowledged.load(), 5);
  core.flush();  // nothing buffered: returns at once
  EXPECT_EQ(t->bodies().size(), 3u);
  core.close();
}

TEST(OpenSearchWriterCoreTest, FlushIntervalSendsWithoutAFlush) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport* t = transport.get();
  OpenSearchSinkOptions o = core_options();
  o.flush_interval = 50ms;
  OpenSearchWriterCore core(o, std::move(transport), SystemClock::instance(), nullptr, nullptr, "test writer");
  core.add(index_action("i", "a", "{}"));
  EXPECT_TRUE(t->wait_for_requests(1, 10s)) << "the flush interval did not send the open request";
  EXPECT_THAT(t->bodies()[0], HasSubstr("\"_id\":\"a\""));
  core.close();
}

TEST(OpenSearchWriterCoreTest, FailedItemFailsTheFlushNamingIndexIdAndReason) {
  auto transport = std::make_unique<ScriptedTransport>();
  transport->push(http(200, R"({"errors":true,"items":[{"index":{"status":201}},{"index":{"status":400,)"
                            R"("error":{"type":"mapper_parsing_exception","reason":"failed to parse field [n]"}}}]})"));
  OpenSearchWriterCore core(core_options(), std::move(transport), SystemClock::instance(), nullptr, nullptr,
                            "OpenSearch sink 's' subtask 0");
  core.add(index_action("charges", "ok", "{}"));
  core.add(index_action("charges", "bad", R"({"n":"x"})"));
  try {
    core.flush();
    FAIL() << "flush() succeeded although an item failed";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kConnector);
    EXPECT_THAT(e.error().message(), HasSubstr("OpenSearch sink 's' subtask 0"));
    EXPECT_THAT(e.error().message(),
                HasSubstr("index 'charges', id 'bad', action index, status 400: mapper_parsing_exception: failed to "
                          "parse field [n]"));
  }
  EXPECT_THROW(core.add(index_action("charges", "later", "{}")), SluiceException) << "the error sticks";
}

TEST(OpenSearchWriterCoreTest, FailedItemGoesToTheDeadLetterFile) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("sluice-os-dlq-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  auto dead_letter = DeadLetterFile::open(path.string()).value_or_throw();
  auto transport = std::make_unique<ScriptedTransport>();
  transport->push(http(200,
                       R"({"errors":true,"items":[{"index":{"status":400,)"
                       R"("error":{"type":"mapper_parsing_exception","reason":"bad n"}}},{"index":{"status":201}}]})"));
  OpenSearchSinkOptions o = core_options();
  o.on_failed_item = BadRecordPolicy::kDeadLetter;
  o.dead_letter_path = path.string();
  auto stats = std::make_shared<OpenSearchSinkStats>();
  OpenSearchWriterCore core(o, std::move(transport), SystemClock::instance(), dead_letter, stats, "w");
  core.add(index_action("charges", "bad", R"({"n":"x"})", 17), "0/AB");
  core.add(index_action("charges", "ok", "{}"));
  core.flush();
  EXPECT_EQ(stats->dead_letters.load(), 1);
  EXPECT_EQ(stats->acknowledged.load(), 1);
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, R"({"sink":"opensearch","index":"charges","id":"bad","action":"index","version":17,"status":400,)"
                  R"("reason":"mapper_parsing_exception","error":"mapper_parsing_exception: bad n","position":"0/AB",)"
                  R"("document":"{\"n\":\"x\"}"})");
  EXPECT_FALSE(std::getline(in, line));
  EXPECT_EQ(dead_letters_appended_by_reason(path.string()),
            (std::map<std::string, int64_t>{{"mapper_parsing_exception", 1}}));
  core.close();
  std::filesystem::remove(path);
}

TEST(OpenSearchWriterCoreTest, RetriesExhaustedFailTheFlush) {
  auto transport = std::make_unique<ScriptedTransport>();
  for (int i = 0; i < 3; ++i)
    transport->push(http(503, "down"));
  OpenSearchWriterCore core(core_options(), std::move(transport), SystemClock::instance(), nullptr, nullptr, "w");
  core.add(index_action("i", "1", "{}"));
  try {
    core.flush();
    FAIL() << "flush() succeeded although every attempt failed";
  } catch (const SluiceException& e) {
    EXPECT_THAT(e.error().message(), HasSubstr("gave up after 2 retries: HTTP 503: down"));
  }
}

TEST(OpenSearchSinkBuilderTest, ValidatesSettings) {
  EXPECT_FALSE(OpenSearchSink<Value>::builder().index("i").try_build().ok()) << "no URL";
  EXPECT_FALSE(OpenSearchSink<Value>::builder().url("ftp://x").index("i").try_build().ok());
  EXPECT_FALSE(OpenSearchSink<Value>::builder().url("http://x").try_build().ok()) << "no index";
  EXPECT_FALSE(OpenSearchSink<Value>::builder()
                   .url("http://x")
                   .date_index("a-{yyyy.QQ}", [](const Value&) { return int64_t{0}; })
                   .try_build()
                   .ok());
  EXPECT_FALSE(OpenSearchSink<Value>::builder()
                   .url("http://x")
                   .index("i")
                   .on_failed_item(BadRecordPolicy::kDeadLetter)
                   .try_build()
                   .ok());
  EXPECT_TRUE(OpenSearchSink<Value>::builder().url("http://x").index("i").try_build().ok());
  EXPECT_TRUE(
      OpenSearchSink<cdc::ChangeEvent>::builder().url("http://x").index("i").change_event_defaults().try_build().ok());
}

}  // namespace
}  // namespace sluice::opensearch
