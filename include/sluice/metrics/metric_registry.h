// MetricRegistry and MetricGroup: metrics scoped as in Flink (job -> task -> operator, each instance told apart
// by its variables: job_name, task_name, subtask_index, operator_name ...) and reported in the Prometheus text
// format with the names Flink's Prometheus reporter gives them, so Flink's dashboards and alert rules work.
//
// A metric's identifier is the scope components of its group and its parents joined by '_' and followed by
// its name: the group "flink" -> "taskmanager" -> "job" -> "task" -> "operator" and the counter "numRecordsIn"
// give `flink_taskmanager_job_task_operator_numRecordsIn`, with the labels of every group on the way
// (`job_name="x",task_name="y",subtask_index="0",operator_name="z"`).
//
// Thread-safety: registering, removing and reporting take the registry's lock; the metric objects returned
// (Counter, Meter, Histogram) have stable addresses until their group is removed, and their writers never
// take a lock (metric_types.h). Gauges are called while reporting, under the registry's lock: a gauge must not
// register metrics. Refresh hooks run before each report without the lock (they may register metrics).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/metrics/metric_types.h"

namespace sluice::metrics {

/// A group's variables, in order: (label name, value).
using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricRegistry;

/// One reported value: the full identifier, every label from the root, the type and help text. For a
/// histogram the value is its count and `histogram` points at it.
struct MetricSample {
  std::string name;
  Labels labels;
  MetricType type = MetricType::kGauge;
  const std::string* help = nullptr;
  double value = 0;
  const Histogram* histogram = nullptr;
};

/// A scope of metrics (Flink's MetricGroup). Created by MetricRegistry::root() and add_group().
class MetricGroup {
 public:
  MetricGroup(const MetricGroup&) = delete;
  MetricGroup& operator=(const MetricGroup&) = delete;
  ~MetricGroup();

  /// The child scope `scope` with `labels` (e.g. add_group("task", {{"task_name", n}, {"subtask_index", "0"}})),
  /// created on first use: the same scope and labels return the same group.
  MetricGroup& add_group(const std::string& scope, Labels labels = {});
  /// Removes `child` and everything below it (a job that ended); its metric objects are destroyed, so their
  /// writers must have stopped.
  void remove_group(MetricGroup& child);

  /// Registers a counter (replacing one of the same name in this group) and returns it.
  Counter& counter(const std::string& name, std::string help = {});
  /// Registers a gauge, reported as a Prometheus gauge.
  void gauge(const std::string& name, Gauge gauge, std::string help = {});
  /// Registers a gauge over an integer-valued function reported as a Prometheus counter (a count kept elsewhere
  /// that never decreases).
  void counter_function(const std::string& name, std::function<double()> count, std::string help = {});
  /// Registers a meter with its own count (mark_event) or over `count`.
  Meter& meter(const std::string& name, std::string help = {});
  Meter& meter(const std::string& name, std::function<double()> count, std::string help = {});
  /// Registers a histogram with these bucket bounds.
  Histogram& histogram(const std::string& name, std::vector<double> upper_bounds, std::string help = {});

  const std::string& scope() const { return scope_; }
  const Labels& labels() const { return labels_; }

 private:
  friend class MetricRegistry;
  struct Metric {
    MetricType type = MetricType::kGauge;
    std::string help;
    std::unique_ptr<Counter> counter;
    Gauge gauge;  // gauges, and counters kept elsewhere
    std::unique_ptr<Meter> meter;
    std::unique_ptr<Histogram> histogram;
  };
  MetricGroup(MetricRegistry& registry, MetricGroup* parent, std::string scope, Labels labels);
  Metric& put(const std::string& name, MetricType type, std::string help);
  void collect(const std::string& prefix, Labels& labels, std::vector<MetricSample>& out) const;

  MetricRegistry& registry_;
  MetricGroup* parent_;
  std::string scope_;
  Labels labels_;
  std::map<std::string, Metric> metrics_;
  std::vector<std::unique_ptr<MetricGroup>> children_;
};

/// The metrics of one process. Thread-safe (see the file comment).
class MetricRegistry {
 public:
  /// `root_scope` is the first component of every identifier ("flink", as Flink's Prometheus reporter).
  explicit MetricRegistry(std::string root_scope = "flink");
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  MetricGroup& root() { return root_; }

  /// `hook` runs (without the registry's lock) before every report: a job's binding takes one snapshot of its
  /// subtasks' counters there instead of one per gauge. Returns an id for remove_refresh_hook.
  int add_refresh_hook(std::function<void()> hook);
  void remove_refresh_hook(int id);

  /// Every metric's current value, after running the refresh hooks (help and histogram are null: they would
  /// point into groups that may go away).
  std::vector<MetricSample> collect() const;
  /// The Prometheus text exposition (format 0.0.4) of collect(): one HELP and TYPE per identifier, counters
  /// as counters, gauges and meters' rates as gauges, histograms as histograms (_bucket with le, _sum, _count).
  std::string prometheus_text() const;

 private:
  friend class MetricGroup;
  std::recursive_mutex& mutex() const { return mu_; }
  void run_refresh_hooks() const;
  mutable std::recursive_mutex mu_;
  MetricGroup root_;
  mutable std::mutex hooks_mu_;
  std::map<int, std::function<void()>> hooks_;
  int next_hook_ = 0;
};

/// `s` with every character outside [a-zA-Z0-9_:] replaced by '_' (Flink's Prometheus reporter does the same,
/// so `records-lag-max` becomes `records_lag_max`).
std::string prometheus_name(std::string_view s);

}  // namespace sluice::metrics
