#include "sluice/runtime/buffer_pool.h"

#include <fmt/format.h>

namespace sluice {

NetworkBufferPool::NetworkBufferPool(uint32_t segment_size, size_t max_buffers)
    : segment_size_(segment_size), max_buffers_(max_buffers) {}

NetworkBufferPool::~NetworkBufferPool() = default;

Result<std::vector<NetworkBuffer*>> NetworkBufferPool::allocate(size_t n) {
  MutexLock lock(mu_);
  std::vector<NetworkBuffer*> out;
  out.reserve(n);
  while (!free_.empty() && out.size() < n) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  n -= out.size();
  if (buffers_.size() + n > max_buffers_) {
    free_.insert(free_.end(), out.begin(), out.end());
    return Error(ErrorCode::kNetwork,
                 fmt::format("network buffer pool exhausted: {} buffers requested, {} of {} in use; raise the pool or "
                             "lower taskmanager.network.memory.buffers-per-channel",
                             n, buffers_.size(), max_buffers_));
  }
  for (size_t i = 0; i < n; ++i) {
    // Default-initialized (not zeroed): pages are only touched, and so only count in RSS, when used.
    segments_.push_back(std::unique_ptr<uint8_t[]>(new uint8_t[segment_size_]));
    auto b = std::make_unique<NetworkBuffer>();
    b->data = segments_.back().get();
    b->capacity = segment_size_;
    out.push_back(b.get());
    buffers_.push_back(std::move(b));
  }
  return out;
}

void NetworkBufferPool::release(const std::vector<NetworkBuffer*>& buffers) {
  MutexLock lock(mu_);
  for (NetworkBuffer* b : buffers) {
    b->size = 0;
    free_.push_back(b);
  }
}

size_t NetworkBufferPool::allocated() const {
  MutexLock lock(mu_);
  return buffers_.size();
}

}  // namespace sluice
