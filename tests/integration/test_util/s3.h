// S3 helpers for tests against moto (scripts/services/s3): a client for an endpoint, a consumer's read of a files
// sink's output under a prefix, and a moto server of a test's own (to pause, kill or restart it without disturbing
// the shared one that other tests use at the same time).
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "integration/test_util/child_process.h"
#include "integration/test_util/polling.h"
#include "sluice/core/config.h"
#include "sluice/core/s3_client.h"

namespace sluice::testing {

/// A path-style client of `endpoint` with 5 MiB parts above `threshold` and 10 s requests.
inline std::shared_ptr<S3Client> s3_test_client(const std::string& endpoint, int64_t threshold = 64LL << 20) {
  Configuration c;
  c.set(options::kS3Endpoint, endpoint);
  c.set(options::kS3PathStyleAccess, true);
  c.set(options::kS3MultipartThreshold, threshold);
  c.set(options::kS3MultipartPartSize, int64_t{5} << 20);
  c.set(options::kS3RequestTimeout, int64_t{10'000});
  auto o = S3Options::from_config(c);
  EXPECT_TRUE(o.ok()) << o.error().to_string();
  return std::make_shared<S3Client>(*o);
}

/// One committed part file of a FileSink on S3, as a consumer lists it.
struct S3PartObject {
  int subtask = -1;
  int64_t sequence = -1;
  std::string key;
};

/// The committed part files `<prefix>/part-<i>-<n>.<ext>` under `prefix`, by subtask then sequence; records a test
/// failure for any other key under the prefix.
inline std::vector<S3PartObject> list_s3_part_files(const S3Client& client, const std::string& bucket,
                                                    const std::string& prefix) {
  std::vector<S3PartObject> parts;
  auto listing = client.list(bucket, prefix + "/");
  EXPECT_TRUE(listing.ok()) << listing.error().to_string();
  if (!listing.ok()) return parts;
  for (const S3Object& o : listing->objects) {
    const std::string name = o.key.substr(prefix.size() + 1);
    S3PartObject p;
    p.key = o.key;
    const char* end = name.data() + name.size();
    auto r1 = std::from_chars(name.data() + std::min<size_t>(5, name.size()), end, p.subtask);
    const bool ok1 = name.starts_with("part-") && r1.ec == std::errc() && r1.ptr != end && *r1.ptr == '-';
    EXPECT_TRUE(ok1) << "not a part file under the prefix: " << o.key;
    if (!ok1) continue;
    auto r2 = std::from_chars(r1.ptr + 1, end, p.sequence);
    EXPECT_TRUE(r2.ec == std::errc()) << o.key;
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end(), [](const S3PartObject& a, const S3PartObject& b) {
    return std::tie(a.subtask, a.sequence) < std::tie(b.subtask, b.sequence);
  });
  return parts;
}

/// A moto server of a test's own on 127.0.0.1 (S3_SERVER_BIN of scripts/services/s3 env), stopped by the
/// destructor. Not thread-safe: one test thread.
class PrivateS3Server {
 public:
  explicit PrivateS3Server(std::string bin) : bin_(std::move(bin)) {}
  ~PrivateS3Server() { kill_now(); }
  /// Starts on `port` (0: a free one) and waits until it answers; creates `bucket` unless it is empty.
  ::testing::AssertionResult start(int port = 0, const std::string& bucket = "failing") {
    using namespace std::chrono_literals;
    if (port == 0) {
      // Bind to port 0 and take the number the kernel chose (the server binds it again right after).
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      socklen_t len = sizeof a;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
      ::close(fd);
    }
    port_ = port;
    proc_ =
        std::make_unique<ChildProcess>(bin_, std::vector<std::string>{"-H", "127.0.0.1", "-p", std::to_string(port)});
    const auto c = s3_test_client(endpoint());
    if (!poll_until([&] { return bucket.empty() ? c->exists("any", "x").ok() : c->create_bucket(bucket).ok(); }, 60s)) {
      return ::testing::AssertionFailure() << "moto did not start: " << proc_->err();
    }
    return ::testing::AssertionSuccess();
  }
  void kill_now() { proc_.reset(); }
  void pause() { proc_->signal(SIGSTOP); }
  void resume() { proc_->signal(SIGCONT); }
  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }
  int port() const { return port_; }

 private:
  std::string bin_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> proc_;
};

}  // namespace sluice::testing
