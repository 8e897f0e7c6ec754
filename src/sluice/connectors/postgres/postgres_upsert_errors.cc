// The Postgres upsert sink's errors: which SQLSTATEs are retried and which make a bad record, and the text of
// libpq messages and records in error messages.
#include <string>

#include "postgres_upsert_internals.h"
#include "sluice/connectors/postgres/postgres_upsert_sink.h"

namespace sluice {
namespace postgres_upsert_internal {

std::string trimmed(std::string e) {
  while (!e.empty() && (e.back() == '\n' || e.back() == ' '))
    e.pop_back();
  return e;
}

std::string truncated_json(const Value& v) {
  std::string s = v.to_json();
  if (s.size() > kMaxRecordJson) {
    s.resize(kMaxRecordJson);
    s += "...";
  }
  return s;
}

}  // namespace postgres_upsert_internal

namespace postgres {

bool is_retryable_sqlstate(std::string_view s) noexcept {
  return s == "40001" || s == "40P01" || s.starts_with("08") || s == "57P01" || s == "57P02" || s == "57P03";
}

bool is_data_error_sqlstate(std::string_view s) noexcept {
  return s.starts_with("22") || s.starts_with("23") || s == "42804" || s == "54000";
}

}  // namespace postgres
}  // namespace sluice
