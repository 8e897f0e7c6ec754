// Private to src/sluice/connectors/postgres/: the counters a PostgresCdcSource's readers share (PostgresCdcStats,
// read by PostgresCdcSource::metrics() and connections() from any thread) and the reader's factory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/postgres/postgres_cdc_source.h"
#include "sluice/connectors/source_connection.h"

namespace sluice {

namespace detail {

/// Counters shared by the readers of one source (atomics: written by readers, read by metrics()).
struct PostgresCdcStats {
  std::atomic<int64_t> events{0}, snapshot_events{0}, transactions{0}, heartbeats{0}, truncates_skipped{0};
  /// Passes of the streaming loop (each ends in a wait on the socket, the wake-up fd or a timer).
  std::atomic<int64_t> stream_wakeups{0};
  std::atomic<double> events_per_second{0};
  /// The commit time of the last emitted streamed event (ms since the epoch); -1 = none yet.
  std::atomic<int64_t> last_commit_ts_ms{-1};
  /// When (wall ms) a keepalive last arrived with every event received before it emitted; -1 = never.
  std::atomic<int64_t> caught_up_ms{-1};
  /// The reader's ping interval (ms): how often an idle stream asks the server for a keepalive.
  std::atomic<int64_t> ping_interval_ms{1000};
  std::atomic<uint64_t> position{0}, confirmed_lsn{0}, received_lsn{0};
  std::atomic<bool> snapshot_done{false};
  /// Since when (wall ms) the reader waits for its slot held by another connection; -1 = not waiting.
  std::atomic<int64_t> slot_busy_since_ms{-1};
  /// The reader's connections to the server (source_connection.h), reported by its fetcher: connected once a
  /// connection is up, disconnected when one fails or the replication stream is silent for the ping interval
  /// + 2 s. Kept across restarts (a server that is down fails every attempt to connect).
  std::shared_ptr<SourceConnectionBoard> connections = std::make_shared<SourceConnectionBoard>("Postgres CDC source");
  /// While streaming: the subtask that streams and when (steady ms) its replication connection last received a
  /// message (connections() reads it too, for a fetcher blocked in a query); -1 = not streaming.
  std::atomic<int> streaming_subtask{-1};
  std::atomic<int64_t> last_rx_steady_ms{-1};
  std::shared_ptr<BadRecordStats> bad = std::make_shared<BadRecordStats>();
};

/// Creates the reader of a PostgresCdcSource (postgres_cdc_reader.cc).
std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> make_postgres_cdc_reader(
    const PostgresCdcSettings& settings, SourceReaderContext& ctx, std::shared_ptr<PostgresCdcStats> stats,
    std::shared_ptr<DeadLetterFile> dead_letter);

}  // namespace detail

}  // namespace sluice
