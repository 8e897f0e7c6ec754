#include "sluice/udf/function_protocol.h"

#include <fmt/format.h>

#include <cstring>

namespace sluice::udf {
namespace {

bool is_reserved_object(const Value::Object& o) {
  return o.size() == 1 && o.field_at(0).first == kDecimalTag;
}

// Whether `v` holds a decimal or a reserved object anywhere (the common case, neither, takes Value's own writer).
bool needs_tagging(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kDecimal:
      return true;
    case Value::Kind::kArray:
      for (const Value& e : v.as_array())
        if (needs_tagging(e)) return true;
      return false;
    case Value::Kind::kObject:
      if (is_reserved_object(v.as_object())) return true;
      for (const auto& [k, e] : v.as_object())
        if (needs_tagging(e)) return true;
      return false;
    default:
      return false;
  }
}

Status write_tagged(const Value& v, std::string& out, std::string& path) {
  switch (v.kind()) {
    case Value::Kind::kDecimal:
      out += R"({"$decimal":")";
      v.as_decimal().append_to(out);
      out += "\"}";
      return ok_status();
    case Value::Kind::kArray: {
      out += '[';
      size_t i = 0;
      for (const Value& e : v.as_array()) {
        if (i > 0) out += ',';
        const size_t mark = path.size();
        fmt::format_to(std::back_inserter(path), "[{}]", i++);
        SLUICE_RETURN_IF_ERROR(write_tagged(e, out, path));
        path.resize(mark);
      }
      out += ']';
      return ok_status();
    }
    case Value::Kind::kObject: {
      if (is_reserved_object(v.as_object())) {
        return Error(ErrorCode::kSerialization,
                     fmt::format("the object at {} has the single field \"$decimal\", which the function protocol "
                                 "reserves for exact decimals; it cannot be sent to a function",
                                 path.empty() ? std::string("the top") : path));
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        Value(k).write_json(out);
        out += ':';
        const size_t mark = path.size();
        path += '.';
        path += k;
        SLUICE_RETURN_IF_ERROR(write_tagged(e, out, path));
        path.resize(mark);
      }
      out += '}';
      return ok_status();
    }
    default:
      v.write_json(out);
      return ok_status();
  }
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
  if (!needs_tagging(record)) {
    record.write_json(text_);
  } else {
    std::string path;
    Status s = write_tagged(record, text_, path);
    if (!s.ok()) {
      text_.resize(mark);
      return s;
    }
    decimals_ = true;
  }
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
