// Unit tests of the Kafka source: the partition owner rule, the split serializer, the enumerator's
// snapshot/restore (no partition handed out twice), deserializers, settings validation, and — with
// librdkafka's mock cluster, for error injection only — start-up errors and consumer errors.
#include "sluice/connectors/kafka/kafka_source.h"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka_mock.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/kafka/kafka_partition_discoverer.h"
#include "sluice/connectors/kafka/kafka_source_enumerator.h"
#include "sluice/connectors/kafka/kafka_source_stats.h"
#include "sluice/core/data_io.h"
#include "test_util/collect_sink.h"

namespace shop {
struct Order {
  std::string id;
  int64_t amount = 0;
  friend bool operator==(const Order&, const Order&) = default;
};
SLUICE_FIELDS(Order, id, amount);
}  // namespace shop

namespace sluice {
namespace {

using detail::KafkaPartitionDiscoverer;
using detail::KafkaSourceEnumerator;

// ---------------------------------------------------------------------------------------------------------
// Owner rule

TEST(KafkaSplitOwnerTest, JavaStringHashMatchesJava) {
  // Values of Java's String.hashCode().
  EXPECT_EQ(kafka::java_string_hash(""), 0);
  EXPECT_EQ(kafka::java_string_hash("hello"), 99162322);
  EXPECT_EQ(kafka::java_string_hash("orders"), -1008770331);  // wraps below zero
  EXPECT_EQ(kafka::java_string_hash("test-topic"), 639758388);
}

TEST(KafkaSplitOwnerTest, PinnedAssignmentsOfFlinksRule) {
  // ((hash * 31) & 0x7FFFFFFF) % n is the start subtask; partitions follow round robin from there.
  std::vector<int> orders;
  for (int p = 0; p < 6; ++p)
    orders.push_back(kafka::split_owner("orders", p, 4));
  EXPECT_EQ(orders, (std::vector<int>{3, 0, 1, 2, 3, 0}));
  std::vector<int> hello;
  for (int p = 0; p < 4; ++p)
    hello.push_back(kafka::split_owner("hello", p, 3));
  EXPECT_EQ(hello, (std::vector<int>{2, 0, 1, 2}));
  EXPECT_EQ(kafka::split_owner("anything", 7, 1), 0);
}

TEST(KafkaSplitOwnerTest, PartitionsOfATopicSpreadEvenly) {
  for (int readers = 1; readers <= 7; ++readers) {
    std::map<int, int> per_reader;
    for (int p = 0; p < readers * 3; ++p)
      ++per_reader[kafka::split_owner("charges", p, readers)];
    ASSERT_EQ(per_reader.size(), static_cast<size_t>(readers));
    for (const auto& [r, n] : per_reader)
      EXPECT_EQ(n, 3) << "reader " << r;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Splits

TEST(KafkaPartitionSplitTest, SerializerRoundTrip) {
  std::vector<KafkaPartitionSplit> splits = {
      {"orders", 0, 0, std::nullopt, false},
      {"orders", 11, 123456789012, 123456789999, false},
      {"a.b_c-d", 2, 0, std::nullopt, true},
  };
  DataOutput out;
  TypeSerializer<std::vector<KafkaPartitionSplit>>::serialize(splits, out);
  std::string bytes(out.view());
  std::vector<KafkaPartitionSplit> back;
  DataInput in(bytes);
  TypeSerializer<std::vector<KafkaPartitionSplit>>::deserialize(back, in);
  EXPECT_TRUE(in.at_end());
  EXPECT_EQ(back, splits);
  EXPECT_EQ(splits[1].split_id(), "orders-11");
}

TEST(KafkaPartitionSplitTest, TruncatedStateFailsToDecode) {
  KafkaPartitionSplit s{"orders", 3, 42, 50, false};
  DataOutput out;
  serialize(s, out);
  std::string bytes(out.view());
  bytes.resize(bytes.size() - 2);
  KafkaPartitionSplit back;
  DataInput in(bytes);
  EXPECT_THROW(deserialize(back, in), SluiceException);
}

// ---------------------------------------------------------------------------------------------------------
// Enumerator with a fake discoverer

struct FakeCluster {
  std::vector<KafkaTopicPartition> partitions;
  std::map<KafkaTopicPartition, int64_t> end_offsets;  // "latest"; earliest is 0
  std::optional<Error> discover_error;
  std::vector<std::string> starts;  // describe() of each make_splits call
};

class FakeDiscoverer final : public KafkaPartitionDiscoverer {
 public:
  explicit FakeDiscoverer(std::shared_ptr<FakeCluster> c) : c_(std::move(c)) {}
  Result<std::vector<KafkaTopicPartition>> discover(std::chrono::milliseconds) override {
    if (c_->discover_error) return *c_->discover_error;
    return c_->partitions;
  }
  Result<std::vector<KafkaPartitionSplit>> make_splits(const std::vector<KafkaTopicPartition>& parts,
                                                       const KafkaStartingOffsets& starting, bool bounded,
                                                       std::chrono::milliseconds) override {
    c_->starts.push_back(starting.describe());
    std::vector<KafkaPartitionSplit> out;
    for (const auto& tp : parts) {
      KafkaPartitionSplit s{tp.topic, tp.partition, 0, std::nullopt, false};
      const int64_t end = c_->end_offsets.count(tp) ? c_->end_offsets.at(tp) : 0;
      if (starting.kind() == KafkaStartingOffsets::Kind::kLatest) s.starting_offset = end;
      if (bounded) s.stopping_offset = end;
      out.push_back(s);
    }
    return out;
  }

 private:
  std::shared_ptr<FakeCluster> c_;
};

class FakeEnumeratorContext final : public SplitEnumeratorContext<KafkaPartitionSplit> {
 public:
  explicit FakeEnumeratorContext(int parallelism) : parallelism_(parallelism) {}
  int current_parallelism() const override { return parallelism_; }
  void assign_split(KafkaPartitionSplit split, int subtask) override {
    ASSERT_GE(subtask, 0);
    ASSERT_LT(subtask, parallelism_);
    assigned[subtask].push_back(std::move(split));
  }
  void signal_no_more_splits(int subtask) override { no_more_splits.insert(subtask); }
  void schedule_periodic(std::function<void()> task, int64_t period_ms) override {
    periodic.push_back(std::move(task));
    periods.push_back(period_ms);
  }
  /// Every split assigned so far, by topic partition (fails on a duplicate).
  std::map<KafkaTopicPartition, std::pair<int, KafkaPartitionSplit>> by_partition() const {
    std::map<KafkaTopicPartition, std::pair<int, KafkaPartitionSplit>> out;
    for (const auto& [subtask, splits] : assigned) {
      for (const auto& s : splits) {
        EXPECT_TRUE(out.emplace(s.topic_partition(), std::make_pair(subtask, s)).second)
            << s.split_id() << " assigned twice";
      }
    }
    return out;
  }
  std::map<int, std::vector<KafkaPartitionSplit>> assigned;
  std::set<int> no_more_splits;
  std::vector<std::function<void()>> periodic;
  std::vector<int64_t> periods;

 private:
  int parallelism_;
};

std::vector<KafkaTopicPartition> partitions_of(const std::string& topic, int n) {
  std::vector<KafkaTopicPartition> out;
  for (int i = 0; i < n; ++i)
    out.push_back({topic, i});
  return out;
}

std::unique_ptr<KafkaSourceEnumerator> make_enumerator(FakeEnumeratorContext& ctx, std::shared_ptr<FakeCluster> c,
                                                       KafkaSourceEnumerator::Options o = {}) {
  o.description = "test";
  return std::make_unique<KafkaSourceEnumerator>(ctx, std::make_unique<FakeDiscoverer>(std::move(c)), std::move(o));
}

TEST(KafkaSourceEnumeratorTest, AssignsEveryPartitionToItsOwnerWhenTheReaderRegisters) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 6);
  FakeEnumeratorContext ctx(4);
  auto e = make_enumerator(ctx, cluster);
  e->start();
  EXPECT_TRUE(ctx.assigned.empty()) << "nothing before readers register";
  for (int r = 0; r < 4; ++r)
    e->add_reader(r);
  auto got = ctx.by_partition();
  ASSERT_EQ(got.size(), 6u);
  for (const auto& [tp, a] : got)
    EXPECT_EQ(a.first, kafka::split_owner(tp.topic, tp.partition, 4)) << tp.topic << "-" << tp.partition;
  EXPECT_TRUE(ctx.no_more_splits.empty()) << "discovery is on: more splits may come";
  ASSERT_EQ(ctx.periods.size(), 1u);
  EXPECT_EQ(ctx.periods[0], 30'000);
  EXPECT_EQ(cluster->starts, (std::vector<std::string>{"earliest"}));
}

TEST(KafkaSourceEnumeratorTest, DiscoversNewPartitionsFromTheEarliestOffset) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 2);
  FakeEnumeratorContext ctx(2);
  KafkaSourceEnumerator::Options o;
  o.starting = KafkaStartingOffsets::latest();
  o.discovery_interval_ms = 5'000;
  auto e = make_enumerator(ctx, cluster, o);
  e->start();
  e->add_reader(0);
  e->add_reader(1);
  ASSERT_EQ(ctx.by_partition().size(), 2u);
  cluster->partitions = partitions_of("orders", 5);
  ASSERT_EQ(ctx.periodic.size(), 1u);
  EXPECT_EQ(ctx.periods[0], 5'000);
  ctx.periodic[0]();
  EXPECT_EQ(ctx.by_partition().size(), 5u);
  EXPECT_EQ(cluster->starts, (std::vector<std::string>{"latest", "earliest"}));
  ctx.periodic[0]();  // nothing new
  EXPECT_EQ(ctx.by_partition().size(), 5u);
}

TEST(KafkaSourceEnumeratorTest, RestoreNeverReassignsPartitionsReadersOwn) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 4);
  FakeEnumeratorContext ctx(3);
  auto e = make_enumerator(ctx, cluster);
  e->start();
  // Reader 0 registers; readers 1 and 2 have not yet when the checkpoint is taken.
  e->add_reader(0);
  const size_t owned_by_0 = ctx.assigned[0].size();
  ASSERT_GT(owned_by_0, 0u);
  std::vector<KafkaPartitionSplit> state = e->snapshot_state(1);
  ASSERT_EQ(state.size(), 4u);
  size_t markers = 0;
  for (const auto& s : state)
    markers += s.assigned ? 1 : 0;
  EXPECT_EQ(markers, owned_by_0);

