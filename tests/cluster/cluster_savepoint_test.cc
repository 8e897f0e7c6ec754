// Savepoints and rescaling in cluster mode, with real processes and real Kafka. One job writes exactly-once to
// Kafka through four runs chained by stop-with-savepoint (`sluice stop`, the REST API's POST /jobs/:id/stop):
//   1. `sluice jobmanager` + 2 TaskManagers of 2 slots at parallelism 4, stopped with a savepoint;
//   2. restored from it with `sluice jobmanager -s` at parallelism 6 on 3 TaskManagers, stopped again;
//   3. restored from the cluster's savepoint by `sluice run -s -p 3` (local mode), stopped with a savepoint;
//   4. the local savepoint restored by `sluice jobmanager -s` at parallelism 2 on 1 TaskManager, run to the end.
// Each run's keyed sink state (Kafka transactions) moves by key group / round robin to the new parallelism, and
// the source's position comes back from each savepoint. A read_committed consumer then counts missing and
// duplicated records and checks that each key's revisions are in order across the four runs. The seed is printed
// (SLUICE_CHAOS_SEED replays one). Needs the Kafka service (scripts/services/kafka). About 30-60 s.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "cluster/cluster_harness.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;
// These tests stop, rescale and resume through savepoints with `restart: none`; none of them loses a TaskManager.
// heartbeat.timeout is 15 s, not the 3 s of the failover tests, so that a heartbeat stalled for a few seconds on a
// loaded CI machine (seen: 3.5 s on 2 cores shared by parallel tests) does not declare the TaskManager lost and fail
// the job.
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=15s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};
constexpr int64_t kEntities = 61;
constexpr int64_t kCount = 40'000;

uint64_t chaos_seed() {
  if (const char* s = std::getenv("SLUICE_CHAOS_SEED")) return std::stoull(s);
  return std::random_device{}();
}

/// Reads the output topic read_committed: each record's entity and revision.
class CommittedReader {
 public:
  CommittedReader(const std::string& servers, const std::string& topic) {
    consumer_ = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", servers},
                                                    {"group.id", topic + "-verifier"},
                                                    {"isolation.level", "read_committed"},
                                                    {"auto.offset.reset", "earliest"},
                                                    {"enable.partition.eof", "false"}});
    if (!consumer_) return;
    rd_kafka_poll_set_consumer(consumer_.get());
    rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(consumer_.get(), topics);
    rd_kafka_topic_partition_list_destroy(topics);
  }
  ~CommittedReader() {
    if (consumer_) rd_kafka_consumer_close(consumer_.get());
  }
  bool ok() const { return static_cast<bool>(consumer_); }
  /// Waits up to `timeout_ms` for the first message, then takes every one already fetched.
  void poll(int timeout_ms) {
    static const std::regex rec(R"re("payload":\{"id":"ch_(\d+)","revision":(\d+)\})re");
    for (int wait = timeout_ms;; wait = 0) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer_.get(), wait);
      if (m == nullptr) return;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && m->payload != nullptr) {
        const std::string value(static_cast<const char*>(m->payload), m->len);
        std::smatch match;
        if (std::regex_search(value, match, rec)) {
          const int64_t entity = std::stoll(match[1]);
          const int64_t revision = std::stoll(match[2]);
          ++records;
          if (!seen[entity].insert(revision).second) ++duplicated;
          // pipeline.entity-version: the n-th record of an entity says n (keyed state across every run).
          static const std::regex version_field(R"re("entity_version":(\d+))re");
          std::smatch v;
          if (!std::regex_search(value, v, version_field)) {
            ++without_version;
          } else if (std::stoll(v[1]) != ++versions[entity]) {
            ++version_mismatch;
          }
          auto it = last.find(entity);
          if (it != last.end() && revision <= it->second) ++out_of_order;
          last[entity] = revision;
        } else {
          ++malformed;
        }
      }
      rd_kafka_message_destroy(m);
    }
  }
  int64_t distinct() const {
    int64_t n = 0;
    for (const auto& [e, revs] : seen)
      n += static_cast<int64_t>(revs.size());
    return n;
  }

  std::map<int64_t, std::set<int64_t>> seen;
  std::map<int64_t, int64_t> last;
  int64_t records = 0, duplicated = 0, out_of_order = 0, malformed = 0;
  std::map<int64_t, int64_t> versions;  // per entity: records read
  int64_t without_version = 0, version_mismatch = 0;

 private:
  tk::Client consumer_;
};

