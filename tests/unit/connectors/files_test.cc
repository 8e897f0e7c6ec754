// Job-level tests of the file source (text and JSON lines, globs, bad input), the file sink and the print sink.
#include "sluice/connectors/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/api/stream_environment.h"
#include "sluice/connectors/datagen.h"
#include "sluice/connectors/print.h"
#include "sluice/core/cancellation.h"
#include "sluice/core/clock.h"
#include "sluice/core/fault_points.h"
#include "sluice/core/task_lease.h"
#include "sluice/operators/sink_operator.h"
#include "sluice/state/operator_state.h"
#include "test_util/collect_sink.h"

namespace shop {

struct Charge {
  std::string id;
  int64_t amount_cents = 0;
  std::optional<std::string> note;
  friend bool operator==(const Charge&, const Charge&) = default;
  friend bool operator<(const Charge& a, const Charge& b) { return a.id < b.id; }
};
SLUICE_FIELDS(Charge, id, amount_cents, note);

}  // namespace shop

namespace sluice {
namespace {

using shop::Charge;
using testing::CollectedRecords;
using testing::CollectSink;

/// A fresh directory under /tmp, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sluice-files-test-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << content;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

template <class T>
std::vector<T> sorted(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v;
}

template <class Src, class T = typename Src::RecordType>
JobResult run_to_collect(std::shared_ptr<Src> source, int parallelism, std::shared_ptr<CollectedRecords<T>> out) {
  StreamEnvironment env;
  env.set_parallelism(parallelism);
  env.from_source(source, "files").sink_to(std::make_shared<CollectSink<T>>(out));
  return env.execute("files test");
}

std::string error_text(const JobResult& r) {
  return r.error ? r.error->to_string() : std::string("(no error)");
}

// ---------------------------------------------------------------------------------------------------------
// Text lines

TEST(FileSourceTest, TextLinesStripLineEndingsAndKeepEmptyLines) {
  TempDir dir;
  write_file(dir / "a.txt", "first\nsecond\r\n\nlast without newline");
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(FileSource<std::string>::text_lines({dir / "a.txt"}), 1, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(out->all(), (std::vector<std::string>{"first", "second", "", "last without newline"}));
}

class FileSourceParallelismTest : public ::testing::TestWithParam<int> {};

TEST_P(FileSourceParallelismTest, TextLinesOfManyFilesArriveOnceAndInFileOrder) {
  TempDir dir;
  constexpr int kFiles = 5;
  constexpr int kLines = 3000;  // more than one poll_next batch per file
  std::vector<std::string> expected;
  for (int f = 0; f < kFiles; ++f) {
    std::string content;
    for (int i = 0; i < kLines; ++i) {
      std::string line = "f" + std::to_string(f) + ":" + std::to_string(i);
      content += line + "\n";
      expected.push_back(line);
    }
    write_file(dir / ("part" + std::to_string(f) + ".txt"), content);
  }
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(files::text_lines({dir.path()}), GetParam(), out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(sorted(out->all()), sorted(expected));
  // One file is one split: its lines reach one subtask, in file order.
  std::map<int, int> subtask_of_file;
  std::map<int, int> next_line;
  const auto per_subtask = out->per_subtask();
  for (size_t s = 0; s < per_subtask.size(); ++s) {
    for (const std::string& line : per_subtask[s]) {
      const int f = std::stoi(line.substr(1, line.find(':') - 1));
      const int i = std::stoi(line.substr(line.find(':') + 1));
      auto [it, inserted] = subtask_of_file.emplace(f, static_cast<int>(s));
      ASSERT_EQ(it->second, static_cast<int>(s)) << "file " << f << " was read by two subtasks";
      ASSERT_EQ(next_line[f], i) << "file " << f << " out of order";
      next_line[f] = i + 1;
    }
  }
}

TEST_P(FileSourceParallelismTest, JsonLinesAsValuesSkipBlankLines) {
  TempDir dir;
  std::vector<std::string> expected;
  for (int f = 0; f < 4; ++f) {
    std::string content;
    for (int i = 0; i < 500; ++i) {
      const std::string doc = R"({"file":)" + std::to_string(f) + R"(,"i":)" + std::to_string(i) + "}";
      content += doc + "\n";
      if (i % 100 == 0) content += "  \r\n\n";
      expected.push_back(doc);
    }
    write_file(dir / ("events-" + std::to_string(f) + ".jsonl"), content);
  }
  auto out = std::make_shared<CollectedRecords<Value>>();
  JobResult r = run_to_collect(FileSource<Value>::json_lines({dir / "*.jsonl"}), GetParam(), out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  std::vector<std::string> got;
  for (const Value& v : out->all())
    got.push_back(v.to_json());
  EXPECT_EQ(sorted(got), sorted(expected));
}

INSTANTIATE_TEST_SUITE_P(Parallelism, FileSourceParallelismTest, ::testing::Values(1, 3));

TEST(FileSourceTest, JsonLinesIntoStructs) {
  TempDir dir;
  write_file(dir / "charges.jsonl", R"({"id":"c1","amount_cents":100})"
                                    "\n"
                                    R"({"id":"c2","amount_cents":250,"note":"gift","extra":true})"
                                    "\n");
  auto out = std::make_shared<CollectedRecords<Charge>>();
  JobResult r = run_to_collect(files::json_lines<Charge>({dir / "charges.jsonl"}), 3, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(sorted(out->all()), (std::vector<Charge>{{"c1", 100, std::nullopt}, {"c2", 250, "gift"}}));
}

// ---------------------------------------------------------------------------------------------------------
// Paths and globs

TEST(FilePathsTest, GlobsDirectoriesAndDuplicates) {
  TempDir dir;
  write_file(dir / "b.jsonl", "");
  write_file(dir / "a.jsonl", "");
  write_file(dir / "c.txt", "");
  write_file(dir / "sub/d.jsonl", "");
  Result<std::vector<std::string>> files = detail::expand_file_paths({dir / "*.jsonl", dir / "c.txt", dir / "a.jsonl"});
  ASSERT_TRUE(files.ok()) << files.error().to_string();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "a.jsonl", dir / "b.jsonl", dir / "c.txt"}));
  // A directory: its regular files, sorted, without entering subdirectories.
  files = detail::expand_file_paths({dir.path()});
  ASSERT_TRUE(files.ok()) << files.error().to_string();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "a.jsonl", dir / "b.jsonl", dir / "c.txt"}));
  // A glob matching a directory expands it.
  files = detail::expand_file_paths({dir / "s*"});
  ASSERT_TRUE(files.ok()) << files.error().to_string();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "sub/d.jsonl"}));
}

