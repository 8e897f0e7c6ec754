#include "sluice/net/connection_manager.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "sluice/core/assign_or_return.h"
#include "sluice/net/channel_state.h"
#include "sluice/net/connection.h"

namespace sluice::net {

using detail::Connection;

std::string Endpoint::to_string() const {
  return fmt::format("{}:{}", host, port);
}

namespace {

constexpr int kEpollTimeoutMs = 50;  // deadlines (connect timeout) are checked at least this often
// How long the listening socket is left unwatched after accept() failed for want of a descriptor or memory.
constexpr int64_t kAcceptPauseNs = 200'000'000;
constexpr int64_t kAcceptWarningEveryNs = 10'000'000'000;  // while accepts keep failing, one warning per 10 s

std::string address_of(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return fmt::format("{}:{}", buf, ntohs(a.sin_port));
}

}  // namespace

class ConnectionManager::Impl {
 public:
  explicit Impl(Options o) : opts_(std::move(o)), waker_(std::make_shared<detail::Waker>()) {}

  ~Impl() {
    stopping_.store(true);
    waker_->wake();
    if (thread_.joinable()) thread_.join();
    for (auto& [fd, p] : accepting_)
      ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  Status start() {
    if (opts_.id.empty() || opts_.id.size() > kMaxPeerIdSize) {
      return Error(ErrorCode::kConfiguration, "a data-plane TaskManager id must have 1 to 255 bytes");
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(opts_.bind.port);
    if (::inet_pton(AF_INET, opts_.bind.host.c_str(), &addr.sin_addr) != 1) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("data-plane bind address '{}' is not a numeric IPv4 address", opts_.bind.host));
    }
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0) {
      return Error(ErrorCode::kNetwork,
                   fmt::format("cannot listen on {} for the data plane: {}", opts_.bind.to_string(), strerror(errno)));
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    bound_ = Endpoint{opts_.bind.host, ntohs(addr.sin_port)};
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.fd = waker_->fd();
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, waker_->fd(), &ev);
    thread_ = std::thread([this] { run(); });
    return ok_status();
  }

  /// The connection to `peer` (created, and dialed by the I/O thread, when there is none).
  Result<std::shared_ptr<Connection>> connection_to(const TaskManagerLocation& peer) {
    if (peer.id == opts_.id) {
      return Error(ErrorCode::kConfiguration,
                   fmt::format("a remote channel to TaskManager '{}' from itself; use a LocalChannel", peer.id));
    }
    if (peer.id.empty() || peer.id.size() > kMaxPeerIdSize) {
      return Error(ErrorCode::kConfiguration, "a data-plane TaskManager id must have 1 to 255 bytes");
    }
    std::lock_guard lock(mu_);
    if (stopping_.load()) return Error(ErrorCode::kNetwork, "the data plane is shut down");
    auto it = conns_.find(peer.id);
    if (it != conns_.end()) return it->second;
    auto c = make_connection(peer);
    conns_[peer.id] = c;
    return c;
  }

  std::shared_ptr<Connection> make_connection(const TaskManagerLocation& peer) {
    auto c = std::make_shared<Connection>(opts_.id, peer, opts_.id < peer.id, epoll_fd_, waker_,
                                          opts_.clock->monotonic_ns() + opts_.connect_timeout_ms * 1'000'000,
                                          &opened_count_);
    new_conns_.push_back(c);
    waker_->wake();
    return c;
  }

