#include "sluice/connectors/source_connection.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "sluice/core/redact.h"

namespace sluice {

int64_t SourceConnectionBoard::steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SourceConnectionBoard::set_connected(int subtask, int64_t now_steady_ms) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[subtask];
  if (!e.connected) {
    spdlog::info("{} subtask {}: connected again after {:.1f} s disconnected", who_, subtask,
                 static_cast<double>(now_steady_ms - e.since_ms) / 1000.0);
  }
  e = Entry{true, now_steady_ms, {}};
}

void SourceConnectionBoard::set_disconnected(int subtask, int64_t since_steady_ms, std::string reason) {
  // Reasons come from client libraries' error texts, which may quote a connection string.
  reason = redact_secrets(reason);
  std::lock_guard lock(mu_);
  Entry& e = entries_[subtask];
  if (e.connected) {
    spdlog::warn("{} subtask {}: disconnected for {:.1f} s: {} (the source keeps retrying; /health names it)", who_,
                 subtask, static_cast<double>(steady_now_ms() - since_steady_ms) / 1000.0, reason);
    e.since_ms = since_steady_ms;
  }
  e.connected = false;
  e.reason = std::move(reason);
}

void SourceConnectionBoard::remove(int subtask) {
  std::lock_guard lock(mu_);
  entries_.erase(subtask);
}

std::vector<SourceConnection> SourceConnectionBoard::snapshot(int64_t now_steady_ms) const {
  std::vector<SourceConnection> out;
  std::lock_guard lock(mu_);
  out.reserve(entries_.size());
  for (const auto& [subtask, e] : entries_) {
    SourceConnection c;
    c.subtask = subtask;
    c.connected = e.connected;
    if (!e.connected) {
      c.disconnected_ms = std::max<int64_t>(0, now_steady_ms - e.since_ms);
      c.reason = e.reason;
    }
    out.push_back(std::move(c));
  }
  return out;
}

double SourceConnectionBoard::gauge(const std::vector<SourceConnection>& states, int subtask) {
  for (const SourceConnection& c : states) {
    if (c.subtask == subtask) return c.connected ? 1.0 : 0.0;
  }
  return -1.0;
}

}  // namespace sluice