  // The checkpoint's state goes through its serializer, as in the coordinator.
  DataOutput out;
  TypeSerializer<std::vector<KafkaPartitionSplit>>::serialize(state, out);
  std::string bytes(out.view());
  std::vector<KafkaPartitionSplit> restored_state;
  DataInput in(bytes);
  TypeSerializer<std::vector<KafkaPartitionSplit>>::deserialize(restored_state, in);

  // Restore at another parallelism; a partition was added meanwhile.
  cluster->partitions = partitions_of("orders", 5);
  FakeEnumeratorContext ctx2(2);
  auto restored = make_enumerator(ctx2, cluster);
  restored->restore_state(restored_state);
  restored->start();
  for (int r = 0; r < 2; ++r)
    restored->add_reader(r);
  auto got = ctx2.by_partition();
  // Everything but reader 0's partitions (restored by the readers from their own state) is handed out once.
  EXPECT_EQ(got.size(), 5u - owned_by_0);
  for (const auto& s : ctx.assigned[0])
    EXPECT_EQ(got.count(s.topic_partition()), 0u) << s.split_id() << " was owned by a reader";
  EXPECT_EQ(got.count(KafkaTopicPartition{"orders", 4}), 1u);
  for (const auto& [tp, a] : got) {
    EXPECT_EQ(a.first, kafka::split_owner(tp.topic, tp.partition, 2));
    EXPECT_FALSE(a.second.assigned);
  }
  // Only the new partition was resolved (from the earliest offset); the restored ones kept their offsets.
  EXPECT_EQ(cluster->starts, (std::vector<std::string>{"earliest", "earliest"}));
  // A second snapshot marks all five partitions as owned.
  std::vector<KafkaPartitionSplit> again = restored->snapshot_state(2);
  EXPECT_EQ(again.size(), 5u);
  EXPECT_TRUE(std::all_of(again.begin(), again.end(), [](const auto& s) { return s.assigned; }));
}

