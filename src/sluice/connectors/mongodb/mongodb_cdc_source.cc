#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mongoc/mongoc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <utility>

#include "sluice/connectors/mongodb/libmongoc_logging.h"
#include "sluice/core/non_recoverable.h"
#include "sluice/core/redact.h"

namespace sluice {

namespace {

constexpr const char* kRole = "MongoDB source";

int64_t cluster_time_ms(MongoClusterTime t) noexcept {
  return static_cast<int64_t>(static_cast<uint64_t>(t) >> 32) * 1000;
}

std::string iso_time(int64_t ms) {
  if (ms <= 0) return "an unknown time";
  std::string out;
  append_iso8601_micros(ms * 1000, out);
  return out;
}

std::string describe_cluster_time(MongoClusterTime t) {
  return fmt::format("Timestamp({}, {})", static_cast<uint64_t>(t) >> 32, static_cast<uint32_t>(t));
}

/// Owns a heap bson_t (bson_new, BCON_NEW, bson_new_from_json). (std::unique_ptr<bson_t> would drop bson_t's
/// alignment attribute from the template argument.)
class BsonPtr {
 public:
  explicit BsonPtr(bson_t* b) noexcept : b_(b) {}
  ~BsonPtr() {
    if (b_ != nullptr) bson_destroy(b_);
  }
  BsonPtr(const BsonPtr&) = delete;
  BsonPtr& operator=(const BsonPtr&) = delete;
  bson_t* get() const noexcept { return b_; }
  bson_t* operator->() const noexcept { return b_; }
  bson_t& operator*() const noexcept { return *b_; }
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  bson_t* b_;
};

mongodb::DriverError driver_error(const bson_error_t& e) {
  return mongodb::DriverError{e.domain, e.code, e.message};
}

// ---------------------------------------------------------------------------------------------------------
// libmongoc driver

class LibmongocChangeStream final : public mongodb::ChangeStreamCursor {
 public:
  explicit LibmongocChangeStream(mongoc_change_stream_t* cs) : cs_(cs) {}
  ~LibmongocChangeStream() override { mongoc_change_stream_destroy(cs_); }
  const bson_t* next() override {
    const bson_t* doc = nullptr;
    return mongoc_change_stream_next(cs_, &doc) ? doc : nullptr;
  }
  bool error(mongodb::DriverError& out) const override {
    bson_error_t e;
    const bson_t* reply = nullptr;
    if (!mongoc_change_stream_error_document(cs_, &e, &reply)) return false;
    out = driver_error(e);
    return true;
  }
  const bson_t* resume_token() const override { return mongoc_change_stream_get_resume_token(cs_); }

 private:
  mongoc_change_stream_t* cs_;
};

class LibmongocCursor final : public mongodb::DocumentCursor {
 public:
  LibmongocCursor(mongoc_collection_t* coll, mongoc_cursor_t* cursor) : coll_(coll), cursor_(cursor) {}
  ~LibmongocCursor() override {
    mongoc_cursor_destroy(cursor_);
    mongoc_collection_destroy(coll_);
  }
  const bson_t* next() override {
    const bson_t* doc = nullptr;
    return mongoc_cursor_next(cursor_, &doc) ? doc : nullptr;
  }
  bool error(mongodb::DriverError& out) const override {
    bson_error_t e;
    if (!mongoc_cursor_error(cursor_, &e)) return false;
    out = driver_error(e);
    return true;
  }

 private:
  mongoc_collection_t* coll_;
  mongoc_cursor_t* cursor_;
};

class LibmongocDriver final : public mongodb::MongoDriver {
 public:
  explicit LibmongocDriver(mongoc_client_t* client) : client_(client) {}
  ~LibmongocDriver() override { mongoc_client_destroy(client_); }

  std::unique_ptr<mongodb::ChangeStreamCursor> watch(const std::string& db, const std::string& coll,
                                                     const bson_t& options) override {
    mongoc_collection_t* c = mongoc_client_get_collection(client_, db.c_str(), coll.c_str());
    bson_t pipeline = BSON_INITIALIZER;
    mongoc_change_stream_t* cs = mongoc_collection_watch(c, &pipeline, &options);
    bson_destroy(&pipeline);
    mongoc_collection_destroy(c);  // the stream keeps what it needs
    return std::make_unique<LibmongocChangeStream>(cs);
  }

  std::unique_ptr<mongodb::DocumentCursor> scan(const std::string& db, const std::string& coll, int batch_size,
                                                const bson_t* after_id) override {
    mongoc_collection_t* c = mongoc_client_get_collection(client_, db.c_str(), coll.c_str());
    bson_t filter = BSON_INITIALIZER;
    if (after_id != nullptr) mongodb::scan_after_filter(*after_id, filter);
    BsonPtr opts(BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}", "batchSize", BCON_INT32(batch_size)));
    mongoc_cursor_t* cursor = mongoc_collection_find_with_opts(c, &filter, opts.get(), nullptr);
    bson_destroy(&filter);
    return std::make_unique<LibmongocCursor>(c, cursor);
  }

  bool cluster_time(const std::string& db, MongoClusterTime& out, mongodb::DriverError& error) override {
    // 1. operationTime / lastWrite.opTime.ts of isMaster (replica sets).
    BsonPtr cmd(BCON_NEW("isMaster", BCON_INT32(1)));
    bson_t reply;
    bson_error_t e;
    const bool ok = mongoc_client_command_simple(client_, db.c_str(), cmd.get(), nullptr, &reply, &e);
    if (!ok) {
      bson_destroy(&reply);
      error = driver_error(e);
      return false;
    }
    bson_iter_t it;
    uint32_t t = 0;
    uint32_t i = 0;
    if (bson_iter_init_find(&it, &reply, "operationTime") && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
      bson_iter_timestamp(&it, &t, &i);
    } else if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "lastWrite.opTime.ts", &it) &&
               BSON_ITER_HOLDS_TIMESTAMP(&it)) {
      bson_iter_timestamp(&it, &t, &i);
    }
    bson_destroy(&reply);
    if (t != 0 || i != 0) {
      out = mongo_cluster_time(t, i);
      return true;
    }
    // 2. The newest oplog entry (the emulator reports no cluster time).
    mongoc_collection_t* oplog = mongoc_client_get_collection(client_, "local", "oplog.rs");
    bson_t filter = BSON_INITIALIZER;
    BsonPtr opts(BCON_NEW("sort", "{", "ts", BCON_INT32(-1), "}", "limit", BCON_INT64(1), "projection", "{", "ts",
                          BCON_INT32(1), "}"));
    mongoc_cursor_t* cursor = mongoc_collection_find_with_opts(oplog, &filter, opts.get(), nullptr);
    const bson_t* doc = nullptr;
    bool found = false;
    if (mongoc_cursor_next(cursor, &doc) && bson_iter_init_find(&it, doc, "ts") && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
      bson_iter_timestamp(&it, &t, &i);
      found = true;
    }
    const bool failed = mongoc_cursor_error(cursor, &e);
    mongoc_cursor_destroy(cursor);
    mongoc_collection_destroy(oplog);
    bson_destroy(&filter);
    if (failed) {
      error = driver_error(e);
      error.message = "reading the cluster time from local.oplog.rs failed (is this a replica set?): " + error.message;
      return false;
    }
    // An empty oplog: nothing happened yet, the stream starts at the beginning of time.
    out = found ? mongo_cluster_time(t, i) : mongo_cluster_time(0, 1);
    return true;
  }

