// librdkafka helpers for integration tests against the real broker of scripts/services/kafka: RAII handles,
// client creation from a config map, topic creation through the Admin API (rd_kafka_CreateTopics) that waits
// until every partition has a leader, and unique topic names. Link PkgConfig::RDKAFKA.
#pragma once

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace sluice::testing::kafka {

struct KafkaDeleter {
  void operator()(rd_kafka_t* rk) const {
    if (rk != nullptr) rd_kafka_destroy(rk);
  }
  void operator()(rd_kafka_conf_t* c) const {
    if (c != nullptr) rd_kafka_conf_destroy(c);
  }
  void operator()(rd_kafka_message_t* m) const {
    if (m != nullptr) rd_kafka_message_destroy(m);
  }
  void operator()(rd_kafka_topic_partition_list_t* l) const {
    if (l != nullptr) rd_kafka_topic_partition_list_destroy(l);
  }
  void operator()(rd_kafka_error_t* e) const {
    if (e != nullptr) rd_kafka_error_destroy(e);
  }
  void operator()(rd_kafka_queue_t* q) const {
    if (q != nullptr) rd_kafka_queue_destroy(q);
  }
  void operator()(rd_kafka_event_t* e) const {
    if (e != nullptr) rd_kafka_event_destroy(e);
  }
  void operator()(rd_kafka_AdminOptions_t* o) const {
    if (o != nullptr) rd_kafka_AdminOptions_destroy(o);
  }
  void operator()(rd_kafka_NewTopic_t* t) const {
    if (t != nullptr) rd_kafka_NewTopic_destroy(t);
  }
  void operator()(rd_kafka_consumer_group_metadata_t* m) const {
    if (m != nullptr) rd_kafka_consumer_group_metadata_destroy(m);
  }
};

using Client = std::unique_ptr<rd_kafka_t, KafkaDeleter>;
using Message = std::unique_ptr<rd_kafka_message_t, KafkaDeleter>;
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, KafkaDeleter>;
using Error = std::unique_ptr<rd_kafka_error_t, KafkaDeleter>;

using Config = std::map<std::string, std::string>;

/// Builds a configuration from key/value pairs. Fails the test (returns nullptr) on an unknown key or value.
/// Callbacks (dr_msg_cb, opaque) are set by the caller on the returned conf before make_client.
inline std::unique_ptr<rd_kafka_conf_t, KafkaDeleter> make_conf(const Config& settings) {
  std::unique_ptr<rd_kafka_conf_t, KafkaDeleter> conf(rd_kafka_conf_new());
  char errstr[512];
  for (const auto& [k, v] : settings) {
    if (rd_kafka_conf_set(conf.get(), k.c_str(), v.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
      ADD_FAILURE() << "librdkafka config " << k << "=" << v << ": " << errstr;
      return nullptr;
    }
  }
  return conf;
}

/// Creates a producer or consumer from conf (which it takes over). Fails the test (returns nullptr) on error.
inline Client make_client(rd_kafka_type_t type, std::unique_ptr<rd_kafka_conf_t, KafkaDeleter> conf) {
  if (!conf) return nullptr;
  char errstr[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf.get(), errstr, sizeof errstr);
  if (rk == nullptr) {
    ADD_FAILURE() << "rd_kafka_new: " << errstr;
    return nullptr;
  }
  conf.release();  // owned by rk now
  return Client(rk);
}

inline Client make_client(rd_kafka_type_t type, const Config& settings) {
  return make_client(type, make_conf(settings));
}

/// A topic name no other test (or earlier run against the same broker) used: PREFIX-<test>-<pid>-<n>.
inline std::string unique_topic(const std::string& prefix) {
  static std::atomic<int> counter{0};
  std::string test = "notest";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) test = info->name();
  std::string name = prefix + "-" + test + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
  for (char& c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return name.substr(0, 249);
}

/// Waits until the broker's metadata shows TOPIC with PARTITIONS partitions, each with a leader.
inline ::testing::AssertionResult wait_for_topic(rd_kafka_t* rk, const std::string& topic, int partitions,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no metadata yet";
  while (std::chrono::steady_clock::now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, nullptr, &md, 5000);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      bool ready = false;
      for (int i = 0; i < md->topic_cnt; ++i) {
        const auto& t = md->topics[i];
        if (topic != t.topic) continue;
        if (t.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
          last = std::string("topic error ") + rd_kafka_err2str(t.err);
        } else if (t.partition_cnt != partitions) {
          last = "partitions " + std::to_string(t.partition_cnt) + " != " + std::to_string(partitions);
        } else {
          ready = true;
          for (int p = 0; p < t.partition_cnt; ++p) {
            if (t.partitions[p].err != RD_KAFKA_RESP_ERR_NO_ERROR || t.partitions[p].leader < 0) {
              ready = false;
              last = "partition " + std::to_string(p) + " has no leader yet";
            }
          }
        }
      }
      rd_kafka_metadata_destroy(md);
      if (ready) return ::testing::AssertionSuccess();
    } else {
      last = std::string("metadata: ") + rd_kafka_err2str(err);
    }
    // Serve the client's event queue between metadata requests (returns early on events) instead of sleeping.
    rd_kafka_poll(rk, 100);
  }
  return ::testing::AssertionFailure() << "topic " << topic << " not ready after " << timeout.count()
                                       << " ms: " << last;
}

