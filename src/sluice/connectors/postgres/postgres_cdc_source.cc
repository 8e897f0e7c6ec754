// PostgresCdcSource: the split's serializer, the one-split enumerator, readers, metrics and connections. The builder
// is in postgres_cdc_source_builder.cc, the reader in postgres_cdc_reader.cc, its Fetcher in postgres_cdc_fetcher.cc
// (with postgres_cdc_snapshot.cc and postgres_cdc_stream.cc).
#include "sluice/connectors/postgres/postgres_cdc_source.h"

#include <fmt/format.h>

#include <algorithm>

#include "postgres_cdc_internals.h"
#include "postgres_cdc_stats.h"

namespace sluice {

using postgres_cdc_internal::wall_ms;

void TypeSerializer<PostgresCdcSplit>::serialize(const PostgresCdcSplit& v, DataOutput& out) {
  out.write_string(v.slot);
  out.write_u8(static_cast<uint8_t>(2 | (v.snapshot_done ? 1 : 0)));  // version 1
  out.write_fixed(v.lsn);
  DataOutput block;
  block.write_fixed(v.txn_lsn);
  block.write_varint(static_cast<uint64_t>(v.txn_events));
  block.write_varint(static_cast<uint64_t>(v.snapshot_events));
  block.write_fixed(v.overlap_lsn);
  out.write_string(block.view());
}

void TypeSerializer<PostgresCdcSplit>::deserialize(PostgresCdcSplit& target, DataInput& in) {
  in.read_string(target.slot);
  const uint8_t flags = in.read_u8();
  if (flags > 3) in.fail(fmt::format("Postgres CDC split: unknown format byte {}", flags));
  target.snapshot_done = (flags & 1) != 0;
  target.lsn = in.read_fixed<int64_t>();
  target.txn_lsn = 0;
  target.txn_events = 0;
  target.snapshot_events = 0;
  target.overlap_lsn = 0;
  if ((flags & 2) == 0) return;  // version 0: no partial transaction, no snapshot progress
  DataInput block(in.read_view(in.read_length()));
  target.txn_lsn = block.read_fixed<int64_t>();
  const uint64_t events = block.read_varint();
  if (events > static_cast<uint64_t>(INT64_MAX)) block.fail("Postgres CDC split: event count out of range");
  target.txn_events = static_cast<int64_t>(events);
  if (block.at_end()) return;  // written before snapshot_events existed
  const uint64_t snapshot_events = block.read_varint();
  if (snapshot_events > static_cast<uint64_t>(INT64_MAX)) block.fail("Postgres CDC split: row count out of range");
  target.snapshot_events = static_cast<int64_t>(snapshot_events);
  if (block.at_end()) return;  // written before overlap_lsn existed
  target.overlap_lsn = block.read_fixed<int64_t>();
  // Anything after is a field of a later version: skipped.
}

PostgresCdcSourceBuilder PostgresCdcSource::builder() {
  return PostgresCdcSourceBuilder();
}

PostgresCdcSource::PostgresCdcSource(detail::PostgresCdcSettings settings)
    : settings_(std::move(settings)), stats_(std::make_shared<detail::PostgresCdcStats>()) {
  stats_->connections =
      std::make_shared<SourceConnectionBoard>("Postgres CDC source (slot " + settings_.slot_name + ")");
}

std::unique_ptr<SplitEnumerator<PostgresCdcSplit>> PostgresCdcSource::create_enumerator(
    SplitEnumeratorContext<PostgresCdcSplit>& ctx) const {
  dead_letter_file();  // a dead-letter file that cannot be opened fails the job at start
  PostgresCdcSplit split;
  split.slot = settings_.slot_name;
  split.snapshot_done = settings_.start_mode == PostgresStartMode::kLatest;
  return std::make_unique<StaticSplitEnumerator<PostgresCdcSplit>>(ctx, std::vector<PostgresCdcSplit>{split});
}

std::unique_ptr<SourceReader<cdc::ChangeEvent, PostgresCdcSplit>> PostgresCdcSource::create_reader(
    SourceReaderContext& ctx) const {
  return detail::make_postgres_cdc_reader(settings_, ctx, stats_, dead_letter_file());
}

std::shared_ptr<DeadLetterFile> PostgresCdcSource::dead_letter_file() const {
  if (settings_.bad_record_policy != BadRecordPolicy::kDeadLetter) return nullptr;
  std::lock_guard lock(mu_);
  if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
  return dead_letter_;
}

PostgresCdcMetrics PostgresCdcSource::metrics() const {
  const auto& st = *stats_;
  PostgresCdcMetrics m;
  m.events = st.events.load();
  m.snapshot_events = st.snapshot_events.load();
  m.transactions = st.transactions.load();
  m.heartbeats = st.heartbeats.load();
  m.truncates_skipped = st.truncates_skipped.load();
  m.bad_records = st.bad->bad_records.load();
  m.stream_wakeups = st.stream_wakeups.load();
  m.events_per_second = st.events_per_second.load();
  // Behind the server's position, not the age of the last change: an idle source that the server keeps
  // confirming (keepalives with nothing pending) is at 0; a source with a backlog is as far behind as the
  // commit time of what it emits now; a silent server (hung, unreachable) makes the lag grow from the last
  // confirmation until the liveness timeout fails the source.
  const int64_t now = wall_ms();
  const int64_t last = st.last_commit_ts_ms.load();
  const int64_t caught = st.caught_up_ms.load();
  int64_t lag = -1;
  if (caught >= 0) lag = std::max<int64_t>(0, now - caught - st.ping_interval_ms.load() - 2000);
  if (last >= 0) lag = lag < 0 ? std::max<int64_t>(0, now - last) : std::min(lag, std::max<int64_t>(0, now - last));
  m.lag_ms = lag;
  m.position = st.position.load();
  m.confirmed_lsn = st.confirmed_lsn.load();
  m.received_lsn = st.received_lsn.load();
  m.snapshot_done = st.snapshot_done.load();
  const int64_t busy = st.slot_busy_since_ms.load();
  m.slot_busy_ms = busy < 0 ? 0 : std::max<int64_t>(1, now - busy);
  return m;
}

std::vector<SourceConnection> PostgresCdcSource::connections() const {
  const int64_t now = SourceConnectionBoard::steady_now_ms();
  std::vector<SourceConnection> out = stats_->connections->snapshot(now);
  // A fetcher blocked in a query (a heartbeat to a paused server) reports late: the stream's silence says it now.
  const int streaming = stats_->streaming_subtask.load();
  const int64_t last_rx = stats_->last_rx_steady_ms.load(std::memory_order_relaxed);
  const int64_t silent = now - last_rx;
  if (streaming >= 0 && last_rx >= 0 && silent > stats_->ping_interval_ms.load() + 2000) {
    for (SourceConnection& c : out) {
      if (c.subtask == streaming && c.connected) {
        c.connected = false;
        c.disconnected_ms = silent;
        c.reason = fmt::format(
            "no message on the replication connection of slot {} (the server is paused, hung "
            "or unreachable)",
            settings_.slot_name);
      }
    }
  }
  return out;
}

}  // namespace sluice
