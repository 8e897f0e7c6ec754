// TypeSerializer<KafkaCommittable>: the committable's encoding in checkpoints and savepoints (format versions 1 and
// 2; see kafka_sink.h).
#include "sluice/connectors/kafka/kafka_sink.h"

namespace sluice {

void TypeSerializer<KafkaCommittable>::serialize(const KafkaCommittable& v, DataOutput& out) {
  // Version 1's fields, as SLUICE_FIELDS encoded them, then the version and what it added.
  ::sluice::serialize(v.transactional_id, out);
  ::sluice::serialize(v.subtask, out);
  ::sluice::serialize(v.token, out);
  ::sluice::serialize(v.marker_topic, out);
  ::sluice::serialize(v.precommit_time_ms, out);
  ::sluice::serialize(v.record_count, out);
  ::sluice::serialize(v.records, out);
  out.write_varint(kKafkaCommittableFormatVersion);
  ::sluice::serialize(v.probe_topic, out);
  ::sluice::serialize(v.probe_partition, out);
  ::sluice::serialize(v.probe_offset, out);
  ::sluice::serialize(v.committed, out);
}

void TypeSerializer<KafkaCommittable>::deserialize(KafkaCommittable& target, DataInput& in) {
  ::sluice::deserialize(target.transactional_id, in);
  ::sluice::deserialize(target.subtask, in);
  ::sluice::deserialize(target.token, in);
  ::sluice::deserialize(target.marker_topic, in);
  ::sluice::deserialize(target.precommit_time_ms, in);
  ::sluice::deserialize(target.record_count, in);
  ::sluice::deserialize(target.records, in);
  target.probe_topic.clear();
  target.probe_partition = -1;
  target.probe_offset = -1;
  target.committed = false;
  if (in.at_end()) return;  // version 1: no probe record, settled by the marker group
  const uint64_t version = in.read_varint();
  if (version != kKafkaCommittableFormatVersion) {
    in.fail("Kafka sink committable of transactional id '" + target.transactional_id + "' has format version " +
            std::to_string(version) + ", which this Sluice does not read (it reads versions 1 and " +
            std::to_string(kKafkaCommittableFormatVersion) + ")");
  }
  ::sluice::deserialize(target.probe_topic, in);
  ::sluice::deserialize(target.probe_partition, in);
  ::sluice::deserialize(target.probe_offset, in);
  ::sluice::deserialize(target.committed, in);
}

}  // namespace sluice
