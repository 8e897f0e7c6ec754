#include "sluice/net/wire_format.h"

#include <fmt/format.h>

#include <cstring>

namespace sluice::net {

std::string ChannelId::to_string() const {
  return fmt::format("edge {}, subtask {} -> {}, attempt {}", edge, producer_subtask, consumer_subtask, attempt);
}

void encode_channel_id(uint8_t* p, const ChannelId& id) {
  const int32_t v[4] = {id.edge, id.producer_subtask, id.consumer_subtask, id.attempt};
  std::memcpy(p, v, kChannelIdSize);  // little-endian hosts only (static_assert in connection.cc)
}

ChannelId decode_channel_id(const uint8_t* p) {
  int32_t v[4];
  std::memcpy(v, p, kChannelIdSize);
  return ChannelId{v[0], v[1], v[2], v[3]};
}

}  // namespace sluice::net