TEST(KafkaSourceEnumeratorTest, BoundedModeSignalsNoMoreSplitsAndDoesNotDiscoverAfterARestore) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 3);
  cluster->end_offsets[{"orders", 1}] = 10;
  FakeEnumeratorContext ctx(2);
  KafkaSourceEnumerator::Options o;
  o.bounded = true;
  auto e = make_enumerator(ctx, cluster, o);
  e->start();
  e->add_reader(0);
  e->add_reader(1);
  EXPECT_EQ(ctx.no_more_splits, (std::set<int>{0, 1}));
  EXPECT_TRUE(ctx.periodic.empty());
  auto got = ctx.by_partition();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at({"orders", 1}).second.stopping_offset, 10);

  cluster->partitions = partitions_of("orders", 4);
  FakeEnumeratorContext ctx2(2);
  auto restored = make_enumerator(ctx2, cluster, o);
  restored->restore_state(e->snapshot_state(1));
  restored->start();
  restored->add_reader(0);
  restored->add_reader(1);
  EXPECT_TRUE(ctx2.assigned.empty()) << "a bounded source reads the partitions of its start only";
  EXPECT_EQ(ctx2.no_more_splits, (std::set<int>{0, 1}));
}

TEST(KafkaSourceEnumeratorTest, SplitsGivenBackGoToTheirOwnerWhenItRegistersAgain) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 2);
  FakeEnumeratorContext ctx(2);
  auto e = make_enumerator(ctx, cluster);
  e->start();
  e->add_reader(0);
  e->add_reader(1);
  const int owner = kafka::split_owner("orders", 0, 2);
  KafkaPartitionSplit s = ctx.by_partition().at({"orders", 0}).second;
  ctx.assigned.clear();
  s.starting_offset = 77;
  e->add_splits_back({s}, owner);
  EXPECT_TRUE(ctx.assigned.empty());
  e->add_reader(owner);
  ASSERT_EQ(ctx.assigned[owner].size(), 1u);
  EXPECT_EQ(ctx.assigned[owner][0].starting_offset, 77);
}

TEST(KafkaSourceEnumeratorTest, StartFailsWithTheDiscoveryError) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->discover_error = Error(ErrorCode::kConnector, "Kafka source: topic 'nope' does not exist");
  FakeEnumeratorContext ctx(1);
  auto e = make_enumerator(ctx, cluster);
  try {
    e->start();
    FAIL() << "start() should throw";
  } catch (const SluiceException& ex) {
    EXPECT_EQ(ex.error().code(), ErrorCode::kConnector);
    EXPECT_NE(ex.error().message().find("topic 'nope' does not exist"), std::string::npos);
  }
}

TEST(KafkaSourceEnumeratorTest, FailedDiscoveryAfterARestoreIsRetriedPeriodically) {
  auto cluster = std::make_shared<FakeCluster>();
  cluster->partitions = partitions_of("orders", 1);
  cluster->discover_error = Error(ErrorCode::kConnector, "broker down");
  FakeEnumeratorContext ctx(1);
  KafkaSourceEnumerator::Options o;
  o.discovery_interval_ms = 1000;
  auto e = make_enumerator(ctx, cluster, o);
  e->restore_state({});
  EXPECT_NO_THROW(e->start());
  e->add_reader(0);
  EXPECT_TRUE(ctx.assigned.empty());
  cluster->discover_error.reset();
  ASSERT_EQ(ctx.periodic.size(), 1u);
  ctx.periodic[0]();
  EXPECT_EQ(ctx.by_partition().size(), 1u);
}

// ---------------------------------------------------------------------------------------------------------
// Deserializers

KafkaMessageView view_of(std::optional<std::string_view> value, std::optional<std::string_view> key = std::nullopt) {
  KafkaMessageView v;
  v.topic = "orders";
  v.partition = 3;
  v.offset = 41;
  v.timestamp_ms = 1'700'000'000'000;
  v.timestamp_type = KafkaTimestampType::kCreateTime;
  v.key = key;
  v.value = value;
  return v;
}

