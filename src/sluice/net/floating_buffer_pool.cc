#include "sluice/net/floating_buffer_pool.h"

#include "sluice/core/assign_or_return.h"

namespace sluice::net {

Result<std::shared_ptr<FloatingBufferPool>> FloatingBufferPool::create(NetworkBufferPool& pool, size_t count) {
  SLUICE_ASSIGN_OR_RETURN(auto buffers, pool.allocate(count));
  return std::shared_ptr<FloatingBufferPool>(new FloatingBufferPool(pool, std::move(buffers)));
}

FloatingBufferPool::FloatingBufferPool(NetworkBufferPool& pool, std::vector<NetworkBuffer*> buffers)
    : pool_(pool), all_(std::move(buffers)), free_(all_) {}

FloatingBufferPool::~FloatingBufferPool() {
  pool_.release(all_);
}

NetworkBuffer* FloatingBufferPool::take(const std::weak_ptr<Listener>& listener) {
  std::lock_guard lock(mu_);
  if (!free_.empty()) {
    NetworkBuffer* b = free_.back();
    free_.pop_back();
    return b;
  }
  if (!listener.expired()) listeners_.push_back(listener);
  return nullptr;
}

void FloatingBufferPool::give_back(NetworkBuffer* buffer) {
  buffer->size = 0;
  for (;;) {
    std::shared_ptr<Listener> l;
    {
      std::lock_guard lock(mu_);
      while (!listeners_.empty() && l == nullptr) {
        l = listeners_.front().lock();
        listeners_.pop_front();
      }
      if (l == nullptr) {
        free_.push_back(buffer);
        return;
      }
    }
    // Outside the lock: the listener takes its channel's lock, which may call take() on this pool.
    if (l->on_floating_buffer(buffer)) return;
  }
}

size_t FloatingBufferPool::available() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace sluice::net
