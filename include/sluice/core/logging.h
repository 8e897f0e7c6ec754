// Logging: Sluice logs through spdlog's default logger. init_logging() points it at stderr (once per process,
// unless the application installed its own default logger first), so logs never mix with records a job
// prints on stdout.
#pragma once

namespace sluice {

/// Makes spdlog's default logger write to stderr. Thread-safe; idempotent; called by StreamEnvironment.
void init_logging();

}  // namespace sluice
