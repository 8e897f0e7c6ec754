// SLUICE_ASSIGN_OR_RETURN: unwraps a Result<T> or returns its error (Arrow's ARROW_ASSIGN_OR_RAISE, Abseil's
// ASSIGN_OR_RETURN), for the set-up code that chains fallible steps. Beside SLUICE_RETURN_IF_ERROR (core/error.h);
// a header of its own so that only the files that use it include it.
//
//   SLUICE_ASSIGN_OR_RETURN(auto storage, FileCheckpointStorage::create(location, job_id));
//   storage.init_checkpoint(1);  // storage is the value, not the Result
#pragma once

#include <utility>

#include "sluice/core/error.h"

/// Evaluates `...` (a Result<T>); returns its error from the enclosing function when it failed, else moves its
/// value into `lhs` (a declaration such as `auto x` or `const auto x`, or an existing variable). Expands to
/// several statements: not for the body of an unbraced if or loop.
#define SLUICE_ASSIGN_OR_RETURN(lhs, ...) \
  SLUICE_DETAIL_ASSIGN_OR_RETURN(SLUICE_DETAIL_CONCAT(sluice_result_, __LINE__), lhs, __VA_ARGS__)

#define SLUICE_DETAIL_CONCAT_INNER(a, b) a##b
#define SLUICE_DETAIL_CONCAT(a, b) SLUICE_DETAIL_CONCAT_INNER(a, b)
#define SLUICE_DETAIL_ASSIGN_OR_RETURN(result, lhs, ...) \
  auto result = (__VA_ARGS__);                           \
  if (!result.ok()) return result.error();               \
  lhs = std::move(*result)
