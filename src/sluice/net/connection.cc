#include "sluice/net/connection.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "sluice/net/channel_state.h"

namespace sluice::net::detail {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian; add byte swaps");

void put_u16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}
void put_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
uint16_t get_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

constexpr size_t kMaxIov = 64;
constexpr size_t kDiscardChunk = 64 * 1024;
// Reads per readiness event before the loop serves other connections.
constexpr int kMaxReadsPerEvent = 16;

}  // namespace

Waker::Waker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Waker::~Waker() {
  if (fd_ >= 0) ::close(fd_);
}

void Waker::wake() {
  if (!pending_.exchange(true, std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t r = ::write(fd_, &one, sizeof one);
    (void)r;  // EAGAIN only when the counter is saturated: the I/O thread is awake anyway
  }
}

void Waker::drained() {
  pending_.store(false, std::memory_order_seq_cst);
}

Connection::Connection(std::string self_id, TaskManagerLocation peer, bool dialer, int epoll_fd,
                       std::shared_ptr<Waker> waker, int64_t deadline_ns, std::atomic<int64_t>* opened)
    : self_id_(std::move(self_id)),
      peer_(std::move(peer)),
      dialer_(dialer),
      epoll_fd_(epoll_fd),
      waker_(std::move(waker)),
      deadline_ns_(deadline_ns),
      opened_(opened),
      state_(dialer ? State::kDialing : State::kAwaiting) {
  discard_.resize(kDiscardChunk);
  iov_.reserve(kMaxIov);
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Connection::describe() const {
  std::lock_guard lock(mu_);
  std::string where = peer_.endpoint.port != 0 ? peer_.endpoint.to_string() : remote_address_;
  if (where.empty()) where = "an unknown address";
  return fmt::format("TaskManager '{}' at {}", peer_.id, where);
}

Error Connection::peer_error(const std::string& what) const {
  return Error(ErrorCode::kNetwork, fmt::format("connection to {}: {}", describe(), what));
}

// ---------------------------------------------------------------------------------------------------------
// Any thread.

Status Connection::add_output(const std::shared_ptr<OutputChannelState>& ch) {
  std::lock_guard lock(mu_);
  if (failure_) return *failure_;
  if (outputs_.count(ch->id) != 0) {
    return Error(ErrorCode::kNetwork, fmt::format("output channel {} to TaskManager '{}' is registered twice",
                                                  ch->id.to_string(), peer_.id));
  }
  outputs_[ch->id] = ch;
  auto it = early_credit_.find(ch->id);
  if (it != early_credit_.end()) {
    ch->early_credit.fetch_add(it->second);
    ch->credit_received.fetch_add(it->second);
    early_credit_.erase(it);
  }
  return ok_status();
}

Status Connection::add_input(const std::shared_ptr<InputChannelState>& ch) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
    if (inputs_.count(ch->id) != 0) {
      return Error(ErrorCode::kNetwork, fmt::format("input channel {} from TaskManager '{}' is registered twice",
                                                    ch->id.to_string(), peer_.id));
    }
    inputs_[ch->id] = ch;
    posted_credit_.push_back(ch);  // the exclusive buffers: the initial credit
  }
  waker_->wake();
  return ok_status();
}

void Connection::schedule_output(std::shared_ptr<OutputChannelState> ch) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return;
    posted_outputs_.push_back(std::move(ch));
  }
  waker_->wake();
}

void Connection::schedule_credit(std::shared_ptr<InputChannelState> ch) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return;
    posted_credit_.push_back(std::move(ch));
  }
  waker_->wake();
}

void Connection::release_input(const ChannelId& id) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return;
    inputs_.erase(id);
    posted_cancels_.push_back(id);
  }
  waker_->wake();
}

// ---------------------------------------------------------------------------------------------------------
// I/O thread: connection setup.

