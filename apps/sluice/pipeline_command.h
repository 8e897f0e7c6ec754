// `sluice run PIPELINE.yaml` and `sluice validate PIPELINE.yaml` (docs/pipelines.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::cli {

/// The flags of the pipeline commands.
struct PipelineFlags {
  std::string file;
  std::vector<std::string> props;  ///< -D key=value engine options, over the file's pipeline.config
  std::string from_savepoint;      ///< -s: execution.state-recovery.path
  int parallelism = 0;             ///< -p: parallelism.default over the file's pipeline.parallelism; 0 = the file's
  bool allow_non_restored_state = false;  ///< execution.state-recovery.ignore-unclaimed-state
  int http_port = -2;  ///< the one port of the REST API, /metrics and /health; -2: as the file says, -1 off, 0 any
  std::string linger = "0";  ///< keep the port serving (the job listed in its final state) this long after it ended
  bool quiet = false;
  int64_t sample = 0;  ///< validate --sample N: run the transform over the first N records of a files source
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