TEST(FilePathsTest, EmptyMatchesAreErrorsNamingThePattern) {
  TempDir dir;
  std::filesystem::create_directories(dir / "empty");
  Result<std::vector<std::string>> files = detail::expand_file_paths({dir / "*.csv"});
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.error().code(), ErrorCode::kConnector);
  EXPECT_NE(files.error().message().find(dir / "*.csv"), std::string::npos) << files.error().message();
  files = detail::expand_file_paths({dir / "empty"});
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.error().message().find(dir / "empty"), std::string::npos) << files.error().message();
  files = detail::expand_file_paths({dir / "missing.txt"});
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.error().message().find("No such file"), std::string::npos) << files.error().message();
  EXPECT_EQ(detail::expand_file_paths({}).error().code(), ErrorCode::kConfiguration);
}

TEST(FileSourceTest, AGlobWithoutMatchesFailsTheJobAtStart) {
  TempDir dir;
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(files::text_lines({dir / "nothing-*.log"}), 2, out);
  ASSERT_EQ(r.status, JobStatus::kFailed);
  EXPECT_EQ(r.error->code(), ErrorCode::kConnector);
  EXPECT_NE(r.error->message().find(dir / "nothing-*.log"), std::string::npos) << error_text(r);
}

// ---------------------------------------------------------------------------------------------------------
// Bad input