  bool list_collections(const std::string& db, std::vector<std::string>& out, mongodb::DriverError& error) override {
    mongoc_database_t* d = mongoc_client_get_database(client_, db.c_str());
    bson_error_t e;
    char** names = mongoc_database_get_collection_names_with_opts(d, nullptr, &e);
    mongoc_database_destroy(d);
    if (names == nullptr) {
      error = driver_error(e);
      return false;
    }
    out.clear();
    for (char** n = names; *n != nullptr; ++n)
      out.emplace_back(*n);
    bson_strfreev(names);
    return true;
  }

 private:
  mongoc_client_t* client_;
};

}  // namespace

std::string_view mongo_start_mode_name(MongoStartMode mode) noexcept {
  switch (mode) {
    case MongoStartMode::kInitial:
      return "initial";
    case MongoStartMode::kLatest:
      return "latest";
    case MongoStartMode::kTimestamp:
      return "timestamp";
    case MongoStartMode::kResumeToken:
      return "resume-token";
  }
  return "?";
}

namespace mongodb {

bool is_history_lost(uint32_t code) noexcept {
  return code == 286 || code == 280 || code == 260;
}

Result<std::unique_ptr<MongoDriver>> make_libmongoc_driver(const std::string& uri, int64_t socket_timeout_ms) {
  mongodb::init_libmongoc();
  bson_error_t e;
  mongoc_uri_t* u = mongoc_uri_new_with_error(uri.c_str(), &e);
  if (u == nullptr) {
    return Error(ErrorCode::kConfiguration,
                 redact_secrets(fmt::format("{}: invalid URI '{}': {}", kRole, uri, e.message)));
  }
  mongoc_uri_set_appname(u, "sluice-mongodb-cdc");
  // libmongoc waits up to 5 minutes for a reply by default (socketTimeoutMS): a paused or partitioned server
  // would keep the reader blocked, its lag flat and the job green for that long.
  if (socket_timeout_ms > 0) {
    const auto timeout = static_cast<int32_t>(std::min<int64_t>(socket_timeout_ms, INT32_MAX));
    if (!mongoc_uri_has_option(u, MONGOC_URI_SOCKETTIMEOUTMS))
      mongoc_uri_set_option_as_int32(u, MONGOC_URI_SOCKETTIMEOUTMS, timeout);
    if (!mongoc_uri_has_option(u, MONGOC_URI_CONNECTTIMEOUTMS))
      mongoc_uri_set_option_as_int32(u, MONGOC_URI_CONNECTTIMEOUTMS, std::min<int32_t>(timeout, 10'000));
  }
  mongoc_client_t* client = mongoc_client_new_from_uri_with_error(u, &e);
  mongoc_uri_destroy(u);
  if (client == nullptr) {
    return Error(ErrorCode::kConfiguration,
                 redact_secrets(fmt::format("{}: cannot create a client for '{}': {}", kRole, uri, e.message)));
  }
  mongoc_client_set_error_api(client, MONGOC_ERROR_API_VERSION_2);
  return std::unique_ptr<MongoDriver>(std::make_unique<LibmongocDriver>(client));
}

namespace {

// MongoDB's order of BSON types when it compares or sorts values of different types (numbers compare with each
// other, strings with symbols).
int bson_type_rank(int type) noexcept {
  switch (type) {
    case BSON_TYPE_MINKEY:
      return 0;
    case BSON_TYPE_UNDEFINED:
    case BSON_TYPE_NULL:
      return 1;
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DECIMAL128:
      return 2;
    case BSON_TYPE_UTF8:
    case BSON_TYPE_SYMBOL:
      return 3;
    case BSON_TYPE_DOCUMENT:
      return 4;
    case BSON_TYPE_ARRAY:
      return 5;
    case BSON_TYPE_BINARY:
      return 6;
    case BSON_TYPE_OID:
      return 7;
    case BSON_TYPE_BOOL:
      return 8;
    case BSON_TYPE_DATE_TIME:
      return 9;
    case BSON_TYPE_TIMESTAMP:
      return 10;
    case BSON_TYPE_REGEX:
      return 11;
    case BSON_TYPE_DBPOINTER:
      return 12;
    case BSON_TYPE_CODE:
      return 13;
    case BSON_TYPE_CODEWSCOPE:
      return 14;
    case BSON_TYPE_MAXKEY:
      return 15;
    default:
      return 16;
  }
}

}  // namespace

void scan_after_filter(const bson_t& after_id, bson_t& filter) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, &after_id, "_id")) return;
  const int rank = bson_type_rank(bson_iter_type(&it));
  bson_t any;
  bson_append_array_begin(&filter, "$or", 3, &any);
  int n = 0;
  auto clause = [&](auto&& append_condition) {
    const std::string idx = std::to_string(n++);
    bson_t c;
    bson_t cond;
    bson_append_document_begin(&any, idx.c_str(), static_cast<int>(idx.size()), &c);
    bson_append_document_begin(&c, "_id", 3, &cond);
    append_condition(cond);
    bson_append_document_end(&c, &cond);
    bson_append_document_end(&any, &c);
  };
  clause([&](bson_t& cond) { bson_append_iter(&cond, "$gt", 3, &it); });
  // The types a document's _id can have: not arrays, regexes or undefined (servers refuse them), nor the
  // deprecated DBPointer, JavaScript code and symbol (symbols compare as strings, in the $gt clause; the emulator
  // rejects a $type of the others: docs/cdc.md says such _ids are not supported by a resumed snapshot).
  static constexpr int kIdTypes[] = {BSON_TYPE_DOUBLE, BSON_TYPE_UTF8,      BSON_TYPE_DOCUMENT,  BSON_TYPE_BINARY,
                                     BSON_TYPE_OID,    BSON_TYPE_BOOL,      BSON_TYPE_DATE_TIME, BSON_TYPE_NULL,
                                     BSON_TYPE_INT32,  BSON_TYPE_TIMESTAMP, BSON_TYPE_INT64,     BSON_TYPE_DECIMAL128,
                                     BSON_TYPE_MAXKEY};
  for (const int t : kIdTypes) {
    if (bson_type_rank(t) > rank) clause([&](bson_t& cond) { bson_append_int32(&cond, "$type", 5, t); });
  }
  bson_append_array_end(&filter, &any);
}

int collection_split_owner(std::string_view split_id, int parallelism) noexcept {
  uint32_t h = 0;
  for (const char c : split_id)
    h = 31 * h + static_cast<uint32_t>(static_cast<unsigned char>(c));
  const uint32_t hash31 = h * 31u;
  return static_cast<int>(static_cast<int64_t>(hash31 & 0x7FFFFFFFu) % std::max(1, parallelism));
}

