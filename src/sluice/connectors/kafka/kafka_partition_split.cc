// Flink's owner rule for Kafka partitions (kafka_partition_split.h).
#include "sluice/connectors/kafka/kafka_partition_split.h"

#include <cstdint>

namespace sluice {

namespace kafka {

int32_t java_string_hash(std::string_view s) noexcept {
  uint32_t h = 0;
  for (const char c : s)
    h = 31 * h + static_cast<uint32_t>(static_cast<unsigned char>(c));
  return static_cast<int32_t>(h);
}

int split_owner(std::string_view topic, int32_t partition, int num_readers) noexcept {
  // Java: ((topic.hashCode() * 31) & 0x7FFFFFFF) % numReaders, then (start + partition) % numReaders.
  const uint32_t hash31 = static_cast<uint32_t>(java_string_hash(topic)) * 31u;
  const int64_t start = static_cast<int64_t>(hash31 & 0x7FFFFFFFu) % num_readers;
  return static_cast<int>((start + partition) % num_readers);
}

}  // namespace kafka

}  // namespace sluice
