// The libmongoc implementation of mongodb::MongoDriver (mongodb_cdc_source.h): change streams, find cursors and the
// commands the source runs, over one mongoc_client_t.
#include <fmt/format.h>
#include <mongoc/mongoc.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "mongodb_cdc_internals.h"
#include "sluice/connectors/mongodb/libmongoc_logging.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/redact.h"

namespace sluice {

using mongodb_cdc_internal::BsonPtr;
using mongodb_cdc_internal::driver_error;
using mongodb_cdc_internal::kRole;

namespace {

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

}  // namespace mongodb

}  // namespace sluice