TEST(KafkaDeserializerTest, BytesAndStrings) {
  std::string out;
  const std::string binary("a\0\xff", 3);
  ASSERT_TRUE(kafka::bytes_value()(view_of(binary), out).ok());
  EXPECT_EQ(out, binary);
  ASSERT_TRUE(kafka::bytes_value()(view_of(std::nullopt), out).ok());
  EXPECT_EQ(out, "");
  ASSERT_TRUE(kafka::string_value()(view_of("grüße"), out).ok());
  EXPECT_EQ(out, "grüße");
  Status bad = kafka::string_value()(view_of(binary), out);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "the value is not valid UTF-8: invalid byte 0xff at byte 2 of 3");
  EXPECT_FALSE(kafka::string_value()(view_of("\xc0\x80"), out).ok()) << "overlong encoding";
  EXPECT_FALSE(kafka::string_value()(view_of("\xed\xa0\x80"), out).ok()) << "surrogate";
}

TEST(KafkaDeserializerTest, JsonIntoValueAndTypedRecords) {
  Value v;
  ASSERT_TRUE(kafka::json_value()(view_of(R"({"id":"o1","amount":5})"), v).ok());
  EXPECT_EQ(v.to_json(), R"({"id":"o1","amount":5})");
  ASSERT_TRUE(kafka::json_value()(view_of(std::nullopt), v).ok());
  EXPECT_TRUE(v.is_null());
  Status bad = kafka::json_value()(view_of("{not json"), v);
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(bad.error().message().empty());

  shop::Order o;
  ASSERT_TRUE(kafka::json_value<shop::Order>()(view_of(R"({"id":"o2","amount":7})"), o).ok());
  EXPECT_EQ(o, (shop::Order{"o2", 7}));
  shop::Order wrong;
  Status typed = kafka::json_value<shop::Order>()(view_of(R"({"id":"o3","amount":"x"})"), wrong);
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.error().message().find("field 'amount'"), std::string::npos) << typed.error().message();
  Status tombstone = kafka::json_value<shop::Order>()(view_of(std::nullopt), wrong);
  ASSERT_FALSE(tombstone.ok());
  EXPECT_NE(tombstone.error().message().find("tombstone"), std::string::npos);
}

TEST(KafkaDeserializerTest, RecordCarriesKeyHeadersAndPosition) {
  std::vector<KafkaHeader> headers = {{"trace", "abc"}, {"empty", std::nullopt}, {"trace", "def"}};
  KafkaMessageView m = view_of("hello", "k1");
  m.fixed_headers = headers;
  KafkaRecord<std::string> r;
  ASSERT_TRUE(kafka::record(kafka::string_value())(m, r).ok());
  EXPECT_EQ(r.key, std::optional<std::string>("k1"));
  EXPECT_EQ(r.value, "hello");
  EXPECT_EQ(r.headers, headers);
  EXPECT_EQ(r.topic, "orders");
  EXPECT_EQ(r.partition, 3);
  EXPECT_EQ(r.offset, 41);
  EXPECT_EQ(r.timestamp_ms, 1'700'000'000'000);
  EXPECT_EQ(r.timestamp_type, KafkaTimestampType::kCreateTime);

  // Serializable between tasks.
  DataOutput out;
  serialize(r, out);
  std::string bytes(out.view());
  KafkaRecord<std::string> back;
  DataInput in(bytes);
  deserialize(back, in);
  EXPECT_EQ(back, r);
}

TEST(KafkaDeserializerTest, ExceptionsBecomeBadRecordReasons) {
  KafkaDeserializer<int> throwing = [](const KafkaMessageView&, int&) -> Status { throw std::runtime_error("boom"); };
  int out = 0;
  Status st = kafka::deserialize_message(throwing, view_of("x"), out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "the deserializer threw: boom");
}

// ---------------------------------------------------------------------------------------------------------
// Settings

TEST(KafkaSourceBuilderTest, RejectsIncompleteOrInvalidSettings) {
  auto message = [](const KafkaSourceBuilder<std::string>& b) {
    auto r = b.try_build();
    EXPECT_FALSE(r.ok());
    if (r.ok()) return std::string();
    EXPECT_EQ(r.error().code(), ErrorCode::kConfiguration);
    return r.error().message();
  };
  auto base = KafkaSource<std::string>::builder().bootstrap_servers("127.0.0.1:9092");
  EXPECT_NE(message(KafkaSource<std::string>::builder().topics({"t"})).find("no bootstrap servers"), std::string::npos);
  EXPECT_NE(message(base).find("exactly one"), std::string::npos);
  EXPECT_NE(message(KafkaSourceBuilder<std::string>(base).topics({"t"}).topic_pattern("t.*")).find("exactly one"),
            std::string::npos);
  EXPECT_NE(message(KafkaSourceBuilder<std::string>(base).topic_pattern("(")).find("invalid topic pattern"),
            std::string::npos);
  EXPECT_NE(
      message(KafkaSourceBuilder<std::string>(base).topics({"t"}).starting_offsets(KafkaStartingOffsets::committed()))
          .find("need a consumer group"),
      std::string::npos);
  EXPECT_NE(message(KafkaSourceBuilder<std::string>(base).topics({"t"}).on_bad_record(BadRecordPolicy::kDeadLetter))
                .find("dead-letter file or topic"),
            std::string::npos);
  const std::string unknown =
      message(KafkaSourceBuilder<std::string>(base).topics({"t"}).property("no.such.property", "1"));
  EXPECT_NE(unknown.find("'no.such.property'"), std::string::npos) << unknown;
  const std::string bad_value =
      message(KafkaSourceBuilder<std::string>(base).topics({"t"}).property("security.protocol", "carrier-pigeon"));
  EXPECT_NE(bad_value.find("'security.protocol' = 'carrier-pigeon'"), std::string::npos) << bad_value;
  EXPECT_EQ(kafka::printable_property_value("sasl.password", "hunter2"), "<redacted>");
  EXPECT_EQ(kafka::printable_property_value("ssl.key.pem", "-----BEGIN"), "<redacted>");
  EXPECT_EQ(kafka::printable_property_value("sasl.username", "alice"), "alice");
  EXPECT_NE(
      message(KafkaSourceBuilder<std::string>(base).topics({"t"}).property("partition.discovery.interval.ms", "soon"))
          .find("not an integer"),
      std::string::npos);
  auto no_deserializer = KafkaSource<Value>::builder().bootstrap_servers("x:1").topics({"t"}).try_build();
  ASSERT_FALSE(no_deserializer.ok());
  EXPECT_NE(no_deserializer.error().message().find("no deserializer"), std::string::npos);
}

