// SourceConnectionBoard: per-subtask states, how long a loss lasts, the gauge's values, one log line per loss and
// per recovery however often a reader reports, and no secret from a client library's reason.
#include "sluice/connectors/source_connection.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "sluice/core/logging.h"

namespace sluice {
namespace {

TEST(SourceConnectionBoardTest, ReportsEachSubtaskAndLogsEachTransitionOnce) {
  init_logging();
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100);
  spdlog::default_logger()->sinks().push_back(log);
  SourceConnectionBoard board("Kafka source (topics [orders])");
  EXPECT_TRUE(board.snapshot(1000).empty());
  EXPECT_EQ(SourceConnectionBoard::gauge(board.snapshot(1000), 0), -1.0);
  board.set_connected(0, 1000);
  board.set_connected(1, 1000);
  // Subtask 1 loses its server at 2000 and reports so on every round until 9000.
  for (int64_t t = 5000; t <= 9000; t += 1000)
    board.set_disconnected(1, 2000, "no broker of 'b:9092' answers: all brokers down");
  std::vector<SourceConnection> s = board.snapshot(9500);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0].connected);
  EXPECT_FALSE(s[1].connected);
  EXPECT_EQ(s[1].subtask, 1);
  EXPECT_EQ(s[1].disconnected_ms, 7500);
  EXPECT_EQ(s[1].reason, "no broker of 'b:9092' answers: all brokers down");
  EXPECT_EQ(SourceConnectionBoard::gauge(s, 0), 1.0);
  EXPECT_EQ(SourceConnectionBoard::gauge(s, 1), 0.0);
  // A later report with another since keeps the loss's start; the recovery clears it.
  board.set_disconnected(1, 8000, "still down: postgresql://cdc:hunter2@db/x refused");
  s = board.snapshot(10'000);
  EXPECT_EQ(s[1].disconnected_ms, 8000);
  EXPECT_EQ(s[1].reason.find("hunter2"), std::string::npos) << s[1].reason;
  for (int i = 0; i < 3; ++i)
    board.set_connected(1, 10'000);
  s = board.snapshot(10'500);
  EXPECT_TRUE(s[1].connected);
  EXPECT_EQ(s[1].disconnected_ms, 0);
  EXPECT_EQ(s[1].reason, "");
  board.remove(1);
  EXPECT_EQ(SourceConnectionBoard::gauge(board.snapshot(11'000), 1), -1.0);

  std::vector<std::string> lines = log->last_formatted();
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), log), sinks.end());
  const auto count = [&](const std::string& text) {
    return std::count_if(lines.begin(), lines.end(),
                         [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  EXPECT_EQ(count("Kafka source (topics [orders]) subtask 1: disconnected for"), 1);
  EXPECT_EQ(count("Kafka source (topics [orders]) subtask 1: connected again after 8.0 s disconnected"), 1);
  EXPECT_EQ(count("subtask 0"), 0);
  EXPECT_EQ(count("hunter2"), 0);
}

}  // namespace
}  // namespace sluice
