// What a connector does with input it cannot decode (DESIGN.md §7 "bad input"): fail the job, or divert the
// record, its source position and the reason to a dead-letter file and go on. Never a silent skip.
//
// Shared by the connectors: each takes a BadRecordPolicy, counts diverted records in a BadRecordStats that
// the user can read while the job runs, and writes DeadLetterFile entries as JSON lines of the form
//   {"source":"file","path":"/in/a.jsonl","line":7,"offset":512,"reason":"undecodable","error":"...",
//    "record":"<raw input>"}
// (the position fields are the connector's own: a Kafka connector writes topic, partition and offset). `reason` is
// a short code from a small set (dead_letter_reason below, a Postgres SQLSTATE, an OpenSearch error type), so that
// dead letters can be counted per reason; `error` is the whole message.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice {

/// What a connector does with a record it cannot decode.
enum class BadRecordPolicy {
  kFail,        ///< fail the job with an error naming the record's position and the reason (the default)
  kDeadLetter,  ///< write the record, its position and the reason to a dead-letter file and continue
};

/// Returns "fail" or "dead-letter" (the names pipeline files use).
std::string_view bad_record_policy_name(BadRecordPolicy policy) noexcept;

/// The `reason` codes of dead-letter entries (besides `sqlstate-<SQLSTATE>` of the Postgres sink and the error
/// type of an OpenSearch bulk item, e.g. `mapper_parsing_exception`).
namespace dead_letter_reason {
inline constexpr std::string_view kUndecodable = "undecodable";    ///< a source record its format cannot decode
inline constexpr std::string_view kLineTooLong = "line-too-long";  ///< a files-source line over max_line_bytes
inline constexpr std::string_view kMissingId = "missing-id";       ///< a MongoDB document without _id
inline constexpr std::string_view kTooLarge = "too-large";     ///< a record over the Kafka producer's message.max.bytes
inline constexpr std::string_view kExpression = "expression";  ///< a pipeline transform's expression failed
inline constexpr std::string_view kFunction = "function";      ///< a pipeline's user function failed
/// Counted for an entry without a `reason` field.
inline constexpr std::string_view kUnspecified = "unspecified";
}  // namespace dead_letter_reason

/// Counters of one connector instance, shared by all its subtasks and readable from any thread while the
/// job runs.
struct BadRecordStats {
  /// Records written to the dead-letter file.
  std::atomic<int64_t> bad_records{0};
};

/// An append-only file of JSON lines, one per bad record. Thread-safe: the subtasks of a connector share one
/// instance and each append() writes its whole line with a single write(2) under a mutex, so lines never
/// interleave (also not with other processes appending to the same file: it is opened with O_APPEND).
/// append() hands each line to the OS at once (no user-space buffering); sync() makes them durable.
///
/// Lifecycle: open() -> append()/sync() ... -> destroyed (closes the file).
class DeadLetterFile {
 public:
  /// Opens `path` for appending, creating it (mode 0644) and its parent directories when missing.
  /// Returns a kConnector error naming the path and the OS reason when that fails.
  [[nodiscard]] static Result<std::shared_ptr<DeadLetterFile>> open(std::string path);

  DeadLetterFile(const DeadLetterFile&) = delete;
  DeadLetterFile& operator=(const DeadLetterFile&) = delete;
  ~DeadLetterFile();

  /// The file's path as given to open().
  const std::string& path() const noexcept { return path_; }

  /// Appends `entry.to_json()` and a newline, and counts it under the entry's `reason` field
  /// (dead_letter_counts.h; dead_letter_reason::kUnspecified without one). Returns a kConnector error naming the
  /// path and the OS reason when the write fails.
  [[nodiscard]] Status append(const Value& entry);
  /// Appends `json_line` (one JSON document without a newline) and a newline, counted under `reason`.
  [[nodiscard]] Status append_line(std::string_view json_line, std::string_view reason);
  /// fdatasync(2)s what was appended so far (connectors call it before a checkpoint records positions past
  /// the diverted records, and when they finish). Returns a kConnector error on failure.
  [[nodiscard]] Status sync();

 private:
  DeadLetterFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  // Writes line_ with write(2), retrying partial writes (a regular file rarely takes less than asked).
  Status write_line_locked();

  std::string path_;
  int fd_;
  std::mutex mu_;
  std::string line_;  // reused under mu_
};

}  // namespace sluice
