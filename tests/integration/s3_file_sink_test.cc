// The files sink on S3 (issue 15 item 3) against moto (scripts/services/s3):
//  * one subtask's two-phase-commit sink operator driven by hand (records, snapshot_state,
//    notify_checkpoint_complete, restore from the operator state's bytes): part files are multipart uploads,
//    invisible until their checkpoint completes; committing again after a restore changes nothing (S3 no longer
//    knows the upload, the key holds the object its parts make); a restore aborts the uploads the checkpoint does
//    not name, of this subtask only; an upload aborted behind the sink's back fails the commit naming the key; a part
//    file larger than s3.multipart.part-size goes up in several parts;
//  * the committable's encoding: an S3 one round-trips, a file-system one is encoded as before S3 (old checkpoints
//    restore);
//  * `sluice run` writing to a moto of the test's own that is paused: the sink's requests time out, the task
//    fails, the job restarts, /health turns 503 naming the S3 request, the REST exceptions hold it; resumed, the job
//    runs again, checkpoints complete, /health is 200, and the finished output holds every record once with no
//    multipart upload left.
// Needs the s3 service: scripts/services/run-with s3 -- ctest --preset release -R s3_file_sink.
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "chaos/harness.h"
#include "integration/test_util/failures.h"
#include "integration/test_util/polling.h"
#include "integration/test_util/s3.h"
#include "integration/test_util/services.h"
#include "sluice/connectors/files.h"
#include "sluice/core/clock.h"
#include "sluice/core/data_io.h"
#include "sluice/core/value.h"
#include "sluice/operators/sink_operator.h"
#include "sluice/state/operator_state.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chaos::count_of;
using chaos::read_file;
using chaos::SluiceProcess;
using chaos::tail;
using testing::poll_until;

constexpr const char* kBucket = "sluice-test";

std::string unique_prefix(const std::string& what) {
  return fmt::format("{}-{}-{}", what, ::getpid(),
                     std::chrono::system_clock::now().time_since_epoch() / std::chrono::microseconds(1));
}

// The context of one subtask of the sink operator, with the job configuration the sink reads its s3.* keys from.
class S3SinkContext final : public RuntimeContext {
 public:
  S3SinkContext(int subtask, int parallelism, int attempt, Configuration config)
      : subtask_(subtask), parallelism_(parallelism), attempt_(attempt), config_(std::move(config)) {}
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return subtask_; }
  int parallelism() const override { return parallelism_; }
  int max_parallelism() const override { return 128; }
  int attempt_number() const override { return attempt_; }
  const Clock& clock() const override { return clock_; }
  OperatorStateStore& operator_state() override { return store_; }
  bool is_checkpointing_enabled() const override { return true; }
  const Configuration* job_configuration() const override { return &config_; }

 private:
  std::string name_ = "Sink: files";
  int subtask_, parallelism_, attempt_;
  Configuration config_;
  ManualClock clock_;
  OperatorStateStore store_;
};

/// One run of one subtask of a text FileSink on s3://sluice-test/<prefix>.
class S3SinkRun {
 public:
  struct Options {
    int subtask = 0;
    int parallelism = 1;
    int attempt = 0;
    std::string restored_state;  // the subtask's operator state snapshot; empty: fresh start
  };
  S3SinkRun(const std::string& endpoint, const std::string& prefix, Options o)
      : ctx_(o.subtask, o.parallelism, o.attempt, config_for(endpoint)),
        op_(FileSink<std::string>::text(fmt::format("s3://{}/{}", kBucket, prefix))) {
    if (!o.restored_state.empty()) {
      DataInput in(o.restored_state);
      Status st = ctx_.operator_state().restore(in);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
    }
    op_.setup(&ctx_, nullptr, {});
    op_.open();
  }
  ~S3SinkRun() { op_.close(); }
  void write(std::string r) { op_.process_element(std::move(r), kNoTimestamp); }
  std::string snapshot(int64_t id) {
    op_.snapshot_state(id);
    DataOutput out;
    ctx_.operator_state().snapshot(out);
    return std::string(out.view());
  }
  void complete(int64_t id) { op_.notify_checkpoint_complete(id); }

