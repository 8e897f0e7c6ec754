// The provided deserializers of kafka_record.h and KafkaMessageView's headers.
#include "sluice/connectors/kafka/kafka_record.h"

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <string>
#include <vector>

#include "sluice/core/utf8.h"

namespace sluice {

namespace kafka {

KafkaDeserializer<std::string> bytes_value() {
  return [](const KafkaMessageView& m, std::string& out) -> Status {
    if (m.value) {
      out.assign(*m.value);
    } else {
      out.clear();
    }
    return ok_status();
  };
}

KafkaDeserializer<std::string> string_value() {
  return [](const KafkaMessageView& m, std::string& out) -> Status {
    if (!m.value) {
      out.clear();
      return ok_status();
    }
    if (const size_t bad = first_invalid_utf8(*m.value); bad != std::string_view::npos) {
      return Error(ErrorCode::kSerialization,
                   fmt::format("the value is not valid UTF-8: invalid byte 0x{:02x} at byte {} of {}",
                               static_cast<unsigned char>((*m.value)[bad]), bad, m.value->size()));
    }
    out.assign(*m.value);
    return ok_status();
  };
}

}  // namespace kafka

std::vector<KafkaHeader> KafkaMessageView::headers() const {
  std::vector<KafkaHeader> out;
  if (raw == nullptr) {
    out.assign(fixed_headers.begin(), fixed_headers.end());
    return out;
  }
  rd_kafka_headers_t* hdrs = nullptr;  // owned by the message
  if (rd_kafka_message_headers(raw, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR || hdrs == nullptr) return out;
  const char* name = nullptr;
  const void* value = nullptr;
  size_t size = 0;
  for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
    KafkaHeader h;
    h.key = name;
    if (value != nullptr) h.value.emplace(static_cast<const char*>(value), size);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace sluice