void Connection::start_dial() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(peer_.endpoint.port);
  if (::inet_pton(AF_INET, peer_.endpoint.host.c_str(), &addr.sin_addr) != 1) {
    fail(peer_error(fmt::format("'{}' is not a numeric IPv4 address", peer_.endpoint.host)));
    return;
  }
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    fail(peer_error("socket() failed: " + errno_text(errno)));
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLOUT | EPOLLIN;
  ev.data.fd = fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd_, &ev);
  want_write_ = true;
  int r = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (r == 0) {
    on_connected();
  } else if (errno != EINPROGRESS) {
    fail(peer_error("connect failed: " + errno_text(errno)));
  }
}

void Connection::on_connected() {
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    fail(peer_error("connect failed: " + errno_text(err)));
    return;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  send_hello();
  state_ = State::kHelloSent;
  write_out();
}

void Connection::adopt(int fd, const std::string& remote_address) {
  fd_ = fd;
  {
    std::lock_guard lock(mu_);
    remote_address_ = remote_address;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd_, &ev);
  want_write_ = false;
  send_hello();
  open();
  write_out();
}

void Connection::send_hello() {
  OutFrame f;
  f.header[0] = static_cast<uint8_t>(FrameType::kHello);
  put_u32(&f.header[1], kMagic);
  put_u16(&f.header[5], kWireVersion);
  put_u16(&f.header[7], static_cast<uint16_t>(self_id_.size()));
  f.header_len = kHelloFixedSize;
  f.extra = self_id_;
  out_.push_back(std::move(f));
}

void Connection::open() {
  state_ = State::kOpen;
  opened_->fetch_add(1);
}

bool Connection::handle_hello(const uint8_t* p, size_t n) {
  if (!dialer_ || state_ != State::kHelloSent) {
    protocol_error("a second hello");
    return false;
  }
  uint32_t magic = get_u32(p + 1);
  uint16_t version = get_u16(p + 5);
  if (magic != kMagic) {
    protocol_error("the peer is not a Sluice data plane (bad magic)");
    return false;
  }
  if (version != kWireVersion) {
    fail(
        peer_error(fmt::format("the peer speaks data-plane wire version {}, this TaskManager version {}; run the "
                               "same Sluice version on every TaskManager",
                               version, kWireVersion)));
    return false;
  }
  std::string id(reinterpret_cast<const char*>(p + kHelloFixedSize), n - kHelloFixedSize);
  if (id != peer_.id) {
    fail(peer_error(fmt::format("TaskManager '{}' answered instead", id)));
    return false;
  }
  open();
  return true;
}

void Connection::check_deadline(int64_t now_ns) {
  if (state_ == State::kOpen || state_ == State::kFailed) return;
  if (now_ns < deadline_ns_) return;
  fail(peer_error(state_ == State::kAwaiting ? "the peer did not connect within the connect timeout"
                                             : "not established within the connect timeout"));
}

void Connection::reset(const std::string& why) {
  if (fd_ >= 0) {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  fail(peer_error(why));
}

void Connection::fail(const Error& error) {
  if (state_ == State::kFailed) return;
  state_ = State::kFailed;
  if (fd_ >= 0) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
    ::close(fd_);
    fd_ = -1;
  }
  std::unordered_map<ChannelId, std::shared_ptr<OutputChannelState>, ChannelIdHash> outputs;
  std::unordered_map<ChannelId, std::shared_ptr<InputChannelState>, ChannelIdHash> inputs;
  {
    std::lock_guard lock(mu_);
    failure_ = error;
    outputs.swap(outputs_);
    inputs.swap(inputs_);
    posted_outputs_.clear();
    posted_credit_.clear();
    posted_cancels_.clear();
    early_credit_.clear();
  }
  for (auto& f : out_) {
    if (f.buffer != nullptr) f.owner->on_written(f.buffer);
  }
  out_.clear();
  out_offset_ = 0;
  if (in_body_ && body_buffer_ != nullptr) body_channel_->return_credited(body_buffer_);
  in_body_ = false;
  body_buffer_ = nullptr;
  body_channel_.reset();
  for (auto& ch : active_) {
    ch->active = false;
    outputs.emplace(ch->id, ch);
  }
  active_.clear();
  for (auto& [id, ch] : outputs)
    ch->fail(error);
  for (auto& [id, ch] : inputs)
    ch->fail(error);
}

