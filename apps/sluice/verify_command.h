// `sluice verify`: reads a job's output as a consumer would (a Kafka topic with isolation.level=read_committed, or
// the committed files of a files sink directory) and checks it with OutputVerifier: duplicates by event id, per-key
// sequence gaps and order. Prints a report; exit code 0 when clean, 1 on a violation or when nothing was read
// (unless --allow-empty), 2 when the output cannot be read or the flags are wrong. docs/verify.md.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace sluice::cli {

struct VerifyFlags {
  std::string bootstrap_servers;  ///< Kafka: --bootstrap-servers with --topic
  std::string topic;
  std::string files;  ///< a files sink's directory
  std::string id_field;
  std::string key_field;
  std::string seq_field;
  int64_t seq_start = INT64_MIN;  ///< INT64_MIN: not given
  int64_t seq_end = INT64_MIN;
  bool allow_duplicates = false;  ///< at-least-once output: duplicates are reported, not a violation
  bool allow_empty = false;       ///< no record read is clean (without it, nothing read is a failed check)
  int timeout_s = 120;            ///< Kafka: longest time to read to the end of every partition
  std::string kafka_properties;   ///< extra librdkafka properties, k=v,k=v
};

/// Adds `verify` to `app`.
CLI::App* add_verify_command(CLI::App& app, VerifyFlags& flags);

/// Runs the check; the exit code (see the file comment).
int run_verify(const VerifyFlags& flags);

}  // namespace sluice::cli
