#include "sluice/metrics/metric_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sluice/metrics/prometheus_text.h"

namespace sluice::metrics {
namespace {

void append_help(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && v >= -9.223372036854775808e18 && v < 9.223372036854775808e18) {
    // Integral values print as integers (exactly: a double that is an integer in int64's range is one), so
    // counters and watermarks (INT64_MIN before the first) read as Flink prints them.
    fmt::format_to(std::back_inserter(out), "{}", static_cast<int64_t>(v));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", v);
  }
}

void append_labels(std::string& out, const Labels& labels, const char* extra_name = nullptr,
                   std::string_view extra_value = {}) {
  if (labels.empty() && extra_name == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    append_escaped_label_value(out, v);
    out += '"';
  }
  if (extra_name != nullptr) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

}  // namespace

std::string prometheus_name(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':';
    if (!ok) c = '_';
  }
  if (!out.empty() && out[0] >= '0' && out[0] <= '9') out.insert(out.begin(), '_');
  return out;
}

MetricGroup::MetricGroup(MetricRegistry& registry, MetricGroup* parent, std::string scope, Labels labels)
    : registry_(registry), parent_(parent), scope_(std::move(scope)), labels_(std::move(labels)) {
  for (auto& [k, v] : labels_)
    k = prometheus_name(k);
}

MetricGroup::~MetricGroup() = default;

MetricGroup& MetricGroup::add_group(const std::string& scope, Labels labels) {
  std::lock_guard lock(registry_.mutex());
  Labels sanitized = labels;
  for (auto& [k, v] : sanitized)
    k = prometheus_name(k);
  for (auto& c : children_) {
    if (c->scope_ == scope && c->labels_ == sanitized) return *c;
  }
  children_.push_back(std::unique_ptr<MetricGroup>(new MetricGroup(registry_, this, scope, std::move(labels))));
  return *children_.back();
}

void MetricGroup::remove_group(MetricGroup& child) {
  std::lock_guard lock(registry_.mutex());
  std::erase_if(children_, [&](const std::unique_ptr<MetricGroup>& c) { return c.get() == &child; });
}

MetricGroup::Metric& MetricGroup::put(const std::string& name, MetricType type, std::string help) {
  Metric& m = metrics_[name];
  m = Metric{};
  m.type = type;
  m.help = std::move(help);
  return m;
}

Counter& MetricGroup::counter(const std::string& name, std::string help) {
  std::lock_guard lock(registry_.mutex());
  Metric& m = put(name, MetricType::kCounter, std::move(help));
  m.counter = std::make_unique<Counter>();
  return *m.counter;
}

void MetricGroup::gauge(const std::string& name, Gauge gauge, std::string help) {
  std::lock_guard lock(registry_.mutex());
  put(name, MetricType::kGauge, std::move(help)).gauge = std::move(gauge);
}

void MetricGroup::counter_function(const std::string& name, std::function<double()> count, std::string help) {
  std::lock_guard lock(registry_.mutex());
  put(name, MetricType::kCounter, std::move(help)).gauge = std::move(count);
}

Meter& MetricGroup::meter(const std::string& name, std::string help) {
  std::lock_guard lock(registry_.mutex());
  Metric& m = put(name, MetricType::kMeter, std::move(help));
  m.meter = std::make_unique<Meter>();
  return *m.meter;
}

Meter& MetricGroup::meter(const std::string& name, std::function<double()> count, std::string help) {
  std::lock_guard lock(registry_.mutex());
  Metric& m = put(name, MetricType::kMeter, std::move(help));
  m.meter = std::make_unique<Meter>(std::move(count));
  return *m.meter;
}

Histogram& MetricGroup::histogram(const std::string& name, std::vector<double> upper_bounds, std::string help) {
  std::lock_guard lock(registry_.mutex());
  Metric& m = put(name, MetricType::kHistogram, std::move(help));
  m.histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  return *m.histogram;
}