TEST(FileSourceTest, ABadJsonLineFailsTheJobNamingFileLineAndOffset) {
  TempDir dir;
  const std::string good = R"({"id":"c1","amount_cents":1})";
  const std::string bad = R"({"id":"c2","amount_cents": oops})";
  write_file(dir / "in.jsonl", good + "\n" + good + "\n" + bad + "\n" + good + "\n");
  auto out = std::make_shared<CollectedRecords<Value>>();
  JobResult r = run_to_collect(files::json_lines({dir / "in.jsonl"}), 1, out);
  ASSERT_EQ(r.status, JobStatus::kFailed);
  const std::string msg = error_text(r);
  EXPECT_NE(msg.find("'" + (dir / "in.jsonl") + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset " + std::to_string(2 * (good.size() + 1))), std::string::npos) << msg;
  EXPECT_NE(msg.find(R"(oops)"), std::string::npos) << msg;  // the excerpt
  EXPECT_NE(msg.find("connector"), std::string::npos) << msg;
  // A restart would read the same line again: the failure suppresses restarts instead of looping.
  EXPECT_NE(msg.find("not recoverable by a restart: a restart reads the same line again"), std::string::npos) << msg;
}

TEST(FileSourceTest, AMappingErrorFailsTheJobNamingTheField) {
  TempDir dir;
  write_file(dir / "in.jsonl", R"({"id":"c1","amount_cents":"12"})"
                               "\n");
  auto out = std::make_shared<CollectedRecords<Charge>>();
  JobResult r = run_to_collect(files::json_lines<Charge>({dir / "in.jsonl"}), 1, out);
  ASSERT_EQ(r.status, JobStatus::kFailed);
  const std::string msg = error_text(r);
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("field 'amount_cents': expected integer, found string"), std::string::npos) << msg;
}

TEST(FileSourceTest, DeadLetterPolicyDivertsBadLinesWithPositionAndReason) {
  TempDir dir;
  const std::string l1 = R"({"id":"c1","amount_cents":1})";
  const std::string l2 = R"({"id":"c2", broken)";
  const std::string l3 = R"({"id":"c3","amount_cents":"x"})";
  const std::string l4 = "\xff\xfe not utf8";
  const std::string l5 = R"({"id":"c5","amount_cents":5})";
  write_file(dir / "in.jsonl", l1 + "\n" + l2 + "\r\n" + l3 + "\n" + l4 + "\n" + l5);
  const std::string dlq = dir / "dlq/bad.jsonl";
  auto source = files::json_lines<Charge>({dir / "in.jsonl"});
  source->on_bad_record(BadRecordPolicy::kDeadLetter, dlq);
  auto out = std::make_shared<CollectedRecords<Charge>>();
  JobResult r = run_to_collect(source, 1, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(out->all(), (std::vector<Charge>{{"c1", 1, std::nullopt}, {"c5", 5, std::nullopt}}));
  EXPECT_EQ(source->stats()->bad_records.load(), 3);

  const std::vector<std::string> entries = split_lines(read_file(dlq));
  ASSERT_EQ(entries.size(), 3U);
  struct Expected {
    int64_t line;
    int64_t offset;
    std::string record;
    std::string reason_part;
  };
  const int64_t o2 = static_cast<int64_t>(l1.size() + 1);
  const int64_t o3 = o2 + static_cast<int64_t>(l2.size() + 2);
  const int64_t o4 = o3 + static_cast<int64_t>(l3.size() + 1);
  const std::vector<Expected> expected = {{2, o2, l2, "byte"},
                                          {3, o3, l3, "field 'amount_cents': expected integer"},
                                          {4, o4, "\xEF\xBF\xBD\xEF\xBF\xBD not utf8", "UTF-8"}};
  for (size_t i = 0; i < entries.size(); ++i) {
    Result<Value> e = Value::from_json(entries[i]);
    ASSERT_TRUE(e.ok()) << entries[i];
    EXPECT_EQ(e->find("source")->as_string(), "file");
    EXPECT_EQ(e->find("path")->as_string(), dir / "in.jsonl");
    EXPECT_EQ(e->find("line")->as_int64(), expected[i].line) << entries[i];
    EXPECT_EQ(e->find("offset")->as_int64(), expected[i].offset) << entries[i];
    EXPECT_EQ(e->find("record")->as_string(), expected[i].record) << entries[i];
    EXPECT_NE(e->find("error")->as_string().find(expected[i].reason_part), std::string::npos) << entries[i];
  }
  // The exact bytes of the line that is not UTF-8 are kept too.
  Result<Value> e4 = Value::from_json(entries[2]);
  ASSERT_NE(e4->find("record_base64"), nullptr);
  EXPECT_EQ(e4->find("record_base64")->as_string(), "//4gbm90IHV0Zjg=");
}

TEST(FileSourceTest, OverLongLinesAreBadRecordsAndReadingGoesOn) {
  TempDir dir;
  const std::string long_line(100, 'x');
  write_file(dir / "in.txt", "short\n" + long_line + "\r\nafter\n" + long_line);
  const std::string dlq = dir / "dlq.jsonl";
  auto source = files::text_lines({dir / "in.txt"});
  source->max_line_bytes(10).on_bad_record(BadRecordPolicy::kDeadLetter, dlq);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(source, 1, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(out->all(), (std::vector<std::string>{"short", "after"}));
  const std::vector<std::string> entries = split_lines(read_file(dlq));
  ASSERT_EQ(entries.size(), 2U);
  Result<Value> first = Value::from_json(entries[0]);
  Result<Value> second = Value::from_json(entries[1]);
  EXPECT_EQ(first->find("line")->as_int64(), 2);
  EXPECT_EQ(first->find("offset")->as_int64(), 6);
  EXPECT_NE(first->find("error")->as_string().find("longer than max_line_bytes"), std::string::npos);
  EXPECT_EQ(second->find("line")->as_int64(), 4);
  EXPECT_EQ(second->find("offset")->as_int64(), 6 + 102 + 6);
}

TEST(FileSourceTest, LinesAcrossChunkBoundariesAndLongerThanAChunk) {
  TempDir dir;
  // Lines of varying length cross many 64 KiB chunk boundaries; one line needs a grown buffer, two exceed
  // the limit (one ends in the middle of the file, the other is the file's unterminated last line).
  constexpr size_t kMax = 100'000;
  std::string content;
  std::vector<std::string> expected;
  std::vector<int64_t> bad_offsets;
  std::vector<int64_t> bad_lines;
  int64_t line_no = 0;
  auto add = [&](const std::string& line, bool bad, const char* ending) {
    ++line_no;
    if (bad) {
      bad_offsets.push_back(static_cast<int64_t>(content.size()));
      bad_lines.push_back(line_no);
    } else {
      expected.push_back(line);
    }
    content += line + ending;
  };
  for (int i = 0; i < 40'000; ++i) {
    add(std::string(static_cast<size_t>(i % 13), 'a') + std::to_string(i), false, i % 5 == 0 ? "\r\n" : "\n");
    if (i == 1000) add(std::string(90'000, 'g'), false, "\n");   // longer than a chunk, within the limit
    if (i == 20000) add(std::string(250'000, 'h'), true, "\n");  // too long, spans several chunks
    if (i == 30000) add(std::string(kMax, 'k'), false, "\r\n");  // exactly the limit, plus "\r\n"
  }
  add(std::string(kMax + 1, 'z'), true, "");
  write_file(dir / "in.txt", content);
  const std::string dlq = dir / "dlq.jsonl";
  auto source = files::text_lines({dir / "in.txt"});
  source->max_line_bytes(static_cast<int64_t>(kMax)).on_bad_record(BadRecordPolicy::kDeadLetter, dlq);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(source, 1, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_TRUE(out->all() == expected) << "records differ";
  const std::vector<std::string> entries = split_lines(read_file(dlq));
  ASSERT_EQ(entries.size(), 2U);
  for (size_t i = 0; i < 2; ++i) {
    Result<Value> e = Value::from_json(entries[i]);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->find("line")->as_int64(), bad_lines[i]);
    EXPECT_EQ(e->find("offset")->as_int64(), bad_offsets[i]);
    EXPECT_EQ(e->find("record")->as_string().size(), detail::LineReader::kLongLineHeadBytes);
  }
}

TEST(FileSourceTest, DeadLetterPolicyWithoutAPathFailsAtStart) {
  TempDir dir;
  write_file(dir / "in.txt", "a\n");
  auto source = files::text_lines({dir / "in.txt"});
  source->on_bad_record(BadRecordPolicy::kDeadLetter);
  auto out = std::make_shared<CollectedRecords<std::string>>();
  JobResult r = run_to_collect(source, 1, out);
  ASSERT_EQ(r.status, JobStatus::kFailed);
  EXPECT_EQ(r.error->code(), ErrorCode::kConfiguration) << error_text(r);
}

// ---------------------------------------------------------------------------------------------------------
// Reader positions (what a checkpoint records)

class FakeReaderContext final : public SourceReaderContext {
 public:
  int subtask_index() const override { return 0; }
  int parallelism() const override { return 1; }
  void send_split_request() override { ++split_requests; }
  void wakeup() override {}
  void wakeup_at(TimestampMs) override {}
  const Clock& clock() const override { return clock_; }
  int split_requests = 0;

 private:
  ManualClock clock_;
};

class VectorOutput final : public ReaderOutput<std::string> {
 public:
  using ReaderOutput<std::string>::collect;
  void collect(std::string&& r) override { records.push_back(std::move(r)); }
  void collect(std::string&& r, TimestampMs) override { records.push_back(std::move(r)); }
  void emit_watermark(TimestampMs) override {}
  std::vector<std::string> records;
};

TEST(FileSourceReaderTest, SnapshotsRecordExactPositionsAndResumeFromThem) {
  TempDir dir;
  std::string content;
  std::vector<std::string> lines;
  for (int i = 0; i < 2500; ++i) {
    lines.push_back(std::string(static_cast<size_t>(i % 7), 'a') + std::to_string(i));
    content += lines.back() + (i % 2 == 0 ? "\n" : "\r\n");
  }
  write_file(dir / "in.txt", content);
  auto source = files::text_lines({dir / "in.txt"});
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->start();
  EXPECT_EQ(ctx.split_requests, 1);
  reader->add_splits({FileSplit{dir / "in.txt", 0, 1}});
  VectorOutput out;
  ASSERT_EQ(reader->poll_next(out), InputStatus::kMoreAvailable);
  ASSERT_EQ(out.records.size(), 1024U);  // one batch
  std::vector<FileSplit> snapshot = reader->snapshot_state(1);
  ASSERT_EQ(snapshot.size(), 1U);
  int64_t offset = 0;
  for (size_t i = 0; i < 1024; ++i)
    offset += static_cast<int64_t>(lines[i].size() + (i % 2 == 0 ? 1 : 2));
  EXPECT_EQ(snapshot[0], (FileSplit{dir / "in.txt", offset, 1025}));
  reader->close();

  // A new reader restored from the snapshot continues with line 1025.
  auto restored = source->create_reader(ctx);
  restored->start();
  restored->add_splits(snapshot);
  restored->notify_no_more_splits();
  VectorOutput rest;
  while (restored->poll_next(rest) == InputStatus::kMoreAvailable) {
  }
  EXPECT_EQ(rest.records, std::vector<std::string>(lines.begin() + 1024, lines.end()));
  EXPECT_EQ(restored->poll_next(rest), InputStatus::kEndOfInput);
  restored->close();
}

TEST(FileSourceReaderTest, AFileShorterThanTheCheckpointedOffsetIsAnError) {
  TempDir dir;
  write_file(dir / "in.txt", "abc\n");
  auto source = files::text_lines({dir / "in.txt"});
  FakeReaderContext ctx;
  auto reader = source->create_reader(ctx);
  reader->add_splits({FileSplit{dir / "in.txt", 100, 7}});
  VectorOutput out;
  try {
    reader->poll_next(out);
    FAIL() << "expected an exception";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kConnector);
    EXPECT_NE(e.error().message().find("truncated"), std::string::npos) << e.what();
  }
}

TEST(FileSplitTest, SerializerRoundTrips) {
  DataOutput o;
  serialize(FileSplit{"/a/b.txt", 1234, 56}, o);
  DataInput in(o.bytes());
  FileSplit back;
  deserialize(back, in);
  EXPECT_EQ(back, (FileSplit{"/a/b.txt", 1234, 56}));
}

// ---------------------------------------------------------------------------------------------------------
// File sink

TEST(FileSinkTest, TextPartFilesHoldEveryRecordOnce) {
  TempDir dir;
  const std::string out_dir = dir / "out/nested";
  StreamEnvironment env;
  env.set_parallelism(3);
  env.from_source(datagen::sequence(0, 9999), "numbers").sink_to(FileSink<int64_t>::text(out_dir));
  JobResult r = env.execute("file sink");
  ASSERT_TRUE(r.ok()) << error_text(r);
  std::vector<std::string> got;
  for (int s = 0; s < 3; ++s) {
    const std::string part = out_dir + "/part-" + std::to_string(s) + ".txt";
    ASSERT_TRUE(std::filesystem::exists(part)) << part;
    for (std::string& l : split_lines(read_file(part)))
      got.push_back(std::move(l));
  }
  std::vector<std::string> expected;
  for (int i = 0; i <= 9999; ++i)
    expected.push_back(std::to_string(i));
  EXPECT_EQ(sorted(got), sorted(expected));
}

TEST(FileSinkTest, JsonLinesPartFilesReadBackThroughTheFileSource) {
  TempDir dir;
  std::vector<Charge> charges;
  for (int i = 0; i < 3000; ++i) {
    charges.push_back(Charge{"c" + std::to_string(i), i * 10,
                             i % 3 == 0 ? std::optional<std::string>("n\"" + std::to_string(i)) : std::nullopt});
  }
  {
    StreamEnvironment env;
    env.set_parallelism(2);
    env.from_source(datagen::from_collection(charges), "charges").sink_to(FileSink<Charge>::json_lines(dir / "out"));
    JobResult r = env.execute("write");
    ASSERT_TRUE(r.ok()) << error_text(r);
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "out/part-0.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/part-1.jsonl"));
  auto out = std::make_shared<CollectedRecords<Charge>>();
  JobResult r = run_to_collect(files::json_lines<Charge>({dir / "out"}), 3, out);
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(sorted(out->all()), sorted(charges));
}

TEST(FileSinkTest, AnUnwritableDirectoryFailsTheJobNamingThePath) {
  TempDir dir;
  write_file(dir / "blocker", "a file, not a directory");
  StreamEnvironment env;
  env.from_source(datagen::sequence(0, 10), "numbers").sink_to(FileSink<int64_t>::text(dir / "blocker/out"));
  JobResult r = env.execute("file sink");
  ASSERT_EQ(r.status, JobStatus::kFailed);
  EXPECT_NE(error_text(r).find(dir / "blocker/out"), std::string::npos) << error_text(r);
}

// ---------------------------------------------------------------------------------------------------------
// File sink with checkpointing: exactly-once by rename on commit. The operator is driven by hand (open,
// records, snapshot_state, notify_checkpoint_complete, restore from the operator state's snapshot bytes).

class SinkTestContext final : public RuntimeContext {
 public:
  SinkTestContext(int subtask, int parallelism, int attempt, bool checkpointing)
      : subtask_(subtask), parallelism_(parallelism), attempt_(attempt), checkpointing_(checkpointing) {}
  const std::string& operator_name() const override { return name_; }
  int subtask_index() const override { return subtask_; }
  int parallelism() const override { return parallelism_; }
  int max_parallelism() const override { return 128; }
  int attempt_number() const override { return attempt_; }
  const Clock& clock() const override { return clock_; }
  OperatorStateStore& operator_state() override { return store_; }
  bool is_checkpointing_enabled() const override { return checkpointing_; }
  ManualClock& manual_clock() { return clock_; }

 private:
  std::string name_ = "Sink: files";
  int subtask_, parallelism_, attempt_;
  bool checkpointing_;
  ManualClock clock_;
  OperatorStateStore store_;
};

/// One run of one subtask of a text FileSink's operator.
class FileSinkRun {
 public:
  /// Rolls the part file at every checkpoint (snapshot() advances the clock past the rollover interval), so a
  /// test sees one file per checkpoint, unless `policy` is set.
  static constexpr RollingPolicy kRollEveryCheckpoint{int64_t{1} << 40, 1, int64_t{1} << 40};

  struct Options {
    int subtask = 0;
    int parallelism = 1;
    int attempt = 0;
    bool checkpointing = true;
    std::string restored_state;           // the subtask's (redistributed) operator state snapshot; empty: fresh start
    std::optional<RollingPolicy> policy;  // default: kRollEveryCheckpoint
  };
  FileSinkRun(const std::string& directory, Options o)
      : ctx_(o.subtask, o.parallelism, o.attempt, o.checkpointing),
        roll_every_checkpoint_(!o.policy),
        op_(make_sink(directory, o.policy.value_or(kRollEveryCheckpoint))) {
    if (!o.restored_state.empty()) {
      DataInput in(o.restored_state);
      Status st = ctx_.operator_state().restore(in);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
    }
    op_.setup(&ctx_, nullptr, {});
    op_.open();
  }
  ~FileSinkRun() { op_.close(); }
  TwoPhaseCommitSinkOperator<std::string, FileCommittable>& op() { return op_; }
  ManualClock& clock() { return ctx_.manual_clock(); }
  void write(std::string r) { op_.process_element(std::move(r), kNoTimestamp); }
  std::string snapshot(int64_t id) {
    if (roll_every_checkpoint_) clock().advance(1);
    op_.snapshot_state(id);
    DataOutput out;
    ctx_.operator_state().snapshot(out);
    return std::string(out.view());
  }
  void complete(int64_t id) { op_.notify_checkpoint_complete(id); }

 private:
  static std::shared_ptr<FileSink<std::string>> make_sink(const std::string& directory, RollingPolicy policy) {
    auto sink = FileSink<std::string>::text(directory);
    sink->rolling_policy(policy);
    return sink;
  }

  SinkTestContext ctx_;
  bool roll_every_checkpoint_;
  TwoPhaseCommitSinkOperator<std::string, FileCommittable> op_;
};

/// The names in `dir` that start with '.' (in_progress) or not (committed), sorted.
std::vector<std::string> names_in(const std::string& dir, bool in_progress) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.starts_with('.') == in_progress) names.push_back(std::move(n));
  }
  return sorted(names);
}

TEST(FileSinkExactlyOnceTest, PartFilesBecomeVisibleOnlyWhenTheirCheckpointCompletes) {
  TempDir dir;
  const std::string out = dir / "out";
  FileSinkRun run(out, {});
  run.write("a");
  run.write("b");
  EXPECT_TRUE(names_in(out, false).empty());
  std::vector<std::string> in_progress = names_in(out, true);
  ASSERT_EQ(in_progress.size(), 1U);
  EXPECT_TRUE(in_progress[0].starts_with(".part-0-0.inprogress")) << in_progress[0];
  run.snapshot(1);
  EXPECT_TRUE(names_in(out, false).empty());
  EXPECT_EQ(read_file(out + "/" + in_progress[0]), "a\nb\n");  // synced by the pre-commit
  run.write("c");
  run.snapshot(2);
  EXPECT_EQ(names_in(out, true).size(), 2U);
  run.complete(1);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-0.txt"), "a\nb\n");
  run.snapshot(3);  // nothing written since checkpoint 2: no file
  run.complete(3);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-1.txt"), "c\n");
  EXPECT_TRUE(names_in(out, true).empty());
  // A FileSource reading the directory sees committed files only.
  run.write("d");
  Result<std::vector<std::string>> listed = detail::expand_file_paths({out});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed.value(), (std::vector<std::string>{out + "/part-0-0.txt", out + "/part-0-1.txt"}));
}

TEST(FileSinkExactlyOnceTest, ARestoreCommitsPreCommittedFilesAndDeletesLingeringOnes) {
  TempDir dir;
  const std::string out = dir / "out";
  std::string chk2;
  {
    FileSinkRun run(out, {.parallelism = 2});
    run.write("a");
    run.snapshot(1);
    run.complete(1);
    run.write("b");
    chk2 = run.snapshot(2);  // checkpoint 2 completes, but the task fails before its notification
    run.write("c");
    run.snapshot(3);  // pre-committed by a checkpoint that never completes
  }
  // What a crashed process leaves: the unfinished in-progress files of this subtask after the restored
  // checkpoint (.part-0-2 above and one more), and one of subtask 1 (not this subtask's to delete).
  write_file(out + "/.part-0-3.inprogress", "x\n");
  write_file(out + "/.part-1-0.inprogress.0123abcd", "y\n");
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));

  FileSinkRun run(out, {.parallelism = 2, .attempt = 1, .restored_state = chk2});
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-1.txt"), "b\n");
  EXPECT_EQ(names_in(out, true), (std::vector<std::string>{".part-1-0.inprogress.0123abcd"}));
  // Numbers of deleted (never committed) files may be used again; committed ones never are.
  run.write("d");
  run.snapshot(3);
  run.complete(3);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt", "part-0-2.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-2.txt"), "d\n");
}

