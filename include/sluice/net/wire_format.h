// The wire format of the TCP data plane between TaskManagers (version 1). docs/cluster-data-plane.md is the
// reference; this header is its code.
//
// A connection starts with one kHello frame in each direction (the dialing side first; the accepting side
// answers), then carries any number of the other frames in both directions. Every integer is little-endian.
// A frame is a one-byte type followed by a fixed layout per type:
//
//   kHello         u32 magic "SLCN", u16 version, u16 id length, id bytes (the TaskManager's id, <= 255 bytes)
//   kBuffer        ChannelId (16 bytes), u32 backlog, u32 size, `size` bytes: one network buffer's content
//   kCredit        ChannelId, u32 credit: the receiver grants that many more buffers on the channel
//   kCancel        ChannelId: the receiver released the channel (Flink's CancelPartitionRequest)
//   kChannelError  ChannelId, u16 length, message (<= 1024 bytes): the channel failed at the peer
//   kBacklog       ChannelId, u32 backlog: the sender ran out of credit with `backlog` buffers queued (Flink's
//                  BacklogAnnouncement), so the receiver can add floating buffers
//
// A ChannelId is four i32: job edge, producer subtask, consumer subtask, attempt (region deployment).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace sluice::net {

/// "SLCN" as a little-endian u32.
inline constexpr uint32_t kMagic = 0x4E434C53;
/// Bumped on any incompatible change; peers of different versions refuse each other naming both versions.
inline constexpr uint16_t kWireVersion = 1;

enum class FrameType : uint8_t {
  kHello = 1,
  kBuffer = 2,
  kCredit = 3,
  kCancel = 4,
  kChannelError = 5,
  kBacklog = 6,
};

/// Identifies one channel among all channels multiplexed on a connection: one producer subtask to one
/// consumer subtask of one job edge, in one deployment (attempt) of the region. A frame for an id the
/// receiving side does not know (never registered, or released: a stale attempt) is an error.
struct ChannelId {
  int32_t edge = 0;
  int32_t producer_subtask = 0;
  int32_t consumer_subtask = 0;
  int32_t attempt = 0;

  bool operator==(const ChannelId&) const = default;
  /// "edge 3, subtask 1 -> 2, attempt 0".
  std::string to_string() const;
};

inline constexpr size_t kChannelIdSize = 16;
inline constexpr size_t kHelloFixedSize = 1 + 4 + 2 + 2;
inline constexpr size_t kMaxPeerIdSize = 255;
inline constexpr size_t kBufferHeaderSize = 1 + kChannelIdSize + 4 + 4;
inline constexpr size_t kCreditFrameSize = 1 + kChannelIdSize + 4;
inline constexpr size_t kCancelFrameSize = 1 + kChannelIdSize;
inline constexpr size_t kBacklogFrameSize = 1 + kChannelIdSize + 4;
inline constexpr size_t kChannelErrorFixedSize = 1 + kChannelIdSize + 2;
inline constexpr size_t kMaxErrorMessageSize = 1024;

/// Writes `id` at `p` (16 bytes).
void encode_channel_id(uint8_t* p, const ChannelId& id);
/// Reads a ChannelId from `p` (16 bytes).
ChannelId decode_channel_id(const uint8_t* p);

struct ChannelIdHash {
  size_t operator()(const ChannelId& id) const noexcept {
    uint64_t a =
        (static_cast<uint64_t>(static_cast<uint32_t>(id.edge)) << 32) ^ static_cast<uint32_t>(id.producer_subtask);
    uint64_t b =
        (static_cast<uint64_t>(static_cast<uint32_t>(id.consumer_subtask)) << 32) ^ static_cast<uint32_t>(id.attempt);
    return std::hash<uint64_t>{}(a * 0x9E3779B97F4A7C15ULL ^ b);
  }
};

}  // namespace sluice::net
