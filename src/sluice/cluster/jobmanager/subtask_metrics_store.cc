#include "sluice/cluster/jobmanager/subtask_metrics_store.h"

#include <algorithm>
#include <limits>

namespace sluice {

void SubtaskMetricsStore::add_counters(SubtaskMetrics& into, const SubtaskMetrics& m) {
  into.bytes_in += m.bytes_in;
  into.bytes_out += m.bytes_out;
  into.run_ns += m.run_ns;
  into.idle_ns += m.idle_ns;
  into.backpressured_ns += m.backpressured_ns;
  if (into.operators.size() < m.operators.size()) into.operators.resize(m.operators.size());
  for (size_t i = 0; i < m.operators.size(); ++i) {
    OperatorSubtaskMetrics& o = into.operators[i];
    if (o.name.empty()) {
      o.name = m.operators[i].name;
      o.uid = m.operators[i].uid;
      o.network_output = m.operators[i].network_output;
    }
    o.records_in += m.operators[i].records_in;
    o.records_out += m.operators[i].records_out;
  }
}

void SubtaskMetricsStore::record(const SubtaskMetrics& m, bool final) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[{m.vertex_id, m.subtask_index}];
  if (m.attempt < e.attempt) return;  // a late report of an attempt already replaced
  if (m.attempt > e.attempt) {
    if (e.attempt >= 0) {
      add_counters(e.ended, e.latest);
      e.has_ended = true;
    }
    e.attempt = m.attempt;
    e.latest = m;
    e.final_seen = final;
  } else {
    // Counters only grow within an attempt, but reports may arrive out of order (a heartbeat sent before the
    // task's end may be handled after it): keep the larger of each, and the end's watermarks once it came.
    SubtaskMetrics& l = e.latest;
    l.bytes_in = std::max(l.bytes_in, m.bytes_in);
    l.bytes_out = std::max(l.bytes_out, m.bytes_out);
    l.run_ns = std::max(l.run_ns, m.run_ns);
    l.idle_ns = std::max(l.idle_ns, m.idle_ns);
    l.backpressured_ns = std::max(l.backpressured_ns, m.backpressured_ns);
    if (l.operators.size() < m.operators.size()) l.operators.resize(m.operators.size());
    for (size_t i = 0; i < m.operators.size(); ++i) {
      OperatorSubtaskMetrics& o = l.operators[i];
      o.name = m.operators[i].name;
      o.uid = m.operators[i].uid;
      o.network_output = m.operators[i].network_output;
      o.records_in = std::max(o.records_in, m.operators[i].records_in);
      o.records_out = std::max(o.records_out, m.operators[i].records_out);
      if (final || !e.final_seen) {
        o.input_watermark = m.operators[i].input_watermark;
        o.output_watermark = m.operators[i].output_watermark;
      }
    }
    e.final_seen = e.final_seen || final;
    l.running = m.running;
  }
  if (e.final_seen) e.latest.running = false;  // after its end, no late heartbeat makes it run again
}

std::vector<SubtaskMetrics> SubtaskMetricsStore::subtasks(int live_attempt) const {
  std::lock_guard lock(mu_);
  std::vector<SubtaskMetrics> out;
  out.reserve(entries_.size());
  for (const auto& [key, e] : entries_) {
    SubtaskMetrics m = e.latest;
    if (e.has_ended) {
      // The latest attempt's counters on top of the earlier attempts'.
      SubtaskMetrics sum = e.ended;
      add_counters(sum, e.latest);
      m.bytes_in = sum.bytes_in;
      m.bytes_out = sum.bytes_out;
      m.run_ns = sum.run_ns;
      m.idle_ns = sum.idle_ns;
      m.backpressured_ns = sum.backpressured_ns;
      m.operators.resize(std::max(m.operators.size(), sum.operators.size()));
      for (size_t i = 0; i < m.operators.size(); ++i) {
        const TimestampMs in_wm =
            i < e.latest.operators.size() ? e.latest.operators[i].input_watermark : std::numeric_limits<int64_t>::min();
        const TimestampMs out_wm = i < e.latest.operators.size() ? e.latest.operators[i].output_watermark
                                                                 : std::numeric_limits<int64_t>::min();
        m.operators[i] = sum.operators[i];
        m.operators[i].input_watermark = in_wm;
        m.operators[i].output_watermark = out_wm;
      }
    }
    m.running = m.running && e.attempt == live_attempt;
    if (live_attempt != std::numeric_limits<int>::min() && e.attempt != live_attempt) {
      // A restarted subtask whose new attempt has not reported yet: its watermarks start from none again.
      for (OperatorSubtaskMetrics& o : m.operators)
        o.input_watermark = o.output_watermark = std::numeric_limits<int64_t>::min();
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<OperatorStats> SubtaskMetricsStore::operators() const {
  // Summed from subtasks(): the same attempts' sums, keyed by (vertex, position in the chain).
  const std::vector<SubtaskMetrics> subs = subtasks(std::numeric_limits<int>::min());
  std::map<std::pair<int, size_t>, OperatorStats> by_op;
  for (const SubtaskMetrics& m : subs) {
    for (size_t i = 0; i < m.operators.size(); ++i) {
      OperatorStats& s = by_op[{m.vertex_id, i}];
      s.name = m.operators[i].name;
      s.uid = m.operators[i].uid;
      s.parallelism = m.parallelism;
      s.records_in += m.operators[i].records_in;
      s.records_out += m.operators[i].records_out;
    }
  }
  std::vector<OperatorStats> out;
  out.reserve(by_op.size());
  for (auto& [key, s] : by_op)
    out.push_back(std::move(s));
  return out;
}

}  // namespace sluice
