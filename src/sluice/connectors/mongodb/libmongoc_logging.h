// libmongoc's global set-up for the MongoDB connector: mongoc_init() once per process, with libmongoc's log handler
// routed into Sluice's logging (spdlog) before it, so that nothing libmongoc says goes to stderr on its own.
// Threading: any thread; init_libmongoc() is idempotent.
#pragma once

#include <mongoc/mongoc.h>
#include <spdlog/common.h>

#include <string_view>

namespace sluice::mongodb {

/// The spdlog level of a libmongoc log line: errors and critical errors are errors, warnings warnings, messages and
/// info info, debug and trace debug and trace. "Falling back to malloc for counters" (libmongoc's statistics
/// counters could not be put in shared memory, which only the mongoc-stat tool reads) is debug: it says nothing
/// about the pipeline.
spdlog::level::level_enum libmongoc_log_level(mongoc_log_level_t level, std::string_view domain,
                                              std::string_view message);

/// Installs the log handler, then calls mongoc_init(); once per process.
void init_libmongoc();

}  // namespace sluice::mongodb
