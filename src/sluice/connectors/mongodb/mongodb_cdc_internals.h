// Private to src/sluice/connectors/mongodb/: what the files of the MongoDB CDC source share (the libmongoc driver,
// the change mapping, the enumerator and the reader): the role name for messages, cluster-time formatting, an owning
// bson_t handle and libmongoc's error as a DriverError. Not installed. Thread-safety: free functions and a handle
// the caller owns.
#pragma once

#include <fmt/format.h>
#include <mongoc/mongoc.h>

#include <cstdint>
#include <string>

#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/value.h"

namespace sluice {
namespace mongodb_cdc_internal {

inline constexpr const char* kRole = "MongoDB source";

inline int64_t cluster_time_ms(MongoClusterTime t) noexcept {
  return static_cast<int64_t>(static_cast<uint64_t>(t) >> 32) * 1000;
}

inline std::string iso_time(int64_t ms) {
  if (ms <= 0) return "an unknown time";
  std::string out;
  append_iso8601_micros(ms * 1000, out);
  return out;
}

inline std::string describe_cluster_time(MongoClusterTime t) {
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

inline mongodb::DriverError driver_error(const bson_error_t& e) {
  return mongodb::DriverError{e.domain, e.code, e.message};
}

}  // namespace mongodb_cdc_internal
}  // namespace sluice
