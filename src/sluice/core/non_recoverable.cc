// The table of marked messages behind mark_non_recoverable() (see the header for why the mark is the message).
#include "sluice/core/non_recoverable.h"

#include <deque>
#include <memory>
#include <mutex>
#include <utility>

namespace sluice {
namespace {

struct Mark {
  std::string message;  // the whole marked message, suffix included
  std::string reason;
};

struct Marks {
  std::mutex mu;
  std::deque<Mark> latest;  // newest last; at most kRememberedMarks
};

Marks& marks() {
  static Marks* m = new Marks();  // never destroyed: task threads may still fail while the process exits
  return *m;
}

void remember(std::string message, std::string reason) {
  Marks& m = marks();
  std::lock_guard lock(m.mu);
  m.latest.push_back(Mark{std::move(message), std::move(reason)});
  while (m.latest.size() > kRememberedMarks)
    m.latest.pop_front();
}

}  // namespace

Error mark_non_recoverable(const Error& error, std::string_view reason) {
  const std::string why = reason.empty() ? std::string("marked non-recoverable") : std::string(reason);
  std::string message = error.message() + " (not recoverable by a restart: " + why + ")";
  remember(message, why);
  std::shared_ptr<const Error> cause;
  if (error.cause() != nullptr) cause = std::make_shared<const Error>(*error.cause());
  return Error(error.code(), std::move(message), std::move(cause));
}

Error adopt_non_recoverable(Error error, std::string_view reason) {
  // An empty message would be found in every failure's text.
  if (!reason.empty() && !error.message().empty()) remember(error.message(), std::string(reason));
  return error;
}

std::string non_recoverable_reason(std::string_view message) {
  Marks& m = marks();
  std::lock_guard lock(m.mu);
  for (auto it = m.latest.rbegin(); it != m.latest.rend(); ++it) {
    if (message.find(it->message) != std::string_view::npos) return it->reason;
  }
  return "";
}

std::string non_recoverable_reason(const Error& error) {
  for (const Error* e = &error; e != nullptr; e = e->cause()) {
    if (std::string r = non_recoverable_reason(std::string_view(e->message())); !r.empty()) return r;
  }
  return "";
}

}  // namespace sluice
