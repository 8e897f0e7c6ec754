#include "sluice/core/error.h"

namespace sluice {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kConfiguration:
      return "configuration";
    case ErrorCode::kGraph:
      return "graph";
    case ErrorCode::kRuntime:
      return "runtime";
    case ErrorCode::kState:
      return "state";
    case ErrorCode::kNetwork:
      return "network";
    case ErrorCode::kCheckpoint:
      return "checkpoint";
    case ErrorCode::kConnector:
      return "connector";
    case ErrorCode::kSerialization:
      return "serialization";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Error Error::with_context(std::string_view context) const {
  std::string m(context);
  m += ": ";
  m += message_;
  return Error(code_, std::move(m), cause_);
}

std::string Error::to_string() const {
  std::string s(error_code_name(code_));
  s += " error: ";
  s += message_;
  for (const Error* c = cause(); c != nullptr; c = c->cause()) {
    s += "\n  caused by: ";
    s += c->message_;
  }
  return s;
}

}  // namespace sluice
