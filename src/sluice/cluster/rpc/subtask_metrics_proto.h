// A subtask's counters on the wire: SubtaskMetrics (api/job.h) <-> cluster.v1.SubtaskMetricsStatus
// (proto/sluice/cluster/v1/jobmanager.proto), which TaskManagers send with their heartbeats and task ends.
//
// Thread-safety: pure functions.
#pragma once

#include "sluice/api/job.h"
#include "sluice/cluster/v1/jobmanager.pb.h"

namespace sluice::rpc {

/// Writes every field of `m` into `out`.
void to_proto(const SubtaskMetrics& m, cluster::v1::SubtaskMetricsStatus* out);

/// The SubtaskMetrics `s` describes.
SubtaskMetrics from_proto(const cluster::v1::SubtaskMetricsStatus& s);

}  // namespace sluice::rpc