TEST(FileSinkExactlyOnceTest, CommittingAgainAfterARestoreChangesNothing) {
  TempDir dir;
  const std::string out = dir / "out";
  std::string chk1;
  {
    FileSinkRun run(out, {});
    run.write("a");
    chk1 = run.snapshot(1);
    run.complete(1);
  }
  {
    FileSinkRun run(out, {.attempt = 1, .restored_state = chk1});
    EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
    EXPECT_EQ(read_file(out + "/part-0-0.txt"), "a\n");
  }
  FileSinkRun run(out, {.attempt = 2, .restored_state = chk1});
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_TRUE(names_in(out, true).empty());
}

TEST(FileSinkExactlyOnceTest, AFileMissingAtCommitFailsTheJobNamingItAndItsCheckpoint) {
  TempDir dir;
  const std::string out = dir / "out";
  std::string chk2;
  {
    FileSinkRun run(out, {});
    run.write("a");
    run.snapshot(1);
    run.complete(1);
    run.write("b");
    chk2 = run.snapshot(2);  // checkpoint 2 completes; the process dies before its commit
  }
  const std::vector<std::string> pending = names_in(out, true);
  ASSERT_EQ(pending.size(), 1U);
  // The pre-committed file is lost (deleted, or lost by the file system): its records would be gone.
  std::filesystem::remove(out + "/" + pending[0]);
  try {
    FileSinkRun run(out, {.attempt = 1, .restored_state = chk2});
    FAIL() << "the restore committed a lost file without an error";
  } catch (const OperatorException& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kConnector) << what;
    EXPECT_NE(what.find("checkpoint 2"), std::string::npos) << what;
    EXPECT_NE(what.find(pending[0]), std::string::npos) << what;
    EXPECT_NE(what.find("part-0-1.txt"), std::string::npos) << what;
    EXPECT_NE(what.find("lost"), std::string::npos) << what;
  }
}