Result<MappedChange> map_change_document(const bson_t& change, const MongoCollectionSplit& split,
                                         const BsonToValueOptions& options) {
  MappedChange out;
  bson_iter_t it;
  std::string op;
  if (bson_iter_init_find(&it, &change, "operationType") && BSON_ITER_HOLDS_UTF8(&it))
    op = bson_iter_utf8(&it, nullptr);
  if (op.empty()) return Error(ErrorCode::kSerialization, "change document without operationType");
  uint32_t t = 0;
  uint32_t i = 0;
  if (bson_iter_init_find(&it, &change, "clusterTime") && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
    bson_iter_timestamp(&it, &t, &i);
  }
  out.cluster_time = mongo_cluster_time(t, i);

  if (op == "drop" || op == "rename" || op == "dropDatabase" || op == "invalidate") {
    out.kind = MappedChange::Kind::kEndOfStream;
    out.what = op;
    if (op == "rename" && bson_iter_init_find(&it, &change, "to") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
      bson_iter_t to;
      std::string db;
      std::string coll;
      if (bson_iter_recurse(&it, &to)) {
        while (bson_iter_next(&to)) {
          if (BSON_ITER_HOLDS_UTF8(&to) && std::string_view(bson_iter_key(&to)) == "db")
            db = bson_iter_utf8(&to, nullptr);
          if (BSON_ITER_HOLDS_UTF8(&to) && std::string_view(bson_iter_key(&to)) == "coll")
            coll = bson_iter_utf8(&to, nullptr);
        }
      }
      out.what = fmt::format("rename to '{}.{}'", db, coll);
    }
    out.what += fmt::format(" at {}", describe_cluster_time(out.cluster_time));
    return out;
  }
  cdc::ChangeEvent& e = out.event;
  if (op == "insert") {
    e.op = cdc::ChangeOp::kCreate;
  } else if (op == "update" || op == "replace") {
    e.op = cdc::ChangeOp::kUpdate;
  } else if (op == "delete") {
    e.op = cdc::ChangeOp::kDelete;
  } else {
    out.kind = MappedChange::Kind::kSkip;
    out.what = op;
    return out;
  }
  // The resume token (the change's _id) becomes the position.
  if (bson_iter_init_find(&it, &change, "_id") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    uint32_t len = 0;
    const uint8_t* data = nullptr;
    bson_iter_document(&it, &len, &data);
    e.source.position = bson_to_canonical_json(data, len);
  }
  if (e.source.position.empty())
    return Error(ErrorCode::kSerialization, "change document without a resume token (_id)");

  auto sub = [&](const char* name, Value& target) -> Status {
    bson_iter_t f;
    if (!bson_iter_init_find(&f, &change, name)) return ok_status();
    if (BSON_ITER_HOLDS_NULL(&f)) return ok_status();
    if (!BSON_ITER_HOLDS_DOCUMENT(&f)) {
      return Error(ErrorCode::kSerialization, fmt::format("change document field '{}' is not a document", name));
    }
    Result<Value> v = bson_iter_to_value(f, options);
    if (!v.ok()) return v.error();
    target = std::move(v).value();
    return ok_status();
  };
  Value document_key;
  SLUICE_RETURN_IF_ERROR(sub("documentKey", document_key));
  if (e.op != cdc::ChangeOp::kDelete) SLUICE_RETURN_IF_ERROR(sub("fullDocument", e.after));
  SLUICE_RETURN_IF_ERROR(sub("fullDocumentBeforeChange", e.before));
  const Value* id = document_key.is_object() ? document_key.find("_id") : nullptr;
  // Servers whose documentKey lacks _id (the emulator puts the update specification there): take it from
  // fullDocument. An update whose document is gone has after = null.
  if (id == nullptr && e.after.is_object()) id = e.after.find("_id");
  if (id == nullptr) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("{} change without a document _id (documentKey {}, fullDocument {})", op,
                             document_key.to_json(), e.after.is_null() ? "null" : "without _id"));
  }
  e.key = Value::object({{"_id", *id}});
  if (e.after.is_object() && e.after.find("_id") == nullptr) e.after = Value::null();  // a delta, not a document
  if (bson_iter_init_find(&it, &change, "txnNumber") && (BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it))) {
    e.source.txn_id = bson_iter_as_int64(&it);
  }
  e.source.connector = "mongodb";
  e.source.database = split.database;
  e.source.collection = split.collection;
  e.source.ts_ms = cluster_time_ms(out.cluster_time);
  e.source.snapshot = split.overlap_until != 0 && out.cluster_time <= split.overlap_until;
  return out;
}

}  // namespace mongodb

// ---------------------------------------------------------------------------------------------------------
// Metrics

void MongoCdcSourceMetrics::record_position(const std::string& split_id, const std::string& position,
                                            int64_t cluster_time_ms) {
  {
    std::lock_guard lock(mu_);
    positions_[split_id] = position;
    SplitTimes& t = split_times_[split_id];
    t.event_ms = std::max(t.event_ms, cluster_time_ms);
  }
  int64_t prev = last_event_time_ms.load(std::memory_order_relaxed);
  while (cluster_time_ms > prev && !last_event_time_ms.compare_exchange_weak(prev, cluster_time_ms)) {
  }
}

std::map<std::string, std::string> MongoCdcSourceMetrics::positions() const {
  std::lock_guard lock(mu_);
  return positions_;
}

void MongoCdcSourceMetrics::record_caught_up(const std::string& split_id, int64_t now_ms) {
  std::lock_guard lock(mu_);
  split_times_[split_id].caught_up_ms = now_ms;
}

int64_t MongoCdcSourceMetrics::lag_ms(int64_t now_ms) const noexcept {
  std::lock_guard lock(mu_);
  int64_t lag = 0;
  for (const auto& [id, t] : split_times_) {
    const int64_t at = std::max(t.event_ms, t.caught_up_ms);
    if (at > 0) lag = std::max(lag, now_ms - at);
  }
  return lag;
}

double MongoCdcSourceMetrics::events_per_second(int64_t now_monotonic_ns) {
  std::lock_guard lock(mu_);
  const int64_t n = events.load(std::memory_order_relaxed);
  if (rate_last_ns_ < 0 || now_monotonic_ns <= rate_last_ns_) {
    rate_last_ns_ = now_monotonic_ns;
    rate_last_events_ = n;
    return 0.0;
  }
  const double rate =
      static_cast<double>(n - rate_last_events_) * 1e9 / static_cast<double>(now_monotonic_ns - rate_last_ns_);
  rate_last_ns_ = now_monotonic_ns;
  rate_last_events_ = n;
  return rate;
}

// ---------------------------------------------------------------------------------------------------------
// Settings and builder

namespace detail {

std::string MongoCdcSourceSettings::describe() const {
  if (!collection_pattern.empty()) return fmt::format("{}./{}/", database, collection_pattern);
  return fmt::format("{}.[{}]", database, fmt::join(collections, ", "));
}

}  // namespace detail

MongoCdcSourceBuilder MongoCdcSource::builder() {
  return MongoCdcSourceBuilder();
}

#define SLUICE_BUILDER_SET(method, type, field)                  \
  MongoCdcSourceBuilder& MongoCdcSourceBuilder::method(type v) { \
    s_.field = std::move(v);                                     \
    return *this;                                                \
  }
