// Writes documents into a MongoDB-wire server for tests (the shared one or a PrivateMongoDb, private_mongodb.h).
// Needs libmongoc (mongoc_init() called by the test).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mongoc/mongoc.h>

#include <string>

namespace sluice::testing {

/// Inserts documents {_id: "r<i>", id: "r<i>"} (i zero-padded to 5 digits) for i in [from, to) into shop.items of
/// the server at `uri`, one insert_one each. Records a fatal test failure on an error. One test thread.
inline void insert_items(const std::string& uri, int from, int to) {
  mongoc_client_t* client = mongoc_client_new(uri.c_str());
  ASSERT_NE(client, nullptr) << "bad URI " << uri;
  mongoc_collection_t* coll = mongoc_client_get_collection(client, "shop", "items");
  for (int i = from; i < to; ++i) {
    const std::string id = fmt::format("r{:05d}", i);
    bson_t* doc = BCON_NEW("_id", BCON_UTF8(id.c_str()), "id", BCON_UTF8(id.c_str()));
    bson_error_t e;
    const bool ok = mongoc_collection_insert_one(coll, doc, nullptr, nullptr, &e);
    bson_destroy(doc);
    if (!ok) {
      mongoc_collection_destroy(coll);
      mongoc_client_destroy(client);
      FAIL() << "insert " << id << ": " << e.message;
    }
  }
  mongoc_collection_destroy(coll);
  mongoc_client_destroy(client);
}

}  // namespace sluice::testing
