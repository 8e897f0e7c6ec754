// A pipeline into a real Postgres: the bundled quickstart change events (examples/data/payments/) through
// `sluice run`'s job with a postgres upsert sink per table; the tables must end up holding the final state of
// every entity, erased customers absent, and a second run over the same changes must change nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "sluice/pipeline/pipeline_runner.h"
#include "test_util/postgres.h"
#include "test_util/services.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

TEST(PipelinePostgresSinkTest, QuickstartChangesUpsertAndDeleteTheFinalState) {
  const std::string url = sluice::testing::require_service("postgres").get("POSTGRES_URL");
  ASSERT_FALSE(url.empty());
  sluice::testing::PgClient pg(url);
  const std::string n = fmt::format("pl{}", ::getpid());
  pg.exec(fmt::format("DROP TABLE IF EXISTS {0}_charges, {0}_customers", n));
  pg.exec(
      fmt::format("CREATE TABLE {}_charges (id text PRIMARY KEY, status text, amount_cents bigint, "
                  "currency text)",
                  n));
  pg.exec(fmt::format("CREATE TABLE {}_customers (id text PRIMARY KEY, name text, country text)", n));

  char tmpl[] = "/tmp/sluice-pipeline-pg-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string yaml = fmt::format(R"(pipeline:
  name: to-postgres
  parallelism: 2
  checkpoint: {{ interval: 200ms, storage: "{0}/checkpoints" }}
source: {{ type: files, path: "{1}/payments" }}
transform:
  - match: "*.public.customers"
    key: key.id
    event:
      payload: "key.id AS id, after.name, after.country"
route:
  - {{ match: "*.public.charges", sink: charges }}
  - {{ match: "*.public.customers", sink: customers }}
sink:
  charges:
    type: postgres
    conninfo: "${{POSTGRES_URL}}"
    table: {2}_charges
    key-columns: [id]
    row: "entity AS id, payload.status, payload.amount_cents, payload.currency"
    batch-size: 500
  customers: {{ type: postgres, conninfo: "${{POSTGRES_URL}}", table: {2}_customers, key-columns: [id] }}
)",
                                       dir.string(), SLUICE_EXAMPLES_DATA_DIR, n);
  for (int run = 0; run < 2; ++run) {
    Result<PipelineSpec> spec = parse_pipeline(yaml, "to-postgres.yaml");
    ASSERT_TRUE(spec.ok()) << spec.error().message();
    Result<std::unique_ptr<PipelineRunner>> runner = PipelineRunner::create(*spec);
    ASSERT_TRUE(runner.ok()) << runner.error().message();
    ASSERT_TRUE((*runner)->start().ok());
    JobResult r = (*runner)->wait();
    ASSERT_EQ(r.status, JobStatus::kFinished) << (r.error ? r.error->to_string() : "");
  }

  // The expected final state, from the change events themselves: the last image per key, deletes removed.
  std::map<std::string, std::string> charges, customers;
  for (const char* file : {"charges", "customers"}) {
    std::ifstream in(fs::path(SLUICE_EXAMPLES_DATA_DIR) / "payments" / (std::string(file) + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      Value e = Value::from_json(line).value_or_throw();
      const std::string id(e.find("key")->find("id")->as_string());
      const Value& after = *e.find("after");
      auto text = [&](const char* f) {
        const Value* v = after.find(f);
        return v == nullptr || v->is_null() ? std::string("<null>")
               : v->is_string()             ? std::string(v->as_string())
                                            : v->to_json();
      };
      auto& state = std::string(file) == "charges" ? charges : customers;
      if (e.find("op")->as_string() == "d") {
        state.erase(id);
      } else if (std::string(file) == "charges") {
        state[id] = fmt::format("{}|{}|{}|{}", id, text("status"), text("amount_cents"), text("currency"));
      } else {
        state[id] = fmt::format("{}|{}|{}", id, text("name"), text("country"));
      }
    }
  }
  auto expected = [](const std::map<std::string, std::string>& m) {
    std::vector<std::string> v;
    for (const auto& [k, row] : m)
      v.push_back(row);
    return v;
  };
  EXPECT_EQ(
      pg.lines(fmt::format("SELECT id, status, amount_cents, currency FROM {}_charges ORDER BY id COLLATE \"C\"", n)),
      expected(charges));
  EXPECT_EQ(pg.lines(fmt::format("SELECT id, name, country FROM {}_customers ORDER BY id COLLATE \"C\"", n)),
            expected(customers));
  EXPECT_GT(charges.size(), 1000u);
  pg.exec(fmt::format("DROP TABLE IF EXISTS {0}_charges, {0}_customers", n));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice::pipeline
