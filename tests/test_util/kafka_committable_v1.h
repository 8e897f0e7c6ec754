// KafkaCommittable as Sluice wrote it into checkpoints and savepoints before the probe record (format version 1:
// seven fields through SLUICE_FIELDS), for the tests that restore an old checkpoint with this build.
#pragma once

#include <cstdint>
#include <string>

#include "sluice/connectors/kafka/kafka_sink.h"
#include "sluice/core/type_serializer.h"

namespace sluice::testing {

struct KafkaCommittableV1 {
  std::string transactional_id;
  int32_t subtask = 0;
  std::string token;
  std::string marker_topic;
  int64_t precommit_time_ms = 0;
  int64_t record_count = 0;
  std::string records;
};
SLUICE_FIELDS(KafkaCommittableV1, transactional_id, subtask, token, marker_topic, precommit_time_ms, record_count,
              records);

/// `c` without what version 2 added.
inline KafkaCommittableV1 as_version1(const KafkaCommittable& c) {
  return KafkaCommittableV1{c.transactional_id,  c.subtask,      c.token,  c.marker_topic,
                            c.precommit_time_ms, c.record_count, c.records};
}

}  // namespace sluice::testing
