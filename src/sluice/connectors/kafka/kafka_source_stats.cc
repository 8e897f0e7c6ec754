// KafkaSourceStats::metrics(): the snapshot KafkaSource<T>::metrics() returns.
#include "sluice/connectors/kafka/kafka_source_stats.h"

#include <algorithm>
#include <tuple>

#include "kafka_source_internals.h"
#include "sluice/core/clock.h"

namespace sluice {

using kafka_source_internal::kRateWindowMs;
using kafka_source_internal::steady_ms;

namespace detail {

KafkaSourceMetrics KafkaSourceStats::metrics() const {
  return metrics(SystemClock::instance().now_ms(), steady_ms());
}

KafkaSourceMetrics KafkaSourceStats::metrics(int64_t now_ms, int64_t steady_now_ms) const {
  KafkaSourceMetrics m;
  m.records_read = records_read.load(std::memory_order_relaxed);
  m.bytes_read = bytes_read.load(std::memory_order_relaxed);
  m.bad_records = bad->bad_records.load(std::memory_order_relaxed);
  bool all_caught_up = true;
  int64_t oldest_lagging_ts = -1;  // the oldest last-record timestamp of the partitions that lag
  {
    std::lock_guard lock(mu);
    for (const std::shared_ptr<KafkaReaderStats>& r : readers) {
      const int64_t start = r->window_start_ms.load(std::memory_order_relaxed);
      const int64_t open_ms = steady_now_ms - start;
      if (start >= 0 && open_ms >= 2 * kRateWindowMs) {
        // Not polled for a while (nothing arrived): the open window's rate, which decays towards 0.
        m.records_per_second += static_cast<double>(r->window_records.load(std::memory_order_relaxed)) * 1000.0 /
                                static_cast<double>(open_ms);
      } else {
        m.records_per_second += r->records_per_second.load(std::memory_order_relaxed);
      }
      for (const auto& [tp, p] : r->partitions) {
        KafkaPartitionMetrics pm;
        pm.topic = p->topic;
        pm.partition = p->partition;
        pm.current_offset = p->current_offset.load(std::memory_order_relaxed);
        pm.committed_offset = p->committed_offset.load(std::memory_order_relaxed);
        int64_t low = RD_KAFKA_OFFSET_INVALID;
        int64_t high = RD_KAFKA_OFFSET_INVALID;
        // librdkafka's values from its last fetch response (a lookup under its locks, no request).
        if (r->consumer != nullptr &&
            rd_kafka_get_watermark_offsets(r->consumer, p->topic.c_str(), p->partition, &low, &high) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            high >= 0) {
          pm.high_watermark = high;
        }
        if (pm.high_watermark >= 0 && pm.current_offset >= 0) {
          pm.lag = std::max<int64_t>(0, pm.high_watermark - pm.current_offset);
        }
        if (pm.lag != 0) all_caught_up = false;
        if (pm.lag > 0) {
          // Only a partition known to lag says how old the data it has not read is; an unknown lag (no fetch
          // response yet) says nothing.
          const int64_t ts = p->last_timestamp_ms.load(std::memory_order_relaxed);
          if (ts >= 0 && (oldest_lagging_ts < 0 || ts < oldest_lagging_ts)) oldest_lagging_ts = ts;
        }
        if (pm.lag >= 0) {
          m.records_lag_max = std::max(m.records_lag_max, pm.lag);
          m.pending_records = std::max<int64_t>(m.pending_records, 0) + pm.lag;
        }
        m.partitions.push_back(std::move(pm));
      }
    }
  }
  std::sort(m.partitions.begin(), m.partitions.end(),
            [](const KafkaPartitionMetrics& a, const KafkaPartitionMetrics& b) {
              return std::tie(a.topic, a.partition) < std::tie(b.topic, b.partition);
            });
  // Unknown (-1) without assigned partitions (a restart in progress) or when no lagging partition has read a
  // record yet: the last timestamp ever read would make a quiet topic look hours behind.
  if (oldest_lagging_ts >= 0) {
    m.lag_ms = std::max<int64_t>(0, now_ms - oldest_lagging_ts);
  } else if (all_caught_up && !m.partitions.empty() && last_timestamp_ms.load(std::memory_order_relaxed) >= 0) {
    m.lag_ms = 0;
  }
  return m;
}

}  // namespace detail

}  // namespace sluice