/// Creates TOPIC (replication factor 1) with the given topic configs through the Admin API and waits until
/// all its partitions have a leader. A topic that already exists with that partition count is accepted.
/// Use: ASSERT_TRUE(create_topic(bootstrap, topic, 3));
inline ::testing::AssertionResult create_topic(const std::string& bootstrap, const std::string& topic, int partitions,
                                               const Config& topic_configs = {},
                                               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  Client admin = make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}});
  if (!admin) return ::testing::AssertionFailure() << "could not create an admin client";
  char errstr[512];
  std::unique_ptr<rd_kafka_NewTopic_t, KafkaDeleter> nt(
      rd_kafka_NewTopic_new(topic.c_str(), partitions, 1, errstr, sizeof errstr));
  if (!nt) return ::testing::AssertionFailure() << "NewTopic " << topic << ": " << errstr;
  for (const auto& [k, v] : topic_configs) {
    if (rd_kafka_resp_err_t err = rd_kafka_NewTopic_set_config(nt.get(), k.c_str(), v.c_str())) {
      return ::testing::AssertionFailure() << "topic config " << k << ": " << rd_kafka_err2str(err);
    }
  }
  std::unique_ptr<rd_kafka_AdminOptions_t, KafkaDeleter> opts(
      rd_kafka_AdminOptions_new(admin.get(), RD_KAFKA_ADMIN_OP_CREATETOPICS));
  auto ms = static_cast<int>(timeout.count());
  rd_kafka_AdminOptions_set_request_timeout(opts.get(), ms, errstr, sizeof errstr);
  rd_kafka_AdminOptions_set_operation_timeout(opts.get(), ms, errstr, sizeof errstr);
  std::unique_ptr<rd_kafka_queue_t, KafkaDeleter> queue(rd_kafka_queue_new(admin.get()));
  rd_kafka_NewTopic_t* topics[] = {nt.get()};
  rd_kafka_CreateTopics(admin.get(), topics, 1, opts.get(), queue.get());
  std::unique_ptr<rd_kafka_event_t, KafkaDeleter> ev(rd_kafka_queue_poll(queue.get(), ms + 5000));
  if (!ev) return ::testing::AssertionFailure() << "CreateTopics " << topic << ": no result in time";
  if (rd_kafka_event_error(ev.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return ::testing::AssertionFailure() << "CreateTopics " << topic << ": " << rd_kafka_event_error_string(ev.get());
  }
  const rd_kafka_CreateTopics_result_t* res = rd_kafka_event_CreateTopics_result(ev.get());
  if (res == nullptr) return ::testing::AssertionFailure() << "CreateTopics " << topic << ": unexpected event";
  size_t cnt = 0;
  const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(res, &cnt);
  for (size_t i = 0; i < cnt; ++i) {
    rd_kafka_resp_err_t err = rd_kafka_topic_result_error(results[i]);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
      const char* msg = rd_kafka_topic_result_error_string(results[i]);
      return ::testing::AssertionFailure()
             << "CreateTopics " << topic << ": " << rd_kafka_err2str(err) << " (" << (msg ? msg : "") << ")";
    }
  }
  return wait_for_topic(admin.get(), topic, partitions, timeout);
}

/// "" when ERROR is null, else its text; takes ownership of ERROR.
inline std::string error_text(rd_kafka_error_t* error) {
  Error e(error);
  return e ? std::string(rd_kafka_error_name(e.get())) + ": " + rd_kafka_error_string(e.get()) : std::string();
}

}  // namespace sluice::testing::kafka
