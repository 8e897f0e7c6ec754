// Domain events: what a pipeline makes of a change event (docs/pipelines.md, "Domain events").
//
// The envelope, one JSON object per event:
//   id           a UUID (RFC 4122 version 5, name-based with SHA-1) of connector, database, collection,
//                source position, sequence, entity and type: a replay of the same change yields the same id,
//                so consumers deduplicate by it
//   type         "charge.paid": from the transform's `event.type` expression, default "<table>.<op name>"
//   entity       the entity id (the transform's `key`, default the change's key): events are keyed by it, so
//                one Kafka partition carries each entity's events in order
//   occurred_at  the source timestamp (commit time), as an ISO-8601 UTC timestamp
//   op           the change's operation: "c", "u", "d" or "r"
//   payload      the row image after the change (before for deletes), or the `event.payload` projection
//   source       {connector, db, collection, position, sequence, snapshot}
// Thread-safety: plain functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/connectors/cdc/change_event.h"
#include "sluice/core/value.h"

namespace sluice::pipeline {

/// The namespace UUID of Sluice's event ids (a fixed, random version-4 UUID): 3f1c5b2e-8a4d-4c6b-9e2f-5d7a1b0c9e84.
inline constexpr std::array<uint8_t, 16> kEventIdNamespace = {0x3f, 0x1c, 0x5b, 0x2e, 0x8a, 0x4d, 0x4c, 0x6b,
                                                              0x9e, 0x2f, 0x5d, 0x7a, 0x1b, 0x0c, 0x9e, 0x84};

/// An RFC 4122 §4.3 name-based UUID, version 5 (SHA-1 of namespace then name, version and variant bits set),
/// in the canonical lower-case 8-4-4-4-12 form. Source: RFC 4122 §4.3; the SHA-1 is OpenSSL's.
std::string uuid_v5(const std::array<uint8_t, 16>& name_space, std::string_view name);

/// The event id of a change: uuid_v5(kEventIdNamespace, name), where name joins connector, database,
/// collection, position, sequence (decimal), the entity's JSON and the type with U+001F separators.
std::string event_id(const cdc::SourceInfo& source, const Value& entity, std::string_view type);

/// The default event type of a change: "<collection without schema>.<created|updated|deleted|read>", e.g.
/// "charges.created" for an insert into public.charges.
std::string default_event_type(const cdc::ChangeEvent& change);

/// The envelope (see the file comment). `occurred_at_micros` is µs since epoch (the source timestamp unless
/// the transform's `event.occurred-at` says otherwise).
Value make_domain_event(const cdc::ChangeEvent& change, const Value& entity, std::string type, Value payload,
                        int64_t occurred_at_micros);

}  // namespace sluice::pipeline
