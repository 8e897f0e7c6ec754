// The OpenSearch sink against the real node of scripts/services/opensearch (docs/services.md):
//  * change events become documents (index) and deletes, readable after _refresh; date-based index names;
//  * an older version replayed does not overwrite a newer one (external versioning; 409 counts as success);
//  * a mapping error goes to the dead-letter file with the item's error, or fails the job naming index, id, reason;
//  * a job with checkpoints and injected failures restarts and ends with exactly the expected documents;
//  * retries on 429 / 5xx against a small local HTTP server (a stand-in: the real node cannot be made to throttle
//    on demand).
// Run: scripts/services/run-with opensearch -- build/<dir>/tests/opensearch_sink_integration_test
// Failure points come from a fixed seed (SLUICE_TEST_SEED overrides it), printed by the test.
#include "sluice/connectors/opensearch/opensearch_sink.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "integration/test_util/failures.h"
#include "integration/test_util/services.h"
#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/core/config.h"

namespace sluice {
namespace {

using sluice::testing::test_seed;

namespace fs = std::filesystem;
namespace os = sluice::opensearch;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

/// A small REST client of the node, for setting up indices and reading documents back.
class Node {
 public:
  explicit Node(const std::string& url) : client_(url) {
    client_.set_connection_timeout(10);
    client_.set_read_timeout(60);
  }
  /// Sends a request; returns the status (0 on a transport error) and fills `body`.
  int call(const std::string& method, const std::string& path, const std::string& payload, std::string* body) {
    httplib::Result r = method == "GET"      ? client_.Get(path.c_str())
                        : method == "DELETE" ? client_.Delete(path.c_str())
                        : method == "PUT"    ? client_.Put(path.c_str(), payload, "application/json")
                                             : client_.Post(path.c_str(), payload, "application/json");
    if (!r) return 0;
    if (body != nullptr) *body = r->body;
    return r->status;
  }
  void create_index(const std::string& index, const std::string& settings_and_mappings) {
    std::string body;
    ASSERT_EQ(call("PUT", "/" + index, settings_and_mappings, &body), 200) << body;
  }
  void refresh(const std::string& index) {
    std::string body;
    ASSERT_EQ(call("POST", "/" + index + "/_refresh", "", &body), 200) << body;
  }
  int64_t count(const std::string& index) {
    refresh(index);
    std::string body;
    EXPECT_EQ(call("GET", "/" + index + "/_count", "", &body), 200) << body;
    Result<Value> v = Value::from_json(body);
    if (!v.ok() || v->find("count") == nullptr) return -1;
    return v->find("count")->as_int64();
  }
  /// The `_source` of a document, or null when absent.
  Value source(const std::string& index, const std::string& id) {
    std::string body;
    const int status = call("GET", "/" + index + "/_doc/" + id, "", &body);
    if (status == 404) return Value();
    EXPECT_EQ(status, 200) << body;
    Result<Value> v = Value::from_json(body);
    if (!v.ok() || v->find("_source") == nullptr) return Value();
    return *v->find("_source");
  }
  /// Every document of `index` (up to 10000): id -> _source.
  std::map<std::string, Value> all(const std::string& index) {
    refresh(index);
    std::string body;
    EXPECT_EQ(call("POST", "/" + index + "/_search", R"({"size":10000,"query":{"match_all":{}}})", &body), 200) << body;
    std::map<std::string, Value> docs;
    Result<Value> v = Value::from_json(body);
    if (!v.ok()) return docs;
    for (const Value& hit : v->find("hits")->find("hits")->as_array())
      docs[std::string(hit.find("_id")->as_string())] = *hit.find("_source");
    return docs;
  }

