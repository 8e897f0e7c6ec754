// EtcdHaStore: what a JobManager leader keeps in etcd so that a standby can take over (Flink's JobGraphStore,
// job-result store and CompletedCheckpointStore pointer, on etcd): per job, its graph (the pipeline file's text or
// the job graph's fingerprint), its status, and the pointer to its latest completed checkpoint.
//
// FENCING: every write takes the writer's LeaderEpoch and is one etcd transaction that applies only if the leader
// key still has that create revision and lease. A JobManager that lost its lease (paused past the TTL, cut off) gets
// FencedWrite::kFenced and nothing changes, so a former leader can neither move the checkpoint pointer nor
// overwrite the job's status after a new leader took over. Callers treat kFenced as "I am no longer the leader":
// stop acting as leader (no checkpoint completes, no sink commits) and campaign again.
//
// Reads need no epoch (a standby, a TaskManager or `sluice` commands read). Values are small JSON documents, so
// `etcdctl get --prefix /sluice/` shows them. Thread-safety: as EtcdClient (any thread). Errors: kConnector when
// etcd cannot be reached or answers nonsense; kSerialization for a value that is not what this store wrote.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_options.h"
#include "sluice/cluster/ha/leader_election.h"
#include "sluice/core/error.h"

namespace sluice::ha {

/// The outcome of a fenced write that reached etcd.
enum class FencedWrite {
  kApplied,  ///< the writer still led and the write is committed
  kFenced,   ///< the writer's epoch is no longer the leader's: nothing was written
};

/// A job as the HA store keeps it.
struct HaJobRecord {
  std::string job_id;
  std::string name;
  /// What a new leader needs to build the same job: the pipeline file's text, or a C++ job's graph fingerprint.
  std::string graph;
  /// "pipeline" (graph is the YAML text) or "fingerprint" (a C++ job rebuilt by its own binary).
  std::string graph_kind = "pipeline";
};

/// The pointer to a job's latest completed checkpoint.
struct CheckpointPointer {
  int64_t checkpoint_id = 0;
  /// Where its metadata lives (a directory of the checkpoint storage: file:///... or s3://...).
  std::string external_path;
  int64_t completed_at_ms = 0;  ///< wall clock, ms since the epoch
  int64_t leader_epoch = 0;     ///< the create revision of the leader that wrote it
};

class EtcdHaStore {
 public:
  /// `client` must outlive the store.
  EtcdHaStore(EtcdClient& client, HaKeys keys) : client_(client), keys_(std::move(keys)) {}

  /// Records a job (its graph) and its status in one transaction.
  Result<FencedWrite> put_job(const LeaderEpoch& epoch, const HaJobRecord& job, std::string_view status);
  /// Records a job's status (Flink's names: CREATED, RUNNING, FAILING, CANCELED, FINISHED, FAILED...).
  Result<FencedWrite> set_job_status(const LeaderEpoch& epoch, std::string_view job_id, std::string_view status);
  /// Moves the job's latest-checkpoint pointer; refused (kFenced) for a former leader. Also refused with
  /// kCheckpoint when `pointer.checkpoint_id` is not above the stored one (a pointer never goes back).
  Result<FencedWrite> set_latest_checkpoint(const LeaderEpoch& epoch, std::string_view job_id,
                                            const CheckpointPointer& pointer);
  /// Records that the leader deploys attempt `attempt` of the job, before it deploys it, so that a new leader
  /// continues from a higher number and no data-plane channel or task report of a former leader's deployment can
  /// be taken for one of its own (the attempt is part of every channel id). Refused (kFenced) for a former leader;
  /// kCheckpoint when `attempt` is below the stored one (attempts never go back; the same one again is applied).
  Result<FencedWrite> set_attempt(const LeaderEpoch& epoch, std::string_view job_id, int attempt);
  /// Removes every key of the job (after it reached a terminal state and its result was reported).
  Result<FencedWrite> remove_job(const LeaderEpoch& epoch, std::string_view job_id);

  /// The ids of the stored jobs.
  Result<std::vector<std::string>> job_ids();
  Result<std::optional<HaJobRecord>> job(std::string_view job_id);
  Result<std::optional<std::string>> job_status(std::string_view job_id);
  Result<std::optional<CheckpointPointer>> latest_checkpoint(std::string_view job_id);
  /// The latest attempt set_attempt() recorded, nullopt when none was.
  Result<std::optional<int>> attempt(std::string_view job_id);

  const HaKeys& keys() const { return keys_; }

 private:
  Result<FencedWrite> fenced(const LeaderEpoch& epoch, std::vector<EtcdCompare> extra, std::vector<EtcdOp> ops);

  EtcdClient& client_;
  HaKeys keys_;
};

}  // namespace sluice::ha
