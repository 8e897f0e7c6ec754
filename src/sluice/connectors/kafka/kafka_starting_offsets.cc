#include "sluice/connectors/kafka/kafka_starting_offsets.h"

#include <fmt/format.h>

#include <string>

namespace sluice {

namespace {

std::string reset_name(KafkaOffsetReset r) {
  switch (r) {
    case KafkaOffsetReset::kEarliest:
      return "earliest";
    case KafkaOffsetReset::kLatest:
      return "latest";
    case KafkaOffsetReset::kNone:
      return "none";
  }
  return "?";
}

}  // namespace

std::string KafkaStartingOffsets::describe() const {
  switch (kind_) {
    case Kind::kEarliest:
      return "earliest";
    case Kind::kLatest:
      return "latest";
    case Kind::kCommitted:
      return "committed (reset " + reset_name(reset_) + ")";
    case Kind::kTimestamp:
      return fmt::format("timestamp {}", timestamp_ms_);
    case Kind::kSpecific:
      return fmt::format("{} specific offsets (reset {})", offsets_.size(), reset_name(reset_));
  }
  return "?";
}

}  // namespace sluice