  void run() {
    pthread_setname_np(pthread_self(), "sluice-net");
    epoll_event events[64];
    while (!stopping_.load()) {
      int n = ::epoll_wait(epoll_fd_, events, 64, kEpollTimeoutMs);
      loop_passes_.fetch_add(1, std::memory_order_relaxed);
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listen_fd_) {
          accept_all();
        } else if (fd == waker_->fd()) {
          uint64_t v;
          ssize_t r = ::read(fd, &v, sizeof v);
          (void)r;
          waker_->drained();
        } else if (auto a = accepting_.find(fd); a != accepting_.end()) {
          read_hello(fd);
        } else if (auto c = by_fd_.find(fd); c != by_fd_.end()) {
          c->second->on_event(events[i].events);
        }
      }
      take_new_connections();
      const int64_t now = opts_.clock->monotonic_ns();
      if (accept_paused_until_ns_ != 0 && os_now_ns() >= accept_paused_until_ns_) watch_listener(true);
      for (auto& c : live_) {
        c->pump();
        c->check_deadline(now);
        if (c->fd() >= 0) by_fd_[c->fd()] = c;
      }
      for (auto it = accepting_.begin(); it != accepting_.end();) {
        if (now > it->second.deadline_ns) {
          spdlog::warn("data plane: {} sent no hello within the connect timeout; closed", it->second.remote);
          ::close(it->first);
          it = accepting_.erase(it);
        } else {
          ++it;
        }
      }
      remove_failed();
    }
    // Shutdown: every connection fails, so no channel waits forever.
    take_new_connections();
    for (auto& c : live_)
      c->fail(Error(ErrorCode::kNetwork, fmt::format("the data plane of TaskManager '{}' shut down", opts_.id)));
    remove_failed();
  }

  void take_new_connections() {
    std::vector<std::shared_ptr<Connection>> fresh;
    std::vector<std::string> resets;
    {
      std::lock_guard lock(mu_);
      fresh.swap(new_conns_);
      resets.swap(resets_);
    }
    for (auto& c : fresh) {
      live_.push_back(c);
      if (c->dialer()) c->start_dial();
      if (c->fd() >= 0) by_fd_[c->fd()] = c;
    }
    for (const auto& peer : resets) {
      for (auto& c : live_) {
        if (c->peer_id() == peer) c->reset("reset by this TaskManager (test hook)");
      }
    }
  }

  void remove_failed() {
    for (size_t i = 0; i < live_.size();) {
      auto& c = live_[i];
      if (c->state() != Connection::State::kFailed) {
        ++i;
        continue;
      }
      failed_count_.fetch_add(1);
      for (auto it = by_fd_.begin(); it != by_fd_.end();) {
        it = it->second == c ? by_fd_.erase(it) : std::next(it);
      }
      {
        std::lock_guard lock(mu_);
        auto it = conns_.find(c->peer_id());
        if (it != conns_.end() && it->second == c) conns_.erase(it);
      }
      live_[i] = std::move(live_.back());
      live_.pop_back();
    }
    int64_t open = 0;
    for (auto& c : live_)
      open += c->state() == Connection::State::kOpen ? 1 : 0;
    open_count_.store(open);
  }

  void accept_all() {
    for (;;) {
      sockaddr_in a{};
      socklen_t len = sizeof a;
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        // Out of descriptors or memory: the connection stays in the backlog and the level-triggered listener
        // stays ready, so watching it would wake this thread at once, again and again. It is left unwatched for a
        // while, and the peer's dial waits (up to its connect timeout).
        if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT ||
            err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP || err == ENETUNREACH ||
            err == EPERM) {
          // A connection that failed on its way in (accept(2) says to retry these): it has left the backlog, the
          // next one may be fine.
          continue;
        }
        if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;  // not expected here
        const int64_t failures = accept_failures_.fetch_add(1, std::memory_order_relaxed) + 1;
        const int64_t now = os_now_ns();
        if (last_accept_warning_ns_ == 0 || now - last_accept_warning_ns_ >= kAcceptWarningEveryNs) {
          last_accept_warning_ns_ = now;
          spdlog::warn(
              "data plane of TaskManager '{}': cannot accept a connection: {}; retrying every {} ms ({} "
              "failed accepts so far)",
              opts_.id, strerror(err), kAcceptPauseNs / 1'000'000, failures);
        }
        watch_listener(false);
        return;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      accepting_[fd] = Accepting{{}, address_of(a), opts_.clock->monotonic_ns() + opts_.connect_timeout_ms * 1'000'000};
    }
  }

  // Watches the listening socket again, or stops watching it for kAcceptPauseNs.
  void watch_listener(bool on) {
    epoll_event ev{};
    ev.events = on ? static_cast<uint32_t>(EPOLLIN) : 0U;
    ev.data.fd = listen_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_until_ns_ = on ? 0 : os_now_ns() + kAcceptPauseNs;
  }

  // The accept() back-off waits for the operating system (descriptors freed), not for anything a test's injected
  // clock stands for: a ManualClock that is never advanced would leave the listener unwatched for good.
  static int64_t os_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Reads exactly the dialer's hello: the dialer sends nothing else before this side's answer.
  void read_hello(int fd) {
    Accepting& a = accepting_[fd];
    auto drop = [&](const std::string& why) {
      spdlog::warn("data plane: refused a connection from {}: {}", a.remote, why);
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      ::close(fd);
      accepting_.erase(fd);
    };
    for (;;) {
      size_t want = kHelloFixedSize;
      if (a.buf.size() >= kHelloFixedSize) {
        uint16_t id_len;
        std::memcpy(&id_len, a.buf.data() + 7, 2);
        want += id_len;
      }
      if (a.buf.size() == want && want > kHelloFixedSize) break;
      uint8_t tmp[kHelloFixedSize + kMaxPeerIdSize];
      ssize_t r = ::read(fd, tmp, want - a.buf.size());
      if (r == 0) return drop("closed before its hello");
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        return drop(strerror(errno));
      }
      a.buf.insert(a.buf.end(), tmp, tmp + r);
      if (a.buf.size() == kHelloFixedSize) {
        uint32_t magic;
        std::memcpy(&magic, a.buf.data() + 1, 4);
        uint16_t id_len;
        std::memcpy(&id_len, a.buf.data() + 7, 2);
        if (a.buf[0] != static_cast<uint8_t>(FrameType::kHello) || magic != kMagic) {
          return drop("not a Sluice data-plane hello");
        }
        if (id_len == 0 || id_len > kMaxPeerIdSize) return drop("a hello with a bad id length");
      }
    }
    uint16_t version;
    std::memcpy(&version, a.buf.data() + 5, 2);
    std::string peer_id(reinterpret_cast<const char*>(a.buf.data() + kHelloFixedSize), a.buf.size() - kHelloFixedSize);
    std::string remote = a.remote;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    accepting_.erase(fd);
    std::shared_ptr<Connection> c;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(peer_id);
      if (it != conns_.end() && it->second->state() == Connection::State::kAwaiting && it->second->fd() < 0) {
        c = it->second;
      } else {
        std::shared_ptr<Connection> old = it != conns_.end() ? it->second : nullptr;
        TaskManagerLocation loc{peer_id, Endpoint{"", 0}};
        c = std::make_shared<Connection>(opts_.id, loc, false, epoll_fd_, waker_,
                                         opts_.clock->monotonic_ns() + opts_.connect_timeout_ms * 1'000'000,
                                         &opened_count_);
        conns_[peer_id] = c;
        new_conns_.push_back(c);
        if (old != nullptr) stale_.push_back(old);
      }
    }
    // A peer that dials again while an older connection looks open (it restarted, and this side has not seen
    // the reset yet): the older connection is stale.
    for (auto& old : stale_)
      old->fail(Error(ErrorCode::kNetwork,
                      fmt::format("TaskManager '{}' connected again from {}: the older connection is stale",
                                  old->peer_id(), remote)));
    stale_.clear();
    take_new_connections();
    c->adopt(fd, remote);
    by_fd_[fd] = c;
    if (version != kWireVersion) {
      c->fail(Error(ErrorCode::kNetwork,
                    fmt::format("TaskManager '{}' at {} speaks data-plane wire version {}, this TaskManager "
                                "version {}; run the same Sluice version on every TaskManager",
                                peer_id, remote, version, kWireVersion)));
      return;
    }
  }

  struct Accepting {
    std::vector<uint8_t> buf;
    std::string remote;
    int64_t deadline_ns = 0;
  };

  Options opts_;
  std::shared_ptr<detail::Waker> waker_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  Endpoint bound_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> opened_count_{0};
  std::atomic<int64_t> failed_count_{0};
  std::atomic<int64_t> open_count_{0};
  std::atomic<int64_t> accept_failures_{0};
  std::atomic<int64_t> loop_passes_{0};

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Connection>> conns_;  // guarded by mu_
  std::vector<std::shared_ptr<Connection>> new_conns_;                  // guarded by mu_
  std::vector<std::string> resets_;                                     // guarded by mu_

  // I/O thread only.
  std::vector<std::shared_ptr<Connection>> live_;
  std::vector<std::shared_ptr<Connection>> stale_;
  std::unordered_map<int, std::shared_ptr<Connection>> by_fd_;
  std::unordered_map<int, Accepting> accepting_;
  int64_t accept_paused_until_ns_ = 0;  // while the listener is unwatched after a failed accept(); 0 = watched
  int64_t last_accept_warning_ns_ = 0;
};

