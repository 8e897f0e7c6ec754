// `sluice ha status`: what etcd holds for a Sluice cluster's high availability (docs/high-availability.md): the
// current leader (address, epoch) and, per job in the HA store, its status and latest-checkpoint pointer.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace sluice::cli {

struct HaFlags {
  std::string endpoints;  ///< high-availability.etcd.endpoints
  std::string cluster_id = "default";
};

/// Adds `ha` (with `status`) to `app`; returns the `status` subcommand.
CLI::App* add_ha_command(CLI::App& app, HaFlags& flags);

/// Prints the leader and the stored jobs. Exit code 0, or 2 when etcd cannot be read or the flags are wrong.
int run_ha_status(const HaFlags& flags);

}  // namespace sluice::cli
