// Waiting for what another process does (a row in Postgres, a slot's position, a line in a child's log, a
// document in OpenSearch): those offer the test nothing to block on, so the condition is checked again and
// again until it holds or a deadline passes. This is the one place integration and chaos tests pace such
// checks; everything inside the test process waits on its own condition variables instead.
#pragma once

#include <chrono>
#include <thread>

namespace sluice::testing {

/// Checks `pred` every `interval` until it holds (true) or `timeout` passed (false, after one last check).
template <class Pred>
bool poll_until(Pred&& pred, std::chrono::milliseconds timeout,
                std::chrono::milliseconds interval = std::chrono::milliseconds(20)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(interval);  // the pace of checks against another process, not synchronisation
  }
  return pred();
}

}  // namespace sluice::testing
