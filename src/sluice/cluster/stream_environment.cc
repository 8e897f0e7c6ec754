// StreamEnvironment's execution half lives with the runtime: the API builds the graph, the mini-cluster runs it.
#include "sluice/api/stream_environment.h"

#include "sluice/cluster/local_cluster.h"
#include "sluice/core/logging.h"

namespace sluice {

StreamEnvironment::StreamEnvironment(Configuration config) : graph_(std::make_shared<StreamGraph>(std::move(config))) {
  init_logging();
}

StreamEnvironment StreamEnvironment::from_args(int argc, const char* const* argv) {
  return StreamEnvironment(Configuration::from_args(argc, argv).value_or_throw());
}

StreamEnvironment& StreamEnvironment::set_parallelism(int parallelism) {
  config().set(options::kParallelism, parallelism);
  return *this;
}

StreamEnvironment& StreamEnvironment::set_max_parallelism(int max_parallelism) {
  config().set(options::kMaxParallelism, max_parallelism);
  return *this;
}

JobClient StreamEnvironment::execute_async(std::string job_name, LocalJobProbe* probe) {
  auto graph = std::exchange(graph_, std::make_shared<StreamGraph>(graph_->config()));
  return submit_local_job(std::move(graph), std::move(job_name), *clock_, probe).value_or_throw();
}

JobResult StreamEnvironment::execute(std::string job_name) {
  auto graph = std::exchange(graph_, std::make_shared<StreamGraph>(graph_->config()));
  Result<JobClient> client = submit_local_job(std::move(graph), job_name, *clock_, nullptr);
  if (!client.ok()) {
    JobResult r;
    r.job_name = std::move(job_name);
    r.status = JobStatus::kFailed;
    r.error = client.error();
    return r;
  }
  return client->wait();
}

}  // namespace sluice
