// Named fault points: places in the engine where a test can make Sluice throw, to drive recovery tests
// (in the manner of RocksDB's test_util/sync_point.h and ClickHouse's src/Common/FailPoint.h).
//
// A fault point is a line `SLUICE_FAULT_POINT(name)` in engine code. A test arms a name with
// `fault::arm(name, skip_hits, fire_count)`; the point then lets `skip_hits` hits pass and throws
// `SluiceException(Error(ErrorCode::kRuntime, "injected fault at '<name>'"))` on each of the next `fire_count`
// hits; later hits pass again. The task that runs the point catches the exception at its boundary like any
// other task failure, so the failover and restart paths run for real.
//
// Compiled in only when the CMake option SLUICE_FAULT_POINTS is ON (the debug, asan and tsan presets); the
// release preset turns it OFF, and then SLUICE_FAULT_POINT expands to ((void)0) without evaluating its
// argument. When compiled in and nothing is armed, a point costs one relaxed atomic load.
//
// Names the engine uses (a test arms the exact string):
//   "operator.process:<operator name>"      thrown in the operator before it processes a record; arm with
//                                           skip_hits = N to fail after N records
//   "checkpoint.snapshot:<task vertex name>" thrown while the task snapshots its state for a checkpoint
//   "sink.after-precommit:<operator name>"  thrown in a two-phase-commit sink after pre-commit and before the
//                                           commit (the transaction is pre-committed but not committed)
//   "checkpoint.restore:<task vertex name>"  thrown while the task restores its state from a checkpoint
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

namespace sluice::fault {

/// A fire count that never runs out: every hit after the skipped ones throws.
inline constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

/// Returns whether fault points are compiled into this build (CMake option SLUICE_FAULT_POINTS).
bool compiled_in() noexcept;

/// Arms the point `name`: its first `skip_hits` hits pass, the next `fire_count` hits throw. Re-arming a name
/// resets its hit and fire counts. Requires skip_hits >= 0 and fire_count >= 1. Has no effect on the engine
/// when fault points are compiled out (see compiled_in()).
void arm(std::string name, int64_t skip_hits, int64_t fire_count = 1);

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

/// The slow path of a hit: counts it under a mutex and throws if the point `name` is due to fire.
void hit(std::string_view name);

}  // namespace detail
}  // namespace sluice::fault

#if defined(SLUICE_FAULT_POINTS) && SLUICE_FAULT_POINTS
/// Marks a named fault point; `name_expr` (anything convertible to std::string_view) is evaluated only
/// while some point is armed. Throws SluiceException (kRuntime) when the point named `name_expr` fires.
#define SLUICE_FAULT_POINT(name_expr) \
  (::sluice::fault::detail::any_armed() ? ::sluice::fault::detail::hit(name_expr) : static_cast<void>(0))
#else
#define SLUICE_FAULT_POINT(name_expr) ((void)0)
#endif