void Connection::protocol_error(const std::string& what) {
  fail(peer_error("protocol error: " + what));
}

// ---------------------------------------------------------------------------------------------------------
// I/O thread: reading.

void Connection::on_event(uint32_t events) {
  if (state_ == State::kFailed) return;
  if (state_ == State::kDialing) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0) on_connected();
    return;
  }
  if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) on_readable();
  if (state_ != State::kFailed && (events & EPOLLOUT) != 0) write_out();
}

void Connection::on_readable() {
  for (int i = 0; i < kMaxReadsPerEvent && state_ != State::kFailed; ++i) {
    if (staged_begin_ == staged_end_) staged_begin_ = staged_end_ = 0;
    if (staged_begin_ > 0 && staged_end_ == kStagingSize) {
      std::memmove(staging_.data(), staging_.data() + staged_begin_, staged_end_ - staged_begin_);
      staged_end_ -= staged_begin_;
      staged_begin_ = 0;
    }
    ssize_t n;
    size_t body_len = 0;
    if (in_body_) {
      const uint32_t left = body_size_ - body_got_;
      iovec iov[2];
      if (body_buffer_ != nullptr) {
        iov[0] = {body_buffer_->data + body_got_, left};
      } else {
        iov[0] = {discard_.data(), std::min<size_t>(left, discard_.size())};
      }
      body_len = iov[0].iov_len;
      iov[1] = {staging_.data() + staged_end_, kStagingSize - staged_end_};
      n = ::readv(fd_, iov, 2);
    } else {
      n = ::read(fd_, staging_.data() + staged_end_, kStagingSize - staged_end_);
    }
    if (n == 0) {
      fail(peer_error("closed by the peer"));
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      fail(peer_error("lost: " + errno_text(errno)));
      return;
    }
    size_t got = static_cast<size_t>(n);
    if (in_body_) {
      size_t take = std::min(got, body_len);
      body_got_ += static_cast<uint32_t>(take);
      staged_end_ += got - take;
      if (body_got_ == body_size_) finish_body();
    } else {
      staged_end_ += got;
    }
    if (!parse_staged()) return;
  }
}

bool Connection::parse_staged() {
  while (!in_body_ && staged_end_ > staged_begin_) {
    const uint8_t* p = staging_.data() + staged_begin_;
    const size_t avail = staged_end_ - staged_begin_;
    const auto type = static_cast<FrameType>(p[0]);
    if (type != FrameType::kHello && state_ != State::kOpen) {
      protocol_error("a frame before the hello");
      return false;
    }
    switch (type) {
      case FrameType::kHello: {
        if (avail < kHelloFixedSize) return true;
        size_t n = kHelloFixedSize + get_u16(p + 7);
        if (n - kHelloFixedSize > kMaxPeerIdSize) {
          protocol_error("a hello with an id above 255 bytes");
          return false;
        }
        if (avail < n) return true;
        if (!handle_hello(p, n)) return false;
        staged_begin_ += n;
        break;
      }
      case FrameType::kBuffer: {
        if (avail < kBufferHeaderSize) return true;
        ChannelId id = decode_channel_id(p + 1);
        uint32_t backlog = get_u32(p + 1 + kChannelIdSize);
        uint32_t size = get_u32(p + 5 + kChannelIdSize);
        staged_begin_ += kBufferHeaderSize;
        begin_buffer(id, backlog, size);
        break;
      }
      case FrameType::kCredit: {
        if (avail < kCreditFrameSize) return true;
        ChannelId id = decode_channel_id(p + 1);
        uint32_t credit = get_u32(p + 1 + kChannelIdSize);
        staged_begin_ += kCreditFrameSize;
        on_credit(id, credit);
        break;
      }
      case FrameType::kCancel: {
        if (avail < kCancelFrameSize) return true;
        ChannelId id = decode_channel_id(p + 1);
        staged_begin_ += kCancelFrameSize;
        on_cancel(id);
        break;
      }
      case FrameType::kBacklog: {
        if (avail < kBacklogFrameSize) return true;
        ChannelId id = decode_channel_id(p + 1);
        uint32_t backlog = get_u32(p + 1 + kChannelIdSize);
        staged_begin_ += kBacklogFrameSize;
        on_backlog(id, backlog);
        break;
      }
      case FrameType::kChannelError: {
        if (avail < kChannelErrorFixedSize) return true;
        size_t len = get_u16(p + 1 + kChannelIdSize);
        if (len > kMaxErrorMessageSize) {
          protocol_error("a channel error message above 1024 bytes");
          return false;
        }
        if (avail < kChannelErrorFixedSize + len) return true;
        ChannelId id = decode_channel_id(p + 1);
        std::string message(reinterpret_cast<const char*>(p + kChannelErrorFixedSize), len);
        staged_begin_ += kChannelErrorFixedSize + len;
        on_channel_error(id, std::move(message));
        break;
      }
      default:
        protocol_error(fmt::format("unknown frame type {}", static_cast<int>(p[0])));
        return false;
    }
    if (state_ == State::kFailed) return false;
  }
  return true;
}

