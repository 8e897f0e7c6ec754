// `sluice run PIPELINE.yaml` and `sluice validate PIPELINE.yaml` (docs/pipelines.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sluice::cli {

/// The flags of the pipeline commands.
struct PipelineFlags {
  std::string file;
  std::vector<std::string> props;  ///< -D key=value engine options, over the file's pipeline.config
  std::string from_savepoint;      ///< -s: execution.state-recovery.path
  int http_port = -2;              ///< -2: as the file says
  int rest_port = -1;              ///< the job's REST API (sluice list/savepoint/stop/cancel); -1 off, 0 any
  std::string linger = "0";        ///< keep /metrics and /health up this long after the job ended
  bool quiet = false;
};

/// Adds `run` and `validate` to `app`; returns them (run, validate).
std::pair<CLI::App*, CLI::App*> add_pipeline_commands(CLI::App& app, PipelineFlags& flags);

/// Runs the pipeline until it ends or SIGINT/SIGTERM cancels it. Exit code: 0 when it finished or SIGTERM
/// cancelled it, 130 when SIGINT did, 1 when it failed or could not start, 2 for an invalid file.
int run_pipeline(const PipelineFlags& flags, bool log_level_given);

/// Parses the file and builds the job without starting it. Exit code 0 when valid, 2 otherwise (the error
/// with its FILE:LINE:COLUMN on stderr).
int validate_pipeline(const PipelineFlags& flags);

}  // namespace sluice::cli
