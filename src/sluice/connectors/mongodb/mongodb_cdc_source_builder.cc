// MongoCdcSourceBuilder: the settings of a MongoCdcSource and their checks (try_build).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "mongodb_cdc_internals.h"
#include "sluice/connectors/mongodb/libmongoc_logging.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"
#include "sluice/core/redact.h"

namespace sluice {

using mongodb_cdc_internal::BsonPtr;
using mongodb_cdc_internal::kRole;

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
  // An idle reader asks to be polled again after poll_interval: 0 would poll without a pause, a core busy for
  // a quiet collection (with max_await 0, or a server that answers an empty getMore at once).
  if (s.poll_interval_ms < 1) return bad("poll_interval must be at least 1 ms");
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

}  // namespace sluice
