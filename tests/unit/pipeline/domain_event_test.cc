#include "sluice/pipeline/domain_event.h"

#include <gtest/gtest.h>

namespace sluice::pipeline {
namespace {

TEST(DomainEventTest, UuidV5MatchesTheWellKnownVector) {
  // RFC 4122 Appendix C's DNS namespace; uuid5(NAMESPACE_DNS, "www.example.com") as Python's uuid module and
  // every other implementation give it.
  const std::array<uint8_t, 16> dns = {0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1,
                                       0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8};
  EXPECT_EQ(uuid_v5(dns, "www.example.com"), "2ed6657d-e927-568b-95e1-2665a8aea6a2");
}

cdc::ChangeEvent charge(cdc::ChangeOp op, std::string position, int64_t sequence) {
  cdc::ChangeEvent e;
  e.op = op;
  e.key = Value::object({{"id", Value("ch_1")}});
  e.after = Value::object({{"id", Value("ch_1")}, {"status", Value("paid")}});
  e.source = cdc::SourceInfo{"postgres", "payments", "public.charges", std::move(position), 1'700'000'000'000,
                             false,      7,          sequence};
  return e;
}

TEST(DomainEventTest, EventIdIsDeterministicAndDependsOnEveryPart) {
  const cdc::ChangeEvent e = charge(cdc::ChangeOp::kUpdate, "0/16B3748", 100);
  const std::string id = event_id(e.source, Value("ch_1"), "charge.paid");
  EXPECT_EQ(id, event_id(e.source, Value("ch_1"), "charge.paid"));
  EXPECT_EQ(id.size(), 36u);
  EXPECT_EQ(id[14], '5');  // version 5
  EXPECT_NE(id, event_id(e.source, Value("ch_2"), "charge.paid"));
  EXPECT_NE(id, event_id(e.source, Value("ch_1"), "charge.refunded"));
  cdc::SourceInfo other = e.source;
  other.sequence = 101;  // a second change of the same transaction
  EXPECT_NE(id, event_id(other, Value("ch_1"), "charge.paid"));
  other = e.source;
  other.position = "0/16B3750";
  EXPECT_NE(id, event_id(other, Value("ch_1"), "charge.paid"));
  other = e.source;
  other.collection = "public.refunds";
  EXPECT_NE(id, event_id(other, Value("ch_1"), "charge.paid"));
  // The transaction id and the source time are not part of the id: a replay may differ in neither anyway.
  other = e.source;
  other.ts_ms += 5;
  EXPECT_EQ(id, event_id(other, Value("ch_1"), "charge.paid"));
}

TEST(DomainEventTest, DefaultTypeAndEnvelope) {
  EXPECT_EQ(default_event_type(charge(cdc::ChangeOp::kCreate, "0/1", 1)), "charges.created");
  EXPECT_EQ(default_event_type(charge(cdc::ChangeOp::kUpdate, "0/1", 1)), "charges.updated");
  EXPECT_EQ(default_event_type(charge(cdc::ChangeOp::kDelete, "0/1", 1)), "charges.deleted");
  EXPECT_EQ(default_event_type(charge(cdc::ChangeOp::kRead, "0/1", 0)), "charges.read");

  const cdc::ChangeEvent e = charge(cdc::ChangeOp::kUpdate, "0/16B3748", 100);
  const Value ev = make_domain_event(e, Value("ch_1"), "charge.paid", Value::object({{"status", Value("paid")}}),
                                     e.source.ts_ms * 1000);
  EXPECT_EQ(ev.to_json(),
            R"({"id":")" + event_id(e.source, Value("ch_1"), "charge.paid") +
                R"(","type":"charge.paid","entity":"ch_1","occurred_at":"2023-11-14T22:13:20.000000Z","op":"u",)"
                R"("payload":{"status":"paid"},"source":{"connector":"postgres","db":"payments",)"
                R"("collection":"public.charges","position":"0/16B3748","sequence":100,"snapshot":false}})");
}

}  // namespace
}  // namespace sluice::pipeline
