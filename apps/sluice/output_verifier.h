// OutputVerifier: the data-level check of `sluice verify` (docs/verify.md). Fed the records of a job's output in the
// order a consumer reads them (a Kafka topic partition by partition in offset order, a files sink's committed files
// line by line), it counts duplicates by event id and, per key, sequence numbers that are missing (gaps), and that
// arrive out of order. Thread-free: one reader feeds it, then report().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sluice::cli {

/// Which fields of a JSON record to check (dotted paths such as `payload.seq`; "" = not checked).
struct VerifyFields {
  std::string id_field;   ///< event id: two records with the same id are a duplicate
  std::string key_field;  ///< the key whose sequence numbers are checked
  std::string seq_field;  ///< per-key sequence number (an integer, or a string of digits)
  /// The first sequence number of every key; nullopt: each key's smallest seen (a gap before it goes unnoticed).
  std::optional<int64_t> seq_start;
  /// The last sequence number of every key (e.g. what the workload wrote); nullopt: each key's largest seen.
  std::optional<int64_t> seq_end;
};

/// What OutputVerifier found. `examples` holds the first few violations, each naming where the record was read.
struct VerifyReport {
  int64_t records = 0;
  int64_t unreadable = 0;  ///< not JSON, or lacking a checked field (each named in examples)
  int64_t keys = 0;
  int64_t distinct_ids = 0;
  int64_t duplicated = 0;    ///< records whose id was seen before (records - distinct ids, over readable ones)
  int64_t missing = 0;       ///< sequence numbers absent from a key's range
  int64_t out_of_order = 0;  ///< first sightings of an id whose seq is below the highest seq already read for its key
  int64_t keys_with_gaps = 0;
  std::vector<std::string> examples;

  /// A violation: anything unreadable, missing or out of order, or a duplicate unless `allow_duplicates`.
  bool violated(bool allow_duplicates) const {
    return unreadable > 0 || missing > 0 || out_of_order > 0 || (!allow_duplicates && duplicated > 0);
  }
};

class OutputVerifier {
 public:
  /// At least one of id_field or (key_field and seq_field) must be set (the caller checks flags).
  explicit OutputVerifier(VerifyFields fields, size_t max_examples = 10)
      : fields_(std::move(fields)), max_examples_(max_examples) {}

  /// Checks one record; `where` names its position (topic/partition@offset, file:line) for the report.
  void add(std::string_view json, const std::string& where);
  /// Computes gaps and returns the counts.
  VerifyReport report();

 private:
  struct KeyState {
    int64_t max_seq = INT64_MIN;
    std::unordered_set<int64_t> seqs;
  };
  void example(std::string text);

  VerifyFields fields_;
  size_t max_examples_;
  VerifyReport report_;
  std::unordered_set<std::string> ids_;
  std::map<std::string, KeyState> keys_;
};

}  // namespace sluice::cli