SLUICE_BUILDER_SET(uri, std::string, uri)
SLUICE_BUILDER_SET(database, std::string, database)
SLUICE_BUILDER_SET(collections, std::vector<std::string>, collections)
SLUICE_BUILDER_SET(collection_pattern, std::string, collection_pattern)
SLUICE_BUILDER_SET(start_mode, MongoStartMode, start_mode)
SLUICE_BUILDER_SET(start_timestamp_ms, int64_t, start_timestamp_ms)
SLUICE_BUILDER_SET(update_lookup, bool, update_lookup)
SLUICE_BUILDER_SET(pre_images, bool, pre_images)
SLUICE_BUILDER_SET(on_drop, MongoOnDrop, on_drop)
SLUICE_BUILDER_SET(on_history_lost, MongoOnHistoryLost, on_history_lost)
SLUICE_BUILDER_SET(batch_size, int32_t, batch_size)
MongoCdcSourceBuilder& MongoCdcSourceBuilder::socket_timeout(std::chrono::milliseconds timeout) {
  s_.socket_timeout_ms = timeout.count();
  return *this;
}
SLUICE_BUILDER_SET(driver_factory, mongodb::MongoDriverFactory, driver_factory)
#undef SLUICE_BUILDER_SET

MongoCdcSourceBuilder& MongoCdcSourceBuilder::resume_token(std::string collection, std::string token_json) {
  s_.resume_tokens[std::move(collection)] = std::move(token_json);
  return *this;
}
MongoCdcSourceBuilder& MongoCdcSourceBuilder::discovery_interval(std::chrono::milliseconds interval) {
  s_.discovery_interval_ms = interval.count();
  return *this;
}
MongoCdcSourceBuilder& MongoCdcSourceBuilder::max_await(std::chrono::milliseconds wait) {
  s_.max_await_ms = wait.count();
  return *this;
}
MongoCdcSourceBuilder& MongoCdcSourceBuilder::poll_interval(std::chrono::milliseconds interval) {
  s_.poll_interval_ms = interval.count();
  return *this;
}
MongoCdcSourceBuilder& MongoCdcSourceBuilder::int32_mapping(mongodb::Int32Mapping mapping) {
  s_.value_options.int32 = mapping;
  return *this;
}
MongoCdcSourceBuilder& MongoCdcSourceBuilder::on_bad_record(BadRecordPolicy policy, std::string dead_letter_path) {
  s_.bad_record_policy = policy;
  s_.dead_letter_path = std::move(dead_letter_path);
  return *this;
}

