// PostgresCdcSourceBuilder: the settings of a PostgresCdcSource and their checks (try_build).
#include <fmt/format.h>

#include <algorithm>

#include "postgres_cdc_internals.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"

namespace sluice {

using postgres_cdc_internal::kRole;
using postgres_cdc_internal::split_table;

namespace {

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

}  // namespace

PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::conninfo(std::string conninfo) {
  s_.conninfo = std::move(conninfo);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::tables(std::vector<std::string> tables) {
  s_.tables = std::move(tables);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::slot_name(std::string name) {
  s_.slot_name = std::move(name);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::owner(std::string owner) {
  s_.owner = std::move(owner);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::publication_name(std::string name) {
  s_.publication_name = std::move(name);
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::create_slot(bool create) {
  s_.create_slot = create;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::create_publication(bool create) {
  s_.create_publication = create;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::start_mode(PostgresStartMode mode) {
  s_.start_mode = mode;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::truncate_policy(PostgresTruncatePolicy policy) {
  s_.truncate_policy = policy;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::on_interrupted_snapshot(PostgresInterruptedSnapshot policy) {
  s_.interrupted_snapshot = policy;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::heartbeat_interval(std::chrono::milliseconds interval) {
  s_.heartbeat_interval_ms = interval.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::status_interval(std::chrono::milliseconds interval) {
  s_.status_interval_ms = interval.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::liveness_timeout(std::chrono::milliseconds timeout) {
  s_.liveness_timeout_ms = timeout.count();
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::snapshot_fetch_rows(int64_t rows) {
  s_.snapshot_fetch_rows = rows;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::queue_capacity(size_t events) {
  s_.queue_capacity = events;
  return *this;
}
PostgresCdcSourceBuilder& PostgresCdcSourceBuilder::on_bad_record(BadRecordPolicy policy,
                                                                  std::string dead_letter_path) {
  s_.bad_record_policy = policy;
  s_.dead_letter_path = std::move(dead_letter_path);
  return *this;
}

Result<std::shared_ptr<PostgresCdcSource>> PostgresCdcSourceBuilder::try_build() const {
  auto bad = [](std::string m) { return Error(ErrorCode::kConfiguration, fmt::format("{}: {}", kRole, m)); };
  if (s_.conninfo.empty()) return bad("no connection: set conninfo(\"host=... dbname=... user=...\")");
  if (!valid_name(s_.slot_name)) {
    return bad(fmt::format("slot name '{}' is invalid: use 1-63 lower-case letters, digits and '_'", s_.slot_name));
  }
  if (!valid_name(s_.publication_name)) {
    return bad(fmt::format("publication name '{}' is invalid: use 1-63 lower-case letters, digits and '_'",
                           s_.publication_name));
  }
  for (const auto& t : s_.tables) {
    auto [schema, table] = split_table(t);
    if (schema.empty() || table.empty() || table.find('.') != std::string::npos) {
      return bad(fmt::format("table '{}' is not \"schema.table\" or \"table\"", t));
    }
  }
  if (s_.heartbeat_interval_ms < 0) return bad("heartbeat_interval must be >= 0");
  if (s_.status_interval_ms <= 0) return bad("status_interval must be > 0");
  if (s_.liveness_timeout_ms < 0) return bad("liveness_timeout must be >= 0 (0 = from wal_sender_timeout)");
  if (s_.snapshot_fetch_rows <= 0) return bad("snapshot_fetch_rows must be > 0");
  if (s_.queue_capacity == 0) return bad("queue_capacity must be > 0");
  if (s_.bad_record_policy == BadRecordPolicy::kDeadLetter && s_.dead_letter_path.empty()) {
    return bad("on_bad_record(kDeadLetter) needs a dead-letter file path");
  }
  return std::make_shared<PostgresCdcSource>(s_);
}

}  // namespace sluice
