#include "sluice/udf/external_map.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "sluice/core/assign_or_return.h"
#include "sluice/udf/function_module.h"

namespace sluice::udf {
namespace fs = std::filesystem;

Result<PreparedExternalFunction> prepare_external_function(const ExternalFunction& fn) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kConfiguration, fmt::format("map_external {} ({}): {}", fn.export_name, fn.module, what));
  };
  if (fn.runtime != "node" && fn.runtime != "python")
    return bad("runtime must be 'node' or 'python', not '" + fn.runtime + "'");
  if (fn.module.empty() || fn.export_name.empty()) return bad("the module and the export are required");
  if (fn.batch_size < 1 || fn.max_in_flight < 1 || fn.batch_max_delay_ms < 0 || fn.timeout_ms < 1 ||
      fn.memory_mb < 16) {
    return bad(
        "batch_size and max_in_flight must be at least 1, batch_max_delay_ms at least 0, timeout_ms at least 1 "
        "and memory_mb at least 16");
  }
  const fs::path module = fs::absolute(fn.module);
  if (!fs::exists(module)) return bad(fmt::format("the module {} does not exist", module.string()));
  PreparedExternalFunction p;
  p.spec = fn;
  p.display = fmt::format("{} ({})", fn.export_name, fn.module);
  if (fn.runtime == "python") {
    Result<PreparedModule> m = prepare_python_module(module);
    if (!m.ok()) return bad(m.error().message());
    p.module_path = m->path;
    p.argv = python_worker_command(fn.memory_mb);
  } else {
    const fs::path project = fn.project_dir.empty() ? module.parent_path() : fs::absolute(fn.project_dir);
    Result<PreparedModule> m = prepare_node_module(module, project);
    if (!m.ok()) return bad(m.error().message());
    p.module_path = m->path;
    p.argv = node_worker_command(fn.memory_mb);
  }
  return p;
}

ExternalCall::ExternalCall(PreparedExternalFunction fn, std::string display)
    : fn_(std::move(fn)), display_(std::move(display)) {
  frame_.open(next_id_);
}

Status ExternalCall::start(std::function<void()> on_reply) {
  FunctionWorkerOptions o;
  o.argv = fn_.argv;
  o.module = fn_.module_path;
  o.export_name = fn_.spec.export_name;
  o.display_name = display_;
  o.memory_mb = fn_.spec.memory_mb;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<FunctionWorker> w, FunctionWorker::start(std::move(o), std::move(on_reply)));
  worker_ = std::move(w);
  return ok_status();
}

Status ExternalCall::append(const Value& record) {
  Status s = frame_.append(record);
  if (!s.ok()) return Error(s.error().code(), fmt::format("function {}: {}", display_, s.error().message()));
  return ok_status();
}

bool ExternalCall::should_send() const {
  return frame_.count() >= static_cast<size_t>(fn_.spec.batch_size) || in_flight_.empty();
}

void ExternalCall::send(std::deque<RecordResult>& out) {
  if (frame_.count() == 0) return;
  while (in_flight_.size() >= static_cast<size_t>(fn_.spec.max_in_flight))
    await_oldest(out);
  const auto now = std::chrono::steady_clock::now();
  Status s = worker_->send(frame_.close(), now + std::chrono::milliseconds(fn_.spec.timeout_ms));
  if (!s.ok()) throw SluiceException(s.error());
  in_flight_.push_back(InFlight{frame_.id(), frame_.count(), now});
  ++batches_sent_;
  records_sent_ += frame_.count();
  frame_.open(++next_id_);
}

void ExternalCall::poll(std::deque<RecordResult>& out) {
  while (!in_flight_.empty()) {
    Result<std::optional<std::string>> r = worker_->next_reply();
    if (!r.ok()) throw SluiceException(r.error());
    if (!r->has_value()) return;
    take(**r, out);
  }
}

void ExternalCall::flush(std::deque<RecordResult>& out) {
  send(out);
  while (!in_flight_.empty())
    await_oldest(out);
}

std::optional<std::chrono::steady_clock::time_point> ExternalCall::oldest_deadline() const {
  if (in_flight_.empty()) return std::nullopt;
  return in_flight_.front().sent + std::chrono::milliseconds(fn_.spec.timeout_ms);
}

void ExternalCall::log_figures(uint64_t timers) const {
  spdlog::info("function {}: {} records in {} batches, {} timers", display_, records_sent_, batches_sent_, timers);
}

void ExternalCall::check_timeout(std::deque<RecordResult>& out) {
  poll(out);
  if (!in_flight_.empty() &&
      std::chrono::steady_clock::now() >= in_flight_.front().sent + std::chrono::milliseconds(fn_.spec.timeout_ms)) {
    await_oldest(out);  // past its deadline: fails now
  }
}

void ExternalCall::await_oldest(std::deque<RecordResult>& out) {
  const InFlight& oldest = in_flight_.front();
  Result<std::optional<std::string>> r =
      worker_->wait_reply(oldest.sent + std::chrono::milliseconds(fn_.spec.timeout_ms));
  if (!r.ok()) throw SluiceException(r.error());
  if (!r->has_value()) {
    throw SluiceException(
        Error(ErrorCode::kRuntime,
              fmt::format("function {}: batch {} ({} records) was not answered within {} ms (the "
                          "function hangs or is too slow); {}",
                          display_, oldest.id, oldest.count, fn_.spec.timeout_ms, worker_->describe_exit())));
  }
  take(**r, out);
}

void ExternalCall::take(const std::string& text, std::deque<RecordResult>& out) {
  const InFlight batch = in_flight_.front();
  Result<std::vector<RecordResult>> results = parse_result_frame(text, batch.id, batch.count);
  if (!results.ok()) {
    throw SluiceException(Error(ErrorCode::kRuntime, fmt::format("function {}: the worker broke the protocol: {}",
                                                                 display_, results.error().message())));
  }
  in_flight_.pop_front();
  for (RecordResult& r : *results)
    out.push_back(std::move(r));
}

}  // namespace sluice::udf
