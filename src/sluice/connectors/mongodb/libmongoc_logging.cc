#include "sluice/connectors/mongodb/libmongoc_logging.h"

#include <spdlog/spdlog.h>

#include <mutex>

namespace sluice::mongodb {

spdlog::level::level_enum libmongoc_log_level(mongoc_log_level_t level, std::string_view /*domain*/,
                                              std::string_view message) {
  if (message.starts_with("Falling back to malloc for counters")) return spdlog::level::debug;
  switch (level) {
    case MONGOC_LOG_LEVEL_ERROR:
    case MONGOC_LOG_LEVEL_CRITICAL:
      return spdlog::level::err;
    case MONGOC_LOG_LEVEL_WARNING:
      return spdlog::level::warn;
    case MONGOC_LOG_LEVEL_MESSAGE:
    case MONGOC_LOG_LEVEL_INFO:
      return spdlog::level::info;
    case MONGOC_LOG_LEVEL_DEBUG:
      return spdlog::level::debug;
    case MONGOC_LOG_LEVEL_TRACE:
      return spdlog::level::trace;
  }
  return spdlog::level::info;
}

void init_libmongoc() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The handler first: mongoc_init() itself may log (the counters' shared memory), and libmongoc's default
    // handler writes to stderr.
    mongoc_log_set_handler(
        [](mongoc_log_level_t level, const char* domain, const char* message, void*) {
          const std::string_view d = domain != nullptr ? domain : "";
          const std::string_view m = message != nullptr ? message : "";
          spdlog::log(libmongoc_log_level(level, d, m), "libmongoc [{}]: {}", d, m);
        },
        nullptr);
    mongoc_init();
  });
}

}  // namespace sluice::mongodb
