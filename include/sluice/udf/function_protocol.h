// The messages of the function protocol (docs/functions.md "Protocol") as the engine writes and reads them: the
// text of a batch frame, built record by record into a reused buffer, and the parse of a result frame into one
// Value per record. Shared by the pipeline's function operator, the C++ API's map_external and the benchmark.
//
// Decimals travel exactly: a decimal is written as the object {"$decimal":"<digits>"} (JSON numbers would reach
// JavaScript as doubles), and such an object in a reply becomes a decimal again. An input object whose only field
// is "$decimal" is therefore reserved: append_record refuses it (a record error), so that no user value is
// mistaken for a decimal.
//
// Thread-safety: free functions and a class for one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/core/value.h"

namespace sluice::udf {

/// The field name of an exact decimal on the wire: {"$decimal":"123.450"}.
inline constexpr std::string_view kDecimalTag = "$decimal";

/// Builds the text of one batch frame: {"type":"batch","id":N,"records":[r1,r2,...]}, with "decimals":true
/// after the records when one of them holds a decimal.
class BatchFrame {
 public:
  /// Starts batch `id`, reusing the buffer's capacity.
  void open(int64_t id);
  /// Appends one record. kSerialization (and the frame unchanged) when the record holds an object whose only
  /// field is "$decimal" (reserved by the protocol).
  [[nodiscard]] Status append(const Value& record);
  /// Closes the frame and returns its text (valid until the next open()).
  std::string_view close();
  size_t count() const noexcept { return count_; }
  int64_t id() const noexcept { return id_; }

 private:
  std::string text_;
  size_t count_ = 0;
  int64_t id_ = 0;
  bool decimals_ = false;
};

/// One record's answer: `ok` holds the returned value (null for null/undefined) unless `failed`, then `message`
/// and `stack` say why.
struct RecordResult {
  bool failed = false;
  Value ok;
  std::string message;
  std::string stack;
};

/// Parses a result frame of batch `id` with `count` records. A malformed frame (not JSON, wrong type, id or
/// count) is a kRuntime error whose message says what was expected and shows the start of the frame; a
/// "$decimal" value that is not a decimal Sluice can hold fails that record only.
[[nodiscard]] Result<std::vector<RecordResult>> parse_result_frame(std::string_view text, int64_t id, size_t count);

}  // namespace sluice::udf
