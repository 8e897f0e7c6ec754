#include "sluice/cluster/ha/ha_store.h"

#include <fmt/format.h>

#include <charconv>

#include "sluice/core/assign_or_return.h"
#include "sluice/core/value.h"

namespace sluice::ha {

namespace {

std::string to_json(const Value& v) {
  std::string out;
  v.write_json(out);
  return out;
}

Result<Value> parse_object(const EtcdKeyValue& kv) {
  auto v = Value::from_json(kv.value);
  if (!v.ok() || !v->is_object()) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("etcd key {} does not hold a JSON object as Sluice writes it: '{}'", kv.key,
                             kv.value.substr(0, 200)));
  }
  return std::move(v).value();
}

std::string string_field(const Value& obj, std::string_view name) {
  const Value* v = obj.find(name);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : std::string();
}

int64_t int_field(const Value& obj, std::string_view name) {
  const Value* v = obj.find(name);
  return v != nullptr && v->is_int64() ? v->as_int64() : 0;
}

Result<std::optional<CheckpointPointer>> parse_pointer(const std::optional<EtcdKeyValue>& kv) {
  if (!kv) return std::optional<CheckpointPointer>();
  SLUICE_ASSIGN_OR_RETURN(auto obj, parse_object(*kv));
  CheckpointPointer p;
  p.checkpoint_id = int_field(obj, "checkpoint_id");
  p.external_path = string_field(obj, "external_path");
  p.completed_at_ms = int_field(obj, "completed_at_ms");
  p.leader_epoch = int_field(obj, "leader_epoch");
  return std::optional<CheckpointPointer>(std::move(p));
}

Result<std::optional<int>> parse_attempt(const std::optional<EtcdKeyValue>& kv) {
  if (!kv) return std::optional<int>();
  int n = -1;
  const auto [end, ec] = std::from_chars(kv->value.data(), kv->value.data() + kv->value.size(), n);
  if (ec != std::errc() || end != kv->value.data() + kv->value.size() || n < 0) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("etcd key {} does not hold an attempt number as Sluice writes it: '{}'", kv->key,
                             kv->value.substr(0, 200)));
  }
  return std::optional<int>(n);
}

}  // namespace

Result<FencedWrite> EtcdHaStore::fenced(const LeaderEpoch& epoch, std::vector<EtcdCompare> extra,
                                        std::vector<EtcdOp> ops) {
  const std::string leader = keys_.leader();
  std::vector<EtcdCompare> compares{
      EtcdCompare{leader, EtcdCompare::Target::kCreateRevision, EtcdCompare::Op::kEqual, epoch.create_revision, {}},
      EtcdCompare{leader, EtcdCompare::Target::kLease, EtcdCompare::Op::kEqual, epoch.lease_id, {}}};
  for (auto& c : extra)
    compares.push_back(std::move(c));
  SLUICE_ASSIGN_OR_RETURN(auto r, client_.txn(compares, ops, {EtcdOp::range(leader)}));
  if (r.succeeded) return FencedWrite::kApplied;
  const auto& found = r.ranges.at(0);
  if (found.empty() || found.front().create_revision != epoch.create_revision ||
      found.front().lease != epoch.lease_id) {
    return FencedWrite::kFenced;
  }
  // Still the leader: one of `extra` failed (the caller's optimistic check).
  return Error(ErrorCode::kCheckpoint, "the HA store changed concurrently");
}

Result<FencedWrite> EtcdHaStore::put_job(const LeaderEpoch& epoch, const HaJobRecord& job, std::string_view status) {
  const Value graph = Value::object({{"job_id", Value::string(job.job_id)},
                                     {"name", Value::string(job.name)},
                                     {"graph_kind", Value::string(job.graph_kind)},
                                     {"graph", Value::string(job.graph)}});
  return fenced(epoch, {},
                {EtcdOp::put(keys_.job_graph(job.job_id), to_json(graph)),
                 EtcdOp::put(keys_.job_status(job.job_id), std::string(status))});
}

Result<FencedWrite> EtcdHaStore::set_job_status(const LeaderEpoch& epoch, std::string_view job_id,
                                                std::string_view status) {
  return fenced(epoch, {}, {EtcdOp::put(keys_.job_status(job_id), std::string(status))});
}

