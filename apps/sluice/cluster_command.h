// `sluice jobmanager PIPELINE.yaml` and `sluice taskmanager PIPELINE.yaml --jobmanager HOST:PORT`: the two
// processes of cluster mode (docs/cluster.md). Both build the pipeline's job graph and compare its fingerprint
// at registration; the JobManager deploys the job's tasks to the TaskManagers' slots and coordinates checkpoints.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sluice::cli {

struct ClusterFlags {
  std::string file;
  std::vector<std::string> props;   ///< -D key=value: cluster options (heartbeat.*, ...) and engine options
  int rpc_port = -2;                ///< -2: jobmanager.rpc.port / taskmanager.rpc.port
  int rest_port = 8081;             ///< the JobManager's REST API; 0 any free port, -1 none
  std::string jobmanager;           ///< the TaskManager's JobManager (HOST:PORT of its RPC service)
  int slots = 0;                    ///< 0: taskmanager.numberOfTaskSlots, else 1
  std::string from_savepoint;       ///< the JobManager's -s: execution.state-recovery.path
  bool allow_non_restored = false;  ///< the JobManager's --allow-non-restored-state
  int http_port = -1;               ///< the TaskManager's /health and /metrics; -1 none, 0 any free port
  std::string linger = "0";  ///< the JobManager's --linger: keep the REST API serving this long after the job ended
};

/// Adds `jobmanager` and `taskmanager` to `app`; returns them.
std::pair<CLI::App*, CLI::App*> add_cluster_commands(CLI::App& app, ClusterFlags& flags);

/// Runs a JobManager until SIGINT/SIGTERM or a REST cancel. Exit code 0 then; 1 when it could not start; 2
/// for an invalid file or option.
int run_jobmanager(const ClusterFlags& flags, const std::string& version, bool log_level_given);

/// Runs a TaskManager until SIGINT/SIGTERM (exit 0); 1 when the JobManager refused it (a different job graph
/// or build) or it could not start; 2 for an invalid file or option.
int run_taskmanager(const ClusterFlags& flags, const std::string& version, bool log_level_given);

}  // namespace sluice::cli
