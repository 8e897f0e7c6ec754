#include "sluice/connectors/cdc/change_event.h"

#include <fmt/format.h>

namespace sluice::cdc {

std::string_view to_string(ChangeOp op) noexcept {
  switch (op) {
    case ChangeOp::kCreate:
      return "c";
    case ChangeOp::kUpdate:
      return "u";
    case ChangeOp::kDelete:
      return "d";
    case ChangeOp::kRead:
      return "r";
  }
  return "?";
}

Result<ChangeOp> parse_change_op(std::string_view code) {
  if (code == "c") return ChangeOp::kCreate;
  if (code == "u") return ChangeOp::kUpdate;
  if (code == "d") return ChangeOp::kDelete;
  if (code == "r") return ChangeOp::kRead;
  return Error(ErrorCode::kConfiguration, fmt::format("unknown change op \"{}\" (expected c, u, d or r)", code));
}

const Value& ChangeEvent::entity_id() const {
  if (key.is_object() && key.size() == 1) return key.as_object().field_at(0).second;
  return key;
}

Value ChangeEvent::to_value() const {
  // Field by field: Value::object's initializer list holds const values and would copy the row images twice.
  Value src = Value::object();
  Value::Object& s = src.as_object();
  s.reserve(8);
  s.set("connector", Value(source.connector));
  s.set("db", Value(source.database));
  s.set("collection", Value(source.collection));
  s.set("position", Value(source.position));
  s.set("ts_ms", Value(source.ts_ms));
  s.set("snapshot", Value(source.snapshot));
  if (source.txn_id >= 0) s.set("txn_id", Value(source.txn_id));
  if (source.sequence != 0) s.set("sequence", Value(source.sequence));
  Value event = Value::object();
  Value::Object& e = event.as_object();
  e.reserve(5);
  e.set("op", Value(to_string(op)));
  e.set("key", key);
  e.set("before", before);
  e.set("after", after);
  e.set("source", std::move(src));
  return event;
}

namespace {

Result<const Value*> field(const Value& obj, std::string_view name, Value::Kind kind, std::string_view where) {
  const Value* f = obj.find(name);
  if (f == nullptr) {
    return Error(ErrorCode::kSerialization, fmt::format("change event: missing field \"{}{}\"", where, name));
  }
  if (f->kind() != kind) {
    return Error(ErrorCode::kSerialization,
                 fmt::format("change event: field \"{}{}\" has the wrong type", where, name));
  }
  return f;
}

}  // namespace

Result<ChangeEvent> ChangeEvent::from_value(const Value& v) {
  if (!v.is_object()) return Error(ErrorCode::kSerialization, "change event: expected an object");
  ChangeEvent e;
  auto op = field(v, "op", Value::Kind::kString, "");
  if (!op) return op.error();
  auto parsed = parse_change_op((*op)->as_string());
  if (!parsed) return Error(ErrorCode::kSerialization, "change event: " + parsed.error().message());
  e.op = *parsed;
  auto key = field(v, "key", Value::Kind::kObject, "");
  if (!key) return key.error();
  e.key = **key;
  if (const Value* b = v.find("before")) e.before = *b;
  if (const Value* a = v.find("after")) e.after = *a;
  auto src = field(v, "source", Value::Kind::kObject, "");
  if (!src) return src.error();
  const Value& s = **src;
  auto str = [&](std::string_view name, std::string& out) -> Status {
    auto f = field(s, name, Value::Kind::kString, "source.");
    if (!f) return f.error();
    out = std::string((*f)->as_string());
    return {};
  };
  if (auto st = str("connector", e.source.connector); !st) return st.error();
  if (auto st = str("db", e.source.database); !st) return st.error();
  if (auto st = str("collection", e.source.collection); !st) return st.error();
  if (auto st = str("position", e.source.position); !st) return st.error();
  auto ts = field(s, "ts_ms", Value::Kind::kInt64, "source.");
  if (!ts) return ts.error();
  e.source.ts_ms = (*ts)->as_int64();
  auto snap = field(s, "snapshot", Value::Kind::kBool, "source.");
  if (!snap) return snap.error();
  e.source.snapshot = (*snap)->as_bool();
  if (const Value* t = s.find("txn_id"); t != nullptr && t->is_int64()) {
    // -1 is "unknown" and to_value() omits it; another negative id would silently read back as unknown.
    if (t->as_int64() < -1) {
      return Error(ErrorCode::kSerialization,
                   fmt::format("change event: field \"source.txn_id\" is {}: a transaction id is not negative (omit "
                               "it when unknown)",
                               t->as_int64()));
    }
    e.source.txn_id = t->as_int64();
  }
  if (const Value* q = s.find("sequence"); q != nullptr && q->is_int64()) e.source.sequence = q->as_int64();
  return e;
}

}  // namespace sluice::cdc
