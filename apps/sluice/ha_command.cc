#include "ha_command.h"

#include <fmt/format.h>

#include <algorithm>

#include "sluice/cluster/ha/etcd_client.h"
#include "sluice/cluster/ha/ha_options.h"
#include "sluice/cluster/ha/ha_store.h"
#include "sluice/cluster/ha/leader_election.h"

namespace sluice::cli {

CLI::App* add_ha_command(CLI::App& app, HaFlags& flags) {
  auto* ha = app.add_subcommand("ha", "High availability on etcd (docs/high-availability.md)");
  ha->require_subcommand(1);
  auto* status = ha->add_subcommand("status", "Print the JobManager leader and the jobs the HA store holds");
  status->add_option("--endpoints", flags.endpoints, "etcd client URLs (high-availability.etcd.endpoints)")->required();
  status->add_option("--cluster-id", flags.cluster_id, "high-availability.cluster-id")->capture_default_str();
  return status;
}

int run_ha_status(const HaFlags& flags) {
  auto fail = [](const Error& e) {
    fmt::print(stderr, "error: {}\n", e.to_string());
    return 2;
  };
  Configuration c;
  c.set_string(std::string(ha::options::kHaType.key), "etcd");
  c.set_string(std::string(ha::options::kEtcdEndpoints.key), flags.endpoints);
  c.set_string(std::string(ha::options::kClusterId.key), flags.cluster_id);
  auto options = ha::HaOptions::from_configuration(c);
  if (!options.ok()) return fail(options.error());
  auto client = ha::EtcdClient::create(ha::EtcdClientOptions{options->endpoints});
  if (!client.ok()) return fail(client.error());
  const ha::HaKeys keys(options->cluster_id);
  auto leader = ha::read_leader(**client, keys.leader());
  if (!leader.ok()) return fail(leader.error());
  if (leader->has_value()) {
    fmt::print("leader: {} (epoch {}, lease {:x})\n", (*leader)->address, (*leader)->epoch.create_revision,
               (*leader)->epoch.lease_id);
  } else {
    fmt::print("leader: none\n");
  }
  ha::EtcdHaStore store(**client, keys);
  auto ids = store.job_ids();
  if (!ids.ok()) return fail(ids.error());
  // Jobs whose pointer exists without a stored graph are listed too (a leader may move the pointer first).
  auto all = (*client)->get_prefix(keys.jobs_prefix());
  if (!all.ok()) return fail(all.error());
  std::vector<std::string> jobs = *ids;
  for (const auto& kv : *all) {
    const std::string rest = kv.key.substr(keys.jobs_prefix().size());
    const std::string id = rest.substr(0, rest.find('/'));
    if (std::find(jobs.begin(), jobs.end(), id) == jobs.end()) jobs.push_back(id);
  }
  for (const auto& id : jobs) {
    auto job = store.job(id);
    auto status = store.job_status(id);
    auto pointer = store.latest_checkpoint(id);
    auto attempt = store.attempt(id);
    if (!job.ok()) return fail(job.error());
    if (!status.ok()) return fail(status.error());
    if (!pointer.ok()) return fail(pointer.error());
    if (!attempt.ok()) return fail(attempt.error());
    fmt::print("job {}{}: status {}", id, job->has_value() ? fmt::format(" ({})", (*job)->name) : std::string(),
               status->has_value() ? **status : std::string("unknown"));
    if (pointer->has_value()) {
      fmt::print(", latest checkpoint {} at {} (written by epoch {})", (*pointer)->checkpoint_id,
                 (*pointer)->external_path, (*pointer)->leader_epoch);
    } else {
      fmt::print(", no completed checkpoint");
    }
    fmt::print("{}\n", attempt->has_value() ? fmt::format(", deployment attempt {}", **attempt) : std::string());
  }
  if (jobs.empty()) fmt::print("jobs: none\n");
  return 0;
}

}  // namespace sluice::cli
