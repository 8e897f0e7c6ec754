// The shared harness of the chaos tests (tests/chaos/*_kill_test.cc, library chaos_harness):
//  * SluiceProcess: a `sluice run FILE` child process, SIGKILLed and restarted by the test, its output in a log
//    file per start; waits on its log (job started, completed checkpoints) with a deadline;
//  * CommittedReader: a topic read as a consumer of the pipeline's output reads it (isolation.level
//    read_committed, every partition assigned from the beginning);
//  * compare_sequences(): per key, what a consumer saw against what it must see, counting missing, duplicated,
//    unexpected and out-of-order items; count_duplicates() for event ids;
//  * chaos_scale() (SLUICE_CHAOS_SCALE, the long runs by hand) and the test directory kept on failure.
// Seeds come from sluice::testing::test_seed() (SLUICE_TEST_SEED); each test prints its own.
// One test thread: nothing here is thread-safe.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "integration/test_util/kafka.h"
#include "sluice/core/value.h"

namespace sluice::chaos {

namespace fs = std::filesystem;

/// The whole file ("" when it cannot be read).
std::string read_file(const fs::path& p);
/// The last `lines` lines of a file.
std::string tail(const fs::path& p, size_t lines = 30);
/// How many times `what` occurs in `text`.
size_t count_of(const std::string& text, const std::string& what);

/// SLUICE_CHAOS_SCALE, the factor of a long run by hand (each test says what it multiplies); 1 when unset,
/// empty, zero or negative. CI runs the default.
double chaos_scale();

/// A fresh directory under the system's temporary directory for a test's pipeline files, logs, checkpoints and
/// output, named <prefix>_<pid>_<time>_<n>.
fs::path make_test_dir(const std::string& prefix);
/// Removes `dir` when the test passed; keeps it and says so when it failed (`failed`).
void keep_or_remove(const fs::path& dir, bool failed);

/// The `pipeline:` section of a chaos test's pipeline file: `name`, `parallelism` (2 by default: the sinks behind
/// the key_by; 1 chains them to the transform), a checkpoint every `interval` stored under `checkpoints`,
/// `delivery` (exactly-once, at-least-once), the HTTP endpoint on a free port, then `extra` (whole lines, indented
/// by two spaces).
std::string pipeline_section(const std::string& name, const fs::path& checkpoints, const std::string& interval,
                             const std::string& delivery, const std::string& extra = "", int parallelism = 2);
/// The sink entry `events` (a line under `sink:`): the domain events into `topic`, keyed by entity.
std::string kafka_events_sink(const std::string& bootstrap, const std::string& topic);

// ---------------------------------------------------------------------------------------------------------------

/// A `sluice run FILE` child process. Each start writes stdout and stderr to <log_dir>/<name>-<start>.log. The
/// binary is the build's sluice (SLUICE_BINARY), or SLUICE_CHAOS_BINARY when set (e.g. a build without a fix, to
/// see a test fail). The child inherits the test's environment except SLUICE_FAULT_POINTS, which it gets only
/// from start()'s argument. The destructor SIGKILLs a child still running.
class SluiceProcess {
 public:
  SluiceProcess(std::string name, fs::path pipeline_file, fs::path log_dir);
  ~SluiceProcess();
  SluiceProcess(const SluiceProcess&) = delete;
  SluiceProcess& operator=(const SluiceProcess&) = delete;

  /// Starts the child; `fault_points` (when not empty) goes to it as SLUICE_FAULT_POINTS (e.g.
  /// "files.before-rename=crash@2").
  ::testing::AssertionResult start(const std::string& fault_points = "");

  /// Waits until this start's log satisfies `pred(log)`; fails when the child exits first or at the deadline,
  /// with the log's tail. `what` names the awaited condition in the failure.
  ::testing::AssertionResult wait_log(const std::function<bool(const std::string&)>& pred, const std::string& what,
                                      std::chrono::milliseconds deadline);
  /// Waits until this start's job runs ("' started:" logged) and completed `checkpoints` checkpoints.
  ::testing::AssertionResult wait_running(size_t checkpoints, std::chrono::milliseconds deadline);
  /// Waits for the child to end by itself; false after the deadline.
  bool wait_exit(std::chrono::milliseconds deadline);

  /// True while the child runs (reaps it when it has ended).
  bool alive();
  /// SIGKILL, then reaps it: a crash, not a shutdown.
  void kill_now();
  /// SIGTERM, then SIGKILL when it has not ended within 20 s.
  void stop();

  /// The wait status of the last child that ended (waitpid's).
  int status() const { return status_; }
  /// This start's log, and the log of start number `start` (0-based).
  const fs::path& log() const { return log_; }
  fs::path log_for(int start) const;
  int starts() const { return starts_; }
  /// Every start's log, concatenated.
  std::string all_logs() const;
  /// The last `lines` lines of every start's log, each under a header naming the file.
  std::string tails(size_t lines = 25) const;

