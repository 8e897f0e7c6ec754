#include "sluice/core/config.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

namespace sluice {
namespace {

std::string lower_trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}

// Splits "32 kb" into 32 and "kb".
bool split_number_unit(const std::string& s, int64_t& number, std::string& unit) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, number);
  if (ec != std::errc() || number < 0) return false;
  while (p != end && *p == ' ')
    ++p;
  unit.assign(p, end);
  return true;
}

Error config_error(std::string_view key, std::string_view text, std::string_view expected) {
  return Error(ErrorCode::kConfiguration, "option '" + std::string(key) + "' has value '" + std::string(text) +
                                              "', expected " + std::string(expected));
}

}  // namespace

Result<int64_t> parse_memory_size(std::string_view text) {
  std::string s = lower_trim(text);
  int64_t n = 0;
  std::string unit;
  if (!split_number_unit(s, n, unit)) return config_error("memory size", text, "a size such as 32kb");
  int64_t mul = 1;
  if (unit.empty() || unit == "b" || unit == "bytes") {
    mul = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mul = 1024;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mul = 1024 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mul = 1024LL * 1024 * 1024;
  } else {
    return config_error("memory size", text, "a unit of b, kb, mb or gb");
  }
  if (n > std::numeric_limits<int64_t>::max() / mul) return config_error("memory size", text, "a size below 8 EiB");
  return n * mul;
}

Result<int64_t> parse_duration_ms(std::string_view text) {
  std::string s = lower_trim(text);
  int64_t n = 0;
  std::string unit;
  if (!split_number_unit(s, n, unit)) return config_error("duration", text, "a duration such as 100ms or 1s");
  if (unit.empty() || unit == "ms") return n;
  if (unit == "s" || unit == "sec") return n * 1000;
  if (unit == "min" || unit == "m") return n * 60'000;
  if (unit == "h") return n * 3'600'000;
  return config_error("duration", text, "a unit of ms, s, min or h");
}

