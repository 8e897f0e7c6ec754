// Configuration: typed options with keys, defaults and descriptions, in the manner of Flink's ConfigOption.
//
// Values are kept as strings and parsed on read, so a configuration can come from command-line flags
// (`-Dkey=value`), YAML or code alike. Not thread-safe for writes; read-only once a job is submitted.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/error.h"

namespace sluice {

/// A typed option: key, default value and a one-line description (rendered in docs/configuration.md).
template <class T>
struct ConfigOption {
  std::string_view key;
  T default_value;
  std::string_view description;
};

/// Parses sizes like "32kb", "4 mb", "1024" (bytes). Returns an error naming the text on failure.
Result<int64_t> parse_memory_size(std::string_view text);
/// Parses durations like "100ms", "1s", "2min", "1h", "250" (ms). Returns milliseconds.
Result<int64_t> parse_duration_ms(std::string_view text);

/// A string-keyed set of options.
class Configuration {
 public:
  /// Sets `key` to the string form of `value`.
  void set_string(std::string key, std::string value) { values_[std::move(key)] = std::move(value); }
  template <class T>
  void set(const ConfigOption<T>& option, const T& value);

  /// Returns the raw string for `key`, if set.
  std::optional<std::string> get_string(std::string_view key) const;
  bool contains(std::string_view key) const { return values_.find(std::string(key)) != values_.end(); }

  /// Returns the option's value, or its default when unset. Throws SluiceException (kConfiguration) naming the
  /// key and the text when the value does not parse.
  int64_t get(const ConfigOption<int64_t>& option) const;
  int32_t get(const ConfigOption<int32_t>& option) const;
  bool get(const ConfigOption<bool>& option) const;
  std::string get(const ConfigOption<std::string>& option) const;
  /// Memory sizes (bytes) and durations (ms) are int64 options whose text may carry units.

  const std::map<std::string, std::string, std::less<>>& entries() const { return values_; }

  /// Parses `-Dkey=value`, `--key=value` and `--key value` arguments. `--parallelism` and `-p` are short for
  /// `parallelism.default`. Unrecognised positional arguments are returned in `rest` when given.
  static Result<Configuration> from_args(int argc, const char* const* argv, std::vector<std::string>* rest = nullptr);

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

template <class T>
void Configuration::set(const ConfigOption<T>& option, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    set_string(std::string(option.key), value ? "true" : "false");
  } else if constexpr (std::is_same_v<T, std::string>) {
    set_string(std::string(option.key), value);
  } else {
    set_string(std::string(option.key), std::to_string(value));
  }
}

/// The engine's options. Keys follow Flink's where a Flink user would look for them.
namespace options {
inline const ConfigOption<int32_t> kParallelism{"parallelism.default", 1,
                                                "Parallelism of operators that do not set their own."};
inline const ConfigOption<int32_t> kMaxParallelism{"pipeline.max-parallelism", 128,
                                                   "Number of key groups of keyed operators (max parallelism)."};
inline const ConfigOption<int32_t> kTaskSlots{
    "taskmanager.numberOfTaskSlots", 0,
    "Slots of the local mini-cluster; 0 = as many as the job needs (one per parallel subtask per slot sharing "
    "group)."};
inline const ConfigOption<int64_t> kBufferSize{"taskmanager.memory.segment-size", 32 * 1024,
                                               "Size of one network buffer in bytes (accepts units: 32kb)."};
inline const ConfigOption<int32_t> kBuffersPerChannel{
    "taskmanager.network.memory.buffers-per-channel", 4,
    "Buffers (credits) each input channel grants its sender; bounds in-flight data per channel."};
inline const ConfigOption<int64_t> kNetworkMemoryMax{
    "taskmanager.memory.network.max", 256LL * 1024 * 1024,
    "Upper bound on the memory of all network buffers of a job (channels x buffers-per-channel x segment size); "
    "a job needing more fails at start (Flink's 'insufficient number of network buffers')."};
inline const ConfigOption<int64_t> kBufferTimeout{
    "execution.buffer-timeout", 10,
    "Longest time (ms) a partly filled output buffer waits before it is sent; a task also sends them when idle."};
inline const ConfigOption<int64_t> kAutoWatermarkInterval{
    "pipeline.auto-watermark-interval", 200,
    "Processing time (ms) between periodic watermark emissions of watermark generators."};
inline const ConfigOption<bool> kChaining{"pipeline.operator-chaining", true,
                                          "Chain adjacent operators with forward edges into one task."};
}  // namespace options

/// Checks every engine option in `config` parses; returns the first error (kConfiguration) naming the key.
/// Logs a warning for each key that is not an engine option (a likely typo).
Status validate_engine_options(const Configuration& config);

}  // namespace sluice
