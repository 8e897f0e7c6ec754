// The checkpoint state handle on the wire: OperatorSubtaskStateHandle (checkpoint/checkpoint_metadata.h) <->
// cluster.v1.StateHandle (proto/sluice/cluster/v1/common.proto). A TaskManager's AcknowledgeCheckpoint carries one per
// state file it wrote; the JobManager puts them into `_metadata`. Every field of the handle that `_metadata` records
// must cross this boundary (an incremental rocksdb database's files once did not, and cluster restores opened an
// empty database): tests/unit/cluster/rpc/state_handle_proto_test.cc round-trips a handle with every field set.
//
// Thread-safety: pure functions.
#pragma once

#include "sluice/checkpoint/checkpoint_metadata.h"
#include "sluice/cluster/v1/common.pb.h"
#include "sluice/core/error.h"

namespace sluice::rpc {

/// Writes `handle` into `out` (whose operator_uid the caller sets), every field but `location`: the JobManager
/// takes that from the sender's registration, never from the sender's word.
void to_proto(const OperatorSubtaskStateHandle& handle, cluster::v1::StateHandle* out);

/// The handle `sh` describes, `location` empty. Errors: kConfiguration naming the file when the state file's name
/// or a native/shared file's name is not a plain file name (the state must be inside the checkpoint's directory,
/// shared files inside `<job dir>/shared/`, which deletes them by name).
Result<OperatorSubtaskStateHandle> from_proto(const cluster::v1::StateHandle& sh);

}  // namespace sluice::rpc
