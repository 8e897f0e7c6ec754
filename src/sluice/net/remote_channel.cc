#include "sluice/net/remote_channel.h"

#include <fmt/format.h>

#include <algorithm>

#include "sluice/net/channel_state.h"
#include "sluice/net/connection.h"

namespace sluice::net {
namespace detail {

bool ChannelFailure::set(const Error& error) {
  std::lock_guard lock(mu_);
  if (error_) return false;
  error_ = error;
  failed_.store(true, std::memory_order_release);
  return true;
}

Error ChannelFailure::error() const {
  std::lock_guard lock(mu_);
  return error_ ? *error_ : Error(ErrorCode::kInternal, "channel has not failed");
}

// ---------------------------------------------------------------------------------------------------------

OutputChannelState::OutputChannelState(const ChannelId& id_, NetworkBufferPool& pool_,
                                       std::vector<NetworkBuffer*> buffers, std::shared_ptr<Connection> conn_)
    : id(id_),
      pool(pool_),
      owned(std::move(buffers)),
      free_ring(owned.size()),
      queue(owned.size()),
      conn(std::move(conn_)) {
  for (NetworkBuffer* b : owned)
    free_ring.push(b);
}

OutputChannelState::~OutputChannelState() {
  pool.release(owned);
}

void OutputChannelState::on_written(NetworkBuffer* b) {
  b->size = 0;
  // Released before the producer can see it in the ring: the other order let the producer take it again (and
  // count it in flight) first, so the pool counted owned + 1 buffers in flight for a moment (peak_in_flight 9 of
  // 8 in data_plane_test's bound checks: 4 of 200 TSan runs under load with batched wakeups, which make it likelier).
  pool.on_release();
  free_ring.push(b);
  wakeup.notify();
}

void OutputChannelState::fail(const Error& e) {
  if (failure.set(Error(e.code(), fmt::format("output channel {}: {}", id.to_string(), e.message())))) wakeup.notify();
}

// ---------------------------------------------------------------------------------------------------------

InputChannelState::InputChannelState(const ChannelId& id_, NetworkBufferPool& pool_,
                                     std::vector<NetworkBuffer*> exclusive_,
                                     std::shared_ptr<FloatingBufferPool> floating_, std::shared_ptr<Connection> conn_)
    : id(id_),
      pool(pool_),
      floating(std::move(floating_)),
      exclusive(std::move(exclusive_)),
      data(exclusive.size() + (floating != nullptr ? floating->size() : 0) + 1),
      conn(std::move(conn_)),
      free_(exclusive),
      unannounced_(static_cast<uint32_t>(exclusive.size())),
      credit_scheduled_(true) {}  // the connection announces the exclusive buffers when the channel is added

InputChannelState::~InputChannelState() {
  // Buffers received and never recycled still count as in flight in the pool.
  while (data.pop() != nullptr)
    pool.on_release();
  pool.release(exclusive);
  for (NetworkBuffer* b : floating_held_)
    floating->give_back(b);
}

bool InputChannelState::is_floating_locked(NetworkBuffer* b) const {
  return std::find(floating_held_.begin(), floating_held_.end(), b) != floating_held_.end();
}

void InputChannelState::schedule_credit_locked() {
  if (unannounced_ == 0 || credit_scheduled_ || released_) return;
  credit_scheduled_ = true;
  conn->schedule_credit(shared_from_this());
}

void InputChannelState::request_floating_locked() {
  if (floating == nullptr || released_) return;
  while (free_.size() < backlog_) {
    NetworkBuffer* b = floating->take(weak_from_this());
    if (b == nullptr) break;  // registered as a listener: offered the next one given back
    floating_held_.push_back(b);
    floating_count.store(static_cast<int64_t>(floating_held_.size()));
    free_.push_back(b);
    ++unannounced_;
  }
}

NetworkBuffer* InputChannelState::take_credited() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return nullptr;
  // Only announced credit may be used: a buffer whose credit is not sent yet is not the sender's to fill.
  if (free_.size() <= unannounced_) return nullptr;
  NetworkBuffer* b = free_.front();
  free_.erase(free_.begin());
  return b;
}

void InputChannelState::return_credited(NetworkBuffer* b) {
  std::lock_guard lock(mu_);
  free_.insert(free_.begin(), b);
}

void InputChannelState::on_received(NetworkBuffer* b, uint32_t backlog) {
  pool.on_acquire();
  int64_t r = received.fetch_add(1) + 1;
  (void)r;
  int64_t h = held.fetch_add(1) + 1;
  int64_t peak = peak_held.load();
  while (h > peak && !peak_held.compare_exchange_weak(peak, h)) {
  }
  data.push(b);
  {
    std::lock_guard lock(mu_);
    backlog_ = backlog;
    request_floating_locked();
    schedule_credit_locked();
  }
  wakeup.notify();
}

void InputChannelState::on_backlog(uint32_t backlog) {
  std::lock_guard lock(mu_);
  backlog_ = backlog;
  request_floating_locked();
  schedule_credit_locked();
}

uint32_t InputChannelState::take_unannounced() {
  std::lock_guard lock(mu_);
  credit_scheduled_ = false;
  if (released_ || failure.failed()) return 0;
  uint32_t n = unannounced_;
  unannounced_ = 0;
  announced.fetch_add(n);
  return n;
}

void InputChannelState::recycle(NetworkBuffer* b) {
  pool.on_release();
  held.fetch_sub(1);
  b->size = 0;
  bool give_back = false;
  {
    std::lock_guard lock(mu_);
    if (is_floating_locked(b) && (free_.size() >= backlog_ || released_)) {
      // Enough credit for the sender's backlog: the floating buffer serves another channel of the gate.
      floating_held_.erase(std::find(floating_held_.begin(), floating_held_.end(), b));
      floating_count.store(static_cast<int64_t>(floating_held_.size()));
      give_back = true;
    } else {
      free_.push_back(b);
      ++unannounced_;
      schedule_credit_locked();
    }
  }
  if (give_back) floating->give_back(b);
}

bool InputChannelState::on_floating_buffer(NetworkBuffer* b) {
  std::lock_guard lock(mu_);
  if (released_ || failure.failed() || free_.size() >= backlog_) return false;
  floating_held_.push_back(b);
  floating_count.store(static_cast<int64_t>(floating_held_.size()));
  free_.push_back(b);
  ++unannounced_;
  schedule_credit_locked();
  return true;
}

void InputChannelState::release() {
  {
    std::lock_guard lock(mu_);
    released_ = true;
  }
  conn->release_input(id);
}

void InputChannelState::fail(const Error& e) {
  if (failure.set(Error(e.code(), fmt::format("input channel {}: {}", id.to_string(), e.message())))) wakeup.notify();
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------

RemoteChannelSender::RemoteChannelSender(std::shared_ptr<detail::OutputChannelState> state)
    : state_(std::move(state)) {}

RemoteChannelSender::~RemoteChannelSender() {
  state_->wakeup.set(nullptr);
  state_->released.store(true);
  // Buffers queued before the release (end of partition among them) are still written; the I/O thread drops
  // the channel once they are.
  if (!state_->scheduled.exchange(true)) state_->conn->schedule_output(state_);
}

NetworkBuffer* RemoteChannelSender::try_acquire() {
  if (state_->failure.failed()) throw SluiceException(state_->failure.error());
  NetworkBuffer* b = state_->free_ring.pop();
  if (b != nullptr) state_->pool.on_acquire();
  return b;
}

void RemoteChannelSender::send(NetworkBuffer* buffer) {
  if (state_->failure.failed()) {
    // Dropped: the next try_acquire() throws the channel's error.
    state_->on_written(buffer);
    return;
  }
  state_->queue.push(buffer);  // never full: it holds as many slots as the channel has buffers
  state_->queued.fetch_add(1);
  if (!state_->scheduled.exchange(true)) state_->conn->schedule_output(state_);
}

void RemoteChannelSender::set_sender_wakeup(WakeupSignal* signal) {
  state_->wakeup.set(signal);
}

RemoteChannelSender::Stats RemoteChannelSender::stats() const {
  Stats s;
  s.credit_received = state_->credit_received.load();
  s.buffers_sent = state_->buffers_sent.load();
  s.queued = state_->queued.load();
  s.buffers = static_cast<int64_t>(state_->owned.size());
  return s;
}

const ChannelId& RemoteChannelSender::id() const {
  return state_->id;
}

// ---------------------------------------------------------------------------------------------------------

RemoteInputChannel::RemoteInputChannel(std::shared_ptr<detail::InputChannelState> state) : state_(std::move(state)) {}

RemoteInputChannel::~RemoteInputChannel() {
  state_->wakeup.set(nullptr);
  state_->release();
}

NetworkBuffer* RemoteInputChannel::poll() {
  NetworkBuffer* b = state_->data.pop();
  if (b != nullptr) return b;
  if (state_->failure.failed()) {
    // A buffer may have arrived between the pop and the failure: hand it out first.
    b = state_->data.pop();
    if (b != nullptr) return b;
    throw SluiceException(state_->failure.error());
  }
  return nullptr;
}

void RemoteInputChannel::recycle(NetworkBuffer* buffer) {
  state_->recycle(buffer);
}

void RemoteInputChannel::set_receiver_wakeup(WakeupSignal* signal) {
  state_->wakeup.set(signal);
}

RemoteInputChannel::Stats RemoteInputChannel::stats() const {
  Stats s;
  s.credit_announced = state_->announced.load();
  s.buffers_received = state_->received.load();
  s.held = state_->held.load();
  s.peak_held = state_->peak_held.load();
  s.exclusive = static_cast<int64_t>(state_->exclusive.size());
  s.floating = state_->floating_count.load();
  return s;
}

const ChannelId& RemoteInputChannel::id() const {
  return state_->id;
}

}  // namespace sluice::net