Result<std::shared_ptr<MongoCdcSource>> MongoCdcSourceBuilder::try_build() const {
  detail::MongoCdcSourceSettings s = s_;
  auto bad = [](std::string what) { return Error(ErrorCode::kConfiguration, fmt::format("{}: {}", kRole, what)); };
  if (s.uri.empty() && !s.driver_factory) return bad("no URI: call uri(\"mongodb://host:port\")");
  if (s.database.empty()) return bad("no database: call database(\"name\")");
  if (s.collections.empty() == s.collection_pattern.empty()) {
    return bad("set either collections({...}) or collection_pattern(regex), exactly one of them");
  }
  for (const std::string& c : s.collections) {
    if (c.empty()) return bad("an empty collection name");
  }
  if (!s.collection_pattern.empty()) {
    try {
      std::regex re(s.collection_pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return bad(fmt::format("invalid collection pattern '{}': {}", s.collection_pattern, e.what()));
    }
  }
  if (s.start_mode == MongoStartMode::kResumeToken) {
    if (!s.collection_pattern.empty()) return bad("start mode resume-token needs a list of collections, not a pattern");
    for (const std::string& c : s.collections) {
      auto t = s.resume_tokens.find(c);
      if (t == s.resume_tokens.end()) {
        return bad(fmt::format("start mode resume-token: no token for collection '{}': call resume_token(\"{}\", json)",
                               c, c));
      }
      bson_error_t e;
      BsonPtr doc(bson_new_from_json(reinterpret_cast<const uint8_t*>(t->second.data()),
                                     static_cast<ssize_t>(t->second.size()), &e));
      if (!doc) return bad(fmt::format("the resume token of '{}' is not Extended JSON: {}", c, e.message));
    }
  }
  if (s.start_mode == MongoStartMode::kTimestamp && s.start_timestamp_ms <= 0) {
    return bad("start mode timestamp needs start_timestamp_ms(ms since epoch) > 0");
  }
  if (s.batch_size <= 0) return bad(fmt::format("batch size must be positive, got {}", s.batch_size));
  if (s.max_await_ms < 0 || s.poll_interval_ms < 0 || s.discovery_interval_ms < 0) {
    return bad("max_await, poll_interval and discovery_interval must not be negative");
  }
  if (s.socket_timeout_ms <= s.max_await_ms) {
    return bad(
        fmt::format("socket_timeout ({} ms) must exceed max_await ({} ms): an idle getMore waits max_await "
                    "for changes before it answers",
                    s.socket_timeout_ms, s.max_await_ms));
  }
  if (s.bad_record_policy == BadRecordPolicy::kDeadLetter && s.dead_letter_path.empty()) {
    return bad("the dead-letter policy needs a file: on_bad_record(BadRecordPolicy::kDeadLetter, path)");
  }
  if (!s.driver_factory) {
    mongodb::init_libmongoc();
    bson_error_t e;
    mongoc_uri_t* u = mongoc_uri_new_with_error(s.uri.c_str(), &e);
    if (u == nullptr) return bad(redact_secrets(fmt::format("invalid URI '{}': {}", s.uri, e.message)));
    mongoc_uri_destroy(u);
    s.driver_factory = [uri = s.uri, timeout = s.socket_timeout_ms] {
      return mongodb::make_libmongoc_driver(uri, timeout);
    };
    s.watch_connection = true;
  }
  return std::make_shared<MongoCdcSource>(std::move(s));
}

// ---------------------------------------------------------------------------------------------------------
// Enumerator

namespace {

class MongoCdcEnumerator final : public SplitEnumerator<MongoCollectionSplit> {
 public:
  MongoCdcEnumerator(SplitEnumeratorContext<MongoCollectionSplit>& ctx, const detail::MongoCdcSourceSettings& s,
                     std::unique_ptr<mongodb::MongoDriver> driver)
      : ctx_(ctx), s_(s), driver_(std::move(driver)) {
    if (!s.collection_pattern.empty()) pattern_.emplace(s.collection_pattern, std::regex::ECMAScript);
  }

  void start() override {
    Status st = discover(/*initial=*/!restored_);
    if (!st.ok()) {
      if (!restored_) throw SluiceException(st.error());
      spdlog::warn("{} ({}): discovery after the restore failed, retrying periodically: {}", kRole, s_.describe(),
                   st.error().to_string());
    }
    if (discovery_enabled()) {
      // listCollections runs off the coordinator's lock (a server that does not answer would otherwise hold up
      // checkpoints for the socket timeout); the names are applied under it, without network calls. The work
      // owns a reference to the driver, the enumerator's only user of it after start().
      ctx_.call_async(
          [this, driver = driver_, db = s_.database, what = s_.describe()]() -> std::function<void()> {
            std::vector<std::string> all;
            mongodb::DriverError e;
            if (!driver->list_collections(db, all, e)) {
              spdlog::warn(
                  "{} ({}): collection discovery failed: listing the collections of database '{}' failed: "
                  "{} (code {})",
                  kRole, what, db, e.message, e.code);
              return nullptr;
            }
            return [this, all = std::move(all)] {
              if (!driver_) return;
              Status r = apply_discovered(all, /*initial=*/false);
              if (!r.ok())
                spdlog::warn("{} ({}): collection discovery failed: {}", kRole, s_.describe(), r.error().to_string());
            };
          },
          s_.discovery_interval_ms);
    }
  }

  void handle_split_request(int /*subtask*/) override {}

  void add_splits_back(std::vector<MongoCollectionSplit> splits, int subtask) override {
    registered_.erase(subtask);
    for (MongoCollectionSplit& sp : splits) {
      assigned_.erase(sp.split_id());
      add_pending(std::move(sp));
    }
    for (int r : registered_)
      assign_pending(r);
  }

  void add_reader(int subtask) override {
    registered_.insert(subtask);
    assign_pending(subtask);
    if (!discovery_enabled()) ctx_.signal_no_more_splits(subtask);
  }

  std::vector<MongoCollectionSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
    std::vector<MongoCollectionSplit> out;
    for (const auto& [owner, splits] : pending_)
      out.insert(out.end(), splits.begin(), splits.end());
    for (const std::string& id : assigned_) {
      MongoCollectionSplit m;
      const size_t dot = id.find('.');
      m.database = id.substr(0, dot);
      m.collection = id.substr(dot + 1);
      m.assigned = true;
      out.push_back(std::move(m));
    }
    return out;
  }

  void restore_state(std::vector<MongoCollectionSplit> splits) override {
    restored_ = true;
    pending_.clear();
    assigned_.clear();
    for (MongoCollectionSplit& sp : splits) {
      if (sp.assigned) {
        assigned_.insert(sp.split_id());
      } else {
        add_pending(std::move(sp));
      }
    }
  }

  void close() override { driver_.reset(); }

 private:
  bool discovery_enabled() const { return pattern_.has_value() && s_.discovery_interval_ms > 0; }

  Status discover(bool initial) {
    std::vector<std::string> all;
    if (pattern_) {
      mongodb::DriverError e;
      if (!driver_->list_collections(s_.database, all, e)) {
        return Error(ErrorCode::kConnector,
                     fmt::format("{}: listing the collections of database '{}' failed: {} (code {})", kRole,
                                 s_.database, e.message, e.code));
      }
    }
    return apply_discovered(all, initial);
  }

  // `all`: the collection names listCollections returned (ignored without a pattern). Network calls only for
  // start mode latest, which only the initial discovery uses.
  Status apply_discovered(const std::vector<std::string>& all, bool initial) {
    std::vector<std::string> names;
    if (pattern_) {
      for (const std::string& n : all) {
        if (!n.starts_with("system.") && std::regex_match(n, *pattern_)) names.push_back(n);
      }
    } else {
      names = s_.collections;
    }
    std::sort(names.begin(), names.end());
    std::set<std::string> known = assigned_;
    for (const auto& [owner, splits] : pending_) {
      for (const auto& sp : splits)
        known.insert(sp.split_id());
    }
    std::vector<std::string> fresh;
    for (const std::string& n : names) {
      if (known.count(s_.database + "." + n) == 0) fresh.push_back(n);
    }
    if (fresh.empty()) return ok_status();
    // Collections found later (or after a restore) are snapshotted: their documents predate discovery.
    const MongoStartMode mode = initial ? s_.start_mode : MongoStartMode::kInitial;
    MongoClusterTime now = 0;
    if (mode == MongoStartMode::kLatest) {
      mongodb::DriverError e;
      if (!driver_->cluster_time(s_.database, now, e)) {
        return Error(ErrorCode::kConnector,
                     fmt::format("{}: reading the cluster time of '{}' for start mode latest failed: {} (code {})",
                                 kRole, s_.uri, e.message, e.code));
      }
    }
    for (const std::string& n : fresh) {
      MongoCollectionSplit sp;
      sp.database = s_.database;
      sp.collection = n;
      switch (mode) {
        case MongoStartMode::kInitial:
          sp.snapshot_pending = true;
          break;
        case MongoStartMode::kLatest:
          sp.start_at = now + 1;  // the next increment: only changes after now
          break;
        case MongoStartMode::kTimestamp:
          sp.start_at = mongo_cluster_time(static_cast<uint32_t>(s_.start_timestamp_ms / 1000), 0);
          break;
        case MongoStartMode::kResumeToken: {
          const std::string& json = s_.resume_tokens.at(n);
          bson_error_t e;
          BsonPtr doc(
              bson_new_from_json(reinterpret_cast<const uint8_t*>(json.data()), static_cast<ssize_t>(json.size()), &e));
          if (!doc)
            return Error(ErrorCode::kConfiguration,
                         fmt::format("{}: bad resume token of '{}': {}", kRole, n, e.message));
          sp.resume_token.assign(reinterpret_cast<const char*>(bson_get_data(doc.get())), doc->len);
          break;
        }
      }
      add_pending(std::move(sp));
    }
    spdlog::info("{} ({}): {} new collection(s) [{}], start mode {}", kRole, s_.describe(), fresh.size(),
                 fmt::join(fresh, ", "), mongo_start_mode_name(mode));
    for (int r : registered_)
      assign_pending(r);
    return ok_status();
  }

  void add_pending(MongoCollectionSplit sp) {
    sp.assigned = false;
    const int owner = mongodb::collection_split_owner(sp.split_id(), std::max(1, ctx_.current_parallelism()));
    pending_[owner].push_back(std::move(sp));
  }

  void assign_pending(int subtask) {
    auto it = pending_.find(subtask);
    if (it == pending_.end()) return;
    std::vector<MongoCollectionSplit> splits = std::move(it->second);
    pending_.erase(it);
    for (MongoCollectionSplit& sp : splits) {
      assigned_.insert(sp.split_id());
      ctx_.assign_split(std::move(sp), subtask);
    }
  }

  SplitEnumeratorContext<MongoCollectionSplit>& ctx_;
  detail::MongoCdcSourceSettings s_;
  std::shared_ptr<mongodb::MongoDriver> driver_;
  std::optional<std::regex> pattern_;
  bool restored_ = false;
  std::set<std::string> assigned_;
  std::map<int, std::vector<MongoCollectionSplit>> pending_;
  std::set<int> registered_;
};

// ---------------------------------------------------------------------------------------------------------
// Reader

namespace {

// Watches one reader's connection to the server for /health (MongoCdcSourceMetrics::connections): the change
// stream's own calls block up to the socket timeout (30 s) on a paused server, so a thread of its own pings the
// server every second on a client of its own with short timeouts, and reports the reader disconnected once no ping
// was answered for 3 s.
class MongoConnectionProbe {
 public:
  static constexpr int32_t kTimeoutMs = 2'500;
  static constexpr int64_t kDisconnectedAfterMs = 3'000;

  MongoConnectionProbe(const std::string& uri, std::shared_ptr<SourceConnectionBoard> board, int subtask)
      : board_(std::move(board)), subtask_(subtask) {
    mongodb::init_libmongoc();
    bson_error_t e;
    mongoc_uri_t* u = mongoc_uri_new_with_error(uri.c_str(), &e);
    if (u == nullptr) return;  // the source's own client reports it
    mongoc_uri_set_appname(u, "sluice-mongodb-probe");
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_SOCKETTIMEOUTMS, kTimeoutMs);
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_CONNECTTIMEOUTMS, kTimeoutMs);
    mongoc_uri_set_option_as_int32(u, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, kTimeoutMs);
    client_ = mongoc_client_new_from_uri_with_error(u, &e);
    mongoc_uri_destroy(u);
    if (client_ == nullptr) return;
    mongoc_client_set_error_api(client_, MONGOC_ERROR_API_VERSION_2);
    board_->set_connected(subtask_, SourceConnectionBoard::steady_now_ms());
    thread_ = std::thread([this] { run(); });
  }
  ~MongoConnectionProbe() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (client_ != nullptr) mongoc_client_destroy(client_);
    board_->remove(subtask_);
  }
  MongoConnectionProbe(const MongoConnectionProbe&) = delete;
  MongoConnectionProbe& operator=(const MongoConnectionProbe&) = delete;

 private:
  void run() {
    int64_t last_answer = SourceConnectionBoard::steady_now_ms();
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      const auto sent = std::chrono::steady_clock::now();
      bson_t* ping = BCON_NEW("ping", BCON_INT32(1));
      bson_t reply;
      bson_error_t e;
      const bool ok = mongoc_client_command_simple(client_, "admin", ping, nullptr, &reply, &e);
      bson_destroy(&reply);
      bson_destroy(ping);
      const int64_t now = SourceConnectionBoard::steady_now_ms();
      if (ok) {
        last_answer = now;
        board_->set_connected(subtask_, now);
      } else if (now - last_answer > kDisconnectedAfterMs) {
        board_->set_disconnected(subtask_, last_answer,
                                 fmt::format("the server does not answer pings: {}", redact_secrets(e.message)));
      }
      lock.lock();
      cv_.wait_until(lock, sent + std::chrono::seconds(1), [this] { return stop_; });
    }
  }

  std::shared_ptr<SourceConnectionBoard> board_;
  const int subtask_;
  mongoc_client_t* client_ = nullptr;  // used by the probe's thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

