// Named fault points: the registry of armed points behind one mutex, and the "anything armed" flag.
#include "sluice/core/fault_points.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cassert>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

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
  Action action = Action::kThrow;

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

// Dies now, as a crash does: no destructor, no buffered output, no atexit handler runs. The one line on stderr
// (unbuffered, written with write(2)) lets a test tell the injected crash from another death.
[[noreturn]] void crash(std::string_view name) {
  std::string line = "sluice: fault point '" + std::string(name) + "' fired: SIGKILL\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
  // SIGKILL cannot be caught or blocked; this is unreachable.
  std::abort();
}

// Blocks the calling thread until the process dies (a test SIGKILLs it).
[[noreturn]] void hang(std::string_view name) {
  std::string line = "sluice: fault point '" + std::string(name) + "' fired: hang\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  for (;;)
    ::pause();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

bool compiled_in() noexcept {
  return true;
}

Status arm_from_spec(std::string_view spec) {
  struct Entry {
    std::string name;
    int64_t skip;
    Action action;
  };
  std::vector<Entry> entries;
  while (!spec.empty()) {
    const size_t end = spec.find(';');
    const std::string_view entry = trim(spec.substr(0, end));
    spec = end == std::string_view::npos ? std::string_view() : spec.substr(end + 1);
    if (entry.empty()) continue;
    auto bad = [&](std::string_view why) {
      return Error(ErrorCode::kConfiguration,
                   "fault points: bad entry '" + std::string(entry) + "': " + std::string(why) +
                       "; expected name=throw, name=crash or name=hang, optionally followed by @<hits to skip>");
    };
    const size_t eq = entry.rfind('=');
    if (eq == std::string_view::npos || eq == 0) return bad("no point name");
    std::string_view action = trim(entry.substr(eq + 1));
    int64_t skip = 0;
    if (const size_t at = action.find('@'); at != std::string_view::npos) {
      const std::string_view digits = action.substr(at + 1);
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), skip);
      if (ec != std::errc() || ptr != digits.data() + digits.size() || skip < 0) return bad("bad hit count after '@'");
      action = action.substr(0, at);
    }
    Action a;
    if (action == "throw") {
      a = Action::kThrow;
    } else if (action == "crash") {
      a = Action::kCrash;
    } else if (action == "hang") {
      a = Action::kHang;
    } else {
      return bad("unknown action '" + std::string(action) + "'");
    }
    entries.push_back(Entry{std::string(trim(entry.substr(0, eq))), skip, a});
  }
  for (Entry& e : entries) {
    spdlog::warn("fault point '{}' armed: {} after {} hit(s)", e.name,
                 e.action == Action::kCrash  ? "crash"
                 : e.action == Action::kHang ? "hang"
                                             : "throw",
                 e.skip);
    arm(std::move(e.name), e.skip, 1, e.action);
  }
  return ok_status();
}

Status arm_from_environment() {
  const char* spec = std::getenv("SLUICE_FAULT_POINTS");
  if (spec == nullptr || *spec == '\0') return ok_status();
  return arm_from_spec(spec);
}

void arm(std::string name, int64_t skip_hits, int64_t fire_count, Action action) {
  assert(skip_hits >= 0 && fire_count >= 1);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto [it, inserted] = r.points.try_emplace(std::move(name));
  if (!inserted && !it->second.exhausted()) --r.live;
  it->second = ArmedPoint{skip_hits, fire_count, 0, 0, action};
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
  Action action = Action::kThrow;
  {
    std::lock_guard lock(r.mu);
    auto it = r.points.find(name);
    if (it == r.points.end()) return;
    ArmedPoint& p = it->second;
    ++p.hits;
    if (p.hits <= p.skip_hits || p.exhausted()) return;
    ++p.fired;
    action = p.action;
    if (p.exhausted()) {
      --r.live;
      r.publish();
    }
  }
  if (action == Action::kCrash) crash(name);
  if (action == Action::kHang) hang(name);
  throw_injected_fault(name);
}

}  // namespace detail
}  // namespace sluice::fault