void Connection::begin_buffer(const ChannelId& id, uint32_t backlog, uint32_t size) {
  std::shared_ptr<InputChannelState> ch;
  {
    std::lock_guard lock(mu_);
    auto it = inputs_.find(id);
    if (it != inputs_.end()) ch = it->second;
  }
  NetworkBuffer* b = nullptr;
  if (ch == nullptr) {
    // Never registered, or released (the consumer of a stale attempt): the sender learns it and fails.
    send_channel_error(id, fmt::format("TaskManager '{}' has no input channel {} (never registered or already "
                                       "released: a stale attempt?)",
                                       self_id_, id.to_string()));
  } else {
    b = ch->take_credited();
    if (b == nullptr) {
      protocol_error(fmt::format("a buffer on channel {} without credit", id.to_string()));
      return;
    }
    if (size > b->capacity) {
      ch->return_credited(b);
      protocol_error(fmt::format("a buffer of {} bytes on channel {}, above the segment size of {} bytes", size,
                                 id.to_string(), b->capacity));
      return;
    }
  }
  body_channel_ = std::move(ch);
  body_buffer_ = b;
  body_size_ = size;
  body_got_ = 0;
  body_backlog_ = backlog;
  in_body_ = true;
  // The part of the body already staged (at most the staging area) is copied; the rest is read in place.
  size_t n = std::min<size_t>(size, staged_end_ - staged_begin_);
  if (b != nullptr) std::memcpy(b->data, staging_.data() + staged_begin_, n);
  staged_begin_ += n;
  body_got_ = static_cast<uint32_t>(n);
  if (body_got_ == body_size_) finish_body();
}

void Connection::finish_body() {
  in_body_ = false;
  if (body_buffer_ != nullptr) {
    body_buffer_->size = body_size_;
    body_channel_->on_received(body_buffer_, body_backlog_);
  }
  body_buffer_ = nullptr;
  body_channel_.reset();
}

void Connection::on_credit(const ChannelId& id, uint32_t credit) {
  std::shared_ptr<OutputChannelState> ch;
  {
    std::lock_guard lock(mu_);
    auto it = outputs_.find(id);
    if (it == outputs_.end()) {
      // The consumer registered before the producer (deployment order is free): kept until it registers,
      // dropped when the consumer cancels.
      early_credit_[id] += credit;
      return;
    }
    ch = it->second;
  }
  ch->credit_received.fetch_add(credit);
  ch->credit += credit;
  if (!ch->active && ch->scheduled.load()) activate(ch);
}