TEST(KafkaSourceBuilderTest, SluiceKeysAndDefaults) {
  auto source = KafkaSource<std::string>::builder()
                    .bootstrap_servers("127.0.0.1:9092")
                    .topics({"t"})
                    .group_id("g")
                    .property("partition.discovery.interval.ms", "5000")
                    .property("commit.offsets.on.checkpoint", "false")
                    .property("client.id.prefix", "job-7")
                    .property("security.protocol", "plaintext")
                    .build();
  const detail::KafkaSourceSettings& s = source->settings();
  EXPECT_EQ(s.discovery_interval_ms, 5000);
  EXPECT_FALSE(s.commit_offsets_on_checkpoint);
  EXPECT_EQ(s.client_id_prefix, "job-7");
  EXPECT_EQ(s.group_id(), "g");
  EXPECT_EQ(s.properties.at("isolation.level"), "read_committed");
  EXPECT_EQ(s.properties.at("auto.offset.reset"), "earliest");
  EXPECT_EQ(s.properties.at("security.protocol"), "plaintext");
  EXPECT_EQ(s.properties.count("partition.discovery.interval.ms"), 0u);
  EXPECT_EQ(source->boundedness(), Boundedness::kContinuousUnbounded);
}

// ---------------------------------------------------------------------------------------------------------
// Error injection with librdkafka's mock cluster (it implements neither read_committed nor transactions:
// these tests read read_uncommitted).

/// A mock cluster with one broker, kept alive by its own client handle.
class MockCluster {
 public:
  MockCluster() {
    char errstr[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr);
    handle_.reset(rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr));
    if (!handle_) throw std::runtime_error(errstr);
    mock_ = rd_kafka_mock_cluster_new(handle_.get(), 1);
    if (mock_ == nullptr) throw std::runtime_error("rd_kafka_mock_cluster_new failed");
  }
  ~MockCluster() { rd_kafka_mock_cluster_destroy(mock_); }
  std::string bootstrap() const { return rd_kafka_mock_cluster_bootstraps(mock_); }
  rd_kafka_mock_cluster_t* get() const { return mock_; }

  /// Creates `topic` and writes values "0".."n-1" round robin over its partitions.
  void create_and_fill(const std::string& topic, int partitions, int n) {
    ASSERT_EQ(rd_kafka_mock_topic_create(mock_, topic.c_str(), partitions, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
    char errstr[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap().c_str(), errstr, sizeof errstr);
    kafka::KafkaClientPtr producer(rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr));
    ASSERT_TRUE(producer) << errstr;
    for (int i = 0; i < n; ++i) {
      const std::string v = std::to_string(i);
      ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(i % partitions),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_VALUE(const_cast<char*>(v.data()), v.size()), RD_KAFKA_V_END),
                RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 10'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }

 private:
  kafka::KafkaClientPtr handle_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;
};

class FakeReaderContext final : public SourceReaderContext {
 public:
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  void send_split_request() override {}
  void wakeup() override {
    std::lock_guard lock(mu_);
    woken_ = true;
    cv_.notify_all();
  }
  void wakeup_at(TimestampMs) override {}
  const Clock& clock() const override { return SystemClock::instance(); }
  /// Waits (at most `ms`) for a wakeup since the last call.
  void wait(int ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return woken_; });
    woken_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
};

class CollectingOutput final : public ReaderOutput<std::string> {
 public:
  void collect(std::string&& r) override { records.push_back(std::move(r)); }
  void collect(std::string&& r, TimestampMs) override { records.push_back(std::move(r)); }
  void emit_watermark(TimestampMs) override {}
  ReaderOutput<std::string>& output_for_split(const std::string& id) override {
    opened.insert(id);
    return *this;
  }
  void release_output_for_split(const std::string& id) override { released.insert(id); }
  std::vector<std::string> records;
  std::set<std::string> opened;
  std::set<std::string> released;
};

/// Polls `reader` until it ends, `done` holds, or 30 s pass; rethrows what poll_next throws.
template <class Done>
InputStatus drive(SourceReader<std::string, KafkaPartitionSplit>& reader, FakeReaderContext& ctx, CollectingOutput& out,
                  Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  InputStatus st = InputStatus::kNothingAvailable;
  while (std::chrono::steady_clock::now() < deadline) {
    st = reader.poll_next(out);
    if (st == InputStatus::kEndOfInput || done()) return st;
    if (st == InputStatus::kNothingAvailable) ctx.wait(100);
  }
  return st;
}

std::shared_ptr<KafkaSource<std::string>> mock_source(const MockCluster& mock, const std::string& topic) {
  return KafkaSource<std::string>::builder()
      .bootstrap_servers(mock.bootstrap())
      .topics({topic})
      .property("isolation.level", "read_uncommitted")
      .property("log_level", "3")
      .startup_timeout(std::chrono::seconds(5))
      .build();
}

