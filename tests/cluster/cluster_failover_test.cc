// Failover across processes: a TaskManager SIGKILLed while a keyed job writes exactly-once to Kafka.
// `sluice jobmanager` + 3 `sluice taskmanager` children of 2 slots (tests/cluster/cluster_harness.h) run datagen ->
// transform -> key_by -> Kafka (delivery: exactly-once, transactions committed on NotifyCheckpointComplete) at
// parallelism 4, checkpoints every 200 ms. After at least one checkpoint completed and records were committed,
// the TaskManager holding the source is killed with SIGKILL; the JobManager cancels the rest, restarts the job
// (fixed-delay) from the latest completed checkpoint on the remaining TaskManagers' slots, and the bounded job
// finishes. A read_committed consumer then counts missing and duplicated records and checks each key's revisions
// are in order. The seed (datagen's seed and the kill's delay) is printed; SLUICE_CHAOS_SEED replays one.
// Needs the Kafka service (scripts/services/kafka). About 20-40 s on a loaded two-core machine.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "cluster/cluster_harness.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/services.h"

namespace sluice::testing::cluster {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using Clock = std::chrono::steady_clock;

constexpr auto kStart = 60s;
const std::vector<std::string> kOptions = {"heartbeat.interval=250ms", "heartbeat.timeout=3s",
                                           "cluster.registration.initial-timeout=50ms",
                                           "cluster.registration.max-timeout=500ms"};
constexpr int64_t kEntities = 97;

uint64_t chaos_seed() {
  if (const char* s = std::getenv("SLUICE_CHAOS_SEED")) return std::stoull(s);
  return std::random_device{}();
}

TEST(ClusterFailoverTest, AKilledTaskManagerIsReplacedFromTheLatestCheckpointAndKafkaGetsEveryRecordOnce) {
  const std::string servers = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS");
  ASSERT_FALSE(servers.empty());
  const uint64_t seed = chaos_seed();
  std::mt19937_64 rng(seed);
  const int64_t kill_after_ms = 300 + static_cast<int64_t>(rng() % 1500);
  const int64_t datagen_seed = static_cast<int64_t>(rng() % 1000000);
  std::cout << "seed " << seed << " (SLUICE_CHAOS_SEED to replay): datagen seed " << datagen_seed << ", kill "
            << kill_after_ms << " ms after the first committed record\n";

  const std::string topic = tk::unique_topic("cluster-failover");
  ASSERT_TRUE(tk::create_topic(servers, topic, 4));
  const fs::path dir = fs::temp_directory_path() / ("sluice-cluster-failover-" + std::to_string(::getpid()) + "-" +
                                                    std::to_string(Clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  // 30,000 records at 5,000/s: about 6 s of input, so the kill falls in the middle.
  constexpr int64_t kCount = 30'000;
  const fs::path file = dir / "failover.yaml";
  {
    std::ofstream f(file);
    f << "pipeline:\n  name: cluster-failover-test\n  parallelism: 4\n  delivery: exactly-once\n"
      << "  checkpoint: { interval: 200ms, storage: \"file://" << (dir / "chk").string() << "\" }\n"
      << "  restart: { strategy: fixed-delay, attempts: 5, delay: 200ms }\n"
      << "source: { type: datagen, count: " << kCount << ", rate: 5000, entities: " << kEntities
      << ", seed: " << datagen_seed << " }\n"
      << "transform:\n  - match: \"*.*.*\"\n    key: after.id\n"
      << "    event:\n      payload: \"after.id AS id, after.revision AS revision\"\n"
      << "sink:\n  out:\n    type: kafka\n    bootstrap-servers: \"" << servers << "\"\n    topic: " << topic << "\n"
      << "    transactional-id-prefix: " << topic << "\n"
      << "    properties: { transaction.timeout.ms: \"60000\" }\n";
  }

  // The read_committed consumer runs from the start: it also shows when the first transaction committed.
  tk::Client consumer = tk::make_client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", servers},
                                                            {"group.id", topic + "-verifier"},
                                                            {"isolation.level", "read_committed"},
                                                            {"auto.offset.reset", "earliest"},
                                                            {"enable.partition.eof", "false"}});
  ASSERT_TRUE(consumer);
  rd_kafka_poll_set_consumer(consumer.get());
  rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
  ASSERT_EQ(rd_kafka_subscribe(consumer.get(), topics), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(topics);
  const std::regex rec(R"re("payload":\{"id":"ch_(\d+)","revision":(\d+)\})re");
  std::map<int64_t, std::set<int64_t>> seen;
  std::map<int64_t, int64_t> last;
  int64_t records = 0, duplicated = 0, out_of_order = 0, malformed = 0;
  // Reads what is there: waits up to `timeout_ms` for the first message, then takes every one already fetched.
  auto poll_once = [&](int timeout_ms) {
    for (int wait = timeout_ms;; wait = 0) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), wait);
      if (m == nullptr) return;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && m->payload != nullptr) {
        const std::string value(static_cast<const char*>(m->payload), m->len);
        std::smatch match;
        if (std::regex_search(value, match, rec)) {
          const int64_t entity = std::stoll(match[1]);
          const int64_t revision = std::stoll(match[2]);
          ++records;
          if (!seen[entity].insert(revision).second) ++duplicated;
          auto it = last.find(entity);
          if (it != last.end() && revision <= it->second) ++out_of_order;
          last[entity] = revision;
        } else {
          ++malformed;
        }
      }
      rd_kafka_message_destroy(m);
    }
  };
  auto distinct = [&] {
    int64_t n = 0;
    for (const auto& [e, revs] : seen)
      n += static_cast<int64_t>(revs.size());
    return n;
  };

  ClusterHarness c(file.string(), kOptions);
  ChildProcess* jm = c.start_jobmanager();
  ASSERT_NE(jm, nullptr);
  std::vector<ChildProcess*> tms;
  for (int i = 0; i < 3; ++i)
    tms.push_back(c.start_taskmanager(2));
  // (A deployment can race a TaskManager's registration and be refused as stale: the restart strategy deploys
  // again, so the attempt that runs is not always attempt 0.)
  ASSERT_TRUE(jm->await_line(std::regex("RUNNING: 5 task\\(s\\) on 2 TaskManager\\(s\\)"), kStart)) << c.logs();
  // A checkpoint completed and its transactions are visible to read_committed.
  ASSERT_TRUE(poll_until(
      [&] {
        poll_once(50);
        return records > 0 && jm->count("completed checkpoint ") > 0;
      },
      kStart))
      << c.logs();
  const auto first_commit = Clock::now();
  while (Clock::now() - first_commit < std::chrono::milliseconds(kill_after_ms))
    poll_once(20);
  // The TaskManager holding the source (3 tasks: the source and two sink subtasks) in the running attempt.
  const int running_before = jm->count("RUNNING: 5 task(s)");
  std::string source_tm;
  {
    const std::regex deployed(R"re(deployed 3 task\(s\) to TaskManager (\S+) \(attempt)re");
    const std::string out = jm->output();
    for (auto it = std::sregex_iterator(out.begin(), out.end(), deployed); it != std::sregex_iterator(); ++it)
      source_tm = (*it)[1];
  }
  ChildProcess* victim = nullptr;
  for (ChildProcess* tm : tms) {
    if (!source_tm.empty() && tm->count("TaskManager " + source_tm + " with") > 0) victim = tm;
  }
  ASSERT_NE(victim, nullptr) << source_tm << "\n" << c.logs();
  const int checkpoints_before = jm->count("completed checkpoint ");
  victim->signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_TRUE(victim->wait_exit(10s).has_value());
  std::cout << "SIGKILLed the source's TaskManager (pid " << victim->pid() << ") after " << checkpoints_before
            << " completed checkpoint(s) and " << records << " committed records\n";

  // The job runs again as attempt 1 (or later) on the remaining TaskManagers.
  ASSERT_TRUE(poll_until(
      [&] {
        poll_once(10);
        return jm->count("RUNNING: 5 task(s)") > running_before;
      },
      kStart))
      << c.logs();
  const auto running_again = Clock::now();
  const int64_t records_at_restart = records;
  ASSERT_TRUE(poll_until(
      [&] {
        poll_once(10);
        return records > records_at_restart;
      },
      kStart))
      << c.logs();
  const auto first_new_commit = Clock::now();
  // The failure is in the job's exception history, newest first, marked as restarted (Flink's shape); the job
  // list's last-failure is that newest entry.
  {
    const auto history = c.get("/jobs/" + c.job_id() + "/exceptions");
    ASSERT_TRUE(history.has_value());
    const Value* entries = history->at_path("exceptionHistory.entries");
    ASSERT_TRUE(entries != nullptr && entries->is_array() && !entries->as_array().empty()) << history->to_json();
    const Value& newest = entries->as_array().front();
    EXPECT_TRUE(newest.find("restarted") != nullptr && newest.find("restarted")->as_bool()) << history->to_json();
    const std::vector<Value>& all = entries->as_array();
    for (size_t i = 1; i < all.size(); ++i) {
      EXPECT_GE(num(all[i - 1], "timestamp"), num(all[i], "timestamp")) << "newest first: " << history->to_json();
    }
    const auto jobs = c.get("/jobs");
    ASSERT_TRUE(jobs.has_value());
    const Value* last = jobs->at_path("jobs[0].last-failure.message");
    ASSERT_TRUE(last != nullptr && last->is_string()) << jobs->to_json();
    EXPECT_EQ(std::string(last->as_string()), str(newest, "message")) << jobs->to_json();
  }
  std::cout << "recovery: RUNNING again "
            << std::chrono::duration_cast<std::chrono::milliseconds>(running_again - killed).count()
            << " ms after the kill, first newly committed record read "
            << std::chrono::duration_cast<std::chrono::milliseconds>(first_new_commit - killed).count()
            << " ms after it\n";

  const std::optional<int> code = jm->wait_exit(90s);
  ASSERT_TRUE(code.has_value()) << "the job did not finish after the failover\n" << c.logs();
  EXPECT_EQ(*code, 0) << c.logs();
  EXPECT_GE(jm->count("RESTARTING"), 1) << jm->output();
  // Read what is committed until every record is there (or the deadline).
  const auto finished = Clock::now();
  poll_until(
      [&] {
        poll_once(100);
        return distinct() >= kCount;
      },
      90s);
  std::cout << distinct() << " distinct records after the wait; every record visible to read_committed "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - finished).count()
            << " ms after the job finished\n";
  // A little longer, so that duplicates committed after the last new record would be seen.
  const auto drain = Clock::now();
  while (Clock::now() - drain < 1s)
    poll_once(100);
  rd_kafka_consumer_close(consumer.get());
  const int64_t missing = kCount - distinct();
  std::cout << records << " records read_committed of " << kCount << ": " << missing << " missing, " << duplicated
            << " duplicated, " << out_of_order << " out of order, " << malformed << " malformed (seed " << seed
            << ")\n";
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(malformed, 0);
  if (HasFailure() || std::getenv("SLUICE_TEST_LOGS") != nullptr) {
    std::cerr << c.logs();
  } else {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

}  // namespace
}  // namespace sluice::testing::cluster