void Connection::on_cancel(const ChannelId& id) {
  std::shared_ptr<OutputChannelState> ch;
  {
    std::lock_guard lock(mu_);
    early_credit_.erase(id);
    auto it = outputs_.find(id);
    if (it != outputs_.end()) {
      ch = it->second;
      outputs_.erase(it);
    }
  }
  if (ch != nullptr && !ch->released.load()) {
    ch->fail(Error(ErrorCode::kNetwork,
                   fmt::format("the consumer of channel {} on {} released it", id.to_string(), describe())));
  }
}

void Connection::on_backlog(const ChannelId& id, uint32_t backlog) {
  std::shared_ptr<InputChannelState> ch;
  {
    std::lock_guard lock(mu_);
    auto it = inputs_.find(id);
    if (it == inputs_.end()) return;  // released meanwhile: the sender learns it from the cancel
    ch = it->second;
  }
  ch->on_backlog(backlog);
}

void Connection::on_channel_error(const ChannelId& id, std::string message) {
  std::shared_ptr<OutputChannelState> out;
  std::shared_ptr<InputChannelState> in;
  {
    std::lock_guard lock(mu_);
    if (auto it = outputs_.find(id); it != outputs_.end()) {
      out = it->second;
      outputs_.erase(it);
    }
    if (auto it = inputs_.find(id); it != inputs_.end()) {
      in = it->second;
      inputs_.erase(it);
    }
  }
  Error e(ErrorCode::kNetwork, fmt::format("channel {} failed at {}: {}", id.to_string(), describe(), message));
  if (out != nullptr) out->fail(e);
  if (in != nullptr) in->fail(e);
}

void Connection::send_channel_error(const ChannelId& id, const std::string& message) {
  OutFrame f;
  f.header[0] = static_cast<uint8_t>(FrameType::kChannelError);
  encode_channel_id(&f.header[1], id);
  f.extra = message.substr(0, kMaxErrorMessageSize);
  put_u16(&f.header[1 + kChannelIdSize], static_cast<uint16_t>(f.extra.size()));
  f.header_len = kChannelErrorFixedSize;
  out_.push_back(std::move(f));
}

// ---------------------------------------------------------------------------------------------------------
// I/O thread: writing.

void Connection::activate(const std::shared_ptr<OutputChannelState>& ch) {
  ch->active = true;
  active_.push_back(ch);
}