TEST(KafkaSourceMockTest, ReaderReadsItsSplitsToTheirStoppingOffsets) {
  MockCluster mock;
  mock.create_and_fill("numbers", 2, 10);
  auto source = mock_source(mock, "numbers");
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->start();
  reader->add_splits({{"numbers", 0, 1, 4, false}, {"numbers", 1, 0, std::nullopt, false}});
  reader->notify_no_more_splits();
  CollectingOutput out;
  drive(*reader, ctx, out, [&] { return out.records.size() >= 3 + 5; });
  std::vector<std::string> got = out.records;
  std::sort(got.begin(), got.end());
  // Partition 0 holds 0,2,4,6,8: offsets 1..3 are 2,4,6. Partition 1 holds 1,3,5,7,9.
  EXPECT_EQ(got, (std::vector<std::string>{"1", "2", "3", "4", "5", "6", "7", "9"}));
  EXPECT_EQ(out.opened, (std::set<std::string>{"numbers-0", "numbers-1"}));
  EXPECT_EQ(out.released, (std::set<std::string>{"numbers-0"}));
  std::vector<KafkaPartitionSplit> state = reader->snapshot_state(1);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0], (KafkaPartitionSplit{"numbers", 1, 5, std::nullopt, false}));
  reader->close();
}

TEST(KafkaSourceMockTest, ADuplicateSplitIsIgnored) {
  MockCluster mock;
  mock.create_and_fill("dups", 1, 3);
  auto source = mock_source(mock, "dups");
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->add_splits({{"dups", 0, 0, 3, false}});
  reader->add_splits({{"dups", 0, 0, 3, false}});
  reader->notify_no_more_splits();
  CollectingOutput out;
  EXPECT_EQ(drive(*reader, ctx, out, [] { return false; }), InputStatus::kEndOfInput);
  EXPECT_EQ(out.records, (std::vector<std::string>{"0", "1", "2"}));
}

TEST(KafkaSourceMockTest, TransientFetchErrorsAreRetried) {
  MockCluster mock;
  mock.create_and_fill("flaky", 1, 20);
  // Fetch is API key 1: the next three fetches fail with a retriable error.
  rd_kafka_mock_push_request_errors(mock.get(), 1, 3, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION);
  auto source = mock_source(mock, "flaky");
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->add_splits({{"flaky", 0, 0, 20, false}});
  reader->notify_no_more_splits();
  CollectingOutput out;
  EXPECT_EQ(drive(*reader, ctx, out, [] { return false; }), InputStatus::kEndOfInput);
  EXPECT_EQ(out.records.size(), 20u);
}

TEST(KafkaSourceMockTest, AnAuthorizationFailureFailsTheReaderWithLibrdkafkasText) {
  MockCluster mock;
  mock.create_and_fill("secret", 1, 5);
  // Fetch is API key 1.
  rd_kafka_mock_push_request_errors(mock.get(), 1, 1, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
  auto source = mock_source(mock, "secret");
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->add_splits({{"secret", 0, 0, std::nullopt, false}});
  CollectingOutput out;
  try {
    drive(*reader, ctx, out, [] { return false; });
    FAIL() << "the reader should fail";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kConnector);
    EXPECT_NE(e.error().message().find("TOPIC_AUTHORIZATION_FAILED"), std::string::npos) << e.error().message();
  }
}