void MetricGroup::collect(const std::string& prefix, Labels& labels, std::vector<MetricSample>& out) const {
  const std::string here = prefix.empty() ? prometheus_name(scope_) : prefix + "_" + prometheus_name(scope_);
  const size_t mark = labels.size();
  labels.insert(labels.end(), labels_.begin(), labels_.end());
  for (const auto& [name, m] : metrics_) {
    MetricSample s;
    s.name = here.empty() ? prometheus_name(name) : here + "_" + prometheus_name(name);
    s.labels = labels;
    s.type = m.type;
    s.help = &m.help;
    switch (m.type) {
      case MetricType::kCounter:
        s.value = m.counter ? static_cast<double>(m.counter->get()) : m.gauge();
        break;
      case MetricType::kGauge:
        s.value = m.gauge();
        break;
      case MetricType::kMeter:
        s.value = m.meter->rate();
        break;
      case MetricType::kHistogram:
        s.value = static_cast<double>(m.histogram->count());
        s.histogram = m.histogram.get();
        break;
    }
    out.push_back(std::move(s));
  }
  for (const auto& c : children_)
    c->collect(here, labels, out);
  labels.resize(mark);
}

MetricRegistry::MetricRegistry(std::string root_scope) : root_(*this, nullptr, std::move(root_scope), {}) {}

int MetricRegistry::add_refresh_hook(std::function<void()> hook) {
  std::lock_guard lock(hooks_mu_);
  const int id = next_hook_++;
  hooks_.emplace(id, std::move(hook));
  return id;
}

void MetricRegistry::remove_refresh_hook(int id) {
  std::lock_guard lock(hooks_mu_);
  hooks_.erase(id);
}

void MetricRegistry::run_refresh_hooks() const {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(hooks_mu_);
    for (const auto& [id, h] : hooks_)
      hooks.push_back(h);
  }
  for (const auto& h : hooks)
    h();
}

std::vector<MetricSample> MetricRegistry::collect() const {
  run_refresh_hooks();
  std::vector<MetricSample> out;
  std::lock_guard lock(mu_);
  Labels labels;
  root_.collect("", labels, out);
  // help and histogram point into groups that may be removed once the lock is released.
  for (auto& s : out) {
    s.help = nullptr;
    s.histogram = nullptr;
  }
  return out;
}

std::string MetricRegistry::prometheus_text() const {
  run_refresh_hooks();
  // Under the lock throughout: the samples point at help texts and histograms of the groups.
  std::lock_guard lock(mu_);
  std::vector<MetricSample> samples;
  Labels labels;
  root_.collect("", labels, samples);
  // One family per identifier, in name order; series of a family in registration order.
  std::stable_sort(samples.begin(), samples.end(),
                   [](const MetricSample& a, const MetricSample& b) { return a.name < b.name; });
  std::string out;
  out.reserve(samples.size() * 160);
  for (size_t i = 0; i < samples.size();) {
    const MetricSample& first = samples[i];
    out += "# HELP ";
    out += first.name;
    out += ' ';
    append_help(out, first.help != nullptr && !first.help->empty() ? *first.help : first.name);
    out += "\n# TYPE ";
    out += first.name;
    out += ' ';
    out += metric_type_name(first.type);
    out += '\n';
    size_t j = i;
    for (; j < samples.size() && samples[j].name == first.name; ++j) {
      const MetricSample& s = samples[j];
      if (s.type == MetricType::kHistogram && s.histogram != nullptr) {
        const std::vector<uint64_t> cum = s.histogram->cumulative_counts();
        const auto& bounds = s.histogram->upper_bounds();
        for (size_t b = 0; b < cum.size(); ++b) {
          std::string le;
          if (b < bounds.size()) {
            append_value(le, bounds[b]);
          } else {
            le = "+Inf";
          }
          out += s.name;
          out += "_bucket";
          append_labels(out, s.labels, "le", le);
          out += ' ';
          append_value(out, static_cast<double>(cum[b]));
          out += '\n';
        }
        out += s.name;
        out += "_sum";
        append_labels(out, s.labels);
        out += ' ';
        append_value(out, s.histogram->sum());
        out += '\n';
        out += s.name;
        out += "_count";
        append_labels(out, s.labels);
        out += ' ';
        append_value(out, static_cast<double>(cum.back()));
        out += '\n';
        continue;
      }
      out += s.name;
      append_labels(out, s.labels);
      out += ' ';
      append_value(out, s.value);
      out += '\n';
    }
    i = j;
  }
  return out;
}

}  // namespace sluice::metrics
