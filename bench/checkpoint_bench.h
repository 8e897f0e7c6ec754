// `sluice-bench checkpoint ...`: what checkpoints cost on the local mini-cluster.
//
//   state      heap keyed state of --state-mb MiB: checkpoint duration, size and the synchronous pause
//   churn      --state-mb MiB of keyed state written once, then --churn-percent of the keys changed per 3 s
//              checkpoint interval: duration, bytes written and full size of the checkpoints (--incremental)
//   throughput a keyed counting job with checkpoints every --intervals (none,10s,1s,200ms): records/s and
//              the ratio to no checkpoints, medians over --rounds rounds run alternately
//   recovery   --state-mb MiB of state, one injected failure: time from the failure to the first record
//              processed by the restored keyed operator; with --restore-parallelism N the job is cancelled
//              instead and a new one restored from its last checkpoint at parallelism N (rescaling): time from
//              its start until every restored subtask has processed a record; --verify-keys fills until every
//              key is written and, after the restore, counts the keys found without a value (state the restore lost)
//   storage    --state-mb MiB of state rewritten at full speed, once per storage of --storages (none, local,
//              s3://bucket/prefix) and round, alternately in one process: records/s and records per CPU-s over
//              --window-s after the fill with checkpoints every --interval, and the checkpoints' duration, size
//              and synchronous pause (at least --checkpoints of them, triggered after the fill)
#pragma once

#include <cstdint>
#include <string>

namespace sluice::bench {

struct CheckpointBenchOptions {
  std::string scenario;                         ///< state, throughput or recovery
  int64_t state_mb = 100;                       ///< MiB of keyed state (state, recovery)
  int64_t value_bytes = 1024;                   ///< bytes per key's value (state, recovery)
  int64_t records = 20'000'000;                 ///< records per run (throughput)
  std::string intervals = "none,10s,1s,200ms";  ///< checkpoint intervals (throughput)
  int rounds = 3;
  int parallelism = 1;
  int restore_parallelism = 0;      ///< recovery: > 0 restores a new job at this parallelism (rescale)
  bool verify_keys = false;         ///< recovery: count the keys without a value after the restore (lost state)
  std::string dir;                  ///< checkpoint directory; default: a fresh one under the temp dir
  std::string backend = "hashmap";  ///< state.backend.type: hashmap or rocksdb
  std::string rocksdb_memory;       ///< state.backend.rocksdb.memory.fixed-per-slot (empty: the default)
  bool incremental = false;         ///< state.backend.incremental
  double churn_percent = 1;         ///< keys changed per checkpoint interval, in % (churn)
  /// Values: "repeated" (one letter repeated: compresses ~13x in RocksDB) or "random" (incompressible bytes).
  std::string values = "repeated";
  std::string storages = "none,local";  ///< storage: none, local (a fresh dir under --dir or the temp dir), s3://...
  std::string interval = "3s";          ///< storage: checkpoint interval
  int window_s = 60;                    ///< storage: seconds of throughput measured after the fill
  int checkpoints = 2;                  ///< storage: completed checkpoints after the fill to wait for
};

/// Runs one scenario and prints its figures; returns the process exit code.
int run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace sluice::bench
