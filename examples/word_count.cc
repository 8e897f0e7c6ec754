#include "word_count.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <mutex>

#include "sluice/connectors/datagen.h"
#include "sluice/connectors/files.h"
#include "sluice/connectors/print.h"

namespace sluice::examples {
namespace {

using WordCount = std::pair<std::string, int64_t>;

/// Keeps the latest (largest) count per word and hands the table over at the end of the input.
class FinalCountsSink final : public Sink<WordCount> {
 public:
  explicit FinalCountsSink(std::function<void(const std::map<std::string, int64_t>&)> on_result)
      : on_result_(std::move(on_result)) {}
  std::unique_ptr<SinkWriter<WordCount>> create_writer(RuntimeContext&) const override {
    return std::make_unique<Writer>(on_result_);
  }

 private:
  class Writer final : public SinkWriter<WordCount> {
   public:
    explicit Writer(std::function<void(const std::map<std::string, int64_t>&)> f) : on_result_(std::move(f)) {}
    void write(const WordCount& wc, const SinkWriterContext&) override {
      int64_t& c = counts_[wc.first];
      c = std::max(c, wc.second);
    }
    void flush(bool end_of_input) override {
      if (end_of_input) on_result_(counts_);
    }

   private:
    std::function<void(const std::map<std::string, int64_t>&)> on_result_;
    std::map<std::string, int64_t> counts_;
  };
  std::function<void(const std::map<std::string, int64_t>&)> on_result_;
};

struct Charge {
  std::string customer;
  int64_t amount_cents = 0;
};
SLUICE_FIELDS(Charge, customer, amount_cents);

}  // namespace

std::vector<std::string> split_words(std::string_view line) {
  // ASCII letters and digits are word characters (lower-cased); so are non-ASCII code points except the
  // punctuation and space blocks (Latin-1 punctuation U+00A0-U+00BF, General Punctuation U+2000-U+206F,
  // CJK punctuation U+3000-U+303F), so "café" and "Straße" stay whole and an em dash separates words.
  std::vector<std::string> words;
  std::string cur;
  size_t i = 0;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  while (i < line.size()) {
    auto c = static_cast<unsigned char>(line[i]);
    if (c < 0x80) {
      bool inner_apostrophe =
          c == '\'' && !cur.empty() && i + 1 < line.size() &&
          (std::isalnum(static_cast<unsigned char>(line[i + 1])) || static_cast<unsigned char>(line[i + 1]) >= 0x80);
      if (std::isalnum(c) || inner_apostrophe) {
        cur.push_back(static_cast<char>(std::tolower(c)));
      } else {
        flush();
      }
      ++i;
      continue;
    }
    // A multi-byte UTF-8 sequence: decode its code point (invalid bytes count as word characters).
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    len = std::min(len, line.size() - i);
    uint32_t cp = len == 1 ? c : (c & (0xFF >> (len + 1)));
    for (size_t k = 1; k < len; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(line[i + k]) & 0x3F);
    bool separator = (cp >= 0xA0 && cp <= 0xBF) || (cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F);
    if (separator) {
      flush();
    } else {
      cur.append(line.substr(i, len));
    }
    i += len;
  }
  flush();
  return words;
}

void build_word_count(StreamEnvironment& env, std::vector<std::string> inputs,
                      std::function<void(const std::map<std::string, int64_t>&)> on_result) {
  env.from_source(files::text_lines(std::move(inputs)), "text")
      .uid("text-source")
      .flat_map<WordCount>([](const std::string& line, Collector<WordCount>& out) {
        for (auto& w : split_words(line))
          out.collect(WordCount{std::move(w), 1});
      })
      .name("Split")
      .key_by([](const WordCount& wc) { return wc.first; })
      .sum<1>()
      .uid("counts")
      .sink_to(std::make_shared<FinalCountsSink>(std::move(on_result)), "Final counts")
      .set_parallelism(1)
      .uid("final-counts");
}

void build_running_sum(StreamEnvironment& env, int64_t count, uint64_t seed, double records_per_second) {
  auto charges = datagen::seeded_random(
      seed, count,
      [](SeededRandom& rng, int64_t) {
        return Charge{"customer-" + std::to_string(rng.next_below(5)), static_cast<int64_t>(rng.next_below(10'000))};
      },
      records_per_second);
  env.from_source(charges, "charges")
      .uid("charges")
      .key_by(&Charge::customer)
      .sum(&Charge::amount_cents)
      .uid("sum-per-customer")
      .sink_to(print_sink<Charge>(), "Print")
      .uid("print");
}

}  // namespace sluice::examples