void Connection::pump() {
  if (state_ != State::kOpen) return;
  std::vector<std::shared_ptr<OutputChannelState>> outs;
  std::vector<std::shared_ptr<InputChannelState>> credits;
  std::vector<ChannelId> cancels;
  {
    std::lock_guard lock(mu_);
    outs.swap(posted_outputs_);
    credits.swap(posted_credit_);
    cancels.swap(posted_cancels_);
  }
  for (auto& ch : outs) {
    if (!ch->active) activate(ch);
  }
  for (auto& ch : credits) {
    uint32_t n = ch->take_unannounced();
    if (n == 0) continue;
    OutFrame f;
    f.header[0] = static_cast<uint8_t>(FrameType::kCredit);
    encode_channel_id(&f.header[1], ch->id);
    put_u32(&f.header[1 + kChannelIdSize], n);
    f.header_len = kCreditFrameSize;
    out_.push_back(std::move(f));
  }
  for (const auto& id : cancels) {
    OutFrame f;
    f.header[0] = static_cast<uint8_t>(FrameType::kCancel);
    encode_channel_id(&f.header[1], id);
    f.header_len = kCancelFrameSize;
    out_.push_back(std::move(f));
  }
  // Serve the active senders against their credit.
  for (size_t i = 0; i < active_.size();) {
    // Every channel leaves the active list here: drained (flag cleared), or waiting for credit (the flag stays
    // set and the next credit frame activates it again).
    OutputChannelState& ch = *active_[i];
    if (ch.failure.failed()) {
      while (NetworkBuffer* b = ch.queue.pop()) {
        ch.queued.fetch_sub(1);
        ch.on_written(b);
      }
    } else {
      for (;;) {
        ch.credit += ch.early_credit.exchange(0);
        while (ch.credit > 0) {
          NetworkBuffer* b = ch.queue.pop();
          if (b == nullptr) break;
          int64_t backlog = ch.queued.fetch_sub(1) - 1;
          --ch.credit;
          ch.buffers_sent.fetch_add(1);
          OutFrame f;
          f.header[0] = static_cast<uint8_t>(FrameType::kBuffer);
          encode_channel_id(&f.header[1], ch.id);
          put_u32(&f.header[1 + kChannelIdSize], static_cast<uint32_t>(std::max<int64_t>(backlog, 0)));
          put_u32(&f.header[5 + kChannelIdSize], b->size);
          f.header_len = kBufferHeaderSize;
          f.buffer = b;
          f.owner = active_[i];
          out_.push_back(std::move(f));
        }
        if (const int64_t backlog = ch.queued.load(); backlog > 0) {
          // Waiting for credit (a credit frame activates it again). Tell the receiver the backlog once per
          // stall, so it can add floating buffers: no buffer frame carries it while there is no credit.
          if (backlog != ch.announced_backlog) {
            ch.announced_backlog = backlog;
            OutFrame f;
            f.header[0] = static_cast<uint8_t>(FrameType::kBacklog);
            encode_channel_id(&f.header[1], ch.id);
            put_u32(&f.header[1 + kChannelIdSize], static_cast<uint32_t>(backlog));
            f.header_len = kBacklogFrameSize;
            out_.push_back(std::move(f));
          }
          break;
        }
        ch.announced_backlog = 0;
        // Drained: clear the flag, then look once more so a buffer queued in between is not stranded.
        ch.scheduled.store(false);
        if (ch.queued.load() > 0 && !ch.scheduled.exchange(true)) continue;
        break;
      }
    }
    ch.active = false;
    if (ch.released.load() && ch.queued.load() == 0) {
      std::lock_guard lock(mu_);
      auto it = outputs_.find(ch.id);
      if (it != outputs_.end() && it->second.get() == &ch) outputs_.erase(it);
    }
    active_[i] = std::move(active_.back());
    active_.pop_back();
  }
  write_out();
}

void Connection::write_out() {
  if (fd_ < 0 || state_ == State::kDialing) return;
  while (!out_.empty()) {
    iov_.clear();
    size_t skip = out_offset_;
    for (size_t k = 0; k < out_.size() && iov_.size() + 3 <= kMaxIov; ++k) {
      OutFrame& f = out_[k];
      auto add = [&](const void* data, size_t len) {
        if (skip >= len) {
          skip -= len;
          return;
        }
        iov_.push_back({const_cast<uint8_t*>(static_cast<const uint8_t*>(data)) + skip, len - skip});
        skip = 0;
      };
      add(f.header.data(), f.header_len);
      if (!f.extra.empty()) add(f.extra.data(), f.extra.size());
      if (f.buffer != nullptr && f.buffer->size > 0) add(f.buffer->data, f.buffer->size);
    }
    msghdr msg{};
    msg.msg_iov = iov_.data();
    msg.msg_iovlen = iov_.size();
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      fail(peer_error("lost: " + errno_text(errno)));
      return;
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && !out_.empty()) {
      OutFrame& f = out_.front();
      size_t rem = f.total() - out_offset_;
      if (left < rem) {
        out_offset_ += left;
        left = 0;
        break;
      }
      left -= rem;
      out_offset_ = 0;
      if (f.buffer != nullptr) f.owner->on_written(f.buffer);
      out_.pop_front();
    }
  }
  update_interest();
}

void Connection::update_interest() {
  if (fd_ < 0) return;
  bool want = !out_.empty();
  if (want == want_write_) return;
  want_write_ = want;
  epoll_event ev{};
  ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  ev.data.fd = fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
}

}  // namespace sluice::net::detail
