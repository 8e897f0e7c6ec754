// DeadLetterFile counts what it appends per file and per reason (the entry's `reason`), for the pipelines'
// deadLetters_numRecordsByReason.
#include "sluice/connectors/bad_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "sluice/connectors/dead_letter_counts.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("sluice-bad-record-" + std::to_string(::getpid()) + "-" + name + ".jsonl");
}

TEST(DeadLetterFileTest, CountsEachAppendedRecordUnderItsReason) {
  const fs::path path = temp_path("reasons");
  fs::remove(path);
  auto file = DeadLetterFile::open(path.string()).value_or_throw();
  EXPECT_EQ(dead_letters_appended(path.string()), 0);
  EXPECT_TRUE(dead_letters_appended_by_reason(path.string()).empty());
  const Value undecodable = Value::object(
      {{"source", Value("file")}, {"reason", Value(dead_letter_reason::kUndecodable)}, {"error", Value("not JSON")}});
  ASSERT_TRUE(file->append(undecodable).ok());
  ASSERT_TRUE(file->append(undecodable).ok());
  ASSERT_TRUE(file->append(Value::object({{"reason", Value("sqlstate-23505")}, {"error", Value("dup")}})).ok());
  ASSERT_TRUE(file->append(Value::object({{"error", Value("an entry of an older writer")}})).ok());
  ASSERT_TRUE(file->append_line(R"({"error":"x"})", dead_letter_reason::kTooLarge).ok());
  EXPECT_EQ(dead_letters_appended(path.string()), 5);
  EXPECT_EQ(dead_letters_appended_by_reason(path.string()),
            (std::map<std::string, int64_t>{
                {"undecodable", 2}, {"sqlstate-23505", 1}, {"unspecified", 1}, {"too-large", 1}}));
  // Every entry is in the file, with its reason.
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], R"({"source":"file","reason":"undecodable","error":"not JSON"})");
  fs::remove(path);
}

TEST(DeadLetterFileTest, CountsFromConcurrentWritersAddUp) {
  const fs::path path = temp_path("concurrent");
  fs::remove(path);
  auto file = DeadLetterFile::open(path.string()).value_or_throw();
  constexpr int kThreads = 4;
  constexpr int kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Value e = Value::object({{"reason", Value(t % 2 == 0 ? "a" : "b")}});
      for (int i = 0; i < kEach; ++i)
        ASSERT_TRUE(file->append(e).ok());
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(dead_letters_appended(path.string()), kThreads * kEach);
  EXPECT_EQ(dead_letters_appended_by_reason(path.string()),
            (std::map<std::string, int64_t>{{"a", 2 * kEach}, {"b", 2 * kEach}}));
  fs::remove(path);
}

}  // namespace
}  // namespace sluice