class MongoCdcReader final : public SourceReader<cdc::ChangeEvent, MongoCollectionSplit> {
 public:
  MongoCdcReader(SourceReaderContext& ctx, const detail::MongoCdcSourceSettings& s,
                 std::unique_ptr<mongodb::MongoDriver> driver, std::shared_ptr<MongoCdcSourceMetrics> metrics,
                 std::shared_ptr<DeadLetterFile> dead_letter)
      : ctx_(ctx),
        s_(s),
        driver_(std::move(driver)),
        metrics_(std::move(metrics)),
        dead_letter_(std::move(dead_letter)),
        name_(fmt::format("{} subtask {} ({})", kRole, ctx.subtask_index(), s.describe())) {
    if (s.watch_connection) {
      probe_ = std::make_unique<MongoConnectionProbe>(s.uri, metrics_->connections, ctx.subtask_index());
    }
  }

  InputStatus poll_next(ReaderOutput<cdc::ChangeEvent>& output) override {
    out_ = &output;
    for (auto& sp : splits_) {
      if (sp->output == nullptr) sp->output = &output.output_for_split(sp->split.split_id());
    }
    size_t emitted = 0;
    // One split per call, round robin; an idle split lets the next one try within the same call.
    for (size_t tries = 0; tries < splits_.size() && emitted == 0; ++tries) {
      next_ = next_ % splits_.size();
      Split& sp = *splits_[next_];
      ++next_;
      emitted += poll_split(sp);
    }
    std::erase_if(splits_, [](const std::unique_ptr<Split>& sp) { return sp->finished; });
    if (splits_.empty() && no_more_splits_) return InputStatus::kEndOfInput;
    if (emitted > 0) return InputStatus::kMoreAvailable;
    ctx_.wakeup_at(ctx_.clock().now_ms() + s_.poll_interval_ms);
    return InputStatus::kNothingAvailable;
  }

  void add_splits(std::vector<MongoCollectionSplit> splits) override {
    for (MongoCollectionSplit& s : splits) {
      const bool dup = std::any_of(splits_.begin(), splits_.end(),
                                   [&](const auto& p) { return p->split.split_id() == s.split_id(); });
      if (s.assigned || dup) {
        spdlog::warn("{}: ignoring a split for '{}': {}", name_, s.split_id(),
                     s.assigned ? "it is an enumerator marker" : "this reader already reads it");
        continue;
      }
      auto sp = std::make_unique<Split>();
      sp->split = std::move(s);
      splits_.push_back(std::move(sp));
    }
  }

  void notify_no_more_splits() override { no_more_splits_ = true; }

  std::vector<MongoCollectionSplit> snapshot_state(int64_t /*checkpoint_id*/) override {
    if (unsynced_dead_letters_) {
      dead_letter_->sync().value_or_throw();
      unsynced_dead_letters_ = false;
    }
    std::vector<MongoCollectionSplit> out;
    for (const auto& sp : splits_) {
      if (!sp->finished) out.push_back(sp->split);
    }
    return out;
  }

  void close() override {
    for (auto& sp : splits_) {
      sp->scan.reset();
      sp->stream.reset();
    }
    splits_.clear();
    driver_.reset();
    probe_.reset();
  }

 private:
  struct Split {
    MongoCollectionSplit split;
    ReaderOutput<cdc::ChangeEvent>* output = nullptr;
    std::unique_ptr<mongodb::DocumentCursor> scan;
    std::unique_ptr<mongodb::ChangeStreamCursor> stream;
    MongoClusterTime snapshot_start = 0;
    bool finished = false;
  };

  std::string coll_name(const Split& sp) const { return sp.split.split_id(); }

  [[noreturn]] void fail(const std::string& message) const {
    throw SluiceException(Error(ErrorCode::kConnector, fmt::format("{}: {}", name_, message)));
  }

  /// Fails with an error no restart can cure (core/non_recoverable.h): the job fails at once with `reason`.
  [[noreturn]] void fail_for_good(const std::string& message, std::string_view reason) const {
    throw SluiceException(
        mark_non_recoverable(Error(ErrorCode::kConnector, fmt::format("{}: {}", name_, message)), reason));
  }

  /// Why a driver error can never pass on a retry: the server refused the credentials (AuthenticationFailed, 18;
  /// the driver's authentication error) or the user lacks a privilege (Unauthorized, 13). "" for anything else.
  static std::string non_recoverable_driver_error(const mongodb::DriverError& e) {
    if (e.domain == MONGOC_ERROR_CLIENT && e.code == MONGOC_ERROR_CLIENT_AUTHENTICATE) {
      return "the server refused the credentials";
    }
    if (e.domain == MONGOC_ERROR_SERVER && e.code == 18) return "the server refused the credentials";
    if (e.domain == MONGOC_ERROR_SERVER && e.code == 13) return "the user lacks a privilege the source needs";
    return "";
  }

  size_t poll_split(Split& sp) {
    if (sp.split.snapshot_pending) return poll_snapshot(sp);
    return poll_stream(sp);
  }

  MongoClusterTime cluster_time_or_fail(const Split& sp) {
    MongoClusterTime t = 0;
    mongodb::DriverError e;
    if (!driver_->cluster_time(sp.split.database, t, e)) {
      fail(fmt::format("reading the cluster time for '{}' failed: {} (code {})", coll_name(sp), e.message, e.code));
    }
    return t;
  }

