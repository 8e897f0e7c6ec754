// libmongoc's log lines go through Sluice's logging at their own level, never to stderr by libmongoc's default
// handler: "Falling back to malloc for counters" (printed at every start where /dev/shm is not usable) was a
// stray stderr line outside the log format.
#include "sluice/connectors/mongodb/libmongoc_logging.h"

#include <gtest/gtest.h>
#include <mongoc/mongoc.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <vector>

namespace sluice::mongodb {
namespace {

TEST(LibmongocLoggingTest, LevelsMapToSpdlogs) {
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_ERROR, "cluster", "x"), spdlog::level::err);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_CRITICAL, "cluster", "x"), spdlog::level::err);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_WARNING, "cluster", "x"), spdlog::level::warn);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_MESSAGE, "cluster", "x"), spdlog::level::info);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_INFO, "cluster", "x"), spdlog::level::info);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_DEBUG, "cluster", "x"), spdlog::level::debug);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_TRACE, "cluster", "x"), spdlog::level::trace);
  EXPECT_EQ(libmongoc_log_level(MONGOC_LOG_LEVEL_WARNING, "mongoc", "Falling back to malloc for counters."),
            spdlog::level::debug);
}

TEST(LibmongocLoggingTest, LibmongocsLinesGoToSpdlogNotStderr) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  ring->set_pattern("%l %v");
  auto logger = std::make_shared<spdlog::logger>("test", ring);
  logger->set_level(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  ::testing::internal::CaptureStderr();
  init_libmongoc();
  mongoc_log(MONGOC_LOG_LEVEL_WARNING, "mongoc", "Falling back to malloc for counters.");
  mongoc_log(MONGOC_LOG_LEVEL_WARNING, "cluster", "Server description for 127.0.0.1:1 changed");
  mongoc_log(MONGOC_LOG_LEVEL_ERROR, "client", "Failed to connect");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "") << "libmongoc wrote to stderr itself";
  std::vector<std::string> lines = ring->last_formatted();
  std::vector<std::string> ours;
  for (auto& l : lines) {
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r'))
      l.pop_back();
    if (l.find("libmongoc [") != std::string::npos) ours.push_back(l);
  }
  // mongoc_init() may have logged too (the counters' fallback itself, where /dev/shm is unusable): take the last 3.
  ASSERT_GE(ours.size(), 3u);
  ours.erase(ours.begin(), ours.end() - 3);
  EXPECT_EQ(ours[0], "debug libmongoc [mongoc]: Falling back to malloc for counters.");
  EXPECT_EQ(ours[1], "warning libmongoc [cluster]: Server description for 127.0.0.1:1 changed");
  EXPECT_EQ(ours[2], "error libmongoc [client]: Failed to connect");
}

}  // namespace
}  // namespace sluice::mongodb
