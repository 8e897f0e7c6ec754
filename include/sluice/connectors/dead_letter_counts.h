// How many records this process appended to each dead-letter file (DeadLetterFile of bad_record.h), by path: a
// sink that diverts a record it cannot write (the Kafka sink's too large record, a failed bulk item, a row the
// Postgres sink refuses) keeps its writer's count to itself, so a pipeline reads it here for its run summary and
// /metrics.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace sluice {

/// Records appended through DeadLetterFile::append / append_line to the file opened as `path` (the string given
/// to DeadLetterFile::open) since the process started; 0 for a path never written. Monotonic.
int64_t dead_letters_appended(const std::string& path);
/// The same records by their entries' `reason` (bad_record.h): reason -> count, empty for a path never written.
std::map<std::string, int64_t> dead_letters_appended_by_reason(const std::string& path);

}  // namespace sluice