/// Runs `sluice stop -m HOST:PORT JOB` and returns the savepoint's path ("" on failure, with the output added).
std::string stop_with_savepoint(const std::string& rest_url, const std::string& job_id, std::string& output) {
  const std::string hostport = rest_url.substr(rest_url.find("://") + 3);
  ChildProcess stop("sluice stop", {"stop", "-m", hostport, job_id, "--timeout", "60"});
  const std::optional<int> code = stop.wait_exit(90s);
  output = stop.output();
  if (!code || *code != 0) return "";
  std::smatch m;
  static const std::regex path(R"(Savepoint completed\. Path: (\S+))");
  if (!std::regex_search(output, m, path)) return "";
  return m[1];
}

/// Waits until `more` records were committed after the first `committed_before` (so checkpoints of this run
/// completed: an exactly-once sink commits on them).
::testing::AssertionResult await_progress(ChildProcess& p, CommittedReader& reader, int64_t committed_before,
                                          int64_t more) {
  const bool ok = poll_until(
      [&] {
        reader.poll(50);
        return reader.records >= committed_before + more;
      },
      kStart);
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no progress: " << reader.records << " records read (before "
                                       << committed_before << ")\n"
                                       << p.output();
}

TEST(ClusterSavepointTest, StopWithSavepointRescalesAcrossTaskManagersAndLocalModeAndKafkaGetsEveryRecordOnce) {
  const std::string servers = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  ASSERT_FALSE(servers.empty());
  const uint64_t seed = chaos_seed();
  std::mt19937_64 rng(seed);
  const int64_t datagen_seed = static_cast<int64_t>(rng() % 1000000);
  // How many committed records each run waits for before it is stopped (varies where the savepoints fall).
  std::vector<int64_t> progress;
  for (int i = 0; i < 3; ++i)
    progress.push_back(1000 + static_cast<int64_t>(rng() % 3000));
  std::cout << "seed " << seed << " (SLUICE_CHAOS_SEED to replay): datagen seed " << datagen_seed << ", stops after "
            << progress[0] << ", " << progress[1] << ", " << progress[2] << " more committed records\n";

  const std::string topic = tk::unique_topic("cluster-savepoint");
  ASSERT_TRUE(tk::create_topic(servers, topic, 4));
  const fs::path dir = fs::temp_directory_path() / ("sluice-cluster-savepoint-" + std::to_string(::getpid()) + "-" +
                                                    std::to_string(Clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  // 40,000 records at 2,000/s: about 20 s of input over the four runs.
  const fs::path file = dir / "savepoint.yaml";
  {
    std::ofstream f(file);
    f << "pipeline:\n  name: cluster-savepoint-test\n  parallelism: 4\n  delivery: exactly-once\n"
      << "  entity-version: true\n"
      << "  checkpoint: { interval: 300ms, storage: \"file://" << (dir / "chk").string() << "\" }\n"
      << "  restart: { strategy: none }\n"
      << "source: { type: datagen, count: " << kCount << ", rate: 2000, entities: " << kEntities
      << ", seed: " << datagen_seed << " }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: kafka\n    bootstrap-servers: \"" << servers << "\"\n    topic: " << topic << "\n"
      << "    transactional-id-prefix: " << topic << "\n"
      << "    properties: { transaction.timeout.ms: \"60000\" }\n";
  }
  CommittedReader reader(servers, topic);
  ASSERT_TRUE(reader.ok());
  std::string stop_output;

  // 1. Parallelism 4 on 2 TaskManagers of 2 slots, stopped with a savepoint.
  std::string savepoint1;
  {
    ClusterHarness c(file.string(), kOptions);
    ChildProcess* jm = c.start_jobmanager();
    ASSERT_NE(jm, nullptr);
    c.start_taskmanager(2);
    c.start_taskmanager(2);
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c.logs();
    ASSERT_TRUE(await_progress(*jm, reader, 0, progress[0]));
    savepoint1 = stop_with_savepoint(c.rest_url(), c.job_id(), stop_output);
    ASSERT_FALSE(savepoint1.empty()) << stop_output << c.logs();
    const std::optional<int> code = jm->wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
    EXPECT_EQ(jm->count("FINISHED"), 2) << jm->output();  // the job's end and the JobManager's
  }
  std::cout << "run 1 (cluster, parallelism 4, 2 TaskManagers): stopped with savepoint " << savepoint1 << " after "
            << reader.records << " committed records\n";
  ASSERT_TRUE(fs::exists(fs::path(savepoint1) / "_metadata"));
  const int64_t after1 = reader.records;

  // 2. From that savepoint at parallelism 6 on 3 TaskManagers (-s), stopped again.
  std::string savepoint2;
  {
    std::vector<std::string> options = kOptions;
    options.push_back("parallelism.default=6");
    ClusterHarness c(file.string(), options);
    ChildProcess* jm = c.start_jobmanager(0, 60s, {"-s", savepoint1});
    ASSERT_NE(jm, nullptr);
    for (int i = 0; i < 3; ++i)
      c.start_taskmanager(2);
    ASSERT_TRUE(jm->await_line(std::regex("starts from stop-with-savepoint"), kStart)) << c.logs();
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 7 task\\(s\\) on 3 TaskManager\\(s\\)"), kStart)) << c.logs();
    ASSERT_TRUE(await_progress(*jm, reader, after1, progress[1]));
    savepoint2 = stop_with_savepoint(c.rest_url(), c.job_id(), stop_output);
    ASSERT_FALSE(savepoint2.empty()) << stop_output << c.logs();
    const std::optional<int> code = jm->wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
  }
  std::cout << "run 2 (cluster, parallelism 6, 3 TaskManagers): stopped with savepoint " << savepoint2 << " after "
            << reader.records << " committed records\n";
  const int64_t after2 = reader.records;

  // 3. The cluster's savepoint restored in local mode at parallelism 3, stopped with a savepoint.
  std::string savepoint3;
  {
    ChildProcess run("sluice run", {"run", file.string(), "-s", savepoint2, "-p", "3", "--rest-port", "0"});
    static const std::regex rest_line(
        R"(REST API, /metrics and /health at (http://[0-9.]+:[0-9]+), job id ([0-9a-f]+))");
    auto rest = run.await_line(rest_line, kStart);
    ASSERT_TRUE(rest.has_value()) << run.output();
    ASSERT_TRUE(await_progress(run, reader, after2, progress[2]));
    savepoint3 = stop_with_savepoint((*rest)[1], (*rest)[2], stop_output);
    ASSERT_FALSE(savepoint3.empty()) << stop_output << run.output();
    const std::optional<int> code = run.wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << run.output();
    EXPECT_EQ(*code, 0) << run.output();
  }
  std::cout << "run 3 (local, parallelism 3): stopped with savepoint " << savepoint3 << " after " << reader.records
            << " committed records\n";

  // 4. The local savepoint restored by a cluster at parallelism 2 on 1 TaskManager; it runs to the end.
  {
    std::vector<std::string> options = kOptions;
    options.push_back("parallelism.default=2");
    ClusterHarness c(file.string(), options);
    ChildProcess* jm = c.start_jobmanager(0, 60s, {"--from-savepoint", savepoint3});
    ASSERT_NE(jm, nullptr);
    c.start_taskmanager(2);
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 3 task\\(s\\) on 1 TaskManager\\(s\\)"), kStart)) << c.logs();
    const std::optional<int> code = jm->wait_exit(90s);
    ASSERT_TRUE(code.has_value()) << "the last run did not finish\n" << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
  }
  poll_until(
      [&] {
        reader.poll(100);
        return reader.distinct() >= kCount;
      },
      60s);
  // A little longer, so that duplicates committed after the last new record would be seen.
  const auto drain = Clock::now();
  while (Clock::now() - drain < 1s)
    reader.poll(100);
  const int64_t missing = kCount - reader.distinct();
  std::cout << reader.records << " records read_committed of " << kCount << " over 4 runs: " << missing << " missing, "
            << reader.duplicated << " duplicated, " << reader.out_of_order << " out of order, " << reader.malformed
            << " malformed; entity_version: " << reader.version_mismatch << " not the entity's count so far, "
            << reader.without_version << " missing (seed " << seed << ")\n";
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(reader.duplicated, 0);
  EXPECT_EQ(reader.out_of_order, 0);
  EXPECT_EQ(reader.malformed, 0);
  EXPECT_EQ(reader.version_mismatch, 0);
  EXPECT_EQ(reader.without_version, 0);
  if (!HasFailure() && std::getenv("SLUICE_TEST_LOGS") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

// A change event of entity `entity` at `revision`, as the Kafka source reads them (the change-event envelope).
std::string change_event(int64_t entity, int64_t revision, int64_t n) {
  return fmt::format(
      R"({{"op":"u","key":{{"id":"ch_{0}"}},"before":null,"after":{{"id":"ch_{0}","revision":{1}}},)"
      R"("source":{{"connector":"postgres","db":"payments","collection":"public.charges","position":"0/{2:X}",)"
      R"("ts_ms":1790000000000,"snapshot":false,"txn_id":{2},"sequence":1}}}})",
      entity, revision, n + 1);
}

TEST(ClusterSavepointTest, KafkaSourceOffsetsMoveWithTheReadersWhenTheJobRescalesThroughSavepoints) {
  const std::string servers = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  ASSERT_FALSE(servers.empty());
  const uint64_t seed = chaos_seed();
  std::mt19937_64 rng(seed);
  std::vector<int64_t> progress;
  for (int i = 0; i < 3; ++i)
    progress.push_back(800 + static_cast<int64_t>(rng() % 2000));
  std::cout << "seed " << seed << " (SLUICE_CHAOS_SEED to replay): stops after " << progress[0] << ", " << progress[1]
            << ", " << progress[2] << " more committed records\n";
  // The producer runs until the last run has started (each run must see new input, however long the runs before
  // it took: with a fixed 16,000 records a slow machine consumed them all in runs 1 and 2 and run 3 waited for
  // progress that could not come), at most kMaxRecords.
  constexpr int64_t kMaxRecords = 400'000;
  constexpr int64_t kKeys = 53;
  const std::string in = tk::unique_topic("cluster-savepoint-in");
  const std::string out = tk::unique_topic("cluster-savepoint-out");
  ASSERT_TRUE(tk::create_topic(servers, in, 4));
  ASSERT_TRUE(tk::create_topic(servers, out, 4));
  const fs::path dir = fs::temp_directory_path() / ("sluice-cluster-savepoint-kafka-" + std::to_string(::getpid()) +
                                                    "-" + std::to_string(Clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  // One file per source parallelism (the readers of a checkpointed source run in one TaskManager).
  auto pipeline = [&](int source_parallelism) {
    const fs::path file = dir / ("kafka-source-p" + std::to_string(source_parallelism) + ".yaml");
    std::ofstream f(file);
    f << "pipeline:\n  name: cluster-savepoint-kafka\n  parallelism: 4\n  delivery: exactly-once\n"
      << "  entity-version: true\n"
      << "  checkpoint: { interval: 300ms, storage: \"file://" << (dir / "chk").string() << "\" }\n"
      << "  restart: { strategy: none }\n"
      << "source:\n  type: kafka\n  bootstrap-servers: \"" << servers << "\"\n  topics: [" << in << "]\n"
      << "  group-id: " << in << "\n  start: earliest\n  parallelism: " << source_parallelism << "\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: kafka\n    bootstrap-servers: \"" << servers << "\"\n    topic: " << out << "\n"
      << "    transactional-id-prefix: " << out << "\n"
      << "    properties: { transaction.timeout.ms: \"60000\" }\n";
    return file.string();
  };
  // The input arrives while the runs go (about 2,000 changes/s, keyed by entity: each entity's changes in one
  // partition, in revision order); the pace only spreads the input over the runs.
  std::atomic<bool> stop_producing{false};
  std::atomic<int64_t> produced{0};
  std::thread producer([&] {
    tk::Client p = tk::make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", servers}, {"linger.ms", "5"}});
    if (!p) return;
    std::map<int64_t, int64_t> revision;
    for (int64_t n = 0; n < kMaxRecords && !stop_producing.load(); ++n) {
      const int64_t entity = n % kKeys;
      const std::string key = "ch_" + std::to_string(entity);
      const std::string value = change_event(entity, ++revision[entity], n);
      while (rd_kafka_producev(p.get(), RD_KAFKA_V_TOPIC(in.c_str()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                               RD_KAFKA_V_KEY(key.data(), key.size()),
                               RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                               RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        rd_kafka_poll(p.get(), 10);
      }
      rd_kafka_poll(p.get(), 0);
      produced.store(n + 1);
      if (n % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // pacing, not a wait
    }
    rd_kafka_flush(p.get(), 60'000);
  });
  struct JoinProducer {
    std::thread& t;
    std::atomic<bool>& stop;
    ~JoinProducer() {
      stop.store(true);
      if (t.joinable()) t.join();
    }
  } join_producer{producer, stop_producing};

  CommittedReader reader(servers, out);
  ASSERT_TRUE(reader.ok());
  std::string stop_output;

  // 1. Parallelism 4 on 2 TaskManagers of 2 slots, 2 source readers (both in the first TaskManager's slots).
  std::string savepoint1;
  {
    ClusterHarness c(pipeline(2), kOptions);
    ChildProcess* jm = c.start_jobmanager();
    ASSERT_NE(jm, nullptr);
    c.start_taskmanager(2);
    c.start_taskmanager(2);
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 6 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c.logs();
    ASSERT_TRUE(await_progress(*jm, reader, 0, progress[0]));
    savepoint1 = stop_with_savepoint(c.rest_url(), c.job_id(), stop_output);
    ASSERT_FALSE(savepoint1.empty()) << stop_output << c.logs();
    const std::optional<int> code = jm->wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
  }
  std::cout << "run 1 (cluster, parallelism 4, 2 Kafka readers, 2 TaskManagers): savepoint after " << reader.records
            << " committed records (" << produced.load() << " produced)\n";
  const int64_t after1 = reader.records;

  // 2. Parallelism 6 and 3 readers on 2 TaskManagers of 3 slots: the 4 partitions' offsets move round robin.
  std::string savepoint2;
  {
    std::vector<std::string> options = kOptions;
    options.push_back("parallelism.default=6");
    ClusterHarness c(pipeline(3), options);
    ChildProcess* jm = c.start_jobmanager(0, 60s, {"-s", savepoint1});
    ASSERT_NE(jm, nullptr);
    c.start_taskmanager(3);
    c.start_taskmanager(3);
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 9 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c.logs();
    ASSERT_TRUE(await_progress(*jm, reader, after1, progress[1]));
    savepoint2 = stop_with_savepoint(c.rest_url(), c.job_id(), stop_output);
    ASSERT_FALSE(savepoint2.empty()) << stop_output << c.logs();
    const std::optional<int> code = jm->wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
  }
  std::cout << "run 2 (cluster, parallelism 6, 3 Kafka readers, 2 TaskManagers): savepoint after " << reader.records
            << " committed records (" << produced.load() << " produced)\n";
  const int64_t after2 = reader.records;

  // 3. Local mode, one reader, parallelism 3.
  std::string savepoint3;
  {
    ChildProcess run("sluice run", {"run", pipeline(1), "-s", savepoint2, "-p", "3", "--rest-port", "0"});
    static const std::regex rest_line(
        R"(REST API, /metrics and /health at (http://[0-9.]+:[0-9]+), job id ([0-9a-f]+))");
    auto rest = run.await_line(rest_line, kStart);
    ASSERT_TRUE(rest.has_value()) << run.output();
    ASSERT_TRUE(await_progress(run, reader, after2, progress[2]));
    savepoint3 = stop_with_savepoint((*rest)[1], (*rest)[2], stop_output);
    ASSERT_FALSE(savepoint3.empty()) << stop_output << run.output();
    const std::optional<int> code = run.wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << run.output();
    EXPECT_EQ(*code, 0) << run.output();
  }
  std::cout << "run 3 (local, parallelism 3, 1 Kafka reader): savepoint after " << reader.records
            << " committed records (" << produced.load() << " produced)\n";

  const int64_t after3 = reader.records;

  // 4. Parallelism 2 with 2 readers on 1 TaskManager, until every change is through; then stopped.
  int64_t records = 0;  // all the producer wrote, known once it stopped
  {
    std::vector<std::string> options = kOptions;
    options.push_back("parallelism.default=2");
    ClusterHarness c(pipeline(2), options);
    ChildProcess* jm = c.start_jobmanager(0, 60s, {"-s", savepoint3});
    ASSERT_NE(jm, nullptr);
    c.start_taskmanager(2);
    ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 4 task\\(s\\) on 1 TaskManager\\(s\\)"), kStart)) << c.logs();
    ASSERT_TRUE(await_progress(*jm, reader, after3, 500));  // new input through the last run's readers too
    stop_producing.store(true);
    producer.join();
    records = produced.load();
    ASSERT_LT(records, kMaxRecords) << "the producer ran out of records before the last run started";
    ASSERT_TRUE(poll_until(
        [&] {
          reader.poll(100);
          return reader.distinct() >= records;
        },
        90s))
        << reader.distinct() << " of " << records << "\n"
        << c.logs();
    const std::string last = stop_with_savepoint(c.rest_url(), c.job_id(), stop_output);
    EXPECT_FALSE(last.empty()) << stop_output << c.logs();
    const std::optional<int> code = jm->wait_exit(60s);
    ASSERT_TRUE(code.has_value()) << c.logs();
    EXPECT_EQ(*code, 0) << c.logs();
  }
  const auto drain = Clock::now();
  while (Clock::now() - drain < 1s)
    reader.poll(100);
  const int64_t missing = records - reader.distinct();
  std::cout << reader.records << " records read_committed of " << records << " over 4 runs: " << missing << " missing, "
            << reader.duplicated << " duplicated, " << reader.out_of_order << " out of order, " << reader.malformed
            << " malformed; entity_version: " << reader.version_mismatch << " not the entity's count so far, "
            << reader.without_version << " missing (seed " << seed << ")\n";
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(reader.duplicated, 0);
  EXPECT_EQ(reader.out_of_order, 0);
  EXPECT_EQ(reader.malformed, 0);
  EXPECT_EQ(reader.version_mismatch, 0);
  EXPECT_EQ(reader.without_version, 0);
  if (!HasFailure() && std::getenv("SLUICE_TEST_LOGS") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

}  // namespace
}  // namespace sluice::testing::cluster