 private:
  httplib::Client client_;
};

std::string unique_index(std::string_view what) {
  static std::atomic<int> counter{0};
  std::string name =
      "sluice-it-" + std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

cdc::ChangeEvent pg_event(cdc::ChangeOp op, const std::string& id, int64_t amount, const std::string& lsn,
                          int64_t ts_ms = 1796083199999) {
  cdc::ChangeEvent e;
  e.op = op;
  e.key = Value::object({{"id", Value(id)}});
  Value row = Value::object({{"id", Value(id)}, {"amount", Value(amount)}, {"status", Value("paid")}});
  if (op == cdc::ChangeOp::kDelete) {
    e.before = row;
  } else {
    e.after = row;
  }
  e.source.connector = "postgres";
  e.source.database = "payments";
  e.source.collection = "public.charges";
  e.source.position = lsn;
  e.source.ts_ms = ts_ms;
  return e;
}

std::string lsn(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0/%llX", static_cast<unsigned long long>(n));
  return buf;
}

/// Runs `events` through a one-source job (parallelism 1, so per-entity order is the list's) into `sink`.
JobResult run_events(std::vector<cdc::ChangeEvent> events, std::shared_ptr<OpenSearchSink<cdc::ChangeEvent>> sink,
                     int sink_parallelism = 2) {
  Configuration c;
  c.set(options::kParallelism, 1);
  StreamEnvironment env(c);
  env.from_source(datagen::from_collection(std::move(events)), "changes")
      .key_by([](const cdc::ChangeEvent& e) { return os::change_event_id(e); })
      .sink_to(std::move(sink), "OpenSearch")
      .set_parallelism(sink_parallelism);
  return env.execute("opensearch events");
}

class OpenSearchSinkIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = sluice::testing::require_service("opensearch").get("OPENSEARCH_URL");
    if (url_.empty()) return;
    node_ = std::make_unique<Node>(url_);
    dir_ = fs::temp_directory_path() / ("sluice-os-it-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string url_;
  std::unique_ptr<Node> node_;
  fs::path dir_;
};

TEST_F(OpenSearchSinkIntegrationTest, IndexesChangeEventsAndDeletes) {
  const std::string index = unique_index("cdc");
  std::vector<cdc::ChangeEvent> events;
  int64_t pos = 100;
  for (int i = 0; i < 300; ++i)
    events.push_back(pg_event(cdc::ChangeOp::kCreate, "c" + std::to_string(i), i, lsn(pos++)));
  for (int i = 0; i < 300; i += 2)
    events.push_back(pg_event(cdc::ChangeOp::kUpdate, "c" + std::to_string(i), 1000 + i, lsn(pos++)));
  for (int i = 0; i < 300; i += 3)
    events.push_back(pg_event(cdc::ChangeOp::kDelete, "c" + std::to_string(i), 0, lsn(pos++)));
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder()
                  .url(url_)
                  .index(index)
                  .change_event_defaults()
                  .batch(64, 1 << 20)
                  .build();
  JobResult r = run_events(events, sink);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");

  std::map<std::string, Value> docs = node_->all(index);
  int expected = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string id = "c" + std::to_string(i);
    if (i % 3 == 0) {
      EXPECT_EQ(docs.count(id), 0u) << id << " was deleted";
      continue;
    }
    ++expected;
    ASSERT_EQ(docs.count(id), 1u) << id;
    EXPECT_EQ(docs[id].find("amount")->as_int64(), i % 2 == 0 ? 1000 + i : i) << id;
  }
  EXPECT_EQ(static_cast<int>(docs.size()), expected);
  EXPECT_EQ(node_->count(index), expected);
  EXPECT_EQ(sink->stats()->acknowledged.load(), static_cast<int64_t>(events.size()));
  EXPECT_EQ(sink->stats()->dead_letters.load(), 0);
}

// Decimals longer than a double holds (issue 14): under dynamic mapping a JSON number with a fraction is indexed as
// a float, so 12345678901234567890.123456789 and ...788 become the same value to every query. By default the sink
// writes decimals as strings of their exact text (Debezium's decimal.handling.mode=string): _source holds the text,
// the field is mapped text + keyword, and a term query tells the two values apart. DecimalHandling::kNumber keeps
// the old JSON numbers, and the node's float mapping then rounds them (what docs/connectors.md says).
TEST_F(OpenSearchSinkIntegrationTest, LongDecimalsAreExactUnderDynamicMappingAsStrings) {
  if (url_.empty()) GTEST_SKIP();
  const std::string exact = "12345678901234567890.123456789";
  const std::string neighbour = "12345678901234567890.123456788";
  const std::string tiny = "0.1000000000000000055511151231257827";  // 34 significant digits
  auto event = [](const std::string& id, const std::string& amount, const std::string& small, int n) {
    cdc::ChangeEvent e = pg_event(cdc::ChangeOp::kCreate, id, 0, lsn(500 + n));
    e.after.set("amount", Value(Decimal::parse(amount).value_or_throw()));
    e.after.set("lines", Value::array({Value(Decimal::parse(small).value_or_throw()),
                                       Value(Decimal::parse("2.50").value_or_throw())}));
    e.after.set("qty", Value(int64_t{7}));
    return e;
  };
  auto term_hits = [&](const std::string& index, const std::string& field, const std::string& value) {
    node_->refresh(index);
    std::string body;
    EXPECT_EQ(node_->call("POST", "/" + index + "/_search",
                          R"({"query":{"term":{")" + field + R"(":")" + value + R"("}}})", &body),
              200)
        << body;
    Result<Value> v = Value::from_json(body);
    if (!v.ok()) return int64_t{-1};
    return v->find("hits")->find("total")->find("value")->as_int64();
  };
  auto mapping_type = [&](const std::string& index, const std::string& field) {
    std::string body;
    EXPECT_EQ(node_->call("GET", "/" + index + "/_mapping", "", &body), 200) << body;
    Result<Value> v = Value::from_json(body);
    const Value* t = v.ok() ? v->find(index) : nullptr;
    for (const char* k : {"mappings", "properties"})
      t = t != nullptr ? t->find(k) : nullptr;
    t = t != nullptr ? t->find(field) : nullptr;
    t = t != nullptr ? t->find("type") : nullptr;
    return t != nullptr && t->is_string() ? std::string(t->as_string()) : std::string("?") + body;
  };

  const std::string index = unique_index("decimal");
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder().url(url_).index(index).change_event_defaults().build();
  JobResult r = run_events({event("e1", exact, tiny, 0)}, sink, 1);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  Value doc = node_->source(index, "e1");
  ASSERT_TRUE(doc.is_object()) << doc.to_json();
  ASSERT_TRUE(doc.find("amount")->is_string()) << doc.to_json();
  EXPECT_EQ(doc.find("amount")->as_string(), exact);
  EXPECT_EQ(doc.find("lines")->as_array()[0].as_string(), tiny);
  EXPECT_EQ(doc.find("lines")->as_array()[1].as_string(), "2.50") << "the scale is kept";
  EXPECT_EQ(doc.find("qty")->as_int64(), 7) << "other numbers stay numbers";
  EXPECT_EQ(mapping_type(index, "amount"), "text");
  EXPECT_EQ(term_hits(index, "amount.keyword", exact), 1);
  EXPECT_EQ(term_hits(index, "amount.keyword", neighbour), 0) << "the index holds the exact value";

  // The JSON numbers of kNumber: _source keeps the digits, the index holds a float.
  const std::string numbers = unique_index("decimal-number");
  auto as_numbers = OpenSearchSink<cdc::ChangeEvent>::builder()
                        .url(url_)
                        .index(numbers)
                        .change_event_defaults()
                        .decimal_handling(os::DecimalHandling::kNumber)
                        .build();
  r = run_events({event("e1", exact, tiny, 1)}, as_numbers, 1);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(mapping_type(numbers, "amount"), "float");
  EXPECT_EQ(term_hits(numbers, "amount", exact), 1);
  EXPECT_EQ(term_hits(numbers, "amount", neighbour), 1)
      << "a float cannot tell them apart: why strings are the default";
}

TEST_F(OpenSearchSinkIntegrationTest, DateIndexNamesFromTheSourceTimestamp) {
  const std::string prefix = unique_index("dated");
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder()
                  .url(url_)
                  .date_index(prefix + "-{yyyy.MM.dd}", [](const cdc::ChangeEvent& e) { return e.source.ts_ms; })
                  .change_event_defaults()
                  .build();
  // 2026-11-30T23:59:59.999Z and one ms later.
  JobResult r = run_events({pg_event(cdc::ChangeOp::kCreate, "a", 1, "0/10", 1796083199999),
                            pg_event(cdc::ChangeOp::kCreate, "b", 2, "0/11", 1796083200000)},
                           sink, 1);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(node_->count(prefix + "-2026.11.30"), 1);
  EXPECT_EQ(node_->count(prefix + "-2026.12.01"), 1);
  EXPECT_FALSE(node_->source(prefix + "-2026.11.30", "a").is_null());
  EXPECT_FALSE(node_->source(prefix + "-2026.12.01", "b").is_null());
}

TEST_F(OpenSearchSinkIntegrationTest, OlderVersionReplayedDoesNotOverwriteNewer) {
  const std::string index = unique_index("versions");
  auto make_sink = [&] {
    return OpenSearchSink<cdc::ChangeEvent>::builder().url(url_).index(index).change_event_defaults().build();
  };
  // The newer state first: "x" at LSN 0/200 with amount 2, "y" deleted at 0/300.
  ASSERT_TRUE(
      run_events({pg_event(cdc::ChangeOp::kUpdate, "x", 2, "0/200"), pg_event(cdc::ChangeOp::kCreate, "y", 7, "0/290"),
                  pg_event(cdc::ChangeOp::kDelete, "y", 0, "0/300")},
                 make_sink(), 1)
          .ok());
  // A replay of older changes: must not overwrite x nor resurrect y (within index.gc_deletes).
  auto replay = make_sink();
  JobResult r =
      run_events({pg_event(cdc::ChangeOp::kCreate, "x", 1, "0/100"), pg_event(cdc::ChangeOp::kDelete, "x", 0, "0/150"),
                  pg_event(cdc::ChangeOp::kCreate, "y", 7, "0/290")},
                 replay, 1);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(replay->stats()->version_conflicts.load(), 3);
  Value x = node_->source(index, "x");
  ASSERT_FALSE(x.is_null()) << "the older delete removed the newer document";
  EXPECT_EQ(x.find("amount")->as_int64(), 2);
  EXPECT_TRUE(node_->source(index, "y").is_null()) << "an older insert resurrected a deleted document";
  // The same version again (a transaction replayed) is applied: external_gte.
  auto again = make_sink();
  ASSERT_TRUE(run_events({pg_event(cdc::ChangeOp::kUpdate, "x", 3, "0/200")}, again, 1).ok());
  EXPECT_EQ(again->stats()->version_conflicts.load(), 0);
  EXPECT_EQ(node_->source(index, "x").find("amount")->as_int64(), 3);
}

/// Index "bad-N" gets a string where the mapping wants a long.
std::vector<cdc::ChangeEvent> events_with_one_bad(int n, int bad) {
  std::vector<cdc::ChangeEvent> events;
  for (int i = 0; i < n; ++i) {
    cdc::ChangeEvent e = pg_event(cdc::ChangeOp::kCreate, "d" + std::to_string(i), i, lsn(1000 + i));
    if (i == bad) e.after.set("amount", Value("not-a-number"));
    events.push_back(std::move(e));
  }
  return events;
}

TEST_F(OpenSearchSinkIntegrationTest, MappingErrorGoesToTheDeadLetterFile) {
  const std::string index = unique_index("dlq");
  node_->create_index(index, R"({"mappings":{"properties":{"amount":{"type":"long"}}}})");
  const fs::path dlq = dir_ / "dead-letters.jsonl";
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder()
                  .url(url_)
                  .index(index)
                  .change_event_defaults()
                  .on_failed_item(BadRecordPolicy::kDeadLetter, dlq.string())
                  .build();
  JobResult r = run_events(events_with_one_bad(50, 17), sink);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(node_->count(index), 49);
  EXPECT_EQ(sink->stats()->dead_letters.load(), 1);
  std::ifstream in(dlq);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << "no dead letter in " << dlq;
  Value dl = Value::from_json(line).value_or_throw();
  EXPECT_EQ(dl.find("sink")->as_string(), "opensearch");
  EXPECT_EQ(dl.find("index")->as_string(), index);
  EXPECT_EQ(dl.find("id")->as_string(), "d17");
  EXPECT_EQ(dl.find("action")->as_string(), "index");
  EXPECT_EQ(dl.find("status")->as_int64(), 400);
  EXPECT_EQ(dl.find("position")->as_string(), lsn(1017));
  EXPECT_EQ(dl.find("version")->as_int64(), 1017);
  EXPECT_THAT(std::string(dl.find("error")->as_string()), HasSubstr("mapper_parsing_exception"));
  EXPECT_THAT(std::string(dl.find("document")->as_string()), HasSubstr("not-a-number"));
  EXPECT_FALSE(std::getline(in, line)) << "one bad document, one dead letter";
}

TEST_F(OpenSearchSinkIntegrationTest, MappingErrorFailsTheJobNamingIndexIdAndReason) {
  const std::string index = unique_index("fail");
  node_->create_index(index, R"({"mappings":{"properties":{"amount":{"type":"long"}}}})");
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder().url(url_).index(index).change_event_defaults().build();
  JobResult r = run_events(events_with_one_bad(20, 5), sink);
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(r.error.has_value());
  const std::string msg = r.error->to_string();
  EXPECT_THAT(msg, HasSubstr("index '" + index + "', id 'd5', action index"));
  EXPECT_THAT(msg, HasSubstr("status 400: mapper_parsing_exception"));
}

using FailingMap = sluice::testing::FailingIdentity<int64_t>;

/// Runs datagen 0..records-1 -> FailingMap (`failures` injected failures at seeded points) -> [key_by v % keys]
/// -> `sink`, with checkpoints every 100 ms and fixed-delay restarts.
JobResult run_with_failures(const fs::path& checkpoints, uint64_t seed, int64_t records, int failures,
                            std::shared_ptr<OpenSearchSink<int64_t>> sink, int64_t keys, int* fired_out) {
  std::mt19937_64 rng(seed);
  auto thresholds = std::make_shared<std::vector<int64_t>>();
  for (int i = 0; i < failures; ++i)
    thresholds->push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(records / 2 / failures)) + 1);
  auto fired = std::make_shared<std::atomic<int>>(0);
  Configuration c;
  c.set(options::kParallelism, 2);
  c.set_string(std::string(options::kCheckpointInterval.key), "100ms");
  c.set(options::kCheckpointDir, "file://" + checkpoints.string());
  c.set(options::kRestartStrategy, std::string("fixed-delay"));
  c.set(options::kFixedDelayAttempts, 100);
  c.set_string(std::string(options::kFixedDelayDelay.key), "0ms");
  c.set(options::kTolerableFailedCheckpoints, 100);
  StreamEnvironment env(c);
  // Rate-limited (about 3 s), so that failures come after completed checkpoints.
  env.from_source(datagen::sequence(0, records - 1, 2000), "numbers")
      .uid("numbers")
      .map(FailingMap{fired, thresholds})
      .uid("failing-map")
      .key_by([keys](const int64_t& v) { return v % keys; })
      .sink_to(std::move(sink), "OpenSearch")
      .uid("opensearch");
  JobResult r = env.execute("opensearch restarts");
  *fired_out = fired->load();
  return r;
}