std::optional<std::string> Configuration::get_string(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

int64_t Configuration::get(const ConfigOption<int64_t>& option) const {
  auto v = get_string(option.key);
  if (!v) return option.default_value;
  // Memory-size and duration options accept units; plain integers parse under either.
  auto key = option.key;
  bool is_duration = option.unit == OptionUnit::kDuration ||
                     (option.unit == OptionUnit::kAuto && (key.find("timeout") != std::string_view::npos ||
                                                           key.find("interval") != std::string_view::npos));
  Result<int64_t> r = is_duration ? parse_duration_ms(*v) : parse_memory_size(*v);
  if (!r.ok()) throw SluiceException(config_error(key, *v, is_duration ? "a duration" : "an integer or size"));
  return *r;
}

int32_t Configuration::get(const ConfigOption<int32_t>& option) const {
  auto v = get_string(option.key);
  if (!v) return option.default_value;
  int32_t n = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (ec != std::errc() || p != v->data() + v->size())
    throw SluiceException(config_error(option.key, *v, "an integer"));
  return n;
}

bool Configuration::get(const ConfigOption<bool>& option) const {
  auto v = get_string(option.key);
  if (!v) return option.default_value;
  std::string s = lower_trim(*v);
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  throw SluiceException(config_error(option.key, *v, "true or false (or 1/0, yes/no, on/off)"));
}

std::string Configuration::get(const ConfigOption<std::string>& option) const {
  auto v = get_string(option.key);
  return v ? *v : option.default_value;
}

double Configuration::get(const ConfigOption<double>& option) const {
  auto v = get_string(option.key);
  if (!v) return option.default_value;
  std::string s = lower_trim(*v);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw SluiceException(config_error(option.key, *v, "a number"));
  return d;
}

Status validate_engine_options(const Configuration& config) {
  static const std::vector<std::string_view> known = {
      options::kParallelism.key, options::kMaxParallelism.key, options::kTaskSlots.key, options::kBufferSize.key,
      options::kBuffersPerChannel.key, options::kNetworkMemoryMax.key, options::kBufferTimeout.key,
      options::kAutoWatermarkInterval.key, options::kChaining.key, options::kCheckpointInterval.key,
      options::kCheckpointTimeout.key, options::kCheckpointMinPause.key, options::kMaxConcurrentCheckpoints.key,
      options::kCheckpointMode.key, options::kCheckpointDir.key, options::kCheckpointsRetained.key,
      options::kSavepointDir.key, options::kTolerableFailedCheckpoints.key, options::kRestoreFallback.key,
      options::kStateRecoveryPath.key, options::kIgnoreUnclaimedState.key, options::kLocalBackupEnabled.key,
      options::kStateRecoveryFromLocal.key, options::kLocalStateRootDir.key, options::kRestartStrategy.key,
      options::kFixedDelayAttempts.key, options::kFixedDelayDelay.key, options::kFailureRateMaxFailures.key,
      options::kFailureRateInterval.key, options::kFailureRateDelay.key, options::kExpDelayInitialBackoff.key,
      options::kExpDelayMaxBackoff.key, options::kExpDelayMultiplier.key, options::kExpDelayResetThreshold.key,
      options::kExpDelayJitter.key, options::kExpDelayAttempts.key, options::kRestPort.key, options::kRestAddress.key,
      // REST security (web/rest_security.h, checked there)
      "rest.auth.admin-token-file", "rest.auth.admin-token-env", "rest.auth.read-token-file",
      "rest.auth.read-token-env", "security.ssl.rest.enabled", "security.ssl.rest.certificate", "security.ssl.rest.key",
      "security.ssl.rest.key-password", options::kStateBackendType.key, options::kStateBackendIncremental.key,
      options::kRocksDBLocalDir.key, options::kRocksDBTimerServiceFactory.key, options::kRocksDBMemoryManaged.key,
      options::kRocksDBMemoryFixedPerSlot.key, options::kRocksDBWriteBufferRatio.key,
      options::kRocksDBHighPrioPoolRatio.key};
  try {
    (void)config.get(options::kParallelism);
    (void)config.get(options::kMaxParallelism);
    (void)config.get(options::kTaskSlots);
    (void)config.get(options::kBufferSize);
    (void)config.get(options::kBuffersPerChannel);
    (void)config.get(options::kNetworkMemoryMax);
    (void)config.get(options::kBufferTimeout);
    (void)config.get(options::kAutoWatermarkInterval);
    (void)config.get(options::kChaining);
    (void)config.get(options::kCheckpointInterval);
    (void)config.get(options::kCheckpointTimeout);
    (void)config.get(options::kCheckpointMinPause);
    (void)config.get(options::kMaxConcurrentCheckpoints);
    (void)config.get(options::kCheckpointsRetained);
    (void)config.get(options::kTolerableFailedCheckpoints);
    (void)config.get(options::kRestoreFallback);
    (void)config.get(options::kIgnoreUnclaimedState);
    (void)config.get(options::kLocalBackupEnabled);
    (void)config.get(options::kStateRecoveryFromLocal);
    (void)config.get(options::kFixedDelayAttempts);
    (void)config.get(options::kFixedDelayDelay);
    (void)config.get(options::kFailureRateMaxFailures);
    (void)config.get(options::kFailureRateInterval);
    (void)config.get(options::kFailureRateDelay);
    (void)config.get(options::kExpDelayInitialBackoff);
    (void)config.get(options::kExpDelayMaxBackoff);
    (void)config.get(options::kExpDelayMultiplier);
    (void)config.get(options::kExpDelayResetThreshold);
    (void)config.get(options::kExpDelayJitter);
    (void)config.get(options::kExpDelayAttempts);
    const int32_t rest_port = config.get(options::kRestPort);
    if (rest_port < -1 || rest_port > 65535) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{} = {}; expected a port 0..65535 (0: any free port) or -1 (disabled)",
                               options::kRestPort.key, rest_port));
    }
    std::string mode = config.get(options::kCheckpointMode);
    std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::toupper(c); });
    if (mode != "EXACTLY_ONCE" && mode != "AT_LEAST_ONCE") {
      return Error(ErrorCode::kConfiguration, fmt::format("{} = '{}'; expected EXACTLY_ONCE or AT_LEAST_ONCE",
                                                          options::kCheckpointMode.key, mode));
    }
    std::string restart = config.get(options::kRestartStrategy);
    if (!restart.empty() && restart != "none" && restart != "fixed-delay" && restart != "failure-rate" &&
        restart != "exponential-delay") {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{} = '{}'; expected none, fixed-delay, failure-rate or exponential-delay",
                               options::kRestartStrategy.key, restart));
    }
    // State backend (issue 18). Values are checked here, at execute(), so a typo fails the job before any
    // task starts; the keyed operators read the same keys (state/keyed_state_store.h).
    std::string backend = config.get(options::kStateBackendType);
    std::transform(backend.begin(), backend.end(), backend.begin(), [](unsigned char c) { return std::tolower(c); });
    if (backend != "hashmap" && backend != "rocksdb") {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{} = '{}'; expected hashmap or rocksdb", options::kStateBackendType.key,
                               config.get(options::kStateBackendType)));
    }
    // state.backend.incremental applies to rocksdb; hashmap checkpoints stay full (as Flink's).
    std::string timers = config.get(options::kRocksDBTimerServiceFactory);
    std::transform(timers.begin(), timers.end(), timers.begin(), [](unsigned char c) { return std::tolower(c); });
    if (timers != "heap" && timers != "rocksdb") {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("{} = '{}'; expected heap or rocksdb", options::kRocksDBTimerServiceFactory.key,
                               config.get(options::kRocksDBTimerServiceFactory)));
    }
    (void)config.get(options::kRocksDBMemoryManaged);
    if (config.get(options::kRocksDBMemoryFixedPerSlot) <= 0) {
      return Error(ErrorCode::kConfiguration, fmt::format("{} = {}; expected a positive memory size such as 64mb",
                                                          options::kRocksDBMemoryFixedPerSlot.key,
                                                          config.get(options::kRocksDBMemoryFixedPerSlot)));
    }
    const double write_buffer_ratio = config.get(options::kRocksDBWriteBufferRatio);
    if (!(write_buffer_ratio > 0 && write_buffer_ratio < 1)) {
      return Error(ErrorCode::kConfiguration, fmt::format("{} = {}; expected a ratio in (0, 1)",
                                                          options::kRocksDBWriteBufferRatio.key, write_buffer_ratio));
    }
    const double high_prio = config.get(options::kRocksDBHighPrioPoolRatio);
    if (!(high_prio >= 0 && high_prio < 1)) {
      return Error(ErrorCode::kConfiguration, fmt::format("{} = {}; expected a ratio in [0, 1)",
                                                          options::kRocksDBHighPrioPoolRatio.key, high_prio));
    }
  } catch (const SluiceException& e) {
    return e.error();
  }
  for (const auto& [key, value] : config.entries()) {
    // The S3 client's options (core/s3_client.h defines, reads and checks them).
    static const std::vector<std::string_view> s3 = {"s3.endpoint",
                                                     "s3.path-style-access",
                                                     "s3.region",
                                                     "s3.access-key",
                                                     "s3.secret-key",
                                                     "s3.credentials-file",
                                                     "s3.multipart.threshold",
                                                     "s3.multipart.part-size",
                                                     "s3.max-attempts",
                                                     "s3.retry.initial-backoff",
                                                     "s3.retry.max-backoff",
                                                     "s3.request-timeout",
                                                     "s3.connect-timeout"};
    if (std::find(s3.begin(), s3.end(), key) != s3.end()) continue;
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      spdlog::warn(
          "configuration key '{}' is not an engine option and is ignored (a typo?); see "
          "docs/configuration.md",
          key);
    }
  }
  return ok_status();
}

