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

/// How the text of an int64 option is parsed.
enum class OptionUnit {
  kAuto,      ///< a duration when the key mentions "timeout" or "interval", else a memory size
  kDuration,  ///< "100ms", "1s", "2min", "1h" or plain milliseconds
  kMemory,    ///< "32kb", "4 mb" or plain bytes
};

/// A typed option: key, default value and a one-line description (rendered in docs/configuration.md).
template <class T>
struct ConfigOption {
  std::string_view key;
  T default_value;
  std::string_view description;
  OptionUnit unit = OptionUnit::kAuto;
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
  double get(const ConfigOption<double>& option) const;
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

// --- Checkpointing (Flink 2.x keys) ---
inline const ConfigOption<int64_t> kCheckpointInterval{
    "execution.checkpointing.interval", 0,
    "Time between the triggers of periodic checkpoints (ms or with a unit); 0 disables checkpointing.",
    OptionUnit::kDuration};
inline const ConfigOption<int64_t> kCheckpointTimeout{"execution.checkpointing.timeout", 10 * 60'000,
                                                      "A checkpoint not completed within this time is aborted.",
                                                      OptionUnit::kDuration};
inline const ConfigOption<int64_t> kCheckpointMinPause{
    "execution.checkpointing.min-pause", 0, "Least time between the end of one checkpoint and the trigger of the next.",
    OptionUnit::kDuration};
inline const ConfigOption<int32_t> kMaxConcurrentCheckpoints{"execution.checkpointing.max-concurrent-checkpoints", 1,
                                                             "Checkpoints that may be in progress at once."};
inline const ConfigOption<std::string> kCheckpointMode{
    "execution.checkpointing.mode", "EXACTLY_ONCE",
    "EXACTLY_ONCE (barriers aligned: state reflects every record exactly once) or AT_LEAST_ONCE (no "
    "alignment: lower latency, records after a barrier may be counted again on recovery)."};
inline const ConfigOption<std::string> kCheckpointDir{
    "execution.checkpointing.dir", "",
    "Where checkpoints are stored (file:///path or a path); required when checkpointing is enabled."};
inline const ConfigOption<int32_t> kCheckpointsRetained{"execution.checkpointing.num-retained", 1,
                                                        "Completed checkpoints kept; older ones are deleted."};
inline const ConfigOption<std::string> kSavepointDir{"execution.checkpointing.savepoint-dir", "",
                                                     "Default directory of savepoints (file:///path or a path)."};
inline const ConfigOption<int32_t> kTolerableFailedCheckpoints{
    "execution.checkpointing.tolerable-failed-checkpoints", 0,
    "Consecutive failed checkpoints tolerated before the job fails (a timeout or a snapshot error)."};
inline const ConfigOption<bool> kRestoreFallback{
    "execution.checkpointing.restore-fallback", false,
    "When the latest checkpoint cannot be read (a missing or corrupted file), restore the previous one instead "
    "of failing."};
inline const ConfigOption<std::string> kStateRecoveryPath{
    "execution.state-recovery.path", "",
    "A savepoint or retained checkpoint (its directory, its _metadata file, or a job directory: the latest "
    "checkpoint in it) to start the job from."};
inline const ConfigOption<bool> kIgnoreUnclaimedState{
    "execution.state-recovery.ignore-unclaimed-state", false,
    "Start even when the savepoint holds state of an operator uid the job no longer has "
    "(Flink's allowNonRestoredState)."};
inline const ConfigOption<bool> kLocalBackupEnabled{
    "execution.checkpointing.local-backup.enabled", false,
    "Cluster mode: each TaskManager also keeps a local copy of the checkpoint state files it writes (under "
    "taskmanager.state.local.root-dirs), for task-local recovery. Enabled as well by "
    "execution.state-recovery.from-local."};
inline const ConfigOption<bool> kStateRecoveryFromLocal{
    "execution.state-recovery.from-local", false,
    "Cluster mode: a restore reads a state file from the TaskManager's local copy when it has one that matches the "
    "checkpoint (size and checksum), instead of the checkpoint storage; subtasks go back to the TaskManager that "
    "wrote their state when it is there (Flink's task-local recovery)."};
inline const ConfigOption<std::string> kLocalStateRootDir{
    "taskmanager.state.local.root-dirs", "",
    "Directory of a TaskManager's local state copies (one directory); empty: <temp dir>/sluice-localState-<resource "
    "id>, removed when the TaskManager stops."};

// --- State backends (Flink keys; docs/checkpoints.md, "State backends") ---
inline const ConfigOption<std::string> kStateBackendType{
    "state.backend.type", "hashmap",
    "Where keyed state lives: hashmap (in memory) or rocksdb (one RocksDB database per keyed operator subtask on "
    "local disk)."};
inline const ConfigOption<bool> kStateBackendIncremental{
    "state.backend.incremental", false,
    "Incremental checkpoints of the rocksdb backend: each uploads only the SST files no earlier checkpoint uploaded "
    "(into <dir>/<job-id>/shared/); hashmap checkpoints stay full."};
inline const ConfigOption<std::string> kRocksDBLocalDir{
    "state.backend.rocksdb.localdir", "",
    "Directory for the RocksDB working directories of this process's subtasks; empty: the system temp dir."};
inline const ConfigOption<std::string> kRocksDBTimerServiceFactory{
    "state.backend.rocksdb.timer-service.factory", "heap",
    "Where the timers of the rocksdb backend live: heap (in memory, checkpointed with the state) or rocksdb (in "
    "the subtask's RocksDB database, for timers larger than memory)."};
inline const ConfigOption<bool> kRocksDBMemoryManaged{
    "state.backend.rocksdb.memory.managed", true,
    "Bound each RocksDB instance's block cache and memtables by one budget (fixed-per-slot); false: RocksDB's "
    "own defaults, which grow with the state."};
inline const ConfigOption<int64_t> kRocksDBMemoryFixedPerSlot{
    "state.backend.rocksdb.memory.fixed-per-slot", 64LL * 1024 * 1024,
    "The memory budget (block cache + memtables) of one RocksDB instance, i.e. of one keyed operator subtask "
    "(accepts units: 64mb).",
    OptionUnit::kMemory};
inline const ConfigOption<double> kRocksDBWriteBufferRatio{
    "state.backend.rocksdb.memory.write-buffer-ratio", 0.5,
    "Share of the budget for memtables (write buffers), in (0, 1)."};
inline const ConfigOption<double> kRocksDBHighPrioPoolRatio{
    "state.backend.rocksdb.memory.high-prio-pool-ratio", 0.1,
    "Share of the block cache reserved for index and filter blocks, in [0, 1)."};

// --- Restart strategies (Flink keys and defaults) ---
inline const ConfigOption<std::string> kRestartStrategy{
    "restart-strategy.type", "",
    "none, fixed-delay, failure-rate or exponential-delay; unset: exponential-delay when checkpointing is "
    "enabled, none otherwise (as Flink)."};
inline const ConfigOption<int32_t> kFixedDelayAttempts{"restart-strategy.fixed-delay.attempts", 1,
                                                       "Restarts before the job fails (fixed-delay)."};
inline const ConfigOption<int64_t> kFixedDelayDelay{"restart-strategy.fixed-delay.delay", 1000,
                                                    "Delay before each restart (fixed-delay).", OptionUnit::kDuration};
inline const ConfigOption<int32_t> kFailureRateMaxFailures{
    "restart-strategy.failure-rate.max-failures-per-interval", 1,
    "Failures within one interval that fail the job (failure-rate)."};
inline const ConfigOption<int64_t> kFailureRateInterval{"restart-strategy.failure-rate.failure-rate-interval", 60'000,
                                                        "The measuring interval (failure-rate).",
                                                        OptionUnit::kDuration};
inline const ConfigOption<int64_t> kFailureRateDelay{
    "restart-strategy.failure-rate.delay", 1000, "Delay before each restart (failure-rate).", OptionUnit::kDuration};
inline const ConfigOption<int64_t> kExpDelayInitialBackoff{"restart-strategy.exponential-delay.initial-backoff", 1000,
                                                           "First restart delay (exponential-delay).",
                                                           OptionUnit::kDuration};
inline const ConfigOption<int64_t> kExpDelayMaxBackoff{"restart-strategy.exponential-delay.max-backoff", 60'000,
                                                       "Largest restart delay (exponential-delay).",
                                                       OptionUnit::kDuration};
inline const ConfigOption<double> kExpDelayMultiplier{"restart-strategy.exponential-delay.backoff-multiplier", 1.5,
                                                      "Factor applied to the delay after each failure."};
inline const ConfigOption<int64_t> kExpDelayResetThreshold{
    "restart-strategy.exponential-delay.reset-backoff-threshold", 3'600'000,
    "Running this long without a failure resets the delay to the initial backoff.", OptionUnit::kDuration};
inline const ConfigOption<double> kExpDelayJitter{"restart-strategy.exponential-delay.jitter-factor", 0.1,
                                                  "Random +/- fraction applied to each delay."};
inline const ConfigOption<int32_t> kExpDelayAttempts{"restart-strategy.exponential-delay.attempts-before-reset-backoff",
                                                     2147483647,
                                                     "Restarts allowed before the backoff resets; more fail the job."};

// --- REST API (Flink keys; used by RestServer::start(const Configuration&) in web/) ---
inline const ConfigOption<int32_t> kRestPort{
    "rest.port", -1,
    "Port of the REST API (jobs, checkpoints, savepoint/stop/cancel); 0 picks a free port, -1 disables it. "
    "The sluice command enables it on 8081 (--rest-port)."};
inline const ConfigOption<std::string> kRestAddress{"rest.address", "127.0.0.1", "Address the REST API binds to."};
}  // namespace options

/// Checks every engine option in `config` parses; returns the first error (kConfiguration) naming the key.
/// Logs a warning for each key that is not an engine option (a likely typo).
Status validate_engine_options(const Configuration& config);

}  // namespace sluice