 private:
  std::string name_;
  fs::path file_;
  fs::path log_dir_;
  fs::path log_;
  pid_t pid_ = -1;
  int status_ = 0;
  int starts_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------

/// One record read from the topic.
struct KafkaRecord {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;
  std::string value;
  bool tombstone = false;  // a null value (the Kafka sink's tombstone after a delete)
};

/// The JSON object in a record's value; nullopt, and a test failure naming the topic, when it is not one.
std::optional<Value> json_object(const KafkaRecord& r, const std::string& topic);

/// Reads a topic as a consumer of the pipeline's output does: read_committed (only committed transactions, up to
/// the last stable offset), partitions 0..partitions-1 assigned from the beginning, no group offsets. Each record
/// goes to `on_record` in the order read (per partition, offset order).
class CommittedReader {
 public:
  using OnRecord = std::function<void(const KafkaRecord&)>;
  CommittedReader(const std::string& bootstrap, std::string topic, int partitions, OnRecord on_record);
  ~CommittedReader();
  CommittedReader(const CommittedReader&) = delete;
  CommittedReader& operator=(const CommittedReader&) = delete;

  /// Reads what arrives within `d`.
  void read_for(std::chrono::milliseconds d);
  /// Reads until every partition is at its end and nothing arrived for `quiet`; false when `deadline` passed
  /// first. A partition's end is kept across calls (librdkafka reports it once per arrival there).
  bool drain(std::chrono::milliseconds deadline = std::chrono::seconds(60),
             std::chrono::milliseconds quiet = std::chrono::seconds(1));
  /// Reads every partition up to the high watermark it has when called; false when the watermarks cannot be
  /// read or `deadline` passed first.
  bool drain_to_watermarks(std::chrono::milliseconds deadline = std::chrono::seconds(60));
  /// Records read so far.
  size_t count() const { return count_; }
  const std::string& topic() const { return topic_; }

 private:
  // Polls once (up to `wait`); true when a record came.
  bool poll(std::chrono::milliseconds wait);

  std::string topic_;
  int partitions_;
  OnRecord on_record_;
  testing::kafka::Client consumer_;
  std::set<int32_t> at_end_;
  std::vector<int64_t> next_;
  size_t count_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------

/// What a consumer saw against what it must see, per key (an entity), counted over all keys.
struct SequenceTally {
  size_t missing = 0;         // expected items never seen (or seen fewer times than expected)
  size_t duplicated = 0;      // expected items seen more times than expected: the surplus
  size_t unexpected = 0;      // items seen that are not expected at all (of the key, or keys not expected)
  size_t out_of_order = 0;    // keys whose items, surplus and unexpected ones aside, come in another order
  std::string first_problem;  // the first key that differs, with both sequences

  bool clean() const { return missing == 0 && duplicated == 0 && unexpected == 0 && out_of_order == 0; }
};

/// Compares, per key, `got` (in consumption order) with `want` (in the order the source made them). An item
/// expected k times counts its first k sightings; later ones are duplicates. Order is checked on those first
/// sightings against `want` without its missing items, so a loss is not also counted as a reordering.
template <class K, class V>
SequenceTally compare_sequences(const std::map<K, std::vector<V>>& want, const std::map<K, std::vector<V>>& got) {
  SequenceTally t;
  std::set<K> keys;
  for (const auto& [k, l] : want)
    keys.insert(k);
  for (const auto& [k, l] : got)
    keys.insert(k);
  static const std::vector<V> kNone;
  for (const K& k : keys) {
    auto wi = want.find(k);
    auto gi = got.find(k);
    const std::vector<V>& w = wi != want.end() ? wi->second : kNone;
    const std::vector<V>& g = gi != got.end() ? gi->second : kNone;
    if (w == g) continue;
    std::map<V, size_t> wanted;
    for (const V& v : w)
      ++wanted[v];
    std::map<V, size_t> seen;
    std::vector<V> got_kept;  // first sightings of expected items
    for (const V& v : g) {
      auto it = wanted.find(v);
      if (it == wanted.end()) {
        ++t.unexpected;
      } else if (++seen[v] > it->second) {
        ++t.duplicated;
      } else {
        got_kept.push_back(v);
      }
    }
    std::map<V, size_t> used;
    std::vector<V> want_kept;  // expected items that were seen
    for (const V& v : w) {
      if (++used[v] <= seen[v]) {
        want_kept.push_back(v);
      } else {
        ++t.missing;
      }
    }
    if (got_kept != want_kept) ++t.out_of_order;
    if (t.first_problem.empty()) {
      t.first_problem = "key " + ::testing::PrintToString(k) + ": want " + ::testing::PrintToString(w) + ", got " +
                        ::testing::PrintToString(g);
    }
  }
  return t;
}

/// How many ids occur more than once: the sum of (occurrences - 1).
size_t count_duplicates(const std::vector<std::string>& ids);

}  // namespace sluice::chaos