TEST_F(OpenSearchSinkIntegrationTest, RestartsFromCheckpointsAndEndsWithExactlyTheExpectedDocuments) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  constexpr int64_t kRecords = 6000;
  constexpr int64_t kKeys = 100;
  constexpr int kFailures = 3;

  // One document per value (id = v): replays after each restore overwrite by id, so exactly kRecords remain.
  const std::string by_value = unique_index("exact");
  auto exact = OpenSearchSink<int64_t>::builder()
                   .url(url_)
                   .index(by_value)
                   .id([](const int64_t& v) { return std::to_string(v); })
                   .document([](const int64_t& v) {
                     return Value::object({{"v", Value(v)}, {"k", Value(v % kKeys)}});
                   })
                   .batch(200, 1 << 20)
                   .flush_interval(50ms)
                   .build();
  int fired = 0;
  JobResult r = run_with_failures(dir_ / "chk-exact", seed, kRecords, kFailures, exact, kKeys, &fired);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(fired, kFailures);
  EXPECT_GE(r.restarts, 1);
  EXPECT_GE(r.completed_checkpoints, 1);
  EXPECT_EQ(node_->count(by_value), kRecords);
  std::map<std::string, Value> docs = node_->all(by_value);
  int64_t wrong = 0;
  for (int64_t v = 0; v < kRecords; ++v) {
    auto it = docs.find(std::to_string(v));
    if (it == docs.end() || it->second.find("v")->as_int64() != v || it->second.find("k")->as_int64() != v % kKeys) {
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << "documents missing or wrong in " << by_value;
  std::printf("by value: %d restarts, %lld checkpoints, %lld actions acknowledged for %lld documents\n", r.restarts,
              static_cast<long long>(r.completed_checkpoints),
              static_cast<long long>(exact->stats()->acknowledged.load()), static_cast<long long>(kRecords));

  // One document per key (id = v % kKeys) with external version v: whatever the order in which the two source
  // splits and the replays arrive, each key ends with its largest value.
  const std::string by_key = unique_index("latest");
  auto latest = OpenSearchSink<int64_t>::builder()
                    .url(url_)
                    .index(by_key)
                    .id([](const int64_t& v) { return std::to_string(v % kKeys); })
                    .document([](const int64_t& v) {
                      return Value::object({{"v", Value(v)}});
                    })
                    .version([](const int64_t& v) -> std::optional<int64_t> { return v; })
                    .batch(200, 1 << 20)
                    .build();
  r = run_with_failures(dir_ / "chk-latest", seed + 1, kRecords, kFailures, latest, kKeys, &fired);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  EXPECT_EQ(fired, kFailures);
  EXPECT_GE(r.restarts, 1);
  std::map<std::string, Value> per_key = node_->all(by_key);
  ASSERT_EQ(static_cast<int64_t>(per_key.size()), kKeys);
  for (int64_t k = 0; k < kKeys; ++k) {
    const int64_t largest = (kRecords - 1) - ((kRecords - 1 - k) % kKeys);
    EXPECT_EQ(per_key[std::to_string(k)].find("v")->as_int64(), largest) << "key " << k;
  }
  std::printf("by key: %d restarts, %lld actions acknowledged, %lld version conflicts skipped\n", r.restarts,
              static_cast<long long>(latest->stats()->acknowledged.load()),
              static_cast<long long>(latest->stats()->version_conflicts.load()));
}

/// A stand-in cluster for throttling: the real node cannot be made to answer 429 on demand, so this local HTTP
/// server answers the first request with 429, the second with a 200 whose second item failed with 503 (and whose
/// first item succeeded), and then accepts everything; it records every body.
class ThrottlingServer {
 public:
  ThrottlingServer() {
    server_.Post("/_bulk", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lock(mu_);
      bodies_.push_back(req.body);
      queries_.push_back(req.has_param("filter_path") ? req.get_param_value("filter_path") : "");
      const size_t n = bodies_.size();
      if (n == 1) {
        res.status = 429;
        res.set_content(R"({"error":{"type":"es_rejected_execution_exception","reason":"queue full"},"status":429})",
                        "application/json");
      } else if (n == 2) {
        res.status = 200;
        res.set_content(R"({"errors":true,"items":[{"index":{"status":201}},{"index":{"status":503,"error":)"
                        R"({"type":"unavailable_shards_exception","reason":"primary shard is not active"}}}]})",
                        "application/json");
      } else {
        res.status = 200;
        res.set_content(R"({"errors":false,"items":[{"index":{"status":201}}]})", "application/json");
      }
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  ~ThrottlingServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }
  std::vector<std::string> queries() {
    std::lock_guard lock(mu_);
    return queries_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> bodies_;
  std::vector<std::string> queries_;
};

TEST(OpenSearchSinkRetryTest, RetriesOn429AndOnItemsThatFailedWith503) {
  ThrottlingServer server;
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder()
                  .url(server.url())
                  .index("charges")
                  .change_event_defaults()
                  .backoff(os::BackoffPolicy{20ms, 200ms, 2.0, 5})
                  .build();
  JobResult r = run_events(
      {pg_event(cdc::ChangeOp::kCreate, "a", 1, "0/10"), pg_event(cdc::ChangeOp::kCreate, "b", 2, "0/11")}, sink, 1);
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  std::vector<std::string> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 3u);
  EXPECT_EQ(bodies[0], bodies[1]) << "a 429 resends the whole request";
  EXPECT_THAT(bodies[0], HasSubstr("\"_id\":\"a\""));
  EXPECT_THAT(bodies[0], HasSubstr("\"_id\":\"b\""));
  EXPECT_EQ(bodies[2],
            "{\"index\":{\"_index\":\"charges\",\"_id\":\"b\",\"version\":17,\"version_type\":\"external_gte\"}}\n"
            "{\"id\":\"b\",\"amount\":2,\"status\":\"paid\"}\n")
      << "only the item that failed with 503 is resent";
  EXPECT_EQ(server.queries()[0], "errors,items.*.status,items.*.error");
  EXPECT_EQ(sink->stats()->retries.load(), 2);
  EXPECT_EQ(sink->stats()->retried_items.load(), 1);
  EXPECT_EQ(sink->stats()->acknowledged.load(), 2);
}

TEST(OpenSearchSinkRetryTest, NetworkErrorsExhaustTheRetriesAndFailTheJob) {
  // A port nothing listens on: the kernel picks it for a socket that is closed again without listen().
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  auto sink = OpenSearchSink<cdc::ChangeEvent>::builder()
                  .url("http://127.0.0.1:" + std::to_string(port))
                  .index("charges")
                  .change_event_defaults()
                  .backoff(os::BackoffPolicy{10ms, 20ms, 2.0, 2})
                  .timeouts(2s, 5s)
                  .build();
  JobResult r = run_events({pg_event(cdc::ChangeOp::kCreate, "a", 1, "0/10")}, sink, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error->to_string(), HasSubstr("gave up after 2 retries: network error"));
  EXPECT_EQ(sink->stats()->requests.load(), 3);
}

}  // namespace
}  // namespace sluice
