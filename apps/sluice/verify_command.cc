#include "verify_command.h"

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "output_verifier.h"

namespace sluice::cli {

namespace {

namespace fs = std::filesystem;

/// Natural order of committed part files (part-2-10 after part-2-9), so a subtask's files are read in the order it
/// wrote them.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) != 0 && std::isdigit(static_cast<unsigned char>(b[j])) != 0) {
      size_t ie = i;
      size_t je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie])) != 0)
        ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je])) != 0)
        ++je;
      const std::string_view na = std::string_view(a).substr(i, ie - i);
      const std::string_view nb = std::string_view(b).substr(j, je - j);
      const auto ta = na.substr(std::min(na.find_first_not_of('0'), na.size()));
      const auto tb = nb.substr(std::min(nb.find_first_not_of('0'), nb.size()));
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

/// Reads every committed file of a files sink directory (names not starting with '.': in-progress and pending files
/// are hidden until their checkpoint commits them), line by line. Returns how many files, or -1 after printing why.
int64_t read_files(const std::string& dir, OutputVerifier& verifier) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fmt::print(stderr, "error: --files {}: not a directory\n", dir);
    return -1;
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.starts_with('.')) continue;
    // Skip files inside hidden directories as well.
    const std::string rel = fs::relative(entry.path(), dir).string();
    if (rel.find("/.") != std::string::npos) continue;
    names.push_back(rel);
  }
  if (ec) {
    fmt::print(stderr, "error: reading directory {}: {}\n", dir, ec.message());
    return -1;
  }
  std::sort(names.begin(), names.end(), natural_less);
  for (const auto& rel : names) {
    const fs::path path = fs::path(dir) / rel;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      fmt::print(stderr, "error: cannot read {}\n", path.string());
      return -1;
    }
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      verifier.add(line, fmt::format("{}:{}", path.string(), n));
    }
    if (in.bad()) {
      fmt::print(stderr, "error: reading {} failed\n", path.string());
      return -1;
    }
  }
  return static_cast<int64_t>(names.size());
}

struct KafkaDeleter {
  void operator()(rd_kafka_t* rk) const {
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
  }
};

/// Reads the whole topic with read_committed, from the beginning to the end each partition has when the read
/// starts (librdkafka's partition EOF: the last stable offset under read_committed). No consumer group offsets are
/// committed. Returns the number of partitions, or -1 after printing why.
int64_t read_kafka(const VerifyFlags& flags, OutputVerifier& verifier) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  auto set = [&](const std::string& k, const std::string& v) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      fmt::print(stderr, "error: Kafka property {}={}: {}\n", k, v, err);
      return false;
    }
    return true;
  };
  bool ok = set("bootstrap.servers", flags.bootstrap_servers) && set("group.id", "sluice-verify") &&
            set("isolation.level", "read_committed") && set("enable.auto.commit", "false") &&
            set("enable.partition.eof", "true") && set("auto.offset.reset", "earliest");
  size_t i = 0;
  while (ok && i < flags.kafka_properties.size()) {
    size_t end = flags.kafka_properties.find(',', i);
    if (end == std::string::npos) end = flags.kafka_properties.size();
    const std::string kv = flags.kafka_properties.substr(i, end - i);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      fmt::print(stderr, "error: --kafka-property '{}' is not key=value\n", kv);
      ok = false;
    } else {
      ok = set(kv.substr(0, eq), kv.substr(eq + 1));
    }
    i = end + 1;
  }
  if (!ok) {
    rd_kafka_conf_destroy(conf);
    return -1;
  }
  rd_kafka_t* raw = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (raw == nullptr) {
    fmt::print(stderr, "error: Kafka consumer: {}\n", err);
    return -1;
  }
  std::unique_ptr<rd_kafka_t, KafkaDeleter> rk(raw);
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk.get(), flags.topic.c_str(), nullptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(flags.timeout_s);
  rd_kafka_resp_err_t merr = rd_kafka_metadata(rk.get(), 0, t, &md, 10000);
  rd_kafka_topic_destroy(t);
  if (merr != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 || md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    fmt::print(stderr, "error: topic {} on {}: {}\n", flags.topic, flags.bootstrap_servers,
               rd_kafka_err2str(merr != RD_KAFKA_RESP_ERR_NO_ERROR ? merr : md->topics[0].err));
    if (md != nullptr) rd_kafka_metadata_destroy(md);
    return -1;
  }
  const int partitions = md->topics[0].partition_cnt;
  rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < md->topics[0].partition_cnt; ++p)
    rd_kafka_topic_partition_list_add(list, flags.topic.c_str(), md->topics[0].partitions[p].id)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_metadata_destroy(md);
  rd_kafka_resp_err_t aerr = rd_kafka_assign(rk.get(), list);
  rd_kafka_topic_partition_list_destroy(list);
  if (aerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
    fmt::print(stderr, "error: assigning {}: {}\n", flags.topic, rd_kafka_err2str(aerr));
    return -1;
  }
  std::set<int32_t> at_end;
  while (static_cast<int>(at_end.size()) < partitions) {
    if (std::chrono::steady_clock::now() >= deadline) {
      fmt::print(stderr, "error: {} of {} partitions of {} not read to their end within {} s (--timeout)\n",
                 partitions - static_cast<int>(at_end.size()), partitions, flags.topic, flags.timeout_s);
      return -1;
    }
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk.get(), 500);
    if (m == nullptr) continue;
    std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> msg(m, &rd_kafka_message_destroy);
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      at_end.insert(m->partition);
      continue;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      fmt::print(stderr, "error: reading {}: {}\n", flags.topic, rd_kafka_message_errstr(m));
      return -1;
    }
    // A record arriving after a partition's EOF (the topic is still written): read on, it counts.
    at_end.erase(m->partition);
    if (m->payload == nullptr) {
      verifier.add("null", fmt::format("{}/{}@{} (a tombstone)", flags.topic, m->partition, m->offset));
      continue;
    }
    verifier.add(std::string_view(static_cast<const char*>(m->payload), m->len),
                 fmt::format("{}/{}@{}", flags.topic, m->partition, m->offset));
  }
  return partitions;
}

}  // namespace