 private:
  static Configuration config_for(const std::string& endpoint) {
    Configuration c;
    c.set(options::kS3Endpoint, endpoint);
    c.set(options::kS3PathStyleAccess, true);
    c.set(options::kS3MultipartPartSize, int64_t{5} << 20);
    c.set(options::kS3RequestTimeout, int64_t{10'000});
    return c;
  }

  S3SinkContext ctx_;
  TwoPhaseCommitSinkOperator<std::string, FileCommittable> op_;
};

class S3FileSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& s3 = testing::require_service("s3");
    endpoint_ = s3.get("S3_ENDPOINT");
    server_bin_ = s3.get("S3_SERVER_BIN");
    ::setenv("AWS_ACCESS_KEY_ID", "sluice-test-key", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "sluice-test-secret", 1);
    client_ = testing::s3_test_client(endpoint_);
    ASSERT_TRUE(client_->create_bucket(kBucket).ok());
    prefix_ = unique_prefix("files");
  }

  // The names of the committed objects under the prefix ("part-0-0.txt", ...), sorted.
  std::vector<std::string> objects() {
    std::vector<std::string> names;
    auto listing = client_->list(kBucket, prefix_ + "/");
    EXPECT_TRUE(listing.ok()) << listing.error().to_string();
    if (listing.ok()) {
      for (const S3Object& o : listing->objects)
        names.push_back(o.key.substr(prefix_.size() + 1));
    }
    return names;
  }
  // The keys (names under the prefix) of the in-progress multipart uploads, sorted.
  std::vector<std::string> uploads() {
    std::vector<std::string> names;
    auto listed = client_->list_multipart_uploads(kBucket, prefix_ + "/");
    EXPECT_TRUE(listed.ok()) << listed.error().to_string();
    if (listed.ok()) {
      for (const S3MultipartUpload& u : *listed)
        names.push_back(u.key.substr(prefix_.size() + 1));
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string object(const std::string& name) {
    auto body = client_->get_object(kBucket, prefix_ + "/" + name);
    EXPECT_TRUE(body.ok()) << body.error().to_string();
    return body.ok() ? *body : std::string();
  }

  std::string endpoint_, server_bin_, prefix_;
  std::shared_ptr<S3Client> client_;
};

TEST_F(S3FileSinkTest, PartFilesAreMultipartUploadsVisibleOnlyWhenTheirCheckpointCompletes) {
  S3SinkRun run(endpoint_, prefix_, {});
  run.write("a");
  run.write("b");
  run.snapshot(1);
  EXPECT_TRUE(objects().empty());
  EXPECT_EQ(uploads(), (std::vector<std::string>{"part-0-0.txt"}));
  run.write("c");
  run.snapshot(2);
  EXPECT_EQ(uploads(), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  run.complete(1);
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_EQ(object("part-0-0.txt"), "a\nb\n");
  run.snapshot(3);  // nothing written since checkpoint 2: no file
  run.complete(3);
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(object("part-0-1.txt"), "c\n");
  EXPECT_TRUE(uploads().empty());
}

TEST_F(S3FileSinkTest, CommittingAgainAfterARestoreChangesNothing) {
  std::string chk1;
  {
    S3SinkRun run(endpoint_, prefix_, {});
    run.write("a");
    chk1 = run.snapshot(1);
    run.complete(1);  // committed; then the task fails before checkpoint 2: the restore commits chk1's file again
  }
  auto before = client_->head_object(kBucket, prefix_ + "/part-0-0.txt");
  ASSERT_TRUE(before.ok() && before->has_value());
  EXPECT_TRUE((*before)->etag.ends_with("-1\"")) << (*before)->etag;
  { S3SinkRun run(endpoint_, prefix_, {.attempt = 1, .restored_state = chk1}); }
  S3SinkRun run(endpoint_, prefix_, {.attempt = 2, .restored_state = chk1});
  auto after = client_->head_object(kBucket, prefix_ + "/part-0-0.txt");
  ASSERT_TRUE(after.ok() && after->has_value());
  EXPECT_EQ((*after)->etag, (*before)->etag);
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_EQ(object("part-0-0.txt"), "a\n");
  // The next file gets the next number.
  run.write("b");
  run.snapshot(2);
  run.complete(2);
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
}

TEST_F(S3FileSinkTest, ARestoreCommitsPreCommittedUploadsAndAbortsTheOthersOfItsSubtasks) {
  std::string chk2;
  {
    S3SinkRun run(endpoint_, prefix_, {.parallelism = 2});
    run.write("a");
    run.snapshot(1);
    run.complete(1);
    run.write("b");
    chk2 = run.snapshot(2);  // checkpoint 2 completes, but the task fails before its notification
    run.write("c");
    run.snapshot(3);  // pre-committed by a checkpoint that never completes
    run.write("d");   // being written when the process dies (its first part is not even uploaded)
  }
  // What crashed processes leave: an upload of this subtask past the checkpoint, and one of subtask 1 (not this
  // subtask's to abort). The runs' own discard() aborted nothing of checkpoint 3 (pre-committed).
  ASSERT_TRUE(client_->create_multipart_upload(kBucket, prefix_ + "/part-0-7.txt").ok());
  ASSERT_TRUE(client_->create_multipart_upload(kBucket, prefix_ + "/part-1-0.txt").ok());
  EXPECT_EQ(uploads(), (std::vector<std::string>{"part-0-1.txt", "part-0-2.txt", "part-0-7.txt", "part-1-0.txt"}));

  S3SinkRun run(endpoint_, prefix_, {.parallelism = 2, .attempt = 1, .restored_state = chk2});
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(object("part-0-1.txt"), "b\n");
  EXPECT_EQ(uploads(), (std::vector<std::string>{"part-1-0.txt"}));
  run.write("e");
  run.snapshot(3);
  run.complete(3);
  EXPECT_EQ(objects(), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt", "part-0-2.txt"}));
  EXPECT_EQ(object("part-0-2.txt"), "e\n");
}

TEST_F(S3FileSinkTest, AnUploadAbortedBehindTheSinksBackFailsTheCommitNamingTheKey) {
  std::string chk1;
  {
    S3SinkRun run(endpoint_, prefix_, {});
    run.write("a");
    chk1 = run.snapshot(1);
  }
  auto listed = client_->list_multipart_uploads(kBucket, prefix_ + "/");
  ASSERT_TRUE(listed.ok() && listed->size() == 1);
  ASSERT_TRUE(client_->abort_multipart_upload(kBucket, listed->front().key, listed->front().upload_id).ok());
  try {
    S3SinkRun run(endpoint_, prefix_, {.attempt = 1, .restored_state = chk1});
    FAIL() << "the restore committed a lost upload without an error";
  } catch (const OperatorException& e) {
    const std::string m = e.what();
    std::cout << m << "\n";
    EXPECT_EQ(e.code(), ErrorCode::kConnector) << m;
    EXPECT_NE(m.find("s3://sluice-test/" + prefix_ + "/part-0-0.txt"), std::string::npos) << m;
    EXPECT_NE(m.find("records are lost"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint 1"), std::string::npos) << m;
  }
  EXPECT_TRUE(objects().empty());
}

TEST_F(S3FileSinkTest, ALargePartFileGoesUpInSeveralParts) {
  std::mt19937_64 rnd(testing::test_seed());
  std::string expected;
  {
    S3SinkRun run(endpoint_, prefix_, {});
    // 12 MiB of lines with 5 MiB parts: parts 1 and 2 go up while writing, the rest at the checkpoint.
    while (expected.size() < (12u << 20)) {
      std::string line(1000, 'x');
      for (char& c : line)
        c = static_cast<char>('a' + rnd() % 26);
      expected += line + "\n";
      run.write(std::move(line));
    }
    run.snapshot(1);
    run.complete(1);
  }
  auto head = client_->head_object(kBucket, prefix_ + "/part-0-0.txt");
  ASSERT_TRUE(head.ok() && head->has_value());
  // The ETag S3 gives the completed object is the one the committer expects from the parts' ETags (the MD5s of
  // the 5 MiB slices), which is how a re-commit recognises its own object after S3 forgot the upload.
  std::vector<std::string> part_etags;
  for (size_t off = 0; off < expected.size(); off += 5u << 20) {
    const std::string_view slice = std::string_view(expected).substr(off, 5u << 20);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    ASSERT_EQ(EVP_Digest(slice.data(), slice.size(), md, &len, EVP_md5(), nullptr), 1);
    std::string hex = "\"";
    for (unsigned int i = 0; i < len; ++i)
      hex += fmt::format("{:02x}", md[i]);
    part_etags.push_back(hex + "\"");
  }
  EXPECT_EQ((*head)->etag, S3Client::multipart_etag(part_etags));
  EXPECT_TRUE((*head)->etag.ends_with("-3\"")) << (*head)->etag;
  EXPECT_TRUE(object("part-0-0.txt") == expected);
}

TEST(FileCommittableTest, AnS3CommittableRoundTripsAndAFileOneKeepsItsEncoding) {
  const FileCommittable s3{"", "s3://b/p/part-0-3.jsonl", "upload-1", {"\"e1\"", "\"e2\""}};
  DataOutput out;
  serialize(std::pair<int64_t, FileCommittable>{7, s3}, out);
  DataInput in(out.view());
  std::pair<int64_t, FileCommittable> back;
  deserialize(back, in);
  EXPECT_EQ(back.second, s3);
  EXPECT_TRUE(in.at_end());

  // A file-system committable: the two paths only, as checkpoints before S3 hold them.
  const FileCommittable local{"/d/.part-0-1.inprogress", "/d/part-0-1.txt", "", {}};
  DataOutput now, before;
  serialize(local, now);
  before.write_string(local.in_progress_path);
  before.write_string(local.final_path);
  EXPECT_EQ(std::string(now.view()), std::string(before.view()));
  DataInput old_in(before.view());
  FileCommittable old{};
  deserialize(old, old_in);
  EXPECT_EQ(old, local);
}

// A private moto, paused while `sluice run` writes to it, then resumed.
TEST_F(S3FileSinkTest, AStoreThatStopsAnsweringFailsTheJobVisiblyAndItRecoversWhenItIsBack) {
  ASSERT_FALSE(server_bin_.empty()) << "S3_SERVER_BIN is not set (scripts/services/s3 env)";
  testing::PrivateS3Server server(server_bin_);
  ASSERT_TRUE(server.start());
  const fs::path dir = chaos::make_test_dir("sluice-files-s3-failing");
  constexpr int kEntities = 100;
  constexpr int64_t kRecords = 6000;
  const fs::path pipeline = dir / "pipeline.yaml";
  std::ofstream(pipeline) << "pipeline:\n"
                          << "  name: files-s3-failing\n"
                          << "  parallelism: 1\n"
                          << "  checkpoint: { interval: 200ms, storage: \"" << (dir / "checkpoints").string()
                          << "\" }\n"
                          << "  delivery: exactly-once\n"
                          << "  restart: { strategy: fixed-delay, attempts: 1000, delay: 300ms }\n"
                          << "  health: { restart-grace: 0 }\n"
                          << "  http: { port: 0 }\n"
                          << "  config:\n"
                          << "    s3.endpoint: \"" << server.endpoint() << "\"\n"
                          << "    s3.path-style-access: true\n"
                          << "    s3.request-timeout: 1s\n"
                          << "    s3.max-attempts: 2\n"
                          << "    s3.retry.initial-backoff: 50ms\n"
                          << "source: { type: datagen, count: " << kRecords << ", rate: 400, entities: " << kEntities
                          << ", seed: 1 }\n"
                          << "transform:\n"
                          << "  - match: \"*.*.*\"\n"
                          << "    key: after.id\n"
                          << "    event:\n"
                          << "      payload: \"after.id AS id, after.revision AS revision\"\n"
                          << "sink:\n"
                          << "  out: { type: files, path: \"s3://failing/out\" }\n";
  SluiceProcess p("run", pipeline, dir);
  ASSERT_TRUE(p.start());
  ASSERT_TRUE(p.wait_running(1, 90s));
  std::smatch m;
  const std::string log = read_file(p.log());
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(health at (http://[0-9.:]+), job id ([0-9a-f]+))"))) << log;
  httplib::Client http(m[1].str());
  http.set_read_timeout(10, 0);
  const std::string job = m[2].str();
  std::string health_body;
  auto health = [&] {
    auto r = http.Get("/health");
    if (r) health_body = r->body;
    return r ? r->status : -1;
  };
  ASSERT_TRUE(poll_until([&] { return health() == 200; }, 60s)) << tail(p.log());

  server.pause();
  // The sink's next UploadPart or CompleteMultipartUpload times out (1 s, 2 attempts): the task fails, the job
  // restarts and cannot start its sink (ListMultipartUploads times out) until the store is back.
  EXPECT_TRUE(poll_until([&] { return health() == 503 && health_body.find("S3") != std::string::npos; }, 60s))
      << health_body << "\n"
      << tail(p.log());
  std::cout << "/health while the store is paused: " << health_body << "\n";
  // The checkpoint the failing sink declined is in the REST history as FAILED, with the sink's error.
  std::string failure;
  EXPECT_TRUE(poll_until(
      [&] {
        auto r = http.Get("/jobs/" + job + "/checkpoints");
        if (!r || r->status != 200) return false;
        auto v = Value::from_json(r->body);
        const Value* history = v.ok() ? v->find("history") : nullptr;
        if (history == nullptr) return false;
        for (const Value& h : history->as_array()) {
          const Value* status = h.find("status");
          const Value* msg = h.find("failure_message");
          if (status != nullptr && status->as_string() == "FAILED" && msg != nullptr && msg->is_string()) {
            failure = std::string(msg->as_string());
            return true;
          }
        }
        return false;
      },
      60s))
      << tail(p.log());
  std::cout << "failed checkpoint in the REST history: " << failure << "\n";
  EXPECT_NE(failure.find("file sink"), std::string::npos) << failure;
  auto exceptions = http.Get("/jobs/" + job + "/exceptions");
  ASSERT_TRUE(exceptions && exceptions->status == 200);
  EXPECT_NE(exceptions->body.find("file sink"), std::string::npos) << exceptions->body;
  EXPECT_NE(exceptions->body.find("Timeout"), std::string::npos) << exceptions->body;

  server.resume();
  const size_t done = count_of(read_file(p.log()), "completed checkpoint");
  EXPECT_TRUE(poll_until(
      [&] { return count_of(read_file(p.log()), "completed checkpoint") > done + 2 && health() == 200; }, 90s))
      << health_body << "\n"
      << tail(p.log());
  ASSERT_TRUE(p.wait_exit(150s)) << tail(p.log());
  ASSERT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0) << tail(p.log());

  // Every record once, in order per entity, and no upload left.
  const auto c = testing::s3_test_client(server.endpoint());
  std::map<std::string, std::vector<int64_t>> seen;
  int64_t lines = 0;
  for (const testing::S3PartObject& part : testing::list_s3_part_files(*c, "failing", "out")) {
    auto body = c->get_object("failing", part.key);
    ASSERT_TRUE(body.ok()) << body.error().to_string();
    std::istringstream in(*body);
    for (std::string line; std::getline(in, line);) {
      ++lines;
      Result<Value> v = Value::from_json(line);
      ASSERT_TRUE(v.ok()) << line;
      const Value* payload = v->find("payload");
      ASSERT_TRUE(payload != nullptr && payload->find("id") != nullptr) << line;
      seen[std::string(payload->find("id")->as_string())].push_back(payload->find("revision")->as_int64());
    }
  }
  std::map<std::string, std::vector<int64_t>> want;
  for (int64_t e = 0; e < kEntities; ++e) {
    std::vector<int64_t>& revisions = want[fmt::format("ch_{:08d}", e)];
    for (int64_t r = 0; r < kRecords / kEntities; ++r)
      revisions.push_back(r);
  }
  const chaos::SequenceTally t = chaos::compare_sequences(want, seen);
  auto left = c->list_multipart_uploads("failing", "out/");
  ASSERT_TRUE(left.ok()) << left.error().to_string();
  std::cout << "lines " << lines << " (expected " << kRecords << "): missing " << t.missing << ", duplicated "
            << t.duplicated << ", out of order " << t.out_of_order << "; multipart uploads left " << left->size()
            << "\n";
  EXPECT_EQ(lines, kRecords);
  EXPECT_TRUE(t.clean()) << t.first_problem;
  EXPECT_EQ(left->size(), 0u);
  chaos::keep_or_remove(dir, HasFailure());
}

}  // namespace
}  // namespace sluice
