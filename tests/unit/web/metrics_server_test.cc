// MetricsServer: start and stop, including a stop right after start (a lost stop hung the process for ever).
#include "sluice/web/metrics_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

namespace sluice {
namespace {

using namespace std::chrono_literals;

Result<std::unique_ptr<MetricsServer>> start_server() {
  return MetricsServer::start(
      "127.0.0.1", 0, [] { return std::string("sluice_up 1\n"); },
      [] {
        return HealthResponse{true, R"({"status":"UP"})"};
      });
}

TEST(MetricsServerTest, ServesMetricsAndHealth) {
  auto server = start_server();
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->body, "sluice_up 1\n");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  (*server)->stop();
}

// A second `sluice run` of a locked job starts the endpoint and stops it at once: the stop must never be lost.
TEST(MetricsServerTest, StopRightAfterStartReturns) {
  for (int i = 0; i < 200; ++i) {
    auto done = std::async(std::launch::async, [] {
      auto server = start_server();
      if (!server.ok()) return false;
      (*server)->stop();
      return true;
    });
    if (done.wait_for(10s) != std::future_status::ready) {
      // The future's destructor would wait for the hung thread: end the process, a failure ctest reports.
      std::fprintf(stderr, "FAILED: stop() after start() hung in round %d\n", i);
      std::_Exit(1);
    }
    ASSERT_TRUE(done.get()) << "round " << i;
  }
}

}  // namespace
}  // namespace sluice
