// The tables of known connector options of pipeline files (private to the pipeline-file parser).
//
// One table per source type and per sink type: each option's key, kind, whether it is required, the values
// an enum-like string option accepts, and the default the connector applies when it is absent (for
// docs/pipelines.md and messages only; the parser does not fill defaults in). Cross-option rules ("exactly one
// of topics / topic-pattern") are checked by the parser (pipeline_spec.cc), not here.
#pragma once

#include <span>
#include <string_view>

namespace sluice::pipeline::detail {

/// How an option's YAML value is read and normalised (see OptionValue).
enum class OptionKind {
  kString,      ///< a scalar, kept as a string
  kInt,         ///< an integer -> int64
  kBool,        ///< true | false -> bool
  kDuration,    ///< "250ms", "1s", "5m", "1h", "2d" or an integer of ms -> int64 ms
  kList,        ///< a sequence of scalars -> array of strings
  kMap,         ///< a mapping of scalar -> scalar -> object of strings
  kExpression,  ///< a scalar compiled as an Expression; kept as its text
  kProjection,  ///< a scalar compiled as a Projection; kept as its text
};

/// The name of `kind` as used in messages and in docs/pipelines.md ("string", "integer", ...).
std::string_view option_kind_name(OptionKind kind) noexcept;

struct OptionDef {
  std::string_view key;
  OptionKind kind = OptionKind::kString;
  bool required = false;
  std::span<const std::string_view> allowed;  ///< non-empty: the only accepted values of a string option
  std::string_view default_text;              ///< what applies when absent (documentation)
  std::string_view description;               ///< one line (documentation)
};

/// The options of one connector type.
struct ConnectorTable {
  std::string_view type;
  std::span<const OptionDef> options;

  const OptionDef* find(std::string_view key) const noexcept;
};

/// Source types: files, datagen, postgres, mongodb, kafka.
std::span<const ConnectorTable> source_tables() noexcept;
/// Sink types: kafka, opensearch, elasticsearch, postgres, files, print.
std::span<const ConnectorTable> sink_tables() noexcept;
/// The sink types a dead-letter sink may have.
std::span<const std::string_view> dead_letter_types() noexcept;

/// The table of `type` in `tables`, or nullptr.
const ConnectorTable* find_table(std::span<const ConnectorTable> tables, std::string_view type) noexcept;

}  // namespace sluice::pipeline::detail