Result<Configuration> Configuration::from_args(int argc, const char* const* argv, std::vector<std::string>* rest) {
  Configuration c;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string key, value;
    if (a == "-D") {  // "-D key=value"
      if (i + 1 >= argc) return Error(ErrorCode::kConfiguration, "-D needs key=value");
      a = argv[++i];
    } else if (a.starts_with("-D")) {
      a.remove_prefix(2);
    } else if (a == "-p" || a == "--parallelism") {
      if (i + 1 >= argc) return Error(ErrorCode::kConfiguration, std::string(a) + " needs a value");
      c.set_string(std::string(options::kParallelism.key), argv[++i]);
      continue;
    } else if (a.starts_with("--")) {
      a.remove_prefix(2);
      if (a.find('=') == std::string_view::npos) {
        if (i + 1 >= argc) return Error(ErrorCode::kConfiguration, "--" + std::string(a) + " needs a value");
        key = a == "parallelism" ? std::string(options::kParallelism.key) : std::string(a);
        c.set_string(key, argv[++i]);
        continue;
      }
    } else {
      if (rest == nullptr) {
        return Error(ErrorCode::kConfiguration,
                     "unexpected argument '" + std::string(a) + "'; options are -Dkey=value or --key=value");
      }
      rest->emplace_back(a);
      continue;
    }
    auto eq = a.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return Error(ErrorCode::kConfiguration, "argument '" + std::string(argv[i]) + "' is not of the form key=value");
    }
    key = std::string(a.substr(0, eq));
    if (key == "parallelism") key = std::string(options::kParallelism.key);
    c.set_string(key, std::string(a.substr(eq + 1)));
  }
  return c;
}

}  // namespace sluice
