// Named fault points: places in the engine where a test can make Sluice throw or die, to drive recovery tests
// (in the manner of RocksDB's test_util/sync_point.h and ClickHouse's src/Common/FailPoint.h).
//
// A fault point is a line `SLUICE_FAULT_POINT(name)` in engine code. A test arms a name with
// `fault::arm(name, skip_hits, fire_count, action)`; the point then lets `skip_hits` hits pass and fires on each of
// the next `fire_count` hits; later hits pass again. Two actions:
//   kThrow  throws SluiceException(Error(ErrorCode::kRuntime, "injected fault at '<name>'")); the task that runs
//           the point catches it at its boundary like any other task failure, so the failover and restart paths
//           run for real (destructors run: this is a task failure, not a crash);
//   kCrash  writes "sluice: fault point '<name>' fired: SIGKILL" to stderr and sends SIGKILL to the process: no
//           destructor, no flush, no abort of a transaction runs, as in a power cut of the process. Used by the
//           chaos tests on a child process (`sluice run`), armed through the environment:
//
//   kHang   writes "sluice: fault point '<name>' fired: hang" to stderr and blocks the hitting thread for ever while
//           the rest of the process runs on (checkpoints complete): a test holds a thread at a point, then
//           SIGKILLs the process. Only for a child process that the test kills (the thread never returns).
//
//   SLUICE_FAULT_POINTS='files.before-rename=crash'            crash at the first hit
//   SLUICE_FAULT_POINTS='files.after-rename=crash@3;x=throw'   crash at the 4th hit (3 skipped); ';' separates points
//
// (arm_from_environment(), called by the `sluice` command at start). Always compiled in: when nothing is armed a
// point costs one relaxed atomic load and a predictable branch (measured in docs/operations.md "Fault points"),
// and its name is never built.
//
// Names the engine uses (a test arms the exact string):
//   "operator.process:<operator name>"      before the operator processes a record; arm with skip_hits = N to fire
//                                           after N records
//   "checkpoint.snapshot:<task vertex name>" while the task snapshots its state for a checkpoint
//   "sink.after-precommit:<operator name>"  in a two-phase-commit sink after pre-commit and before the commit (the
//                                           transaction is pre-committed but not committed)
//   "checkpoint.restore:<task vertex name>"  while the task restores its state from a checkpoint
//   "files.before-rename"                   in the files sink's commit, after the in-progress file is synced and
//                                           before it is renamed to its final name
//   "postgres.after-create-slot"            in the Postgres CDC source's reader thread, right after it created its
//                                           replication slot and before the initial snapshot reads a row
//   "files.after-rename"                    in the files sink's commit, after the rename and before the directory
//                                           is synced
//   "kafka.lose-commit"                     in the Kafka sink's transaction commit; armed with kThrow it aborts the
//                                           transaction and reports it committed (a broker that acknowledged a
//                                           commit and lost it)
// Operator names are those of the stream graph ("Map", "Sink: out"); task vertex names are those of the job
// graph ("Source: n -> Map").
//
// Thread-safety: every function may be called from any thread. Points armed before a task thread starts are
// seen by it; arming while tasks run takes effect on each thread soon after (a relaxed flag).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "sluice/core/error.h"

namespace sluice::fault {

/// A fire count that never runs out: every hit after the skipped ones fires.
inline constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

/// What an armed point does when it fires.
enum class Action {
  kThrow,  ///< throw the injected-fault SluiceException (a task failure)
  kCrash,  ///< SIGKILL the process (a crash)
  kHang,   ///< block the hitting thread for ever (the process is to be SIGKILLed by the test)
};

/// Returns true: fault points are compiled into every build (kept for tests written when release builds had
/// none).
bool compiled_in() noexcept;

/// Arms the point `name`: its first `skip_hits` hits pass, the next `fire_count` hits fire with `action`.
/// Re-arming a name resets its hit and fire counts. Requires skip_hits >= 0 and fire_count >= 1.
void arm(std::string name, int64_t skip_hits, int64_t fire_count = 1, Action action = Action::kThrow);

/// Parses a list of points to arm, `name=action[@skip_hits][;...]` with action `throw`, `crash` or `hang` (each fires
/// once, after skip_hits hits, 0 by default). Returns a kConfiguration error naming the bad entry.
[[nodiscard]] Status arm_from_spec(std::string_view spec);

/// Arms the points listed in the environment variable SLUICE_FAULT_POINTS (see arm_from_spec); nothing when
/// it is unset or empty. Logs each armed point at warning level, since a production process should have none.
[[nodiscard]] Status arm_from_environment();

/// Disarms the point `name` and forgets its counts; no effect if it is not armed.
void disarm(const std::string& name);

/// Disarms every point and forgets all counts. Call it in a test's TearDown.
void disarm_all();

/// Returns how many times the armed point `name` has thrown since it was armed (0 if not armed).
int64_t fired(const std::string& name);

/// Returns how many times the armed point `name` was hit since it was armed, skipped and firing hits alike
/// (0 if not armed). Exact up to its last fire; hits after that are counted only while other points are live.
int64_t hits(const std::string& name);

/// Throws the injected-fault exception of the point `name`:
/// SluiceException(Error(ErrorCode::kRuntime, "injected fault at '<name>'")).
[[noreturn]] void throw_injected_fault(std::string_view name);

namespace detail {

/// True while at least one armed point still has fires left; read relaxed on the fast path.
extern std::atomic<bool> g_any_armed;

inline bool any_armed() noexcept {
  return g_any_armed.load(std::memory_order_relaxed);
}

/// The slow path of a hit: counts it under a mutex and throws (or SIGKILLs the process) if the point `name` is
/// due to fire.
void hit(std::string_view name);

}  // namespace detail
}  // namespace sluice::fault

/// Marks a named fault point; `name_expr` (anything convertible to std::string_view) is evaluated only
/// while some point is armed. Throws SluiceException (kRuntime), or SIGKILLs the process, when the point named
/// `name_expr` fires.
#define SLUICE_FAULT_POINT(name_expr)                                                                  \
  (__builtin_expect(::sluice::fault::detail::any_armed(), 0) ? ::sluice::fault::detail::hit(name_expr) \
                                                             : static_cast<void>(0))
