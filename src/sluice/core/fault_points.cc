// Named fault points: the registry of armed points behind one mutex, and the "anything armed" flag.
#include "sluice/core/fault_points.h"

#include <cassert>
#include <map>
#include <mutex>

#include "sluice/core/error.h"

namespace sluice::fault {
namespace detail {

std::atomic<bool> g_any_armed{false};

}  // namespace detail

namespace {

struct ArmedPoint {
  int64_t skip_hits = 0;
  int64_t fire_count = 0;
  int64_t hits = 0;
  int64_t fired = 0;

  bool exhausted() const { return fired >= fire_count; }
};

struct Registry {
  std::mutex mu;
  std::map<std::string, ArmedPoint, std::less<>> points;  // guarded by mu
  int64_t live = 0;  ///< armed points with fires left; guarded by mu, mirrored in g_any_armed

  void publish() { detail::g_any_armed.store(live > 0, std::memory_order_relaxed); }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool compiled_in() noexcept {
#if defined(SLUICE_FAULT_POINTS) && SLUICE_FAULT_POINTS
  return true;
#else
  return false;
#endif
}

void arm(std::string name, int64_t skip_hits, int64_t fire_count) {
  assert(skip_hits >= 0 && fire_count >= 1);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto [it, inserted] = r.points.try_emplace(std::move(name));
  if (!inserted && !it->second.exhausted()) --r.live;
  it->second = ArmedPoint{skip_hits, fire_count, 0, 0};
  ++r.live;
  r.publish();
}

void disarm(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.points.find(name);
  if (it == r.points.end()) return;
  if (!it->second.exhausted()) --r.live;
  r.points.erase(it);
  r.publish();
}

void disarm_all() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.points.clear();
  r.live = 0;
  r.publish();
}

int64_t fired(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.points.find(name);
  return it == r.points.end() ? 0 : it->second.fired;
}

int64_t hits(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.points.find(name);
  return it == r.points.end() ? 0 : it->second.hits;
}

void throw_injected_fault(std::string_view name) {
  throw SluiceException(Error(ErrorCode::kRuntime, "injected fault at '" + std::string(name) + "'"));
}

namespace detail {

void hit(std::string_view name) {
  Registry& r = registry();
  {
    std::lock_guard lock(r.mu);
    auto it = r.points.find(name);
    if (it == r.points.end()) return;
    ArmedPoint& p = it->second;
    ++p.hits;
    if (p.hits <= p.skip_hits || p.exhausted()) return;
    ++p.fired;
    if (p.exhausted()) {
      --r.live;
      r.publish();
    }
  }
  throw_injected_fault(name);
}

}  // namespace detail
}  // namespace sluice::fault
