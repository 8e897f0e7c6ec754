// What running a job returns: its status, per-operator counters and duration (JobResult), and a handle to a
// job running in the background (JobClient).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/error.h"

namespace sluice {

/// Flink's job states, reduced to those a local job goes through.
enum class JobStatus { kCreated, kRunning, kFinished, kFailed, kCanceled };
const char* job_status_name(JobStatus s);

/// Counters of one operator summed over its subtasks.
struct OperatorStats {
  std::string name;
  std::string uid;
  int parallelism = 1;
  uint64_t records_in = 0;
  uint64_t records_out = 0;
};

/// The outcome of a job.
struct JobResult {
  std::string job_id;
  std::string job_name;
  JobStatus status = JobStatus::kCreated;
  std::optional<Error> error;  ///< set when status is kFailed
  std::chrono::milliseconds duration{0};
  std::vector<OperatorStats> operators;  ///< in graph order

  bool ok() const { return status == JobStatus::kFinished; }
  /// The stats of the first operator with this name, or nullptr.
  const OperatorStats* find(const std::string& operator_name) const {
    for (const auto& o : operators) {
      if (o.name == operator_name) return &o;
    }
    return nullptr;
  }
};

/// A handle to a submitted job. Thread-safe.
class JobClient {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual const std::string& job_id() const = 0;
    virtual JobStatus status() const = 0;
    virtual void cancel() = 0;
    virtual JobResult wait() = 0;
    virtual bool wait_for(std::chrono::milliseconds timeout) = 0;
  };
  explicit JobClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  const std::string& job_id() const { return impl_->job_id(); }
  JobStatus status() const { return impl_->status(); }
  /// Asks every task to stop; returns at once. wait() then reports kCanceled.
  void cancel() { impl_->cancel(); }
  /// Blocks until the job ends and every task thread has exited; returns the result (idempotent).
  JobResult wait() { return impl_->wait(); }
  /// Waits up to `timeout` for the job to end; true when it has.
  bool wait_for(std::chrono::milliseconds timeout) { return impl_->wait_for(timeout); }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace sluice
