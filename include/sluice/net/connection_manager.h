// ConnectionManager: one TaskManager's end of the TCP data plane (Flink's NettyConnectionManager).
//
// It listens on one endpoint and keeps one TCP connection per peer TaskManager, multiplexing every channel
// between the two (in both directions) on it. Of two TaskManagers the one with the smaller id dials and the
// other accepts, so a pair never opens two connections. One I/O thread (epoll) reads and writes every
// connection: it writes the senders' queued buffers against the receivers' credit and reads incoming
// buffers straight into the receivers' pooled buffers. Task threads only touch lock-free rings and post
// work to it.
//
// Lifecycle: start() -> channels created and released while running -> destructor closes every connection
// (their channels fail) and joins the I/O thread. The NetworkBufferPools passed in must outlive the
// manager and its channels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/net/floating_buffer_pool.h"
#include "sluice/net/remote_channel.h"

namespace sluice::net {

/// A TCP endpoint. `host` is a numeric IPv4 address.
struct Endpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  /// "127.0.0.1:6121".
  std::string to_string() const;
};

/// Where a peer TaskManager's data plane listens (Flink's TaskManagerLocation + ConnectionID).
struct TaskManagerLocation {
  std::string id;  ///< unique per TaskManager (<= 255 bytes); ids order who dials
  Endpoint endpoint;
};

class ConnectionManager {
 public:
  struct Options {
    std::string id;  ///< this TaskManager's id
    Endpoint bind;   ///< port 0: any free port (see endpoint())
    const Clock* clock = &SystemClock::instance();
    /// Longest time (ms, on `clock`) to establish a connection (dial + hello) before its channels fail.
    int64_t connect_timeout_ms = 10'000;
  };

  /// Binds and starts the I/O thread. Fails (kNetwork) when the endpoint cannot be bound.
  static Result<std::unique_ptr<ConnectionManager>> start(Options options);
  ~ConnectionManager();
  ConnectionManager(const ConnectionManager&) = delete;
  ConnectionManager& operator=(const ConnectionManager&) = delete;

  /// The bound endpoint (with the port chosen for port 0).
  Endpoint endpoint() const;
  const std::string& id() const;

  /// Registers the producer's end of channel `id` towards `consumer`, with `buffers` buffers of `pool` of
  /// its own (filled by the task, queued until credit arrives). Thread-safe. Fails on a duplicate id, a
  /// consumer with this manager's id, or an exhausted pool.
  Result<std::unique_ptr<RemoteChannelSender>> create_output_channel(const TaskManagerLocation& consumer,
                                                                     const ChannelId& id, NetworkBufferPool& pool,
                                                                     size_t buffers);
  /// Registers the consumer's end of channel `id` from `producer`, with `exclusive` buffers of `pool`
  /// (announced as credit at once) and the gate's `floating` buffers (nullable). Thread-safe.
  Result<std::unique_ptr<RemoteInputChannel>> create_input_channel(const TaskManagerLocation& producer,
                                                                   const ChannelId& id, NetworkBufferPool& pool,
                                                                   size_t exclusive,
                                                                   std::shared_ptr<FloatingBufferPool> floating);

  struct Stats {
    int64_t connections_opened = 0;  ///< handshakes completed (dialed + accepted)
    int64_t connections_failed = 0;
    int64_t open_connections = 0;
    /// accept() calls that failed for want of a descriptor or memory (the listener then rests 200 ms).
    int64_t accept_failures = 0;
    /// Passes of the I/O thread's loop: one per batch of socket events, and one per 50 ms when idle.
    int64_t io_loop_passes = 0;
  };
  /// Thread-safe.
  Stats stats() const;

  /// Test hook: aborts the connection to `peer_id` with a TCP reset (SO_LINGER 0), as a crashed peer would.
  /// Returns false when there is none.
  bool reset_connection_for_test(const std::string& peer_id);

  class Impl;

 private:
  explicit ConnectionManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::net
