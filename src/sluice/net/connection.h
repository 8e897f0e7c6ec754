// Connection: the TCP connection to one peer TaskManager, multiplexing every channel between the two.
// Private to net/. Socket work runs on the ConnectionManager's I/O thread; task threads register channels
// and post work (buffers to send, credit to announce, released channels) under `mu_`.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/net/connection_manager.h"
#include "sluice/net/wire_format.h"

namespace sluice::net::detail {

struct OutputChannelState;
struct InputChannelState;

/// Wakes the I/O thread (an eventfd; one write per batch of posts). Thread-safe.
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  int fd() const { return fd_; }
  void wake();
  /// I/O thread: the eventfd was read; later posts must write it again.
  void drained();

 private:
  int fd_;
  std::atomic<bool> pending_{false};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { kDialing, kAwaiting, kHelloSent, kOpen, kFailed };

  /// `opened` counts handshakes completed (the manager's stats; touched on the I/O thread only while it runs).
  Connection(std::string self_id, TaskManagerLocation peer, bool dialer, int epoll_fd, std::shared_ptr<Waker> waker,
             int64_t deadline_ns, std::atomic<int64_t>* opened);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // --- any thread ---
  Status add_output(const std::shared_ptr<OutputChannelState>& ch);
  Status add_input(const std::shared_ptr<InputChannelState>& ch);
  void schedule_output(std::shared_ptr<OutputChannelState> ch);
  void schedule_credit(std::shared_ptr<InputChannelState> ch);
  void release_input(const ChannelId& id);
  const std::string& peer_id() const { return peer_.id; }
  /// "TaskManager 'tm-b' at 127.0.0.1:6121".
  std::string describe() const;
  bool dialer() const { return dialer_; }

  // --- I/O thread ---
  State state() const { return state_; }
  int fd() const { return fd_; }
  /// Starts a non-blocking connect to the peer.
  void start_dial();
  /// Takes an accepted socket whose hello was read; answers with this side's hello and opens.
  void adopt(int fd, const std::string& remote_address);
  /// Handles epoll events of fd().
  void on_event(uint32_t events);
  /// Takes posted work, turns it into frames and writes what the socket takes.
  void pump();
  /// Fails the connection when it is not open by its deadline.
  void check_deadline(int64_t now_ns);
  /// Closes the socket and fails every channel with `error` (naming the peer). Idempotent.
  void fail(const Error& error);
  /// Aborts with a TCP reset (SO_LINGER 0), as a crashed process would.
  void reset(const std::string& why);

 private:
  struct OutFrame {
    std::array<uint8_t, 32> header{};
    uint32_t header_len = 0;
    std::string extra;  // hello id, error message
    NetworkBuffer* buffer = nullptr;
    std::shared_ptr<OutputChannelState> owner;
    size_t total() const { return header_len + extra.size() + (buffer != nullptr ? buffer->size : 0); }
  };

  void on_connected();
  void send_hello();
  void open();
  void on_readable();
  /// Parses whole frames from the staging area; false when the connection failed.
  bool parse_staged();
  bool handle_hello(const uint8_t* p, size_t n);
  void begin_buffer(const ChannelId& id, uint32_t backlog, uint32_t size);
  void finish_body();
  void on_credit(const ChannelId& id, uint32_t credit);
  void on_cancel(const ChannelId& id);
  void on_backlog(const ChannelId& id, uint32_t backlog);
  void on_channel_error(const ChannelId& id, std::string message);
  void send_channel_error(const ChannelId& id, const std::string& message);
  void activate(const std::shared_ptr<OutputChannelState>& ch);
  void write_out();
  void update_interest();
  void protocol_error(const std::string& what);
  Error peer_error(const std::string& what) const;

  const std::string self_id_;
  TaskManagerLocation peer_;
  const bool dialer_;
  const int epoll_fd_;
  const std::shared_ptr<Waker> waker_;
  const int64_t deadline_ns_;
  std::atomic<int64_t>* const opened_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<ChannelId, std::shared_ptr<OutputChannelState>, ChannelIdHash> outputs_;
  std::unordered_map<ChannelId, std::shared_ptr<InputChannelState>, ChannelIdHash> inputs_;
  std::unordered_map<ChannelId, int64_t, ChannelIdHash> early_credit_;
  std::vector<std::shared_ptr<OutputChannelState>> posted_outputs_;
  std::vector<std::shared_ptr<InputChannelState>> posted_credit_;
  std::vector<ChannelId> posted_cancels_;
  std::optional<Error> failure_;
  std::string remote_address_;

  // I/O thread only.
  State state_;
  int fd_ = -1;
  bool want_write_ = false;
  std::vector<std::shared_ptr<OutputChannelState>> active_;
  std::deque<OutFrame> out_;
  size_t out_offset_ = 0;  // bytes of out_.front() already written
  std::vector<iovec> iov_;
  // Read side: frame headers and small frames are staged here; a buffer frame's body goes straight into
  // the receiver's pooled buffer (at most the staged tail of the body is copied).
  static constexpr size_t kStagingSize = 4096;
  std::array<uint8_t, kStagingSize> staging_{};
  size_t staged_begin_ = 0;
  size_t staged_end_ = 0;
  std::shared_ptr<InputChannelState> body_channel_;
  NetworkBuffer* body_buffer_ = nullptr;  // null with a body to discard (unknown channel)
  std::vector<uint8_t> discard_;
  uint32_t body_size_ = 0;
  uint32_t body_got_ = 0;
  uint32_t body_backlog_ = 0;
  bool in_body_ = false;
};

}  // namespace sluice::net::detail