TEST(FileSinkExactlyOnceTest, NamesNeverRepeatAfterARestore) {
  TempDir dir;
  const std::string out = dir / "out";
  std::string chk1, chk2;
  {
    FileSinkRun run(out, {});
    run.write("a");
    chk1 = run.snapshot(1);
    run.complete(1);
    chk2 = run.snapshot(2);  // nothing pending; the next sequence number (1) is in the state
    run.write("b");
    run.snapshot(3);
    run.complete(3);
  }
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  {
    // Restoring an older checkpoint: part-0-1 exists, so the next file is part-0-2.
    FileSinkRun run(out, {.attempt = 1, .restored_state = chk1});
    run.write("c");
    run.snapshot(4);
    run.complete(4);
    EXPECT_EQ(read_file(out + "/part-0-1.txt"), "b\n");
    EXPECT_EQ(read_file(out + "/part-0-2.txt"), "c\n");
  }
  // Every committed file was moved away by a reader: the sequence number comes from the state.
  for (const std::string& n : names_in(out, false))
    std::filesystem::remove(out + "/" + n);
  FileSinkRun run(out, {.attempt = 2, .restored_state = chk2});
  run.write("d");
  run.snapshot(5);
  run.complete(5);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-1.txt"}));
}

TEST(FileSinkExactlyOnceTest, ALowerParallelismCommitsTheFilesOfEveryOldSubtask) {
  TempDir dir;
  const std::string out = dir / "out";
  std::vector<std::string> old;
  for (int s = 0; s < 3; ++s) {
    FileSinkRun run(out, {.subtask = s, .parallelism = 3});
    run.write("r" + std::to_string(s));
    old.push_back(run.snapshot(1));  // checkpoint 1 completes; the job fails before the notification
  }
  write_file(out + "/.part-2-1.inprogress", "lingering\n");  // old subtask 2's file after checkpoint 1
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string_view> views(old.begin(), old.end());
    DataOutput state;
    ASSERT_TRUE(OperatorStateStore::redistribute(views, 2, s, state).ok());
    FileSinkRun run(out, {.subtask = s, .parallelism = 2, .attempt = 1, .restored_state = std::string(state.view())});
  }
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-1-0.txt", "part-2-0.txt"}));
  EXPECT_EQ(read_file(out + "/part-2-0.txt"), "r2\n");
  EXPECT_TRUE(names_in(out, true).empty());  // subtask 0 owns old subtask 2's leftovers (2 % 2 == 0)
}

