#include "sluice/udf/function_protocol.h"

#include <fmt/format.h>

#include <cstring>

namespace sluice::udf {
namespace {

bool is_reserved_object(const Value::Object& o) {
  return o.size() == 1 && o.field_at(0).first == kDecimalTag;
}

// Writes `v` as the protocol carries it, in one pass over the tree: Value's own JSON for scalars, a decimal as
// {"$decimal":"<digits>"} (setting `tagged`). Returns the reserved object met (its text is then incomplete and
// the caller truncates it), nullptr when none.
const Value* write_record(const Value& v, std::string& out, bool& tagged) {
  switch (v.kind()) {
    case Value::Kind::kDecimal:
      out += R"({"$decimal":")";
      v.as_decimal().append_to(out);
      out += "\"}";
      tagged = true;
      return nullptr;
    case Value::Kind::kArray: {
      out += '[';
      bool first = true;
      for (const Value& e : v.as_array()) {
        if (!first) out += ',';
        first = false;
        if (const Value* bad = write_record(e, out, tagged)) return bad;
      }
      out += ']';
      return nullptr;
    }
    case Value::Kind::kObject: {
      const Value::Object& o = v.as_object();
      if (is_reserved_object(o)) return &v;
      out += '{';
      bool first = true;
      for (const auto& [k, e] : o) {
        if (!first) out += ',';
        first = false;
        append_json_string(k, out);
        out += ':';
        if (const Value* bad = write_record(e, out, tagged)) return bad;
      }
      out += '}';
      return nullptr;
    }
    default:
      v.write_json(out);
      return nullptr;
  }
}

// The path of `target` inside `v` (".after.tags[2]"), for the error message; false when it is not inside.
bool path_to(const Value& v, const Value* target, std::string& path) {
  if (&v == target) return true;
  const size_t mark = path.size();
  if (v.is_array()) {
    size_t i = 0;
    for (const Value& e : v.as_array()) {
      fmt::format_to(std::back_inserter(path), "[{}]", i++);
      if (path_to(e, target, path)) return true;
      path.resize(mark);
    }
  } else if (v.is_object()) {
    for (const auto& [k, e] : v.as_object()) {
      path += '.';
      path += k;
      if (path_to(e, target, path)) return true;
      path.resize(mark);
    }
  }
  return false;
}

// Turns every {"$decimal":"<text>"} inside `v` into a decimal; an error names the first one that is not a decimal
// Sluice can hold.
Status untag(Value& v) {
  if (v.is_array()) {
    for (Value& e : v.as_array())
      SLUICE_RETURN_IF_ERROR(untag(e));
  } else if (v.is_object()) {
    Value::Object& o = v.as_object();
    if (is_reserved_object(o)) {
      const Value& text = o.field_at(0).second;
      if (!text.is_string()) {
        return Error(ErrorCode::kSerialization,
                     fmt::format("returned {{\"$decimal\": {}}}: the value of \"$decimal\" must be a string of digits",
                                 text.to_json().substr(0, 100)));
      }
      Result<Decimal> d = Decimal::parse(text.as_string());
      if (!d.ok()) {
        return Error(ErrorCode::kSerialization,
                     fmt::format("returned the decimal \"{}\", which Sluice cannot hold exactly: {}",
                                 text.as_string().substr(0, 100), d.error().message()));
      }
      v = Value(*d);
      return ok_status();
    }
    for (size_t i = 0; i < o.size(); ++i)
      SLUICE_RETURN_IF_ERROR(untag(o.value_at(i)));
  }
  return ok_status();
}

}  // namespace

void BatchFrame::open(int64_t id) {
  text_.clear();
  fmt::format_to(std::back_inserter(text_), R"({{"type":"batch","id":{},"records":[)", id);
  count_ = 0;
  id_ = id;
  decimals_ = false;
}

Status BatchFrame::append(const Value& record) {
  const size_t mark = text_.size();
  if (count_ > 0) text_ += ',';
  bool tagged = false;
  if (const Value* bad = write_record(record, text_, tagged)) {
    text_.resize(mark);
    std::string path;
    path_to(record, bad, path);
    return Error(ErrorCode::kSerialization,
                 fmt::format("the object at {} has the single field \"$decimal\", which the function protocol "
                             "reserves for exact decimals; it cannot be sent to a function",
                             path.empty() ? std::string("the top") : path));
  }
  decimals_ = decimals_ || tagged;
  ++count_;
  return ok_status();
}

std::string_view BatchFrame::close() {
  // "decimals" tells the worker to revive the {"$decimal": ...} objects; a batch without any is not walked.
  text_ += decimals_ ? R"(],"decimals":true})" : "]}";
  return text_;
}

Result<std::vector<RecordResult>> parse_result_frame(std::string_view text, int64_t id, size_t count) {
  auto malformed = [&](std::string_view what) {
    std::string shown(text.substr(0, 300));
    if (text.size() > 300) shown += "...";
    return Error(ErrorCode::kRuntime,
                 fmt::format("{}: expected the result of batch {} with {} results, got {}", what, id, count, shown));
  };
  Result<Value> reply = Value::from_json(text);
  if (!reply.ok()) return malformed("a reply is not JSON (" + reply.error().message() + ")");
  const Value* type = reply->find("type");
  const Value* got_id = reply->find("id");
  Value* results = const_cast<Value*>(reply->find("results"));
  if (type == nullptr || !type->is_string() || type->as_string() != "result" || got_id == nullptr ||
      !got_id->is_int64() || got_id->as_int64() != id || results == nullptr || !results->is_array() ||
      results->as_array().size() != count) {
    return malformed("a reply does not match");
  }
  // A worker writes a decimal as {"$decimal":"..."}: only a reply holding that text needs the walk.
  const bool tagged = text.find(R"("$decimal")") != std::string_view::npos;
  std::vector<RecordResult> out(count);
  auto& items = results->as_array();
  for (size_t i = 0; i < count; ++i) {
    Value& item = items[i];
    if (!item.is_object()) return malformed(fmt::format("result {} is not an object", i));
    if (Value* ok = item.find("ok"); ok != nullptr) {
      out[i].ok = std::move(*ok);
      if (tagged) {
        if (Status s = untag(out[i].ok); !s.ok()) {
          out[i].failed = true;
          out[i].ok = Value();
          out[i].message = s.error().message();
        }
      }
    } else if (const Value* error = item.find("error"); error != nullptr) {
      out[i].failed = true;
      const Value* message = error->find("message");
      const Value* stack = error->find("stack");
      if (message != nullptr && message->is_string()) out[i].message = message->as_string();
      if (stack != nullptr && stack->is_string()) out[i].stack = stack->as_string();
    } else {
      return malformed(fmt::format("result {} has neither \"ok\" nor \"error\"", i));
    }
  }
  return out;
}

}  // namespace sluice::udf