CLI::App* add_verify_command(CLI::App& app, VerifyFlags& flags) {
  auto* cmd = app.add_subcommand(
      "verify",
      "Check a job's output: duplicates by event id, per-key sequence gaps and order (reads a Kafka topic with "
      "read_committed, or a files sink directory)");
  auto* bootstrap = cmd->add_option("--bootstrap-servers", flags.bootstrap_servers, "Kafka brokers (HOST:PORT,...)");
  auto* topic = cmd->add_option("--topic", flags.topic, "Kafka topic to read (all partitions, from the beginning)");
  auto* files = cmd->add_option("--files", flags.files, "A files sink's directory (its committed files)");
  bootstrap->needs(topic);
  topic->needs(bootstrap);
  files->excludes(topic)->excludes(bootstrap);
  cmd->add_option("--id-field", flags.id_field, "Event id field (dotted path); duplicates are counted by it");
  cmd->add_option("--key-field", flags.key_field, "Key field whose sequence numbers are checked (dotted path)");
  cmd->add_option("--seq-field", flags.seq_field, "Per-key sequence number field (dotted path, an integer)");
  cmd->add_option("--seq-start", flags.seq_start,
                  "First sequence number of every key (default: each key's smallest seen)");
  cmd->add_option("--seq-end", flags.seq_end, "Last sequence number of every key (default: each key's largest seen)");
  cmd->add_flag("--allow-duplicates", flags.allow_duplicates,
                "At-least-once output: report duplicates without failing");
  cmd->add_flag("--allow-empty", flags.allow_empty,
                "Output with no record at all is clean (without it, reading nothing fails the check: exit 1)");
  cmd->add_option("--timeout", flags.timeout_s, "Kafka: seconds to read every partition to its end")
      ->capture_default_str();
  cmd->add_option("--kafka-properties", flags.kafka_properties,
                  "Extra librdkafka consumer properties, key=value,key=value");
  return cmd;
}

int run_verify(const VerifyFlags& flags) {
  if (flags.files.empty() && flags.topic.empty()) {
    fmt::print(stderr, "error: sluice verify needs --files DIR or --bootstrap-servers HOST:PORT --topic NAME\n");
    return 2;
  }
  if ((flags.key_field.empty()) != (flags.seq_field.empty())) {
    fmt::print(stderr, "error: --key-field and --seq-field go together (per-key sequence checks need both)\n");
    return 2;
  }
  if (flags.id_field.empty() && flags.key_field.empty()) {
    fmt::print(stderr,
               "error: give --id-field (duplicate check) and/or --key-field with --seq-field (sequence checks)\n");
    return 2;
  }
  VerifyFields fields{flags.id_field, flags.key_field, flags.seq_field, std::nullopt, std::nullopt};
  if (flags.seq_start != INT64_MIN) fields.seq_start = flags.seq_start;
  if (flags.seq_end != INT64_MIN) fields.seq_end = flags.seq_end;
  OutputVerifier verifier(fields);
  const auto t0 = std::chrono::steady_clock::now();
  std::string source;
  if (!flags.files.empty()) {
    const int64_t n = read_files(flags.files, verifier);
    if (n < 0) return 2;
    source = fmt::format("{} ({} committed files)", flags.files, n);
  } else {
    const int64_t n = read_kafka(flags, verifier);
    if (n < 0) return 2;
    source = fmt::format("topic {} ({} partitions, read_committed)", flags.topic, n);
  }
  const VerifyReport r = verifier.report();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  const bool bad = r.violated(flags.allow_duplicates);
  fmt::print("source:        {}\n", source);
  fmt::print("records:       {}\n", r.records);
  if (!flags.id_field.empty()) fmt::print("distinct ids:  {}\n", r.distinct_ids);
  if (!flags.key_field.empty()) fmt::print("keys:          {}\n", r.keys);
  fmt::print("duplicated:    {}{}\n", r.duplicated, flags.allow_duplicates && r.duplicated > 0 ? " (allowed)" : "");
  if (!flags.key_field.empty()) {
    fmt::print("missing:       {} (in {} keys)\n", r.missing, r.keys_with_gaps);
    fmt::print("out of order:  {}\n", r.out_of_order);
  }
  fmt::print("unreadable:    {}\n", r.unreadable);
  for (const auto& e : r.examples)
    fmt::print("  {}\n", e);
  // Nothing read proves nothing: a wrong directory or topic, or a job that lost everything, must not pass.
  const bool empty = r.records == 0 && r.unreadable == 0 && !flags.allow_empty;
  if (empty) {
    fmt::print(
        "result:        EMPTY: no record was read from {} ({} ms); give --allow-empty if no output is expected\n",
        flags.files.empty() ? "topic " + flags.topic : flags.files, ms);
    std::fflush(stdout);
    fmt::print(stderr, "error: no record was read from {}\n",
               flags.files.empty() ? "topic " + flags.topic : flags.files);
    return 1;
  }
  fmt::print("result:        {} ({} ms)\n", bad ? "VIOLATED" : "OK", ms);
  std::fflush(stdout);
  return bad ? 1 : 0;
}

}  // namespace sluice::cli
