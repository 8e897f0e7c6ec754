// The non-template functions of kafka_sink.h's user API: delivery guarantee names and the Java client's default
// partitioning (murmur2). The sink itself is in the files listed in this folder's README (settings, producer,
// producer pool, recovery copy, writer, committer, committable).
#include "sluice/connectors/kafka/kafka_sink.h"

#include <cctype>

namespace sluice {

std::string_view delivery_guarantee_name(DeliveryGuarantee guarantee) noexcept {
  switch (guarantee) {
    case DeliveryGuarantee::kNone:
      return "none";
    case DeliveryGuarantee::kAtLeastOnce:
      return "at-least-once";
    case DeliveryGuarantee::kExactlyOnce:
      return "exactly-once";
  }
  return "unknown";
}

Result<DeliveryGuarantee> parse_delivery_guarantee(std::string_view text) {
  std::string t;
  for (char c : text)
    t.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (t == "none") return DeliveryGuarantee::kNone;
  if (t == "at-least-once") return DeliveryGuarantee::kAtLeastOnce;
  if (t == "exactly-once") return DeliveryGuarantee::kExactlyOnce;
  return Error(ErrorCode::kConfiguration,
               "unknown delivery guarantee '" + std::string(text) + "': use none, at-least-once or exactly-once");
}

int32_t kafka_murmur2(std::string_view bytes) noexcept {
  // org.apache.kafka.common.utils.Utils.murmur2, in unsigned arithmetic (Java's int wraps the same way).
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto length = static_cast<uint32_t>(bytes.size());
  constexpr uint32_t kSeed = 0x9747b28c;
  constexpr uint32_t kM = 0x5bd1e995;
  constexpr int kR = 24;
  uint32_t h = kSeed ^ length;
  const uint32_t length4 = length / 4;
  for (uint32_t i = 0; i < length4; ++i) {
    const uint32_t i4 = i * 4;
    uint32_t k = static_cast<uint32_t>(data[i4]) | (static_cast<uint32_t>(data[i4 + 1]) << 8) |
                 (static_cast<uint32_t>(data[i4 + 2]) << 16) | (static_cast<uint32_t>(data[i4 + 3]) << 24);
    k *= kM;
    k ^= k >> kR;
    k *= kM;
    h *= kM;
    h ^= k;
  }
  const uint32_t tail = length & ~3u;
  switch (length % 4) {
    case 3:
      h ^= static_cast<uint32_t>(data[tail + 2]) << 16;
      [[fallthrough]];
    case 2:
      h ^= static_cast<uint32_t>(data[tail + 1]) << 8;
      [[fallthrough]];
    case 1:
      h ^= static_cast<uint32_t>(data[tail]);
      h *= kM;
      break;
    default:
      break;
  }
  h ^= h >> 13;
  h *= kM;
  h ^= h >> 15;
  return static_cast<int32_t>(h);
}

int32_t kafka_default_partition(std::string_view key, int32_t num_partitions) noexcept {
  const uint32_t positive = static_cast<uint32_t>(kafka_murmur2(key)) & 0x7fffffffu;
  return static_cast<int32_t>(positive % static_cast<uint32_t>(num_partitions));
}
}  // namespace sluice
