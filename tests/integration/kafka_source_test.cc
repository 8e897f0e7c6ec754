// The Kafka source against the real broker of scripts/services/kafka (docs/services.md):
//  * a pre-filled multi-partition topic read in bounded mode: every record exactly once, in offset order per
//    partition; under read_committed the bound is the last stable offset (an open transaction does not hang it);
//  * offsets reach the consumer group only when a checkpoint (here a savepoint) completes;
//  * stop with a savepoint, write more, restore at another parallelism: every value exactly once;
//  * starting offsets: committed (with either reset strategy, and `none` failing), and by timestamp;
//  * a poison record fails the job naming its position, or goes to a dead-letter file / topic;
//  * metrics(): records and bytes read, bad records, lag while records wait unread and 0 once read, current
//    offsets at the partitions' ends, committed offsets after a completed checkpoint;
//  * partitions added while the job runs are read;
//  * an empty partition turns idle and does not stall an event-time window.
// Run: scripts/services/run-with kafka -- ctest --test-dir build/<dir> -L integration -R KafkaSource
#include "sluice/connectors/kafka/kafka_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"
#include "sluice/api/sink.h"
#include "sluice/api/stream_environment.h"
#include "sluice/api/windowing.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace tk = sluice::testing::kafka;
using namespace std::chrono_literals;
using Rec = KafkaRecord<std::string>;

constexpr auto kDeadline = 120s;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// A fresh directory under /tmp, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("sluice-kafka-source-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(wall_ms()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

/// Records a sink received, with a condition variable to wait on. Thread-safe.
template <class T>
class Received {
 public:
  /// Records block in add() until open() (for backpressure); open from the start by default.
  explicit Received(bool open = true) : open_(open) {}
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  /// Waits until a writer blocks on the closed gate.
  bool wait_for_blocked_writer() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return blocked_ > 0; });
  }
  void add(int subtask, const T& r) {
    std::unique_lock lock(mu_);
    if (!open_) {
      ++blocked_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
      --blocked_;
    }
    if (per_subtask_.size() <= static_cast<size_t>(subtask)) per_subtask_.resize(static_cast<size_t>(subtask) + 1);
    per_subtask_[static_cast<size_t>(subtask)].push_back(r);
    ++count_;
    cv_.notify_all();
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  /// Waits until at least `n` records arrived or `timeout` passed; true when they did.
  bool wait_for(size_t n, std::chrono::milliseconds timeout = kDeadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= n; });
  }
  /// Waits up to `timeout` for the next record (a paced wait for conditions checked elsewhere).
  void wait_a_little(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    const size_t seen = count_;
    cv_.wait_for(lock, timeout, [&] { return count_ != seen; });
  }
  std::vector<std::vector<T>> per_subtask() const {
    std::lock_guard lock(mu_);
    return per_subtask_;
  }
  std::vector<T> all() const {
    std::lock_guard lock(mu_);
    std::vector<T> out;
    for (const auto& v : per_subtask_)
      out.insert(out.end(), v.begin(), v.end());
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<T>> per_subtask_;
  size_t count_ = 0;
  bool open_ = true;
  int blocked_ = 0;
};

template <class T>
class ReceivingSink final : public Sink<T> {
 public:
  explicit ReceivingSink(std::shared_ptr<Received<T>> out) : out_(std::move(out)) {}
  std::unique_ptr<SinkWriter<T>> create_writer(RuntimeContext& ctx) const override {
    return std::make_unique<Writer>(out_, ctx.subtask_index());
  }

 private:
  class Writer final : public SinkWriter<T> {
   public:
    Writer(std::shared_ptr<Received<T>> out, int subtask) : out_(std::move(out)), subtask_(subtask) {}
    void write(const T& r, const SinkWriterContext&) override { out_->add(subtask_, r); }
    void flush(bool) override {}

   private:
    std::shared_ptr<Received<T>> out_;
    int subtask_;
  };
  std::shared_ptr<Received<T>> out_;
};

/// One message to produce.
struct Msg {
  int32_t partition = 0;
  std::string value;
  std::string key;
  int64_t timestamp_ms = 0;  // 0: the producer's time
};

std::string error_of(const JobResult& r) {
  return r.error ? r.error->to_string() : std::string("(no error)");
}

class KafkaSourceIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override { bootstrap_ = sluice::testing::require_service("kafka").get("KAFKA_BOOTSTRAP_SERVERS"); }

  std::string make_topic(const std::string& prefix, int partitions) {
    std::string topic = tk::unique_topic(prefix);
    EXPECT_TRUE(tk::create_topic(bootstrap_, topic, partitions));
    return topic;
  }

  tk::Client producer(const tk::Config& extra = {}) {
    // Idempotent: a retried batch (a fresh topic's leader not known yet) cannot reorder a partition's messages,
    // which the offset and timestamp checks rely on (seen: a timestamp lookup answering 53 instead of 70).
    tk::Config c{
        {"bootstrap.servers", bootstrap_}, {"log_level", "3"}, {"linger.ms", "5"}, {"enable.idempotence", "true"}};
    for (const auto& [k, v] : extra)
      c[k] = v;
    return tk::make_client(RD_KAFKA_PRODUCER, c);
  }

  /// Produces `msgs` (in order) and waits for every delivery.
  void produce(const std::string& topic, const std::vector<Msg>& msgs, rd_kafka_t* p = nullptr) {
    tk::Client own;
    if (p == nullptr) {
      own = producer();
      p = own.get();
    }
    for (const Msg& m : msgs) {
      for (;;) {
        rd_kafka_resp_err_t err =
            rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(m.partition),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_KEY(m.key.empty() ? nullptr : const_cast<char*>(m.key.data()), m.key.size()),
                              RD_KAFKA_V_VALUE(const_cast<char*>(m.value.data()), m.value.size()),
                              RD_KAFKA_V_TIMESTAMP(m.timestamp_ms), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
          rd_kafka_poll(p, 100);
          continue;
        }
        ASSERT_EQ(err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(err);
        break;
      }
    }
    ASSERT_EQ(rd_kafka_flush(p, 60'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }

  /// `per_partition` messages "p:i" (key "k<i>") into each of `partitions` partitions, interleaved.
  void fill(const std::string& topic, int partitions, int per_partition, int first = 0) {
    std::vector<Msg> msgs;
    for (int i = first; i < first + per_partition; ++i) {
      for (int p = 0; p < partitions; ++p)
        msgs.push_back(Msg{p, std::to_string(p) + ":" + std::to_string(i), "k" + std::to_string(i)});
    }
    produce(topic, msgs);
  }

  /// The group's committed offsets of partitions 0..n-1 (-1001 = none).
  std::vector<int64_t> committed(const std::string& group, const std::string& topic, int partitions) {
    tk::Client c = tk::make_client(RD_KAFKA_CONSUMER,
                                   {{"bootstrap.servers", bootstrap_}, {"group.id", group}, {"log_level", "3"}});
    tk::PartitionList list(rd_kafka_topic_partition_list_new(partitions));
    for (int p = 0; p < partitions; ++p)
      rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p);
    std::vector<int64_t> out(static_cast<size_t>(partitions), -2);
    rd_kafka_resp_err_t err = rd_kafka_committed(c.get(), list.get(), 10'000);
    EXPECT_EQ(err, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(err);
    for (int i = 0; i < list->cnt; ++i)
      out[static_cast<size_t>(list->elems[i].partition)] = list->elems[i].offset;
    rd_kafka_consumer_close(c.get());
    return out;
  }

  void commit(const std::string& group, const std::string& topic, const std::map<int, int64_t>& offsets) {
    tk::Client c = tk::make_client(RD_KAFKA_CONSUMER,
                                   {{"bootstrap.servers", bootstrap_}, {"group.id", group}, {"log_level", "3"}});
    tk::PartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(offsets.size())));
    for (const auto& [p, o] : offsets)
      rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p)->offset = o;
    ASSERT_EQ(rd_kafka_commit(c.get(), list.get(), 0), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_consumer_close(c.get());
  }

  void add_partitions(const std::string& topic, int total) {
    tk::Client admin = producer();
    char errstr[512];
    std::unique_ptr<rd_kafka_NewPartitions_t, decltype(&rd_kafka_NewPartitions_destroy)> np(
        rd_kafka_NewPartitions_new(topic.c_str(), static_cast<size_t>(total), errstr, sizeof errstr),
        &rd_kafka_NewPartitions_destroy);
    ASSERT_TRUE(np) << errstr;
    std::unique_ptr<rd_kafka_queue_t, tk::KafkaDeleter> q(rd_kafka_queue_new(admin.get()));
    rd_kafka_NewPartitions_t* arr[] = {np.get()};
    rd_kafka_CreatePartitions(admin.get(), arr, 1, nullptr, q.get());
    std::unique_ptr<rd_kafka_event_t, tk::KafkaDeleter> ev(rd_kafka_queue_poll(q.get(), 60'000));
    ASSERT_TRUE(ev);
    ASSERT_EQ(rd_kafka_event_error(ev.get()), RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_event_error_string(ev.get());
    size_t cnt = 0;
    const rd_kafka_topic_result_t** res =
        rd_kafka_CreatePartitions_result_topics(rd_kafka_event_CreatePartitions_result(ev.get()), &cnt);
    ASSERT_EQ(cnt, 1u);
    ASSERT_EQ(rd_kafka_topic_result_error(res[0]), RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_TRUE(tk::wait_for_topic(admin.get(), topic, total));
  }

  KafkaSourceBuilder<Rec> source(const std::string& topic) {
    return KafkaSource<Rec>::builder()
        .bootstrap_servers(bootstrap_)
        .topics({topic})
        .deserializer(kafka::record(kafka::string_value()))
        .property("log_level", "4");
  }

  static Configuration config(int parallelism) {
    Configuration c;
    c.set(options::kParallelism, parallelism);
    c.set(options::kRestartStrategy, std::string("none"));
    return c;
  }

  static Configuration checkpointing(int parallelism, const fs::path& dir, const std::string& interval) {
    Configuration c = config(parallelism);
    c.set_string(std::string(options::kCheckpointInterval.key), interval);
    c.set(options::kCheckpointDir, "file://" + dir.string());
    return c;
  }

  std::string bootstrap_;
};

/// Checks that `records` hold every "p:i" for i in [from, to) of each partition exactly once, and that each
/// subtask saw each partition's offsets in increasing order.
void expect_exactly(const std::vector<std::vector<Rec>>& per_subtask, int partitions, int from, int to) {
  std::map<std::string, int> seen;
  for (const auto& records : per_subtask) {
    std::map<int32_t, int64_t> last_offset;
    for (const Rec& r : records) {
      ++seen[r.value];
      EXPECT_EQ(r.value.substr(0, r.value.find(':')), std::to_string(r.partition)) << r.value;
      auto it = last_offset.find(r.partition);
      if (it != last_offset.end()) {
        EXPECT_LT(it->second, r.offset) << "partition " << r.partition << " out of order";
      }
      last_offset[r.partition] = r.offset;
    }
  }
  size_t expected = 0;
  for (int p = 0; p < partitions; ++p) {
    for (int i = from; i < to; ++i) {
      ++expected;
      const std::string v = std::to_string(p) + ":" + std::to_string(i);
      auto it = seen.find(v);
      if (it == seen.end()) {
        ADD_FAILURE() << "missing " << v;
      } else if (it->second != 1) {
        ADD_FAILURE() << v << " seen " << it->second << " times";
      }
    }
  }
  EXPECT_EQ(seen.size(), expected);
}

TEST_F(KafkaSourceIntegrationTest, BoundedReadOfAPrefilledTopicIsExactAndOrderedPerPartition) {
  const std::string topic = make_topic("bounded", 4);
  fill(topic, 4, 2500);
  StreamEnvironment env(config(3));
  auto out = std::make_shared<Received<Rec>>();
  env.from_source(source(topic).bounded().build(), "kafka")
      .uid("kafka")
      .sink_to(std::make_shared<ReceivingSink<Rec>>(out));
  JobResult r = env.execute("bounded read");
  ASSERT_TRUE(r.ok()) << error_of(r);
  expect_exactly(out->per_subtask(), 4, 0, 2500);
  // Keys, timestamps and positions come with the records.
  for (const Rec& rec : out->all()) {
    ASSERT_TRUE(rec.key.has_value());
    EXPECT_EQ("k" + rec.value.substr(rec.value.find(':') + 1), *rec.key);
    EXPECT_EQ(rec.topic, topic);
    EXPECT_EQ(rec.timestamp_type, KafkaTimestampType::kCreateTime);
    EXPECT_GT(rec.timestamp_ms, wall_ms() - 3'600'000);
  }
}

TEST_F(KafkaSourceIntegrationTest, BoundedReadCommittedStopsAtTheLastStableOffset) {
  const std::string topic = make_topic("lso", 1);
  tk::Client tx = producer({{"transactional.id", tk::unique_topic("tx")}});
  ASSERT_EQ(tk::error_text(rd_kafka_init_transactions(tx.get(), 30'000)), "");
  std::vector<Msg> committed_msgs, aborted_msgs, open_msgs;
  for (int i = 0; i < 10; ++i) {
    committed_msgs.push_back(Msg{0, "0:" + std::to_string(i)});
    aborted_msgs.push_back(Msg{0, "aborted-" + std::to_string(i)});
    open_msgs.push_back(Msg{0, "open-" + std::to_string(i)});
  }
  ASSERT_EQ(tk::error_text(rd_kafka_begin_transaction(tx.get())), "");
  produce(topic, committed_msgs, tx.get());
  ASSERT_EQ(tk::error_text(rd_kafka_commit_transaction(tx.get(), 30'000)), "");
  ASSERT_EQ(tk::error_text(rd_kafka_begin_transaction(tx.get())), "");
  produce(topic, aborted_msgs, tx.get());
  ASSERT_EQ(tk::error_text(rd_kafka_abort_transaction(tx.get(), 30'000)), "");
  ASSERT_EQ(tk::error_text(rd_kafka_begin_transaction(tx.get())), "");
  produce(topic, open_msgs, tx.get());  // flushed, still open while the job runs

  StreamEnvironment env(config(1));
  auto out = std::make_shared<Received<Rec>>();
  env.from_source(source(topic).bounded().build(), "kafka").sink_to(std::make_shared<ReceivingSink<Rec>>(out));
  JobResult r = env.execute("read_committed bounded");
  ASSERT_EQ(tk::error_text(rd_kafka_abort_transaction(tx.get(), 30'000)), "");
  ASSERT_TRUE(r.ok()) << error_of(r);
  expect_exactly(out->per_subtask(), 1, 0, 10);
}

TEST_F(KafkaSourceIntegrationTest, OffsetsAreCommittedOnlyWhenACheckpointCompletes) {
  constexpr int kParts = 3;
  const std::string topic = make_topic("commits", kParts);
  fill(topic, kParts, 200);
  const std::string group = tk::unique_topic("group");
  TempDir dir;
  // No periodic checkpoint during the test: only the savepoint below completes one.
  StreamEnvironment env(checkpointing(2, dir.path() / "checkpoints", "3600s"));
  auto out = std::make_shared<Received<Rec>>();
  env.from_source(source(topic).group_id(group).build(), "kafka")
      .uid("kafka")
      .sink_to(std::make_shared<ReceivingSink<Rec>>(out));
  JobClient job = env.execute_async("commits");
  ASSERT_TRUE(out->wait_for(kParts * 200)) << "got " << out->size();
  // Everything was read, yet nothing is committed: no checkpoint has completed.
  EXPECT_EQ(job.checkpoint_stats().size(), 0u);
  EXPECT_EQ(committed(group, topic, kParts), std::vector<int64_t>(kParts, RD_KAFKA_OFFSET_INVALID));
  Result<std::string> savepoint = job.trigger_savepoint((dir.path() / "savepoints").string()).get();
  ASSERT_TRUE(savepoint.ok()) << savepoint.error().to_string();
  // The commit is asynchronous: wait for it.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  std::vector<int64_t> got;
  while (std::chrono::steady_clock::now() < deadline) {
    got = committed(group, topic, kParts);
    if (got == std::vector<int64_t>(kParts, 200)) break;
    out->wait_a_little(100ms);
  }
  EXPECT_EQ(got, std::vector<int64_t>(kParts, 200));
  job.cancel();
  job.wait();
}

TEST_F(KafkaSourceIntegrationTest, RestoreFromASavepointResumesWithoutLossOrDuplicates) {
  constexpr int kParts = 3;
  const std::string topic = make_topic("restore", kParts);
  fill(topic, kParts, 10'000);
  TempDir dir;
  // The first job's sink holds its records back, so backpressure stops the source part-way through the topic
  // and the savepoint's barrier falls in the middle of each partition.
  auto first = std::make_shared<Received<Rec>>(/*open=*/false);
  std::string savepoint;
  {
    StreamEnvironment env(checkpointing(2, dir.path() / "checkpoints", "3600s"));
    env.from_source(source(topic).build(), "kafka")
        .uid("kafka")
        .rebalance()
        .sink_to(std::make_shared<ReceivingSink<Rec>>(first))
        .uid("sink");
    JobClient job = env.execute_async("before the savepoint");
    ASSERT_TRUE(first->wait_for_blocked_writer());
    std::future<Result<std::string>> sp = job.stop_with_savepoint((dir.path() / "savepoints").string());
    first->open();
    Result<std::string> done = sp.get();
    ASSERT_TRUE(done.ok()) << done.error().to_string();
    savepoint = *done;
    JobResult r = job.wait();
    ASSERT_TRUE(r.ok()) << error_of(r);
  }
  const size_t before = first->size();
  std::printf("the first job read %zu of %d records before its savepoint\n", before, kParts * 10'000);
  EXPECT_LT(before, size_t{kParts * 10'000}) << "the savepoint should fall in the middle of the topic";
  fill(topic, kParts, 5'000, 10'000);  // written while no job runs
  // Resume at another parallelism: the splits are redistributed with their offsets.
  Configuration c = checkpointing(3, dir.path() / "checkpoints", "200ms");
  c.set(options::kStateRecoveryPath, savepoint);
  StreamEnvironment env(c);
  auto second = std::make_shared<Received<Rec>>();
  env.from_source(source(topic).build(), "kafka")
      .uid("kafka")
      .rebalance()
      .sink_to(std::make_shared<ReceivingSink<Rec>>(second))
      .uid("sink");
  JobClient job = env.execute_async("after the savepoint");
  const size_t total = kParts * 15'000;
  ASSERT_TRUE(second->wait_for(total - before)) << "before " << before << ", after " << second->size();
  Result<std::string> sp = job.stop_with_savepoint((dir.path() / "savepoints").string()).get();
  ASSERT_TRUE(sp.ok()) << sp.error().to_string();
  JobResult r = job.wait();
  ASSERT_TRUE(r.ok()) << error_of(r);
  std::vector<std::vector<Rec>> all = first->per_subtask();
  for (auto& v : second->per_subtask())
    all.push_back(std::move(v));
  expect_exactly(all, kParts, 0, 15'000);
}

TEST_F(KafkaSourceIntegrationTest, StartingOffsetsFromCommittedOffsetsAndTimestamps) {
  constexpr int kParts = 2;
  const std::string topic = make_topic("starting", kParts);
  const int64_t base = wall_ms() - 600'000;
  std::vector<Msg> msgs;
  for (int i = 0; i < 100; ++i) {
    for (int p = 0; p < kParts; ++p)
      msgs.push_back(Msg{p, std::to_string(p) + ":" + std::to_string(i), "", base + i * 1000});
  }
  produce(topic, msgs);
  const std::string group = tk::unique_topic("group");
  commit(group, topic, {{0, 40}});  // partition 1 has no committed offset

  auto run = [&](KafkaStartingOffsets starting, const std::string& g) {
    StreamEnvironment env(config(2));
    auto out = std::make_shared<Received<Rec>>();
    auto b = source(topic).bounded().starting_offsets(std::move(starting));
    if (!g.empty()) b.group_id(g);
    env.from_source(b.build(), "kafka").sink_to(std::make_shared<ReceivingSink<Rec>>(out));
    JobResult r = env.execute("starting offsets");
    std::map<int32_t, std::pair<int64_t, size_t>> first_and_count;  // partition -> (first offset, count)
    for (const Rec& rec : out->all()) {
      auto [it, fresh] = first_and_count.try_emplace(rec.partition, rec.offset, 0);
      it->second.first = std::min(it->second.first, rec.offset);
      ++it->second.second;
    }
    return std::make_pair(r, first_and_count);
  };

  auto [r1, got1] = run(KafkaStartingOffsets::committed(KafkaOffsetReset::kEarliest), group);
  ASSERT_TRUE(r1.ok()) << error_of(r1);
  EXPECT_EQ(got1[0], std::make_pair(int64_t{40}, size_t{60}));
  EXPECT_EQ(got1[1], std::make_pair(int64_t{0}, size_t{100}));

  auto [r2, got2] = run(KafkaStartingOffsets::committed(KafkaOffsetReset::kLatest), group);
  ASSERT_TRUE(r2.ok()) << error_of(r2);
  EXPECT_EQ(got2[0], std::make_pair(int64_t{40}, size_t{60}));
  EXPECT_EQ(got2.count(1), 0u);

  auto [r3, got3] = run(KafkaStartingOffsets::committed(KafkaOffsetReset::kNone), group);
  ASSERT_EQ(r3.status, JobStatus::kFailed);
  EXPECT_NE(error_of(r3).find("no committed offset for topic '" + topic + "' partition 1"), std::string::npos)
      << error_of(r3);

  auto [r4, got4] = run(KafkaStartingOffsets::timestamp(base + 70 * 1000), "");
  ASSERT_TRUE(r4.ok()) << error_of(r4);
  EXPECT_EQ(got4[0], std::make_pair(int64_t{70}, size_t{30}));
  EXPECT_EQ(got4[1], std::make_pair(int64_t{70}, size_t{30}));

  auto [r5, got5] = run(KafkaStartingOffsets::offsets({{{topic, 1}, 95}}), "");
  ASSERT_TRUE(r5.ok()) << error_of(r5);
  EXPECT_EQ(got5[0], std::make_pair(int64_t{0}, size_t{100}));
  EXPECT_EQ(got5[1], std::make_pair(int64_t{95}, size_t{5}));
}

TEST_F(KafkaSourceIntegrationTest, APoisonRecordFailsTheJobOrGoesToTheDeadLetters) {
  const std::string topic = make_topic("poison", 1);
  const std::string dlq_topic = make_topic("dlq", 1);
  std::vector<Msg> msgs;
  for (int i = 0; i < 10; ++i)
    msgs.push_back(Msg{0, i == 5 ? std::string("{\"id\": broken") : "{\"id\":" + std::to_string(i) + "}", "key"});
  produce(topic, msgs);
  auto json_source = [&] {
    return KafkaSource<Value>::builder()
        .bootstrap_servers(bootstrap_)
        .topics({topic})
        .bounded()
        .deserializer(kafka::json_value())
        .property("log_level", "4");
  };

  {
    StreamEnvironment env(config(1));
    auto out = std::make_shared<Received<Value>>();
    env.from_source(json_source().build(), "kafka").sink_to(std::make_shared<ReceivingSink<Value>>(out));
    JobResult r = env.execute("poison, fail");
    ASSERT_EQ(r.status, JobStatus::kFailed);
    EXPECT_NE(error_of(r).find("bad record in topic '" + topic + "' partition 0 at offset 5"), std::string::npos)
        << error_of(r);
  }
  {
    TempDir dir;
    const fs::path file = dir.path() / "dead" / "letters.jsonl";
    auto src = json_source().on_bad_record(BadRecordPolicy::kDeadLetter, file.string()).build();
    StreamEnvironment env(config(1));
    auto out = std::make_shared<Received<Value>>();
    env.from_source(src, "kafka").sink_to(std::make_shared<ReceivingSink<Value>>(out));
    JobResult r = env.execute("poison, dead-letter file");
    ASSERT_TRUE(r.ok()) << error_of(r);
    EXPECT_EQ(out->size(), 9u);
    EXPECT_EQ(src->stats()->bad_records.load(), 1);
    std::ifstream in(file);
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    Result<Value> entry = Value::from_json(line);
    ASSERT_TRUE(entry.ok()) << line;
    EXPECT_EQ(entry->at_path("topic")->as_string(), topic);
    EXPECT_EQ(entry->at_path("offset")->as_int64(), 5);
    EXPECT_EQ(entry->at_path("record")->as_string(), "{\"id\": broken");
    EXPECT_EQ(entry->at_path("key")->as_string(), "key");
    EXPECT_FALSE(std::getline(in, line)) << "one entry only";
  }
  {
    auto src = json_source().on_bad_record(BadRecordPolicy::kDeadLetter).dead_letter_topic(dlq_topic).build();
    StreamEnvironment env(config(1));
    auto out = std::make_shared<Received<Value>>();
    env.from_source(src, "kafka").sink_to(std::make_shared<ReceivingSink<Value>>(out));
    JobResult r = env.execute("poison, dead-letter topic");
    ASSERT_TRUE(r.ok()) << error_of(r);
    EXPECT_EQ(out->size(), 9u);
    // Read the dead-letter topic back with the source itself.
    StreamEnvironment check(config(1));
    auto dead = std::make_shared<Received<Rec>>();
    check.from_source(source(dlq_topic).bounded().build(), "dlq").sink_to(std::make_shared<ReceivingSink<Rec>>(dead));
    JobResult cr = check.execute("read the dead letters");
    ASSERT_TRUE(cr.ok()) << error_of(cr);
    ASSERT_EQ(dead->size(), 1u);
    const Rec d = dead->all()[0];
    EXPECT_EQ(d.value, "{\"id\": broken");
    EXPECT_EQ(d.key, std::optional<std::string>("key"));
    std::map<std::string, std::string> headers;
    for (const KafkaHeader& h : d.headers)
      headers[h.key] = h.value.value_or("");
    EXPECT_EQ(headers["sluice.dlq.topic"], topic);
    EXPECT_EQ(headers["sluice.dlq.partition"], "0");
    EXPECT_EQ(headers["sluice.dlq.offset"], "5");
    EXPECT_FALSE(headers["sluice.dlq.error"].empty());
  }
}

TEST_F(KafkaSourceIntegrationTest, MetricsCountRecordsAndShowLagPositionsAndCommittedOffsets) {
  constexpr int kParts = 2;
  constexpr int kPerPartition = 500;
  constexpr int64_t kTotal = kParts * kPerPartition;
  const std::string topic = make_topic("metrics", kParts);
  std::vector<Msg> msgs;
  int64_t bytes = 0;
  for (int i = 0; i < kPerPartition; ++i) {
    for (int p = 0; p < kParts; ++p) {
      // One poison record (partition 1, offset 250) for the dead letters.
      msgs.push_back(Msg{p, p == 1 && i == 250 ? std::string("{\"p\": broken")
                                               : "{\"p\":" + std::to_string(p) + ",\"i\":" + std::to_string(i) + "}"});
      bytes += static_cast<int64_t>(msgs.back().value.size());
    }
  }
  produce(topic, msgs);
  const std::string group = tk::unique_topic("group");
  TempDir dir;
  auto src = KafkaSource<Value>::builder()
                 .bootstrap_servers(bootstrap_)
                 .topics({topic})
                 .group_id(group)
                 .deserializer(kafka::json_value())
                 .on_bad_record(BadRecordPolicy::kDeadLetter, (dir.path() / "dead-letters.jsonl").string())
                 .property("log_level", "4")
                 .build();
  // No periodic checkpoint: only the savepoint below completes one. Each partition has its own reader
  // (Flink's owner rule spreads a topic's consecutive partitions over consecutive subtasks).
  StreamEnvironment env(checkpointing(kParts, dir.path() / "checkpoints", "3600s"));
  // The sink (chained to the source) holds its first records back, so the readers stop inside their first
  // batch: librdkafka has fetched the partitions' ends, the readers have not read them.
  auto out = std::make_shared<Received<Value>>(/*open=*/false);
  env.from_source(src, "kafka").uid("kafka").sink_to(std::make_shared<ReceivingSink<Value>>(out)).uid("sink");
  JobClient job = env.execute_async("metrics");
  ASSERT_TRUE(out->wait_for_blocked_writer());
  const KafkaSourceMetrics blocked = src->metrics();
  EXPECT_LT(blocked.records_read, kTotal);
  EXPECT_GT(blocked.records_lag_max, 0) << "records were written but not read";
  EXPECT_GT(blocked.pending_records, 0);
  out->open();

  ASSERT_TRUE(out->wait_for(kTotal - 1)) << "got " << out->size();
  // The counters are published after each batch, the last one right after its records reached the sink.
  KafkaSourceMetrics m;
  const bool caught_up = sluice::testing::poll_until(
      [&] {
        m = src->metrics();
        return m.records_read == kTotal && m.partitions.size() == size_t{kParts} && m.records_lag_max == 0;
      },
      kDeadline);
  ASSERT_TRUE(caught_up) << "records " << m.records_read << ", partitions " << m.partitions.size() << ", lag max "
                         << m.records_lag_max;
  EXPECT_EQ(m.bytes_read, bytes);
  EXPECT_EQ(m.bad_records, 1);
  EXPECT_EQ(src->stats()->bad_records.load(), 1);
  EXPECT_EQ(m.pending_records, 0);
  EXPECT_EQ(m.lag_ms, 0) << "caught up";
  for (int p = 0; p < kParts; ++p) {
    const KafkaPartitionMetrics& pm = m.partitions[static_cast<size_t>(p)];
    EXPECT_EQ(pm.topic, topic);
    EXPECT_EQ(pm.partition, p);
    EXPECT_EQ(pm.current_offset, kPerPartition) << "partition " << p;
    EXPECT_EQ(pm.high_watermark, kPerPartition) << "partition " << p;
    EXPECT_EQ(pm.lag, 0) << "partition " << p;
    EXPECT_EQ(pm.committed_offset, -1) << "no checkpoint has completed yet";
  }

  // A completed checkpoint commits its offsets; the broker's acknowledgement shows in the metrics.
  Result<std::string> savepoint = job.trigger_savepoint((dir.path() / "savepoints").string()).get();
  ASSERT_TRUE(savepoint.ok()) << savepoint.error().to_string();
  const bool committed_shown = sluice::testing::poll_until(
      [&] {
        m = src->metrics();
        return m.partitions.size() == size_t{kParts} && m.partitions[0].committed_offset == kPerPartition &&
               m.partitions[1].committed_offset == kPerPartition;
      },
      kDeadline);
  EXPECT_TRUE(committed_shown) << "committed offsets "
                               << (m.partitions.empty() ? -2 : m.partitions[0].committed_offset);
  EXPECT_EQ(committed(group, topic, kParts), std::vector<int64_t>(kParts, kPerPartition));
  job.cancel();
  job.wait();
  EXPECT_TRUE(src->metrics().partitions.empty()) << "the closed readers' partitions drop out";
  EXPECT_EQ(src->metrics().records_read, kTotal);
}

TEST_F(KafkaSourceIntegrationTest, PartitionsAddedWhileRunningAreRead) {
  const std::string topic = make_topic("grow", 1);
  fill(topic, 1, 10);
  StreamEnvironment env(config(2));
  auto out = std::make_shared<Received<Rec>>();
  env.from_source(source(topic).partition_discovery_interval(1s).build(), "kafka")
      .sink_to(std::make_shared<ReceivingSink<Rec>>(out));
  JobClient job = env.execute_async("growing topic");
  ASSERT_TRUE(out->wait_for(10));
  add_partitions(topic, 3);
  std::vector<Msg> msgs;
  for (int i = 10; i < 20; ++i) {
    for (int p = 0; p < 3; ++p)
      msgs.push_back(Msg{p, std::to_string(p) + ":" + std::to_string(i)});
  }
  produce(topic, msgs);
  const bool all = out->wait_for(10 + 30);
  job.cancel();
  job.wait();
  ASSERT_TRUE(all) << "got " << out->size();
  std::vector<std::vector<Rec>> per_subtask = out->per_subtask();
  // Partition 0 holds 0..19; the new partitions 10..19.
  std::map<std::string, int> seen;
  for (const auto& v : per_subtask) {
    for (const Rec& r : v)
      ++seen[r.value];
  }
  EXPECT_EQ(seen.size(), 40u);
  for (const auto& [v, n] : seen)
    EXPECT_EQ(n, 1) << v;
}

TEST_F(KafkaSourceIntegrationTest, AnIdlePartitionDoesNotStallEventTimeWindows) {
  const std::string topic = make_topic("idle", 2);
  const int64_t base = (wall_ms() - 600'000) / 10'000 * 10'000;  // a window boundary
  using KV = std::pair<std::string, int64_t>;
  auto strategy = WatermarkStrategy<Rec>::for_monotonous_timestamps().with_idleness(500ms);
  tk::Client p = producer();
  int64_t next = 0;  // event time (s after base) of the next record on partition 0; partition 1 stays empty
  for (int parallelism : {1, 2}) {
    SCOPED_TRACE("parallelism " + std::to_string(parallelism));
    StreamEnvironment env(config(parallelism));
    auto out = std::make_shared<Received<KV>>();
    env.from_source(source(topic).build(), strategy, "kafka")
        .map([](const Rec&) {
          return KV{"all", 1};
        })
        .key_by([](const KV& kv) { return kv.first; })
        .window(TumblingEventTimeWindows::of(10s))
        .reduce([](const KV& a, const KV& b) {
          return KV{a.first, a.second + b.second};
        })
        .sink_to(std::make_shared<ReceivingSink<KV>>(out));
    JobClient job = env.execute_async("idle partition");
    // Partition 0 stays active (a record every 100 ms of processing time, one second of event time each), as
    // in a live topic; the window [base, base + 10 s) closes only when partition 1 is idle. The job never ends.
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (out->size() == 0 && std::chrono::steady_clock::now() < deadline) {
      produce(topic, {Msg{0, std::to_string(next), "", base + next * 1000}}, p.get());
      ++next;
      out->wait_a_little(100ms);
    }
    job.cancel();
    job.wait();
    ASSERT_GT(out->size(), 0u) << "the empty partition held the watermark back";
    EXPECT_EQ(out->all()[0], (KV{"all", 10})) << "the first window holds event times base .. base + 9 s";
  }
}

}  // namespace
}  // namespace sluice
