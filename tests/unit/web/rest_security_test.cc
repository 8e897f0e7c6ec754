// Bearer tokens of the REST API (web/rest_security.h): loading them from a file or an environment variable with
// every refusal, the verdicts (401 without or with an unknown token, 403 for an action with the read token), and
// the comparison. HTTPS and the whole server: tests/integration/rest_security_e2e_test.cc.
#include "sluice/web/rest_security.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace sluice {
namespace {

namespace fs = std::filesystem;

const std::string kAdmin = "0123456789abcdef-admin";
const std::string kRead = "0123456789abcdef-read";

class RestSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-rest-security-unit-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    fs::remove_all(dir_);
    ::unsetenv("SLUICE_UNIT_READ_TOKEN");
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    fs::permissions(dir_ / name, fs::perms::owner_read | fs::perms::owner_write);
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(RestSecurityTest, LoadsTokensFromAFileAndAVariable) {
  Configuration c;
  c.set(options::kRestAuthAdminTokenFile, write("admin", kAdmin + "\n"));
  ::setenv("SLUICE_UNIT_READ_TOKEN", kRead.c_str(), 1);
  c.set(options::kRestAuthReadTokenEnv, std::string("SLUICE_UNIT_READ_TOKEN"));
  auto auth = load_rest_auth(c);
  ASSERT_TRUE(auth.ok()) << auth.error().to_string();
  EXPECT_EQ(auth->admin_token, kAdmin);  // the file's newline dropped
  EXPECT_EQ(auth->read_token, kRead);
  EXPECT_TRUE(auth->enabled());
  auto none = load_rest_auth(Configuration{});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
}

TEST_F(RestSecurityTest, RefusesBadTokensNamingTheKeyNeverTheToken) {
  auto error_of = [](const Configuration& c) {
    auto r = load_rest_auth(c);
    return r.ok() ? std::string("(accepted)") : r.error().message();
  };
  Configuration both;
  both.set(options::kRestAuthAdminTokenFile, write("a", kAdmin));
  both.set(options::kRestAuthAdminTokenEnv, std::string("X"));
  EXPECT_NE(error_of(both).find("both set"), std::string::npos) << error_of(both);

  Configuration missing;
  missing.set(options::kRestAuthAdminTokenFile, (dir_ / "nope").string());
  EXPECT_NE(error_of(missing).find("cannot read"), std::string::npos) << error_of(missing);

  Configuration unset;
  unset.set(options::kRestAuthReadTokenEnv, std::string("SLUICE_UNIT_READ_TOKEN"));
  EXPECT_NE(error_of(unset).find("not set or empty"), std::string::npos) << error_of(unset);

  Configuration short_token;
  short_token.set(options::kRestAuthAdminTokenFile, write("short", "s3cr3t\n"));
  const std::string e = error_of(short_token);
  EXPECT_NE(e.find("fewer than 16"), std::string::npos) << e;
  EXPECT_EQ(e.find("s3cr3t"), std::string::npos) << "the token is quoted: " << e;

  Configuration spaces;
  spaces.set(options::kRestAuthAdminTokenFile, write("spaces", "0123456789 abcdef0123"));
  EXPECT_NE(error_of(spaces).find("whitespace"), std::string::npos) << error_of(spaces);

  Configuration same;
  same.set(options::kRestAuthAdminTokenFile, write("admin", kAdmin));
  same.set(options::kRestAuthReadTokenFile, write("read", kAdmin));
  EXPECT_NE(error_of(same).find("the same"), std::string::npos) << error_of(same);
}

TEST_F(RestSecurityTest, TlsNeedsACertificateAndAKey) {
  Configuration c;
  c.set(options::kRestSslEnabled, true);
  auto r = load_rest_tls(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("security.ssl.rest.certificate"), std::string::npos);
  c.set(options::kRestSslCertificate, std::string("/x/cert.pem"));
  c.set(options::kRestSslKey, std::string("/x/key.pem"));
  auto ok = load_rest_tls(c);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->enabled);
  EXPECT_EQ(ok->key_file, "/x/key.pem");
  Configuration bad;
  bad.set_string("security.ssl.rest.enabled", "maybe");
  EXPECT_FALSE(load_rest_tls(bad).ok());
}

TEST_F(RestSecurityTest, VerdictsPerTokenAndMethod) {
  const RestAuthOptions auth{kAdmin, kRead};
  EXPECT_EQ(authorize_rest_request(auth, "GET", "").status, 401);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Basic abc").status, 401);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Bearer " + kRead + "x").status, 401);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Bearer " + kRead.substr(1)).status, 401);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Bearer " + kRead).status, 200);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "bearer " + kRead).status, 200);  // the scheme is case-insensitive
  EXPECT_EQ(authorize_rest_request(auth, "HEAD", "Bearer " + kRead).status, 200);
  const RestAuthDecision post = authorize_rest_request(auth, "POST", "Bearer " + kRead);
  EXPECT_EQ(post.status, 403);
  EXPECT_NE(post.message.find("admin token"), std::string::npos) << post.message;
  EXPECT_EQ(authorize_rest_request(auth, "PATCH", "Bearer " + kRead).status, 403);
  EXPECT_EQ(authorize_rest_request(auth, "POST", "Bearer " + kAdmin).status, 200);
  EXPECT_EQ(authorize_rest_request(auth, "PATCH", "Bearer " + kAdmin).status, 200);
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Bearer " + kAdmin).status, 200);
  // The message never quotes what was presented.
  EXPECT_EQ(authorize_rest_request(auth, "GET", "Bearer guess-guess-guess").message.find("guess"), std::string::npos);
  // Read-only deployment: no admin token, so no action at all.
  const RestAuthOptions read_only{"", kRead};
  EXPECT_EQ(authorize_rest_request(read_only, "GET", "Bearer " + kRead).status, 200);
  EXPECT_EQ(authorize_rest_request(read_only, "POST", "Bearer " + kRead).status, 403);
  EXPECT_EQ(authorize_rest_request(read_only, "POST", "Bearer ").status, 401);
  // Off: everything passes.
  EXPECT_EQ(authorize_rest_request(RestAuthOptions{}, "PATCH", "").status, 200);
}

TEST_F(RestSecurityTest, TokensEqualComparesWholeTokens) {
  EXPECT_TRUE(tokens_equal(kAdmin, kAdmin));
  EXPECT_FALSE(tokens_equal(kAdmin, kAdmin + "x"));
  EXPECT_FALSE(tokens_equal(kAdmin, kAdmin.substr(0, kAdmin.size() - 1)));
  EXPECT_FALSE(tokens_equal(kAdmin, ""));
  EXPECT_TRUE(tokens_equal("", ""));
}

}  // namespace
}  // namespace sluice
