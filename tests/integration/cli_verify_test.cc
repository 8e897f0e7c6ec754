// `sluice verify` (docs/verify.md) run as a user runs it, on real outputs: a files sink directory written by a real
// `sluice run`, then a copy of it deliberately broken (a line removed, one duplicated, two swapped); and Kafka topics
// written by a transactional producer, where an aborted transaction's duplicates must be invisible (read_committed)
// and a skipped sequence number must be found.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "integration/test_util/child_process.h"
#include "integration/test_util/kafka.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/services.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::run_to_end;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sluice-verify-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    out.push_back(line);
  return out;
}

void write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p);
  for (const auto& l : lines)
    out << l << "\n";
}

// The per-key sequence of a datagen charge is its row's `revision` (0 at creation, +1 per change), the event id is
// the domain event's `id` (a UUIDv5 of the source position).
const std::vector<std::string> kFields = {"--id-field", "id",          "--key-field",
                                          "entity",     "--seq-field", "payload.revision"};

TEST(CliVerifyTest, AFilesSinkOutputIsCleanAndABrokenCopyIsCaught) {
  TempDir dir;
  const std::string out = dir.path() + "/out";
  const std::string pipeline = dir.path() + "/p.yaml";
  {
    std::ofstream f(pipeline);
    f << "pipeline:\n  name: verify-files\n  parallelism: 2\n"
      << "  checkpoint: { interval: 200ms, storage: \"" << dir.path() << "/ckpt\" }\n"
      << "  delivery: exactly-once\n"
      << "source: { type: datagen, count: 3000, entities: 40, seed: 7 }\n"
      << "transform:\n  - match: \"*\"\n    key: after.id\n    event:\n      type: \"'charge.' || after.status\"\n"
      << "      payload: \"after.id, after.revision, after.status\"\n"
      << "sink:\n  out: { type: files, path: \"" << out << "\" }\n";
  }
  auto run = run_to_end(SLUICE_BINARY, {"run", pipeline, "--http-port", "-1"});
  ASSERT_EQ(run.code, 0) << run.out << run.err;

  std::vector<std::string> args = {"verify", "--files", out};
  args.insert(args.end(), kFields.begin(), kFields.end());
  auto clean = run_to_end(SLUICE_BINARY, args);
  EXPECT_EQ(clean.code, 0) << clean.out << clean.err;
  EXPECT_NE(clean.out.find("records:       3000"), std::string::npos) << clean.out;
  EXPECT_NE(clean.out.find("keys:          40"), std::string::npos) << clean.out;
  EXPECT_NE(clean.out.find("result:        OK"), std::string::npos) << clean.out;

  // The broken copy: in the largest committed file, line 300 removed (a loss), line 20 written twice (a replay), and
  // two lines of one key swapped (a reordering).
  const std::string broken = dir.path() + "/broken";
  fs::copy(out, broken, fs::copy_options::recursive);
  fs::path largest;
  for (const auto& e : fs::directory_iterator(broken)) {
    if (e.path().filename().string().starts_with('.')) continue;
    if (largest.empty() || fs::file_size(e.path()) > fs::file_size(largest)) largest = e.path();
  }
  ASSERT_FALSE(largest.empty());
  std::vector<std::string> lines = read_lines(largest);
  ASSERT_GT(lines.size(), 1000U);
  // Find two lines of the same key, the first not one of lines 10 and 20, to swap.
  auto key_of = [](const std::string& l) { return l.substr(l.find("\"entity\":"), 30); };
  size_t a = 100;
  size_t b = a + 1;
  while (b < lines.size() && key_of(lines[b]) != key_of(lines[a]))
    ++b;
  ASSERT_LT(b, lines.size());
  std::swap(lines[a], lines[b]);
  lines.erase(lines.begin() + 300);  // mid-sequence: each of 40 keys has ~75 records, so not a key's first or last
  lines.insert(lines.begin() + 21, lines[20]);
  write_lines(largest, lines);
  args[2] = broken;
  auto bad = run_to_end(SLUICE_BINARY, args);
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("duplicated:    1"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("missing:       1 (in 1 keys)"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("out of order:  1"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("result:        VIOLATED"), std::string::npos) << bad.out;
  std::printf("%s", bad.out.c_str());

  // Bad flags and unreadable sources are exit code 2, with the reason.
  auto no_source = run_to_end(SLUICE_BINARY, {"verify", "--id-field", "id"});
  EXPECT_EQ(no_source.code, 2) << no_source.out << no_source.err;
  // An empty directory (or one holding only uncommitted files) read nothing: not clean unless --allow-empty.
  {
    const TempDir empty;
    write_lines(fs::path(empty.path()) / ".part-0-0.inprogress",
                {R"({"id":"a","entity":"k","payload":{"revision":0}})"});
    std::vector<std::string> args = {"verify", "--files", empty.path()};
    args.insert(args.end(), kFields.begin(), kFields.end());
    auto nothing = run_to_end(SLUICE_BINARY, args);
    EXPECT_EQ(nothing.code, 1) << nothing.out << nothing.err;
    EXPECT_NE(nothing.out.find("records:       0"), std::string::npos) << nothing.out;
    EXPECT_NE(nothing.out.find("result:        EMPTY: no record was read from " + empty.path()), std::string::npos)
        << nothing.out;
    EXPECT_NE(nothing.err.find("no record was read"), std::string::npos) << nothing.err;
    args.push_back("--allow-empty");
    auto allowed = run_to_end(SLUICE_BINARY, args);
    EXPECT_EQ(allowed.code, 0) << allowed.out << allowed.err;
    EXPECT_NE(allowed.out.find("result:        OK"), std::string::npos) << allowed.out;
  }
  auto missing_dir = run_to_end(SLUICE_BINARY, {"verify", "--files", dir.path() + "/nope", "--id-field", "id"});
  EXPECT_EQ(missing_dir.code, 2);
  EXPECT_NE(missing_dir.err.find("not a directory"), std::string::npos) << missing_dir.err;
  // Malformed flags too (not CLI11's own codes 104-114), naming the flag; --help is 0.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"verify", "--files", dir.path(), "--id-field"},
        std::vector<std::string>{"verify", "--files", dir.path(), "--key-field", "entity", "--seq-field", "seq",
                                 "--seq-start", "abc"},
        std::vector<std::string>{"verify", "--files", dir.path(), "--id-field", "id", "--no-such-flag"},
        std::vector<std::string>{"verify", "--files", dir.path(), "--topic", "t", "--id-field", "id"}}) {
    auto malformed = run_to_end(SLUICE_BINARY, args);
    EXPECT_EQ(malformed.code, 2) << args.back() << ": " << malformed.out << malformed.err;
    EXPECT_FALSE(malformed.err.empty());
  }
  EXPECT_EQ(run_to_end(SLUICE_BINARY, {"verify", "--help"}).code, 0);
}