  size_t poll_snapshot(Split& sp) {
    if (!sp.scan) {
      sp.split.resume_token.clear();
      sp.split.token_time_ms = 0;
      sp.stream.reset();
      if (!sp.split.snapshot_last_id.empty() && sp.split.start_at != 0) {
        // A restored scan: documents up to the last one emitted before the checkpoint are not read again, and
        // the stream starts at the same T0, so the changes to those documents since T0 are still streamed.
        bson_t after;
        if (!bson_init_static(&after, reinterpret_cast<const uint8_t*>(sp.split.snapshot_last_id.data()),
                              sp.split.snapshot_last_id.size())) {
          fail(fmt::format("the stored snapshot position of '{}' is not BSON", coll_name(sp)));
        }
        sp.snapshot_start = sp.split.start_at;
        sp.scan = driver_->scan(sp.split.database, sp.split.collection, s_.batch_size, &after);
        spdlog::info("{}: {}snapshot of '{}' resumes after {}; streaming resumes at {}", name_,
                     sp.split.resnapshot ? "re-" : "", coll_name(sp), mongodb::bson_to_canonical_json(after),
                     describe_cluster_time(sp.snapshot_start));
      } else {
        // Consistent start: the resume point is taken before the scan, so every change after it is streamed.
        sp.snapshot_start = cluster_time_or_fail(sp);
        sp.split.start_at = sp.snapshot_start;
        sp.split.snapshot_last_id.clear();
        sp.scan = driver_->scan(sp.split.database, sp.split.collection, s_.batch_size, nullptr);
        spdlog::info("{}: {}snapshot of '{}' starts; streaming resumes at {}", name_, sp.split.resnapshot ? "re-" : "",
                     coll_name(sp), describe_cluster_time(sp.snapshot_start));
      }
    }
    size_t n = 0;
    const int64_t ts_ms = cluster_time_ms(sp.snapshot_start);
    while (n < static_cast<size_t>(s_.batch_size)) {
      const bson_t* doc = sp.scan->next();
      if (doc == nullptr) break;
      remember_scan_position(sp, *doc);
      Result<Value> v = mongodb::bson_to_value(*doc, s_.value_options);
      if (!v.ok()) {
        bad_record(sp, describe_cluster_time(sp.snapshot_start), v.error().message(), *doc);
        continue;
      }
      const Value* id = v->find("_id");
      if (id == nullptr) {
        bad_record(sp, describe_cluster_time(sp.snapshot_start), "a document without _id", *doc);
        continue;
      }
      cdc::ChangeEvent e;
      e.op = cdc::ChangeOp::kRead;
      e.key = Value::object({{"_id", *id}});
      e.after = std::move(v).value();
      e.source.connector = "mongodb";
      e.source.database = sp.split.database;
      e.source.collection = sp.split.collection;
      e.source.position = describe_cluster_time(sp.snapshot_start);
      e.source.ts_ms = ts_ms;
      e.source.snapshot = true;
      sp.output->collect(std::move(e), ts_ms);
      ++n;
    }
    metrics_->events.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    metrics_->snapshot_reads.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    if (n < static_cast<size_t>(s_.batch_size)) {
      mongodb::DriverError e;
      if (sp.scan->error(e)) {
        fail(fmt::format("the snapshot scan of '{}' failed: {} (code {})", coll_name(sp), e.message, e.code));
      }
      sp.scan.reset();
      sp.split.overlap_until = cluster_time_or_fail(sp);
      sp.split.snapshot_pending = false;
      sp.split.snapshot_last_id.clear();
      spdlog::info("{}: snapshot of '{}' done; stream events up to {} are marked as overlapping it", name_,
                   coll_name(sp), describe_cluster_time(sp.split.overlap_until));
    }
    return std::max<size_t>(n, 1);  // a finished scan counts as progress: stream next
  }

  // The scan's position moves past `doc` whether it is emitted or goes to the dead-letter file (as the stream's
  // token does): the copy of {"_id": ...} a checkpoint stores.
  static void remember_scan_position(Split& sp, const bson_t& doc) {
    bson_iter_t it;
    if (!bson_iter_init_find(&it, &doc, "_id")) return;
    bson_t id = BSON_INITIALIZER;
    bson_append_iter(&id, "_id", 3, &it);
    sp.split.snapshot_last_id.assign(reinterpret_cast<const char*>(bson_get_data(&id)), id.len);
    bson_destroy(&id);
  }

  void open_stream(Split& sp) {
    BsonPtr opts(bson_new());
    if (s_.update_lookup) BSON_APPEND_UTF8(opts.get(), "fullDocument", "updateLookup");
    if (s_.pre_images) BSON_APPEND_UTF8(opts.get(), "fullDocumentBeforeChange", "whenAvailable");
    BSON_APPEND_INT64(opts.get(), "maxAwaitTimeMS", s_.max_await_ms);
    BSON_APPEND_INT32(opts.get(), "batchSize", s_.batch_size);
    if (!sp.split.resume_token.empty()) {
      bson_t token;
      if (!bson_init_static(&token, reinterpret_cast<const uint8_t*>(sp.split.resume_token.data()),
                            sp.split.resume_token.size())) {
        fail(fmt::format("the stored resume token of '{}' is not BSON", coll_name(sp)));
      }
      BSON_APPEND_DOCUMENT(opts.get(), "resumeAfter", &token);
    } else if (sp.split.start_at != 0) {
      const auto t = static_cast<uint64_t>(sp.split.start_at);
      BSON_APPEND_TIMESTAMP(opts.get(), "startAtOperationTime", static_cast<uint32_t>(t >> 32),
                            static_cast<uint32_t>(t));
    }
    sp.stream = driver_->watch(sp.split.database, sp.split.collection, *opts);
  }