TEST(KafkaSourceMockTest, BadRecordsFailOrGoToTheDeadLetterFile) {
  MockCluster mock;
  mock.create_and_fill("json", 1, 3);  // "0", "1", "2" are JSON numbers
  {
    // Produce one poison record at offset 3 and a good one after it.
    char errstr[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", mock.bootstrap().c_str(), errstr, sizeof errstr);
    kafka::KafkaClientPtr producer(rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr));
    for (std::string v : {std::string("{oops"), std::string("4")}) {
      ASSERT_EQ(rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC("json"), RD_KAFKA_V_PARTITION(0),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(v.data(), v.size()),
                                  RD_KAFKA_V_END),
                RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 10'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  auto builder = KafkaSource<Value>::builder()
                     .bootstrap_servers(mock.bootstrap())
                     .topics({"json"})
                     .deserializer(kafka::json_value())
                     .property("isolation.level", "read_uncommitted")
                     .property("log_level", "3");
  class Out final : public ReaderOutput<Value> {
   public:
    void collect(Value&& v) override { values.push_back(v.to_json()); }
    void collect(Value&& v, TimestampMs) override { values.push_back(v.to_json()); }
    void emit_watermark(TimestampMs) override {}
    std::vector<std::string> values;
  };
  auto run = [&](const std::shared_ptr<KafkaSource<Value>>& source, Out& out) {
    FakeReaderContext ctx;
    auto reader = source->create_reader(ctx);
    reader->add_splits({{"json", 0, 0, 5, false}});
    reader->notify_no_more_splits();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      InputStatus st = reader->poll_next(out);
      if (st == InputStatus::kEndOfInput) return reader->snapshot_state(1);
      if (st == InputStatus::kNothingAvailable) ctx.wait(100);
    }
    ADD_FAILURE() << "the reader did not end";
    return std::vector<KafkaPartitionSplit>{};
  };

  Out failed;
  try {
    run(builder.build(), failed);
    FAIL() << "kFail should fail the reader";
  } catch (const SluiceException& e) {
    EXPECT_NE(e.error().message().find("topic 'json' partition 0 at offset 3"), std::string::npos)
        << e.error().message();
  }
  EXPECT_EQ(failed.values, (std::vector<std::string>{"0", "1", "2"}));

  char tmpl[] = "/tmp/sluice-kafka-dlq-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/dead/letters.jsonl";
  auto diverting = KafkaSourceBuilder<Value>(builder).on_bad_record(BadRecordPolicy::kDeadLetter, path).build();
  Out out;
  run(diverting, out);
  EXPECT_EQ(out.values, (std::vector<std::string>{"0", "1", "2", "4"})) << "the record after the bad one is read";
  EXPECT_EQ(diverting->stats()->bad_records.load(), 1);
  EXPECT_EQ(diverting->metrics().bad_records, 1);
  EXPECT_EQ(diverting->metrics().records_read, 5) << "the bad record is read too";
  // The file source's dead-letter format with Kafka's position fields.
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char line[1024] = {};
  ASSERT_NE(std::fgets(line, sizeof line, f), nullptr);
  std::fclose(f);
  Result<Value> entry = Value::from_json(std::string_view(line).substr(0, std::strlen(line) - 1));
  ASSERT_TRUE(entry.ok());
  auto field = [&](std::string_view name) -> const Value& {
    static const Value missing;
    const Value* v = entry->at_path(name);
    EXPECT_NE(v, nullptr) << name;
    return v != nullptr ? *v : missing;
  };
  EXPECT_EQ(field("source").as_string(), "kafka");
  EXPECT_EQ(field("topic").as_string(), "json");
  EXPECT_EQ(field("partition").as_int64(), 0);
  EXPECT_EQ(field("offset").as_int64(), 3);
  EXPECT_EQ(field("record").as_string(), "{oops");
  EXPECT_TRUE(field("key").is_null());
  EXPECT_FALSE(field("error").as_string().empty());
  std::filesystem::remove_all(tmpl);
}

TEST(KafkaSourceMetricsTest, EmptyUntilReadersRegisterAndLagUnknownWithoutAHighWatermark) {
  detail::KafkaSourceStats stats;
  KafkaSourceMetrics m = stats.metrics(1'000'000, 0);
  EXPECT_EQ(m.records_read, 0);
  EXPECT_EQ(m.records_lag_max, -1);
  EXPECT_EQ(m.pending_records, -1);
  EXPECT_EQ(m.lag_ms, -1) << "no record read yet";
  EXPECT_TRUE(m.partitions.empty());

  // A reader without a consumer (librdkafka knows no high watermark): offsets known, lag unknown.
  auto reader = std::make_shared<detail::KafkaReaderStats>();
  auto b1 = std::make_shared<detail::KafkaPartitionStats>("b", 1);
  auto a0 = std::make_shared<detail::KafkaPartitionStats>("a", 0);
  b1->current_offset = 7;
  a0->current_offset = 3;
  a0->committed_offset = 2;
  a0->last_timestamp_ms = 999'000;
  reader->partitions[{"b", 1}] = b1;
  reader->partitions[{"a", 0}] = a0;
  stats.readers.push_back(reader);
  stats.records_read = 10;
  stats.bytes_read = 20;
  stats.last_timestamp_ms = 999'500;
  stats.bad->bad_records = 1;
  m = stats.metrics(1'000'000, 0);
  EXPECT_EQ(m.records_read, 10);
  EXPECT_EQ(m.bytes_read, 20);
  EXPECT_EQ(m.bad_records, 1);
  ASSERT_EQ(m.partitions.size(), 2u);
  EXPECT_EQ(m.partitions[0], (KafkaPartitionMetrics{"a", 0, 3, 2, -1, -1})) << "sorted by topic and partition";
  EXPECT_EQ(m.partitions[1], (KafkaPartitionMetrics{"b", 1, 7, -1, -1, -1}));
  EXPECT_EQ(m.records_lag_max, -1);
  EXPECT_EQ(m.pending_records, -1);
  // No partition is known to lag or to be caught up: unknown, not "now minus the last record ever read".
  EXPECT_EQ(m.lag_ms, -1);
}

TEST(KafkaSourceMetricsTest, TheRateOfAReaderNotPolledForTwoWindowsDecays) {
  detail::KafkaSourceStats stats;
  auto reader = std::make_shared<detail::KafkaReaderStats>();
  reader->records_per_second = 500.0;  // the last completed window
  reader->window_start_ms = 10'000;
  reader->window_records = 40;
  stats.readers.push_back(reader);
  auto other = std::make_shared<detail::KafkaReaderStats>();
  other->records_per_second = 100.0;
  other->window_start_ms = 13'500;
  stats.readers.push_back(other);
  EXPECT_DOUBLE_EQ(stats.metrics(0, 11'000).records_per_second, 600.0);
  // 4 s later the first reader's window is still open (it was not polled): 40 records in 4 s.
  EXPECT_DOUBLE_EQ(stats.metrics(0, 14'000).records_per_second, 10.0 + 100.0);
}

/// Polls `reader` (any record type) until `done` holds or 30 s pass; false on timeout.
template <class Reader, class Out, class Done>
bool poll_until_done(Reader& reader, FakeReaderContext& ctx, Out& out, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    if (reader.poll_next(out) == InputStatus::kNothingAvailable) ctx.wait(100);
  }
  return done();
}

TEST(KafkaSourceMockTest, MetricsShowPositionsLagAndCommittedOffsets) {
  MockCluster mock;
  mock.create_and_fill("metered", 2, 10);  // partitions 0 and 1 hold five one-byte values each
  auto source = KafkaSource<std::string>::builder()
                    .bootstrap_servers(mock.bootstrap())
                    .topics({"metered"})
                    .group_id("metered-group")
                    .property("isolation.level", "read_uncommitted")
                    .property("log_level", "3")
                    .build();
  // Another thread reads the metrics all along (for TSan).
  // Joined on every exit (a failed ASSERT returns early; a joinable std::thread would terminate the binary). It
  // reads every millisecond, a scraper's pace rather than a spin that would starve the mock cluster.
  std::jthread observer([&](std::stop_token stop) {
    std::mutex mu;
    std::condition_variable_any cv;
    std::unique_lock lock(mu);
    while (!stop.stop_requested()) {
      KafkaSourceMetrics m = source->metrics();
      EXPECT_LE(m.records_read, 10);
      // Returns after 1 ms, or at once when a stop is requested.
      cv.wait_for(lock, stop, std::chrono::milliseconds(1), [] { return false; });
    }
  });
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->add_splits({{"metered", 0, 0, std::nullopt, false}, {"metered", 1, 0, std::nullopt, false}});
  KafkaSourceMetrics m = source->metrics();
  ASSERT_EQ(m.partitions.size(), 2u);
  EXPECT_EQ(m.partitions[0].current_offset, 0);
  EXPECT_EQ(m.partitions[0].committed_offset, -1);
  EXPECT_EQ(m.lag_ms, -1);

  // librdkafka fetches without the reader being polled: the high watermarks arrive, nothing is read yet.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (source->metrics().pending_records != 10 && std::chrono::steady_clock::now() < deadline)
    ctx.wait(100);
  m = source->metrics();
  EXPECT_EQ(m.pending_records, 10);
  EXPECT_EQ(m.records_lag_max, 5);
  EXPECT_EQ(m.records_read, 0);
  for (const KafkaPartitionMetrics& p : m.partitions) {
    EXPECT_EQ(p.high_watermark, 5) << p.partition;
    EXPECT_EQ(p.lag, 5) << p.partition;
  }

  CollectingOutput out;
  ASSERT_TRUE(poll_until_done(*reader, ctx, out, [&] { return out.records.size() >= 10; }));
  m = source->metrics();
  EXPECT_EQ(m.records_read, 10);
  EXPECT_EQ(m.bytes_read, 10);
  EXPECT_EQ(m.records_lag_max, 0);
  EXPECT_EQ(m.pending_records, 0);
  EXPECT_EQ(m.lag_ms, 0) << "caught up";
  ASSERT_EQ(m.partitions.size(), 2u);
  for (const KafkaPartitionMetrics& p : m.partitions) {
    EXPECT_EQ(p.topic, "metered");
    EXPECT_EQ(p.current_offset, 5) << p.partition;
    EXPECT_EQ(p.lag, 0) << p.partition;
  }

  // A completed checkpoint commits its offsets; the broker's acknowledgement shows as committed offsets.
  reader->snapshot_state(1);
  reader->notify_checkpoint_complete(1);
  ASSERT_TRUE(poll_until_done(*reader, ctx, out,
                              [&] {
                                const KafkaSourceMetrics now = source->metrics();
                                return now.partitions.size() == 2 && now.partitions[0].committed_offset == 5 &&
                                       now.partitions[1].committed_offset == 5;
                              }))
      << "committed offsets " << source->metrics().partitions[0].committed_offset;

  reader->close();
  observer.request_stop();
  observer.join();
  m = source->metrics();
  EXPECT_TRUE(m.partitions.empty()) << "a closed reader's partitions drop out";
  EXPECT_EQ(m.records_read, 10) << "counters stay";
}

TEST(KafkaSourceMockTest, AMissingTopicFailsTheJobAtStart) {
  MockCluster mock;
  mock.create_and_fill("present", 1, 1);
  StreamEnvironment env;
  auto records = std::make_shared<testing::CollectedRecords<std::string>>();
  env.from_source(mock_source(mock, "absent"), "kafka")
      .sink_to(std::make_shared<testing::CollectSink<std::string>>(records));
  JobResult r = env.execute("missing topic");
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->to_string().find("topic 'absent' does not exist"), std::string::npos) << r.error->to_string();
}

TEST(KafkaSourceMockTest, AnUnreachableClusterFailsTheJobAfterTheStartupTimeout) {
  StreamEnvironment env;
  auto source = KafkaSource<std::string>::builder()
                    .bootstrap_servers("127.0.0.1:1")
                    .topics({"t"})
                    .startup_timeout(std::chrono::milliseconds(1500))
                    .property("log_level", "0")
                    .build();
  auto records = std::make_shared<testing::CollectedRecords<std::string>>();
  env.from_source(source, "kafka").sink_to(std::make_shared<testing::CollectSink<std::string>>(records));
  const auto start = std::chrono::steady_clock::now();
  JobResult r = env.execute("unreachable");
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.status, JobStatus::kFailed);
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->to_string().find("cannot reach the Kafka cluster at '127.0.0.1:1' within 1500 ms"),
            std::string::npos)
      << r.error->to_string();
  EXPECT_LT(took, std::chrono::seconds(20));
}

TEST(KafkaSourceMockTest, BoundedJobReadsEveryPartitionInOrder) {
  MockCluster mock;
  mock.create_and_fill("bounded", 3, 300);
  StreamEnvironment env;
  env.set_parallelism(2);
  auto source = KafkaSource<std::string>::builder()
                    .bootstrap_servers(mock.bootstrap())
                    .topics({"bounded"})
                    .bounded()
                    .property("isolation.level", "read_uncommitted")
                    .property("log_level", "3")
                    .build();
  auto records = std::make_shared<testing::CollectedRecords<std::string>>();
  env.from_source(source, "kafka").sink_to(std::make_shared<testing::CollectSink<std::string>>(records));
  JobResult r = env.execute("bounded");
  ASSERT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  std::vector<std::string> all = records->all();
  ASSERT_EQ(all.size(), 300u);
  // Per partition (value % 3), values arrive in increasing order on one subtask.
  for (const auto& per_subtask : records->per_subtask()) {
    std::map<int, int> last;
    for (const std::string& v : per_subtask) {
      const int n = std::stoi(v);
      auto it = last.find(n % 3);
      if (it != last.end()) {
        EXPECT_LT(it->second, n);
      }
      last[n % 3] = n;
    }
  }
}

}  // namespace
}  // namespace sluice
