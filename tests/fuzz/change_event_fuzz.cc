// The change-event envelope (docs/cdc.md): JSON -> Value -> ChangeEvent::from_value, as the files and Kafka
// sources read it. Any input gives an event or an error; an event prints (to_value) to an envelope that reads
// back as the same event.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "sluice/connectors/cdc/change_event.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::Result<sluice::Value> v = sluice::Value::from_json(text);
  if (!v.ok()) return 0;
  sluice::Result<sluice::cdc::ChangeEvent> e = sluice::cdc::ChangeEvent::from_value(*v);
  if (!e.ok()) return 0;
  const sluice::Value envelope = e->to_value();
  sluice::Result<sluice::cdc::ChangeEvent> again = sluice::cdc::ChangeEvent::from_value(envelope);
  SLUICE_FUZZ_CHECK(again.ok(), envelope.to_json() + ": " + again.error().message());
  SLUICE_FUZZ_CHECK(*again == *e, envelope.to_json() + " reads back differently");
  (void)e->entity_id();
  sluice::Result<sluice::Value> reparsed = sluice::Value::from_json(envelope.to_json());
  SLUICE_FUZZ_CHECK(reparsed.ok(), envelope.to_json());
  return 0;
}