  size_t poll_stream(Split& sp) {
    if (!sp.stream) open_stream(sp);
    size_t n = 0;
    while (n < static_cast<size_t>(s_.batch_size) && !sp.finished && !sp.split.snapshot_pending) {
      const bson_t* doc = sp.stream->next();
      if (doc == nullptr) break;
      ++n;
      handle_change(sp, *doc);
    }
    if (sp.finished || sp.split.snapshot_pending) return std::max<size_t>(n, 1);
    mongodb::DriverError e;
    if (sp.stream->error(e)) {
      handle_stream_error(sp, e);
      return 1;
    }
    if (n == 0) {
      // An empty batch: the server has nothing newer for this stream, so the split is caught up now (the source
      // lag is measured against the server's position, not the age of the last change).
      metrics_->record_caught_up(sp.split.split_id(), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          std::chrono::system_clock::now().time_since_epoch())
                                                          .count());
      // Adopt the server's post-batch resume token (real servers advance it while idle).
      const bson_t* token = sp.stream->resume_token();
      if (token != nullptr && token->len > 5) {
        std::string bytes(reinterpret_cast<const char*>(bson_get_data(token)), token->len);
        if (bytes != sp.split.resume_token) sp.split.resume_token = std::move(bytes);
      }
    }
    return n;
  }

  void handle_change(Split& sp, const bson_t& doc) {
    Result<mongodb::MappedChange> m = mongodb::map_change_document(doc, sp.split, s_.value_options);
    // The resume token moves past this change whatever happens to it (bson_copy semantics: our own bytes).
    bson_iter_t it;
    if (bson_iter_init_find(&it, &doc, "_id") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
      uint32_t len = 0;
      const uint8_t* data = nullptr;
      bson_iter_document(&it, &len, &data);
      sp.split.resume_token.assign(reinterpret_cast<const char*>(data), len);
    }
    if (!m.ok()) {
      bad_record(sp, mongodb::bson_to_canonical_json(doc), m.error().message(), doc);
      return;
    }
    if (m->cluster_time != 0) sp.split.token_time_ms = cluster_time_ms(m->cluster_time);
    switch (m->kind) {
      case mongodb::MappedChange::Kind::kSkip:
        metrics_->ddl_events.fetch_add(1, std::memory_order_relaxed);
        return;
      case mongodb::MappedChange::Kind::kEndOfStream:
        metrics_->ddl_events.fetch_add(1, std::memory_order_relaxed);
        if (s_.on_drop == MongoOnDrop::kFail) {
          // A restart from the checkpoint reads the same end of the stream again.
          fail_for_good(
              fmt::format("collection '{}' ended its change stream ({}). The source is configured with on-drop: fail; "
                          "re-create the collection and restart the job without its checkpoint, or set "
                          "on_drop(MongoOnDrop::kEndSplit) to let the job go on without it",
                          coll_name(sp), m->what),
              "the collection was dropped or renamed (on-drop: fail)");
        }
        spdlog::warn("{}: collection '{}' ended its change stream ({}): its split ends (on-drop: end-split)", name_,
                     coll_name(sp), m->what);
        sp.finished = true;
        sp.stream.reset();
        if (out_ != nullptr) out_->release_output_for_split(sp.split.split_id());
        return;
      case mongodb::MappedChange::Kind::kEvent:
        break;
    }
    cdc::ChangeEvent& e = m->event;
    if (sp.split.resnapshot) e.source.snapshot = e.source.snapshot || m->cluster_time <= sp.split.overlap_until;
    metrics_->record_position(sp.split.split_id(), e.source.position, e.source.ts_ms);
    metrics_->events.fetch_add(1, std::memory_order_relaxed);
    const int64_t ts = e.source.ts_ms;
    sp.output->collect(std::move(e), ts > 0 ? ts : kNoTimestamp);
  }

  void handle_stream_error(Split& sp, const mongodb::DriverError& e) {
    sp.stream.reset();
    if (mongodb::is_history_lost(e.code)) {
      metrics_->history_lost.fetch_add(1, std::memory_order_relaxed);
      const std::string token =
          sp.split.resume_token.empty()
              ? (sp.split.start_at != 0 ? "start time " + describe_cluster_time(sp.split.start_at)
                                        : std::string("no token"))
              : mongodb::bson_to_canonical_json(reinterpret_cast<const uint8_t*>(sp.split.resume_token.data()),
                                                sp.split.resume_token.size());
      const int64_t when = sp.split.token_time_ms != 0 ? sp.split.token_time_ms : cluster_time_ms(sp.split.start_at);
      if (s_.on_history_lost == MongoOnHistoryLost::kFail) {
        fail_for_good(
            fmt::format(
                "the change stream history of collection '{}' is lost (server error {}: {}): the stored position {} "
                "(cluster time {}) is no longer in the oplog. Remedy: restart the job without its checkpoint with "
                "start "
                "mode 'initial' to take a new snapshot, or set on_history_lost(MongoOnHistoryLost::kResnapshot); to "
                "prevent it, size the oplog (replSetResizeOplog / oplogMinRetentionHours) to cover the longest outage "
                "plus the checkpoint interval",
                coll_name(sp), e.code, e.message, token, iso_time(when)),
            "the checkpoint's position is no longer in the oplog (on-history-lost: fail)");
      }
      spdlog::warn(
          "{}: the change stream history of '{}' is lost (server error {}: {}; position {} at {}): "
          "re-snapshotting the collection (on-history-lost: resnapshot)",
          name_, coll_name(sp), e.code, e.message, token, iso_time(when));
      metrics_->resnapshots.fetch_add(1, std::memory_order_relaxed);
      sp.split.snapshot_pending = true;
      sp.split.resnapshot = true;
      sp.split.snapshot_last_id.clear();
      sp.split.resume_token.clear();
      sp.split.token_time_ms = 0;
      return;
    }
    // A socket error or a failed server selection: most often a server that stopped answering (the liveness
    // timeout), which the driver's own message does not say.
    const bool unreachable = e.domain == MONGOC_ERROR_STREAM || e.domain == MONGOC_ERROR_SERVER_SELECTION;
    if (std::string reason = non_recoverable_driver_error(e); !reason.empty()) {
      fail_for_good(fmt::format("the change stream of collection '{}' failed (error {}, domain {}): {}", coll_name(sp),
                                e.code, e.domain, e.message),
                    reason);
    }
    fail(fmt::format("the change stream of collection '{}' failed (error {}, domain {}): {}{}", coll_name(sp), e.code,
                     e.domain, e.message,
                     unreachable ? fmt::format("; the server did not answer within the socket timeout ({} ms unless "
                                               "the URI sets socketTimeoutMS) or cannot be reached",
                                               s_.socket_timeout_ms)
                                 : std::string()));
  }

  void bad_record(Split& sp, const std::string& position, const std::string& reason, const bson_t& doc) {
    if (s_.bad_record_policy == BadRecordPolicy::kFail || !dead_letter_) {
      fail(fmt::format(
          "bad change in collection '{}' at position {}: {}. Divert such records with "
          "on_bad_record(BadRecordPolicy::kDeadLetter, path) (in a pipeline file: set pipeline.dead-letter)",
          coll_name(sp), position, reason));
    }
    Value entry = Value::object({{"source", Value("mongodb")},
                                 {"db", Value(sp.split.database)},
                                 {"collection", Value(sp.split.collection)},
                                 {"position", Value(position)},
                                 {"error", Value(reason)},
                                 {"record", Value(mongodb::bson_to_canonical_json(doc))}});
    dead_letter_->append(entry).value_or_throw();
    unsynced_dead_letters_ = true;
    metrics_->bad_records.fetch_add(1, std::memory_order_relaxed);
  }

  SourceReaderContext& ctx_;
  detail::MongoCdcSourceSettings s_;
  std::unique_ptr<mongodb::MongoDriver> driver_;
  std::shared_ptr<MongoCdcSourceMetrics> metrics_;
  std::shared_ptr<DeadLetterFile> dead_letter_;
  std::string name_;
  std::unique_ptr<MongoConnectionProbe> probe_;  // null with a driver other than libmongoc's
  std::vector<std::unique_ptr<Split>> splits_;
  size_t next_ = 0;
  bool no_more_splits_ = false;
  bool unsynced_dead_letters_ = false;
  ReaderOutput<cdc::ChangeEvent>* out_ = nullptr;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Source

MongoCdcSource::MongoCdcSource(detail::MongoCdcSourceSettings settings) : settings_(std::move(settings)) {
  metrics_->connections = std::make_shared<SourceConnectionBoard>("MongoDB CDC source (" + settings_.describe() + ")");
}

std::shared_ptr<DeadLetterFile> MongoCdcSource::dead_letter_file() const {
  if (settings_.bad_record_policy != BadRecordPolicy::kDeadLetter) return nullptr;
  std::lock_guard lock(mu_);
  if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
  return dead_letter_;
}

std::unique_ptr<SplitEnumerator<MongoCollectionSplit>> MongoCdcSource::create_enumerator(
    SplitEnumeratorContext<MongoCollectionSplit>& ctx) const {
  dead_letter_file();
  return std::make_unique<MongoCdcEnumerator>(ctx, settings_, settings_.driver_factory().value_or_throw());
}

std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> MongoCdcSource::create_reader(
    SourceReaderContext& ctx) const {
  return std::make_unique<MongoCdcReader>(ctx, settings_, settings_.driver_factory().value_or_throw(), metrics_,
                                          dead_letter_file());
}

}  // namespace sluice
