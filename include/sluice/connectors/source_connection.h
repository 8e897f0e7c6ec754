// Whether each reader subtask of a source is connected to its external system (the Kafka cluster, the Postgres
// replication connection, the MongoDB server), for /health's `source-disconnected` reason and the
// `sourceConnected` gauge (docs/operations.md, "Health and alerts"). A connector keeps one SourceConnectionBoard
// per source, shared by its readers: each reader reports what it sees (connected, or lost since when and why),
// and the board logs each loss once (warn) and each recovery once (info), never once per poll.
//
// A lost connection is not a failure of the job: the connectors keep retrying (librdkafka, the Postgres reader
// until its liveness timeout, libmongoc) and the job stays RUNNING, so without this a source that lost its
// server is silent until a liveness timeout fails it (tens of seconds). Each connector reports a loss within
// about 3 s (the connectors' own probes; see each connector's header), well inside /health's 5 s.
//
// Thread-safety: every member function may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace sluice {

/// One reader subtask's connection as of now.
struct SourceConnection {
  int subtask = 0;
  bool connected = true;
  /// How long it has been disconnected (ms); 0 when connected.
  int64_t disconnected_ms = 0;
  /// Why ("" when connected), e.g. "no broker of '127.0.0.1:9092' answered (last: _TRANSPORT: ...)".
  std::string reason;
};

/// The connection states of a source's reader subtasks (see the file comment).
class SourceConnectionBoard {
 public:
  /// `who` names the source in log lines ("Kafka source (topics [orders])").
  explicit SourceConnectionBoard(std::string who) : who_(std::move(who)) {}

  /// Subtask `subtask` is connected (again). Logs the recovery once, with how long it was disconnected.
  void set_connected(int subtask, int64_t now_steady_ms);
  /// Subtask `subtask` has been disconnected since `since_steady_ms` (steady clock, ms) because of `reason`
  /// (updated on every call; logged once per loss).
  void set_disconnected(int subtask, int64_t since_steady_ms, std::string reason);
  /// Forgets subtask `subtask` (its reader closed): it is neither connected nor disconnected any more.
  void remove(int subtask);

  /// Every known subtask's state at `now_steady_ms` (steady clock, ms), by subtask index. A subtask whose
  /// reader is not open (not started yet, between restarts, finished) is absent.
  std::vector<SourceConnection> snapshot(int64_t now_steady_ms) const;
  /// The `sourceConnected` gauge of `subtask` in `states` (a snapshot()): 1 connected, 0 disconnected, -1 absent.
  static double gauge(const std::vector<SourceConnection>& states, int subtask);

  /// The steady clock in ms (the clock of every `*_steady_ms` argument).
  static int64_t steady_now_ms();

 private:
  struct Entry {
    bool connected = true;
    int64_t since_ms = 0;
    std::string reason;
  };
  const std::string who_;
  mutable std::mutex mu_;
  std::map<int, Entry> entries_;  // guarded by mu_
};

}  // namespace sluice