// ---------------------------------------------------------------------------------------------------------

Result<std::unique_ptr<ConnectionManager>> ConnectionManager::start(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status s = impl->start();
  if (!s.ok()) return s.error();
  return std::unique_ptr<ConnectionManager>(new ConnectionManager(std::move(impl)));
}

ConnectionManager::ConnectionManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ConnectionManager::~ConnectionManager() = default;

Endpoint ConnectionManager::endpoint() const {
  return impl_->bound_;
}

const std::string& ConnectionManager::id() const {
  return impl_->opts_.id;
}

Result<std::unique_ptr<RemoteChannelSender>> ConnectionManager::create_output_channel(
    const TaskManagerLocation& consumer, const ChannelId& id, NetworkBufferPool& pool, size_t buffers) {
  if (buffers == 0) return Error(ErrorCode::kConfiguration, "an output channel needs at least one buffer");
  SLUICE_ASSIGN_OR_RETURN(auto conn, impl_->connection_to(consumer));
  SLUICE_ASSIGN_OR_RETURN(auto bufs, pool.allocate(buffers));
  auto state = std::make_shared<detail::OutputChannelState>(id, pool, std::move(bufs), conn);
  Status s = conn->add_output(state);
  if (!s.ok()) return s.error();
  return std::make_unique<RemoteChannelSender>(std::move(state));
}

