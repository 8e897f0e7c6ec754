#include "sluice/core/redact.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

TEST(RedactTest, PasswordsOfUrisAreReplaced) {
  EXPECT_EQ(redact_secrets("invalid URI 'mongodb://app:s3cret@db1:27017,db2/?replicaSet=rs0'"),
            "invalid URI 'mongodb://app:****@db1:27017,db2/?replicaSet=rs0'");
  EXPECT_EQ(redact_secrets("postgresql://sluice:pa/ss?w#rd@[::1"), "postgresql://sluice:****@[::1");
  EXPECT_EQ(redact_secrets("Couldn't connect (http://admin:hunter2@127.0.0.1:1)"),
            "Couldn't connect (http://admin:****@127.0.0.1:1)");
  EXPECT_EQ(redact_secrets("mongodb+srv://u:p@a.example.com and https://x:y@h/"),
            "mongodb+srv://u:****@a.example.com and https://x:****@h/");
  // No password: unchanged.
  EXPECT_EQ(redact_secrets("http://127.0.0.1:9200/_bulk"), "http://127.0.0.1:9200/_bulk");
  EXPECT_EQ(redact_secrets("mongodb://app@db:27017"), "mongodb://app@db:27017");
}

TEST(RedactTest, SecretKeyValuesAreReplaced) {
  EXPECT_EQ(redact_secrets("host=db user=app password=s3cret dbname=x"), "host=db user=app password=**** dbname=x");
  EXPECT_EQ(redact_secrets("host=db password = 'it''s a secret' port=5432"), "host=db password = '****' port=5432");
  EXPECT_EQ(redact_secrets("postgresql://db/x?user=a&password=s3cret&sslmode=require"),
            "postgresql://db/x?user=a&password=****&sslmode=require");
  EXPECT_EQ(redact_secrets(R"({"sasl.password": "K4fka", "sasl.username": "u"})"),
            R"({"sasl.password": "****", "sasl.username": "u"})");
  EXPECT_EQ(redact_secrets("sasl.jaas.config=org.Plain required password=\"x\";"),
            "sasl.jaas.config=**** required password=\"****\";");
  EXPECT_EQ(redact_secrets("PWD=abc ssl.key.password:xyz client_secret=q"),
            "PWD=**** ssl.key.password:**** client_secret=****");
  // Words that only look like keys stay.
  EXPECT_EQ(redact_secrets("FATAL: password authentication failed for user \"app\""),
            "FATAL: password authentication failed for user \"app\"");
  EXPECT_EQ(redact_secrets("unexpected token '=' at offset 3"), "unexpected token '=' at offset 3");
  EXPECT_EQ(redact_secrets(""), "");
}

TEST(RedactTest, SecretKeys) {
  EXPECT_TRUE(is_secret_key("password"));
  EXPECT_TRUE(is_secret_key("sasl.password"));
  EXPECT_TRUE(is_secret_key("Password"));
  EXPECT_TRUE(is_secret_key("sasl.oauthbearer.client.secret"));
  EXPECT_TRUE(is_secret_key("api_key"));
  EXPECT_FALSE(is_secret_key("user"));
  EXPECT_FALSE(is_secret_key("bootstrap.servers"));
}

}  // namespace
}  // namespace sluice
