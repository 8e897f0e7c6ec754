// Failures that no restart can cure (Flink's SuppressRestartsException): a job whose failure is marked fails at
// once with the reason, instead of restarting from the same checkpoint into the same failure for ever.
//
// Mark only a failure that a restart from the same checkpoint and configuration repeats for certain: a
// configuration the server refuses, resume state that is gone (a dropped replication slot, a lost resume token
// under exactly-once), bad credentials, an object the user must create or restore. Never a transient one (a
// refused connection, a timeout, a broker or server restarting).
//
// How the mark travels: an Error crosses the task boundary as its message and code only (OperatorException,
// Task's description of the failure, with_context's prefixes), so the mark is the message itself. A marked error's
// message ends with " (not recoverable by a restart: <reason>)", which the logs, /health, `sluice list` and the
// REST API show as part of the failure, and the whole marked message is remembered in a process-wide table (the
// latest kRememberedMarks). A failure is non-recoverable when its message or a cause's contains a remembered
// marked message: text alone never marks, so a record's value quoted in an error cannot suppress restarts.
//
// Across processes the mark travels as a field of its own beside the message (TaskExecutionStateUpdate's
// non_recoverable_reason), which the receiver adopts with adopt_non_recoverable().
//
// Thread-safety: every function may be called from any thread (the table has its own lock).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "sluice/core/error.h"

namespace sluice {

/// How many marked messages the process remembers (the latest ones; a failure is judged soon after its mark).
inline constexpr size_t kRememberedMarks = 256;

/// Returns `error` marked as not recoverable by a restart, with `reason` (why no restart can succeed, e.g. "the
/// replication slot is gone, and with it the changes since the checkpoint"): same code and cause, the message
/// followed by " (not recoverable by a restart: <reason>)". An empty reason reads "marked non-recoverable".
[[nodiscard]] Error mark_non_recoverable(const Error& error, std::string_view reason);

/// For a marked error received from another process (a TaskManager's report of a failed task, whose message it
/// marked in its own table): remembers `error`'s message as marked with `reason` in this process, unchanged (it
/// already carries the suffix), and returns `error`. An empty reason returns `error` unmarked.
[[nodiscard]] Error adopt_non_recoverable(Error error, std::string_view reason);

/// The reason when `error` (its message, or one of its causes') carries a message marked by
/// mark_non_recoverable() in this process; "" when it does not (a restart may cure it).
[[nodiscard]] std::string non_recoverable_reason(const Error& error);

/// The same for a failure known only by its text (e.g. a message in the job's exception history).
[[nodiscard]] std::string non_recoverable_reason(std::string_view message);

}  // namespace sluice
