// Thread rules the compiler checks: clang's thread-safety analysis (-Wthread-safety) through Abseil's annotations,
// under Sluice's names.
//
// A member that a mutex guards says so (`std::deque<Mail> mails_ SLUICE_GUARDED_BY(mu_);`); a function that
// must be called with the mutex held says SLUICE_REQUIRES(mu_), one that takes it itself SLUICE_EXCLUDES(mu_).
// The mutex must be a capability the analysis knows: sluice::Mutex with sluice::MutexLock (core/mutex.h), since
// libstdc++'s std::mutex carries no annotations. With GCC the macros expand to nothing; the clang build that
// checks them is the `thread-safety` preset (scripts/test runs it).
#pragma once

#include <absl/base/thread_annotations.h>

/// The member is read and written only with mutex `x` held.
#define SLUICE_GUARDED_BY(x) ABSL_GUARDED_BY(x)
/// What the pointer member points to is read and written only with `x` held (the pointer itself is not guarded).
#define SLUICE_PT_GUARDED_BY(x) ABSL_PT_GUARDED_BY(x)
/// This mutex is taken before the ones listed, never while one of them is held (lock order).
#define SLUICE_ACQUIRED_BEFORE(...) ABSL_ACQUIRED_BEFORE(__VA_ARGS__)
/// The function must be called with these mutexes held (the `_locked` helpers).
#define SLUICE_REQUIRES(...) ABSL_EXCLUSIVE_LOCKS_REQUIRED(__VA_ARGS__)
/// The function takes these mutexes itself: the caller must not hold them.
#define SLUICE_EXCLUDES(...) ABSL_LOCKS_EXCLUDED(__VA_ARGS__)
/// The class is a mutex (a capability).
#define SLUICE_CAPABILITY ABSL_LOCKABLE
/// The class holds a mutex for its lifetime (an RAII lock).
#define SLUICE_SCOPED_CAPABILITY ABSL_SCOPED_LOCKABLE
/// The function acquires / releases the mutex (or, on a scoped lock, the one it holds).
#define SLUICE_ACQUIRE(...) ABSL_EXCLUSIVE_LOCK_FUNCTION(__VA_ARGS__)
#define SLUICE_RELEASE(...) ABSL_UNLOCK_FUNCTION(__VA_ARGS__)
/// The function acquires the mutex when it returns `result`.
#define SLUICE_TRY_ACQUIRE(...) ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(__VA_ARGS__)
/// Opts one function out of the analysis; say why beside it.
#define SLUICE_NO_THREAD_SAFETY_ANALYSIS ABSL_NO_THREAD_SAFETY_ANALYSIS
