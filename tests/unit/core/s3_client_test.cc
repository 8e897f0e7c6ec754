// S3Client's error for a refused request says whether the process had credentials: a TaskManager started without
// them sends unsigned requests, and the store's "HTTP 403: (no body)" alone did not say why.
//
// The 403 comes from a one-connection-at-a-time HTTP listener on 127.0.0.1 in this file, not from moto: moto's
// server accepts any credentials unless its IAM emulation is configured, so it cannot produce an AccessDenied for
// an unsigned request here. Everything else about the client is tested against moto (tests/integration/
// s3_checkpoint_test.cc).
#include "sluice/core/s3_client.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Answers every request with "403 Forbidden" and an empty body until destroyed.
class ForbiddingServer {
 public:
  ForbiddingServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ForbiddingServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      static const std::string kResponse = "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      (void)!::write(c, kResponse.data(), kResponse.size());
      ::close(c);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

S3Options options_for(const std::string& endpoint) {
  S3Options o;
  o.endpoint = endpoint;
  o.path_style = true;
  o.max_attempts = 1;
  o.request_timeout_ms = 5'000;
  return o;
}

TEST(S3ClientTest, AnAccessDeniedUnsignedRequestSaysTheProcessHasNoCredentials) {
  ForbiddingServer server;
  S3Client client(options_for(server.endpoint()));
  Result<std::string> r = client.get_object("bucket", "job/chk-1/_metadata");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message(), HasSubstr("S3 GET s3://bucket/job/chk-1/_metadata: HTTP 403"));
  EXPECT_THAT(r.error().message(), HasSubstr("no S3 credentials"));
  EXPECT_THAT(r.error().message(), HasSubstr("AWS_ACCESS_KEY_ID"));
}

TEST(S3ClientTest, AnAccessDeniedSignedRequestPointsAtTheCredentialsAccess) {
  ForbiddingServer server;
  S3Options o = options_for(server.endpoint());
  o.access_key = "AKIDEXAMPLE";
  o.secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
  S3Client client(std::move(o));
  Status s = client.put_object("bucket", "job/chk-1/state", "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message(), HasSubstr("HTTP 403"));
  EXPECT_THAT(s.error().message(), HasSubstr("signed with this process's credentials"));
  EXPECT_THAT(s.error().message(), Not(HasSubstr("wJalrXUtnFEMI")));  // never the secret
}

}  // namespace
}  // namespace sluice