TEST(FileSinkExactlyOnceTest, WithCheckpointingTheFinalCheckpointCommitsTheRest) {
  TempDir dir;
  const std::string out = dir / "out";
  FileSinkRun run(out, {});
  run.write("a");
  run.op().end_input();
  run.op().finish();
  EXPECT_TRUE(names_in(out, false).empty());
  run.snapshot(1);
  run.complete(1);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
}

TEST(FileSinkExactlyOnceTest, AFailedRunDeletesItsUnfinishedInProgressFileOnClose) {
  TempDir dir;
  const std::string out = dir / "out";
  {
    FileSinkRun run(out, {});
    run.write("a");
    run.snapshot(1);
    run.write("b");  // never pre-committed
  }                  // close() without finish(): the task failed
  // The pre-committed file stays for the restore to commit; the unfinished one is gone.
  const std::vector<std::string> left = names_in(out, true);
  ASSERT_EQ(left.size(), 1U);
  EXPECT_TRUE(left[0].starts_with(".part-0-0.inprogress")) << left[0];
}

// A TaskManager woken from SIGSTOP after its lease lapsed (core/task_lease.h): its sink task may run before the
// TaskManager's connection thread cancels it, and must write nothing more, neither a full buffer nor on close.
TEST(FileSinkTest, AStaleTaskWritesNothingMoreNeitherAFullBufferNorOnClose) {
  TempDir dir;
  const std::string out = dir / "out";
  ManualClock lease_clock(0);
  TaskLease lease(lease_clock);
  lease.extend_until(3'000);
  set_current_task_lease(&lease);
  const std::string line(99, 'x');  // 100 bytes with the newline
  uintmax_t before = 0;
  {
    FileSinkRun run(out, {.checkpointing = false});
    for (int i = 0; i < 1'000; ++i)  // 100 KB: one 64 KiB buffer written
      run.write(line);
    before = std::filesystem::file_size(out + "/part-0.txt");
    EXPECT_GE(before, detail::PartFileWriter::kBufferBytes) << "a full buffer is written while the lease holds";
    lease_clock.set(3'000);
    bool stopped = false;
    for (int i = 0; i < 1'000 && !stopped; ++i) {
      try {
        run.write(line);
      } catch (const TaskCancelledException&) {
        stopped = true;
      }
    }
    EXPECT_TRUE(stopped) << "the sink did not stop the stale task at its next write";
    EXPECT_EQ(std::filesystem::file_size(out + "/part-0.txt"), before);
  }  // close(): the buffered lines are dropped, not written
  set_current_task_lease(nullptr);
  EXPECT_EQ(std::filesystem::file_size(out + "/part-0.txt"), before);
  EXPECT_EQ(read_file(out + "/part-0.txt").size() % 100, 0U) << "only whole lines, written before the lease lapsed";
}

TEST(FileSinkExactlyOnceTest, WithoutCheckpointingASubtaskWritesOnePartFileCommittedAtTheEnd) {
  TempDir dir;
  const std::string out = dir / "out";
  FileSinkRun run(out, {.subtask = 1, .parallelism = 2, .checkpointing = false});
  run.write("a");
  run.write("b");
  run.op().end_input();
  run.op().finish();
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-1.txt"}));
  EXPECT_EQ(read_file(out + "/part-1.txt"), "a\nb\n");
  EXPECT_TRUE(names_in(out, true).empty());
}

/// Every line of the committed files in `dir` (names not starting with '.').
std::vector<std::string> committed_lines(const std::string& dir) {
  std::vector<std::string> lines;
  for (const std::string& n : names_in(dir, false)) {
    for (std::string& l : split_lines(read_file(dir + "/" + n)))
      lines.push_back(std::move(l));
  }
  return sorted(lines);
}

TEST(FileSinkExactlyOnceTest, AJobWithCheckpointingCommitsEveryRecordOnce) {
  TempDir dir;
  const std::string out = dir / "out";
  StreamEnvironment env;
  env.set_parallelism(3);
  env.config().set_string("execution.checkpointing.interval", "10ms");
  env.config().set_string("execution.checkpointing.dir", dir / "checkpoints");
  auto sink = FileSink<int64_t>::text(out);
  sink->rolling_policy({.part_size_bytes = 4096, .rollover_interval_ms = 60'000, .inactivity_interval_ms = 60'000});
  env.from_source(datagen::sequence(0, 9999, /*rate=*/200'000), "numbers").sink_to(sink);
  JobResult r = env.execute("file sink exactly-once");
  ASSERT_TRUE(r.ok()) << error_text(r);
  std::vector<std::string> expected;
  for (int i = 0; i <= 9999; ++i)
    expected.push_back(std::to_string(i));
  EXPECT_EQ(committed_lines(out), sorted(expected));
  EXPECT_TRUE(names_in(out, true).empty());
  for (const std::string& n : names_in(out, false)) {
    auto parsed = detail::parse_part_file_name(n);
    EXPECT_TRUE(parsed.has_value() && !parsed->in_progress && n.ends_with(".txt")) << n;
  }
}

TEST(FileSinkExactlyOnceTest, AFailureBetweenPreCommitAndCommitNeitherLosesNorRepeatsARecord) {
  TempDir dir;
  const std::string out = dir / "out";
  StreamEnvironment env;
  env.set_parallelism(2);
  env.config().set_string("execution.checkpointing.interval", "10ms");
  env.config().set_string("execution.checkpointing.dir", dir / "checkpoints");
  env.config().set_string("restart-strategy.type", "fixed-delay");
  env.config().set_string("restart-strategy.fixed-delay.attempts", "3");
  env.config().set_string("restart-strategy.fixed-delay.delay", "0ms");
  auto sink = FileSink<int64_t>::text(out);
  sink->rolling_policy({.part_size_bytes = 4096, .rollover_interval_ms = 60'000, .inactivity_interval_ms = 60'000});
  env.from_source(datagen::sequence(0, 9999, /*rate=*/100'000), "numbers").sink_to(sink).name("files");
  fault::arm("sink.after-precommit:files", /*skip_hits=*/1);
  JobResult r = env.execute("file sink exactly-once with a failure");
  const int64_t fired = fault::fired("sink.after-precommit:files");
  fault::disarm_all();
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(fired, 1);
  std::vector<std::string> expected;
  for (int i = 0; i <= 9999; ++i)
    expected.push_back(std::to_string(i));
  EXPECT_EQ(committed_lines(out), sorted(expected));
  EXPECT_TRUE(names_in(out, true).empty());
}

TEST(FileSinkExactlyOnceTest, PartFileNamesParse) {
  auto parsed = detail::parse_part_file_name(".part-3-17.inprogress.00ff");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_TRUE(parsed->in_progress);
  EXPECT_EQ(parsed->subtask, 3);
  EXPECT_EQ(parsed->sequence, 17);
  parsed = detail::parse_part_file_name("part-0-5.jsonl");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_FALSE(parsed->in_progress);
  EXPECT_EQ(parsed->sequence, 5);
  for (const char* bad : {"part-0.txt", ".part-0-1.inprogress.", ".part-0-1.txt", "part-0-1", "part--1-2.txt",
                          "part-a-1.txt", "xpart-0-1.txt", ""}) {
    EXPECT_FALSE(detail::parse_part_file_name(bad).has_value()) << bad;
  }
  EXPECT_EQ(detail::part_file_path("/d", 2, 9, "txt"), "/d/part-2-9.txt");
  EXPECT_EQ(detail::in_progress_file_path("/d", 2, 9, "ab"), "/d/.part-2-9.inprogress.ab");
  EXPECT_EQ(detail::in_progress_file_path("/d", 2, 9), "/d/.part-2-9.inprogress");
  parsed = detail::parse_part_file_name(".part-2-9.inprogress");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_TRUE(parsed->in_progress);
  EXPECT_EQ(parsed->sequence, 9);
}

// ---------------------------------------------------------------------------------------------------------
// Rolling policy: part files roll by size and time, independent of checkpoints.

constexpr int64_t kNever = int64_t{1} << 40;

TEST(FileSinkRollingPolicyTest, AnInProgressFileGoesOnAcrossCheckpointsAndRollsBySize) {
  TempDir dir;
  const std::string out = dir / "out";
  FileSinkRun run(out, {.policy = RollingPolicy{10, kNever, kNever}});
  run.write("aaaa");  // 5 bytes
  run.snapshot(1);
  run.complete(1);
  EXPECT_TRUE(names_in(out, false).empty());  // still in progress: a checkpoint does not finish it
  EXPECT_EQ(names_in(out, true), (std::vector<std::string>{".part-0-0.inprogress"}));
  EXPECT_EQ(read_file(out + "/.part-0-0.inprogress"), "aaaa\n");  // synced by the checkpoint
  run.write("bbbb");                                              // 10 bytes: finished
  run.write("c");                                                 // the next part file
  EXPECT_TRUE(names_in(out, false).empty());                      // finished, committed only by the next checkpoint
  run.snapshot(2);
  run.complete(2);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-0.txt"), "aaaa\nbbbb\n");
  EXPECT_EQ(names_in(out, true), (std::vector<std::string>{".part-0-1.inprogress"}));
  // The end of the input finishes the in-progress file; the final checkpoint commits it.
  run.op().end_input();
  run.op().finish();
  run.snapshot(3);
  run.complete(3);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-1.txt"), "c\n");
  EXPECT_TRUE(names_in(out, true).empty());
}

TEST(FileSinkRollingPolicyTest, RollsByRolloverAndInactivityIntervals) {
  TempDir dir;
  const std::string out = dir / "out";
  FileSinkRun run(out, {.policy = RollingPolicy{kNever, 1000, 300}});
  run.write("a");
  run.snapshot(1);
  run.clock().advance(299);
  run.snapshot(2);  // inactive for 299 ms: goes on
  run.complete(2);
  EXPECT_TRUE(names_in(out, false).empty());
  run.clock().advance(1);
  run.snapshot(3);  // inactive for 300 ms: finished
  run.complete(3);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
  // Written to every 400 ms, a file is never inactive; it rolls once it is 1000 ms old.
  int64_t id = 4;
  for (const char* r : {"b", "c", "d"}) {
    run.write(r);
    run.snapshot(id);
    run.complete(id++);
    EXPECT_EQ(names_in(out, false).size(), 1U) << r;
    run.clock().advance(400);
  }
  run.write("e");  // 1200 ms after "b" opened the file
  run.snapshot(id);
  run.complete(id);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-0-1.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-1.txt"), "b\nc\nd\ne\n");
}

TEST(FileSinkRollingPolicyTest, ARestoreTruncatesTheInProgressFileToItsCheckpointedLengthAndWritesOn) {
  TempDir dir;
  const std::string out = dir / "out";
  const RollingPolicy policy{kNever, kNever, kNever};
  std::string chk1;
  {
    FileSinkRun run(out, {.policy = policy});
    run.write("a");
    run.write("b");
    chk1 = run.snapshot(1);  // records the in-progress file at 4 bytes
    run.complete(1);
    run.write("c");
    run.snapshot(2);  // never completes
  }                   // the task fails: the recorded in-progress file stays
  // What the failed attempt wrote after checkpoint 1, and a torn line of a crash.
  write_file(out + "/.part-0-0.inprogress", "a\nb\nc\nhalf a li");
  FileSinkRun run(out, {.attempt = 1, .restored_state = chk1, .policy = policy});
  EXPECT_EQ(read_file(out + "/.part-0-0.inprogress"), "a\nb\n");
  run.write("d");
  run.op().end_input();
  run.op().finish();
  run.snapshot(2);
  run.complete(2);
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-0.txt"), "a\nb\nd\n");
  EXPECT_TRUE(names_in(out, true).empty());
}

TEST(FileSinkRollingPolicyTest, ARecordedInProgressFileMissingAtRestoreFailsNamingIt) {
  TempDir dir;
  const std::string out = dir / "out";
  const RollingPolicy policy{kNever, kNever, kNever};
  std::string chk1;
  {
    FileSinkRun run(out, {.policy = policy});
    run.write("a");
    chk1 = run.snapshot(1);
    run.complete(1);
  }
  std::filesystem::remove(out + "/.part-0-0.inprogress");
  try {
    FileSinkRun run(out, {.attempt = 1, .restored_state = chk1, .policy = policy});
    FAIL() << "a lost in-progress file was not noticed";
  } catch (const OperatorException& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(".part-0-0.inprogress"), std::string::npos) << what;
    EXPECT_NE(what.find("lost"), std::string::npos) << what;
  }
}

TEST(FileSinkRollingPolicyTest, ALowerParallelismFinishesTheOldSubtasksInProgressFiles) {
  TempDir dir;
  const std::string out = dir / "out";
  const RollingPolicy policy{kNever, kNever, kNever};
  std::vector<std::string> old;
  for (int s = 0; s < 3; ++s) {
    FileSinkRun run(out, {.subtask = s, .parallelism = 3, .policy = policy});
    run.write("r" + std::to_string(s));
    old.push_back(run.snapshot(1));
  }
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string_view> views(old.begin(), old.end());
    DataOutput state;
    ASSERT_TRUE(OperatorStateStore::redistribute(views, 2, s, state).ok());
    FileSinkRun run(
        out,
        {.subtask = s, .parallelism = 2, .attempt = 1, .restored_state = std::string(state.view()), .policy = policy});
    run.write("n" + std::to_string(s));
    run.op().end_input();
    run.op().finish();
    run.snapshot(2);
    run.complete(2);
  }
  // Subtask 0 wrote on in its own file and finished old subtask 2's; subtask 1 wrote on in its own.
  EXPECT_EQ(names_in(out, false), (std::vector<std::string>{"part-0-0.txt", "part-1-0.txt", "part-2-0.txt"}));
  EXPECT_EQ(read_file(out + "/part-0-0.txt"), "r0\nn0\n");
  EXPECT_EQ(read_file(out + "/part-1-0.txt"), "r1\nn1\n");
  EXPECT_EQ(read_file(out + "/part-2-0.txt"), "r2\n");
  EXPECT_TRUE(names_in(out, true).empty());
}

// ---------------------------------------------------------------------------------------------------------
// Print sink

/// A temporary FILE* the print sink writes to; text() reads back what was written.
class CapturedStream {
 public:
  CapturedStream() : f_(std::tmpfile()) {
    if (f_ == nullptr) throw std::runtime_error("tmpfile failed");
  }
  ~CapturedStream() { std::fclose(f_); }
  std::FILE* get() const { return f_; }
  std::string text() const {
    std::fflush(f_);
    std::rewind(f_);
    std::string s;
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f_)) > 0)
      s.append(buf, n);
    return s;
  }

 private:
  std::FILE* f_;
};

TEST(PrintSinkTest, ParallelismOnePrintsWithTheIdentifierOnly) {
  CapturedStream stream;
  StreamEnvironment env;
  env.set_parallelism(1);
  env.from_source(datagen::from_collection<Charge>({{"c1", 5, std::nullopt}, {"c2", 6, "x"}}), "charges")
      .sink_to(std::make_shared<PrintSink<Charge>>("charges", stream.get()));
  JobResult r = env.execute("print");
  ASSERT_TRUE(r.ok()) << error_text(r);
  EXPECT_EQ(stream.text(),
            "charges> {\"id\":\"c1\",\"amount_cents\":5,\"note\":null}\n"
            "charges> {\"id\":\"c2\",\"amount_cents\":6,\"note\":\"x\"}\n");
}

TEST(PrintSinkTest, ParallelSubtasksPrefixTheirNumberAndLinesNeverInterleave) {
  CapturedStream stream;
  constexpr int kRecords = 20'000;
  StreamEnvironment env;
  env.set_parallelism(3);
  env.from_source(datagen::seeded_random(7, kRecords,
                                         [](SeededRandom&, int64_t i) {
                                           return std::string(static_cast<size_t>(i % 50), 'x') + "#" +
                                                  std::to_string(i);
                                         }),
                  "strings")
      .sink_to(std::make_shared<PrintSink<std::string>>("", stream.get()));
  JobResult r = env.execute("print");
  ASSERT_TRUE(r.ok()) << error_text(r);
  const std::vector<std::string> lines = split_lines(stream.text());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kRecords));
  std::vector<int> seen(kRecords, 0);
  for (const std::string& line : lines) {
    ASSERT_GE(line.size(), 3U) << line;
    ASSERT_TRUE(line[0] >= '1' && line[0] <= '3' && line.substr(1, 2) == "> ") << line;
    const std::string body = line.substr(3);
    const size_t hash = body.find('#');
    ASSERT_NE(hash, std::string::npos) << line;
    const int i = std::stoi(body.substr(hash + 1));
    ASSERT_EQ(body, std::string(static_cast<size_t>(i % 50), 'x') + "#" + std::to_string(i)) << line;
    ++seen[static_cast<size_t>(i)];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), kRecords);
}

TEST(PrintSinkTest, PrefixWithIdentifierAndSubtask) {
  CapturedStream stream;
  StreamEnvironment env;
  env.set_parallelism(2);
  env.from_source(datagen::sequence(1, 4), "n").sink_to(std::make_shared<PrintSink<int64_t>>("nums", stream.get()));
  JobResult r = env.execute("print");
  ASSERT_TRUE(r.ok()) << error_text(r);
  std::vector<std::string> lines = sorted(split_lines(stream.text()));
  ASSERT_EQ(lines.size(), 4U);
  for (const std::string& l : lines) {
    EXPECT_TRUE(l.rfind("nums:1> ", 0) == 0 || l.rfind("nums:2> ", 0) == 0) << l;
  }
}

}  // namespace
}  // namespace sluice
