#include "sluice/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace sluice {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto current = spdlog::default_logger();
    // Replace only spdlog's own default (named ""), never a logger the application installed.
    if (current == nullptr || current->name().empty()) {
      auto logger = spdlog::stderr_color_mt("sluice");
      if (current != nullptr) logger->set_level(current->level());
      spdlog::set_default_logger(std::move(logger));
    }
  });
}

}  // namespace sluice