// Writes `records` (JSON values) to `topic` in one transaction, committed or aborted.
void produce_transaction(const std::string& bootstrap, const std::string& topic, const std::string& txn_id,
                         const std::vector<std::pair<std::string, std::string>>& records, bool commit) {
  using namespace testing::kafka;
  Client p = make_client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}, {"transactional.id", txn_id}});
  ASSERT_TRUE(p);
  ASSERT_EQ(error_text(rd_kafka_init_transactions(p.get(), 30000)), "");
  ASSERT_EQ(error_text(rd_kafka_begin_transaction(p.get())), "");
  for (const auto& [key, value] : records) {
    ASSERT_EQ(rd_kafka_producev(p.get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  if (commit) {
    ASSERT_EQ(error_text(rd_kafka_commit_transaction(p.get(), 30000)), "");
  } else {
    ASSERT_EQ(rd_kafka_flush(p.get(), 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_EQ(error_text(rd_kafka_abort_transaction(p.get(), 30000)), "");
  }
}

// Waits until every partition's last stable offset has reached its high watermark: commit_transaction returns
// once the coordinator has logged the commit, the markers on the partitions follow, and a read_committed reader
// (sluice verify reads to the last stable offset) that starts before them stops short of the transaction.
void wait_until_stable(const std::string& bootstrap, const std::string& topic, int partitions) {
  using namespace testing::kafka;
  Client committed = make_client(
      RD_KAFKA_CONSUMER,
      {{"bootstrap.servers", bootstrap}, {"group.id", topic + "-stable"}, {"isolation.level", "read_committed"}});
  Client uncommitted = make_client(
      RD_KAFKA_CONSUMER,
      {{"bootstrap.servers", bootstrap}, {"group.id", topic + "-stable"}, {"isolation.level", "read_uncommitted"}});
  ASSERT_TRUE(committed && uncommitted);
  for (int p = 0; p < partitions; ++p) {
    int64_t lo = 0, stable = -1, high = -2;
    const bool stable_now = testing::poll_until(
        [&] {
          return rd_kafka_query_watermark_offsets(committed.get(), topic.c_str(), p, &lo, &stable, 10'000) ==
                     RD_KAFKA_RESP_ERR_NO_ERROR &&
                 rd_kafka_query_watermark_offsets(uncommitted.get(), topic.c_str(), p, &lo, &high, 10'000) ==
                     RD_KAFKA_RESP_ERR_NO_ERROR &&
                 stable == high;
        },
        std::chrono::seconds(30));
    ASSERT_TRUE(stable_now) << topic << "/" << p << ": last stable offset " << stable << ", high watermark " << high;
  }
}

std::vector<std::pair<std::string, std::string>> workload(int keys, int seqs, int skip_seq = -1) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int s = 1; s <= seqs; ++s) {
    for (int k = 0; k < keys; ++k) {
      if (s == skip_seq && k == 0) continue;
      const std::string key = "k" + std::to_string(k);
      out.emplace_back(key, "{\"event_id\":\"" + key + "-" + std::to_string(s) + "\",\"account\":\"" + key +
                                "\",\"seq\":" + std::to_string(s) + "}");
    }
  }
  return out;
}

TEST(CliVerifyTest, AKafkaTopicIsReadCommittedAndAGapIsCaught) {
  const std::string bootstrap = testing::kafka_bootstrap_servers();
  if (bootstrap.empty()) return;
  const std::vector<std::string> fields = {"--id-field",  "event_id", "--key-field", "account",
                                           "--seq-field", "seq",      "--timeout",   "60"};
  // Clean: 5 keys x 40 seqs committed; then an aborted transaction replaying the first 10 seqs of every key.
  const std::string clean_topic = testing::kafka::unique_topic("verify-clean");
  ASSERT_TRUE(testing::kafka::create_topic(bootstrap, clean_topic, 3));
  produce_transaction(bootstrap, clean_topic, clean_topic + "-txn", workload(5, 40), true);
  produce_transaction(bootstrap, clean_topic, clean_topic + "-txn", workload(5, 10), false);
  wait_until_stable(bootstrap, clean_topic, 3);
  std::vector<std::string> args = {"verify", "--bootstrap-servers", bootstrap, "--topic", clean_topic};
  args.insert(args.end(), fields.begin(), fields.end());
  auto clean = run_to_end(SLUICE_BINARY, args);
  EXPECT_EQ(clean.code, 0) << clean.out << clean.err;
  EXPECT_NE(clean.out.find("records:       200"), std::string::npos) << clean.out;
  EXPECT_NE(clean.out.find("read_committed"), std::string::npos) << clean.out;
  // The same topic read uncommitted shows the aborted replay: what read_committed protects a check from.
  std::vector<std::string> uncommitted = args;
  uncommitted.insert(uncommitted.end(), {"--kafka-properties", "isolation.level=read_uncommitted"});
  auto dirty = run_to_end(SLUICE_BINARY, uncommitted);
  EXPECT_EQ(dirty.code, 1) << dirty.out << dirty.err;
  EXPECT_NE(dirty.out.find("duplicated:    50"), std::string::npos) << dirty.out;

  // A topic that holds only an aborted transaction reads nothing committed: not clean unless --allow-empty.
  const std::string empty_topic = testing::kafka::unique_topic("verify-empty");
  ASSERT_TRUE(testing::kafka::create_topic(bootstrap, empty_topic, 3));
  produce_transaction(bootstrap, empty_topic, empty_topic + "-txn", workload(5, 10), false);
  wait_until_stable(bootstrap, empty_topic, 3);
  args[4] = empty_topic;
  auto nothing = run_to_end(SLUICE_BINARY, args);
  EXPECT_EQ(nothing.code, 1) << nothing.out << nothing.err;
  EXPECT_NE(nothing.out.find("EMPTY: no record was read from topic " + empty_topic), std::string::npos) << nothing.out;
  std::vector<std::string> allow_empty = args;
  allow_empty.push_back("--allow-empty");
  EXPECT_EQ(run_to_end(SLUICE_BINARY, allow_empty).code, 0);

  // Broken: seq 17 of key k0 never written.
  const std::string gap_topic = testing::kafka::unique_topic("verify-gap");
  ASSERT_TRUE(testing::kafka::create_topic(bootstrap, gap_topic, 3));
  produce_transaction(bootstrap, gap_topic, gap_topic + "-txn", workload(5, 40, 17), true);
  wait_until_stable(bootstrap, gap_topic, 3);
  args[4] = gap_topic;
  auto gap = run_to_end(SLUICE_BINARY, args);
  EXPECT_EQ(gap.code, 1) << gap.out << gap.err;
  EXPECT_NE(gap.out.find("missing:       1 (in 1 keys)"), std::string::npos) << gap.out;
  EXPECT_NE(gap.out.find("key k0: 1 of seq 1..40 missing, first: 17"), std::string::npos) << gap.out;
}

}  // namespace
}  // namespace sluice
