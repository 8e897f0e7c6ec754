// Boolean engine options: the spellings accepted, and an error for any other that names the option, the value and
// every accepted form.
#include "sluice/core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "sluice/core/error.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

const ConfigOption<bool> kFlag{"test.flag", false, "a boolean option of this test"};

TEST(ConfigurationTest, BooleanOptionsAcceptTheirUsualSpellings) {
  for (const char* yes : {"true", "TRUE", " True ", "1", "yes", "on"}) {
    Configuration c;
    c.set_string("test.flag", yes);
    EXPECT_TRUE(c.get(kFlag)) << yes;
  }
  for (const char* no : {"false", "FALSE", "0", "no", "off"}) {
    Configuration c;
    c.set_string("test.flag", no);
    EXPECT_FALSE(c.get(kFlag)) << no;
  }
  Configuration unset;
  EXPECT_FALSE(unset.get(kFlag));
}

TEST(ConfigurationTest, AnyOtherBooleanValueFailsNamingTheOptionAndTheAcceptedForms) {
  Configuration c;
  c.set_string("test.flag", "maybe");
  try {
    (void)c.get(kFlag);
    FAIL() << "'maybe' was accepted";
  } catch (const SluiceException& e) {
    EXPECT_THAT(e.error().message(), HasSubstr("'test.flag'"));
    EXPECT_THAT(e.error().message(), HasSubstr("'maybe'"));
    EXPECT_THAT(e.error().message(), HasSubstr("true or false (or 1/0, yes/no, on/off)"));
  }
}

}  // namespace
}  // namespace sluice