Result<FencedWrite> EtcdHaStore::set_latest_checkpoint(const LeaderEpoch& epoch, std::string_view job_id,
                                                       const CheckpointPointer& pointer) {
  const std::string key = keys_.job_checkpoint(job_id);
  const Value value = Value::object({{"checkpoint_id", Value(pointer.checkpoint_id)},
                                     {"external_path", Value::string(pointer.external_path)},
                                     {"completed_at_ms", Value(pointer.completed_at_ms)},
                                     {"leader_epoch", Value(epoch.create_revision)}});
  // Optimistic: read the stored pointer, then write only if it is unchanged since (mod revision) and older.
  for (int attempt = 0; attempt < 5; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(auto current, client_.get(key));
    SLUICE_ASSIGN_OR_RETURN(auto stored, parse_pointer(current));
    // This very write, applied by an earlier attempt whose answer was lost (an etcd member restarting under the
    // transaction: the client retried on the next endpoint, where the mod-revision compare then failed).
    if (stored.has_value() && stored->checkpoint_id == pointer.checkpoint_id &&
        stored->external_path == pointer.external_path && stored->leader_epoch == epoch.create_revision) {
      SLUICE_ASSIGN_OR_RETURN(auto leader, read_leader(client_, keys_.leader()));
      if (!leader.has_value() || leader->epoch != epoch) return FencedWrite::kFenced;
      return FencedWrite::kApplied;
    }
    if (stored.has_value() && stored->checkpoint_id >= pointer.checkpoint_id) {
      // A former leader's pointer is usually behind the new leader's: say "fenced", which is what it needs to know.
      SLUICE_ASSIGN_OR_RETURN(auto leader, read_leader(client_, keys_.leader()));
      if (!leader.has_value() || leader->epoch != epoch) return FencedWrite::kFenced;
      return Error(ErrorCode::kCheckpoint,
                   fmt::format("job {}: the latest-checkpoint pointer is at checkpoint {}; {} would move it back",
                               job_id, stored->checkpoint_id, pointer.checkpoint_id));
    }
    const int64_t mod = current.has_value() ? current->mod_revision : 0;
    auto r = fenced(epoch, {EtcdCompare{key, EtcdCompare::Target::kModRevision, EtcdCompare::Op::kEqual, mod, {}}},
                    {EtcdOp::put(key, to_json(value))});
    if (r.ok()) return r;
    if (r.error().code() != ErrorCode::kCheckpoint) return r;
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("job {}: the latest-checkpoint pointer kept changing under the leader", job_id));
}

Result<FencedWrite> EtcdHaStore::set_attempt(const LeaderEpoch& epoch, std::string_view job_id, int attempt) {
  const std::string key = keys_.job_attempt(job_id);
  // Optimistic as the pointer: read, then write only if the key is unchanged since (mod revision) and not above.
  for (int round = 0; round < 5; ++round) {
    SLUICE_ASSIGN_OR_RETURN(auto current, client_.get(key));
    SLUICE_ASSIGN_OR_RETURN(auto stored, parse_attempt(current));
    if (stored.has_value() && *stored > attempt) {
      SLUICE_ASSIGN_OR_RETURN(auto leader, read_leader(client_, keys_.leader()));
      if (!leader.has_value() || leader->epoch != epoch) return FencedWrite::kFenced;
      return Error(
          ErrorCode::kCheckpoint,
          fmt::format("job {}: attempt {} is recorded in etcd; attempt {} would go back", job_id, *stored, attempt));
    }
    const int64_t mod = current.has_value() ? current->mod_revision : 0;
    auto r = fenced(epoch, {EtcdCompare{key, EtcdCompare::Target::kModRevision, EtcdCompare::Op::kEqual, mod, {}}},
                    {EtcdOp::put(key, std::to_string(attempt))});
    if (r.ok()) return r;
    if (r.error().code() != ErrorCode::kCheckpoint) return r;
  }
  return Error(ErrorCode::kCheckpoint,
               fmt::format("job {}: the attempt number kept changing under the leader", job_id));
}

Result<FencedWrite> EtcdHaStore::remove_job(const LeaderEpoch& epoch, std::string_view job_id) {
  return fenced(epoch, {},
                {EtcdOp::remove(keys_.job_graph(job_id)), EtcdOp::remove(keys_.job_status(job_id)),
                 EtcdOp::remove(keys_.job_checkpoint(job_id)), EtcdOp::remove(keys_.job_attempt(job_id))});
}

Result<std::vector<std::string>> EtcdHaStore::job_ids() {
  SLUICE_ASSIGN_OR_RETURN(auto kvs, client_.get_prefix(keys_.jobs_prefix()));
  std::vector<std::string> out;
  const size_t skip = keys_.jobs_prefix().size();
  for (const auto& kv : kvs) {
    if (!kv.key.ends_with("/graph")) continue;
    out.push_back(kv.key.substr(skip, kv.key.size() - skip - std::string_view("/graph").size()));
  }
  return out;
}

Result<std::optional<HaJobRecord>> EtcdHaStore::job(std::string_view job_id) {
  SLUICE_ASSIGN_OR_RETURN(auto kv, client_.get(keys_.job_graph(job_id)));
  if (!kv.has_value()) return std::optional<HaJobRecord>();
  SLUICE_ASSIGN_OR_RETURN(auto obj, parse_object(*kv));
  HaJobRecord job;
  job.job_id = string_field(obj, "job_id");
  job.name = string_field(obj, "name");
  job.graph_kind = string_field(obj, "graph_kind");
  job.graph = string_field(obj, "graph");
  return std::optional<HaJobRecord>(std::move(job));
}

Result<std::optional<std::string>> EtcdHaStore::job_status(std::string_view job_id) {
  SLUICE_ASSIGN_OR_RETURN(auto kv, client_.get(keys_.job_status(job_id)));
  if (!kv.has_value()) return std::optional<std::string>();
  return std::optional<std::string>(kv->value);
}

Result<std::optional<CheckpointPointer>> EtcdHaStore::latest_checkpoint(std::string_view job_id) {
  SLUICE_ASSIGN_OR_RETURN(auto kv, client_.get(keys_.job_checkpoint(job_id)));
  return parse_pointer(kv);
}

Result<std::optional<int>> EtcdHaStore::attempt(std::string_view job_id) {
  SLUICE_ASSIGN_OR_RETURN(auto kv, client_.get(keys_.job_attempt(job_id)));
  return parse_attempt(kv);
}

}  // namespace sluice::ha