Result<std::unique_ptr<RemoteInputChannel>> ConnectionManager::create_input_channel(
    const TaskManagerLocation& producer, const ChannelId& id, NetworkBufferPool& pool, size_t exclusive,
    std::shared_ptr<FloatingBufferPool> floating) {
  if (exclusive == 0 && floating == nullptr) {
    return Error(ErrorCode::kConfiguration, "an input channel needs exclusive or floating buffers");
  }
  SLUICE_ASSIGN_OR_RETURN(auto conn, impl_->connection_to(producer));
  SLUICE_ASSIGN_OR_RETURN(auto bufs, pool.allocate(exclusive));
  auto state = std::make_shared<detail::InputChannelState>(id, pool, std::move(bufs), std::move(floating), conn);
  Status s = conn->add_input(state);
  if (!s.ok()) return s.error();
  return std::make_unique<RemoteInputChannel>(std::move(state));
}

ConnectionManager::Stats ConnectionManager::stats() const {
  Stats s;
  s.connections_opened = impl_->opened_count_.load();
  s.connections_failed = impl_->failed_count_.load();
  s.open_connections = impl_->open_count_.load();
  s.accept_failures = impl_->accept_failures_.load();
  s.io_loop_passes = impl_->loop_passes_.load();
  return s;
}

bool ConnectionManager::reset_connection_for_test(const std::string& peer_id) {
  {
    std::lock_guard lock(impl_->mu_);
    if (impl_->conns_.count(peer_id) == 0) return false;
    impl_->resets_.push_back(peer_id);
  }
  impl_->waker_->wake();
  return true;
}

}  // namespace sluice::net
