// Reading the Prometheus text exposition format 0.0.4 back: what a scraper sees. Used by tests (ours parse
// /metrics of a running job) and by anything that wants a value out of another process's /metrics.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/metrics/metric_registry.h"

namespace sluice::metrics {

/// One sample line: `name{label="value",...} value`.
struct ParsedSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// A parsed exposition: samples in order, and the TYPE and HELP of each family.
struct ParsedExposition {
  std::vector<ParsedSample> samples;
  std::map<std::string, std::string> types;  ///< family -> counter | gauge | histogram | summary | untyped
  std::map<std::string, std::string> help;

  /// The samples named `name` whose labels include every pair of `match`.
  std::vector<const ParsedSample*> find(std::string_view name,
                                        const std::map<std::string, std::string>& match = {}) const;
  /// The sum of find(name, match)'s values, or nullopt when there is none.
  std::optional<double> sum(std::string_view name, const std::map<std::string, std::string>& match = {}) const;
};

/// Appends `value` escaped as a label value of the text format 0.0.4 (backslash, double quote and line feed
/// become \\, \" and \n; every other byte is kept). The one escaping of every /metrics writer (the registry,
/// `sluice run`'s sluice_* families, the REST server's job metrics). Pure; any thread.
void append_escaped_label_value(std::string& out, std::string_view value);
/// The same, as a new string.
[[nodiscard]] std::string escape_label_value(std::string_view value);

/// Parses `text` strictly: metric and label names must be valid, label values properly quoted and escaped,
/// values numbers (or NaN, +Inf, -Inf), a family's TYPE must come before its samples and appear once, and no
/// series (name and labels) may repeat. Errors: kSerialization naming the line and what is wrong with it.
[[nodiscard]] Result<ParsedExposition> parse_prometheus_text(std::string_view text);

}  // namespace sluice::metrics
