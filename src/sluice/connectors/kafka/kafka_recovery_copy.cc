// The Kafka sink's recovery copies: RecoveryCopyWriter and RecoveryCopyReader (see kafka_recovery_copy.h).
#include "kafka_recovery_copy.h"

namespace sluice {
namespace detail {

namespace {
constexpr uint8_t kHasKey = 1;
constexpr uint8_t kHasValue = 2;
constexpr uint8_t kSameTopic = 4;
}  // namespace

void RecoveryCopyWriter::append(const KafkaProducerRecord& record, int32_t partition, int64_t timestamp_ms) {
  uint8_t flags = 0;
  if (record.has_key()) flags |= kHasKey;
  if (record.has_value()) flags |= kHasValue;
  const bool same_topic = count_ > 0 && record.topic == last_topic_;
  if (same_topic) flags |= kSameTopic;
  out_.write_u8(flags);
  if (!same_topic) {
    out_.write_string(record.topic);
    last_topic_ = record.topic;
  }
  out_.write_signed_varint(partition);
  out_.write_signed_varint(timestamp_ms);
  if (record.has_key()) out_.write_string(record.key());
  if (record.has_value()) out_.write_string(record.value());
  out_.write_varint(record.headers.size());
  for (const KafkaHeader& h : record.headers) {
    out_.write_string(h.key);
    out_.write_u8(h.value ? 1 : 0);
    if (h.value) out_.write_string(*h.value);
  }
  ++count_;
}

std::string RecoveryCopyWriter::take() {
  std::string bytes(out_.view());
  out_.clear();
  last_topic_.clear();
  count_ = 0;
  return bytes;
}

bool RecoveryCopyReader::next(RecoveryRecord& out) {
  if (in_.at_end()) return false;
  const uint8_t flags = in_.read_u8();
  if ((flags & ~(kHasKey | kHasValue | kSameTopic)) != 0) in_.fail("unknown recovery record flags");
  if ((flags & kSameTopic) != 0) {
    if (last_topic_.empty()) in_.fail("a recovery record repeats the topic of no previous record");
  } else {
    last_topic_ = in_.read_view(in_.read_length());
  }
  out.topic = last_topic_;
  out.partition = static_cast<int32_t>(in_.read_signed_varint());
  out.timestamp_ms = in_.read_signed_varint();
  out.key.reset();
  out.value.reset();
  if ((flags & kHasKey) != 0) out.key = in_.read_view(in_.read_length());
  if ((flags & kHasValue) != 0) out.value = in_.read_view(in_.read_length());
  out.headers.clear();
  const uint64_t headers = in_.read_varint();
  for (uint64_t i = 0; i < headers; ++i) {
    std::string_view name = in_.read_view(in_.read_length());
    std::optional<std::string_view> value;
    if (in_.read_u8() != 0) value = in_.read_view(in_.read_length());
    out.headers.emplace_back(name, value);
  }
  return true;
}

}  // namespace detail
}  // namespace sluice
