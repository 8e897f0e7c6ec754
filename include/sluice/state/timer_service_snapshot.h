// TimerServiceSnapshot: the capture of an InternalTimerService's timers for an asynchronous checkpoint, written
// per key group by the checkpoint writer (docs/state-format.md, the timer part of a keyed operator blob). Two
// kinds: the heap service's, serialized at capture (timer_service.h), and the RocksDB service's, a RocksDB
// snapshot read when written (rocksdb_timer_queue.h).
#pragma once

#include "sluice/core/data_io.h"
#include "sluice/core/key_group.h"

namespace sluice {

/// The timers of an InternalTimerService as they were at capture(): a heap service's serialized per key group,
/// or a RocksDB service's snapshot read when written.
///
/// Thread-safety: immutable; write_timers() may run on any thread, concurrently with the task thread.
class TimerServiceSnapshot {
 public:
  virtual ~TimerServiceSnapshot() = default;
  /// Appends the timers of key group `kg` as InternalTimerService::snapshot_key_group(kg) wrote them at capture
  /// time. Throws SluiceException (kState) when `kg` is outside the captured range.
  virtual void write_timers(KeyGroup kg, DataOutput& out) const = 0;
  /// As write_timers(), for a checkpoint that stores the backend's native files: nothing when the timers are in
  /// those files (RocksDB timers).
  virtual void write_timers_beside_native(KeyGroup kg, DataOutput& out) const { write_timers(kg, out); }
};

}  // namespace sluice
