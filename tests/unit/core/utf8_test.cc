// core/utf8.h: the one UTF-8 validator (RFC 3629 §4) of Value's JSON, the Kafka source and the Postgres decoder.
#include "sluice/core/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

constexpr size_t kValid = std::string_view::npos;

TEST(Utf8Test, AcceptsEveryWellFormedSequenceLength) {
  EXPECT_EQ(first_invalid_utf8(""), kValid);
  EXPECT_EQ(first_invalid_utf8("plain ascii\n"), kValid);
  EXPECT_EQ(first_invalid_utf8("\xC3\xA9"), kValid);          // é, 2 bytes
  EXPECT_EQ(first_invalid_utf8("\xE2\x82\xAC"), kValid);      // €, 3 bytes
  EXPECT_EQ(first_invalid_utf8("\xF0\x9F\x98\x80"), kValid);  // 😀, 4 bytes
  EXPECT_EQ(first_invalid_utf8("\xED\x9F\xBF"), kValid);      // U+D7FF, just below the surrogates
  EXPECT_EQ(first_invalid_utf8("\xEE\x80\x80"), kValid);      // U+E000, just above them
  EXPECT_EQ(first_invalid_utf8("\xF4\x8F\xBF\xBF"), kValid);  // U+10FFFF, the last code point
  EXPECT_EQ(first_invalid_utf8(std::string_view("a\0b", 3)), kValid);
  EXPECT_TRUE(is_valid_utf8("na\xC3\xAFve"));
}

TEST(Utf8Test, NamesTheFirstByteThatStartsNoValidSequence) {
  EXPECT_EQ(first_invalid_utf8("ab\x80"), 2u);            // a lone continuation byte
  EXPECT_EQ(first_invalid_utf8("\xC3\xA9\xC3"), 2u);      // truncated at the end
  EXPECT_EQ(first_invalid_utf8("x\xE2\x82y"), 1u);        // a missing continuation byte
  EXPECT_EQ(first_invalid_utf8("\xC0\x80"), 0u);          // overlong NUL
  EXPECT_EQ(first_invalid_utf8("\xC1\xBF"), 0u);          // overlong 2-byte form
  EXPECT_EQ(first_invalid_utf8("\xE0\x9F\xBF"), 0u);      // overlong 3-byte form
  EXPECT_EQ(first_invalid_utf8("\xF0\x8F\xBF\xBF"), 0u);  // overlong 4-byte form
  EXPECT_EQ(first_invalid_utf8("ok\xED\xA0\x80"), 2u);    // U+D800, a surrogate
  EXPECT_EQ(first_invalid_utf8("\xED\xBF\xBF"), 0u);      // U+DFFF
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // U+110000, above the last code point
  EXPECT_EQ(first_invalid_utf8("\xF5\x80\x80\x80"), 0u);  // lead bytes F5..FF never occur
  EXPECT_EQ(first_invalid_utf8("\xFF"), 0u);
  EXPECT_EQ(first_invalid_utf8("\xF0\x9F\x98\x80\xF0\x9F\x98"), 4u);
  EXPECT_FALSE(is_valid_utf8("caf\xE9"));  // Latin-1 é
}

TEST(Utf8Test, SequenceLengthSeesOnlyTheBytesAvailable) {
  const auto* euro = reinterpret_cast<const unsigned char*>("\xE2\x82\xAC");
  EXPECT_EQ(utf8_sequence_length(euro, 3), 3u);
  EXPECT_EQ(utf8_sequence_length(euro, 2), 0u);  // the third byte is beyond `avail`
  EXPECT_EQ(utf8_sequence_length(reinterpret_cast<const unsigned char*>("A"), 1), 1u);
}

// Every 1- and 2-byte string, and every 3-byte string with a lead byte of E0..EF: the validator agrees with a
// decoder that builds the code point and applies RFC 3629's rules to it.
TEST(Utf8Test, AgreesWithADecodingReferenceOnEveryShortInput) {
  auto reference = [](std::string_view s) -> size_t {
    size_t i = 0;
    const auto* b = reinterpret_cast<const unsigned char*>(s.data());
    while (i < s.size()) {
      const unsigned char c = b[i];
      if (c < 0x80) {
        ++i;
        continue;
      }
      size_t len = 0;
      uint32_t cp = 0;
      if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
      } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
      } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
      } else {
        return i;
      }
      if (i + len > s.size()) return i;
      for (size_t k = 1; k < len; ++k) {
        if ((b[i + k] & 0xC0) != 0x80) return i;
        cp = (cp << 6) | (b[i + k] & 0x3F);
      }
      const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
      if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
      i += len;
    }
    return std::string_view::npos;
  };
  size_t checked = 0;
  std::string s;
  for (int a = 0; a < 256; ++a) {
    s.assign(1, static_cast<char>(a));
    ASSERT_EQ(first_invalid_utf8(s), reference(s)) << a;
    for (int b = 0; b < 256; ++b) {
      s.assign({static_cast<char>(a), static_cast<char>(b)});
      ASSERT_EQ(first_invalid_utf8(s), reference(s)) << a << " " << b;
      ++checked;
      if (a < 0xE0 || a > 0xEF) continue;
      for (int c = 0; c < 256; ++c) {
        s.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
        ASSERT_EQ(first_invalid_utf8(s), reference(s)) << a << " " << b << " " << c;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 65536u + 16u * 65536u);
}

// The ASCII fast path reads eight bytes at a time: a bad byte or a multi-byte sequence at every offset of
// ASCII runs of every length around the word size.
TEST(Utf8Test, TheFirstBadByteIsFoundAtEveryOffsetOfAnAsciiRun) {
  for (size_t len = 1; len <= 40; ++len) {
    for (size_t at = 0; at < len; ++at) {
      std::string s(len, 'a');
      s[at] = '\xFF';
      ASSERT_EQ(first_invalid_utf8(s), at) << len << " " << at;
      s[at] = '\x7F';
      ASSERT_EQ(first_invalid_utf8(s), kValid) << len << " " << at;
      s.replace(at, 1, "\xC3\xA9");  // é
      ASSERT_EQ(first_invalid_utf8(s), kValid) << len << " " << at;
      s.push_back('\x80');  // a lone continuation byte after the run
      ASSERT_EQ(first_invalid_utf8(s), s.size() - 1) << len << " " << at;
    }
  }
}

}  // namespace
}  // namespace sluice
