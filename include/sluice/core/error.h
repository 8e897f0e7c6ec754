// Error and Result<T>: how Sluice reports expected failures (I/O, parse errors, a broker's refusal).
//
// An Error carries a code from one central table, a message that says what happened, where and how to fix
// it, and an optional cause. Result<T> holds either a T or an Error and is [[nodiscard]]; it is modelled on
// Arrow's arrow::Result (cpp/src/arrow/result.h). Unexpected failures (violated invariants) are assertions.
#pragma once

#include <cassert>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

/// The central table of error codes. Each names the layer that failed.
enum class ErrorCode : int {
  kOk = 0,
  kConfiguration = 1,  ///< bad option, bad argument, invalid job definition
  kGraph = 2,          ///< the job graph cannot be built (type or parallelism conflicts)
  kRuntime = 3,        ///< a task failed (user function threw, task cancelled)
  kState = 4,          ///< state access or state (de)serialization failed
  kNetwork = 5,        ///< data exchange between tasks failed
  kCheckpoint = 6,     ///< snapshot, storage or restore failed
  kConnector = 7,      ///< an external system refused or returned bad data
  kSerialization = 8,  ///< bytes could not be decoded (truncated, corrupt, wrong version)
  kCancelled = 9,      ///< the job or task was cancelled on request
  kInternal = 10,      ///< a bug in Sluice
};

/// Returns the stable lower-case name of `code` ("configuration", "runtime", ...).
std::string_view error_code_name(ErrorCode code) noexcept;

/// An expected failure: code, message (what, where, how to fix) and an optional cause chain.
/// Immutable and cheap to copy (the cause is shared).
class Error {
 public:
  Error(ErrorCode code, std::string message, std::shared_ptr<const Error> cause = nullptr)
      : code_(code), message_(std::move(message)), cause_(std::move(cause)) {}

  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  const Error* cause() const noexcept { return cause_.get(); }

  /// Returns a new error with `context` prepended ("context: message"), keeping code and cause.
  Error with_context(std::string_view context) const;

  /// Renders "code: message" followed by "caused by: ..." for each cause.
  std::string to_string() const;

 private:
  ErrorCode code_;
  std::string message_;
  std::shared_ptr<const Error> cause_;
};

/// Thrown where an Error must cross an API that reports failures by exception (user functions,
/// serializers deep inside a record loop). Tasks catch it at their boundary and turn it back into an Error.
class SluiceException : public std::runtime_error {
 public:
  explicit SluiceException(Error error) : std::runtime_error(error.to_string()), error_(std::move(error)) {}
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

/// A value of type T or an Error. Modelled on arrow::Result and std::expected.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  /// The value; must only be called when ok().
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; must only be called when !ok().
  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }

  /// Returns the value or throws SluiceException with the error.
  T value_or_throw() && {
    if (!ok()) throw SluiceException(std::get<1>(v_));
    return std::get<0>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

/// Result of an operation that produces no value.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::make_shared<Error>(std::move(error))) {}  // NOLINT(google-explicit-constructor)
  bool ok() const noexcept { return error_ == nullptr; }
  explicit operator bool() const noexcept { return ok(); }
  const Error& error() const {
    assert(!ok());
    return *error_;
  }
  void value_or_throw() const {
    if (!ok()) throw SluiceException(*error_);
  }

 private:
  std::shared_ptr<Error> error_;
};

using Status = Result<void>;

/// Returns an OK Status.
inline Status ok_status() {
  return {};
}

}  // namespace sluice

/// Evaluates `expr` (a Status or Result); returns its error from the enclosing function if it failed.
#define SLUICE_RETURN_IF_ERROR(expr)                         \
  do {                                                       \
    auto&& sluice_status_ = (expr);                          \
    if (!sluice_status_.ok()) return sluice_status_.error(); \
  } while (0)
