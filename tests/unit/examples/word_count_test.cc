// Word count gives identical results at parallelism 1 and 4 (and matches a direct count).
#include "word_count.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace sluice::examples {
namespace {

std::map<std::string, int64_t> run(int parallelism, const std::string& input) {
  StreamEnvironment env;
  env.set_parallelism(parallelism);
  std::map<std::string, int64_t> result;
  build_word_count(env, {input}, [&](const std::map<std::string, int64_t>& counts) { result = counts; });
  JobResult r = env.execute("word count");
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->to_string() : "");
  return result;
}

TEST(WordCountTest, SameResultAtParallelismOneAndFour) {
  const std::string input = std::string(SLUICE_EXAMPLES_DATA_DIR) + "/hamlet.txt";
  auto p1 = run(1, input);
  auto p4 = run(4, input);
  ASSERT_FALSE(p1.empty());
  EXPECT_EQ(p1, p4);
  // Against a straightforward count of the same file.
  std::ifstream f(input);
  std::map<std::string, int64_t> expected;
  std::string line;
  while (std::getline(f, line)) {
    for (auto& w : split_words(line))
      ++expected[w];
  }
  EXPECT_EQ(p1, expected);
  EXPECT_EQ(p1.at("the"), 19);
}

TEST(WordCountTest, SplitWords) {
  EXPECT_EQ(split_words("To be, or not—to be: 'tis"),
            (std::vector<std::string>{"to", "be", "or", "not", "to", "be", "tis"}));
  EXPECT_EQ(split_words("wish'd. there's"), (std::vector<std::string>{"wish'd", "there's"}));
  EXPECT_TRUE(split_words("  ,;  ").empty());
  EXPECT_EQ(split_words("Café naïve Straße"), (std::vector<std::string>{"café", "naïve", "straße"}));
}

}  // namespace
}  // namespace sluice::examples
